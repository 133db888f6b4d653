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

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from toy_engine.device import usable_cpus  # a hub's 1-CPU container counts as one

WORKERS = 2  # more would measure nothing new: most tests already keep two processes busy
NO_TESTS_COLLECTED = 5  # pytest's exit status when a part selects nothing


def names_tests(args: list[str]) -> bool:
    """Whether the arguments name files or tests (``path``, ``path::test``), pick markers or
    pick the workers themselves: then they mean exactly what pytest makes of them."""
    plugins = {b for a, b in zip(args, args[1:]) if a == "-p"} | {a[2:] for a in args
                                                                    if a.startswith("-p")}
    picks = "no:xdist" in plugins or any(a in ("-n", "-m") or a.startswith(("--numprocesses",
                                                                             "-m")) for a in args)
    return picks or any(not a.startswith("-") and Path(a.split("::")[0]).exists() for a in args)


def pytest(args: list[str], part: str) -> int:
    """One pytest process; a Ctrl-C reaches it (it prints what ran), then stops this script."""
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    start = time.monotonic()
    try:
        status = subprocess.call([sys.executable, "-m", "pytest", *args])
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"run_tests: {part} took {time.monotonic() - start:.0f} s (exit {status})", flush=True)
    if pressed:
        raise KeyboardInterrupt
    return 0 if status == NO_TESTS_COLLECTED else status


def main(args: list[str]) -> int:
    if names_tests(args) or usable_cpus() < 2:
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *args])
    shared = pytest(["-n", str(WORKERS), "--dist", "loadfile", "-m", "not alone", *args],
                    f"the suite on {WORKERS} workers")
    alone = pytest(["-p", "no:xdist", "-m", "alone", *args], "the tests marked alone")
    return shared or alone


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("run_tests: interrupted", file=sys.stderr)
        sys.exit(130)
