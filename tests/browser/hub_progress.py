"""The room's progress service on the real hub of test_jupyterhub.py (issue 27).

Not a test module itself: test_jupyterhub.py's hub runs the service (a managed service,
``/services/course-progress/``) and calls these from its tests, so the progress checks share
its hub, its learners and their running servers instead of starting another hub.

* ``learners_run_checks``: with both learners' JupyterLab open, the instructor logs in through
  Chromium and opens the room's page; one learner answers exercise 04b's check right, the
  other wrong, in their own kernels (the verdict goes out with the learner's own server token);
  the instructor's page, refreshing itself, must show both within seconds, the wrong one with its
  category linked to the instructor guide's explanation; a learner's browser gets 403 there.
* ``refusals_and_restart``: real requests with real hub tokens -- none, a learner's on the
  instructor's routes, a learner posting for another user (query and body), a forged user field,
  a 1 MB body, bad JSON, unknown notebook and check -- each refused with its status, nothing
  stored (the service's SQLite file is read directly); then the service process is killed, the
  hub restarts it, and the instructor's page still shows what the learners did.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import urllib.error
import urllib.request

SERVICE = "course-progress"
CHECK = "04_seqlen_correction/check_metadata_answer"
RIGHT = '{"seqlens_k", "positions", "slot_mapping", "input_ids"}'
WRONG = '{"seqlens_k", "positions", "slot_mapping", "input_ids", "seqlens_q"}'  # -> unchanged_field
WRONG_CATEGORY = "unchanged_field"
SHOWN_WITHIN_S = 10.0      # a learner's verdict on the instructor's page
RESTART_WITHIN_S = 90.0    # the hub polls a managed service every 30 s, then restarts it (torch import included)

_RUN_CHECK = """
import time
from overlap_course import checks
from overlap_course import progress
t0 = time.perf_counter()
verdict = checks.check_metadata_answer(%s)
took_ms = (time.perf_counter() - t0) * 1000
sent = progress.flush_sends(10)
print(verdict.passed, verdict.category, sent, progress.service_url() is not None, progress._service_trouble,
      round(took_ms, 1))
"""


def service_config(port: int, python: str, db, guide, instructor_group: str = "instructors") -> str:
    """The jupyterhub_config.py lines the service needs (what docs/jupyterhub.md shows)."""
    return f"""
