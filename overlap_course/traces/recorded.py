"""The recorded quiet-machine traces shipped in ``overlap_course/traces/``.

They are the honest fallback of every live comparison: when this machine is busy (or
has fewer than 2 usable CPUs), the bench and the notebooks show these beside the live
run, labelled with the machine, date and commit they were recorded at.  Recorded with
``scripts/record_traces.py``, which names each file with :func:`trace_name`; what a trace
holds (mode, host overhead, draft tokens, device, workload) is read from its own ``meta``,
never parsed back out of its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from overlap_course.safe_json import quoted
from toy_engine.runinfo import TimelineMeta, from_json_object
from toy_engine.timeline import Timeline

__all__ = ["TRACES_DIR", "RECORDED_WORKLOAD", "Recording", "recording", "trace_name", "device_kind",
           "available_traces", "shipped_trace_file", "load_trace", "recorded_runs",
           "recorded_label"]

TRACES_DIR = Path(__file__).parent

#: The workload the traces are recorded with: the one the notebooks' live comparisons run
#: (03b, 04 and 05 benchmark 8 requests x 48 new tokens at batch 8), so that a RECORDED row
#: beside a live one compares like with like.
RECORDED_WORKLOAD = dict(requests=8, max_new_tokens=48, batch_size=8)


@dataclass(frozen=True)
class Recording:
    """How, where, when and at which commit a shipped trace was recorded
    (``meta.annotations["recorded"]``, written by ``scripts/record_traces.py``)."""

    command: str
    date: str  # ISO 8601, UTC
    commit: str | None  # "+dirty" when tracked files differed from it
    machine: dict  # node, platform, python, CPUs, load average, torch (and the GPU)
    torch: str
    model: str
    prompts: str  # the function that made the prompts
    race_check: bool
    kept: str  # which of the runs was kept, and why
    nice: int
    tokens_per_s_all_runs: list[float]
    device_cpu_share_all_runs: list[float | None]
    contention: dict  # the kept run's contention meter


def recording(timeline: Timeline) -> Recording | None:
    """How the trace was recorded; None for a live run."""
    raw = timeline.meta.annotations.get("recorded")
    return None if raw is None else from_json_object(Recording, raw, "timeline meta['annotations']['recorded']")


def device_kind(device_name: str | None) -> str:
    """``cpu`` for the CPU stand-in (``cpu-process``), else ``cuda``: how traces are told apart."""
    return "cpu" if device_name == "cpu-process" else "cuda"


def trace_name(mode: str, host_overhead_ms: float = 0.0, device: str = "cpu", drafts: int = 0) -> str:
    """File stem of a recorded trace: ``cpu_zos``, ``cpu_serial_overhead2ms``, ``cpu_zos_spec4``, ..."""
    spec = f"_spec{drafts}" if drafts else ""
    suffix = f"_overhead{host_overhead_ms:g}ms" if host_overhead_ms else ""
    return f"{device}_{mode}{spec}{suffix}"


def available_traces() -> list[str]:
    """Names of the recorded traces shipped with the package (for :func:`load_trace`)."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.json"))


def shipped_trace_file(name: str) -> Path:
    """The file of the shipped trace ``name``, refused unless ``name`` is one of
    :func:`available_traces`: a name with a ``/`` or ``..`` (``../../tmp/big``) would reach any
    ``X.json`` on the machine, read whole (a 3 GB one: a ``MemoryError``)."""
    shipped = available_traces()
    if name not in shipped:
        path_like = isinstance(name, str) and ("/" in name or "\\" in name or ".." in name)
        hint = (" (no file of that name exists; a shipped name has no '/' or '..')"
                if path_like else "")
        raise ValueError(f"no recorded trace {quoted(name)}{hint}; available: "
                         f"{', '.join(shipped) or 'none'}")
    return TRACES_DIR / f"{name}.json"


def load_trace(name: str) -> Timeline:
    """A shipped, recorded timeline by name, e.g. ``load_trace("cpu_zos")`` or
    ``load_trace("cpu_serial_overhead2ms")``.

    :func:`recording` says how, where, when and at which commit it was recorded (and its
    contention meter), ``meta.stats`` carries the run's stats.
    """
    return Timeline.from_json(shipped_trace_file(name))


def recorded_runs(host_overhead_ms: float = 0.0, modes=("serial", "zos"), device: str = "cpu",
                  drafts: int = 0) -> dict:
    """The recorded quiet-machine timelines for ``modes`` (mode -> Timeline), with
    ``drafts`` draft tokens per round (0: no speculation).

    The trace with the nearest recorded host overhead is used (its ``meta`` says which);
    an empty dict when none with that many drafts is shipped.
    """
    metas = {path: from_json_object(TimelineMeta, json.loads(path.read_text(encoding="utf-8"))["meta"], path.name)
             for path in sorted(TRACES_DIR.glob("*.json"))}
    recorded = {}
    for mode in modes:
        candidates = {meta.host_overhead_ms: path for path, meta in metas.items()
                      if meta.mode == mode and device_kind(meta.device) == device and meta.num_draft_tokens == drafts}
        if candidates:
            nearest = min(candidates, key=lambda h: (abs(h - host_overhead_ms), h))
            recorded[mode] = Timeline.from_json(candidates[nearest])
    return recorded


def recorded_label(timeline: Timeline) -> str:
    """'<machine> (CPUs, load), <date> UTC, commit <sha>': where a shipped trace comes from."""
    rec = recording(timeline)
    if rec is None:
        raise ValueError("this timeline is a live run, not a recorded trace (figures.load_trace(name) loads one)")
    where = rec.machine
    cpus = where.get("usable_cpus", where.get("cpus"))
    load = where.get("load_average")
    parts = [f"{where.get('node', '?')} ({cpus} CPUs" + (f", load {load[0]}" if load else "") + ")",
             rec.date[:16].replace("T", " ") + " UTC", f"commit {(rec.commit or '?')[:10]}"]
    return ", ".join(parts)
