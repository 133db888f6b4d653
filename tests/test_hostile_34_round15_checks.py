"""Round fifteen, checks15: a stage called on another engine that is open and idle (named at the
call, in every check that hands out an engine), a before_sample that waits for the device
itself, a ring_slots that changes past its first calls, and a fraction given as a percentage."""

import time

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import lesson07b, pool

import loops_for_tests

GLOBAL = {}


def _open_engine():
    """The notebook's cell-15 engine: open, idle, after a generate."""
    engine = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
    engine.generate(["Once upon a time"], max_new_tokens=4)
    return engine


def _zos_loop(schedule_on_global: bool):
    def zos_loop(eng):
        engine = GLOBAL["engine"]
        previous = None
        while (eng if schedule_on_global else engine).scheduler.has_work():
            plan = (engine if schedule_on_global else eng).schedule()
            if plan is None:
                previous = eng.flush(previous)
                continue
            inputs = eng.prepare_inputs(plan)
            if previous is not None:
                eng.correct_on_device(inputs)
            eng.launch_forward(inputs)
            if previous is not None:
                eng.process_outputs(previous)
                previous = None
            step = eng.launch_sample(inputs)
            if plan.is_prefill:
                eng.process_outputs(step)
            else:
                previous = step
    return zos_loop


def test_a_stage_on_the_open_idle_global_engine_is_named_at_once():
    GLOBAL["engine"] = engine = _open_engine()
    try:
        start = time.monotonic()
        verdict = checks.check_zos_loop(_zos_loop(schedule_on_global=True))
        took = time.monotonic() - start
        has_work = checks.check_zos_loop(_zos_loop(schedule_on_global=False))
    finally:
        engine.close()
    assert verdict.category == "other_engine", verdict.message
    assert "`.schedule(...)` on an engine other than the one the check gave it (`eng`)" in \
        verdict.message
    assert "a closed one" not in verdict.message
    assert took < 20, f"{took:.0f} s: named at the call, not at the time limit"
    assert has_work.category == "other_engine", has_work.message
    assert "`.scheduler.has_work(...)`" in has_work.message
    assert "round 0" not in has_work.message


def test_an_abort_that_calls_the_global_engine_is_named_so_too():
    GLOBAL["engine"] = engine = _open_engine()

    def abort(eng, request_id):
        GLOBAL["engine"].abort(request_id)
    try:
        verdict = checks.check_abort(abort)
    finally:
        engine.close()
    assert verdict.category == "other_engine", verdict.message
    assert "`.abort(...)`" in verdict.message and "(`eng`)" in verdict.message


def test_the_right_loop_still_passes_with_a_global_engine_about():
    GLOBAL["engine"] = engine = _open_engine()

    def finish(eng, step):
        assert GLOBAL["engine"].scheduler is not eng.scheduler  # reading is no stage called
        eng.process_outputs(step)
    zos_loop = loops_for_tests.zos_loop(finish=finish)
    try:
        verdict = checks.check_zos_loop(zos_loop)
    finally:
        engine.close()
    assert verdict.passed, verdict.message


def _waits_then_zero(engine, plan, held):
    if engine.constraint is None:
        for h in held:
            engine.device.wait(h.sample_done)
        return 0
    return len(held)


def _waits_on_what_it_returns(engine, plan, held):
    if engine.constraint is None:
        return 0
    for h in held:
        engine.device.wait(h.sample_done)
    return len(held)


def _synchronizes(engine, plan, held):
    if engine.constraint is None:
        return 0
    engine.device.synchronize()
    return len(held)


def test_a_before_sample_that_waits_for_the_device_itself_is_named():
    verdict = checks.check_before_sample(_waits_then_zero)
    assert verdict.category == "serializes", verdict.message
    assert "no constraint" in verdict.message and "waited for the device itself" in verdict.message
    assert "the host waits only for what the sampler reads" not in verdict.message
    synced = checks.check_before_sample(_synchronizes)
    assert synced.category == "serializes", synced.message
    assert "title case" in synced.message
    assert checks.check_before_sample(_waits_on_what_it_returns).passed


def test_ring_slots_that_changes_after_two_calls_fails_and_names_the_change():
    seen = {}

    def ring_slots(depth):
        seen[depth] = seen.get(depth, 0) + 1
        return depth + 1 if seen[depth] <= 2 else depth
    first = checks.check_ring_slots(ring_slots)
    assert first.category == "keeps_state", first.message
    assert "earlier in this check" in first.message


def test_a_change_across_two_checks_of_the_same_function_is_named():
    calls = [0]

    def ring_slots(depth):
        calls[0] += 1
        return depth + 1 if calls[0] <= 63 else depth  # one check asks 63 times at most
    assert checks.check_ring_slots(ring_slots).passed
    second = checks.check_ring_slots(ring_slots)
    assert second.category == "keeps_state", second.message
    assert "in an earlier check" in second.message


def test_an_idle_fraction_given_as_a_percentage_says_so():
    engine = pool.engine()
    engine.generate(pool.PROMPTS[:2], max_new_tokens=6, loop=te.loops.serial_loop)
    idle = engine.stats.device_idle_fraction
    busy_percent = checks.check_idle_fraction(lambda t: 100 * (1 - idle), engine)
    assert busy_percent.category == "percentage", busy_percent.message
    assert "busy fraction as a percentage" in busy_percent.message
    assert "from 0 to 1" in busy_percent.message
    other = checks.check_idle_fraction(lambda t: 37.5, engine)
    assert other.category == "percentage", other.message
    assert "looks like a percentage" in other.message and "from 0 to 1" in other.message
    assert checks.check_idle_fraction(lambda t: 0.0375, engine).category != "percentage"


def test_the_queue_runs_still_cover_both_constraints():
    assert {c for c, _, _ in lesson07b.QUEUE_RUNS} == {True, False}
