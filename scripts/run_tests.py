"""``./run.sh test``: the whole suite on two workers, then the tests that must run alone.

    ./run.sh test [PYTEST OPTION ...]     # the whole suite, in two parts (below)
    ./run.sh test tests/test_zos.py ...   # what you name, in one pytest process, as given

Most of the suite waits on child processes (a judge, a device process, a command line, a
notebook's kernel), so two pytest-xdist workers, each given whole files (``--dist loadfile``),
keep both cores busy: on the 2-core machines this course is built on, the same 3,231 tests took
1,169 s instead of 1,525 s (docs/measurements/test_suite.md).  Tests marked ``alone`` (one
measures each hub learner's CPU and memory; one lets a cheating submission write beside the
course) then run by themselves.  One usable CPU, or options that already pick the workers
(``-n``, ``-p no:xdist``): one pytest process runs everything, as named.
"""

from __future__ import annotations

import _signal  # loaded at Python's start: no import before SIGINT is held

# POSIX: a Ctrl-C while the course package imports waits for interruptible's handler
_held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(
    _signal, "pthread_sigmask") else None
from overlap_course.ctrl_c import interruptible  # noqa: E402

interruptible(__name__, "run_tests", _held)  # first: a Ctrl-C while torch imports is one line

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from pytest import ExitCode  # noqa: E402

from overlap_course.command_line import USAGE_ERROR, run  # noqa: E402
from toy_engine.device import usable_cpus  # noqa: E402  (a hub's 1-CPU container counts as one)

WORKERS = 2  # the machines measured have 2 cores; most tests keep two processes busy
# Options that choose the workers or the tests themselves (pytest-xdist's and pytest's -m), or
# that run none (--help, --version: printed once, not once per part).
ONE_RUN_OPTIONS = ("-n", "--numprocesses", "--maxprocesses", "--dist", "-d", "--tx", "--px",
                   "--rsyncdir", "--rsyncignore", "--max-worker-restart", "-f", "--looponfail",
                   "-m", "-h", "--help", "-V", "--version")


def names_tests(args: list[str]) -> bool:
    """Whether the arguments name files or tests (``path``, ``path::test``), pick markers or
    pick the workers themselves: then they mean exactly what pytest makes of them."""
    plugins = {b for a, b in zip(args, args[1:]) if a == "-p"}
    plugins |= {a[2:] for a in args if a.startswith("-p")}
    picks = any(a.startswith(ONE_RUN_OPTIONS) for a in args)
    return "no:xdist" in plugins or picks or any(map(_a_path, args))


def _a_path(arg: str) -> bool:
    try:
        return not arg.startswith("-") and Path(arg.partition("::")[0]).exists()
    except (OSError, ValueError):  # a name too long for the system, a NUL: a -k expression
        return False


def pytest(args: list[str], part: str) -> int:
    """One pytest process; a Ctrl-C reaches it (it prints what ran), then stops this script."""
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    start = time.monotonic()
    try:
        status = subprocess.call([sys.executable, "-m", "pytest", *args])
    finally:
        signal.signal(signal.SIGINT, previous)
    if status == ExitCode.USAGE_ERROR and not pressed:  # pytest named the option, in 4 lines:
        return USAGE_ERROR  # no timing line after them, and the course's status for bad input
    print(f"run_tests: {part} took {time.monotonic() - start:.0f} s (exit {status})", flush=True)
    if pressed:
        raise KeyboardInterrupt
    return 0 if status == ExitCode.NO_TESTS_COLLECTED else status  # a part selected nothing


def main(args: list[str]) -> int:
    if names_tests(args) or usable_cpus() < 2:
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *args])
    shared = pytest(["-n", str(WORKERS), "--dist", "loadfile", "-m", "not alone", *args],
                    f"the suite on {WORKERS} workers")
    if shared not in (ExitCode.OK, ExitCode.TESTS_FAILED):  # a usage error: said once is enough
        return shared
    alone = pytest(["-p", "no:xdist", "-m", "alone", *args], "the tests marked alone")
    return shared or alone


if __name__ == "__main__":
    run("run_tests", lambda: main(sys.argv[1:]))
