"""Devices: where the model runs, asynchronously from the host.

The engine talks to a device through five calls, the same ones a CUDA program uses:

* ``launch(kernel, *args)`` queues work on the device's single in-order stream and
  returns at once;
* ``record_event()`` marks "everything launched so far";
* ``wait(event)`` blocks the host until that point is reached (the only way to learn
  that work is done);
* ``host(name, mode)`` gives the host a buffer the device reads or writes;
* ``spans()`` returns when each launch really started and ended on the device,
  on the host's clock (ns), and the CPU time it got (ns; None where not measured),
  for the timeline.

Two implementations:

``CudaDevice``
    A ``torch.cuda.Stream``; kernels enqueue CUDA work; events are
    ``torch.cuda.Event(enable_timing=True)``.  Device times are aligned to the host
    clock through a reference event recorded (and waited for) at start-up.

``ProcessDevice`` (the CPU stand-in)
    A separate *device process* owns the model and the KV cache.  Host-visible
    buffers are shared-memory tensors sent to it once; each launch is a tiny message
    on a Pipe; the device process runs kernels in order and stamps their start/end
    with ``time.perf_counter_ns`` (the same clock in every process on Linux).
    Why a process and not a thread: a worker thread running eager PyTorch fights the
    host's Python for the GIL.  On a throwaway prototype it made device idle time
    *look* smaller but rounds were no faster (0.96-1.02x) and a round's device work
    itself slowed from 4 to 5-8 ms; a process gave 1.4-2.1x faster rounds with ~0.1-0.3
    ms launch latency, i.e. it behaves like a real accelerator on a 2-core machine.
    Prototype lessons kept here: the process is started from a ``forkserver`` that
    preloads torch, or by ``spawn`` where there is no forkserver (``start_method``;
    never ``fork`` after torch has run); it ignores SIGINT (Jupyter's
    Interrupt signals the whole process group) and exits when its parent dies;
    kernels defined in a notebook reach it by value through cloudpickle; an
    exception in a kernel becomes a sticky ``DeviceError`` at the next ``wait``, as
    a CUDA error would; the host blocks in ``poll``/``recv`` instead of spinning.
    The pipe must never be left in the middle of a message: a SIGINT that lands while
    a message is sent or received is held until the message is complete
    (``hold_sigint``), and any other exception escaping halfway marks the link
    broken, so it is never read out of step (the engine then starts a new device).
    A dead device process is a ``DeviceError`` naming its exit code.

Both share a *race checker* (the course's compute-sanitizer): every launch declares
which host buffers it reads and writes and which KV-cache blocks it touches; the host
is only allowed to touch a buffer, or free KV blocks, after waiting on an event that
covers every unfinished launch using them.
"""

from __future__ import annotations

import _signal
import contextlib
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import select
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import cloudpickle
import torch
import torch.multiprocessing  # noqa: F401  (registers shared-memory tensor pickling)

from .record import RunRecord


class DeviceError(RuntimeError):
    """A kernel failed on the device, the device process died, or the link to it broke.

    Sticky, like a CUDA error: every later wait raises it too; the engine starts a new
    device (a fresh "context") when it recovers."""


class RaceError(RuntimeError):
    """The host touched state that unfinished device work still uses.

    The fields say what happened, so a checker never has to parse the message:
    ``kind`` is ``"buffer"`` (the host touched a buffer a pending launch uses),
    ``"free_in_use"`` (KV blocks freed while a pending launch uses them) or
    ``"launch_on_free"`` (a launch touches freed blocks) or ``"double_free"`` (blocks
    freed that were free already; refused even with race checking off, since the pool
    would then hand one block to two requests); ``buffer``/``access``
    (``"r"``/``"w"``) name the buffer access, ``blocks`` the KV blocks involved,
    ``round``/``launch`` the conflicting launch's round and stage, ``owner`` who
    owns the launch's results (buffer) or freed the blocks.
    """

    KINDS = ("buffer", "free_in_use", "launch_on_free", "double_free")

    def __init__(self, message: str, *, kind: str, round: int, launch: str, buffer: str | None = None,
                 access: str | None = None, blocks=(), owner: str | None = None):
        super().__init__(message)
        assert kind in self.KINDS, kind
        self.kind, self.round, self.launch, self.owner = kind, round, launch, owner
        self.buffer, self.access, self.blocks = buffer, access, sorted(blocks)


