"""The contention meter (overlap_course.measure.contention): preempted spans, CPU shares,
the busy verdict and the machine's load around a run."""

import dataclasses

import pytest

from overlap_course.measure import contention as cmod
from overlap_course.measure.contention import (busy_stretches, contention, cpu_share, cpu_shares, late_ms,
                                               preempted, record_machine_load)
from toy_engine.runinfo import RunStats
from toy_engine.timeline import Span, Timeline

from test_timeline import contended


def handmade() -> Timeline:
    tl = Timeline(origin_ns=0)
    tl.add("device", "forward", 0, 0.0, 4.0)
    tl.add("host", "prepare", 1, 4.0, 5.0)
    return tl


def test_preempted_spans():
    s = Span("device", "forward", 1, 0.0, 4.0, cpu_ms=1.0)
    assert cpu_share(s) == 0.25 and preempted(s)
    assert preempted(Span("device", "forward", 1, 0.0, 4.0, cpu_ms=3.9)) is False
    assert preempted(Span("device", "forward", 1, 0.0, 0.1, cpu_ms=0.0)) is False  # too short to judge
    assert preempted(Span("host", "prepare", 1, 0.0, 4.0, cpu_ms=1.0))  # the host loop lost its core
    assert preempted(Span("host", "wait", 1, 0.0, 4.0, cpu_ms=0.0)) is False  # blocked on purpose
    assert cpu_share(Span("device", "forward", 1, 0.0, 4.0)) is None
    assert cpu_share(Span("device", "forward", 1, 0.0, 1.0, cpu_ms=1.2)) == 1.0  # clock granularity
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="cpu_ms"):
            Span("device", "forward", 1, 0.0, 1.0, cpu_ms=bad)


def test_cpu_shares_busy_stretches_and_verdict():
    tl = contended()
    shares = cpu_shares(tl)
    assert shares["device_cpu_share"] == pytest.approx((3.8 + 0.01 + 2.0) / 9.1)
    assert shares["host_cpu_share"] == pytest.approx(0.9)
    assert busy_stretches(tl, lane="host") == []
    assert [(a, b, s.round) for a, b, s in busy_stretches(tl)] == [(6.0, 11.0, 2)]
    assert [(a, b) for a, b, _ in busy_stretches(tl, start_ms=8, end_ms=20)] == [(8.0, 11.0)]
    assert busy_stretches(tl, end_ms=6) == []
    c = contention(tl)
    assert c["device_preempted_ms"] == pytest.approx(3.0) and c["busy"] is True and c["host_preempted_ms"] == 0
    assert c["device_preempted_fraction"] == pytest.approx(3.0 / 9.1)
    assert "device_cpu_share" not in {f.name for f in dataclasses.fields(RunStats)}  # no course verdicts
    quiet = Timeline(origin_ns=0)
    quiet.add("device", "forward", 1, 0, 4, cpu_ms=3.9)
    assert contention(quiet)["busy"] is False and busy_stretches(quiet) == []
    # The device kept its core but the host loop did not: busy too (overlap needs both).
    quiet.add("host", "overhead", 2, 4, 6, cpu_ms=1.0)
    c = contention(quiet)
    assert c["busy"] is True and c["host_preempted_ms"] == pytest.approx(1.0)
    assert [s.stage for _, _, s in busy_stretches(quiet, lane="host")] == ["overhead"]
    # No CPU times (CUDA, old traces): unknown, not quiet.
    assert contention(handmade())["busy"] is None
    assert cpu_shares(handmade()) == {"device_cpu_share": None, "host_cpu_share": None}


def test_machine_load_measures_what_other_programs_used(monkeypatch):
    snaps = iter([(100.0, 5.0, 2), (101.0, 5.3, 2)])  # machine busy +1.0 CPU s, this process +0.3 s
    monkeypatch.setattr(cmod, "cpu_snapshot", lambda: next(snaps))
    start = cmod.cpu_snapshot()
    tl = Timeline()
    tl.origin_ns -= 1_000_000_000  # the run took 1 s
    tl.add("device", "forward", 1, 0, 400, cpu_ms=400.0)  # the device process: 0.4 s
    record_machine_load(tl, start)
    load = cmod.machine_load(tl)
    assert load.cpus == 2 and load.others_cpus == pytest.approx(0.3, abs=0.01)
    c = contention(tl)
    assert c["others_cpus"] == load.others_cpus and c["busy"] is True  # 0.3 > BUSY_OTHERS_CPUS
    assert contention(Timeline.from_json(tl.to_json()))["busy"] is True  # survives in meta
    hand = Timeline(origin_ns=0)  # no snapshot at the start: nothing measured
    record_machine_load(hand, None)
    assert cmod.machine_load(hand) is None and "machine_load" not in hand.meta.annotations


def paced(late_forward_ms: float = 0.0) -> Timeline:
    """A paced round: device spans last their time model (the forward ``late_forward_ms`` longer), their
    CPU time is the real compute (well under it), the host loop kept its core."""
    tl = Timeline(origin_ns=0)
    tl.add("device", "upload", 1, 0.0, 0.15, cpu_ms=0.1, paced_ms=0.15)
    tl.add("device", "forward", 1, 0.15, 10.15 + late_forward_ms, cpu_ms=5.0, paced_ms=10.0)
    tl.add("device", "sample", 1, 10.15 + late_forward_ms, 10.95 + late_forward_ms, cpu_ms=0.5, paced_ms=0.8)
    tl.add("host", "overhead", 2, 0.2, 2.2, cpu_ms=2.0)
    return tl


def test_a_paced_run_is_judged_by_how_late_its_kernels_end():
    """A paced span's CPU share is low by design (it sleeps out its time model): not busy.  One that ends
    late (its compute did not fit) is, like a preempted one."""
    on_time = contention(paced())
    assert on_time["paced"] is True and on_time["device_cpu_share"] is None and on_time["busy"] is False
    assert on_time["device_late_fraction"] == 0.0 and on_time["host_cpu_share"] == pytest.approx(1.0)
    assert busy_stretches(paced()) == [] and not any(preempted(s) for s in paced().spans)
    late = paced(late_forward_ms=2.0)
    c = contention(late)
    assert c["device_late_fraction"] == pytest.approx(2.0 / 10.95) and c["busy"] is True
    assert [s.stage for _, _, s in busy_stretches(late)] == ["forward"]
    assert late_ms(late.lane("device")[1]) == pytest.approx(2.0)
    small = paced(late_forward_ms=0.1)  # a sleep's overshoot: neither late nor busy
    assert not preempted(small.lane("device")[1]) and contention(small)["busy"] is False
    assert contention(Timeline.from_json(late.to_json()))["device_late_fraction"] == c["device_late_fraction"]
    unpaced = contention(contended())
    assert unpaced["paced"] is False and unpaced["device_late_fraction"] is None


def test_other_programs_alone_do_not_make_a_paced_run_busy():
    """On a hub the other learners' work fills the machine: a paced run whose kernels ended on time and
    whose host kept its core is not busy (reported, not judged); an unpaced one is."""
    loaded = paced()
    loaded.meta.annotations["machine_load"] = {"cpus": 32, "wall_s": 1.0, "others_cpus": 20.0}
    c = contention(loaded)
    assert c["others_cpus"] == 20.0 and c["busy"] is False
    unpaced = contended()
    unpaced.meta.annotations["machine_load"] = {"cpus": 32, "wall_s": 1.0, "others_cpus": 20.0}
    assert contention(unpaced)["busy"] is True
