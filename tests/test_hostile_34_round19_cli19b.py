"""Round nineteen's hostile cli cases 3, 5, 6 and 7 (/work/round19/cli/REPORT.md).

* 3: ``measure_notebooks.py ok.ipynb --json ok.ipynb`` wrote its JSON over the notebook it
  measured and exited 0; now refused before measuring (``command_line.not_an_input``, which
  trace export's STORED == OUT refusal shares).
* 5: in a folder removed under the terminal, every command that imports torch died with MKL's
  "Cannot load .../libtorch_cpu.so" (a false reason); now one line naming the folder, exit 2.
* 6: the progress service without jupyterhub said only "install jupyterhub" for a --db that
  open_store refuses (a link loop, /proc/self/environ, a name too long); and it refused a file
  that is not SQLite, which open_store moves aside and replaces: it no longer does.
* 7: ``progress REC`` called a whole JSON line that is not a verdict "a write cut short, or not
  text".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from overlap_course import command_line, progress
from overlap_course import progress_service as ps

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# --- case 3: measure_notebooks --json on the notebook it measures --------------------------

def _notebook(path: Path) -> bytes:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, path)
    return path.read_bytes()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("out", ["ok.ipynb", "./ok.ipynb", "link.ipynb", "ABS"])
def test_measure_notebooks_json_on_its_notebook_is_refused_before_measuring(tmp_path, out):
    """Before: the notebook was measured, then replaced by the JSON; exit 0."""
    before = _notebook(tmp_path / "ok.ipynb")
    (tmp_path / "link.ipynb").symlink_to("ok.ipynb")
    out = str(tmp_path / "ok.ipynb") if out == "ABS" else out
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_notebooks.py"),
                           "ok.ipynb", "--json", out], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--json" in done.stderr, done.stderr
    assert "names the notebook" in done.stderr and done.stdout == "", done.stderr
    assert (tmp_path / "ok.ipynb").read_bytes() == before


def test_an_output_is_refused_only_when_it_is_an_input(tmp_path):
    not_an_input = command_line.not_an_input  # new in round 19
    (tmp_path / "in.json").write_text("{}")
    os.link(tmp_path / "in.json", tmp_path / "hard.json")  # written by rename: the input stays
    not_an_input(str(tmp_path / "hard.json"), "OUT", {tmp_path / "in.json": "the input"})
    not_an_input(str(tmp_path / "new.json"), "OUT", {tmp_path / "in.json": "the input"})
    with pytest.raises(ValueError, match="OUT .* names the input, which the command reads"):
        not_an_input(str(tmp_path / "." / "in.json"), "OUT", {tmp_path / "in.json": "the input"})


# --- case 5: a command that imports torch, in a removed folder -----------------------------

@pytest.mark.skipif(sys.platform != "linux", reason="a removed current folder: Linux")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("args, prog", [
    (["-m", "overlap_course.train", "--help"], "python -m overlap_course.train"),
    (["-m", "overlap_course.measure.bench", "--repeats", "1"],
     "python -m overlap_course.measure.bench"),
    (["-m", "overlap_course.traces.kineto", "export", "/tmp/never.json", "cpu_zos"],
     "python -m overlap_course.traces.kineto"),
    ([str(ROOT / "scripts" / "record_traces.py"), "--help"], "record_traces")])
def test_a_torch_command_in_a_removed_folder_says_so_in_one_line(tmp_path, args, prog):
    """Before: exit 2 with "Intel oneMKL FATAL ERROR: Cannot load .../libtorch_cpu.so"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    command = " ".join([f"cd {gone} && rmdir {gone} && exec {sys.executable}", *args])
    done = subprocess.run(["bash", "-c", command], env=ENV, capture_output=True, text=True,
                          timeout=250)
    said = [line for line in done.stderr.splitlines()
            if "error retrieving current directory" not in line]  # bash's own
    assert done.returncode == 2 and len(said) == 1, done.stderr
    assert said[0].startswith(f"{prog}: error: the current folder was deleted"), said
    assert "cd to a folder that exists" in said[0] and not os.path.exists("/tmp/never.json")


@pytest.mark.skipif(sys.platform != "linux", reason="a removed current folder: Linux")
@pytest.mark.timeout(120)
def test_a_command_without_torch_still_runs_in_a_removed_folder(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    record = tmp_path / "p.jsonl"
    record.write_text("")
    done = subprocess.run(["bash", "-c", f"cd {gone} && rmdir {gone} && exec {sys.executable} "
                           f"-m overlap_course.progress {record}"], env=ENV,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0 and "your progress:" in done.stdout, done.stderr


# --- case 6: the service without jupyterhub, and a bad --db --------------------------------

def _no_hub(monkeypatch, capsys, db: str) -> str:
    monkeypatch.setattr(ps, "HubOAuth", None)
    assert ps.main(["--db", db]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("db", ["loop", "/proc/self/environ", "x" * 5000])
def test_the_service_without_a_hub_names_a_db_open_store_refuses(tmp_path, monkeypatch,
                                                                   capsys, db):
    """Before: "install jupyterhub" only; open_store refused each ("cannot open")."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loop2", "loop")
    os.symlink("loop", "loop2")
    if db.startswith("/proc") and not os.path.exists(db):
        pytest.skip("no /proc")
    err = _no_hub(monkeypatch, capsys, db)
    assert "cannot open the database" in err and "install jupyterhub" not in err, err
    assert sorted(os.listdir()) == ["loop", "loop2"]


def test_the_service_without_a_hub_leaves_a_non_sqlite_file_to_open_store(
        tmp_path, monkeypatch, capsys):
    """Before: refused ("left as it is"), where open_store moves it aside and starts afresh."""
    db = tmp_path / "text.sqlite"
    db.write_text("hello")
    assert "install jupyterhub" in _no_hub(monkeypatch, capsys, str(db))
    assert db.read_text() == "hello" and os.listdir(tmp_path) == ["text.sqlite"]


# --- case 7: a JSON line that is not a verdict ---------------------------------------------

def test_a_json_line_that_is_not_a_verdict_is_not_called_cut_short(tmp_path):
    record = tmp_path / "p.jsonl"
    record.write_text('{"a": 1}\n')
    text = repr(progress.your_progress(record))
    assert "a write cut short, or not text)" not in text, text
    assert "1 line(s) of the record are not verdicts" in text and "JSON of another shape" in text
