"""Slides from the course notebooks, for projecting in a workshop: works offline.

    python -m overlap_course.build.slides                 # every notebook -> build/slides/*.slides.html
    python -m overlap_course.build.slides notebooks/02_serial_engine.ipynb --out /tmp/s

The slides are nbconvert's reveal.js export of the *stored* notebooks (outputs as tested by
nbval), with three changes that make them work in a room without internet:

* reveal.js is the npm package ``reveal.js@REVEAL_VERSION``, installed once with npm into
  ``build/`` and copied next to the slides, instead of nbconvert's default CDN address;
* the Plotly timelines are drawn by the ``plotly.min.js`` that the plotly Python package
  ships, copied next to the slides (the notebooks store figure data only);
* the template (``slides.html.j2``) loads nothing else: no jQuery, require.js, MathJax or
  mermaid from a CDN.

Each cell's slide is its ``slideshow.slide_type`` metadata (JupyterLab: property inspector).
A cell without it gets one from the notebook's structure -- a markdown cell with a ``#`` or
``##`` heading starts a slide, any other markdown cell a sub-slide below it, and code cells
join the prose above them -- so notebooks without slide metadata still make sensible slides.
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "slides")  # first: Ctrl-C while the imports run is one line

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

from overlap_course.build.notebooks import notebook_file
from overlap_course.build.setup_cell import read_notebook
from overlap_course.build.stored_figure import PLOTLY_MIME, check_figures
from overlap_course.command_line import PATH_CHARS, Parser, fail, os_problem, out_folder, run
from overlap_course.figures.config import plotly_config
from overlap_course.safe_json import (clipped, quoted, refuse_unwritable, write_file,
                                      write_whole)

ROOT = Path(__file__).resolve().parents[2]
REVEAL_VERSION = "5.2.1"
TEMPLATE = Path(__file__).with_name("slides.html.j2")
COURSE = "Overlap the Pipeline"
SLIDE_WIDTH, SLIDE_HEIGHT = 1280, 720  # a projector's 720p: every slide is laid out at this size


def deck_title(nb, path: Path) -> str:
    """The deck's title: the notebook's first heading and the course's name, not the file name."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return f"{line[2:].strip()} — {COURSE}"
    return f"{path.stem} — {COURSE}"


#: The slide types reveal.js export knows (JupyterLab's property inspector offers these).
SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")


def check_slide_metadata(nb, shown: str) -> None:
    """Refuse, before anything is written, a cell whose ``slideshow`` metadata nbformat lets
    through but :func:`slide_type` cannot read: not an object, or a ``slide_type`` that is
    not one of :data:`SLIDE_TYPES` (null and "" mean none, as when it is absent)."""
    for i, cell in enumerate(nb.cells, 1):
        show = cell.get("metadata", {}).get("slideshow", {})
        kind = show.get("slide_type") if isinstance(show, dict) else None
        if not isinstance(show, dict):
            field, value, fix = "slideshow", show, 'an object such as {"slide_type": "slide"}'
        elif kind not in (None, "", *SLIDE_TYPES):
            field, value, fix = "slideshow.slide_type", kind, f"one of {', '.join(SLIDE_TYPES)}"
        else:
            continue
        raise ValueError(f"{shown}: cell {i}: its metadata.{field} is "
                         f"{clipped(json.dumps(value), 40)}, which must be {fix}, or absent "
                         f"(JupyterLab: property inspector, Slide Type); nothing was written")


def slide_type(cell) -> str:
    """The cell's slide type: its own metadata, else derived from headings."""
    own = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
    if own:
        return own
    if cell.cell_type == "markdown":
        lines = [line.lstrip() for line in cell.source.splitlines()]
        if any(line.startswith(("# ", "## ")) for line in lines):
            return "slide"
        return "subslide"  # one screenful of prose; the code cells after it join it
    return "-"


