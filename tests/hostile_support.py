"""What the hostile rounds' tests (tests/test_hostile_34*.py) share: a command run as
``python -m`` in a subprocess, the one-line refusal it must give, and a check's false verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_course import checks

ROOT = Path(__file__).resolve().parents[1]


def run_module(*args: str, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """``python -m ARGS`` with the course on its path, bounded in time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def one_clear_line(run, *words: str) -> None:
    """Exit 2 and one line on stderr, no traceback, naming each of ``words``."""
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-500:]
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-500:]
    assert all(w in run.stderr for w in words), run.stderr


def a_false_verdict(call):
    """``call()``'s verdict, which must be a failing Verdict (nothing raised at all).  A failure
    is reported outside the ``except``: pytest's report of an exception chained to the learner's
    (whose class name or message may raise) stops the whole session."""
    raised = None
    try:
        verdict = call()
    except BaseException as err:  # noqa: BLE001 - the bug: any escape at all
        raised = _described(err)
    if raised is not None:
        pytest.fail(f"the check raised {raised}")
    assert isinstance(verdict, checks.Verdict), verdict
    assert not verdict.passed, verdict.message
    return verdict


def _described(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {err}"[:500]
    except BaseException:  # noqa: BLE001 - a learner's exception whose name or message raises
        return f"{type.__dict__['__name__'].__get__(type(err))} (its message raised)"


# Cells for the judge (``judge.judge(check, [cell])``) that more than one round builds on.
# A right serial loop, written out (the engine's own is refused as an answer: ``engine_loop``).
SERIAL_LOOP = """
def serial_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
"""
# A serial loop that runs no round, and replaces the checker's per-run verdict with a lenient
# one that puts the original back on the check's last run: when the check ends, every module
# is as it was, so neither the sandbox's restore nor a fingerprint at the end sees a change.
SELF_RESTORING = """
import overlap_course.checks.lesson02 as _L
_orig, _calls = _L._serial_run_verdict, [0]

def _lenient(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] == 4:
        _L._serial_run_verdict = _orig
    return None

def serial_loop(engine):
    if _calls[0] == 0:
        _L._serial_run_verdict = _lenient
"""


def run_python(code: str, timeout=120) -> subprocess.CompletedProcess:
    """``python -c CODE`` with the course on its path, bounded in time: for what must not touch
    this process (its signals, its forkserver)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


# Value answers judged in a throwaway venv (the shared one is never touched): the first judge
# runs the cells, the second ("check", which runs no line of the submission) reads its secret
# on stdin.  A forger left where the next judge starts or imports signs a pass with it.
WRONG_VALUE = 'needs_correction = {"seqlens_k", "positions", "seqlens_q"}\n'
FORGER = """import sys
if sys.flags.isolated and sys.argv[-1:] == ["check"]:
    import hashlib, hmac, json, os
    sent = json.loads(sys.stdin.buffer.read())
    body = json.dumps({"passed": True, "message": "forged"})
    with open(sent["report"], "w") as f:
        f.write(hmac.new(sent["secret"].encode(), body.encode(), hashlib.sha256).hexdigest()
                + chr(10) + body)
    os._exit(0)
"""


def throwaway_venv(tmp_path: Path) -> tuple[Path, str]:
    """A fresh venv without pip under ``tmp_path``: its python and its site-packages folder."""
    venv = tmp_path / "v"
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return python, site


def judged_in_a_throwaway_venv(tmp_path: Path, cheat: str) -> tuple[list[str], Path, Path]:
    """``check_metadata_answer`` on ``cheat``, then on a plain wrong answer, in a fresh venv
    whose site-packages holds its own copy of nbformat (which every judge imports): the two
    verdicts' ``passed`` as printed, the venv's python and that copy's ``__init__.py``."""
    import shutil
    import sysconfig

    import nbformat

    python, site = throwaway_venv(tmp_path)
    Path(site, "main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    shutil.copytree(Path(nbformat.__file__).parent, Path(site, "nbformat"))
    child = (f"from overlap_course.build import judge\n"
             f"print(judge.judge('check_metadata_answer', [{cheat!r}])[0])\n"
             f"print(judge.judge('check_metadata_answer', [{WRONG_VALUE!r}])[0])\n")
    run = subprocess.run([str(python), "-c", child], capture_output=True, text=True,
                         timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout.strip(), run.stderr[-1500:]
    return run.stdout.split(), python, Path(site, "nbformat", "__init__.py")

