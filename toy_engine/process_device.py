"""The CPU stand-in for a CUDA stream: a device process (started by ``forkserver`` or ``spawn``, never ``fork``,
never re-running the learner's ``__main__``) fed through a pipe.

A *device process* owns the model and the KV cache; host buffers are shared-memory tensors sent once, each launch
is a small message, and kernels run in order, stamped with ``time.perf_counter_ns``.  A process, not a thread: a
thread running eager PyTorch fights the host's Python for the GIL (docs/measurements/device.md).  Messages, always
whole: ``("setup", ...)``, ``("kernel", id, pickled)``, ``("launch", seq, kernel id, args, event id or None, send
time)``, ``("event", id)`` and ``("close",)`` go down; ``("ready", pid)``, ``("event", id, stamps, error)`` come back.
"""

import contextlib
import multiprocessing as mp
import multiprocessing.connection  # noqa: F401  (mp.connection.wait)
import multiprocessing.spawn as mp_spawn
import os
import pickle
import signal
import sys
import threading
import time
import types
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler

import cloudpickle
import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory tensor pickling)

from .device import Device, DeviceContext, DeviceError
from .sending import dumps, received, sendable
from .interrupts import hold_sigint, sigint_blocked
from . import judged_forkserver
from .validate import check_float, plugin_label, shown

# What a forkserver imports once for all device processes: torch, their main and the kernels.
_FORKSERVER_PRELOAD = ["torch", __name__, "toy_engine.kernels"]
START_METHOD_ENV = "TOY_ENGINE_START_METHOD"


def start_method() -> str:
    """``forkserver`` on Linux (torch imported once: several times faster, docs/measurements/device.md),
    else ``spawn`` (Windows has no forkserver; on macOS it can crash).  ``TOY_ENGINE_START_METHOD``
    overrides it; ``fork`` is refused: forking after torch has run threads can deadlock."""
    chosen = os.environ.get(START_METHOD_ENV, "").strip().lower()
    available = mp.get_all_start_methods()
    if not chosen:
        return "forkserver" if sys.platform != "darwin" and "forkserver" in available else "spawn"
    usable = [m for m in ("forkserver", "spawn") if m in available]
    if chosen not in usable:
        why = " (fork after torch has run can deadlock)" if chosen == "fork" else ""
        raise ValueError(f"{START_METHOD_ENV}={chosen!r} is not a start method the device process can "
                         f"use here{why}; set it to one of {usable}, or unset it for the automatic choice")
    return chosen


class _MainPatch:
    """without_main_module's patch, shared by the threads inside it (the checkers start engines
    from several at once).  An object, not a list or class attributes: the checkers' snapshot of
    the toy's modules would read its count changing as a learner's change."""

    def __init__(self) -> None:
        self.lock, self.inside, self.original = threading.Lock(), 0, None


_MAIN_PATCH = _MainPatch()
_PREPARATION_DATA = mp_spawn.get_preparation_data  # as imported: not one a cell put there
_NO_MAIN = object()  # sys.modules had no __main__


@contextlib.contextmanager
def without_main_module():
    """Start children without re-importing the user's main script (unguarded, it starts an engine).
    Thread-safe: the patch is installed by the first thread in and put back by the last one out
    (a thread leaving first would put the original back under one still starting its child)."""
    patch = _MAIN_PATCH
    with patch.lock:
        if patch.inside == 0:
            patch.original, original = mp_spawn.get_preparation_data, _PREPARATION_DATA

            def preparation_data(name):
                """The parent's data read with a bare ``__main__`` in its place, so that none
                of the user's is in it: after IPython's ``%reset`` its ``__main__`` has no
                ``__spec__``, which multiprocessing reads (AttributeError), and a cell can
                leave any object there, or none."""
                with patch.lock:  # one thread at a time swaps it, and puts the user's back
                    main = sys.modules.get("__main__", _NO_MAIN)
                    sys.modules["__main__"] = types.ModuleType("__main__")
                    try:
                        return original(name)
                    finally:  # in its place (the judge's snapshot reads sys.modules in order)
                        if main is _NO_MAIN:
                            del sys.modules["__main__"]
                        else:
                            sys.modules["__main__"] = main

            mp_spawn.get_preparation_data = preparation_data
        patch.inside += 1
    try:
        yield
    finally:
        with patch.lock:
            patch.inside -= 1
            if patch.inside == 0:
                mp_spawn.get_preparation_data, patch.original = patch.original, None