def with_slide_types(nb):
    """A copy of ``nb`` in which every cell has slideshow metadata (the first cell starts a slide)."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        kind = slide_type(cell)
        if i == 0 and kind in ("-", "fragment"):
            kind = "slide"
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
    return nb


# A slide's content budget at 1280x720 (reveal.js keeps a margin), and rough heights in slide
# pixels of what a cell shows, at the template's font sizes (slides.html.j2).
SLIDE_BUDGET_PX = 600
_PROSE_LINE_PX, _PROSE_CHARS, _HEADING_PX, _TABLE_ROW_PX = 40, 80, 75, 40
_CODE_LINE_PX, _OUTPUT_LINE_PX, _BOX_PX = 19, 17, 20


def _cell_height(cell) -> float:
    """Roughly how tall a cell is on a slide (prose wraps; listings do not: they scroll)."""
    if cell.cell_type == "markdown":
        height = 0.0
        for line in cell.source.splitlines():
            if line.lstrip().startswith("#"):
                height += _HEADING_PX
            elif line.lstrip().startswith("|"):
                height += _TABLE_ROW_PX
            elif not line.strip():
                height += 10
            else:
                height += _PROSE_LINE_PX * max(1, -(-len(line) // _PROSE_CHARS))
        return height
    if cell.cell_type != "code":
        return 0.0
    lines = [line for line in cell.source.splitlines() if not line.startswith("# NBVAL_")]
    height = _CODE_LINE_PX * len(lines) + _BOX_PX if lines else 0.0
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if PLOTLY_MIME in data:
            height += (data[PLOTLY_MIME].get("layout", {}).get("height") or 450) + _BOX_PX
        elif "image/png" in data:
            height += 400
        elif out.get("output_type") == "stream":
            height += _OUTPUT_LINE_PX * len(out.get("text", "").splitlines()) + _BOX_PX
        elif "text/html" in data:
            height += 200
        elif "text/plain" in data:
            height += _OUTPUT_LINE_PX * len(str(data["text/plain"]).splitlines()) + _BOX_PX
        elif out.get("output_type") == "error":
            height += _OUTPUT_LINE_PX * 6
    return height


def split_long_slides(nb, budget: float = SLIDE_BUDGET_PX) -> int:
    """Start a sub-slide at a cell that would push its slide past ``budget``; returns how many
    slides were added.  A single cell taller than a slide stays whole (the slide then scrolls)."""
    added, used = 0, 0.0
    for cell in nb.cells:
        kind = cell.metadata["slideshow"]["slide_type"]
        height = _cell_height(cell)
        if kind in ("slide", "subslide"):
            used = height
        elif kind in ("-", "fragment"):
            if used > 0 and used + height > budget:
                cell.metadata["slideshow"]["slide_type"] = "subslide"
                added, used = added + 1, height
            else:
                used += height
    return added


def _plotly_to_html(nb) -> int:
    """Replace stored Plotly figure data by HTML that draws it with the local plotly.js."""
    count = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get(PLOTLY_MIME) if out.get("output_type") in (
                "display_data", "execute_result") else None
            if fig is None:
                continue
            count += 1
            div = f"plotly-figure-{count}"
            height = fig.get("layout", {}).get("height") or 450
            config = json.dumps(plotly_config(responsive=True))
            spec = json.dumps({"data": fig.get("data", []), "layout": fig.get("layout", {})}).replace("</", "<\\/")
            out["data"] = {"text/html": (
                f'<div id="{div}" style="width:100%;height:{height}px"></div>\n'
                f'<script>(function () {{ var fig = {spec}; '
                f'Plotly.newPlot("{div}", fig.data, fig.layout, {config}); }})();</script>')}
    return count


def reveal_dir(cache: Path = ROOT / "build" / f"reveal.js-{REVEAL_VERSION}") -> Path:
    """The unpacked npm package reveal.js@REVEAL_VERSION, installed with npm on first use."""
    package = cache / "node_modules" / "reveal.js"
    if (package / "dist" / "reveal.js").is_file():
        return package
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"building slides needs the npm package reveal.js@{REVEAL_VERSION}, and npm is not "
                           f"installed: install Node.js with npm (Debian: apt-get install npm), then run again")
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(cache),
                             f"reveal.js@{REVEAL_VERSION}"], capture_output=True, text=True)
    if result.returncode != 0 or not (package / "dist" / "reveal.js").is_file():
        raise RuntimeError(f"npm install reveal.js@{REVEAL_VERSION} failed (exit {result.returncode}):\n"
                           f"{result.stderr.strip()[-2000:]}")
    return package


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _copy_whole(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` through a file beside it renamed over it: copied in
    place, a full disk cut the earlier decks' ``plotly.min.js`` short (every figure gone),
    and the error named the file read.  A folder or a pipe at ``target`` is refused."""
    refuse_unwritable(target, _named(target))
    write_whole(target, lambda part: shutil.copyfile(source, part))


