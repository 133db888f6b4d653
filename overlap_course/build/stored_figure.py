"""A Plotly figure as a notebook stores it (``application/vnd.plotly.v1+json``), checked before
anything draws it: the static images (kaleido) and the slides read it as a figure, and a string
or a number there was an ``AttributeError`` or a ``KaleidoError`` traceback from deep inside
them.  One check, so that both commands refuse the same outputs in the same words."""

from __future__ import annotations

import math

from overlap_course.safe_json import quoted

__all__ = ["PLOTLY_MIME", "figure_problem", "check_figures"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: Plotly's smallest width and height (px), and the largest a stored figure may ask for: a
#: PNG of more would take Chromium's memory, a slide of more could not be seen whole.
MIN_PX, MAX_PX = 10, 10_000


def _size_problem(layout: dict) -> str | None:
    for key in ("width", "height"):
        value = layout.get(key)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not MIN_PX <= value <= MAX_PX:
            return (f"has layout.{key} {quoted(value, 40)}, not a size from {MIN_PX} to "
                    f"{MAX_PX} px")
    return None


def figure_problem(figure) -> str | None:
    """What makes ``figure`` something Plotly cannot draw, as the end of a sentence about it;
    None for a figure: an object with ``data`` (a list of trace objects) and/or ``layout``
    (an object whose width and height, if given, are sizes in px)."""
    if not isinstance(figure, dict):
        return f"is a {type(figure).__name__} ({quoted(figure, 40)}), not a figure object"
    if "data" not in figure and "layout" not in figure:
        return "has neither 'data' nor 'layout'"
    data, layout = figure.get("data", []), figure.get("layout", {})
    if not isinstance(data, list) or not all(isinstance(trace, dict) for trace in data):
        return f"has 'data' {quoted(data, 40)}, not a list of traces (objects)"
    if not isinstance(layout, dict):
        return f"has 'layout' {quoted(layout, 40)}, not an object"
    return _size_problem(layout)


def check_figures(nb, shown: str) -> None:
    """Refuse the notebook ``nb`` (named ``shown`` in the message) if one of its stored Plotly
    outputs is not a figure: ``ValueError`` naming the cell and the output, before a browser
    starts or a file is written."""
    for i, cell in enumerate(nb.cells, 1):
        outputs = cell.get("outputs", []) if cell.cell_type == "code" else []
        for j, output in enumerate(outputs, 1):
            data = output.get("data", {})
            problem = figure_problem(data[PLOTLY_MIME]) if PLOTLY_MIME in data else None
            if problem:
                raise ValueError(f"{shown}: cell {i}, output {j}: its stored Plotly figure "
                                 f"({PLOTLY_MIME}) {problem}; clear that output, or run the "
                                 f"notebook again to store the figure its cell draws")
