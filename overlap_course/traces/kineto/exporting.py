"""Exporting the course's runs in Kineto's format, so a learner opens them where practitioners
open real ones (Perfetto, chrome://tracing) and HTA measures them as it measures a GPU's.

The export says what the course's timeline says, in the profiler's words: host spans on a
host thread, each launch a ``cuda_runtime`` call with a correlation id, device work as
``kernel`` / ``gpu_memcpy`` events on a stream, ``ac2g`` flow arrows from launch to device
span, one ``ProfilerStep#N`` per pass of the loop, waits as ``cudaEventSynchronize`` +
``Event Sync``, and an arrow from each round's ``sample`` to the host step that consumes
its tokens.
"""

from __future__ import annotations

import bisect
import gzip
import json
from pathlib import Path

from overlap_course.safe_json import name_text
from toy_engine.timeline import PROCESS_STAGES, Span, Timeline, owner_name
from toy_engine.validate import shown

from .reading import MAX_TIME_US

__all__ = ["DEFAULT_STREAM", "check_exportable", "export", "kineto_events"]

#: The stream id exports use (the default stream usually shows up as 7 in Kineto traces).
DEFAULT_STREAM = 7
HOST_PID, HOST_TID, DEVICE_PID, SYNC_TID = 1000, 1000, 0, -1
#: The host stage that issues each device stage in the engine's loops: the upload
#: at the end of ``prepare``, ``correct`` and ``forward`` in ``launch_forward``, ``sample`` in
#: ``launch_sample``.  Other stages: a ``launch_<stage>`` span of the round, else the round's
#: latest host span that started before the work did.
LAUNCH_SITES = {"upload": "prepare", "correct": "launch_forward", "forward": "launch_forward",
                "sample": "launch_sample"}
_TAIL_US = 5.0  # width of a runtime call placed at the end of a span that is not a launch span
_DEVICE_KIND = {"upload": ("gpu_memcpy", "Memcpy HtoD (upload)", "cudaMemcpyAsync", 41)}
_KERNEL_KIND = ("kernel", None, "cudaLaunchKernel", 211)
#: First correlation id.  Real ones are large too; small ones break HTA 0.5.0 under pandas 3
#: (it stores them in an int8 column, then cannot write event indices into it).
_FIRST_CORRELATION = 100_000
_TOKEN_FLOW_IDS = 900_000_000
#: A timeline's origin is a clock reading in nanoseconds: a 64-bit integer.
ORIGIN_LIMIT_NS = 2**63
#: A span's round is a count of the loop's passes: a 64-bit integer, as a trace's reader (the
#: course's, HTA's pandas columns) holds it.
ROUND_LIMIT = 2**63


def _steps(tl: Timeline) -> list[tuple[float, float, int | None]]:
    """(start_ms, end_ms, round) of each pass of the loop: from one ``schedule`` to the next."""
    host = tl.lane("host")
    every = sorted(tl.spans, key=lambda s: s.start_ms)
    end = max((s.end_ms for s in host), default=max(s.end_ms for s in every))
    sched = [(s.start_ms, s.round) for s in host if s.stage == "schedule"]
    if not sched:  # a hand-made or imported timeline: each round starts at its first span
        firsts: dict[int, float] = {}
        for s in every:
            firsts.setdefault(s.round, s.start_ms)
        sched = sorted((t, r) for r, t in firsts.items())
    out = []
    for i, (start, rnd) in enumerate(sched):
        stop = sched[i + 1][0] if i + 1 < len(sched) else max(end, start)
        out.append((start, stop, rnd))
    return out


