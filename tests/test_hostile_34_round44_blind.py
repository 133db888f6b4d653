"""Issue 34, round forty-four's blind learner (notebooks and exercises only).  Exercise 03(b)'s
figure drew an order the check passed ("Forward", "sample ") as wrong from its first pair; and
three wrong answers got a message that did not name their slip: an idle fraction counted from
time 0 (exercise 02), the tokens lost by both requests together (03a), an ideal speed-up cut
to two decimals (03b).  Each failed when written."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import toy_engine as te
from overlap_course import checks, figures
from toy_engine.runinfo import RunStats

RIGHT = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
         ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


@pytest.fixture(scope="module")
def zos_run():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as engine:
        engine.generate(["Once upon a time"], max_new_tokens=4)
        yield engine


@pytest.fixture(scope="module")
def serial_run():
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) as engine:
        engine.generate(["Once upon a time", "The bird said"], max_new_tokens=24)
        yield engine


def _written_row(timeline, order) -> dict:
    fig = figures.order_figure(timeline, first_round=1, num_rounds=3, written=order).to_dict()
    return next(t for t in fig["data"] if t.get("name") == "you wrote")


@pytest.mark.parametrize("spelled", [str.title, str.upper, lambda s: f" {s} "])
def test_the_order_figure_reads_a_pair_as_the_check_does(zos_run, spelled):
    order = [(spelled(stage), r) for stage, r in RIGHT]
    assert checks.check_three_rounds(order).passed
    right, row = _written_row(zos_run.timeline, RIGHT), _written_row(zos_run.timeline, order)
    assert row["meta"]["first_difference"] is None
    assert row["marker"]["color"] == right["marker"]["color"]  # the engine's stage colours
    assert repr(order[0]) in row["hovertext"][0].replace("&#x27;", "'")  # as written


def test_the_order_figure_still_marks_a_real_difference(zos_run):
    order = [("Sample", 1), ("Forward", 1), *RIGHT[2:]]
    assert not checks.check_three_rounds(order).passed
    assert _written_row(zos_run.timeline, order)["meta"]["first_difference"] == 0


def _idle(t):
    return sum(b - a for a, b in t.device_gaps())


def _lead(t):
    return min(s.start_ms for s in t.lane("device"))


@pytest.mark.parametrize("answer", [
    lambda t: (_idle(t) + _lead(t)) / (_idle(t) + _lead(t) + t.device_busy_ms()),
    lambda t: 1 - t.device_busy_ms() / max(s.end_ms for s in t.lane("device")),
    lambda t: _idle(t) / max(s.end_ms for s in t.lane("device")),
])
def test_an_idle_fraction_counted_from_time_zero_is_named(serial_run, answer):
    verdict = checks.check_idle_fraction(answer, serial_run)
    assert not verdict.passed and verdict.category == "counts_startup", verdict.message
    assert "before the device's first work" in verdict.message or (
        "before any device work" in verdict.message), verdict.message


def test_the_tokens_both_requests_lost_together_are_named():
    reference = [SimpleNamespace(token_ids=[1, 2, 3, 4, 5]) for _ in range(2)]
    without_flush = [SimpleNamespace(token_ids=[1, 2, 3, 4]) for _ in range(2)]
    verdict = checks.check_tokens_lost(2, reference, without_flush)
    assert not verdict.passed and verdict.category == "total_not_per_request", verdict.message
    assert "each request" in verdict.message
    assert checks.check_tokens_lost(1, reference, without_flush).passed


def _stats(host_ms: float, device_ms: float) -> RunStats:
    return RunStats(rounds=10, wall_ms=100.0, device_busy_ms=80.0, device_idle_fraction=0.2,
                    mean_host_ms_per_round=host_ms, mean_device_ms_per_round=device_ms,
                    tokens=20, tokens_per_s=200.0, prefill_rounds=1, decode_rounds=9,
                    decode_device_idle_fraction=0.2, draft_tokens_proposed=0,
                    draft_tokens_accepted=0, mean_accepted_per_round=0.0,
                    tokens_per_forward=1.0, discarded_outputs=0)


def test_an_ideal_cut_to_two_decimals_is_told_to_round():
    stats = _stats(1.0, 12.52)  # (1 + 12.52) / 12.52 = 1.0799
    ideal = (1.0 + 12.52) / 12.52
    verdict = checks.check_ideal_ratio(math.floor(ideal * 100) / 100, stats)
    assert not verdict.passed and verdict.category == "cut_two_decimals", verdict.message
    assert "x1.08" in verdict.message
    assert checks.check_ideal_ratio(round(ideal, 2), stats).passed
