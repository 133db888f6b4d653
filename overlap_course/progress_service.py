"""The room's progress service: a JupyterHub service that collects every learner's verdicts
and shows the instructor where the room stands.

The hub starts it from its config as a *managed* service at ``/services/course-progress/``
(``python -m overlap_course.progress_service --db FILE``).  Learners' kernels ``POST
api/verdicts`` with their own hub token (``overlap_course/progress.py`` sends them); who sent a
verdict comes from the token, never from the request, and a verdict the course's catalogue
does not know is refused with a status that says why (``progress_store.validate``).
Instructors -- hub admins, or members of ``--instructors`` -- see learners x checks and the
room's most common mistakes (``GET``, ``api/room``, ``room.html``, ``guide``).  State is one
SQLite file (``progress_store.py``), committed per verdict: a restarted service loses
nothing.  ``docs/jupyterhub.md`` has every route and refusal, the roles, and the configs for a
plain hub, Zero to JupyterHub and The Littlest JupyterHub.
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))  # the hub's stop: clean, even mid-import

import argparse  # noqa: E402
import html  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sqlite3  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import quote, urlsplit  # noqa: E402
from tornado import httpclient, ioloop, web  # noqa: E402

try:
    from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
except ImportError:  # no hub here: validate(), room() and the page still work (tests/test_progress_service.py)
    HubOAuth = None
    HubOAuthCallbackHandler = web.RequestHandler  # no login without a hub: the route answers 405

    class HubOAuthenticated:  # type: ignore[no-redef]
        pass

    def url_path_join(*parts: str) -> str:  # type: ignore[no-redef]
        return "/".join(p.strip("/") for p in parts if p).join(["/" if parts[0].startswith("/") else "", ""])

try:
    from . import safe_json
    from .progress_catalogue import guide_mistakes, read_guide
    from .progress_page import CSS, page, render_table
    from .progress_store import Store, check_store, open_store, room, validate
except ImportError:  # a script beside copies of the files docs/jupyterhub.md names
    import safe_json  # type: ignore[no-redef]
    from progress_catalogue import guide_mistakes, read_guide  # type: ignore[no-redef]
    from progress_page import CSS, page, render_table  # type: ignore[no-redef]
    from progress_store import Store, check_store, open_store, room, validate  # type: ignore[no-redef]

USER_CACHE_S = 10.0
MAX_WRITES = 100  # verdicts queued for the database (each takes ms; a lock, 1 s)


class _Base(HubOAuthenticated, web.RequestHandler):
    @property
    def app(self) -> "ProgressService":
        return self.settings["progress"]

    def write_error(self, status_code: int, **kwargs) -> None:
        """Say why (tornado's own page says only "Forbidden"): JSON for the API, a line of HTML else."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        why = getattr(exc, "log_message", None) or self._reason
        if "/api/" in self.request.path:
            self.refuse(status_code, why)
        else:
            self.finish(f"<!doctype html><meta charset=utf-8><title>{status_code}</title>"
                        f"<h1>{status_code} {html.escape(self._reason)}</h1><p>{html.escape(str(why))}</p>")

    def refuse(self, code: int, why: str) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": code, "error": why}))


class LoginCallbackHandler(_Base, HubOAuthCallbackHandler):
    """oauth_callback, jupyterhub's but for a code the hub refuses (a stale or forged login
    link): jupyterhub turns the hub's 400 into its own 500; this says 400 and to log in again.
    The hub unreachable or refusing the service's token stays a server error."""

    async def get(self):
        try:
            await super().get()
        except web.HTTPError as err:
            refused = (err.log_message or "").startswith("Failed to check authorization")
            if err.status_code != 500 or not refused:
                raise
            why = err.log_message.partition(": ")[2] or "no reason given"
            raise web.HTTPError(400, f"the login failed: the hub refused its code ({why}); open "
                                     f"{self.app.prefix} to log in again") from None


class VerdictHandler(_Base):
    """POST api/verdicts: token in the header only (a cookie never posts for anyone)."""

    def check_xsrf_cookie(self):  # token-authenticated API: no cookies are used
        return

    async def post(self):
        header = self.request.headers.get("Authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() not in ("token", "bearer") or not token.strip():
            return self.refuse(401, "send your hub token: Authorization: token <JUPYTERHUB_API_TOKEN>")
        model = await self.hub_auth.user_for_token(token.strip(), use_cache=False, sync=False)
        if not model:
            return self.refuse(403, "the hub does not know this token")
        if model.get("kind", "user") != "user":
            return self.refuse(403, "only learners send verdicts")
        if not self.hub_auth.check_scopes(self.hub_auth.access_scopes, model):
            return self.refuse(403, f"this token may not use the service (it needs one of "
                                    f"{sorted(self.hub_auth.access_scopes)})")
        if self.get_query_arguments("user") or self.get_query_arguments("name"):
            return self.refuse(403, "who sends a verdict comes from the token, never from the request")
        code, why, verdict = validate(self.request.body, model["name"])
        if verdict is None:
            print(f"refused a verdict from {model['name']}: {code} {why}", flush=True)
            return self.refuse(code, why)
        await self.app.database(self.app.store.add, model["name"], verdict)
        self.set_status(201)
        self.finish({"stored": True, "user": model["name"], "notebook": verdict["notebook"],
                     "check": verdict["check"]})


class _InstructorHandler(_Base):
    api = False  # an API route answers 401 without credentials instead of sending a browser to log in

    async def instructor(self) -> dict | None:
        """The current user if an instructor; 403 for anyone else (a login redirect first)."""
        user = self.current_user
        if not user:
            if self.request.headers.get("Authorization"):
                raise web.HTTPError(403, "the hub does not know this token, or it may not use the service")
            if self.api:
                raise web.HTTPError(401, "log in to the hub, or send an instructor's token")
            self.redirect(self.get_login_url())
            return None
        if not await self.app.is_instructor(user["name"]):
            raise web.HTTPError(403, f"{user['name']} is not an instructor (hub admins and the group "
                                     f"'{self.app.instructors}' are)")
        return user


class RoomHandler(_InstructorHandler):
    """The room: its page, the table the page's refreshes fetch, or its data as JSON (``view``)."""

    def initialize(self, view: str) -> None:
        self.view, self.api = view, view == "api"

    async def get(self):
        if not await self.instructor():
            return
        learners = await self.app.learners()
        entries = await self.app.database(self.app.store.entries, read=True)
        data = room(entries, learners, self.app.store.unreadable)
        if self.view == "api":
            self.set_header("Content-Type", "application/json")
            return self.finish(json.dumps(data))
        table = render_table(data, self.app.guide_url)
        if self.view == "table":
            return self.finish(table)
        # The page's own refreshes are cookie-authenticated fetches: the hub's XSRF rules want the token.
        token = self.xsrf_token
        self.finish(page(self.app.prefix, table, token.decode() if isinstance(token, bytes) else str(token)))


class GuideHandler(_InstructorHandler):
    async def get(self):
        if not await self.instructor():
            return
        try:  # off the event loop: a slow disk holds up this page, not the room
            rows = await ioloop.IOLoop.current().run_in_executor(None, guide_mistakes,
                                                                 self.app.guide_file)
        except ValueError as err:  # edited since the start (no longer UTF-8, too big): not a 500
            raise web.HTTPError(503, f"{err}; fix the file: this page reads it again on every "
                                     f"visit") from None
        if not rows:
            raise web.HTTPError(404, "no instructor guide (start the service with --guide-file)")
        seen, out = set(), []
        for r in rows:
            anchor = "" if r["category"] in seen else f' id="category-{html.escape(r["category"])}"'
            seen.add(r["category"])
            out.append(f"<tr{anchor}><td>{html.escape(r['exercise'])}</td><td><code>{html.escape(r['category'])}"
                       f"</code></td><td>{html.escape(r['mistake'])}</td><td>{html.escape(r['explain'])}</td></tr>")
        self.finish(f"<!doctype html><meta charset=utf-8><title>Mistakes the checkers catch</title>"
                    f"<style>{CSS}</style>"
                    f"<h1>Mistakes the checkers catch, and how to explain them</h1>"
                    f"<p>From the instructor guide.</p><table><tr><th>exercise</th><th>category</th>"
                    f"<th>mistake</th><th>how to explain it</th></tr>{''.join(out)}</table>")


class ProgressService:
    def __init__(self, store: Store, instructors: str, guide_file: str | None,
                 guide_url: str | None):
        self.store = store
        self.instructors = instructors
        self.prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/course-progress/")
        guide = Path(guide_file or Path(__file__).resolve().parent.parent / "docs" / "instructor_guide.md")
        self.guide_file = guide if guide_file or guide.exists() else None
        self.guide_url = guide_url or url_path_join(self.prefix, "guide")
        self.hub_auth = HubOAuth.instance(cache_max_age=60)  # configured by the hub's JUPYTERHUB_* variables
        self._users: dict[str, tuple[float, dict | None]] = {}
        self._all: tuple[float, list[dict]] = (0.0, [])
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="course-progress-db")
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="course-progress-read")
        self._writes = 0  # verdicts waiting for (or in) the write thread

    async def database(self, call, *args, read: bool = False):
        """``call(*args)`` on the store, reads and writes on a thread each: with one thread, a
        lock held by another program (an instructor's ``sqlite3`` shell) made each queued verdict
        wait 5 s, and the room behind them all (30 s for 6).  A write now waits at most
        ``Store.WRITE_WAIT_S``, or none behind :data:`MAX_WRITES` others, then gets a 503."""
        if not read and self._writes >= MAX_WRITES:
            raise web.HTTPError(503, f"{MAX_WRITES} verdicts are waiting for the room's database; "
                                     f"yours stays in your own progress record; try again later")
        self._writes += not read
        try:
            pool = self._reads if read else self._db_thread
            return await ioloop.IOLoop.current().run_in_executor(pool, call, *args)
        except sqlite3.Error as err:
            raise web.HTTPError(503, f"the room's database cannot be used now ({err}); a verdict "
                                     f"stays in the learner's own progress record; try again "
                                     f"later") from None
        finally:
            self._writes -= not read

    async def _hub(self, path: str):
        client = httpclient.AsyncHTTPClient()
        resp = await client.fetch(url_path_join(self.hub_auth.api_url, path), raise_error=False,
                                  headers={"Authorization": f"token {self.hub_auth.api_token}"})
        if resp.code == 404:
            return None
        if resp.code != 200:
            raise web.HTTPError(502, f"the hub answered {resp.code} to {path}")
        return json.loads(resp.body)

    async def user(self, name: str) -> dict | None:
        seen, model = self._users.get(name, (0.0, None))
        if time.monotonic() - seen > USER_CACHE_S:
            model = await self._hub(f"/users/{quote(name)}")
            self._users[name] = (time.monotonic(), model)
        return model

    async def is_instructor(self, name: str) -> bool:
        model = await self.user(name)
        return bool(model) and (bool(model.get("admin")) or self.instructors in (model.get("groups") or []))

    async def learners(self) -> list[str]:
        """The hub's users who are not instructors (they show as rows before their first check)."""
        seen, users = self._all
        if time.monotonic() - seen > USER_CACHE_S:
            users = await self._hub("/users") or []
            self._all = (time.monotonic(), users)
        return [u["name"] for u in users if not u.get("admin") and self.instructors not in (u.get("groups") or [])]

    def make_app(self) -> web.Application:
        def at(tail):  # tornado reads a route as a pattern: a "(" or "." in the prefix is text
            return re.escape(url_path_join(self.prefix, tail))
        settings = {"progress": self, "cookie_secret": os.urandom(32), "xsrf_cookies": False}
        return web.Application([
            (re.escape(self.prefix), RoomHandler, {"view": "page"}),
            (at("room.html"), RoomHandler, {"view": "table"}),
            (at("api/room"), RoomHandler, {"view": "api"}),
            (at("api/verdicts"), VerdictHandler),
            (at("guide"), GuideHandler),
            (at("oauth_callback"), LoginCallbackHandler),
        ], **settings)


