"""Notebook 06 (real traces) as stored, and the course website's page of it.

nbval re-runs the notebook and compares its outputs (``pytest notebooks/06_real_traces.ipynb``);
these tests check what nbval does not: that its checked cells ask about the real file and the
learner's own export, that its figures are stored with their PNGs and show the real trace beside
the toy's, and that the site (``site/build.py``, staged without Sphinx here; the browser test
builds it) carries that page.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat

from overlap_course.build import notebooks as course

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "06_real_traces.ipynb"


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_the_lesson_checks_the_real_file_and_the_learners_export():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    calls = [line for src in _code(nb) for line in src.splitlines() if "checks.check_" in line]
    assert calls == ["checks.check_idle_share(idle_share, REAL)",
                     "checks.check_idle_sync(culprit, REAL)",
                     'checks.check_idle_sync(culprit_mine, exported["serial"], name="culprit_mine")']
    code = "\n".join(_code(nb))
    assert 'REAL = "a100_event_sync"' in code and "kineto.export(runs[mode], exported[mode])" in code
    # busy machine: the comparison falls back to the runs recorded on a quiet machine
    assert "busy_warning(runs, cuda=" in code and 'figures.load_trace(f"cpu_{mode}_overhead2ms")' in code
    assert "kineto.cuda_profiles()" in code


def test_the_lesson_is_stored_small_with_static_figures():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert NOTEBOOK.stat().st_size < 300_000 and "widgets" not in nb.metadata
    figures = course.figure_outputs(nb)
    assert len(figures) == 3 and all("image/png" in o.data for o in figures)
    titles = [o.data[course.PLOTLY_MIME]["layout"]["title"]["text"] for o in figures]
    assert "NVIDIA A100" in titles[0] and titles[1].startswith("a100_event_sync, to scale")
    assert "serial run, read back from its Kineto export" in titles[2]  # the toy's, beside the real one
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "ui.perfetto.dev" in text and "chrome://tracing" in text and re.search(r"CPU\s+process", text)


def test_without_gpu_profiles_the_lesson_says_why_it_skips():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "kineto.cuda_profiles()" in c.source)
    out = "".join(o.get("text", "") for o in cell.outputs)
    assert "No torch.profiler traces of the CUDA engine here" in out and "scripts/gpu_check.sh" in out


def test_the_site_has_the_lesson_with_the_real_trace_beside_the_toys(tmp_path):
    spec = importlib.util.spec_from_file_location("site_build", REPO / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    src = build.stage(tmp_path)
    index = (src / "index.md").read_text()
    assert re.search(r"^notebooks/06_real_traces$", index, re.M) and "{doc}`notebooks/06_real_traces`" in index
    staged = nbformat.read(src / "notebooks" / "06_real_traces.ipynb", as_version=4)
    pages = [o.data["text/html"] for c in staged.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "text/html" in o.get("data", {})]
    assert len(pages) == 3 and all("Plotly.newPlot" in p for p in pages)
    assert "NVIDIA A100" in pages[0] and "read back from its Kineto export" in pages[2]


def test_the_lesson_is_listed_as_optional_and_kept_out_of_the_course_total():
    spec = importlib.util.spec_from_file_location("measure_notebooks", REPO / "scripts" / "measure_notebooks.py")
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    rel = "notebooks/06_real_traces"
    assert rel in measure.COURSE and rel in measure.OPTIONAL
    import json

    times = json.loads(measure.TIMES.read_text())
    minutes = {r: measure.learner_minutes(r, measure.shape(r), times["runs"][r]) for r in measure.COURSE
               if r not in measure.UNTIMED}  # no learner minutes yet: out of every total
    assert minutes[rel] <= 20  # the budget for the lesson
    core = sum(m for r, m in minutes.items() if r not in measure.OPTIONAL)
    readme = (REPO / "README.md").read_text()
    assert f"the whole course is about {core / 60:.1f} hours ({sum(minutes.values()) / 60:.1f} with the optional " \
           f"notebook 06)" in readme
    assert f"`{rel}` (optional)" in (REPO / "docs" / "instructor_guide.md").read_text()
    # measured on its own (--record PATH): the guide says when and at which commit
    run = times["runs"][rel]
    assert f"`{rel}` on {run['date']} at commit {run['commit']}" in (REPO / "docs" / "instructor_guide.md").read_text()
