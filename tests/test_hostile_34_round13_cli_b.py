"""Round thirteen's command-line cases (issue 34, fixer cli13b): a source or stored notebook
that is junk or a FIFO refused in one line (never a hang or a traceback), ``grading annotate``
writing whole on a full disk (``RLIMIT_FSIZE`` stands in for ENOSPC) and naming the file, a
progress record the disk will not give back said as such (not as "nothing done"), and run.sh's
note on a ``PYTHON`` that does not run in one clean line."""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from overlap_course import progress, safe_json
from overlap_course.build import grading, setup_cell

ROOT = Path(__file__).resolve().parents[1]
JUNK = [b'{"cells": 5}', b"[]", b"\xff\xfe", b"[" * 200,
        b'{"cells":[{"cell_type":"code"}],"nbformat":4,"nbformat_minor":5,"metadata":{}}']


def _returns_within(seconds: float, call, fifo: Path):
    """``call()``'s result or exception; a call still blocked on ``fifo`` after ``seconds`` is
    set free (a writer opens the FIFO) and the test fails."""
    out = []

    def target():
        try:
            out.append(call())
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            out.append(err)
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if not out:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader gets EOF and ends
        worker.join(10)
        pytest.fail(f"still running after {seconds} s: waiting on the FIFO {fifo}")
    return out[0]


def _root_with(tmp_path: Path, name: str = "02_serial_loop") -> tuple[Path, Path]:
    """A course root holding one source notebook (a copy of the real one) and its path."""
    (tmp_path / "root" / "source").mkdir(parents=True)
    path = tmp_path / "root" / "source" / f"{name}.ipynb"
    shutil.copy2(ROOT / "source" / f"{name}.ipynb", path)
    return tmp_path / "root", path


def _one_line(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(word in lines[0] for word in words), err


# --- case 3: a FIFO at a source notebook's name -----------------------------------------------

def test_grading_course_refuses_a_fifo_source_at_once(tmp_path):
    root, path = _root_with(tmp_path)
    path.unlink()
    os.mkfifo(path)
    got = _returns_within(20, lambda: grading.course(tmp_path / "D", root=root), path)
    assert isinstance(got, ValueError) and "02_serial_loop.ipynb" in str(got), got
    assert "not a file" in str(got) and not (tmp_path / "D").exists()


def test_grading_annotate_refuses_a_fifo_source_at_once(tmp_path, monkeypatch, capsys):
    root, path = _root_with(tmp_path)
    path.unlink()
    os.mkfifo(path)
    monkeypatch.setattr(grading, "ROOT", root)
    assert _returns_within(20, lambda: grading.main(["annotate"]), path) == 2
    _one_line(capsys.readouterr().err, "grading annotate: error:", "02_serial_loop.ipynb",
              "not a file")


def test_grading_course_still_copies_each_source_byte_for_byte(tmp_path):
    root, path = _root_with(tmp_path)
    grading.course(tmp_path / "D", root=root)
    copied = tmp_path / "D" / "source" / "02_serial_loop" / "02_serial_loop.ipynb"
    assert copied.read_bytes() == path.read_bytes()


# --- case 5: grading annotate with a junk source notebook -------------------------------------

@pytest.mark.parametrize("junk", JUNK, ids=["cells-5", "list", "not-utf8", "deep", "no-metadata"])
def test_grading_annotate_refuses_a_junk_source_in_one_line(tmp_path, monkeypatch, capsys, junk):
    root, path = _root_with(tmp_path)
    path.write_bytes(junk)
    monkeypatch.setattr(grading, "ROOT", root)
    assert grading.main(["annotate"]) == 2
    _one_line(capsys.readouterr().err, "grading annotate: error:", "02_serial_loop.ipynb",
              "is not a notebook")
    assert path.read_bytes() == junk


def test_grading_course_refuses_a_junk_source_in_one_line(tmp_path):
    root, path = _root_with(tmp_path)
    path.write_bytes(b'{"cells": 5}')
    with pytest.raises(ValueError, match="02_serial_loop.ipynb.* is not a notebook"):
        grading.course(tmp_path / "D", root=root)


# --- case 6: grading annotate on a full disk ---------------------------------------------------

ANNOTATE = """import sys
from pathlib import Path
from overlap_course.build import grading
grading.ROOT = Path(sys.argv[1])
sys.exit(grading.main(["annotate"]))
"""


def test_grading_annotate_on_a_full_disk_keeps_the_source_whole_and_names_it(tmp_path):
    root, path = _root_with(tmp_path, "03_zos_loop")
    data = json.loads(path.read_text(encoding="utf-8"))
    for cell in data["cells"]:
        cell["metadata"].pop("nbgrader", None)  # stale metadata: annotate has to write
    text = json.dumps(data, indent=1)
    path.write_text(text, encoding="utf-8")
    limit = len(text) // 2
    proc = subprocess.run([sys.executable, "-c", ANNOTATE, str(root)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                (limit, limit)))
    assert proc.returncode == 2, proc.stderr
    _one_line(proc.stderr, "grading annotate: error:", "File too large", str(path))
    assert path.read_text(encoding="utf-8") == text  # as it was, not cut in half
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no partial left


def test_grading_annotate_still_writes_the_metadata(tmp_path, monkeypatch, capsys):
    root, path = _root_with(tmp_path, "03_zos_loop")
    data = json.loads(path.read_text(encoding="utf-8"))
    for cell in data["cells"]:
        cell["metadata"].pop("nbgrader", None)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    monkeypatch.setattr(grading, "ROOT", root)
    assert grading.main(["annotate"]) == 0
    assert "source/03_zos_loop.ipynb: updated" in capsys.readouterr().out
    assert grading.check(root) == []


# --- case 7: setup_cell write with a stored notebook that is not one ---------------------------

@pytest.fixture
def one_stored(tmp_path, monkeypatch):
    """setup_cell's notebooks: one stored notebook at a temporary path (the setup cell not run)."""
    path = tmp_path / "notebooks" / "01_tiny_gpt.ipynb"
    path.parent.mkdir()
    monkeypatch.setattr(setup_cell, "notebooks", lambda root=None: [path])
    monkeypatch.setattr(setup_cell, "_run_here", lambda source: 1)
    return path


def test_setup_cell_write_refuses_a_junk_notebook_in_one_line(one_stored, capsys):
    one_stored.write_bytes(b'{"cells": 5}')
    assert setup_cell.main(["write"]) == 2
    _one_line(capsys.readouterr().err, "setup_cell write: error:", "01_tiny_gpt.ipynb",
              "is not a notebook")
    assert one_stored.read_bytes() == b'{"cells": 5}'


def test_setup_cell_write_says_in_one_line_when_the_cell_misbehaves(monkeypatch, capsys):
    def loud(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "some output\n", "an error\n")
    monkeypatch.setattr(setup_cell.subprocess, "run", loud)
    assert setup_cell.main(["write"]) == 2
    _one_line(capsys.readouterr().err, "setup_cell write: error:", "the setup cell did something")


def test_setup_cell_write_says_in_one_line_when_the_cell_runs_too_long(monkeypatch, capsys):
    def slow(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])
    monkeypatch.setattr(setup_cell.subprocess, "run", slow)
    assert setup_cell.main(["write"]) == 2
    _one_line(capsys.readouterr().err, "setup_cell write: error:", "120 s")


