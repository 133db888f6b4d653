"""Issue 34, round twelve, the command lines (fixer cliA): cases 13, 22, 11 and 5.

13: ``notebooks check | head`` (and ``images``) ended with exit 2 and a "Broken pipe" line,
where every other command ends quietly: notebooks' ``main`` caught stdout's ``OSError`` itself.
22: ``COMMAND --help > /dev/full`` was exit 0 and silence: argparse swallows the failed write.
11: a stored notebook of the wrong shape was a traceback under ``notebooks check``,
``setup_cell check`` and ``grading check``, a cut one a line naming no notebook.
5: ``notebooks images`` on a full disk cut the notebook in half in place, and the message
named no file.  Each test failed before the fix."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _plain_notebook(path: Path, text: str = "no figures here") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(text), nbformat.v4.new_code_cell("1 + 1")]
    nb.cells[1].execution_count = 1
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("args", [["check"], ["images", "plain.ipynb"]])
def test_notebooks_end_quietly_when_the_reader_is_gone(tmp_path, args):
    _plain_notebook(tmp_path / "plain.ipynb")
    read, write = os.pipe()
    os.close(read)  # `| head` that took what it wanted before the first line
    proc = subprocess.Popen([sys.executable, "-m", "overlap_course.build.notebooks", *args],
                            stdout=write, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=ENV)
    os.close(write)
    _, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (0, "")


@pytest.mark.parametrize("args", [["-m", "overlap_course.traces.kineto", "--help"],
                                  ["-m", "overlap_course.build.notebooks", "--help"],
                                  ["-m", "overlap_course.build.grading", "check", "--help"],
                                  [str(ROOT / "site" / "build.py"), "--help"]])
def test_help_that_cannot_be_written_is_one_line_and_exit_2(args):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=ENV)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot write to standard output" in done.stderr


def test_help_cut_by_its_reader_is_still_quiet():
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.Popen([sys.executable, "-m", "overlap_course.traces.kineto", "--help"],
                            stdout=write, stderr=subprocess.PIPE, text=True, env=ENV)
    os.close(write)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")


JUNK = {"cells a number": '{"cells": 5}', "a list": "[]",
        "nbformat_minor 1e400": '{"nbformat": 4, "nbformat_minor": 1e400, "cells": [], '
                                '"metadata": {}}',
        "cut short": '{\n "cells": [\n  {\n   "cell_type": "mark',
        "100,000 [": "[" * 100_000}


@pytest.fixture
def tree(tmp_path):
    """A copy of the course's notebooks and code, to spoil."""
    for folder in ("overlap_course", "toy_engine", "notebooks", "exercises", "solutions",
                   "source"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize("junk", list(JUNK))
def test_a_junk_stored_notebook_is_refused_naming_it_in_process(tree, junk):
    from overlap_course.build import grading, notebooks, setup_cell

    for check, folder in ((notebooks.check, "notebooks"), (setup_cell.problems, "notebooks"),
                          (grading.check, "source")):
        target = sorted((tree / folder).glob("*.ipynb"))[0]
        whole = target.read_text()
        target.write_text(JUNK[junk])
        with pytest.raises(ValueError, match=target.name):
            check(tree)
        target.write_text(whole)


@pytest.mark.parametrize("command, folder", [
    (["overlap_course.build.notebooks", "check"], "notebooks"),
    (["overlap_course.build.setup_cell", "check"], "notebooks"),
    (["overlap_course.build.grading", "check"], "source")])
def test_a_junk_stored_notebook_is_one_line_and_exit_2(tree, command, folder):
    target = sorted((tree / folder).glob("*.ipynb"))[0]
    target.write_text('{"cells": 5}')
    done = subprocess.run([sys.executable, "-m", *command], cwd=tree, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tree)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and target.name in done.stderr, done.stderr
    assert "not a notebook" in done.stderr


def test_images_on_a_full_disk_leave_the_notebook_whole_and_name_it(tmp_path):
    path = _plain_notebook(tmp_path / "mine.ipynb", "my notes " * 20_000)
    before = path.read_bytes()
    limit = len(before) // 2  # RLIMIT_FSIZE stands in for a full disk (no root needed)
    done = subprocess.run(
        [sys.executable, "-m", "overlap_course.build.notebooks", "images", str(path)],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
        capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr, done.stderr
    assert path.read_bytes() == before
    json.loads(path.read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.ipynb"]  # no .partial left


def test_a_written_notebook_keeps_its_mode(tmp_path):
    from overlap_course.build.setup_cell import read_notebook, write_notebook

    path = _plain_notebook(tmp_path / "mine.ipynb")
    path.chmod(0o640)
    nb = read_notebook(path)
    nb.cells[0].source = "changed"
    write_notebook(nb, path)
    assert path.stat().st_mode & 0o777 == 0o640
    assert read_notebook(path).cells[0].source == "changed"


@pytest.mark.parametrize("junk", [["JUNK"], ["--forse"], ["-f"], ["--force=yes"],
                                  ["--force", "x"]])
def test_run_sh_setup_refuses_what_it_does_not_know(junk):
    """Refused before setup looks at .venv (case 19).  PYTHON names no program, so that a
    tree without .venv installs nothing where setup would go on (before the fix)."""
    done = subprocess.run([str(ROOT / "run.sh"), "setup", *junk], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PYTHON": "/nonexistent/python3"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and junk[-1] in done.stderr and "--force" in done.stderr


def test_run_tests_with_an_option_pytest_does_not_know_is_a_usage_error(tmp_path):
    """pytest's own refusal, which names the option (case 21), and exit 2: no timing line
    after it, and not pytest's 4."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_tests.py"),
                           "--no-such-option-xyz"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert done.returncode == 2, done.stderr
    assert "--no-such-option-xyz" in done.stderr
    assert "run_tests:" not in done.stdout + done.stderr
    assert len((done.stdout + done.stderr).strip().splitlines()) <= 4


def test_run_tests_version_is_printed_once():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_tests.py"), "--version"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0
    assert (done.stdout + done.stderr).count("pytest") == 1, done.stdout + done.stderr


@pytest.mark.skipif(not (ROOT / ".venv" / ".run-sh-setup").is_file() or sys.platform != "linux",
                    reason="run.sh would set up .venv first; the held folder needs /proc")
def test_run_sh_trace_from_a_folder_removed_under_the_terminal_runs_there(tmp_path):
    """Case 20: `cd "$CALLER"` failed, three bash lines and exit 1; the command runs now, in
    the removed folder, as `python -m` does (bash's own `shell-init` line is before run.sh)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    done = subprocess.run(f"cd {gone} && rmdir {gone} && {ROOT / 'run.sh'} trace summary "
                          f"a100_alexnet", shell=True, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["trace_name"]
    # only bash's own lines about the folder, from its start (no script can keep them back)
    assert all("error retrieving current directory" in line
               for line in done.stderr.splitlines()), done.stderr
