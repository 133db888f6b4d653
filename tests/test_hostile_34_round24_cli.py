"""Round 24, command lines: run.sh's setup lock met an output's lock; two outputs refused or
named only after the work; a folder that cannot be listed blamed on its filesystem; JSON that
named a file with a lone surrogate.

1. run.sh locked the clone's folder, as ``out_folders.locked`` locks an output's: a trace
   export into the clone's root made every ./run.sh say "another ./run.sh is setting up .venv"
   and wait for the recording.  Now run.sh locks a file only it makes (``.run-sh.lock``);
   the course's commands lock folders only.
2. ``measure_notebooks --json OUT`` measured, then failed on OUT's missing or read-only folder.
3. ``record_traces`` on a full disk said "No space left on device", naming no file.
4. In a clone folder that may not be listed (-wx), run.sh said its filesystem does not lock.
5. ``trace summary`` / ``trace export`` wrote a name that is not UTF-8 as a lone surrogate.

The run.sh tests run round 22's stand-in clone (nothing is set up or installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from overlap_course.out_folders import locked
from test_hostile_34_round22_cli22 import _env, _set_up, _stand_in, needs_bash
from test_hostile_34_round23_cli23 import _as_a_user, _change_an_input, _run_sh

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
BUSY = "an output's lock"


# -- cases 1 and 4: run.sh's setup lock --

@needs_bash
def test_run_sh_does_not_wait_for_a_command_writing_into_the_clone_s_folder(tmp_path):
    """A trace export into the clone's root held the folder's lock for the whole recording:
    ./run.sh said "another ./run.sh is setting up .venv; waiting for it to finish" and waited."""
    repo, log = _set_up(tmp_path)
    _change_an_input(repo)
    with locked(repo, BUSY):  # as `./run.sh trace export run.json` in the clone holds it
        try:
            done = subprocess.run(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                                  capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail("./run.sh setup waited for the output's lock on the clone's folder")
    assert done.returncode == 0 and "another" not in done.stderr, done.stderr
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"]


@needs_bash
def test_an_output_in_the_clone_s_folder_is_not_refused_while_run_sh_sets_up(tmp_path):
    """The other way round: during a setup, an export into the clone's root was refused as
    "being written by another command"."""
    repo = tmp_path / "clone"
    log = _stand_in(repo, pip_seconds=4)
    setup = subprocess.Popen(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 50
        while not _said(log, "pip-start") and time.monotonic() < deadline:
            time.sleep(0.05)  # in pip, holding the setup lock
        assert _said(log, "pip-start")
        with locked(repo, BUSY):
            assert not _said(log, "pip-end"), "the setup ended: nothing was tried"
    finally:
        setup.communicate(timeout=60)
    assert setup.returncode == 0


def _said(log: Path, what: str) -> bool:
    return log.exists() and what in log.read_text()


def test_run_sh_s_lock_file_is_ignored_by_git():
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert ".run-sh.lock" in lines


@needs_bash
def test_a_clone_folder_that_cannot_be_listed_is_locked_and_not_blamed_on_its_filesystem(
        tmp_path):
    """A -wx folder could not be opened for the folder's lock: run.sh set up unlocked, saying
    "cannot be locked here (its filesystem does not lock)", which was false."""
    repo, log = _set_up(tmp_path)
    _change_an_input(repo)
    repo.chmod(0o333)
    try:
        done = subprocess.run([*_as_a_user(), "./run.sh", "setup"], cwd=repo, env=_env(repo),
                              capture_output=True, text=True, timeout=60)
    finally:
        repo.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "run.sh: changed since .venv was set up: pyproject.toml - setting up again"]
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"]


@needs_bash
def test_a_lock_file_that_cannot_be_opened_is_said_as_such(tmp_path):
    """A lock one may not open is no filesystem that cannot lock: the line says which file,
    and what to do."""
    repo, log = _set_up(tmp_path)
    _change_an_input(repo)
    lock = repo / ".run-sh.lock"
    lock.touch()
    lock.chmod(0o444)
    done = subprocess.run([*_as_a_user(), "./run.sh", "setup"], cwd=repo, env=_env(repo),
                          capture_output=True, text=True, timeout=60)
    lines = done.stderr.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr
    assert lines[1] == (f"run.sh: {repo}/.run-sh.lock cannot be opened for writing (not yours, "
                        f"or not a file), so nothing stops a second ./run.sh from setting up at "
                        f"once: start none until this one ends, then remove .run-sh.lock "
                        f"(run.sh makes it again)")
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"]


@needs_bash
def test_run_sh_still_runs_one_setup_at_a_time(tmp_path):
    """The lock file serves as the folder did: the second waits, then finds it set up."""
    repo, log = _set_up(tmp_path)
    _change_an_input(repo)
    slow = repo / ".venv" / "bin" / "pip"
    slow.write_text(slow.read_text().replace("sleep 0", "sleep 2"))
    runs = [subprocess.Popen(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    said = [r.communicate(timeout=60) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], said
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"], said
    assert sum("another ./run.sh is setting up" in err for _, err in said) == 1, said


# -- case 2: measure_notebooks --json --

MEASURE = [sys.executable, str(ROOT / "scripts" / "measure_notebooks.py")]


def _measure(tmp_path: Path, *args: str, source: str = "1", as_a_user=False):
    nbformat.write(new_notebook(cells=[new_code_cell(source)]), tmp_path / "nb.ipynb")
    return subprocess.run([*(_as_a_user() if as_a_user else []), *MEASURE, *args, "nb.ipynb"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)


def test_measure_notebooks_makes_the_folder_of_json(tmp_path):
    """It measured, then "No such file or directory: 'results/times.json'", exit 2."""
    done = _measure(tmp_path, "--json", "results/times.json")
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "results" / "times.json").read_text())
    assert [Path(r["notebook"]).name for r in written] == ["nb.ipynb"]


def test_measure_notebooks_refuses_a_read_only_folder_before_measuring(tmp_path):
    """It measured (the whole course without NOTEBOOK: minutes), then "Permission denied"."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        done = _measure(tmp_path, "--json", "ro/times.json", as_a_user=True)
    finally:
        ro.chmod(0o755)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == "measure_notebooks: error: cannot write 'ro/times.json': Permission " \
                          "denied; choose a path in a directory you can write\n"


