"""The course website: built offline from the stored notebooks, read in Chromium.

``site/build.py`` (``./run.sh site``) is run into a temporary folder and the result is
served on a loopback port.  Then, for every page reachable from the index: no console
or page error, no request leaves loopback (plotly.js and the theme come with the site),
every internal link and anchor resolves, and each page draws as many Plotly figures as its
stored notebook holds, or as build.py draws for it (``drawn_figures``), each an SVG with bars
or markers, of a real size.  One figure is hovered to show it is interactive.  The build must
not run the notebooks: each page shows the stored outputs verbatim (timings differ on every
run).  Screenshots of the index and of notebook 03a go to ``artifacts/browser/``.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import re
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import nbformat
import pytest

from overlap_course.build import notebooks as course

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"
BUILD_TIMEOUT_S = 300
PAGES = [Path(d) / p.name for d in ("notebooks", "exercises") for p in sorted((REPO / d).glob("*.ipynb"))]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built by site/build.py, served on 127.0.0.1."""
    out = tmp_path_factory.mktemp("site")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "site" / "build.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, f"site build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    print(f"site built in {seconds:.1f} s")
    root = out / "html"
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield dict(root=root, base=f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.shutdown()
        server.server_close()


def _page_text(path: Path) -> str:
    text = html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))
    return " ".join(text.split())


def _stored_stream_lines(nb_path: Path) -> list[str]:
    """Output lines with numbers in them: a re-run would print other timings or values."""
    nb = nbformat.read(nb_path, as_version=4)
    lines = []
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.output_type == "stream":
                lines += [" ".join(line.split()) for line in output.text.splitlines()
                          if re.search(r"\d\.\d", line) and len(line.strip()) > 12]
    return lines


def test_every_notebook_and_exercise_has_a_page_with_its_stored_outputs(site):
    missing = [str(p) for p in PAGES if not (site["root"] / p.with_suffix(".html")).is_file()]
    assert not missing, f"no page for {missing}"
    checked = 0
    for rel in PAGES:
        lines = _stored_stream_lines(REPO / rel)
        text = _page_text(site["root"] / rel.with_suffix(".html"))
        absent = [line for line in lines if line not in text]
        assert not absent, (f"{rel}: stored output lines missing from its page (was the notebook re-run?): "
                            f"{absent[:3]}")
        checked += len(lines)
    assert checked >= 10, f"only {checked} stored output lines with numbers found to compare"


_PLOTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
    const r = gd.getBoundingClientRect();
    return {id: gd.id, traces: (gd.data || []).length, svgTraces: gd.querySelectorAll('g.trace').length,
            marks: gd.querySelectorAll('g.point path, g.points path.point').length, width: r.width,
            height: r.height};
})"""


def _wait_plots(page, expected: int, timeout_s: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        plots = page.evaluate(_PLOTS_JS)
        drawn = [p for p in plots if p["traces"] and p["svgTraces"] >= p["traces"] and p["marks"] > 0]
        if len(drawn) >= expected or time.monotonic() > deadline:
            return plots
        page.wait_for_timeout(250)


def _ids(path: Path) -> set[str]:
    return set(re.findall(r"\bid=\"([^\"]+)\"", path.read_text()))


def _check_links(site, url: str, hrefs: list[str], broken: list[str]) -> set[str]:
    """Internal pages linked from url (broken targets and anchors go to `broken`)."""
    pages = set()
    for href in hrefs:
        target = urlparse(urljoin(url, href))
        if target.scheme not in ("http", "https") or f"{target.scheme}://{target.netloc}/" != site["base"]:
            continue
        rel = unquote(target.path).lstrip("/") or "index.html"
        file = site["root"] / rel
        if file.is_dir():
            file = file / "index.html"
        if not file.is_file():
            broken.append(f"{url} -> {href} (no {rel})")
            continue
        if target.fragment and file.suffix == ".html" and target.fragment not in _ids(file):
            broken.append(f"{url} -> {href} (no id {target.fragment!r} in {rel})")
        if file.suffix == ".html":
            pages.add(str(file.relative_to(site["root"])))
    return pages


def test_site_in_chromium_draws_figures_links_resolve_no_errors(site, watched):
    page = watched.page
    todo, seen, broken, report = ["index.html"], set(), [], {}
    while todo:
        rel = todo.pop()
        if rel in seen or rel in ("genindex.html", "search.html"):
            continue
        seen.add(rel)
        url = site["base"] + rel
        page.goto(url, wait_until="load")
        expected = len(_stored_figures(rel))
        plots = _wait_plots(page, expected)
        report[rel] = len(plots)
        assert len(plots) == expected, f"{rel}: {len(plots)} Plotly figures on the page, {expected} stored: {plots}"
        for p in plots:
            assert p["traces"] > 0 and p["marks"] > 0, f"{rel}: figure {p['id']} has no drawn bars or markers: {p}"
            assert p["svgTraces"] >= p["traces"], f"{rel}: figure {p['id']} traces not all in the SVG: {p}"
            assert p["width"] > 300 and p["height"] > 150, f"{rel}: figure {p['id']} drawn too small: {p}"
        hrefs = page.evaluate("() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        todo += sorted(_check_links(site, url, hrefs, broken) - seen)
    assert not broken, "broken internal links:\n" + "\n".join(broken)
    unseen = [str(p.with_suffix(".html")) for p in PAGES if str(p.with_suffix(".html")) not in seen]
    assert not unseen, f"pages not reachable from the index: {unseen}"
    assert {"setup.html", "instructor_guide.html", "explorer_app.html"} <= seen, sorted(seen)
    assert sum(report.values()) >= 8, f"figures per page: {report}"
    assert not watched.external, f"requests that left loopback (the site must work offline): {watched.external}"
    assert not watched.errors, "console / page errors:\n" + "\n".join(watched.errors)


def test_site_figure_is_interactive(site, watched):
    """Hovering a bar shows Plotly's hover label (plotly.js is live, not a picture)."""
    page = watched.page
    page.goto(site["base"] + "notebooks/03a_zos_order.html", wait_until="load")
    plots = _wait_plots(page, 1)
    assert plots, "notebooks/03a_zos_order.html has no Plotly figure"
    figure = page.locator(".js-plotly-plot").first
    figure.scroll_into_view_if_needed()
    # The widest bar: the first one is often a `schedule` sliver (~0.01 ms, under 3 px), which
    # hovers or not depending on its neighbours in that run's timings.
    bars = figure.locator("g.point path")
    boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
    box = max((b for b in boxes if b), key=lambda b: b["width"], default=None)
    assert box and box["width"] > 0, f"no bar of the first figure has a size on the page: {boxes[:5]}"
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(".js-plotly-plot .hoverlayer .hovertext", timeout=10_000)
    label = figure.locator(".hoverlayer .hovertext").first.text_content()
    assert "round" in label and "ms" in label, f"hover label: {label!r}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "site_03a_zos_order.png"))
    page.goto(site["base"] + "index.html", wait_until="load")
    page.screenshot(path=str(ARTIFACTS / "site_index.png"), full_page=True)
    assert not watched.errors, "console / page errors:\n" + "\n".join(watched.errors)


# -- issue 23: the site in a room (JavaScript off, plotly.js only where needed, titles, narrow screens)

COURSE = "Overlap the Pipeline"
SCREENS = REPO / "artifacts-screens"


def _site_pages(site) -> list[str]:
    return sorted(str(p.relative_to(site["root"])) for p in site["root"].rglob("*.html")
                  if not p.relative_to(site["root"]).parts[0].startswith("_")
                  and p.name not in ("genindex.html", "search.html"))


@functools.cache
def _drawn_figures() -> dict[str, dict]:
    """The figures site/build.py draws for pages that are not notebooks, by page."""
    spec = importlib.util.spec_from_file_location("site_build", REPO / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build.drawn_figures()


def _stored_figures(rel: str) -> list[dict]:
    stored = REPO / Path(rel).with_suffix(".ipynb")
    if not stored.is_file():
        drawn = _drawn_figures()
        return [drawn[Path(rel).stem]] if len(Path(rel).parts) == 1 and Path(rel).stem in drawn else []
    return [o["data"][course.PLOTLY_MIME] for o in course.figure_outputs(nbformat.read(stored, as_version=4))]


def _title_text(fig: dict) -> str:
    title = fig.get("layout", {}).get("title", {})
    text = title.get("text", "") if isinstance(title, dict) else str(title)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def test_site_without_javascript_shows_the_stored_pngs_with_alt_text(site, chromium):
    """JavaScript off (or plotly.js missing): every figure is the notebook's stored PNG, visible,
    with alt text that names what it shows (the figure's title)."""
    context = chromium.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 720})
    page = context.new_page()
    outside = []
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(site["base"])
               else (outside.append(route.request.url), route.abort()))
    problems, checked = [], 0
    try:
        for rel in _site_pages(site):
            figures = _stored_figures(rel)
            if not figures:
                continue
            page.goto(site["base"] + rel, wait_until="load")
            shown = []
            for img in page.locator("article img").all():
                box = img.bounding_box()
                if not img.is_visible() or not box or box["width"] < 300 or box["height"] < 150:
                    continue
                loaded = img.evaluate("i => i.complete && i.naturalWidth > 0")
                shown.append((img.get_attribute("alt") or "", loaded))
            if len(shown) != len(figures):
                problems.append(f"{rel}: {len(shown)} figure-sized images visible without JavaScript, "
                                f"{len(figures)} figures stored")
                continue
            for (alt, loaded), fig in zip(shown, figures):
                title = _title_text(fig)
                if not loaded:
                    problems.append(f"{rel}: the image for {title!r} did not load")
                if len(alt) < 20 or (title and title not in " ".join(alt.split())):
                    problems.append(f"{rel}: alt text {alt!r} does not say what the figure shows ({title!r})")
                checked += 1
            if rel == "notebooks/03a_zos_order.html":
                SCREENS.mkdir(exist_ok=True)
                page.locator("article img[alt]").first.scroll_into_view_if_needed()
                page.screenshot(path=str(SCREENS / "site_03a_no_javascript_1280x720.png"))
    finally:
        context.close()
    assert not problems, "\n".join(problems)
    assert checked >= 8, f"only {checked} figures checked"
    assert not outside, f"requests that left the site: {outside[:5]}"