c.JupyterHub.services.append({{
    "name": {SERVICE!r},
    "url": "http://127.0.0.1:{port}",
    "command": [{python!r}, "-m", "overlap_course.progress_service", "--db", {str(db)!r},
                "--guide-file", {str(guide)!r}, "--instructors", {instructor_group!r}],
    "oauth_no_confirm": True,
}})
c.JupyterHub.load_roles += [
    {{"name": "user", "scopes": ["self", "access:services!service={SERVICE}"]}},
    {{"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                   "access:services!service={SERVICE}"]}},
    {{"name": {SERVICE!r}, "services": [{SERVICE!r}], "scopes": ["list:users", "read:users", "read:users:groups"]}},
]
"""


def _url(hub: dict, path: str = "") -> str:
    return f"{hub['base']}/services/{SERVICE}/{path}"


def request(hub: dict, path: str, *, token: str | None = None, body: bytes | None = None,
            method: str | None = None) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(_url(hub, path), data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            code, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        code, text = err.code, err.read().decode(errors="replace")
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


def stored(hub: dict) -> int:
    with sqlite3.connect(hub["progress"]["db"]) as db:
        return db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]


def rows(hub: dict) -> list[tuple]:
    with sqlite3.connect(hub["progress"]["db"]) as db:
        return db.execute("SELECT user, notebook, check_name, passed, category FROM verdicts ORDER BY id").fetchall()


def _cell(page, learner: str, check: str = CHECK) -> tuple[str | None, str]:
    loc = page.locator(f'tr[data-learner="{learner}"] td[data-check="{check}"]')
    if loc.count() == 0:
        return None, ""
    return loc.get_attribute("data-state"), loc.inner_text()


def open_instructor_page(browser, hub: dict):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(f"{hub['base']}/hub/login?next=/services/{SERVICE}/", wait_until="domcontentloaded")
    page.fill("#username_input", hub["progress"]["instructor"])
    page.fill("#password_input", hub["password"])
    page.click("#login_submit")
    page.wait_for_url(f"**/services/{SERVICE}/", timeout=60_000)
    page.wait_for_selector("#room")
    return page


def learners_run_checks(browser, pages: dict, hub: dict, run_in_kernel) -> dict:
    """Both learners check an answer in their kernel (first right, second wrong); the
    instructor's page shows both within seconds.  Returns timings for usage.json."""
    instructor = open_instructor_page(browser, hub)
    (right_user, right_page), (wrong_user, wrong_page) = list(pages.items())[:2]
    before = stored(hub)
    t0 = time.monotonic()
    outs = {right_user: run_in_kernel(right_page, _RUN_CHECK % RIGHT),
            wrong_user: run_in_kernel(wrong_page, _RUN_CHECK % WRONG)}
    for user, want in ((right_user, "True passed True True []"), (wrong_user, f"False {WRONG_CATEGORY} True True []")):
        assert outs[user].strip().startswith(want), f"{user}: the check in the kernel printed {outs[user]!r}"
    sent_at = time.monotonic()
    while time.monotonic() < sent_at + SHOWN_WITHIN_S:
        if (_cell(instructor, right_user)[0], _cell(instructor, wrong_user)[0]) == ("passed", "tried"):
            break
        instructor.wait_for_timeout(250)
    shown = time.monotonic() - sent_at
    right_state, wrong_state = _cell(instructor, right_user), _cell(instructor, wrong_user)
    assert right_state[0] == "passed" and wrong_state == ("tried", f"tried: {WRONG_CATEGORY}"), (
        f"{SHOWN_WITHIN_S:.0f} s after the checks the instructor's page shows {right_user}: {right_state}, "
        f"{wrong_user}: {wrong_state} ({instructor.inner_text('#status')}); stored: {rows(hub)}")
    new = rows(hub)[before:]
    assert (right_user, "04_seqlen_correction", "check_metadata_answer", 1, "passed") in new, new
    assert (wrong_user, "04_seqlen_correction", "check_metadata_answer", 0, WRONG_CATEGORY) in new, new
    # The room's common mistakes link the category to the guide's explanation of it.
    link = instructor.locator(f'#mistakes li[data-check="{CHECK}"] a[data-category="{WRONG_CATEGORY}"]')
    assert link.count() == 1, instructor.inner_text("#mistakes")
    link.click()
    instructor.wait_for_selector(f"#category-{WRONG_CATEGORY}")
    explanation = instructor.inner_text(f"#category-{WRONG_CATEGORY}")
    assert "do not move" in explanation, explanation
    # A learner's own browser (logged in to the hub) is refused the instructor's page.
    learner_tab = right_page.context.new_page()
    resp = learner_tab.goto(_url(hub), wait_until="domcontentloaded")
    assert resp.status == 403 and "not an instructor" in learner_tab.content(), (resp.status, learner_tab.url)
    learner_tab.close()
    instructor.context.close()
    return {"checks_ms_in_kernel": {u: float(o.split()[-1]) for u, o in outs.items()},
            "seconds_until_on_instructor_page": round(shown, 1), "run_to_page_s": round(time.monotonic() - t0, 1)}


def _token(hub: dict, user: str) -> str:
    """A real token of ``user``, issued by the hub (the test's own service holds `tokens`)."""
    body = {"note": "progress test", "expires_in": 3600, "scopes": [f"access:services!service={SERVICE}"]}
    req = urllib.request.Request(f"{hub['base']}/hub/api/users/{user}/tokens", data=json.dumps(body).encode(),
                                 method="POST", headers={"Authorization": f"token {hub['token']}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["token"]


def refusals_and_restart(browser, hub: dict, learners: list[str]) -> dict:
    ada, ben = learners[:2]
    instructor = hub["progress"]["instructor"]
    tokens = {u: _token(hub, u) for u in (ada, ben, instructor)}
    good = {"notebook": "03_zos_loop", "check": "check_zos_loop", "passed": False, "category": "no_flush"}
    # Accepted verdicts first (ada wrong, ben right): the refusals below are refused for what they
    # are, not for a broken route, and the page after the restart must still show these two.
    code, answer = request(hub, "api/verdicts", token=tokens[ada], body=json.dumps(good).encode())
    assert (code, answer.get("user")) == (201, ada), (code, answer)
    right = dict(good, passed=True, category="passed")
    code, answer = request(hub, "api/verdicts", token=tokens[ben], body=json.dumps(right).encode())
    assert (code, answer.get("user")) == (201, ben), (code, answer)
    cases = {
        "no token": (None, good, 401),
        "a token the hub never issued": ("0" * 32, good, 403),
        "a learner posting for another user (body)": (tokens[ada], dict(good, user=ben), 403),
        "a learner posting for another user (query)": (tokens[ada], good, 403),
        "a forged user field naming an instructor": (tokens[ben], dict(good, user=instructor), 403),
        "a 1 MB body": (tokens[ada], dict(good, category="x" * 2**20), 413),
        "bad JSON": (tokens[ada], b'{"notebook": "03_zos_loop", ', 400),
        "an unknown notebook": (tokens[ada], dict(good, notebook="06_bonus"), 422),
        "an unknown check": (tokens[ada], dict(good, check="check_everything"), 422),
        "an instructor's token on a learner's route, naming a learner": (tokens[instructor], dict(good, user=ada), 403),
    }
    results = {}
    for what, (token, body, want) in cases.items():
        before = stored(hub)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        path = "api/verdicts" + (f"?user={ben}" if "(query)" in what else "")
        code, answer = request(hub, path, token=token, body=data, method="POST")
        assert code == want, f"{what}: {code} {answer}"
        assert stored(hub) == before, f"{what}: refused with {code} but something was stored"
        results[what] = code
    # The instructor's routes: a learner's token gets 403, no token 401, the instructor's 200.
    assert request(hub, "api/room", token=tokens[ada])[0] == 403
    assert request(hub, "", token=tokens[ben])[0] == 403
    assert request(hub, "api/room")[0] == 401
    code, room = request(hub, "api/room", token=tokens[instructor])
    assert code == 200 and room["learners"][ada]["03_zos_loop/check_zos_loop"]["category"] == "no_flush", room
    before = stored(hub)

    # The service dies; the hub starts it again; nothing is lost.
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"])
             if "overlap_course.progress_service" in " ".join(p.info["cmdline"] or [])
             and hub["progress"]["db"] in " ".join(p.info["cmdline"] or [])]
    assert len(procs) == 1, [p.info["cmdline"] for p in procs]
    old_pid = procs[0].pid
    procs[0].send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # gone, or a zombie until the hub's next poll reaps it
        try:
            if procs[0].status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the service (pid {old_pid}) outlived SIGKILL")
    t0 = time.monotonic()
    while time.monotonic() < t0 + RESTART_WITHIN_S:
        code, room = request(hub, "api/room", token=tokens[instructor])
        if code == 200:
            break
        time.sleep(1)
    restarted = time.monotonic() - t0
    assert code == 200, f"the hub did not restart the service in {RESTART_WITHIN_S:.0f} s: {code} {room}"
    assert room["verdicts"] == before == stored(hub)
    inst = open_instructor_page(browser, hub)
    try:
        for user, want in ((ada, ("tried", "tried: no_flush")), (ben, ("passed", "passed"))):
            got = _cell(inst, user, "03_zos_loop/check_zos_loop")
            assert got == want, (user, got, inst.inner_text("#room")[:2000])
    finally:
        inst.context.close()
    return {"refusals": results, "restart_seconds": round(restarted, 1), "killed_pid": old_pid}
