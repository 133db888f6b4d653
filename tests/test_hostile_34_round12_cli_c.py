"""Issue 34, round twelve, the command lines (fixer clibrowser): cases 1, 3 and 12.

1: ``notebooks execute`` and Ctrl-C while a cell ran or the kernel started was a traceback
(nbclient's ``DeadKernelError`` then ``AssertionError``, the kernel's ``ZMQError``, a
``CancelledError``) and exit 1 or 2: nbclient's own SIGINT handler replaced the course's.
3: with a BROWSER_PATH that never answers, Ctrl-C (twice) during ``notebooks images`` (handout,
``site --draw``) waited 60 s for the browser's start, then printed a second line.
12: a BROWSER_PATH that writes to its output printed choreographer's JSONError traceback.
Each test failed before the fix."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
NOTEBOOKS = [sys.executable, "-m", "overlap_course.build.notebooks"]


def _start(args, cwd, env=ENV) -> subprocess.Popen:
    """The command in a session of its own, as a terminal starts it (Ctrl-C: its group)."""
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _pids(found) -> list[str]:
    """The processes for which ``found(pid)`` holds."""
    pids = []
    for entry in glob.glob("/proc/[0-9]*"):
        try:
            if found(entry):
                pids.append(entry.rsplit("/", 1)[1])
        except OSError:  # ended meanwhile
            pass
    return pids


def _alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait_for(condition, proc, limit=120.0):
    deadline = time.monotonic() + limit
    while proc.poll() is None and time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"never happened; the command said {proc.communicate()}")


def _kernels_of(proc):
    mark = f"JPY_PARENT_PID={proc.pid}\0".encode()
    return lambda: _pids(lambda entry: mark in Path(entry, "environ").read_bytes())


def _ends_in_one_line(proc, prog: str, within: float = 120.0) -> str:
    try:
        _, err = proc.communicate(timeout=within)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if "running over TCP" not in line]  # the kernel's
    assert (proc.returncode, lines) == (130, [f"{prog}: interrupted"]), err[-3000:]
    return err


@pytest.mark.parametrize("when", ["a cell runs", "the kernel starts"])
@pytest.mark.parametrize("to", ["the group", "the process"])
def test_ctrl_c_in_notebooks_execute_is_one_line_and_ends_the_kernel(tmp_path, when, to):
    started = tmp_path / "started"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(120)")]
    nbformat.write(nb, tmp_path / "slow.ipynb")
    before = (tmp_path / "slow.ipynb").read_bytes()
    proc = _start([*NOTEBOOKS, "execute", "slow.ipynb"], tmp_path)
    kernels = _wait_for(_kernels_of(proc), proc)
    if when == "a cell runs":
        _wait_for(started.exists, proc)
        time.sleep(0.3)
    (os.killpg if to == "the group" else os.kill)(proc.pid, signal.SIGINT)
    _ends_in_one_line(proc, "notebooks")
    assert (tmp_path / "slow.ipynb").read_bytes() == before
    deadline = time.monotonic() + 10
    while any(map(_alive, kernels)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, kernels)), "the kernel was left running"


def _figure_notebook(tmp_path: Path) -> Path:
    path = tmp_path / "figures.ipynb"
    shutil.copy(ROOT / "notebooks" / "00_start_here.ipynb", path)  # has Plotly figures
    return path


def _fake_browser(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "fake_browser.sh"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return fake


def test_ctrl_c_while_the_browser_never_answers_ends_at_once(tmp_path):
    notebook = _figure_notebook(tmp_path)
    before = notebook.read_bytes()
    fake = _fake_browser(tmp_path, "exec sleep 300")
    proc = _start([*NOTEBOOKS, "images", notebook.name], tmp_path,
                  {**ENV, "BROWSER_PATH": str(fake)})
    browsers = _wait_for(lambda: _pids(
        lambda entry: str(fake).encode() in Path(entry, "cmdline").read_bytes()), proc)
    time.sleep(0.5)
    pressed = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    err = _ends_in_one_line(proc, "notebooks")
    took = time.monotonic() - pressed
    assert took < 20, f"{took:.0f} s after Ctrl-C (the browser's start waits 60 s): {err!r}"
    assert notebook.read_bytes() == before
    time.sleep(0.5)
    assert not any(map(_alive, browsers)), "the browser was left running"


@pytest.mark.parametrize("body", ["echo junk\nexit 0", "echo junk >&2\necho '{bye}'\nexit 0"])
def test_a_browser_path_that_writes_junk_is_one_line(tmp_path, body):
    notebook = _figure_notebook(tmp_path)
    fake = _fake_browser(tmp_path, body)
    done = subprocess.run([*NOTEBOOKS, "images", notebook.name], cwd=tmp_path,
                          env={**ENV, "BROWSER_PATH": str(fake)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("notebooks images: error: ")
    assert f"BROWSER_PATH={str(fake)!r}" in done.stderr
