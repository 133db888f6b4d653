"""Issue 34, round eleven (checks): a step kept in a global from another engine's interrupted
run was judged the checker's own round "processed 2 times" (the engine committed it, into the
other run's requests); check_round_gap told a constant 1.0 "cut or rounded to whole ms" for a
gap of 0.3, and printed a gap in seconds as "0.000 ms"; check_idle_fraction gave 0.32 for
0.3167 no rounding hint."""

from __future__ import annotations

import pytest

import toy_engine as te
from overlap_course import checks

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
