"""Issue 34, round seventeen, the command lines (helper cli17b).

Case 5: the output-folder lock noted ``a/..`` among the folders it made for ``a/../b``; its
``rmdir`` failed and stopped the cleanup before ``a``: a refused ``trace export a/../b/x.json``
left ``a/``.

Case 6: an interrupted ``train --out t1/t2/x.pt`` (exit 130) left ``t1/t2/``, made before the
training.

Case 7: run.sh with its stdout or stderr closed: its first ``echo`` failed and ended it with
exit 1 (``./run.sh setup >&-`` said "echo: write error"; junk with ``2>&-`` gave 1, not 2).

Case 8: the progress service, refused for a missing jupyterhub, had already made the database
(or written its schema into an empty ``--db``).

Case 9: an OUT of ``/dev/null`` was refused because "writing would wait for a reader", which is
false: it is refused because the output is a new file renamed into its place."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_course import progress_service as ps
from overlap_course import command_line, train
from overlap_course.command_line import locked, out_file
from test_hostile_34_round9_run import _run_sh_copy

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
EXPORT = [sys.executable, "-m", "overlap_course.traces.kineto", "export"]


# --- case 5: '..' in the folder the lock makes -------------------------------------------------

def test_a_refused_export_whose_out_goes_through_dotdot_leaves_no_folder(tmp_path):
    """Before: "prompt 5 is too long", exit 2, and a/ left."""
    done = subprocess.run([*EXPORT, "a/../b/x.json", "--prompts", "64", "--max-new-tokens",
                           "200"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2 and "too long" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make", [lambda folder: command_line.made_folder(folder),
                                  lambda folder: locked(folder, "busy")],
                         ids=["made_folder", "locked"])
def test_every_folder_made_through_dotdot_is_removed_when_the_block_fails(tmp_path, make):
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt):
        with make(tmp_path / "a" / ".." / "b" / "c" / ".." / ".." / "kept" / "d" / "e"):
            assert (tmp_path / "kept" / "d" / "e").is_dir()
            raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert list((tmp_path / "kept").iterdir()) == []


def test_a_folder_made_through_dotdot_that_holds_a_file_stays_and_the_others_go(tmp_path):
    with pytest.raises(ValueError):
        with command_line.made_folder(tmp_path / "a" / ".." / "b"):
            (tmp_path / "a" / "file").write_text("someone else's")
            raise ValueError()
    assert [p.name for p in tmp_path.iterdir()] == ["a"]
    with command_line.made_folder(tmp_path / "x" / ".." / "y"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "x", "y"]


# --- case 6: train's folders for --out ---------------------------------------------------------

def _stopped(*args, **kwargs):
    raise KeyboardInterrupt


def test_an_interrupted_train_leaves_no_folder_it_made_for_out(tmp_path, monkeypatch, capsys):
    """Before: "train: interrupted", 130, and t1/t2/ left (made before the training)."""
    monkeypatch.setattr(train, "_fit", _stopped)
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "t1" / "t2" / "x.pt"
    assert train.main(["--out", str(out), "--steps", "1", "--sample", "0"]) == 130
    assert capsys.readouterr().err == "train: interrupted\n"
    assert list((tmp_path / "kept").iterdir()) == []
    with pytest.raises(KeyboardInterrupt):
        train.train(steps=1, out=tmp_path / "a" / ".." / "b" / "x.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]


# --- case 7: run.sh with a closed stdout or stderr ---------------------------------------------

@pytest.mark.skipif(shutil.which("bash") is None, reason="run.sh needs bash")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, status", [
    ("setup >&-", 0), ("setup >&- 2>&-", 0), ("bogus 2>&-", 2), ("setup --forse 2>&-", 2),
    ("bogus >&- 2>&-", 2)])
def test_run_sh_with_a_closed_stream_exits_as_with_it_open(tmp_path, args, status):
    """Before: 1 each time; ``setup >&-`` said "echo: write error: Bad file descriptor"."""
    _run_sh_copy(tmp_path)
    done = subprocess.run(["bash", "-c", f"./run.sh {args}"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stderr) == (status, ""), done.stderr


# --- case 8: the progress service refused for a missing hub ------------------------------------

def _refused_without_a_hub(monkeypatch, capsys, db: Path, *words: str) -> None:
    monkeypatch.setattr(ps, "HubOAuth", None)
    assert ps.main(["--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(word in err for word in words), err


def test_the_service_refused_for_no_hub_makes_no_database(tmp_path, monkeypatch, capsys):
    """Before: new.sqlite (8 KB, the schema) left; an empty --db got the schema."""
    _refused_without_a_hub(monkeypatch, capsys, tmp_path / "new.sqlite", "install jupyterhub")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "empty.sqlite").write_bytes(b"")
    _refused_without_a_hub(monkeypatch, capsys, tmp_path / "empty.sqlite", "install jupyterhub")
    assert [(p.name, p.stat().st_size) for p in tmp_path.iterdir()] == [("empty.sqlite", 0)]
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to("sub/new.sqlite")  # SQLite would make it where it points
    _refused_without_a_hub(monkeypatch, capsys, tmp_path / "link", "install jupyterhub")
    assert list((tmp_path / "sub").iterdir()) == []


def test_the_service_refused_for_no_hub_names_a_bad_db_first_and_writes_nothing(
        tmp_path, monkeypatch, capsys):
    _refused_without_a_hub(monkeypatch, capsys, tmp_path / "gone" / "x.sqlite",
                           "cannot open the database")
    (tmp_path / "text.sqlite").write_text("hello")  # round 19: no refusal, as open_store's
    _refused_without_a_hub(monkeypatch, capsys, tmp_path / "text.sqlite", "install jupyterhub")
    assert (tmp_path / "text.sqlite").read_text() == "hello"
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("PRAGMA journal_mode=WAL")
    other.execute("CREATE TABLE verdicts (x)")
    other.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    _refused_without_a_hub(monkeypatch, capsys, tmp_path / "other.sqlite", "is not this service's")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -wal, no -shm


def test_the_service_with_a_hub_still_makes_its_database(tmp_path, monkeypatch):
    monkeypatch.setattr(ps, "serve", lambda store, a, host, port: store.count())
    monkeypatch.setattr(ps, "HubOAuth", object)  # as where the hub is installed
    assert ps.main(["--db", str(tmp_path / "new.sqlite")]) == 0
    assert (tmp_path / "new.sqlite").is_file()


# --- case 9: /dev/null as an output ------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_dev_null_as_an_output_is_refused_for_a_true_reason(tmp_path):
    """Before: "writing would wait for a reader"; /dev/null never waits."""
    with pytest.raises(ValueError) as err:
        out_file("/dev/null", "--json", "times.json")
    assert "wait for a reader" not in str(err.value)
    assert "a new file renamed into its place" in str(err.value), err.value
    done = subprocess.run([*EXPORT, "/dev/null", "cpu_zos"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "renamed into its place" in done.stderr, done.stderr
