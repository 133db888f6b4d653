"""Issue 34's ninth hostile round, the build and training commands: ``train --batch-size 4096``
(the parser's own maximum) ended in a torch allocator traceback; ``slides`` and ``notebooks
execute`` read metadata nbformat lets through (``slideshow`` null, a string, a list;
``widgets`` null or "x") and crashed, the slides after copying their assets, the execution
after every cell ran; ``site --out site/x`` copied site/ into itself 499 folders deep; and a
BROWSER_PATH naming another program (/bin/true) was refused with a Python tuple, with a
second line from choreographer's watchdog one run in three.  Each failed when written."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys

import nbformat
import pytest

from hostile_support import ROOT, one_clear_line, run_module

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PLOTLY_MIME = "application/vnd.plotly.v1+json"
ALLOCATOR = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
             "memory: you tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate "
             "memory)")


def _one_line(err: str, *words: str) -> None:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


# -- train --batch-size ---------------------------------------------------------------------------

class Trained(Exception):
    """Raised by a stand-in for the training: the command got as far as training."""


def _no_training(*args, **kwargs):
    raise Trained


@pytest.mark.parametrize("batch", ["4096", "257"])
def test_train_refuses_a_batch_whose_step_needs_more_than_a_laptop_has(tmp_path, monkeypatch,
                                                                      capsys, batch):
    """4096 windows of 256 need ~50 GB in one step: refused, naming the bound and the most that
    fits, before the training starts (stood in for here: nothing is allocated) or a file is
    made."""
    from overlap_course import train

    monkeypatch.setattr(train, "_fit", _no_training)
    out = tmp_path / "m.pt"
    assert train.main(["--batch-size", batch, "--steps", "1", "--sample", "0",
                       "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, "train: error:", f"--batch-size {batch}",
              f"{train.MAX_STEP_GIB} GiB", "at most 256")
    assert list(tmp_path.iterdir()) == []


def test_train_takes_the_largest_batch_that_fits(tmp_path, monkeypatch):
    """The bound refuses no more than it must: 256 full windows, or 4096 short ones, train."""
    from overlap_course import train

    monkeypatch.setattr(train, "_fit", _no_training)
    for batch, block in (("256", "256"), ("4096", "16")):
        with pytest.raises(Trained):
            train.main(["--batch-size", batch, "--block-size", block, "--steps", "1",
                        "--sample", "0", "--out", str(tmp_path / "m.pt")])


@pytest.mark.parametrize("error", [RuntimeError(ALLOCATOR), MemoryError()],
                         ids=["torch allocator", "MemoryError"])
def test_train_names_the_batch_size_when_memory_runs_out(tmp_path, monkeypatch, capsys, error):
    """A machine with less memory than the bound assumes: torch's allocator failure (a plain
    RuntimeError, simulated here) was a 38-line traceback, exit 1."""
    from overlap_course import train

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(train, "_fit", out_of_memory)
    out = tmp_path / "m.pt"
    assert train.main(["--batch-size", "64", "--sample", "0", "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, "train: error:", "out of memory", "--batch-size 64",
              "lower --batch-size")
    assert list(tmp_path.iterdir()) == []


def test_train_lets_other_runtime_errors_through(tmp_path, monkeypatch):
    """Only an allocation failure is read as one: another RuntimeError is a bug to see whole."""
    from overlap_course import train

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(train, "_fit", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        train.main(["--sample", "0", "--out", str(tmp_path / "m.pt")])


@pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX resource limits")
def test_train_batch_4096_under_a_laptops_memory_is_one_line(tmp_path):
    """The reported run: 8 GB of address space, ``--batch-size 4096``: exit 1 and a torch
    traceback after the data was loaded; now refused before it."""
    import resource

    def laptop():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    out = tmp_path / "m.pt"
    run = subprocess.run([sys.executable, "-m", "overlap_course.train", "--steps", "1",
                          "--batch-size", "4096", "--sample", "0", "--out", str(out)],
                         capture_output=True, text=True, timeout=180, env=ENV, cwd=ROOT,
                         preexec_fn=laptop)
    one_clear_line(run, "--batch-size 4096", "GiB")
    assert not out.exists()


# -- slides: slideshow metadata nbformat lets through -------------------------------------------

JUNK_SLIDESHOW = {"slideshow null": ({"slideshow": None}, "metadata.slideshow is null"),
                  "slideshow text": ({"slideshow": "x"}, 'metadata.slideshow is "x"'),
                  "slideshow a list": ({"slideshow": [1]}, "metadata.slideshow is [1]"),
                  "slide_type an object": ({"slideshow": {"slide_type": {"a": 1}}},
                                           "metadata.slideshow.slide_type is"),
                  "slide_type a typo": ({"slideshow": {"slide_type": "slid"}},
                                        'metadata.slideshow.slide_type is "slid"')}


def _slides_notebook(path, metadata: dict):
    """A notebook nbformat validates whose second cell carries ``metadata``."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_markdown_cell("## A slide\ntext")
    cell.metadata.update(metadata)
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), cell, nbformat.v4.new_code_cell("x = 1")]
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("junk", JUNK_SLIDESHOW)
def test_slides_refuse_slideshow_metadata_they_cannot_read_before_writing(tmp_path, monkeypatch,
                                                                         junk):
    """An AttributeError or TypeError from ``slide_type`` after the reveal.js assets were copied
    into --out (the copy is stood in for here, so that no npm is needed)."""
    from overlap_course.build import slides

    monkeypatch.setattr(slides, "_copy_assets", lambda out_dir: None)
    metadata, said = JUNK_SLIDESHOW[junk]
    nb, out = _slides_notebook(tmp_path / "junk.ipynb", metadata), tmp_path / "out"
    with pytest.raises(ValueError) as refusal:
        slides.build([nb], out)
    _one_line(str(refusal.value), str(nb), "cell 2", said, "nothing was written")
    assert not out.exists()


