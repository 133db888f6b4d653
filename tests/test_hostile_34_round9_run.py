"""Issue 34's ninth hostile round, the commands' surroundings: a user with no home, a Ctrl-C
while a command still imports torch, a room's database row of another type, a legal file name
whose temporary name is not, run.sh called from another folder, a guide edited after the
service started.  Each failed before its fix (/work/round9/cli/REPORT9.md cases 5-10)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_support import ROOT, one_clear_line, run_module, run_python
from overlap_course import progress, progress_store
from overlap_course.checks import Verdict

SHIPPED_TRACE = "a100_event_sync"

# -- case 5: no home (HOME unset, a user id with no entry in the password database) --

NO_HOME = ("import os, pwd, runpy, sys\n"
           "os.environ.pop('HOME', None); os.environ.pop('OVERLAP_PROGRESS_FILE', None)\n"
           "def unknown(uid): raise KeyError(f'getpwuid(): uid not found: {uid}')\n"
           "pwd.getpwuid = unknown\n")


@pytest.mark.skipif(sys.platform == "win32", reason="the password database is POSIX's")
def test_progress_with_no_home_says_which_variable_to_set():
    run = run_python(NO_HOME + "sys.argv = ['progress']\n"
                     "runpy.run_module('overlap_course.progress', run_name='__main__')\n", 60)
    one_clear_line(run, "no home folder", "OVERLAP_PROGRESS_FILE")


@pytest.mark.skipif(sys.platform == "win32", reason="the password database is POSIX's")
def test_a_verdict_with_no_home_says_it_is_not_saved():
    run = run_python(NO_HOME + "from overlap_course import progress\n"
                     "from overlap_course.checks import Verdict\n"
                     "v = progress.record(Verdict(False, 'wrong', 'no_flush'), "
                     "check='check_zos_loop', notebook='03_zos_loop')\n"
                     "print(v.message)\n", 60)
    assert run.returncode == 0, run.stderr[-800:]
    assert "your progress is not saved" in run.stdout and "OVERLAP_PROGRESS_FILE" in run.stdout, \
        run.stdout


# -- case 6: Ctrl-C while the command imports torch --

def _torch_loading(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


COMMANDS = {"train": ["overlap_course.train", "--steps", "1", "--out", "/nonexistent/never.pt"],
            "python -m overlap_course.measure.bench": ["overlap_course.measure.bench",
                                                       "--repeats", "1"],
            "corpus": ["overlap_course.corpus"],
            "python -m overlap_course.traces.kineto": ["overlap_course.traces.kineto", "export",
                                                       "never.json", "cpu_zos"]}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see torch load")
@pytest.mark.parametrize("prog", list(COMMANDS))
@pytest.mark.timeout(120)
def test_ctrl_c_while_torch_imports_is_one_line_and_130(prog, tmp_path):
    """SIGINT as soon as torch's library is mapped (its import has a second or more to go)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", *COMMANDS[prog]], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not _torch_loading(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err[-800:])
    assert err.strip().splitlines()[-1] == f"{prog}: interrupted", err[-800:]


def test_trace_summary_imports_no_torch():
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "overlap_course.traces.kineto",
                          "summary", SHIPPED_TRACE], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-800:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines()}
    heavy = imported & {"torch", "toy_engine"}
    assert not heavy, f"`trace summary` imported {heavy}: it only reads JSON"


# -- case 7: a database row of another type --

def test_the_room_skips_and_counts_rows_it_cannot_read(tmp_path):
    path = str(tmp_path / "db.sqlite")
    store = progress_store.open_store(path)
    store.add("carol", {"notebook": "03_zos_loop", "check": "check_zos_loop", "passed": True,
                        "category": "passed"})
    other = sqlite3.connect(path, isolation_level=None)
    insert = ("INSERT INTO verdicts (user, notebook, check_name, passed, category, client_time, "
              "received) VALUES (?, '03_zos_loop', 'check_zos_loop', ?, ?, NULL, ?)")
    other.execute(insert, ("carol", 0, "no_flush", "yesterday"))  # text in a REAL column
    other.execute(insert, ("dan", 0, b"no_flush", 1.0))  # bytes as the category
    other.execute(insert, (b"frank", 0, "no_flush", 1.0))  # bytes as the user
    other.execute(insert, ("erin", "no", "no_flush", 1.0))  # text as passed
    other.close()
    entries = store.entries()
    data = progress_store.room(entries, [], store.unreadable)
    assert store.unreadable == 4 and data["verdicts"] == 1 and data["unreadable"] == 4
    assert data["learners"]["carol"]["03_zos_loop/check_zos_loop"]["state"] == "passed"


