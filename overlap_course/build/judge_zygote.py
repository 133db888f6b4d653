"""Judge processes forked from one pristine parent, the zygote, instead of started afresh.

A judge process used to be a new ``python -I``: torch, the toy and the course imported each
time, about 1.5 s of CPU before the submission's first line (quiet, 2-core machine; two or three
times that beside other work), for every graded cell, twice for a value answer.  Six judged
serial loops in one process, side by side: 31.0 s before, 26.1 s forked (quiet); 45.5 s and
33.2 s at a load of 3 (docs/measurements/test_suite.md).  The zygote is
such a process, started the same way (``-I``, an environment and an empty folder of its own)
by the grader before any judge, with what a judge imports first already imported; it runs no
line of any submission and only forks.  Each judge is a child forked from it that becomes a
session of its own, takes its stdin (the request and the run's secret: never seen by the
zygote, which only passes the descriptors on), stderr, folder and environment from the grader,
and then runs exactly what a fresh judge runs, ending through the interpreter's own exit.  So a
judge starts with the state a fresh one had after its imports: none of an earlier judge's
(each is a copy of the zygote, not of a sibling), and the grader still re-hashes the installed
files after each.  A zygote is used while the installation is as it was when it started (the
digest of the installed files, the interpreter and the course folder), else a new one starts.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

#: Whether judges are forked (Linux); elsewhere each is a fresh ``python -I`` as before.
FORKS = sys.platform == "linux"
_CHILD_SUBREAPER = 36  # prctl

# The judges find the course and the toy in ROOT and nothing else there: ROOT is not put on
# sys.path, where a file a submission left in it (ROOT/hmac.py) would shadow a module.
_FINDER = """import sys
from importlib.machinery import PathFinder
class OnlyTheCourse:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in ("overlap_course", "toy_engine"):
            return PathFinder.find_spec(name, [sys.argv[1]])
sys.meta_path.insert(0, OnlyTheCourse)
"""
_BOOT = _FINDER + """from overlap_course.build import judge_zygote
judge_zygote.serve(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "fork")
"""
#: Where judges are not forked: each a fresh ``python -I ROOT MODE``, as before the zygote
_FRESH = _FINDER + """from overlap_course.build import judge_process
judge_process.judge_main(sys.argv[1:])
"""


def serve(root: str, fd: int, forks: bool) -> None:
    """The zygote: import what a judge imports first, then fork a judge for each order."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP pool here: libgomp's does not survive a fork (a judge
    # forked after the course's import had run torch on 2 threads hung in its first torch call)
    from overlap_course.build import judge_process  # and what a judge imports first:
    import overlap_course.checks.host_waits  # noqa: F401
    import overlap_course.checks.pool  # noqa: F401
    import toy_engine.judged_forkserver  # noqa: F401
    import torch.utils._device  # noqa: F401
    if sys.platform == "linux":  # a judge's orphans are the zygote's (_swept), not init's
        ctypes.CDLL(None).prctl(_CHILD_SUBREAPER, 1, 0, 0, 0)
    orders = socket.socket(fileno=fd)
    while True:
        message, fds, _, _ = socket.recv_fds(orders, 1 << 16, 2)
        if not message:
            return  # the grader has gone
        order = json.loads(message)
        if not forks:
            _spawned(orders, root, order, fds)
            continue
        pid = os.fork()
        if pid == 0:
            orders.close()
            torch.set_num_threads(threads)  # as a fresh judge has them
            raise SystemExit(_judge(root, order, fds, judge_process.judge_main))
        for f in fds:
            os.close(f)
        orders.sendall(f"{pid}\n".encode())
        orders.sendall(f"{_reaped(pid)}\n".encode())


def _spawned(orders: socket.socket, root: str, order: dict, fds: list[int]) -> None:
    """Where a fork is not safe after torch's import (macOS): a fresh ``python -I`` judge."""
    with subprocess.Popen([sys.executable, "-I", "-c", _FRESH, root, order["mode"]],
                          stdin=fds[0], stdout=subprocess.DEVNULL, stderr=fds[1],
                          cwd=order["cwd"], env=order["env"], start_new_session=True) as judge:
        for f in fds:
            os.close(f)
        orders.sendall(f"{judge.pid}\n".encode())
        judge.returncode = _reaped(judge.pid)
        orders.sendall(f"{judge.returncode}\n".encode())


