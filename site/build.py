"""Build the course website from the stored notebooks, offline, without running them.

    python site/build.py [--out build/site]      # or: ./run.sh site
    python site/build.py --draw                  # redraw the stored images of the drawn pages

Sphinx + MyST-NB read a staged copy of the site (``OUT/src``) and write ``OUT/html``:

* ``site/*.md`` and ``conf.py``, and the pages kept in ``docs/`` (``DOC_PAGES``: the instructor
  guide, the map from the toy to real engines), so each is written once;
* ``notebooks/`` and ``exercises/`` as stored (outputs included, no kernel), less nbval's
  ``# NBVAL_...`` marker lines, with one change per output: a Plotly figure's JSON becomes
  a ``text/html`` form, a div plus the ``Plotly.newPlot`` call of ``plotly.io.to_html``,
  which MyST-NB places on the page, so the recorded figures stay interactive; the
  explorer's widget output, which has no state stored and needs a kernel, becomes a note
  that points to the app;
* ``plotly.min.js`` from the installed plotly package, so no page asks a CDN; ``conf.py`` loads
  it only on pages that draw a figure;
* each figure keeps the notebook's stored PNG, with alt text saying what it shows, for readers
  without JavaScript (``_static/course.css`` shows the PNG until plotly.js has drawn);
* the figures of pages that are not notebooks (:func:`drawn_figures`: "When does overlap pay?")
  drawn here from their one source into ``_generated/``, which the page includes (``conf.py``
  keeps the folder out of the documents), with the PNG stored in ``site/figures/`` (``--draw``
  redraws it, with Chromium); the PNG names the figure it shows by a digest, and a stale one
  fails the build.

Warnings fail the build (``-W``): a broken cross-reference or toctree entry is an error.
Each build replaces the folders it writes under ``OUT`` (:data:`OWNED`), and only those it
made (:func:`refuse_foreign`): ``--out`` naming a learner's own folder deletes nothing of theirs.
"""

from __future__ import annotations

import _signal  # loaded at Python's start: no import before SIGINT is held

# POSIX: a Ctrl-C while the course package imports waits for interruptible's handler
_held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(
    _signal, "pthread_sigmask") else None
from overlap_course.ctrl_c import interruptible  # noqa: E402

interruptible(__name__, "site", _held)  # first: Ctrl-C while the imports run is one line

import base64
import hashlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# Every import the build needs, here under interruptible's Ctrl-C: torch (under figures)
# swallows a KeyboardInterrupt raised while it first imports numpy, so none may import later.
import nbformat
import plotly
import plotly.io as pio
from PIL import Image

from overlap_course.build.setup_cell import read_notebook as read_stored
from overlap_course.build.stored_figure import check_figures
from overlap_course.command_line import (PATH_CHARS, FolderLost, Parser, fail,
                                         locked as lock_folder, os_problem, out_folder, run)
from overlap_course.ctrl_c import KILLS, Killed
from overlap_course.figures.config import plotly_config
from overlap_course.figures.payoff import payoff_figure, published_text
from overlap_course.safe_json import quoted, signals_held

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
NOTEBOOK_DIRS = ("notebooks", "exercises")
DOC_PAGES = ("instructor_guide.md", "real_engines.md")
DIGEST_KEY = "figure-sha256"  # a drawn page's stored PNG: the digest of the figure it shows
# The folders under OUT that each build replaces (MyST-NB writes OUT/jupyter_execute).
OWNED = ("src", "html", "doctrees", "jupyter_execute", "html.partial", "html.old")
STAMP = ".made-by-site-build"  # in each of them: the build made it, so it may replace it
DEFAULT_OUT = ROOT / "build" / "site"
NBVAL_MARKER = re.compile(r"^\s*# NBVAL_[A-Z_]+\s*$")
WIDGET_NOTE = ("<div class='admonition note'><p class='admonition-title'>Live widget</p><p>This output is an "
               "interactive widget that needs a running kernel: run the notebook in Jupyter. Without one, the "
               "timeline explorer runs as an app (<code>./run.sh explorer</code>, see <a href='../explorer_app.html'>"
               "the timeline explorer as an app</a>) and the payoff widget's figure has a page of its own "
               "(<a href='../overlap_pays.html'>when does overlap pay?</a>).</p></div>")


def live_html(fig: dict, div_id: str) -> str:
    """A figure as a div and its ``Plotly.newPlot`` call, drawn by the page's plotly.js."""
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, validate=False, div_id=div_id,
                       config=plotly_config(responsive=True))


