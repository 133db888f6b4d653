"""Which rounds a figure shows: both views pick their window of rounds the same way."""

from __future__ import annotations

from toy_engine.timeline import PROCESS_STAGES, Span, Timeline


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


def round_window(timeline: Timeline, first_round: int, last_round: int) -> tuple[float, float]:
    """Time range of rounds ``first_round..last_round`` that is comparable across runs.

    From the moment round ``first_round - 1``'s tokens reached the requests (the end of its
    processing) to the moment round ``last_round``'s did: the time the engine took to deliver
    these rounds, which is what throughput is made of, in any loop.  Serial and ZOS deliver
    one round per pass, so equal widths mean equal time and the run with more tokens per
    second draws the shorter window (other anchors made the faster run look slower:
    docs/measurements/figures.md).  Where round ``first_round - 1`` was never processed the
    window starts at its first device work; rounds without processing end at their last
    device work.
    """
    if last_round < first_round:
        raise ValueError(f"last_round ({last_round}) must be >= first_round ({first_round})")
    spans = [s for s in timeline.spans if first_round <= s.round <= last_round]
    if not spans:
        rounds = timeline.rounds()
        raise ValueError(f"rounds {first_round}..{last_round} have no spans in this timeline "
                         f"(it has rounds {rounds[0] if rounds else None}..{rounds[-1] if rounds else None})")
    delivered = [s.end_ms for s in timeline.spans
                 if s.round == first_round - 1 and s.lane == "host" and s.stage in PROCESS_STAGES]
    starts = [s.start_ms for s in spans if s.lane == "device"] or [s.start_ms for s in spans]
    ends = ([s.end_ms for s in spans if s.lane == "host" and s.stage in PROCESS_STAGES]
            or [s.end_ms for s in spans if s.lane == "device"] or [s.end_ms for s in spans])
    t0, t1 = (max(delivered) if delivered else min(starts)), max(ends)
    return t0, max(t0, t1)
