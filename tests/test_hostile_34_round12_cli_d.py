"""Issue 34, round twelve, the command lines (cases cli2, cli9 and cli23).

cli2: the bench's ``finally`` closed its engines one by one; a Ctrl-C that one ``close()`` held
and replayed broke the loop, leaving the other engines to their finalizers, where a further
press was an ``Exception ignored in: <finalize object>`` traceback after the ``interrupted``
line.  cli9: under ``TOY_ENGINE_START_METHOD=spawn`` a TMPDIR too long for an AF_UNIX socket
failed the device's setup message (torch shares its buffers through a socket in TMPDIR): a
``DeviceError`` traceback, exit 1; neither command caught ``DeviceError``.  cli23:
``site/build.py`` and ``scripts/run_tests.py`` took a Ctrl-C while their first line imported
the course package as a traceback, exit -2.  Each test failed before the fix."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX signals")

# A press at the start of every device shutdown (close(), or the device's finalizer): the
# deterministic form of an impatient user's Ctrl-Cs while the bench closes its engines.
PRESS_AT_SHUTDOWN = r'''
import importlib.util, os, signal, sys


class PressAtShutdown:
    def find_spec(self, name, path=None, target=None):
        if name != "toy_engine.process_device":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            shutdown = module._shutdown

            def pressed(*args):
                os.kill(os.getpid(), signal.SIGINT)
                return shutdown(*args)

            module._shutdown = pressed

        spec.loader.exec_module = exec_module
        return spec


if os.environ.pop("PRESS_AT_SHUTDOWN", ""):
    sys.meta_path.insert(0, PressAtShutdown())
'''

# A SIGINT when the process starts importing CTRL_C_AT_IMPORT (an audit hook sees it).
CTRL_C_AT_IMPORT = r'''
import os, signal, sys
AT = os.environ.pop("CTRL_C_AT_IMPORT", "")
if AT:
    def hook(event, args):
        global AT
        if event == "import" and args[0] == AT:
            AT = ""
            os.kill(os.getpid(), signal.SIGINT)
    sys.addaudithook(hook)
'''


def _site(tmp_path: Path, code: str) -> str:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(code, encoding="utf-8")
    return f"{site}{os.pathsep}{ROOT}"


def _as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session(sid: int) -> set[int]:
    found = set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            found.add(int(stat.split("/")[2]))
    return found


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_bench_ctrl_c_at_every_engine_shutdown_is_one_line_and_130(tmp_path):
    """A press as each engine's device shuts down (before: the first one replayed broke the
    closing loop, the next one an ``Exception ignored`` traceback in a finalizer)."""
    env = {**os.environ, "PYTHONPATH": _site(tmp_path, PRESS_AT_SHUTDOWN),
           "PRESS_AT_SHUTDOWN": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "overlap_course.measure.bench", "--modes",
                             "serial,zos", "--repeats", "1", "--requests", "1",
                             "--max-new-tokens", "2", "--json"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    try:
        _, err = proc.communicate(timeout=240)
        deadline = time.monotonic() + 20  # the forkserver ends once its parent has gone
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _session(proc.pid)
    finally:
        if proc.poll() is None or _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, err) == (130, "python -m overlap_course.measure.bench: "
                                           "interrupted\n"), (proc.returncode, err[-2000:])
    assert not left, f"processes left behind: {left}"


def _long_tmpdir() -> Path:
    base = Path(tempfile.mkdtemp())
    folder = base / ("t" * max(1, 100 - len(str(base)) - 1))  # 100 characters: too long
    folder.mkdir()
    return folder


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv, prog", [
    (["overlap_course.traces.kineto", "export", "OUT.json", "--mode", "zos", "--prompts", "1",
      "--max-new-tokens", "2"], "python -m overlap_course.traces.kineto"),
    (["overlap_course.measure.bench", "--modes", "zos", "--repeats", "1", "--requests", "1",
      "--max-new-tokens", "2"], "python -m overlap_course.measure.bench")])
def test_spawn_with_a_tmpdir_too_long_for_a_socket_needs_none(argv, prog, tmp_path):
    """Under spawn the setup message's shared buffers needed a socket in TMPDIR (before: a
    ``DeviceError`` traceback, "its pipe broke (sending failed: OSError)", exit 1; then one line
    naming TMPDIR, exit 2).  Since round 29 the buffers go with the device process's start,
    their descriptors passed by the start itself: no socket, and the command runs."""
    tmpdir = _long_tmpdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir),
           "TOY_ENGINE_START_METHOD": "spawn"}
    done = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (prog, done.stderr[-2000:])
    assert (tmp_path / "OUT.json").exists() == ("export" in argv)


DIED = "the device process exited with code -9 (killed by SIGKILL) (receiving failed: EOFError)"


def test_trace_export_a_device_that_died_is_one_line_exit_1(monkeypatch, capsys, tmp_path):
    """A ``DeviceError`` while recording (before: a traceback)."""
    import toy_engine.engine
    from overlap_course.traces.kineto import cli
    from toy_engine.device import DeviceError

    class Died:
        def __init__(self, config):
            pass

        def __enter__(self):
            raise DeviceError(DIED)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(toy_engine.engine, "Engine", Died)
    out = tmp_path / "t.json"
    assert cli.main(["export", str(out), "--mode", "zos", "--prompts", "1"]) == 1
    assert capsys.readouterr().err == f"{cli.PROG}: error: the zos run failed: {DIED}\n"
    assert not out.exists()


def test_bench_a_device_that_died_is_one_line_exit_1(monkeypatch, capsys):
    """A ``DeviceError`` during the runs (before: a traceback)."""
    from overlap_course.measure import bench
    from toy_engine.device import DeviceError

    def died(*args):
        raise DeviceError(DIED)

    monkeypatch.setattr(bench, "run_bench", died)
    assert bench.main(["--repeats", "1"]) == 1
    assert capsys.readouterr().err == f"{bench.PROG}: error: {DIED}\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ["overlap_course", "overlap_course.ctrl_c"])
@pytest.mark.parametrize("script, prog", [("site/build.py", "site"),
                                          ("scripts/run_tests.py", "run_tests")])
def test_ctrl_c_while_a_script_imports_the_course_is_one_line_and_130(script, prog, module,
                                                                      tmp_path):
    """The scripts' first line (before: a ``KeyboardInterrupt`` traceback, exit -2)."""
    env = {**os.environ, "PYTHONPATH": _site(tmp_path, CTRL_C_AT_IMPORT),
           "CTRL_C_AT_IMPORT": module}
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=100,
                          preexec_fn=_as_from_a_terminal)
    assert (done.returncode, done.stderr) == (130, f"{prog}: interrupted\n"), done.stderr[-2000:]


def test_a_script_imported_leaves_sigint_unblocked(tmp_path):
    """Imported, not run (``runpy``, a test): the block its first line sets is undone."""
    code = ("import runpy, signal; runpy.run_path(%r); "
            "print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))" % str(
                ROOT / "site" / "build.py"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=100, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr[-2000:]
