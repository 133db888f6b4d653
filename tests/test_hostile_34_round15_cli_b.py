"""Issue 34, round fifteen, the command lines (fixer cli15b): cases 1-5.

1. ``notebooks execute A B | head -1``: the second progress line met a closed pipe, and the
   command ended "quietly", exit 0, with B never executed.  A progress line
   (``command_line.progress``) now drops what the reader no longer takes and the work goes on;
   a command that had an exit status keeps it (``check | true`` said 0 over its 1).
2. One kill or Ctrl-C while ``write_whole`` removed its ``.NAME.XXXX.partial`` folder left it.
3. An output path that is a symbolic link loop: a traceback (``trace export``, the site build)
   or a bare line with no ``PROG: error:`` (``slides``, ``handout``).
4. Two ``trace export`` runs on one OUT: one run's serial file beside the other's ZOS file,
   both exit 0.  Now the second is refused by the site build's lock, taken on OUT's folder.
5. A ``kill -9``'s leftover ``.OUT.<pid>.partial.json`` under the same process id made every
   later export fail with a false "File exists; choose a path in a directory you can write".

Each test failed before the fix.  A kill at an exact point is sent by an audit hook (a
``sitecustomize.py`` on PYTHONPATH)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
PLAIN = {**os.environ, "PYTHONPATH": str(ROOT)}
EXPORT = [sys.executable, "-m", "overlap_course.traces.kineto", "export"]


def _reader_gone(cmd, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` with its stdout a pipe whose reader has gone (``| head -1`` once it read)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(cmd, stdout=write, stderr=subprocess.PIPE, text=True, **kwargs)
    finally:
        os.close(write)


def _one_error_line(done, prog: str, *words: str) -> None:
    err = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"{prog}: error: "), err
    assert "Traceback" not in err and all(w in err for w in words), err


def _partials(folder: Path) -> list:
    return sorted(str(p) for p in folder.rglob("*.partial*"))


# -- case 1: a progress line's reader gone -----------------------------------------------------

def test_notebooks_execute_with_its_reader_gone_executes_every_notebook(tmp_path):
    paths = []
    for name in ("a", "b"):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(f"print({name!r})")]
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        paths.append(str(tmp_path / f"{name}.ipynb"))
    done = _reader_gone([sys.executable, "-m", "overlap_course.build.notebooks", "execute",
                         *paths], env=PLAIN, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    for path in paths:
        assert nbformat.read(path, as_version=4).cells[0].outputs, f"{path} was not executed"


PROGRESS = """\
import sys
from pathlib import Path
from overlap_course.command_line import progress, run

def main():
    for n in range(3):
        progress(f"writing {n}")
        Path(sys.argv[1], str(n)).write_text("written")
    return int(sys.argv[2])

run("demo", main)
"""


@pytest.mark.parametrize("status", [0, 1])
def test_a_command_whose_product_is_files_finishes_them_with_its_reader_gone(tmp_path, status):
    script = tmp_path / "demo.py"
    script.write_text(PROGRESS)
    (tmp_path / "out").mkdir()
    done = _reader_gone([sys.executable, str(script), str(tmp_path / "out"), str(status)],
                        env=PLAIN, timeout=60)
    assert done.returncode == status and done.stderr == "", done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["0", "1", "2"]


def test_a_command_that_failed_keeps_its_status_when_its_reader_is_gone(tmp_path):
    """``grading check | true`` with problems: its output, buffered as by default, met the
    closed pipe in the last flush, after ``main`` had returned 1: exit 0."""
    script = tmp_path / "check.py"
    script.write_text("from overlap_course.command_line import run\n"
                      "run('check', lambda: print('a problem') or 1)\n")
    buffered = {k: v for k, v in PLAIN.items() if k != "PYTHONUNBUFFERED"}
    done = _reader_gone([sys.executable, str(script)], env=buffered, timeout=60)
    assert done.returncode == 1 and done.stderr == "", done.stderr


# -- case 2: a kill while write_whole cleans up ------------------------------------------------

KILL_IN_CLEANUP = """\
import os, sys
_seen = [0]
def _hook(event, args):
    if event in {events!r} and ".partial" in str(args[0]) and _seen[0] >= 0:
        _seen[0] += 1
        if _seen[0] == {nth}:
            _seen[0] = -1
            os.kill(os.getpid(), {sig})
sys.addaudithook(_hook)
"""


def _kill_in_cleanup(tmp_path: Path, sig: int, nth: int, events=("shutil.rmtree",)) -> dict:
    """A signal at the ``nth`` of ``events`` on a temporary file, where signals are held."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_IN_CLEANUP.format(sig=int(sig), nth=nth,
                                                                  events=set(events)))
    return {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, -signal.SIGTERM),
                                         (signal.SIGHUP, -signal.SIGHUP),
                                         (signal.SIGINT, 130)])
