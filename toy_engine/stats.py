"""A run's headline numbers (``engine.stats``), computed from its timeline and counters."""

from __future__ import annotations

import statistics

from .runinfo import RunStats
from .timeline import Stage, Timeline


def run_stats(timeline: Timeline, counts: dict, prefill_rounds: set, wall_s: float,
              launch_latencies_ms: list[float]) -> RunStats:
    """``counts`` are the run's per-request tallies (tokens, request_decode_rounds,
    proposed, accepted, discarded); ``prefill_rounds`` which rounds were prefills."""
    rounds = sorted({s.round for s in timeline.spans if s.stage == Stage.FORWARD})
    decode_rounds = [r for r in rounds if r not in prefill_rounds]
    c = counts
    summary = {k: v for k, v in timeline.summary().items() if k != "wall_ms"}  # the loop's wall time, not the spans'
    return RunStats(
        **summary,
        wall_ms=wall_s * 1e3,
        tokens=c["tokens"],
        tokens_per_s=c["tokens"] / wall_s if wall_s > 0 else 0.0,
        prefill_rounds=len(rounds) - len(decode_rounds),
        decode_rounds=len(decode_rounds),
        decode_device_idle_fraction=timeline.device_idle_fraction(decode_rounds) if decode_rounds else 0.0,
        draft_tokens_proposed=c["proposed"],
        draft_tokens_accepted=c["accepted"],
        mean_accepted_per_round=c["accepted"] / c["request_decode_rounds"] if c["request_decode_rounds"] else 0.0,
        tokens_per_forward=c["tokens"] / len(rounds) if rounds else 0.0,
        discarded_outputs=c["discarded"],
        launch_latency_ms=statistics.median(launch_latencies_ms) if launch_latencies_ms else None,
    )
