"""Where a learner stands: every check's verdict, recorded.

Every check of ``overlap_course.checks`` hands its verdict to :func:`record` (through
:func:`recorded`), which appends one line to a record in the learner's home::

    {"v": 1, "notebook": "03_zos_loop", "check": "check_zos_loop", "passed": false,
     "category": "no_flush", "time": 1796000000.0}

-- what the check decided, never the learner's code or the message (a message may quote an
answer).  :func:`your_progress` reads it back: per notebook, which checks passed, which were
tried (with the last mistake's category) and which are not reached yet.

* ``$OVERLAP_PROGRESS_FILE`` names the record (default ``~/.overlap_course/progress.jsonl``).
* Nothing breaks when it cannot be written (read-only home, full disk): the check answers as
  always, and the first such verdict says that progress is not saved.
* On a JupyterHub with the course's progress service (``progress_service.py``), each verdict
  is also sent to the room's service, authenticated with the learner's own hub token
  (``$JUPYTERHUB_API_TOKEN``) to ``$OVERLAP_PROGRESS_URL``.  Sending happens on a background
  thread: a check never waits for the network; when the service is down the verdict is
  dropped there (it stays in the local record) and the next verdict says so once.

A line cut short (a kernel killed mid-write) costs only that line: the next verdict starts on a
fresh line, and the reader skips what it cannot read (whatever its bytes) and says how many.

Self-contained on purpose (standard library and ``safe_json`` only, no import from the engine):
the service imports it and its catalogue (``progress_catalogue.py``) without torch.
"""

from __future__ import annotations

if __name__ == "__main__":  # first: Ctrl-C while the imports run is one line (not on the hub)
    from overlap_course.ctrl_c import interruptible
    interruptible(__name__, "python -m overlap_course.progress")

import functools
import html
import json
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

try:
    from . import safe_json
    from .progress_catalogue import (CATALOGUE, ORDER, UNANSWERED, home_notebook, known, status,
                                     well_formed)
except ImportError:  # copied beside safe_json.py and progress_catalogue.py (docs/jupyterhub.md)
    import safe_json  # type: ignore[no-redef]
    from progress_catalogue import (  # type: ignore[no-redef]
        CATALOGUE, ORDER, UNANSWERED, home_notebook, known, status, well_formed)

RECORD_VERSION = 1
ENV_FILE = "OVERLAP_PROGRESS_FILE"
ENV_URL = "OVERLAP_PROGRESS_URL"    # the room's service, e.g. http://hub:8000/services/course-progress/
SERVICE_NAME = "course-progress"
MAX_BODY_BYTES = 16 * 1024         # what the service accepts per verdict
SEND_TIMEOUT_S = 5.0
ENV_GRADING = "OVERLAP_GRADING"    # set in nbgrader's grading kernels (overlap_course/build/grading.py)


def _record_path() -> Path:
    """The record's path; a ``ValueError`` saying to set :data:`ENV_FILE` where there is no
    home to keep it in (HOME unset and a user id the system does not know: a container's)."""
    path = os.environ.get(ENV_FILE)
    try:
        return Path(path) if path else Path.home() / ".overlap_course" / "progress.jsonl"
    except RuntimeError as err:  # Path.home(): "Could not determine home directory"
        raise ValueError(f"no home folder to keep your progress in ({err}: HOME is unset and "
                         f"this user has none); set {ENV_FILE} to a file you can write, e.g. "
                         f"{ENV_FILE}=/tmp/progress.jsonl") from None


def _notebook_for(check: str) -> str | None:
    session = os.environ.get("JPY_SESSION_NAME", "")
    stem = Path(session).stem if session else ""
    return stem if known(stem, check) else home_notebook(check)


# ------------------------------------------------------------------ recording

_lock = threading.Lock()
_said: set[str] = set()          # notes already given once ("not saved", "service down")
_service_trouble: list[str] = []  # set by the sender thread, said by the next verdict


