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

Why the grade comes from a judge in fresh processes, and what that judge guards against:
``overlap_course/build/judge.py`` (the grader's side) and ``judge_process.py`` (its process).
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "grading")  # first: Ctrl-C while the imports run is one line

import argparse
import re
import sys
from contextlib import ExitStack
from pathlib import Path

from overlap_course.build.graded import (CONTEXT_RUNS, CONTEXT_TYPES, GRADED_CALLS, POINTS,  # noqa: F401
                                         ROOT, VALUE_ANSWERS)
from overlap_course.build.setup_cell import read_notebook, read_notebook_text, write_notebook
from overlap_course.command_line import (PATH_CHARS, Parser, fail, os_problem, out_folder,
                                         progress, run)
from overlap_course.out_folders import made_folder
from overlap_course.safe_json import printable, quoted, refuse_unwritable, whole_set

SCHEMA_VERSION = 3

NBGRADER_CONFIG = '''\
# nbgrader configuration for "Overlap the Pipeline" (written by `python -m overlap_course.build.grading course`).
c = get_config()  # noqa
c.CourseDirectory.course_id = "overlap-the-pipeline"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
# The grade of each check comes from a judge in a fresh process that the submission's kernel
# cannot reach (overlap_course/build/judge.py): without this line nbgrader would grade by
# what the learner's own kernel printed, which the learner's cells control.
from overlap_course.build.judge import autograde_preprocessors
c.Autograde.autograde_preprocessors = autograde_preprocessors()
c.Execute.timeout = 300          # a checker runs the engine: several seconds on a busy machine
# The learner's kernel, which runs the submission before any judge, is started fenced: it
# cannot read the solutions, the gradebook or other submissions (autograde_preprocessors,
# overlap_course/build/kernel_fence.py).
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
    nb = read_notebook(path)
    changed = False
    for cell, meta in zip(nb.cells, expected_metadata(path.stem, nb)):
        if cell.metadata.get("nbgrader") != meta:
            changed = True
            if meta is None:
                cell.metadata.pop("nbgrader", None)
            else:
                cell.metadata["nbgrader"] = meta
    if changed:
        write_notebook(nb, path)  # whole or as it was: in place, a full disk cut it in half
    return changed


def check(root: Path = ROOT) -> list[str]:
    """Source notebooks whose nbgrader metadata is missing or stale."""
    problems = []
    for path in sorted((root / "source").glob("*.ipynb")):
        nb = read_notebook(path)
        want = expected_metadata(path.stem, nb)
        if [c.metadata.get("nbgrader") for c in nb.cells] != want:
            problems.append(f"{path.relative_to(root)}: nbgrader metadata out of date: run "
                            f"`python -m overlap_course.build.grading annotate`")
        graded = {m["grade_id"] for m in want if m and m["grade"]}
        if graded != set(POINTS.get(path.stem, {})):
            problems.append(f"{path.relative_to(root)}: graded checks {sorted(graded)}, POINTS lists "
                            f"{sorted(POINTS.get(path.stem, {}))}")
    return problems


def _differs(path: Path, content: bytes) -> bool:
    """Whether the file at ``path`` holds other than ``content``: its size first, then at most
    that many bytes (reading it whole, a 3 GB file at a course file's name was a MemoryError)."""
    if not path.is_file():
        return False
    if path.stat().st_size != len(content):
        return True
    with path.open("rb") as f:
        return f.read(len(content) + 1) != content


def course(dest: Path, root: Path = ROOT, assignments=None, force: bool = False) -> Path:
    """An nbgrader course directory: ``source/<exercise>/<exercise>.ipynb`` and the config.
    Raises ValueError, naming the problem, for an unknown exercise, a DEST that is a file, or
    (unless ``force``) a file in DEST that differs from what this would write: an instructor's
    edited config or assignment is kept, and nothing is written.  The files are written all or
    none (``whole_set``), and the folders made for them are removed again on a failure or a
    Ctrl-C (``made_folder``): a full disk left half a course, a refusal its empty folders."""
    sources = {path.stem: path for path in sorted((root / "source").glob("*.ipynb"))}
    unknown = [name for name in assignments or () if name not in sources]
    if unknown:
        raise ValueError(f"no exercise named {', '.join(map(repr, unknown))}; the exercises are "
                         f"{', '.join(sources)}")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"DEST {str(dest)!r} is a file: give a folder (new or existing)")
    files = {dest / "source" / name / path.name: read_notebook_text(path).encode("utf-8")
             for name, path in sources.items() if not assignments or name in assignments}
    files[dest / "nbgrader_config.py"] = NBGRADER_CONFIG.encode()
    for f in files:  # a pipe or a folder at a file's name: refused before anything is written
        refuse_unwritable(f, quoted(str(f), PATH_CHARS))
    edited = [str(f) for f, content in files.items() if _differs(f, content)]
    if edited and not force:
        more = f" (and {len(edited) - 1} more)" if len(edited) > 1 else ""
        raise ValueError(f"{edited[0]}{more} differs from what `grading course` writes (edited?): "
                         f"nothing written; pass --force to overwrite")
    with ExitStack() as folders:
        for folder in dict.fromkeys(path.parent for path in files):
            folders.enter_context(made_folder(folder))
        with whole_set() as parts:
            for path, content in files.items():
                try:
                    Path(parts.part(path)).write_bytes(content)
                except OSError as err:  # a full disk's write names no file: its target
                    raise OSError(err.errno, err.strerror, str(path)) from None
    return dest


def _dest(text: str) -> Path:
    """DEST as a path; an empty one would be the current folder, named by nobody."""
    if not text.strip():
        raise argparse.ArgumentTypeError("DEST is empty: name the folder for the course, "
                                         "e.g. grading-course")
    return Path(text)


def main(argv=None) -> int:
    p = Parser(prog="grading", description="the exercises as an nbgrader course")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("course", help="lay out an nbgrader course directory from source/")
    c.add_argument("dest", type=_dest, help="the folder to lay the course out in (a new one)")
    c.add_argument("assignments", nargs="*")
    c.add_argument("--force", action="store_true",
                   help="overwrite files in DEST that differ from the course's (edited ones)")
    sub.add_parser("annotate", help="write nbgrader cell metadata into source/*.ipynb")
    sub.add_parser("check", help="fail if source/*.ipynb lack their nbgrader metadata")
    a = p.parse_args(argv)
    if a.cmd == "course":
        try:
            dest = out_folder(str(a.dest), "DEST")  # as every command's --out: a link to nowhere
            home = course(dest, assignments=a.assignments, force=a.force)
        except (ValueError, OSError) as err:  # OSError: DEST under a file, or not writable
            why = f"{err.strerror}: {err.filename!r}" if isinstance(err, OSError) else str(err)
            return fail("grading course", why)
        print(f"nbgrader course in {printable(home)}")  # a name's odd bytes escaped
    elif a.cmd == "annotate":
        try:
            for path in sorted((ROOT / "source").glob("*.ipynb")):
                done = "updated" if annotate(path) else "up to date"
                progress(f"{path.relative_to(ROOT)}: {done}")
        except ValueError as err:  # a source notebook that is not one, a cell with no answer
            return fail("grading annotate", err)
        except OSError as err:  # a full disk: write_notebook names the notebook
            return fail("grading annotate", os_problem(err))
    else:
        try:
            problems = check()
        except ValueError as err:  # a source notebook that is not one (read_notebook)
            return fail("grading check", err)
        print("\n".join(problems) or "nbgrader metadata is up to date")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    run("grading", main)