def _device_main(conn, num_threads: int, pace: dict | None, buffers: dict) -> None:
    """Run launches in order, report stamps at events; ignore SIGINT (Jupyter signals the whole group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_die_with_parent, daemon=True).start()
    torch.set_num_threads(num_threads)
    if pace and hasattr(os, "nice"):  # like a GPU's, a paced kernel's compute never holds up the host
        os.nice(19)
    with torch.inference_mode():
        _serve(conn, _Stream(pace=pace, buffers=buffers))


def _die_with_parent() -> None:
    # The parent's sentinel is ready once it exits; os.kill(pid, 0) on Windows sends CTRL_C_EVENT.
    mp.parent_process().join()
    os._exit(0)


@dataclass
class _Stream:
    """The device process's side: kernels, context, unreported stamps (seq, start, end, CPU ns: CPU beside wall
    time tells a preempted kernel from a slow one; paced ns or None), the first error (sticky).  Paced, it keeps a
    virtual clock: a kernel ends when ``ProcessDevice.PACED_MS`` says (or its compute, if later), on the clock."""

    kernels: dict = field(default_factory=dict)  # kernel id -> kernel
    ctx: DeviceContext | None = None
    stamps: list[tuple[int, int, int, int, int | None]] = field(default_factory=list)
    buffers: dict = field(default_factory=dict)  # the shared host buffers, name -> tensor
    error: str | None = None
    pace: dict | None = None
    clock: int = 0  # where the last kernel ends (perf_counter_ns); paced, it can be ahead of time

    def run(self, seq: int, kid: int, args, sent: int) -> None:
        if self.error is not None:
            return
        kernel, start, cpu = self.kernels[kid], time.perf_counter_ns(), time.process_time_ns()
        try:
            kernel(self.ctx, *(cloudpickle.loads(args) if isinstance(args, bytes) else args))
        except BaseException as exc:  # noqa: BLE001 - reported to the host
            self.error = f"{type(exc).__name__}: {exc} (in kernel '{kernel.__name__}', launch {seq})"
        end, cpu, paced = time.perf_counter_ns(), time.process_time_ns() - cpu, None
        model = None if self.pace is None or self.error else self.pace.get(kernel.__name__)
        if model is not None:  # ms + ms per packed token, from its launch (+ latency) or its predecessor's end
            paced = round((model[0] + model[1] * len(self.ctx.state["inputs"]["input_ids"])) * 1e6)
            start = sent + round(self.pace["launch"][0] * 1e6)
        start = max(start, self.clock)  # in order on the clock, which a paced stream runs ahead of time
        end = self.clock = max(end, start + (paced or 0))
        self.stamps.append((seq, start, end, cpu, paced))


def _serve(conn, stream: _Stream) -> None:
    """Handle the host's messages in order until it closes the stream or goes away.  An event is answered once
    everything before it is done and, paced, its time has come; meanwhile the next launches already run."""
    due = []  # events to answer, in order: (when, event id, the stamps and the error before it)
    while True:
        try:
            while due and due[0][0] <= time.perf_counter_ns():
                conn.send(("event", *due.pop(0)[1:]))
            if due and not conn.poll():  # nothing to run ahead: sleep till the event is due (poll waits whole ms)
                time.sleep(max(0, due[0][0] - time.perf_counter_ns()) / 1e9)
                continue
            msg = conn.recv()
        except Exception:  # noqa: BLE001 - host gone or link broken: nothing left to serve
            return
        kind, event_id = msg[0], None
        if kind == "launch":
            _, seq, kid, args, event_id, sent = msg
            stream.run(seq, kid, args, sent)
        elif kind == "event":
            event_id = msg[1]
        elif kind == "kernel":
            stream.kernels[msg[1]] = cloudpickle.loads(msg[2])
        elif kind == "setup":
            _, model_bytes, num_kv_blocks, block_size = msg
            stream.ctx = DeviceContext.build(model_bytes, num_kv_blocks, block_size, stream.buffers,
                                             torch.device("cpu"))
            conn.send(("ready", os.getpid()))
        elif kind == "close":
            return
        if event_id is not None:
            due.append((stream.clock, event_id, stream.stamps, stream.error))
            stream.stamps = []


def _exit_description(code: int) -> str:
    signals = {s.value: s.name for s in signal.Signals}
    return f"exited with code {code}" + (f" (killed by {signals[-code]})" if -code in signals else "")


def _open_pidfd(proc, method: str) -> int | None:
    """A pidfd of a device process a forkserver started (Linux): ProcessDevice._ended says why."""
    if method == "forkserver" and hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            return os.pidfd_open(proc.pid)
    return None


def _has_ended(pidfd: int, timeout_s: float = 0.0) -> bool:
    return bool(mp.connection.wait([pidfd], timeout_s))  # readable once it has exited


def _shutdown(proc, conn, link: dict, pidfd: int | None) -> None:
    """Stop the device process and close the pipe (``close()``, or the device's finalizer)."""
    if link["ok"]:  # a broken pipe might carry half a message: do not talk through it
        try:
            conn.send(("close",))
        except (OSError, ValueError):
            pass
        proc.join(timeout=2)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=2)
    if pidfd is not None:  # its forkserver gone, join() returned at once: the pidfd waits
        if not _has_ended(pidfd, 2.0):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)
    conn.close()
    if not proc.is_alive():  # the exit code is known: its sentinel pipe can go, and is_alive() still answers
        proc._popen.close()


