"""Sphinx configuration of the course website (built by ``./run.sh site``; see build.py).

Why Sphinx + MyST-NB and not Jupyter Book: Jupyter Book 2 builds with the MyST
JavaScript engine, which fetches its site theme over the network at build time; Jupyter
Book 1 is Sphinx + MyST-NB underneath, pinned to older Sphinx releases.  Sphinx + MyST-NB
install from PyPI alone and build with no network at all, and MyST-NB reads the stored
notebooks without running them (``nb_execution_mode = "off"``).
"""

project = "Overlap the Pipeline"
author = "the Overlap the Pipeline course"
copyright = "2026, the Overlap the Pipeline course"

extensions = ["myst_nb"]
# The site shows the outputs stored in the repository, the ones nbval checks: no kernel.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
# build.py writes the drawn pages' figures and tables there; the pages include them.
exclude_patterns = ["_build", "_generated", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_title = "Overlap the Pipeline"
html_static_path = ["_static"]
templates_path = ["_templates"]  # layout.html: the page title names the course once
html_css_files = ["course.css"]
html_copy_source = False
html_show_sourcelink = False
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
}
# Without a default the theme logs "Got invalid theme mode" on a first visit.
html_context = {"default_mode": "light"}


def _page_title(title: str) -> str:
    """The page's <title>: its own title and the course's name, the name once."""
    import re

    title = " ".join(re.sub(r"<[^>]+>", "", title or "").split())
    if not title or project in title:
        return title or project
    return f"{title} — {project}"


def _page_context(app, pagename, templatename, context, doctree):
    context["course_page_title"] = _page_title(context.get("title", ""))
    # plotly.js (4.8 MB, from the plotly package: build.py copies it into _static) only on pages
    # that draw a figure; it loads in <head>, before the figures' inline scripts.
    if "Plotly.newPlot" in context.get("body", ""):
        app.add_js_file("plotly.min.js")


def setup(app):
    app.connect("html-page-context", _page_context)