PROG = "python -m overlap_course.progress_service"
DEFAULT_URL = "http://127.0.0.1:10101"


def _refuse(message) -> int:
    """One line on stderr (a line break in what it quotes written as \\n), and status 2.  As
    ``overlap_course/command_line.py`` says it; copied, since the hub may have only this file
    and the four beside it (docs/jupyterhub.md)."""
    text = safe_json.message_line(message)  # a line break as \\n, an ESC as \\x1b, bounded
    try:  # stderr closed (None: print would write stdout), full or a pipe nobody reads: status 2
        if sys.stderr is not None:
            print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return 2


class _Parser(argparse.ArgumentParser):
    """Errors in one line (argparse prints its usage first); the hub's log shows the last line."""

    def error(self, message: str):
        raise SystemExit(_refuse(f"{message} (see --help)"))


def listen_address(url: str) -> tuple[str, int]:
    """(host, port) of ``$JUPYTERHUB_SERVICE_URL``; a ValueError naming it if it has no port."""
    try:  # urlsplit refuses an unclosed "[", .port a port out of range
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if port is None or parts.scheme not in ("http", "https"):
        raise ValueError(f"JUPYTERHUB_SERVICE_URL {url[:80]!r} must be http://HOST:PORT (the hub "
                         f"sets it from the service's 'url' in its config)")
    return parts.hostname or "127.0.0.1", port


