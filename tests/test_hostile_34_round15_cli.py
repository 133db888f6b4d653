"""Issue 34, round fifteen, the command lines (helper clitests15).

Case 1: ``PYTHON=/bin/echo ./run.sh ...`` beside an existing .venv said "not PYTHON=/bin/echo's
-V", as if ``-V`` were echo's Python version (``/bin/true``: nothing).  Now a program is given
its version only when it answers as a Python does; otherwise the note says it is not one.

Case 2: ``scripts/profile_cuda.py``, ``measure_notebooks.py`` and ``record_traces.py`` had none
of the course's Ctrl-C rule: a ``KeyboardInterrupt`` traceback, a notebook left running, a
half-written file.  Now each says ``PROG: interrupted`` in one line and exits 130, as every
command does (``overlap_course.ctrl_c``), and writes its files whole or not at all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


# --- case 1: run.sh's note on a PYTHON that runs but is no Python -------------------------------

def _course_with_a_venv(tmp_path: Path) -> Path:
    bin_ = tmp_path / "course" / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.11.7"\nexit 3\n')
    (bin_ / "python").chmod(0o755)
    shutil.copy2(ROOT / "run.sh", tmp_path / "course" / "run.sh")
    return tmp_path / "course" / "run.sh"


def _run_sh(run_sh: Path, python: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(run_sh), "setup"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHON=python), stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("junk", ["/bin/echo", "/bin/true", "/bin/false"])
def test_run_sh_says_a_python_that_is_no_python_is_not_one(tmp_path, junk):
    proc = _run_sh(_course_with_a_venv(tmp_path), junk)
    note = [line for line in proc.stderr.splitlines() if "already holds" in line]
    assert note == [f"run.sh: .venv already holds Python 3.11.7, not PYTHON={junk}'s (not a "
                    f"Python: its -V names no Python version); using .venv (rm -rf .venv to "
                    f"switch)"], proc.stderr


def test_run_sh_still_gives_a_real_pythons_version(tmp_path):
    other = tmp_path / "python3.13"
    other.write_text('#!/bin/sh\necho "Python 3.13.0"\n')
    other.chmod(0o755)
    proc = _run_sh(_course_with_a_venv(tmp_path), str(other))
    assert f"not PYTHON={other}'s Python 3.13.0; using .venv" in proc.stderr, proc.stderr


def test_run_sh_refuses_a_program_that_is_no_python_without_quoting_it(tmp_path):
    """With no .venv yet: the refusal said "/bin/echo is -V; the course needs Python 3.11"."""
    (tmp_path / "course").mkdir()
    shutil.copy2(ROOT / "run.sh", tmp_path / "course" / "run.sh")
    proc = _run_sh(tmp_path / "course" / "run.sh", "/bin/echo")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("run.sh: /bin/echo is (not a Python: its -V names no Python "
                                  "version); the course needs Python 3.11 or newer"), proc.stderr
    assert not (tmp_path / "course" / ".venv").exists()


# --- case 2: the scripts' Ctrl-C ------------------------------------------------------------

# Imported by Python's site first: CTRL_C_AT says where the script sends itself SIGINT, once --
# "import M" when it first imports M, "write NAME" when it opens a file whose name holds NAME for
# writing (round 17: a set of files is written under temporary names beside its own).
SITECUSTOMIZE = r'''
import os, signal, sys

AT = os.environ.pop("CTRL_C_AT", "")


def hook(event, args):
    global AT
    kind, _, what = AT.partition(" ")
    if (kind == "import" and event == "import" and args[0] == what) or (
            kind == "write" and event == "open" and isinstance(args[0], str)
            and what in os.path.basename(args[0]) and any(c in (args[1] or "") for c in "wxa")):
        AT = ""
        os.kill(os.getpid(), signal.SIGINT)


if AT:
    sys.addaudithook(hook)
'''


def _script(tmp_path: Path, at: str, *argv: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "CTRL_C_AT": at}
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("script, module, arg", [
    ("profile_cuda", "argparse", "--help"), ("profile_cuda", "torch", "--out=out"),
    ("record_traces", "torch", "--help"), ("measure_notebooks", "nbformat", "--help")])
def test_a_script_given_ctrl_c_while_it_starts_says_one_line(tmp_path, script, module, arg):
    """Before: a KeyboardInterrupt traceback (profile_cuda's torch: main's import of it)."""
    done = _script(tmp_path, f"import {module}", str(SCRIPTS / f"{script}.py"), arg)
    assert (done.returncode, done.stderr) == (130, f"{script}: interrupted\n"), done.stderr


def test_profile_cuda_given_ctrl_c_while_it_writes_leaves_no_half_written_trace(tmp_path):
    out = tmp_path / "out"
    done = _script(tmp_path, "write torch_profile_zos.json.gz", str(SCRIPTS / "profile_cuda.py"),
                   "--device", "cpu", "--prompts", "1", "--max-new-tokens", "2", "--out", str(out))
    assert (done.returncode, done.stderr.splitlines()[-1:]) == (130, ["profile_cuda: interrupted"])
    assert "Traceback" not in done.stderr, done.stderr
    assert not out.exists()  # round 17: the set all or none (and no --out made for nothing)


def test_record_traces_given_ctrl_c_while_it_writes_writes_the_set_whole_then_stops(tmp_path):
    out = tmp_path / "out"
    done = _script(tmp_path, "write cpu_serial.json", str(SCRIPTS / "record_traces.py"),
                   "--device", "cpu", "--requests", "2", "--max-new-tokens", "3", "--repeats", "1",
                   "--host-overheads", "0", "--modes", "serial", "zos", "--allow-busy",
                   "--out", str(out))
    assert (done.returncode, done.stderr) == (130, "record_traces: interrupted\n"), done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["cpu_serial.json", "cpu_zos.json"]
    for path in out.iterdir():
        assert json.loads(path.read_text())["spans"]


def _sleeping_notebook(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "running"
    cell = f"open({str(mark)!r}, 'w').close()\nimport time\ntime.sleep(300)"
    path = tmp_path / "sleeper.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]), path)
    return path, mark


@pytest.mark.timeout(240)
def test_measure_notebooks_given_ctrl_c_while_a_notebook_runs_stops_it_in_one_line(tmp_path):
    """Before: a traceback, and the script waited for the notebook (a kill: it ran on)."""
    notebook, mark = _sleeping_notebook(tmp_path)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "measure_notebooks.py"), str(notebook),
                             "--json", str(tmp_path / "out.json")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its process group: a terminal's Ctrl-C
    try:
        deadline = time.monotonic() + 180
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), proc.communicate(timeout=60)
        started = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, err) == (130, "measure_notebooks: interrupted\n"), err
    _, running = psutil.wait_procs(started, timeout=30)
    assert not running, f"left running: {[p.cmdline() for p in running]}"
    assert not list((tmp_path / "tmp").iterdir()) and not (tmp_path / "out.json").exists()