def test_measure_notebooks_removes_the_folder_it_made_when_a_notebook_fails(tmp_path):
    done = _measure(tmp_path, "--json", "new/deeper/times.json", source="1/0")
    assert done.returncode == 1 and "ZeroDivisionError" in done.stderr, done.stderr
    assert not (tmp_path / "new").exists()


# -- case 3: record_traces on a full disk --

FULL = """import importlib.util, pathlib, sys
spec = importlib.util.spec_from_file_location("record_traces", sys.argv[1])
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)
class Recorded:
    def to_json(self):
        return "{}"
rt._record_all = lambda args, targets: [(Recorded(), path) for path in targets.values()]
def full(self, *args, **kwargs):  # as a write on a full disk fails: no file named
    raise OSError(28, "No space left on device")
pathlib.Path.write_text = full
sys.exit(rt.main(sys.argv[2:]))"""


def test_record_traces_on_a_full_disk_names_the_file(tmp_path):
    """It said "record_traces: error: No space left on device" after the recording."""
    done = subprocess.run([sys.executable, "-c", FULL, str(ROOT / "scripts" / "record_traces.py"),
                           "--device", "cpu", "--modes", "serial", "--host-overheads", "0",
                           "--out", "out"], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stderr) == (
        2, "record_traces: error: cannot write 'out/cpu_serial.json': No space left on device; "
           "free space on its disk, or choose a path on another\n"), done.stderr
    assert list(tmp_path.iterdir()) == [], "the folder made for nothing was left"


# -- case 5: JSON naming a file that is not UTF-8 --

NAME = b"\xff.json"


def _strict(text: bytes):
    """The JSON ``text`` parsed, refused if it holds a lone surrogate (a strict parser's view)."""
    value = json.loads(text.decode("utf-8"))
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError: a lone one
    return value


def _kineto(tmp_path: Path, *args: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([os.fsencode(sys.executable), b"-m", b"overlap_course.traces.kineto",
                           *args], cwd=tmp_path, env=ENV, capture_output=True, timeout=300)


def test_trace_summary_names_a_file_that_is_not_utf8_without_a_lone_surrogate(tmp_path):
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 0, "dur": 5, "pid": 0,
                              "tid": 7, "name": "k"}]}
    (Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), NAME)))).write_text(json.dumps(trace))
    done = _kineto(tmp_path, b"summary", NAME)
    assert done.returncode == 0, done.stderr
    assert _strict(done.stdout)["source"] == "\\udcff.json"


def test_trace_export_names_a_file_that_is_not_utf8_without_a_lone_surrogate(tmp_path):
    done = _kineto(tmp_path, b"export", NAME, b"cpu_zos")
    assert done.returncode == 0, done.stderr
    assert list(_strict(done.stdout)) == ["\\udcff.json"]
    written = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), NAME))).read_bytes()
    assert _strict(written)["traceName"] == "\\udcff.json"