def interactive_outputs(nb, name: str) -> int:
    """Give every Plotly output an HTML form drawn by the page's plotly.js; returns how many."""
    n = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = output.get("data", {})
            if PLOTLY_MIME in data:
                # The HTML form replaces the JSON, which MyST-NB has no renderer for (it would warn).
                fig = data.pop(PLOTLY_MIME)
                live = live_html(fig, f"figure-{name}-{n}")
                png = data.pop("image/png", None)
                if not (png is None or isinstance(png, str)
                        or isinstance(png, list) and all(isinstance(p, str) for p in png)):
                    raise ValueError(f"{name}: a stored PNG (image/png) is {quoted(png, 40)}, "
                                     f"not base64 text; clear that output, or run the notebook "
                                     f"again to store the image its cell draws")
                data["text/html"] = figure_html(live, png, alt_text(fig)) if png else live
                n += 1
            elif WIDGET_MIME in data:
                output["data"] = {"text/html": WIDGET_NOTE}
    return n


def alt_text(fig: dict) -> str:
    """What a stored figure shows, in words: its title, lanes and legend (the PNG's alt text)."""
    # a figure (check_figures); a part of another shape (a number for a title, a string for
    # the y axis) is left out of the words, as plotly.js leaves it out of the drawing
    layout = fig.get("layout", {})
    title = layout.get("title", {})
    title = title.get("text", "") if isinstance(title, dict) else title
    title = title if isinstance(title, str) else ""
    title = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", title)).split())
    names = list(dict.fromkeys(str(t["name"]) for t in fig.get("data", []) if t.get("name")))
    yaxis = layout.get("yaxis")
    ticks = yaxis.get("ticktext") if isinstance(yaxis, dict) else None
    lanes = [str(v) for v in ticks] if isinstance(ticks, list) else []
    parts = [f"Figure: {title}." if title else "Figure."]
    if lanes:
        parts.append(f"Lanes: {', '.join(lanes)}.")
    if names:
        parts.append(f"Bars and marks: {', '.join(names[:12])}{' and more' if len(names) > 12 else ''}.")
    return " ".join(parts)


def figure_html(live: str, png: str, alt: str) -> str:
    """The live figure with the notebook's stored PNG beside it: course.css shows the PNG until
    plotly.js is there to draw (JavaScript off, or plotly.js missing), then only the drawing."""
    png = "".join(png.split()) if isinstance(png, str) else "".join(png)
    return ('<div class="course-figure"><script>if (window.Plotly) '
            'document.currentScript.parentElement.classList.add("course-figure-drawn");</script>'
            f'<img class="course-figure-static" src="data:image/png;base64,{png}" alt="{html.escape(alt)}">'
            f'<div class="course-figure-live">{live}</div></div>')


def drawn_figures() -> dict[str, dict]:
    """The figures of the pages that are not notebooks, by page (``site/<page>.md``)."""
    return {"overlap_pays": payoff_figure().to_dict()}


def figure_digest(fig: dict) -> str:
    """A figure's content, hashed (Plotly's template left out, it is not ours)."""
    layout = {k: v for k, v in fig.get("layout", {}).items() if k != "template"}
    return hashlib.sha256(json.dumps({**fig, "layout": layout}, sort_keys=True, default=str).encode()).hexdigest()


def stored_image(page: str, fig: dict) -> Path:
    """The PNG stored for a drawn page's figure; missing, or drawn from another figure: a ValueError."""
    png = SITE / "figures" / f"{page}.png"
    redraw = "redraw it with `python site/build.py --draw` (needs Chromium)"
    if not png.is_file():
        raise ValueError(f"no stored image {png.relative_to(ROOT)} for site/{page}.md's figure: {redraw}")
    if Image.open(png).text.get(DIGEST_KEY) != figure_digest(fig):
        raise ValueError(f"{png.relative_to(ROOT)} shows an older version of site/{page}.md's figure: {redraw}")
    return png


def draw_stored_images() -> list[Path]:
    """Draw each drawn page's PNG as the notebooks' static figures are drawn (kaleido, Chromium,
    a 256-colour palette), with the figure's digest in a text chunk."""
    import io

    from PIL import PngImagePlugin

    from overlap_course.build.drawing import render_images, shrink_png

    figures = drawn_figures()
    paths = []
    for (page, fig), png in zip(figures.items(), render_images(list(figures.values()))):
        info = PngImagePlugin.PngInfo()
        info.add_text(DIGEST_KEY, figure_digest(fig))
        path = SITE / "figures" / f"{page}.png"
        path.parent.mkdir(exist_ok=True)
        Image.open(io.BytesIO(shrink_png(png))).save(path, format="PNG", optimize=True, pnginfo=info)
        paths.append(path)
    return paths


