"""Lab 3's answers: what a learner's ``ring_slots(depth)`` returns, asked a random number of times
per depth in a shuffled order, and remembered per function across checks (notebook 07)."""

from __future__ import annotations

import random
import weakref

from overlap_course.labs import plugins
from toy_engine.config import MAX_SLOTS

from .answers import returned_whole, show
from .errors import quoted
from .lab_workloads import DEPTHS
from .verdict import Verdict, fails, not_implemented

# What each ring_slots function answered per depth, across checks in this kernel: a size that
# changes between checks on the same function is named, wherever the change comes.
ASKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def asked(ring_slots, calls: tuple = (3, 8), again: bool = False) -> list | Verdict:
    """``ring_slots`` asked for each depth a random number of times within ``calls``, in a
    shuffled order: per depth, its size or the verdict on its first answer; or the verdict on
    an answer that changed (from an earlier call, or an earlier check unless ``again``: this
    check's second asking). A function that changes only past every call made here still
    passes: no number of calls can rule that out."""
    rng, got = random.Random(), {}
    asks = [d for d in DEPTHS for _ in range(rng.randint(*calls))]
    rng.shuffle(asks)
    try:
        earlier = ASKED.setdefault(ring_slots, {})
    except Exception:  # noqa: BLE001 - no weak reference, or a hash that raises: this check's
        earlier = {}
    before = set() if again else set(earlier)
    for n, depth in enumerate(asks, 1):
        if isinstance(got.get(depth), Verdict):
            continue
        slots = size(ring_slots, depth)
        first = got.setdefault(depth, slots) if depth not in earlier else earlier[depth]
        if isinstance(slots, Verdict) and first is slots:
            continue
        if isinstance(slots, Verdict):
            slots.message = f"asked again for depth {depth} (call {n}), {slots.message}"
            return slots
        earlier.setdefault(depth, slots)
        if slots != first:
            when = ("in an earlier check" if depth in before else
                    "earlier in this check, the depths asked in a shuffled order")
            return fails("keeps_state",
                         f"ring_slots({depth}) returned {first} {when}, and {slots} when asked "
                         f"again (call {n} of this check): a loop holding that many rounds "
                         f"always needs the same ring, so the size must depend on the depth "
                         f"alone (keep no state between calls)")
        got[depth] = slots
    return [got[d] for d in DEPTHS]


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
