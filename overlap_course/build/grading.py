"""The exercises as an nbgrader course: the same sources, graded by the course's own checkers
in a process the submission cannot reach.

``source/*.ipynb`` carry nbgrader's cell metadata (schema 3) beside their ``### BEGIN
SOLUTION`` markers: each cell with a marked answer is a *solution* cell, and each exercise's
checker cell (``checks.check_...(...)``) is a locked *autograded test* worth :data:`POINTS`
points.  The shipped ``exercises/`` and ``solutions/`` do not change (``course.py`` drops the
metadata when it renders them), so self-paced learners see nothing of this.  An instructor::

    python -m overlap_course.build.grading course COURSE_DIR  # nbgrader's layout + config
    cd COURSE_DIR
    nbgrader generate_assignment 02_serial_loop        # release/: the learner's version
    # ... collect submissions into submitted/<student>/02_serial_loop/ ...
    nbgrader autograde 02_serial_loop                  # runs the kernels, then the judge

Why a judge.  nbgrader scores an autograded cell by its outputs (an error: 0 points), and
those come from the learner's kernel, where the learner's cells ran first and could set
``os.environ``, replace a check, ``Verdict`` or ``sys.modules`` entries, patch builtins or read
the solution.  nbgrader's hidden tests (``### BEGIN HIDDEN TESTS``) and otter-grader's hidden
tests hide a test's *source*, and ``nbgrader autograde`` re-inserts locked cells from the
instructor's copy, but the test still runs in that kernel, after the learner's code: neither
keeps the verdict out of the learner's reach.  So the course's ``nbgrader_config.py`` adds one
step after nbgrader's ``Execute`` (:func:`autograde_preprocessors`): each graded cell's outputs
are replaced by the verdict of a fresh ``python -I`` process (no user site, no ``PYTHONPATH``,
an empty temporary folder as current folder and ``HOME``) that imports the course nbgrader
itself loaded, re-runs the submission's code cells above the check, and calls the checker:

* a value answer (``order``, ``needs_correction``) is read out by one such process and checked
  by a second that runs no line of the submission; it crosses as tagged plain data (no pickle,
  whose loading runs code; no object whose ``__eq__`` or ``__iter__`` the learner wrote);
* a code answer must run beside its checker; the judge fingerprints (by identity) every module
  of the course and the toy, their classes, ``builtins`` and the functions of the modules the
  checkers call before the first line of the submission, and trusts the verdict only if all is
  as it was, no thread of the submission still runs and no trace hook is left;
* an audit hook, installed before the submission's first line, refuses to open notebooks,
  ``solutions/``, ``source/`` and the course folder, and to write, rename or remove anything
  under the course, the toy and the folders of Python's modules and start-up hooks;
* each judge gets a secret made for its run on stdin (with its request and the report's random
  path; none of them is in argv, the environment or a file) and signs its report with it; a
  report that is not signed, or a process that exits before the judge's own verdict, scores 0;
* after each judge process, and before each notebook, the grader re-hashes the installed
  course, the toy and the start-up hooks (``*.pth``, ``sitecustomize``) against their state
  when nbgrader started, and trusts no verdict if they changed.

Chosen over verifying the kernel's modules before trusting its verdict: a kernel can be made
to lie about any check of itself (an input transformer that rewrites the test cell, a patched
``showtraceback``), while a process started after it has none of its state.  What remains:
code that runs beside its checker shares the judge's process, so code written against the
judge on purpose can still mutate the checker's data in place, walk frames, dig the run's
secret out of the judge's memory and sign a forged report, write files through ``ctypes`` or
a process of its own (the audit hook is not inherited; the re-hash after the judge catches such
writes to sources, though not to ``__pycache__``, unless the process leaves the judge's process
group on purpose and writes later) -- all of it in the submission, for the instructor to read.
And the kernel runs as the grader's user, before any judge: grade where submissions cannot
write the course folder or the environment (a container, as otter-grader recommends).
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from pathlib import Path

import nbformat

from overlap_course.command_line import Parser, fail

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_VERSION = 3
JUDGE_TIMEOUT_S = 600  # one judge process: the learner's cells up to the check, then the check
# Points per check: the exercise's graded checker cells, by the check each calls.
POINTS = {
    "02_serial_loop": {"check_serial_loop": 3, "check_idle_fraction": 2},
    "03_zos_loop": {"check_zos_loop": 4, "check_three_rounds": 2},
    "04_seqlen_correction": {"check_correction": 4, "check_metadata_answer": 2},
    "05_lifetime": {"check_process_outputs": 4},
}
# The graded cell of a check: the one that calls it on the learner's own answer (not a demo
# such as ``forgetful_loop``, nor the summary cell at the end).
GRADED_CALLS = {
    "check_serial_loop": "checks.check_serial_loop(serial_loop)",
    "check_idle_fraction": "checks.check_idle_fraction(idle_fraction, engine)",
    "check_zos_loop": "checks.check_zos_loop(zos_loop)",
    "check_three_rounds": "checks.check_three_rounds(order)",
    "check_correction": "checks.check_correction(correct_seqlens_qk)",
    "check_metadata_answer": "checks.check_metadata_answer(needs_correction)",
    "check_process_outputs": "checks.check_process_outputs(process_outputs)",
}
# Answers that are values, not code: the judge reads them out of the learner's cells in one
# process and checks them in another, so no line of the submission runs beside that checker.
VALUE_ANSWERS = {"order", "needs_correction"}
# Arguments of a graded call that are not the learner's answer, and the toy class each must be.
CONTEXT_TYPES = {"engine": "Engine"}

NBGRADER_CONFIG = '''\
# nbgrader configuration for "Overlap the Pipeline" (written by `python -m overlap_course.build.grading course`).
c = get_config()  # noqa
c.CourseDirectory.course_id = "overlap-the-pipeline"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
# The grade of each check comes from a judge in a fresh process that the submission's kernel
# cannot reach (overlap_course/build/grading.py): without this line nbgrader would grade by
# what the learner's own kernel printed, which the learner's cells control.
from overlap_course.build.grading import autograde_preprocessors
c.Autograde.autograde_preprocessors = autograde_preprocessors()
c.Execute.timeout = 300          # a checker runs the engine: several seconds on a busy machine
c.ClearSolutions.code_stub = {
    "python": "# YOUR CODE HERE\\nraise NotImplementedError(\\"exercise: write this part\\")"}
'''


def _is_solution(source: str) -> bool:
    return "### BEGIN SOLUTION" in source


def _answer_name(source: str) -> str:
    """What a solution cell defines: its function, or the variable of a top-level answer."""
    m = re.search(r"^def (\w+)\(", source, re.M) or re.search(r"### BEGIN SOLUTION:\s*(\w+)\s*=", source)
    if m is None:
        raise ValueError(f"a solution cell that defines no function and names no answer:\n{source[:200]}")
    return m.group(1)


def graded_check(source: str) -> str | None:
    """The check a cell grades, if it is a graded checker cell."""
    lines = [line.strip() for line in source.strip().splitlines()]
    for check, call in GRADED_CALLS.items():
        if call in lines or f"verdict = {call}" in lines:
            return check
    return None


def expected_metadata(notebook: str, nb) -> list[dict | None]:
    """The nbgrader metadata each cell of a source notebook must carry (None: none)."""
    out = []
    for cell in nb.cells:
        meta = None
        if cell.cell_type == "code" and _is_solution(cell.source):
            meta = {"grade": False, "solution": True, "locked": False, "grade_id": f"answer_{_answer_name(cell.source)}",
                    "schema_version": SCHEMA_VERSION}
        elif cell.cell_type == "code" and (check := graded_check(cell.source)) in POINTS.get(notebook, {}):
            meta = {"grade": True, "solution": False, "locked": True, "grade_id": check,
                    "points": POINTS[notebook][check], "schema_version": SCHEMA_VERSION}
        out.append(meta)
    return out


def annotate(path: Path) -> bool:
    """Write the nbgrader metadata into a source notebook; True if it changed."""
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell, meta in zip(nb.cells, expected_metadata(path.stem, nb)):
        if cell.metadata.get("nbgrader") != meta:
            changed = True
            if meta is None:
                cell.metadata.pop("nbgrader", None)
            else:
                cell.metadata["nbgrader"] = meta
    if changed:
        nbformat.write(nb, path)
    return changed


def check(root: Path = ROOT) -> list[str]:
    """Source notebooks whose nbgrader metadata is missing or stale."""
    problems = []
    for path in sorted((root / "source").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        want = expected_metadata(path.stem, nb)
        if [c.metadata.get("nbgrader") for c in nb.cells] != want:
            problems.append(f"{path.relative_to(root)}: nbgrader metadata out of date: run "
                            f"`python -m overlap_course.build.grading annotate`")
        graded = {m["grade_id"] for m in want if m and m["grade"]}
        if graded != set(POINTS.get(path.stem, {})):
            problems.append(f"{path.relative_to(root)}: graded checks {sorted(graded)}, POINTS lists "
                            f"{sorted(POINTS.get(path.stem, {}))}")
    return problems


def course(dest: Path, root: Path = ROOT, assignments=None, force: bool = False) -> Path:
    """An nbgrader course directory: ``source/<exercise>/<exercise>.ipynb`` and the config.
    Raises ValueError, naming the problem, for an unknown exercise, a DEST that is a file, or
    (unless ``force``) a file in DEST that differs from what this would write: an instructor's
    edited config or assignment is kept, and nothing is written."""
    sources = {path.stem: path for path in sorted((root / "source").glob("*.ipynb"))}
    unknown = [name for name in assignments or () if name not in sources]
    if unknown:
        raise ValueError(f"no exercise named {', '.join(map(repr, unknown))}; the exercises are "
                         f"{', '.join(sources)}")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"DEST {str(dest)!r} is a file: give a folder (new or existing)")
    files = {dest / "source" / name / path.name: path.read_bytes()
             for name, path in sources.items() if not assignments or name in assignments}
    files[dest / "nbgrader_config.py"] = NBGRADER_CONFIG.encode()
    edited = [str(f) for f, content in files.items() if f.is_file() and f.read_bytes() != content]
    if edited and not force:
        more = f" (and {len(edited) - 1} more)" if len(edited) > 1 else ""
        raise ValueError(f"{edited[0]}{more} differs from what `grading course` writes (edited?): "
                         f"nothing written; pass --force to overwrite")
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return dest


# ------------------------------------------------------------------ the judge (grader's side)

def autograde_preprocessors() -> list:
    """nbgrader's own autograde steps, with the judge right after the kernel has run (and before
    ``SaveAutoGrades`` reads the graded cells' outputs).  Called by the course's
    ``nbgrader_config.py`` when nbgrader starts, before any submission runs: the digest of the
    installed course taken here is what every later judge is checked against."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute, NbGraderPreprocessor

    pristine = installed_digest()

    class JudgeInFreshProcess(NbGraderPreprocessor):  # enabled, unlike nbconvert's
        """Overwrites each graded cell's outputs with a fresh process's verdict."""

        def preprocess(self, nb, resources):
            judge_notebook(nb, pristine)
            return nb, resources

    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    steps.insert(steps.index(Execute) + 1, JudgeInFreshProcess)
    return steps


