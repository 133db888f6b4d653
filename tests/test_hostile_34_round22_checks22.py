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