def draw_pages(src: Path) -> None:
    """Write each drawn page's figure (live, with its stored PNG) and, for overlap_pays, the
    published numbers into ``src/_generated/``, where the pages include them."""
    out = src / "_generated"
    out.mkdir()
    for page, fig in drawn_figures().items():
        png = stored_image(page, fig)
        (out / f"{page}_figure.html").write_text(
            figure_html(live_html(fig, f"figure-{page}"), base64.b64encode(png.read_bytes()).decode("ascii"),
                        alt_text(fig)), encoding="utf-8")
    (out / "overlap_pays_published.md").write_text(published_text("markdown"), encoding="utf-8")


def drop_test_markers(nb) -> None:
    """Remove nbval's ``# NBVAL_...`` marker lines from the code shown: they are for the tests."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = "\n".join(line for line in cell.source.splitlines() if not NBVAL_MARKER.match(line))


def read_notebook(path: Path):
    """The notebook at ``path``, read as every build command reads one (a pipe or a folder
    there, or JSON of the wrong shape such as ``{"cells": 5}``, refused, not waited on or a
    traceback): else a ValueError in one line naming it."""
    shown = str(path.relative_to(ROOT))
    try:
        return read_stored(path, shown)
    except ValueError as exc:
        raise ValueError(f"{exc}; restore it with `git checkout -- {shown}`") from None


def stored_notebooks() -> dict[Path, object]:
    """Every notebook the site shows, read before any work: a broken one is refused at once."""
    return {path: read_notebook(path) for folder in NOTEBOOK_DIRS
            for path in sorted((ROOT / folder).glob("*.ipynb"))}


def locked(out: Path) -> lock_folder:
    """OUT made and locked for this build (``command_line.locked``): without it, each
    build's :func:`fresh_folder` deleted the other's ``src/`` and ``html.partial/`` while Sphinx
    read them: the site one announced was gone."""
    return lock_folder(out, f"--out {quoted(str(out), PATH_CHARS)} is being written by another "
                            f"site build (or a trace export into it) running now: wait for it "
                            f"to end, or name another --out; nothing was changed")


def refuse_foreign(out: Path, names: tuple[str, ...] = OWNED) -> None:
    """A ValueError, before any work, if a folder the build replaces is already under ``out`` and
    an earlier build did not make it (no :data:`STAMP` in it): a learner's ``--out ~/project``
    would lose its ``src/``.  ``build/site``, the default, is the build's alone (older builds
    left no stamp there)."""
    for name in names:
        folder = out / name
        ours = folder.is_dir() and not folder.is_symlink() and (
            (folder / STAMP).is_file() or out == DEFAULT_OUT.resolve())
        if (folder.exists() or folder.is_symlink()) and not ours:
            raise ValueError(f"--out {quoted(str(out), PATH_CHARS)} already has {name}/, which "
                             f"this build did not make (no {STAMP} in it) and would replace: "
                             f"name a new or empty folder, e.g. --out build/site, or move "
                             f"{name}/ away; nothing was deleted")


def refuse_inside_site(out: Path) -> None:
    """A ValueError, before any work, for an ``out`` (resolved) that is ``site/`` or under it:
    the build copies ``site/`` into ``out/src``, which would then lie inside what it copies
    (copytree went on copying its own copy, 499 folders deep, until a RecursionError)."""
    site = SITE.resolve()
    if out == site or site in out.parents:
        raise ValueError(f"--out {quoted(str(out), PATH_CHARS)} is site/ or inside it, which "
                         f"the build copies into OUT/src: it would copy its own output into "
                         f"itself; name a folder outside site/, e.g. --out build/site")


def fresh_folder(out: Path, name: str) -> Path:
    """``out/name`` empty and stamped as the build's: an older one removed if the build made it."""
    refuse_foreign(out, (name,))
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()  # not OUT too: removed under the build's lock, it is another's to make
    (folder / STAMP).write_text("made by site/build.py (./run.sh site), which replaces this folder "
                                "on each build\n", encoding="utf-8")
    return folder


def stage(out: Path, stored: dict | None = None) -> Path:
    """Lay out the Sphinx source folder under ``out/src`` (replacing an older one) from the
    stored notebooks (:func:`stored_notebooks`, read here if not given)."""
    stored = stored_notebooks() if stored is None else stored
    src = fresh_folder(out, "src")
    shutil.copytree(SITE, src, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("build.py", "__pycache__", "_build", "figures"))
    for name in DOC_PAGES:
        shutil.copy(ROOT / "docs" / name, src / name)
    static = src / "_static"
    static.mkdir(exist_ok=True)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", static / "plotly.min.js")
    for folder in NOTEBOOK_DIRS:
        (src / folder).mkdir()
    for path, nb in stored.items():
        folder = path.parent.name
        check_figures(nb, str(path.relative_to(ROOT)))  # as slides and images refuse them
        interactive_outputs(nb, f"{folder}-{path.stem}")
        drop_test_markers(nb)
        nbformat.write(nb, src / folder / path.name)
    draw_pages(src)
    return src


