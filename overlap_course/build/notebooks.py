"""Build the course's exercise and solution notebooks from one source (nbgrader-style).

    python -m overlap_course.build.notebooks build      # source/ -> exercises/ + solutions/, then execute
    python -m overlap_course.build.notebooks check      # are exercises/ and solutions/ up to date?
    python -m overlap_course.build.notebooks execute notebooks/03a_zos_order.ipynb ...
    python -m overlap_course.build.notebooks images notebooks/03a_zos_order.ipynb ...   # redraw static figures only

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
an executed widget's state would embed all of plotly.js in every notebook.  Each Plotly
figure output also carries a PNG of itself (``image/png`` beside the interactive
``application/vnd.plotly.v1+json``), so that viewers without JavaScript or without
Plotly's renderer (a repository's notebook view, ``nbconvert --to html``) still show
every timeline; nbval never compares ``image/png``, so the images cannot make it flaky.  A
widget output holding a Plotly FigureWidget (notebook 05's explorer) gets a PNG of the figure
as the run left it, read from the widget state before that is dropped.
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "notebooks")  # first: Ctrl-C while the imports run is one line

import argparse
import asyncio
import base64
import re
import signal
import sys
import threading
from pathlib import Path

import nbformat

from overlap_course.build import setup_cell
from overlap_course.build.setup_cell import read_notebook, write_notebook
from overlap_course.build.drawing import render_images, shrink_png
from overlap_course.build.stored_figure import PLOTLY_MIME, check_figures
from overlap_course.command_line import Parser, fail, os_problem, progress, run
from overlap_course.safe_json import quoted
from overlap_course.out_folders import unwritable

ROOT = Path(__file__).resolve().parents[2]
BEGIN = re.compile(r"^(\s*)### BEGIN SOLUTION(?::\s*(.*))?$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
STUB = 'raise NotImplementedError("exercise: write this part")'
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"


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
        cell.metadata.pop("nbgrader", None)  # the nbgrader course's metadata (grading.py), not the learners'
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
        source_nb = read_notebook(src)
        for path, keep in ((ex, False), (sol, True)):
            if not path.exists():
                problems.append(f"{path.relative_to(root)} is missing: run `python -m overlap_course.build.notebooks build`")
            elif _sources(read_notebook(path)) != _sources(render(source_nb, keep)):
                problems.append(f"{path.relative_to(root)} is out of date with {src.relative_to(root)}: "
                                f"run `python -m overlap_course.build.notebooks build`")
    problems += setup_cell.problems(root)
    for path in stored_notebooks(root):
        nb = read_notebook(path)
        if "widgets" in nb.metadata:
            problems.append(f"{path.relative_to(root)} stores widget state (it embeds plotly.js): strip it")
        if path.stat().st_size > 1_000_000:
            problems.append(f"{path.relative_to(root)} is {path.stat().st_size // 1000} kB (limit 1000 kB)")
        missing = sum("image/png" not in o.data for o in figure_outputs(nb))
        if missing:
            problems.append(f"{path.relative_to(root)} has {missing} Plotly figure(s) without a static image: run "
                            f"`python -m overlap_course.build.notebooks images {path.relative_to(root)}`")
        if any(c.cell_type == "code" and c.source.strip() and c.execution_count is None for c in nb.cells):
            problems.append(f"{path.relative_to(root)} has unexecuted cells: run `python -m overlap_course.build.notebooks "
                            f"execute {path.relative_to(root)}`")
    return problems


def stored_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in ("notebooks", "exercises", "solutions") for p in (root / d).glob("*.ipynb"))


def figure_outputs(nb) -> list:
    """The outputs of a notebook that hold a Plotly figure."""
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if PLOTLY_MIME in o.get("data", {})]


def widget_figures(nb) -> list[tuple[dict, dict]]:
    """(output, figure) for each widget output with a Plotly FigureWidget inside: the figure as the
    executed notebook's widget state holds it (plotly's anywidget keeps ``_widget_data`` and
    ``_widget_layout``); the first one found walking down from the output's widget."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            view = output.get("data", {}).get(WIDGET_MIME)
            todo = [view["model_id"]] if view else []
            while todo:
                widget = state.get(todo.pop(0), {}).get("state", {})
                if "_widget_data" in widget:
                    found.append((output, {"data": widget["_widget_data"], "layout": widget["_widget_layout"]}))
                    break
                todo += [child.removeprefix("IPY_MODEL_") for child in widget.get("children", [])]
    return found


