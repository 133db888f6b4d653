"""A judge's device forkserver, forked from the judge before it reads its request and secret.

The engine's device processes come from one forkserver that the judge pins before any line of
the submission runs (:mod:`toy_engine.judged_forkserver`).  Started as multiprocessing starts it,
that forkserver is a new interpreter that imports torch again: about 1.3 s of CPU per judge
(the first engine 1.44 s instead of 0.19 s, 2-core machine, quiet).  A judge is a fork of the
zygote, which has torch, the toy and the course imported, so a fork of the judge has them too.

Forked *when* it is, it holds nothing a new interpreter would not: after the judge's Landlock
fence (it shares it, and so may signal its device processes as before) and before the judge
reads stdin, where this run's request, secret and report path arrive -- so none of them, nor
the report's writer, is in its memory (round 40 forged a signed "passed" from a forkserver forked
later, whose children the cells can ask for and run code in).  It keeps only its socket, its
pipe from the judge and stderr: stdin (the secret's pipe) and stdout are ``/dev/null``.  Like
the new interpreter, it and its children have no audit hook; the fence is what guards their
files (and, a fenced process holding no capability, nothing reads the judge's memory).  Its
socket is a file in the judge's folder, which the cells may write: every device process is
asked of it by a connect that checks the process listening there is this server.

Only where CPython's forkserver takes this layout (3.11-3.13; 3.14's authenticates its clients)
and the judge runs one thread; elsewhere the judge starts a new one later, as before, with
multiprocessing's own connect (a relay bound in the socket's place is not refused there).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver  # noqa: F401  (its module-level ForkServer)
import os
import socket
import struct
import sys
from multiprocessing import connection, reduction, resource_tracker

from toy_engine.judged_forkserver import identity

_CREDS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid of the process that listens
_MAX_FDS = mp.forkserver.MAXFDS_TO_SEND  # as imported (a cell set it to 3: "ValueError")


def fork_before_the_secret(preload: list[str]) -> int | None:
    """The forkserver's pid, forked now and made the one multiprocessing's forkserver context
    uses; None where it cannot be forked safely (the judge then starts one as before)."""
    if sys.platform != "linux" or sys.version_info >= (3, 14) or len(
            os.listdir("/proc/self/task")) != 1 or not all(name in sys.modules for name in preload):
        return None
    server = mp.forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            return None
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            os.chmod(address, 0o600)
            alive_r, alive_w = os.pipe()  # at EOF the judge is gone, and the server ends
            ready_r, ready_w = os.pipe()  # at EOF the server listens
            pid = os.fork()
            if pid == 0:  # never returns: nothing of the judge's runs after this in the server
                try:
                    listener.listen()  # here: a client's SO_PEERCRED names the server, not us
                    _keep_only(listener.fileno(), alive_r)
                    mp.forkserver.main(listener.fileno(), alive_r, [])
                finally:
                    os._exit(0)
            for fd in (alive_r, ready_w):
                os.close(fd)
            os.read(ready_r, 1)
            os.close(ready_r)
        # as ForkServer.ensure_running records the one it starts (CPython 3.11-3.13)
        server._forkserver_address, server._forkserver_alive_fd = address, alive_w
        server._forkserver_pid = pid
        mp.forkserver.connect_to_new_process = _connecting(address, identity(pid), alive_w)
    return pid


def _connecting(address: str, server: tuple[int, int] | None, alive_w: int):
    """multiprocessing's ``connect_to_new_process`` (CPython 3.11-3.13, its protocol as is) to
    the server forked here only: at the address as forked (not the one the instance holds
    now), and refused unless the process that listens there is that server (its ``identity``,
    pid and start time).  Round 42: a cell renamed the socket's file in the judge's folder and
    bound its own relay there, which rewrote what each device process of the check unpickled
    (the submission's code ran in them) and passed it on to this server, which forked them as
    always.  Round 44: a cell killed the server, and a child of its own took its pid."""
    pid = server[0] if server else None

    def connect_to_new_process(fds):
        if len(fds) + 4 >= _MAX_FDS:
            raise ValueError("too many fds")
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(address)
            creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
            listening = _CREDS.unpack(creds)[0]
            if listening != pid or identity(listening) != server:
                raise ConnectionRefusedError(
                    f"the device processes' socket ({address}) is served by process "
                    f"{listening}, not by the forkserver {pid} the judge started before your "
                    f"code: your code replaced it")
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            try:
                reduction.sendfds(client, [child_r, child_w, alive_w,
                                           resource_tracker.getfd(), *fds])
                return parent_r, parent_w
            except BaseException:
                os.close(parent_r)
                os.close(parent_w)
                raise
            finally:
                os.close(child_r)
                os.close(child_w)
    return connect_to_new_process


def _keep_only(*kept: int) -> None:
    """Close every descriptor but ``kept`` and stderr; stdin and stdout read and write nothing."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    start = 0
    for fd in sorted({0, 1, 2, *kept}):
        if start < fd:
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))
