"""Issue 34, round twelve (the blind helper's cases 3, 4, 6, 8, 9, 11, 12, 13): a busy fraction
or a percentage that was also rounded was told only "rounded" (or nothing); the gap read off the
hover and written to two decimals, as notebook 02 asks, failed as "not the gap"; a gap in
microseconds was not named, and 0 ms was "close: rounded"; a double free through
`scheduler.free` passed exercise 05; a constraint tested by its name got the shipped verdict;
the host lane's launch names got a bare step mismatch; a whole float returned where an int is
used was told to "return a whole number"; the block's number at offset 0 was "you added the
offset"."""

from __future__ import annotations

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import readings
from toy_engine.races import RaceError
from toy_engine.timeline import Timeline, TimelineMeta

PROMPTS = ["Once upon a time", "The bird said", "There was a fox"]


@pytest.fixture(scope="module")
def serial_run():
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) as engine:
        engine.generate(PROMPTS, max_new_tokens=12)
        yield engine


def _idle(timeline):
    idle = sum(end - start for start, end in timeline.device_gaps())
    return idle / (idle + timeline.device_busy_ms())


# ---- case 3: check_idle_fraction, a named slip that is also rounded --------------------------

@pytest.mark.parametrize("digits", [0, 1])
def test_a_percentage_rounded_is_named_a_percentage(serial_run, digits):
    verdict = checks.check_idle_fraction(lambda tl: round(100 * _idle(tl), digits), serial_run)
    assert verdict.category == "percentage", verdict.message
    assert "a percentage" in verdict.message and "unrounded" in verdict.message, verdict.message


def test_the_busy_fraction_rounded_is_named_the_busy_fraction(serial_run):
    verdict = checks.check_idle_fraction(lambda tl: round(1 - _idle(tl), 3), serial_run)
    assert verdict.category == "busy_fraction", verdict.message
    assert "rounded to" in verdict.message and "unrounded" in verdict.message, verdict.message


def test_a_rounding_that_is_also_the_busy_fraction_rounded_names_both():
    """Round twelve's run: idle 0.5394, busy 0.4606; 0.5 is either rounded to 1 decimal."""
    slips = [("busy_fraction", 0.4606, "the busy fraction", "the idle fraction is ...", None)]
    verdict = readings.slip_reading(0.5, 0.5394, "the idle fraction", slips)
    assert verdict.category == "wrong_value", verdict.message
    assert "the busy fraction (0.4606) rounded to 1 decimal" in verdict.message, verdict.message
    assert "the idle fraction cut or rounded to 1 decimal" in verdict.message, verdict.message
    alone = readings.slip_reading(0.46, 0.5394, "the idle fraction", slips)
    assert alone.category == "busy_fraction", alone.message


# ---- case 4: check_round_gap, the hover's three decimals written to two ----------------------

def _hover_timeline():
    """Round 9 ends at 10.0004 ms (the hover: 10.000), round 10 starts at 10.3446 (10.345)."""
    tl = Timeline(meta=TimelineMeta(mode="serial", device="cpu-process"))
    t = 10.0004 - 1.56 * 10 - 0.39 * 9
    for rnd in range(13):
        if rnd == 10:
            t = 10.3446
        for stage, dur in (("upload", 0.04), ("forward", 1.3), ("sample", 0.2)):
            tl.add_device_ns(stage, rnd, tl.origin_ns + round(t * 1e6),
                             tl.origin_ns + round((t + dur) * 1e6), cpu_ns=round(dur * 1e6))
            t += dur + 0.01
        t += 0.38
    return tl


def test_the_hover_reading_written_to_two_decimals_passes():
    verdict = checks.check_round_gap(0.35, _hover_timeline(), round=10)  # 0.345, rounded up
    assert verdict.passed and "hover" in verdict.message, verdict.message
    assert checks.check_round_gap(0.34, _hover_timeline(), round=10).passed


def test_two_decimals_off_the_hover_reading_too_still_fail():
    assert not checks.check_round_gap(0.36, _hover_timeline(), round=10).passed
    assert not checks.check_round_gap(0.33, _hover_timeline(), round=10).passed


def test_the_hover_gives_readings_less_than_a_thousandth_off():
    assert readings.hover_gaps(0.3442) == [0.344, 0.345]
    assert readings.hover_gaps(1.366000000000001) == [1.366]


# ---- case 12: check_round_gap, microseconds and zero -----------------------------------------

def _gap_timeline(gap):
    tl = Timeline()
    t = 0.0
    for r in range(3):
        tl.add("device", "upload", r, t, t + 0.02)
        tl.add("device", "forward", r, t + 0.05, t + 3.0)
        tl.add("device", "sample", r, t + 3.0, t + 3.3)
        t += 3.3 + (gap if r == 1 else 0.61)
    return tl


