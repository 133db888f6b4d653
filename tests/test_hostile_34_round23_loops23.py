"""Round twenty-three's blind cases on the loop checks (issue 34).

NEW 1: a loop of a fixed number of rounds that skips the None plans (``for _ in range(200)``)
went on calling ``engine.schedule()`` after every request had finished, and passed: what the
run did is judged now, so it gets the "went on" verdict; a loop that stops at the end (on
``has_work()`` being False, or at the None that says so) still passes.

NEW 2: a loop that runs each round in a thread it joins had every stage refused there and kept
starting threads until the time limit, whose verdict never named the refusal, while Python
printed a traceback per thread (the checker's ``_Spinning`` among them): the thread errors are
recorded for the check's duration (one line printed), and the verdict names the refusal.
"""

import threading

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import sandbox

import mistakes
import loops_for_tests


def _round(engine, plan):
    inputs = engine.prepare_inputs(plan)
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))


def serial_counts_rounds(rounds=200):
    def serial_loop(engine):
        for _ in range(rounds):  # "enough rounds"
            plan = engine.schedule()
            if plan is None:
                continue
            _round(engine, plan)
    return serial_loop


def _zos_round(engine, plan, previous):
    """One ZOS round (the reference's order); returns the step it defers (None: processed)."""
    inputs = engine.prepare_inputs(plan)
    if previous is not None:
        engine.correct_on_device(inputs)
    engine.launch_forward(inputs)
    if previous is not None:
        engine.process_outputs(previous)
    current = engine.launch_sample(inputs)
    if plan.is_prefill:
        engine.process_outputs(current)
        return None
    return current


def zos_counts_rounds(engine):
    previous = None
    for _ in range(300):
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        previous = _zos_round(engine, plan, previous)


def zos_breaks_at_the_end(engine):
    """Right: it stops at the None that comes with nothing deferred (one schedule() past the
    end, as the serial loop that breaks on None)."""
    previous = None
    while True:
        plan = engine.schedule()
        if plan is None:
            if previous is None:
                break
            previous = engine.flush(previous)
            continue
        previous = _zos_round(engine, plan, previous)


@pytest.mark.parametrize("check, loop, calls", [
    (checks.check_serial_loop, serial_counts_rounds(), 151),
    (checks.check_zos_loop, zos_counts_rounds, 249)], ids=["serial", "zos"])
def test_a_loop_of_a_fixed_number_of_rounds_went_on_after_the_work(check, loop, calls):
    v = check(loop)
    assert not v.passed and v.category == "none_plan", v
    assert v.message.startswith("after round 47 every request had finished"), v
    assert f"your loop went on: it called `engine.schedule()` {calls} more time(s)" in v.message
    assert "loop while `engine.scheduler.has_work()`" in v.message, v


def test_a_fixed_count_the_checker_cuts_short_is_told_it_went_on_not_that_it_spins():
    v = checks.check_serial_loop(serial_counts_rounds(5000))
    assert not v.passed and v.category == "none_plan", v
    assert "after round 47 every request had finished" in v.message, v


@pytest.mark.parametrize("check, loop", [
    (checks.check_serial_loop, loops_for_tests.serial_loop),
    (checks.check_serial_loop, mistakes.serial_while_true),
    (checks.check_serial_loop, mistakes.serial_break_on_none),
    (checks.check_zos_loop, loops_for_tests.zos_loop()),
    (checks.check_zos_loop, mistakes.zos_while_true),
    (checks.check_zos_loop, zos_breaks_at_the_end)])
def test_loops_that_stop_at_the_end_still_pass(check, loop):
    v = check(loop)
    assert v.passed, v


def serial_thread_per_round(engine):
    while engine.scheduler.has_work():
        def one_round():
            _round(engine, engine.schedule())
        t = threading.Thread(target=one_round)
        t.start()
        t.join()


def zos_thread_per_round(engine):
    state = {"previous": None}

    def one_pass():
        previous, plan = state["previous"], engine.schedule()
        if plan is None:
            state["previous"] = engine.flush(previous)
            return
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        state["previous"] = engine.launch_sample(inputs)
    while engine.scheduler.has_work():
        t = threading.Thread(target=one_pass)
        t.start()
        t.join()


_REFUSED = "engine.schedule() was called from another thread than the one running generate"


@pytest.mark.parametrize("check, loop", [
    (checks.check_serial_loop, serial_thread_per_round),
    (checks.check_zos_loop, zos_thread_per_round)], ids=["serial", "zos"])
def test_a_thread_per_round_is_told_the_refusal_and_its_tracebacks_are_not_printed(
        check, loop, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)  # the real 30 s ends it the same way
    printed = []

    def learners_hook(args):  # what Python's own hook would print, one per thread
        printed.append(type(args.exc_value).__name__)
    monkeypatch.setattr(threading, "excepthook", learners_hook)
    v = check(loop)
    assert threading.excepthook is learners_hook  # put back after the check
    assert not v.passed and v.category == "other_thread", v
    assert _REFUSED in v.message and "Run the rounds in the thread that calls" in v.message, v
    assert "still running after 3 s, at line" in v.message, v
    assert printed == []
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err[:2000]
    assert "in threads your code started were not printed; the first: RuntimeError" in err
    assert "_Spinning" not in err and "Traceback" not in err
    assert checks.check_serial_loop(loops_for_tests.serial_loop).passed  # the engines recovered


def test_a_check_whose_threads_raise_nothing_prints_nothing(monkeypatch, capsys):
    def learners_hook(args):
        raise AssertionError("not called")
    monkeypatch.setattr(threading, "excepthook", learners_hook)
    assert checks.check_zos_loop(loops_for_tests.zos_loop()).passed
    assert threading.excepthook is learners_hook
    assert capsys.readouterr().err == ""
