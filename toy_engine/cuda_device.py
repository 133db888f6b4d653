"""The device on a GPU: a ``torch.cuda.Stream``, with ``torch.cuda.Event`` as its events.

Kernels enqueue CUDA work on the stream; each launch is bracketed by two timing events.
Device times are put on the host's clock through a reference event recorded (and waited
for) at start-up.
"""

from __future__ import annotations

import time

import cloudpickle
import torch

from .device import Device, DeviceContext


class CudaDevice(Device):
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

