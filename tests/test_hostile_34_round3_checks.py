"""Issue 34's third hostile round, the checks' part (copied from the tester's
tests/test_hostile_34_round3.py): a learner's object that returns the wrong type from a dunder,
a BaseException of the learner's, a string whose methods lie, an answer that never returns, and
an exercise function that blocks in C.  Each failed before its fix."""

from __future__ import annotations

import numbers
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from overlap_course import checks
from overlap_course.checks import sandbox
from hostile_support import a_false_verdict as _a_false_verdict

ROOT = Path(__file__).resolve().parents[1]
TABLE = dict(table=[5, 2, 9], pos=9, block_size=4)


# ------------------------------------------------------------------ dunders of the wrong type

class FloatReturnsText(float):
    def __float__(self):
        return "37"


class IntReturnsText(int):
    def __int__(self):
        return "37"

    def __index__(self):
        return "37"


class NegativeLength(list):
    def __len__(self):
        return -1


class HugeLength(list):
    def __len__(self):
        return 2**70


class RegisteredReal:
    """Registered as a real number, with no ``__float__``: ``float()`` refuses it."""


numbers.Real.register(RegisteredReal)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("answer", [FloatReturnsText(37.0), IntReturnsText(37),
                                    NegativeLength([37]), HugeLength([37]), RegisteredReal()],
                         ids=["float-returns-text", "int-returns-text", "len-negative",
                              "len-2**70", "registered-real"])
def test_check_slot_answers_a_dunder_of_the_wrong_type(answer):
    _a_false_verdict(lambda: checks.check_slot(answer, **TABLE))


@pytest.mark.timeout(30)
def test_check_true_key_length_answers_a_float_whose_float_returns_text():
    _a_false_verdict(lambda: checks.check_true_key_length(FloatReturnsText(27.0), 27,
                                                          accepted=4))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", [FloatReturnsText(0.3), RegisteredReal()],
                         ids=["float-returns-text", "registered-real"])
def test_check_idle_fraction_answers_a_function_returning_an_odd_real(value, make_engine,
                                                                      monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)
    engine = make_engine(mode="serial", max_batch_size=4)
    engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
    _a_false_verdict(lambda: checks.check_idle_fraction(lambda timeline: value, engine))


@pytest.mark.timeout(60)
def test_check_ring_slots_answers_a_function_returning_an_int_whose_int_returns_text(
        monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)
    _a_false_verdict(lambda: checks.check_ring_slots(lambda *a, **k: IntReturnsText(1)))


# ------------------------------------------------------------------ the learner's BaseException

class LearnersBaseException(BaseException):
    """Not KeyboardInterrupt nor SystemExit: the learner's own."""


class _stops_with:
    """An iterable (not an iterator: one is refused before it is read, round 39) whose reading
    raises ``error`` after one item."""

    def __init__(self, error):
        self.error = error

    def __iter__(self):
        yield 1
        raise self.error("learner")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error", [LearnersBaseException, GeneratorExit])
