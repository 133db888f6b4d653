"""The paced CPU stand-in (issue 25): on one usable CPU the engine picks it, labels it, and its
kernels end no earlier than the time model says, with the tokens of the unpaced engine.

The speed-up it shows is a benchmark figure (README, docs/measurements/device.md), not a test."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

import toy_engine as te
from overlap_course.measure import bench
from toy_engine import device as engine_device
from toy_engine import process_device
from toy_engine.process_device import ProcessDevice

PROMPTS = ["Once upon a time", "The little fox", "One day", "She said"]

# Pinned to one CPU as `taskset -c 0` would: the bench, a paced engine's spans, and the unpaced engine's tokens.
ONE_CPU = textwrap.dedent("""
    import json, os
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import toy_engine as te
    from overlap_course.measure import bench
    result = bench.run_bench(modes=("serial", "zos"), repeats=1, num_requests=4, max_new_tokens=12)
    out = dict(paced=result["paced"], pacing=result["pacing"], because=result["paced_because"],
               table=bench.format_table(result), equal=[m["equal_to_serial"] for m in result["modes"].values()])
    prompts = bench.default_workload(4)
    for device in ("auto", "cpu"):
        with te.Engine(te.EngineConfig(mode="zos", device=device)) as engine:
            out[device] = [c.token_ids for c in engine.generate(prompts, max_new_tokens=12)]
            out[device + "_meta"] = engine.timeline.meta.pacing
            out[device + "_paced_spans"] = [s.paced_ms is not None for s in engine.timeline.lane("device")]
    print(json.dumps(out))
""")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity API on this platform")
@pytest.mark.timeout(120)
def test_pinned_to_one_cpu_the_engine_paces_the_stand_in_and_says_so():
    run = subprocess.run([sys.executable, "-c", ONE_CPU], capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["paced"] and out["pacing"] == ProcessDevice.PACED_MS and out["equal"] == [True, True]
    assert "1 usable CPU(s), fewer than 2" in out["because"]
    assert "PACED stand-in, time model upload" in out["table"] and "on one core at most x" in out["table"]
    assert out["auto_meta"] == ProcessDevice.PACED_MS and all(out["auto_paced_spans"])
    assert out["cpu_meta"] is None and not any(out["cpu_paced_spans"])
    assert out["auto"] == out["cpu"]  # paced or not, on one core: the same tokens


def test_paced_kernels_end_no_earlier_than_the_model_and_events_wait_for_them(shipped):
    model, alphabet = shipped
    config = te.EngineConfig(mode="zos", device="paced", num_draft_tokens=2)
    with te.Engine(config, model=model, tokenizer=te.CharTokenizer(alphabet)) as engine:
        paced_tokens = [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=10)]
        tl = engine.timeline
    latency = ProcessDevice.PACED_MS["launch"][0]  # a kernel that finds the device idle starts this late
    assert tl.meta.pacing == ProcessDevice.PACED_MS and engine.stats.launch_latency_ms == pytest.approx(latency)
    device = tl.lane("device")
    assert device and all(s.paced_ms is not None for s in device)
    for span in device:  # the virtual device clock: never earlier than the model, one kernel after another
        assert span.duration_ms >= span.paced_ms - 1e-6, span
        base, per_token = ProcessDevice.PACED_MS["upload_inputs" if span.stage == "upload" else span.stage]
        assert span.paced_ms >= base and (per_token or span.paced_ms == pytest.approx(base))
    assert all(b.start_ms >= a.end_ms - 1e-6 for a, b in zip(device, device[1:]))
    sample_end = {s.round: s.end_ms for s in device if s.stage == "sample"}
    waits = [s for s in tl.lane("host") if s.stage == "wait"]
    assert waits and all(w.end_ms >= sample_end[w.owner] for w in waits)  # its event: after the paced end
    pytest.importorskip("plotly")
    from overlap_course import figures

    fig = figures.timeline_figure(tl)  # the figure says so too, span by span
    hovers = [h for trace in fig.data for h in (trace.hovertext or ())]
    assert "PACED" in fig.layout.title.text and any("PACED: the time model gives" in h for h in hovers)
    unpaced = dataclasses.replace(config, device="cpu")
    with te.Engine(unpaced, model=model, tokenizer=te.CharTokenizer(alphabet)) as engine:
        assert [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=10)] == paced_tokens


class _Recorded:
    """Stands in for ProcessDevice in make_device: what it would have been built with."""

    PACED_MS, PACED_BELOW_CPUS = ProcessDevice.PACED_MS, ProcessDevice.PACED_BELOW_CPUS

    def __init__(self, *args):
        self.pace = args[-1]


@pytest.mark.parametrize("kind, cpus, paced", [("auto", 1.0, True), ("auto", 0.5, True), ("auto", 2.0, False),
                                               ("cpu", 1.0, False), ("paced", 4.0, True)])
def test_auto_paces_the_stand_in_below_two_usable_cpus(monkeypatch, kind, cpus, paced):
    monkeypatch.setattr(process_device, "ProcessDevice", _Recorded)
    monkeypatch.setattr(engine_device, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(engine_device.torch.cuda, "is_available", lambda: False)
    made = engine_device.make_device(kind, None, 4, 4, {})
    assert made.pace == (ProcessDevice.PACED_MS if paced else None)


def test_the_config_names_the_paced_device():
    assert te.EngineConfig(device="paced").device == "paced"
    with pytest.raises(ValueError, match="'paced'"):
        te.EngineConfig(device="slow")


def test_one_core_bound():
    """(h + P) / max(P, h + c): host CPU h and device compute c per round both fit a paced round P, or not."""
    assert bench.one_core_ratio(2.8, 11.0, 6.5) == pytest.approx(13.8 / 11.0)
    assert bench.one_core_ratio(2.8, 8.0, 6.5) == pytest.approx(10.8 / 9.3)  # they do not fit: less
