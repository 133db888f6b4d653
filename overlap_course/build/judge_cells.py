"""How a judge process runs the submission's cells: in order, in one namespace, as the
learner's kernel ran them, IPython's own syntax included (a magic that only times or shows its
cell runs it as plain code)."""

from __future__ import annotations

import builtins

__all__ = ["run_cells"]


def run_cells(cells: list[str]) -> tuple[dict, list[str]]:
    """The submission's cells in order, as its kernel ran them: a cell that raises is noted
    and the next one runs (nbgrader runs notebooks with errors allowed)."""
    space = {"__name__": "__main__", "__builtins__": builtins, "display": lambda *a, **k: None}
    space["get_ipython"] = lambda: _Magics(space)
    notes = []
    for number, source in enumerate(cells, 1):
        try:
            exec(_compiled(source, f"<submission cell {number}>"), space)  # noqa: S102
        except BaseException as err:  # noqa: BLE001 - the kernel goes on to the next cell too
            notes.append(f"code cell {number} raised {type(err).__name__}: {str(err)[:200]}")
    return space, notes


def _compiled(source: str, name: str):
    """A cell as its kernel reads it: plain Python, or IPython's syntax (``%%time``, ``%matplotlib
    inline``) turned into calls of ``get_ipython()`` (:class:`_Magics`), so that a right answer
    under a magic is judged, not refused as a syntax error (round seven: 0 points)."""
    try:
        return compile(source, name, "exec")
    except SyntaxError:
        from IPython.core.inputtransformer2 import TransformerManager
        return compile(TransformerManager().transform_cell(source), name, "exec")


class _Magics:
    """The judge's ``get_ipython()``: magics that only time or show run their cell as plain
    code; any other (``!pip``, ``%run``, ``%%writefile``) is an error that names it."""

    CELL, LINE = {"time", "timeit", "capture", "prun"}, {"matplotlib", "load_ext", "autoreload",
                                                          "config", "time", "timeit"}

    def __init__(self, space: dict):
        self._space = space

    def run_cell_magic(self, magic: str, line: str, cell: str):
        if magic not in self.CELL:
            raise NameError(f"the judge does not run the cell magic %%{magic}: remove it")
        exec(_compiled(cell, f"<%%{magic} cell>"), self._space)  # noqa: S102

    def run_line_magic(self, magic: str, line: str, *args):
        if magic not in self.LINE:
            raise NameError(f"the judge does not run the magic %{magic}: remove it")
        if magic in ("time", "timeit"):
            exec(_compiled(line, f"<%{magic} line>"), self._space)  # noqa: S102

    def system(self, command: str, *args):
        raise NameError(f"the judge does not run shell commands (!{command[:40]}): remove it")

    getoutput = system
