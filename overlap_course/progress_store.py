"""What the progress service keeps: a verdict as it must be to be stored (:func:`validate`),
the SQLite file that stores it, committed per verdict (:class:`Store`), and the room as the
instructor's page shows it (:func:`room`).

Like the service, it imports nothing of the course but ``progress.py`` (and its catalogue) and
``safe_json.py``, so that the hub can run copies of the five files side by side
(docs/jupyterhub.md).
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import sys
import time
from urllib.parse import quote

try:
    from . import safe_json
    from .progress import CATALOGUE, MAX_BODY_BYTES, ORDER, UNANSWERED, status, well_formed
except ImportError:  # a script beside copies of the files docs/jupyterhub.md names
    import safe_json  # type: ignore[no-redef]
    from progress import (CATALOGUE, MAX_BODY_BYTES, ORDER,  # type: ignore[no-redef]
                          UNANSWERED, status, well_formed)

FIELDS = {"notebook", "check", "passed", "category", "time"}
CATEGORY = re.compile(r"[a-z][a-z0-9_]{0,47}")


#: The columns of the verdicts table: a database whose table lacks one is refused at start.
COLUMNS = {"id", "user", "notebook", "check_name", "passed", "category", "client_time",
           "received"}


class Store:
    """The verdicts, in SQLite: one row per verdict, committed at once.  A file that is not a
    SQLite database raises ``sqlite3.DatabaseError`` here, at start (see :func:`open_store`);
    one whose ``verdicts`` table has other columns, a ``ValueError`` naming it."""

    #: How long a verdict waits for another program's lock (an instructor's ``sqlite3`` shell
    #: in a transaction) before its 503; then, for :data:`LOCKED_S`, verdicts fail at once.  At
    #: SQLite's 5 s each, 6 queued verdicts took 30 s; an insert takes milliseconds.
    WRITE_WAIT_S, LOCKED_S = 1.0, 1.0

    def __init__(self, path: str):
        # the service writes from one worker thread and reads from another (WAL: a reader never
        # waits on a writer), so neither the event loop nor the room waits on a lock
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                  timeout=self.WRITE_WAIT_S)
        self.locked_until = 0.0
        self.unreadable = 0  # rows the last entries() skipped
        _refuse_contents(self.db, path)  # before anything is written: another's is left as it was
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("""CREATE TABLE IF NOT EXISTS verdicts (
            id INTEGER PRIMARY KEY, user TEXT NOT NULL, notebook TEXT NOT NULL, check_name TEXT NOT NULL,
            passed INTEGER NOT NULL, category TEXT NOT NULL, client_time REAL, received REAL NOT NULL)""")
        self.reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.reader.text_factory = _text

    def add(self, user: str, v: dict) -> None:
        """One verdict, committed; a lock met in the last :data:`LOCKED_S` fails it at once."""
        if time.monotonic() < self.locked_until:
            raise sqlite3.OperationalError("database is locked (by another program)")
        try:
            self._insert(user, v)
        except sqlite3.OperationalError as err:
            if "locked" in str(err) or "busy" in str(err):
                self.locked_until = time.monotonic() + self.LOCKED_S
            raise

    def _insert(self, user: str, v: dict) -> None:
        self.db.execute("INSERT INTO verdicts (user, notebook, check_name, passed, category, client_time, received)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (user, v["notebook"], v["check"], int(v["passed"]), v["category"], v.get("time"), time.time()))

    def entries(self) -> dict[str, list[dict]]:
        """Every learner's verdicts.  SQLite keeps a value of any type in any column: a row
        written by another program (an instructor's ``sqlite3`` shell, two rooms' files merged)
        whose values are not what :meth:`add` writes is skipped and counted in
        :attr:`unreadable`, as a learner's record skips a line it cannot read; a text
        ``received`` would break the room's sorting (every page an HTTP 500), and text that is
        not UTF-8 SQLite's decoding (every page a 503, for as long as the row is there)."""
        out: dict[str, list[dict]] = {}
        unreadable = 0
        for user, nb, check, passed, category, received in self.reader.execute(
                "SELECT user, notebook, check_name, passed, category, received FROM verdicts ORDER BY id"):
            entry = {"notebook": nb, "check": check, "passed": passed == 1, "category": category,
                     "time": received}
            readable = isinstance(user, str) and type(passed) is int and passed in (0, 1)
            if readable and well_formed(entry):
                out.setdefault(user, []).append(entry)
            else:
                unreadable += 1
        self.unreadable = unreadable
        return out

    def count(self) -> int:
        return self.reader.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]