def test_the_room_page_says_how_many_rows_were_skipped():
    from overlap_course import progress_service

    data = progress_store.room({}, [], 2)
    assert "2 row(s) of the database could not be read" in progress_service.render_table(data, "g")


# -- case 8: a legal long name for trace export --

def test_export_writes_a_file_whose_name_is_long_but_legal(tmp_path):
    out = tmp_path / ("a" * 245 + ".json")
    out.write_text(""), out.unlink()  # the system takes the name
    run = run_module("overlap_course.traces.kineto", "export", str(out), "cpu_zos", timeout=120)
    assert run.returncode == 0 and out.is_file(), run.stderr[-500:]
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


# -- case 9: run.sh from another folder --

def _run_sh_copy(repo: Path) -> None:
    """run.sh and the inputs it stamps, with a .venv whose python is this one and whose stamp
    matches (so run.sh sets nothing up); the course comes from PYTHONPATH."""
    text = (ROOT / "run.sh").read_text()
    version = re.search(r"^SETUP_VERSION=(\S+)", text, re.M).group(1)
    inputs = re.search(r"^SETUP_INPUTS=\(([^)]*)\)", text, re.M).group(1).split()
    shutil.copy2(ROOT / "run.sh", repo / "run.sh")
    for name in inputs:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    platform = subprocess.run([str(python), "-c", "import platform, sys; "
                               "print(sys.version.split()[0], platform.machine())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    sums = [subprocess.run(f"cksum < {name} | cut -d' ' -f1,2", shell=True, cwd=repo, check=True,
                           capture_output=True, text=True).stdout.strip() for name in inputs]
    stamp = [f"setup {version}", f"python {platform}", f"folder {repo}"]
    stamp += [f"{name} {s}" for name, s in zip(inputs, sums)]
    (repo / ".venv" / ".run-sh-setup").write_text("\n".join(stamp) + "\n")


@pytest.mark.skipif(shutil.which("bash") is None, reason="run.sh needs bash")
@pytest.mark.timeout(180)
def test_run_sh_reads_and_writes_relative_paths_in_the_callers_folder(tmp_path):
    repo, user = tmp_path / "course", tmp_path / "mine"
    repo.mkdir(), user.mkdir()
    _run_sh_copy(repo)
    shutil.copy2(ROOT / "overlap_course" / "traces" / "a100" / f"{SHIPPED_TRACE}.json.gz",
                 user / "my.json.gz")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIP_NO_INDEX": "1"}

    def run_sh(*args):
        return subprocess.run(["../course/run.sh", *args], cwd=user, env=env, capture_output=True,
                              text=True, timeout=150, stdin=subprocess.DEVNULL)

    summary = run_sh("trace", "summary", "my.json.gz")
    assert summary.returncode == 0 and '"device_idle_fraction"' in summary.stdout, summary.stderr
    export = run_sh("trace", "export", "out.json", "cpu_zos")
    assert export.returncode == 0, export.stderr[-800:]
    assert (user / "out.json").is_file() and not (repo / "out.json").exists()


# -- case 10: the guide edited after the service started --

@pytest.mark.timeout(60)
def test_a_guide_edited_to_non_utf8_is_a_503_that_says_why(tmp_path):
    from tornado import httpclient, web

    from overlap_course import progress_service

    guide = tmp_path / "guide.md"
    guide.write_bytes(b"## Mistakes the checkers catch\ncaf\xe9 notes\n")  # Latin-1

    class Open(progress_service.GuideHandler):  # an instructor, without a hub
        async def instructor(self):
            return {"name": "teach"}

    class Service:
        guide_file = guide

    async def get():
        app = web.Application([("/guide", Open)], progress=Service())
        server = app.listen(0, address="127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        try:
            resp = await httpclient.AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/guide",
                                                            raise_error=False)
            return resp.code, resp.body.decode()
        finally:
            server.stop()

    code, body = asyncio.run(get())
    assert code == 503 and "guide.md" in body and "UTF-8" in body, (code, body[-500:])
