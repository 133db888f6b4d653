"""Issue 34, what round forty-three found and left for the next session.  Exercise 04 told a
correction that grew a request's key length where it must not move that "it must grow"; an
error inside one of check_correction's cases named no line; a loop or a ``process_outputs``
plug-in that freed requests unfinished had them end "abort" with nothing said; and a forkserver
stopped by a cell was said to be followed by itself ("devices now come from" its own pid).
Each failed when written."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import warnings

import pytest
import torch

import toy_engine as te
from toy_engine import kernels
from overlap_course import checks
from overlap_course.build import judge_process


def _grows_the_done_ones_too(meta, accepted, block_size):
    """Right but for requests with pending 0, whose key length it grows by 1."""
    kernels.correct_seqlens_qk(meta, accepted, block_size)
    meta["seqlens_k"] += 1 - meta["pending"]


def _raises_on_six_requests(meta, accepted, block_size):
    if len(meta["rows"]) == 6:
        meta["rows"][torch.tensor([9])]
    kernels.correct_seqlens_qk(meta, accepted, block_size)


def test_a_key_length_grown_where_it_must_not_move_is_told_so():
    verdict = checks.check_correction(_grows_the_done_ones_too)
    assert not verdict.passed
    assert "must not move here (+1)" in verdict.message, verdict.message
    assert "must grow" not in verdict.message, verdict.message


def test_an_error_inside_a_case_names_the_learners_line():
    verdict = checks.check_correction(_raises_on_six_requests)
    assert not verdict.passed and "with 6 requests" in verdict.message, verdict.message
    assert "of `_raises_on_six_requests`, `meta[\"rows\"][torch.tensor([9])]`" in (
        verdict.message), verdict.message


def _frees_each_request_unfinished(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        for req in list(engine.scheduler.running):
            if not req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)


def test_requests_a_loop_frees_unfinished_end_abort_with_a_warning_naming_them():
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        with pytest.warns(RuntimeWarning, match=r"request\(s\) \[0, 1\] left the scheduler "
                                                r"unfinished with no abort asked") as seen:
            outs = engine.generate(["ab", "cd"], max_new_tokens=4,
                                   loop=_frees_each_request_unfinished)
        assert seen[0].filename == __file__  # the learner's call, not the toy's line
        assert [c.finish_reason for c in outs] == ["abort", "abort"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a run that loses nothing says nothing
            again = engine.generate(["ab"], max_new_tokens=3)
        assert again[0].finish_reason == "length"


def test_a_stopped_forkserver_is_not_said_to_be_followed_by_itself(monkeypatch):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # gone, and reaped
    server = multiprocessing.forkserver._forkserver
    monkeypatch.setattr(server, "_forkserver_pid", pid)
    assert judge_process._forkserver_moved((pid, None)) == [
        f"the forkserver {pid} the judge started was stopped"]
    monkeypatch.setattr(server, "_forkserver_pid", pid + 1)
    moved = judge_process._forkserver_moved((pid, None))
    assert moved[0].endswith(f"devices now come from {pid + 1}")
