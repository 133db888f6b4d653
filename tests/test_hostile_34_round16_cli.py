"""Issue 34, round sixteen, the command lines (helper cli16).

Case 1: a command started with stdout or stderr closed (``>&-``, ``2>&-``) pointed the
descriptor at /dev/null close-on-exec (``os.open`` returned the closed descriptor itself, and
``dup2`` onto it changed nothing; or sys.stdout's /dev/null file took descriptor 2): every
child started with that stream closed, and ``notebooks execute``'s Jupyter kernel died.

Case 2: the output-folder lock opened the folder read-only, so ``trace export`` into a folder
one may write but not list (``-wx``) was refused as "a directory you can write".

Case 3: junk arguments to ``scripts/record_traces.py``, ``profile_cuda.py`` and
``measure_notebooks.py`` were tracebacks (some after an engine's warm-up) or argparse's usage.

Case 4: the lock made OUT's folders before recording: a refused, failed or interrupted export
left them, empty."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from overlap_course.command_line import locked

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
EXPORT = [sys.executable, "-m", "overlap_course.traces.kineto", "export"]


def _one_error_line(done: subprocess.CompletedProcess, prog: str, *words: str) -> None:
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0].startswith(f"{prog}: error: ") and "Traceback" not in done.stderr, lines
    assert all(word in lines[0] for word in words), lines[0]


def _notebook(path: Path, source: str = "print(1)") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)
    return path


# --- case 1: a closed stdout or stderr at start, and the command's children --------------------

CHILD_SEES = r'''
import os, subprocess, sys
from overlap_course.command_line import run
def main():
    child = subprocess.run([sys.executable, "-c", "import sys; print(sys.stdout is None, "
                            "sys.stderr is None, file=open(sys.argv[1], 'w'))", sys.argv[1]])
    return child.returncode
run("probe", main)
'''


@pytest.mark.parametrize("closed", [">&-", "2>&-", ">&- 2>&-"])
def test_a_child_of_a_command_started_with_a_closed_stream_gets_it_open(tmp_path, closed):
    """Before: ``True`` for each closed stream (the child's sys.stdout/stderr was None)."""
    (tmp_path / "probe.py").write_text(CHILD_SEES)
    seen = tmp_path / "seen.txt"
    done = subprocess.run(["bash", "-c", f'"$0" probe.py "$1" {closed}', sys.executable,
                           str(seen)], cwd=tmp_path, env=ENV, timeout=120)
    assert done.returncode == 0
    assert seen.read_text() == "False False\n"


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
def test_notebooks_execute_with_a_closed_stream_executes_them(tmp_path, closed):
    """Before: the kernel died (exit 2, nothing executed, two tracebacks with stdout closed)."""
    nbs = [_notebook(tmp_path / f"n{i}.ipynb") for i in (1, 2)]
    err = tmp_path / "err.txt"
    keep = f" 2>{err}" if closed == ">&-" else f" >{err}"
    done = subprocess.run(["bash", "-c", f'"$0" -m overlap_course.build.notebooks execute "$1" '
                           f'"$2" {closed}{keep}', sys.executable, *map(str, nbs)],
                          cwd=tmp_path, env=ENV, timeout=300)
    assert done.returncode == 0, err.read_text()
    assert "Traceback" not in err.read_text()
    assert all(nbformat.read(nb, as_version=4).cells[0].outputs for nb in nbs)


# --- cases 2 and 4: the output-folder lock ----------------------------------------------------

def _as_a_user() -> list[str]:
    """Root passes every permission check: drop that, or run as the user one is."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: no permission check to meet")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_a_trace_export_into_a_folder_one_may_write_but_not_list_writes(tmp_path):
    """Before: "cannot write 'wx/x.json': Permission denied; choose a path in a directory
    you can write", exit 2: the lock opened the folder to read it."""
    wx = tmp_path / "wx"
    wx.mkdir()
    wx.chmod(0o333)
    try:
        done = subprocess.run([*_as_a_user(), *EXPORT, "wx/x.json", "cpu_zos"], cwd=tmp_path,
                              env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        wx.chmod(0o755)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert [p.name for p in wx.iterdir()] == ["x.json"]


def test_a_refused_trace_export_leaves_no_folder_it_made(tmp_path):
    """Before: new/ and new/deep/ were left, empty, after "prompt 5 is too long"."""
    done = subprocess.run([*EXPORT, "new/deep/x.json", "--prompts", "64", "--max-new-tokens",
                           "200"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=600)
    _one_error_line(done, "python -m overlap_course.traces.kineto", "too long")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_the_lock_removes_the_folders_it_made_when_its_block_fails(tmp_path, error):
    (tmp_path / "kept").mkdir()
    with pytest.raises(error):
        with locked(tmp_path / "kept" / "a" / "b", "busy"):
            raise error()
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert list((tmp_path / "kept").iterdir()) == []


def test_the_lock_keeps_its_folders_when_the_block_ends_well_or_they_hold_a_file(tmp_path):
    with locked(tmp_path / "a" / "b", "busy"):
        pass
    assert (tmp_path / "a" / "b").is_dir()
    with pytest.raises(ValueError):
        with locked(tmp_path / "c" / "d", "busy"):
            (tmp_path / "c" / "file").write_text("someone else's")
            raise ValueError()
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["file"]


def test_the_lock_still_refuses_a_folder_held_by_another(tmp_path):
    with locked(tmp_path, "held"):
        with pytest.raises(ValueError, match="^busy now$"):
            locked(tmp_path, "busy now")


# --- case 3: junk arguments to the scripts ----------------------------------------------------

SMALL = ["--modes", "serial", "--host-overheads", "0", "--requests", "2", "--max-new-tokens", "4",
         "--repeats", "1"]


@pytest.mark.parametrize("script, args, words", [
    ("record_traces", ["--repeats", "0"], ["--repeats", "0"]),
    ("record_traces", ["--batch-size", "0"], ["--batch-size"]),
    ("record_traces", ["--requests", "abc"], ["--requests", "abc"]),
    ("record_traces", ["--requests", "0"], ["--requests"]),
    ("record_traces", ["--max-new-tokens", "0"], ["--max-new-tokens"]),
    ("record_traces", ["--drafts", "-1"], ["--drafts"]),
    ("record_traces", ["--host-overheads", "nan"], ["--host-overheads", "nan"]),
    ("record_traces", ["--max-new-tokens", "250"], ["too long"]),
    ("profile_cuda", ["--prompts", "0"], ["--prompts"]),
    ("profile_cuda", ["--prompts", "-3"], ["--prompts"]),
    ("profile_cuda", ["--max-new-tokens", "0"], ["--max-new-tokens"]),
    ("profile_cuda", ["--max-new-tokens", "250"], ["too long"]),
])
def test_junk_arguments_to_a_recording_script_are_one_line(tmp_path, script, args, words):
    """Before: max() of nothing after a warm-up, the engine's tracebacks, argparse's usage."""
    base = SMALL if script == "record_traces" else ["--device", "cpu"]
    out = tmp_path / "made" / "out"
    done = subprocess.run([sys.executable, str(SCRIPTS / f"{script}.py"), *base, *args,
                           "--out", str(out)], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    _one_error_line(done, script, *words)
    assert list(tmp_path.iterdir()) == []  # no --out folder made for nothing


@pytest.mark.parametrize("args, words", [
    (["--record", "{tmp}/ok.ipynb"], ["--record", "ok.ipynb"]),
    (["{root}/README.md"], ["README.md", "not a notebook"]),
    (["{tmp}/missing.ipynb"], ["missing.ipynb"]),
    (["{tmp}/ok.ipynb", "--json", "{tmp}/"], ["--json", "folder"]),
])
def test_junk_arguments_to_measure_notebooks_are_one_line_before_it_measures(tmp_path, args,
                                                                              words):
    _notebook(tmp_path / "ok.ipynb")
    argv = [a.format(tmp=tmp_path, root=ROOT) for a in args]
    done = subprocess.run([sys.executable, str(SCRIPTS / "measure_notebooks.py"), *argv],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    _one_error_line(done, "measure_notebooks", *words)
    assert done.stdout == ""  # refused before the table's header: nothing measured


def test_measure_notebooks_names_a_notebook_outside_the_repository_and_writes_its_json(tmp_path):
    """Before: measured, then ``relative_to`` raised: no row, no --json."""
    nb = _notebook(tmp_path / "ok.ipynb")
    done = subprocess.run([sys.executable, str(SCRIPTS / "measure_notebooks.py"), str(nb),
                           "--json", "t.json"], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert f"| `{nb}` | 1 |" in done.stdout
    assert [r["notebook"] for r in json.loads((tmp_path / "t.json").read_text())] == [str(nb)]


def test_measure_notebooks_says_in_one_line_which_notebook_failed(tmp_path):
    nb = _notebook(tmp_path / "bad.ipynb", "1/0")
    done = subprocess.run([sys.executable, str(SCRIPTS / "measure_notebooks.py"), str(nb)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (1, 1), done.stderr
    assert lines[0].startswith(f"measure_notebooks: error: {nb} failed to execute"), lines
    assert "ZeroDivisionError" in lines[0]
