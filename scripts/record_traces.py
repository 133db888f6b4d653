"""Record the timelines shipped in ``toy_engine/traces/`` (read with ``viz.load_trace``).

    python scripts/record_traces.py                 # auto device: CUDA if present, else CPU stand-in
    python scripts/record_traces.py --device cuda   # on a GPU machine: CUDA-event timelines

For each mode it starts one engine, does a warm-up run (the first forward is cold and
would dominate the picture), then ``--repeats`` recorded runs, and keeps the run with
the median tokens/s, so one unlucky slice of a shared machine does not become the
course's example.  The result is written to ``toy_engine/traces/<device>_<mode>.json``
(``<device>`` is ``cpu`` or ``cuda``) with ``meta`` saying how it was recorded.
Keep the workload small: a trace is a teaching picture, not a benchmark (< 200 KB).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

import torch

from toy_engine import CharTokenizer, Engine, EngineConfig, GPTConfig, TinyGPT, load_model
from toy_engine.bench import default_workload
from toy_engine.model import CHECKPOINT

OUT_DIR = Path(__file__).resolve().parent.parent / "toy_engine" / "traces"


def _model():
    try:
        model, alphabet = load_model()
        return model, CharTokenizer(alphabet), f"checkpoint {CHECKPOINT.name}"
    except FileNotFoundError:
        tok = CharTokenizer()
        return TinyGPT(GPTConfig(vocab_size=tok.vocab_size)), tok, "untrained TinyGPT (no checkpoint yet)"


def _machine() -> dict:
    info = dict(node=platform.node(), platform=platform.platform(), python=platform.python_version(),
                cpus=os.cpu_count(), torch=torch.__version__)
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def record(mode: str, args, model, tokenizer, model_desc: str) -> Path:
    config = EngineConfig(mode=mode, device=args.device, max_batch_size=args.batch_size,
                          num_draft_tokens=args.drafts, host_overhead_ms=args.host_overhead,
                          race_check=False)
    prompts = default_workload(args.requests)
    with Engine(config, model=model, tokenizer=tokenizer) as engine:
        engine.generate(prompts, max_new_tokens=args.max_new_tokens)  # warm-up, not kept
        runs = []
        for _ in range(args.repeats):
            engine.generate(prompts, max_new_tokens=args.max_new_tokens)
            runs.append((engine.stats["tokens_per_s"], engine.timeline, dict(engine.stats)))
        device_name = engine.device.name
    median = statistics.median_low([tps for tps, _, _ in runs])
    _, timeline, stats = next(r for r in runs if r[0] == median)
    kind = "cuda" if device_name not in ("cpu-process",) else "cpu"
    timeline.meta.update(
        recorded=dict(command=" ".join(shlex.quote(a) for a in ["python"] + sys.argv),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      machine=_machine(), torch=torch.__version__, model=model_desc,
                      workload=dict(requests=args.requests, max_new_tokens=args.max_new_tokens,
                                    prompts="toy_engine.bench.default_workload"),
                      race_check=False, kept=f"median tokens/s of {args.repeats} runs after 1 warm-up",
                      tokens_per_s_all_runs=[round(r[0], 1) for r in runs]),
        stats=stats)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{kind}_{mode}.json"
    timeline.to_json(path)
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--modes", nargs="+", default=["serial", "zos"], choices=["serial", "zos"])
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--drafts", type=int, default=0)
    p.add_argument("--host-overhead", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT_DIR)
    args = p.parse_args(argv)
    model, tokenizer, desc = _model()
    for mode in args.modes:
        path = record(mode, args, model, tokenizer, desc)
        size = path.stat().st_size
        print(f"{path}  {size / 1024:.1f} KB")
        if size > 200_000:
            print(f"warning: {path.name} is over 200 KB; record a shorter run", file=sys.stderr)


if __name__ == "__main__":
    main()
