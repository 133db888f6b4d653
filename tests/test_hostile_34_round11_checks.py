"""Issue 34, round eleven (checks): a step kept in a global from another engine's interrupted
run was judged the checker's own round "processed 2 times" (the engine committed it, into the
other run's requests); check_round_gap told a constant 1.0 "cut or rounded to whole ms" for a
gap of 0.3, and printed a gap in seconds as "0.000 ms"; check_idle_fraction gave 0.32 for
0.3167 no rounding hint."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import toy_engine as te
from overlap_course import checks
from toy_engine.timeline import Timeline

# ---- blind3: a StepState of another run ----------------------------------------------------


class _Stop(Exception):
    """Stands in for a Ctrl-C in the middle of a run."""


def _zos_loop_keeping(state: dict, stop_at: int | None = None):
    """The reference ZOS loop, but `previous` lives in ``state`` (a learner's global) between
    runs; ``stop_at``: the run stops after launching that round, its step left in ``state``."""
    def loop(engine):
        previous = state["previous"]
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = state["previous"] = engine.flush(previous)
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None:
                engine.process_outputs(previous)
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
                previous = None
            else:
                previous = current
            state["previous"] = previous
            if plan.round == stop_at:
                raise _Stop
    return loop


def _interrupted(engine, state: dict, stop_at: int = 3) -> te.StepState:
    with pytest.raises(_Stop):
        engine.generate(["Once upon a time", "The cat"], max_new_tokens=8,
                        loop=_zos_loop_keeping(state, stop_at))
    assert state["previous"] is not None and state["previous"].plan.round == stop_at
    return state["previous"]


def test_a_step_left_by_another_engines_interrupted_run_is_named_foreign():
    state = {"previous": None}
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as other:
        _interrupted(other, state)
        verdict = checks.check_zos_loop(_zos_loop_keeping(state))
    assert verdict.category == "foreign_step", verdict.message
    assert "processed 2 times" not in verdict.message
    assert "round 3's StepState" in verdict.message and "another run" in verdict.message
    state["previous"] = None  # the same loop, its global cleared: right
    assert checks.check_zos_loop(_zos_loop_keeping(state)).passed


def test_the_engine_refuses_a_step_of_its_own_earlier_run_and_leaves_that_run_alone():
    state = {"previous": None}
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as engine:
        stale = _interrupted(engine, state)
        inflight = [r.num_inflight for r in stale.plan.requests]
        with pytest.raises(RuntimeError, match="launched by another run") as err:
            engine.generate(["Max"], max_new_tokens=4, loop=_zos_loop_keeping(state))
        assert type(err.value).__name__ == "ForeignStep" and err.value.round == 3
        assert "previous = None" in str(err.value)
        assert [r.num_inflight for r in stale.plan.requests] == inflight  # nothing committed
        assert not stale.committed
        assert engine.generate(["Max"], max_new_tokens=4)[0].finish_reason == "length"


def test_commit_outputs_refuses_a_step_of_another_run_too():
    state = {"previous": None}
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as engine:
        stale = _interrupted(engine, state)

        def inline(engine):  # the processing written out: the commit itself refuses it
            engine.commit_outputs(stale, [0] * 16)
        with pytest.raises(RuntimeError, match="launched by another run"):
            engine.generate(["Max"], max_new_tokens=4, loop=inline)
        assert not stale.committed


# ---- quick-blind a, b: check_round_gap -------------------------------------------------------

def _timeline_with_gap(gap, gap_before_round_1=0.61):
    """Round 2's gap is ``gap``; the others ``gap_before_round_1`` (tests/test_practice.py's)."""
    tl = Timeline()
    t = 0.0
    for r in range(3):
        tl.add("device", "upload", r, t, t + 0.02)
        tl.add("device", "forward", r, t + 0.05, t + 3.0)
        tl.add("device", "sample", r, t + 3.0, t + 3.3)
        t += 3.3 + (gap if r == 1 else gap_before_round_1)
    return tl


@pytest.mark.parametrize("gap", [0.3167, 0.42, 0.45, 2.3])
def test_one_ms_is_not_a_cut_or_rounded_gap_that_is_neither(gap):
    verdict = checks.check_round_gap(1.0, _timeline_with_gap(gap), 2)
    assert verdict.category == "wrong", verdict.message
    assert "whole milliseconds" not in verdict.message


@pytest.mark.parametrize("gap, answer, how", [
    (1.366, 1.0, "cut or rounded to whole milliseconds"), (1.766, 1.0, "cut to whole milliseconds"),
    (1.566, 2, "rounded to whole milliseconds"),
    (1.366, 1.36, "cut to 2 decimals"), (1.366, 1.4, "rounded to 1 decimal"),
    (0.8245, 0.8, "cut or rounded to 1 decimal")])
def test_a_gap_cut_or_rounded_is_told_which(gap, answer, how):
    verdict = checks.check_round_gap(answer, _timeline_with_gap(gap), 2)
    assert verdict.category == "too_few_digits" and how in verdict.message, verdict.message


@pytest.mark.parametrize("gap, answer, reads", [
    (0.8245, 0.0008245, "x1000 gives 0.8245 ms, the gap"),
    (0.4245, 0.0004245, "x1000 gives 0.4245 ms, the gap"),
    (0.8245, 0.0008, "x1000 gives 0.8 ms, the gap cut or rounded to 1 decimal"),
    (0.8245, 0.00082, "x1000 gives 0.82 ms, the gap"),
    (0.4245, np.float32(0.0004245), "the gap"),
    (12.3456, 0.0123456, "x1000 gives 12.3456 ms, the gap")])
def test_a_gap_in_seconds_is_named_with_its_value_in_ms(gap, answer, reads):
    verdict = checks.check_round_gap(answer, _timeline_with_gap(gap), 2)
    assert verdict.category == "seconds" and reads in verdict.message, verdict.message
    assert "0.000 ms" not in verdict.message and "0.001 ms" not in verdict.message


@pytest.mark.parametrize("gap", [0.3167, 0.4245, 0.8204, 0.8245, 0.9951, 1.366, 2.0049, 12.3456])
def test_right_readings_of_the_gap_pass(gap):
    """Exact, to 3 or 2 decimals, as float32, tensor, list, Fraction: all within the rule."""
    tl = _timeline_with_gap(gap)
    want = checks.lesson02.round_extent(tl)[0][2] - checks.lesson02.round_extent(tl)[1][1]
    for answer in (want, round(want, 3), round(want, 2), np.float32(want),
                   np.float32(round(want, 2)), torch.tensor(round(want, 2)), [round(want, 2)],
                   Fraction(f"{want:.2f}"), round(want, 2) + 0.004, round(want, 2) - 0.004,
                   math.floor(want * 1000) / 1000):
        if abs(float(answer[0] if isinstance(answer, list) else answer) - want) <= 0.005:
            verdict = checks.check_round_gap(answer, tl, 2)
            assert verdict.passed, (gap, answer, verdict.message)


def test_the_neighbouring_gap_to_more_digits_is_still_named():
    """ca52443 and 2d19056: the rule's two decimals pass, the other gap to more digits does not."""
    tl = _timeline_with_gap(0.8234, gap_before_round_1=0.8204)
    assert checks.check_round_gap(0.82, tl, 2).passed
    assert checks.check_round_gap(0.8204, tl, 2).category == "wrong_round"


