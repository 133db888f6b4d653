"""Issue 34's fifth hostile round: a check's time limit defeated by the learner's code turning
off what the limit relies on (the line tracer, the alarm).  Each case runs in its own
interpreter (a hang must not hang pytest) under a 1 s limit, and fails if no verdict came
within 15 s; and the progress service. Each failed when written (round five)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = '''
import signal, sys, threading, time
from overlap_course import checks
from overlap_course.checks import sandbox
sandbox.TIME_LIMIT_S = 1.0

def stubborn(engine):  # the same loop with tracing left on: the control
    while True:
        try:
            time.sleep(10)
        except BaseException:
            pass

def disarms(engine):
    signal.setitimer(signal.ITIMER_REAL, 0)
    threading.Event().wait()

def untraced_answer():
    sys.settrace(None)
    while True:
        try:
            time.sleep(10)
        except BaseException:
            pass
    yield

name = sys.argv[1]
if name.endswith("_answer"):
    verdict = checks.check_swapped_order(globals()[name](), True, False)
else:
    verdict = checks.check_serial_loop(globals()[name])
print("verdict", verdict.passed, verdict.category, flush=True)
'''


def _verdict_line(name: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", SCRIPT, name], capture_output=True,
                             text=True, timeout=15, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{name}`: the check was still running after 15 s (its limit here: 1 s)")
    return run.stdout + run.stderr[-300:]


@pytest.mark.timeout(60)
def test_an_exercise_check_stops_code_that_disarmed_its_alarm():
    """Finding 2: the alarm disarmed (setitimer 0), then a wait in C: the watchdog sends the
    alarm again.  Not fixed, and so not here: the same in a notebook check (no watchdog), and
    an alarm the learner's code ignores (SIG_IGN) or blocks (pthread_sigmask), and finding 1
    (tracing turned off, then every TimeUp caught around a blocking call in an exercise check:
    tracing again at each alarm misplaced the line the verdict names) -- Ctrl-C still stops
    those (sandbox.start_time_limit's docstring)."""
    assert "verdict False time_limit" in _verdict_line("disarms")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["stubborn", "untraced_answer"])
def test_control_the_limit_stops_a_stubborn_loop(name):
    """Controls: the loop with tracing on (exercise check), and with tracing off in a notebook
    check (whose alarm traces again at each alarm): both stopped."""
    assert "verdict False time_limit" in _verdict_line(name)


# ------------------------------------------------------------------ the progress service


def _service(args: list[str], env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "overlap_course.progress_service", *args],
                          capture_output=True, text=True, timeout=30, env=env,
                          stdin=subprocess.DEVNULL)


def _no_hub() -> None:
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return
    pytest.skip("jupyterhub is installed here: the service would start")


@pytest.mark.timeout(60)
def test_a_service_that_cannot_run_leaves_its_db_file_alone(tmp_path):
    """Finding 3: no JupyterHub here, so exit 2; before that, a text file at --db was moved
    aside and replaced by a fresh database."""
    _no_hub()
    notes = tmp_path / "notes.txt"
    notes.write_text("my precious notes\n")
    run = _service(["--db", str(notes)])
    assert run.returncode == 2, run.stderr
    assert notes.read_bytes() == b"my precious notes\n" and sorted(tmp_path.iterdir()) == [notes], (
        sorted(p.name for p in tmp_path.iterdir()), run.stderr)
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.timeout(60)
def test_a_bracket_in_the_service_url_is_refused_naming_the_variable(tmp_path):
    """Finding 4: urllib's 'Invalid IPv6 URL' alone, not naming JUPYTERHUB_SERVICE_URL."""
    run = _service(["--db", str(tmp_path / "p.db")], {"JUPYTERHUB_SERVICE_URL": "http://[::1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "JUPYTERHUB_SERVICE_URL" in run.stderr, run.stderr


@pytest.mark.timeout(60)
def test_control_a_bad_port_is_refused_naming_the_variable(tmp_path):
    run = _service(["--db", str(tmp_path / "p.db")], {"JUPYTERHUB_SERVICE_URL": "http://h:-1"})
    assert run.returncode == 2 and "JUPYTERHUB_SERVICE_URL 'http://h:-1'" in run.stderr, run.stderr


# ------------------------------------------------------------------ grading: the judge

# The notebook's context cell, and a wrong idle_fraction (0.0 whatever the timeline).
WRONG_IDLE = '''
import toy_engine as te
engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)

def idle_fraction(timeline):
    return 0.0
'''

# The same, and inspect.Signature.bind (which context.given calls at every check, and which
# no fingerprint holds) swaps the answer for the toy's own method before the check sees it.
BIND_SWAPPED = WRONG_IDLE + '''
import inspect
_bind = inspect.Signature.bind

def _swapped(self, *args, **kwargs):
    bound = _bind(self, *args, **kwargs)
    if "idle_fraction" in bound.arguments:
        bound.arguments["idle_fraction"] = te.timeline.Timeline.device_idle_fraction
    return bound

inspect.Signature.bind = _swapped
'''


@pytest.mark.timeout(120)
def test_a_patched_standard_library_class_does_not_pass_the_judge():
    """Finding 5: ``(True, 'your idle fraction equals engine.stats.device_idle_fraction ...')``
    for a function that returns 0.0."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_idle_fraction", [BIND_SWAPPED])
    assert not passed, message


@pytest.mark.timeout(120)
def test_control_the_judge_fails_the_wrong_idle_fraction_alone():
    from overlap_course.build import judge
    passed, message = judge.judge("check_idle_fraction", [WRONG_IDLE])
    assert not passed and "expected" in message, message
