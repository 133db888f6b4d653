"""Serial vs ZOS (and speculative variants) on one workload, side by side, in one process.

    python -m overlap_course.measure.bench            # a table
    python -m overlap_course.measure.bench --json     # the same numbers as JSON

Each mode gets its own engine (start-up is not timed) and one warm-up run; then the
modes run in turn, ``--repeats`` times, so slow phases of a shared machine hit all
modes alike.  Per mode the median run is reported.  The *ideal* ZOS speed-up comes
from the serial run's own per-round host and device times: overlapping them perfectly
turns ``host + device`` into ``max(host, device)``.

On the unpaced CPU stand-in the "device" is a process that needs a core of its own, so a busy
machine can shrink or even invert the measured gain.  Every run therefore carries the
contention meter (:mod:`overlap_course.measure.contention`); when a run was busy,
or too few CPUs are usable, the table says so and prints the comparison recorded on
a quiet machine (``overlap_course/traces``), labelled with where, when and at which commit.

With fewer than 2 usable CPUs ``device="auto"`` picks the *paced* stand-in (its kernels last
what a time model says, sleeping out what their compute left): the table and the JSON say PACED
with the model's numbers and why it was chosen, the device's measured compute CPU per round
beside its paced time, and the best ratio one core allows, ``(h + P) / max(P, h + c)`` (host
CPU h, paced device time P, device compute c per round: both must fit a paced round).
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

PROG = "python -m overlap_course.measure.bench"
interruptible(__name__, PROG)  # first: Ctrl-C while the imports run is one line

import statistics
import sys
from dataclasses import asdict

from overlap_course.command_line import (Parser, emit, fail, finite_number, interrupted,
                                         os_problem, run, whole_number)
from overlap_course.corpus import generate_corpus
from overlap_course.safe_json import dumps
from overlap_course.traces.recorded import recorded_label, recorded_runs
from toy_engine.config import (MAX_BATCH_SIZE, MAX_DRAFT_TOKENS, MAX_HOST_OVERHEAD_MS,
                               MAX_TEMPERATURE, EngineConfig)
from toy_engine.device import DeviceError
from toy_engine.engine import Engine
from toy_engine.interrupts import hold_sigint
from toy_engine.model import GPTConfig
from toy_engine.validate import check_float, check_int

from . import machine
from .contention import contention

COLUMNS = [
    ("tokens_per_s", "tok/s", "{:.0f}"),
    ("wall_ms", "wall ms", "{:.0f}"),
    ("device_busy_ms", "dev busy ms", "{:.0f}"),
    ("decode_device_idle_fraction", "dev idle (decode)", "{:.3f}"),
    ("mean_host_ms_per_round", "host ms/round", "{:.2f}"),
    ("mean_device_ms_per_round", "dev ms/round", "{:.2f}"),
    ("host_cpu_ms_per_round", "host CPU ms/round", "{:.2f}"),
    ("device_cpu_ms_per_round", "dev CPU ms/round", "{:.2f}"),
    ("mean_accepted_per_round", "acc/round", "{:.2f}"),
    ("device_cpu_share", "dev CPU share", "{:.2f}"),
    ("device_late_fraction", "paced dev late", "{:.1%}"),
    ("equal_to_serial", "= serial", "{}"),
]


def recorded_comparison_text(host_overhead_ms: float = 0.0, drafts: int = 0, workload: dict | None = None) -> str:
    """The recorded serial-vs-ZOS numbers (with ``drafts`` draft tokens: serial+spec vs
    zos+spec) as one labelled paragraph, for the bench and notebooks.  ``workload``: the live
    run's (``num_requests``, ``max_new_tokens``); the text says so when the recording's differs."""
    runs = recorded_runs(host_overhead_ms, drafts=drafts)
    spec = f"+spec (k = {drafts})" if drafts else ""
    if set(runs) != {"serial", "zos"}:
        return f"no recorded quiet-machine trace is shipped for serial{spec} vs zos{spec}"
    s, z = (runs[m].meta.stats for m in ("serial", "zos"))
    w = runs["zos"].meta.workload
    overhead = runs["zos"].meta.host_overhead_ms
    name = "+spec" if drafts else ""
    text = (f"RECORDED on a quiet machine: {recorded_label(runs['zos'])}; {w.requests} requests x "
            f"{w.max_new_tokens} new tokens, host overhead {overhead:g} ms/round"
            f"{f', {drafts} draft tokens' if drafts else ''}: "
            f"serial{name} {s.tokens_per_s:.0f} tok/s, zos{name} {z.tokens_per_s:.0f} tok/s, "
            f"zos{name}/serial{name} x{z.tokens_per_s / max(s.tokens_per_s, 1e-9):.2f}; "
            f"device idle (decode) {s.decode_device_idle_fraction:.1%} -> {z.decode_device_idle_fraction:.1%}")
    if workload and (workload.get("num_requests"), workload.get("max_new_tokens")) != (w.requests, w.max_new_tokens):
        text += (f" (a different workload from the live run's {workload.get('num_requests')} requests x "
                 f"{workload.get('max_new_tokens')} new tokens: compare ratios, not tokens/s)")
    return text


def default_workload(num_requests: int = 16, seed: int = 1) -> list[str]:
    """Prompts of mixed lengths (5 to ~60 characters), cut from the corpus."""
    docs = generate_corpus(seed=seed, num_chars=20_000)
    lengths = [5, 12, 20, 30, 45, 60]
    return [docs[i % len(docs)][: lengths[i % len(lengths)]] for i in range(num_requests)]


def ideal_ratio(host_ms: float, device_ms: float) -> float:
    """The best speed-up overlap can give a run: a serial round costs host + device, a perfectly
    overlapped one max(host, device) (the serial run's per-round means)."""
    return (host_ms + device_ms) / max(host_ms, device_ms)


def one_core_ratio(host_cpu_ms: float, paced_ms: float, device_cpu_ms: float) -> float:
    """The best a paced run on one core can do: the host's CPU and the device's compute of a round
    must both fit one paced round, (h + P) / max(P, h + c)."""
    return (host_cpu_ms + paced_ms) / max(paced_ms, host_cpu_ms + device_cpu_ms)


def cpu_per_round(timeline) -> dict:
    """The CPU time host work (waits left out) and device kernels really got, per round."""
    rounds = len(timeline.rounds()) or 1
    return {f"{lane}_cpu_ms_per_round": sum(s.cpu_ms or 0.0 for s in timeline.spans
                                            if s.lane == lane and s.stage != "wait") / rounds
            for lane in ("host", "device")}


def _median(runs: list[dict]) -> dict:
    """Per statistic, the median over the runs.  A measurement a run could not make (others_cpus
    of a run under 0.2 s) is None: the median is over the runs that made it."""
    keys = {k for r in runs for k, v in r.items() if isinstance(v, (int, float))}
    return {k: statistics.median([r[k] for r in runs if isinstance(r.get(k), (int, float))]) for k in keys}


def _ratios(m: dict, paced: bool = False) -> dict:
    """ZOS against serial (and with speculation), measured and ideal (paced: the one-core bound too)."""
    out = {}
    for fast, slow in (("zos", "serial"), ("zos+spec", "serial+spec")):
        if fast in m and slow in m:
            ideal = ideal_ratio(m[slow]["mean_host_ms_per_round"], m[slow]["mean_device_ms_per_round"])
            ratio = m[fast]["tokens_per_s"] / m[slow]["tokens_per_s"]
            out[f"{fast} / {slow}"] = dict(
                throughput_ratio=ratio, ideal_ratio=ideal, ratio_over_ideal=ratio / ideal,
                decode_idle_ratio=(m[fast]["decode_device_idle_fraction"] / m[slow]["decode_device_idle_fraction"]
                                   if m[slow]["decode_device_idle_fraction"] else 0.0))
            if paced:
                out[f"{fast} / {slow}"]["one_core_ratio"] = one_core_ratio(
                    m[slow]["host_cpu_ms_per_round"], m[slow]["mean_device_ms_per_round"],
                    m[slow]["device_cpu_ms_per_round"])
    return out


MODES = ("serial", "zos", "serial+spec", "zos+spec")
MAX_REPEATS = 100
MAX_REQUESTS = 10_000
# A prompt takes at least one of the model's positions; the rest can be new tokens.
MAX_NEW_TOKENS = GPTConfig.context_len - 1


def _configs(modes, device, max_batch_size, num_draft_tokens, host_overhead_ms,
             race_check) -> dict[str, EngineConfig]:
    """Each mode's engine configuration, checked (EngineConfig checks its fields)."""
    if isinstance(modes, str) or not modes:
        raise ValueError(f"modes must be a non-empty list of {', '.join(MODES)}; got {modes!r}")
    configs = {}
    for mode in modes:
        if mode not in MODES or mode in configs:
            why = "named twice" if mode in configs else "unknown"
            raise ValueError(f"mode {str(mode)[:40]!r} is {why}: modes are {', '.join(MODES)}, "
                             f"each at most once")
        base, _, spec = mode.partition("+")
        if spec and num_draft_tokens == 0:
            raise ValueError(f"mode {mode!r} speculates with num_draft_tokens = 0 (no drafts): "
                             f"give num_draft_tokens >= 1 or leave the +spec modes out")
        configs[mode] = EngineConfig(mode=base, device=device, max_batch_size=max_batch_size,
                                     num_draft_tokens=num_draft_tokens if spec else 0,
                                     host_overhead_ms=host_overhead_ms, race_check=race_check)
    return configs


def run_bench(modes=("serial", "zos"), num_draft_tokens: int = 4, repeats: int = 3,
              num_requests: int = 16, max_new_tokens: int = 96, max_batch_size: int = 8,
              host_overhead_ms: float = 0.0, device: str = "auto", temperature: float = 0.0,
              race_check: bool = False) -> dict:
    """Run every mode on the same prompts; return per-mode medians and the ratios.  Every
    argument is checked (``ValueError`` / ``TypeError`` naming it) before an engine starts."""
    configs = _configs(modes, device, max_batch_size, num_draft_tokens, host_overhead_ms,
                       race_check)
    repeats = check_int("repeats", repeats, 1, MAX_REPEATS)
    num_requests = check_int("num_requests", num_requests, 1, MAX_REQUESTS)
    kw = dict(max_new_tokens=check_int("max_new_tokens", max_new_tokens, 1),
              temperature=check_float("temperature", temperature, 0.0, MAX_TEMPERATURE), seed=0)
    prompts = default_workload(num_requests)
    engines = {}
    runs = {m: [] for m in modes}
    outputs = {}
    try:
        for mode, config in configs.items():
            engines[mode] = Engine(config)
        for mode, engine in engines.items():  # warm-up
            outputs[mode] = [c.token_ids for c in engine.generate(prompts, **kw)]
        for _ in range(repeats):
            for mode, engine in engines.items():
                outs = engine.generate(prompts, **kw)
                meter = {k: v for k, v in contention(engine.timeline).items() if k != "busy"}
                runs[mode].append(dict(asdict(engine.stats), **meter, **cpu_per_round(engine.timeline)))
                outputs[mode] = [c.token_ids for c in outs]  # (a run as a dict: medians per key, JSON)
        device_name = next(iter(engines.values())).device.name
        pacing = getattr(next(iter(engines.values())).device, "pacing", None)
    finally:  # every engine, held: a Ctrl-C replayed by one close() would leave the rest to
        with hold_sigint():  # finalizers, where a press is an "Exception ignored" traceback
            for engine in engines.values():
                engine.close()

    reference = outputs.get("serial")
    report = machine.machine_report()
    result = {"workload": dict(num_requests=num_requests, max_new_tokens=max_new_tokens,
                               max_batch_size=max_batch_size, host_overhead_ms=host_overhead_ms,
                               num_draft_tokens=num_draft_tokens, repeats=repeats, temperature=temperature),
              "device": device_name, "paced": pacing is not None, "pacing": pacing,
              "paced_because": None if pacing is None else (
                  f"chosen by device={device!r}" if device == "paced" else
                  f"chosen by device={device!r}: {report['allowed']:g} usable CPU(s), fewer than "
                  f"{machine.MIN_CPUS_FOR_OVERLAP}, and no GPU"),
              "machine": report,
              "modes": {mode: dict(_median(runs[mode]), equal_to_serial=reference is None or outputs[mode] == reference)
                        for mode in modes}}
    result.update(_ratios(result["modes"], pacing is not None))
    # Judged on every run, not the medians: one busy repeat is enough to distrust a ratio.
    result["busy_warning"] = machine.busy_warning(
        {f"{mode}, run {i + 1}": stats for mode in modes for i, stats in enumerate(runs[mode])},
        cuda=device_name not in ("cpu-process",))
    if result["busy_warning"]:
        live = dict(num_requests=num_requests, max_new_tokens=max_new_tokens)
        texts = [recorded_comparison_text(host_overhead_ms, drafts, live)
                 for fast, slow, drafts in (("zos", "serial", 0), ("zos+spec", "serial+spec", num_draft_tokens))
                 if fast in modes and slow in modes]
        result["recorded"] = "\n".join(texts)
    return result


def format_table(result: dict) -> str:
    w = result["workload"]
    lines = [f"device: {result['device']}; {w['num_requests']} requests x {w['max_new_tokens']} new tokens, "
             f"batch {w['max_batch_size']}, host overhead {w['host_overhead_ms']} ms/round, "
             f"{w['repeats']} repeats (medians)", ""]
    if result.get("pacing"):
        lines[1:1] = [f"{machine.pacing_text(result['pacing'])}; {result['paced_because']}."]
    # a paced device's CPU share is low by design: it is judged by how late its kernels end instead
    columns = [c for c in COLUMNS if c[0] != ("device_cpu_share" if result.get("paced") else "device_late_fraction")]
    header = f"{'mode':<12}" + "".join(f"{title:>19}" for _, title, _ in columns)
    lines += [header, "-" * len(header)]
    for mode, stats in result["modes"].items():
        cells = ("-" if stats.get(key) is None else fmt.format(stats[key]) for key, _, fmt in columns)
        lines.append(f"{mode:<12}" + "".join(f"{cell:>19}" for cell in cells))
    for key, value in result.items():
        if " / " in key:
            lines.append("")
            one_core = (f"; on one core at most x{value['one_core_ratio']:.2f} = (h + P) / max(P, h + c)"
                        if "one_core_ratio" in value else "")
            lines.append(f"{key}: throughput x{value['throughput_ratio']:.2f} (ideal x{value['ideal_ratio']:.2f}, "
                         f"{value['ratio_over_ideal']:.0%} of ideal{one_core}); decode idle fraction "
                         f"x{value['decode_idle_ratio']:.2f} of the slower mode's")
    if result.get("busy_warning"):
        lines += ["", result["busy_warning"], result.get("recorded", "")]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--repeats", type=whole_number(1, MAX_REPEATS), default=3)
    p.add_argument("--requests", type=whole_number(1, MAX_REQUESTS), default=16)
    p.add_argument("--max-new-tokens", type=whole_number(1, MAX_NEW_TOKENS),
                   default=96)
    p.add_argument("--batch-size", type=whole_number(1, MAX_BATCH_SIZE), default=8)
    p.add_argument("--num-draft-tokens", type=whole_number(0, MAX_DRAFT_TOKENS), default=4)
    p.add_argument("--host-overhead-ms", type=finite_number(0.0, MAX_HOST_OVERHEAD_MS),
                   default=0.0, help="extra, labelled host work per round (teaching knob)")
    p.add_argument("--temperature", type=finite_number(0.0, MAX_TEMPERATURE), default=0.0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "paced", "cuda"],
                   help="auto: CUDA if there is one, else the CPU stand-in (paced below 2 usable CPUs)")
    a = p.parse_args(argv)
    try:  # run_bench checks every argument, naming it, before an engine starts
        result = run_bench(tuple(a.modes.split(",")), a.num_draft_tokens, a.repeats, a.requests,
                           a.max_new_tokens, a.batch_size, a.host_overhead_ms, a.device,
                           a.temperature)
    except (ValueError, TypeError) as exc:
        return fail(PROG, exc)
    except OSError as exc:  # an engine the system would not start (a socket path too long...)
        return fail(PROG, os_problem(exc))
    except KeyboardInterrupt:  # run_bench closed its engines on the way out
        return interrupted(PROG)
    except DeviceError as exc:  # a device process died mid-run: no result, a runtime failure
        fail(PROG, exc)
        return 1
    emit(dumps(result, "the bench's result", indent=2) if a.json else format_table(result))
    return 0 if all(m["equal_to_serial"] for m in result["modes"].values()) else 1


if __name__ == "__main__":
    run(PROG, main)
