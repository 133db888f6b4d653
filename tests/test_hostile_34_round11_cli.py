"""Issue 34, round eleven, the command lines (cases cli3 and cli4).

cli3: a Ctrl-C in the milliseconds after a command's ``main`` returned, while the interpreter ran
its finalizers (``atexit`` callbacks: torch's, multiprocessing's; threads joined), printed a
``KeyboardInterrupt`` traceback and the command exited 0.  cli4: one before the command's own
first line -- ``command_line``'s imports, the kineto package's ``__init__`` (Python runs it
before the package's ``__main__``), the measure package's torch -- was a traceback.

The rule now, for every command: a SIGINT the process receives from its first line of course
code (the package ``overlap_course`` for ``python -m``, the script's first line) until its last
finalizer has run says ``PROG: interrupted`` and ends it with exit status 130, never a
traceback; one after that finds the command finished: its output and exit status are its own.
``./run.sh``, before it hands over to the command's Python, says ``run.sh: interrupted`` (130).
(Python's own start, before any course code, is Python's: not tested here.)

The SIGINT is sent by the process to itself at a chosen point (:data:`SITECUSTOMIZE`, first on
PYTHONPATH: an audit hook sees every import), or to its process group from outside, as a
terminal's Ctrl-C is, while a finalizer sleeps.  Each test failed before the fix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACE = str(ROOT / "overlap_course" / "traces" / "a100" / "a100_event_sync.json.gz")
pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")

# Imported by Python's site before anything else.  CTRL_C_AT says where the process sends itself
# SIGINT; it leaves the environment, so that no child process of the command sends one too.
SITECUSTOMIZE = r'''
import atexit, os, signal, sys, threading, time

AT = os.environ.pop("CTRL_C_AT", "")
MARK = os.environ.pop("CTRL_C_MARK", "")
imported = []  # every module imported from the package overlap_course on
STARTED = {"overlap_course.command_line", "overlap_course.progress_store"}


def mark(text):
    with open(MARK, "a") as f:
        f.write(text + "\n")


def ctrl_c(where):
    mark("sent " + where)
    os.kill(os.getpid(), signal.SIGINT)


def after_main():
    """What AT adds once the command has started (it imports command_line, or the service its
    store): registered after the command's start, so run before its last finalizer."""
    if AT == "finalizer":
        atexit.register(ctrl_c, "in a finalizer")
    elif AT == "joining threads":  # the main thread has ended: the interpreter joins this one
        threading.Thread(target=lambda: (threading.main_thread().join(),
                                         ctrl_c("while threads are joined"))).start()
    elif AT == "slow finalizer":
        def slow():
            mark("sleeping")
            time.sleep(4)
            mark("slept")
        atexit.register(slow)


def hook(event, args):
    if event != "import" or (not imported and args[0] != "overlap_course"):
        return
    first = args[0] not in imported
    imported.append(args[0])
    if args[0] in STARTED and not STARTED & set(imported[:-1]):
        after_main()
    if AT == f"import {len(imported) - 1}" or (AT == f"import {args[0]}" and first):
        ctrl_c(f"importing {args[0]}")


class Started:
    """Marks command_line's import (the command has started, before the fix too), then leaves:
    no code of this file runs in the command after it (an audit hook, which cannot leave, can
    turn a KeyboardInterrupt raised in it into an 'Exception ignored' message)."""

    def find_spec(self, name, path=None, target=None):
        if name == "overlap_course.command_line":
            sys.meta_path.remove(self)
            mark("started")


if AT == "started":
    sys.meta_path.insert(0, Started())
elif AT:
    sys.addaudithook(hook)
if AT == "count":
    atexit.register(lambda: mark(" ".join(imported)))  # registered first: run last
elif AT == "finished":  # runs after the command's last finalizer too
    atexit.register(ctrl_c, "after the last finalizer")
