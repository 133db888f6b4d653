"""Issue 34's second hostile round: each case failed before its fix (the judge's shadow module
is in tests/test_grading_guard.py).  Command lines run as subprocesses, bounded in time."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
from pathlib import Path

import pytest

from overlap_course import checks
from overlap_course.labs import plugins, plugins_2026
from overlap_course.measure import bench
from overlap_course.progress import read_record, your_progress
from hostile_support import run_module as _run, one_clear_line as _one_clear_line

ROOT = Path(__file__).resolve().parents[1]


def _export(*args: str, cwd) -> subprocess.CompletedProcess:
    return _run("overlap_course.traces.kineto", "export", *args, cwd=cwd)


def test_export_refuses_to_overwrite_the_timeline_it_converts(tmp_path):
    stored = tmp_path / "stored.json"
    stored.write_bytes((ROOT / "overlap_course" / "traces" / "cpu_zos.json").read_bytes())
    before = stored.read_bytes()
    _one_clear_line(_export("stored.json", str(stored), cwd=tmp_path), "STORED", "overwrite")
    assert stored.read_bytes() == before


def test_export_refuses_an_empty_stored_name_instead_of_recording(tmp_path):
    _one_clear_line(_export("o4.json", "", cwd=tmp_path), "STORED is empty")
    assert not (tmp_path / "o4.json").exists()


def test_export_refuses_an_out_that_names_a_folder(tmp_path):
    _one_clear_line(_export("newdir/", "cpu_zos", cwd=tmp_path), "names a folder")
    assert not (tmp_path / "newdir").exists()


def test_the_bench_refuses_speculation_without_drafts():
    with pytest.raises(ValueError, match="num_draft_tokens = 0"):
        bench.run_bench(("serial+spec",), num_draft_tokens=0)
    _one_clear_line(_run("overlap_course.measure.bench", "--modes", "serial+spec",
                         "--num-draft-tokens", "0"), "no drafts")


def _returns_within(seconds: float, call):
    """``call()``'s outcome (its value or the exception it raised), or fail if it hangs."""
    out = []

    def target():
        try:
            out.append(call())
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out.append(err)
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"still running after {seconds} s"
    return out[0]


def test_a_device_as_the_record_is_refused_at_once():
    got = _returns_within(10, lambda: your_progress("/dev/zero"))
    assert isinstance(got, ValueError) and "not a file" in str(got)


def test_a_pipe_as_the_record_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "progress.jsonl"
    os.mkfifo(fifo)
    got = _returns_within(10, lambda: read_record(fifo))
    assert isinstance(got, ValueError) and str(fifo) in str(got)
    got = _run("overlap_course.progress", str(fifo), timeout=20)
    _one_clear_line(got, "not a file")


def test_a_missing_record_is_still_an_empty_one(tmp_path):
    assert read_record(tmp_path / "none.jsonl") == ([], 0)


def _abort(engine, request_id):
    pass


@pytest.mark.parametrize("build, names", [
    (lambda: plugins.per_request(wants_more=lambda: True), ["wants_more", "wants_more(req)"]),
    (lambda: plugins.per_request(commit=lambda req, tokens: None), ["commit", "decode"]),
    (lambda: plugins.aborts(lambda engine: None, [(1, 0)]), ["abort", "request_id"]),
    (lambda: plugins_2026.batch_queue(2, lambda engine, plan: 0), ["before_sample", "held"]),
    (lambda: plugins_2026.future_key(lambda req: 0), ["key", "key(req, b)"]),
])
def test_a_plugin_function_of_the_wrong_arity_is_refused_when_built(build, names):
    with pytest.raises(TypeError) as err:
        build()
    assert all(name in str(err.value) for name in names), str(err.value)


def test_plugin_functions_that_can_take_the_arguments_are_accepted():
    plugins.per_request(wants_more=lambda req, *rest: True, commit=lambda *a, **k: None)
    plugins.aborts(_abort, [(1, 0)])
    plugins_2026.batch_queue(2, lambda engine, plan, held, extra=None: 0)
    plugins_2026.future_key(print)  # a builtin that takes anything


def test_abort_points_from_an_endless_iterator_are_refused():
    got = _returns_within(10, lambda: plugins.aborts(_abort, itertools.count()))
    assert isinstance(got, ValueError) and "never ends" in str(got)


@pytest.mark.parametrize("engine", [None, object(), 5])
def test_a_stub_answer_with_a_junk_engine_gets_a_verdict(engine):
    verdict = checks.check_idle_fraction(None, engine)
    assert verdict.passed is False and verdict.category == "unanswered", verdict.message


def test_grading_refuses_an_empty_dest(tmp_path):
    _one_clear_line(_run("overlap_course.build.grading", "course", "", cwd=tmp_path),
                    "DEST is empty")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["summary", "{fifo}"], ["export", "o.json", "{fifo}"],
                                  ["export", "{fifo}", "cpu_zos"]])
def test_a_pipe_given_to_the_trace_command_is_refused_without_waiting(tmp_path, argv):
    """Found while closing round two: each of these waited forever on the pipe's other end."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    argv = [a.format(fifo=fifo) for a in argv]
    _one_clear_line(_run("overlap_course.traces.kineto", *argv, cwd=tmp_path, timeout=60),
                    str(fifo))