def test_a_notebook_check_answers_an_iterator_raising_a_base_exception(error):
    _a_false_verdict(lambda: checks.check_three_rounds(_stops_with(error)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [LearnersBaseException, GeneratorExit])
def test_an_exercise_check_answers_a_function_raising_a_base_exception(error, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)

    def answer(*args, **kwargs):
        raise error("the learner's function raised")
    _a_false_verdict(lambda: checks.check_ring_slots(answer))


@pytest.mark.timeout(30)
def test_a_keyboard_interrupt_from_the_learners_code_still_interrupts():
    """Ctrl-C is the person at the keyboard: never turned into a verdict."""
    with pytest.raises(KeyboardInterrupt):
        checks.check_three_rounds(_stops_with(KeyboardInterrupt))


# ------------------------------------------------------------------ a wrong answer that passes

class AlwaysEqual(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__

    def strip(self, *args):
        return self

    lower = strip

    def endswith(self, *args):
        return False

    startswith = endswith


class Lies(str):
    """"zz", whose ``strip``/``lower`` return a string that equals anything."""

    def strip(self, *args):
        return AlwaysEqual("zz")

    lower = strip


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", [Lies("zz"), AlwaysEqual("zz")], ids=["lies", "always-equal"])
def test_a_lying_string_does_not_pass_check_largest_host_stage(make_engine, answer):
    engine = make_engine(mode="serial", max_batch_size=4)
    engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
    _a_false_verdict(lambda: checks.check_largest_host_stage(answer, engine.timeline))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", [Lies("zz"), AlwaysEqual("zz")], ids=["lies", "always-equal"])
def test_a_lying_string_does_not_pass_check_idle_sync(answer):
    _a_false_verdict(lambda: checks.check_idle_sync(answer, "a100_event_sync"))


# ------------------------------------------------------------------ controls (pass before too)

class RaisesLen(list):
    def __len__(self):
        raise RuntimeError("learner")


@pytest.mark.timeout(30)
def test_control_a_plain_wrong_slot_and_a_raising_len_get_false_verdicts():
    assert not checks.check_slot(36, **TABLE).passed
    assert checks.check_slot(37, **TABLE).passed
    verdict = _a_false_verdict(lambda: checks.check_slot(RaisesLen([37]), **TABLE))
    assert verdict.category == "raised"


@pytest.mark.timeout(60)
def test_control_an_exercise_check_stops_a_spinning_loop(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 2.0)

    def spins(engine):
        while True:
            pass
    assert _a_false_verdict(lambda: checks.check_serial_loop(spins)).category == "time_limit"


# ------------------------------------------------------------------ an answer that never ends

STUCK = '''
import sys
from overlap_course import checks
from overlap_course.checks import sandbox
sandbox.TIME_LIMIT_S = 2.0  # the exercise checks' limit, short here
def stuck():
    while True:
        pass
    yield
class LenLoops(list):
    def __len__(self):
        while True:
            pass
if sys.argv[1] == "iterator":
    verdict = checks.check_swapped_order(stuck(), True, False)
else:
    verdict = checks.check_slot(LenLoops([37]), table=[5, 2, 9], pos=9, block_size=4)
print("verdict", verdict.passed, verdict.category)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", ["iterator", "len"])
def test_a_notebook_check_on_an_answer_that_never_returns_ends(answer):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", STUCK, answer], capture_output=True,
                             text=True, timeout=10, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the check was still running after 10 s (its limit here: 2 s)")
    assert "verdict False time_limit" in run.stdout, run.stderr[-300:]


# ------------------------------------------------------------------ code that blocks, not spins

BLOCKS = '''
import sys, threading, time
from overlap_course import checks
from overlap_course.checks import sandbox
sandbox.TIME_LIMIT_S = 2.0
def waits(engine):
    threading.Event().wait()
def sleeps(engine):
    time.sleep(120)
verdict = checks.check_serial_loop(waits if sys.argv[1] == "wait" else sleeps)
print("verdict", verdict.category)
verdict = checks.check_serial_loop(lambda engine: None)
print("then", verdict.category)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["wait", "sleep"])
def test_an_exercise_check_stops_code_that_blocks(how):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", BLOCKS, how], capture_output=True,
                             text=True, timeout=12, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the check was still running after 12 s (its limit here: 2 s)")
    assert "verdict time_limit" in run.stdout, (run.stdout, run.stderr[-300:])
    assert "then" in run.stdout and "then passed" not in run.stdout, run.stdout


STUBBORN = '''
import signal, sys, time
from overlap_course import checks
from overlap_course.checks import sandbox
sandbox.TIME_LIMIT_S = 1.0
def stubborn():
    while True:
        try:
            time.sleep(10)
        except BaseException:
            pass
    yield
def locks(engine):
    import threading
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
verdict = checks.check_swapped_order(stubborn(), True, False)
print("notebook", verdict.category, "of `stubborn`" in verdict.message)
verdict = checks.check_serial_loop(locks)
print("exercise", verdict.category, "of `locks`" in verdict.message)
print("alarm left", signal.getitimer(signal.ITIMER_REAL), sys.gettrace())
'''


@pytest.mark.timeout(60)
def test_a_time_limit_stops_code_that_catches_it_around_a_blocking_call():
    """A notebook check's limit is an alarm; an ``except BaseException`` around ``time.sleep``
    catches every TimeUp the alarm raises there, so once time is up the learner's lines are
    traced too (as an exercise check's are).  A lock taken twice is stopped too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", STUBBORN], capture_output=True,
                             text=True, timeout=20, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the check was still running after 20 s (its limit here: 1 s)")
    assert "notebook time_limit True" in run.stdout, (run.stdout, run.stderr[-300:])
    assert "exercise time_limit True" in run.stdout, (run.stdout, run.stderr[-300:])
    assert "alarm left (0.0, 0.0) None" in run.stdout, run.stdout


@pytest.mark.timeout(30)
def test_a_check_keeps_the_alarm_and_handler_it_found():
    """The process has one ITIMER_REAL: a check puts back the timer (pytest-timeout's, here) and
    the SIGALRM handler it found, and a timer due during the check still calls its handler."""
    found, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    calls = []
    try:
        signal.signal(signal.SIGALRM, lambda signum, frame: calls.append(signum))
        signal.setitimer(signal.ITIMER_REAL, 20.0)
        assert checks.check_slot(37, **TABLE).passed
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 19.0 < left <= 20.0, left
        assert signal.getsignal(signal.SIGALRM) is not found and not calls
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # due while the check reads the answer
        verdict = checks.check_swapped_order(_sleeps_then(0.3), True, False)
        assert calls == [signal.SIGALRM] and verdict.category != "time_limit", (calls, verdict)
    finally:
        signal.signal(signal.SIGALRM, found)
        signal.setitimer(signal.ITIMER_REAL, *timer)


def _sleeps_then(seconds):
    time.sleep(seconds)
    yield True


class Outside(BaseException):
    """Raised by a SIGALRM handler that is not the check's (pytest-timeout's fails a test)."""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("raised", [Outside, KeyboardInterrupt])
def test_what_another_alarm_handler_raises_is_not_taken_for_the_learners(raised):
    """The learner's code was interrupted, not the raiser: no verdict, the exception goes on."""
    found, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    library = os.path.join(sysconfig.get_paths()["purelib"], "pytest_timeout_like.py")
    space = {"raised": raised}  # the handler's code as a library's (pytest-timeout's) file
    exec(compile("def handler(signum, frame):\n    raise raised('the alarm of someone else')\n",
                 library, "exec"), space)
    handler = space["handler"]
    try:
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(raised):
            checks.check_swapped_order(_sleeps_then(2.0), True, False)
    finally:
        signal.signal(signal.SIGALRM, found)
        signal.setitimer(signal.ITIMER_REAL, *timer)


def test_numpy_bools_are_still_flags():
    """``answers.flag_list`` reads plain lists now (no learner's __len__ twice): NumPy 2 names
    ``np.bool_`` ``bool``, and it still counts as a flag, while a learner's class of that name
    does not."""
    import numpy as np
    from overlap_course.checks import answers
    assert answers.flag_list([np.bool_(True), np.bool_(False)]) == [1, 0]
    assert answers.flag_list(np.array([True, False, True])) == [1, 0, 1]
    assert answers.bool_pair((np.bool_(True), False)) == (True, False)
    fake = type("bool", (), {"__bool__": lambda self: True})
    assert answers.flag_list([fake(), fake()]) is None
