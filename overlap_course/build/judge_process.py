"""A judge process (started by :mod:`overlap_course.build.judge`): the course imported before
the submission's first line, an audit hook that guards the files, the submission's cells, the
check, and a report signed with the run's secret."""

from __future__ import annotations

import _hashlib
import json
import os
import sys
import threading
from pathlib import Path

from overlap_course.build import judge_folders, landlock
from overlap_course.build.judge_benign import remember_modules
from overlap_course.build.judge_cells import run_cells
from overlap_course.build.judge_forkserver import fork_before_the_secret
from overlap_course.build.judge_keep import (forget_caches, keeper,
                                             strange_modules as _strange_modules)
from overlap_course.build.judge_fingerprint import _OURS, _compare, _fingerprint, watcher
from overlap_course.build.judge_frames import RAW_MEMORY_EVENTS
from overlap_course.build.judge_handlers import ASYNCGEN_EVENTS
from overlap_course.build.judge_values import code_answer, report_text
from overlap_course.build.judge_values import decode as _decode, encode as _encode
from overlap_course.build.graded import CONTEXT_RUNS, CONTEXT_TYPES
from overlap_course.build.judge_watch import (CODE_EVENTS, FRAME_EVENTS, MEMORY_EVENTS,
                                             PROFILE_EVENT, Watch, from_submission)
from toy_engine.judged_forkserver import identity


def signer(secret: str):
    """``sign(body)``: a report's signature with the run's secret, by C functions bound now (in
    the judge, before the submission's first line: a cell that replaces ``hmac``, ``hashlib`` or
    their attributes changes nothing the judge signs with).  The grader checks a report with it
    too."""
    key, digest, utf8, hexed = secret.encode(), _hashlib.hmac_digest, str.encode, bytes.hex

    def sign(body: str) -> str:
        return hexed(digest(key, utf8(body, "utf-8"), "sha256"))
    return sign