def test_slides_command_refuses_junk_slideshow_in_one_line(tmp_path):
    """The command itself: one line, exit 2, --out not made."""
    nb, out = _slides_notebook(tmp_path / "junk.ipynb", {"slideshow": None}), tmp_path / "out"
    run = run_module("overlap_course.build.slides", str(nb), "--out", str(out), timeout=120)
    one_clear_line(run, str(nb), "cell 2", "metadata.slideshow")
    assert not out.exists()


def test_slides_still_read_every_slideshow_metadata_they_know():
    """No slideshow, an empty one, a null or empty slide_type, and every known slide type."""
    from overlap_course.build import slides

    for metadata in ({}, {"slideshow": {}}, {"slideshow": {"slide_type": None}},
                     {"slideshow": {"slide_type": ""}},
                     *({"slideshow": {"slide_type": kind}} for kind in slides.SLIDE_TYPES)):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell("# Title", metadata=metadata)]
        slides.check_slide_metadata(nb, "nb")
        assert slides.with_slide_types(nb).cells[0].metadata.slideshow.slide_type


# -- notebooks execute: widget state nbformat lets through --------------------------------------

JUNK_WIDGETS = {"null": None, "text": "x",
                "inner text": {"application/vnd.jupyter.widget-state+json": "x"},
                "state text": {"application/vnd.jupyter.widget-state+json": {"state": "x"}}}


def _widgets_notebook(path, widgets):
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = widgets
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


class KernelLeavingNoWidgets:
    """nbclient's client, its run stood in for: the cells ran and made no widget (so nbclient
    leaves the notebook's widget metadata as it found it)."""

    km = None  # no kernel (notebooks runs ``async_execute`` on a loop of its own)

    def __init__(self, nb, **kwargs):
        self.nb = nb

    async def async_execute(self):
        for cell in self.nb.cells:
            cell.execution_count = 1


@pytest.mark.parametrize("junk", JUNK_WIDGETS)
def test_notebooks_execute_treats_junk_widget_state_as_absent(tmp_path, monkeypatch, capsys,
                                                             junk):
    """``widget_figures`` called ``.get`` on it after every cell ran: an AttributeError, the run
    lost.  The state is an earlier run's (the run stores its own): dropped before the run."""
    import nbclient

    from overlap_course.build import notebooks

    monkeypatch.setattr(nbclient, "NotebookClient", KernelLeavingNoWidgets)
    path = _widgets_notebook(tmp_path / "w.ipynb", JUNK_WIDGETS[junk])
    assert notebooks.main(["execute", str(path)]) == 0, capsys.readouterr().err
    written = nbformat.read(path, as_version=4)
    assert "widgets" not in written.metadata and written.cells[0].execution_count == 1


def _has_python_kernel() -> bool:
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        return "python3" in KernelSpecManager().find_kernel_specs()
    except Exception:  # noqa: BLE001 - no jupyter_client, or no kernel spec folder at all
        return False


@pytest.mark.timeout(200)
@pytest.mark.skipif(not _has_python_kernel(), reason="needs the python3 Jupyter kernel (ipykernel)")
def test_notebooks_execute_runs_notebooks_with_junk_widget_state(tmp_path):
    """The reported run, with a real kernel: each notebook executed and written, no traceback."""
    paths = [_widgets_notebook(tmp_path / f"w{i}.ipynb", widgets)
             for i, widgets in enumerate(JUNK_WIDGETS.values())]
    run = subprocess.run([sys.executable, "-m", "overlap_course.build.notebooks", "execute",
                          *map(str, paths)], capture_output=True, text=True, timeout=180,
                         env=ENV, cwd=ROOT)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-800:]
    for path in paths:
        nb = json.loads(path.read_text())
        assert "widgets" not in nb["metadata"] and nb["cells"][0]["execution_count"] == 1


