"""Issue 34, round forty-eight.  Round 47's checks at the round boundary read a finished
request's blocks with ``tuple()`` (an int met a bare TypeError; a tuple was blamed on the free
list), did not notice the race checker's ``on_alloc`` replaced mid-run (a RaceError blamed
another request's free), and said a moved request "is where the engine put it".  Grading: an
exercise 05 plug-in that set a guard on ``engine.scheduler.free`` hid its early free and scored
4/4 in real nbgrader (a method set on the scheduler was not an edit of the shared engine), and
one that replaced ``note_admitted`` was told a deferred step was dropped.  Blind: a ZOS loop that
asked ``engine.schedule()`` again after it returned None, with its step still held, was told to
flush when schedule() returns None, which it did after asking again.  Each failed when
written."""

from __future__ import annotations

import types

import pytest

import mistakes
import toy_engine as te
from overlap_course import checks

PROMPTS = ["ab", "cd", "efg"]


@pytest.mark.parametrize("made", [lambda blocks: blocks[0], tuple], ids=["int", "tuple"])
def test_a_finished_requests_blocks_rewritten_name_its_place(made):
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=2, num_draft_tokens=2)) as engine:
        want = [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)]

        def on_round(engine, rnd):
            for req in engine.scheduler.running:
                if req.finished and req.blocks:
                    req.blocks = made(req.blocks)
        with pytest.raises(RuntimeError, match=r"prompt \d's place was changed by on_round"):
            engine.generate(PROMPTS, max_new_tokens=8, on_round=on_round)
        assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)] == want


def test_the_race_checkers_callback_replaced_mid_run_is_named():
    config = te.EngineConfig(mode="zos", max_batch_size=2, num_draft_tokens=2, num_kv_blocks=2,
                             block_size=16)
    with te.Engine(config) as engine:
        want = [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)]

        def on_round(engine, rnd):
            if rnd == 1:
                engine.scheduler.blocks.on_alloc = lambda blocks: None
        with pytest.raises(RuntimeError, match=r"engine\.scheduler\.blocks\.on_alloc was changed"):
            engine.generate(PROMPTS, max_new_tokens=8, on_round=on_round)
        assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)] == want


def test_a_moved_request_is_not_said_to_be_where_the_engine_put_it():
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=2)) as engine:
        def on_round(engine, rnd):
            if rnd == 2:
                s = engine.scheduler
                first, second = s.running[:2]
                first.row, second.row = second.row, first.row
                for req in (first, second):  # placed rewritten to match
                    s.placed[id(req)] = (req.row, list(req.blocks))
        with pytest.raises(RuntimeError) as raised:
            engine.generate(PROMPTS[:2], max_new_tokens=8, on_round=on_round)
        said = str(raised.value)
        assert "place was changed" in said and "is where the engine put it" not in said, said


def _guarded_free(self, req):
    if req.num_inflight == 0:
        type(self).free(self, req)


def _frees_through_a_guard(engine, step):
    """Exercise 05's early free, hidden behind a guard the plug-in sets on the scheduler."""
    if "free" not in vars(engine.scheduler):
        engine.scheduler.free = types.MethodType(_guarded_free, engine.scheduler)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:  # the exercise's bug: no num_inflight test
            engine.scheduler.free(req)


def _turns_the_checks_off(engine, step):
    engine.scheduler.note_admitted = lambda plan: plan
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


@pytest.mark.parametrize("answer, name", [(_frees_through_a_guard, "engine.scheduler.free"),
                                          (_turns_the_checks_off,
                                           "engine.scheduler.note_admitted")])
def test_a_plug_in_that_sets_a_method_on_the_scheduler_is_an_edit_of_the_engine(answer, name):
    verdict = checks.check_process_outputs(answer)
    assert not verdict.passed and verdict.category == "edits_engine", verdict
    assert f"`{name}`" in verdict.message, verdict
    # the change was undone: the next check's run meets the scheduler as built
    assert checks.check_process_outputs(_right).passed


def _right(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


def test_a_schedule_asked_again_after_none_is_told_to_flush_before_asking_again():
    """Its run is a dropped step's (the second call plans nothing either, and the engine stalls
    there), so the verdict is the same; its advice says when to flush."""
    verdict = checks.check_zos_loop(mistakes.make_zos(retry_none=True))
    assert not verdict.passed and verdict.category == "no_flush", verdict
    assert "before you call `engine.schedule()` again" in verdict.message, verdict