class _LaunchSites:
    """Each round's host spans indexed once by stage (and all but ``wait``), sorted by start:
    the host span that issued a device span is a binary search, not a scan of its round (a
    scan per device span took about 65 s to export 16,000 + 16,000 spans of one round)."""

    _ANY = object()  # the key of a round's spans that are not ``wait``

    def __init__(self, host: list[Span]) -> None:
        keyed: dict[tuple, list[tuple[float, int, Span]]] = {}
        for i, h in enumerate(host):
            keyed.setdefault((h.round, h.stage), []).append((h.start_ms, i, h))
            if h.stage != "wait":
                keyed.setdefault((h.round, self._ANY), []).append((h.start_ms, i, h))
        self._spans = {k: sorted(v, key=lambda e: e[:2]) for k, v in keyed.items()}
        self._starts = {k: [e[0] for e in v] for k, v in self._spans.items()}

    def _latest(self, key: tuple, at: float, or_last: bool) -> Span | None:
        """The span of ``key`` with the latest start at or before ``at`` (the first in the
        timeline's order among equal starts, as ``max`` picks), else with ``or_last`` the
        latest of all."""
        starts = self._starts.get(key)
        if not starts:
            return None
        end = bisect.bisect_right(starts, at)
        if end == 0:
            if not or_last:
                return None
            end = len(starts)
        return self._spans[key][bisect.bisect_left(starts, starts[end - 1])][2]

    def of(self, dev: Span) -> tuple[Span | None, bool]:
        """The host span that issued ``dev`` and whether it is a launch span (else: issued at
        its end)."""
        for stage in (LAUNCH_SITES.get(dev.stage), f"launch_{dev.stage}"):
            h = self._latest((dev.round, stage), dev.start_ms, or_last=True)
            if h is not None:
                return h, h.stage.startswith("launch")
        h = self._latest((dev.round, self._ANY), dev.start_ms, or_last=False)
        if h is not None:
            return h, h.stage.startswith("launch")
        return None, False


class _Events:
    """The ``traceEvents`` being written, on the timeline's clock in microseconds, and the next
    correlation id (one per runtime call, shared with the device work or sync it caused)."""

    def __init__(self, timeline: Timeline) -> None:
        self.events: list[dict] = []
        self.base_us = timeline.origin_ns // 1000
        self.correlation = _FIRST_CORRELATION

    def us(self, ms: float) -> float:
        return round(self.base_us + ms * 1000.0, 3)

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation - 1

    def complete(self, cat, name, pid, tid, t0_us, t1_us, args) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": t0_us,
              "dur": round(max(0.0, t1_us - t0_us), 3), "args": args}
        self.events.append(ev)
        return ev

    def flow(self, cat, name, fid, start, finish) -> None:
        (p0, t0, ts0), (p1, t1, ts1) = start, finish
        self.events.append({"ph": "s", "id": fid, "pid": p0, "tid": t0, "ts": ts0, "cat": cat, "name": name})
        self.events.append({"ph": "f", "id": fid, "pid": p1, "tid": t1, "ts": ts1, "cat": cat, "name": name, "bp": "e"})


def _add_steps(out: _Events, timeline: Timeline) -> None:
    """The loop's passes, as the profiler's steps, then the empty step a final ``prof.step()`` opens."""
    steps = _steps(timeline)
    run_end = out.us(max(s.end_ms for s in timeline.spans))
    for i, (a, b, rnd) in enumerate(steps):
        out.complete("user_annotation", f"ProfilerStep#{i}", HOST_PID, HOST_TID, out.us(a), out.us(b), {"round": rnd})
    out.complete("user_annotation", f"ProfilerStep#{len(steps)}", HOST_PID, HOST_TID, run_end, run_end + 1.0,
                 {"note": "opened by the last prof.step(); empty (HTA leaves the last step out of its window)"})


def _add_host_spans(out: _Events, host: list[Span]) -> None:
    """Host spans: the course's stages, as user annotations."""
    for h in host:
        args = {"round": h.round}
        if h.owner is not None:
            args["owner"] = owner_name(h.owner)
        if h.label:
            args["label"] = h.label
        if h.cpu_ms is not None:
            args["cpu_ms"] = round(h.cpu_ms, 4)
        out.complete("user_annotation", h.stage, HOST_PID, HOST_TID, out.us(h.start_ms), out.us(h.end_ms), args)


def _add_launches(out: _Events, host: list[Span], device: list[Span], stream: int) -> None:
    """One runtime call per device span, inside the host span that issued it (calls sharing a
    span split it evenly), the device span on ``stream``, and an ``ac2g`` arrow between them."""
    launch_sites = _LaunchSites(host)
    groups: dict[int, list[Span]] = {}
    sites: dict[int, tuple[Span | None, bool]] = {}
    for d in device:
        site = launch_sites.of(d)
        key = id(site[0]) if site[0] is not None else -id(d)
        groups.setdefault(key, []).append(d)
        sites[key] = site
    for key, devs in groups.items():
        h, is_launch = sites[key]
        n = len(devs)
        if h is None:
            slots = [(out.us(d.start_ms), out.us(d.start_ms)) for d in devs]
        else:
            a, b = out.us(h.start_ms), out.us(h.end_ms)
            if not is_launch:
                a = max(a, b - _TAIL_US * n)
            w = (b - a) / n
            slots = [(round(a + k * w, 3), round(a + (k + 1) * w, 3)) for k in range(n)]
        for d, (r0, r1) in zip(devs, slots):
            corr = out.next_correlation()
            cat, dname, call, cbid = _DEVICE_KIND.get(d.stage, _KERNEL_KIND)
            out.complete("cuda_runtime", call, HOST_PID, HOST_TID, r0, r1,
                         {"External id": corr, "cbid": cbid, "correlation": corr})
            dargs = {"External id": corr, "device": 0, "context": 1, "stream": stream, "correlation": corr,
                     "round": d.round}
            if d.cpu_ms is not None:
                dargs["cpu_ms"] = round(d.cpu_ms, 4)
            ev = out.complete(cat, dname or d.stage, DEVICE_PID, stream, out.us(d.start_ms), out.us(d.end_ms), dargs)
            out.flow("ac2g", "ac2g", corr, (HOST_PID, HOST_TID, r0), (DEVICE_PID, stream, ev["ts"]))


