"""How many CPU cores this process can really use: the course's contention meter.

Live overlap on the CPU stand-in needs two cores at once, one for the host loop and one
for the device process.  ``os.cpu_count()`` is not that number: a container's CPU quota,
the affinity mask and other busy processes all take cores away, and on a busy machine the
measured ZOS gain vanishes (seen at load average 3 on 2 cores: x0.9-1.0).  The notebooks
read this report and, with fewer than two usable cores, say so and draw the shipped
recorded traces (``viz.load_trace``) next to the live run.
"""

from __future__ import annotations

import os
from pathlib import Path

LIVE_OVERLAP_CORES = 2.0  # one for the host loop, one for the device process


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _cgroup_quota() -> float | None:
    """CPUs allowed by a cgroup v2 (``cpu.max``) or v1 (``cfs_quota_us``) limit; None if unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def machine_report() -> dict:
    """Affinity, cgroup quota, 1-minute load average, usable cores, and whether live overlap can show.

    ``usable`` = the cores this process may run on (affinity, capped by the quota) minus the
    load that is not ours: the load average counts the runnable processes, and the
    notebook's own kernel accounts for about one of them.
    """
    affinity, quota, load = _affinity(), _cgroup_quota(), _load_average()
    allowed = float(affinity if quota is None else min(affinity, quota))
    others = 0.0 if load is None else max(0.0, load - 1.0)
    usable = round(max(0.0, allowed - others), 2)
    return {
        "affinity": affinity,
        "cgroup_quota": quota,
        "load_average": None if load is None else round(load, 2),
        "usable": usable,
        "live_overlap": usable >= LIVE_OVERLAP_CORES,
    }


def usable_cpus() -> float:
    """Cores this process can use right now (see machine_report)."""
    return machine_report()["usable"]
