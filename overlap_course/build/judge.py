"""The judge: each graded cell's verdict from fresh processes the submission cannot reach
(the grader's side; the judge's own process is :mod:`overlap_course.build.judge_process`).

Why a judge.  nbgrader scores an autograded cell by its outputs (an error: 0 points), and
those come from the learner's kernel, where the learner's cells ran first and could set
``os.environ``, replace a check, ``Verdict`` or ``sys.modules`` entries, patch builtins or read
the solution.  nbgrader's hidden tests (``### BEGIN HIDDEN TESTS``) and otter-grader's hidden
tests hide a test's *source*, and ``nbgrader autograde`` re-inserts locked cells from the
instructor's copy, but the test still runs in that kernel, after the learner's code: neither
keeps the verdict out of the learner's reach.  So the course's ``nbgrader_config.py`` adds one
step after nbgrader's ``Execute`` (:func:`autograde_preprocessors`): each graded cell's outputs
are replaced by the verdict of a fresh judge process (no user site, no ``PYTHONPATH``, an
empty temporary folder as current folder and ``HOME``; forked from a ``python -I`` started before
any submission, which has imported the course nbgrader itself loaded and runs nothing else:
:mod:`~overlap_course.build.judge_zygote`) that re-runs the submission's code cells above the
check, and calls the checker:

* a value answer (``order``, ``needs_correction``) is read out by one such process and checked
  by a second that runs no line of the submission; it crosses as tagged plain data (no pickle,
  whose loading runs code; no object whose ``__eq__`` or ``__iter__`` the learner wrote);
* a code answer must run beside its checker; the judge fingerprints (by identity) every module
  of the course and the toy, their classes, ``builtins`` and the functions of the modules the
  checkers call (with what their closure cells hold) before the first line of the submission,
  and trusts the verdict only if all is
  as it was each time the submission's code handed control back to the checker (a replacement
  undone before the end counts: :class:`~overlap_course.build.judge_watch.Watch`; a hand-back to
  the standard library, asyncio's event loop, is compared as it reaches the checker) and at the
  end, no thread still runs that was not alive before the cells nor one of the course's own (a
  ``threading.Thread`` running its time limit's watchdog or an executor's worker) the checker's
  or the engine's code was seen starting
  (:mod:`~overlap_course.build.judge_threads`; a raw thread whose target is C code has no frame
  to list) and no trace hook is left; a context argument
  (``engine``) is the judge's own run of the notebook's cell, not the submission's object;
* an audit hook, installed before the submission's first line, refuses to open notebooks,
  ``solutions/``, ``source/``, the course folder and anything outside the installation, the
  system's folders and the judge's own folder (a file the unguarded kernel left in ``/tmp``);
  to write, rename or remove anything under the course, the toy and the folders of Python's
  modules, start-up hooks and interpreter (a venv's ``bin/python`` link too); and to import
  ``readline``, whose history files read and write any file with no audit event; to open
  a folder outside its own, or a relative path that climbs out of its folder (a ``dir_fd``
  call reads it from a folder the ``open`` event does not report), or a process's memory as a
  file (``/proc/self/mem``: round 30 read the run's secret from it);
* each judge gets a secret made for its run on stdin (with its request and the report's random
  path; none of them is in argv, the environment or a file) and signs its report with it; a
  report that is not signed, or a process that exits before the judge's own verdict, scores 0;
* after each judge process, and before each notebook, the grader re-hashes the installed
  course, the toy, the start-up hooks (``*.pth``, ``sitecustomize``) and the interpreter against
  their state when nbgrader started, and trusts no verdict if they changed;
* where Linux has Landlock, the kernel itself fences each judge's files (and the learner's
  grading kernel's, from its start: :mod:`~overlap_course.build.kernel_fence`, round 31)
  whatever code reaches them:
  C code such as ``torch.from_file`` or ``sqlite3``, which no audit event reports
  (:mod:`~overlap_course.build.landlock`); a fenced process is not dumpable and holds no
  capability, nor does what it forks or runs (none reads its memory, even as root: round 41),
  and its device forkserver is forked before the secret is read, asked only over a socket whose
  listener is checked by pid and start time (:mod:`~overlap_course.build.judge_forkserver`),
  and what its device processes send back is read as plain values (round 43); from ABI 6 it
  signals no process outside its fence; what a judge leaves running, even in a session of its
  own, the zygote (a subreaper) ends with it (round 30: one killed later students' judges).

Chosen over verifying the kernel's modules before trusting its verdict: a kernel can be made to
lie about any check of itself (an input transformer that rewrites the test cell, a patched
``showtraceback``), while a process started after it has none of its state. What remains: code
that runs beside its checker shares the judge's process, so code written against the judge on
purpose can still mutate the checker's data in place, leave a builtin for C code to call later
(a dunder method other than ``__del__`` that the checker's code reaches:
``functools.partial(setattr, ...)``, which no hand-back sees; a gc callback, a finalizer, a
weakref or proxy whose callback is C code (``WeakMethod``'s too), a class whose own
``__del__`` is, a signal handler, an error hook (``threading.excepthook``, ``sys.excepthook``,
``sys.unraisablehook``) that is, and ``sys.set_asyncgen_hooks``' that are, made or set
by the cells or in the check, are graded as a change at each compare (rounds 24 and 25:
:mod:`~overlap_course.build.judge_weakrefs`, :mod:`~overlap_course.build.judge_handlers`),
unless a finalizer or a weakref calls the cells' Python code, compared as it runs (the
library's, bound to an object or a class's ``__del__`` from another class, is a change: round
28), or touches only the
cells' own plain data (:mod:`~overlap_course.build.judge_harmless`: a method of a list, set or
deque made while the cells ran, given plain values; one the checker's code made as a cell called
it counts as the cells' too, while a right answer's list made in its loop, or a dict, is graded
as a change); an audit hook is refused and named, but not the standard library's Python code
that calls a C
callable it is handed, as a partial of a function that calls its argument, nor asyncgen hooks
set by such code, or in a thread that ends, and not set again before a compare), and reach
the judge's memory, where the run's secret lies, to sign a forged report: the report is
written by C functions bound before the cells (no ``json`` or ``hmac`` a cell could patch), and
the judge refuses the submission's code ``gc``'s
walks (``get_objects``, ``get_referrers``, ``get_referents``), other threads' frames and a
frame it asks for itself (``sys._getframe``, a traceback's, a generator's or a coroutine's
``*_frame``), but a frame still reaches it through the standard library
(``inspect.currentframe``, ``traceback.walk_stack``: ``logging`` and ``traceback`` read frames
for right answers too), a signal handler or a trace function, and from it ``f_back`` and
``f_locals`` lead to the report's writer (a trace function set on a frame not the submission's,
which runs at that frame's lines unseen by any hand-back and writes its ``f_locals`` back, is
graded as a change at each compare, at the end, and as such a frame is called or resumed:
:mod:`~overlap_course.build.judge_frames`, round 27); and, with ``ctypes``, memory: the
submission's code is refused its audited ways to an address or a C function (``from_address``,
``string_at``, ``PyObj_FromPtr``, ``CDLL``, ``pythonapi.X``, ``_ctypes.call_function``), but a
call of a C function pointer already made (``ctypes.memmove``, ``memset``, ``cast``), a
``Union`` of a ``c_void_p`` and a pointer, ``c_char_p(address).value`` and numpy's
``__array_interface__`` given an address raise no audit event: any memory, still.  The judge's own
modules (and ``builtins``' names, and its classes' attributes), which a cell can rebind with
no audit event, are put back and any change named (graded 0) after the cells, at each
hand-back and after the check, by C methods bound before the cells, and no function but the
submission's may have its ``__code__`` or defaults swapped.
What the audit hook runs while the cells run (the watch's ``audited``, ``reaches_memory`` and
profile hook) is closures made before the cells, with the names, types and builtins they read
bound then, and the profile hook ``sys.getprofile()`` returns is ``sys.audit`` bound to an
event's name that the audit hook answers, so it hands the check's caller nothing of the judge's
(round 20: ``Watch.foreign`` rebound by a cell, or set on the watch from the profile hook's
``__self__``, let it walk gc to the report's writer); but the hook's file rules still call
``pathlib``'s and ``os.path``'s Python code, whose module and class attributes a cell can rebind
until the next put-back (Landlock, where there is one, fences the files anyway), and finalizers
are listed from ``weakref.finalize``'s registry as it was bound before the cells (one the cells
rebind, ``finalize._registry = {}``, hides the finalizers made later from the hand-backs).
Without Landlock, it can also write files through ``ctypes`` or a
process of its own (the audit hook is not inherited; the re-hash after the judge catches such
writes to the course's and the toy's sources and bytecode, unless the process leaves the judge's
process group on purpose and writes later) -- all of it in the submission, for the instructor
to read.  A right answer the judge runs differently from the kernel: of the kernel's folder, the
judge's holds only the files submitted with the notebook (:mod:`.judge_beside`), ``Out[N]`` counts
only the cells the judge runs (graded cells are left out), and a shell line (``!echo``) is not
run, only noted (a cell that needs what it did fails there).  Exercise 04's run on valueless
tensors catches code that reads values, skips that run or works differently there, not code that
fakes a correction of its own when ``is_meta`` (it is in the submission, for the instructor to
read).  And the kernel runs as the grader's user, before any judge: it can rewrite torch or the
standard library, which are not hashed (too large to hash per process), so grade where submissions
cannot write the course folder or the environment (a container, as otter-grader recommends).
"""

