"""Round 25, command lines: a room broken by one database row; a --json run's results lost to
another run; run.sh hung by a FIFO; junk answered by another program's message or by silence;
JSON that named one file as another.

1. A progress-store row whose text is not UTF-8 (another program's) made ``Store.entries()``
   raise: every room page failed for as long as the row was there.
2. Two ``measure_notebooks --json`` runs into one new folder: the first, interrupted, removed
   the folder (empty so far) and the second measured, then failed with no reason.
3. A FIFO at ``.run-sh.lock`` made every ./run.sh hang without a word; a dangling link there
   made a file outside the clone.
4. A folder at the stamp (``.venv/.run-sh-setup``) ended setup with rm's message, exit 1.
5. ``measure_notebooks --update --json OUT`` wrote nothing and exited 0 without a word.
6. JSON wrote a name's byte 0xff as ``\\xff``, as it wrote the name ``a\\xffb`` (another file).

The run.sh tests run round 22's stand-in clone (nothing is set up or installed).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from overlap_course import progress_store, safe_json
from overlap_course.out_folders import locked
from test_hostile_34_round22_cli22 import _env, _stand_in, needs_bash

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
MEASURE = ROOT / "scripts" / "measure_notebooks.py"
VERDICT = {"notebook": "01_tiny_gpt", "check": "check_slot", "passed": True, "category": "ok",
           "time": 1.0}


# -- case 1: a row whose text is not UTF-8 --

@pytest.mark.parametrize("column", ["user", "notebook", "check_name", "category"])
def test_a_row_whose_text_is_not_utf8_is_skipped_and_counted(tmp_path, column):
    store = progress_store.open_store(str(tmp_path / "room.sqlite"))
    store.add("ada", VERDICT)
    values = {"user": "'ben'", "notebook": "'01_tiny_gpt'", "check_name": "'check_slot'",
              "category": "'ok'", column: "CAST(X'626F62FF' AS TEXT)"}  # b'bob\xff'
    store.db.execute(f"INSERT INTO verdicts (user, notebook, check_name, passed, category, "
                     f"client_time, received) VALUES ({values['user']}, {values['notebook']}, "
                     f"{values['check_name']}, 1, {values['category']}, 1, 2)")
    try:
        entries = store.entries()
    except sqlite3.Error as err:
        pytest.fail(f"every room page fails while the row is there: {err}")
    data = progress_store.room(entries, [], store.unreadable)
    assert list(entries) == ["ada"] and store.unreadable == 1 and data["unreadable"] == 1


# -- cases 2 and 5: measure_notebooks --json --

def _notebook(folder: Path, source: str = "1", name: str = "nb.ipynb") -> Path:
    nb = new_notebook()
    nb.cells = [new_code_cell(source)]
    nbformat.write(nb, folder / name)
    return folder / name


def _measure(cwd: Path, *args, script: Path = MEASURE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_measure_json_into_a_folder_another_run_holds_is_refused_before_measuring(tmp_path):
    """The folder was not locked: the first run, interrupted, removed it (made for nothing)
    while the second measured into it; the second then failed with "No such file"."""
    _notebook(tmp_path)
    with locked(tmp_path / "nd", "busy"):  # as the first run holds it while it measures
        done = _measure(tmp_path, "nb.ipynb", "--json", "nd/b.json")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "measure_notebooks: error: --json 'nd/b.json': its folder is being written by another "
        "command running now (a measure_notebooks --json, a trace export, a recording): wait "
        "for it to end, or name a file in another folder; nothing was measured"]
    assert "nb.ipynb" not in done.stdout and not (tmp_path / "nd" / "b.json").exists()


def test_measure_json_whose_folder_is_removed_while_it_measures_says_so(tmp_path):
    """Removed under the run (by another's cleanup, a learner's rm -rf): named as such, not
    "No such file or directory"."""
    _notebook(tmp_path, f"import shutil\nshutil.rmtree({str(tmp_path / 'nd')!r})")
    done = _measure(tmp_path, "nb.ipynb", "--json", "nd/b.json")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "measure_notebooks: error: --json's folder 'nd' was removed or replaced while this run "
        "held it: nothing written; run it again")


@pytest.mark.parametrize("extra", [["--json", "out/x.json"], ["nb.ipynb"]])
def test_measure_update_refuses_what_it_would_ignore(tmp_path, extra):
    """--update measures nothing: --json OUT was checked, never written, and it exited 0
    without a word (notebooks given were ignored the same way).  A copy of the script: its
    repository is tmp_path, so a run that went on would write nothing of the course's."""
    script = tmp_path / "scripts" / "measure_notebooks.py"
    script.parent.mkdir()
    shutil.copy2(MEASURE, script)
    _notebook(tmp_path)
    done = _measure(tmp_path, "--update", *extra, script=script)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("measure_notebooks: error: --update measures nothing"), \
        done.stderr
    assert "takes no --json and no notebooks" in done.stderr
    assert not (tmp_path / "out").exists()


