"""The recorded quiet-machine traces shipped in ``toy_engine/traces/``.

They are the honest fallback of every live comparison: when this machine is busy (or
has fewer than 2 usable CPUs), the bench and the notebooks show these beside the live
run, labelled with the machine, date and commit they were recorded at.  Recorded with
``scripts/record_traces.py``.  Plain Python (no torch, no plotly).
"""

from __future__ import annotations

from pathlib import Path

from .timeline import Timeline

__all__ = ["TRACES_DIR", "trace_name", "recorded_runs", "recorded_label"]

TRACES_DIR = Path(__file__).parent / "traces"


def trace_name(mode: str, host_overhead_ms: float = 0.0, device: str = "cpu") -> str:
    """File stem of a recorded trace: ``cpu_zos``, ``cpu_serial_overhead2ms``, ..."""
    suffix = f"_overhead{host_overhead_ms:g}ms" if host_overhead_ms else ""
    return f"{device}_{mode}{suffix}"


def recorded_runs(host_overhead_ms: float = 0.0, modes=("serial", "zos"), device: str = "cpu") -> dict:
    """The recorded quiet-machine timelines for ``modes`` (mode -> Timeline).

    The trace with the nearest recorded host overhead is used (its ``meta`` says which);
    an empty dict when none is shipped.
    """
    recorded = {}
    for mode in modes:
        candidates = {}
        for path in TRACES_DIR.glob(f"{device}_{mode}*.json"):
            stem = path.stem
            if stem == trace_name(mode, 0.0, device):
                candidates[0.0] = path
            elif stem.startswith(f"{device}_{mode}_overhead") and stem.endswith("ms"):
                try:
                    candidates[float(stem[len(f"{device}_{mode}_overhead"):-2])] = path
                except ValueError:
                    continue
        if candidates:
            nearest = min(candidates, key=lambda h: (abs(h - host_overhead_ms), h))
            recorded[mode] = Timeline.from_json(candidates[nearest])
    return recorded


def recorded_label(timeline: Timeline) -> str:
    """'<machine> (CPUs, load), <date> UTC, commit <sha>': where a shipped trace comes from."""
    rec = timeline.meta.get("recorded", {})
    where = rec.get("machine", {})
    cpus = where.get("usable_cpus", where.get("cpus"))
    load = where.get("load_average")
    parts = [f"{where.get('node', '?')} ({cpus} CPUs" + (f", load {load[0]}" if load else "") + ")",
             str(rec.get("date", "?"))[:16].replace("T", " ") + " UTC",
             f"commit {str(rec.get('commit') or '?')[:10]}"]
    return ", ".join(parts)
