"""Issue 34, round thirty-three (exercises 02/03's loop checkers): a ZOS loop that plans too
early, and one that catches the engine's refusal of scheduling ahead.

a: a ZOS loop that calls ``engine.schedule()`` for round N+1 right after round N's
``launch_forward`` -- before it processes round N-1's deferred step -- passed
``check_zos_loop``: same tokens, but its plans are made from state a round staler than the
lesson's loop (which plans round N+1 at the top of the next pass, once round N-1 is processed),
so a request that ended in round N-1 is planned into round N+1 too (with a stop string: 10
discarded outputs, the engine's loop 4). The ZOS order (``host_order._zos_order``) checked
where each step was processed against the launches, never against the plans. Each step is
now processed before any plan after the one the lesson's loop makes before it
(``plan_order.planned_early``: a prefill's before the next plan, a decode step's before the
plan after next); a loop that asks earlier is told the next round was planned before the
previous step was processed (``scheduled_too_early``), naming the rounds.
b: the same loop, when its early ``schedule()`` returned None, flushed at the top of the next
pass and was told "round 23 ... was flushed before round 24 was even scheduled": it is told
a.'s verdict. A right loop that plans round N+1 after processing round N-1 but before round
N's sample (as stale as the lesson's) flushes after a None from that ``schedule()``: the flush
and the overlap rules read the ``schedule()`` calls since the round's forward, not its sample
(its sample changes no plan), and it passes.
c: a loop that schedules ahead and catches the engine's refusal ``PlannedSince`` (raised by
``prepare_inputs`` before its span, so ``HostLog.prepare_calls`` never sees the call) was told
"round 1 ... was scheduled but never prepared or launched" (``plan_dropped``) by both loop
checkers. A caught ``PlannedSince`` is now read like an uncaught one, before the plan order:
it is told it scheduled ahead, that the engine refused it with ``PlannedSince`` and that the
loop caught the error and went on without that round."""

from __future__ import annotations

import pytest

import toy_engine as te
from loops_for_tests import zos_loop as right_zos_loop
from overlap_course import checks
from toy_engine.refusals import PlannedSince


def _launch(engine, plan, previous, early: bool):
    """Round ``plan``'s launches; ``previous`` processed under its forward.  ``early``: the
    next plan asked for right after the forward (wrong), else after ``previous`` is
    processed, before the sample (right for a decode round; a prefill's step is processed at
    once, then the next plan asked for).  Returns (the new previous, the next plan or None)."""
    inputs = engine.prepare_inputs(plan)
    if previous is not None:
        engine.correct_on_device(inputs)
    engine.launch_forward(inputs)
    ask = engine.scheduler.has_work
    nxt = engine.schedule() if early and ask() else None
    if previous is not None:
        engine.process_outputs(previous)
    if not early and not plan.is_prefill and ask():
        nxt = engine.schedule()
    step = engine.launch_sample(inputs)
    if not plan.is_prefill:
        return step, nxt
    engine.process_outputs(step)
    return None, (engine.schedule() if not early and ask() else nxt)


def planning(early: bool, flush_at_top: bool = False):
    """A ZOS loop that asks for the next plan inside each pass (see ``_launch``); a None plan
    is flushed at the top of the next pass, then asked for again (``flush_at_top``: without
    checking the scheduler's work first)."""
    def zos_loop(engine):
        previous, plan = None, engine.schedule()
        while flush_at_top or engine.scheduler.has_work():
            if plan is None:
                previous = engine.flush(previous)
                if not engine.scheduler.has_work():
                    break
                plan = engine.schedule()
                continue
            previous, plan = _launch(engine, plan, previous, early)
    return zos_loop


def decode_early(engine):
    """Wrong: a prefill processed at once, but each decode round's successor asked for right
    after its forward, before the step deferred under it is processed."""
    previous, plan = None, None
    while engine.scheduler.has_work():
        plan = engine.schedule() if plan is None else plan
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        nxt = engine.schedule() if not plan.is_prefill else None
        if previous is not None:
            engine.process_outputs(previous)
        step = engine.launch_sample(inputs)
        previous = None if plan.is_prefill else step
        if plan.is_prefill:
            engine.process_outputs(step)
        plan = nxt


def caught_planned_since(engine):
    """Wrong twice (blind round 33): schedules ahead, and catches the engine's refusal."""
    previous, plan = None, None
    while engine.scheduler.has_work():
        plan = engine.schedule() if plan is None else plan
        if plan is None:
            previous = engine.flush(previous)
            continue
        nxt = engine.schedule() if not plan.is_prefill else None
        try:
            inputs = engine.prepare_inputs(plan)
        except PlannedSince:
            plan = nxt
            continue
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        step = engine.launch_sample(inputs)
        previous = None if plan.is_prefill else step
        if plan.is_prefill:
            engine.process_outputs(step)
        plan = nxt


def discarded(loop) -> int:
    """Outputs discarded (wasted extra steps) with a stop string, on the blind round's run."""
    prompts = ["Once upon a time", "The bird said", "There was a fox", "A cat", "Then the dog"]
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)) as eng:
        eng.generate(prompts, max_new_tokens=24, stop=["e"], loop=loop)
        return eng.stats.discarded_outputs


@pytest.mark.parametrize("flush_at_top", [False, True])
def test_a_b_the_next_plan_asked_for_under_the_forward_is_named(flush_at_top):
    v = checks.check_zos_loop(planning(early=True, flush_at_top=flush_at_top))
    assert not v.passed and v.category == "scheduled_too_early", v
    assert v.message.startswith("round 0 (prefill"), v.message
    assert "for round 1's plan right after round 0's `launch_forward`" in v.message, v.message
    assert "before it processed round 0's step" in v.message, v.message
    assert "planned before the previous step was processed" in v.message, v.message
    assert "wasted" in v.message and "flushed" not in v.message, v.message


def test_a_a_decode_round_planned_before_the_step_deferred_is_named():
    v = checks.check_zos_loop(decode_early)
    assert not v.passed and v.category == "scheduled_too_early", v
    assert v.message.startswith("round 1 (decode"), v.message
    assert "for round 3's plan right after round 2's `launch_forward`" in v.message, v.message
    assert "before it processed round 1's step" in v.message, v.message


def test_a_planning_early_wastes_more_steps_than_the_lessons_loop():
    lesson = discarded(None)
    assert discarded(planning(early=True)) > lesson
    assert discarded(planning(early=False)) == lesson


@pytest.mark.parametrize("check", [checks.check_zos_loop, checks.check_serial_loop])
def test_c_a_caught_planned_since_is_scheduling_ahead(check):
    v = check(caught_planned_since)
    assert not v.passed and v.category == "scheduled_ahead", v
    assert v.message.startswith("round 1 (decode"), v.message
    assert "round 2's plan before it prepared round 1's" in v.message, v.message
    assert "`PlannedSince`" in v.message and "caught the error" in v.message, v.message
    assert "never prepared" not in v.message, v.message


@pytest.mark.parametrize("loop", [planning(early=False), planning(early=False, flush_at_top=True),
                                  right_zos_loop()], ids=["plans-before-sample", "flush-at-top",
                                                          "reference"])
def test_right_loops_pass(loop):
    v = checks.check_zos_loop(loop)
    assert v.passed, v.message
