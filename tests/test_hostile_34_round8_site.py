"""Issue 34's eighth hostile round, the site build and the service's login: ``./run.sh site``
answered bad input with argparse's usage and tracebacks, and Ctrl-C with a traceback; ``--out
DIR`` deleted ``DIR/src`` and ``DIR/html`` whoever made them; and the progress service answered
a login callback with a code the hub never issued with HTTP 500.  Each failed when written."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hostile_support import ROOT, one_clear_line

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
BUILD = ROOT / "site" / "build.py"
posix = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals and process groups")


def _site_build():
    spec = importlib.util.spec_from_file_location("site_build", BUILD)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def _site(*args: str, cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python site/build.py ARGS`` (what ``./run.sh site`` runs), killed after ``timeout`` s
    (a build started by mistake takes minutes); its stderr says so if it was."""
    proc = subprocess.Popen([sys.executable, str(BUILD), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(still building after {timeout} s: killed)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@posix
@pytest.mark.parametrize("case", ["unknown flag", "a file", "under a file", "empty"])
def test_the_site_build_answers_bad_input_in_one_line(tmp_path, case):
    """argparse's usage above the error (two lines); NotADirectoryError tracebacks, exit 1."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    args = {"unknown flag": ["--nope"], "a file": ["--out", str(afile)],
            "under a file": ["--out", str(afile / "x")], "empty": ["--out", " "]}[case]
    run = _site(*args, cwd=tmp_path)
    one_clear_line(run, "site: error:", *(["afile"] if "file" in case else []))
    assert afile.read_text() == "x"


@posix
def test_the_site_build_deletes_no_folder_it_did_not_make(tmp_path):
    """``--out ~/project`` removed the project's src/ and html/ (rmtree, errors ignored) before
    building; now it refuses, before any work, naming the folder."""
    for sub in ("src", "html"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "precious.txt").write_text("my own work\n")
    start = time.monotonic()
    run = _site("--out", str(tmp_path), cwd=tmp_path)
    lost = [sub for sub in ("src", "html") if not (tmp_path / sub / "precious.txt").is_file()]
    assert not lost, f"deleted: {lost}; the build said {run.stderr[-500:]}"
    one_clear_line(run, str(tmp_path), "src/", "nothing was deleted")
    assert time.monotonic() - start < 30 and not (tmp_path / "doctrees").exists()


def test_the_site_build_replaces_only_the_folders_it_made(tmp_path, monkeypatch):
    """A folder an earlier build stamped is replaced; a link, a file or an unstamped folder is
    refused, and nothing in it is touched.  The default build/site is the build's alone (builds
    before the stamp left none there)."""
    build = _site_build()
    old = tmp_path / "src"
    old.mkdir()
    (old / build.STAMP).write_text("")
    (old / "stale.md").write_text("")
    assert build.fresh_folder(tmp_path, "src") == old
    assert sorted(p.name for p in old.iterdir()) == [build.STAMP]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    (mine / build.STAMP).write_text("")  # a stamp inside the link's target does not make it ours
    (tmp_path / "html").symlink_to(mine)
    (tmp_path / "doctrees").write_text("a file")
    (tmp_path / "jupyter_execute").mkdir()
    for name in ("html", "doctrees", "jupyter_execute"):
        with pytest.raises(ValueError, match=f"already has {name}/.*nothing was deleted"):
            build.fresh_folder(tmp_path, name)
    assert (mine / "keep.txt").is_file() and (tmp_path / "doctrees").read_text() == "a file"
    default = tmp_path / "build" / "site"
    (default / "src").mkdir(parents=True)
    monkeypatch.setattr(build, "DEFAULT_OUT", default)
    build.refuse_foreign(default)


@posix
@pytest.mark.parametrize("phase", ["src", "doctrees"])
def test_ctrl_c_stops_the_site_build_in_one_line(tmp_path, phase):
    """A KeyboardInterrupt traceback, exit 1; Sphinx, interrupted too, added its own line.  Ctrl-C
    (SIGINT to the process group) while staging (``src``) and while Sphinx runs (``doctrees``,
    made just before it starts); Sphinx must not outlive the build."""
    out = tmp_path / "site"
    proc = subprocess.Popen([sys.executable, str(BUILD), "--out", str(out)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not (out / phase).is_dir() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1 if phase == "doctrees" else 0.2)  # Sphinx started and importing
        assert proc.poll() is None, f"the build ended before {phase}/: {proc.stderr.read()[-500:]}"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err[-800:])
    assert err.strip() == "site: interrupted", err[-800:]
    if os.path.isdir("/proc"):
        time.sleep(0.5)
        left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _mentions(pid, str(out))]
        assert not left, f"processes still building into {out}: {left}"


def _mentions(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:  # gone meanwhile, or not ours to read
        return False


HUB = importlib.util.find_spec("jupyterhub") is not None


@posix
@pytest.mark.skipif(not HUB, reason="jupyterhub is not installed here: the login callback is its "
                                    "HubOAuthCallbackHandler (pip install 'jupyterhub>=4,<7')")
def test_a_login_code_the_hub_refuses_is_a_400_not_a_500(tmp_path):
    """Anyone gets a valid state cookie (the room's login redirect sets it); a junk code with it
    reached the hub, whose 400 (invalid_grant) jupyterhub's callback turned into a 500."""
    code = textwrap.dedent("""
        import asyncio, os, urllib.parse
        from tornado import httpclient, web
        from tornado.httpserver import HTTPServer
        from tornado.testing import bind_unused_port

        class Token(web.RequestHandler):  # the hub (oauthlib) on a code it never issued
            def check_xsrf_cookie(self):
                pass
            def post(self):
                self.set_status(400)
                self.finish({"error": "invalid_grant", "error_description": "Invalid code"})

        async def main():
            hub, hub_port = bind_unused_port()
            HTTPServer(web.Application([(r"/hub/api/oauth2/token", Token)])).add_sockets([hub])
            prefix = "/services/course-progress/"
            os.environ.update(JUPYTERHUB_API_URL=f"http://127.0.0.1:{hub_port}/hub/api",
                              JUPYTERHUB_API_TOKEN="svc",
                              JUPYTERHUB_CLIENT_ID="service-course-progress",
                              JUPYTERHUB_SERVICE_PREFIX=prefix, JUPYTERHUB_BASE_URL="/",
                              JUPYTERHUB_OAUTH_CALLBACK_URL=prefix + "oauth_callback",
                              JUPYTERHUB_OAUTH_ACCESS_SCOPES='["access:services"]')
            from overlap_course import progress_service as ps
            service = ps.ProgressService(ps.open_store("room.sqlite"), "instructors", None, None)
            sock, port = bind_unused_port()
            HTTPServer(service.make_app()).add_sockets([sock])
            base = f"http://127.0.0.1:{port}" + prefix
            client = httpclient.AsyncHTTPClient()
            r = await client.fetch(base, follow_redirects=False, raise_error=False)
            state = urllib.parse.parse_qs(urllib.parse.urlsplit(r.headers["Location"]).query)
            cookie = r.headers["Set-Cookie"].split(";")[0]
            r = await client.fetch(base + "oauth_callback?code=junk&state="
                                   + urllib.parse.quote(state["state"][0]),
                                   headers={"Cookie": cookie}, follow_redirects=False,
                                   raise_error=False)
            print("STATUS", r.code)
            print("BODY", r.body.decode(errors="replace").replace("\\n", " ")[:600])

        asyncio.run(main())
    """)
    # The test's own path (jupyterhub may sit beside the venv's packages, not in them).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, sys.path)])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=env)
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert "STATUS" in lines, run.stderr[-1500:]
    assert lines["STATUS"] == "400", (lines, run.stderr[-1500:])
    assert "the login failed" in lines["BODY"] and "Invalid code" in lines["BODY"], lines
    assert "log in again" in lines["BODY"], lines
