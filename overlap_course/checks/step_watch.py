"""A learner's ``process_outputs`` plug-in (exercise 05) watched as the engine calls it: what it
did to each step (:class:`StepWatch`), and which engine functions an error came through.
"""

from __future__ import annotations

import inspect

from toy_engine.engine import Engine
from toy_engine.record import Commit, Free, Refused, Wait

from .pool_reading import pool_after, pool_before


class StepWatch:
    """Records what a learner's ``process_outputs`` did to each step it was given: which
    events it waited on, and each request's launched-round count and cache before/after."""

    def __init__(self, engine: Engine, process_outputs):
        self.engine, self.learner, self.calls = engine, process_outputs, []
        self.held: dict[int, int] = {}  # each KV block's last holder seen: names a block lost later

    def __call__(self, engine: Engine, step) -> None:
        reqs = tuple(step.plan.requests)  # a copy: the learner's code may change the plan's list
        call = dict(step=step, requests=reqs, waits=[],
                    before=[(r.num_inflight, r.finished) for r in reqs], after=None,
                    holders={b: r.index for r in engine.requests for b in r.blocks},
                    **pool_before(engine))
        self.held.update(call["holders"])
        self.calls.append(call)
        record, first = engine.record, len(engine.record.events)
        try:
            self.learner(engine, step)
        except BaseException:
            call["raised"] = True  # judged by the exception (the engine then recovers)
            raise
        finally:
            clock, events = engine.timeline.ns_to_ms, record.events[first:]
            call["waits"] = [(w.seq, clock(w.start_ns), clock(w.end_ns), w.round) for w in events
                             if isinstance(w, Wait)]
            call["commits"] = [c for c in events if isinstance(c, Commit)]
            call["frees"] = [f for f in events if isinstance(f, Free)]
            call["refused"] = [r for r in events if isinstance(r, Refused)]
            call["plan_changed"] = tuple(step.plan.requests) != reqs
            call["after"] = [(r.num_inflight, r.finished, bool(r.blocks),
                              r in engine.scheduler.running) for r in reqs]
            call.update(pool_after(engine))


def engine_frames(err: BaseException) -> set[str]:
    """Names of the engine's functions on ``err``'s traceback."""
    names, tb = set(), err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _ENGINE_FILE:
            names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


_ENGINE_FILE = inspect.getsourcefile(Engine)
