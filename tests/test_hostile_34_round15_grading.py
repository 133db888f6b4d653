"""Issue 34, round fifteen, grading.  A right serial loop that then slept an hour was stopped
by the check's time limit, whose TimeUp fired inside the judge's profile hook: CPython turned
the hook off with a ``sys.setprofile`` audit event, which the judge blamed on the submission
instead of giving the time-out's verdict.  And ``harness._PRISTINE`` (what the check's own
``restore()`` puts back) was read by identity only: a cell that changed its record in place had
the check install the cell's function, which put everything back at its first call and left the
references filled with a wrong loop's tokens, and a wrong answer got full marks; so did a cell
that rebound a checker's function (``pool.reference``) the same way, as the judge compared
nothing before the submission's first hand-back.  Each failed when written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_fingerprint import Snapshot, _compare, _fingerprint
from overlap_course.build.judge_watch import Watch
from overlap_course.checks import harness

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

_SLEEPS = RIGHT_LOOP.replace("engine.device.wait(step.sample_done)\n",
                             "engine.device.wait(step.sample_done)\n"
                             "        __import__('time').sleep(3600)\n")


def _in_submission():
    """A function of the submission's (its code's file name says so) that calls its argument."""
    space = {}
    exec(compile("def call(f):\n    return f()\n", "<submission-9>", "exec"), space)
    return space["call"]


def test_the_watchs_own_hook_turned_off_is_judged_by_the_verdict_not_blamed_at_once():
    """CPython turning the watch's hook off (a TimeUp raised in it) audits ``sys.setprofile``
    while the hook is still set: a lost hook; with another profile set, the submission's."""
    call, watch = _in_submission(), Watch()
    watch.changes = lambda: []  # the check is running
    try:
        sys.setprofile(watch.hook)
        try:
            call(lambda: watch.audited("sys.setprofile", ()))
        finally:
            sys.setprofile(None)
        assert watch.lost and watch.hooks == []
        call(lambda: watch.audited("sys.setprofile", ()))
        assert watch.hooks == ["sys.setprofile"]
    finally:
        watch.weakrefs_end()  # its hook's look froze the collector's objects


def test_a_loop_that_sleeps_past_the_limit_gets_the_time_out_verdict():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _SLEEPS])
    assert passed is False and "still running after 30 s" in message, message
    assert "changed what the checker runs on" not in message, message


# The cells' function, called first by the check's warm-up, puts everything back, then fills the
# references with the wrong loop's tokens (an engine's instance attribute is not watched).
_FILL = '''
from overlap_course.checks import pool as _pool, lesson02 as _l2

def _wrong_generate(self, *args, **kwargs):
    return type(self).generate(self, *args, **{**kwargs, "loop": serial_loop})

def _filled(real, *args, **kwargs):
    shared = _pool.engine()
    shared.generate = _wrong_generate.__get__(shared)
    try:
        _pool.reference.cache_clear()
        _pool.reference()
        _pool.endings_reference()
        _l2._long_reference()
        return real(*args, **kwargs)
    finally:
        del shared.generate
'''
_REBOUND = _FILL + '''
_real = _pool.reference

def _first(*args, **kwargs):
    _pool.reference = _real
    return _filled(_real, *args, **kwargs)

_pool.reference = _first
'''
_RECORDED = _FILL + '''
from overlap_course.checks import harness as _h
from toy_engine.engine import Engine as _E
_record = _h._PRISTINE.classes[("toy_engine.engine", "Engine")][1]   # changed in place
_real = _record["generate"]

def _first(self, *args, **kwargs):
    _E.generate = _record["generate"] = _real
    return _filled(_real.__get__(self), *args, **kwargs)

_record["generate"] = _first
'''
# An observer put in the record of the engine's RUN_OBSERVERS (a book, not compared): the check's
# restore() adds it; it runs the wrong loop in the four reference runs, then takes itself out.
_OBSERVED = '''
from overlap_course.checks import harness as _h
import toy_engine.engine as _te
_path = "toy_engine.engine.RUN_OBSERVERS"
_box, _held = _h._PRISTINE.contents[_path]
_runs = []

def _observer(engine, phase):
    if phase != "start":
        return
    _runs.append(engine)
    if len(_runs) == 4:
        _te.RUN_OBSERVERS.remove(_observer)
        _h._PRISTINE.contents[_path] = (_box, _held)
    serial_loop(engine)

_h._PRISTINE.contents[_path] = (_box, _held + ((_observer,),))
'''


def test_the_sandboxs_record_changed_in_place_is_named():
    record = harness._PRISTINE.classes[("toy_engine.engine", "Engine")][1]
    real = record["generate"]
    before, snapshot = _fingerprint(), Snapshot()
    assert snapshot.same() and _compare(before, _fingerprint()) == []
    record["generate"] = print
    try:
        assert not snapshot.same()
        assert "overlap_course.checks.harness._PRISTINE" in _compare(before, _fingerprint())
    finally:
        record["generate"] = real
    assert snapshot.same() and _compare(before, _fingerprint()) == []


def test_a_restore_leaves_the_record_as_it_was():
    """What a restore found is returned, not kept on the record the judge reads by value."""
    before = _fingerprint()
    assert harness._PRISTINE.restore() == ([], {})
    assert _compare(before, _fingerprint()) == []


def test_the_watch_compares_before_the_submissions_first_call_runs():
    """Compared before the first call runs and at its return; in a fresh interpreter, as in a
    judge: in a test worker, what other tests left (a thread started after the watch was made,
    a weakref's callback: CI's stop 53 and the run after it) is a change the first compare
    finds, after which the watch compares no more."""
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
            "from test_hostile_34_round15_grading import Watch, _in_submission\n"
            "call, watch, seen = _in_submission(), Watch(), []\n"
            "watch.start(lambda: seen.append('compared') or [])\n"
            "try:\n    call(lambda: seen.append('ran'))\nfinally:\n    watch.stop()\n"
            "print(seen, watch.changed)\n")
    run = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)],
                         capture_output=True, text=True, timeout=300)
    assert run.stdout.strip() == "['compared', 'ran', 'compared'] []", run.stdout + run.stderr


@pytest.mark.parametrize("cell, name", [(_REBOUND, "pool.reference"),
                                        (_RECORDED, "Engine.__dict__"),
                                        (_OBSERVED, "harness._PRISTINE")])
def test_a_cell_undone_by_its_own_first_call_does_not_pass_a_wrong_loop(cell, name):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, cell])
    assert passed is False and "changed what the checker runs on" in message, message
    assert name in message, message


def test_a_right_loop_still_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP])
    assert passed is True, message
