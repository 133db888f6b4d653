"""Round twenty-four's blind cases on the exercise and plug-in checks (issue 34).

NEW 1: a stage called from a thread the learner's code starts and joins is refused by the engine,
whose error stays in that thread; the verdict then blamed what followed ("never waited for",
"`launch_sample` came before `launch_forward`", "never committed"). A refusal the run kept is
named first now, in check_serial_loop, check_zos_loop and exercise 05's check_process_outputs.

NEW 2: a ZOS loop that processed every deferred step with `engine.flush` passed, though exercise
03 keeps flush for when `schedule()` returns None: a flush after a `schedule()` that returned a
plan is named once the run is right otherwise (exercise 02 states no such rule: its check keeps
its note; a prefill flushed at once stays a right alternative, as tests/mistakes.py has it).

NEW 3: before_sample's `engine.constraint is not None and len(held)` (False) was told only "a
whole number from 0 to 0": a bool is refused for a count as every check refuses it for a number,
and the message now says so and how to return the int.

NEW 4 / NEW 5: exercise 05 passed a process_outputs that set "abort" on a request commit_outputs
had ended with "stop", and blamed the commit for one that ended unfinished requests: a
finish_reason set by the learner's code is named, judged by what commit_outputs alone gives.
"""

import threading

import pytest

import toy_engine as te
from overlap_course import checks

from loops_for_tests import processed_by_hand, zos_loop
import loops_for_tests

# The refusals are raised in threads the loops start, as a learner's would be.
pytestmark = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning")


def _in_thread(fn, *args):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", fn(*args)))
    thread.start()
    thread.join()
    return box.get("r")


def _serial(stage_in_thread):
    """The serial loop, with ``stage_in_thread`` called from a thread it starts and joins."""
    def call(engine, stage, *args):
        fn = getattr(engine, stage)
        return _in_thread(fn, *args) if stage == stage_in_thread else fn(*args)

    def serial_loop(engine):
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            call(engine, "launch_forward", inputs)
            step = call(engine, "launch_sample", inputs)
            if step is not None:
                call(engine, "process_outputs", step)
    return serial_loop