def installed_digest() -> dict[str, str]:
    """SHA-256 of every file the judge trusts: the course's and the toy's modules, and the
    start-up hooks (``*.pth``, ``sitecustomize``) a fresh ``python -I`` runs before them."""
    files = [path for package in ("overlap_course", "toy_engine")
             for path in sorted((ROOT / package).rglob("*.py"))]
    for where in sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")}):
        folder = Path(where)
        files += sorted(folder.glob("*.pth")) + sorted(folder.glob("*customize.py"))
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _changed_files(pristine: dict[str, str]) -> list[str]:
    now = installed_digest()
    edited = {f for f in now if f in pristine and now[f] != pristine[f]}
    return sorted(set(now) ^ set(pristine) | edited)


def judge_notebook(nb, pristine: dict[str, str] | None = None) -> None:
    """Give every graded cell of an executed submission the judge's outputs: a line that
    says it passed, or a ``CheckNotPassed`` error (nbgrader scores a cell with an error 0)."""
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
            passed, message = judge(check, _code_before(nb, index), private)
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
          pristine: dict[str, str] | None = None) -> tuple[bool, str]:
    """(passed, message) for ``check`` on the answers ``cells`` define, from fresh processes.

    A check of values reads them in one process (the learner's cells run there) and judges them
    in another that runs no line of the submission; a check of code runs the cells and the
    check in one process that verifies afterwards that nothing the checker uses was replaced.
    After each process the installed files are re-hashed against ``pristine`` (by default,
    their state now): a verdict from a judge whose course was rewritten is not trusted."""
    pristine = installed_digest() if pristine is None else pristine
    names = graded_arguments(check)
    request = {"check": check, "names": names, "cells": cells, "private": list(private)}
    if set(names) <= VALUE_ANSWERS:
        answers = _run_judge("answers", request, pristine)
        if "values" not in answers:
            return False, answers["message"]
        request = {"check": check, "names": names, "values": answers["values"], "private": []}
    report = _run_judge("check", request, pristine)
    return report["passed"] is True, report["message"]


