"""Record torch.profiler (Kineto) traces of the engine's CUDA runs, serial and ZOS.

    python scripts/profile_cuda.py [--out artifacts/gpu]     # run by scripts/gpu_check.sh

For each mode it starts one engine on the GPU, does a warm-up run (the first forward is cold),
then records one ``generate`` under ``torch.profiler.profile(activities=[CPU, CUDA])`` with a
schedule, stepping the profiler once per pass of the engine's loop (the ``on_round`` plug-in,
called at the start of every ``schedule``): every pass becomes a ``ProfilerStep#N`` in the trace.
A last ``prof.step()`` after the run opens an empty step, so HTA's window (it leaves the last
step out) and ``overlap_course.traces.kineto.summary``'s are the whole run.  Written:

* ``OUT/torch_profile_serial.json.gz`` and ``OUT/torch_profile_zos.json.gz`` -- Kineto's Chrome
  trace JSON (``export_chrome_trace``), gzip; open them in https://ui.perfetto.dev;
* ``OUT/torch_profile_summary.json`` -- ``kineto.summary`` and ``kineto.idle_after_syncs`` of
  both, with the GPU's name, torch's version and the workload.

The three are written all or none (``safe_json.whole_set``): an interrupted or failed run
leaves ``OUT`` as it was.

Notebook 06 reads these files when they are in ``overlap_course/traces/cuda/`` (copy them there to
ship them) or in ``artifacts/gpu/`` (``overlap_course.traces.kineto.cuda_profiles``).  Without CUDA the
script says so and exits with status 0, writing nothing (``--device cpu`` profiles the CPU
stand-in's host process instead, which has no device events: a check of this code path only).
"""

from __future__ import annotations

import _signal  # loaded at Python's start, as are os and sys: no import before SIGINT is held
import os.path
import sys

# POSIX: a Ctrl-C while the course package imports waits for interruptible's handler
_held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(
    _signal, "pthread_sigmask") else None
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout
from overlap_course.ctrl_c import interruptible  # noqa: E402

interruptible(__name__, "profile_cuda", _held)  # first: a Ctrl-C from here is one line, 130

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from overlap_course.command_line import (Parser, fail, importing, locked, out_folder,  # noqa: E402
                                         run, whole_number)
from overlap_course.safe_json import whole_set  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

MODES = ("serial", "zos")


def profile_generate(engine, prompts, max_new_tokens: int, activities) -> "torch.profiler.profile":
    """One ``engine.generate`` under the profiler, one ProfilerStep per pass of the loop.
    Returns the finished profiler (``export_chrome_trace`` works on it)."""
    from torch.profiler import profile, schedule

    # warmup=1: step 0 (generate's set-up, up to the first pass) only warms the profiler up; every
    # pass is recorded, pass k as ProfilerStep#k.  The loop never reaches the end of `active`.
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1_000_000),
                   record_shapes=False, with_stack=False)
    with prof:
        engine.generate(prompts, max_new_tokens=max_new_tokens, on_round=lambda _engine, _round: prof.step())
        prof.step()  # the empty last step (HTA leaves the last step out of its window)
    return prof


def record(mode: str, part: str, device: str, prompts: int, max_new_tokens: int) -> None:
    """Profile one mode into ``part`` (a ``.json.gz`` name: torch writes gzip)."""
    import torch
    from torch.profiler import ProfilerActivity

    import toy_engine as te
    from overlap_course.measure.bench import default_workload

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    workload = default_workload(prompts)
    with te.Engine(te.EngineConfig(mode=mode, device=device)) as engine:
        engine.generate(workload, max_new_tokens=max_new_tokens)  # warm-up
        prof = profile_generate(engine, workload, max_new_tokens, activities)
        if device == "cuda":
            torch.cuda.synchronize()
    prof.export_chrome_trace(part)


def measured(path: Path, part: str) -> dict:
    """What ``kineto`` measures of one profile, read at ``part`` and named as ``path``."""
    from overlap_course.safe_json import quoted
    from overlap_course.traces import kineto

    try:
        trace = kineto.KinetoTrace(part, where=f"trace file {quoted(str(path), 200)}")
        s, idle = kineto.summary(trace), kineto.idle_after_syncs(trace)
        return {"file": path.name, "device_idle_fraction": s["device_idle_fraction"],
                "host_wait_share": s["host_wait_share"], "idle_us": idle["idle_us"],
                "idle_after_syncs_us": idle["by_sync_us"], "rounds": idle["rounds"]}
    except ValueError as err:  # e.g. --device cpu: a host-only profile
        return {"file": path.name, "error": str(err)}


def main(argv=None) -> int:
    with importing("profile_cuda"):  # torch would swallow a Ctrl-C while it first imports
        import torch
        from overlap_course.measure.bench import MAX_NEW_TOKENS, MAX_REQUESTS
    # Bounded as the bench bounds them: junk is one line before an engine starts.
    p = Parser(prog="profile_cuda", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "artifacts" / "gpu"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--prompts", type=whole_number(1, MAX_REQUESTS), default=8)
    p.add_argument("--max-new-tokens", type=whole_number(1, MAX_NEW_TOKENS), default=32)
    a = p.parse_args(argv)
    try:
        a.out = out_folder(a.out)
    except ValueError as exc:  # a file, under a file: before an engine starts
        return fail("profile_cuda", exc)

    if a.device == "cuda" and not torch.cuda.is_available():
        print("profile_cuda: skipped: no CUDA GPU visible to torch, so there are no GPU kernels to profile "
              "(the lesson then uses the shipped A100 trace and your CPU stand-in exports)")
        return 0
    args = argv if argv is not None else sys.argv[1:]
    report = {"device": (torch.cuda.get_device_name(0) if a.device == "cuda"
                         else "cpu (host process only)"),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "workload": {"prompts": a.prompts, "max_new_tokens": a.max_new_tokens},
              "command": "python scripts/profile_cuda.py " + " ".join(args)}
    busy = (f"--out {str(a.out)!r} is being written by another command running now: wait "
            f"for it to end, or name another --out; nothing was written")
    try:  # --out made for the files, and removed again if the engine refuses the workload
        # The three files all or none: a Ctrl-C during the ZOS run left the new serial trace
        # beside the earlier run's ZOS trace and summary.
        with locked(a.out, busy) as lock, \
                whole_set(check=lambda: lock.still_held("--out")) as files:
            parts = {mode: files.part(a.out / f"torch_profile_{mode}.json.gz", ".json.gz")
                     for mode in MODES}
            summary = files.part(a.out / "torch_profile_summary.json", ".json")
            for mode, part in parts.items():
                record(mode, part, a.device, a.prompts, a.max_new_tokens)
            for mode, part in parts.items():
                report[mode] = measured(a.out / f"torch_profile_{mode}.json.gz", part)
            Path(summary).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    except ValueError as exc:  # a prompt too long for the model's context, or --out busy
        return fail("profile_cuda", exc)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    run("profile_cuda", main)  # Ctrl-C: one line, 130 (a second one ends it at once)