from __future__ import annotations

import compileall
import hashlib
import hmac
import json
import os
import secrets
import signal
import stat
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import nbformat

from overlap_course.build import kernel_fence
from overlap_course.build.graded import GRADED_CALLS, ROOT, VALUE_ANSWERS
from overlap_course import progress
from overlap_course.build import judge_beside, judge_zygote
from overlap_course.build.judge_process import signer

JUDGE_TIMEOUT_S = 600  # one judge process: the learner's cells up to the check, then the check
#: How long the zygote may take to reap a judge ended at the time limit, and what it left: no
#: answer by then (stopped, where signals are not fenced in), and a new zygote serves the next.
_REAPED_S = 10


def autograde_preprocessors() -> list:
    """nbgrader's own autograde steps, with the judge right after the kernel has run (and before
    ``SaveAutoGrades`` reads the graded cells' outputs).  Called by the course's
    ``nbgrader_config.py`` when nbgrader starts, before any submission runs: the digest of the
    installed course taken here is what every later judge is checked against."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute, NbGraderPreprocessor

    pristine = compiled_digest()

    class JudgeInFreshProcess(NbGraderPreprocessor):  # enabled, unlike nbconvert's
        """Overwrites each graded cell's outputs with a fresh process's verdict."""

        def preprocess(self, nb, resources):
            judge_notebook(nb, pristine, judge_beside.given(resources))
            return nb, resources

    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    at = steps.index(Execute)
    steps[at:at + 1] = [judge_beside.read_step(), kernel_fence.fenced_execute(),
                        JudgeInFreshProcess]  # the kernel fenced, what it was given read first
    return steps


def installed_digest() -> dict[str, str]:
    """SHA-256 of every file the judge trusts: the course's and the toy's modules and their
    bytecode (a ``.pyc`` whose header matches its source is loaded instead of it), the
    start-up hooks (``*.pth``, ``sitecustomize``) a fresh ``python -I`` runs before them, and
    the interpreter it runs (the binary, a venv's ``pyvenv.cfg`` and where its link points)."""
    patterns = ("*.py", f"*.{sys.implementation.cache_tag}.pyc")  # this Python's bytecode
    files = [path for package in ("overlap_course", "toy_engine")
             for pattern in patterns for path in sorted((ROOT / package).rglob(pattern))]
    for where in sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")}):
        folder = Path(where)
        files += sorted(folder.glob("*.pth")) + sorted(folder.glob("*customize.py"))
    digest = {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    # the interpreter every judge starts: where a venv's link points, and what it runs
    venv = Path(sys.prefix) / "pyvenv.cfg"
    for f in (venv, Path(sys.executable).resolve()):
        digest[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "missing"
    digest[f"{sys.executable} -> "] = os.path.realpath(sys.executable)
    return digest


def compiled_digest() -> dict[str, str]:
    """:func:`installed_digest` once every module of the course and the toy has its bytecode
    (compiled now where it is missing or stale), so that a judge importing a module for the
    first time writes no new ``.pyc`` that would read as a change."""
    for package in ("overlap_course", "toy_engine"):
        compileall.compile_dir(ROOT / package, quiet=2)  # a read-only install: nothing written
    return installed_digest()


def _changed_files(pristine: dict[str, str]) -> list[str]:
    now = installed_digest()
    edited = {f for f in now if f in pristine and now[f] != pristine[f]}
    return sorted(set(now) ^ set(pristine) | edited)


def judge_notebook(nb, pristine: dict[str, str] | None = None, beside=({}, "")) -> None:
    """Give every graded cell of an executed submission the judge's outputs: a line that
    says it passed, or a ``CheckNotPassed`` error (nbgrader scores a cell with an error 0).
    ``beside``: the files submitted with the notebook (:mod:`.judge_beside`), and why not."""
    changed = _changed_files(pristine) if pristine is not None else []
    private = _private_folders(Path.cwd())
    for index, cell in enumerate(nb.cells):
        check = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code" or check not in GRADED_CALLS:
            continue
        if changed:
            passed, message = False, (
                f"not graded: {len(changed)} installed file(s) the grader trusts changed since "
                f"nbgrader started ({', '.join(changed[:3])}); an earlier submission may have "
                f"written them: reinstall the course and grade again, with submissions unable "
                f"to write the environment")
        else:
            passed, message = judge(check, _code_before(nb, index), private, files=beside[0])
            message += f" ({beside[1]})" * (not passed and bool(beside[1]))
        cell.outputs = [_outcome(check, passed, message)]


def _code_before(nb, index: int) -> list[str]:
    """The submission's code cells above a graded cell, other graded cells left out."""
    return [c.source for c in nb.cells[:index] if c.cell_type == "code"
            and c.metadata.get("nbgrader", {}).get("grade_id") not in GRADED_CALLS]


def _outcome(check: str, passed: bool, message: str):
    if passed:
        return nbformat.v4.new_output("stream", name="stdout",
                                      text=f"PASSED (judged in a fresh process): {message}\n")
    text = f"{check}: {message}"
    return nbformat.v4.new_output("error", ename="CheckNotPassed", evalue=text,
                                  traceback=[f"CheckNotPassed: {text}"])


def graded_arguments(check: str) -> list[str]:
    """The names a graded call passes its check: ``check_idle_fraction(idle_fraction, engine)``."""
    inside = GRADED_CALLS[check].partition("(")[2].rstrip(")")
    return [name.strip() for name in inside.split(",")]


def _private_folders(course: Path) -> list[str]:
    """Folders the judge's code may not read: the solutions, and the nbgrader course it grades
    in (other submissions, the gradebook) unless that folder holds the installation itself."""
    folders = [ROOT / "solutions", ROOT / "source", course.resolve()]
    needed = (ROOT, Path(sys.prefix).resolve(), Path(tempfile.gettempdir()).resolve())
    return [str(f) for f in folders if not any(n.is_relative_to(f) for n in needed)]


def judge(check: str, cells: list[str], private: list[str] = (),
          pristine: dict[str, str] | None = None, files=None) -> tuple[bool, str]:
    """(passed, message) for ``check`` on the answers ``cells`` define, from fresh processes.

    A check of values reads them in one process (the learner's cells run there) and judges them
    in another that runs no line of the submission; a check of code runs the cells and the
    check in one process that verifies afterwards that nothing the checker uses was replaced.
    After each process the installed files are re-hashed against ``pristine`` (by default,
    their state now): a verdict from a judge whose course was rewritten is not trusted.
    ``files``: what each judge finds in its folder (the files submitted with the notebook)."""
    pristine = compiled_digest() if pristine is None else pristine
    names = graded_arguments(check)
    request = {"check": check, "names": names, "cells": cells, "private": list(private)}
    if set(names) <= VALUE_ANSWERS:
        answers = _run_judge("answers", request, pristine, files)
        if "values" not in answers:
            return False, answers["message"]
        request = {"check": check, "names": names, "values": answers["values"], "private": []}
    report = _run_judge("check", request, pristine, files if "cells" in request else None)
    return report["passed"] is True, report["message"]


def _run_judge(mode: str, request: dict, pristine: dict[str, str], files=None) -> dict:
    """One judge process, forked by the judges' zygote (a ``python -I``: no user site, no
    ``PYTHONPATH``, no current folder on the path; :mod:`~overlap_course.build.judge_zygote`), in
    an empty temporary folder, with an environment of its own.  The request, a secret made for
    this run and the report's (random) path cross on its stdin, which the judge reads before any
    line of the submission: neither argv, the environment nor a file holds them.  Its report is
    trusted only if signed with that secret, in the shape it must have, from a process that
    exited 0 and left the installed files as they were."""
    with tempfile.TemporaryDirectory(prefix="overlap-judge-") as tmp:
        judge_beside.write(files or {}, tmp)
        secret = secrets.token_hex(32)
        answer = Path(tmp, f"{secrets.token_hex(16)}.json")
        ask = json.dumps({"secret": secret, "report": str(answer), "request": request})
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8", progress.ENV_FILE: os.devnull}  # a judge keeps no record (a
        # submitted `.overlap_course` file beside the notebook made a pass say it was not saved)
        with tempfile.TemporaryFile() as err:  # not kept in memory: a judge may write GBs
            code = _forked(mode, ask.encode("utf-8"), tmp, env, err.fileno())
            if code is None:
                return {"passed": False, "message": f"the judge stopped your code after "
                                                    f"{JUDGE_TIMEOUT_S} s without a verdict"}
            last = _last_line(err)
        changed = _changed_files(pristine)
        if changed:
            return {"passed": False, "message": (
                f"not graded: the judge's process changed {len(changed)} installed file(s) "
                f"the grader trusts ({', '.join(changed[:3])}): reinstall the course")}
        return _read_report(answer, secret, mode, code, last)


def _forked(mode: str, ask: bytes, tmp: str, env: dict, err: int) -> int | None:
    """Run one judge to its end: its exit code, or None when it ran past the time limit.  A
    zygote that cannot fork (ended by an earlier judge) is replaced, and so is one that ends or
    stops answering while its judge runs: that gives no exit code, and no verdict of that
    judge is trusted (-1).  One judge at a time per grader process (the zygote's replies)."""
    with judge_zygote.LOCK:
        reading, feeding = os.pipe()
        try:
            pid, parent = _fork(mode, tmp, env, reading, err)
        except BaseException:
            os.close(feeding)
            raise
        finally:
            os.close(reading)
        threading.Thread(target=_feed, args=(feeding, ask), daemon=True).start()
        code, late = -1, False  # -1 also when the grader is interrupted: the reply is unread
        try:
            code = parent.exit_code(JUDGE_TIMEOUT_S)
            if code is None:  # past the limit: its group ended here, then reaped by its zygote
                late = True
                _end_group(pid)
                code = parent.exit_code(_REAPED_S)
        except OSError:  # the zygote ended, or stopped answering, while its judge ran
            pass
        finally:
            if code is None or code == -1:  # the judge may still run: its zygote did not
                _end_group(pid)  # reap it (a judge the zygote reaped, it ended with its group)
                judge_zygote.forget(at_once=True)
        return None if late else code


def _fork(mode: str, tmp: str, env: dict, stdin: int, err: int):
    """(pid, zygote): a judge forked by this installation's zygote, a new one if it fails."""
    for attempt in (1, 2):
        parent = judge_zygote.zygote(str(ROOT), installed_digest())
        try:
            return parent.fork(mode, tmp, env, stdin, err), parent
        except OSError:
            judge_zygote.forget(at_once=True)
            if attempt == 2:
                raise


def _feed(fd: int, data: bytes) -> None:
    """The request to the judge's stdin (a thread: a request larger than the pipe holds waits
    for the judge to read it, and a judge that ended first leaves nothing waiting)."""
    try:
        with open(fd, "wb") as pipe:
            pipe.write(data)
    except OSError:
        pass


def _last_line(err) -> str:
    """The last line the judge wrote to its stderr (its error), read from the file's end."""
    err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
    lines = err.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else "no message"


def _end_group(pid: int) -> None:
    """The judge and whatever it started (the engine's device process, a learner's child)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(path: Path, secret: str, mode: str, code: int, last: str) -> dict:
    """The report: its signature on one line, then its JSON (signed, so that code that reads
    the written report learns no secret it could sign a forgery with).  Opened without blocking
    and without following a link, and read only if it is a plain file: the judge's folder is
    the submission's too, and a FIFO put at the report's name (round nine) blocked the grader
    for ever in ``open``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a plain file")
            data = f.read(_MAX_REPORT_BYTES + 1)
        if len(data) > _MAX_REPORT_BYTES:
            raise ValueError("too large")
        signature, _, body = data.decode("utf-8").partition("\n")
        if not hmac.compare_digest(signature, signer(secret)(body)):
            raise ValueError("not signed by the judge")
        report = json.loads(body)
    except (OSError, ValueError, RecursionError):  # a report the submission's code wrote itself
        report = None
    if isinstance(report, dict) and code == 0 and _well_formed(report, mode):
        return report
    return {"passed": False, "message": f"the judge ended (exit {code}) without a verdict: "
                                        f"{last}"}


_MAX_REPORT_BYTES = 4_000_000


def _well_formed(report: dict, mode: str) -> bool:
    if mode == "answers" and "values" in report:
        return isinstance(report["values"], list)
    message_ok = isinstance(report.get("message"), str)
    return message_ok and (mode == "answers" or isinstance(report.get("passed"), bool))


# ------------------------------------------------------------------ the judge (its process)
