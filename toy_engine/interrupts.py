"""Interrupt-safe sections: a SIGINT (Ctrl-C, Jupyter's Interrupt) waits until a block ends.
The engine holds it around its lock and a run's bookkeeping, the CPU stand-in around every pipe
message (cost and the failure it prevents: docs/measurements/device.md) and its process's start
(one cut short kills the forkserver every engine shares); never around pickling a plug-in.
"""

import _signal
import contextlib
import signal
import threading
from multiprocessing import resource_tracker


class hold_sigint:
    """Hold a SIGINT until the block ends, then replay it (one between a message's header and payload
    breaks the pipe for good); main thread only.  Over ``_signal``: ``signal`` costs more per launch."""

    def __enter__(self):
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            previous = _signal.getsignal(signal.SIGINT)
            if previous is not None:  # None: installed from C, leave it alone
                self._previous, self._caught = previous, False
                _signal.signal(signal.SIGINT, self._catch)
        return self

    def _catch(self, signum, frame) -> None:
        self._caught = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            _signal.signal(signal.SIGINT, self._previous)
            if self._caught:
                signal.raise_signal(signal.SIGINT)  # delivered now, at a message boundary

    @contextlib.contextmanager
    def let_through(self):
        """Inside the held block, deliver SIGINT as usual (one held so far first)."""
        if self._previous is None:
            yield
            return
        _signal.signal(signal.SIGINT, self._previous)
        try:
            if self._caught:
                self._caught = False
                signal.raise_signal(signal.SIGINT)
            yield
        finally:
            _signal.signal(signal.SIGINT, self._catch)


@contextlib.contextmanager
def sigint_blocked():
    """SIGINT blocked while the device process starts, as the standard library starts its
    resource tracker: the forkserver (or a spawned device process) inherits the block until it
    ignores SIGINT, so a Ctrl-C while it imports torch prints no traceback of its own above the
    command's line.  The host still gets it; the forkserver's other children start blocked."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process group for Ctrl-C to reach
        yield
        return
    resource_tracker.ensure_running()  # first: starting, it unblocks SIGINT
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
