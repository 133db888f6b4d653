"""Devices: where the model runs, asynchronously from the host.

The engine uses the calls a CUDA program uses: ``launch`` queues a kernel on one in-order
stream and returns at once, ``record_event`` marks "everything launched so far", ``wait``
blocks until an event is reached (the only way to learn that work is done), ``host`` hands out
a buffer, ``spans`` says when each launch really ran (host clock, ns) and its CPU time, if measured.
``CudaDevice`` (below) and ``ProcessDevice`` (process_device.py, the CPU stand-in) implement
the stream; ``Device`` checks every launch, host access and free with the race checker.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import torch

from .races import PendingLaunch, RaceChecker, RaceError
from .record import RunRecord


class DeviceError(RuntimeError):
    """A kernel failed, the device process died, or its link broke; sticky, like a CUDA error."""


class ForeignEvent(RuntimeError):
    """An event recorded on another device was waited for: its id means nothing here (a device
    process started after a failure numbers its events from 1 again), so the wait would never
    end, or end on the wrong work.  ``round``: the event's round."""

    def __init__(self, round: int, stage: str):
        super().__init__(
            f"round {round}'s {stage or 'event'} was launched on another device (this engine's "
            f"device process before a failure replaced it, or another engine's): its results "
            f"are gone with that device, and waiting for it here would never end. Was a step "
            f"kept from an earlier run (a global `previous`)? Start each loop with "
            f"`previous = None`, and process a step only in the run that launched it")
        self.round = round


@dataclass
class Event:
    """A point in the stream: every launch with ``seq <= self.seq`` is before it."""

    seq: int
    round: int
    handle: object = None  # torch.cuda.Event on CUDA, an integer id on the stand-in
    stage: str = ""        # the stage of the last launch before it ("sample" for a step's sample_done)
    device: int = 0        # the serial number of the device that recorded it (Device.serial)


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

    @classmethod
    def build(cls, model_bytes: bytes, num_kv_blocks: int, block_size: int, buffers: dict,
              device: torch.device) -> DeviceContext:
        """A context on ``device``: the device's own copy of the pickled model, an empty KV cache."""
        model = cloudpickle.loads(model_bytes).to(device)
        return cls(model, model.new_kv_cache(num_kv_blocks, block_size), block_size, device, buffers)


class Device:
    """The interface the engine uses; subclasses implement the stream."""

    name = "device"
    _serials = itertools.count(1)

    def __init__(self, race_check: bool = True):
        self.serial = next(Device._serials)  # its events carry it: another device's are refused
        self.races = RaceChecker(race_check)
        self._seq = 0
        self._last_round, self._last_stage = 0, ""
        self.run_record = RunRecord()  # what the current run did; the engine gives it a new one per run

    def launch(self, kernel, *args, round: int, stage: str | None = None, reads=(), writes=(),
               blocks=(), record_event: bool = False, owner: int | None = None) -> Event | None:
        """Queue ``kernel(ctx, *args)``; returns before it runs.  ``reads``/``writes`` name the host
        buffers it uses, ``blocks`` the KV blocks; ``stage`` names it on the timeline, ``owner`` is the
        round owning its results; ``record_event=True`` also returns an event (one message, not two)."""
        self._seq += 1
        stage = stage or kernel.__name__
        self._last_round, self._last_stage = round, stage
        self.races.on_launch(PendingLaunch(self._seq, stage, round, frozenset(reads), frozenset(writes),
                                           frozenset(blocks), owner))
        self.run_record.launch(self._seq, round, stage, blocks)
        try:
            handle = self._launch(self._seq, kernel, args, round, stage, record_event)
        except DeviceError:  # nothing was queued: no phantom launch may block the host's accesses
            self.races.forget(self._seq)
            raise
        return Event(self._seq, round, handle, stage, self.serial) if record_event else None

    def record_event(self) -> Event:
        return Event(self._seq, self._last_round, self._record(), self._last_stage, self.serial)

    def wait(self, event: Event, timeout: float | None = None) -> None:
        """Block until every launch before ``event`` has finished (DeviceError after ``timeout`` s);
        an event of another device is refused (``ForeignEvent``)."""
        if event.device != self.serial:
            raise ForeignEvent(event.round, event.stage)
        start = time.perf_counter_ns()
        self._wait(event, timeout)
        self.run_record.wait(event.seq, event.round, event.stage, start, time.perf_counter_ns())
        self.races.on_wait(event.seq)

    def free_blocks(self, blocks, prompt: int, double=()) -> None:
        """Request ``prompt`` frees ``blocks`` (``double``: already free); recorded even when refused."""
        try:
            self.races.on_free(blocks, prompt, double, self._last_round)
        except RaceError:
            self.run_record.free(prompt, blocks, double, refused=True)
            raise
        self.run_record.free(prompt, blocks, double)

    def synchronize(self, timeout: float | None = None) -> None:
        self.wait(self.record_event(), timeout)

    def host(self, name: str, mode: str = "r") -> torch.Tensor:
        """The host side of a buffer, checked against unfinished launches."""
        try:
            self.races.check_access(name, mode)
        except RaceError as err:
            self.run_record.refused(name, mode, err.round, err.launch)
            raise
        self.run_record.access(name, mode)
        return self.buffers[name]

    buffers: dict  # subclasses set it and implement what follows

    def _launch(self, seq, kernel, args, round, stage, record_event): raise NotImplementedError
    def _record(self): raise NotImplementedError
    def _wait(self, event, timeout): raise NotImplementedError
    def spans(self, paced: bool = False) -> list[tuple]: raise NotImplementedError
    def take_launch_latencies_ms(self) -> list[float]: return []  # since the last call; none here
    def close(self) -> None: pass
    def check_sendable(self, label: str, value) -> None: pass  # refuse what it cannot run

    def failure(self) -> str | None:
        """Why this device can no longer be used (closed, dead, link broken), or None."""
        return None

    def probe(self, timeout: float) -> str | None:
        """``failure()`` after a round trip within ``timeout`` s (the forkserver reports a death late)."""
        if self.failure() is None:
            try:
                self.synchronize(timeout)
            except DeviceError:
                pass  # failure() now says why
        return self.failure()


