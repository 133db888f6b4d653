"""Issue 34, round fifteen, grading.  A right serial loop that then slept an hour was stopped
by the check's time limit, whose TimeUp fired inside the judge's profile hook: CPython turned
the hook off with a ``sys.setprofile`` audit event, which the judge blamed on the submission
instead of giving the time-out's verdict.  And ``harness._PRISTINE`` (what the check's own
``restore()`` puts back) was read by identity only: a cell that changed its record in place had
the check install the cell's function, which put everything back at its first call and left the
references filled with a wrong loop's tokens, and a wrong answer got full marks.  Each failed
when written."""

from __future__ import annotations

import sys

from overlap_course.build import judge
from overlap_course.build.judge_watch import Watch

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
    sys.setprofile(watch.hook)
    try:
        call(lambda: watch.audited("sys.setprofile", ()))
    finally:
        sys.setprofile(None)
    assert watch.lost and watch.hooks == []
    call(lambda: watch.audited("sys.setprofile", ()))
    assert watch.hooks == ["sys.setprofile"]


def test_a_loop_that_sleeps_past_the_limit_gets_the_time_out_verdict():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _SLEEPS])
    assert passed is False and "still running after 30 s" in message, message
    assert "changed what the checker runs on" not in message, message
