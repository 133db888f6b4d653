"""Issue 34's tenth hostile round, the command lines (/work/round10/cli, cases 1, 3 and 4).

A Ctrl-C while the engine's forkserver still imported torch (its preload, the first 0.5 s and
more of a device's first start) printed the forkserver's ~70-line ``KeyboardInterrupt``
traceback above ``trace export``'s and the bench's one line: it is in the terminal's process
group.  A BROWSER_PATH program that starts and never speaks Chrome's protocol (a Firefox, an
old Chromium; here ``sleep``) hung ``handout``, ``site --draw`` and ``notebooks images``
forever.  The progress service and ``python -m overlap_course.progress`` were under no Ctrl-C
rule: a SIGINT at start (the hub stops its services with SIGINT) was a traceback.  Each test
failed when written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
posix = pytest.mark.skipif(not hasattr(os, "killpg") or not os.path.isdir("/proc"),
                           reason="sends SIGINT to a process group and reads /proc (Linux)")


def _as_from_a_terminal() -> None:
    """SIGINT at its default in the child, whatever this test process has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], cwd, env=ENV) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)


def _processes() -> dict[int, tuple[int, str, bytes]]:
    """Every process: pid -> (parent, start time, command line)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        found[int(name)] = (int(stat[1]), stat[19], cmdline)
    return found


def _descendants(pid: int, table: dict) -> dict[int, tuple[int, str, bytes]]:
    family, grew = {pid}, True
    while grew:
        more = {p for p, (parent, _, _) in table.items() if parent in family} - family
        family |= more
        grew = bool(more)
    return {p: table[p] for p in family - {pid}}


def _still_running(seen: dict[int, tuple[int, str, bytes]]) -> list[bytes]:
    """The processes of ``seen`` still running: the same start time (not a reused pid), and a
    command line (a zombie has none: it has ended)."""
    now = _processes()
    return [cmd for pid, (_, start, cmd) in seen.items()
            if pid in now and now[pid][1] == start and b"\0" in now[pid][2]]


# -- case 1: Ctrl-C while the forkserver preloads torch -------------------------------------------

ENGINE_COMMANDS = {
    "trace export": ["-m", "overlap_course.traces.kineto", "export", "t.json", "--prompts", "64",
                     "--max-new-tokens", "16", "--device", "cpu"],
    "bench": ["-m", "overlap_course.measure.bench", "--requests", "4", "--repeats", "1"],
}
PROGS = {"trace export": "python -m overlap_course.traces.kineto",
         "bench": "python -m overlap_course.measure.bench"}


@posix
@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", sorted(ENGINE_COMMANDS))
def test_ctrl_c_while_the_forkserver_preloads_torch_is_one_line(command, tmp_path):
    """The reported runs: SIGINT to the process group (what Ctrl-C does) 0.1 s after the
    forkserver appears, while it imports torch: ``PROG: interrupted`` alone, exit 130, and
    no process of the command (resource tracker, forkserver, device) left behind."""
    proc = _start(["-P", *ENGINE_COMMANDS[command]], tmp_path)
    seen, deadline = {}, time.monotonic() + 180
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(_descendants(proc.pid, _processes()))
            if any(b"forkserver" in cmd for _, _, cmd in seen.values()):
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the command ended before its forkserver started"
        assert time.monotonic() < deadline, "no forkserver within 180 s"
        time.sleep(0.1)  # the forkserver is importing torch now
        os.killpg(proc.pid, signal.SIGINT)
        while proc.poll() is None and time.monotonic() < deadline:  # the device, if it starts
            seen.update(_descendants(proc.pid, _processes()))
            time.sleep(0.01)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "Traceback" not in err, err[-1500:]
    assert err.strip().splitlines() == [f"{PROGS[command]}: interrupted"], err[-1500:]
    assert proc.returncode == 130
    gone_by = time.monotonic() + 20
    while _still_running(seen) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not _still_running(seen), f"left behind: {_still_running(seen)}"


# -- case 3: a BROWSER_PATH program that never answers ------------------------------------------

def _hanging_browser(tmp_path: Path) -> tuple[str, Path]:
    """A "browser" that starts and never answers: it writes its pid, then sleeps."""
    pid_file = tmp_path / "browser.pid"
    script = tmp_path / "hangchrome.sh"
    script.write_text(f"#!/bin/sh\necho $$ > '{pid_file}'\nexec sleep 600\n")
    script.chmod(0o755)
    return str(script), pid_file


def _figure_notebook(path: Path) -> Path:
    output = {"output_type": "display_data", "metadata": {},
              "data": {"application/vnd.plotly.v1+json": {"data": [], "layout": {}},
                       "text/plain": "fig"}}
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": "a", "metadata": {}, "source": "fig", "execution_count": 1,
         "outputs": [output]}]}))
    return path


def _gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # reaped soon by whoever started it; no longer running


def _end_browser(pid_file: Path) -> None:
    """A test that failed leaves no browser: its process group (choreographer's wrapper too)."""
    if pid_file.exists() and not _gone(pid_file):
        try:
            os.killpg(os.getpgid(int(pid_file.read_text())), signal.SIGKILL)
        except OSError:
            pass


@posix
@pytest.mark.timeout(150)
@pytest.mark.parametrize("command", ["handout", "notebooks images"])
def test_a_browser_that_never_answers_is_one_line_and_ended(command, tmp_path, monkeypatch,
                                                             capsys):
    """Before: no line, no exit (the report's run was killed after 6 min 40 s), the browser left
    running.  Now, past ``drawing.BROWSER_START_S`` (shortened here to 3 s): one line naming
    BROWSER_PATH, exit 2, and the browser ended.  The command runs on a thread of its own, so
    that one still waiting after 60 s fails here (its browser ended to let it finish)."""
    from overlap_course.build import drawing, handout, notebooks

    browser, pid_file = _hanging_browser(tmp_path)
    monkeypatch.setenv("BROWSER_PATH", browser)
    monkeypatch.setattr(drawing, "BROWSER_START_S", 3.0, raising=False)
    if command == "handout":
        argv, main = ["--out", str(tmp_path / "out")], handout.main
    else:
        argv, main = ["images", str(_figure_notebook(tmp_path / "f.ipynb"))], notebooks.main
    ended = {}
    command_line = threading.Thread(target=lambda: ended.update(status=main(argv)), daemon=True)
    command_line.start()
    command_line.join(60)
    hung, gone = command_line.is_alive(), _gone(pid_file)
    _end_browser(pid_file)
    command_line.join(60)
    err = capsys.readouterr().err
    assert not hung, f"still waiting for the browser after 60 s; then: {err}"
    assert gone, "the browser was left running"
    assert ended.get("status") == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"BROWSER_PATH='{browser}'" in err and "did not answer within 3 s" in err, err
    assert "Chrome or Chromium" in err, err


@posix
@pytest.mark.timeout(120)
def test_the_handout_command_with_a_browser_that_never_answers_ends(tmp_path):
    """The command as run (``python -m``), its bound shortened through the module: exit 2, one
    line, and no browser left once it has ended."""
    browser, pid_file = _hanging_browser(tmp_path)
    code = ("from overlap_course.build import drawing, handout\n"
            "from overlap_course.command_line import run\n"
            "drawing.BROWSER_START_S = 3.0\n"
            f"run('handout', lambda: handout.main(['--out', {str(tmp_path / 'out')!r}]))\n")
    proc = _start(["-c", code], tmp_path, env={**ENV, "BROWSER_PATH": browser})
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        gone = _gone(pid_file)
        _end_browser(pid_file)
    assert proc.returncode == 2 and "Traceback" not in err, err[-1500:]
    assert len(err.strip().splitlines()) == 1 and "did not answer within 3 s" in err, err
    assert gone, "the browser was left running"


# -- case 4: the progress service and command under the Ctrl-C rule ------------------------------

# Runs MODULE as ``python -m`` does, and sends SIGINT to itself the first time an audit EVENT
# with ARG (an import of a module, the database's opening) happens: at that exact point.
DRIVER = """
import os, runpy, signal, sys
PRELUDE
def ctrl_c_at(event, args, fired=[]):
    if event == EVENT and args[0] == ARG and not fired:
        fired.append(True)
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(ctrl_c_at)
runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
"""


def _ctrl_c_at(module: str, event: str, arg: str, argv: list[str], cwd, prelude: str = ""):
    code = (DRIVER.replace("PRELUDE", prelude).replace("EVENT", repr(event))
            .replace("ARG", repr(arg)).replace("MODULE", repr(module)))
    proc = _start(["-c", code, *argv], cwd)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


@posix
@pytest.mark.timeout(120)
@pytest.mark.parametrize("event, arg", [("import", "tornado"), ("sqlite3.connect", None)],
                         ids=["importing tornado", "opening the database"])
def test_the_service_stopped_as_it_starts_stops_cleanly(event, arg, tmp_path):
    """The hub stops its services with SIGINT.  Before: one landing while the service imported
    tornado, or opened and checked its database (``PRAGMA quick_check``, seconds for a term's
    file on a slow disk), was a traceback and a death by SIGINT.  Now a clean stop, exit 0.
    The database under a stand-in hub: without one the service opens none (round 17)."""
    pytest.importorskip("tornado")
    db = str(tmp_path / "room.sqlite")
    status, _, err = _ctrl_c_at("overlap_course.progress_service", event, arg or db,
                                ["--db", db], tmp_path, FAKE_HUB if arg is None else "")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-1500:]
    assert (status, err) == (0, ""), (status, err[-1500:])


