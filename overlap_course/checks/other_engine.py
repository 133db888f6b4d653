"""A learner's loop that calls a stage on an engine other than the one the check gave it (the
notebook's global ``engine``): that engine's own message would blame a step "left from another
run" or ask for a new engine, so the check names the call instead."""

from __future__ import annotations

import inspect

from toy_engine.engine import Engine

from .verdict import Verdict, fails


_METHODS = set(dir(Engine))  # a frame of a stage's guard (stages._stage) is none of them


class OtherEngine(Exception):
    """A learner's loop called a stage of an engine other than the one it was given (a global
    ``engine`` of the notebook), which raised: ``args`` (the method, the loop's parameter, whether
    that engine is closed)."""


def found(err, engine: Engine, loop) -> OtherEngine | None:
    """``err`` raised inside an Engine that is not the check's ``engine``, or None: its own
    message (a step "left from another run", a closed engine) would blame something else."""
    calls, tb = [], getattr(err, "__traceback__", None)
    while tb is not None:
        me, name = tb.tb_frame.f_locals.get("self"), tb.tb_frame.f_code.co_name
        if isinstance(me, Engine) and name in _METHODS:
            calls.append((me, name))
        tb = tb.tb_next
    if not calls or calls[-1][0] is engine:
        return None
    other = calls[-1][0]
    method = next(name for me, name in calls if me is other)
    try:
        param = next(iter(inspect.signature(loop).parameters))
    except (TypeError, ValueError, StopIteration):
        param = None
    return OtherEngine(method, param, getattr(other, "_closed", False) is True)


def verdict(method: str, param: str | None, closed: bool) -> Verdict:
    """Not the engine's own message: it would blame a step kept from another run, or say to
    create a new engine."""
    given = f"`{param}`" if param else "the engine your loop is given"
    which = ", a closed one," if closed else ""
    return fails("other_engine",
                 f"your loop called `.{method}(...)` on an engine other than the one the check "
                 f"gave it ({given}){which} and that engine refused: the check runs your loop on "
                 f"an engine of its own, and a plan, inputs or step belong to the engine that "
                 f"made them. Call every stage on {given}, never on a global `engine` of the "
                 f"notebook")