def add_static_images(nb, widgets: list[tuple[dict, dict]] = (), shown: str = "notebook") -> int:
    """Store a PNG beside every Plotly figure output (replacing an older one), and beside each
    widget output of ``widgets`` (:func:`widget_figures`); returns how many.  A figure
    plotly.js cannot draw is a ``ValueError`` naming the notebook (``shown``)."""
    pairs = [(o, o.data[PLOTLY_MIME]) for o in figure_outputs(nb)] + list(widgets)
    if pairs:
        try:
            pngs = render_images([figure for _, figure in pairs])
        except ValueError as err:
            raise ValueError(f"{shown}: {err}") from None
        for (output, _), png in zip(pairs, pngs):
            output.data["image/png"] = base64.b64encode(shrink_png(png)).decode("ascii")
    return len(pairs)


def execute(path: Path, timeout: int = 600) -> None:
    """Run a notebook in place (from its own folder); store outputs and static figures, not widget
    state (it is read for the widgets' figures, then dropped)."""
    from nbclient import NotebookClient

    from nbclient.exceptions import CellExecutionError

    _written_in_place(path)
    nb = read_notebook(path)
    # an earlier run's widget state or junk (null, "x"): the run stores its own, read afterwards
    nb.metadata.pop("widgets", None)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        _run_cells(client)
    except CellExecutionError as err:  # its message: the cell and a traceback in ANSI colours
        raise RuntimeError(_failed_cell(path, nb, err)) from None
    shown = quoted(str(path), 200)
    check_figures(nb, shown)  # a cell may display one that is not a figure
    widgets = widget_figures(nb)
    nb.metadata.pop("widgets", None)
    add_static_images(nb, widgets, shown)
    write_notebook(nb, path)


def _written_in_place(path: Path) -> None:
    """Refuse, before the run, a notebook whose folder cannot be written (read-only): it is
    written back there, which failed only after executing it whole (minutes)."""
    err = unwritable(path.parent)
    if err is not None:
        raise ValueError(f"{quoted(str(path), 200)} is executed in place, but its folder cannot "
                         f"be written ({err.strerror}): copy it into a folder you can write")


class _CourseLoop(asyncio.SelectorEventLoop):
    """An event loop that leaves SIGINT to :func:`_run_cells`: nbclient's own handler would shut
    the kernel down under the running cell and leave the course's Ctrl-C unseen, a
    ``DeadKernelError`` and ``AssertionError`` traceback instead of the one line."""

    def add_signal_handler(self, sig, callback, *args):
        if sig == signal.SIGINT:
            raise RuntimeError("SIGINT is the course's Ctrl-C")  # nbclient goes on without
        super().add_signal_handler(sig, callback, *args)


def _run_cells(client) -> None:
    """``client.execute()``, where Ctrl-C cancels the run at its next ``await`` (a
    ``KeyboardInterrupt`` raised anywhere in jupyter_client or zmq can leave it hanging) and
    kills the kernel, running a cell or starting; then it is the ``KeyboardInterrupt`` the
    command expects, whatever the cancelled run raised.  A second Ctrl-C raises it at once."""
    loop, presses = _CourseLoop(), []
    run = loop.create_task(client.async_execute())

    def cancel() -> None:
        client.shutdown_kernel = "immediate"  # the kernel may be busy: no polite request
        run.cancel()

    def ctrl_c(signum, frame) -> None:
        presses.append(signum)
        if len(presses) > 1:
            raise KeyboardInterrupt
        loop.call_soon_threadsafe(cancel)

    course = signal.getsignal(signal.SIGINT)
    ours = course is not signal.SIG_IGN and threading.current_thread() is threading.main_thread()
    if ours:  # (ignored, as under nohup: it stays so)
        signal.signal(signal.SIGINT, ctrl_c)
    try:
        loop.run_until_complete(run)
    except (asyncio.CancelledError, Exception):  # "Kernel died", from the cancelled cell
        if not presses:
            raise
    finally:
        try:
            _close(loop, client.km)
        finally:
            if ours:
                signal.signal(signal.SIGINT, course)
            loop.close()
    if presses:
        raise KeyboardInterrupt


