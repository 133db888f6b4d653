"""Issue 34's eighth hostile round, the course's build and training commands: ``train --steps``
of 400 digits, a notebook whose stored Plotly output is not a figure (``notebooks images``,
``slides``), and ``trace export`` of a stored timeline its own reading back refuses, blamed on
the export's hidden temporary file.  Each failed when written."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from hostile_support import ROOT, one_clear_line, run_module

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PLOTLY_MIME = "application/vnd.plotly.v1+json"
HAS_CHROMIUM = os.access("/usr/bin/chromium", os.X_OK) or bool(os.environ.get("BROWSER_PATH"))


# -- train --steps ------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", ["9" * 400, "1000001"])
def test_train_refuses_steps_beyond_its_maximum_in_one_line(tmp_path, steps):
    """400 digits passed the parser (no maximum), then the evaluation schedule, a float,
    overflowed: an ``OverflowError`` traceback, exit 1."""
    out = tmp_path / "m.pt"
    run = run_module("overlap_course.train", "--steps", steps, "--out", str(out),
                     "--threads", "1", "--sample", "0", timeout=120)
    one_clear_line(run, "--steps", "1000000")
    assert not out.exists()


def test_train_called_with_huge_steps_names_them():
    """``train(steps=10**400)`` from Python: the same ``OverflowError``, not a ``ValueError``."""
    from overlap_course import train

    with pytest.raises(ValueError, match="steps"):
        train.train(steps=10**400, progress=False)


# -- a stored Plotly output that is not a figure -----------------------------------------------

JUNK_FIGURES = {"a string": "not a figure", "layout a number": {"data": [], "layout": 5},
                "data a number": {"data": 5, "layout": {}},
                "a trace a number": {"data": [5], "layout": {}},
                "height text": {"data": [], "layout": {"height": "tall"}},
                "neither data nor layout": {"title": "x"}}


def _notebook(path, figure) -> bytes:
    """A notebook nbformat validates: a heading, then a cell whose one output holds ``figure``."""
    output = {"output_type": "display_data", "metadata": {},
              "data": {PLOTLY_MIME: figure, "text/plain": "fig"}}
    cells = [{"cell_type": "markdown", "id": "m1", "metadata": {}, "source": "# Title"},
             {"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": 1,
              "source": "fig", "outputs": [output]}]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                "cells": cells}))
    return path.read_bytes()


def _without_warnings(run):
    """kaleido's and Chromium's WARNING lines are theirs, not the command's refusal."""
    run.stderr = "\n".join(line for line in run.stderr.splitlines() if "WARNING" not in line)
    return run


@pytest.mark.parametrize("junk", ["a string", "data a number"])
def test_notebooks_images_refuses_a_stored_figure_that_is_none_before_a_browser(tmp_path, junk):
    """An ``AttributeError`` or a ``KaleidoError`` traceback from inside kaleido.  No browser
    here (BROWSER_PATH names nothing): the refusal must come before one is started."""
    nb = tmp_path / "junk.ipynb"
    before = _notebook(nb, JUNK_FIGURES[junk])
    env = {**ENV, "BROWSER_PATH": str(tmp_path / "no-chromium"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "overlap_course.build.notebooks", "images",
                          str(nb)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env)
    one_clear_line(_without_warnings(run), str(nb), "cell 2, output 1", PLOTLY_MIME)
    assert nb.read_bytes() == before


@pytest.mark.skipif(not HAS_CHROMIUM, reason="needs Chromium to draw (bash "
                                             "scripts/install_browser.sh)")
def test_notebooks_images_names_the_notebook_of_a_figure_plotly_cannot_draw(tmp_path):
    """A figure of the right shape that plotly.js refuses (an axis that is text): kaleido's
    ``KaleidoError`` traceback, exit 1."""
    nb = tmp_path / "axis.ipynb"
    before = _notebook(nb, {"data": [], "layout": {"xaxis": "junk"}})
    run = run_module("overlap_course.build.notebooks", "images", str(nb), timeout=240)
    one_clear_line(_without_warnings(run), str(nb), "plotly.js could not draw")
    assert nb.read_bytes() == before


@pytest.mark.parametrize("junk", ["a string", "height text"])
def test_slides_refuse_a_stored_figure_that_is_none_before_writing(tmp_path, junk):
    """An ``AttributeError`` / ``TypeError`` traceback from ``_cell_height`` or
    ``_plotly_to_html``, after the assets were copied."""
    nb, out = tmp_path / "junk.ipynb", tmp_path / "out"
    _notebook(nb, JUNK_FIGURES[junk])
    run = run_module("overlap_course.build.slides", str(nb), "--out", str(out), timeout=120)
    one_clear_line(run, str(nb), "cell 2, output 1", PLOTLY_MIME)
    assert not out.exists()


def test_images_and_slides_refuse_every_junk_figure_alike(tmp_path, monkeypatch):
    """Each junk figure, in process (a command each costs seconds): the images (no browser:
    refused before one starts) and the slides (nothing written) refuse it naming the cell."""
    from overlap_course.build import notebooks, slides

    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium"))
    for junk, figure in JUNK_FIGURES.items():
        nb, out = tmp_path / f"{junk}.ipynb", tmp_path / "out"
        before = _notebook(nb, figure)
        for build in (lambda: notebooks.refresh_images(nb), lambda: slides.build([nb], out)):
            with pytest.raises(ValueError, match="cell 2, output 1") as refusal:
                build()
            assert str(nb) in str(refusal.value), junk
        assert nb.read_bytes() == before and not out.exists(), junk
    from overlap_course.build.stored_figure import figure_problem

    real = {"data": [{"type": "bar", "y": [1, 2]}], "layout": {"height": 300}}
    assert figure_problem(real) is None and figure_problem({"layout": {}}) is None


# -- trace export of a stored timeline its reading back refuses ---------------------------------

def _huge_round(t):
    for s in t["spans"]:
        s["round"] = 10**50


def _all_at_zero(t):
    for s in t["spans"]:
        s["start_ms"] = s["end_ms"] = 0.0


def _launched_after_the_end(t):
    """Device work launched (by its round's launch span) only at the run's end: HTA's window
    leaves it out, although the device span itself starts early."""
    t["spans"] = [dict(lane=lane, stage=stage, round=0, start_ms=start, end_ms=end)
                  for lane, stage, start, end in (("host", "schedule", 0.0, 0.5),
                                                  ("host", "launch_forward", 6.0, 6.0),
                                                  ("device", "forward", 1.0, 2.0))]


@pytest.mark.parametrize("change, words", [
    (_huge_round, ["round", "64 bits"]),
    (_all_at_zero, ["every device span", "0 ms"]),
    (_launched_after_the_end, ["cannot be exported", "nothing was written"])])
def test_export_names_stored_not_its_temporary_file(tmp_path, change, words):
    """Refused naming ``.OUT.<pid>.partial.json`` (gone when the line is read) and calling it
    "a truncated trace"."""
    timeline = copy.deepcopy(json.loads((ROOT / "overlap_course/traces/cpu_zos.json").read_text()))
    change(timeline)
    stored, out = tmp_path / "stored.json", tmp_path / "out.json"
    stored.write_text(json.dumps(timeline))
    run = run_module("overlap_course.traces.kineto", "export", str(out), str(stored))
    one_clear_line(run, f"STORED {str(stored)!r}", *words)
    assert ".partial" not in run.stderr and "truncated" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stored.json"]
