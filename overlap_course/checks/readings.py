"""How a number a learner read off a figure relates to the true one: how many decimals it was
written with, whether it is the true value cut or rounded, whether it is in seconds.  The
verdicts that use these name the reading, not only "wrong" (round eleven's blind answers)."""
from __future__ import annotations

import math

from .verdict import Verdict, fails


def near(a: float, b: float) -> bool:
    """Within a thousandth (of a ms, or of ``b``'s size): a measured mistake's value, read off."""
    return abs(a - b) <= max(1e-3, 1e-3 * abs(b))


def decimals(x: float) -> int:
    """How many decimals a number was written with (1.37 -> 2, 8e-05 -> 5; a float32's noise
    and digits past the sixth ignored)."""
    return len(f"{round(float(x), 6):.6f}".rstrip("0").split(".")[1])


def shortened(answer: float, true: float,
              whole: str | None = "whole milliseconds") -> str | None:
    """How ``answer`` is ``true`` written with fewer digits ("cut to 2 decimals", "rounded to
    whole milliseconds"), or None: written with d decimals, it is ``true`` rounded or cut
    (``int()``, ``math.trunc``) to d decimals.  Only those: 1.0 for a gap of 0.3 is neither.
    ``whole`` None: a whole number is never taken for one (a fraction's 0 or 1 says nothing)."""
    digits = decimals(answer)
    if digits == 0 and whole is None:
        return None
    scale = 10 ** digits
    ways = [how for how, value in (("cut", math.trunc(round(true * scale, 6)) / scale),
                                   ("rounded", round(true, digits)))
            if abs(answer - value) <= 1e-6 * max(1.0, abs(value))]
    if not ways:
        return None
    to = whole if digits == 0 else f"{digits} decimal{'s' * (digits != 1)}"
    why = " (int() drops the decimals)" if ways == ["cut"] and digits == 0 else ""
    return f"{' or '.join(ways)} to {to}{why}"


def gap_in_seconds(gap_ms: float, want: float, precision_ms: float) -> Verdict | None:
    """The gap written in seconds: x1000 it is the gap by the rule, or the gap cut or rounded
    (0.0008 for 0.8245 ms).  Its own value in ms says nothing ("0.000 ms"), so it is not shown."""
    ms, how = gap_ms * 1e3, shortened(gap_ms * 1e3, want)
    if abs(ms - want) <= max(precision_ms, 1e-3 * abs(want)):
        read = f"{ms:g} ms, the gap"
    elif how is not None:
        read = (f"{ms:g} ms, the gap {how} (the check's rule is two decimals, within "
                f"{precision_ms} ms)")
    else:
        return None
    return fails("seconds", f"{gap_ms:g} looks like the gap in seconds: x1000 gives {read}. The "
                            f"timeline's times are already in milliseconds: write the gap in ms")
