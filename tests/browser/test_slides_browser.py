"""The workshop slides in a real browser, offline: Chromium opens build output from file://.

tests/test_slides.py checks the files; this checks what a projector shows: reveal.js starts
(``Reveal.isReady()``), the deck has one slide per section, the Plotly timelines are drawn
(host and device lanes present as SVG), and the page asks the network for nothing (every
request is a file:// URL).  Screenshots go to ``artifacts/browser/``.

Needs ``bash scripts/install_browser.sh`` and npm (for reveal.js); skipped without Chromium
or Playwright unless ``REQUIRE_BROWSER_TEST=1``.
"""

from __future__ import annotations

from pathlib import Path

from toy_engine import slides

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"


def test_slides_run_offline_in_chromium(chromium, tmp_path):
    page_file = slides.build([REPO / "notebooks" / "02_serial_engine.ipynb"], tmp_path)[0]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    remote, errors = [], []
    page = chromium.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.on("request", lambda req: None if req.url.startswith(("file://", "data:", "about:"))
                else remote.append(req.url))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(page_file.as_uri())
        page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=30_000)
        total = page.evaluate("Reveal.getTotalSlides()")
        page.screenshot(path=str(ARTIFACTS / "slides_02_title.png"))
        # go to the first slide that holds a timeline and check it was drawn
        page.evaluate("""() => {
            const plot = document.querySelector('.js-plotly-plot');
            const slide = plot.closest('section');
            const idx = Reveal.getIndices(slide);
            Reveal.slide(idx.h, idx.v);
        }""")
        page.wait_for_timeout(500)
        drawn = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
            .map(p => p.querySelectorAll('.main-svg .bars path, .main-svg .trace').length)""")
        lanes = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot .ytick text'))
            .map(t => t.textContent)""")
        page.screenshot(path=str(ARTIFACTS / "slides_02_timeline.png"))
    finally:
        page.close()
    assert not errors, errors
    assert not remote, f"the slides asked the network for {remote[:5]}"
    assert total >= 8, f"only {total} slides"
    assert len(drawn) >= 2 and all(n > 0 for n in drawn), drawn
    assert "host" in lanes and "device" in lanes, lanes