def _zos(stage_in_thread):
    """The ZOS loop, with ``stage_in_thread`` called from a thread it starts and joins."""
    def call(engine, stage, *args):
        fn = getattr(engine, stage)
        return _in_thread(fn, *args) if stage == stage_in_thread else fn(*args)

    def zos(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                call(engine, "flush", previous)
                previous = None
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                engine.correct_on_device(inputs)
            call(engine, "launch_forward", inputs)
            if previous is not None:
                call(engine, "process_outputs", previous)
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
            previous = None if plan.is_prefill else current
    return zos


_REFUSED = "was called from another thread than the one running generate"


def _names_the_thread(v, stage: str, who: str = "loop"):
    assert not v.passed and v.category == "other_thread", v
    assert f"engine.{stage}() {_REFUSED}" in v.message, v
    assert f"never reached your {who}, which " in v.message, v  # went on, or returned early


@pytest.mark.parametrize("stage", ["launch_forward", "launch_sample", "process_outputs"])
def test_a_serial_stage_in_a_joined_thread_is_named_not_what_followed(stage):
    v = checks.check_serial_loop(_serial(stage))
    _names_the_thread(v, stage)
    assert "which went on as though the call had been made" in v.message, v
    assert "never waited for" not in v.message and "came before" not in v.message, v


@pytest.mark.parametrize("stage", ["launch_forward", "process_outputs", "flush"])
def test_a_zos_stage_in_a_joined_thread_is_named_not_what_followed(stage):
    v = checks.check_zos_loop(_zos(stage))
    _names_the_thread(v, stage)
    assert "never processed" not in v.message and "came before" not in v.message, v


def test_a_refusal_the_thread_caught_is_named_too():
    """The run keeps the refusal whether or not the thread's own code caught it."""
    def quiet(fn, *args):
        try:
            fn(*args)
        except RuntimeError:
            pass

    def serial_loop(engine):
        while engine.scheduler.has_work():
            inputs = engine.prepare_inputs(engine.schedule())
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            thread = threading.Thread(target=quiet, args=(engine.process_outputs, step))
            thread.start()
            thread.join()
    _names_the_thread(checks.check_serial_loop(serial_loop), "process_outputs")


def test_exercise_05s_commit_in_a_joined_thread_is_named_not_never_committed():
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        out = engine.read_outputs(step)
        for req in _in_thread(engine.commit_outputs, step, out) or []:
            engine.scheduler.release_if_done(req)
    v = checks.check_process_outputs(process_outputs)
    _names_the_thread(v, "commit_outputs", "process_outputs")
    assert "never committed" not in v.message, v
    assert "Wait, read, commit and free in the thread that calls your process_outputs" in \
        v.message, v


def test_the_right_loops_still_pass():
    assert checks.check_serial_loop(loops_for_tests.serial_loop).passed
    assert checks.check_zos_loop(loops_for_tests.zos_loop()).passed
    assert checks.check_process_outputs(processed_by_hand).passed


# ------------------------------------------------------------------ NEW 2: flush with a plan

def test_a_zos_loop_that_flushes_every_deferred_step_is_told_flush_is_for_the_none_plan():
    loop = zos_loop(finish=lambda eng, step: eng.flush(step))
    v = checks.check_zos_loop(loop)
    assert not v.passed and v.category == "flushed_with_a_plan", v
    assert "round 1 (decode, prompts [0, 1, 2]): your loop processed its step with " \
           "`engine.flush`, though the last `engine.schedule()` had returned a plan " \
           "(round 2's)" in v.message, v
    assert "process it with `engine.process_outputs(previous)`" in v.message, v


def test_a_serial_loop_that_flushes_each_step_keeps_its_note():
    """Exercise 02 states no rule for flush: its check passes, with the note it gave."""
    def serial_loop(engine):
        while engine.scheduler.has_work():
            inputs = engine.prepare_inputs(engine.schedule())
            engine.launch_forward(inputs)
            engine.flush(engine.launch_sample(inputs))
    v = checks.check_serial_loop(serial_loop)
    assert v.passed and "your loop processes each step with `engine.flush`" in v.message, v


# ------------------------------------------------------------------ NEW 3: a bool for a count

@pytest.mark.parametrize("answer", [
    lambda engine, plan, held: engine.constraint is not None and len(held),
    lambda engine, plan, held: len(held) if engine.constraint is not None else False],
    ids=["and", "if-else"])
def test_before_sample_returning_a_bool_is_told_a_bool_is_not_a_count(answer):
    v = checks.check_before_sample(answer)
    assert not v.passed, v
    assert "before_sample returned False, a bool" in v.message, v
    assert "a count must be an int, not a bool" in v.message, v
    assert "`x and n` is False, not 0, where x is false" in v.message, v
    assert "return `int(...)`, or write the 0 out" in v.message, v


def test_the_int_versions_of_those_pass():
    def before_sample(engine, plan, held):
        return int(engine.constraint is not None and len(held))
    assert checks.check_before_sample(before_sample).passed


def test_a_future_key_returning_a_bool_is_told_a_bool_is_not_an_index():
    v = checks.check_future_key(lambda req, b: b == 1)
    assert not v.passed, v
    assert "key returned False, a bool" in v.message, v
    assert "an index must be an int, not a bool" in v.message, v


# ------------------------------------------------------------------ NEW 4 and 5: finish_reason

def test_exercise_05_refuses_abort_on_a_request_commit_ended():
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)
            elif req.finished:  # the extra step: "abort" it so nothing more runs
                req.finish_reason = "abort"
    v = checks.check_process_outputs(process_outputs)
    assert not v.passed and v.category in ("overwrote_finish", "raised"), v
    assert "finish_reason" in v.message and "'abort'" in v.message, v
    if v.category == "overwrote_finish":  # the engine may refuse the assignment itself
        assert "your process_outputs set prompt 0's finish_reason to 'abort' after " \
               "`commit_outputs` had ended it with 'stop'" in v.message, v
        assert "a finished request keeps the reason it ended with" in v.message, v


def test_exercise_05_refuses_a_reason_changed_once_the_request_is_freed():
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and req.num_inflight == 0:
                if req.finish_reason == "stop":
                    req.finish_reason = "length"
                engine.scheduler.free(req)
    v = checks.check_process_outputs(process_outputs)
    assert not v.passed and v.category in ("overwrote_finish", "raised"), v
    assert "'length'" in v.message, v


def _ends_unfinished(end):
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if not req.finished and req.num_inflight == 0 and end(req):
                req.finish_reason = "stop" if req.text.endswith(" ") else "length"
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)
    return process_outputs


@pytest.mark.parametrize("end", [
    lambda req: True,
    lambda req: len(req.output_ids) >= 5,
    lambda req: req.text.endswith(" ")], ids=["no-round-in-flight", "at-5", "at-a-space"])
def test_exercise_05_names_a_request_ended_by_process_outputs(end):
    v = checks.check_process_outputs(_ends_unfinished(end))
    assert not v.passed and v.category == "ended_unfinished", v
    assert "though `commit_outputs` had left it unfinished: that ended it early" in v.message, v
    assert "commit every step's tokens exactly once" not in v.message, v
