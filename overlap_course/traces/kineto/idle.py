"""Device idle time of a real trace, counted as Meta's Holistic Trace Analysis counts it,
and charged to the host syncs that caused it.

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
  ``engine.stats.device_idle_fraction`` (:meth:`Timeline.device_idle_fraction`).

:func:`idle_after_syncs` charges each device gap to the blocking host call
(``...Synchronize``) that returned inside it; :func:`side_by_side` tabulates traces with it.
"""

from __future__ import annotations

from .reading import Event, KinetoTrace, is_sync_call

__all__ = ["KERNEL_WAIT_US", "SYNC_EVENT_CALLS", "summary", "host_syncs", "idle_after_syncs", "side_by_side"]

#: A gap shorter than this (us) that the host did not cause counts as kernel_wait (HTA's default).
KERNEL_WAIT_US = 30.0


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


def _stream_breakdown(trace: KinetoTrace, events: list[Event], kernel_wait_us: float) -> dict:
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
        raise ValueError(f"{trace.where}: no device work was launched before the last "
                         f"ProfilerStep (HTA's window); nothing to measure")
    if not on_stream:  # HTA counts the events of streams other than -1
        raise ValueError(f"{trace.where}: all its device work is on stream -1, which HTA (and "
                         f"this summary) leaves out of the device's time; nothing to measure")
    overall = _busy_idle(on_stream)
    by_stream: dict = {}  # one pass: a scan of all device events per stream took ~20 s at
    for e in device:      # 20,000 streams (x4 per doubling)
        by_stream.setdefault(e.stream, []).append(e)
    streams = {str(s): _rounded(_stream_breakdown(trace, by_stream[s], kernel_wait_us))
               for s in sorted(by_stream)}
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


#: Kineto's device-side record of each blocking host call (``cat: cuda_sync``), and that call.
SYNC_EVENT_CALLS = {"Stream Sync": "cudaStreamSynchronize", "Event Sync": "cudaEventSynchronize",
                    "Context Sync": "cudaDeviceSynchronize"}


def host_syncs(source) -> list[str]:
    """Names of the blocking host calls (``...Synchronize``) in a trace, in order of first use."""
    trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
    return list(dict.fromkeys(e.name for e in sorted(trace.host, key=lambda e: e.ts) if is_sync_call(e.name)))


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
        raise ValueError(f"{trace.where}: no device work in HTA's window; nothing to measure")
    merged = _merged(device)
    t0 = min(e.ts for e in trace.host + trace.device)  # the origin of to_timeline's views
    syncs = sorted((e for e in trace.host if is_sync_call(e.name)), key=lambda e: e.end)
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