def sphinx(cmd: list[str]) -> None:
    """Run Sphinx in a process group of its own: Ctrl-C reaches the build alone, which stops
    Sphinx and says so in one line (Sphinx would add its own "Interrupted!").  A SIGTERM or
    SIGHUP to the build is passed on to Sphinx's group and waited for, then the build ends by
    it as every command does: sent to the build's group only, it left Sphinx running as an
    orphan, writing ``OUT/html.partial``.  Raises ``CalledProcessError`` if Sphinx fails,
    :class:`Killed` once a signal has ended it."""
    got, proc = [], None

    def forward(signum, frame):
        got.append(signum)
        if proc is not None:
            _signal_group(proc.pid, signum)

    before = {sig: signal.signal(sig, forward) for sig in KILLS}
    try:
        proc = subprocess.Popen(cmd, process_group=0)
        if got:  # before Popen returned: Sphinx has not had it
            _signal_group(proc.pid, got[0])
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C: Sphinx is stopped, not waited for to the end
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if got:
        raise Killed(got[0])
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def _signal_group(pgid: int, signum: int) -> None:
    """``signum`` to the process group ``pgid``, if any of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def build(out: Path, stored: dict | None = None, held=lambda: None) -> Path:
    """Stage and build; returns the folder of index.html.  Sphinx writes ``OUT/html.partial``,
    which replaces ``OUT/html`` only once it is whole: a Ctrl-C, a kill or a failure keeps the
    earlier site (``fresh_folder`` of ``html`` deleted it before Sphinx began).  ``held``
    raises if OUT is no longer the folder locked (``locked.still_held``): nothing is renamed."""
    src = stage(out, stored)
    new, doctrees = fresh_folder(out, "html.partial"), fresh_folder(out, "doctrees")
    fresh_folder(out, "jupyter_execute")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
           "-d", str(doctrees), str(src), str(new)]
    try:
        sphinx(cmd)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    held()  # before html.old goes: in an OUT made again, it is another build's
    html, old = out / "html", out / "html.old"  # html.old: left by a kill; ours (main)
    if old.exists():
        shutil.rmtree(old)
    earlier = html.exists()
    try:
        with signals_held():  # both renames or neither, a kill too: never a site missing between
            held()
            if earlier:
                os.replace(html, old)
            os.replace(new, html)
    finally:  # the new site in place: the earlier one goes, a kill held above arriving or not
        if earlier and not new.exists():
            shutil.rmtree(old, ignore_errors=True)
    return html


def main(argv=None) -> int:
    p = Parser(prog="site", description="build the course website from the stored notebooks")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default build/site)")
    p.add_argument("--draw", action="store_true",
                   help="redraw the stored images of the pages build.py draws (site/figures/), then stop")
    a = p.parse_args(argv)
    if a.draw:
        try:  # no Chromium, or a BROWSER_PATH that names another program: one line
            drawn = draw_stored_images()
        except (RuntimeError, ValueError) as exc:
            return fail("site", exc)
        print("site: drew " + ", ".join(str(path.relative_to(ROOT)) for path in drawn))
        return 0
    start = time.monotonic()
    try:  # bad input: one line and exit 2, before any work
        out = out_folder(a.out).resolve()
        refuse_inside_site(out)
        refuse_foreign(out)
        stored = stored_notebooks()
        lock = locked(out)
    except ValueError as exc:
        return fail("site", exc)
    try:
        with lock:  # a build that failed leaves no --out folder it made (empty) behind
            html = build(out, stored, lambda: lock.still_held("--out"))
    except FolderLost as exc:  # removed or replaced under the build: another's now
        return fail("site", exc)
    except OSError as exc:
        if exc.filename2:  # a copy (shutil): the second file is the one being written
            return fail("site", f"cannot copy {quoted(str(exc.filename), PATH_CHARS)} to "
                                f"{quoted(str(exc.filename2), PATH_CHARS)}: {exc.strerror}")
        return fail("site", os_problem(exc))
    except subprocess.CalledProcessError as exc:
        print(f"site: sphinx-build failed (exit {exc.returncode}); its warnings are above", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"site: {exc}", file=sys.stderr)
        return 1
    print(f"site: {html / 'index.html'} built in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    run("site", main)
