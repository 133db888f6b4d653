"""A real trace as a course :class:`~toy_engine.timeline.Timeline`, so the course's views
(to scale, in order) draw a GPU run the way they draw the toy's."""

from __future__ import annotations

import bisect
import math
import re

from toy_engine.timeline import Timeline, TimelineMeta

from .idle import summary
from .reading import DEVICE_CATS, Event, KinetoTrace, is_launch_call, is_sync_call

__all__ = ["to_timeline"]

def _host_stage(name: str) -> str:
    if is_launch_call(name):
        return "launch"
    if is_sync_call(name):
        return "wait"
    return name or "call"


def _short(name: str, limit: int = 60) -> str:
    name = re.sub(r"<.*>", "<...>", name) if len(name) > limit else name
    return name if len(name) <= limit else name[: limit - 3] + "..."


def to_timeline(source) -> Timeline:
    """A Kineto trace as a course :class:`Timeline`, for the course's views.

    Host lane: runtime / driver calls (stage ``launch`` for kernel launches and async copies,
    ``wait`` for synchronize calls, else the call's name; ``label`` is the call's name).
    Device lane: kernels / memcpys / memsets of every stream (stage ``kernel`` / ``memcpy`` /
    ``memset``; ``label`` says the stream and the kernel).  Rounds: one per
    ``ProfilerStep#N`` (round N), else one per top-level user annotation, else all round 0;
    device work belongs to the round of the call that launched it.  ``meta.annotations["kineto"]``
    keeps the trace's name, device, streams and :func:`summary`.
    """
    trace = source if isinstance(source, KinetoTrace) else KinetoTrace(source)
    if trace.steps:
        starts = [(e.ts, n) for n, e in trace.steps]
    else:
        tops = [a for a in sorted(trace.annotations, key=lambda a: (a.ts, -a.end))]
        outer: list[Event] = []
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
    tl = Timeline(origin_ns=origin_ns, meta=TimelineMeta(mode="imported", device=dev_name, annotations={
        "kineto": {"source": trace.source, "trace_name": trace.meta.get("traceName"),
                   "streams": sorted({e.stream for e in trace.device}),
                   "rounds_from": ("ProfilerStep" if trace.steps else
                                   "user annotations" if trace.annotations else "none (all round 0)"),
                   "summary": summary(trace)}}))
    ms = lambda ts: (ts - t0) / 1000.0  # noqa: E731
    for e in trace.host:
        tl.add("host", _host_stage(e.name), round_at(e.ts), ms(e.ts), ms(e.end), label=e.name)
    for e in trace.device:
        launch = trace.launch_ts.get(e.correlation) if e.correlation is not None else None
        tl.add("device", DEVICE_CATS[e.cat], round_at(e.ts if launch is None else launch), ms(e.ts), ms(e.end),
               label=f"stream {e.stream}: {_short(e.name)}")
    return tl
