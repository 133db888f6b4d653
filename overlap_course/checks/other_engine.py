"""A learner's code that calls a stage on an engine other than the one the check runs it on (the
notebook's global ``engine``, open or closed, idle or not): seen as the call is made, by the
trace function of every exercise check's time limit, and stopped there. Left to run, an idle
engine answers None and the loop spins to the time limit, an empty scheduler ends the loop at
round 0, a closed engine refuses: none of which names the slip."""

from __future__ import annotations

import inspect
import os
import types

import toy_engine
from toy_engine.device import CudaDevice, Device
from toy_engine.engine import Engine
from toy_engine.process_device import ProcessDevice
from toy_engine.scheduler import BlockManager, Scheduler

from .engine_view import EngineView
from .sandbox import _is_learners
from .verdict import Verdict, fails

# What a learner reaches through an engine, and how the check's engine holds it.
_PARTS = ((Engine, "", lambda e: e), (Scheduler, "scheduler.", lambda e: e.scheduler),
          (BlockManager, "scheduler.blocks.", lambda e: e.scheduler.blocks),
          *((cls, "device.", lambda e: e.device) for cls in (Device, CudaDevice, ProcessDevice)))
_EXECUTE = Engine._execute.__code__  # the frame of a run: its ``self`` is the engine running
_TOY = os.path.dirname(toy_engine.__file__) + os.sep
_STAGE = Engine.schedule.__code__  # every stage's wrapper (stages._stage): its ``name`` says which


def _codes() -> dict:
    """The code of every public method of those parts, inherited too (the stages are
    RoundStages'), written in the toy (not contextlib's helper of ``calling``): (path, the part
    of an engine)."""
    return {value.__code__: (path, part) for cls, path, part in _PARTS for name in dir(cls)
            if not name.startswith("_")
            and isinstance(value := inspect.getattr_static(cls, name), types.FunctionType)
            and value.__code__.co_filename.startswith(_TOY)}


class Stopped(BaseException):
    """Raised by the call stopped, at its first use of ``self`` (not an Exception: ``except
    Exception`` in a loop must not swallow it); the call itself is in ``Watch.found``."""


class _Refused:
    """Put in place of the stopped call's ``self``: its first use raises Stopped there, in the
    method's own frame (raised in the trace function, it would turn the time limit's trace off)."""

    def __getattribute__(self, name):
        raise Stopped(name)


class Watch:
    """One check's watch: ``codes`` maps each watched method's code to ``seen``, for the time
    limit's trace function; ``found`` is (method, the learner's parameter, closed) or None."""

    def __init__(self) -> None:
        self.found = None
        self.codes = dict.fromkeys(_CODES, self.seen)

    def seen(self, frame) -> None:
        """A watched method starts: from the learner's code, during a run of another engine than
        the one it belongs to, it is stopped at its entry (where it has done nothing)."""
        caller = frame.f_back
        if caller is None or not _is_learners(caller.f_code.co_filename):
            return
        running = _running(caller)
        path, part = _CODES[frame.f_code]
        me = frame.f_locals.get("self")
        if running is None or me is part(running) or (
                type(me) is EngineView and object.__getattribute__(me, "_engine") is running):
            return  # the view of the running engine: ``te.Engine.<stage>(engine, ...)``
        name = frame.f_locals["name"] if frame.f_code is _STAGE else frame.f_code.co_name
        if self.found is None:
            closed = isinstance(me, Engine) and getattr(me, "_closed", False) is True
            self.found = (path + name, _parameter(caller, running), closed)
        frame.f_locals["self"] = _Refused()  # written back to the frame as the hook returns


_CODES = _codes()


def _running(frame) -> Engine | None:
    """The engine whose run called the learner's code (the innermost), or None."""
    while frame is not None:
        if frame.f_code is _EXECUTE:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def _parameter(frame, engine: Engine) -> str | None:
    """The parameter of the learner's function that the check called which holds ``engine``
    (or the checker's view of it), or None."""
    while frame.f_back is not None and _is_learners(frame.f_back.f_code.co_filename):
        frame = frame.f_back
    code = frame.f_code
    for name in code.co_varnames[:code.co_argcount]:
        value = frame.f_locals.get(name)
        if value is engine or (type(value) is EngineView and value._engine is engine):
            return name
    return None


def verdict(method: str, param: str | None, closed: bool) -> Verdict:
    """Named at the call: what the other engine did next would blame a step kept from another
    run, ask for a new engine, or spin to the time limit."""
    given = f"`{param}`" if param else "the engine your code is given"
    which = ", a closed one" if closed else ""
    return fails("other_engine",
                 f"your code called `.{method}(...)` on an engine other than the one the check "
                 f"gave it ({given}){which}: the checker stopped it at that call. The check runs "
                 f"your code on an engine of its own, and a plan, inputs, step or request belong "
                 f"to the engine that made them. Call every stage on {given}, never on a global "
                 f"`engine` of the notebook")
