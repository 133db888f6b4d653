"""The one Plotly configuration of every figure the course draws: notebooks (the renderers and the
explorer's FigureWidget), standalone HTML (``viz.save_html``), the website and the slides.

plotly.js 3+ puts a "Share chart" button (``sendChartToCloud``) in every figure's mode bar by
default (``showSendToCloud`` defaults to true); pressed, it uploads the figure's data to
Plotly's cloud service.  Course data should not leave the machine on one click, and a room
without internet gains nothing from it, so it is off everywhere, with the Plotly logo link.
"""

from __future__ import annotations

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
    course's, so ``fig.show()`` and a figure as a cell's value carry it."""
    import plotly.io as pio

    for name in list(pio.renderers):
        renderer = pio.renderers[name]
        if hasattr(renderer, "config"):
            renderer.config = {**(renderer.config or {}), **plotly_config()}
