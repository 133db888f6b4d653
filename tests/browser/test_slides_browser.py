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

from overlap_course.build import slides

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


# -- issue 23: slides for a 1280x720 projector

SCREENS = REPO / "artifacts-screens"
WIDTH, HEIGHT = 1280, 720

# Every slide of the deck, one at a time: its height and width as shown (in slide pixels:
# reveal.js's scaling to the window taken out; the content's height when the slide scrolls),
# and its listings that wrap or are cut.
_MEASURE_JS = """async () => {
    const out = [];
    const cfg = Reveal.getConfig();
    for (const slide of Reveal.getSlides()) {
        const idx = Reveal.getIndices(slide);
        Reveal.slide(idx.h, idx.v);
        await new Promise(r => setTimeout(r, 60));
        const wraps = [];
        for (const pre of slide.querySelectorAll('pre')) {
            const ws = getComputedStyle(pre).whiteSpace;
            const ox = getComputedStyle(pre).overflowX;
            if (!ws.startsWith('pre') || ws === 'pre-wrap' || ws === 'pre-line')
                wraps.push('wraps (' + ws + '): ' + pre.textContent.trim().slice(0, 40));
            else if (pre.scrollWidth > pre.clientWidth + 1 && ox !== 'auto' && ox !== 'scroll')
                wraps.push('cut off: ' + pre.textContent.trim().slice(0, 40));
        }
        const r = slide.getBoundingClientRect(), scale = Reveal.getScale();
        const scrolls = slide.scrollHeight > slide.clientHeight + 1;  // content hidden below the fold
        out.push({h: idx.h, v: idx.v, height: scrolls ? slide.scrollHeight : Math.round(r.height / scale),
                  width: Math.round(r.width / scale),
                  cfgHeight: cfg.height, cfgWidth: cfg.width, wraps,
                  text: (slide.textContent || '').trim().slice(0, 50)});
    }
    return out;
}"""


def _decks(tmp_path):
    return slides.build(None, tmp_path)


def test_every_slide_of_every_deck_fits_1280x720(chromium, tmp_path):
    page = chromium.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    too_big, wraps, titles, counts = [], [], [], {}
    try:
        for deck in _decks(tmp_path):
            page.goto(deck.as_uri())
            page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=30_000)
            page.wait_for_timeout(500)
            title = page.title()
            stem = deck.name.split(".")[0]
            if stem in title or "_" in title or not title.strip():
                titles.append(f"{deck.name}: title {title!r} is a file name")
            measured = page.evaluate(_MEASURE_JS)
            counts[stem] = len(measured)
            for m in measured:
                where = f"{stem} slide {m['h']}.{m['v']} ({m['text']!r})"
                if m["cfgWidth"] != WIDTH or m["cfgHeight"] != HEIGHT:
                    too_big.append(f"{stem}: slides are {m['cfgWidth']}x{m['cfgHeight']}, not {WIDTH}x{HEIGHT}")
                    break
                if m["height"] > HEIGHT + 1 or m["width"] > WIDTH + 1:
                    too_big.append(f"{where}: {m['width']}x{m['height']} px")
                wraps += [f"{where}: {w}" for w in m["wraps"]]
            if stem == "03a_zos_order":
                SCREENS.mkdir(exist_ok=True)
                page.evaluate("""() => { const figs = Array.from(document.querySelectorAll('.js-plotly-plot'));
                    const gd = figs.find(g => /order view/.test(JSON.stringify((g.layout || {}).title || ''))) || figs[0];
                    const idx = Reveal.getIndices(gd.closest('section')); Reveal.slide(idx.h, idx.v); }""")
                page.wait_for_timeout(800)
                page.screenshot(path=str(SCREENS / "slides_03a_order_view_1280x720.png"))
    finally:
        page.close()
    print(f"slides per deck: {counts}")
    problems = []
    if titles:
        problems.append("deck titles:\n" + "\n".join(titles))
    if wraps:
        problems.append(f"{len(wraps)} listings that wrap or are cut:\n" + "\n".join(wraps))
    if too_big:
        problems.append(f"{len(too_big)} of {sum(counts.values())} slides larger than {WIDTH}x{HEIGHT}:\n"
                        + "\n".join(too_big))
    assert not problems, "\n\n".join(problems)
