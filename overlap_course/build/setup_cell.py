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

import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat

from overlap_course.command_line import run

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


def _first_code(nb):
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def problems(root: Path = ROOT) -> list[str]:
    """Notebooks whose first code cell is not the current setup cell."""
    want, found = cell_source(), []
    for path in notebooks(root):
        first = _first_code(nbformat.read(path, as_version=4))
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
        nb = nbformat.read(path, as_version=4)
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
        nbformat.write(nb, path)
        changed.append(path)
    return changed


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["write"]:
        for path in write():
            print(f"setup cell written: {path.relative_to(ROOT)}")
        return 0
    if args == ["check"]:
        found = problems()
        print("\n".join(found) or "every notebook starts with the course setup cell")
        return 1 if found else 0
    print("usage: python -m overlap_course.build.setup_cell write | check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    run("setup_cell", main)
