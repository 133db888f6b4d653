"""Lesson 06 (notebook 06_real_traces, optional): a real GPU's trace read with the course's
Kineto reader.  Every check judges against the trace it is given -- the real A100 file, or
the learner's own export -- never against a number written here.
"""

from __future__ import annotations

import re

from overlap_course.traces import kineto

from . import answers
from .answers import share, show
from .errors import said
from .harness import notebook_check
from .verdict import Verdict, fails, passes, unanswered

__all__ = ["check_idle_share", "check_idle_sync"]

#: How far (in share points) an eyeballed idle share may be from the measured one.
IDLE_SHARE_TOLERANCE = 0.10
_CALL_SUFFIX = ("()", "_v2")
SYNC_EVENT_NAMES = {"stream sync": "cudaStreamSynchronize", "event sync": "cudaEventSynchronize",
                    "context sync": "cudaDeviceSynchronize"}


def _trace_figures(trace, what):
    """(KinetoTrace, its summary) or a Verdict saying what is wrong with ``trace``."""
    try:
        parsed = trace if isinstance(trace, kineto.KinetoTrace) else kineto.KinetoTrace(trace)
        return parsed, kineto.summary(parsed)
    except (ValueError, TypeError) as err:
        return fails("setup", f"cannot measure {what}: {said(err)}")


@notebook_check
def check_idle_share(answer, trace) -> Verdict:
    """Predict (06): the share of the trace's device span (first to last event on a GPU stream)
    in which no device work runs -- HTA's idle, :func:`overlap_course.traces.kineto.summary`'s
    ``device_idle_fraction``.  A fraction (0.8), a percentage (80) or a percentage string ("80%");
    within 10 points passes, since it is read off a figure, unless the answer sits on a known
    wrong measurement (the busy share, or idle over the whole trace instead of the device span)."""
    if answer is None:
        return unanswered("set `idle_share` to a number, e.g. 0.5 or 50 (%)")
    answer = share(answer)
    if answer is None:
        return fails("shape", "write the share as a number (0.5, or 50 for 50 %, or \"50%\")")
    measured = _trace_figures(trace, "the idle share")
    if isinstance(measured, Verdict):
        return measured
    parsed, s = measured
    idle, span, busy_us, idle_us = (s["device_idle_fraction"], s["device_span_us"], s["device_busy_us"],
                                    s["device_idle_us"])
    look = "Read the device row between its first and its last event: how much of it has no bar?"
    if answer < 0:
        return fails("negative", f"a share cannot be negative. {look}")
    if answer > 100:
        if abs(answer - idle_us) <= 0.05 * idle_us:
            return fails("idle_time_not_share", f"{answer:g}: that is the idle time in microseconds, not a share")
        return fails("share_over_one", f"{answer:g}: a share is at most 1 (or 100 %). {look}")
    fraction, written = (answer / 100, f"{answer:g} %") if answer > 1 else (answer, f"{answer:g}")
    if answer > 1 and busy_us > 0 and abs(answer - idle_us / busy_us) <= 0.05 * idle_us / busy_us:
        return fails("idle_over_busy", f"{answer:g}: that is idle over busy; the share is idle over the whole span")
    everything = parsed.host + parsed.on_stream
    whole = max(e.end for e in everything) - min(e.ts for e in everything)
    for value, category, why in ((1 - idle, "busy_fraction", "the busy share: the question asks how much of the span "
                                                              "the device is idle"),
                                 (1 - busy_us / whole, "whole_trace", "the idle share of the whole trace, from the "
                                  "first host call on: the question's span runs from the first to the last event on "
                                  "the device row")):
        if abs(fraction - value) <= 0.01 < abs(fraction - idle):
            return fails(category, f"{written} is {why}")
    if abs(fraction - idle) <= IDLE_SHARE_TOLERANCE:
        kernels_only = s["kernels_only_idle_fraction"]
        extra = (f" (counting only kernels, copies and memsets as busy, not the stream's sync interval: "
                 f"{kernels_only:.1%})" if abs(kernels_only - idle) >= 0.001 else "")
        most = ". Most of the span the GPU has nothing queued" if idle > 0.5 else ""
        return passes(f"{written} is close: measured, the device is idle {idle_us:.0f} of the {span:.0f} us from its "
                      f"first to its last event, {idle:.1%} (busy {busy_us:.0f} us){extra}{most}")
    if abs(fraction - (1 - idle)) <= IDLE_SHARE_TOLERANCE / 2:
        return fails("busy_fraction", f"{written} is close to the busy share: the question asks how much of the span "
                                      f"the device is idle")
    return fails("wrong", f"{written} is more than {100 * IDLE_SHARE_TOLERANCE:.0f} points off: the device is idle "
                          f"{'more' if fraction < idle else 'less'} than that. {look}")


