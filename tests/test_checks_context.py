"""The checks' context arguments (what the notebook passes besides the answer) given odd values:
a "setup" verdict naming the argument, what it must be and what the notebook passes there
(``overlap_course/checks/context.py``), never a raise; the notebook's own values still judge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from overlap_course import checks
from overlap_course.checks.verdict import Verdict
from toy_engine.runinfo import RunStats

ODD = [None, True, -1, 0, 2.5, 10**20, 10**400, 1e308, math.nan, "x", [], {}, [None], [1, -1],
       [0] * 5000, object(), (1, 2), range(3), {"input_ids": [1, 2], "pending": [1]}]

# check: (a right answer, the notebook's own context arguments)
NOTEBOOK = {
    "check_slot": ((37,), {"table": [5, 2, 9], "pos": 9, "block_size": 4}),
    "check_corrected_slots": (([20, 21, 22],), {"positions": [10, 11, 12], "table": [6, 0, 8, 5],
                                                "accepted": 2, "block_size": 4}),
    "check_true_key_length": ((31,), {"host_seqlens_k": 27, "accepted": 4}),
    "check_done_after_wait": (({0, 1},), {"waited": 1, "num_kernels": 3}),
    "check_decode_lengths": (([1, 1, 1], [10, 8, 4]), {"prompt_lengths": [9, 7, 3]}),
    "check_overhead_gap": ((5.0,), {"overhead_ms": 5.0}),
    "check_future_inputs": (([-1, 7, -1], [1, 0, 1]),
                            {"meta": {"input_ids": [-1, 7, -1], "pending": [1, 0, 1]},
                             "serial_meta": {"input_ids": [4, 7, 9]}}),
}


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAP_PROGRESS_FILE", str(tmp_path / "progress.jsonl"))


def test_the_notebooks_own_context_still_judges():
    for name, (answer, context) in NOTEBOOK.items():
        assert getattr(checks, name)(*answer, **context).passed, name
    assert checks.check_slot(np.int64(37), table=np.array([5, 2, 9]), pos=np.int64(9),
                             block_size=4.0).passed


@pytest.mark.parametrize("name", sorted(NOTEBOOK))
def test_each_odd_context_argument_is_a_setup_verdict_naming_it(name):
    answer, context = NOTEBOOK[name]
    for param in context:
        for odd in ODD:
            verdict = getattr(checks, name)(*answer, **{**context, param: odd})
            assert type(verdict) is Verdict, (param, odd)
        for junk in ("x", object(), 10**400, math.nan, *([None] * (param != "serial_meta"))):
            verdict = getattr(checks, name)(*answer, **{**context, param: junk})
            assert verdict.category == "setup" and f"`{param}`" in verdict.message, (param, junk)
            assert "the notebook passes" in verdict.message, verdict


def test_the_message_says_what_the_argument_must_be_and_what_the_notebook_passes():
    verdict = checks.check_done_after_wait({0, 1}, waited=1, num_kernels=10**20)
    assert verdict.category == "setup"
    assert "`num_kernels`" in verdict.message and "whole number from 1 to 4096" in verdict.message
    assert "the notebook passes the kernels its cell launched (3)" in verdict.message
    verdict = checks.check_round_gap(1.0, None, 10)
    assert verdict.category == "setup" and "`timeline`" in verdict.message
    assert "Timeline" in verdict.message and "engine.timeline" in verdict.message


def test_arguments_that_disagree_are_a_setup_verdict():
    cases = [checks.check_slot(37, [5, 2, 9], 100, 4),
             checks.check_done_after_wait({0}, waited=5, num_kernels=3),
             checks.check_corrected_slots([1, 2, 3], [10, 11, 12], [6, 0, 8, 5], 9, 4)]
    for verdict in cases:
        assert verdict.category == "setup" and "disagree" in verdict.message, verdict


def test_a_stub_answer_is_unanswered_whatever_the_context():
    """The learner's first step is to answer; the context is read only once there is one."""
    assert checks.check_slot(None, None, None, None).category == "unanswered"
    assert checks.check_decode_lengths(None, [1], object()).category == "unanswered"
    assert checks.check_round_gap(None, "x", 10**400).category == "unanswered"


def _stats(host_ms) -> RunStats:
    return RunStats(rounds=21, wall_ms=100.0, device_busy_ms=90.0, device_idle_fraction=0.5,
                    mean_host_ms_per_round=host_ms, mean_device_ms_per_round=2.0, tokens=80,
                    tokens_per_s=800.0, prefill_rounds=1, decode_rounds=20,
                    decode_device_idle_fraction=0.5, draft_tokens_proposed=0,
                    draft_tokens_accepted=0, mean_accepted_per_round=0.0, tokens_per_forward=1.0,
                    discarded_outputs=0)


def test_the_engine_and_the_stats_are_read_before_the_check_uses_them():
    assert checks.check_ideal_ratio(1.5, _stats(1.0)).passed  # (1 + 2) / 2
    for verdict in (checks.check_idle_fraction(lambda timeline: 0.5, None),
                    checks.check_idle_fraction(lambda timeline: 0.5, object()),
                    checks.check_ideal_ratio(1.0, None, None),
                    checks.check_ideal_ratio(1.0, "stats"),
                    checks.check_ideal_ratio(1.0, _stats(10**400)),
                    checks.check_ideal_ratio(1.0, _stats(0.0)),
                    checks.check_largest_host_stage("prepare", []),
                    checks.check_processed_under(1, None, 1),
                    checks.check_uncommitted_rounds({1}, [], []),
                    checks.check_future_inputs([], [], [])):
        assert verdict.category == "setup", verdict