def test_grading_course_killed_while_a_write_cleans_up_leaves_no_partial(tmp_path, sig, status):
    """The course's files are renamed into place together, signals held (round 19: written all
    or none): a signal at the third rename lands after the last."""
    env = _kill_in_cleanup(tmp_path, sig, 3, events=("os.rename",))
    done = subprocess.run([sys.executable, "-m", "overlap_course.build.grading", "course", "gc"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == status, done.stderr
    assert (tmp_path / "gc").is_dir() and not _partials(tmp_path / "gc")


def test_slides_killed_while_a_write_cleans_up_leave_no_partial(tmp_path):
    env = _kill_in_cleanup(tmp_path, signal.SIGTERM, 5)
    done = subprocess.run([sys.executable, "-m", "overlap_course.build.slides",
                           str(ROOT / "notebooks" / "01_tiny_gpt.ipynb"), "--out", "sl"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert (tmp_path / "sl").is_dir() and not _partials(tmp_path / "sl")


# -- case 3: an output path that is a symbolic link loop ----------------------------------------

@pytest.mark.parametrize("prog, cmd", [
    ("python -m overlap_course.traces.kineto", [*EXPORT[1:], "a.json", "cpu_zos"]),
    ("python -m overlap_course.traces.kineto", [*EXPORT[1:], "a.json/x.json", "cpu_zos"]),
    ("site", [str(ROOT / "site" / "build.py"), "--out", "a"]),
    ("slides", ["-m", "overlap_course.build.slides",
                str(ROOT / "notebooks" / "00_start_here.ipynb"), "--out", "a"]),
    ("handout", ["-m", "overlap_course.build.handout", "--out", "a"])])
def test_an_output_path_that_is_a_symlink_loop_is_one_error_line(tmp_path, prog, cmd):
    for one, other in (("a", "b"), ("b", "a"), ("a.json", "b.json"), ("b.json", "a.json")):
        os.symlink(other, tmp_path / one)
    done = subprocess.run([sys.executable, *cmd], cwd=tmp_path, env=PLAIN, capture_output=True,
                          text=True, timeout=600)
    _one_error_line(done, prog, "symbolic links")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "a.json", "b", "b.json"]


def test_a_stored_timeline_that_is_a_symlink_loop_is_named_as_one(tmp_path):
    """It was "no recorded trace 'loop'": a loop read as a shipped name."""
    os.symlink("loop2", tmp_path / "loop")
    os.symlink("loop", tmp_path / "loop2")
    done = subprocess.run([*EXPORT, "out.json", "loop"], cwd=tmp_path, env=PLAIN,
                          capture_output=True, text=True, timeout=600)
    _one_error_line(done, "python -m overlap_course.traces.kineto", "STORED 'loop'",
                    "symbolic links")
    assert not (tmp_path / "out.json").exists()


# -- case 4: two trace exports on one OUT at once ----------------------------------------------

WAIT_AT_RENAME = """\
import os, sys, time
def _hook(event, args):
    if event == "os.rename" and str(args[1]).endswith("_serial.json"):
        open({ready!r}, "w").close()
        end = time.monotonic() + 300
        while not os.path.exists({go!r}) and time.monotonic() < end:
            time.sleep(0.05)
sys.addaudithook(_hook)
"""


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    end = time.monotonic() + 600
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the first export never reached its renames"
        time.sleep(0.05)


def test_a_second_trace_export_on_the_same_out_is_refused_and_the_pair_is_one_runs(tmp_path):
    work, hook = tmp_path / "work", tmp_path / "hook"
    work.mkdir()
    hook.mkdir()
    ready, go = tmp_path / "ready", tmp_path / "go"
    (hook / "sitecustomize.py").write_text(WAIT_AT_RENAME.format(ready=str(ready), go=str(go)))
    cmd = [*EXPORT, "OUT.json", "--prompts", "1", "--max-new-tokens", "2"]
    first = subprocess.Popen([*cmd, "--host-overhead-ms", "0"], cwd=work, text=True,
                             env={**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(ready, first)
        second = subprocess.run([*cmd, "--host-overhead-ms", "2"], cwd=work, env=PLAIN,
                                capture_output=True, text=True, timeout=600)
    finally:
        go.touch()
        out, err = first.communicate(timeout=600)
    _one_error_line(second, "python -m overlap_course.traces.kineto", "'OUT.json'",
                    "another trace export", "nothing was written")
    assert second.stdout == ""
    assert first.returncode == 0, err
    assert sorted(json.loads(out)) == ["OUT_serial.json", "OUT_zos.json"]
    for name in ("OUT_serial.json", "OUT_zos.json"):  # host overhead spans: only the second's
        assert '"overhead"' not in (work / name).read_text(), f"{name} is the second run's"
    assert sorted(p.name for p in work.iterdir()) == ["OUT_serial.json", "OUT_zos.json"]


def test_a_trace_export_into_a_folder_held_by_another_is_refused_before_it_records(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = subprocess.run([*EXPORT, "x.json", "cpu_zos"], cwd=tmp_path, env=PLAIN,
                              capture_output=True, text=True, timeout=600)
    finally:
        os.close(fd)
    _one_error_line(done, "python -m overlap_course.traces.kineto", "'x.json'", "another")
    assert list(tmp_path.iterdir()) == []


# -- case 5: a kill -9's leftover under the same process id ------------------------------------

def test_a_leftover_temporary_file_with_this_pid_does_not_stop_the_export(tmp_path):
    """The leftover is made by a wrapper that then execs the export: the same process id."""
    argv = [sys.executable, *EXPORT[1:], "x.json", "cpu_zos"]
    wrapper = ("import os, sys\n"
               "open(f'.x.json.{os.getpid()}.partial.json', 'w').write('{\"half\": ')\n"
               f"os.execv({sys.executable!r}, {argv!r})\n")
    done = subprocess.run([sys.executable, "-c", wrapper], cwd=tmp_path, env=PLAIN,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "x.json").read_text())["traceEvents"]
    assert len(_partials(tmp_path)) == 1  # the leftover, not this run's
