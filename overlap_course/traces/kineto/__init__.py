"""Real traces in and out: the PyTorch profiler's (Kineto's) Chrome-trace JSON.

Practitioners check overlap in traces written by ``torch.profiler``; these modules move between
those traces and the course's :class:`~toy_engine.timeline.Timeline`, both ways:

* ``reading``   -- :func:`read_trace`, :class:`KinetoTrace`, what a host call does
  (:func:`is_launch_call`, :func:`is_sync_call`); the shipped real traces
  (:func:`real_traces`) and the CUDA engine's profiles (:func:`cuda_profiles`);
* ``idle``      -- :func:`summary` (device idle overall and per stream, as HTA counts it),
  :func:`idle_after_syncs` (which host sync left the device idle), :func:`side_by_side`;
* ``timeline``  -- :func:`to_timeline`: a real trace drawn by the course's views;
* ``exporting`` -- :func:`export`: any course run in Kineto's format, for Perfetto and HTA;
* ``cli``       -- ``python -m overlap_course.traces.kineto summary|export`` (``./run.sh trace``).

Plain Python (json, gzip): no pandas, plotly or HTA is imported here.  Reading and measuring a
trace imports no engine (``./run.sh trace summary`` without torch's seconds of import);
``exporting`` and ``timeline`` work on the course's timelines, whose package imports torch, and
are imported when first used (:func:`__getattr__`).
"""

import importlib

from .cli import main
from .idle import KERNEL_WAIT_US, SYNC_EVENT_CALLS, host_syncs, idle_after_syncs, side_by_side, summary
from .reading import (CUDA_TRACES_DIRS, REAL_TRACES_DIR, KinetoTrace, cuda_profiles, is_launch_call, is_sync_call,
                      read_trace, real_traces)

#: Names imported from their module on first use, with the engine.
_WITH_THE_ENGINE = {"DEFAULT_STREAM": "exporting", "export": "exporting",
                    "kineto_events": "exporting", "to_timeline": "timeline"}


def __getattr__(name: str):
    if name in _WITH_THE_ENGINE:
        return getattr(importlib.import_module(f".{_WITH_THE_ENGINE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["REAL_TRACES_DIR", "real_traces", "read_trace", "KinetoTrace", "summary", "to_timeline",
           "export", "kineto_events", "main", "KERNEL_WAIT_US", "DEFAULT_STREAM", "idle_after_syncs",
           "host_syncs", "SYNC_EVENT_CALLS", "CUDA_TRACES_DIRS", "cuda_profiles", "side_by_side", "is_launch_call",
           "is_sync_call"]
