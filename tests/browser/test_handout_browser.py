"""The "three rounds" handout as it prints: one A4 landscape page, figures drawn, nothing fetched.

tests/test_handout.py checks what the page says; this takes the built page and the PDF that
Chromium printed (the ``built_handout`` fixture), checks the PDF has exactly one A4-landscape
page, then opens the HTML in Chromium with print styles at the paper's size: the four
figures are loaded, drawn (not blank), inside the page and not clipped, and no request
leaves the machine.
A screenshot goes to ``artifacts/browser/handout.png``.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"
A4_LANDSCAPE_PT = (841.9, 595.3)
A4_LANDSCAPE_PX = (1123, 794)  # 297 x 210 mm at 96 px per inch


def _pdf_pages(pdf: bytes) -> tuple[int, list[tuple[float, float]]]:
    """(page objects, media box sizes) of a PDF; Chromium writes both uncompressed."""
    pages = len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf))
    boxes = [(float(x1) - float(x0), float(y1) - float(y0)) for x0, y0, x1, y1 in
             re.findall(rb"/MediaBox\s*\[\s*([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*\]", pdf)]
    return pages, boxes


def test_handout_prints_one_page_with_its_figures(chromium, built_handout):
    page_file, pdf_file = built_handout
    pages, boxes = _pdf_pages(pdf_file.read_bytes())
    assert pages == 1, f"the handout printed {pages} pages"
    assert boxes and all(abs(w - A4_LANDSCAPE_PT[0]) < 2 and abs(h - A4_LANDSCAPE_PT[1]) < 2 for w, h in boxes), boxes

    context = chromium.new_context(viewport=dict(zip(("width", "height"), A4_LANDSCAPE_PX)))
    remote, errors = [], []
    try:
        page = context.new_page()
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:", "about:"))
                   else (remote.append(route.request.url), route.abort()))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
        page.emulate_media(media="print")
        page.goto(page_file.as_uri())
        page.wait_for_function("Array.from(document.images).every(i => i.complete)")
        geometry = page.evaluate("""() => {
            const box = r => ({top: r.top, bottom: r.bottom, left: r.left, right: r.right});
            const sheet = document.querySelector('.page');
            return {page: box(sheet.getBoundingClientRect()),
                    images: Array.from(document.images).map(i => ({loaded: i.naturalWidth > 0, ...box(i.getBoundingClientRect())})),
                    content: Array.from(sheet.querySelectorAll('figure, h2, p, ol, table')).map(e => box(e.getBoundingClientRect()))};
        }""")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = page.screenshot(path=str(ARTIFACTS / "handout.png"), full_page=True)
    finally:
        context.close()
    assert not remote, f"the handout asked the network for {remote[:5]}"
    assert not errors, errors
    sheet = geometry["page"]
    for element in geometry["content"]:  # .page hides overflow: anything past it would be cut off in print
        assert element["bottom"] <= sheet["bottom"] + 0.5 and element["right"] <= sheet["right"] + 0.5, (element, sheet)
    images = geometry["images"]
    assert len(images) == 4 and all(i["loaded"] for i in images), images  # 3 order views + the real trace
    screenshot = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"))
    for image in images:
        crop = screenshot[int(image["top"]):int(image["bottom"]), int(image["left"]):int(image["right"])].reshape(-1, 3)
        inked = float((crop.min(axis=1) < 200).mean())
        colours = len(np.unique(crop, axis=0))
        assert inked > 0.10 and colours > 20, f"a figure looks blank: {inked:.0%} inked, {colours} colours"