# -- site --out inside site/ ----------------------------------------------------------------------

def _site_build():
    spec = importlib.util.spec_from_file_location("site_build", ROOT / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def test_site_refuses_an_out_inside_site_before_writing(tmp_path, monkeypatch, capsys):
    """``--out site/x`` staged site/ into site/x/src, inside what it copies: a RecursionError
    after 499 nested folders.  The build is stood in for (nothing is written, even if the
    refusal is missing); a link to site/ is seen through."""
    build = _site_build()

    def no_build(out):
        raise AssertionError(f"the build started for --out {out}")

    monkeypatch.setattr(build, "build", no_build)
    (tmp_path / "link").symlink_to(build.SITE, target_is_directory=True)
    for out in (build.SITE / "x", build.SITE, tmp_path / "link" / "deeper"):
        assert build.main(["--out", str(out)]) == 2
        _one_line(capsys.readouterr().err, "site: error:", "inside it", "outside site/")
    assert not (build.SITE / "x").exists() and not (build.SITE / "deeper").exists()


# -- BROWSER_PATH naming a program that is not Chromium -----------------------------------------

def _figure_notebook(path):
    output = {"output_type": "display_data", "metadata": {},
              "data": {PLOTLY_MIME: {"data": [], "layout": {}}, "text/plain": "fig"}}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": "a", "metadata": {}, "source": "fig", "execution_count": 1,
         "outputs": [output]}]}
    path.write_text(json.dumps(nb))
    return path


class DeadBrowser:
    """kaleido's browser when BROWSER_PATH is /bin/true, every time as in the worst run:
    choreographer's watchdog warns, then opening fails with a tuple of sentences."""

    def __init__(self, *args, **kwargs):
        pass

    async def __aenter__(self):
        from choreographer.errors import BrowserFailedError

        logging.getLogger("choreographer.browser_async").warning(
            "Wait expired, Browser is being closed by watchdog.")
        raise BrowserFailedError("The browser seemed to close immediately after starting.",
                                 "You can set the `logging.Logger` level lower to see more.")

    async def __aexit__(self, *exc):
        return None


def test_a_browser_that_dies_at_start_is_one_sentence_naming_browser_path(monkeypatch, caplog):
    """Deterministic (the watchdog's line came one run in three): the refusal is a ValueError
    (bad input) in words naming BROWSER_PATH, and choreographer logs no warning of its own."""
    import kaleido

    from overlap_course.build import drawing

    monkeypatch.setattr(kaleido, "Kaleido", DeadBrowser)
    monkeypatch.setenv("BROWSER_PATH", "/bin/true")
    with pytest.raises(ValueError) as refusal:
        drawing.render_images([{"data": [], "layout": {}}])
    _one_line(str(refusal.value), "BROWSER_PATH='/bin/true'", "Chrome or Chromium")
    assert "('" not in str(refusal.value)
    assert not [r for r in caplog.records if r.name.startswith("choreographer")], caplog.text
    # left silent: its threads can log after the drawing (round twelve, cli 12's JSONError)
    assert logging.getLogger("choreographer").level > logging.CRITICAL


def test_a_default_browser_that_dies_at_start_is_not_blamed_on_browser_path(monkeypatch):
    """Without BROWSER_PATH the browser found is broken: a RuntimeError naming it."""
    import kaleido

    from overlap_course.build import drawing

    monkeypatch.setattr(kaleido, "Kaleido", DeadBrowser)
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(drawing, "_browser", lambda: "/opt/chrome")
    with pytest.raises(RuntimeError, match="/opt/chrome closed as soon as it started") as failed:
        drawing.render_images([{"data": [], "layout": {}}])
    assert not isinstance(failed.value, ValueError)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("command", ["notebooks images", "handout"])
def test_browser_path_naming_another_program_is_one_line(tmp_path, command):
    """The reported runs: ``notebooks images`` with /bin/true printed a Python tuple (exit 2);
    ``handout`` with /bin/false exited 1 with two lines."""
    program = "/bin/true" if command == "notebooks images" else "/bin/false"
    if not os.access(program, os.X_OK):
        pytest.skip(f"no {program} here")
    notebook = str(_figure_notebook(tmp_path / "f.ipynb"))
    args = (["overlap_course.build.notebooks", "images", notebook]
            if command == "notebooks images" else
            ["overlap_course.build.handout", "--out", str(tmp_path / "out")])
    run = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                         timeout=180, cwd=ROOT, env={**ENV, "BROWSER_PATH": program})
    one_clear_line(run, f"BROWSER_PATH='{program}'", "Chrome or Chromium")
    assert "('" not in run.stderr