def _say_once(key: str, note: str) -> str:
    with _lock:
        if key in _said:
            return ""
        _said.add(key)
    return note


class CheckNotPassed(AssertionError):
    """Raised for a verdict that did not pass, only under nbgrader's autograder
    (``$OVERLAP_GRADING=1``): an autograded test cell that raises scores 0."""


def record(verdict, check: str, notebook: str | None = None):
    """Append ``verdict`` to the learner's record (and queue it for the room's service);
    returns the verdict.  Never raises and never blocks on the network -- except under
    nbgrader's autograder, where a verdict that did not pass raises :class:`CheckNotPassed`."""
    _keep(verdict, check, notebook)
    if not verdict.passed and os.environ.get(ENV_GRADING) == "1":
        raise CheckNotPassed(f"{check}: {verdict.message}")
    return verdict


def _keep(verdict, check: str, notebook: str | None) -> None:
    try:
        notebook = notebook or _notebook_for(check)
        if notebook is None:
            return
        entry = {"v": RECORD_VERSION, "notebook": notebook, "check": check, "passed": bool(verdict.passed),
                 "category": verdict.category, "time": round(time.time(), 3)}
        note = ""
        try:
            path = _record_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            _append(path, json.dumps(entry))
        except (OSError, ValueError) as err:  # ValueError: no home to keep it in
            why = (err if isinstance(err, ValueError)
                   else f"{path} cannot be written ({err.strerror or err})")
            note += _say_once("not_saved", f"\n(your progress is not saved: {why}; this answer "
                                           f"is unaffected)")
        _send(entry)
        if _service_trouble:
            note += _say_once("service", f"\n(the room's progress service did not answer "
                                         f"({_service_trouble[0]}): your instructor may not see this "
                                         f"verdict; your own record has it)")
        if note:
            verdict.message += note
    except Exception:  # noqa: BLE001 - recording must never cost the learner the answer
        pass


def _append(path: Path, line: str) -> None:
    """Append one line, on a line of its own: when the record ends in a line cut short (a kernel
    killed mid-write), a newline first, so the cut line is the only one lost.  One unbuffered
    write per line: writers in several kernels at once do not interleave."""
    data = (line + "\n").encode("utf-8")
    with open(path, "a+b", buffering=0) as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)


def recorded(check, name: str | None = None):
    """``check`` with every verdict it returns recorded (``name``: the check's name in
    :data:`CATALOGUE`, default the function's).  A ``name=`` keyword naming a second question
    of the check (``check_discarded(..., name="discarded_by_abort")``) is recorded as
    ``check:name``."""
    base = name or check.__name__

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        verdict = check(*args, **kwargs)
        asked = kwargs.get("name")  # a plain str: a subclass's own __format__ may raise
        asked = f"{base}:{str.__str__(asked)}" if isinstance(asked, str) else None
        which = asked if asked is not None and home_notebook(asked) else base
        return record(verdict, check=which)

    return wrapper


# ------------------------------------------------------------------ the room's service

def service_url() -> str | None:
    """Where verdicts go on a hub: ``$OVERLAP_PROGRESS_URL`` + ``api/verdicts``, only with a
    hub token to send them with."""
    base = os.environ.get(ENV_URL, "")
    if not base or not os.environ.get("JUPYTERHUB_API_TOKEN"):
        return None
    return base.rstrip("/") + "/api/verdicts"


class _Sender(threading.Thread):
    def __init__(self):
        super().__init__(name="course-progress-sender", daemon=True)
        self.queue: queue.Queue = queue.Queue(maxsize=1000)

    def run(self):
        while True:
            entry = self.queue.get()
            try:
                post(entry)
                _service_trouble.clear()
            except Exception as err:  # noqa: BLE001 - the service is down or refused: drop it
                _service_trouble[:] = [_describe(err)]
            finally:
                self.queue.task_done()


def _describe(err: Exception) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code}"
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    return type(err).__name__