@dataclass
class Event:
    """A point in the stream: every launch with ``seq <= self.seq`` is before it."""

    seq: int
    round: int
    handle: object = None  # torch.cuda.Event on CUDA, an integer id on the stand-in
    stage: str = ""        # the stage of the last launch before it ("sample" for a step's sample_done)


@dataclass
class _Launch:
    seq: int
    name: str
    round: int
    reads: frozenset
    writes: frozenset
    blocks: frozenset
    owner: str | None = None  # who owns the launch's results (e.g. a StepState)


class RaceChecker:
    """Happens-before bookkeeping for host accesses, like compute-sanitizer's racecheck.

    It does not look at the clock: an access is a race when no ``wait`` has ordered it
    after the launch, even if the launch happened to be finished already.  That makes
    every report deterministic.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.pending: list[_Launch] = []
        self.free_blocks: dict[int, str] = {}  # block -> who freed it

    def on_launch(self, launch: _Launch) -> None:
        if not self.enabled:
            return
        for block in sorted(launch.blocks & self.free_blocks.keys()):
            freed_by = self.free_blocks[block]
            raise RaceError(
                f"launch '{launch.name}' of round {launch.round} touches KV block {block}, "
                f"which is free (freed by {freed_by}): its cache may already belong "
                f"to another request",
                kind="launch_on_free", round=launch.round, launch=launch.name, blocks=[block], owner=freed_by)
        self.pending.append(launch)

    def on_wait(self, seq: int) -> None:
        self.pending = [p for p in self.pending if p.seq > seq]

    def check_access(self, name: str, mode: str) -> None:
        if not self.enabled:
            return
        for p in self.pending:
            if name in p.writes or (mode == "w" and name in p.reads):
                verb = "read" if mode == "r" else "write"
                use = "writes" if name in p.writes else "reads"
                raise RaceError(
                    f"race on buffer '{name}': host {verb} while launch '{p.name}' of round "
                    f"{p.round} still {use} it; wait on an event recorded after that launch "
                    f"(round {p.round}'s completion event) first",
                    kind="buffer", round=p.round, launch=p.name, buffer=name, access=mode, owner=p.owner)

    def on_free(self, blocks, owner: str) -> None:
        if not self.enabled:
            return
        blocks = set(blocks)
        for p in self.pending:
            if p.blocks & blocks:
                raise RaceError(
                    f"KV blocks {sorted(p.blocks & blocks)} of {owner} freed while launch "
                    f"'{p.name}' of round {p.round} may still use them; free a finished "
                    f"request's cache only after waiting on round {p.round}'s event",
                    kind="free_in_use", round=p.round, launch=p.name, blocks=p.blocks & blocks, owner=owner)
        self.free_blocks.update((b, owner) for b in blocks)

    def on_alloc(self, blocks) -> None:
        for b in blocks:
            self.free_blocks.pop(b, None)

    def reset(self) -> None:
        """Forget every launch and freed block (after a synchronize, when the engine
        starts over with an empty cache)."""
        self.pending.clear()
        self.free_blocks.clear()


@dataclass
class DeviceContext:
    """What a kernel sees: the model, its KV cache, device buffers and persistent state."""

    model: torch.nn.Module
    kv_cache: torch.Tensor
    block_size: int
    device: torch.device
    host_buffers: dict
    mirrors: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)  # kernels keep device-side values here

    def load(self, name: str) -> torch.Tensor:
        """A host buffer's contents as a device tensor (an async copy on CUDA)."""
        buf = self.host_buffers[name]
        if self.device.type == "cpu":
            return buf
        mirror = self.mirrors.get(name)
        if mirror is None:
            mirror = self.mirrors[name] = torch.empty_like(buf, device=self.device)
        return mirror.copy_(buf, non_blocking=True)

    def store(self, name: str, value: torch.Tensor) -> None:
        """Write a device tensor into the start of a host buffer (async on CUDA)."""
        self.host_buffers[name].view(-1)[: value.numel()].copy_(value.reshape(-1), non_blocking=True)


