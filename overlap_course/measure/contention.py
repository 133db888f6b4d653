"""The contention meter: was the machine busy while a run was timed?

The engine records, for every span, the CPU time its process (device) or thread (host)
really got (``Span.cpu_ms``).  On the CPU stand-in the device is a process that needs a
core; when other work takes that core, a 3 ms forward takes 6 ms of wall time with 3 ms
of CPU.  ``wall >> CPU`` is how a figure tells "the machine was busy" from "the device
was idle".  A snapshot of the machine's CPU counters taken around each run
(:func:`watch_runs`, installed when ``overlap_course.measure`` is imported) adds the one
kind of contention a process's own CPU time cannot see: other programs sharing caches and
memory bandwidth.  The thresholds' measurements are in ``docs/measurements/contention.md``.

A *paced* run (``device="paced"``, or ``"auto"`` with fewer than 2 usable CPUs) is judged
differently: its device spans last as long as the stand-in's time model says (``Span.paced_ms``),
sleeping out whatever the real compute left, so their CPU share is low by design.  What
spoils such a run is a kernel whose compute did not fit its paced time: the span ends *late*.
Other programs' CPU use (the other learners on a hub's machine) is reported but does not make a
paced run busy by itself: if their load slowed it, its kernels ended late or its host lost its core.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

from toy_engine import engine as _engine
from toy_engine.runinfo import from_json_object
from toy_engine.timeline import LANES, Span, Timeline

from .machine import cpu_snapshot

__all__ = ["PREEMPTED_CPU_SHARE", "PREEMPTED_MIN_MS", "BUSY_RUN_CPU_SHARE", "BUSY_OTHERS_CPUS", "PACED_LATE_SHARE",
           "MachineLoad", "cpu_share", "late_ms", "preempted", "cpu_shares", "busy_stretches", "contention",
           "machine_load", "record_machine_load", "watch_runs"]

#: A span that got less than this share of its wall time as CPU was preempted: ready to
#: run, but without a core.  Host ``wait`` spans block on purpose and are never judged;
#: spans under ``PREEMPTED_MIN_MS`` neither (one timer tick decides their ratio).
PREEMPTED_CPU_SHARE = 0.7
PREEMPTED_MIN_MS = 0.2
#: A run is busy when its device spans, or its host work (``wait`` excluded), got less
#: than this share of their wall time as CPU over the whole run.
BUSY_RUN_CPU_SHARE = 0.85
#: ... or when other programs used more than this many CPUs of the machine during it.
BUSY_OTHERS_CPUS = 0.25
#: A paced span is late when it ended more than this share of its paced time (and at least
#: ``PREEMPTED_MIN_MS``) after the model said; a paced run is busy when its device spans ended,
#: all together, more than this share of their paced time late.
PACED_LATE_SHARE = 0.10


@dataclass(frozen=True)
class MachineLoad:
    """The machine around one run (``meta.annotations["machine_load"]``): its CPUs, the run's
    wall time, and how many CPUs other programs used meanwhile (None: not judged)."""

    cpus: int
    wall_s: float
    others_cpus: float | None


def machine_load(timeline: Timeline) -> MachineLoad | None:
    """The load measured around the timeline's run; None when it was not measured."""
    raw = timeline.meta.annotations.get("machine_load")
    return None if raw is None else from_json_object(MachineLoad, raw, "timeline meta['annotations']['machine_load']")


def cpu_share(span: Span) -> float | None:
    """The span's CPU time / wall time (None when not measured or the span is empty)."""
    if span.cpu_ms is None or span.duration_ms <= 0:
        return None
    return min(1.0, span.cpu_ms / span.duration_ms)


def late_ms(span: Span) -> float | None:
    """How much later than its time model a paced span ended (None: not paced)."""
    return None if span.paced_ms is None else max(0.0, span.duration_ms - span.paced_ms)


def preempted(span: Span, threshold: float = PREEMPTED_CPU_SHARE) -> bool:
    """Work that was ready but got no core for a good part of its wall time; for a paced span,
    one that ended late (its compute did not fit its paced time)."""
    if span.paced_ms is not None:
        return late_ms(span) > max(PREEMPTED_MIN_MS, PACED_LATE_SHARE * span.paced_ms)
    share = cpu_share(span)
    return (span.stage != "wait" and share is not None and share < threshold
            and span.duration_ms >= PREEMPTED_MIN_MS)


