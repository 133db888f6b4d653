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
    """What the threads a check's code starts raise, from ``start`` (as a check starts) to ``end``
    (once its time limit has ended: nothing cuts the hook's return short), recorded through
    :func:`_dispatch`, installed as ``threading.excepthook`` once, as the course is imported, and
    kept there: a hook swapped at each check would read, to the grading judge, as a change the
    submission made (round 23)."""

    def __init__(self):
        self.count, self.first, self.refusal, self.swapped = 0, None, None, None

    def start(self) -> None:
        if threading.excepthook is not _dispatch:  # replaced since (a learner's own hook)
            self.swapped, threading.excepthook = threading.excepthook, _dispatch
        _RECORDING.append(self)

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
        if self in _RECORDING:  # started
            _RECORDING.remove(self)
        if self.swapped is not None:
            threading.excepthook = self.swapped
        if self.count:
            first = " ".join(f"{type_name(self.first)}: {said(self.first, 100)}".split())
            print(f"({self.count} exception(s) in threads your code started were not printed; "
                  f"the first: {first})", file=sys.stderr)


#: The checks recording now (the newest records); none: Python's own hook prints, as before
_RECORDING: list[ThreadErrors] = []
_PYTHONS = threading.excepthook


def _dispatch(args) -> None:
    """``threading.excepthook`` while the course is imported."""
    if _RECORDING:
        _RECORDING[-1]._record(args)
    else:
        _PYTHONS(args)


threading.excepthook = _dispatch


def _refused(err: BaseException | None) -> bool:
    """Whether ``err`` is the engine's refusal of a stage called from another thread than the
    run's loop: the RuntimeError that ``Run.enter`` raises (its only one)."""
    tb = getattr(err, "__traceback__", None) if type(err) is RuntimeError else None
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is Run.enter.__code__


def other_thread(refusal: BaseException, ending: str | None, who: str = "loop",
                 fix: str = "Run the rounds") -> Verdict:
    """The engine refused a stage called from a thread the learner's ``who`` started: the refusal
    was raised in that thread, lost to ``who``, whose ``ending`` (what it did instead) follows
    it; None: ``who`` raised it again and stopped (round 43: ``pool.submit(...).result()`` was
    said to have lost it).  Named first, whatever followed: what followed is the refused
    call's absence."""
    what = (f"That thread's error never reached your {who}, {ending}" if ending is not None
            else f"Your {who} stopped with that error, raised again from that thread")
    return fails("other_thread",
                 f"your {who} called the engine from another thread than the one that called "
                 f"your {who}, and the engine refused the call ({said(refusal)}). {what}. "
                 f"{fix} in the thread that calls your {who}")