def _call_name(answer: str) -> str:
    call = answers.name(answer)
    for suffix in _CALL_SUFFIX:
        if call.endswith(suffix):
            call = call[: -len(suffix)]
    return call


@notebook_check
def check_idle_sync(answer, trace, name: str = "culprit") -> Verdict:
    """Your turn (06): name the host call after which the device sat idle longest -- the
    blocking ``...Synchronize`` call charged with the most idle time by
    :func:`overlap_course.traces.kineto.idle_after_syncs` (the gaps in which it returned).  Judged on the
    trace given: the real A100 file, or the learner's own exported run (``name``: the answer's
    variable in the notebook, for the unanswered message)."""
    if answer is None:
        return unanswered(f"set `{name}` to the host call's name, as a string")
    if not isinstance(answer, str) or not str.__str__(answer).strip():
        return fails("shape", f"write the call's name as a string, e.g. \"cudaLaunchKernel\", not {show(answer)}")
    answer = str.__str__(answer)  # a plain str: a subclass's own strip or __eq__ never judge it
    measured = _trace_figures(trace, "which sync left the device idle")
    if isinstance(measured, Verdict):
        return measured
    parsed, _ = measured
    idle = kineto.idle_after_syncs(parsed)
    if not idle["by_sync_us"]:
        return fails("setup", f"no host sync returned while the device was idle in this trace: its "
                              f"{idle['idle_us']:.0f} us of idle are the host launching too slowly")
    want, want_us = next(iter(idle["by_sync_us"].items()))
    gaps = [g for g in idle["gaps"] if g["sync"] == want]
    total = idle["idle_us"]
    got = _call_name(answer)
    got = _call_name(SYNC_EVENT_NAMES.get(got, got))
    where = (f"{len(gaps)} gap{'s' * (len(gaps) != 1)}, {want_us:.0f} of the {total:.0f} us the device idled"
             if len(gaps) > 1 else
             f"the device drained at {gaps[0]['start_us']:.0f} us, {want} returned at {gaps[0]['sync_end_us']:.0f} us "
             f"and nothing was queued until {gaps[0]['end_us']:.0f} us: {want_us:.0f} of the {total:.0f} us it idled")
    if got == want.lower():
        alias = (f" ({show(answer.strip())} is its record on the device's sync track)"
                 if _call_name(answer) != want.lower() else "")
        rest = (f"; the other {idle['no_sync_us']:.0f} us are gaps in which no sync returned: the host issuing work "
                f"too slowly" if idle["no_sync_us"] >= 1 else "")
        return passes(f"{want}{alias}: the host blocked until the queue was empty, so the device waited "
                      f"for everything the host did next; {where}{rest}")
    host_names = {e.name.lower(): e.name for e in parsed.host}
    if re.search(r"item|local_scalar|is_nonzero|\.cpu|tolist", got):
        return fails("pytorch_call",
                     f"{show(answer.strip())} is the PyTorch side of it (reading a GPU value on the host "
                     f"copies it and waits); name the CUDA runtime call on the host lane that waited")
    if got in host_names and kineto.is_launch_call(host_names[got]):
        return fails("launch_call",
                     f"{host_names[got]} queues work and returns at once; it never waits for the device. "
                     f"Look for the call the host blocked in right after the device went idle")
    if got in host_names and not kineto.is_sync_call(host_names[got]):
        return fails("not_blocking", f"{host_names[got]} does not block the host (it records, queries or measures an "
                                     f"event). Look for a ...Synchronize call")
    if got in host_names:  # another sync of this trace
        own = idle["by_sync_us"].get(host_names[got], 0.0)
        why = (f"it returned in gaps worth {own:.0f} us" if own else
               "it did not return while the device was idle: it waited on work that was still running, or came "
               "after the last device event")
        return fails("other_sync", f"{host_names[got]}: {why}. The most idle after one call, {want_us:.0f} of the "
                                   f"{total:.0f} us, follows a different sync")
    return fails("not_in_trace", f"{show(answer.strip())} is not a call of this trace: look on its host lane for the "
                                 f"calls named ...Synchronize (kineto.host_syncs(trace) lists them)")
