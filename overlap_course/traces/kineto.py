"""Real traces in and out: the PyTorch profiler's (Kineto's) Chrome-trace JSON.

Practitioners check overlap in traces written by ``torch.profiler`` and opened in Perfetto
(https://ui.perfetto.dev) or ``chrome://tracing``.  This module moves between those traces
and the course's :class:`~toy_engine.timeline.Timeline`, both ways:

* **import** -- :func:`read_trace` reads a trace (plain or gzip JSON), :func:`summary`
  measures device idle time overall and per CUDA stream and splits it into host-wait /
  kernel-wait / other, :func:`to_timeline` turns it into a course timeline (runtime and
  driver calls on the host lane, kernels / memcpys / memsets on the device lane, one round
  per ``ProfilerStep#N``) for the course's views.
* **export** -- :func:`export` writes any course timeline (a live ``engine.timeline`` or a
  stored trace) in Kineto's shape: host spans on a host thread, each launch as a
  ``cuda_runtime`` call with a correlation id, device work as ``kernel`` / ``gpu_memcpy``
  events on a stream, ``ac2g`` flow arrows from launch to device span, one ``ProfilerStep#N``
  per pass of the loop, waits as ``cudaEventSynchronize`` + ``Event Sync``, and an arrow
  from each round's ``sample`` to the host step that consumes its tokens.
* **which sync** -- :func:`idle_after_syncs` charges each device gap to the blocking host call
  (``...Synchronize``) that returned inside it; :func:`side_by_side` tabulates traces with it.

How idle time is counted (the definitions of Meta's Holistic Trace Analysis, HTA 0.5.0,
read from its source, so that the numbers can be checked against it):

* **overall** (HTA's *temporal breakdown*): from the first to the last event that sits on a
  GPU stream, the time no such event runs.  HTA counts *every* event that carries a stream
  id other than -1, which includes stream-scoped synchronisation intervals (``cuda_sync``
  "Stream Sync", "Stream Wait Event"); ``kernels_only_idle_fraction`` is the same figure
  over kernels, memcpys and memsets alone.
* **per stream** (HTA's *idle-time breakdown*): kernels, memcpys and memsets of one stream;
  each gap before a device event is *host_wait* when the runtime call that launched that
  event started after the stream went idle (the host had not issued it yet), else
  *kernel_wait* when the gap is under 30 us (HTA's default launch-to-launch delay), else
  *other*.
* **window**: when a trace has two or more ``ProfilerStep`` annotations, HTA treats the last
  one as incomplete and leaves out device work launched at or after its start; so does
  :func:`summary`.  Exports end with an empty step opened after the run (as a loop that
  calls ``prof.step()`` at the end of every pass would), so HTA's window of an export is the
  whole run: first device span start to last device span end, the same window as
  ``engine.stats["device_idle_fraction"]`` (:meth:`Timeline.device_idle_fraction`).

Plain Python (json, gzip): no torch, pandas, plotly or HTA is imported here; ``toy_engine``
itself never imports this module.  Command line: ``python -m overlap_course.traces.kineto summary
FILE`` and ``python -m overlap_course.traces.kineto export OUT.json [STORED]`` (``./run.sh trace ...``).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from toy_engine.timeline import PROCESS_STAGES, Span, Timeline

__all__ = ["REAL_TRACES_DIR", "real_traces", "read_trace", "KinetoTrace", "summary", "to_timeline",
           "export", "kineto_events", "main", "KERNEL_WAIT_US", "DEFAULT_STREAM", "idle_after_syncs",
           "host_syncs", "SYNC_EVENT_CALLS", "CUDA_TRACES_DIRS", "cuda_profiles", "side_by_side"]

#: The real A100 traces shipped with the package (HTA's public test data, MIT; README.md there).
REAL_TRACES_DIR = Path(__file__).parent / "a100"

#: Kineto's categories of device work, and the course stage each becomes.
DEVICE_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
               "gpu_memset": "memset", "Memset": "memset"}
#: Host-side API calls (each may carry the correlation id of the device work it launched).
HOST_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
#: A gap shorter than this (us) that the host did not cause counts as kernel_wait (HTA's default).
KERNEL_WAIT_US = 30.0
#: The stream id exports use (the default stream usually shows up as 7 in Kineto traces).
DEFAULT_STREAM = 7
_LAUNCH_CALLS = re.compile(r"^(cuda|cu)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|GraphLaunch|"
                           r"MemcpyAsync|MemsetAsync|Memcpy(HtoD|DtoH|DtoD)Async|MemsetD\w*Async)(_v\d+)?$")
_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")


def real_traces() -> dict[str, Path]:
    """The shipped real traces: name (``a100_event_sync``, ...) -> path."""
    return {p.name[: -len(".json.gz")]: p for p in sorted(REAL_TRACES_DIR.glob("*.json.gz"))}


# ---------------------------------------------------------------------------- reading

def _resolve(source) -> Path:
    if isinstance(source, str) and source in real_traces():
        return real_traces()[source]
    return Path(source)


def read_trace(source) -> dict:
    """Load a Chrome-trace JSON document: a path (plain or gzip JSON, told apart by content,
    not by name), a shipped trace's name (``"a100_event_sync"``), or an already loaded dict.

    Anything that is not a trace raises ``ValueError`` saying what is wrong with it.
    """
    if isinstance(source, dict):
        data, where = source, "trace"
    else:
        if not isinstance(source, (str, Path)) or not str(source).strip():
            raise ValueError(f"a trace is a file path, a shipped trace name ({', '.join(real_traces())}) "
                             f"or a dict, got {source!r}")
        path = _resolve(source)
        where = f"trace file {str(path)!r}"
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {where}: {exc.strerror or exc}") from None
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (EOFError, OSError, zlib.error) as exc:
                raise ValueError(f"{where} is a truncated or corrupt gzip file ({exc})") from None
        if not raw.strip():
            raise ValueError(f"{where} is empty")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValueError(f"{where} is neither gzip nor UTF-8 text: not a JSON trace") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}, column "
                             f"{exc.colno}); a truncated trace, or not a trace?") from None
    if isinstance(data, list):  # the Chrome trace format's "JSON array" form
        data = {"traceEvents": data}
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a JSON object with 'traceEvents', got a {type(data).__name__}")
    if "traceEvents" not in data:
        keys = ", ".join(sorted(map(str, data))[:8]) or "none"
        raise ValueError(f"{where} has no 'traceEvents' (its keys: {keys}): not a Chrome/Kineto trace")
    if not isinstance(data["traceEvents"], list):
        raise ValueError(f"{where}: 'traceEvents' must be a list of events, got a "
                         f"{type(data['traceEvents']).__name__}")
    return data


@dataclass(frozen=True)
class _Event:
    index: int           # position in traceEvents
    cat: str
    name: str
    ts: float            # us
    end: float           # us
    stream: int | None   # args.stream (None: absent)
    correlation: int | None

    @property
    def dur(self) -> float:
        return self.end - self.ts


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _int_or_none(value) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


class KinetoTrace:
    """A parsed Kineto trace: the events this module uses, checked.

    ``device``: kernels / memcpys / memsets (each with a stream); ``on_stream``: every
    complete event with a stream id other than -1 (what HTA's temporal breakdown counts);
    ``host``: runtime and driver calls; ``steps``: ``ProfilerStep#N`` annotations;
    ``annotations``: the other user annotations; ``launch_ts``: correlation id -> start of
    the host call that carries it.
    """

    def __init__(self, source) -> None:
        data = read_trace(source)
        self.source = "trace" if isinstance(source, dict) else str(_resolve(source))
        self.meta = {k: v for k, v in data.items() if k != "traceEvents"}
        self.device: list[_Event] = []
        self.on_stream: list[_Event] = []
        self.host: list[_Event] = []
        self.syncs: list[_Event] = []
        self.steps: list[tuple[int, _Event]] = []
        self.annotations: list[_Event] = []
        self.launch_ts: dict[int, float] = {}
        where = "trace" if isinstance(source, dict) else f"trace file {self.source!r}"
        for i, ev in enumerate(data["traceEvents"]):
            if not isinstance(ev, dict):
                raise ValueError(f"{where}: traceEvents[{i}] is not an object (got {ev!r:.60})")
            if "dur" not in ev or ev.get("cat") is None or ev.get("ph", "X") != "X" or ev.get("cat") == "Trace":
                continue  # flows, metadata, instants, the profiler's own span
            cat, name = ev["cat"], ev.get("name", "")
            label = f"{where}: traceEvents[{i}] ({cat} {str(name)[:40]!r})"
            if not isinstance(cat, str) or not isinstance(name, str):
                raise ValueError(f"{label}: 'cat' and 'name' must be strings")
            ts = _number(ev.get("ts"), f"{label}: 'ts'")
            dur = _number(ev["dur"], f"{label}: 'dur'")
            if dur < 0:
                raise ValueError(f"{label}: 'dur' is negative ({dur})")
            args = ev.get("args", {})
            if not isinstance(args, dict):
                raise ValueError(f"{label}: 'args' must be an object, got {type(args).__name__}")
            stream = _int_or_none(args.get("stream"))
            if cat in DEVICE_CATS:
                if "stream" in args and stream is None:
                    raise ValueError(f"{label}: args.stream must be an integer, got {args['stream']!r}")
                if stream is None:
                    stream = _int_or_none(ev.get("tid"))
                if stream is None:
                    raise ValueError(f"{label}: device work without a stream (no args.stream, no integer tid)")
            corr = _int_or_none(args.get("correlation"))
            corr = corr if corr is not None and corr >= 0 else None
            e = _Event(i, cat, name, ts, ts + dur, stream, corr)
            if stream is not None and stream != -1:
                self.on_stream.append(e)
            if cat in DEVICE_CATS:
                self.device.append(e)
            elif cat in HOST_CATS:
                self.host.append(e)
                if corr is not None:
                    self.launch_ts.setdefault(corr, ts)
            elif cat == "cuda_sync":
                self.syncs.append(e)
            elif cat in ("user_annotation", "cpu_instant_event", "python_function") or cat.startswith("user"):
                m = _STEP.match(name)
                if m:
                    self.steps.append((int(m.group(1)), e))
                elif cat == "user_annotation":
                    self.annotations.append(e)
        if not self.device:
            raise ValueError(f"{where} has no device events (cat kernel, gpu_memcpy or gpu_memset): a CPU-only "
                             f"profile? Record with torch.profiler's ProfilerActivity.CUDA")
        self.steps.sort(key=lambda s: s[1].ts)

    # -- HTA's window ----------------------------------------------------------------

    @property
    def last_step_start(self) -> float | None:
        """Start of the last ProfilerStep when there are two or more (HTA leaves that step out)."""
        return max(e.ts for _, e in self.steps) if len(self.steps) >= 2 else None

    def in_window(self, e: _Event) -> bool:
        """Device work HTA keeps: launched (or, without a launch, started) before the last step."""
        cut = self.last_step_start
        if cut is None:
            return True
        launch = self.launch_ts.get(e.correlation) if e.correlation is not None else None
        return (launch if launch is not None else e.ts) < cut


# ---------------------------------------------------------------------------- measuring

def _merged(events) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for ts, end in sorted((e.ts, e.end) for e in events):
        if out and ts <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([ts, end])
    return [(a, b) for a, b in out]


def _busy_idle(events) -> dict:
    merged = _merged(events)
    if not merged:
        return dict(span_us=0.0, busy_us=0.0, idle_us=0.0, idle_fraction=0.0)
    span = merged[-1][1] - merged[0][0]
    busy = sum(b - a for a, b in merged)
    return dict(span_us=span, busy_us=busy, idle_us=span - busy, idle_fraction=(span - busy) / span if span else 0.0)


def _stream_breakdown(trace: KinetoTrace, events: list[_Event], kernel_wait_us: float) -> dict:
    """One stream's idle time split as HTA's idle-time breakdown splits it."""
    cats = dict(host_wait=0.0, kernel_wait=0.0, other=0.0)
    reached = None
    for e in sorted(events, key=lambda e: (e.ts, e.end)):
        if reached is not None and e.ts > reached:
            gap = e.ts - reached
            launch = trace.launch_ts.get(e.correlation) if e.correlation is not None else None
            if launch is not None and launch > reached:
                cats["host_wait"] += gap     # the host had not issued it when the stream went idle
            elif gap < kernel_wait_us:
                cats["kernel_wait"] += gap   # issued in time: launch latency between kernels
            else:
                cats["other"] += gap
        reached = e.end if reached is None else max(reached, e.end)
    out = _busy_idle(events)
    out.update({f"{k}_us": v for k, v in cats.items()})
    out["host_wait_share"] = cats["host_wait"] / out["idle_us"] if out["idle_us"] > 0 else 0.0
    out["events"] = len(events)
    return out


def _rounded(d: dict) -> dict:
    """Microseconds to the nanosecond, fractions to 6 places."""
    return {k: (round(v, 3 if k.endswith("_us") else 6) if isinstance(v, float) else v) for k, v in d.items()}


def summary(source, kernel_wait_us: float = KERNEL_WAIT_US) -> dict:
    """Device idle time of a Kineto trace, overall and per stream (the module docstring has
    the definitions, HTA's).  ``source``: a path, a shipped trace name, a dict or a
    :class:`KinetoTrace`.  Times in microseconds, fractions in 0..1."""
    trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
    on_stream = [e for e in trace.on_stream if trace.in_window(e)]
    device = [e for e in trace.device if trace.in_window(e)]
    if not device:
        raise ValueError(f"{trace.source}: no device work was launched before the last ProfilerStep "
                         f"(HTA's window); nothing to measure")
    overall = _busy_idle(on_stream)
    streams = {}
    for s in sorted({e.stream for e in device}):
        streams[str(s)] = _rounded(_stream_breakdown(trace, [e for e in device if e.stream == s], kernel_wait_us))
    idle_sum = sum(v["idle_us"] for v in streams.values())
    by_cat = {c: sum(v[f"{c}_us"] for v in streams.values()) for c in ("host_wait", "kernel_wait", "other")}
    first = min(e.ts for e in on_stream)
    last = max(e.end for e in on_stream)
    cut = trace.last_step_start
    return {
        "source": trace.source,
        "trace_name": trace.meta.get("traceName"),
        "device_idle_fraction": round(overall["idle_fraction"], 6),
        "device_busy_us": round(overall["busy_us"], 3),
        "device_idle_us": round(overall["idle_us"], 3),
        "device_span_us": round(overall["span_us"], 3),
        "kernels_only_idle_fraction": round(_busy_idle(device)["idle_fraction"], 6),
        "host_wait_share": round(by_cat["host_wait"] / idle_sum, 6) if idle_sum > 0 else 0.0,
        "idle_by_category_us": {k: round(v, 3) for k, v in by_cat.items()},
        "streams": streams,
        "window": {
            "start_us": first, "end_us": last,
            "profiler_steps": len(trace.steps),
            "rule": ("device work launched before the last ProfilerStep (HTA leaves the last one out)"
                     if cut is not None else "the whole trace (fewer than two ProfilerSteps)"),
        },
        "definitions": ("overall: HTA's temporal breakdown (every event on a stream, stream syncs included); "
                        "streams: HTA's idle-time breakdown (kernels, memcpys, memsets; host_wait when the "
                        f"launch came after the stream went idle, kernel_wait when a gap < {kernel_wait_us:g} us "
                        "was not the host's, other otherwise)"),
    }


# ---------------------------------------------------------------------------- idle after host syncs

#: Kineto's device-side record of each blocking host call (``cat: cuda_sync``), and that call.
SYNC_EVENT_CALLS = {"Stream Sync": "cudaStreamSynchronize", "Event Sync": "cudaEventSynchronize",
                    "Context Sync": "cudaDeviceSynchronize"}


def _is_sync_call(name: str) -> bool:
    return "Synchronize" in name  # cudaStreamSynchronize, cudaEventSynchronize, cuCtxSynchronize, ...


def host_syncs(source) -> list[str]:
    """Names of the blocking host calls (``...Synchronize``) in a trace, in order of first use."""
    trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
    return list(dict.fromkeys(e.name for e in sorted(trace.host, key=lambda e: e.ts) if _is_sync_call(e.name)))


def idle_after_syncs(source) -> dict:
    """Which host syncs left the device idle, measured on a Kineto trace.

    The device's work (kernels, memcpys, memsets of every stream, in HTA's window; see
    :func:`summary`) is merged; each gap between two stretches of work is charged to the host
    synchronize call that *returned inside it* (the last one, if several): the host blocked
    until the queue had drained, so when it went on nothing was queued, and the device waited
    for whatever the host did next.  A gap in which no sync returned is the host not issuing
    work fast enough (launch overhead, Python, a slow ``prepare``): ``no_sync_us``.

    Returns ``idle_us`` (all gaps), ``by_sync_us`` (call name -> idle of the gaps it is charged
    with), ``no_sync_us``, ``gaps`` (each: ``start_us``, ``end_us``, ``idle_us``, ``sync``,
    ``sync_end_us``, ``next_launch``), ``syncs`` (every sync call's name), ``rounds`` (loop
    passes: ProfilerSteps in the window, else 1).  Times in microseconds from the trace's first
    host call or device event, the origin of :func:`to_timeline`.
    """
    trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
    device = [e for e in trace.device if trace.in_window(e)]
    if not device:
        raise ValueError(f"{trace.source}: no device work in HTA's window; nothing to measure")
    merged = _merged(device)
    t0 = min(e.ts for e in trace.host + trace.device)  # the origin of to_timeline's views
    syncs = sorted((e for e in trace.host if _is_sync_call(e.name)), key=lambda e: e.end)
    starts = {e.ts: e for e in sorted(device, key=lambda e: e.ts)}
    launch_names = {e.correlation: e.name for e in trace.host if e.correlation is not None}
    gaps, by_sync, no_sync = [], {}, 0.0
    for (_, g0), (g1, _) in zip(merged, merged[1:]):
        returned = [s for s in syncs if g0 <= s.end <= g1]
        sync = returned[-1] if returned else None
        nxt = starts.get(g1)
        gap = {"start_us": round(g0 - t0, 3), "end_us": round(g1 - t0, 3), "idle_us": round(g1 - g0, 3),
               "sync": sync.name if sync else None,
               "sync_end_us": round(sync.end - t0, 3) if sync else None,
               "next_launch": launch_names.get(nxt.correlation) if nxt is not None else None}
        gaps.append(gap)
        if sync is None:
            no_sync += g1 - g0
        else:
            by_sync[sync.name] = by_sync.get(sync.name, 0.0) + (g1 - g0)
    cut = trace.last_step_start
    steps = [e for _, e in trace.steps if cut is None or e.ts < cut]
    return {"source": trace.source, "idle_us": round(sum(g["idle_us"] for g in gaps), 3),
            "by_sync_us": {k: round(v, 3) for k, v in sorted(by_sync.items(), key=lambda kv: -kv[1])},
            "no_sync_us": round(no_sync, 3), "gaps": gaps, "syncs": host_syncs(trace),
            "rounds": max(1, len(steps)), "span_us": round(merged[-1][1] - merged[0][0], 3)}


def side_by_side(traces: dict) -> str:
    """A text table comparing traces (label -> anything :func:`summary` reads): device idle
    (HTA's), the host_wait share of it, the idle charged to host syncs (:func:`idle_after_syncs`)
    as a share of all idle and per loop pass (ProfilerStep), and the sync charged with most."""
    head = ("trace", "passes", "span", "device idle", "host_wait", "idle after a sync", "per pass", "mostly after")
    rows = []
    for label, source in traces.items():
        trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
        s, a = summary(trace), idle_after_syncs(trace)
        after = sum(a["by_sync_us"].values())
        span = s["device_span_us"]
        rows.append((str(label), str(a["rounds"]), f"{span / 1000:.2f} ms" if span >= 1000 else f"{span:.0f} us",
                     f"{s['device_idle_fraction']:.1%}", f"{s['host_wait_share']:.0%}",
                     f"{after / a['idle_us']:.0%}" if a["idle_us"] else "-",
                     f"{after / a['rounds']:.0f} us", next(iter(a["by_sync_us"]), "-")))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i in (0, 7) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join(x.rstrip() for x in [line(head), line(tuple("-" * w for w in widths)), *map(line, rows)])


#: Where the lesson (notebook 06) looks for torch.profiler traces of the CUDA engine, in order:
#: shipped ones, then what ``scripts/gpu_check.sh`` (``scripts/profile_cuda.py``) just wrote.
CUDA_TRACES_DIRS = (Path(__file__).parent / "cuda", Path(__file__).resolve().parents[2] / "artifacts" / "gpu")


def cuda_profiles(dirs=CUDA_TRACES_DIRS) -> dict[str, Path]:
    """torch.profiler traces of the CUDA engine, ``{"serial": path, "zos": path}``, from the first
    folder holding both ``torch_profile_serial.json.gz`` and ``torch_profile_zos.json.gz``; {} if none."""
    for folder in dirs:
        paths = {mode: Path(folder) / f"torch_profile_{mode}.json.gz" for mode in ("serial", "zos")}
        if all(p.is_file() for p in paths.values()):
            return paths
    return {}


# ---------------------------------------------------------------------------- import as a timeline

def _host_stage(name: str) -> str:
    if _LAUNCH_CALLS.match(name):
        return "launch"
    if "Synchronize" in name:
        return "wait"
    return name or "call"


def _short(name: str, limit: int = 60) -> str:
    name = re.sub(r"<.*>", "<...>", name) if len(name) > limit else name
    return name if len(name) <= limit else name[: limit - 3] + "..."


def to_timeline(source) -> Timeline:
    """A Kineto trace as a course :class:`Timeline`, for the course's views.

    Host lane: runtime / driver calls (stage ``launch`` for kernel launches and async copies,
    ``wait`` for synchronize calls, else the call's name; ``owner`` is the call's name).
    Device lane: kernels / memcpys / memsets of every stream (stage ``kernel`` / ``memcpy`` /
    ``memset``; ``owner`` says the stream and the kernel).  Rounds: one per
    ``ProfilerStep#N`` (round N), else one per top-level user annotation, else all round 0;
    device work belongs to the round of the call that launched it.  ``meta["kineto"]`` keeps
    the trace's name, device, streams and :func:`summary`.
    """
    trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
    if trace.steps:
        starts = [(e.ts, n) for n, e in trace.steps]
    else:
        tops = [a for a in sorted(trace.annotations, key=lambda a: (a.ts, -a.end))]
        outer: list[_Event] = []
        for a in tops:
            if not outer or a.ts >= outer[-1].end:
                outer.append(a)
        starts = [(a.ts, i) for i, a in enumerate(outer)] or [(-math.inf, 0)]
    keys = [s for s, _ in starts]

    def round_at(ts: float) -> int:
        i = bisect.bisect_right(keys, ts) - 1
        return starts[max(i, 0)][1]

    used = trace.host + trace.device
    t0 = min(e.ts for e in used)
    origin_ns = int(t0) * 1000 + int(round((t0 - int(t0)) * 1000))  # exact for integer-us traces
    dev_name = "GPU"
    props = trace.meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        dev_name = str(props[0].get("name", dev_name))
    tl = Timeline(origin_ns=origin_ns, meta={
        "mode": "imported", "device": dev_name,
        "kineto": {"source": trace.source, "trace_name": trace.meta.get("traceName"),
                   "streams": sorted({e.stream for e in trace.device}),
                   "rounds_from": ("ProfilerStep" if trace.steps else
                                   "user annotations" if trace.annotations else "none (all round 0)"),
                   "summary": summary(trace)}})
    ms = lambda ts: (ts - t0) / 1000.0  # noqa: E731
    for e in trace.host:
        tl.add("host", _host_stage(e.name), round_at(e.ts), ms(e.ts), ms(e.end), owner=e.name)
    for e in trace.device:
        launch = trace.launch_ts.get(e.correlation) if e.correlation is not None else None
        tl.add("device", DEVICE_CATS[e.cat], round_at(e.ts if launch is None else launch), ms(e.ts), ms(e.end),
               owner=f"stream {e.stream}: {_short(e.name)}")
    return tl


# ---------------------------------------------------------------------------- export

HOST_PID, HOST_TID, DEVICE_PID, SYNC_TID = 1000, 1000, 0, -1
#: The host stage that issues each device stage in the engine's loops (engine.py): the upload
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


def _launch_site(dev: Span, host_by_round: dict[int, list[Span]]) -> tuple[Span | None, bool]:
    """The host span that issued ``dev`` and whether it is a launch span (else: issued at its end)."""
    spans = host_by_round.get(dev.round, [])
    for stage in (LAUNCH_SITES.get(dev.stage), f"launch_{dev.stage}"):
        cands = [h for h in spans if h.stage == stage]
        if cands:
            before = [h for h in cands if h.start_ms <= dev.start_ms] or cands
            h = max(before, key=lambda h: h.start_ms)
            return h, h.stage.startswith("launch")
    cands = [h for h in spans if h.stage != "wait" and h.start_ms <= dev.start_ms]
    if cands:
        h = max(cands, key=lambda h: h.start_ms)
        return h, h.stage.startswith("launch")
    return None, False


def kineto_events(timeline: Timeline, stream: int = DEFAULT_STREAM) -> list[dict]:
    """The ``traceEvents`` of :func:`export` (see there)."""
    if not isinstance(timeline, Timeline):
        raise TypeError(f"export takes a toy_engine Timeline (engine.timeline, Timeline.from_json(...)), "
                        f"got {type(timeline).__name__}")
    device = timeline.lane("device")
    if not device:
        raise ValueError("this timeline has no device spans: nothing to export (run generate first)")
    host = timeline.lane("host")
    base_us = timeline.origin_ns // 1000
    us = lambda ms: round(base_us + ms * 1000.0, 3)  # noqa: E731
    events: list[dict] = []

    def x(cat, name, pid, tid, t0_us, t1_us, args) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": t0_us,
              "dur": round(max(0.0, t1_us - t0_us), 3), "args": args}
        events.append(ev)
        return ev

    def flow(cat, name, fid, start, finish) -> None:
        (p0, t0_, ts0), (p1, t1_, ts1) = start, finish
        events.append({"ph": "s", "id": fid, "pid": p0, "tid": t0_, "ts": ts0, "cat": cat, "name": name})
        events.append({"ph": "f", "id": fid, "pid": p1, "tid": t1_, "ts": ts1, "cat": cat, "name": name, "bp": "e"})

    # the loop's passes, as the profiler's steps, then the empty step a final prof.step() opens
    steps = _steps(timeline)
    run_end = us(max(s.end_ms for s in timeline.spans))
    for i, (a, b, rnd) in enumerate(steps):
        x("user_annotation", f"ProfilerStep#{i}", HOST_PID, HOST_TID, us(a), us(b), {"round": rnd})
    x("user_annotation", f"ProfilerStep#{len(steps)}", HOST_PID, HOST_TID, run_end, run_end + 1.0,
      {"note": "opened by the last prof.step(); empty (HTA leaves the last step out of its window)"})

    # host spans: the course's stages, as user annotations
    for h in host:
        args = {"round": h.round}
        if h.owner:
            args["owner"] = h.owner
        if h.cpu_ms is not None:
            args["cpu_ms"] = round(h.cpu_ms, 4)
        x("user_annotation", h.stage, HOST_PID, HOST_TID, us(h.start_ms), us(h.end_ms), args)

    # launches: one runtime call per device span, inside the host span that issued it
    host_by_round: dict[int, list[Span]] = {}
    for h in host:
        host_by_round.setdefault(h.round, []).append(h)
    groups: dict[int, list[Span]] = {}
    sites: dict[int, tuple[Span | None, bool]] = {}
    for d in device:
        site = _launch_site(d, host_by_round)
        key = id(site[0]) if site[0] is not None else -id(d)
        groups.setdefault(key, []).append(d)
        sites[key] = site
    corr = _FIRST_CORRELATION
    consumers = {}
    for h in host:
        if h.stage in PROCESS_STAGES:
            consumers.setdefault(h.round, h)
    for key, devs in groups.items():
        h, is_launch = sites[key]
        n = len(devs)
        if h is None:
            slots = [(us(d.start_ms), us(d.start_ms)) for d in devs]
        else:
            a, b = us(h.start_ms), us(h.end_ms)
            if not is_launch:
                a = max(a, b - _TAIL_US * n)
            w = (b - a) / n
            slots = [(round(a + k * w, 3), round(a + (k + 1) * w, 3)) for k in range(n)]
        for d, (r0, r1) in zip(devs, slots):
            cat, dname, call, cbid = _DEVICE_KIND.get(d.stage, _KERNEL_KIND)
            x("cuda_runtime", call, HOST_PID, HOST_TID, r0, r1,
              {"External id": corr, "cbid": cbid, "correlation": corr})
            dargs = {"External id": corr, "device": 0, "context": 1, "stream": stream, "correlation": corr,
                     "round": d.round}
            if d.cpu_ms is not None:
                dargs["cpu_ms"] = round(d.cpu_ms, 4)
            ev = x(cat, dname or d.stage, DEVICE_PID, stream, us(d.start_ms), us(d.end_ms), dargs)
            flow("ac2g", "ac2g", corr, (HOST_PID, HOST_TID, r0), (DEVICE_PID, stream, ev["ts"]))
            corr += 1

    # waits: the host blocks on the round's sample event
    for h in host:
        if h.stage != "wait":
            continue
        a, b = us(h.start_ms), us(h.end_ms)
        x("cuda_runtime", "cudaEventSynchronize", HOST_PID, HOST_TID, a, b,
          {"External id": corr, "cbid": 137, "correlation": corr})
        x("cuda_sync", "Event Sync", DEVICE_PID, SYNC_TID, a, b,
          {"External id": corr, "cuda_sync_kind": "Event Sync", "wait_on_stream": stream, "stream": -1,
           "correlation": corr, "device": 0, "context": 1, "round": h.round})
        flow("ac2g", "ac2g", corr, (HOST_PID, HOST_TID, a), (DEVICE_PID, SYNC_TID, a))
        corr += 1

    # each round's sampled tokens -> the host step that consumes them
    for k, d in enumerate(s for s in device if s.stage == "sample"):
        c = consumers.get(d.round)
        if c is not None:
            flow("tokens", f"round {d.round} tokens to host", _TOKEN_FLOW_IDS + k,
                 (DEVICE_PID, stream, us(d.start_ms)), (HOST_PID, HOST_TID, us(c.start_ms)))

    # metadata: process and thread names (Perfetto / chrome://tracing show these)
    on_cpu = str(timeline.meta.get("device", "")).startswith("cpu")
    t_meta = us(min(s.start_ms for s in timeline.spans))
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
        events.append({"name": kind, "ph": "M", "ts": t_meta, "pid": pid, "tid": tid, "args": value})
    return events


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
    device = str(meta.get("device", "device"))
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": f"toy_engine {device}" + (" (CPU stand-in process)"
                                                                        if device.startswith("cpu") else "")}],
        "distributedInfo": {"rank": 0},
        "traceName": name or (Path(path).name if path is not None else f"toy_engine_{meta.get('mode', 'run')}"),
        "displayTimeUnit": "ms",
        "toy_engine": {
            "mode": meta.get("mode"), "device": meta.get("device"),
            "device_idle_fraction": timeline.device_idle_fraction(),
            "window": "first device span start to last device span end (Timeline.device_idle_fraction)",
            "origin_ns": timeline.origin_ns,
        },
        "traceEvents": events,
    }
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(trace)  # default separators: HTA finds the rank with '"rank": <n>'
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode("utf-8")))
        else:
            path.write_text(text, encoding="utf-8")
    return trace


# ---------------------------------------------------------------------------- command line

def _load_timeline(source: str) -> Timeline:
    """A stored course timeline: a path, or the name of a shipped one (``cpu_zos``)."""
    from overlap_course.traces.recorded import TRACES_DIR
    path = Path(source)
    if not path.exists() and (TRACES_DIR / f"{source}.json").is_file():
        path = TRACES_DIR / f"{source}.json"
    return Timeline.from_json(path)


def _record(mode: str, args) -> Timeline:
    from overlap_course.measure.bench import default_workload  # the engine (torch) only when recording
    from toy_engine.engine import Engine, EngineConfig
    config = EngineConfig(mode=mode, device=args.device, host_overhead_ms=args.host_overhead_ms)
    with Engine(config) as engine:
        engine.generate(default_workload(args.prompts), max_new_tokens=args.max_new_tokens)
        return engine.timeline


def _out_path(out: Path, mode: str) -> Path:
    suffix = "".join(out.suffixes[-2:]) if out.name.endswith(".json.gz") else out.suffix or ".json"
    stem = out.name[: len(out.name) - len(suffix)] if out.name.endswith(suffix) else out.name
    return out.with_name(f"{stem}_{mode}{suffix}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlap_course.traces.kineto",
                                description="PyTorch-profiler (Kineto) traces: measure one, or export course runs.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="device idle overall and per stream, as JSON")
    s.add_argument("file", help=f"a Kineto trace (.json or .json.gz) or a shipped one: {', '.join(real_traces())}")
    e = sub.add_parser("export", help="write course runs as Kineto JSON")
    e.add_argument("out", help="output file (.json or .json.gz); recording both modes writes OUT_serial and OUT_zos")
    e.add_argument("stored", nargs="?", help="convert this stored course timeline (path, or a shipped name "
                                             "like cpu_zos) instead of recording")
    e.add_argument("--mode", choices=("serial", "zos", "both"), default="both")
    e.add_argument("--prompts", type=int, default=8)
    e.add_argument("--max-new-tokens", type=int, default=32)
    e.add_argument("--host-overhead-ms", type=float, default=0.0)
    e.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    try:
        if args.cmd == "summary":
            print(json.dumps(summary(args.file), indent=2))
            return 0
        out = Path(args.out)
        if args.stored:
            runs = {None: _load_timeline(args.stored)}
        else:
            modes = ("serial", "zos") if args.mode == "both" else (args.mode,)
            runs = {m: _record(m, args) for m in modes}
        report = {}
        for mode, tl in runs.items():
            path = out if mode is None or len(runs) == 1 else _out_path(out, mode)
            export(tl, path)
            report[str(path)] = {"mode": tl.meta.get("mode"),
                                 "course_device_idle_fraction": round(tl.device_idle_fraction(), 6),
                                 "summary_device_idle_fraction": summary(path)["device_idle_fraction"]}
        print(json.dumps(report, indent=2))
        return 0
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
