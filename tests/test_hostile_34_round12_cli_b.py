"""Round twelve's command-line cases (issue 34, fixer B): files written whole or not at all on a
full disk (``RLIMIT_FSIZE`` stands in for ENOSPC) or a Ctrl-C, messages that name the file, and
the signals that end a run."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _limited(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _command(args, *, limit=None, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env=env or _env(), cwd=cwd, timeout=timeout,
                          preexec_fn=_limited(limit) if limit else None)


def _partials(folder: Path) -> list:
    return sorted(str(p) for p in folder.rglob("*.partial"))


# --- case 6: grading course --------------------------------------------------------------

def test_grading_course_on_a_full_disk_names_the_file_and_tears_none(tmp_path):
    dest = tmp_path / "course"
    done = _command(["overlap_course.build.grading", "course", str(dest)], limit=20_000)
    assert done.returncode == 2, done.stderr
    assert "None" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "03_zos_loop.ipynb" in done.stderr, done.stderr
    for f in dest.rglob("*.ipynb"):  # each notebook is whole or absent
        assert f.read_bytes() == (ROOT / "source" / f.name).read_bytes(), f
    assert not _partials(tmp_path)
    again = _command(["overlap_course.build.grading", "course", str(dest)])
    assert again.returncode == 0, again.stderr


_CTRL_C_WHILE_WRITING = '''
import os, signal, sys
def hook(event, args):
    # the moment the first new copy is being made beside its notebook (round 19: the course is
    # written all or none, each file as a temporary one renamed into place with the others)
    if event == "open" and not hook.done and ".partial" in str(args[0]):
        hook.done = True
        os.kill(os.getpid(), signal.SIGINT)
hook.done = False
sys.addaudithook(hook)
'''


def test_grading_course_ctrl_c_while_rewriting_leaves_every_file_whole(tmp_path):
    dest = tmp_path / "course"
    assert _command(["overlap_course.build.grading", "course", str(dest)]).returncode == 0
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_CTRL_C_WHILE_WRITING)
    cut = _command(["overlap_course.build.grading", "course", str(dest)],
                   env=_env(PYTHONPATH=f"{site}{os.pathsep}{ROOT}"))
    assert cut.returncode == 130, cut.stderr
    for f in dest.rglob("*.ipynb"):
        assert f.read_bytes() == (ROOT / "source" / f.name).read_bytes(), f
    assert not _partials(tmp_path)


# --- case 7: corpus ----------------------------------------------------------------------

def test_corpus_on_a_full_disk_is_one_line_and_keeps_the_table(tmp_path):
    for package in ("overlap_course", "toy_engine"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    table = tmp_path / "toy_engine" / "checkpoints" / "ngram_table.pt"
    before = table.read_bytes()
    done = _command(["overlap_course.corpus"], limit=len(before) // 2, cwd=tmp_path,
                    env=_env(PYTHONPATH=str(tmp_path)))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "ngram_table.pt" in done.stderr, done.stderr
    assert table.read_bytes() == before
    assert not _partials(tmp_path / "toy_engine")


# --- cases 8 and 18: train ---------------------------------------------------------------

# One thread: beside other work a second one doubled a tiny run's time (11-14 s, 7 s on one).
_TRAIN = ["overlap_course.train", "--batch-size", "1", "--block-size", "8", "--threads", "1",
          "--sample", "0"]


def test_train_on_a_full_disk_is_one_line_naming_out(tmp_path):
    out = tmp_path / "model.pt"
    done = _command([*_TRAIN, "--steps", "1", "--out", str(out)], limit=1_000_000)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"{str(out)!r}"), done.stderr
    assert not out.exists() and not _partials(tmp_path)


def test_train_ended_by_sigterm_or_sighup_leaves_no_partial_folder(tmp_path):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        proc = subprocess.Popen([sys.executable, "-m", *_TRAIN, "--steps", "1000000",
                                 "--out", str(tmp_path / "model.pt")], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            # tqdm's bar on stderr: the training runs
            seen = b""
            while b"training" not in seen:
                chunk = proc.stderr.read1(4096)
                assert chunk, seen
                seen += chunk
            time.sleep(0.5)
            os.killpg(proc.pid, sig)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stderr.close()
        assert not _partials(tmp_path), sig


# --- case 15: trace summary / export, a file that fails after it opened --------------------

def test_trace_read_failing_after_open_names_the_file(tmp_path):
    for args in (["summary", "/proc/self/mem"],
                 ["export", str(tmp_path / "out.json"), "/proc/self/mem"]):
        done = _command(["overlap_course.traces.kineto", *args])
        assert done.returncode == 2, done.stderr
        assert "'/proc/self/mem'" in done.stderr and "Traceback" not in done.stderr, done.stderr


# --- cases 16 and 4: the site --------------------------------------------------------------

SITE_BUILD = ROOT / "site" / "build.py"


def test_site_on_a_full_disk_names_the_file_it_could_not_write(tmp_path):
    out = tmp_path / "site"
    done = subprocess.run([sys.executable, str(SITE_BUILD), "--out", str(out)], env=_env(),
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=_limited(1_000_000))
    assert done.returncode == 2, done.stderr
    assert str(out) in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_site_ctrl_c_while_sphinx_runs_keeps_the_earlier_site(tmp_path):
    out = tmp_path / "site"
    for name in ("src", "html", "doctrees", "jupyter_execute"):  # an earlier build's
        (out / name).mkdir(parents=True)
        (out / name / ".made-by-site-build").write_text("made by site/build.py\n")
        os.utime(out / name / ".made-by-site-build", (0, 0))
    (out / "html" / "index.html").write_text("<h1>the earlier site</h1>")
    proc = subprocess.Popen([sys.executable, str(SITE_BUILD), "--out", str(out)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        end = time.monotonic() + 240
        stamp = out / "jupyter_execute" / ".made-by-site-build"  # made anew just before Sphinx
        while not (stamp.exists() and stamp.stat().st_mtime > 0):
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()[-500:]
            time.sleep(0.05)
        time.sleep(1)  # Sphinx is reading the sources
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-800:]
    assert (out / "html" / "index.html").read_text() == "<h1>the earlier site</h1>"


# --- case 17: trace export, Ctrl-C between its two renames --------------------------------

_CTRL_C_AT_SECOND_RENAME = '''
import os, signal, sys
def hook(event, args):
    if event == "os.rename":
        hook.seen += 1
        if hook.seen == 2:
            os.kill(os.getpid(), signal.SIGINT)
hook.seen = 0
sys.addaudithook(hook)
'''


def test_trace_export_ctrl_c_between_its_renames_is_all_or_none(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_CTRL_C_AT_SECOND_RENAME)
    for mode in ("serial", "zos"):
        (tmp_path / f"ex_{mode}.json").write_text("OLD\n")
    done = _command(["overlap_course.traces.kineto", "export", "ex.json", "--prompts", "2",
                     "--max-new-tokens", "4"], cwd=tmp_path,
                    env=_env(PYTHONPATH=f"{site}{os.pathsep}{ROOT}"))
    assert done.returncode in (0, 130), done.stderr
    old = {(tmp_path / f"ex_{m}.json").read_text() == "OLD\n" for m in ("serial", "zos")}
    assert len(old) == 1, "one file of this run beside one of an earlier run"


# --- case 14: progress_service with stderr that cannot be written ---------------------------

def test_progress_service_refuses_with_2_when_stderr_cannot_be_written(tmp_path):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "overlap_course.progress_service",
                               "--bogus"], stdout=subprocess.PIPE, stderr=full, text=True,
                              env=_env(), timeout=120)
    assert done.returncode == 2
    closed = subprocess.run(f"{sys.executable} -m overlap_course.progress_service --bogus 2>&-",
                            shell=True, capture_output=True, text=True, env=_env(), timeout=120)
    assert closed.returncode == 2 and closed.stdout == "", closed.stdout


# --- case 10: site, a stored Plotly output of the wrong shape -----------------------------

def _junk_figure(kind: str):
    def spoil(output):
        figure = output["data"]["application/vnd.plotly.v1+json"]
        if kind == "yaxis a string":
            figure["layout"]["yaxis"] = "lanes"
        elif kind == "title a number":
            figure["layout"]["title"] = {"text": 5}
        elif kind == "data a string":
            figure["data"] = "junk"
        elif kind == "a PNG that is a number":
            output["data"]["image/png"] = 5
    return spoil


def test_site_refuses_or_describes_a_stored_figure_of_the_wrong_shape(tmp_path):
    import json
    for folder in ("site", "notebooks", "exercises"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "_build"))
    (tmp_path / "docs").mkdir()
    for page in ("instructor_guide.md", "real_engines.md"):
        shutil.copy(ROOT / "docs" / page, tmp_path / "docs" / page)
    path = tmp_path / "notebooks" / "00_start_here.ipynb"
    shipped = path.read_text()
    for kind in ("yaxis a string", "title a number", "data a string", "a PNG that is a number"):
        nb = json.loads(shipped)
        spoiled = 0
        for cell in nb["cells"]:
            for output in cell.get("outputs", []):
                if "application/vnd.plotly.v1+json" in output.get("data", {}):
                    _junk_figure(kind)(output)
                    spoiled += 1
        assert spoiled, "the notebook stores no Plotly figure"
        path.write_text(json.dumps(nb, indent=1))
        out = tmp_path / "out"
        done = subprocess.run([sys.executable, str(tmp_path / "site" / "build.py"), "--out",
                               str(out)], env=_env(), capture_output=True, text=True,
                              timeout=300)
        assert "Traceback" not in done.stderr, (kind, done.stderr[-800:])
        if kind in ("data a string", "a PNG that is a number"):  # refused in one line
            assert done.returncode != 0 and done.stderr.count("\n") == 1, (kind, done.stderr)
            assert "00_start_here" in done.stderr, (kind, done.stderr)
