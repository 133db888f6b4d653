"""Round twenty's engine cases: a StepState or Plan whose __class__ a plug-in swapped for a
subclass (a `slot` property, a lying snapshot()) had its code run by the stages, which read
another slot or trusted the lie: wrong tokens, no error; a plan changed around launch_sample (its
requests reordered, is_prefill flipped) was checked only in prepare and commit: a constraint's
masks for the wrong requests, or a BadOutputs blaming the outputs.  And the run's record of its
rounds lived until the next generate (~2.3 KB a round): now only while a round is in flight,
and after while the learner keeps its objects."""
import copy
import gc
import weakref

import pytest

import toy_engine as te
from toy_engine.refusals import PreparedTwice, StepProcessedTwice
from toy_engine.run import StepState
from toy_engine.scheduler import Plan
from loops_for_tests import engine_per_mode, processed_by_hand

PROMPTS = ["Once upon", "The king"]


engine = engine_per_mode(PROMPTS)


class OtherSlot(StepState):
    @property
    def slot(self):
        return (vars(self)["slot"] + 1) % 2


def test_a_step_whose_class_was_swapped_is_refused_by_name_never_read(engine):
    def po(eng, step):
        step.__class__ = OtherSlot
        processed_by_hand(eng, step)
    with pytest.raises(TypeError) as err:
        engine.generate(PROMPTS, 20, process_outputs=po)
    assert str(err.value).startswith(
        "read_outputs takes the StepState that engine.launch_sample(inputs) returned, got a "
        "OtherSlot, a subclass of it (step.__class__ changed")
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


class LyingPlan(Plan):
    def snapshot(self):
        return vars(self)["_snap"]


def test_a_plan_whose_class_was_swapped_is_refused_by_name_not_asked(engine):
    def po(eng, step):
        plan = step.plan
        vars(plan)["_snap"] = plan.snapshot()
        plan.__class__ = LyingPlan
        plan.requests.reverse()
        processed_by_hand(eng, step)
    with pytest.raises(ValueError) as err:
        engine.generate(PROMPTS, 20, process_outputs=po)
    assert str(err.value).startswith(
        "read_outputs was given round 0's step, its plan changed since engine.schedule() "
        "returned it (plan.__class__ changed from Plan to LyingPlan, by process_outputs=po")
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def _around_sample(change, undo):
    """A loop that changes the plan just before launch_sample and undoes it just after."""
    def loop(engine):
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                continue
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            change(plan)
            step = engine.launch_sample(inputs)
            undo(plan)
            engine.process_outputs(step)
    return loop


def test_requests_reordered_around_launch_sample_are_refused_there_constraint_on():
    prompts = ["Once upon", "The king said", "She ", "A"]
    with te.Engine(te.EngineConfig(mode="serial", device="cpu", constraint="title_case")) as e:
        want = [c.text for c in e.generate(prompts, 24)]
        flip = _around_sample(lambda p: p.requests.reverse(), lambda p: p.requests.reverse())
        with pytest.raises(ValueError) as err:
            e.generate(prompts, 24, loop=flip)
        assert str(err.value).startswith(
            "launch_sample was given round 0's inputs, its plan changed since engine.schedule() "
            "returned it (its requests reordered, added or removed")
        assert [c.text for c in e.generate(prompts, 24)] == want


def test_is_prefill_flipped_around_launch_sample_is_named_not_blamed_on_the_outputs():
    def flip(plan):
        vars(plan)["is_prefill"] = not vars(plan)["is_prefill"]
    with te.Engine(te.EngineConfig(mode="serial", device="cpu", num_draft_tokens=2)) as e:
        want = [c.text for c in e.generate(PROMPTS, 20)]
        with pytest.raises(ValueError) as err:
            e.generate(PROMPTS, 20, loop=_around_sample(flip, flip))
        assert str(err.value).startswith(
            "launch_sample was given round 0's inputs, its plan changed since engine.schedule() "
            "returned it (plan.is_prefill changed from True to False, around Plan's guard "
            "(object.__setattr__ or vars()), by loop=loop or before")
        assert [c.text for c in e.generate(PROMPTS, 20)] == want


def test_inputs_blocks_cannot_be_edited_in_place(engine):
    def loop(eng):
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                continue
            inputs = eng.prepare_inputs(plan)
            inputs.blocks.clear()  # would blind the race checker to the forward's blocks
    with pytest.raises(AttributeError, match="'frozenset' object has no attribute 'clear'"):
        engine.generate(PROMPTS, 20, loop=loop)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_the_record_lives_while_rounds_are_in_flight_not_for_the_whole_run(engine):
    gone = []

    def po(eng, step):
        if not gone:
            gone.append(weakref.ref(step))
            gone.append(weakref.ref(step.plan))
        processed_by_hand(eng, step)
    outs = engine.generate(["Once upon"] * 32, 100, process_outputs=po)
    assert engine.stats.rounds > 200
    gc.collect()
    assert [ref() for ref in gone] == [None, None]  # the run keeps no committed round alive
    assert len(engine._run.made) < 200, len(engine._run.made)  # dead ones dropped as it grows
    assert [c.text for c in outs[:2]] != []


def test_a_committed_step_or_plan_kept_is_still_refused_after_many_rounds(engine):
    kept = []

    def po(eng, step):
        kept.append(step)
        processed_by_hand(eng, step)
        if len(kept) == 300:  # round 0's records were weak for 300 rounds, dead ones dropped
            processed_by_hand(eng, kept[0])
    with pytest.raises(StepProcessedTwice, match="^round 0's step was already processed"):
        engine.generate(["Once upon"] * 32, 100, process_outputs=po)
    plans = []

    def prepare_again(eng):
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                continue
            plans.append(plan)
            inputs = eng.prepare_inputs(plans[0] if len(plans) == 300 else plan)
            eng.launch_forward(inputs)
            eng.process_outputs(eng.launch_sample(inputs))
    with pytest.raises(PreparedTwice) as err:
        engine.generate(["Once upon"] * 32, 100, loop=prepare_again)
    assert (err.value.round, err.value.ran) == (0, True)
    copied = []

    def copies(eng, step):
        copied.append(step)
        processed_by_hand(eng, step)
        if len(copied) == 300:
            processed_by_hand(eng, copy.copy(copied[0]))
    with pytest.raises(ValueError, match="did not return \\(a copy"):
        engine.generate(["Once upon"] * 32, 100, process_outputs=copies)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want