def judge_main(argv: list[str]) -> None:
    """Entry of a judge process: ``ROOT MODE``, and on stdin the request, the run's secret and
    the report's path, read once the judge is fenced and has forked its device forkserver
    (which so holds none of them: :mod:`~overlap_course.build.judge_forkserver`).  The course is
    imported from ROOT before any line of the submission runs, and its state is fingerprinted
    then."""
    root, mode = argv
    import overlap_course
    import toy_engine
    from toy_engine import judged_forkserver
    from overlap_course import checks
    from overlap_course.checks import host_waits, pool

    for package in (overlap_course, toy_engine):
        if not Path(package.__file__).resolve().is_relative_to(Path(root).resolve()):
            raise SystemExit(f"the judge imported {package.__name__} from {package.__file__}, "
                             f"not from {root}")
    trusted = judge_folders.protected(Path(root))
    readable = judge_folders.readable(trusted)
    # The kernel's fence first: the hook below would refuse the folders its rules must open.
    landlock.restrict([*map(str, readable), *landlock.SYSTEM_RUNS,
                       *judge_folders.module_folders(Path(root))],
                      [os.getcwd(), *landlock.SYSTEM_WRITES])  # what C code reaches too
    device = sys.modules["toy_engine.process_device"]
    if mode == "check":
        fork_before_the_secret(device._FORKSERVER_PRELOAD)
    sent = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin.close()
    request = sent["request"]
    if request["check"] in host_waits.ON_META_TENSORS:
        import torch._dynamo  # noqa: F401 - the check's meta tensors import it, which rebinds
        # torch.manual_seed and sets trace hooks: here, before the fingerprint, not in the check
    # What torch.set_default_device imports: imported by a cell, its device mode's code counts as
    # the submission's, and the watch compared the checker's world at every torch call it
    # intercepts (round 13: a right loop under set_default_device('cpu') timed out in the judge)
    import torch.utils._device  # noqa: F401
    # and what a device process's start imports, fingerprinted before the cells (round 43: a cell
    # imported it first and gave it a copy of multiprocessing.spawn that ran its code there)
    import multiprocessing.popen_forkserver  # noqa: F401
    _no_bar_monitor()
    write = _reporter(sent.pop("report"), sent.pop("secret"))
    watch = Watch()
    sys.addaudithook(_guard(request["private"], trusted, readable, watch))
    # a module the cells write next to themselves, found as the kernel finds it (there its folder
    # comes first; here last, so that no file of the submission shadows an installed module)
    sys.path.append(os.getcwd())
    check, names = getattr(checks, request["check"]), request["names"]
    if mode == "answers":
        write(_read_values(request["cells"], names, keeper()))
        return
    # The device processes' forkserver, started before any submission line and the only one
    # used (round 16: one the check started after the cells ran the code they put in it): the
    # one forked above, or a new one
    judged_forkserver.start(device._FORKSERVER_PRELOAD, device.without_main_module)
    forkserver = judged_forkserver.PINNED.pid, judged_forkserver.PINNED.identity  # by value, now
    runs = {name: _judges_run(CONTEXT_RUNS[name], toy_engine)  # before any submission line
            for name in names if name in CONTEXT_TYPES and "values" not in request}
    remember_modules()
    before, modules = _fingerprint(), set(sys.modules)
    # bound before the cells, which could rebind the names; the judge's own are put back
    close_engines, ring_slots = pool.close_engines, sys.modules["toy_engine.engine"].RING_SLOTS
    verdict_type, restore = checks.Verdict, keeper()
    threads = set(threading.enumerate())
    if "values" in request:
        args = [_decode(value) for value in request["values"]]  # a bad one ends the judge: 0
    else:
        watch.cells_begin()  # what is alive now is not the cells'
        args = _code_arguments(request["cells"], names, toy_engine, runs, watch, restore)
        if isinstance(args, str):
            write({"passed": False, "message": args})
            return
        # What the cells left in the checks' engines and caches is not the checker's: an engine
        # built while they ran (a piece of the toy swapped for that call) is retired, and the
        # check builds its own under the watch; and no ring of host slots is left set.
        close_engines()
        ring_slots.set(None)
        forget_caches(watch.foreign)
    verdict = _verdict(check, args, (before, forkserver), threads, verdict_type, watch, restore)
    if moved := restore():  # again by code of the submission's the comparison ran (a metaclass)
        verdict = {"passed": False, "message": _moved(moved)}
    strangers = _strange_modules(modules, trusted)
    if strangers:
        verdict = {"passed": False, "message": f"modules imported by your cells or the check "
                                               f"do not come from the installed files "
                                               f"({', '.join(strangers[:3])}): graded as not "
                                               f"passed"}
    write(verdict)


def _no_bar_monitor() -> None:
    """tqdm's first bar starts a monitor thread that outlives every bar (it only lowers a bar's
    ``miniters`` after a stall), and a thread of the submission's still running as control comes
    back is a change: a right loop showing a bar failed (round 26).  Off here, before the cells
    (11 ms to import, measured with torch loaded); a cell that turns it back on is judged so."""
    try:
        import tqdm.std
    except ImportError:
        return
    tqdm.std.tqdm.monitor_interval = 0


