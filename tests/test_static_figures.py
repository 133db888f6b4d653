"""Every stored Plotly figure also shows without JavaScript: a PNG beside the interactive data.

A repository's notebook view, ``nbconvert --to html`` and most static viewers do not run
Plotly's renderer, so a figure stored only as ``application/vnd.plotly.v1+json`` is blank
there.  ``overlap_course.build.notebooks`` stores a PNG (kaleido driving Chromium) beside each one; these
tests check that every figure has one, that the images stay within the size budget, and
that a notebook converted to HTML with every script removed shows each figure as an image
(in Chromium with JavaScript disabled, when Chromium and Playwright are installed).

Size budget, per stored notebook (base64 PNG as stored; measured 2026-11-30):
  * one static figure <= FIGURE_BUDGET_BYTES: now 11-20 kB; issue 12's taller four-panel
    comparisons (900 x 1080 px, hatching) measure 52-58 kB;
  * a notebook's static figures together <= IMAGES_BUDGET_BYTES: now at most 79 kB
    (notebooks/03_zos, 4 figures); 176 kB with issue 12's five figures there; after
    notebook 03 was split (issue 13): 55 kB in 03a_zos_order (2 figures), 87 kB in
    03b_zos_measured (2 figures);
  * a stored notebook in all <= NOTEBOOK_BUDGET_BYTES: now 14-323 kB (03_zos: 244 kB
    before its images); 561 kB for issue 12's 03_zos with its images; after the split
    182 kB (03a) and 282 kB (03b).  (course.check() keeps its own hard limit of 1000 kB.)
"""

from __future__ import annotations

import base64
import copy
import io
import os
import re
from pathlib import Path

import nbformat
import pytest

from overlap_course.build import drawing
from overlap_course.build import notebooks as course
from overlap_course.figures.config import STATIC_WIDTH_PX

ROOT = Path(__file__).resolve().parent.parent
FIGURE_BUDGET_BYTES = 80_000
IMAGES_BUDGET_BYTES = 250_000
NOTEBOOK_BUDGET_BYTES = 700_000
REQUIRE = os.environ.get("REQUIRE_BROWSER_TEST", "") == "1"

STORED = course.stored_notebooks(ROOT)
WITH_FIGURES = [p for p in STORED if course.figure_outputs(nbformat.read(p, as_version=4))]


def _widget_outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if course.WIDGET_MIME in o.get("data", {})]


WITH_WIDGETS = [p for p in STORED if _widget_outputs(nbformat.read(p, as_version=4))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _png(output) -> "Image.Image":  # noqa: F821 - PIL is imported lazily
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(output.data["image/png"])))


def _unavailable(reason: str):
    if REQUIRE:
        pytest.fail(f"{reason} (REQUIRE_BROWSER_TEST=1; run `bash scripts/install_browser.sh`)", pytrace=False)
    pytest.skip(f"{reason}; run `bash scripts/install_browser.sh`")


def test_the_course_has_figures():
    assert len(WITH_FIGURES) >= 4, f"only {[_rel(p) for p in WITH_FIGURES]} hold Plotly figures"


def _assert_drawn(output, what: str) -> None:
    image = _png(output).convert("RGB")
    assert image.width >= 600 and image.height >= 200, f"{what} is {image.size}"
    # Drawn, not blank: many colours, and a good share of the pixels are not background.
    colours = image.getcolors(1 << 16) or []
    inked = sum(n for n, rgb in colours if min(rgb) < 235)
    assert len(colours) >= 16, f"{what} has {len(colours)} colours: is it empty?"
    assert inked > 0.05 * image.width * image.height, f"{what} is mostly blank"


@pytest.mark.parametrize("path", WITH_FIGURES, ids=_rel)
def test_every_figure_has_a_drawn_static_image(path):
    nb = nbformat.read(path, as_version=4)
    for i, output in enumerate(course.figure_outputs(nb)):
        assert "image/png" in output.data, (f"{_rel(path)}: figure {i} has no static image: run "
                                            f"`python -m overlap_course.build.notebooks images {_rel(path)}`")
        _assert_drawn(output, f"{_rel(path)}: figure {i}")


@pytest.mark.parametrize("path", WITH_WIDGETS, ids=_rel)
def test_every_widget_output_has_a_static_image_of_its_figure(path):
    """Stored without widget state, a widget draws only beside a live kernel: its output keeps a
    PNG of its figure as the run left it (notebook 05's explorer after Run All), and its text
    names it instead of ``VBox(children=...``."""
    nb = nbformat.read(path, as_version=4)
    for i, output in enumerate(_widget_outputs(nb)):
        assert "image/png" in output.data, (f"{_rel(path)}: widget output {i} has no static image: run "
                                            f"`python -m overlap_course.build.notebooks execute {_rel(path)}`")
        _assert_drawn(output, f"{_rel(path)}: widget output {i}")
        assert "VBox(" not in output.data["text/plain"], output.data["text/plain"]


def test_execute_stores_an_image_of_a_widgets_figure_as_the_run_left_it(tmp_path):
    """The build reads the explorer's figure from the run's widget state, after its last run."""
    if not os.access("/usr/bin/chromium", os.X_OK) and not os.environ.get("BROWSER_PATH"):
        _unavailable("no Chromium for kaleido")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from overlap_course import figures\n"
                                  "explorer = figures.TimelineExplorer(num_requests=2, max_new_tokens=8)\nexplorer"),
        nbformat.v4.new_code_cell("explorer.mode.value = 'serial'\nexplorer.run()\nexplorer.close()")])
    nbformat.write(nb, tmp_path / "explorer.ipynb")
    course.execute(tmp_path / "explorer.ipynb")
    nb = nbformat.read(tmp_path / "explorer.ipynb", as_version=4)
    assert "widgets" not in nb.metadata
    (output,) = nb.cells[0].outputs
    assert "image/png" in output.data and course.WIDGET_MIME in output.data
    _assert_drawn(output, "the explorer's image")  # its last run, not the empty "press Run" figure