@pytest.mark.parametrize("gap, answer, reads", [
    (0.3442, 344.2, "/1000 gives 0.3442 ms, the gap"), (0.3442, 344, "/1000 gives 0.344 ms"),
    (4.058, 4058.0, "/1000 gives 4.058 ms, the gap"),
    (4.058, 4000, "/1000 gives 4 ms, the gap cut or rounded to whole milliseconds")])
def test_a_gap_in_microseconds_is_named(gap, answer, reads):
    verdict = checks.check_round_gap(answer, _gap_timeline(gap), 2)
    assert verdict.category == "microseconds" and reads in verdict.message, verdict.message


@pytest.mark.parametrize("gap", [0.35, 0.8245, 2.3])
def test_zero_is_named_as_no_gap_not_as_a_rounding(gap):
    verdict = checks.check_round_gap(0, _gap_timeline(gap), 2)
    assert verdict.category == "no_gap", verdict.message
    assert "close" not in verdict.message and "int()" in verdict.message, verdict.message


# ---- case 6: a second scheduler.free is refused -----------------------------------------------

def _frees_twice(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
            engine.scheduler.free(req)


def test_exercise_05_names_a_double_free_through_the_scheduler():
    verdict = checks.check_process_outputs(_frees_twice)
    assert verdict.category == "double_free", verdict.message


@pytest.mark.parametrize("race_check", [True, False])
def test_the_scheduler_refuses_a_second_free_with_checking_on_or_off(race_check):
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=2, race_check=race_check)) as engine:
        with pytest.raises(RaceError, match="freed a second time") as info:
            engine.generate(PROMPTS, max_new_tokens=4, process_outputs=_frees_twice)
        assert info.value.kind == "double_free"
        again = engine.generate(PROMPTS, max_new_tokens=4)  # the engine is usable after it
        assert all(c.finish_reason == "length" for c in again)


def test_release_if_done_twice_and_a_free_of_a_waiting_request_do_nothing():
    def process(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
            engine.scheduler.release_if_done(req)
        for req in list(engine.scheduler.waiting):
            engine.scheduler.free(req)  # holds nothing: the shipped abort frees it so

    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=1)) as engine:
        want = [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=4)]
        got = engine.generate(PROMPTS, max_new_tokens=4, process_outputs=process)
        assert [c.token_ids for c in got] == want


# ---- case 8: before_sample testing the constraint by its name --------------------------------

def test_a_constraint_tested_by_its_name_is_named():
    def by_name(engine, plan, held):
        return len(held) if engine.constraint == "title_case" else 0

    verdict = checks.check_before_sample(by_name)
    assert verdict.category == "wrong_tokens", verdict.message
    assert "TitleCase" in verdict.message and "is not None" in verdict.message, verdict.message
    shipped = checks.check_before_sample(lambda engine, plan, held: 0)
    assert "TitleCase" not in shipped.message and "returned 0" not in shipped.message


# ---- case 9: check_three_rounds in the host lane's names --------------------------------------

ZOS_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
             ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]
HOST = {"forward": "launch_forward", "sample": "launch_sample"}


def test_the_host_lanes_names_are_named():
    verdict = checks.check_three_rounds([(HOST.get(s, s), r) for s, r in ZOS_ORDER])
    assert verdict.category == "host_names", verdict.message
    assert '"forward" and "sample"' in verdict.message and "engine's order" in verdict.message


def test_the_host_lanes_names_in_a_wrong_order_name_both():
    serial = [("forward", 1), ("sample", 1), ("postprocess", 1)] + ZOS_ORDER[3:]
    verdict = checks.check_three_rounds([(HOST.get(s, s), r) for s, r in serial])
    assert verdict.category == "host_names", verdict.message
    # steps counted from 1 since round 43: the third entry is "step 3"
    assert '"forward" and "sample"' in verdict.message and "step 3" in verdict.message


# ---- case 11: a whole float where the loop needs an int ----------------------------------------

@pytest.mark.parametrize("verdict", [
    lambda: checks.check_ring_slots(lambda depth: depth + 1.0),
    lambda: checks.check_future_key(lambda req, b: float(req.row)),
    lambda: checks.check_before_sample(lambda engine, plan, held: float(len(held)))],
    ids=["ring_slots", "key", "before_sample"])
def test_a_whole_float_is_told_it_must_be_an_int(verdict):
    got = verdict()
    assert got.category == "shape", got.message
    assert "a float" in got.message and "must be an int" in got.message, got.message
    assert "int(...)" in got.message, got.message


# ---- case 13: check_slot, the block's number at offset 0 ------------------------------------

def test_the_blocks_number_at_offset_zero_is_the_blocks_number():
    verdict = checks.check_slot(6, table=[3, 8, 6, 1], pos=8, block_size=4, name="second_slot")
    assert verdict.category == "block_number", verdict.message
    assert checks.check_slot(9, table=[5, 2, 9], pos=9, block_size=4).category == "block_number"
    added = checks.check_slot(10, table=[5, 2, 9], pos=9, block_size=4)
    assert added.category == "offset_on_block_number", added.message