def _close(loop, km) -> None:
    """End what a cancelled run left: its kernel, if it was starting (nbclient kills it only
    from its first cell on), and the cell's poller tasks."""
    if km is not None and km.has_kernel:
        loop.run_until_complete(km.shutdown_kernel(now=True))
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left))


def _failed_cell(path: Path, nb, err) -> str:
    """Which cell of ``path`` raised, and what, in one line: the notebook is left as it was."""
    where = "a cell"
    for i, cell in enumerate(nb.cells, 1):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", ())):
            first = cell.source.strip().splitlines()[:1] or [""]
            where = f"cell {i} ({quoted(first[0], 40)})"
            break
    what = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", f"{err.ename}: {err.evalue}")
    return f"{quoted(str(path), 200)}: {where} raised {what}; the notebook is left unchanged"


def refresh_images(path: Path) -> int:
    """Redraw the static figures of a stored notebook from its stored figures (no kernel)."""
    nb = read_notebook(path)
    shown = quoted(str(path), 200)
    check_figures(nb, shown)  # before Chromium starts (seconds)
    n = add_static_images(nb, shown=shown)
    write_notebook(nb, path)
    return n


def notebook_file(text: str) -> Path:
    """An argparse ``type``: a file that reads as a notebook (refused in one line, not with
    nbformat's traceback, before any kernel starts)."""
    path, shown = Path(text), quoted(text, 200)
    try:
        exists, is_file = path.exists(), path.is_file()
    except OSError as err:  # a name too long for the system
        raise argparse.ArgumentTypeError(f"{shown}: {err.strerror or err}") from None
    if not exists:
        raise argparse.ArgumentTypeError(f"no such notebook: {shown}")
    if not is_file:
        raise argparse.ArgumentTypeError(f"{shown} is not a file: name a notebook (.ipynb)")
    try:
        read_notebook(path, shown)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return path


def build(root: Path = ROOT, run: bool = True) -> None:
    """Regenerate what changed; a copy whose cells already match its source keeps its outputs."""
    for src, ex, sol in targets(root):
        source_nb = read_notebook(src)
        for path, keep in ((ex, False), (sol, True)):
            rendered = render(source_nb, keep)
            if path.exists() and _sources(read_notebook(path)) == _sources(rendered):
                continue
            path.parent.mkdir(exist_ok=True)
            write_notebook(rendered, path)
            if run:
                progress(f"executing {path.relative_to(root)}")
                execute(path)


def main(argv=None) -> int:
    p = Parser(prog="notebooks", description="build and check the course notebooks")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="regenerate exercises/ and solutions/ from source/")
    b.add_argument("--no-execute", action="store_true")
    sub.add_parser("check", help="fail if generated notebooks are out of date or stored badly")
    e = sub.add_parser("execute", help="execute notebooks in place")
    e.add_argument("paths", nargs="+", type=notebook_file)
    i = sub.add_parser("images", help="redraw the static PNG of every stored Plotly figure (no kernel)")
    i.add_argument("paths", nargs="+", type=notebook_file)
    a = p.parse_args(argv)
    try:
        return _run(a)
    except OSError as err:  # a notebook that cannot be written back, a folder that cannot be made
        if isinstance(err, BrokenPipeError) or getattr(err, "on_stdout", False):
            raise  # stdout's: run() ends quietly (``| head``) or says it was stdout
        return fail(f"notebooks {a.cmd}", os_problem(err))
    except (RuntimeError, ValueError) as err:  # no Chromium (its hint), a cell that raised, a
        return fail(f"notebooks {a.cmd}", err)  # kernel that died, a stored figure that is none


def _run(a) -> int:
    if a.cmd == "build":
        build(run=not a.no_execute)
    elif a.cmd == "execute":
        for path in a.paths:
            progress(f"executing {path}")
            execute(path.resolve())
    elif a.cmd == "images":
        for path in a.paths:
            progress(f"{path}: {refresh_images(path.resolve())} static figure(s)")
    else:
        problems = check()
        print("\n".join(problems) or "course notebooks are up to date")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    run("notebooks", main)