'''


def _as_from_a_terminal() -> None:
    """SIGINT at its default in the child, whatever this test process has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env(tmp_path: Path, at: str) -> tuple[dict, Path]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    mark = tmp_path / "mark.txt"
    mark.unlink(missing_ok=True)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "CTRL_C_AT": at,
            "CTRL_C_MARK": str(mark)}, mark


def _marks(mark: Path) -> list[str]:
    return mark.read_text().splitlines() if mark.exists() else []


def _run(argv: list[str], at: str, tmp_path: Path) -> tuple[int, str, str, list[str]]:
    env, mark = _env(tmp_path, at)
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180, preexec_fn=_as_from_a_terminal)
    return done.returncode, done.stdout, done.stderr, _marks(mark)


# Every command, run quickly (its help, or input it refuses) -- the same code path to the end.
COMMANDS = {
    "python -m overlap_course.traces.kineto": ["-m", "overlap_course.traces.kineto", "summary",
                                               TRACE],
    "python -m overlap_course.progress": ["-m", "overlap_course.progress", "none.jsonl"],
    "python -m overlap_course.measure.bench": ["-m", "overlap_course.measure.bench", "--help"],
    "grading": ["-m", "overlap_course.build.grading", "--help"],
    "slides": ["-m", "overlap_course.build.slides", "--help"],
    "handout": ["-m", "overlap_course.build.handout", "--help"],
    "setup_cell": ["-m", "overlap_course.build.setup_cell", "neither"],
    "notebooks": ["-m", "overlap_course.build.notebooks", "--help"],
    "corpus": ["-m", "overlap_course.corpus", "--help"],
    "train": ["-m", "overlap_course.train", "--help"],
    "site": [str(ROOT / "site" / "build.py"), "--help"],
    "run_tests": [str(ROOT / "scripts" / "run_tests.py"), "--version"],
}
SUMMARY = COMMANDS["python -m overlap_course.traces.kineto"]
IDLE = 0.787072  # TRACE's device idle fraction: trace summary's output is whole
KINETO = "python -m overlap_course.traces.kineto: interrupted"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_ctrl_c_in_a_commands_first_imports_is_one_line_and_130(prog, tmp_path):
    """At argparse's import: for most commands inside ``command_line``'s own imports, for the
    kineto command inside its package's ``__init__`` (before: a traceback)."""
    status, _, err, marks = _run(COMMANDS[prog], "import argparse", tmp_path)
    assert marks == ["sent importing argparse"], (marks, err[-1500:])
    assert (status, err) == (130, f"{prog}: interrupted\n"), (status, err[-1500:])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("prog", sorted(set(COMMANDS) - {"run_tests"}))  # it ends in pytest's
def test_ctrl_c_in_a_commands_finalizers_is_one_line_and_130(prog, tmp_path):
    """After ``main`` returned, in an ``atexit`` callback (before: a traceback, exit 0)."""
    status, _, err, marks = _run(COMMANDS[prog], "finalizer", tmp_path)
    assert marks == ["sent in a finalizer"], (marks, err[-1500:])
    assert "Traceback" not in err and status == 130, (status, err[-1500:])
    assert err.splitlines()[-1:] == [f"{prog}: interrupted"] and err.count("interrupted") == 1, err


def test_ctrl_c_at_every_import_of_trace_summary_is_one_line_and_130(tmp_path):
    """Each module imported from the package on, one run each: its own, Python's (json, gzip),
    the kineto package's readers, ``command_line`` and its imports."""
    status, out, err, marks = _run(SUMMARY, "count", tmp_path)
    assert status == 0 and err == "", err[-1500:]
    names = marks[0].split()
    assert names[0] == "overlap_course" and "overlap_course.traces.kineto.cli" in names, names
    failed = []
    for n, name in enumerate(names[1:], 1):
        status, _, err, marks = _run(SUMMARY, f"import {n}", tmp_path)
        if marks != [f"sent importing {name}"] or (status, err) != (130, KINETO + "\n"):
            failed.append((n, name, status, marks, err[-600:]))
    assert not failed, f"{len(failed)} of {len(names) - 1} imports: {failed[:3]}"


def test_ctrl_c_while_the_interpreter_joins_threads_is_one_line_and_130(tmp_path):
    """``main`` returned; the interpreter waits for a thread (before: a traceback, exit 0)."""
    status, out, err, marks = _run(SUMMARY, "joining threads", tmp_path)
    assert marks == ["sent while threads are joined"], (marks, err[-1500:])
    assert (status, err) == (130, KINETO + "\n"), (status, err[-1500:])
    assert json.loads(out)["device_idle_fraction"] == IDLE  # its output whole


def test_ctrl_c_after_the_last_finalizer_finds_the_command_finished(tmp_path):
    """After every finalizer of the command, it has finished: its output and exit status 0, no
    line (before: a traceback)."""
    status, out, err, marks = _run(SUMMARY, "finished", tmp_path)
    assert marks == ["sent after the last finalizer"], (marks, err[-1500:])
    assert (status, err) == (0, ""), (status, err[-1500:])
    assert json.loads(out)["device_idle_fraction"] == IDLE


def _ctrl_c_from_outside(tmp_path: Path, at: str, when, presses: int = 1, argv=SUMMARY):
    """Start trace summary; once the mark file holds ``when``'s line, SIGINT its process group
    ``presses`` times, as a terminal's Ctrl-C does."""
    env, mark = _env(tmp_path, at)
    proc = subprocess.Popen([sys.executable, *argv], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while when[0] not in _marks(mark) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(when[1])
        for _ in range(presses):
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # it had finished
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err, _marks(mark)


@pytest.mark.timeout(120)
def test_a_ctrl_c_in_a_slow_finalizer_lets_it_end_then_is_one_line_and_130(tmp_path):
    """The finalizers run to their end (an engine's ``close`` is one), then the line."""
    status, out, err, marks = _ctrl_c_from_outside(tmp_path, "slow finalizer", ("sleeping", 0.2))
    assert marks == ["sleeping", "slept"], (marks, err[-1500:])
    assert (status, err) == (130, KINETO + "\n"), (status, err[-1500:])
    assert json.loads(out)["device_idle_fraction"] == IDLE


@pytest.mark.timeout(120)
def test_a_second_ctrl_c_in_a_slow_finalizer_ends_the_command_at_once(tmp_path):
    status, _, err, marks = _ctrl_c_from_outside(tmp_path, "slow finalizer", ("sleeping", 0.2),
                                                 presses=2)
    assert marks == ["sleeping"], (marks, err[-1500:])
    assert (status, err) == (130, KINETO + "\n"), (status, err[-1500:])


def _long_trace(path: Path) -> Path:
    """The shipped AlexNet trace 40 times over, one after another: half a second of summary."""
    import gzip

    with gzip.open(ROOT / "overlap_course" / "traces" / "a100" / "a100_alexnet.json.gz") as f:
        trace = json.load(f)
    timed = [e for e in trace["traceEvents"] if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    trace["traceEvents"] = [{**e, "ts": e["ts"] + k * span} for k in range(40) for e in timed]
    path.write_text(json.dumps(trace), encoding="utf-8")
    return path


@pytest.mark.timeout(300)
def test_ctrl_c_from_outside_at_any_moment_is_one_line_or_a_finished_command(tmp_path):
    """A sweep of delays from ``command_line``'s import past the command's end (summary of a
    long trace): each run is interrupted (the line, 130) or had finished (its whole output, exit
    0) -- never a traceback.  Where each delay lands depends on the machine's load: the tests
    above hit each phase for sure."""
    argv = ["-m", "overlap_course.traces.kineto", "summary", str(_long_trace(tmp_path / "t.json"))]
    whole = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120).stdout
    outcomes = {}
    for delay in [0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5]:
        status, out, err, _ = _ctrl_c_from_outside(tmp_path, "started", ("started", delay),
                                                   argv=argv)
        if (status, err) == (130, KINETO + "\n"):
            outcomes[delay] = "interrupted"
        else:
            assert (status, err, out == whole) == (0, "", True), (delay, status, err[-1500:])
            outcomes[delay] = "finished"
    assert "interrupted" in outcomes.values(), outcomes


SERVICE = ["-m", "overlap_course.progress_service", "--db", "room.sqlite"]
# Not by `python -m` (by runpy here; a hub may run the file alone, beside the four it imports,
# docs/jupyterhub.md): the service's own first lines.
SERVICE_ALONE = ["-c", "import runpy; runpy.run_module('overlap_course.progress_service', "
                 "run_name='__main__', alter_sys=True)", "--db", "room.sqlite"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, at", [(SERVICE, "import 1"), (SERVICE, "import argparse"),
                                      (SERVICE_ALONE, "import argparse")],
                         ids=["python -m, first import", "python -m, argparse", "alone, argparse"])
def test_the_service_stopped_in_its_first_imports_stops_cleanly(argv, at, tmp_path):
    """The hub stops its service with SIGINT: a clean stop, exit 0 and no line, from the first
    import after the package's (before: at argparse's import, a traceback)."""
    pytest.importorskip("tornado")
    status, _, err, marks = _run(argv, at, tmp_path)
    assert len(marks) == 1 and marks[0].startswith("sent importing"), (marks, err[-1500:])
    assert (status, err) == (0, ""), (status, err[-1500:])


@pytest.mark.timeout(120)
def test_a_sigint_while_the_service_ends_changes_nothing(tmp_path):
    """Once its main returned it is stopping: another SIGINT (the hub's, a second Ctrl-C) in a
    finalizer was a ``SystemExit`` traceback.  Without a hub, main refuses to serve (2)."""
    pytest.importorskip("tornado")
    try:
        import jupyterhub  # noqa: F401
        pytest.skip("with a hub installed the service would serve")
    except ImportError:
        pass
    status, _, err, marks = _run(SERVICE, "finalizer", tmp_path)
    assert marks == ["sent in a finalizer"], (marks, err[-1500:])
    assert (status, err.count("\n")) == (2, 1) and "JupyterHub environment" in err, err[-1500:]


# A terminal's Ctrl-C (run.sh and its children) as run.sh's Python says which version it is.
RUN_SH_SITE = """
import os, signal, sys
if os.environ.pop("CTRL_C_RUN_SH", ""):
    sys.addaudithook(lambda event, args: event == "import" and args[0] == "platform"
                     and os.killpg(0, signal.SIGINT))
"""


@pytest.mark.timeout(120)
def test_ctrl_c_while_run_sh_checks_its_setup_is_one_line_and_130(tmp_path):
    """Every ``./run.sh`` command first asks the .venv's Python its version: a Ctrl-C there was
    that Python's ``KeyboardInterrupt`` traceback, and run.sh died of it without a word."""
    for name in ("run.sh", "pyproject.toml", "environment.yml", "scripts/install_torch.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(RUN_SH_SITE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "CTRL_C_RUN_SH": "1"}
    env.pop("PYTHON", None)
    done = subprocess.run(["bash", str(tmp_path / "run.sh"), "trace", "summary", TRACE],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          start_new_session=True, preexec_fn=_as_from_a_terminal)
    assert (done.returncode, done.stderr) == (130, "run.sh: interrupted\n"), done.stderr[-1500:]
    assert not (tmp_path / ".venv" / ".run-sh-setup").exists()  # it stopped before setting up
