"""The engine's refusals that a learner's loop caught and went on past (round 28: a refused
``prepare_inputs`` or ``commit_outputs`` in a ``try`` passed): each is kept with the call and
the round, and named as an uncaught one is."""

from __future__ import annotations

import functools

from toy_engine import refusals
from toy_engine.buffers import BadOutputs
from toy_engine.device import ForeignEvent
from toy_engine.run import StaleInputs

from .errors import quoted
from .verdict import Verdict, fails

#: What the engine refuses: the classes of its refusals module, and the buffers' and device's
REFUSALS = (*(c for c in vars(refusals).values() if isinstance(c, type)
              and issubclass(c, Exception) and c.__module__ == refusals.__name__),
            BadOutputs, ForeignEvent)


def kept(call, name: str, view):
    """``call`` (the engine's ``name``), a refusal out of it kept on ``view`` before it is
    raised: a StaleInputs in ``view.stale``, any other (name, round, error) in ``view.caught``
    (``round``: the last one ``schedule()`` planned)."""
    @functools.wraps(call)
    def kept_call(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except REFUSALS as err:
            if isinstance(err, StaleInputs):
                view.stale.append(err)
            else:
                view.caught.append((name, max(view.plans, default=0), err))
            raise
    return kept_call


def caught_refusal(caught: tuple) -> Verdict:
    """A refusal the loop caught and went on past (the run otherwise right)."""
    name, at, err = caught
    return refused_and_caught(f"in round {at}, your loop", name, err, "your loop", "Make")


def refused_and_caught(called: str, name: str, err: Exception, caught: str,
                       fix: str) -> Verdict:
    """A refusal of the engine's out of ``engine.name`` that the learner's code caught (a
    loop's or a plug-in's: ``called`` and ``caught`` say whose), and ``fix``."""
    return fails("refusal_caught",
                 f"{called} called `engine.{name}` and the engine refused it ({quoted(err)}), "
                 f"and {caught} caught the error and went on. The refusal is the bug report: an "
                 f"engine that did not check would have made that call. {fix} the call right (or "
                 f"leave it out) instead of catching the error")
