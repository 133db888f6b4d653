"""Issue 34's eighth hostile round, the checks: a learner's exception whose ``__str__`` returns
a number, one of the toy's own exceptions raised by the learner's code without the attributes
the engine sets (or with junk in them), and a TimeUp of the learner's own class whose
``__str__`` raises or whose ``seconds`` is text.  Each made a check raise before its fix."""

from __future__ import annotations

import pytest

import toy_engine as te
from hostile_support import a_false_verdict
from overlap_course import checks
from overlap_course.checks import sandbox
from toy_engine.run import StepProcessedTwice


@pytest.fixture(scope="module")
def serial(small_serial_engine):
    return small_serial_engine


def raising(make):
    def learner(*args, **kwargs):
        raise make()
    return learner


EXERCISES = ("check_serial_loop", "check_zos_loop", "check_correction", "check_process_outputs",
             "check_wants_more", "check_abort", "check_ring_slots", "check_commit",
             "check_before_sample", "check_future_key")


# ------------------------------------------------------------------ 1: __str__ returns a number

class NumberMessage(Exception):
    def __str__(self):
        return 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", [*EXERCISES, "check_idle_fraction"])
def test_a_check_quotes_a_learners_exception_whose_message_is_not_text(name, serial,
                                                                        monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    call = getattr(checks, name)
    if name == "check_idle_fraction":
        call = lambda f: checks.check_idle_fraction(f, serial)  # noqa: E731
    verdict = a_false_verdict(lambda: call(raising(NumberMessage)))
    assert verdict.category == "raised", verdict.message
    assert "NumberMessage: (its message could not be read)" in verdict.message


# ------------------------------------------------------------------ 2: the toy's own, forged

class Stuck(te.EngineStalled):
    def __init__(self):
        RuntimeError.__init__(self, "stuck")


class Racy(te.RaceError):
    def __init__(self):
        RuntimeError.__init__(self, "racy")


class Twice(StepProcessedTwice):
    def __init__(self):
        RuntimeError.__init__(self, "twice")


def junk_stalled():
    err = te.EngineStalled("stuck", reason="unprocessed_inflight")
    err.prompt_indexes = err.reason = None
    return err


def junk_race():
    return te.RaceError("racy", kind="buffer", round=None, launch=None)


def well_formed_race():
    """Every attribute of the engine's types, but raised by the learner's code, not the engine."""
    return te.RaceError("racy", kind="buffer", round=0, launch="sample", buffer="out0", access="r")


FORGED = {"subclass-stalled": Stuck, "subclass-race": Racy, "subclass-twice": Twice,
          "stalled-junk": junk_stalled, "race-junk": junk_race,
          "race-from-learner": well_formed_race}
STALLED, RACES = ("subclass-stalled", "stalled-junk"), ("subclass-race", "race-junk",
                                                        "race-from-learner")
# Each check with the classes it reads the attributes of.
FORGED_IN = {"check_serial_loop": STALLED + RACES, "check_zos_loop": STALLED + RACES,
             "check_process_outputs": (*STALLED, *RACES, "subclass-twice"),
             "check_wants_more": STALLED, "check_abort": STALLED, "check_commit": STALLED}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, forged", [(name, forged) for name, read in FORGED_IN.items()
                                          for forged in read])
def test_a_check_reads_only_the_engines_own_errors_as_the_engines(name, forged, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    verdict = a_false_verdict(lambda: getattr(checks, name)(raising(FORGED[forged])))
    assert verdict.category == "raised", verdict.message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, call", [
    ("buffer", lambda err: checks.check_ring_race((1, 3), err, ring=3)),
    ("free_in_use", lambda err: checks.check_abort_in_flight(({1}, set()), err)),
    ("buffer", lambda err: checks.check_race_report(("meta0", 1), err)),
], ids=["check_ring_race", "check_abort_in_flight", "check_race_report"])
def test_a_notebook_check_given_a_race_error_no_run_raised_asks_for_the_runs(kind, call):
    verdict = a_false_verdict(lambda: call(te.RaceError("racy", kind=kind, round=None,
                                                        launch=None)))
    assert verdict.category == "setup", verdict.message


# ------------------------------------------------------------------ 3: a TimeUp of its own

class Late(sandbox.TimeUp):
    def __str__(self):
        raise ValueError("the learner's __str__")


class Odd(sandbox.TimeUp):
    seconds = "soon"


def _answer_raising(cls):
    class Gap(float):  # comparisons and conversion raise the learner's TimeUp
        __float__ = __eq__ = __lt__ = __gt__ = __le__ = __ge__ = raising(cls)
        __hash__ = float.__hash__
    return Gap(5.0)


OWN_TIME_UP = {
    "check_overhead_gap": lambda cls: checks.check_overhead_gap(_answer_raising(cls),
                                                                overhead_ms=5.0),
    "check_swapped_order": lambda cls: checks.check_swapped_order(iter(raising(cls), 1), True,
                                                                  False),
    "check_ring_slots": lambda cls: checks.check_ring_slots(raising(cls)),
    "check_serial_loop": lambda cls: checks.check_serial_loop(raising(cls)),
    "check_wants_more": lambda cls: checks.check_wants_more(raising(cls)),
    "check_commit": lambda cls: checks.check_commit(raising(cls)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [Late, Odd], ids=["str-raises", "seconds-is-text"])
@pytest.mark.parametrize("name", OWN_TIME_UP)
def test_a_learners_own_time_up_is_their_exception_not_the_limit(name, cls, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    verdict = a_false_verdict(lambda: OWN_TIME_UP[name](cls))
    assert verdict.category == "raised", verdict.message
    assert cls.__name__ in verdict.message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", [Late, Odd], ids=["str-raises", "seconds-is-text"])
def test_a_learners_own_time_up_raised_outside_their_frames_is_still_theirs(cls, monkeypatch):
    """Raised in a frame that is not the learner's (code compiled as the toy's file): not
    the learner's by its traceback, and still no limit's."""
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    code = compile("raise cls()", te.__file__, "exec")

    def ring_slots(depth):
        exec(code, {"cls": cls})

    verdict = a_false_verdict(lambda: checks.check_ring_slots(ring_slots))
    assert verdict.category == "raised" and cls.__name__ in verdict.message, verdict.message


@pytest.mark.timeout(60)
def test_the_limits_own_time_up_is_still_a_time_limit(monkeypatch):
    """The other side of case 3: what the check's limit raises is still read as its own."""
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 0.5)

    def forever(depth):
        while True:
            pass

    verdict = a_false_verdict(lambda: checks.check_ring_slots(forever))
    assert verdict.category == "time_limit", verdict.message
    assert "still running after" in verdict.message
