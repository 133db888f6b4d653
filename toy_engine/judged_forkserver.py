"""One forkserver for every device process, when the course's judge asks for it: started before
a submission runs, so that no code of the submission's is in it.  A forkserver started later
(the submission's cells killed it, or changed how it starts) runs whatever the cells put in it,
and the device processes forked from it run the submission's kernels; none is used."""

import multiprocessing as mp
import multiprocessing.forkserver  # noqa: F401  (its forkserver's pid)
import types

from .device import DeviceError

#: The pid of the forkserver that must fork every device process; None (outside the judge): any;
#: and its :func:`identity`.  An object's attributes: the checkers put the toy's module names back
#: as they were imported.
PINNED = types.SimpleNamespace(pid=None, identity=None)


def identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks since boot) of a live process, None for none (Linux).  A
    pid is free again once its process is reaped; a start time is not (round 44: a cell killed
    the forkserver, reaped it, and forked until a child of its own had its pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # "pid (name) state ppid ... starttime ..."
            return pid, int(f.read().rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def running(preload: list[str], without_main) -> int:
    """The forkserver's pid, started now (preloading ``preload``) if it is not running."""
    mp.get_context("forkserver").set_forkserver_preload(preload)
    with without_main():
        mp.forkserver.ensure_running()
    return mp.forkserver._forkserver._forkserver_pid


def start(preload: list[str], without_main) -> None:
    """Start the forkserver now, preloading ``preload``, and use only it from now on."""
    PINNED.pid = running(preload, without_main)
    PINNED.identity = identity(PINNED.pid)


def method(chosen: str) -> str:
    """The start method of a device process: ``chosen``, or the forkserver once one is pinned."""
    return chosen if PINNED.pid is None else "forkserver"


def check_parent(pid: int) -> None:
    """Refuse a device process that the pinned forkserver (alive) did not fork."""
    if PINNED.pid is None:
        return
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # "pid (name) state ppid ..."
            parent = int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        parent = None
    if parent != PINNED.pid or identity(parent) != PINNED.identity:
        raise DeviceError(f"device process {pid} was forked by process {parent}, not by the "
                          f"forkserver {PINNED.pid} the judge started before your code: your code "
                          f"stopped, restarted or replaced the forkserver")
