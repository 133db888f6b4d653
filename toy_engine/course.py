"""Build the course's exercise and solution notebooks from one source (nbgrader-style).

    python -m toy_engine.course build      # source/ -> exercises/ + solutions/, then execute
    python -m toy_engine.course check      # are exercises/ and solutions/ up to date?
    python -m toy_engine.course execute notebooks/03_zos.ipynb ...

In ``source/*.ipynb`` a solution is written between marker lines::

    def zos_loop(engine):
        ### BEGIN SOLUTION
        ...the answer...
        ### END SOLUTION

``solutions/`` keeps the answer (markers dropped); ``exercises/`` replaces it with
``raise NotImplementedError(...)`` at the marker's indentation, or with the stub given
on the marker line (``### BEGIN SOLUTION: answer = None``) for top-level answers, so an
exercise notebook still runs top to bottom and its checker says "not implemented yet".

Notebooks are stored executed (nbval compares their outputs) but without widget state:
an executed widget's state would embed all of plotly.js in every notebook.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BEGIN = re.compile(r"^(\s*)### BEGIN SOLUTION(?::\s*(.*))?$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
STUB = 'raise NotImplementedError("exercise: write this part")'


def strip_solution(source: str, keep: bool) -> str:
    """The cell's code with each marked region kept (solution) or replaced (exercise)."""
    out, inside = [], False
    for line in source.splitlines():
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise ValueError("nested ### BEGIN SOLUTION")
            inside = True
            if not keep:
                indent, stub = begin.group(1), begin.group(2)
                out.append(indent + (stub or f"# YOUR CODE HERE\n{indent}{STUB}"))
            continue
        if END.match(line):
            if not inside:
                raise ValueError("### END SOLUTION without BEGIN")
            inside = False
            continue
        if keep or not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without END")
    return "\n".join(out)


def render(source_nb, keep: bool):
    nb = nbformat.from_dict(source_nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solution(cell.source, keep)
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    return nb


def targets(root: Path = ROOT):
    """(source path, exercise path, solution path) for every source notebook."""
    for src in sorted((root / "source").glob("*.ipynb")):
        yield src, root / "exercises" / src.name, root / "solutions" / src.name


def _sources(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def check(root: Path = ROOT) -> list[str]:
    """Problems found: generated copies out of date, or notebooks stored badly."""
    problems = []
    for src, ex, sol in targets(root):
        source_nb = nbformat.read(src, as_version=4)
        for path, keep in ((ex, False), (sol, True)):
            if not path.exists():
                problems.append(f"{path.relative_to(root)} is missing: run `python -m toy_engine.course build`")
            elif _sources(nbformat.read(path, as_version=4)) != _sources(render(source_nb, keep)):
                problems.append(f"{path.relative_to(root)} is out of date with {src.relative_to(root)}: "
                                f"run `python -m toy_engine.course build`")
    for path in stored_notebooks(root):
        nb = nbformat.read(path, as_version=4)
        if "widgets" in nb.metadata:
            problems.append(f"{path.relative_to(root)} stores widget state (it embeds plotly.js): strip it")
        if path.stat().st_size > 1_000_000:
            problems.append(f"{path.relative_to(root)} is {path.stat().st_size // 1000} kB (limit 1000 kB)")
        if any(c.cell_type == "code" and c.source.strip() and c.execution_count is None for c in nb.cells):
            problems.append(f"{path.relative_to(root)} has unexecuted cells: run `python -m toy_engine.course "
                            f"execute {path.relative_to(root)}`")
    return problems


def stored_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in ("notebooks", "exercises", "solutions") for p in (root / d).glob("*.ipynb"))


def execute(path: Path, timeout: int = 600) -> None:
    """Run a notebook in place (from its own folder) and store outputs, not widget state."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


def build(root: Path = ROOT, run: bool = True) -> None:
    """Regenerate what changed; a copy whose cells already match its source keeps its outputs."""
    for src, ex, sol in targets(root):
        source_nb = nbformat.read(src, as_version=4)
        for path, keep in ((ex, False), (sol, True)):
            rendered = render(source_nb, keep)
            if path.exists() and _sources(nbformat.read(path, as_version=4)) == _sources(rendered):
                continue
            path.parent.mkdir(exist_ok=True)
            nbformat.write(rendered, path)
            if run:
                print(f"executing {path.relative_to(root)}", flush=True)
                execute(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="build and check the course notebooks")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="regenerate exercises/ and solutions/ from source/")
    b.add_argument("--no-execute", action="store_true")
    sub.add_parser("check", help="fail if generated notebooks are out of date or stored badly")
    e = sub.add_parser("execute", help="execute notebooks in place")
    e.add_argument("paths", nargs="+", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "build":
        build(run=not a.no_execute)
    elif a.cmd == "execute":
        for path in a.paths:
            print(f"executing {path}", flush=True)
            execute(path.resolve())
    else:
        problems = check()
        print("\n".join(problems) or "course notebooks are up to date")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
