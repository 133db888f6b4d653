"""Issue 34, round thirty-five, blind learner (exercises 02 and 03).  An error of the learner's
own inside the flush that follows a None plan (a typo, a missing argument) was told the loop
"went on with" the None; ``process_outputs(step, "launch_sample")`` ran (any string was a
timeline label) and the checker then blamed a second ``launch_sample``; a deferred step flushed
as soon as no running request wanted more was told that "no decode step was deferred", and a
right loop whose such flush came last of all was failed."""

from __future__ import annotations

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import host_order


def _zos(on_none="previous = engine.flush(previous)", process="engine.process_outputs(previous)",
         first=""):
    """Exercise 03's loop, with its None branch, its processing of ``previous`` and a first
    line of each pass as given."""
    space: dict = {}
    exec(f'''
def zos_loop(engine):
    previous = None
    while engine.scheduler.has_work():
        {first or "pass"}
        plan = engine.schedule()
        if plan is None:
            {on_none}
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            {process}
            previous = None
        step = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(step)
        else:
            previous = step
''', space)
    return space["zos_loop"]


@pytest.mark.parametrize("on_none, raised", [
    ("previous = engine.flush(previous)\n            engine.commit_output", "AttributeError"),
    ("engine.commit_outputs(previous)", "TypeError"),
])
def test_an_error_of_the_learners_own_in_the_flush_is_named_as_raised(on_none, raised):
    v = checks.check_zos_loop(_zos(on_none=on_none))
    assert not v.passed and f"your loop raised {raised}" in v.message, v.message
    assert "went on with it" not in v.message, v.message


def test_a_none_plan_used_is_still_named_so():
    v = checks.check_zos_loop(_zos(on_none="engine.prepare_inputs(plan)"))
    assert not v.passed and "went on with it" in v.message, v.message


def test_a_stage_that_is_not_processing_is_refused_by_the_engine():
    v = checks.check_zos_loop(_zos(process='engine.process_outputs(previous, "launch_sample")'))
    assert not v.passed and "process_outputs was given stage='launch_sample'" in v.message, v
    assert "called 2 times" not in v.message, v.message
    with te.Engine(te.EngineConfig(mode="zos")) as engine:
        for stage in ("banana", "launch_forward", 42, None):
            with pytest.raises(ValueError, match="'postprocess' .* or 'flush'"):
                engine.generate(["Once upon"], max_new_tokens=4, loop=_zos(
                    process=f"engine.process_outputs(previous, {stage!r})"))
        assert len(engine.generate(["Once upon"], max_new_tokens=4)) == 1


# Flushes ``previous`` as soon as no running request wants another token, before asking
# schedule() (which would plan the waiting requests' prefill, or return None)
_PREDICTED = ("if previous is not None and not any(r.wants_more() for r in "
              "engine.scheduler.running):\n            previous = engine.flush(previous)\n"
              "            continue")


def test_a_flush_before_a_round_that_came_is_named_as_such():
    v = checks.check_zos_loop(_zos(first=_PREDICTED))
    assert not v.passed and "flushed before `engine.schedule()` was asked for round" in v.message
    assert "no decode step was deferred" not in v.message, v.message


def test_a_flush_that_no_round_follows_loses_nothing():
    """The same loop on a run whose requests all start at once: its flush comes last of all."""
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as engine:
        outs = engine.generate(["Once upon a time", "The bird said", "A"], max_new_tokens=10,
                               loop=_zos(first=_PREDICTED))
        assert [o.finish_reason for o in outs] == ["length"] * 3
        log = host_order.HostLog(engine, {})
        assert log.events[-1][0] == "flush"
        assert host_order.zos_overlapped(log) is None
