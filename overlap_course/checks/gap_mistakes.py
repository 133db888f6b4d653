"""Notebook 02's round gap, measured wrong: what the classic slips give on a timeline (the gap
after the round, start to start, up to the forward, from the host's wait, ...), and another
round's gap read to more digits than the rule's two decimals."""

from __future__ import annotations

from .readings import decimals, near


def round_extent(timeline) -> tuple[dict, dict]:
    first_start, last_end = {}, {}
    for span in timeline.lane("device"):
        first_start[span.round] = min(first_start.get(span.round, span.start_ms), span.start_ms)
        last_end[span.round] = max(last_end.get(span.round, span.end_ms), span.end_ms)
    return first_start, last_end


def gap_mistakes(timeline, round: int, want: float) -> list[tuple[float, str, str]]:
    """What the classic wrong measurements of the gap give on this timeline: (value, category, why)."""
    first_start, last_end = round_extent(timeline)
    dev = {(s.stage, s.round): s for s in timeline.lane("device")}
    host = {(s.stage, s.round): s for s in timeline.lane("host")}
    mistakes = [
        (-want, "sign_flipped",
         "the sign is flipped: subtract the end of the earlier round from the start of the later one"),
    ]
    if round + 1 in first_start:
        mistakes.append((first_start[round + 1] - last_end[round], "wrong_round",
                         f"that is the gap after round {round}; the question asks for the gap before it, after "
                         f"round {round - 1}"))
    if round - 2 in last_end:
        mistakes.append((first_start[round - 1] - last_end[round - 2], "wrong_round",
                         f"that is the gap before round {round - 1}; the question asks for the gap before round "
                         f"{round}"))
    if round - 1 in first_start:
        mistakes.append((first_start[round] - first_start[round - 1], "start_to_start",
                         f"that is from the start of round {round - 1} to the start of round {round}: it includes "
                         f"round {round - 1}'s device work; start from the end of its last span"))
    if ("upload", round) in dev and ("forward", round) in dev:
        mistakes.append((dev[("forward", round)].start_ms - dev[("upload", round)].end_ms, "inside_round",
                         f"that is the small gap inside round {round}, between its upload and its forward"))
    if ("sample", round - 1) in dev and ("forward", round) in dev:
        mistakes.append((dev[("forward", round)].start_ms - dev[("sample", round - 1)].end_ms, "up_to_forward",
                         f"you measured up to round {round}'s forward, but its upload is already device work"))
    if ("wait", round - 1) in host:
        mistakes.append((first_start[round] - host[("wait", round - 1)].end_ms, "host_lane",
                         f"you started at the end of the host's wait; the gap starts on the device lane, when "
                         f"round {round - 1}'s sample ends"))
    if ("sample", round - 1) in dev:
        mistakes.append((first_start[round] - dev[("sample", round - 1)].start_ms, "from_sample_start",
                         f"you started at the start of round {round - 1}'s sample; the device was busy until "
                         f"its end"))
    return mistakes


def nearer_gap(timeline, gap_ms: float, want: float, hover: float | None) -> int | None:
    """The round whose gap before it is the answer (within a thousandth) and nearer than the
    asked one, for an answer written to more than the rule's two decimals that is not the
    hover's reading of the asked gap."""
    if decimals(gap_ms) <= 2 or (hover is not None and near(gap_ms, hover)):
        return None
    first_start, last_end = round_extent(timeline)
    gaps = {r: first_start[r] - last_end[r - 1] for r in first_start if r - 1 in last_end}
    nearer = [r for r, gap in gaps.items() if near(gap_ms, gap) and abs(gap_ms - gap) <
              abs(gap_ms - want)]
    return min(nearer, key=lambda r: abs(gap_ms - gaps[r]), default=None)
