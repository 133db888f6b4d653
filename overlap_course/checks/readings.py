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
    ways = _ways(answer, true, digits)
    if not ways:
        return None
    # a float keeps no trailing 0: round(x, 4) is 0.606 when x's 4th decimal rounds to 0
    more = " or more" if digits and _ways(answer, true, digits + 1) else ""
    to = whole if digits == 0 else f"{digits}{more} decimal{'s' * (digits != 1 or bool(more))}"
    why = " (int() drops the decimals)" if ways == ["cut"] and digits == 0 else ""
    return f"{' or '.join(ways)} to {to}{why}"


def _ways(answer: float, true: float, digits: int) -> list[str]:
    """How ``answer`` is ``true`` with ``digits`` decimals: "cut", "rounded", both or neither."""
    scale = 10 ** digits
    return [how for how, value in (("cut", math.trunc(round(true * scale, 6)) / scale),
                                   ("rounded", round(true, digits)))
            if abs(answer - value) <= 1e-6 * max(1.0, abs(value))]


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


def hover_gaps(true: float) -> list[float]:
    """What start minus end gives read off the figure's hover, both to three decimals: a
    multiple of 0.001 less than 0.001 from ``true`` (0.344 or 0.345 for 0.3442: round 9 ending at
    10.0004 reads 10.000, round 10 starting at 10.3446 reads 10.345; blind round 12)."""
    low = math.floor(round(true * 1e3, 6))
    return [k / 1e3 for k in range(low - 1, low + 3) if abs(k / 1e3 - true) < 1e-3 - 1e-9]


def gap_in_microseconds(gap_ms: float, want: float, precision_ms: float) -> Verdict | None:
    """The gap written in microseconds (start and end taken for seconds, x1000): /1000 it is
    the gap by the rule, or the gap cut or rounded; None if it is neither."""
    ms = gap_ms / 1e3
    how = shortened(round(ms, 6), want)
    if abs(ms - want) <= max(precision_ms, 1e-3 * abs(want)):
        read = f"{ms:g} ms, the gap"
    elif how is not None:
        read = f"{ms:g} ms, the gap {how}"
    else:
        return None
    return fails("microseconds", f"{gap_ms:g} looks like the gap in microseconds: /1000 gives "
                                 f"{read}. The timeline's times are already in milliseconds: "
                                 f"write the gap as they give it, without converting")


def no_gap(gap_before: int) -> Verdict:
    """0 ms for a gap the device did have: the belief named first, then int()'s cut."""
    return fails("no_gap", f"0 ms says the device never idled before round {gap_before}, but it "
                           f"did: in the serial loop it has nothing queued while the host "
                           f"processes a round and prepares the next (the hatched bar on the "
                           f"device lane). Subtract the two spans' times; if you did and got "
                           f"0, int() dropped the decimals: keep two")


def slip_reading(got: float, true: float, name: str, slips) -> Verdict | None:
    """``got`` as a usual slip's value written with fewer digits: the slip named, then the
    rounding (round 12: 18.0 for a percentage of 18.03, 0.5 for a busy fraction of 0.4606);
    ``name``: the true value's, for the message.
    ``slips``: (category, value, what, fix, whole) with ``whole`` as :func:`shortened` takes it.
    Where ``got`` is also the true value cut or rounded, a slip rounded is named beside it: only
    the unrounded value tells them apart.  None if it is no slip's value."""
    own = shortened(got, true, whole=None)
    for category, value, what, fix, whole in slips:
        how = shortened(got, value, whole)
        # beside the true value cut or rounded, only a slip rounded is named: a cut of both
        # (0.2 for 0.2036 and for 0.2557) is the short reading's coincidence
        if how is None or own is not None and "rounded" not in how:
            continue
        if own is not None:
            return fails("wrong_value", f"got {got:g}, expected {true:.8f}: {name} {own}, or "
                                        f"{what} ({value:.4f}) {how}: both give {got:g}, so only "
                                        f"the unrounded value tells them apart. Return it "
                                        f"unrounded (the check allows 1e-6)")
        return fails(category, f"got {got:g}: that is {what} ({value:.4f}) {how}. "
                               f"{fix[0].upper()}{fix[1:]}, unrounded (the check allows 1e-6)")
    return None


def idle_slips(timeline, stats, expected: float) -> list[tuple]:
    """Exercise 2(b)'s usual slips on this run (``stats``: its engine's), each (category,
    value, what, fix, whole) for :func:`slip_reading`; a percentage or a time of two digits or
    more may be rounded to a whole number."""
    idle, busy = sum(b - a for a, b in timeline.device_gaps()), timeline.device_busy_ms()
    extent = max(s.end_ms for s in timeline.spans) - min(s.start_ms for s in timeline.spans)
    slips = [("percentage", 100 * expected, f"a percentage ({100 * expected:.2f}%)",
              f"return the fraction itself, idle / (idle + busy), a number between 0 and 1 "
              f"({expected:.4f} here)", _whole_if_two_digits(100 * expected, "a whole percent")),
             ("busy_fraction", 1 - expected, "the busy fraction",
              "the idle fraction is idle / (idle + busy)", None)]
    if busy:
        slips.append(("idle_over_busy", idle / busy, "idle / busy",
                      "divide by idle + busy (the whole time between the first and the last "
                      "device work), not by busy", None))
    slips.append(("idle_ms", idle, "the idle time in ms",
                  "divide it by idle + busy to get a fraction",
                  _whole_if_two_digits(idle, "whole milliseconds")))
    device = timeline.lane("device")
    lead = min(s.start_ms for s in device) if device else 0.0
    if lead > 0:  # from time 0 (blind round 44): 1 - busy / the last device span's end
        slips.append(("counts_startup", (idle + lead) / (idle + lead + busy),
                      f"counted from time 0: the {lead:.1f} ms before the device's first work "
                      f"(the run starting, nothing queued yet) counted as idle",
                      "the idle fraction runs from the first device span to the last; "
                      "device_gaps() starts there", None))
        slips.append(("counts_startup", idle / (idle + lead + busy),
                      f"idle over the time from 0 to the device's last work, whose first "
                      f"{lead:.1f} ms came before any device work (the run starting)",
                      "the idle fraction runs from the first device span to the last: "
                      "divide by idle + busy", None))
    for denominator in (getattr(stats, "wall_ms", extent), extent):
        if denominator:
            slips.append(("wall_denominator", idle / denominator, "idle over the wall time",
                          "wall_ms also counts host-only time before the first and after the "
                          "last device work: use idle + busy as the denominator", None))
    # the same slips given as a percentage (72.2 for a busy fraction of 0.722: round 13)
    slips += [("percentage", 100 * value, f"{what} as a percentage ({100 * value:.2f}%)",
               f"give a fraction from 0 to 1, not a percentage; {fix}",
               _whole_if_two_digits(100 * value, "a whole percent"))
              for category, value, what, fix, _ in slips[1:]
              if category in ("busy_fraction", "idle_over_busy", "wall_denominator",
                              "counts_startup")]
    return slips


def _whole_if_two_digits(value: float, whole: str) -> str | None:
    """A whole number is taken for ``value`` rounded only if it keeps two digits (18 for 18.03;
    0 or 1 for 0.4 says nothing)."""
    return whole if abs(value) >= 10 else None
