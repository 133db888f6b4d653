"""A judge process (started by :mod:`overlap_course.build.judge`): the course imported before
the submission's first line, an audit hook that guards the files, the submission's cells, the
check, and a report signed with the run's secret."""

from __future__ import annotations

import _hashlib
import json
import os
import sys
import sysconfig
import threading
import types
from pathlib import Path

from overlap_course.build import landlock
from overlap_course.build.judge_benign import remember_modules
from overlap_course.build.judge_cells import run_cells
from overlap_course.build.judge_keep import keeper
from overlap_course.build.judge_fingerprint import (_OURS, _compare, _fingerprint,
                                                   forget_caches, watcher)
from overlap_course.build.judge_values import code_answer, report_text
from overlap_course.build.judge_values import decode as _decode, encode as _encode
from overlap_course.build.grading import CONTEXT_RUNS, CONTEXT_TYPES
from overlap_course.build.judge_watch import (CODE_EVENTS, FRAME_EVENTS, MEMORY_EVENTS, Watch,
                                             from_submission)


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
    the report's path, read before anything else.  The course is imported from ROOT before any
    line of the submission runs, and its state is fingerprinted then."""
    root, mode = argv
    sent = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin.close()
    import overlap_course
    import toy_engine
    from toy_engine import judged_forkserver
    from overlap_course import checks
    from overlap_course.checks import host_waits, pool

    for package in (overlap_course, toy_engine):
        if not Path(package.__file__).resolve().is_relative_to(Path(root).resolve()):
            raise SystemExit(f"the judge imported {package.__name__} from {package.__file__}, "
                             f"not from {root}")
    request = sent["request"]
    if request["check"] in host_waits.ON_META_TENSORS:
        import torch._dynamo  # noqa: F401 - the check's meta tensors import it, which rebinds
        # torch.manual_seed and sets trace hooks: here, before the fingerprint, not in the check
    # What torch.set_default_device imports: imported by a cell, its device mode's code counts as
    # the submission's, and the watch compared the checker's world at every torch call it
    # intercepts (round 13: a right loop under set_default_device('cpu') timed out in the judge)
    import torch.utils._device  # noqa: F401
    write = _reporter(sent.pop("report"), sent.pop("secret"))
    trusted = _protected_folders(Path(root))
    watch = Watch()
    readable = _readable_folders(trusted)
    # The kernel's fence first: the hook below would refuse the folders its rules must open.
    landlock.restrict([*map(str, readable), *landlock.SYSTEM_RUNS, *filter(None, sys.path)],
                      [os.getcwd(), *landlock.SYSTEM_WRITES])  # what C code reaches too
    sys.addaudithook(_guard(request["private"], trusted, readable, watch))
    # a module the cells write next to themselves, found as the kernel finds it (there its folder
    # comes first; here last, so that no file of the submission shadows an installed module)
    sys.path.append(os.getcwd())
    check, names = getattr(checks, request["check"]), request["names"]
    if mode == "answers":
        write(_read_values(request["cells"], names, keeper()))
        return
    # The device processes' forkserver, started before any submission line and the only one
    # used (round 16: one the check started after the cells ran the code they put in it)
    device = sys.modules["toy_engine.process_device"]
    judged_forkserver.start(device._FORKSERVER_PRELOAD, device.without_main_module)
    forkserver = judged_forkserver.PINNED.pid  # by value, before the cells
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


def _protected_folders(root: Path) -> list[Path]:
    """What no judge process may write: the course, the toy, and the folders of the modules and
    start-up hooks (``*.pth``, ``sitecustomize``) the next ``python -I`` loads, and of the
    interpreter itself (a venv's ``bin/python`` replaced made every later judge a forger)."""
    paths = sysconfig.get_paths()
    folders = {root / "overlap_course", root / "toy_engine"}
    folders |= {Path(paths[k]) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    folders |= {Path(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix,
                                  sys.base_exec_prefix, os.path.dirname(sys.executable))}
    return sorted({Path(os.path.realpath(f)) for f in folders})




def _readable_folders(protected: list[Path]) -> list[Path]:
    """What a judge process may read: the installation (what it may not write), the system's
    own folders, and its own empty folder.  Nothing else, so that no file another process left
    -- the learner's kernel, which ran the same cells first, unguarded, and could copy the
    solution to ``/tmp`` -- reaches the submission's cells in the judge."""
    return [*protected, Path(os.getcwd()).resolve(),
            *(Path(os.path.realpath(f)) for f in landlock.SYSTEM_READS)]


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
    the judge's memory, where the run's secret lies (``Watch.reaches_memory``)."""
    folders, home = [Path(f) for f in private], Path(os.getcwd()).resolve()
    # bound now: a cell can rebind the module's names (``CODE_EVENTS = set()``) as the hook runs
    code_events, memory_events, frame_events = CODE_EVENTS, MEMORY_EVENTS, FRAME_EVENTS
    audited, reaches_memory = watch.audited, watch.reaches_memory

    def resolved(path) -> Path | None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None  # a file descriptor: opening it was audited
        if _climbs(os.fsdecode(path)):
            raise PermissionError(f"the judge does not let a submission use a relative path "
                                  f"that leaves its folder ({os.fsdecode(path)[:80]}): give "
                                  f"the path from /")
        return Path(os.path.realpath(os.fsdecode(path)))

    def refuse_write(path) -> None:
        """Checked as it resolves, and as the link it may be: removing or replacing a link
        changes the link, not the file it names (a venv's ``bin/python``)."""
        if (target := resolved(path)) is None:
            return
        link = Path(os.path.realpath(os.path.dirname(os.path.abspath(os.fsdecode(path)))),
                    os.path.basename(os.fsdecode(path)))
        if any(p.is_relative_to(f) for p in (target, link) for f in protected):
            raise PermissionError(f"the judge does not let a submission change {target}")

    def hook(event: str, args: tuple) -> None:
        if event in code_events:
            audited(event, args)
        if (event in memory_events or event in frame_events) and reaches_memory(event, args):
            what = f"read a {args[1]}" if event == "object.__getattr__" else f"call {event}"
            raise PermissionError(f"the judge does not let a submission's code {what}: it "
                                  f"reaches the judge's own memory; a right answer needs none")
        if event == "os.symlink" or event == "os.link":
            raise PermissionError("the judge refuses new links")
        if event == "import" and args[0] in _UNAUDITED_FILES:
            raise PermissionError(f"the judge does not let a submission import {args[0]}")
        if event == "sqlite3.connect":  # its files are opened in C, unaudited
            raise PermissionError("the judge does not let a submission open a database")
        if event in _WRITES:
            for path in args[:2] if event == "os.rename" else args[:1]:
                refuse_write(path)
        if event != "open" or (path := resolved(args[0])) is None:
            return
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & _WRITE_FLAGS:
            refuse_write(args[0])
        if path.is_dir() and (not path.is_relative_to(home) or any(
                f.is_relative_to(path) or path.is_relative_to(f) for f in protected)):
            raise PermissionError(f"the judge does not let a submission open the folder {path}")
        if (path.suffix == ".ipynb" or any(path.is_relative_to(f) for f in folders)
                or not any(path.is_relative_to(f) for f in readable)):
            raise PermissionError(f"the judge does not let a submission read {path}")
    return hook


def _climbs(name: str) -> bool:
    """Whether a relative path leaves the folder it starts from (``a/../../b``)."""
    depth = 0
    for part in ([] if os.path.isabs(name) else name.split(os.sep)):
        depth += -1 if part == ".." else part not in ("", ".")
        if depth < 0:
            return True
    return False


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
    (``began``: the fingerprint and the forkserver's pid) each time the submission's code handed
    control back to the checker, and at the end.  Not started under a torch mode the cells left
    entered: the checker's own runs before its time limit (its references) would run the mode's
    code, unlimited (round 17: 14,000 calls, each compared, kept the judge past 270 s).  The
    judge's modules are put back (``restore``) at each hand-back and as the check returns, before
    any name is looked up in them (by default, as they are at the call): the comparer is the
    judge's own."""
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
               + _forkserver_moved(forkserver))
    left = [t.name for t in threading.enumerate()
            if t not in threads and (from_submission(t, watch) or watch.running(t))]
    hooks = watch.hooks + [name for name, hook in (("sys.settrace", sys.gettrace()),
                                                   ("sys.setprofile", sys.getprofile()))
                           if hook is not None]
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


def _forkserver_moved(pid: int) -> list[str]:
    """The forkserver the judge started before the cells, if it is gone or another one serves:
    a cell that stopped it had the check start one with the cell's code (round 16)."""
    now = sys.modules["multiprocessing.forkserver"]._forkserver._forkserver_pid
    try:
        alive = os.waitpid(pid, os.WNOHANG) == (0, 0)  # the judge's child
    except ChildProcessError:
        alive = False
    if alive and now == pid:
        return []
    return [f"the forkserver {pid} the judge started was {'replaced' if alive else 'stopped'}: "
            f"devices now come from {now}"]


def _strange_modules(before: set[str], trusted: list[Path]) -> list[str]:
    """Modules first imported after the judge's fingerprint, under a name the checker could
    import (the course's, the toy's, the standard library's, torch's, numpy's), that do not
    come from the installed files: put in ``sys.modules`` by the submission, or loaded from a
    file it wrote.  A learner's own helper module under another name is not judged."""
    names = _OURS + ("torch", "numpy")
    strange = []
    for name in sorted(set(sys.modules) - before):
        top = name.partition(".")[0]
        if top not in names and top not in sys.stdlib_module_names:
            continue
        if not (_installed(sys.modules.get(name), trusted) or _registered(name, trusted)):
            strange.append(name)
    return strange


def _installed(module, trusted: list[Path]) -> bool:
    """Whether ``module`` was loaded from the installed files (or is built in)."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if origin in ("built-in", "frozen"):
        return True
    places = [origin] if origin else list(getattr(spec, "submodule_search_locations", None)
                                          or [])
    real = [Path(os.path.realpath(p)) for p in places if isinstance(p, str)]
    return bool(real) and all(any(r.is_relative_to(t) for t in trusted) for r in real)


def _registered(name: str, trusted: list[Path]) -> bool:
    """Whether ``name`` is a module with no ``__spec__`` that an installed module (not a
    package) holds as its attribute and put in ``sys.modules`` (pyexpat's C code registers
    ``pyexpat.errors`` and ``pyexpat.model`` so): no import from a file can reach that name."""
    parent_name, _, attr = name.rpartition(".")
    parent, module = sys.modules.get(parent_name), sys.modules.get(name)
    if (type(parent) is not types.ModuleType or type(module) is not types.ModuleType
            or not _installed(parent, trusted)):
        return False
    space = types.ModuleType.__dict__["__dict__"].__get__(parent)
    return "__path__" not in space and space.get(attr) is module
