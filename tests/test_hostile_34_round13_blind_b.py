"""Round thirteen, second blind round: blocks or rows given back by writing the pool (early, or
twice), a request that ends with no token, a request that re-lists blocks the pool has back, the
note after a pool with a block twice, a ring size that changes when asked again, and 0-d ring
sizes."""

import numpy as np
import torch

from overlap_course import checks
from overlap_course.checks import pool


def _commit(engine, step):
    engine.device.wait(step.sample_done)
    return engine.commit_outputs(step, engine.read_outputs(step))


def _pool_early(engine, step):
    s = engine.scheduler
    for req in _commit(engine, step):
        if req.finished and req in s.running:  # no num_inflight test: the extra step still runs
            s.blocks.free_ids.extend(req.blocks)
            s.running.remove(req)
            s.free_rows.append(req.row)
            s.free_rows.sort()
            req.blocks, req.row = [], -1


def _pool_early_then_free(engine, step):
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 1 and req.blocks:
            engine.scheduler.blocks.free_ids.extend(req.blocks)
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def _row_early(engine, step):
    s = engine.scheduler
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 1 and req.row >= 0:
            s.free_rows.append(req.row)
        if req.finished and req.num_inflight == 0 and req in s.running:
            s.blocks.free(req.blocks, req.index)
            s.running.remove(req)
            req.blocks, req.row = [], -1


def test_blocks_or_rows_given_back_by_writing_the_pool_while_in_flight_are_early_frees():
    for fn in (_pool_early, _pool_early_then_free, _row_early):
        verdict = checks.check_process_outputs(fn)
        assert not verdict.passed, fn.__name__
        assert verdict.category == "free_in_use", (fn.__name__, verdict)
        assert "launched and not yet waited for" in verdict.message
        assert "num_inflight == 0" in verdict.message


def _one_block_twice(engine, step):
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 0:
            first = req.blocks[0]
            engine.scheduler.free(req)
            engine.scheduler.blocks.free_ids.append(first)


def _twice_then_popleft(engine, step):
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 0:
            first = req.blocks[0]
            engine.scheduler.free(req)
            engine.scheduler.blocks.free_ids.append(first)
            engine.scheduler.blocks.free_ids.popleft()


def test_a_block_put_into_the_pool_twice_is_a_double_free():
    for fn in (_one_block_twice, _twice_then_popleft):
        verdict = checks.check_process_outputs(fn)
        assert not verdict.passed, fn.__name__
        assert verdict.category == "double_free", (fn.__name__, verdict)
        assert "twice" in verdict.message and "free_ids" in verdict.message


def _right(engine, step):
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def test_after_a_pool_with_a_block_or_row_twice_the_next_verdict_carries_no_note():
    for fn in (_twice_then_popleft, _row_early):
        assert not checks.check_process_outputs(fn).passed
        verdict = checks.check_process_outputs(_right)
        assert verdict.passed, (fn.__name__, verdict.message)
        assert "earlier cell" not in verdict.message, fn.__name__
        assert "shared engine" not in verdict.message, fn.__name__


def test_a_note_on_a_pool_with_a_block_twice_counts_distinct_blocks():
    shared = pool.engine()
    free = shared.scheduler.blocks.free_ids
    free[0] = free[1]
    changed = pool.heal()
    assert any("127 free blocks of 128, in 128 entries" in c for c in changed), changed
    assert pool.whole_pool(pool.engine())


def _frees_only_with_tokens(engine, step):
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 0 and req.output_ids:
            engine.scheduler.free(req)


def test_a_request_that_ends_with_no_token_must_be_freed_too():
    verdict = checks.check_process_outputs(_frees_only_with_tokens)
    assert not verdict.passed
    assert verdict.category == "kept_blocks", verdict
    assert "with its first token, so it kept no token" in verdict.message


def _relists_blocks(engine, step):
    for req in _commit(engine, step):
        if req.finished and req.num_inflight == 0:
            kept = list(req.blocks)
            engine.scheduler.free(req)
            req.blocks = kept


def test_blocks_relisted_after_the_free_are_named_as_claimed_not_as_never_given_back():
    verdict = checks.check_process_outputs(_relists_blocks)
    assert not verdict.passed
    assert verdict.category == "stale_blocks", verdict
    assert "never were" not in verdict.message
    assert "claims blocks the pool already has back" in verdict.message


def test_a_ring_size_that_changes_when_asked_again_never_passes():
    seen = set()

    def right_once(depth):
        answer = depth if depth in seen else depth + 1
        seen.add(depth)
        return answer

    calls = []

    def right_seven_times(depth):
        calls.append(depth)
        return depth + 1 if len(calls) <= 7 else 2

    for fn in (right_once, right_seven_times):
        verdict = checks.check_ring_slots(fn)
        assert not verdict.passed, fn.__name__
        assert verdict.category == "keeps_state", verdict
        assert "asked again" in verdict.message


def test_zero_d_ring_sizes_are_the_numbers_they_hold():
    for fn in (lambda d: torch.tensor(d + 1), lambda d: np.array(d + 1)):
        verdict = checks.check_ring_slots(fn)
        assert verdict.passed, verdict.message
    verdict = checks.check_ring_slots(lambda d: torch.tensor(d + 1.0))
    assert not verdict.passed and "a float" in verdict.message