def serve(store: Store, a: argparse.Namespace, host: str, port: int) -> int:
    """Serve the room until the hub stops the service (SIGINT)."""
    service = ProgressService(store, a.instructors, a.guide_file, a.guide_url)
    # Bodies up to 2 MB reach the handler, which refuses anything over 16 KB with a 413 saying so.
    try:
        service.make_app().listen(port, host, max_body_size=2 * 2**20)
    except OSError as err:  # a port taken, a host that does not resolve or is not this machine's
        return _refuse(f"cannot listen on {host}:{port}, from JUPYTERHUB_SERVICE_URL "
                       f"({err.strerror or err}): give the service a free port of this machine "
                       f"in the hub's config")
    print(f"course-progress: {store.count()} verdict(s) in {a.db}; serving {service.prefix} on "
          f"{host}:{port}", flush=True)
    ioloop.IOLoop.current().start()  # until the hub stops it with SIGINT (see the imports)
    return 0


def main(argv=None) -> int:
    p = _Parser(prog=PROG, description="the course's progress service for a JupyterHub")
    p.add_argument("--db", default="course-progress.sqlite", help="the SQLite file (kept across restarts)")
    p.add_argument("--instructors", default="instructors", help="the hub group whose members see the room")
    p.add_argument("--guide-file", help="the instructor guide (docs/instructor_guide.md) for the mistakes page")
    p.add_argument("--guide-url", help="where mistake links point (default: this service's guide page)")
    a = p.parse_args(argv)
    try:
        host, port = listen_address(os.environ.get("JUPYTERHUB_SERVICE_URL", DEFAULT_URL))
        if a.guide_file == "":  # Path("") is ".": the refusal quoted a folder never given
            raise ValueError("--guide-file is empty: name the instructor guide, e.g. "
                             "--guide-file docs/instructor_guide.md")
        if a.guide_file is not None and read_guide(Path(a.guide_file)) is None:
            raise ValueError(f"--guide-file {safe_json.quoted(a.guide_file, 200)}: no such file")
        if HubOAuth is None:  # refused: --db's refusals first, with no database made
            check_store(a.db)
            raise ValueError("the service runs in a JupyterHub environment: install jupyterhub "
                             "(4 to 6) where it runs")
        store = open_store(a.db)
    except ValueError as err:
        return _refuse(err)
    return serve(store, a, host, port)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:  # stopping: another SIGINT (the hub's, a Ctrl-C) was a traceback from its exit
        signal.signal(signal.SIGINT, signal.SIG_IGN)