def post(entry: dict, url: str | None = None, token: str | None = None) -> dict:
    """POST one verdict to the service with the learner's hub token; its JSON answer."""
    url = url or service_url()
    token = token or os.environ["JUPYTERHUB_API_TOKEN"]
    body = {k: entry[k] for k in ("notebook", "check", "passed", "category", "time")}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=SEND_TIMEOUT_S) as resp:
        return json.loads(resp.read() or b"{}")


_sender: _Sender | None = None


def _send(entry: dict) -> None:
    global _sender
    if service_url() is None:
        return
    with _lock:
        if _sender is None or not _sender.is_alive():
            _sender = _Sender()
            _sender.start()
    try:
        _sender.queue.put_nowait(entry)
    except queue.Full:
        _service_trouble[:] = ["too many verdicts waiting to be sent"]


def flush_sends(timeout: float = 10.0) -> bool:
    """Wait until every queued verdict was sent or dropped (tests, end of a session)."""
    sender = _sender
    if sender is None:
        return True
    deadline = time.monotonic() + timeout
    while sender.queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.02)
    return not sender.queue.unfinished_tasks


# ------------------------------------------------------------------ reading it back

#: The longest line of the record read (one verdict is about 130 bytes); a longer one is
#: skipped and counted, so a damaged record is read in bounded memory.
MAX_LINE_BYTES = MAX_BODY_BYTES


def _lines(f):
    """The lines of the open binary file ``f``, each at most :data:`MAX_LINE_BYTES`; a longer
    one (whatever its bytes, however long) is read past and given as ``None``."""
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):  # the rest of the long line, 1 MiB at a time
            line = f.readline(1 << 20)
        yield None


PATH_CHARS, CATEGORY_CHARS = 200, 60  # the most characters of each that the views show


class RecordUnreadable(ValueError):
    """The record is there but the system would not give its bytes (no permission, a failing
    disk or network home): no view, since one without its verdicts says the learner did none."""


def read_record(path: Path | None = None) -> tuple[list[dict], int]:
    """The record's entries, and how many of its lines are not verdicts (cut short, too long,
    not UTF-8, not JSON, JSON of another shape): those are skipped, as are entries that are
    not a known notebook's check.  Read line by line: memory stays bounded however big it is.
    :class:`RecordUnreadable` where the file cannot be opened or read (at the start or partway)."""
    path = path or _record_path()
    entries, unreadable, lines = [], 0, 0
    where = f"the progress record {safe_json.quoted(str(path), PATH_CHARS)}"
    try:
        f = safe_json.open_regular(path, where)
    except FileNotFoundError:
        return entries, unreadable
    except OSError as err:
        raise RecordUnreadable(f"{where} cannot be read: {err.strerror or err}; give the path "
                               f"of a progress.jsonl") from None
    try:
        with f:
            for lines, line in enumerate(_lines(f), 1):
                if line is not None and not line.strip():
                    continue
                try:
                    entry = None if line is None else safe_json.loads(line, "a progress line")
                except ValueError:
                    entry = None
                if not well_formed(entry):
                    unreadable += 1
                elif known(entry["notebook"], entry["check"]):
                    entries.append(entry)
    except OSError as err:  # what was read so far would pass for the whole record
        raise RecordUnreadable(f"{where} could not be read ({err.strerror or err}, at line "
                               f"{lines + 1}): try again later") from None
    return entries, unreadable


