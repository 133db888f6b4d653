"""The first code cell of every course notebook: a notebook opened alone sets itself up.

    python -m overlap_course.build.setup_cell write   # put the cell first in every notebook
    python -m overlap_course.build.setup_cell check   # is it there, and up to date?

A hosted runtime (Colab, Kaggle) or a notebook downloaded on its own has no clone and no
``./run.sh setup``: the cell installs the course (``toy_engine[course]``) from the repository
when ``toy_engine`` or ``overlap_course`` cannot be imported, keeping the runtime's torch (pip
leaves a torch that satisfies ``torch>=2.3,<3`` alone), then the notebook goes on.  Where the
course is installed it does nothing and prints nothing, so stored outputs do not change.

The address comes from one place, ``[project.urls] Repository`` in ``pyproject.toml``; a learner
overrides it with ``OVERLAP_COURSE_SOURCE`` (a pip URL such as ``git+file:///path/to/clone``,
or a folder).  The cell is the notebook's first code cell, id :data:`CELL_ID`, in
``notebooks/`` and ``source/`` (hence in the generated ``exercises/`` and ``solutions/``).
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "setup_cell")  # first: Ctrl-C while the imports run is one line

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import nbformat

from overlap_course import safe_json
from overlap_course.command_line import Parser, fail, os_problem, run
from overlap_course.safe_json import quoted

ROOT = Path(__file__).resolve().parents[2]
CELL_ID = "course-setup"
ENV_VAR = "OVERLAP_COURSE_SOURCE"
TEMPLATE = '''\
# Course setup: opened alone (Colab, Kaggle, a downloaded notebook), this installs the course,
# keeping the runtime's torch; where the course is installed it does nothing.
import importlib.util
import os
import subprocess
import sys

if not all(importlib.util.find_spec(name) for name in ("toy_engine", "overlap_course")):
    # The course's publishing address; {env_var} overrides it with a pip URL
    # (git+file:///path/to/clone) or a folder.
    REPOSITORY = "git+{url}"
    COURSE_SOURCE = os.environ.get("{env_var}") or REPOSITORY
    if os.path.isdir(COURSE_SOURCE):
        COURSE_SOURCE = "file://" + os.path.abspath(COURSE_SOURCE)
    print(f"installing the course from {{COURSE_SOURCE}} (torch is kept if present) ...")
    course = f"toy_engine[course] @ {{COURSE_SOURCE}}"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", course],
                         capture_output=True, text=True)  # shown here, not in the server's log
    if pip.returncode != 0:
        print(pip.stdout[-3000:], pip.stderr[-3000:], sep="\\n")
        raise RuntimeError(f"pip could not install the course from {{COURSE_SOURCE}}; set "
                           "{env_var} to a copy you can reach (a git URL or a folder)")
    importlib.invalidate_caches()
    print("the course is installed; the notebook goes on")'''


def repository_url() -> str:
    """The one place that names the course's repository: pyproject.toml's [project.urls]."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["urls"]["Repository"]


def cell_source() -> str:
    return TEMPLATE.format(env_var=ENV_VAR, url=repository_url())


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook a learner opens: the lessons, the exercise sources and their copies."""
    return sorted(p for d in ("notebooks", "source", "exercises", "solutions")
                  for p in (root / d).glob("*.ipynb"))


#: The largest notebook file a command reads (the course's largest is ~0.3 MB; static figures
#: of a long run can make one tens of MB).
NOTEBOOK_MAX_BYTES = 256 << 20


def read_notebook(path: Path, shown: str | None = None):
    """The notebook at ``path``, or a ``ValueError`` in one line naming it (``shown``) and what
    is wrong: every build command reads through here, since nbformat trusts its JSON (a stored
    ``{"cells": 5}`` was a TypeError traceback, a cut one a line that named no notebook)."""
    return _read(path, shown)[1]


def read_notebook_text(path: Path, shown: str | None = None) -> str:
    """The text of the notebook at ``path``, refused as :func:`read_notebook` refuses it: for a
    command that copies the file as it is (``grading course`` read a FIFO there forever)."""
    return _read(path, shown)[0]


def _read(path: Path, shown: str | None):
    shown = shown or quoted(str(path), 200)
    content = ""
    try:
        content = _bounded_text(path, shown)
        nb = nbformat.reads(content, as_version=4)
        nbformat.validate(nb)
    except safe_json.NotAFile:  # a FIFO, a folder, a device: its message names the file
        raise
    except (RecursionError, AssertionError, OverflowError) as err:
        raise ValueError(f"{shown} is not a notebook ({_distrusted(content, err)})") from None
    except (ValueError, KeyError, TypeError, AttributeError, OSError,
            nbformat.ValidationError) as err:
        raise ValueError(f"{shown} is not a notebook "
                         f"({type(err).__name__}: {str(err)[:80]})") from None
    return content, nb


def _bounded_text(path: Path, shown: str) -> str:
    """The file's text, refused past :data:`NOTEBOOK_MAX_BYTES` (nbformat reads it whole)."""
    with safe_json.open_regular(path, shown) as f:
        raw = f.read(NOTEBOOK_MAX_BYTES + 1)
    if len(raw) > NOTEBOOK_MAX_BYTES:
        raise ValueError(f"it has more than {NOTEBOOK_MAX_BYTES >> 20} MiB")
    return raw.decode("utf-8")


