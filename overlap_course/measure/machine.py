"""How many CPUs this process can really use, and what that means for live timings.

On the CPU stand-in the "device" is a second process.  Unpaced (``device="cpu"``) it
computes on a core of its own the whole time, so overlap can only show when the host loop
and the device process run at the same time, on 2 usable CPUs.  Paced (``device="paced"``,
what ``"auto"`` picks below 2 usable CPUs) it computes, then sleeps out a GPU-like time, so
host and device overlap on one CPU.  ``os.cpu_count()`` is not the answer to "how many?": a
workshop hub may give each user a 1-CPU cgroup quota on a 64-core machine, and
``taskset``/a container may restrict the affinity mask.  The engine counts them
(:func:`toy_engine.device.usable_cpus`: the smaller of the two) to choose its device.

What *other* processes do with those cores right now is estimated from the load average
(``usable`` in the report, read by notebook 00); what they did during a given run is measured by
the run's contention meter (:mod:`overlap_course.measure.contention`), which is what the bench and
the figures judge by.
"""

from __future__ import annotations

import os

from toy_engine import device as _device
from toy_engine.device import cgroup_cpu_quota, usable_cpus
from toy_engine.process_device import ProcessDevice

__all__ = ["usable_cpus", "cgroup_cpu_quota", "machine_report", "busy_warning", "pacing_text", "cpu_snapshot",
           "MIN_CPUS_FOR_OVERLAP", "PACED_MIN_CPUS", "BUSY_WARNING_PREFIX"]

#: The unpaced stand-in: host loop + device process, each on its own core.
MIN_CPUS_FOR_OVERLAP = ProcessDevice.PACED_BELOW_CPUS
#: The paced stand-in: host work and device compute per round both fit in one paced round of one
#: CPU (docs/measurements/device.md); with less, the device's kernels end late.
PACED_MIN_CPUS = 1.0

#: Every busy warning starts with this, so tests and learners can spot it.
BUSY_WARNING_PREFIX = "WARNING: machine busy"


def cpu_snapshot() -> tuple[float, float, int] | None:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process, CPUs) now.

    From ``/proc/stat`` (Linux; None elsewhere).  Two snapshots around a run tell how much
    CPU *other* programs took meanwhile: the one kind of contention a process's own CPU
    time cannot see (they share caches and memory bandwidth with us even when neither is
    preempted).  Steal time counts as busy: a hypervisor gave our vCPU to someone else.
    """
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = [int(x) for x in lines[0].split()[1:]]
    busy_ticks = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    times = os.times()
    return busy_ticks / os.sysconf("SC_CLK_TCK"), times.user + times.system, cpus


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on Linux
        return None


def machine_report() -> dict:
    """What the live timings of this kernel can show, for notebook 00 and the bench.

    ``allowed`` is :func:`usable_cpus` (affinity mask, cgroup quota); ``stand_in`` the CPU
    stand-in ``device="auto"`` picks with that many ("paced" below ``MIN_CPUS_FOR_OVERLAP``, else
    "cpu"), and ``needed`` what it needs to show overlap.  ``usable`` also takes away the load
    that is not ours right now: the 1-minute load average counts the runnable processes, and this
    notebook's kernel is about one of them.  ``live_overlap`` is ``usable >= needed``;
    ``overlap_can_show`` the same question asked of ``allowed`` alone (can this machine ever show it?).
    """
    affinity, quota, load = _device.affinity_cpus(), _device.cgroup_cpu_quota(), _load_average()
    allowed = _device.usable_cpus()
    others = 0.0 if load is None else max(0.0, load - 1.0)
    usable = round(max(0.0, allowed - others), 2)
    paced = allowed < MIN_CPUS_FOR_OVERLAP
    needed = PACED_MIN_CPUS if paced else float(MIN_CPUS_FOR_OVERLAP)
    can_show = allowed >= needed
    if not can_show:
        meaning = (f"only {allowed:g} usable CPU(s): even the paced stand-in needs {needed:g} for its host "
                   f"loop's and its device's work to fit a paced round, so live ZOS timings cannot beat serial "
                   f"here; the notebooks show the recorded quiet-machine traces beside the live ones")
    elif usable < needed:
        meaning = (f"{allowed:g} CPUs, but other programs keep about {others:.1f} of them busy (load average "
                   f"{load:.2f}): live timings may not show overlap until they finish")
    elif paced:
        meaning = (f"{allowed:g} usable CPU(s): without a GPU, device='auto' picks the PACED stand-in, whose "
                   f"kernels compute, then sleep out a GPU-like time (a GPU does not use the host's core), so "
                   f"the host loop and the device overlap on one core and live timings can show it")
    else:
        meaning = (f"{allowed:g} usable CPUs: the host loop and the device process can run at the same "
                   f"time, so live timings can show overlap")
    return dict(cpu_count=os.cpu_count(), affinity=affinity, cgroup_quota=quota, allowed=allowed,
                load_average=None if load is None else round(load, 2), usable=usable,
                stand_in="paced" if paced else "cpu", needed=needed,
                live_overlap=usable >= needed, overlap_can_show=can_show, meaning=meaning)


def pacing_text(pacing: dict) -> str:
    """A paced stand-in's time model as a learner reads it (``meta.pacing``, ``ProcessDevice.PACED_MS``)."""
    parts = [f"{kernel.removesuffix('_inputs')} {ms:g} ms" + (f" + {per_token:g} ms per packed token" * bool(per_token))
             for kernel, (ms, per_token) in pacing.items() if kernel != "launch"]
    return (f"PACED stand-in, time model {', '.join(parts)}, each starting {pacing['launch'][0]:g} ms after its "
            f"launch at the earliest: a kernel's span lasts what the model says (the device sleeps out what its real "
            f"compute left; a GPU does not use the host's core), its CPU time is the real compute")