def _build_context(model_bytes: bytes, num_kv_blocks: int, block_size: int, buffers: dict,
                   device: torch.device) -> DeviceContext:
    model = cloudpickle.loads(model_bytes).to(device)
    kv = model.new_kv_cache(num_kv_blocks, block_size)
    return DeviceContext(model, kv, block_size, device, buffers)


class Device:
    """The interface the engine uses; subclasses implement the stream."""

    name = "device"

    def __init__(self, race_check: bool = True):
        self.races = RaceChecker(race_check)
        self._seq = 0
        self._last_round, self._last_stage = 0, ""
        self.run_record = RunRecord()  # what the current run did; the engine gives it a new one per run

    def launch(self, kernel, *args, round: int, stage: str | None = None, reads=(), writes=(),
               blocks=(), record_event: bool = False, owner: str | None = None) -> Event | None:
        """Queue ``kernel(ctx, *args)`` on the stream; returns before it runs.

        ``reads``/``writes`` name the host buffers it uses, ``blocks`` the KV-cache blocks
        it touches; ``stage`` is its name on the timeline; ``owner`` who owns its results.  ``record_event=True`` also
        records an event right after it and returns it (one message instead of two).
        """
        self._seq += 1
        stage = stage or kernel.__name__
        self._last_round, self._last_stage = round, stage
        self.races.on_launch(_Launch(self._seq, stage, round, frozenset(reads), frozenset(writes),
                                     frozenset(blocks), owner))
        self.run_record.launch(self._seq, round, stage, blocks)
        handle = self._launch(self._seq, kernel, args, round, stage, record_event)
        return Event(self._seq, round, handle, stage) if record_event else None

    def record_event(self) -> Event:
        return Event(self._seq, self._last_round, self._record(), self._last_stage)

    def wait(self, event: Event, timeout: float | None = None) -> None:
        """Block until every launch before ``event`` has finished (DeviceError after
        ``timeout`` seconds, if given)."""
        start = time.perf_counter_ns()
        self._wait(event, timeout)
        self.run_record.wait(event.seq, event.round, event.stage, start, time.perf_counter_ns())
        self.races.on_wait(event.seq)

    def free_blocks(self, blocks, owner: str, double=()) -> None:
        """The block manager frees ``blocks`` (``double``: those already free).  Recorded
        whatever happens; a double free is refused always, a free in use when race checking is on."""
        try:
            if double:
                raise RaceError(f"KV blocks {sorted(double)} of {owner} are freed a second time: they are "
                                f"already free, and freeing them again would let two requests share them. "
                                f"Free a request once (`engine.scheduler.release_if_done(req)` checks)",
                                kind="double_free", round=self._last_round, launch="free", blocks=double,
                                owner=owner)
            self.races.on_free(blocks, owner)
        except RaceError:
            self.run_record.free(owner, blocks, double, refused=True)
            raise
        self.run_record.free(owner, blocks, double)

    def synchronize(self, timeout: float | None = None) -> None:
        self.wait(self.record_event(), timeout)

    def host(self, name: str, mode: str = "r") -> torch.Tensor:
        """The host side of a buffer, checked against unfinished launches."""
        try:
            self.races.check_access(name, mode)
        except RaceError as err:
            self.run_record.refused(name, mode, err.round, err.launch)
            raise
        return self.buffers[name]

    # implemented by subclasses
    buffers: dict

    def _launch(self, seq, kernel, args, round, stage, record_event): raise NotImplementedError
    def _record(self): raise NotImplementedError
    def _wait(self, event, timeout): raise NotImplementedError
    def spans(self) -> list[tuple[str, int, int, int, int | None]]: raise NotImplementedError
    def close(self) -> None: pass

    def failure(self) -> str | None:
        """Why this device can no longer be used (closed, dead, link broken), or None."""
        return None

    def probe(self, timeout: float) -> str | None:
        """``failure()``, after asking the device itself (within ``timeout`` s) where that tells more."""
        return self.failure()


