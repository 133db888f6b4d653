"""Issue 34, round thirty-two (exercise 03): three ZOS loops told another mistake than theirs.

a: a loop that takes two plans and runs the newer one first (the older one later) was told
"round 1 ... was scheduled but never prepared or launched" (it does run it, or tries to), or,
running the two of each pair in swapped order, that round 2's sample came before round 1's
postprocess. ``host_order.dropped_plan`` (now ``plan_order.plan_order``) looked only for plans
never prepared; it now reads every ``prepare_inputs`` call, refused ones too, and names a plan
prepared after a later one: plans run in the order ``schedule()`` returns them.
b: a decode plan dropped with ``continue`` after ``prepare_inputs`` or after ``launch_forward``
was blamed on the round before it ("round 3 ... its step was never waited for and processed,
and round 5 reuses its host buffer"): the race now names round 4, prepared (its forward
launched) but its sample never launched and its step never processed.
c: a loop that calls ``schedule()`` for round N+1 before preparing round N (then runs every plan
once, in order) was told "round 23 ... was flushed before round 24 was even scheduled"; its
round N is prepared as if round N+1 were launched already (the engine gave other text; since
round 33 it refuses the plan: ``PlannedSince``). It is now told it scheduled ahead, naming the
first two rounds.

Right loops pass: the reference ZOS loop, and one that keeps its plans in a queue, in order."""

from __future__ import annotations

import pytest

from loops_for_tests import zos_loop as right_zos_loop
from overlap_course import checks


def _run(engine, plan, previous):
    """One round of the ZOS loop for ``plan``; returns the new ``previous``."""
    inputs = engine.prepare_inputs(plan)
    if previous is not None:
        engine.correct_on_device(inputs)
    engine.launch_forward(inputs)
    if previous is not None:
        engine.process_outputs(previous)
    step = engine.launch_sample(inputs)
    if plan.is_prefill:
        engine.process_outputs(step)
        return None
    return step


def stash_older(engine):
    """Wrong: takes two decode plans, runs the newer one and keeps the older one for later."""
    previous, stash = None, None
    while engine.scheduler.has_work() or stash is not None:
        plan, stash = (stash if stash is not None else engine.schedule()), None
        if plan is not None and not plan.is_prefill and engine.scheduler.has_work():
            nxt = engine.schedule()
            if nxt is not None:
                plan, stash = nxt, plan
        if plan is None:
            previous = engine.flush(previous)
            continue
        previous = _run(engine, plan, previous)


def swapped_pairs(engine):
    """Wrong: takes two decode plans and runs them newer first."""
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        nxt = engine.schedule() if not plan.is_prefill else None
        if nxt is not None:
            previous = _run(engine, nxt, previous)
        previous = _run(engine, plan, previous)


def in_order_queue(engine):
    """Right: plans kept in a queue, each run before the next is asked for."""
    previous, queue = None, []
    while engine.scheduler.has_work():
        queue.append(engine.schedule())
        plan = queue.pop(0)
        if plan is None:
            previous = engine.flush(previous)
            continue
        previous = _run(engine, plan, previous)


def dropped_after(where):
    """Wrong: round 4 (decode) dropped with ``continue`` after its prepare or its forward."""
    def zos_loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            inputs = engine.prepare_inputs(plan)
            if where == "prepare" and plan.round == 4:
                continue
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if where == "forward" and plan.round == 4:
                continue
            if previous is not None:
                engine.process_outputs(previous)
            step = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(step)
                previous = None
            else:
                previous = step
    return zos_loop


def scheduled_ahead(engine):
    """Wrong: asks for the next decode plan before preparing this one, then runs each in order."""
    previous, queue = None, []
    while engine.scheduler.has_work() or queue:
        if not queue:
            queue.append(engine.schedule())
        plan = queue.pop(0)
        if plan is not None and not plan.is_prefill and engine.scheduler.has_work():
            queue.append(engine.schedule())
        if plan is None:
            previous = engine.flush(previous)
            continue
        previous = _run(engine, plan, previous)


@pytest.mark.parametrize("loop", [stash_older, swapped_pairs])
def test_a_plans_run_out_of_order_are_named_with_both_rounds(loop):
    v = checks.check_zos_loop(loop)
    assert not v.passed and v.category == "out_of_order", v
    assert v.message.startswith("round 1 (decode"), v.message
    assert "only after round 2's" in v.message, v.message
    assert "in the order `engine.schedule()` returns them" in v.message, v.message
    assert "never prepared" not in v.message and "postprocess" not in v.message, v.message


@pytest.mark.parametrize("where", ["prepare", "forward"])
def test_b_a_plan_dropped_after_its_prepare_is_named_not_the_round_before(where):
    v = checks.check_zos_loop(dropped_after(where))
    assert not v.passed and v.category == "never_launched", v
    assert v.message.startswith("round 4 (decode"), v.message
    assert "its step never processed" in v.message, v.message
    assert ("its forward launched but never its sample" in v.message) == (where == "forward")
    assert "round 3's step, deferred under it" in v.message and "`meta1`" in v.message


def test_c_scheduling_ahead_is_named_not_a_flush():
    v = checks.check_zos_loop(scheduled_ahead)
    assert not v.passed and v.category == "scheduled_ahead", v
    assert v.message.startswith("round 1 (decode"), v.message
    assert "round 2's plan before it prepared round 1's" in v.message, v.message
    assert "flush" not in v.message, v.message


@pytest.mark.parametrize("loop", [right_zos_loop(), in_order_queue])
def test_right_loops_pass(loop):
    v = checks.check_zos_loop(loop)
    assert v.passed, v.message