def _reaped(pid: int) -> int:
    """The judge's exit code, its group ended first, while its ended process still holds the
    pid (ended by the grader after the reap, that group id could already be another's), and
    then whatever left the group."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    try:
        os.killpg(pid, signal.SIGKILL)  # whatever the judge started and left running
    except (ProcessLookupError, PermissionError):
        pass
    _, status = os.waitpid(pid, 0)
    _swept()
    return os.waitstatus_to_exitcode(status)


def _swept() -> None:
    """End what left the judge's group (``os.setsid()`` in a child: round 30's ran on and killed
    later judges' processes).  Orphaned, it is the zygote's (a subreaper), whose only other
    child was the judge: each child left is killed, then reaped, until none is left."""
    while True:
        for child in _children():
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)  # its children, orphaned as it ends, are the zygote's next
            while os.waitpid(-1, os.WNOHANG)[0]:  # and those already ended, before the next
                pass  # scan of /proc (one scan per reap: 2,000 left made a judge 54 s, not 5 s)
        except ChildProcessError:
            return


def _children() -> list[int]:
    """The zygote's children, by each process's parent in ``/proc``."""
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:  # "pid (name) state ppid ..."
                if int(f.read().rpartition(b")")[2].split()[1]) == me:
                    found.append(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    return found


def _judge(root: str, order: dict, fds: list[int], judge_main) -> int:
    """In the forked child: become the judge a fresh ``python -I`` in ``order["cwd"]`` was."""
    os.setsid()  # its own group: the grader ends it and whatever it starts together
    stdin, stderr = fds
    os.dup2(stdin, 0)
    os.dup2(stderr, 2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    for f in (stdin, stderr, null):
        os.close(f)
    os.chdir(order["cwd"])
    os.environ.clear()
    os.environ.update(order["env"])
    tempfile.tempdir = None  # found again from TMPDIR
    import multiprocessing
    multiprocessing.current_process().authkey = os.urandom(32)  # not its siblings'
    sys.argv = ["-c", root, order["mode"]]
    judge_main([root, order["mode"]])
    return 0


#: How long the zygote may take to answer an order: one that does not (a judge stopped it,
#: ``SIGSTOP`` to its parent) is replaced.
_ANSWER_S = 60


class Zygote:
    """The grader's side: one zygote per (interpreter, course folder, installed digest)."""

    def __init__(self, root: str, digest: dict[str, str]) -> None:
        self.key = _key(root, digest)
        self.home = tempfile.TemporaryDirectory(prefix="overlap-zygote-")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": self.home.name,
               "TMPDIR": self.home.name, "LANG": "C.UTF-8"}
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, root, str(theirs.fileno()),
             "fork" if FORKS else "spawn"],
            cwd=self.home.name, env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.socket, self.replies = ours, ours.makefile("rb")

    def fork(self, mode: str, cwd: str, env: dict, stdin: int, stderr: int) -> int:
        """A judge forked for ``mode``; returns its pid (its group's too)."""
        order = json.dumps({"mode": mode, "cwd": cwd, "env": env}).encode()
        socket.send_fds(self.socket, [order], [stdin, stderr])
        return int(self._reply(_ANSWER_S))

    def exit_code(self, timeout: float) -> int | None:
        """The judge's exit code as it ends, or None after ``timeout`` seconds (still running:
        end its group, then :func:`forget` this zygote, whose reply can no longer be read)."""
        try:
            return int(self._reply(timeout))
        except TimeoutError:
            return None

    def _reply(self, timeout: float | None) -> bytes:
        self.socket.settimeout(timeout)
        line = self.replies.readline()
        if not line.endswith(b"\n"):
            raise ConnectionError("the judges' zygote ended")
        return line

    def close(self, at_once: bool = False) -> None:
        """End the zygote: it reads the end of its orders and exits, or (``at_once``, or it
        does not within 10 s: stopped, busy with a judge that does not end) is killed."""
        self.replies.close()
        self.socket.close()
        try:
            self.process.wait(timeout=0 if at_once else 10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.home.cleanup()


_ZYGOTE: list[Zygote] = []
LOCK = threading.Lock()  # held by the grader from an order to its judge's exit code


def _key(root: str, digest: dict[str, str]) -> tuple:
    """What a zygote serves: this interpreter, the course folder, the installed files' digest."""
    return sys.executable, root, json.dumps(digest, sort_keys=True)


def zygote(root: str, digest: dict[str, str]) -> Zygote:
    """The zygote for this installation, started now if there is none or it differs."""
    key = _key(root, digest)
    if _ZYGOTE and (_ZYGOTE[0].key != key or _ZYGOTE[0].process.poll() is not None):
        _ZYGOTE.pop().close()
    if not _ZYGOTE:
        _ZYGOTE.append(Zygote(root, digest))
    return _ZYGOTE[0]


def forget(at_once: bool = False) -> None:
    """Close the zygote (a new one starts at the next judge); ``at_once`` after it failed."""
    if _ZYGOTE:
        _ZYGOTE.pop().close(at_once)


atexit.register(forget)