# -- cases 3 and 4: junk where run.sh keeps its lock and its stamp --

def _junk(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "elsewhere")
    else:  # a link to a file: opened for writing, it is written through
        (tmp_path / "elsewhere").write_text("")
        path.symlink_to(tmp_path / "elsewhere")


KINDS = {"fifo": "a named pipe (FIFO)", "folder": "a folder", "dangling link": "a symbolic link",
         "link to a file": "a symbolic link"}


@needs_bash
@pytest.mark.parametrize("kind", list(KINDS))
def test_junk_at_run_sh_s_lock_is_refused_in_one_line(tmp_path, kind):
    """A FIFO: `exec 8>>` waited for a reader, every ./run.sh hung without a word.  A dangling
    link: the file it names was made, outside the clone.  A folder: on, unlocked."""
    repo = tmp_path / "clone"
    log = _stand_in(repo)
    _junk(kind, repo / ".run-sh.lock", tmp_path)
    try:
        done = subprocess.run(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("./run.sh setup hung on the lock")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"run.sh: {repo}/.run-sh.lock is {KINDS[kind]}, not the file run.sh keeps there "
        f"(setup's lock): remove it (run.sh makes it again), then run ./run.sh setup again"]
    assert not log.exists()  # nothing ran
    if kind == "dangling link":
        assert not (tmp_path / "elsewhere").exists()


@needs_bash
def test_a_folder_at_run_sh_s_stamp_is_refused_in_one_line(tmp_path):
    """[ -f ] is false for a folder: setup ran and `set -e` ended it at rm's message, exit 1."""
    repo = tmp_path / "clone"
    log = _stand_in(repo)
    (repo / ".venv" / ".run-sh-setup").mkdir()
    done = subprocess.run(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"run.sh: {repo}/.venv/.run-sh-setup is a folder, not the file run.sh keeps there (the "
        f"record of its last setup): remove it (run.sh makes it again), then run ./run.sh "
        f"setup again"]
    assert not log.exists()  # nothing ran


# -- case 6: a name that is not UTF-8, and a name that looks like its escape --

BYTE, LOOKALIKE = os.fsdecode(b"a\xffb.json"), "a\\xffb.json"


def test_json_names_the_byte_and_its_lookalike_apart_as_messages_quote_them():
    assert safe_json.name_text(BYTE) != safe_json.name_text(LOOKALIKE)
    for name in (BYTE, LOOKALIKE, "plain.json"):
        # the messages' repr, its quotes aside
        assert safe_json.quoted(name, 200) == f"'{safe_json.name_text(name)}'"


def test_trace_summary_names_each_file_as_it_is(tmp_path):
    """Both names were written "a\\xffb.json": a reader opening it read the lookalike."""
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 0, "dur": 5, "pid": 0,
                              "tid": 7, "name": "k"}]}
    sources = []
    for name in (BYTE, LOOKALIKE):
        (tmp_path / name).write_text(json.dumps(trace))
        done = subprocess.run([sys.executable, "-m", "overlap_course.traces.kineto", "summary",
                               name], cwd=tmp_path, env=ENV, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr
        sources.append(json.loads(done.stdout.decode("utf-8"))["source"])
    assert sources == ["a\\udcffb.json", "a\\\\xffb.json"]


def test_measure_json_names_a_notebook_that_is_not_utf8_without_a_lone_surrogate(tmp_path):
    _notebook(tmp_path, name=os.fsdecode(b"n\xff.ipynb"))
    done = _measure(tmp_path, os.fsdecode(b"n\xff.ipynb"), "--json", "r.json")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r.json").read_bytes().decode("utf-8")
    [row] = json.loads(text)
    row["notebook"].encode("utf-8")  # no lone surrogate (json's "\udcff" escape read back)
    named = safe_json.name_text(tmp_path.resolve() / os.fsdecode(b"n\xff.ipynb"))
    assert row["notebook"] == named