# --- case 10: a progress record the disk will not give back ------------------------------------

def test_a_record_that_fails_on_reading_is_not_shown_as_nothing_done(capsys):
    with pytest.raises(ValueError, match="Input/output error"):
        progress.read_record(Path("/proc/self/mem"))  # opens; its first read is EIO
    shown = progress.your_progress("/proc/self/mem")
    for view in (repr(shown), shown._repr_html_()):
        assert "could not be read" in view and "Input/output error" in view, view
        assert "not reached" not in view and "0 passed" not in view, view
    assert progress.main(["/proc/self/mem"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    _one_line(out.err, "could not be read", "/proc/self/mem", "Input/output error")


def test_a_record_that_fails_partway_drops_no_verdict_silently(tmp_path, monkeypatch):
    record = tmp_path / "progress.jsonl"
    line = json.dumps({"v": 1, "notebook": "03_zos_loop", "check": "check_zos_loop",
                       "passed": True, "category": "passed", "time": 1.0})
    record.write_text(line + "\n" + line + "\n", encoding="utf-8")
    assert len(progress.read_record(record)[0]) == 2

    class Failing(io.BytesIO):
        def readline(self, size=-1):
            if self.tell():
                raise OSError(5, "Input/output error")
            return super().readline(size)
    monkeypatch.setattr(safe_json, "open_regular", lambda path, what: Failing(record.read_bytes()))
    with pytest.raises(ValueError, match="at line 2"):
        progress.read_record(record)
    assert "could not be read" in repr(progress.your_progress(record))


# --- case 11: run.sh's note on a PYTHON that does not run --------------------------------------

@pytest.mark.parametrize("junk", ["python3 -X", "/nonexistent-python", "/"])
def test_run_sh_says_in_one_clean_line_that_python_does_not_run(tmp_path, junk):
    bin_ = tmp_path / "course" / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.11.7"\nexit 3\n')
    (bin_ / "python").chmod(0o755)
    shutil.copy2(ROOT / "run.sh", tmp_path / "course" / "run.sh")
    proc = subprocess.run([str(tmp_path / "course" / "run.sh"), "setup"], capture_output=True,
                          env=dict(os.environ, PYTHON=junk), text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    note = [line for line in proc.stderr.splitlines() if "already holds" in line]
    assert note == [f"run.sh: .venv already holds Python 3.11.7, not PYTHON={junk}'s "
                    f"(not found); using .venv (rm -rf .venv to switch)"], proc.stderr
    assert "command not found" not in proc.stderr and "Is a directory" not in proc.stderr
