"""Round nineteen's second engine cases: a process_outputs plug-in that changes its step's slot
or event around the set-once guard (object.__setattr__, vars(step), step.__dict__) got another
round's tokens with no error; one that changed step.plan.round was told launch_sample ran
twice (or, with a round never planned, its commit went unchecked); one that called
engine.process_outputs, the stage it replaces, died of a RecursionError 1000 frames deep."""
import dataclasses

import pytest

from toy_engine.run import StageInPlugin
from loops_for_tests import engine_per_mode, processed_by_hand

PROMPTS = ["Once upon", "The king"]


engine = engine_per_mode(PROMPTS)


def _refill(step, **changed):
    fields = {**vars(step), **changed}
    step.__dict__.clear()
    step.__dict__.update(fields)


BYPASSES = {
    "object.__setattr__": lambda step: object.__setattr__(step, "slot", (step.slot + 1) % 2),
    "vars": lambda step: vars(step).__setitem__("slot", (step.slot + 1) % 2),
    "__dict__ refilled": lambda step: _refill(step, slot=(step.slot + 1) % 2),
}


@pytest.mark.parametrize("how", BYPASSES)
def test_a_slot_changed_around_the_set_once_guard_is_refused_where_the_tokens_are_read(
        engine, how):
    def po(eng, step):
        BYPASSES[how](step)
        processed_by_hand(eng, step)
    with pytest.raises(ValueError) as err:
        engine.generate(PROMPTS, 20, process_outputs=po)
    assert str(err.value).startswith(
        "process_outputs=po gave engine.read_outputs() round 0's step with step.slot changed "
        "from 0 to 1 since engine.launch_sample(inputs) made it")
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_an_event_or_plan_swapped_in_or_a_replaced_step_is_refused_never_read(engine):
    kept = []

    def event(eng, step):  # the previous round's event: its wait says nothing of this sample
        kept.append(step)
        if len(kept) > 1:
            vars(step)["sample_done"] = kept[-2].sample_done
        processed_by_hand(eng, step)
    with pytest.raises(ValueError, match=r"^process_outputs=event gave engine\.read_outputs\(\) "
                                         r"round 1's step with step\.sample_done replaced"):
        engine.generate(PROMPTS, 20, process_outputs=event)

    def copied(eng, step):
        processed_by_hand(eng, dataclasses.replace(step, slot=1 - step.slot))
    with pytest.raises(ValueError, match=r"^process_outputs=copied gave engine\.read_outputs\(\) "
                                         r"a StepState that engine\.launch_sample\(inputs\) did "
                                         r"not return \(a copy, dataclasses\.replace\(\)"):
        engine.generate(PROMPTS, 20, process_outputs=copied)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_a_loop_changing_its_inputs_slot_around_the_guard_is_refused_before_the_launch(engine):
    def loop(eng):
        plan = eng.schedule()
        inputs = eng.prepare_inputs(plan)
        object.__setattr__(inputs, "slot", 1)
        eng.launch_forward(inputs)
    with pytest.raises(ValueError, match=r"^loop=loop gave engine\.launch_forward\(\) round 0's "
                                         r"inputs with inputs\.slot changed from 0 to 1"):
        engine.generate(PROMPTS, 20, loop=loop)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_a_loop_marking_its_inputs_forwarded_itself_is_refused_not_sampled_on_old_logits(
        engine):
    def loop(eng):
        inputs = eng.prepare_inputs(eng.schedule())
        vars(inputs)["forwarded"] = True  # the engine's flag: no forward was launched
        eng.launch_sample(inputs)
    with pytest.raises(ValueError, match=r"^loop=loop gave engine\.launch_sample\(\) round 0's "
                                         r"inputs with inputs\.forwarded changed from False to "
                                         r"True since engine\.prepare_inputs\(plan\) made it"):
        engine.generate(PROMPTS, 20, loop=loop)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


@pytest.mark.parametrize("new", [-1, 10**6])
def test_a_plugin_setting_plan_round_is_refused_by_name_not_blamed_on_launch_sample(
        engine, new):
    def po(eng, step):
        if step.plan.round > 2:
            step.plan.round = step.plan.round + new if new < 0 else new
        processed_by_hand(eng, step)
    with pytest.raises(AttributeError) as err:
        engine.generate(PROMPTS, 20, process_outputs=po)
    msg = str(err.value)
    assert msg.startswith(f"process_outputs=po set plan.round of round 3 to "
                          f"{2 if new < 0 else new}: a plan's round and kind are the engine's")
    assert "more than once" not in msg
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


@pytest.mark.parametrize("new", [2, 10**6])
def test_plan_round_changed_around_its_guard_is_refused_at_the_commit_by_the_runs_record(
        engine, new):
    """Round twenty: every stage that reads the plan checks it, so read_outputs (before the
    commit) refuses it now."""
    def po(eng, step):
        if step.plan.round == 3:
            object.__setattr__(step.plan, "round", new)
        processed_by_hand(eng, step)
    with pytest.raises(ValueError) as err:
        engine.generate(PROMPTS, 20, process_outputs=po)
    msg = str(err.value)
    assert msg.startswith(f"read_outputs was given round 3's step, its plan changed since "
                          f"engine.schedule() returned it (plan.round changed from 3 to {new}, "
                          f"around Plan's guard (object.__setattr__ or vars()), by "
                          f"process_outputs=po or before")
    assert "more than once" not in msg
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_a_plugin_setting_plan_is_prefill_is_refused_by_name(engine):
    def po(eng, step):
        step.plan.is_prefill = not step.plan.is_prefill
    with pytest.raises(AttributeError, match=r"^process_outputs=po set plan\.is_prefill of "
                                             r"round 0 to False"):
        engine.generate(PROMPTS, 20, process_outputs=po)


def test_a_plugin_calling_the_stage_it_replaces_is_refused_by_name_not_recursion(engine):
    def po(eng, step):
        eng.process_outputs(step)
    with pytest.raises(StageInPlugin) as err:
        engine.generate(PROMPTS, 20, process_outputs=po)
    assert err.value.stage == "process_outputs"
    msg = str(err.value)
    assert msg.startswith("engine.process_outputs() was called from inside the plug-in "
                          "process_outputs=po, the stage it replaces")
    assert "engine.commit_outputs(step, out)" in msg and "engine.read_outputs(step)" in msg
    assert [r.finish_reason for r in engine.requests] == ["abort", "abort"]
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_the_engines_own_process_outputs_and_a_plugin_calling_the_stages_still_run(engine):
    done = engine.generate(PROMPTS, 20, process_outputs=processed_by_hand)
    assert [c.text for c in done] == engine.want
