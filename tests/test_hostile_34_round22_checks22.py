"""Round twenty-two's blind round (issue 34): the loop checks said "your loop returned after
round 0" for an empty loop that never ran a round; check_abort blamed an abort that waited for
the whole device (`synchronize()`) and then freed on a race ("while that round still runs")
that the wait had ruled out, and never named the stall the notebook warns of."""

import pytest

from overlap_course import checks


def _empty(engine):
    return None  # a learner's stub: the body is still empty


def _one_round(engine):
    """Runs round 0 the serial way, then returns with work left."""
    inputs = engine.prepare_inputs(engine.schedule())
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))


@pytest.mark.parametrize("check", [checks.check_serial_loop, checks.check_zos_loop])
def test_a_loop_that_ran_no_round_is_not_said_to_return_after_round_0(check):
    empty = check(_empty)
    assert empty.category == "loop_returned", empty
    assert "returned before it ran any round while prompts [0, 1, 2, 3]" in empty.message
    assert "round 0" not in empty.message
    early = check(_one_round)
    assert early.category == "loop_returned", early
    assert "returned after round 0 while prompts" in early.message


def _find(engine, request_id):
    return next(r for r in engine.requests if r.id == request_id)


def _synchronize_then_free(engine, request_id):
    """The notebook's abort made "safe": wait for the whole device, then free at once."""
    req = _find(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        return
    engine.device.synchronize()
    engine.scheduler.free(req)


def _free_without_waiting(engine, request_id):
    """The same abort with no wait: the free races the round in flight."""
    req = _find(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        return
    engine.scheduler.blocks.free_ids.extend(req.blocks)  # the checker's race check never sees it
    req.blocks.clear()
    engine.scheduler.free(req)


def test_check_abort_names_the_stall_of_a_synchronize_not_a_race_it_ruled_out():
    verdict = checks.check_abort(_synchronize_then_free)
    assert verdict.category == "serializes", verdict
    assert "still runs" not in verdict.message and "still uses it" not in verdict.message
    assert "aborting prompt 1 ('One day, the little') before round 3" not in verdict.message
    for said in ("prompt 1 ('One day, the little') before round 3 waited for the device (1 wait",
                 "`engine.device.synchronize()`) and then gave its KV blocks [",
                 "that wait left no launched round to touch them",
                 "each abort then stalls the host until the device is idle"):
        assert said in verdict.message, verdict.message
    raced = checks.check_abort(_free_without_waiting)  # without the wait the race is named
    assert raced.category == "free_in_use", raced
    assert "while round 2's `forward`, launched and not yet waited for, still uses it" in \
        raced.message