def _add_waits(out: _Events, host: list[Span], stream: int) -> None:
    """The host blocking on a round's sample event: ``cudaEventSynchronize`` and its ``Event Sync``."""
    for h in host:
        if h.stage != "wait":
            continue
        corr = out.next_correlation()
        a, b = out.us(h.start_ms), out.us(h.end_ms)
        out.complete("cuda_runtime", "cudaEventSynchronize", HOST_PID, HOST_TID, a, b,
                     {"External id": corr, "cbid": 137, "correlation": corr})
        out.complete("cuda_sync", "Event Sync", DEVICE_PID, SYNC_TID, a, b,
                     {"External id": corr, "cuda_sync_kind": "Event Sync", "wait_on_stream": stream, "stream": -1,
                      "correlation": corr, "device": 0, "context": 1, "round": h.round})
        out.flow("ac2g", "ac2g", corr, (HOST_PID, HOST_TID, a), (DEVICE_PID, SYNC_TID, a))


def _add_token_flows(out: _Events, host: list[Span], device: list[Span], stream: int) -> None:
    """Each round's sampled tokens -> the host step that consumes them."""
    consumers: dict[int, Span] = {}
    for h in host:
        if h.stage in PROCESS_STAGES:
            consumers.setdefault(h.round, h)
    for k, d in enumerate(s for s in device if s.stage == "sample"):
        c = consumers.get(d.round)
        if c is not None:
            out.flow("tokens", f"round {d.round} tokens to host", _TOKEN_FLOW_IDS + k,
                     (DEVICE_PID, stream, out.us(d.start_ms)), (HOST_PID, HOST_TID, out.us(c.start_ms)))


def _add_names(out: _Events, timeline: Timeline, stream: int) -> None:
    """Process and thread names and order (Perfetto and chrome://tracing show these)."""
    on_cpu = (timeline.meta.device or "").startswith("cpu")
    t_meta = out.us(min(s.start_ms for s in timeline.spans))
    for pid, tid, kind, value in (
            (HOST_PID, 0, "process_name", {"name": "python (toy_engine host loop)"}),
            (HOST_PID, 0, "process_labels", {"labels": "CPU"}),
            (HOST_PID, 0, "process_sort_index", {"sort_index": 0}),
            (DEVICE_PID, 0, "process_name", {"name": "toy_engine device" + (" (CPU stand-in)" if on_cpu else "")}),
            (DEVICE_PID, 0, "process_labels", {"labels": "GPU 0"}),
            (DEVICE_PID, 0, "process_sort_index", {"sort_index": 16777216}),
            (HOST_PID, HOST_TID, "thread_name", {"name": f"thread {HOST_TID} (host loop)"}),
            (DEVICE_PID, stream, "thread_name", {"name": f"stream {stream} "}),
            (DEVICE_PID, stream, "thread_sort_index", {"sort_index": stream}),
            (DEVICE_PID, SYNC_TID, "thread_name", {"name": "Device 0 (syncs)"}),
            (DEVICE_PID, SYNC_TID, "thread_sort_index", {"sort_index": SYNC_TID})):
        out.events.append({"name": kind, "ph": "M", "ts": t_meta, "pid": pid, "tid": tid, "args": value})


