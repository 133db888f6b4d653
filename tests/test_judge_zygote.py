"""The judges' zygote (``overlap_course/build/judge_zygote.py``): judges forked from one
pristine process instead of a new ``python -I`` each, which imported torch, the toy and the
course every time (CI's stop 53 ran over its 40 minutes, most of it in judges).

What must hold: a judge still starts with nothing of an earlier judge's; a judge that ends or
stops its zygote scores 0 and the next judge gets a new one; a zygote serves only the
installation it was started for; it ends with its grader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from overlap_course.build import judge, judge_zygote

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine, running_with


def _zygote_pid() -> int | None:
    return judge_zygote._ZYGOTE[0].process.pid if judge_zygote._ZYGOTE else None


# A right loop whose cells leave a mark where the next judge would see it, were it a copy of
# this one (a module attribute, an environment variable, a file in the current folder).
_MARKS = RIGHT_LOOP + '''
import json, os
assert not hasattr(json, "LEFT_BY_A_JUDGE"), "an earlier judge's module state"
assert "LEFT_BY_A_JUDGE" not in os.environ, "an earlier judge's environment"
assert not os.path.exists("left_by_a_judge"), "an earlier judge's folder"
json.LEFT_BY_A_JUDGE = os.environ["LEFT_BY_A_JUDGE"] = "yes"
open("left_by_a_judge", "w").close()
'''


def test_judges_share_one_zygote_and_nothing_of_each_other():
    needs_the_engine()
    first = judge.judge("check_serial_loop", [IMPORTS, _MARKS])
    zygote = _zygote_pid()
    second = judge.judge("check_serial_loop", [IMPORTS, _MARKS])
    assert first[0] is True and second[0] is True, (first, second)
    assert zygote is not None and _zygote_pid() == zygote


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_zygote_that_ends_or_stops_while_its_judge_runs_gives_0_and_the_next_a_new_one(
        monkeypatch, signal_name):
    """Sent from outside (a judge's own signals stay inside its fence where Landlock scopes
    them, round 30; older kernels let a judge stop or end its zygote: the same path)."""
    needs_the_engine()
    before = judge_zygote.zygote(str(judge.ROOT), judge.installed_digest()).process.pid
    slow = RIGHT_LOOP + "import time\ntime.sleep(4)\n"
    monkeypatch.setattr(judge, "JUDGE_TIMEOUT_S", 8)  # a stopped zygote answers nothing
    monkeypatch.setattr(judge, "_REAPED_S", 2)
    sender = threading.Timer(2, os.kill, (before, getattr(signal, signal_name)))
    sender.start()
    try:
        passed, message = judge.judge("check_serial_loop", [IMPORTS, slow])
    finally:
        sender.join()
    assert passed is False, message
    assert ("without a verdict" in message or "after 8 s" in message), message
    after = judge_zygote.zygote(str(judge.ROOT), judge.installed_digest()).process
    assert after.pid != before and after.poll() is None  # a new one, running
    if signal_name == "SIGKILL":  # and it judges (once is enough: the same path after either)
        monkeypatch.undo()
        again = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP])
        assert again[0] is True, again


def test_what_a_judge_left_running_in_its_group_ends_with_it():
    """The zygote ends the judge's group while the ended judge still holds its pid, then reaps
    it: the grader no longer ends a group by a pid that another process may have by then."""
    needs_the_engine()
    mark = f"left-by-a-judge-{os.getpid()}-{time.time_ns()}"
    left = RIGHT_LOOP + ("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                         f"'import time; time.sleep(600)', {mark!r}])\n")
    judge.judge("check_serial_loop", [IMPORTS, left])
    assert running_with(mark) == [], "a judge's child outlived its verdict"


def test_where_a_fork_is_not_safe_each_judge_is_a_fresh_python(monkeypatch):
    needs_the_engine()
    judge_zygote.forget()
    monkeypatch.setattr(judge_zygote, "FORKS", False)  # as on macOS
    assert judge.judge("check_serial_loop", [IMPORTS, _MARKS])[0] is True
    judge_zygote.forget()


def test_a_zygote_serves_only_the_installation_it_was_started_for(tmp_path):
    root = str(judge.ROOT)
    first = judge_zygote.zygote(root, {"a.py": "1"})
    assert judge_zygote.zygote(root, {"a.py": "1"}) is first
    second = judge_zygote.zygote(root, {"a.py": "2"})
    assert second is not first and first.process.poll() is not None  # ended, not left behind
    third = judge_zygote.zygote(str(tmp_path), {"a.py": "2"})
    assert third is not second and second.process.poll() is not None
    judge_zygote.forget()
    assert third.process.poll() is not None and not judge_zygote._ZYGOTE


def test_a_zygote_ends_with_its_grader():
    grader = subprocess.run(
        [sys.executable, "-c", "import os\nfrom overlap_course.build import judge, judge_zygote\n"
         "print(judge_zygote.zygote(str(judge.ROOT), {}).process.pid, flush=True)\n"
         "os._exit(0)  # no atexit: as a grader killed ends\n"],
        capture_output=True, text=True, timeout=300)
    pid = grader.stdout.strip()
    assert pid.isdigit(), grader.stderr[-2000:]
    for _ in range(600):  # it reads the end of its orders once its imports are done
        if _zombie(pid):
            break
        time.sleep(0.1)
    assert _zombie(pid), f"zygote {pid} still runs after its grader ended"


def _zombie(pid: str) -> bool:
    """Ended (a zombie until whoever adopted it reaps it, or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
