"""Round fifteen's engine cases 01 and 02, and the blind case A (issue 34): a plan prepared
again, or one another engine's run scheduled, is refused by prepare_inputs by name (before: a
false "launch_sample was called more than once", and another run's requests handed this
engine's tokens silently); a round prepared and never launched is named as such (before: "still
wait for launched rounds ...; was a deferred step dropped", and the checks showed the engine's
code "unprocessed_inflight")."""

import pytest

from overlap_course import checks
from toy_engine.config import EngineConfig
from toy_engine.engine import Engine
from toy_engine import run

PROMPTS = ["Once upon", "There was", "The cat sat"]


@pytest.fixture(scope="module")
def engine():
    with Engine(EngineConfig(mode="serial", max_batch_size=3)) as eng:
        yield eng


def _round(engine, plan):
    inputs = engine.prepare_inputs(plan)
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))


def _keeps_round_2s_plan(engine):
    """Round 3 prepares the plan kept from round 2 (a variable re-used), not schedule()'s."""
    old = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        _round(engine, old if plan.round == 3 else plan)
        old = plan


def _prepares_twice(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        engine.prepare_inputs(plan)
        _round(engine, plan)


# ------------------------------------------------------------ 01: a plan prepared again

def test_01_a_kept_plan_prepared_again_is_refused_naming_the_round_that_never_ran(engine):
    reference = [c.text for c in engine.generate(PROMPTS, 12)]
    with pytest.raises(run.PreparedTwice, match=r"prepare_inputs was given round 2's plan, which "
                       r"was already prepared and its round ran .* returned round 3's plan "
                       r"since, and that plan never runs") as caught:
        engine.generate(PROMPTS, 12, loop=_keeps_round_2s_plan)
    assert "more than once" not in str(caught.value)
    assert [c.text for c in engine.generate(PROMPTS, 12)] == reference


def test_01_the_same_plan_prepared_twice_is_refused_before_its_slot_is_rewritten(engine):
    with pytest.raises(run.PreparedTwice, match=r"round 0's plan, which was already prepared\. "
                       r"Prepare each plan once"):
        engine.generate(PROMPTS, 12, loop=_prepares_twice)


def test_01_check_serial_loop_says_the_kept_plan_left_round_3s_unrun():
    verdict = checks.check_serial_loop(_keeps_round_2s_plan)
    assert verdict.category == "prepared_twice", verdict.message
    assert "round 3's plan never ran" in verdict.message
    assert "launch_sample" not in verdict.message.split("(")[0]
    assert checks.check_serial_loop(_prepares_twice).category == "prepared_twice"


# ------------------------------------------------- 02: a plan of another engine's run

def test_02_another_engines_running_plan_is_refused_and_both_engines_go_on(engine):
    with Engine(EngineConfig(mode="serial", max_batch_size=3)) as other:
        ref, ref_other = ([c.text for c in e.generate(PROMPTS, 8)] for e in (engine, other))
        seen = {}

        def loop_other(eng):  # prepares the global plan: the first engine's
            before = [(len(r.output_ids), r.num_inflight) for r in seen["plan"].requests]
            with pytest.raises(run.ForeignStep, match=r"round 3's plan was scheduled by another run "
                               r".* or one still going on another engine") as caught:
                eng.prepare_inputs(seen["plan"])
            seen["refused"] = caught.value
            assert [(len(r.output_ids), r.num_inflight) for r in seen["plan"].requests] == before
            _round_loop(eng)

        def loop(eng):
            while eng.scheduler.has_work():
                plan = eng.schedule()
                if plan is not None and plan.round == 3 and "plan" not in seen:
                    seen["plan"] = plan
                    assert [c.text for c in other.generate(PROMPTS, 8, loop=loop_other)] == \
                        ref_other
                if plan is not None:
                    _round(eng, plan)

        assert [c.text for c in engine.generate(PROMPTS, 8, loop=loop)] == ref
        assert seen["refused"].what == "plan"
        assert [c.text for c in other.generate(PROMPTS, 8)] == ref_other


def _round_loop(eng):
    while eng.scheduler.has_work():
        plan = eng.schedule()
        if plan is not None:
            _round(eng, plan)


KEPT = {}


def _keeps_a_plan_across_runs(engine):
    """A plan kept in a global, from the check's earlier run, prepared in its next one."""
    plan = engine.schedule()
    if "plan" in KEPT:
        plan = KEPT["plan"]
    KEPT["plan"] = plan
    _round(engine, plan)
    _round_loop(engine)


def test_02_check_serial_loop_names_a_plan_kept_from_another_run():
    KEPT.clear()
    verdict = checks.check_serial_loop(_keeps_a_plan_across_runs)
    assert verdict.category == "foreign_step", verdict.message
    assert "prepared round 0's plan, which this run never scheduled" in verdict.message


# ------------------------------------------- A: a round prepared and never launched

def _prepares_only(engine):
    engine.prepare_inputs(engine.schedule())


def _forward_only(engine):
    engine.launch_forward(engine.prepare_inputs(engine.schedule()))


def _swallows_sample_before_forward(engine):
    while engine.scheduler.has_work():
        try:
            inputs = engine.prepare_inputs(engine.schedule())
            step = engine.launch_sample(inputs)
            engine.launch_forward(inputs)
            engine.process_outputs(step)
        except Exception:  # noqa: BLE001 - the learner's mistake under test
            break


@pytest.mark.parametrize("loop", [_prepares_only, _forward_only,
                                  _swallows_sample_before_forward])
def test_A_the_stall_names_the_round_prepared_and_never_launched(engine, loop):
    with pytest.raises(run.EngineStalled) as caught:
        engine.generate(PROMPTS, 8, loop=loop)
    message = str(caught.value)
    assert "round 0's plan was prepared but its sample never launched" in message
    assert "deferred step" not in message and "launched rounds" not in message
    with pytest.raises(run.EngineStalled, match=r"prompt 0 still counts a round"):
        engine.generate(PROMPTS[:1], 8, loop=loop)
    assert len(engine.generate(PROMPTS, 8)) == 3


@pytest.mark.parametrize("check", [checks.check_serial_loop, checks.check_zos_loop])
@pytest.mark.parametrize("loop, forward", [(_prepares_only, False), (_forward_only, True),
                                           (_swallows_sample_before_forward, False)])
def test_A_the_checks_name_it_without_the_engines_code(check, loop, forward):
    verdict = check(loop)
    assert verdict.category == "never_launched", verdict.message
    assert "round 0 (prefill, prompts [0, 1, 2]) was prepared but never launched" in \
        verdict.message
    assert ("its forward launched but never its sample" in verdict.message) == forward
    for wrong in ("unprocessed_inflight", "deferred step", "launched rounds whose results"):
        assert wrong not in verdict.message
