"""Issue 34, round nineteen, the command lines (fixer cli19a).

1. ``out_folders.locked``: of two runs on one new ``--out``, one made the folder and the other
   locked it first; the one that made it then removed "its" folder, which the other held and
   was recording into (60 of 300 real tries).  Now only the holder of the lock removes what it
   made, before it lets the lock go, and a lock got on a folder removed meanwhile is taken
   again on a new one.
2. ``scripts/record_traces.py`` checked ``--out`` but not the files it writes there: a folder
   or a FIFO at ``OUT/cpu_serial.json`` was refused only after every run was recorded.
3. ``grading course NEW/c`` that could not write its first file (a full disk) left NEW,
   NEW/c, NEW/c/source, ...; with a little more room, half a course.  Now all or none, and the
   folders it made go again.

Each test failed before the fix."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlap_course import out_folders
from overlap_course.out_folders import locked

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
RECORD = [sys.executable, str(ROOT / "scripts" / "record_traces.py")]
SMALL = ["--modes", "serial", "zos", "--host-overheads", "0", "--requests", "1",
         "--max-new-tokens", "2", "--repeats", "1", "--allow-busy", "--device", "cpu"]
RACES = 100  # about one in five lost the folder before the fix


# --- case 1: the run refused the lock removed the folder the holder writes into ----------------

def _flock_after(first, monkeypatch):
    """``out_folders.fcntl.flock`` that runs ``first()`` once, just before the real flock."""
    real, done = fcntl.flock, []

    def flock(fd, op):
        if not done:
            done.append(first())
        return real(fd, op)
    monkeypatch.setattr(out_folders, "fcntl", type("F", (), {
        "flock": staticmethod(flock), "LOCK_EX": fcntl.LOCK_EX, "LOCK_NB": fcntl.LOCK_NB}))
    return done


def test_the_run_refused_the_lock_leaves_the_folder_it_made_to_the_holder(tmp_path, monkeypatch):
    """Before: A made ``new/out``, B locked it first, A was refused and removed it: B's
    recording was then written into nothing ("No such file or directory")."""
    folder = tmp_path / "new" / "out"
    held = []

    def b_locks_first():
        monkeypatch.undo()  # B's own flock is the real one
        held.append(locked(folder, "B: busy").__enter__())

    _flock_after(b_locks_first, monkeypatch)
    with pytest.raises(ValueError, match="A: busy"):
        locked(folder, "A: busy")
    assert folder.is_dir(), "the folder B holds was removed"
    (folder / "cpu_serial.json").write_text("B's recording")
    held[0].__exit__(None, None, None)
    assert (folder / "cpu_serial.json").read_text() == "B's recording"


def test_a_lock_got_on_a_folder_removed_meanwhile_is_taken_on_a_new_one(tmp_path, monkeypatch):
    """A holder that made the folder fails and removes it while B has it open, just before B's
    flock: before, B then held a lock on a removed folder and wrote into nothing."""
    folder = tmp_path / "out"
    a = locked(folder, "A: busy").__enter__()

    def a_fails_and_removes_it():
        monkeypatch.undo()
        a.__exit__(RuntimeError, RuntimeError("A failed"), None)

    _flock_after(a_fails_and_removes_it, monkeypatch)
    with locked(folder, "B: busy"):
        assert folder.is_dir(), "B holds a lock on a folder that is gone"
        (folder / "cpu_serial.json").write_text("B's recording")
    assert (folder / "cpu_serial.json").read_text() == "B's recording"


def _one_run(folder: str, start: float, results) -> None:
    while time.time() < start:  # both begin at one moment (a barrier woke one first)
        pass
    try:
        with locked(Path(folder), "busy"):
            Path(folder, f"{os.getpid()}.json").write_text("recorded")  # fails if removed
            results.put("won")
    except ValueError:
        results.put("refused")
    except OSError as exc:
        results.put(f"lost its folder: {exc}")


def test_two_real_runs_started_together_on_a_new_out_never_lose_the_folder(tmp_path):
    """Two processes lock one new folder at the same moment, RACES times.  Before: in about one
    try in five the winner's folder was removed under it by the one refused."""
    ctx = multiprocessing.get_context("fork")
    seen = []
    for i in range(RACES):
        folder, results = str(tmp_path / f"o{i}" / "out"), ctx.Queue()
        start = time.time() + 0.05
        runs = [ctx.Process(target=_one_run, args=(folder, start, results)) for _ in range(2)]
        for run in runs:
            run.start()
        got = [results.get(timeout=120) for _ in runs]
        for run in runs:
            run.join(timeout=120)
        assert "won" in got and all(r in ("won", "refused") for r in got), (i, got)
        seen.append(len(os.listdir(folder)))
    assert all(seen), seen  # each winner's file is there


# --- case 2: record_traces refuses a folder or a pipe at a file it writes, before any run -----

@pytest.mark.parametrize("make", [os.mkdir, os.mkfifo], ids=["folder", "fifo"])
def test_record_traces_refuses_a_folder_or_pipe_at_its_file_before_recording(tmp_path, make):
    """Before: every run was recorded and announced (``cpu_serial: ... tok/s``), then the
    refusal, exit 2: minutes of recording lost."""
    (tmp_path / "o").mkdir()
    make(tmp_path / "o" / "cpu_zos.json")
    done = subprocess.run([*RECORD, *SMALL, "--out", "o"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0].startswith("record_traces: error: 'o/cpu_zos.json' is not a file"), lines
    assert "remove it or write elsewhere" in lines[0]
    assert done.stdout == "" and "tok/s" not in done.stderr  # nothing recorded
    assert sorted(os.listdir(tmp_path / "o")) == ["cpu_zos.json"]


# --- case 3: grading course, all or none --------------------------------------------------------

def _course(tmp_path, file_limit: int | None, *args: str) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    return subprocess.run([sys.executable, "-m", "overlap_course.build.grading", "course", *args],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit if file_limit else None)


def _left(tmp_path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), tmp_path)
                  for d, ds, fs in os.walk(tmp_path) for n in ds + fs)


@pytest.mark.parametrize("file_limit", [1024, 20_000], ids=["first file", "a later file"])
def test_grading_course_that_cannot_write_a_file_leaves_nothing(tmp_path, file_limit):
    """A file-size limit stands for a full disk.  Before: the folders made for the course were
    left (``new``, ``new/c``, ``new/c/source``, ...), and with more room some notebooks too."""
    done = _course(tmp_path, file_limit, "new/c")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("grading course: error: File too large: 'new/c/"), done.stderr
    assert _left(tmp_path) == []


def test_grading_course_refused_in_an_existing_course_touches_nothing_there(tmp_path):
    """DEST already laid out: a failed rewrite (--force) keeps every file and folder as it was;
    only the folder it made for a missing exercise goes again."""
    assert _course(tmp_path, None, "c").returncode == 0
    notebooks = sorted((tmp_path / "c" / "source").iterdir())
    (notebooks[-1] / f"{notebooks[-1].name}.ipynb").write_text("edited")
    os.rename(notebooks[0], tmp_path / "moved")  # its folder is made again, first
    before = {p: p.read_bytes() for p in (tmp_path / "c").rglob("*") if p.is_file()}
    done = _course(tmp_path, 1024, "c", "--force")
    assert done.returncode == 2, done.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "c").rglob("*") if p.is_file()} == before
    assert not notebooks[0].exists()  # made for the write that failed: removed again