_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from overlap_course.build import grading; "
         "grading.judge_main(sys.argv[1:])")


def _run_judge(mode: str, request: dict, pristine: dict[str, str]) -> dict:
    """One judge process: ``python -I`` (no user site, no ``PYTHONPATH``, no current folder on
    the path), in an empty temporary folder, with an environment of its own.  The request, a
    secret made for this run and the report's (random) path cross on its stdin, which the judge
    reads before any line of the submission: neither argv, the environment nor a file holds
    them.  Its report is trusted only if signed with that secret, in the shape it must have,
    from a process that exited 0 and left the installed files as they were."""
    with tempfile.TemporaryDirectory(prefix="overlap-judge-") as tmp:
        secret = secrets.token_hex(32)
        answer = Path(tmp, f"{secrets.token_hex(16)}.json")
        ask = json.dumps({"secret": secret, "report": str(answer), "request": request})
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8"}
        cmd = [sys.executable, "-I", "-c", _BOOT, str(ROOT), mode]
        judge = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)
        try:
            _, err = judge.communicate(ask.encode("utf-8"), timeout=JUDGE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"passed": False, "message": f"the judge stopped your code after "
                                                f"{JUDGE_TIMEOUT_S} s without a verdict"}
        finally:
            _end_group(judge)
        changed = _changed_files(pristine)
        if changed:
            return {"passed": False, "message": (
                f"not graded: the judge's process changed {len(changed)} installed file(s) "
                f"the grader trusts ({', '.join(changed[:3])}): reinstall the course")}
        return _read_report(answer, secret, mode, judge.returncode, err)