@contextlib.contextmanager
def _socket_in_tmpdir(what: str):
    """A socket of ``what`` lives in TMPDIR (the forkserver's): a TMPDIR too long for one is
    named, not an ``AF_UNIX path too long`` deep in multiprocessing."""
    try:
        yield
    except OSError as exc:
        if "AF_UNIX path too long" not in str(exc):
            raise
        raise OSError(f"cannot start the device process: the folder for {what}, "
                      f"TMPDIR={os.environ.get('TMPDIR')!r}, is a path too long for the "
                      f"system; set TMPDIR to a short one such as /tmp") from None


def _start(proc, child) -> None:
    """``proc.start()``; then the pipe's other end closes: the device process has its own."""
    with _socket_in_tmpdir("its socket"):
        proc.start()
    child.close()


class ProcessDevice(Device):
    """The CPU stand-in, host side.  Kernels travel by value (cloudpickle); one that raises is a sticky
    ``DeviceError`` at the next ``wait``; an exception (not a held SIGINT) mid-message breaks the link."""

    name = "cpu-process"
    POLL_S = 0.5        # how often a waiting host checks that the device process is alive
    START_TIMEOUT_S = 120.0  # first start of the forkserver imports torch: slow on a busy machine
    #: Paced, a kernel starts ``launch`` ms after its launch at the earliest and ends no earlier than (ms + ms per
    #: packed token) after it starts; ``device="auto"`` paces below PACED_BELOW_CPUS usable CPUs.  Calibration and
    #: measurements: docs/measurements/device.md.
    PACED_MS = {"launch": [0.3, 0.0], "upload_inputs": [0.15, 0.0], "correct": [0.15, 0.0], "forward": [9.5, 0.1],
                "sample": [0.8, 0.0]}
    PACED_BELOW_CPUS = 2

    def __init__(self, model, num_kv_blocks, block_size, buffer_specs, race_check=True,
                 num_threads: int = 1, pace: dict | None = None):
        super().__init__(race_check)
        self.pacing = pace = checked_pacing(pace)  # its own copy of the time model, else None
        self.buffers = {n: torch.zeros(*shape, dtype=dt).share_memory_() for n, (shape, dt) in buffer_specs.items()}
        ctx = mp.get_context(judged_forkserver.method(start_method()))
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
        self._conn, child = ctx.Pipe()
        # buffers passed by the start: sent later, they needed a descriptor-server thread
        self._proc = ctx.Process(target=_device_main, args=(child, num_threads, pace, self.buffers),
                                 daemon=True, name="toy-engine-device")
        self._kernel_ids: dict[object, int] = {}
        self._sent_ns: dict[int, tuple[int, str, int]] = {}  # seq -> (send time, name, round)
        self._done_upto = 0  # events complete in order: every id <= this one is done
        self._stamps: list[tuple] = []  # (stage, round, start, end, CPU ns, paced ns or None)
        self._latencies_ns: deque[int] = deque(maxlen=4096)  # the latest: memory stays bounded
        self._last_end_ns = self._events = 0  # the last device span's end; the last event id
        self._error: str | None = None
        self._link = {"ok": True}  # False mid-message, and for good once one broke
        self._failure: str | None = None
        self._forkserver_gone = False  # seen gone while the device process ran
        try:  # cut short, the process ends now: a traceback kept (as Jupyter does) would keep it
            # Held (a Ctrl-C mid-start kills the shared forkserver) until the finalizer is set.
            with hold_sigint(), without_main_module(), sigint_blocked():
                _start(self._proc, child)
                self._pidfd = _open_pidfd(self._proc, ctx.get_start_method())
                self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._conn,
                                                   self._link, self._pidfd)
            judged_forkserver.check_parent(self._proc.pid)
            self.pid = self._set_up(model, num_kv_blocks, block_size)
        except BaseException:
            if hasattr(self, "_finalizer"):  # the process started
                self.close()
            raise

    def _set_up(self, model, num_kv_blocks: int, block_size: int) -> int:
        """Hand the started process its model; returns its pid once it is ready."""
        # Pickled before the held send, where Ctrl-C still works and a failure breaks no pipe
        setup = ForkingPickler.dumps(("setup", cloudpickle.dumps(model), num_kv_blocks, block_size))
        with hold_sigint():
            self._whole(lambda: self._conn.send_bytes(setup), "sending")
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while not self._poll(deadline, "start"):
            pass
        with hold_sigint():
            msg = self._recv()
        assert msg[0] == "ready", msg
        return msg[1]

    # -- the link: whole messages only -----------------------------------------------

    def check_sendable(self, label: str, value) -> None:
        sendable(label, value, value)

    def failure(self) -> str | None:
        if self._failure is None and self._error is None and self._link["ok"]:
            ended = self._ended()
            self._failure = None if ended is None else f"the device process {ended}"
        return self._flagged()

    def _ended(self, wait_s: float = 0.0) -> str | None:
        """How the device process ended, or None while it runs.  Its forkserver reports that,
        and once gone (killed, out of memory) answers 255 for every process it started, running
        or not: then the pidfd says (waiting up to ``wait_s`` for a pipe that just broke)."""
        code = None if self._proc.is_alive() else self._proc.exitcode
        if code != 255 or self._pidfd is None:
            return None if code is None else _exit_description(code)
        if not _has_ended(self._pidfd, wait_s):
            self._forkserver_gone = True
            return None
        fate = "ended" if self._forkserver_gone else "exited with code 255, or ended"
        return f"{fate} after the forkserver that started it, which reports how, was gone"

    def _flagged(self) -> str | None:
        """What is already known to be wrong, without a system call (this runs on every message)."""
        if self._failure is None and not self._link["ok"]:
            self._failure = ("a message to or from the device process was interrupted halfway, so the pipe "
                             "is out of step")
        return self._failure or self._error

    def _check(self) -> None:
        failure = self._flagged()
        if failure:
            raise DeviceError(failure)

    def _lost(self, doing: str) -> DeviceError:
        """The pipe failed: say whether and how the device process ended."""
        self._proc.join(timeout=1)
        ended = self._ended(wait_s=1.0) or "is still running but its pipe broke"
        self._failure = f"the device process {ended} ({doing})"
        return DeviceError(self._failure)

    def _send(self, msg) -> None:
        self._whole(lambda: self._conn.send(msg), "sending")

    def _recv(self):
        return self._whole(lambda: received(self._conn.recv_bytes()), "receiving")

    def _whole(self, transfer, doing: str):
        """One message through the pipe (callers hold SIGINT): the link stays broken if it does not finish."""
        self._check()
        self._link["ok"] = False
        try:
            result = transfer()
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            raise self._lost(f"{doing} failed: {type(exc).__name__}") from None
        self._link["ok"] = True
        return result

    def _poll(self, deadline: float | None, what: str) -> bool:
        """Wait up to POLL_S for a message; nothing is read, so an interrupt here is harmless."""
        self._check()
        wait_s = self.POLL_S if deadline is None else max(0.0, min(self.POLL_S, deadline - time.monotonic()))
        try:
            if self._conn.poll(wait_s):  # readable, or hung up: recv tells which
                return True
        except (OSError, ValueError) as exc:
            raise self._lost(f"polling failed: {type(exc).__name__}") from None
        self.failure()  # quiet for a while: is it still alive?
        self._check()
        if deadline is not None and time.monotonic() >= deadline:
            self._failure = f"the device process did not answer within the time allowed to {what}"
            raise DeviceError(self._failure)
        return False

    # -- the stream ------------------------------------------------------------------

    def _launch(self, seq, kernel, args, round, stage, record_event):
        # Pickled before SIGINT is held: a plug-in's __reduce__ runs here, and may never return.
        kid = self._kernel_ids.get(kernel)
        pickled = dumps(kernel) if kid is None else None
        if plugins := [a for a in args if callable(a)]:  # a notebook's function: by value
            args = sendable(f"{plugin_label(plugins[0])} (round {round}'s {stage} launch)",
                            plugins[0], args)
        with hold_sigint():
            if kid is None:
                kid = len(self._kernel_ids)
                self._send(("kernel", kid, pickled))
                self._kernel_ids[kernel] = kid
            self._sent_ns[seq] = (time.perf_counter_ns(), stage, round)
            event_id = self._events + 1 if record_event else None
            self._send(("launch", seq, kid, args, event_id, self._sent_ns[seq][0]))
            if record_event:
                self._events = event_id
        return event_id

    def _record(self):
        with hold_sigint():
            self._send(("event", self._events + 1))
            self._events += 1
        return self._events

    def _receive(self) -> None:
        """Read one event report and book it (all of it, or none: SIGINT is held)."""
        with hold_sigint():
            _, ev_id, stamps, error = self._recv()
            self._done_upto = max(self._done_upto, ev_id)
            for seq, start, end, cpu, paced in stamps:
                sent, name, rnd = self._sent_ns.pop(seq)
                if sent >= self._last_end_ns:  # the device was idle: start - send is pure latency (paced: 0)
                    self._latencies_ns.append(start - sent)
                self._last_end_ns = end
                self._stamps.append((name, rnd, start, end, cpu, paced))
            self._error = self._error or error

    def _wait(self, event, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while event.handle > self._done_upto:  # waiting again on a finished event returns at once
            if self._poll(deadline, f"reach round {event.round}'s event"):
                self._receive()
        if self._error:
            raise DeviceError(self._error)

    def spans(self, paced: bool = False):
        out, self._stamps = self._stamps, []
        return out if paced else [stamp[:5] for stamp in out]

    def take_launch_latencies_ms(self) -> list[float]:
        return [self._latencies_ns.popleft() / 1e6 for _ in range(len(self._latencies_ns))]

    def close(self) -> None:
        """Stop the device process and release its pipe and shared memory now."""
        if self._failure is None:
            self._failure = "the device is closed"
        with hold_sigint():  # a second Ctrl-C must not cut the close short: the process would stay
            self._finalizer()
        self.buffers = {}  # the last references to the shared-memory storages (one fd each)


MAX_PACED_MS = 1000.0  # per kernel and per token: 100 x a forward's; past it, runs take hours
# What the time model can price: setup_state runs before a round's packed tokens exist.
PACEABLE = ("launch", "upload_inputs", "correct", "forward", "sample")


def checked_pacing(pace) -> dict | None:
    """A copy of a time model shaped as ``ProcessDevice.PACED_MS``, its values checked: a device
    (and each run's ``meta.pacing``) edited in place changes no other engine; NaN or 1e7 ms would
    crash or hang the device process."""
    if pace is None:
        return None
    if type(pace) is not dict or "launch" not in pace:
        raise TypeError(f"ProcessDevice.PACED_MS must be a dict of kernel name -> [ms, ms per "
                        f"packed token] with a 'launch' entry, got {shown(pace)}")
    checked = {}
    for kernel, model in pace.items():
        where = f"ProcessDevice.PACED_MS[{shown(kernel)}]"
        if type(kernel) is not str or type(model) not in (list, tuple) or len(model) != 2:
            raise TypeError(f"{where} must be [ms, ms per packed token], got {shown(model)}")
        if kernel not in PACEABLE:
            raise ValueError(f"{where}: only {', '.join(PACEABLE)} can be paced; remove it")
        checked[kernel] = [check_float(f"{where}[{i}]", value, 0.0, MAX_PACED_MS, " ms")
                           for i, value in enumerate(model)]
    return checked
