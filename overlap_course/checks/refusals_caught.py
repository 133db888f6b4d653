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
    return fails("refusal_caught",
                 f"in round {at}, your loop called `engine.{name}` and the engine refused it "
                 f"({quoted(err)}), and your loop caught the error and went on. The refusal is "
                 f"the bug report: an engine that did not check would have made that call. Make "
                 f"the call right (or leave it out) instead of catching the error")
