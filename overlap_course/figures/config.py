"""The one Plotly configuration of every figure the course draws: notebooks (the renderers and the
explorer's FigureWidget), standalone HTML (:func:`save_html`), the website and the slides.

plotly.js 3+ puts a "Share chart" button (``sendChartToCloud``) in every figure's mode bar by
default (``showSendToCloud`` defaults to true); pressed, it uploads the figure's data to
Plotly's cloud service.  Course data should not leave the machine on one click, and a room
without internet gains nothing from it, so it is off everywhere, with the Plotly logo link.
"""

from __future__ import annotations

from pathlib import Path

#: The static copy stored beside every figure (``overlap_course.build.notebooks``) is drawn this size
#: when the figure sets none: about JupyterLab's notebook column, so 900 px is the narrowest any
#: figure is drawn (at kaleido's default 700 px the timelines' subtitles were cut off).
STATIC_WIDTH_PX, STATIC_HEIGHT_PX = 900, 450

PLOTLY_CONFIG = {
    "showSendToCloud": False,
    "modeBarButtonsToRemove": ["sendChartToCloud"],
    "displaylogo": False,
}


def plotly_config(**extra) -> dict:
    """A fresh copy of :data:`PLOTLY_CONFIG`, with ``extra`` options (e.g. ``responsive=True``)."""
    config = {k: list(v) if isinstance(v, list) else v for k, v in PLOTLY_CONFIG.items()}
    config.update(extra)
    return config


def configure_renderers() -> None:
    """Give every plotly.io renderer that takes a config (notebook JSON, HTML, iframe, browser) the
    course's, so ``fig.show()`` and a figure as a cell's value carry it; in a notebook, send
    figures as plotly JSON only.

    Plotly's notebook default also embeds plotly.js (~5 MB) into every notebook that shows a
    figure.  JupyterLab renders the JSON through the jupyterlab-plotly extension that ships
    with plotly, so the course's notebooks stay small.
    """
    import plotly.io as pio

    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and "IPKernelApp" in shell.config:
        pio.renderers.default = "plotly_mimetype"
    for name in list(pio.renderers):
        renderer = pio.renderers[name]
        if hasattr(renderer, "config"):
            renderer.config = {**(renderer.config or {}), **plotly_config()}


def save_html(fig, path) -> Path:
    """Write a standalone HTML page with plotly.js inlined (works offline, no CDN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True, include_mathjax=False, config=plotly_config())
    return path
