"""Issue 34, round fifteen, the command lines (helper clitests15).

Case 1: ``PYTHON=/bin/echo ./run.sh ...`` beside an existing .venv said "not PYTHON=/bin/echo's
-V", as if ``-V`` were echo's Python version (``/bin/true``: nothing).  Now a program is given
its version only when it answers as a Python does; otherwise the note says it is not one.

Case 2: ``scripts/profile_cuda.py``, ``measure_notebooks.py`` and ``record_traces.py`` had none
of the course's Ctrl-C rule: a ``KeyboardInterrupt`` traceback, a notebook left running, a
half-written file.  Now each says ``PROG: interrupted`` in one line and exits 130, as every
command does (``overlap_course.ctrl_c``), and writes its files whole or not at all."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
