"""Issue 34's fourth hostile round, cases 6-11: files the command lines write.  A shipped
timeline's name as STORED with OUT its file, a stale partial folder or a FIFO beside train's
--out, and FIFOs at the files slides, handout and grading course write: each one line, exit 2
(or a clean success), never a hang or an overwritten input."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ trace export

def _copy_of_the_course(tmp_path: Path) -> Path:
    """The course and the toy copied, so that a command that overwrites a shipped file harms
    only the copy."""
    skip = shutil.ignore_patterns("__pycache__")
    for package in ("overlap_course", "toy_engine"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    return tmp_path


@pytest.mark.timeout(120)
def test_export_does_not_overwrite_the_shipped_timeline_it_converts(tmp_path):
    """``export overlap_course/traces/cpu_zos.json cpu_zos``: exit 0, and the shipped stored
    timeline is replaced by its Kineto export (the next ``export x.json cpu_zos`` fails)."""
    root = _copy_of_the_course(tmp_path)
    shipped = root / "overlap_course" / "traces" / "cpu_zos.json"
    digest = hashlib.sha256(shipped.read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, "-m", "overlap_course.traces.kineto", "export",
                          "overlap_course/traces/cpu_zos.json", "cpu_zos"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=100)
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == digest, run.stdout[:300]
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr


# ------------------------------------------------------------------ training

def _train(out: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    """One step on one window of 8 tokens, one thread: what is saved, and where, is the same
    (4.4 s with the default batch of 16 full windows on two threads, now 3 s)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "overlap_course.train", "--steps", "1",
                           "--batch-size", "1", "--block-size", "8", "--threads", "1",
                           "--sample", "0", "--out", str(out)], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.timeout(120)
def test_train_does_not_replace_the_checkpoint_and_then_say_it_could_not(tmp_path):
    """A stale ``.m.pt.partial/`` holding another file: exit 2 ``cannot write the checkpoint:
    Directory not empty`` -- after ``m.pt`` was replaced by the new checkpoint."""
    out = tmp_path / "m.pt"
    out.write_bytes(b"the old checkpoint")
    (tmp_path / ".m.pt.partial").mkdir()
    (tmp_path / ".m.pt.partial" / "other").write_text("x")
    run = _train(out)
    assert run.returncode in (0, 2) and "Traceback" not in run.stderr, run.stderr[-500:]
    if run.returncode == 2:
        assert out.read_bytes() == b"the old checkpoint", run.stderr[-300:]


@pytest.mark.timeout(120)
def test_train_does_not_hang_on_a_pipe_left_at_its_partial_file(tmp_path):
    """``.m.pt.partial/m.pt`` a FIFO: ``part.open('wb')`` waits for a reader forever."""
    (tmp_path / ".m.pt.partial").mkdir()
    os.mkfifo(tmp_path / ".m.pt.partial" / "m.pt")
    try:
        run = _train(tmp_path / "m.pt", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("train still running after 30 s (blocked opening the FIFO)")
    assert run.returncode in (0, 2) and "Traceback" not in run.stderr, run.stderr[-500:]


# ------------------------------------------------------------------ slides and handout

def _build(args: list[str], timeout: int = 30, **more_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **more_env}
    try:
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[0]} still running after {timeout} s (blocked opening a FIFO)")


@pytest.mark.timeout(120)
def test_slides_do_not_hang_on_a_pipe_at_the_slide_file(tmp_path):
    os.mkfifo(tmp_path / "00_start_here.slides.html")
    run = _build(["overlap_course.build.slides", "--out", str(tmp_path),
                  "notebooks/00_start_here.ipynb"])
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("browser", ["found", "none"])
@pytest.mark.parametrize("name", ["three_rounds.html", "three_rounds.pdf"])
def test_the_handout_does_not_hang_on_a_pipe_at_its_output(tmp_path, name, browser):
    """The pipe is refused before anything is drawn, so with no browser too (a learner's
    ``./run.sh test`` before ``install_browser.sh``); ``/bin/false`` stands for no browser."""
    os.mkfifo(tmp_path / name)
    no_browser = {"BROWSER_PATH": "/bin/false"} if browser == "none" else {}
    run = _build(["overlap_course.build.handout", "--out", str(tmp_path)], **no_browser)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]
    assert name in run.stderr and "not a file" in run.stderr, run.stderr[-500:]


# ------------------------------------------------------------------ grading course

@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["nbgrader_config.py",
                                   "source/02_serial_loop/02_serial_loop.ipynb"])
def test_grading_course_does_not_hang_on_a_pipe_in_dest(tmp_path, where):
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(tmp_path / where)
    run = _build(["overlap_course.build.grading", "course", str(tmp_path)])
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]


def test_control_grading_course_refuses_an_edited_config_in_one_line(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text("mine\n")
    run = _build(["overlap_course.build.grading", "course", str(tmp_path)])
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]
    assert (tmp_path / "nbgrader_config.py").read_text() == "mine\n"