def _end_group(process: subprocess.Popen) -> None:
    """The judge and whatever it started (the engine's device process, a learner's child)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _sign(secret: str, body: str) -> str:
    return hmac.new(secret.encode(), body.encode("utf-8"), hashlib.sha256).hexdigest()


def _read_report(path: Path, secret: str, mode: str, code: int, err: bytes) -> dict:
    """The report: its signature on one line, then its JSON (signed, so that code that reads
    the written report learns no secret it could sign a forgery with)."""
    try:
        if path.stat().st_size > _MAX_REPORT_BYTES:
            raise ValueError("too large")
        signature, _, body = path.read_text(encoding="utf-8").partition("\n")
        if not hmac.compare_digest(signature, _sign(secret, body)):
            raise ValueError("not signed by the judge")
        report = json.loads(body)
    except (OSError, ValueError, RecursionError):  # a report the submission's code wrote itself
        report = None
    if isinstance(report, dict) and code == 0 and _well_formed(report, mode):
        return report
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
    return {"passed": False, "message": f"the judge ended (exit {code}) without a verdict: "
                                        f"{tail[0][:300]}"}


_MAX_REPORT_BYTES = 4_000_000


def _well_formed(report: dict, mode: str) -> bool:
    if mode == "answers" and "values" in report:
        return isinstance(report["values"], list)
    message_ok = isinstance(report.get("message"), str)
    return message_ok and (mode == "answers" or isinstance(report.get("passed"), bool))


# ------------------------------------------------------------------ the judge (its process)

def judge_main(argv: list[str]) -> None:
    """Entry of a judge process: ``ROOT MODE``, and on stdin the request, the run's secret and
    the report's path, read before anything else.  The course is imported from ROOT before any
    line of the submission runs, and its state is fingerprinted then."""
    root, mode = argv
    sent = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin.close()
    import overlap_course
    import toy_engine
    from overlap_course import checks

    for package in (overlap_course, toy_engine):
        if not Path(package.__file__).resolve().is_relative_to(Path(root).resolve()):
            raise SystemExit(f"the judge imported {package.__name__} from {package.__file__}, "
                             f"not from {root}")
    request = sent["request"]
    write = _reporter(sent.pop("report"), sent.pop("secret"))
    sys.addaudithook(_guard(request["private"], _protected_folders(Path(root))))
    check, names = getattr(checks, request["check"]), request["names"]
    if mode == "answers":
        write(_read_values(request["cells"], names))
        return
    before = _fingerprint()
    threads = set(threading.enumerate())
    if "values" in request:
        args = [_decode(value) for value in request["values"]]  # a bad one ends the judge: 0
    else:
        args = _code_arguments(request["cells"], names, toy_engine)
        if isinstance(args, str):
            write({"passed": False, "message": args})
            return
    write(_verdict(check, args, before, threads, checks.Verdict))


def _protected_folders(root: Path) -> list[Path]:
    """What no judge process may write: the course, the toy, and the folders of the modules and
    start-up hooks (``*.pth``, ``sitecustomize``) the next ``python -I`` loads."""
    paths = sysconfig.get_paths()
    folders = {root / "overlap_course", root / "toy_engine"}
    folders |= {Path(paths[k]) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return sorted({Path(os.path.realpath(f)) for f in folders})


# Audit events that change a file or folder at the path they name (first argument; a rename's
# second too); ``open`` is a write when its mode or flags say so.
_WRITES = {"os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown",
           "os.utime", "os.rename"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _guard(private: list[str], protected: list[Path]):
    """An audit hook (it cannot be removed) installed before the submission's first line: it
    refuses new links, reading notebooks and the private folders (the submission's cells cannot
    exec the solution's cell from disk), and writing the protected folders -- or opening one of
    them, or a folder above one, as a directory whose descriptor would reach them by a relative
    path -- so that no judge process can rewrite what the next one imports."""
    folders = [Path(f) for f in private]

    def resolved(path) -> Path | None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None  # a file descriptor: opening it was audited
        return Path(os.path.realpath(os.fsdecode(path)))

    def refuse_write(path: Path | None) -> None:
        if path is not None and any(path.is_relative_to(f) for f in protected):
            raise PermissionError(f"the judge does not let a submission change {path}")

    def hook(event: str, args: tuple) -> None:
        if event == "os.symlink" or event == "os.link":
            raise PermissionError("the judge refuses new links")
        if event in _WRITES:
            for path in args[:2] if event == "os.rename" else args[:1]:
                refuse_write(resolved(path))
        if event != "open" or (path := resolved(args[0])) is None:
            return
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & _WRITE_FLAGS:
            refuse_write(path)
        if path.is_dir() and any(f.is_relative_to(path) or path.is_relative_to(f)
                                 for f in protected):
            raise PermissionError(f"the judge does not let a submission open the folder {path}")
        if path.suffix == ".ipynb" or any(path.is_relative_to(f) for f in folders):
            raise PermissionError(f"the judge does not let a submission read {path}")
    return hook


def _reporter(path: str, secret: str):
    """Writes the report, signed with the run's secret, with functions bound now (before the
    submission can replace any); then ends the process at once, so that no handler the
    submission left (``atexit``, a finalizer) runs after the verdict."""
    dumps, opener, sign, leave = json.dumps, builtins.open, _sign, os._exit

    def write(report: dict) -> None:
        body = dumps(report)
        with opener(path, "w", encoding="utf-8") as f:
            f.write(f"{sign(secret, body)}\n{body}")
        leave(0)
    return write


def _run_cells(cells: list[str]) -> tuple[dict, list[str]]:
    """The submission's cells in order, as its kernel ran them: a cell that raises is noted
    and the next one runs (nbgrader runs notebooks with errors allowed)."""
    space = {"__name__": "__main__", "__builtins__": builtins, "display": lambda *a, **k: None}
    notes = []
    for number, source in enumerate(cells, 1):
        try:
            exec(compile(source, f"<submission cell {number}>", "exec"), space)  # noqa: S102
        except BaseException as err:  # noqa: BLE001 - the kernel goes on to the next cell too
            notes.append(f"code cell {number} raised {type(err).__name__}: {str(err)[:200]}")
    return space, notes


def _missing(name: str, notes: list[str]) -> str:
    why = f" ({notes[-1]})" if notes else ""
    return f"`{name}` is not defined by your notebook's cells above the check{why}"


def _read_values(cells: list[str], names: list[str]) -> dict:
    space, notes = _run_cells(cells)
    values = []
    for name in names:
        if name not in space:
            return {"message": _missing(name, notes)}
        try:
            values.append(_encode(space[name]))
        except ValueError as err:
            return {"message": f"`{name}`: {err}"}
    return {"values": values}


def _code_arguments(cells: list[str], names: list[str], toy_engine) -> list | str:
    """The graded call's arguments from the submission's cells, or why they cannot be judged."""
    space, notes = _run_cells(cells)
    args = []
    for name in names:
        if name not in space:
            return _missing(name, notes)
        value = space[name]
        if name in CONTEXT_TYPES and type(value) is not getattr(toy_engine, CONTEXT_TYPES[name]):
            return (f"`{name}` must be a `toy_engine.{CONTEXT_TYPES[name]}`, "
                    f"not a {type(value).__name__}")
        if name not in CONTEXT_TYPES and type(value) is not types.FunctionType:
            return f"`{name}` must be a function written with `def`, not a {type(value).__name__}"
        args.append(value)
    return args


def _verdict(check, args: list, before: dict, threads: set, verdict_type) -> dict:
    """The check's verdict, kept only if the check's world is as it was when the judge began."""
    try:
        verdict = check(*args)
    except BaseException as err:  # noqa: BLE001 - a checker never raises: something was replaced
        return {"passed": False, "message": f"the check raised {type(err).__name__}: the checker "
                                            f"was changed or your code stopped it"}
    changed = _compare(before, _fingerprint())
    left = [t.name for t in threading.enumerate() if t not in threads and _from_submission(t)]
    hooks = [name for name, hook in (("sys.settrace", sys.gettrace()),
                                     ("sys.setprofile", sys.getprofile())) if hook is not None]
    if changed or left or hooks:
        what = changed[:4] + [f"thread {n!r}" for n in left[:2]] + hooks
        return {"passed": False, "message": f"your code changed what the checker runs on "
                                            f"({', '.join(what)}): graded as not passed"}
    if type(verdict) is not verdict_type or type(verdict.message) is not str:
        return {"passed": False, "message": "the check returned something that is not its verdict"}
    return {"passed": verdict.passed is True, "message": verdict.message}


# Modules whose state the checker depends on: ours whole, the others' functions and classes.
_OURS = ("overlap_course", "toy_engine")
_THEIRS = ("builtins", "torch", "json", "os", "io", "math", "operator", "functools", "threading",
           "dataclasses", "copy", "collections", "itertools", "types", "sys", "numpy")


def _fingerprint() -> dict[str, tuple]:
    """What the checker reads, by identity: every module of the course and the toy (each name
    in it, each class's attributes), and the functions of the modules it calls."""
    marks = {}
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        ours = top in _OURS
        if not ours and name not in _THEIRS:
            continue
        marks[f"sys.modules[{name!r}]"] = (id(module),)
        for attr, value in list(vars(module).items()):
            if ours or callable(value):
                marks[f"{name}.{attr}"] = _mark(value)
            if isinstance(value, type) and (ours or attr == "Tensor"):
                marks[f"{name}.{attr}.__dict__"] = tuple(sorted(
                    (key, _mark(item)) for key, item in vars(value).items()
                    if key != "__slotnames__"))  # copyreg's cache, filled by the first copy
    return marks


def _mark(value) -> tuple:
    return (id(value), *(id(getattr(value, a, None)) for a in ("__code__", "__defaults__",
                                                               "__kwdefaults__", "__func__")))


def _compare(before: dict, after: dict) -> list[str]:
    """Names replaced or removed, and names added to a course module that shadow a builtin."""
    changed = [key for key, mark in before.items() if after.get(key) != mark]
    shadow = []
    for key in after.keys() - before.keys():
        module, _, attr = key.rpartition(".")
        if (f"sys.modules[{module!r}]" in before and module.startswith(_OURS)
                and attr in vars(builtins) and not attr.startswith("__")):
            shadow.append(key)
    return changed + sorted(shadow)


def _from_submission(thread: threading.Thread) -> bool:
    code = getattr(getattr(thread, "_target", None), "__code__", None)
    code = code or getattr(type(thread).run, "__code__", None)
    return code is not None and code.co_filename.startswith("<submission")


# A value answer crosses between the judge's processes as tagged JSON of exact builtin types:
# no pickle (whose loading runs code), no object whose __eq__ or __iter__ the learner wrote.
_TAGS = {type(None): "none", bool: "bool", int: "int", float: "float", str: "str", list: "list",
         tuple: "tuple", set: "set", frozenset: "frozenset", dict: "dict"}
_MAX_ITEMS = 10_000
_MAX_DEPTH = 20


def _encode(value, depth: int = 0, budget: list | None = None):
    budget = [0] if budget is None else budget
    budget[0] += 1
    tag = _TAGS.get(type(value))
    if tag is None:
        raise ValueError(f"a {type(value).__name__} is not a plain Python value: write it with "
                         f"sets, lists, tuples, dicts, strings and numbers")
    if depth > _MAX_DEPTH or budget[0] > _MAX_ITEMS:
        raise ValueError(f"more than {_MAX_DEPTH} levels or {_MAX_ITEMS} items: not an answer")
    if tag == "dict":
        return [tag, [[_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)]
                      for k, v in value.items()]]
    if tag in ("list", "tuple", "set", "frozenset"):
        return [tag, [_encode(item, depth + 1, budget) for item in value]]
    if tag == "int":
        return [tag, str(value)]  # any size, without JSON's number limits
    if tag == "float":
        return [tag, value.hex()]
    return [tag, value]


