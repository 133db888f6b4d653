"""One forkserver for every device process, when the course's judge asks for it: started before
a submission runs, so that no code of the submission's is in it.  A forkserver started later
(the submission's cells killed it, or changed how it starts) runs whatever the cells put in it,
and the device processes forked from it run the submission's kernels; none is used."""

import multiprocessing as mp
import multiprocessing.forkserver  # noqa: F401  (its forkserver's pid)
import os
import socket
import sys
import types
from multiprocessing import connection, resource_tracker

from .device import DeviceError

#: The pid of the forkserver that must fork every device process; None (outside the judge): any.
#: An object's attribute: the checkers put the toy's module names back as they were imported.
PINNED = types.SimpleNamespace(pid=None)


def running(preload: list[str], without_main) -> int:
    """The forkserver's pid, started now (preloading ``preload``) if it is not running."""
    mp.get_context("forkserver").set_forkserver_preload(preload)
    with without_main():
        mp.forkserver.ensure_running()
    return mp.forkserver._forkserver._forkserver_pid


def start(preload: list[str], without_main) -> None:
    """Start the forkserver now, preloading ``preload``, and use only it from now on.  A
    process of one thread (a judge before its cells and its audit hook) forks it from itself,
    ``preload`` already imported: a new interpreter imported torch again for each judge, its
    first engine 1.4 s instead of 0.15 s (measured, 2 cores).  CPython 3.14's forkserver
    authenticates its clients, a layout this does not write: there, as elsewhere, a new one."""
    if sys.version_info < (3, 14) and len(os.listdir("/proc/self/task")) == 1 and all(
            name in sys.modules for name in preload):
        PINNED.pid = _forked()
    else:
        PINNED.pid = running(preload, without_main)


def _forked() -> int:
    """multiprocessing's forkserver loop in a child forked now, made the one its forkserver
    context uses (CPython 3.11-3.13: as ``ForkServer.ensure_running`` records a new one)."""
    server = mp.forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:  # one runs already: that one
            return server._forkserver_pid
        resource_tracker.ensure_running()  # before the fork: the server and its children share it
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # its end at EOF: this process is gone, so is the server
            pid = os.fork()
            if pid == 0:  # never returns: no handler of this process's runs in the server
                try:
                    os.close(alive_w)
                    mp.forkserver.main(listener.fileno(), alive_r, [])
                finally:
                    os._exit(0)
            os.close(alive_r)
        server._forkserver_address, server._forkserver_alive_fd = address, alive_w
        server._forkserver_pid = pid
    return pid


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
    if parent != PINNED.pid:
        raise DeviceError(f"device process {pid} was forked by process {parent}, not by the "
                          f"forkserver {PINNED.pid} the judge started before your code: your code "
                          f"stopped, restarted or replaced the forkserver")
