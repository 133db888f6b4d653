"""Issue 34, round thirty-three (the engine): plans prepared out of the order ``schedule()``
returned them.  Planning a round counts it in flight for its requests (their lengths, their
rounds in flight), so a plan prepared after a later one was planned reads lengths already moved
past it: a plain ZOS loop that asked for round N+1's plan before preparing round N's returned
other text with no error, and one that ran two plans newer first stopped on a bare race on the
host buffer ``meta1``.  ``prepare_inputs`` now refuses a plan that is not the last one planned
(``PlannedSince``, naming both rounds), and the engine stays usable.

A plan dropped (``continue`` before its prepare, or after it) ended in a race on a host buffer
(no drafts) or in a refusal of drafts too deep (with drafts) that named only the symptom: both
now name the dropped round as their cause (``Run.explained``), as a ring of three slots, which
stalls instead, did.  The errors keep their types and fields (exercise 03's checker reads
them)."""

from __future__ import annotations

import pytest

import toy_engine as te
from toy_engine.races import RaceError
from toy_engine.refusals import DraftsTooDeep, PlannedSince

# round 32's loops: one asks for the next plan before preparing this one, one runs two plans
# newer first
from test_hostile_34_round32_ex03 import scheduled_ahead as ahead, swapped_pairs as newer_first

PROMPTS = ["the quick brown fox", "hello world", "once upon a time"]


@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.parametrize("loop, later", [(ahead, "has planned round 2 since"),
                                         (newer_first, "has planned round 2 since")])
def test_a_plan_prepared_after_a_later_one_was_planned_is_refused(loop, later, drafts):
    config = te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=drafts)
    with te.Engine(config) as engine:
        reference = [o.text for o in engine.generate(PROMPTS, max_new_tokens=8)]
        with pytest.raises(PlannedSince) as raised:
            engine.generate(PROMPTS, max_new_tokens=8, loop=loop)
        assert (raised.value.round, raised.value.latest) == (1, 2)
        assert "round 1's plan" in str(raised.value) and later in str(raised.value)
        assert "before asking for the next" in str(raised.value)
        # nothing lost: the call's requests ended, the engine drained and usable
        assert not engine.scheduler.has_work()
        assert [o.text for o in engine.generate(PROMPTS, max_new_tokens=8)] == reference


def dropping(where):
    """Round 2 (decode) dropped with ``continue`` before its prepare, or after it."""
    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            if where == "before" and plan.round == 2:
                continue
            inputs = engine.prepare_inputs(plan)
            if where == "after" and plan.round == 2:
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
    return loop


@pytest.mark.parametrize("drafts, error", [(0, RaceError), (2, DraftsTooDeep)])
@pytest.mark.parametrize("where, how", [
    ("before", "round 2's plan was scheduled but never prepared or launched"),
    ("after", "round 2's plan was prepared but its sample never launched")])
def test_an_error_after_a_dropped_plan_names_the_dropped_round(drafts, error, where, how):
    config = te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=drafts)
    with te.Engine(config) as engine:
        reference = [o.text for o in engine.generate(PROMPTS, max_new_tokens=8)]
        with pytest.raises(error) as raised:
            engine.generate(PROMPTS, max_new_tokens=8, loop=dropping(where))
        assert f"The cause: {how}" in str(raised.value), str(raised.value)
        assert "run every plan engine.schedule() returns, once" in str(raised.value)
        assert [o.text for o in engine.generate(PROMPTS, max_new_tokens=8)] == reference
