"""The course on a real JupyterHub: two learners log in through Chromium and run notebook 00.

What an instructor's hub does, on loopback: JupyterHub (``DummyAuthenticator``, one shared
password) with ``LocalProcessSpawner``, which starts each learner's ``jupyterhub-singleuser``
as that learner's own Unix user, behind ``configurable-http-proxy`` (npm).  Everything comes
from ``scripts/install_hub.sh`` (``/opt/toy-engine-hub``: a venv from a system Python that
every user can execute, with the course package installed from this checkout).

The test, as root:

1. adds two Unix users (``useradd``; names unique to the run, removed at the end) and copies
   ``notebooks/00_start_here.ipynb`` into their homes; starts the hub on free 127.0.0.1 ports;
2. logs both learners in through the hub's login form in two browser contexts (separate
   cookies) of Debian's Chromium (Playwright, no browser download); JupyterLab opens on the
   notebook in each;
3. runs all cells in both at the same time and checks that every code cell ran and no cell
   shows an error;
4. then starts one more engine in each kernel (a learner who leaves an engine open) and
   stops each learner's server through the hub's REST API: every process of that user --
   server, kernel, forkserver, device process -- must be gone within 30 s;
5. samples every process of each user every 0.5 s from login to stop and writes the peaks
   (RSS, PSS: shared torch pages counted once per user) and the CPU seconds used to
   ``artifacts/hub/usage.json``; docs/jupyterhub.md turns them into per-user guarantees;
6. (issue 27) the hub also runs the room's progress service: between 3 and 4, an instructor
   (group ``instructors``, no server) watches both learners' checks arrive on the service's live
   page; a second test then sends every refusal the service must make, with real tokens, kills
   the service and checks the page after the hub restarts it (``hub_progress.py``).

Needs root, ``bash scripts/install_hub.sh`` and ``bash scripts/install_browser.sh``; without
them the test is skipped, unless ``REQUIRE_HUB_TEST=1`` (CI) turns the skip into a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_support import CHROMIUM, CHROMIUM_ARGS, free_port, sync_api, unavailable  # noqa: E402
from test_jupyterlab import (  # noqa: E402  (the JupyterLab page helpers, shared)
    _JS_HELPERS, _assert_no_errors, _clear_outputs, _code, _command, _log_tail, _write_json)
import hub_progress  # noqa: E402  (issue 27: the room's progress service, on this test's hub)

# It measures each learner's memory and CPU time (artifacts/hub/usage.json): no test beside it.
pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "hub"
PREFIX = Path(os.environ.get("TOY_HUB_PREFIX", "/opt/toy-engine-hub"))
JUPYTERHUB = PREFIX / "venv" / "bin" / "jupyterhub"
PROXY = PREFIX / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"

# Unix user names unique to this run: two runs on one machine never touch each other's users.
RUN_ID = secrets.token_hex(3)
LEARNERS = [f"toyhub-{RUN_ID}-{name}" for name in ("ada", "ben")]
INSTRUCTOR = f"toyhub-{RUN_ID}-ines"  # a hub user only (the group "instructors"); never spawns a server
NOTEBOOK = "notebooks/00_start_here.ipynb"
SPAWN_TIMEOUT_S = 180    # login, server start and JupyterLab loaded, both learners
RUN_TIMEOUT_S = 420      # all cells of notebook 00 in both kernels at once, cold kernels
STOP_TIMEOUT_S = 30      # a stopped server's processes all gone (the spawner's own SIGINT/TERM/KILL ladder is 20 s)
SAMPLE_EVERY_S = 0.5


def _unavailable(reason: str):
    unavailable(reason, "REQUIRE_HUB_TEST",
                "run as root after `bash scripts/install_hub.sh` and `bash scripts/install_browser.sh`")


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.py"))}


def _hub_api(hub: dict, path: str, method: str = "GET", timeout: float = 30.0):
    req = urllib.request.Request(f"{hub['base']}/hub/api{path}", method=method,
                                 headers={"Authorization": f"token {hub['token']}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _user_processes(uid: int) -> list:
    import psutil

    out = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids is not None and uids.real == uid:
            out.append(proc)
    return out


def _role(proc) -> str:
    """What a learner's process is, from its command line."""
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - it just ended
        return "gone"
    if "jupyterhub-singleuser" in cmd:
        return "server"
    if "ipykernel" in cmd:
        return "kernel"
    if "multiprocessing.resource_tracker" in cmd:
        return "resource_tracker"
    if "multiprocessing.forkserver" in cmd or "multiprocessing.spawn" in cmd:
        # The forkserver itself is the kernel's child; device processes are forked from it.
        try:
            parent = " ".join(proc.parent().cmdline())
        except Exception:  # noqa: BLE001
            parent = ""
        return "device" if ("multiprocessing.forkserver" in parent or "spawn" in cmd) else "forkserver"
    return "other"


