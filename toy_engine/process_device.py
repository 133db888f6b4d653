"""The CPU stand-in for a CUDA stream: a device process fed through a pipe.

A *device process* owns the model and the KV cache; host buffers are shared-memory tensors
sent once, each launch is a small message, and kernels run in order, stamped with
``time.perf_counter_ns``.  A process, not a thread: a thread running eager PyTorch fights the
host's Python for the GIL (docs/measurements/device.md).  Messages, always whole: ``("setup", ...)``,
``("kernel", id, pickled)``, ``("launch", seq, kernel id, args, event id or None)``, ``("event", id)``
and ``("close",)`` go down; ``("ready", pid)`` and ``("event", id, stamps, error)`` come back.
"""

import multiprocessing as mp
import os
import select
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field

import cloudpickle
import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory tensor pickling)

from .device import Device, DeviceContext, DeviceError
from .interrupts import hold_sigint
from .process_start import mp_context, without_main_module

# What a forkserver imports once for all device processes: torch, their main and the kernels.
_FORKSERVER_PRELOAD = ["torch", __name__, "toy_engine.kernels"]


def _device_main(conn, num_threads: int) -> None:
    """Run launches in order, report stamps at events; ignore SIGINT (Jupyter signals the whole group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_die_with_parent, daemon=True).start()
    torch.set_num_threads(num_threads)
    with torch.inference_mode():
        _serve(conn, _Stream())


def _die_with_parent() -> None:
    # The parent's sentinel is ready once it exits; os.kill(pid, 0) on Windows sends CTRL_C_EVENT.
    mp.parent_process().join()
    os._exit(0)


@dataclass
class _Stream:
    """The device process's side: kernels, context, unreported stamps (seq, start, end, CPU ns: CPU
    beside wall time tells a preempted kernel from a slow one) and the first error (sticky)."""

    kernels: dict = field(default_factory=dict)  # kernel id -> kernel
    ctx: DeviceContext | None = None
    stamps: list[tuple[int, int, int, int]] = field(default_factory=list)
    error: str | None = None

    def run(self, seq: int, kid: int, args) -> None:
        if self.error is not None:
            return
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        try:
            self.kernels[kid](self.ctx, *(cloudpickle.loads(args) if isinstance(args, bytes) else args))
        except BaseException as exc:  # noqa: BLE001 - reported to the host
            self.error = f"{type(exc).__name__}: {exc} (in kernel '{self.kernels[kid].__name__}', launch {seq})"
        self.stamps.append((seq, start, time.perf_counter_ns(), time.process_time_ns() - cpu))


def _serve(conn, stream: _Stream) -> None:
    """Handle the host's messages in order until it closes the stream or goes away."""
    while True:
        try:
            msg = conn.recv()
        except Exception:  # noqa: BLE001 - host gone or link broken: nothing left to serve
            return
        kind, event_id = msg[0], None
        if kind == "launch":
            _, seq, kid, args, event_id = msg
            stream.run(seq, kid, args)
        elif kind == "event":
            event_id = msg[1]
        elif kind == "kernel":
            stream.kernels[msg[1]] = cloudpickle.loads(msg[2])
        elif kind == "setup":
            _, model_bytes, num_kv_blocks, block_size, buffers = msg
            stream.ctx = DeviceContext.build(model_bytes, num_kv_blocks, block_size, buffers, torch.device("cpu"))
            conn.send(("ready", os.getpid()))
        elif kind == "close":
            return
        if event_id is not None:  # everything before the event is done: report it
            try:
                conn.send(("event", event_id, stream.stamps, stream.error))
            except OSError:  # the host is gone or closed its end
                return
            stream.stamps = []


def _exit_description(code: int | None) -> str:
    if code is None:
        return "is still running but its pipe broke"
    signals = {s.value: s.name for s in signal.Signals}
    return f"exited with code {code}" + (f" (killed by {signals[-code]})" if -code in signals else "")


def _pipe_poller(conn):
    """``readable(timeout_s) -> bool`` for the host's end: one kept poll object (Connection.poll builds
    a selector per call, docs/measurements/device.md), except on Windows, which has no select.poll."""
    if not hasattr(select, "poll"):
        return conn.poll
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return lambda timeout_s: bool(poller.poll(int(timeout_s * 1000)))


def _shutdown(proc, conn, link: dict) -> None:
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
    conn.close()
    if not proc.is_alive():  # the exit code is known: its sentinel pipe can go, and is_alive() still answers
        proc._popen.close()