# A hub for the service to run under: only what it uses before a request comes.
FAKE_HUB = """
import types
from tornado import web
class HubOAuth:
    @classmethod
    def instance(cls, **kwargs):
        return cls()
auth = types.ModuleType("jupyterhub.services.auth")
auth.HubOAuth, auth.HubOAuthCallbackHandler = HubOAuth, web.RequestHandler
auth.HubOAuthenticated = type("HubOAuthenticated", (), {})
utils = types.ModuleType("jupyterhub.utils")
utils.url_path_join = lambda *parts: "/".join(p.strip("/") for p in parts if p)
sys.modules.update({"jupyterhub": types.ModuleType("jupyterhub"), "jupyterhub.utils": utils,
                    "jupyterhub.services": types.ModuleType("jupyterhub.services"),
                    "jupyterhub.services.auth": auth})
"""


@posix
@pytest.mark.timeout(120)
def test_the_service_stopped_while_it_serves_stops_cleanly(tmp_path):
    """Stopped while serving (as before this round, now by the same rule): exit 0, no line."""
    pytest.importorskip("tornado")
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code = (FAKE_HUB + "sys.argv[1:] = ['--db', " + repr(str(tmp_path / "room.sqlite")) + "]\n"
            "runpy.run_module('overlap_course.progress_service', run_name='__main__', "
            "alter_sys=True)\n")
    proc = _start(["-c", "import runpy, sys\n" + code], tmp_path,
                  env={**ENV, "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}"})
    try:
        line = proc.stdout.readline()
        assert "serving" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert (proc.returncode, err) == (0, ""), (proc.returncode, err[-1500:])


@posix
@pytest.mark.timeout(120)
def test_the_progress_command_interrupted_while_it_imports_is_one_line(tmp_path):
    """``python -m overlap_course.progress`` stopped while it imports urllib (the report: 35-55
    ms in, a traceback ending in progress.py's imports): one line and exit 130."""
    status, _, err = _ctrl_c_at("overlap_course.progress", "import", "urllib.request",
                                [str(tmp_path / "none.jsonl")], tmp_path)
    assert err.strip().splitlines() == ["python -m overlap_course.progress: interrupted"], err
    assert status == 130
