"""`./run.sh` once set up: every command starts at once, with no package index and without pip.

Setup stamps the inputs that define the environment (pyproject.toml, environment.yml, the torch
installer, Python, the folder) into ``.venv/.run-sh-setup``; while they are unchanged no command
calls pip.  Each command runs here with every package index unreachable (``PIP_NO_INDEX=1``,
``PIP_INDEX_URL`` a closed loopback port) and with ``PIP_LOG`` set: pip writes that log on every
run, so its absence shows pip never ran.  A changed input must set up again (pip runs).

Those need the ``.venv`` that `./run.sh setup` made (CI runs the suite through `./run.sh test`,
after `./run.sh setup`); skipped without one.  Which Python sets up a new ``.venv`` (``$PYTHON``
or ``python3``, 3.11 or newer) is checked without one, in a copy of run.sh in a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".run-sh-setup"
CLOSED_INDEX = "http://127.0.0.1:9/"  # the discard port: nothing answers
REVEAL = ROOT / "build" / "reveal.js-5.2.1" / "node_modules" / "reveal.js" / "dist" / "reveal.js"

needs_venv = pytest.mark.skipif(not (VENV / "bin" / "python").is_file(),
                                reason="no .venv: run ./run.sh setup first (CI does)")


def _offline_env(tmp_path: Path) -> tuple[dict, Path]:
    log = tmp_path / "pip.log"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_INDEX_URL=CLOSED_INDEX, PIP_EXTRA_INDEX_URL=CLOSED_INDEX,
               PIP_LOG=str(log), PIP_DEFAULT_TIMEOUT="5", PIP_RETRIES="0")
    env.pop("VIRTUAL_ENV", None)
    return env, log


def _run(args: list[str], tmp_path: Path, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float, Path]:
    env, log = _offline_env(tmp_path)
    start = time.monotonic()
    proc = subprocess.run(["./run.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start, log


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    commands = {
        "setup": ["setup"],
        "test": ["test", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_data.py"],
        "lab": ["lab", "--version"],
        "explorer": ["explorer", "--help"],
        "site": ["site", "--out", str(tmp_path / "site")],
        "handout": ["handout", "--out", str(tmp_path / "handout")],
    }
    if REVEAL.is_file():  # reveal.js comes from npm once; without it `slides` needs npm, not pip
        commands["slides"] = ["slides", "notebooks/00_start_here.ipynb", "--out", str(tmp_path / "slides")]
    return commands


@needs_venv
@pytest.mark.timeout(900)
def test_every_command_works_offline_without_pip_once_set_up(tmp_path):
    failed, timings = [], {}
    for name, args in _commands(tmp_path).items():
        if name == "handout" and not os.access("/usr/bin/chromium", os.X_OK):
            print("handout not run: it prints its PDF with Chromium (bash scripts/install_browser.sh)")
            continue
        work = tmp_path / name
        work.mkdir()
        proc, seconds, log = _run(args, work)
        timings[name] = round(seconds, 1)
        if log.exists():
            failed.append(f"./run.sh {' '.join(args)} ran pip (with no index):\n{log.read_text()[-1500:]}")
        if proc.returncode != 0:
            failed.append(f"./run.sh {' '.join(args)} exited {proc.returncode} with no index:\n"
                          f"{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}")
    print(f"seconds per command: {timings}")
    assert not failed, "\n\n".join(failed)
    assert timings["setup"] < 5, f"./run.sh setup took {timings['setup']} s with nothing to do"


@needs_venv
def test_a_changed_input_sets_up_again(tmp_path):
    """The stamp names each input; one that differs (here: the stamp is edited as if
    pyproject.toml had changed) makes setup run pip again and say what changed."""
    assert STAMP.is_file(), f"./run.sh setup left no stamp of its inputs ({STAMP})"
    original = STAMP.read_text()
    assert any(line.startswith("pyproject.toml ") for line in original.splitlines()), original
    saved = tmp_path / "stamp"
    shutil.copy2(STAMP, saved)
    try:
        STAMP.write_text("".join(("pyproject.toml changed\n" if line.startswith("pyproject.toml ") else line + "\n")
                                 for line in original.splitlines()))
        proc, _, log = _run(["setup"], tmp_path, timeout=600)
        assert log.exists(), f"setup did not run pip after an input changed:\n{proc.stdout}\n{proc.stderr}"
        assert "pyproject.toml" in proc.stderr, f"setup did not say what changed:\n{proc.stderr[-2000:]}"
    finally:
        shutil.copy2(saved, STAMP)  # as it was (a successful offline reinstall writes the same)


def _python_stub(tmp_path: Path, version: str) -> Path:
    """A stand-in interpreter that reports ``version`` and stops at `-m venv` (exit 3), so that
    run.sh's choice of Python is seen without setting anything up."""
    real = "/usr/bin/env python3"
    stub = tmp_path / f"python{version}"
    major, minor = (int(p) for p in version.split(".")[:2])
    stub.write_text(f"""#!/bin/sh
case "$1" in
    -V) echo "Python {version}" ;;
    -m) exit 3 ;;
    -c) exec {real} -c "import sys; sys.version_info = ({major}, {minor}, 0); $2" ;;
esac
""")
    stub.chmod(0o755)
    return stub


def _run_sh_copy(tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "course"
    folder.mkdir()
    shutil.copy2(ROOT / "run.sh", folder / "run.sh")
    env = dict(os.environ, PYTHON=python)
    return subprocess.run([str(folder / "run.sh"), "setup"], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("version", ["3.11.7", "3.12.1", "3.13.0", "3.14.0"])
def test_run_sh_sets_up_with_python_3_11_or_newer_and_says_which(tmp_path, version):
    stub = _python_stub(tmp_path, version)
    proc = _run_sh_copy(tmp_path, str(stub))
    # The stub's `-m venv` exits 3: run.sh accepted this Python and went on to make .venv with it.
    assert proc.returncode == 3, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert f"setting up .venv with {stub} (Python {version})" in proc.stderr, proc.stderr


@pytest.mark.parametrize("version", ["3.10.13", "3.9.18"])
def test_run_sh_names_the_working_versions_to_an_older_python(tmp_path, version):
    proc = _run_sh_copy(tmp_path, str(_python_stub(tmp_path, version)))
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert f"is Python {version}" in proc.stderr and "3.11 or newer" in proc.stderr, proc.stderr
    assert "PYTHON=python3.13 ./run.sh setup" in proc.stderr, proc.stderr
    assert not (tmp_path / "course" / ".venv").exists()


def test_run_sh_says_when_python_is_not_found(tmp_path):
    proc = _run_sh_copy(tmp_path, str(tmp_path / "no-such-python"))
    assert proc.returncode == 2 and "not found" in proc.stderr, proc.stderr


def test_run_sh_says_which_python_an_existing_venv_holds(tmp_path):
    """PYTHON names another version than the .venv already made: run.sh says it uses the .venv."""
    (tmp_path / "course" / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(_python_stub(tmp_path, "3.11.7"), tmp_path / "course" / ".venv" / "bin" / "python")
    shutil.copy2(ROOT / "run.sh", tmp_path / "course" / "run.sh")
    newer = _python_stub(tmp_path, "3.13.0")
    proc = subprocess.run([str(tmp_path / "course" / "run.sh"), "setup"], capture_output=True,
                          env=dict(os.environ, PYTHON=str(newer)), text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    said = f".venv already holds Python 3.11.7, not PYTHON={newer}'s Python 3.13.0"
    assert said in proc.stderr, proc.stderr