class ProcessDevice(Device):
    """The CPU stand-in, host side.  Kernels travel by value (cloudpickle); one that raises is a sticky
    ``DeviceError`` at the next ``wait``; an exception (not a held SIGINT) mid-message breaks the link."""

    name = "cpu-process"
    POLL_S = 0.5        # how often a waiting host checks that the device process is alive
    START_TIMEOUT_S = 120.0  # first start of the forkserver imports torch: slow on a busy machine

    def __init__(self, model, num_kv_blocks, block_size, buffer_specs, race_check=True,
                 num_threads: int = 1):
        super().__init__(race_check)
        self.buffers = {n: torch.zeros(*shape, dtype=dt).share_memory_() for n, (shape, dt) in buffer_specs.items()}
        ctx = mp_context(_FORKSERVER_PRELOAD)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_device_main, args=(child, num_threads),
                                 daemon=True, name="toy-engine-device")
        with without_main_module():
            self._proc.start()
        child.close()
        self._readable = _pipe_poller(self._conn)
        self._link = {"ok": True}  # False while a message is half sent or read, and for good if one broke
        self._failure: str | None = None
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._conn, self._link)
        self._kernel_ids: dict[object, int] = {}
        self._sent_ns: dict[int, tuple[int, str, int]] = {}  # seq -> (send time, name, round)
        self._done_upto = 0  # events complete in order: every id <= this one is done
        self._stamps: list[tuple[str, int, int, int, int]] = []  # (stage, round, start, end, CPU ns)
        self._latencies_ns: list[int] = []
        self._last_end_ns = 0
        self._events = 0
        self._error: str | None = None
        with hold_sigint():
            self._send(("setup", cloudpickle.dumps(model), num_kv_blocks, block_size, self.buffers))
        msg = self._recv_within(self.START_TIMEOUT_S, "start")
        assert msg[0] == "ready", msg
        self.pid = msg[1]

    # -- the link: whole messages only -----------------------------------------------

    def failure(self) -> str | None:
        if self._failure is None and self._error is None and self._link["ok"] and not self._proc.is_alive():
            self._failure = f"the device process {_exit_description(self._proc.exitcode)}"
        return self._flagged()

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
        self._failure = f"the device process {_exit_description(self._proc.exitcode)} ({doing})"
        return DeviceError(self._failure)

    def _send(self, msg) -> None:
        self._whole(lambda: self._conn.send(msg), "sending")

    def _recv(self):
        return self._whole(self._conn.recv, "receiving")

    def _whole(self, transfer, doing: str):
        """One message through the pipe (callers hold SIGINT): the link stays broken if it does not finish."""
        self._check()
        self._link["ok"] = False
        try:
            result = transfer()
        except (EOFError, OSError, ValueError) as exc:
            raise self._lost(f"{doing} failed: {type(exc).__name__}") from None
        self._link["ok"] = True
        return result

    def _poll(self, deadline: float | None, what: str) -> bool:
        """Wait up to POLL_S for a message; nothing is read, so an interrupt here is harmless."""
        self._check()
        wait_s = self.POLL_S if deadline is None else max(0.0, min(self.POLL_S, deadline - time.monotonic()))
        try:
            if self._readable(wait_s):  # readable, or hung up: recv tells which
                return True
        except (OSError, ValueError) as exc:
            raise self._lost(f"polling failed: {type(exc).__name__}") from None
        self.failure()  # quiet for a while: is it still alive?
        self._check()
        if deadline is not None and time.monotonic() >= deadline:
            self._failure = f"the device process did not answer within the time allowed to {what}"
            raise DeviceError(self._failure)
        return False

    def _recv_within(self, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while not self._poll(deadline, what):
            pass
        with hold_sigint():
            return self._recv()

    # -- the stream ------------------------------------------------------------------

    def _launch(self, seq, kernel, args, round, stage, record_event):
        with hold_sigint():
            kid = self._kernel_ids.get(kernel)
            if kid is None:
                kid = len(self._kernel_ids)
                self._send(("kernel", kid, cloudpickle.dumps(kernel)))
                self._kernel_ids[kernel] = kid
            self._sent_ns[seq] = (time.perf_counter_ns(), stage, round)
            if any(callable(a) for a in args):  # a function (maybe from a notebook) travels by value
                args = cloudpickle.dumps(args)
            event_id = self._events + 1 if record_event else None
            self._send(("launch", seq, kid, args, event_id))
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
            for seq, start, end, cpu in stamps:
                sent, name, rnd = self._sent_ns.pop(seq)
                if sent >= self._last_end_ns:  # the device was idle: start - send is pure latency
                    self._latencies_ns.append(start - sent)
                self._last_end_ns = end
                self._stamps.append((name, rnd, start, end, cpu))
            self._error = self._error or error

    def _wait(self, event, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while event.handle > self._done_upto:  # waiting again on a finished event returns at once
            if self._poll(deadline, f"reach round {event.round}'s event"):
                self._receive()
        if self._error:
            raise DeviceError(self._error)

    def spans(self):
        out, self._stamps = self._stamps, []
        return out

    def launch_latencies_ms(self) -> list[float]:
        return [ns / 1e6 for ns in self._latencies_ns]

    def probe(self, timeout: float) -> str | None:
        """A round trip: the forkserver reports a death late (docs/measurements/device.md)."""
        if self.failure() is None:
            try:
                self.synchronize(timeout)
            except DeviceError:
                pass  # failure() now says why
        return self.failure()

    def close(self) -> None:
        """Stop the device process and release its pipe and shared memory now."""
        if self._failure is None:
            self._failure = "the device is closed"
        self._finalizer()
        self.buffers = {}  # the last references to the shared-memory storages (one fd each)
