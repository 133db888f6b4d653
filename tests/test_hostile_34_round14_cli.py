"""Issue 34, round fourteen, the command lines (fixer cli14): cases 1-4.

1-3, one cause: a SIGTERM (``kill``) or SIGHUP (a closed terminal) was held only where Ctrl-C
was, and otherwise ended the command at once, its ``finally`` blocks never run.  1: the site
build killed between its two renames (``html -> html.old``, ``html.partial -> html``) had no
``OUT/html`` at all.  2: ``trace export`` killed between its two renames left one new file
beside an old one, and a temporary file.  3: every ``write_whole`` writer (``slides`` shown)
left its ``.NAME.XXXX.partial`` folder.  4: ``progress RECORD`` with a RECORD that does not
exist said "0 passed, 0 tried", exit 0.  Each test failed before the fix.

A kill at an exact point is sent by an audit hook (a ``sitecustomize.py`` on PYTHONPATH) to the
command's own process, at one rename or one open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KILLS = [signal.SIGTERM, signal.SIGHUP]

HOOK = """\
import os, signal, sys
def _hook(event, args, _sig={sig}, _dst={dst!r}, _opened={opened!r}):
    if event == "os.rename" and _dst and str(args[1]).endswith(_dst):
        os.kill(os.getpid(), _sig)
    if (event == "open" and _opened and _opened in str(args[0]) and ".partial" in str(args[0])
            and args[1] and any(c in str(args[1]) for c in "wxa")):
        os.kill(os.getpid(), _sig)
sys.addaudithook(_hook)
"""


def _env(tmp_path: Path, sig: int, *, dst: str = "", opened: str = "", first: str = "") -> dict:
    """PYTHONPATH with a ``sitecustomize`` that sends ``sig`` at the rename onto ``dst`` or at
    the open of a temporary ``opened``; ``first``: a folder put before everything else."""
    hook = tmp_path / f"hook_{sig}"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK.format(sig=int(sig), dst=dst, opened=opened))
    path = [p for p in (first, str(hook), str(ROOT)) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _partials(folder: Path) -> list:
    return sorted(str(p) for p in folder.rglob("*.partial*"))


# -- case 1: the site build killed between its renames ----------------------------------------

FAKE_SPHINX = """\
import os, sys
with open(os.path.join(sys.argv[-1], "index.html"), "w") as f:  # OUT/html.partial
    f.write("the new site")
"""


@pytest.mark.parametrize("sig", KILLS)
def test_a_site_build_killed_between_its_renames_keeps_a_whole_site(tmp_path, sig):
    fake = tmp_path / "fake" / "sphinx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_SPHINX)
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "site" / "build.py"), "--out", str(out)]
    plain = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{ROOT}"}
    first = subprocess.run(cmd, env=plain, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    (out / "html" / "index.html").write_text("the earlier site")
    env = _env(tmp_path, sig, dst=os.sep + "html", first=str(fake.parent))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -sig, done.stderr
    assert (out / "html" / "index.html").read_text() == "the new site", sorted(out.iterdir())
    assert not (out / "html.partial").exists() and not (out / "html.old").exists()


# -- case 2: trace export killed between its renames ------------------------------------------

@pytest.mark.parametrize("sig", KILLS)
def test_a_trace_export_killed_between_its_renames_writes_both_or_neither(tmp_path, sig):
    cmd = [sys.executable, "-m", "overlap_course.traces.kineto", "export", "ex.json"]
    plain = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(cmd, env=plain, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr
    pair = [tmp_path / "ex_serial.json", tmp_path / "ex_zos.json"]
    for path in pair:
        path.write_text("OLD")
    env = _env(tmp_path, sig, dst="ex_zos.json")
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == -sig, done.stderr
    assert len({p.read_text()[:3] == "OLD" for p in pair}) == 1, [p.read_text()[:3] for p in pair]
    assert not _partials(tmp_path)


# -- case 3: a write_whole writer killed mid-write --------------------------------------------

@pytest.mark.parametrize("sig", KILLS)
def test_slides_killed_while_writing_leave_no_partial_folder(tmp_path, sig):
    out = tmp_path / "deck"
    env = _env(tmp_path, sig, opened="plotly.min.js")
    done = subprocess.run([sys.executable, "-m", "overlap_course.build.slides",
                           str(ROOT / "notebooks" / "01_tiny_gpt.ipynb"), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -sig, done.stderr
    assert out.is_dir() and not _partials(out)


# -- case 4: progress RECORD that does not exist ----------------------------------------------

@pytest.mark.parametrize("name", ["progres.jsonl", "no_such_folder/progress.jsonl"])
def test_progress_of_a_record_that_does_not_exist_is_one_line_and_exit_2(tmp_path, name):
    (tmp_path / "progress.jsonl").write_text("")
    record = str(tmp_path / name)
    done = subprocess.run([sys.executable, "-m", "overlap_course.progress", record],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stdout
    assert done.stdout == ""
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err and record in err, err


# -- the shared rule, in command_line.run ------------------------------------------------------

RUN_KILLED = """\
import os, signal, sys, time
from overlap_course.command_line import run
mark, how = sys.argv[1], sys.argv[2]

def main():
    if how == "child":  # a forked child (multiprocessing's fork) dies as by default
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(3)
        open(mark, "w").write(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
        return 0
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    finally:
        if how == "twice":  # a second kill while cleaning up: at once
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(30)
        open(mark, "w").write("cleaned")

run("killed", main)
"""


@pytest.mark.parametrize("how, status, mark", [("once", -signal.SIGTERM, "cleaned"),
                                               ("twice", -signal.SIGHUP, None),
                                               ("child", 0, str(-signal.SIGTERM))])
def test_a_killed_command_cleans_up_then_ends_by_the_signal(tmp_path, how, status, mark):
    script, marker = tmp_path / "killed.py", tmp_path / "mark"
    script.write_text(RUN_KILLED)
    done = subprocess.run([sys.executable, str(script), str(marker), how], capture_output=True,
                          text=True, timeout=25, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (marker.read_text() if marker.exists() else None) == mark