# --------------------------------------------------------------------------- CUDA

class CudaDevice(Device):
    name = "cuda"

    def __init__(self, model, num_kv_blocks, block_size, buffer_specs, race_check=True):
        super().__init__(race_check)
        dev = torch.device("cuda")
        self.name = torch.cuda.get_device_name(dev)
        self.buffers = {n: torch.zeros(*shape, dtype=dt).pin_memory() for n, (shape, dt) in buffer_specs.items()}
        self.stream = torch.cuda.Stream(dev)
        with torch.cuda.stream(self.stream):
            self.ctx = _build_context(cloudpickle.dumps(model), num_kv_blocks, block_size, self.buffers, dev)
        self._timed: list[tuple[str, int, torch.cuda.Event, torch.cuda.Event]] = []
        # Clock alignment: host time when a reference event is known to have completed.
        self._ref = torch.cuda.Event(enable_timing=True)
        self._ref.record(self.stream)
        self._ref.synchronize()
        self._ref_ns = time.perf_counter_ns()

    def _launch(self, seq, kernel, args, round, stage, record_event):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        with torch.cuda.stream(self.stream):
            kernel(self.ctx, *args)
        end.record(self.stream)
        self._timed.append((stage, round, start, end))
        return self._record() if record_event else None

    def _record(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        return ev

    def _wait(self, event, timeout=None):
        event.handle.synchronize()

    def _to_ns(self, ev) -> int:
        return self._ref_ns + int(self._ref.elapsed_time(ev) * 1e6)

    def spans(self):
        # Query each end event once: asking twice, an event completing in between would
        # fall into neither list and its span would be lost.
        done, running = [], []
        for t in self._timed:
            (done if t[3].query() else running).append(t)
        self._timed = running
        return [(name, rnd, self._to_ns(s), self._to_ns(e), None) for name, rnd, s, e in done]


# --------------------------------------------------------------- CPU stand-in

START_METHOD_ENV = "TOY_ENGINE_START_METHOD"
_CONTEXTS: dict = {}  # start method -> its multiprocessing context, made once per host process


def start_method() -> str:
    """How the device process is started: ``forkserver`` on Linux, ``spawn`` on Windows and macOS.

    A forkserver that has already imported torch forks each device process: an engine
    started in 0.6-0.8 s, against 5-6 s under spawn, which imports torch afresh in every
    device process (the first start costs 6-8 s either way; a shared 2-core Linux
    machine at load average 6, slower than a quiet laptop).  forkserver does not exist on
    Windows, and on macOS Python itself defaults to spawn because forking a process that
    loaded system libraries (Accelerate, libomp: what torch loads) can crash the child.
    CI runs the device and engine tests under both.  ``TOY_ENGINE_START_METHOD=spawn``
    (or ``forkserver``) overrides the choice; it is read at every engine start.  ``fork``
    is refused: forking a process in which torch has already run threads can deadlock.
    """
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


def _context():
    """The multiprocessing context of the chosen start method (a forkserver preloads torch)."""
    method = start_method()
    ctx = _CONTEXTS.get(method)
    if ctx is None:
        ctx = _CONTEXTS[method] = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["torch", "toy_engine.device", "toy_engine.kernels"])
    return ctx


