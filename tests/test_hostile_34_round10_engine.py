"""Issue 34, round ten (fixed in the eleventh): a Ctrl-C while ``Engine()`` started left its device
process running for as long as the interrupt's traceback was kept (Jupyter keeps the last one);
a right loop checked after a stopped wrong one was told an earlier cell had replaced
``engine.device.buffers[0]``; exercise 05's "See it work" cell ended in a traceback on two
mistakes its own checker names."""

from __future__ import annotations

import gc
import multiprocessing as mp

import pytest

from toy_engine import process_device
from toy_engine.config import EngineConfig
from toy_engine.engine import Engine
from toy_engine.process_device import ProcessDevice


def _device_processes() -> list:
    return [p for p in mp.active_children() if p.name == "toy-engine-device"]


def _interrupt_at(monkeypatch, where: str) -> None:
    """Raise KeyboardInterrupt where a real Ctrl-C lands while ``Engine()`` starts."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "pickling the model":
        monkeypatch.setattr(process_device.cloudpickle, "dumps", interrupt)
    elif where == "waiting for ready":
        poll = ProcessDevice._poll
        monkeypatch.setattr(ProcessDevice, "_poll", lambda self, deadline, what: (
            interrupt() if what == "start" else poll(self, deadline, what)))
    else:  # the device is up; the engine builds its first timeline
        monkeypatch.setattr(Engine, "_meta", interrupt)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["pickling the model", "waiting for ready", "the engine's timeline"])
def test_an_engine_start_cut_short_by_ctrl_c_ends_its_device_process(monkeypatch, where):
    before = _device_processes()
    _interrupt_at(monkeypatch, where)
    with pytest.raises(KeyboardInterrupt) as caught:
        Engine(EngineConfig(device="cpu"))
    monkeypatch.undo()
    kept = caught.value.__traceback__  # as IPython keeps sys.last_traceback
    gc.collect()
    left = [p for p in _device_processes() if p not in before]
    for proc in left:
        proc.kill()
    assert kept is not None and not left, \
        f"Ctrl-C while {where}: the device process outlives the interrupt: {left}"


@pytest.mark.timeout(60)
def test_a_device_process_that_cannot_start_is_reported_as_it_was(monkeypatch):
    def refuse(*args):
        raise OSError("cannot start the device process: no room")

    monkeypatch.setattr(process_device, "_start", refuse)
    with pytest.raises(OSError, match="no room") as caught:  # not an AttributeError from close()
        Engine(EngineConfig(device="cpu"))
    assert caught.value.__context__ is None, repr(caught.value.__context__)
