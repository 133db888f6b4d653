"""Exercise 03's runs after its first (title-case) one: each is judged on its own log, by the
same rules (round 36: a loop that waited on a forward, or misused flush, only with drafts or
only in the endings runs passed), and its label names the run in a verdict."""

from __future__ import annotations

from . import pool
from .host_order import correction_mistake, waits_beyond_sample, zos_overlapped
from .learner_code import loop_verdict, run_loop
from .run_edits import run_verdict, same_run
from .verdict import Verdict, fails

SPEC = f"with speculative decoding ({pool.DRAFTS} drafts per round)"


def endings_run(loop, drafts: int) -> tuple[Verdict | None, object]:
    """The learner's loop on the endings run; what went wrong, or None; and the run's log."""
    engine, log, outs, err = run_loop(loop, endings=True, **pool.drafted(drafts))
    verdict = loop_verdict(log, err, "zos", zos_overlapped)
    if verdict is None:
        verdict = waits_beyond_sample(engine, log)
    if verdict is not None:
        return verdict, log
    reference = [c.token_ids for c in pool.endings_reference()]
    verdict = run_verdict(log, outs, reference)
    if verdict is not None:
        return verdict, log
    diff = pool.compare([c.token_ids for c in outs], reference)
    if diff:
        why = correction_mistake(engine, log) if drafts else ""
        return fails("correction" if why else "wrong_tokens",
                     f"{diff}: {why or 'process every step exactly once, in round order'}"), log
    why = same_run(log, outs, pool.serial_run(endings=True), rounds=False)
    return (fails("edits_run", why) if why else None), log
