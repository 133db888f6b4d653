"""Issue 34, round thirteen, the command lines (fixer cli13a): cases 1, 2, 4, 8 and 9.

1: two ``site/build.py`` on the same ``--out`` deleted each other's folders: the site one
announced was gone.  2: SIGTERM or SIGHUP while Sphinx ran left Sphinx running as an orphan
(its own process group).  4: ``slides`` and the site read stored notebooks with plain
nbformat: ``{"cells": 5}`` or ``[]`` a traceback, a FIFO a hang.  8: ``slides`` on a full
disk cut ``OUT/plotly.min.js`` short in place and named the file it read.  9: a folder at
``OUT/plotly.min.js`` was exit 0 and a deck without figures.  Each test failed before the fix."""

from __future__ import annotations

import importlib.util
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _one_line(err: str, *words: str) -> None:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def _site_build():
    spec = importlib.util.spec_from_file_location("site_build", ROOT / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def _plain_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A deck\n\nno figures here"),
                nbformat.v4.new_code_cell("1 + 1")]
    nb.cells[1].execution_count = 1
    nbformat.write(nb, path)
    return path


def _earlier_site(out: Path, build) -> Path:
    """An earlier build's ``OUT/html``, stamped as the build's."""
    html = out / "html"
    html.mkdir(parents=True)
    (html / build.STAMP).write_text("")
    (html / "index.html").write_text("the earlier site")
    return html


# -- case 1: two builds at once on one --out --------------------------------------------------

