"""How many CPUs this process can really use, and what that means for live timings.

On the CPU stand-in the "device" is a second process that needs a core of its own:
overlap can only show when the host loop and the device process run at the same
time.  ``os.cpu_count()`` is not the answer to "can they?": a workshop hub may give
each user a 1-CPU cgroup quota on a 64-core machine, and ``taskset``/a container may
restrict the affinity mask.  So we take the smallest of

* the affinity mask (``os.sched_getaffinity``): the cores we may be scheduled on;
* the cgroup CPU quota, v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us / cpu.cfs_period_us``):
  how many cores' worth of time we get per period, whatever the mask says.

A quota is a float (``50000 / 100000`` is half a core).  What *other* processes do with
those cores right now is estimated from the load average (``usable`` in the report, read
by notebook 00); what they did during a given run is measured by the run's contention
meter (:mod:`overlap_course.measure.contention`), which is what the bench and the figures judge by.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["usable_cpus", "machine_report", "busy_warning", "cpu_snapshot", "MIN_CPUS_FOR_OVERLAP",
           "LIVE_OVERLAP_CORES", "BUSY_WARNING_PREFIX"]

#: Host loop + device process, each on its own core.
MIN_CPUS_FOR_OVERLAP = 2
LIVE_OVERLAP_CORES = float(MIN_CPUS_FOR_OVERLAP)

_CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Every busy warning starts with this, so tests and learners can spot it.
BUSY_WARNING_PREFIX = "WARNING: machine busy"


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows: no affinity API
        return os.cpu_count() or 1


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 ``cpu`` controller path, from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_along(base: Path, rel: str, read_one) -> float | None:
    """Smallest quota from the process's cgroup up to the root (a parent's limit applies too)."""
    best = None
    rel_path = Path(rel.lstrip("/"))
    for directory in [base / rel_path, *(base / p for p in rel_path.parents)]:
        quota = read_one(directory)
        if quota is not None:
            best = quota if best is None else min(best, quota)
    return best


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")  # "max 100000" or "50000 100000"
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None  # -1: no limit
    return int(quota) / int(period)


def cgroup_cpu_quota(root: Path = _CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """CPUs' worth of time the cgroup allows per period; None when there is no quota.

    ``root`` and ``proc_cgroup`` (the text of /proc/self/cgroup) are parameters so the
    parsing can be tested on a fake tree.
    """
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    v2, v1 = _cgroup_paths(proc_cgroup)
    quotas = []
    if v2 is not None:
        quotas.append(_quota_along(root, v2, _v2_quota))
    if v1 is not None:  # a v1 tree mounts the cpu controller at <root>/cpu (or cpu,cpuacct)
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            if (root / mount).is_dir():
                quotas.append(_quota_along(root / mount, v1, _v1_quota))
                break
    quotas = [q for q in quotas if q is not None]
    return min(quotas) if quotas else None


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


def _cgroup_quota() -> float | None:
    return cgroup_cpu_quota()


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on Linux
        return None


def usable_cpus() -> float:
    """CPUs this process can really use: min(affinity mask size, cgroup quota)."""
    quota = _cgroup_quota()
    affinity = _affinity()
    return float(affinity if quota is None else min(affinity, quota))


def machine_report() -> dict:
    """What the live timings of this kernel can show, for notebook 00 and the bench.

    ``allowed`` is :func:`usable_cpus` (affinity mask, cgroup quota).  ``usable`` also
    takes away the load that is not ours right now: the 1-minute load average counts the
    runnable processes, and this notebook's kernel is about one of them.  ``live_overlap``
    is ``usable >= 2``: below that the host loop and the device process take turns on one
    core and a live ZOS run cannot beat a serial one.  ``overlap_can_show`` is the same
    question asked of ``allowed`` alone (can this machine ever show it?).
    """
    affinity, quota, load = _affinity(), _cgroup_quota(), _load_average()
    allowed = float(affinity if quota is None else min(affinity, quota))
    others = 0.0 if load is None else max(0.0, load - 1.0)
    usable = round(max(0.0, allowed - others), 2)
    can_show = allowed >= MIN_CPUS_FOR_OVERLAP
    if not can_show:
        meaning = (f"only {allowed:g} usable CPU(s): the host loop and the device process take turns on "
                   f"one core, so live ZOS timings cannot beat serial here; the notebooks show the "
                   f"recorded quiet-machine traces beside the live ones")
    elif usable < LIVE_OVERLAP_CORES:
        meaning = (f"{allowed:g} CPUs, but other programs keep about {others:.1f} of them busy (load average "
                   f"{load:.2f}): live timings may not show overlap until they finish")
    else:
        meaning = (f"{allowed:g} usable CPUs: the host loop and the device process can run at the same "
                   f"time, so live timings can show overlap")
    return dict(cpu_count=os.cpu_count(), affinity=affinity, cgroup_quota=quota, allowed=allowed,
                load_average=None if load is None else round(load, 2), usable=usable,
                live_overlap=usable >= LIVE_OVERLAP_CORES, overlap_can_show=can_show, meaning=meaning)


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
    ready to run on); fewer than :data:`MIN_CPUS_FOR_OVERLAP` usable CPUs is a warning by
    itself.  CUDA runs do not share the host's cores: never busy here.  ``recorded``: the caller
    shows RECORDED quiet-machine runs beside the live ones (the bench, ``compare_figure``), and
    the warning points to them; the explorer shows none, and its warning does not.
    """
    from toy_engine.timeline import Timeline

    from .contention import BUSY_OTHERS_CPUS, BUSY_RUN_CPU_SHARE, contention

    if cuda:
        return None
    report = machine_report()

    low = {"device": {}, "host": {}}
    others = {}
    for label, run in runs.items():
        run = run[0] if isinstance(run, tuple) else run
        stats = contention(run) if isinstance(run, Timeline) else run
        for lane in low:
            share = stats.get(f"{lane}_cpu_share")
            if share is not None and share < BUSY_RUN_CPU_SHARE:
                low[lane][label] = share
        if (stats.get("others_cpus") or 0.0) > BUSY_OTHERS_CPUS:
            others[label] = stats["others_cpus"]
    if not low["device"] and not low["host"] and not others and report["overlap_can_show"]:
        return None
    reasons = []
    for lane, who in (("device", "The device process"), ("host", "The host loop")):
        if low[lane]:
            reasons.append(f"{who} got only {_listed(low[lane], '.0%', lowest=True)} of its wall time as CPU.")
    if others:
        listed = _listed(others, ".2f", lowest=False)
        reasons.append(f"Other programs used {listed} of the machine's {report['cpu_count']} CPUs meanwhile "
                       f"(over {BUSY_OTHERS_CPUS:g} slows our processes through shared caches even when "
                       f"they are not preempted).")
    if reasons:
        reasons.append(f"A quiet run gets more than {BUSY_RUN_CPU_SHARE:.0%}: other programs held the cores "
                       f"(load average {report['load_average']}).")
    if not report["overlap_can_show"]:
        reasons.append(report["meaning"][0].upper() + report["meaning"][1:] + ".")
    advice = "Compare with the RECORDED quiet-machine run shown with them; close" if recorded else "Close"
    return (f"{BUSY_WARNING_PREFIX}. " + " ".join(reasons) +
            " Live serial/ZOS timings measured like this do not show what overlap buys; ZOS can even look "
            f"slower. {advice} other notebooks or programs and re-run for live numbers.")
