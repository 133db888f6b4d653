"""Notebook 06's checks (overlap_course.checks.lesson06) and what they stand on:
kineto.idle_after_syncs, kineto.cuda_profiles and scripts/profile_cuda.py.

Every check judges against the trace it is given -- the real A100 file, a learner's own export,
or a synthetic trace built here with other numbers -- so the tests give each check traces whose
answers differ, and require the right answer for *that* trace to pass and the others to fail.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

import toy_engine as te
from overlap_course.traces import kineto
from overlap_course import checks
from overlap_course.measure.bench import default_workload
from overlap_course.traces.recorded import TRACES_DIR
from toy_engine.timeline import Timeline

REPO = Path(__file__).resolve().parent.parent
REAL = "a100_event_sync"


def _stored_export(name: str) -> dict:
    return kineto.export(Timeline.from_json(TRACES_DIR / f"{name}.json"))


def _synthetic(kernels, calls) -> dict:
    """A small Kineto trace: ``kernels`` as (ts, dur, correlation) on stream 7, ``calls`` as
    (name, ts, dur, correlation or None) on the host thread."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{c}", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
               "args": {"stream": 7, "correlation": c}} for ts, dur, c in kernels]
    events += [{"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {} if c is None else {"correlation": c}} for name, ts, dur, c in calls]
    return {"traceEvents": events}


# A trace whose idle share is 20 %, not the A100's 79 %, and whose culprit is cudaDeviceSynchronize.
OTHER = _synthetic(kernels=[(0, 40, 1), (60, 30, 2), (90, 10, 3)],
                   calls=[("cudaLaunchKernel", -5, 3, 1), ("cudaDeviceSynchronize", 10, 45, None),
                          ("cudaLaunchKernel", 58, 1, 2), ("cudaStreamSynchronize", 65, 20, None),
                          ("cudaLaunchKernel", 86, 1, 3)])


# ---------------------------------------------------------------------------- check_idle_share

def test_idle_share_right_answers_pass_as_fraction_or_percent():
    idle = kineto.summary(REAL)["device_idle_fraction"]
    for answer in (idle, 100 * idle, round(idle, 2), round(100 * idle), idle - 0.08, 100 * idle + 8):
        verdict = checks.check_idle_share(answer, REAL)
        assert verdict.passed, (answer, verdict)
        assert f"{idle:.1%}" in verdict.message
    # a numpy / torch scalar is a number too
    import torch
    assert checks.check_idle_share(torch.tensor(idle), REAL).passed
    assert checks.check_idle_share(f"{100 * idle:.0f}%", REAL).passed  # a percentage string is a share too


@pytest.mark.parametrize("answer, category, says", [
    (None, "unanswered", "not answered yet"),
    ("79 percent", "shape", "as a number"),
    (float("nan"), "junk", "finite number"),
    (True, "shape", "as a number"),
    (-0.2, "negative", "cannot be negative"),
    (0.3, "wrong", "idle more than that"),
    (1.0, "wrong", "idle less than that"),
])
def test_idle_share_wrong_answers_fail_and_say_why(answer, category, says):
    verdict = checks.check_idle_share(answer, REAL)
    assert not verdict.passed and verdict.category == category and says in verdict.message, verdict
    assert "78.7" not in verdict.message and "207" not in verdict.message  # a wrong try is not told the answer


def test_idle_share_over_the_whole_trace_is_named():
    """Idle over the whole trace (from the first host call) is within 10 points of the device span's
    idle share on the A100 file: the check names that window instead of passing it."""
    verdict = checks.check_idle_share((372 - 56) / 372, REAL)
    assert verdict.category == "whole_trace" and "first to the last event on the device row" in verdict.message


def test_idle_share_recognises_busy_share_microseconds_and_idle_over_busy():
    s = kineto.summary(REAL)
    busy_share = 1 - s["device_idle_fraction"]
    for answer, category, says in ((busy_share, "busy_fraction", "busy share"),
                                   (100 * busy_share, "busy_fraction", "busy share"),
                                   (s["device_idle_us"], "idle_time_not_share", "microseconds"),
                                   (s["device_idle_us"] / s["device_busy_us"], "idle_over_busy", "idle over busy"),
                                   (s["device_span_us"], "share_over_one", "at most 1")):
        verdict = checks.check_idle_share(answer, REAL)
        assert not verdict.passed and verdict.category == category and says in verdict.message, (answer, verdict)


def test_idle_share_is_judged_on_the_trace_given():
    other = kineto.summary(OTHER)["device_idle_fraction"]
    assert other == pytest.approx(0.2)
    assert checks.check_idle_share(0.2, OTHER).passed
    assert not checks.check_idle_share(0.2, REAL).passed
    real = kineto.summary(REAL)["device_idle_fraction"]
    assert checks.check_idle_share(real, REAL).passed and not checks.check_idle_share(real, OTHER).passed
    # the learner's own (stored quiet) serial export: its own idle
    serial = _stored_export("cpu_serial")
    assert checks.check_idle_share(kineto.summary(serial)["device_idle_fraction"], serial).passed


def test_idle_share_on_a_broken_trace_is_a_verdict_not_an_exception(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    verdict = checks.check_idle_share(0.5, bad)
    assert not verdict.passed and verdict.category == "setup" and "not valid JSON" in verdict.message


# ---------------------------------------------------------------------------- check_idle_sync

def test_idle_after_syncs_on_the_real_trace_is_the_files():
    idle = kineto.idle_after_syncs(REAL)
    # the gaps are the stream's idle time, as the per-stream summary (HTA's idle-time breakdown) counts it
    assert idle["idle_us"] == pytest.approx(kineto.summary(REAL)["streams"]["7"]["idle_us"])
    assert idle["idle_us"] == pytest.approx(idle["no_sync_us"] + sum(idle["by_sync_us"].values()))
    longest = max(idle["gaps"], key=lambda g: g["idle_us"])
    # read from the raw file: the sync that returned inside the longest gap
    raw = kineto.read_trace(REAL)["traceEvents"]
    t0 = min(e["ts"] for e in raw if e.get("cat") in ("cuda_runtime", "kernel", "gpu_memcpy"))
    inside = [e["name"] for e in raw if e.get("cat") == "cuda_runtime" and "Synchronize" in e["name"]
              and longest["start_us"] <= e["ts"] + e["dur"] - t0 <= longest["end_us"]]
    assert inside == [longest["sync"]] and list(idle["by_sync_us"]) == inside
    assert idle["syncs"] == kineto.host_syncs(REAL)


def test_idle_sync_right_answer_for_the_real_trace_passes_in_its_spellings():
    want = next(iter(kineto.idle_after_syncs(REAL)["by_sync_us"]))
    kind = {v: k for k, v in kineto.SYNC_EVENT_CALLS.items()}[want]  # its cuda_sync record, e.g. "Stream Sync"
    for answer in (want, f"{want}()", f"  {want.lower()} ", f"'{want}'", kind):
        verdict = checks.check_idle_sync(answer, REAL)
        assert verdict.passed, (answer, verdict)
        assert want in verdict.message


def test_idle_sync_wrong_answers_for_the_real_trace_fail():
    idle = kineto.idle_after_syncs(REAL)
    want = next(iter(idle["by_sync_us"]))
    other_syncs = [name for name in idle["syncs"] if name != want]
    assert other_syncs, "the real trace has other syncs to confuse it with"
    cases = {name: ("other_sync", "did not return while the device was idle") for name in other_syncs}
    cases.update({"cudaLaunchKernel": ("launch_call", "queues work and returns"),
                  "cudaMemcpyAsync": ("launch_call", "queues work and returns"),
                  "cudaEventRecord": ("not_blocking", "does not block"),
                  "cudaEventQuery": ("not_blocking", "does not block"),
                  "aten::item": ("pytorch_call", "PyTorch side"), ".item()": ("pytorch_call", "PyTorch side"),
                  "torch.cuda.synchronize": ("not_in_trace", "not a call of this trace"),
                  "cuCtxSynchronize": ("not_in_trace", "not a call of this trace")})
    for answer, (category, says) in cases.items():
        verdict = checks.check_idle_sync(answer, REAL)
        assert not verdict.passed and verdict.category == category and says in verdict.message, (answer, verdict)
    for answer, category, says in ((None, "unanswered", "not answered yet"), (3, "shape", "as a string"),
                                   ("", "shape", "as a string")):
        verdict = checks.check_idle_sync(answer, REAL)
        assert not verdict.passed and verdict.category == category and says in verdict.message, (answer, verdict)


def test_idle_sync_is_judged_on_the_trace_given():
    # the synthetic trace: cudaDeviceSynchronize returns in the 20 us gap; the stream sync does not
    assert kineto.idle_after_syncs(OTHER)["by_sync_us"] == {"cudaDeviceSynchronize": 20.0}
    assert checks.check_idle_sync("cudaDeviceSynchronize", OTHER).passed
    assert not checks.check_idle_sync("cudaStreamSynchronize", OTHER).passed
    real = next(iter(kineto.idle_after_syncs(REAL)["by_sync_us"]))
    assert real != "cudaDeviceSynchronize" and not checks.check_idle_sync("cudaDeviceSynchronize", REAL).passed
    # a trace in which no sync leaves the device idle has no right answer, and says why
    launch_bound = _synthetic(kernels=[(0, 10, 1), (30, 10, 2)],
                              calls=[("cudaLaunchKernel", -3, 2, 1), ("cudaLaunchKernel", 25, 2, 2),
                                     ("cudaDeviceSynchronize", 28, 14, None)])
    verdict = checks.check_idle_sync("cudaDeviceSynchronize", launch_bound)
    assert not verdict.passed and verdict.category == "setup" and "launching too slowly" in verdict.message


def test_idle_sync_on_exported_serial_and_zos_runs():
    """The course's serial loop waits on each round's sample event (cudaEventSynchronize in the
    export) and the device idles after it; ZOS has the next forward queued before it waits."""
    for overhead in ("", "_overhead2ms"):
        serial, zos = (_stored_export(f"cpu_{m}{overhead}") for m in ("serial", "zos"))
        assert checks.check_idle_sync("cudaEventSynchronize", serial).passed
        for wrong in ("cudaStreamSynchronize", "cudaLaunchKernel", "wait"):
            assert not checks.check_idle_sync(wrong, serial).passed, wrong
        after = {name: kineto.idle_after_syncs(t) for name, t in (("serial", serial), ("zos", zos))}
        per_round = {m: a["by_sync_us"].get("cudaEventSynchronize", 0.0) / a["rounds"] for m, a in after.items()}
        assert per_round["zos"] < 0.5 * per_round["serial"], per_round  # recorded on a quiet machine
        # notebook 06's words: most of serial's idle follows the sync; most of ZOS's is gaps without one
        assert after["serial"]["by_sync_us"]["cudaEventSynchronize"] > 0.5 * after["serial"]["idle_us"], after
        assert after["zos"]["no_sync_us"] > 0.5 * after["zos"]["idle_us"], after


def test_idle_sync_on_a_fresh_serial_run(shipped, tmp_path):
    """What the notebook does: a live serial run, exported, then the check on that file."""
    model, alphabet = shipped
    with te.Engine(te.EngineConfig(mode="serial", device="cpu", host_overhead_ms=1.0), model=model,
                   tokenizer=te.CharTokenizer(alphabet)) as engine:
        engine.generate(default_workload(4), max_new_tokens=8)
        path = tmp_path / "serial.json"
        kineto.export(engine.timeline, path)
    assert checks.check_idle_sync("cudaEventSynchronize", path).passed
    assert not checks.check_idle_sync("cudaStreamSynchronize", path).passed


def test_idle_sync_on_a_broken_trace_is_a_verdict_not_an_exception(tmp_path):
    verdict = checks.check_idle_sync("cudaStreamSynchronize", tmp_path / "missing.json.gz")
    assert not verdict.passed and verdict.category == "setup" and "cannot read trace file" in verdict.message


# ---------------------------------------------------------------------------- the CUDA profiles

def test_cuda_profiles_need_both_modes(tmp_path):
    first, second = tmp_path / "shipped", tmp_path / "artifacts"
    first.mkdir()
    second.mkdir()
    assert kineto.cuda_profiles((first, second)) == {}
    (first / "torch_profile_serial.json.gz").write_bytes(b"")
    assert kineto.cuda_profiles((first, second)) == {}  # one mode alone is not a comparison
    for mode in ("serial", "zos"):
        (second / f"torch_profile_{mode}.json.gz").write_bytes(b"")
    assert kineto.cuda_profiles((first, second)) == {m: second / f"torch_profile_{m}.json.gz" for m in ("serial", "zos")}
    assert kineto.CUDA_TRACES_DIRS[0] == REPO / "overlap_course" / "traces" / "cuda"


def _profile_cuda():
    spec = importlib.util.spec_from_file_location("profile_cuda", REPO / "scripts" / "profile_cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_script_steps_once_per_pass_on_the_cpu_path(shipped, tmp_path):
    """The profiler code path on this CPU-only torch (ProfilerActivity.CPU): one ProfilerStep per
    pass of the loop plus the empty last one; the host-only trace is refused by the reader with
    the CPU-only message (on a GPU, ProfilerActivity.CUDA adds the kernels)."""
    from torch.profiler import ProfilerActivity

    profile_cuda = _profile_cuda()
    model, alphabet = shipped
    with te.Engine(te.EngineConfig(mode="zos", device="cpu"), model=model,
                   tokenizer=te.CharTokenizer(alphabet)) as engine:
        prof = profile_cuda.profile_generate(engine, default_workload(2), 4, [ProfilerActivity.CPU])
        passes = [s for s in engine.timeline.lane("host") if s.stage == "schedule"]
    path = tmp_path / "torch_profile_zos.json.gz"
    prof.export_chrome_trace(str(path))
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = sorted((e["ts"], e["name"]) for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert [name for _, name in steps] == [f"ProfilerStep#{i}" for i in range(1, len(passes) + 2)]
    with pytest.raises(ValueError, match="CPU-only profile"):
        kineto.summary(path)


def test_profile_script_without_cuda_skips_with_a_reason(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: scripts/gpu_check.sh runs the real thing")
    assert _profile_cuda().main(["--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "skipped: no CUDA GPU" in out and not (tmp_path / "out").exists()


def test_gpu_check_records_the_profiles():
    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    assert '"$PY" scripts/profile_cuda.py --device cuda --out "$OUT"' in text


@pytest.mark.skipif(not kineto.cuda_profiles(), reason="no torch.profiler traces of the CUDA engine here "
                    "(written by scripts/gpu_check.sh on a GPU machine into artifacts/gpu/)")
def test_recorded_cuda_profiles_read_and_show_the_pattern():
    paths = kineto.cuda_profiles()
    after = {m: kineto.idle_after_syncs(p) for m, p in paths.items()}
    for mode, path in paths.items():
        s = kineto.summary(path)
        assert 0 <= s["device_idle_fraction"] < 1 and after[mode]["rounds"] > 1, (mode, s)
    assert checks.check_idle_sync(next(iter(after["serial"]["by_sync_us"])), paths["serial"]).passed


def test_lesson_06_checks_are_exported():
    from overlap_course.checks import lesson06

    assert {"check_idle_share", "check_idle_sync"} <= set(checks.__all__)
    assert checks.check_idle_sync is lesson06.check_idle_sync