def _listed(values: dict, fmt: str, lowest: bool) -> str:
    """Up to three runs by name; more as a range and the worst one (a bench has 4 modes x repeats)."""
    if len(values) <= 3:
        return ", ".join(f"{v:{fmt}} ({label})" for label, v in values.items())
    worst = (min if lowest else max)(values, key=values.get)
    low, high = min(values.values()), max(values.values())
    return f"{low:{fmt}}–{high:{fmt}} in {len(values)} runs (worst: {values[worst]:{fmt}} ({worst}))"


def busy_warning(runs: dict, cuda: bool = False, recorded: bool = True) -> str | None:
    """A warning when live serial/ZOS numbers cannot be trusted on this machine, else None.

    ``runs`` maps a label to a run's contention meter (a dict, e.g. the bench's), to a
    :class:`~toy_engine.timeline.Timeline`, or to a ``(timeline, stats)`` pair.  A
    run is busy when its device process or its host loop got less than
    ``BUSY_RUN_CPU_SHARE`` of its wall time as CPU (another process held the core it was
    ready to run on), when a paced run's device spans ended late (``PACED_LATE_SHARE``), or when
    other programs used the machine; fewer usable CPUs than the runs' stand-in needs (2 unpaced,
    1 paced) is a warning by itself.  CUDA runs do not share the host's cores: never busy here.
    ``recorded``: the caller shows RECORDED quiet-machine runs beside the live ones (the bench,
    ``compare_figure``), and the warning points to them; the explorer shows none, and its warning does not.
    """
    from toy_engine.timeline import Timeline

    from .contention import BUSY_OTHERS_CPUS, BUSY_RUN_CPU_SHARE, PACED_LATE_SHARE, contention

    if cuda:
        return None
    report = machine_report()

    low = {"device": {}, "host": {}}
    others, late, unpaced = {}, {}, False
    for label, run in runs.items():
        run = run[0] if isinstance(run, tuple) else run
        stats = contention(run) if isinstance(run, Timeline) else run
        unpaced = unpaced or not stats.get("paced")
        for lane in low:
            share = stats.get(f"{lane}_cpu_share")
            if share is not None and share < BUSY_RUN_CPU_SHARE:
                low[lane][label] = share
        if (stats.get("device_late_fraction") or 0.0) > PACED_LATE_SHARE:
            late[label] = stats["device_late_fraction"]
        if not stats.get("paced") and (stats.get("others_cpus") or 0.0) > BUSY_OTHERS_CPUS:  # paced: late says
            others[label] = stats["others_cpus"]
    too_few = report["allowed"] < (MIN_CPUS_FOR_OVERLAP if unpaced else PACED_MIN_CPUS)
    if not low["device"] and not low["host"] and not late and not others and not too_few:
        return None
    reasons = []
    for lane, who in (("device", "The device process"), ("host", "The host loop")):
        if low[lane]:
            reasons.append(f"{who} got only {_listed(low[lane], '.0%', lowest=True)} of its wall time as CPU.")
    if low["device"] or low["host"]:
        reasons.append(f"A quiet run gets more than {BUSY_RUN_CPU_SHARE:.0%}: other programs held the cores "
                       f"(load average {report['load_average']}).")
    if late:
        reasons.append(f"The PACED device's kernels ended {_listed(late, '.0%', lowest=False)} of their paced "
                       f"time late (a quiet run: under {PACED_LATE_SHARE:.0%}): their compute did not fit the "
                       f"time model, because other programs held the core (load average {report['load_average']}) "
                       f"or a CPU quota under {PACED_MIN_CPUS:g} throttled it.")
    if others:
        listed = _listed(others, ".2f", lowest=False)
        reasons.append(f"Other programs used {listed} of the machine's {report['cpu_count']} CPUs meanwhile "
                       f"(over {BUSY_OTHERS_CPUS:g} slows our processes through shared caches even when "
                       f"they are not preempted).")
    if too_few and unpaced and report["allowed"] >= PACED_MIN_CPUS:
        reasons.append(f"Only {report['allowed']:g} usable CPU(s): the unpaced stand-in's host loop and device "
                       f"process take turns on one core, so live ZOS timings cannot beat serial here "
                       f"(device='paced', what device='auto' picks with fewer than {MIN_CPUS_FOR_OVERLAP}, "
                       f"overlaps on one core).")
    elif too_few:
        reasons.append(report["meaning"][0].upper() + report["meaning"][1:] + ".")
    advice = "Compare with the RECORDED quiet-machine run shown with them; close" if recorded else "Close"
    return (f"{BUSY_WARNING_PREFIX}. " + " ".join(reasons) +
            " Live serial/ZOS timings measured like this do not show what overlap buys; ZOS can even look "
            f"slower. {advice} other notebooks or programs and re-run for live numbers.")
