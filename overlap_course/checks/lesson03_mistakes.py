"""Lesson 03's named mistakes: what the classic wrong answers to its questions look like, so
that a checker can say which one a learner made (the ideal ratio of 03b, the order of the
exercise's three rounds)."""

from __future__ import annotations

from overlap_course.measure.bench import ideal_ratio
from toy_engine.runinfo import RunStats

from .verdict import Verdict, fails


def ratio_mistakes(serial_stats: RunStats, zos_stats: RunStats | None) -> list[tuple[float, str, str]]:
    """What the classic wrong ratios give on these runs: (value, category, why)."""
    host, dev = serial_stats.mean_host_ms_per_round, serial_stats.mean_device_ms_per_round
    mistakes = [
        (ideal_ratio(host, dev) - 1, "gain", "that is the gain, the ratio minus 1 (which is also min(host, device) / "
                                             "max(host, device)): the question asks for the ratio itself, a serial "
                                             "round's time over an overlapped one's"),
        ((host + dev) / min(host, dev), "divides_by_smaller",
         "divide by the larger of the two: overlap leaves the longer lane's time"),
        (max(host, dev) / (host + dev), "upside_down",
         "that is upside down: the serial round takes host + device, the overlapped "
         "one max(host, device); the speed-up is serial over overlapped"),
        (dev / host, "device_over_host", "that is device over host; the ideal is (host + device) / max(host, device)"),
        (host / dev, "host_over_device", "that is host over device; the ideal is (host + device) / max(host, device)"),
        (host + dev, "serial_round_time", "that is a serial round's time in ms; divide it by what an overlapped "
                                          "round takes, max(host, device)"),
    ]
    idle = serial_stats.decode_device_idle_fraction
    if 0 <= idle < 1:
        mistakes.append((1 / (1 - idle), "from_idle_fraction", "that estimate comes from the idle fraction; the "
                                                               "question asks for the per-round host and device times"))
    if zos_stats is not None:
        try:
            mistakes.append((ideal_ratio(zos_stats.mean_host_ms_per_round, zos_stats.mean_device_ms_per_round),
                             "zos_times", "those are the ZOS run's times: the ideal comes from the serial run, "
                                          "where host and device work add up"))
            mistakes.append((zos_stats.tokens_per_s / serial_stats.tokens_per_s, "measured_speedup",
                             "that is the measured speed-up; the ideal is computed from the serial run's times"))
        except ZeroDivisionError:
            pass
    return mistakes


def order_mistake(i: int, got: tuple[str, int], want: tuple[str, int]) -> Verdict:
    """The first step where the learner's order differs from the engine's, named."""
    category, why = "order", ""
    if want[0] == "postprocess" and got[0] == "sample":
        category, why = "sample_before_postprocess", (
            ": the previous step is processed after this forward is launched, before this sample "
            "(the sample may need the tokens it commits, as the title-case demo of notebook 03a shows)")
    elif got[0] == want[0] == "flush":
        category, why = "wrong_round", (
            f": the flush is right, its round is not: it processes the last round, round "
            f"{want[1]} (" + (f"the run has no round {got[1]})" if got[1] > want[1] else
                              f"round {got[1]} was postprocessed under round {got[1] + 1}'s "
                              f"forward)"))
    elif want[0] == "flush":
        category, why = "no_flush", ": the last round has no next round to hide under, so it is flushed"
    elif got[0] == "flush" and want == ("sample", got[1]):
        category, why = "flush_before_sample", (
            f": round {got[1]} is the last round, and it is flushed, but only after its sample is "
            f"launched: a step can be processed only once it exists")
    elif got[0] == "flush":
        category, why = "flush_mid_run", (": a flush is only for the last round, when no next round is "
                                          "left to hide it under; the others are postprocessed")
    elif got[0] == "forward" and want == ("sample", got[1] - 1):
        category, why = "forward_before_sample", (
            f": round {got[1]}'s forward needs round {got[1] - 1}'s sampled token as its input (it stays on "
            f"the device, FROM_DEVICE), so round {got[1] - 1}'s sample is launched first, and the host "
            f"plans round {got[1]} only after that")
    elif got[0] in ("postprocess", "flush") and want[0] == "forward":
        category, why = "serial_order", (": a decode step is processed in the next round, after that "
                                         "round's forward is launched, not in its own")
    return fails(category, f"step {i + 1}: you wrote {got}, the engine did {want}{why}")