def cpu_shares(timeline: Timeline) -> dict:
    """CPU time / wall time of device spans and of host work (``wait`` excluded: it blocks
    by design; paced spans too: they sleep by design).  None when no such span carries ``cpu_ms``."""
    out = {}
    for lane in LANES:
        spans = [s for s in timeline.spans
                 if s.lane == lane and s.cpu_ms is not None and s.stage != "wait" and s.paced_ms is None]
        wall = sum(s.duration_ms for s in spans)
        out[f"{lane}_cpu_share"] = min(1.0, sum(s.cpu_ms for s in spans) / wall) if wall > 0 else None
    return {"device_cpu_share": out["device_cpu_share"], "host_cpu_share": out["host_cpu_share"]}


def busy_stretches(timeline: Timeline, start_ms: float | None = None, end_ms: float | None = None,
                   threshold: float = PREEMPTED_CPU_SHARE, lane: str = "device") -> list[tuple[float, float, Span]]:
    """Preempted spans of ``lane`` clipped to a window: "machine busy", not "device idle"."""
    lo = -math.inf if start_ms is None else start_ms
    hi = math.inf if end_ms is None else end_ms
    return [(max(s.start_ms, lo), min(s.end_ms, hi), s) for s in timeline.lane(lane)
            if preempted(s, threshold) and s.end_ms > lo and s.start_ms < hi]


def contention(timeline: Timeline) -> dict:
    """The run's meter: CPU shares, time the machine took from each lane, other programs'
    CPUs (:func:`machine_load`, None when not measured), for a paced run how late its device
    spans ended (``device_late_fraction``: of their paced time; None when not paced) and ``busy``:
    True, False, or None when no CPU times were recorded (CUDA, hand-made timelines) -- unknown, not quiet."""
    shares = cpu_shares(timeline)
    lost = {lane: sum(s.duration_ms - s.cpu_ms for s in timeline.spans
                      if s.lane == lane and s.paced_ms is None and preempted(s)) for lane in LANES}
    paced = [s for s in timeline.spans if s.paced_ms is not None]
    model_ms = sum(s.paced_ms for s in paced)
    late = sum(late_ms(s) for s in paced) / model_ms if model_ms > 0 else None
    busy_ms = timeline.device_busy_ms()
    known = [v for v in shares.values() if v is not None]
    load = machine_load(timeline)
    others = None if load is None else load.others_cpus
    busy = None
    if known or late is not None:  # paced: its late kernels say whether others' work spoiled it
        busy = (min(known, default=1.0) < BUSY_RUN_CPU_SHARE or (late or 0.0) > PACED_LATE_SHARE
                or (late is None and others is not None and others > BUSY_OTHERS_CPUS))
    return dict(shares, paced=bool(paced), device_late_fraction=late, device_preempted_ms=lost["device"],
                device_preempted_fraction=lost["device"] / busy_ms if busy_ms > 0 else 0.0,
                host_preempted_ms=lost["host"], others_cpus=others, busy=busy)


def record_machine_load(timeline: Timeline, start: tuple | None, device_cpu_s: float | None = None) -> None:
    """Annotate the timeline with its :class:`MachineLoad`: how many CPUs other programs used
    since ``start`` (a :func:`cpu_snapshot` taken when the run began).  Ours is this process's CPU plus the
    device spans' (or ``device_cpu_s``); runs under 0.2 s are not judged: /proc/stat counts
    in 10 ms ticks."""
    end = None if start is None else cpu_snapshot()
    if end is None:
        return
    wall_s = (time.perf_counter_ns() - timeline.origin_ns) / 1e9
    if device_cpu_s is None:
        device_cpu_s = sum(s.cpu_ms or 0.0 for s in timeline.spans if s.lane == "device") / 1e3
    others = max(0.0, end[0] - start[0] - (end[1] - start[1] + device_cpu_s))
    load = MachineLoad(cpus=end[2], wall_s=round(wall_s, 4),
                       others_cpus=round(others / wall_s, 3) if wall_s >= 0.2 else None)
    timeline.meta.annotations["machine_load"] = asdict(load)


class _MachineWatch:
    """A run observer: a CPU snapshot when a run starts, the machine's load when it ends."""

    def __init__(self) -> None:
        self._starts: dict[int, tuple | None] = {}

    def __call__(self, engine, phase: str) -> None:
        if phase == "start":
            self._starts[id(engine)] = cpu_snapshot()
        elif id(engine) in self._starts:
            record_machine_load(engine.timeline, self._starts.pop(id(engine)))


_WATCH = _MachineWatch()


def watch_runs() -> None:
    """Measure the machine around every engine run from now on (idempotent)."""
    if _WATCH not in _engine.RUN_OBSERVERS:
        _engine.RUN_OBSERVERS.append(_WATCH)