class _Sampler(threading.Thread):
    """Every 0.5 s: RSS and PSS of each learner's processes, by role; CPU seconds per process."""

    def __init__(self, uids: dict[str, int]):
        super().__init__(daemon=True)
        self.uids, self.stop_flag = uids, threading.Event()
        # Sums over the learner's processes at the sample with the most RSS (and most PSS), and
        # the most memory one process of each role held alone (USS: pages no other process maps).
        self.peak = {u: {"rss_mib": 0.0, "pss_mib": 0.0, "by_role_rss_mib": {}, "one_process_uss_mib": {}}
                     for u in uids}
        self.cpu_s: dict[str, dict[int, float]] = {u: {} for u in uids}  # last seen, per pid
        self.roles_seen: dict[str, set] = {u: set() for u in uids}
        self.cpu_total: dict[str, list] = {u: [] for u in uids}  # (time, CPU seconds so far)
        self.others: dict[str, set] = {u: set() for u in uids}  # command lines of role "other"

    def run(self):
        while not self.stop_flag.is_set():
            for user, uid in self.uids.items():
                self.sample(user, uid)
            self.stop_flag.wait(SAMPLE_EVERY_S)

    def sample(self, user: str, uid: int) -> None:
        rss = pss = 0
        by_role: dict[str, float] = {}
        for proc in _user_processes(uid):
            try:
                mem = proc.memory_full_info()
                cpu = proc.cpu_times()
                role = _role(proc)
            except Exception:  # noqa: BLE001 - ended between listing and reading
                continue
            rss, pss = rss + mem.rss, pss + mem.pss
            by_role[role] = by_role.get(role, 0) + mem.rss / 2**20
            uss = self.peak[user]["one_process_uss_mib"]
            uss[role] = max(uss.get(role, 0), round(mem.uss / 2**20, 1))
            self.cpu_s[user][proc.pid] = cpu.user + cpu.system
            self.roles_seen[user].add(role)
            if role == "other":
                self.others[user].add(" ".join(proc.cmdline())[:120])
        self.cpu_total[user].append((time.monotonic(), sum(self.cpu_s[user].values())))
        peak = self.peak[user]
        if pss / 2**20 > peak["pss_mib"]:
            peak["pss_mib"] = round(pss / 2**20, 1)
        if rss / 2**20 > peak["rss_mib"]:
            peak["rss_mib"] = round(rss / 2**20, 1)
            peak["by_role_rss_mib"] = {k: round(v, 1) for k, v in sorted(by_role.items())}

    def cpu_seconds(self, user: str) -> float:
        return round(sum(self.cpu_s[user].values()), 1)

    def peak_cores(self, user: str, window_s: float = 2.0) -> float:
        """The most cores the learner's processes used together, over any 2 s window."""
        series, best, j = self.cpu_total[user], 0.0, 0
        for t, total in series:
            while j < len(series) and series[j][0] <= t - window_s:
                j += 1
            if j and t > series[j - 1][0]:
                t0, c0 = series[j - 1]
                best = max(best, (total - c0) / (t - t0))
        return round(best, 2)


# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def playwright_api():
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        _unavailable("LocalProcessSpawner runs servers as other Unix users: the test must run as root")
    for path in (JUPYTERHUB, PROXY):
        if not os.access(path, os.X_OK):
            _unavailable(f"no {path}")
    api = sync_api(_unavailable)
    site = subprocess.run([str(PREFIX / "venv" / "bin" / "python"), "-c",
                           "import toy_engine, os; print(os.path.dirname(toy_engine.__file__))"],
                          cwd="/", capture_output=True, text=True, check=True).stdout.strip()
    if _digest(Path(site)) != _digest(REPO / "toy_engine"):
        pytest.fail(f"the hub's course package ({site}) is not this checkout's toy_engine/: "
                    "run `bash scripts/install_hub.sh` again", pytrace=False)
    return api


@pytest.fixture(scope="module")
def learners(playwright_api):
    """Two Unix users with notebook 00 in their home; removed (with every process) afterwards."""
    uids = {}
    for name in LEARNERS:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        home = Path(pwd.getpwnam(name).pw_dir)
        (home / "notebooks").mkdir()
        shutil.copy(REPO / NOTEBOOK, home / NOTEBOOK)
        # JupyterLab without news, update checks or autosave; the app object exposed to the test.
        _write_json(home / ".jupyter" / "jupyter_server_config.json",
                    {"ServerApp": {"terminals_enabled": False},
                     "LabApp": {"expose_app_in_browser": True, "news_url": None,
                                "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                                "extension_manager": "readonly"}})
        _write_json(home / ".jupyter" / "labconfig" / "page_config.json",
                    {"buildCheck": False, "buildAvailable": False})
        settings = home / ".jupyter" / "lab" / "user-settings" / "@jupyterlab"
        _write_json(settings / "docmanager-extension" / "plugin.jupyterlab-settings", {"autosave": False})
        _write_json(settings / "apputils-extension" / "notification.jupyterlab-settings",
                    {"fetchNews": "false", "checkForUpdates": False})
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
        uids[name] = pwd.getpwnam(name).pw_uid
    try:
        yield uids
    finally:
        for name, uid in uids.items():
            for proc in _user_processes(uid):
                try:
                    proc.kill()
                except Exception:  # noqa: BLE001 - already gone
                    pass
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


@pytest.fixture(scope="module")
def hub(learners, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jupyterhub")
    port, hub_port, proxy_api_port, progress_port = free_port(), free_port(), free_port(), free_port()
    password, token = secrets.token_urlsafe(12), secrets.token_hex(16)
    server_cmd = [str(PREFIX / "venv" / "bin" / "jupyterhub-singleuser")]
    progress_url = f"http://127.0.0.1:{port}/services/{hub_progress.SERVICE}/"  # learners' kernels send here
    (tmp / "jupyterhub_config.py").write_text(f"""
c = get_config()  # noqa
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/jupyterhub_cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = {set(learners) | {INSTRUCTOR}!r}
c.JupyterHub.load_groups = {{"instructors": {{"users": [{INSTRUCTOR!r}]}}}}
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = {server_cmd!r}
c.Spawner.default_url = "/lab/tree/{NOTEBOOK}"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {{"OVERLAP_PROGRESS_URL": {progress_url!r}}}
c.JupyterHub.services = [{{"name": "hub-test", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "hub-test", "services": ["hub-test"],
                             "scopes": ["list:users", "read:users", "admin:servers", "tokens"]}}]
""" + hub_progress.service_config(progress_port, str(PREFIX / "venv" / "bin" / "python"),
                                  tmp / "course-progress.sqlite", REPO / "docs" / "instructor_guide.md"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TOY_ENGINE_START_METHOD")}
    env["PATH"] = f"{PREFIX / 'venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    log = tmp / "jupyterhub.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(JUPYTERHUB), "-f", str(tmp / "jupyterhub_config.py")], cwd=tmp, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    info = dict(base=base, token=token, password=password, log=log, proc=proc,
                progress=dict(db=str(tmp / "course-progress.sqlite"), instructor=INSTRUCTOR))
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyterhub exited with {proc.returncode}:\n{_log_tail(log)}", pytrace=False)
            try:
                _hub_api(info, "/users", timeout=2)
                break
            except (urllib.error.URLError, OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyterhub did not answer in 90 s:\n{_log_tail(log)}", pytrace=False)
                time.sleep(0.5)
        yield info
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the hub stops the servers it spawned, and its proxy
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


# ---------------------------------------------------------------------------- page helpers

def _log_in(page, hub: dict, user: str) -> None:
    page.goto(f"{hub['base']}/hub/login", wait_until="domcontentloaded")
    page.fill("#username_input", user)
    page.fill("#password_input", hub["password"])
    page.click("#login_submit")


def _wait_for_lab(page, user: str, deadline: float) -> None:
    """The hub spawns the server and redirects to JupyterLab on the notebook."""
    left = lambda: max(1_000, int((deadline - time.monotonic()) * 1000))  # noqa: E731
    page.wait_for_url(f"**/user/{user}/lab/**", timeout=left())
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined", timeout=left())
    page.evaluate("() => window.jupyterapp.started")
    page.evaluate(_JS_HELPERS)
    page.wait_for_function("(p) => { const w = window.__browserTest.panel(p);"
                           " return w && w.context.isReady && w.content.widgets.length > 0; }",
                           arg=NOTEBOOK, timeout=left())
    page.wait_for_function("(p) => window.__browserTest.kernelStatus(p) === 'idle'", arg=NOTEBOOK,
                           timeout=left())


def _start_run_all(page, user: str) -> None:
    """Run All, repeated while no cell has started (on a cold kernel one is sometimes lost)."""
    for _ in range(6):
        _command(page, NOTEBOOK, "notebook:run-all-cells")
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end:
            cells = page.evaluate("(p) => window.__browserTest.cells(p)", NOTEBOOK)
            if any(c["count"] is not None or c["prompt"].startswith("[*]") for c in _code(cells, 0, len(cells))):
                return
            page.wait_for_timeout(250)
    pytest.fail(f"{user}: Run All never started a cell", pytrace=False)


def _finished(page) -> tuple[bool, list[dict]]:
    """Done: kernel idle, no ``[*]``, and every code cell ran (or one raised, which stops the run)."""
    status = page.evaluate("(p) => window.__browserTest.kernelStatus(p)", NOTEBOOK)
    cells = page.evaluate("(p) => window.__browserTest.cells(p)", NOTEBOOK)
    code = _code(cells, 0, len(cells))
    pending = any(c["prompt"].startswith("[*]") for c in code)
    done = all(c["count"] is not None for c in code)
    failed = any(c["errors"] and "raises-exception" not in c["tags"] for c in code)
    return status == "idle" and not pending and (done or failed), cells


# A learner who leaves an engine open: the server's stop must still end its device process.
_OPEN_ENGINE = """(code) => new Promise((resolve, reject) => {
  const w = window.__browserTest.panel(%r);
  const future = w.sessionContext.session.kernel.requestExecute({code});
  let text = '';
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') text += msg.content.text;
    if (msg.header.msg_type === 'error') text += msg.content.ename + ': ' + msg.content.evalue;
  };
  future.done.then(() => resolve(text), reject);
})""" % NOTEBOOK


# ---------------------------------------------------------------------------- the test

@pytest.mark.timeout(SPAWN_TIMEOUT_S + RUN_TIMEOUT_S + 2 * STOP_TIMEOUT_S + 180)
def test_two_learners_run_notebook_00_on_a_real_jupyterhub(playwright_api, learners, hub):
    sampler = _Sampler(learners)
    sampler.start()
    usage: dict = {"learners": {}, "cpu_count": os.cpu_count()}
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        pages = {}
        try:
            for user in learners:
                context = browser.new_context(viewport={"width": 1400, "height": 1100})
                context.set_default_timeout(60_000)
                pages[user] = context.new_page()
                _log_in(pages[user], hub, user)
            deadline = time.monotonic() + SPAWN_TIMEOUT_S
            for user, page in pages.items():
                _wait_for_lab(page, user, deadline)
                _clear_outputs(page, NOTEBOOK)

            t0 = time.monotonic()
            for user, page in pages.items():
                _start_run_all(page, user)
            finished_at: dict[str, float] = {}
            cells: dict[str, list] = {}
            while len(finished_at) < len(pages) and time.monotonic() < t0 + RUN_TIMEOUT_S:
                for user, page in pages.items():
                    if user not in finished_at:
                        done, cells[user] = _finished(page)
                        if done:
                            finished_at[user] = time.monotonic()
                time.sleep(0.5)
            late = sorted(set(pages) - set(finished_at))
            assert not late, f"{late}: notebook 00 not finished in {RUN_TIMEOUT_S} s"
            for user in pages:
                _assert_no_errors(f"{user}: {NOTEBOOK}", cells[user])
                code = _code(cells[user], 0, len(cells[user]))
                assert all(c["count"] is not None for c in code), f"{user}: not every code cell ran"
                usage["learners"][user] = {"notebook_00_seconds": round(finished_at[user] - t0, 1)}
            usage["progress"] = hub_progress.learners_run_checks(  # issue 27: the instructor's live view
                browser, pages, hub, lambda page, code: page.evaluate(_OPEN_ENGINE, code))

            for user, page in pages.items():
                out = page.evaluate(_OPEN_ENGINE, "import toy_engine as te\n"
                                    "left_open = te.Engine(te.EngineConfig(device='cpu'))\n"
                                    "print(left_open.device.pid)")
                assert out.strip().isdigit(), f"{user}: opening an engine printed {out!r}"
                usage["learners"][user]["open_engine_device_pid"] = int(out)
            time.sleep(2 * SAMPLE_EVERY_S)  # one more sample with the engines open
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            for user, page in pages.items():
                try:
                    page.screenshot(path=str(ARTIFACTS / f"{user}.png"), full_page=True)
                except Exception:  # noqa: BLE001 - keep the real failure
                    pass
            print(f"jupyterhub log tail:\n{_log_tail(hub['log'], 4000)}")
            raise
        finally:
            browser.close()

    for user, uid in learners.items():
        device_pid = usage["learners"][user]["open_engine_device_pid"]
        assert any(p.pid == device_pid for p in _user_processes(uid)), (
            f"{user}: device process {device_pid} is not running as {user} (uid {uid})")
        _hub_api(hub, f"/users/{user}/server", method="DELETE")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (left := _user_processes(uid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, (f"{user}: {STOP_TIMEOUT_S} s after the hub stopped the server, processes remain: "
                          f"{[(p.pid, _role(p)) for p in left]}")
        usage["learners"][user]["stop_seconds"] = round(STOP_TIMEOUT_S - (deadline - time.monotonic()), 1)
    sampler.stop_flag.set()
    sampler.join(timeout=10)

    for user in learners:
        seen = sampler.roles_seen[user]
        assert {"server", "kernel", "device"} <= seen, f"{user}: the sampler saw only {sorted(seen)}"
        usage["learners"][user].update(peak=sampler.peak[user], cpu_seconds=sampler.cpu_seconds(user),
                                       peak_cores_2s=sampler.peak_cores(user),
                                       other_processes=sorted(sampler.others[user]))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "usage.json").write_text(json.dumps(usage, indent=1))
    print(json.dumps(usage, indent=1))


@pytest.mark.timeout(240)
def test_progress_service_refuses_what_it_must_and_survives_a_restart(playwright_api, learners, hub):
    """On the same hub, after the learners' run: see tests/browser/hub_progress.py."""
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            result = hub_progress.refusals_and_restart(browser, hub, list(learners))
        except BaseException:
            print(f"jupyterhub log tail:\n{_log_tail(hub['log'], 4000)}")
            raise
        finally:
            browser.close()
    print(json.dumps(result, indent=1))
