"""Which rounds a figure shows: both views pick their window of rounds the same way."""

from __future__ import annotations

from toy_engine.timeline import Span, Timeline


def check_timeline(value, name: str = "timeline") -> Timeline:
    """``value`` if it is a Timeline; else a TypeError that says where to get one."""
    if not isinstance(value, Timeline):
        raise TypeError(f"{name} must be a Timeline (engine.timeline, or figures.load_trace(name)), got "
                        f"{type(value).__name__}")
    return value


def decode_rounds(timeline: Timeline) -> list[int]:
    """Rounds that ran a forward and are not prefill rounds (``meta.prefill_rounds``)."""
    prefill = set(timeline.meta.prefill_rounds)
    return sorted({s.round for s in timeline.spans if s.stage == "forward"} - prefill)


def default_first_round(timeline: Timeline) -> int:
    """First decode round whose previous round is a decode round too.

    That is the first *steady-state* round: prefill and the first decode round still
    look like start-up (cold caches, no deferred step to overlap with).
    """
    decode = decode_rounds(timeline)
    decode_set = set(decode)
    steady = [r for r in decode if r - 1 in decode_set]
    if steady:
        return steady[0]
    rounds = timeline.rounds()
    return 0 if not rounds or 0 in rounds else rounds[0]


def common_first_round(timelines: list[Timeline]) -> int:
    """The first round that is steady state in every run (so all rows show the same rounds)."""
    return max(default_first_round(tl) for tl in timelines)


def window_spans(timeline: Timeline, first_round: int, num_rounds: int) -> list[Span]:
    """Spans *owned* by rounds ``first_round .. first_round+num_rounds-1``.

    Selection is by round, not time: a round's deferred postprocess (or flush) belongs
    to the window even though it ran during a later round.
    """
    wanted = range(first_round, first_round + num_rounds)
    return sorted((s for s in timeline.spans if s.round in wanted), key=lambda s: (s.start_ms, s.end_ms))