def test_a_second_site_build_on_the_same_out_is_refused_and_deletes_nothing(
        tmp_path, monkeypatch, capsys):
    """The second build starts while the first is in its build (stood in for): it must be
    refused in one line, exit 2, before it deletes anything of the first's."""
    build = _site_build()
    out = tmp_path / "out"
    html = _earlier_site(out, build)
    seconds, running = [], []

    def first(*args):
        if running:
            raise AssertionError("the second build started while the first ran")
        running.append(True)
        try:
            seconds.append(build.main(["--out", str(out)]))
        finally:
            running.pop()
        return html

    monkeypatch.setattr(build, "build", first)
    assert build.main(["--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert seconds == [2]
    _one_line(err, "site: error:", str(out), "another site build")
    assert (html / "index.html").read_text() == "the earlier site"
    assert build.main(["--out", str(out)]) == 0  # the lock ends with the first build
    assert seconds == [2, 2]


# -- case 2: SIGTERM / SIGHUP while Sphinx runs -------------------------------------------------

FAKE_SPHINX = """\
import os, sys, time
out = sys.argv[-1]  # OUT/html.partial
open(os.path.join(out, "..", "sphinx.pid"), "w").write(str(os.getpid()))
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_killed_site_build_takes_sphinx_with_it_and_keeps_the_earlier_site(tmp_path, sig):
    """A kill sent to the build's process group (``kill -TERM -PGID``, a closed terminal)
    while Sphinx (a stand-in that sleeps) runs: Sphinx must end too, the build by the signal,
    the earlier site kept and no ``html.partial`` left."""
    fake = tmp_path / "fake" / "sphinx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_SPHINX)
    out = tmp_path / "out"
    _earlier_site(out, _site_build())
    env = {**ENV, "PYTHONPATH": f"{fake.parent}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "site" / "build.py"), "--out", str(out)],
                            env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid_file, pid = out / "sphinx.pid", None
    try:
        deadline = time.monotonic() + 240
        while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), proc.communicate(timeout=60)
        time.sleep(0.5)
        pid = int(pid_file.read_text())
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -sig, err
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "Sphinx was left running"
        assert (out / "html" / "index.html").read_text() == "the earlier site"
        assert not (out / "html.partial").exists()
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- case 4: a stored notebook that is not one --------------------------------------------------

SITE_DRIVER = """\
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("site_build", sys.argv[1])
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
root = Path(sys.argv[2])
build.ROOT, build.SITE = root, root / "site"
sys.exit(build.main(["--out", str(root / "out")]))
"""

SLIDES_DRIVER = """\
import sys
from pathlib import Path
import overlap_course.build.slides as slides
slides.ROOT = Path(sys.argv[2])
slides.reveal_dir = lambda: (_ for _ in ()).throw(AssertionError("reveal.js asked for"))
sys.exit(slides.main(["--out", str(slides.ROOT / "out")]))
"""


def _junk_tree(tmp_path: Path, junk) -> Path:
    for folder in ("site", "docs", "notebooks", "exercises"):
        (tmp_path / folder).mkdir()
    for page in ("instructor_guide.md", "real_engines.md"):
        (tmp_path / "docs" / page).write_text("# page\n")
    _plain_notebook(tmp_path / "notebooks" / "01_fine.ipynb")
    stored = tmp_path / "notebooks" / "02_junk.ipynb"
    if junk == "fifo":
        os.mkfifo(stored)
    else:
        stored.write_bytes(junk)
    return tmp_path


@pytest.mark.parametrize("junk", [b'{"cells": 5}', b"[]", "fifo"])
@pytest.mark.parametrize("command", ["site", "slides"])
def test_a_stored_notebook_that_is_not_one_is_one_line_and_exit_2(tmp_path, junk, command):
    root = _junk_tree(tmp_path, junk)
    driver = SITE_DRIVER if command == "site" else SLIDES_DRIVER
    try:
        done = subprocess.run([sys.executable, "-c", driver, str(ROOT / "site" / "build.py"),
                               str(root)], capture_output=True, text=True, timeout=90, env=ENV)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} still ran after 90 s on a stored notebook {junk!r}")
    assert done.returncode == 2, done.stderr
    what = "is not a file" if junk == "fifo" else "is not a notebook"  # a pipe: said as such
    _one_line(done.stderr, f"{command}: error:", "02_junk.ipynb", what)
    assert not (root / "out").exists() or not any((root / "out").iterdir())


# -- cases 8 and 9: slides' assets ---------------------------------------------------------------

ASSETS_DRIVER = """\
import sys
from pathlib import Path
import overlap_course.build.slides as slides
slides.reveal_dir = lambda: Path(sys.argv[1])
sys.exit(slides.main([sys.argv[2], "--out", sys.argv[3]]))
"""


def _slides(tmp_path: Path, out: Path, limit: int | None = None):
    reveal = tmp_path / "reveal"
    for part in ("dist/reveal.js", "dist/theme/white.css", "plugin/notes/notes.js"):
        (reveal / part).parent.mkdir(parents=True, exist_ok=True)
        (reveal / part).write_text(f"// {part}\n")
    nb = _plain_notebook(tmp_path / "deck.ipynb")

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-c", ASSETS_DRIVER, str(reveal), str(nb), str(out)],
                          capture_output=True, text=True, timeout=300, env=ENV,
                          preexec_fn=small_disk if limit else None)


def test_slides_on_a_full_disk_keep_the_earlier_plotly_js_whole_and_name_it(tmp_path):
    import plotly

    whole = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    out = tmp_path / "out"
    first = _slides(tmp_path, out)
    assert first.returncode == 0, first.stderr
    second = _slides(tmp_path, out, limit=1 << 20)  # smaller than plotly.min.js (~4.8 MB)
    assert second.returncode == 2, second.stderr
    _one_line(second.stderr, "slides: error:", str(out / "plotly.min.js"))
    assert "site-packages" not in second.stderr
    assert (out / "plotly.min.js").read_bytes() == whole
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("odd", ["folder", "fifo"])
def test_slides_refuse_a_folder_or_pipe_at_plotly_js(tmp_path, odd):
    out = tmp_path / "out"
    out.mkdir()
    os.mkdir(out / "plotly.min.js") if odd == "folder" else os.mkfifo(out / "plotly.min.js")
    done = _slides(tmp_path, out)
    assert done.returncode == 2, done.stdout + done.stderr
    _one_line(done.stderr, "slides: error:", str(out / "plotly.min.js"), "not a file")
    assert not (out / "deck.slides.html").exists()
    assert sorted(p.name for p in out.iterdir()) == ["plotly.min.js"]