@contextlib.contextmanager
def _without_main_module():
    """Start children without re-running the user's ``__main__``.

    spawn and forkserver children normally re-import the parent's main script (so a
    script without an ``if __name__ == "__main__"`` guard would run again in the device
    process, and under spawn start another engine there).  The device process never
    needs it: kernels defined there arrive by value via cloudpickle.
    """
    original = mp_spawn.get_preparation_data

    def preparation_data(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = preparation_data
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = original


class hold_sigint:
    """Hold a SIGINT (Jupyter's Interrupt, Ctrl-C) until the block ends, then replay it.

    Python raises KeyboardInterrupt between any two bytecodes, also between reading a
    message's header and its payload; the next read would then take payload bytes for
    a header and the pipe stays out of step for good (seen in 4 of 12 random real
    interrupts before this existed).  Only the main thread runs Python signal handlers,
    so other threads need nothing.  Why the C module ``_signal`` and a class: the
    public ``signal.getsignal``/``signal.signal`` wrap results in enums (13 + 25 us per
    call on our loaded 2-core machine, against 0.04 + 1.2 us) and a generator-based
    context manager adds ~3 us; this is held around every launch.
    """

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
        """Inside the held block, deliver SIGINT as usual (one held so far is delivered
        first): the engine holds it while it takes and gives back its lock, not while it runs."""
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


def _exit_description(code: int | None) -> str:
    if code is None:
        return "is still running but its pipe broke"
    if code < 0:
        try:
            return f"exited with code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _device_main(conn, num_threads: int) -> None:
    """The device process: run launches in order, report stamps at each event.

    It is not pinned to a core: pinning it to core 1 of the 2-core machine changed
    tokens/s by -12% to +10% between runs of the same mode, inside the run-to-run spread,
    so the OS scheduler keeps the freedom to move it away from other work.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def die_with_parent():
        # The parent's sentinel (a pipe on POSIX, a process handle on Windows) becomes ready
        # when it exits; os.kill(pid, 0) is no probe on Windows (it sends CTRL_C_EVENT).
        mp.parent_process().join()
        os._exit(0)

    threading.Thread(target=die_with_parent, daemon=True).start()
    torch.set_num_threads(num_threads)
    kernels: dict[int, object] = {}
    # (seq, start, end, CPU ns): process_time beside perf_counter tells a preempted
    # kernel (wall >> CPU: the machine is busy) from a slow one; it counts torch's
    # intra-op threads too, should device_threads be > 1.
    stamps: list[tuple[int, int, int, int]] = []
    ctx, error = None, None
    with torch.inference_mode():
        while True:
            try:
                msg = conn.recv()
            except Exception:  # noqa: BLE001 - host gone or link broken: nothing left to serve
                return
            kind, event_id = msg[0], None
            if kind == "launch":
                _, seq, kid, args, event_id = msg
                if error is None:  # sticky: after a failure nothing else runs
                    start, cpu = time.perf_counter_ns(), time.process_time_ns()
                    try:
                        kernels[kid](ctx, *(cloudpickle.loads(args) if isinstance(args, bytes) else args))
                    except BaseException as exc:  # noqa: BLE001 - reported to the host
                        error = f"{type(exc).__name__}: {exc} (in kernel '{kernels[kid].__name__}', launch {seq})"
                    stamps.append((seq, start, time.perf_counter_ns(), time.process_time_ns() - cpu))
            elif kind == "event":
                event_id = msg[1]
            elif kind == "kernel":
                kernels[msg[1]] = cloudpickle.loads(msg[2])
            elif kind == "setup":
                _, model_bytes, num_kv_blocks, block_size, buffers = msg
                ctx = _build_context(model_bytes, num_kv_blocks, block_size, buffers, torch.device("cpu"))
                conn.send(("ready", os.getpid()))
            elif kind == "close":
                return
            if event_id is not None:  # everything before the event is done: report it
                try:
                    conn.send(("event", event_id, stamps, error))
                except OSError:  # the host is gone or closed its end
                    return
                stamps = []


def _pipe_poller(conn):
    """``readable(timeout_s) -> bool`` for the host's end of the pipe.

    One poll object kept for the pipe: Connection.poll builds a selector per call, which
    made each wait ~12 us slower than a bare recv; a kept select.poll costs ~3 us.
    Windows has no select.poll (and its pipes are not sockets): Connection.poll there.
    """
    if not hasattr(select, "poll"):
        return conn.poll
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return lambda timeout_s: bool(poller.poll(int(timeout_s * 1000)))


def _shutdown(proc, conn, link: dict) -> None:
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
    """The CPU stand-in for a CUDA stream: a device process fed through a Pipe."""

    name = "cpu-process"
    POLL_S = 0.5        # how often a waiting host checks that the device process is alive
    START_TIMEOUT_S = 120.0  # first start of the forkserver imports torch: slow on a busy machine

    def __init__(self, model, num_kv_blocks, block_size, buffer_specs, race_check=True,
                 num_threads: int = 1):
        super().__init__(race_check)
        self.buffers = {n: torch.zeros(*shape, dtype=dt).share_memory_() for n, (shape, dt) in buffer_specs.items()}
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_device_main, args=(child, num_threads),
                                 daemon=True, name="toy-engine-device")
        with _without_main_module():
            self._proc.start()
        child.close()
        self._readable = _pipe_poller(self._conn)
        # ``link["ok"]`` is False while a message is half sent or half read, and stays
        # False if an exception escaped there: the pipe is then out of step for good.
        self._link = {"ok": True}
        self._failure: str | None = None
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._conn, self._link)
        self._kernel_ids: dict[object, int] = {}
        self._sent_ns: dict[int, tuple[int, str, int]] = {}  # seq -> (send time, name, round)
        self._done_upto = 0  # events complete in order: every id <= this one is done
        self._stamps: list[tuple[str, int, int, int]] = []
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
        """What is already known to be wrong (no system call: this runs on every message;
        a dead process shows up as a broken pipe, or in ``_poll``'s liveness check)."""
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
        """Send one message (callers hold SIGINT back around it)."""
        self._check()
        self._link["ok"] = False
        try:
            self._conn.send(msg)
        except (OSError, ValueError) as exc:
            raise self._lost(f"sending failed: {type(exc).__name__}") from None
        self._link["ok"] = True

    def _recv(self):
        self._check()
        self._link["ok"] = False
        try:
            msg = self._conn.recv()
        except (EOFError, OSError, ValueError) as exc:
            raise self._lost(f"receiving failed: {type(exc).__name__}") from None
        self._link["ok"] = True
        return msg

    def _poll(self, deadline: float | None, what: str) -> bool:
        """Wait up to POLL_S for a message; nothing is read, so an interrupt here is harmless."""
        self._check()
        wait_s = self.POLL_S if deadline is None else max(0.0, min(self.POLL_S, deadline - time.monotonic()))
        try:
            if self._readable(wait_s):  # readable, or hung up: recv tells which
                return True
        except (OSError, ValueError) as exc:
            raise self._lost(f"polling failed: {type(exc).__name__}") from None
        failure = self.failure()  # quiet for a while: is it still alive?
        if failure:
            raise DeviceError(failure)
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
        """A round trip to the device process: the forkserver reports its death 20-60 ms
        late, so a device killed just before a call still looks alive to ``failure()``;
        one that cannot answer is dead."""
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


def make_device(kind: str, model, num_kv_blocks, block_size, buffer_specs, race_check=True,
                num_threads: int = 1) -> Device:
    """``kind``: "auto" (CUDA if available, else the CPU stand-in), "cuda" or "cpu"."""
    if kind not in ("auto", "cuda", "cpu"):
        raise ValueError(f"unknown device {kind!r}: use 'auto', 'cuda' or 'cpu'")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        return CudaDevice(model, num_kv_blocks, block_size, buffer_specs, race_check)
    return ProcessDevice(model, num_kv_blocks, block_size, buffer_specs, race_check, num_threads)