def check_exportable(timeline: Timeline) -> None:
    """Refuse (``ValueError`` naming the field) a timeline whose export no trace reader could
    measure, before anything is written: the export's own reading back would refuse it, and
    name the file being written instead of the timeline."""
    if not isinstance(timeline, Timeline):
        raise TypeError(f"export takes a toy_engine Timeline (engine.timeline, Timeline.from_json(...)), "
                        f"got {type(timeline).__name__}")
    device = timeline.lane("device")
    if not device:
        raise ValueError("this timeline has no device spans: nothing to export (run generate first)")
    origin = timeline.origin_ns
    if not isinstance(origin, int) or not -ORIGIN_LIMIT_NS <= origin < ORIGIN_LIMIT_NS:
        raise ValueError(f"this timeline's origin_ns is not a clock reading in nanoseconds "
                         f"(a 64-bit integer), got {str(origin)[:30]}")
    rnd = max(s.round for s in timeline.spans)
    if rnd >= ROUND_LIMIT:
        raise ValueError(f"this timeline has a span of round {shown(rnd)}, beyond the 64 bits a "
                         f"trace's reader holds (at most {ROUND_LIMIT - 1}): not a run's round")
    end = max(s.end_ms for s in timeline.spans)
    if not any(d.start_ms < end for d in device):  # (every span at 0 ms, say)
        raise ValueError(f"every device span of this timeline starts at {end:g} ms, when its last "
                         f"span ends: a run with no device time to measure")


def kineto_events(timeline: Timeline, stream: int = DEFAULT_STREAM) -> list[dict]:
    """The ``traceEvents`` of :func:`export` (see there)."""
    check_exportable(timeline)
    device = timeline.lane("device")
    host = timeline.lane("host")
    out = _Events(timeline)
    _add_steps(out, timeline)
    _add_host_spans(out, host)
    _add_launches(out, host, device, stream)
    _add_waits(out, host, stream)
    _add_token_flows(out, host, device, stream)
    _add_names(out, timeline, stream)
    latest = max(abs(e["ts"]) + e.get("dur", 0.0) for e in out.events)
    if not latest <= MAX_TIME_US:  # what the course's reader would refuse (NaN fails this too)
        raise ValueError(f"this timeline's spans reach {latest:.3g} us from the clock's zero, "
                         f"beyond the {MAX_TIME_US:g} us a trace may hold: a span's start_ms or "
                         f"end_ms is not a time of the run")
    return out.events


def export(timeline: Timeline, path=None, *, name: str | None = None, stream: int = DEFAULT_STREAM) -> dict:
    """A course timeline as a Kineto (PyTorch profiler) Chrome trace; written to ``path`` if given
    (gzip JSON when it ends in ``.gz``).  Returns the trace as a dict.

    Host spans become ``user_annotation`` events on one host thread (the course's stage names);
    every device span gets a runtime call (``cudaLaunchKernel``; ``cudaMemcpyAsync`` for the
    upload) with its own correlation id inside the host span that issued it (the engine records
    one span per call site, so calls sharing a span split it evenly, and the upload's call sits
    in the last few microseconds of ``prepare``), an ``ac2g`` flow from call to device span, and
    the device span as a ``kernel`` (``gpu_memcpy`` for the upload) on stream ``stream``.
    ``wait`` spans become ``cudaEventSynchronize`` with an ``Event Sync`` on the device; each
    pass of the loop (``schedule`` to ``schedule``) a ``ProfilerStep#N``, plus the empty step a
    final ``prof.step()`` opens; each round's ``sample`` has a flow to its ``postprocess`` /
    ``flush``.  Opens in Perfetto (ui.perfetto.dev, "Open trace file") and chrome://tracing
    ("Load"); HTA (``TraceAnalysis(trace_dir=...)``) parses it.
    """
    events = kineto_events(timeline, stream)
    meta = timeline.meta
    device = meta.device or "device"
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": f"toy_engine {device}" + (" (CPU stand-in process)"
                                                                        if device.startswith("cpu") else "")}],
        "distributedInfo": {"rank": 0},
        "traceName": name_text(  # as the export's report names it: one name, one text
            name or (Path(path).name if path is not None else f"toy_engine_{meta.mode or 'run'}")),
        "displayTimeUnit": "ms",
        "toy_engine": {
            "mode": meta.mode, "device": meta.device,
            "device_idle_fraction": timeline.device_idle_fraction(),
            "window": "first device span start to last device span end (Timeline.device_idle_fraction)",
            "origin_ns": timeline.origin_ns,
        },
        "traceEvents": events,
    }
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # default separators: HTA finds the rank with '"rank": <n>'; NaN and Infinity are not JSON
        text = json.dumps(trace, allow_nan=False)
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode("utf-8")))
        else:
            path.write_text(text, encoding="utf-8")
    return trace
