"""A run's headline numbers (``engine.stats``), computed from its timeline and counters."""

import statistics

from .runinfo import RunStats
from .timeline import Stage, Timeline, union_ms


def run_stats(timeline: Timeline, counts: dict, prefill_rounds: set, wall_s: float,
              launch_latencies_ms: list[float]) -> RunStats:
    """From the run's per-request tallies (``counts``) and which rounds were prefills."""
    rounds = timeline.rounds()
    forwards = sorted({s.round for s in timeline.spans if s.stage == Stage.FORWARD})
    decode = [r for r in forwards if r not in prefill_rounds]

    def per_round(lane: str) -> float:  # the union of a round's work (waiting is not work), averaged
        work = (union_ms(s for s in timeline.spans if s.lane == lane and s.round == r and s.stage != Stage.WAIT)
                for r in rounds)
        return sum(work) / len(rounds) if rounds else 0.0

    c = counts
    return RunStats(
        rounds=len(rounds), wall_ms=wall_s * 1e3,
        device_busy_ms=timeline.device_busy_ms(), device_idle_fraction=timeline.device_idle_fraction(),
        mean_host_ms_per_round=per_round("host"), mean_device_ms_per_round=per_round("device"),
        tokens=c["tokens"], tokens_per_s=c["tokens"] / wall_s if wall_s > 0 else 0.0,
        prefill_rounds=len(forwards) - len(decode), decode_rounds=len(decode),
        decode_device_idle_fraction=timeline.device_idle_fraction(decode) if decode else 0.0,
        draft_tokens_proposed=c["proposed"], draft_tokens_accepted=c["accepted"],
        mean_accepted_per_round=c["accepted"] / c["request_decode_rounds"] if c["request_decode_rounds"] else 0.0,
        tokens_per_forward=c["tokens"] / len(forwards) if forwards else 0.0, discarded_outputs=c["discarded"],
        launch_latency_ms=statistics.median(launch_latencies_ms) if launch_latencies_ms else None,
    )
