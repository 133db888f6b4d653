"""Exceptions in the threads a learner's code starts while an exercise check runs: recorded, not
printed, and the engine's refusal of a stage called from such a thread kept for the verdict.

A loop that runs each round in a thread it joins has every stage refused there: the loop never
sees the error, so it goes on starting threads until the time limit, and Python printed a
traceback for each (blind round 23: 190,000 in one cell, most of them the checker's own
``_Spinning``).  One line now says how many there were and what the first was.
"""

from __future__ import annotations

import sys
import threading

from toy_engine.run import Run

from .answers import type_name
from .errors import said
from .verdict import Verdict, fails


class ThreadErrors:
    """``threading.excepthook`` replaced from ``start`` (as a check starts) to ``end`` (once its
    time limit has ended: nothing cuts the hook's return short)."""

    def __init__(self):
        self.count, self.first, self.refusal, self.previous = 0, None, None, None

    def start(self) -> None:
        self.previous, threading.excepthook = threading.excepthook, self._record

    def _record(self, args) -> None:
        """Python's own hook prints nothing for SystemExit: neither does this one."""
        if args.exc_type is SystemExit:
            return
        self.count += 1
        if self.first is None:
            self.first = args.exc_value
        if self.refusal is None and _refused(args.exc_value):
            self.refusal = args.exc_value

    def end(self) -> None:
        if self.previous is not None:  # started
            threading.excepthook = self.previous
        if self.count:
            first = " ".join(f"{type_name(self.first)}: {said(self.first, 100)}".split())
            print(f"({self.count} exception(s) in threads your code started were not printed; "
                  f"the first: {first})", file=sys.stderr)


def _refused(err: BaseException | None) -> bool:
    """Whether ``err`` is the engine's refusal of a stage called from another thread than the
    run's loop: the RuntimeError that ``Run.enter`` raises (its only one)."""
    tb = getattr(err, "__traceback__", None) if type(err) is RuntimeError else None
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is Run.enter.__code__


def other_thread(refusal: BaseException, ending: str) -> Verdict:
    """The engine refused a stage called from a thread the loop started: the refusal was raised
    in that thread, lost to the loop, whose ``ending`` (what it did instead) follows it."""
    return fails("other_thread",
                 f"your loop called the engine from another thread than the one that called your "
                 f"loop, and the engine refused the call ({said(refusal)}). That thread's "
                 f"error never reached your loop, {ending}. Run the rounds in the thread that "
                 f"calls your loop")