def _decode(node):
    tag, payload = node[0], node[1] if len(node) > 1 else None
    if tag == "dict":
        return {_decode(k): _decode(v) for k, v in payload}
    if tag in ("list", "tuple", "set", "frozenset"):
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](
            _decode(item) for item in payload)
    if tag == "int":
        return int(payload)
    if tag == "float":
        return float.fromhex(payload)
    return payload


def main(argv=None) -> int:
    p = Parser(prog="grading", description="the exercises as an nbgrader course")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("course", help="lay out an nbgrader course directory from source/")
    c.add_argument("dest", type=Path)
    c.add_argument("assignments", nargs="*")
    c.add_argument("--force", action="store_true",
                   help="overwrite files in DEST that differ from the course's (edited ones)")
    sub.add_parser("annotate", help="write nbgrader cell metadata into source/*.ipynb")
    sub.add_parser("check", help="fail if source/*.ipynb lack their nbgrader metadata")
    a = p.parse_args(argv)
    if a.cmd == "course":
        try:
            home = course(a.dest, assignments=a.assignments, force=a.force)
            print(f"nbgrader course in {home}")
        except (ValueError, OSError) as err:  # OSError: DEST under a file, or not writable
            why = f"{err.strerror}: {err.filename!r}" if isinstance(err, OSError) else str(err)
            return fail("grading course", why)
    elif a.cmd == "annotate":
        for path in sorted((ROOT / "source").glob("*.ipynb")):
            print(f"{path.relative_to(ROOT)}: {'updated' if annotate(path) else 'up to date'}")
    else:
        problems = check()
        print("\n".join(problems) or "nbgrader metadata is up to date")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