def _copy_assets(out_dir: Path) -> None:
    package = reveal_dir()
    for part in ("dist", "plugin"):
        for source in sorted(p for p in (package / part).rglob("*") if p.is_file()):
            target = out_dir / "reveal.js" / source.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_whole(source, target)
    _copy_whole(_plotly_js(), out_dir / "plotly.min.js")


def _slide_file(out_dir: Path, notebook: Path) -> Path:
    return out_dir / f"{notebook.stem}.slides.html"


def _named(path: Path) -> str:
    return quoted(str(path), PATH_CHARS)


def build(notebooks: list[Path] | None = None, out_dir: Path = ROOT / "build" / "slides") -> list[Path]:
    """Write one ``NAME.slides.html`` per notebook into ``out_dir`` (with its assets); returns the files."""
    from nbconvert import SlidesExporter

    notebooks = notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    # refused before anything is written: a file that is not a notebook, a stored figure that
    # is not one, slideshow metadata it cannot read, a pipe or a folder at a file it writes
    stored = {path: read_notebook(path, _named(path)) for path in notebooks}
    for path in notebooks:
        check_figures(stored[path], _named(path))
        check_slide_metadata(stored[path], _named(path))
        refuse_unwritable(_slide_file(out_dir, path), _named(_slide_file(out_dir, path)))
    refuse_unwritable(out_dir / "plotly.min.js", _named(out_dir / "plotly.min.js"))
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_assets(out_dir)
    # "white": of reveal.js's themes, one whose fonts ship with it (most load fonts from the web)
    exporter = SlidesExporter(template_file=str(TEMPLATE), reveal_url_prefix="reveal.js", reveal_theme="white",
                              reveal_width=str(SLIDE_WIDTH), reveal_height=str(SLIDE_HEIGHT),
                              exclude_input_prompt=True, exclude_output_prompt=True)
    written = []
    for path in notebooks:
        nb = with_slide_types(stored[path])
        nb.metadata["title"] = deck_title(nb, path)
        split_long_slides(nb)
        _plotly_to_html(nb)
        for cell in nb.cells:  # the test-suite markers mean nothing to an audience
            if cell.cell_type == "code":
                cell.source = "\n".join(l for l in cell.source.splitlines() if not l.startswith("# NBVAL_"))
        html, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
        target = _slide_file(out_dir, path)
        write_file(target, html, _named(target))
        written.append(target)
    return written


def main(argv=None) -> int:
    p = Parser(prog="slides",
               description="build offline reveal.js slides from the course notebooks")
    p.add_argument("notebooks", nargs="*", type=notebook_file,
                   help="default: every notebook in notebooks/")
    p.add_argument("--out", default=str(ROOT / "build" / "slides"), help="default: build/slides")
    a = p.parse_args(argv)
    try:
        out = out_folder(a.out)
        written = build([n.resolve() for n in a.notebooks] or None, out.resolve())
    except ValueError as err:
        return fail("slides", err)
    except OSError as err:
        return fail("slides", os_problem(err))
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    for path in written:
        print(path)
    print(f"open {written[0]} in a browser (works offline; press S for speaker view)")
    return 0


if __name__ == "__main__":
    run("slides", main)