def _distrusted(content: str, err: BaseException) -> str:
    """What is wrong with a file nbformat broke on, since it trusts its JSON (100,000 '['
    raised RecursionError, an nbformat_minor of 1e400 an AssertionError): safe_json says."""
    try:
        safe_json.loads(content, "the file")
    except ValueError as refusal:
        return f"{type(refusal).__name__}: {refusal}"[:120]
    return f"{type(err).__name__}: {str(err)[:80]}"


def write_notebook(nb, path: Path) -> None:
    """Write ``nb`` to ``path`` through a temporary file beside it, renamed over it: a full disk
    or a Ctrl-C leaves the old notebook whole (written in place, it was cut in half), and the
    ``OSError`` names ``path`` (a failed write names no file)."""
    text = nbformat.writes(nb)
    partial = None
    try:  # mkstemp too: a folder that cannot be written named a temporary file never made
        fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial",
                                       dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        os.chmod(partial, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(partial, path)
    except BaseException as err:
        try:
            if partial is not None:
                os.unlink(partial)
        except OSError:
            pass
        if isinstance(err, OSError) and (partial is None or err.filename in (None, partial)):
            err.filename = str(path)
        raise


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _first_code(nb):
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def problems(root: Path = ROOT) -> list[str]:
    """Notebooks whose first code cell is not the current setup cell."""
    want, found = cell_source(), []
    for path in notebooks(root):
        first = _first_code(read_notebook(path))
        if first is None or first.get("id") != CELL_ID or first.source != want:
            found.append(f"{path.relative_to(root)}: its first code cell is not the course setup "
                         f"cell: run `python -m overlap_course.build.setup_cell write`")
    return found


def _run_here(source: str) -> int:
    """Run the cell in this environment (the course installed): it must print nothing."""
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0 or proc.stdout or proc.stderr:
        raise RuntimeError(f"the setup cell did something where the course is installed "
                           f"(exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return 1


def write(root: Path = ROOT) -> list[Path]:
    """Put the setup cell first (a new cell; every other cell and its id kept) or update it."""
    source, changed = cell_source(), []
    count = _run_here(source)
    for path in notebooks(root):
        nb = read_notebook(path)
        first = _first_code(nb)
        stored = path.parent.name != "source"  # source/ is stored unexecuted
        if first is not None and first.get("id") == CELL_ID:
            if first.source == source:
                continue
            first.source = source
        else:
            first = nbformat.v4.new_code_cell(source, id=CELL_ID)
            first.metadata["slideshow"] = {"slide_type": "skip"}
            # After the title cell, before everything else: the first thing a learner runs.
            at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
            nb.cells.insert(at, first)
        first.outputs, first.execution_count = [], count if stored else None
        write_notebook(nb, path)
        changed.append(path)
    return changed


def main(argv=None) -> int:
    # argparse: a wrong argument is named in one line, as by every command (was: only the usage).
    p = Parser(prog="setup_cell", description="put the course setup cell first in every notebook "
                                              "(write), or say where it is missing (check)")
    p.add_argument("action", choices=("write", "check"))
    action = p.parse_args(argv).action
    if action == "write":
        try:
            for path in write():
                print(f"setup cell written: {path.relative_to(ROOT)}")
        except (ValueError, RuntimeError) as err:  # a stored notebook that is not one; the cell
            return fail("setup_cell write", err)
        except subprocess.TimeoutExpired as err:
            return fail("setup_cell write", f"the setup cell ran past {err.timeout:g} s here")
        except OSError as err:  # a full disk: write_notebook names the notebook
            return fail("setup_cell write", os_problem(err))
        return 0
    try:
        found = problems()
    except ValueError as err:  # a stored notebook that is not one (read_notebook)
        return fail("setup_cell check", err)
    print("\n".join(found) or "every notebook starts with the course setup cell")
    return 1 if found else 0


if __name__ == "__main__":
    run("setup_cell", main)
