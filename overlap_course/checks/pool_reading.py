"""What the scheduler's pool holds around a learner's call (a process_outputs, an abort), read
whatever code changed it: ``free`` is heard by the race checker, a learner's own writes to
``free_ids`` and ``free_rows`` are not, so the checks compare the pool itself before and after
(``lifetime_runs.pool_mistake``)."""

from __future__ import annotations

from toy_engine.engine import Engine


def pool_before(engine: Engine) -> dict:
    """What ``lifetime_runs.pool_mistake`` reads before a learner's call (a process_outputs, an
    abort): the pool, who claims which block and row, and the pool's sizes."""
    return dict(pool=pool_of(engine), claims=claims_of(engine),
                sizes=(engine.config.num_kv_blocks, engine.config.max_batch_size))


def pool_after(engine: Engine) -> dict:
    """What ``lifetime_runs.pool_mistake`` reads after that call: the pool and claims, the
    launches not yet waited for, and each request's (num_inflight, finished, row)."""
    return dict(pool_after=pool_of(engine), claims_after=claims_of(engine),
                outstanding=engine.record.outstanding(),
                states={r.index: (r.num_inflight, r.finished, r.row) for r in engine._run.requests})


def pool_of(engine: Engine) -> tuple | None:
    """The scheduler's free KV blocks and free batch rows, read whatever code changed them
    (``free``, or a learner's own writes to ``free_ids`` and ``free_rows``, which the race
    checker never hears of); None where a learner's junk stands in their place."""
    try:
        scheduler = engine.scheduler
        return tuple(scheduler.blocks.free_ids), tuple(scheduler.free_rows)
    except Exception:  # noqa: BLE001 - judged by the run's exception, then healed
        return None


def claims_of(engine: Engine) -> tuple[dict, dict]:
    """What the run's requests claim now: block -> prompt (``req.blocks``), row -> prompt."""
    blocks, rows = {}, {}
    for req in engine._run.requests:  # the run's own list: a learner may change the visible one
        try:
            blocks.update((b, req.index) for b in req.blocks if isinstance(b, int))
            if isinstance(req.row, int) and req.row >= 0:
                rows[req.row] = req.index
        except TypeError:  # a learner's junk in place of a list: the run judges it
            pass
    return blocks, rows
