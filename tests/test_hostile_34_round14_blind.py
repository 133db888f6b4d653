"""Round fourteen, blind round: notebook 07 lab 2's check_abort judges the pool after each abort
as exercise 05's check does after each process_outputs: blocks written into the pool or a row
given back while a launched round holds the request, a block twice, and a stale ``req.blocks``
each fail naming the mistake; the pool is made whole after, with no note on the next verdict."""

from overlap_course import checks


def _find(engine, request_id):
    return next(r for r in engine.requests if r.id == request_id)


def _mark(engine, request_id):
    """The start every abort below shares: the request, marked aborted, out of the waiting queue
    (None when it had finished already)."""
    req = _find(engine, request_id)
    if req.finished:
        return None
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    return req


def _pool_write_early(engine, request_id):
    req, s = _mark(engine, request_id), engine.scheduler
    if req is None:
        return
    if req in s.running and req.num_inflight > 0:
        s.blocks.free_ids.extend(req.blocks)  # a launched round still uses them
        req.blocks = []
    s.release_if_done(req)


def _row_early(engine, request_id):
    req, s = _mark(engine, request_id), engine.scheduler
    if req is None:
        return
    if req in s.running and req.num_inflight > 0 and req.row >= 0 and req.row not in s.free_rows:
        s.free_rows.append(req.row)  # a launched round still holds the row
    s.release_if_done(req)


def _stale_blocks(engine, request_id):
    req, s = _mark(engine, request_id), engine.scheduler
    if req is None:
        return
    kept = list(req.blocks)
    s.release_if_done(req)
    if req not in s.running and kept:
        req.blocks = kept  # the pool has these back


def _block_twice(engine, request_id):
    req, s = _mark(engine, request_id), engine.scheduler
    if req is None:
        return
    blocks, idle = list(req.blocks), req in s.running and req.num_inflight == 0
    s.release_if_done(req)
    if idle and blocks:
        s.blocks.free_ids.append(blocks[0])  # the same block a second time


def _right(engine, request_id):
    engine.scheduler.abort(_find(engine, request_id))


_FREE, _ROWS = "`engine.scheduler.blocks.free_ids`", "`engine.scheduler.free_rows`"


def _fails_with(abort, *words):
    verdict = checks.check_abort(abort)
    assert not verdict.passed, verdict.message
    for word in words:
        assert word in verdict.message, verdict.message
    assert "fresh engine" not in verdict.message and "-1" not in verdict.message
    return verdict


def _right_passes_clean():
    verdict = checks.check_abort(_right)
    assert verdict.passed, verdict.message
    assert "Note" not in verdict.message and "earlier cell" not in verdict.message, verdict.message


def test_blocks_written_into_the_pool_while_a_round_runs_fail_as_an_early_free():
    verdict = _fails_with(_pool_write_early, "KV cache of prompt(s)", _FREE, "still uses it",
                          "num_inflight == 0")
    assert verdict.category == "free_in_use"
    _right_passes_clean()


def test_a_row_given_back_while_a_round_runs_fails_as_an_early_free():
    verdict = _fails_with(_row_early, "batch row of prompt(s)", _ROWS, "still uses it")
    assert verdict.category == "free_in_use"
    _right_passes_clean()


def test_old_blocks_put_back_into_req_blocks_fail_as_stale():
    verdict = _fails_with(_stale_blocks, "are back in the pool", "`req.blocks` still lists them")
    assert verdict.category == "stale_blocks"
    _right_passes_clean()


def test_a_block_given_back_twice_is_named_twice_not_minus_one_missing():
    verdict = _fails_with(_block_twice, "after your abort", _FREE, "twice")
    assert verdict.category == "double_free"
    assert "never came back" not in verdict.message and "check's engine" not in verdict.message
    _right_passes_clean()


def test_the_right_abort_passes_twice_in_a_row():
    _right_passes_clean()
    _right_passes_clean()