class CudaDevice(Device):
    """A ``torch.cuda.Stream``; launches are timed by event pairs, aligned to a reference event."""

    name = "cuda"

    def __init__(self, model, num_kv_blocks, block_size, buffer_specs, race_check=True):
        super().__init__(race_check)
        dev = torch.device("cuda")
        self.name = torch.cuda.get_device_name(dev)
        self.buffers = {n: torch.zeros(*shape, dtype=dt).pin_memory() for n, (shape, dt) in buffer_specs.items()}
        self.stream = torch.cuda.Stream(dev)
        with torch.cuda.stream(self.stream):
            self.ctx = DeviceContext.build(cloudpickle.dumps(model), num_kv_blocks, block_size, self.buffers, dev)
        self._timed: list[tuple[str, int, torch.cuda.Event, torch.cuda.Event]] = []
        self._ref = torch.cuda.Event(enable_timing=True)  # aligns clocks: host time once it completed
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
        return self.stream.record_event(torch.cuda.Event(enable_timing=True))

    def _wait(self, event, timeout=None):
        event.handle.synchronize()

    def _to_ns(self, ev) -> int:
        return self._ref_ns + int(self._ref.elapsed_time(ev) * 1e6)

    def spans(self, paced: bool = False):
        done, running = [], []  # query each end event once: one completing in between would be lost
        for t in self._timed:
            (done if t[3].query() else running).append(t)
        self._timed = running
        return [(name, rnd, self._to_ns(s), self._to_ns(e), None) + (None,) * paced for name, rnd, s, e in done]


def picks_cuda(kind: str) -> bool:
    """Whether make_device(kind) builds the CUDA device (a command names its files before)."""
    return kind == "cuda" or (kind == "auto" and torch.cuda.is_available())


def make_device(kind: str, model, num_kv_blocks, block_size, buffer_specs, race_check=True,
                num_threads: int = 1) -> Device:
    """``kind``: "auto" (CUDA, else the CPU stand-in: paced below 2 usable CPUs), "cuda", "cpu" or "paced"."""
    from .process_device import ProcessDevice  # it builds on this module: imported once needed
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    if picks_cuda(kind):
        return CudaDevice(model, num_kv_blocks, block_size, buffer_specs, race_check)
    paced = kind == "paced" or (kind == "auto" and usable_cpus() < ProcessDevice.PACED_BELOW_CPUS)
    return ProcessDevice(model, num_kv_blocks, block_size, buffer_specs, race_check, num_threads,
                         ProcessDevice.PACED_MS if paced else None)


def usable_cpus() -> float:
    """CPUs this process can really use: its cores, capped by a cgroup quota (1 in a hub's 1-CPU container)."""
    quota = cgroup_cpu_quota()
    return float(affinity_cpus() if quota is None else min(affinity_cpus(), quota))


def affinity_cpus() -> int:
    """The cores this process may run on (``taskset``, a container's cpuset; macOS, Windows: all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cgroup_cpu_quota(cgroups: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None) -> float | None:
    """CPUs' worth of time per period the cgroup and its ancestors allow (the smallest; v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in the cpu controller's tree), None without one.  Arguments: tests."""
    own = Path("/proc/self/cgroup")
    text = (own.read_text() if own.exists() else "") if proc_cgroup is None else proc_cgroup
    quotas = []
    for _, controllers, path in (line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2):
        if controllers and "cpu" not in controllers.split(","):
            continue
        files = ("cpu.cfs_quota_us", "cpu.cfs_period_us") if controllers else ("cpu.max",)  # v1 else v2
        rel = Path(path.lstrip("/"))
        for directory in (cgroups / controllers / p for p in (rel, *rel.parents)):
            with contextlib.suppress(OSError):  # no such file here
                quota, _, period = " ".join((directory / f).read_text().strip() for f in files).partition(" ")
                if quota.isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0:  # not "max", "-1"
                    quotas.append(int(quota) / int(period))
    return min(quotas, default=None)
