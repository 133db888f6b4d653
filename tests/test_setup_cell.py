"""Every notebook's first code cell sets the course up when it is opened alone.

The cell itself, installing for real from a git URL in a fresh venv, runs in
tests/test_plain_install.py; here: it is in every notebook, written from the one address in
pyproject.toml, silent where the course is installed, and clear when the install fails.
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from overlap_course.build import setup_cell

ROOT = Path(__file__).resolve().parent.parent


def test_every_notebook_starts_with_the_current_setup_cell():
    assert setup_cell.problems() == []
    for path in setup_cell.notebooks():
        nb = nbformat.read(path, as_version=4)
        assert nb.cells[0].cell_type == "markdown", f"{path}: the setup cell comes after the title"
        assert nb.cells[1].get("id") == setup_cell.CELL_ID, path
        if path.parent.name != "source":
            assert nb.cells[1].outputs == [], f"{path}: the stored setup cell printed something"


def test_the_address_is_named_in_one_place():
    """pyproject.toml names it; the README says what it is; the notebooks carry the cell written
    from it.  No other tracked file may name it (it would go stale when it moves)."""
    url = setup_cell.repository_url()
    assert url.startswith("https://") and url in setup_cell.cell_source()
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                               text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot list the tracked files")
    written = {str(p.relative_to(ROOT)) for p in setup_cell.notebooks()}
    naming = {f for f in files if (ROOT / f).is_file() and url in _text(ROOT / f)}
    assert naming - written == {"pyproject.toml", "README.md"}, sorted(naming - written)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return ""  # a checkpoint


def test_the_cell_is_silent_where_the_course_is_installed():
    proc = subprocess.run([sys.executable, "-c", setup_cell.cell_source()], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_a_failed_install_names_the_source_and_the_fix(tmp_path):
    """Without the course (an interpreter with no packages of ours, -I: no PYTHONPATH), from a
    source that does not exist: the cell says what it tried and how to point it elsewhere."""
    base = getattr(sys, "_base_executable", sys.executable)
    missing = tmp_path / "no-such-clone"
    env = {"OVERLAP_COURSE_SOURCE": str(missing), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([base, "-I", "-c", setup_cell.cell_source()], capture_output=True,
                          text=True, timeout=120, env=env)
    probe = subprocess.run([base, "-I", "-c", "import toy_engine"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} imports toy_engine: no interpreter without the course here")
    assert proc.returncode != 0
    assert f"installing the course from {missing}" in proc.stdout, proc.stdout
    assert "ERROR" in proc.stdout, f"pip's own error is not shown in the cell:\n{proc.stdout}"
    assert "RuntimeError: pip could not install the course" in proc.stderr, proc.stderr[-2000:]
    assert setup_cell.ENV_VAR in proc.stderr.splitlines()[-1], proc.stderr[-2000:]
