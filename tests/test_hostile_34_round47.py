"""Issue 34, round forty-seven.  Round 46's checks of the scheduler read their ranges from the
fields a plug-in wrote and looked at free rows and blocks only: two running requests moved into
one row (``placed`` cleared, or rewritten to match) or onto one block gave silently wrong text;
``placed`` or ``freed`` replaced met bare TypeErrors; junk left in ``freed`` broke the next clean
run; and round 46's test of a scheduler between runs replaced one a notebook spies on (notebook
05 sets ``engine.scheduler.free``), so its cells failed.  Grading: exercise 02(b)'s refusal of
the built-in was undone by resetting the timeline's class or running a copy of the built-in's
code.  Blind: exercise 05's checker printed the engine's warning at its own line, and a
``process_outputs(step, engine)`` was not told its parameters are the other way round.  Each
failed when written."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

import toy_engine as te
from overlap_course import checks

PROMPTS = ["ab", "cd"]


def _engine(mode: str, drafts: int = 0) -> te.Engine:
    return te.Engine(te.EngineConfig(mode=mode, max_batch_size=2, num_draft_tokens=drafts))


def _texts(completions) -> list[str]:
    return [c.text for c in completions]


def _one_row(s):
    first, second = s.running[0], s.running[1]
    s.placed.clear()
    second.row = first.row


def _swapped(s):
    first, second = s.running[0], s.running[1]
    first.row, second.row = second.row, first.row
    s.placed[id(first)], s.placed[id(second)] = ((first.row, list(first.blocks)),
                                                 (second.row, list(second.blocks)))


def _one_block(s):
    first, second = s.running[0], s.running[1]
    second.blocks = list(first.blocks)
    s.placed[id(second)] = (second.row, list(first.blocks))


def _freed_running(s):
    s.freed[s.running[1].id] = [0]


def _rows_beyond(s):
    s.rows = 10  # not the engine's: its count is its config's
    s.free_rows[:] = [5, 6]


@pytest.mark.parametrize("mode, drafts", [("serial", 0), ("zos", 2)])
@pytest.mark.parametrize("write, said", [
    (_one_row, r"prompt 1's place was changed .* row 1 .* now says row 0"),
    (_swapped, r"prompt \d's place was changed"),
    (_one_block, r"prompt 1's place was changed .* blocks"),
    (_freed_running, r"freed .*a running request is never in it"),
    (_rows_beyond, r"free_rows .*between 0 and 1"),
    (lambda s: setattr(s, "placed", None), r"placed was replaced by None"),
    (lambda s: setattr(s, "freed", []), r"freed was replaced by \[\]"),
], ids=["one-row", "swapped", "one-block", "freed-running", "rows-beyond", "placed-none",
        "freed-list"])
def test_what_an_on_round_plug_in_writes_in_the_scheduler_is_refused_by_name(mode, drafts,
                                                                              write, said):
    with _engine(mode, drafts) as engine:
        want = _texts(engine.generate(PROMPTS, max_new_tokens=8))

        def on_round(engine, rnd):
            if rnd == 2:
                write(engine.scheduler)
        with pytest.raises(RuntimeError, match=said):
            engine.generate(PROMPTS, max_new_tokens=8, on_round=on_round)
        assert all(r.finish_reason == "abort" for r in engine.requests)
        assert _texts(engine.generate(PROMPTS, max_new_tokens=8)) == want


def test_a_process_outputs_plug_in_that_moves_a_request_is_refused_at_the_next_round():
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
        if step.plan.round == 1 and len(engine.scheduler.running) == 2:
            _one_row(engine.scheduler)

    with _engine("zos", 2) as engine:
        want = _texts(engine.generate(PROMPTS, max_new_tokens=8))
        with pytest.raises(RuntimeError, match=r"prompt 1's place was changed"):
            engine.generate(PROMPTS, max_new_tokens=8, process_outputs=process_outputs)
        assert _texts(engine.generate(PROMPTS, max_new_tokens=8)) == want


@pytest.mark.parametrize("junk", [None, [], {i: [0] for i in range(1000)}],
                         ids=["none", "list", "future-ids"])
def test_junk_a_loop_left_in_freed_does_not_reach_the_next_run(junk):
    def loop(engine):
        te.loops.serial_loop(engine)
        if type(junk) is dict:
            engine.scheduler.freed.update(junk)
        else:
            engine.scheduler.freed = junk

    with _engine("serial") as engine:
        want = _texts(engine.generate(PROMPTS, max_new_tokens=6))
        assert _texts(engine.generate(PROMPTS, max_new_tokens=6, loop=loop)) == want
        assert _texts(engine.generate(PROMPTS, max_new_tokens=6)) == want


def test_a_spy_set_on_the_scheduler_between_runs_stays_for_the_next_run():
    """Notebook 05 spies on ``engine.scheduler.free`` so: the engine must not swap it out."""
    with _engine("serial") as engine:
        engine.generate(PROMPTS, max_new_tokens=4)
        calls, free = [], engine.scheduler.free

        def spy(req):
            calls.append(req.index)
            free(req)
        engine.scheduler.free = spy
        engine.generate(PROMPTS, max_new_tokens=4)
        assert sorted(calls) == [0, 1] and engine.scheduler.free is spy
        del engine.scheduler.free


def _class_reset(timeline):
    timeline.__class__ = te.Timeline
    return timeline.device_idle_fraction()


def _code_copy(timeline):
    code = te.Timeline.device_idle_fraction.__code__.replace(co_name="mine")
    return types.FunctionType(code, vars(sys.modules[te.Timeline.__module__]))(timeline, None)


def _computed(timeline):
    idle = sum(end - start for start, end in timeline.device_gaps())
    timeline.note = "an attribute of the answer's own"
    return idle / (idle + timeline.device_busy_ms())


@pytest.fixture(scope="module")
def serial_run():
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        engine.generate(PROMPTS, max_new_tokens=6)
        yield engine


@pytest.mark.parametrize("answer", [_class_reset, _code_copy])
def test_the_built_in_idle_fraction_is_refused_after_a_class_reset_or_as_a_copy(answer,
                                                                                serial_run):
    verdict = checks.check_idle_fraction(answer, serial_run)
    assert not verdict.passed and verdict.category == "built_in", verdict
    assert checks.check_idle_fraction(_computed, serial_run).passed


def _frees_unfinished(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.num_inflight == 0:  # not only the finished ones
            engine.scheduler.free(req)


def test_exercise_05s_verdict_comes_without_the_engines_warning_from_the_checker():
    with warnings.catch_warnings(record=True) as seen:
        verdict = checks.check_process_outputs(_frees_unfinished)
    assert not verdict.passed and "not finished" in verdict.message, verdict
    assert not [w for w in seen if "left the scheduler unfinished" in str(w.message)], [
        (w.filename, w.lineno) for w in seen]
    with _engine("serial") as engine, pytest.warns(RuntimeWarning, match="left the scheduler"):
        engine.generate(PROMPTS, max_new_tokens=6, process_outputs=_frees_unfinished)


def _swapped_parameters(step, engine):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))


def test_a_process_outputs_with_its_parameters_the_other_way_round_is_told_so():
    verdict = checks.check_process_outputs(_swapped_parameters)
    assert not verdict.passed and "the engine first" in verdict.message, verdict
