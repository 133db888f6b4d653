"""Issue 34, round twenty, the command lines (fixer cli20; /work/round20/cli/REPORT.md).

1. ``measure_notebooks --record exercises/02_serial_loop.ipynb --json EX``: --json was written
   over the exercise (only the notebooks measured and learner_times.json were refused), then
   the update read it: a traceback, the exercise lost.  Now every file the update reads or
   rewrites is refused before measuring (``update_files``, beside the code that reads them).
2. trace export A locked new/o and recorded; new/o was removed and export B made and locked a
   new one; A then re-made the folder (``mkdir(exist_ok=True)``) and wrote into B's.
3. The same, new/o replaced by a file: "cannot write 'new/o/t_serial.json': File exists".
   Now both are one line naming the folder (``locked.still_held``), exit 2, nothing written.
4. In a removed current folder, ``measure_notebooks --json x.json`` said "No such file or
   directory" (no path) and ``grading course x`` named x; now both say the folder was deleted.

Each test failed before the fix."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from overlap_course.out_folders import locked
from overlap_course.traces.kineto import cli

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
MEASURE = ROOT / "scripts" / "measure_notebooks.py"


def _measure_module():
    spec = importlib.util.spec_from_file_location("measure_notebooks_cli20", MEASURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- case 1: --record's --json on a file the update reads or rewrites ----------------------

@pytest.mark.parametrize("json_path", [
    "exercises/02_serial_loop.ipynb", "./source/02_serial_loop.ipynb", "README.md",
    "docs/instructor_guide.md", "notebooks/00_start_here.ipynb", "exercises/03_zos_loop.ipynb"])
def test_record_json_on_a_file_the_update_uses_is_refused_before_measuring(
        json_path, monkeypatch, capsys):
    """Before: measured (here: stubbed, exit 1), then the file replaced by the JSON."""
    module = _measure_module()
    measured, written = [], []
    monkeypatch.setattr(module, "measure", lambda path, tmp: measured.append(path) or 1 / 0)
    monkeypatch.setattr(module, "write_file", lambda *args: written.append(args))
    monkeypatch.chdir(ROOT)
    status = module.main(["--record", "exercises/02_serial_loop.ipynb", "--json", json_path])
    err = capsys.readouterr().err
    assert status == 2 and measured == [] and written == [], err
    assert err.count("\n") == 1 and "--json" in err and "which the command reads" in err, err


def test_update_files_names_every_file_the_update_reads(monkeypatch):
    """The refusal's list is the update's own (``_copies``, README, GUIDE), not a second one."""
    module = _measure_module()
    read = []
    real_read, real_text = nbformat.read, Path.read_text
    monkeypatch.setattr(nbformat, "read", lambda path, *a, **k: read.append(Path(path)) or
                        real_read(path, *a, **k))
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self) or
                        real_text(self, *a, **k))
    module.updated_files(json.loads(real_text(module.TIMES)))
    assert read and set(read) <= set(module.update_files()), set(read) - set(module.update_files())


# --- cases 2 and 3: OUT's folder removed or replaced while an export holds it ---------------

def _export_while(tmp_path, monkeypatch, capsys, meanwhile):
    """``trace export new/o/t.json --mode both``, ``meanwhile()`` done while it "records"."""
    monkeypatch.chdir(tmp_path)
    timeline = cli._load_timeline("cpu_zos")

    def record(mode, args):
        if mode == "serial":
            meanwhile()
        return timeline

    monkeypatch.setattr(cli, "_record", record)
    status = cli.main(["export", "new/o/t.json", "--mode", "both"])
    return status, capsys.readouterr().err


def test_export_never_writes_into_a_folder_another_run_locked(tmp_path, monkeypatch, capsys):
    """Before: exit 0, A's pair written into B's locked new/o."""
    other = []

    def another_export_takes_it():
        shutil.rmtree("new/o")
        other.append(locked(Path("new/o"), "busy").__enter__())

    status, err = _export_while(tmp_path, monkeypatch, capsys, another_export_takes_it)
    try:
        assert status == 2, err
        assert err.count("\n") == 1 and "OUT's folder 'new/o' was removed or replaced" in err, err
        assert "nothing written" in err and os.listdir(tmp_path / "new" / "o") == []
        other[0].still_held("B's folder")  # left as B made it
    finally:
        other[0].__exit__(None, None, None)


def test_export_whose_folder_became_a_file_says_so(tmp_path, monkeypatch, capsys):
    """Before: "cannot write 'new/o/t_serial.json': File exists" (no such file exists)."""

    def replaced_by_a_file():
        shutil.rmtree("new/o")
        Path("new/o").write_text("a learner's file\n")

    status, err = _export_while(tmp_path, monkeypatch, capsys, replaced_by_a_file)
    assert status == 2 and "File exists" not in err, err
    assert "OUT's folder 'new/o' was removed or replaced" in err, err
    assert (tmp_path / "new" / "o").read_text() == "a learner's file\n"


def test_a_lock_whose_folder_was_replaced_removes_nothing_of_the_new_one(tmp_path):
    """The refused run made new/o; removing "its" folder on the way out removed B's."""
    a = locked(tmp_path / "new" / "o", "busy").__enter__()
    shutil.rmtree(tmp_path / "new")
    b = locked(tmp_path / "new" / "o", "busy").__enter__()
    try:
        with pytest.raises(ValueError, match="was removed or replaced while this run held it"):
            a.still_held("--out")
        a.__exit__(ValueError, ValueError(), None)
        assert (tmp_path / "new" / "o").is_dir()
        b.still_held("--out")
    finally:
        b.__exit__(None, None, None)


# --- case 4: an output named relative to a removed current folder --------------------------

@pytest.mark.skipif(sys.platform != "linux", reason="a removed current folder: Linux")
@pytest.mark.timeout(200)
@pytest.mark.parametrize("args, prog, name", [
    ([str(MEASURE), "--json", "x.json", "NB"], "measure_notebooks", "--json 'x.json'"),
    (["-m", "overlap_course.build.grading", "course", "x"], "grading course", "DEST 'x'")])
def test_an_output_in_a_removed_folder_says_the_folder_was_deleted(tmp_path, args, prog, name):
    """Before: "No such file or directory" (no path; or naming x, which is not what is gone)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    gone = tmp_path / "gone"
    gone.mkdir()
    args = [str(tmp_path / "nb.ipynb") if a == "NB" else a for a in args]
    done = subprocess.run([sys.executable, *args], cwd=gone, env=ENV, capture_output=True,
                          text=True, timeout=180, preexec_fn=lambda: os.rmdir(gone))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"{prog}: error: {name}: the current folder was deleted (nothing can "
                           f"be written there): cd to a folder that exists and run it again\n")