class Progress:
    """What :func:`your_progress` returns: a table in a notebook, text elsewhere."""

    def __init__(self, entries: list[dict], path: Path, unreadable: int = 0, error: str = ""):
        self.path, self.status, self.unreadable = path, status(entries), unreadable
        self.error = error  # the record could not be read: said instead of the table

    def unreadable_note(self) -> str:
        """Said once per view, however many lines were skipped."""
        if not self.unreadable:
            return ""
        return (f"{self.unreadable} line(s) of the record are not verdicts (a write cut short, "
                f"not text, too long, or JSON of another shape) and were skipped; the other "
                f"verdicts are all here")

    def counts(self) -> dict[str, int]:
        states = [s["state"] for s in self.status.values()]
        return {k: states.count(k) for k in ("passed", "tried", "not reached")}

    def __repr__(self) -> str:
        if self.error:
            return f"your progress is not known: {self.error}"
        c = self.counts()
        lines = [f"your progress: {c['passed']} passed, {c['tried']} tried, {c['not reached']} not reached "
                 f"(of {sum(c.values())} checks; "
                 f"record: {safe_json.clipped(self.path, PATH_CHARS)})"]
        if self.unreadable:
            lines.append(f"  ({self.unreadable_note()})")
        for nb in ORDER:
            lines.append(f"  {nb}")
            for check in CATALOGUE[nb]:
                s = self.status[(nb, check)]
                mistake = safe_json.clipped(s["category"], CATEGORY_CHARS)
                extra = f" (last mistake: {mistake})" if s["state"] == "tried" else ""
                lines.append(f"    {s['state']:<12} {check}{extra}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        if self.error:
            return f"<p>Your progress is not known: {html.escape(self.error)}</p>"
        colour = {"passed": "#c8e6c9", "tried": "#ffe0b2", "not reached": "#eeeeee"}
        c = self.counts()
        rows = []
        for nb in ORDER:
            cells = []
            for check in CATALOGUE[nb]:
                s = self.status[(nb, check)]
                mistake = safe_json.clipped(s["category"], CATEGORY_CHARS)
                label = s["state"] + (f": {mistake}" if s["state"] == "tried" else "")
                cells.append(f'<span style="background:{colour[s["state"]]};padding:1px 5px;margin:2px;'
                             f'display:inline-block" title="{html.escape(label)}">{html.escape(check)}'
                             f' &mdash; {html.escape(label)}</span>')
            rows.append(f"<tr><td style='text-align:left'><b>{nb}</b></td>"
                        f"<td style='text-align:left'>{''.join(cells)}</td></tr>")
        note = f"<p><i>{html.escape(self.unreadable_note())}</i></p>" if self.unreadable else ""
        return (f"<p>Your progress: <b>{c['passed']}</b> passed, <b>{c['tried']}</b> tried, "
                f"<b>{c['not reached']}</b> not reached</p>{note}<table>{''.join(rows)}</table>")


def your_progress(path: str | os.PathLike | None = None) -> Progress:
    """Where you stand: every check of the course, passed / tried / not reached."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"your_progress(path): path must be a file's path (a str), "
                        f"not a {type(path).__name__}")
    path = Path(path) if path else _record_path()
    try:
        entries, unreadable = read_record(path)
    except RecordUnreadable as err:  # said in the view, as a notebook shows it
        return Progress([], path, error=str(err))
    return Progress(entries, path, unreadable)


def main(argv=None) -> int:
    """``python -m overlap_course.progress [RECORD]``: the table, as text."""
    from overlap_course.command_line import Parser, emit, fail  # not on the hub: not needed there

    prog = "python -m overlap_course.progress"
    parser = Parser(prog=prog, description="where you stand: every check of the course")
    parser.add_argument("record", nargs="?", help="a progress.jsonl (default: your own)")
    args = parser.parse_args(argv)
    try:
        if args.record is not None:
            os.stat(args.record)
    except FileNotFoundError:  # a typo: the missing default record means nothing done, not this
        return fail(prog, f"the progress record {safe_json.quoted(args.record, PATH_CHARS)} does "
                          f"not exist: give the path of a progress.jsonl, or none for your own")
    except (OSError, ValueError):  # a loop, a NUL: said by the reader below
        pass
    try:
        mine = your_progress(args.record)
    except ValueError as exc:
        return fail(prog, exc)
    if mine.error:
        return fail(prog, mine.error)
    emit(str(mine))
    return 0


if __name__ == "__main__":
    from overlap_course.command_line import run  # not on the hub
    run("python -m overlap_course.progress", main)