def test_site_loads_plotly_only_on_pages_with_figures(site, watched):
    page = watched.page
    loaded: list[str] = []
    page.on("request", lambda req: "plotly" in req.url.rsplit("/", 1)[-1] and loaded.append(req.url))
    wrong = []
    for rel in _site_pages(site):
        loaded.clear()
        page.goto(site["base"] + rel, wait_until="load")
        figures = len(_stored_figures(rel))
        if bool(loaded) != bool(figures):
            wrong.append(f"{rel}: {figures} figures, plotly.js requested: {loaded or 'no'}")
    assert not wrong, "\n".join(wrong)


def test_site_page_titles_name_the_course_once(site, watched):
    page = watched.page
    wrong = []
    for rel in _site_pages(site):
        page.goto(site["base"] + rel, wait_until="domcontentloaded")
        title = page.title()
        if title.count(COURSE) != 1 or not title.strip():
            wrong.append(f"{rel}: {title!r}")
    assert not wrong, "page titles that do not name the course exactly once:\n" + "\n".join(wrong)


# For each table and code listing in the article: the box that scrolls it (itself or an ancestor
# with overflow-x auto/scroll) lies inside the article column and the window; without such a box,
# the element itself must fit (no content past its edge).
_FIT_JS = """() => {
    const article = document.querySelector('article.bd-article') || document.querySelector('main');
    const col = article.getBoundingClientRect();
    const right = Math.min(col.right, window.innerWidth);
    const bad = [];
    const name = el => (el.tagName.toLowerCase() + ': ' + (el.textContent || '').trim().slice(0, 50));
    for (const el of article.querySelectorAll('table, pre')) {
        const r = el.getBoundingClientRect();
        if (r.width === 0 || el.closest('.js-plotly-plot')) continue;
        let box = el;
        while (box && box !== article) {
            const o = getComputedStyle(box).overflowX;
            if (o === 'auto' || o === 'scroll') break;
            box = box.parentElement;
        }
        const scroller = box && box !== article ? box : null;
        const b = (scroller || el).getBoundingClientRect();
        if (b.right > right + 1 || b.left < col.left - 1)
            bad.push(name(el) + ' sticks out of the column (' + Math.round(b.left) + '..' + Math.round(b.right)
                     + ' px, column ' + Math.round(col.left) + '..' + Math.round(right) + ')');
        else if (!scroller && el.scrollWidth > el.clientWidth + 1)
            bad.push(name(el) + ' is cut off: ' + el.scrollWidth + ' px of content in ' + el.clientWidth);
    }
    if (document.documentElement.scrollWidth > window.innerWidth + 1)
        bad.push('the page scrolls sideways: ' + document.documentElement.scrollWidth + ' px in ' + window.innerWidth);
    return bad;
}"""


@pytest.mark.parametrize("width", [1280, 420])
def test_site_tables_and_listings_fit_the_column_or_scroll_in_their_own_box(site, chromium, width):
    context = chromium.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(site["base"])
               else route.abort())
    wrong = []
    try:
        for rel in _site_pages(site):
            page.goto(site["base"] + rel, wait_until="load")
            wrong += [f"{rel} at {width} px: {problem}" for problem in page.evaluate(_FIT_JS)]
    finally:
        context.close()
    assert not wrong, "\n".join(wrong)
