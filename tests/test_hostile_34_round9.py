"""Issue 34's ninth hostile round: what rounds eight and nine left.  A learner's code that raises
the checker's own ``answers.Junk`` (or a subclass whose ``__str__`` raises) or the lab runs'
``Runaway`` (with no round in it) was read as the checker's own signal, and the check raised.
An error the checker raised is read as the checker's only when raised in the checker's code."""

from __future__ import annotations

import pytest

from hostile_support import a_false_verdict
from overlap_course import checks
from overlap_course.checks import answers, sandbox
from overlap_course.checks import lab_runs as runs

EXERCISES = ("check_serial_loop", "check_zos_loop", "check_correction", "check_process_outputs",
             "check_wants_more", "check_abort", "check_ring_slots", "check_commit",
             "check_before_sample", "check_future_key")


class LoudJunk(answers.Junk):
    def __str__(self):
        raise RuntimeError("no message")


def raising(make):
    def learner(*args, **kwargs):
        raise make()
    return learner


FORGED = {"junk": lambda: answers.Junk("a forged verdict"), "junk_subclass": LoudJunk,
          "runaway_no_round": runs.Runaway, "runaway_text": lambda: runs.Runaway("soon")}


@pytest.fixture(scope="module")
def serial(small_serial_engine):
    return small_serial_engine


@pytest.mark.timeout(240)
@pytest.mark.parametrize("forged", sorted(FORGED))
@pytest.mark.parametrize("name", [*EXERCISES, "check_idle_fraction"])
def test_the_checkers_own_exceptions_raised_by_a_learner_are_the_learners(name, forged, serial,
                                                                          monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    call = getattr(checks, name)
    if name == "check_idle_fraction":
        call = lambda f: checks.check_idle_fraction(f, serial)  # noqa: E731
    verdict = a_false_verdict(lambda: call(raising(FORGED[forged])))
    assert verdict.category == "raised", (verdict.category, verdict.message)


class JunkEverywhere:
    """A value every reading of which raises the learner's own Junk, whose message raises."""
    def __float__(self):
        raise LoudJunk()
    __int__ = __index__ = __len__ = __iter__ = __eq__ = __hash__ = __float__


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call", [
    lambda v: checks.check_metadata_answer(v), lambda v: checks.check_three_rounds(v),
    lambda v: checks.check_swapped_order(v, True, False), lambda v: checks.check_overhead_gap(v),
], ids=["metadata_answer", "three_rounds", "swapped_order", "overhead_gap"])
def test_a_value_raising_the_learners_own_junk_gets_a_verdict(call):
    verdict = a_false_verdict(lambda: call(JunkEverywhere()))
    assert verdict.category in ("raised", "shape"), (verdict.category, verdict.message)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv", [
    ["-m", "overlap_course.measure.bench", "--max-new-tokens", "100000000", "--requests", "1"],
    ["-m", "overlap_course.traces.kineto", "export", "OUT.json", "--max-new-tokens", "256"],
], ids=["bench", "trace_export"])
def test_max_new_tokens_past_the_models_context_is_refused_before_an_engine_starts(argv,
                                                                                    tmp_path):
    """Before: the bench built an engine (and a device process) to say the same, afterwards."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--max-new-tokens: must be from 1 to 255" in done.stderr, done.stderr
    assert not (tmp_path / "OUT.json").exists()


# ------------------------------------------------ round eight's blind notes: three rounds' order

RIGHT_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
               ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


def test_three_rounds_written_as_a_set_is_told_a_set_keeps_no_order():
    verdict = a_false_verdict(lambda: checks.check_three_rounds(set(RIGHT_ORDER)))
    assert verdict.category == "shape" and "a set keeps no order" in verdict.message


def test_three_rounds_written_with_the_timelines_stage_members_is_read_by_name():
    """``Stage.POSTPROCESS`` is "postprocess" (a StrEnum): judged and quoted as that name."""
    from toy_engine.timeline import Stage
    order = [(Stage(stage) if stage in ("postprocess", "flush") else stage, r)
             for stage, r in RIGHT_ORDER]
    assert checks.check_three_rounds(order)
    verdict = a_false_verdict(lambda: checks.check_three_rounds(order[::-1]))
    assert "<Stage." not in verdict.message and "'flush'" in verdict.message, verdict.message


# ------------------------------------- round eight's blind notes: mistakes named, not their effect

def frees_the_nearly_finished(engine):
    """A serial loop that frees a request one token before its limit ("about to finish")."""
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            break
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished or len(req.output_ids) >= req.max_new_tokens - 1:
                engine.scheduler.free(req)


def corrects_twice(engine):
    """The ZOS loop with each round's lengths corrected twice."""
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
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


@pytest.mark.timeout(120)
def test_a_loop_that_frees_an_unfinished_request_is_told_so():
    verdict = a_false_verdict(lambda: checks.check_serial_loop(frees_the_nearly_finished))
    assert verdict.category == "left_unfinished", (verdict.category, verdict.message)
    assert "never finished" in verdict.message and "`req.finished`" in verdict.message


@pytest.mark.timeout(120)
def test_a_zos_loop_that_corrects_a_round_twice_is_told_so():
    verdict = a_false_verdict(lambda: checks.check_zos_loop(corrects_twice))
    assert verdict.category == "launched_twice", (verdict.category, verdict.message)
    assert "`correct_on_device` was called 2 times" in verdict.message


# ------------------------------------------- the judge imports torch._dynamo only where needed

@pytest.mark.timeout(300)
def test_the_right_correction_passes_in_the_judge_which_imports_dynamo_for_it_alone():
    """torch._dynamo (1.2-2.3 s per judge process) is imported only for the checks that run code
    on meta tensors; the right correction still passes there (its meta run imports dynamo)."""
    import nbformat

    from overlap_course.build import judge
    from overlap_course.checks import host_waits
    assert host_waits.ON_META_TENSORS <= set(dir(checks))
    solution = nbformat.read(judge.ROOT / "solutions" / "04_seqlen_correction.ipynb", 4)
    cells = ["import torch"] + [c.source for c in solution.cells if c.cell_type == "code"
                                and "def correct_seqlens_qk" in c.source]
    passed, message = judge.judge("check_correction", cells)
    assert passed, message