# Audit events that change a file or folder at the path they name (first argument; a rename's
# second too); ``open`` is a write when its mode or flags say so.
_WRITES = {"os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown",
           "os.utime", "os.rename"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


#: Modules that read and write files in C, with no audit event: ``readline``'s history files
#: read the solution and wrote into site-packages, unseen by the hook below.
_UNAUDITED_FILES = {"readline"}


def _guard(private: list[str], protected: list[Path], readable: list[Path], watch: Watch):
    """An audit hook (it cannot be removed) installed before the submission's first line: it
    refuses new links, modules that reach files unaudited, reading notebooks, the private
    folders (the submission's cells cannot exec the solution's cell from disk) and anything
    outside ``readable``, and writing the protected folders -- or opening one of them, or a
    folder above one, as a directory whose descriptor would reach them by a relative path --
    so that no judge process can rewrite what the next one imports.  A relative path is read
    from the current folder, but a call with ``dir_fd`` reads it from that descriptor's folder,
    which the ``open`` event does not report (round nine read any file from ``/proc``'s:
    ``self/cwd/../..``): so no folder outside the judge's own is opened, and no relative path
    climbs above the folder it starts from.  And it refuses the submission's code what reaches
    the judge's memory, where the run's secret lies (``Watch.reaches_memory``).  No audit hook
    is added after it (one could run C code at any event: ``functools.partial(...)``), nor does
    the submission set ``sys.set_asyncgen_hooks`` (``judge_handlers``); both are named."""
    folders, home = [Path(f) for f in private], Path(os.getcwd()).resolve()
    # bound now: a cell can rebind the modules' names (``CODE_EVENTS = set()``, a builtin) as
    # the hook runs; the watch's hooks are closures, and its profile hook raises ``profiled``
    code_events, memory_events, frame_events = CODE_EVENTS, MEMORY_EVENTS, FRAME_EVENTS
    audited, reaches_memory, profile = watch.audited, watch.reaches_memory, watch.profile
    asyncgen_set, asyncgen_events, hooks, no_more = (watch.asyncgen_set, ASYNCGEN_EVENTS,
                                                     watch.hooks, _NoMoreHooks)
    raw_events, raw_memory = RAW_MEMORY_EVENTS, watch.raw_memory
    profiled, unaudited, writes, write_flags = PROFILE_EVENT, frozenset(_UNAUDITED_FILES), \
        frozenset(_WRITES), _WRITE_FLAGS
    watch.sealed()
    climbs, is_a, any_, refuse, set_, writing = (_climbs, isinstance, any, PermissionError,
                                                 set, frozenset("wax+"))
    memory_file, str_, memory_name = landlock.MEMORY_FILE.fullmatch, str, landlock.memory_name()
    real, fsdecode, dirname, absolute, basename, paths = (
        os.path.realpath, os.fsdecode, os.path.dirname, os.path.abspath, os.path.basename,
        (str, bytes, os.PathLike))

    def resolved(path) -> Path | None:
        if not is_a(path, paths):
            return None  # a file descriptor: opening it was audited
        target = Path(real(fsdecode(path)))  # from the folder it is in now (round 38: `..`
        if climbs(fsdecode(path)) and not target.is_relative_to(home):  # after an os.chdir)
            raise refuse(f"the judge does not let a submission use a relative path that "
                         f"leaves its folder ({fsdecode(path)[:80]}): keep to the notebook's")
        return target

    def refuse_write(path) -> None:
        """Checked as it resolves, and as the link it may be: removing or replacing a link
        changes the link, not the file it names (a venv's ``bin/python``)."""
        if (target := resolved(path)) is None:
            return
        link = Path(real(dirname(absolute(fsdecode(path)))), basename(fsdecode(path)))
        if any_(p.is_relative_to(f) for p in (target, link) for f in protected):
            raise refuse(f"the judge does not let a submission change {target}")

    def hook(event: str, args: tuple) -> None:
        if event == profiled:  # the watch's profile hook, at each call and return
            return profile(*args)
        if event in code_events:
            audited(event, args)
        if event in raw_events:  # ctypes reaching memory by address (judge_frames)
            raw_memory(event)
        if event == "sys.addaudithook":  # a RuntimeError: the hook is not added, silently
            hooks.append(event)
            raise no_more("the judge does not let a submission add an audit hook")
        if event in asyncgen_events:
            asyncgen_set()
        if (event in memory_events or event in frame_events) and reaches_memory(event, args):
            what = f"read a {args[1]}" if event == "object.__getattr__" else f"call {event}"
            raise refuse(f"the judge does not let a submission's code {what}: it reaches the "
                         f"judge's own memory; a right answer needs none")
        if event == "os.symlink" or event == "os.link":
            raise refuse("the judge refuses new links")
        if event == "import" and args[0] in unaudited:
            raise refuse(f"the judge does not let a submission import {args[0]}")
        if event == "sqlite3.connect":  # its files are opened in C, unaudited
            raise refuse("the judge does not let a submission open a database")
        if event in writes:
            for path in args[:2] if event == "os.rename" else args[:1]:
                refuse_write(path)
        if event != "open" or (path := resolved(args[0])) is None:
            return
        if memory_name(args[0]) or memory_file(str_(path)):  # its memory as a file (the secret)
            raise refuse(f"the judge does not let a submission read {path}: it is the "
                         f"judge's own memory; a right answer needs none")
        mode, flags = args[1], args[2]
        if (is_a(mode, str) and set_(mode) & writing) or (flags or 0) & write_flags:
            refuse_write(args[0])
        if path.is_dir() and (not path.is_relative_to(home) or any_(
                f.is_relative_to(path) or path.is_relative_to(f) for f in protected)):
            raise refuse(f"the judge does not let a submission open the folder {path}")
        if (path.suffix == ".ipynb" or any_(path.is_relative_to(f) for f in folders)
                or not any_(path.is_relative_to(f) for f in readable)):
            raise refuse(f"the judge does not let a submission read {path}")
    return hook


class _NoMoreHooks(RuntimeError):
    """Raised at ``sys.addaudithook``: a RuntimeError makes the add fail with no exception."""


def _climbs(name: str) -> bool:
    """Whether a relative path leaves the folder it starts from (``a/../../b``)."""
    return not os.path.isabs(name) and os.path.normpath(name).split(os.sep)[0] == ".."


def _reporter(path: str, secret: str):
    """Writes the report and ends the process at once, so that no handler the submission left
    (``atexit``, a finalizer) runs after the verdict.  Encoded, signed and written only with what
    is bound now, before the submission's first line: C functions and builtin types' methods,
    which no cell can replace -- no ``json`` (round 19: a cell's ``json._default_encoder``, which
    ``dumps`` reads at each call, rewrote the verdict it was given, then signed), ``hmac`` or
    ``open`` (its text layer runs ``encodings``' Python code)."""
    sign, text, ascii_ = signer(secret), report_text(), str.encode
    opened, put, leave = os.open, os.write, os._exit
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC

    def write(report: dict) -> None:
        body = text(report)
        data = ascii_(sign(body) + "\n" + body, "ascii")
        fd = opened(path, flags, 0o600)
        while data:
            data = data[put(fd, data):]
        leave(0)
    return write


def _missing(name: str, notes: list[str]) -> str:
    """Why ``name`` is missing: the cells that raised, the first ones (the cause: a file a
    ``%%writefile`` could not write comes before the import that then failed)."""
    why = f" ({'; '.join(notes[:3])}{'; ...' if len(notes) > 3 else ''})" if notes else ""
    return f"`{name}` is not defined by your notebook's cells above the check{why}"


def _moved(names: list[str]) -> str:
    return (f"your code changed the judge's own code ({', '.join(names[:3])}): graded as not "
            f"passed")


def _read_values(cells: list[str], names: list[str], restore) -> dict:
    space, notes = run_cells(cells)
    if moved := restore():
        return {"message": _moved(moved)}
    values = []
    for name in names:
        if name not in space:
            return {"message": _missing(name, notes)}
        try:
            values.append(_encode(space[name]))
        except ValueError as err:
            return {"message": f"`{name}`: {err}"}
        except Exception as err:  # noqa: BLE001 - the value's own code (its __iter__) raised
            return {"message": f"`{name}`: reading it raised {type(err).__name__}: give a plain "
                               f"value (sets, lists, tuples, dicts, strings and numbers)"}
    return {"values": values}


def _code_arguments(cells: list[str], names: list[str], toy_engine, runs: dict,
                    watch: Watch, restore=None) -> list | str:
    """The graded call's arguments from the submission's cells, or why they cannot be judged;
    a context argument is the judge's own run (``runs``), once the cells define it too.  The
    judge's own modules are put back first (``restore``; by default, as they are at the call):
    what follows looks names up in them."""
    restore = restore or keeper()
    space, notes = run_cells(cells)
    if moved := restore():
        return _moved(moved)
    args = []
    for name in names:
        if name not in space:
            return _missing(name, notes)
        value = space[name]
        if name in CONTEXT_TYPES and type(value) is not getattr(toy_engine, CONTEXT_TYPES[name]):
            return (f"`{name}` must be a `toy_engine.{CONTEXT_TYPES[name]}`, "
                    f"not a {type(value).__name__}")
        if name in CONTEXT_TYPES:
            value = runs[name]
        if name not in CONTEXT_TYPES:
            value = code_answer(name, value, watch.foreign)
            if isinstance(value, str):
                return value
        args.append(value)
    return args


def _judges_run(run: dict, toy_engine):
    """The notebook's run made by the judge before the submission's first line (whose cells
    could otherwise patch the engine that makes it): the engine a context argument stands for."""
    engine = toy_engine.Engine(toy_engine.EngineConfig(**run["config"]))
    engine.generate(list(run["prompts"]), max_new_tokens=run["max_new_tokens"])
    return engine


def _verdict(check, args: list, began: tuple, threads: set, verdict_type, watch: Watch,
             restore=None) -> dict:
    """The check's verdict, kept only if the check's world was as it was when the judge began
    (``began``: the fingerprint and the forkserver's pid and identity) each time the
    submission's code handed control back to the checker, and at the end. Not started under a
    torch mode the cells left entered: the checker's own runs before its time limit (its
    references) would run the mode's code, unlimited (round 17: 14,000 calls, each compared,
    kept the judge past 270 s). The judge's modules are put back (``restore``) at each hand-back
    and as the check returns, before any name is looked up in them (by default, as they are at
    the call): the comparer is the judge's own."""
    before, forkserver, restore = *began, restore or keeper()
    if modes := watch.modes.entered():
        return {"passed": False, "message": f"your code changed what the checker runs on "
                                            f"({', '.join(modes[:2])}): graded as not passed; "
                                            f"enter a mode only around your own code (`with`)"}
    compare = watcher(before)  # at each hand-back, the judge's modules first put back (no
    watch.start(lambda: restore() or compare())  # _compare a cell or the submission rebound)
    try:
        verdict = check(*args)
    except BaseException as err:  # noqa: BLE001 - a checker never raises: something was replaced
        restore()
        watch.stop()
        if moved := _forkserver_moved(forkserver):
            return {"passed": False, "message": f"your code changed what the checker runs on "
                                                f"({moved[0]}): graded as not passed"}
        return {"passed": False, "message": f"the check raised {type(err).__name__}: the checker "
                                            f"was changed or your code stopped it"}
    moved = restore()
    watch.stop()
    changed = (moved + (watch.changed or _compare(before, _fingerprint())) + watch.modes.entered()
               + _forkserver_moved(forkserver) + watch.traced() + watch.threads_left())
    left = [t.name for t in threading.enumerate()
            if t not in threads and (from_submission(t, watch) or watch.running(t))]
    hooks = watch.hooks + watch.handlers() + [
        name for name, hook in (("sys.settrace", sys.gettrace()),
                                ("sys.setprofile", sys.getprofile())) if hook is not None]
    if type(verdict) is not verdict_type or verdict.passed is not False:
        # else lost to the time limit's TimeUp, or turned off by it: the check failed
        hooks += ["sys.setprofile"] * watch.lost + watch.tracing
    if changed or left or hooks:
        what = changed[:4] + [f"thread {n!r}" for n in left[:2]] + sorted(set(hooks))
        return {"passed": False, "message": f"your code changed what the checker runs on "
                                            f"({', '.join(what)}): graded as not passed"}
    if type(verdict) is not verdict_type or type(verdict.message) is not str:
        return {"passed": False, "message": "the check returned something that is not its verdict"}
    return {"passed": verdict.passed is True, "message": verdict.message}


def _forkserver_moved(server: tuple) -> list[str]:
    """The forkserver the judge started before the cells (its pid and ``identity``), if it is gone
    or another one serves: a cell that stopped it had the check start one with the cell's code
    (round 16), or forked until a child of the judge's had its pid (round 44)."""
    pid, began = server
    now = sys.modules["multiprocessing.forkserver"]._forkserver._forkserver_pid
    try:
        alive = os.waitpid(pid, os.WNOHANG) == (0, 0) and identity(pid) == began
    except ChildProcessError:  # (not the judge's child: reaped already)
        alive = False
    if alive and now == pid:
        return []
    if alive:
        return [f"the forkserver {pid} the judge started was replaced: devices now come from {now}"]
    since = f": devices now come from {now}" if now not in (pid, None) else ""  # (round 43: "by"
    return [f"the forkserver {pid} the judge started was stopped{since}"]  # the same pid)