@pytest.mark.parametrize("path", STORED, ids=_rel)
def test_stored_notebook_within_size_budget(path):
    nb = nbformat.read(path, as_version=4)
    sizes = [len(o.data.get("image/png", "")) for o in course.figure_outputs(nb)]
    big = [(i, n) for i, n in enumerate(sizes) if n > FIGURE_BUDGET_BYTES]
    assert not big, (f"{_rel(path)}: static figure(s) {big} over {FIGURE_BUDGET_BYTES} bytes: keep them "
                     f"palette PNGs ({drawing.STATIC_COLORS} colours, {STATIC_WIDTH_PX} px wide)")
    assert sum(sizes) <= IMAGES_BUDGET_BYTES, (f"{_rel(path)}: its {len(sizes)} static figures take {sum(sizes)} "
                                               f"bytes, over the {IMAGES_BUDGET_BYTES}-byte budget")
    size = path.stat().st_size
    assert size <= NOTEBOOK_BUDGET_BYTES, (f"{_rel(path)} is {size} bytes, over the {NOTEBOOK_BUDGET_BYTES}-byte "
                                           f"budget ({sum(sizes)} of it static figures)")


def _html_without_scripts(nb) -> str:
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(copy.deepcopy(nb))
    return re.sub(r"<script\b.*?</script\s*>", "", html, flags=re.S | re.I)


def _figure_images(html: str) -> int:
    return len(re.findall(r"<img\b[^>]*\bsrc=\"data:image/png;base64,", html))


@pytest.mark.filterwarnings("ignore:Your element with mimetype")  # the plotly-only output, as intended
def test_the_no_script_check_rejects_a_figure_without_image():
    nb = nbformat.read(WITH_FIGURES[0], as_version=4)
    for output in course.figure_outputs(nb):
        output.data.pop("image/png", None)
    assert _figure_images(_html_without_scripts(nb)) == 0


def test_course_check_reports_a_figure_without_image(tmp_path):
    nb = nbformat.read(WITH_FIGURES[0], as_version=4)
    course.figure_outputs(nb)[0].data.pop("image/png")
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nb, tmp_path / "notebooks" / "x.ipynb")
    problems = course.check(tmp_path)
    assert any("without a static image" in p and "build.notebooks images" in p for p in problems), problems


@pytest.fixture(scope="module")
def chromium_page():
    """A Chromium page with JavaScript disabled (None when the browser is not installed)."""
    if not os.access("/usr/bin/chromium", os.X_OK):
        yield None
        return
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        yield None
        return
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        context = browser.new_context(java_script_enabled=False, viewport={"width": 1100, "height": 900})
        page = context.new_page()
        yield page
        browser.close()


@pytest.mark.parametrize("path", WITH_FIGURES, ids=_rel)
def test_notebook_as_html_without_javascript_shows_every_figure(path, chromium_page, tmp_path):
    nb = nbformat.read(path, as_version=4)
    figures = len(course.figure_outputs(nb)) + len(_widget_outputs(nb))
    html = _html_without_scripts(nb)
    assert "<script" not in html.lower()
    assert _figure_images(html) == figures, f"{_rel(path)}: {_figure_images(html)} images for {figures} figures"
    if chromium_page is None:
        _unavailable("no Chromium + Playwright to open the script-free HTML")
    page_file = tmp_path / f"{path.stem}.html"
    page_file.write_text(html)
    chromium_page.goto(page_file.as_uri())
    shown = chromium_page.evaluate("""() => Array.from(document.querySelectorAll('img'))
        .filter(i => i.src.startsWith('data:image/png') && i.complete && i.naturalWidth >= 600)
        .map(i => i.getBoundingClientRect()).filter(r => r.width > 300 && r.height > 100).length""")
    assert shown == figures, f"{_rel(path)}: Chromium without JavaScript shows {shown} of {figures} figures"


def test_palette_png_keeps_the_figure_colours():
    """The shrunk PNG's solid areas (bars, legend swatches) keep their colours within 12/255."""
    if not os.access("/usr/bin/chromium", os.X_OK) and not os.environ.get("BROWSER_PATH"):
        _unavailable("no Chromium for kaleido")
    import numpy as np
    from PIL import Image

    figure = course.figure_outputs(nbformat.read(WITH_FIGURES[0], as_version=4))[0].data[course.PLOTLY_MIME]
    (raw,) = drawing.render_images([figure])
    small = drawing.shrink_png(raw)
    assert len(small) < 0.6 * len(raw), f"palette PNG {len(small)} bytes vs kaleido's {len(raw)}"
    a = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")).reshape(-1, 3).astype(int)
    b = np.asarray(Image.open(io.BytesIO(small)).convert("RGB")).reshape(-1, 3).astype(int)
    colours, index, counts = np.unique(a, axis=0, return_inverse=True, return_counts=True)
    error = np.abs(a - b).max(axis=1)
    index = index.ravel()
    worst = max(int(error[index == k].max()) for k in np.nonzero(counts >= 40)[0])
    assert worst <= 12, f"a colour filling >= 40 px moved by {worst}/255 in the palette PNG"