def _text(value: bytes) -> str | bytes:
    """A TEXT value as ``str``, or its bytes when they are not UTF-8 (another program wrote
    them): :meth:`Store.entries` counts that row as unreadable instead of raising."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _named(path) -> str:
    """A path as a message quotes it: its repr, at most 200 characters of it."""
    return safe_json.quoted(str(path), 200)


def _refuse_contents(db: sqlite3.Connection, path: str) -> None:
    """A damaged file (``sqlite3.DatabaseError``) or another program's ``verdicts`` table (a
    ``ValueError``) refused, read only; ``db`` closed if so."""
    check = db.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        db.close()
        raise sqlite3.DatabaseError(f"damaged: {' '.join(check.split())[:200]}")  # one line
    columns = {row[1] for row in db.execute("PRAGMA table_info(verdicts)")}
    if columns and not COLUMNS <= columns:  # none: a new file, the table is made below
        db.close()
        raise ValueError(f"the database {_named(path)} has a table 'verdicts' that is not this "
                         f"service's (its columns: {', '.join(sorted(columns))[:200]}; "
                         f"missing: {', '.join(sorted(COLUMNS - columns))}): it holds "
                         f"something else, so it is left as it is; pass another --db")


def _refuse_path(path: str) -> None:
    """No file (``--db ""``, SQLite's ``:memory:``, a ``file:`` URI, which SQLite may read as
    ``file::memory:``: verdicts lost at the service's next restart), a folder, a pipe or a
    device refused, by the name alone."""
    if not path.strip() or path.strip() == ":memory:" or path.startswith("file:"):
        raise ValueError(f"--db {_named(path)} names no file (SQLite would keep the verdicts in "
                         f"memory or a temporary file, or read it as a URI): they would be lost "
                         f"at the service's next restart; pass a file's path, e.g. "
                         f"--db course-progress.sqlite")
    if path.endswith(("/", os.sep)) or os.path.isdir(path):  # SQLite makes "newdir/" a file
        raise ValueError(f"--db {_named(path)} names a folder: name a file in it, e.g. "
                         f"--db {_named(os.path.join(path, 'course-progress.sqlite'))}")
    try:  # followed through links: SQLite opens what a link names
        mode = os.stat(path).st_mode
    except OSError:  # missing (SQLite makes it) or not ours to look at (SQLite says why)
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # /dev/null: SQLite wrote /dev/null-journal
        raise ValueError(f"--db {_named(path)} is a pipe or a device, not a file: SQLite would "
                         f"write its journal beside it and keep nothing; pass a file's path, "
                         f"e.g. --db course-progress.sqlite")


def _cannot_open(path: str, why) -> ValueError:
    return ValueError(f"cannot open the database {_named(path)} ({why}): check that its folder "
                      f"exists and this service may write there, or pass another --db")


def check_store(path: str) -> None:
    """Every refusal :func:`open_store` would give ``path``, with nothing made or written: a
    service refused for another reason (no hub) left a new database, or its schema written into
    an empty file.  A file that is not a readable SQLite database is no refusal: open_store
    moves it aside and starts a fresh one, saying so (nothing is done to it here)."""
    _refuse_path(path)
    try:
        os.stat(path)
    except FileNotFoundError:  # SQLite makes it, where a link points
        pass
    except OSError as err:  # a symbolic link loop, a name too long, a path through a file
        raise _cannot_open(path, err.strerror) from None
    real = os.path.realpath(path)  # SQLite makes its -wal and -shm files beside it
    if not all(os.path.exists(real + end) for end in ("", "-wal", "-shm")) and not os.access(
            os.path.dirname(real), os.W_OK | os.X_OK):  # /proc/self/environ's folder too
        raise _cannot_open(path, "unable to open database file")
    if not os.path.exists(path):
        return
    if not os.access(path, os.R_OK | os.W_OK):
        raise _cannot_open(path, "no permission to read and write it")
    try:  # immutable: read only, with no -wal or -shm file made beside a WAL database
        db = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?immutable=1", uri=True)
        _refuse_contents(db, path)
        db.close()
    except sqlite3.OperationalError as err:
        raise _cannot_open(path, err) from None
    except sqlite3.DatabaseError:  # not SQLite, or damaged: open_store moves it aside
        pass


def open_store(path: str) -> Store:
    """The store at ``path``.  One that cannot be opened (a missing folder, no permission) is a
    ``ValueError`` naming the file and what to do, as are the paths :func:`_refuse_path` refuses;
    a file that is not a readable SQLite database is moved aside (kept, with its -wal and -shm
    files, for recovery) and a fresh one started, saying so: a restarted service keeps serving
    the room and nothing is silently lost."""
    _refuse_path(path)
    try:
        return Store(path)
    except sqlite3.OperationalError as err:
        raise _cannot_open(path, err) from None
    except sqlite3.DatabaseError as err:
        aside = _aside_name(path)
        try:
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.replace(path + suffix, aside + suffix)
        except OSError as move:
            raise ValueError(f"the database {_named(path)} is not a readable SQLite file "
                             f"({err}) and cannot be moved aside ({move.strerror}): move it "
                             f"away by hand, then start again") from None
        print(f"course-progress: {_named(path)} is not a readable SQLite database ({err}); "
              f"moved it to {_named(aside)} (kept for recovery) and started a fresh one",
              file=sys.stderr, flush=True)
        return Store(path)


def _aside_name(path: str) -> str:
    """``PATH.unreadable-DATE-TIME``, with ``-2``, ``-3``... when that is taken (two damaged
    files in one second): a file moved aside never replaces one moved aside before."""
    base = f"{path}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
    aside, n = base, 1
    while any(os.path.lexists(aside + suffix) for suffix in ("", "-wal", "-shm")):
        n += 1
        aside = f"{base}-{n}"
    return aside


#: The latest ``time`` a verdict may carry (about the year 5138): later is no time.
MAX_TIME_S = 1e11


def validate(body: bytes, user: str) -> tuple[int, str, dict | None]:
    """(status, why, verdict): 201 and the verdict to store, or the refusal."""
    if len(body) > MAX_BODY_BYTES:
        return 413, f"a verdict is at most {MAX_BODY_BYTES} bytes; this body has {len(body)}", None
    try:
        v = safe_json.loads(body, "the body")
    except ValueError as err:  # not UTF-8, not JSON, too deep, a number too long
        return 400, str(err), None
    if not isinstance(v, dict):
        return 400, "the body must be a JSON object", None
    if "user" in v or "name" in v:
        named = v.get("user", v.get("name"))
        if named != user:
            return 403, (f"you are {user} (your token says so) and may send only your own verdicts, "
                         f"not {str(named)[:40]!r}'s"), None
        return 400, "no user field: who sends a verdict comes from the token", None
    extra = set(v) - FIELDS
    if extra:
        return 400, (f"unknown field(s) {[str(k)[:40] for k in sorted(extra)[:5]]}; a verdict "
                     f"has {sorted(FIELDS)}"), None
    missing = {"notebook", "check", "passed", "category"} - set(v)
    if missing:
        return 400, f"missing field(s) {sorted(missing)}", None
    if not isinstance(v["notebook"], str) or v["notebook"] not in CATALOGUE:
        return 422, f"unknown notebook {str(v['notebook'])[:60]!r}", None
    if not isinstance(v["check"], str) or v["check"] not in CATALOGUE[v["notebook"]]:
        return 422, f"notebook {v['notebook']} has no check {str(v['check'])[:60]!r}", None
    if not isinstance(v["passed"], bool):
        return 400, "passed must be true or false", None
    if not isinstance(v["category"], str) or not CATEGORY.fullmatch(v["category"]):
        return 400, "category must be a short lower_case name", None
    if v["passed"] != (v["category"] == "passed"):
        return 400, "category is 'passed' exactly when passed is true", None
    t = v.get("time")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                          or not 0 <= t <= MAX_TIME_S):
        return 400, f"time must be seconds since the epoch, from 0 to {MAX_TIME_S:g}", None
    return 201, "stored", v


def room(entries: dict[str, list[dict]], learners: list[str], unreadable: int = 0) -> dict:
    """The page's data: every learner's status per check, and per check the room's mistakes
    (category, learners who made it, tries), most learners first; ``unreadable``: the rows
    :meth:`Store.entries` skipped, which the page counts."""
    checks = [(nb, check) for nb in ORDER for check in CATALOGUE[nb]]
    names = sorted(set(learners) | set(entries))
    grid = {}
    for name in names:
        st = status(entries.get(name, []))
        grid[name] = {f"{nb}/{check}": st[(nb, check)] for nb, check in checks}
    mistakes: dict[str, dict[str, dict]] = {}
    for name, rows in entries.items():
        for e in rows:
            if e["passed"] or e["category"] in UNANSWERED:
                continue
            m = mistakes.setdefault(f"{e['notebook']}/{e['check']}", {}).setdefault(
                e["category"], {"learners": set(), "tries": 0})
            m["learners"].add(name)
            m["tries"] += 1
    common = {key: sorted(([cat, len(m["learners"]), m["tries"]] for cat, m in cats.items()),
                          key=lambda r: (-r[1], -r[2], r[0]))
              for key, cats in mistakes.items()}
    return {"checks": [f"{nb}/{check}" for nb, check in checks], "learners": grid, "mistakes": common,
            "verdicts": sum(len(r) for r in entries.values()), "unreadable": unreadable,
            "updated": time.time()}
