"""The engine as a learner's loop sees it (exercises 02 and 03): a view of a shared engine
that passes every call through, notes what the checker needs to name a mistake, and refuses
what would change the engine other checks share."""

from __future__ import annotations

import inspect
import sys

from toy_engine.engine import Engine

from .refusals_caught import kept
from .run_edits import RequestWatch
from .whose_loop import engine_loop_above


class EngineView:
    """The engine as a learner's loop sees it: every call goes through to the engine;
    ``schedule`` also notes each round's prompt indexes, so messages can name them."""

    # A loop that swallows the engine's errors may never finish: stop it after far more
    # schedule() calls than the reference loops make (48 serial rounds on PROMPTS, a few
    # more None plans in ZOS) and judge the spin.
    MAX_SCHEDULES = 1000

    # The view's own notes (past_end: schedule() calls after the one that found the end; stale:
    # launches refused, StaleInputs, caught or not; caught: other refusals, (call, round, error);
    # engine_loop: which of whose_loop.SHIPPED_LOOPS asked for a round, if one did).
    NOTES = ("_engine", "watch", "plans", "edits", "schedules", "done_at", "past_end", "stale",
             "caught", "engine_loop")

    # In slots, not the instance's dict, which the loop's own names use: a loop that writes
    # ``vars(engine)["schedules"]`` writes a name the slot hides, not the note.  Weakly
    # referenced as any object (a right loop's ``weakref.finalize(engine, ...)``).
    __slots__ = (*NOTES, "__dict__", "__weakref__")

    def __init__(self, engine: Engine, watch: RequestWatch):
        for name, value in zip(self.NOTES, (engine, watch, {}, [], 0, None, 0, [], [], None)):
            object.__setattr__(self, name, value)

    def schedule(self):
        object.__setattr__(self, "schedules", self.schedules + 1)
        if self.schedules > self.MAX_SCHEDULES:
            raise Spinning(self.schedules - 1)
        if self.engine_loop is None:
            object.__setattr__(self, "engine_loop", engine_loop_above(sys._getframe(1)))
        if self.done_at is not None and not self._engine.scheduler.has_work():
            object.__setattr__(self, "past_end", self.past_end + 1)
        plan = self.watch.around(self._engine.schedule)()
        if plan is not None:
            self.plans[plan.round] = [r.index for r in plan.requests]
        elif self.done_at is None and not self._engine.scheduler.has_work():
            # asked for a round after the end
            object.__setattr__(self, "done_at", max(self.plans, default=0))
        return plan

    def __getattr__(self, name):
        value = getattr(self._engine, name)
        mine = inspect.ismethod(value) and value.__self__ is self._engine
        return self.watch.around(kept(value, name, self)) if mine else value

    def __setattr__(self, name, value):
        """A new name holds the loop's own state on this view, for this run; others are refused."""
        self._refuse(name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._refuse(name)  # ``del engine.plans`` left the checker's code an AttributeError
        object.__delattr__(self, name)

    def _refuse(self, name: str) -> None:
        if hasattr(type(self._engine), name) or name in vars(self._engine):
            kind = "method" if callable(getattr(type(self._engine), name, None)) else "attribute"
            what = f"which replaces the engine's {kind} `{name}`"
        elif name in self.NOTES or hasattr(type(self), name):
            what = "a name the checker uses on the engine it hands your loop, for its own notes"
        else:
            return
        self.edits.append((name, what))
        raise EngineEdited(name, what)


class Spinning(BaseException):
    """Stops a learner's loop that keeps going: a BaseException, so that an ``except
    Exception`` in the loop cannot swallow it."""


class EngineEdited(AttributeError):
    """A learner's loop tried to replace an attribute of a checker's shared engine."""
