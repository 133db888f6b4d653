"""Slides built from the stored notebooks (overlap_course/build/slides.py) work offline.

Builds real slides (nbconvert + the npm package reveal.js, installed once into build/) and
checks that every script and style sheet they load is a local file that exists, that the
Plotly timelines became HTML drawn by the local plotly.js, and that each notebook section
became its own slide.  tests/browser/test_slides_browser.py opens them in Chromium.
"""

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from overlap_course.build import slides

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["00_start_here", "02_serial_engine"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed, so the npm package reveal.js cannot be installed: apt-get install npm")
    out = tmp_path_factory.mktemp("slides")
    return out, slides.build([REPO / "notebooks" / f"{n}.ipynb" for n in NOTEBOOKS], out)


def test_every_asset_is_local_and_present(built):
    out, written = built
    assert [p.name for p in written] == [f"{n}.slides.html" for n in NOTEBOOKS]
    for page in written:
        html = page.read_text(encoding="utf-8")
        assets = re.findall(r'<script[^>]*\ssrc="([^"]+)"', html) + re.findall(r'<link[^>]*\shref="([^"]+)"', html)
        assert "reveal.js/dist/reveal.js" in assets and "plotly.min.js" in assets
        for asset in assets:
            assert not re.match(r"(https?:)?//", asset), f"{page.name} loads {asset} from the network"
            assert (out / asset).is_file(), f"{page.name} needs {asset}, which is not in {out}"
        assert "Reveal.initialize" in html


def test_figures_become_local_plotly_html(built):
    out, written = built
    html = written[1].read_text(encoding="utf-8")  # notebook 02 draws two timelines
    stored = sum(slides.PLOTLY_MIME in o.get("data", {})
                 for c in nbformat.read(REPO / "notebooks" / "02_serial_engine.ipynb", as_version=4).cells
                 for o in c.get("outputs", []))
    assert stored >= 2
    assert html.count("Plotly.newPlot(") == stored
    assert slides.PLOTLY_MIME not in html


def test_sections_become_slides(built):
    _, written = built
    nb = nbformat.read(REPO / "notebooks" / "02_serial_engine.ipynb", as_version=4)
    sections = sum(slides.slide_type(c) == "slide" for c in nb.cells)
    html = written[1].read_text(encoding="utf-8")
    assert sections >= 6
    assert html.count('<section') >= 2 * sections  # a slide is a section holding its sub-slides


def test_slide_types_from_structure():
    md = nbformat.v4.new_markdown_cell
    code = nbformat.v4.new_code_cell
    assert slides.slide_type(md("# Title\ntext")) == "slide"
    assert slides.slide_type(md("text first\n\n## 2. A section")) == "slide"
    assert slides.slide_type(md("### A sub-heading")) == "subslide"
    assert slides.slide_type(md("plain prose")) == "subslide"
    assert slides.slide_type(code("print(1)")) == "-"
    own = md("## heading")
    own.metadata["slideshow"] = {"slide_type": "skip"}
    assert slides.slide_type(own) == "skip"
    nb = slides.with_slide_types(nbformat.v4.new_notebook(cells=[code("x = 1"), md("## A")]))
    assert [c.metadata["slideshow"]["slide_type"] for c in nb.cells] == ["slide", "slide"]


def test_cli_names_a_missing_notebook(capsys):
    with pytest.raises(SystemExit) as stop:
        slides.main(["notebooks/99_nope.ipynb"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "no such notebook: 'notebooks/99_nope.ipynb'" in err and len(err.splitlines()) == 1
