"""Lab 3's answers: what a learner's ``ring_slots(depth)`` returns, asked a random number of times
per depth in a shuffled order, and remembered per function across checks (notebook 07)."""

from __future__ import annotations

import random
import weakref
from collections import Counter

from overlap_course.labs import plugins
from toy_engine.config import MAX_SLOTS

from .answers import returned_whole, show
from .errors import quoted
from .lab_workloads import DEPTHS
from .verdict import Verdict, fails, not_implemented

# What each ring_slots function answered per depth, across checks in this kernel: a size that
# changes between checks on the same function is named, wherever the change comes.
ASKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def asked(ring_slots, calls: tuple = (3, 8), again: bool = False,
          counts: Counter | None = None) -> list | Verdict:
    """``ring_slots`` asked for each depth a random number of times within ``calls``, in a
    shuffled order: per depth, its size or the verdict on its first answer; or the verdict on
    an answer that changed (from an earlier call, or an earlier check unless ``again``: this
    check's second asking). ``counts``: the calls per depth this check made before, so a
    change names the call as the learner can count it. A function that changes only past
    every call made here still passes: no number of calls can rule that out."""
    rng, got, counts = random.Random(), {}, Counter() if counts is None else counts
    asks = [d for d in DEPTHS for _ in range(rng.randint(*calls))]
    rng.shuffle(asks)
    try:
        earlier = ASKED.setdefault(ring_slots, {})
    except Exception:  # noqa: BLE001 - no weak reference, or a hash that raises: this check's
        earlier = {}
    before = set() if again else set(earlier)
    for depth in asks:
        if isinstance(got.get(depth), Verdict):
            continue
        counts[depth] += 1
        slots = size(ring_slots, depth)
        first = got.setdefault(depth, slots) if depth not in earlier else earlier[depth]
        if isinstance(slots, Verdict) and first is slots:
            continue
        if isinstance(slots, Verdict):
            slots.message = f"asked again ({_which_call(counts, depth)}), {slots.message}"
            return slots
        earlier.setdefault(depth, slots)
        if slots != first:
            when = ("in an earlier check" if depth in before else
                    "earlier in this check, the depths asked in a shuffled order")
            return fails("keeps_state",
                         f"ring_slots({depth}) returned {first} {when}, and {slots} when asked "
                         f"again ({_which_call(counts, depth)}): a loop holding that many rounds "
                         f"always needs the same ring, so the size must depend on the depth "
                         f"alone (keep no state between calls)")
        got[depth] = slots
    return [got[d] for d in DEPTHS]


def _which_call(counts: Counter, depth: int) -> str:
    """The call that answered, as the learner's own log of calls counts it: the how-manieth
    with this depth, and the how-manieth in all (the check's askings together)."""
    nth, total = counts[depth], sum(counts.values())
    suffix = "th" if 10 <= nth % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
    when = "first" if nth == 1 else f"{nth}{suffix}"
    return (f"the {when} time this check asked for depth {depth}; call {total} of its calls "
            f"to ring_slots")


def size(ring_slots, depth: int) -> int | Verdict:
    """``ring_slots(depth)`` as a plain int from 1 to MAX_SLOTS (a 0-d tensor or array is the
    number it holds, as the other plug-ins' answers), or the verdict on what it returned."""
    try:
        got = ring_slots(depth)
    except NotImplementedError:
        return not_implemented("`ring_slots`")
    except Exception as err:  # noqa: BLE001
        return fails("raised", f"ring_slots({depth}) raised {quoted(err)}")
    value = plugins.zero_d(got)
    slots = returned_whole(value)  # a plain int, or None
    if plugins.whole_float(value):
        return fails("shape", f"ring_slots({depth}) returned {show(got)}, a float: the loop "
                              f"makes a ring of that many slots, and a size must be "
                              f"{plugins.AN_INT} (from 1 to {MAX_SLOTS})")
    if slots is None or not 1 <= slots <= MAX_SLOTS:
        return fails("shape", f"ring_slots({depth}) returned {show(got)}: return a whole number of "
                              f"slots from 1 to the engine's limit, {MAX_SLOTS}")
    return slots