# ---- quick-blind c: check_idle_fraction ------------------------------------------------------

@pytest.fixture(scope="module")
def serial_run():
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) as engine:
        engine.generate(["Once upon a time", "The bird said", "There was a fox"], max_new_tokens=12)
        yield engine


def _idle(timeline):
    idle = sum(end - start for start, end in timeline.device_gaps())
    return idle / (idle + timeline.device_busy_ms())


@pytest.mark.parametrize("digits", [1, 2, 3])
@pytest.mark.parametrize("how", ["rounded", "cut"])
def test_an_idle_fraction_rounded_or_cut_to_few_decimals_gets_the_rounding_hint(
        serial_run, digits, how):
    def answer(timeline):
        value = _idle(timeline)
        return round(value, digits) if how == "rounded" else math.trunc(value * 10**digits) / 10**digits
    verdict = checks.check_idle_fraction(answer, serial_run)
    assert verdict.category == "wrong_value", verdict.message
    assert how in verdict.message and "return it unrounded" in verdict.message.lower(), \
        verdict.message


@pytest.mark.parametrize("constant", [0, 0.0, 1.0, 0.987654])
def test_an_idle_fraction_that_is_no_rounding_gets_no_rounding_hint(serial_run, constant):
    verdict = checks.check_idle_fraction(lambda timeline: constant, serial_run)
    assert not verdict.passed and "rounded" not in verdict.message, verdict.message


@pytest.mark.parametrize("answer", [
    _idle, lambda tl: np.float64(_idle(tl)), lambda tl: torch.tensor(_idle(tl), dtype=torch.float64),
    lambda tl: round(_idle(tl), 7), lambda tl: float(np.float32(_idle(tl)))],
    ids=["float", "np.float64", "tensor", "7 decimals", "float32"])
def test_right_idle_fractions_pass(serial_run, answer):
    assert checks.check_idle_fraction(answer, serial_run).passed
