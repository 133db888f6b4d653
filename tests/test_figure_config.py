"""No "Share chart" (upload to Plotly's cloud) button on any figure the course draws.

plotly.js shows that button unless a figure's config says ``showSendToCloud: false``.  Each
way the course emits a figure must carry the course's config (overlap_course/figures/config.py):
the notebook renderers (a figure as a cell's value, ``fig.show()``), the explorer's
FigureWidget (notebook 05, the Voilà app), ``figures.save_html``, the website's and the slides'
HTML.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import plotly.io as pio
import pytest

from overlap_course.build import slides
from overlap_course import figures

ROOT = Path(__file__).resolve().parent.parent
MIME = "application/vnd.plotly.v1+json"
# the config as it appears in JSON or in a JavaScript object literal
NO_CLOUD = re.compile(r'"showSendToCloud":\s*false')


def _figure():
    return figures.timeline_figure(figures.load_trace("cpu_zos"))


def _no_cloud(config: dict, where: str) -> None:
    assert config.get("showSendToCloud") is False, f"{where}: config {config} leaves plotly's Share chart button on"
    assert "sendChartToCloud" in config.get("modeBarButtonsToRemove", []), f"{where}: config {config}"
    assert config.get("displaylogo") is False, f"{where}: config {config}"


@pytest.mark.parametrize("renderer", ["plotly_mimetype", "notebook_connected", "iframe", "browser"])
def test_notebook_renderers_carry_the_config(renderer):
    fig = _figure()
    if renderer == "plotly_mimetype":  # what a notebook stores and JupyterLab draws
        bundle = pio.renderers[renderer].to_mimebundle(fig.to_dict())
        _no_cloud(bundle[MIME].get("config", {}), renderer)
    else:
        config = pio.renderers[renderer].config
        _no_cloud(config or {}, renderer)


def test_explorer_widget_carries_the_config():
    explorer = figures.TimelineExplorer()
    try:
        _no_cloud(explorer.figure._config, "TimelineExplorer.figure")
    finally:
        explorer.close()


def test_save_html_carries_the_config(tmp_path):
    text = figures.save_html(_figure(), tmp_path / "f.html").read_text()
    assert NO_CLOUD.search(text), "figures.save_html's page leaves plotly's Share chart button on"


def _stored_notebook_with_figures():
    path = ROOT / "notebooks" / "03a_zos_order.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert any(MIME in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])), f"{path}: no figure"
    return nb


def _html_outputs(nb) -> list[str]:
    return [o["data"]["text/html"] for c in nb.cells for o in c.get("outputs", [])
            if "text/html" in o.get("data", {}) and "Plotly.newPlot" in o["data"]["text/html"]]


def test_slides_figures_carry_the_config():
    nb = _stored_notebook_with_figures()
    assert slides._plotly_to_html(nb) > 0
    html = _html_outputs(nb)
    assert html and all(NO_CLOUD.search(h) for h in html), "a slide's figure leaves Share chart on"


def test_site_figures_carry_the_config():
    spec = importlib.util.spec_from_file_location("site_build", ROOT / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    nb = _stored_notebook_with_figures()
    assert build.interactive_outputs(nb, "t") > 0
    html = _html_outputs(nb)
    assert html and all(NO_CLOUD.search(h) for h in html), "a site page's figure leaves Share chart on"
