"""Lesson 07's runs on the shared engines (``pool``): the labs' workloads, the engine's own runs a
learner's are compared with, and the learner's runs with the lab's plug-in in place
(``overlap_course.labs.plugins``).  Short runs: a check makes several, and CI times them."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from overlap_course.labs import plugins
from toy_engine import loops
from toy_engine.config import MAX_SLOTS
from toy_engine.races import RaceError
from toy_engine.record import Commit, Schedule, Wait

from . import pool


@dataclass(frozen=True)
class PolicyRun:
    """Lab 1: one run a policy is judged on.  ``held``: the rounds its loop keeps in flight (0 the
    serial loop, 1 ZOS, more ``plugins.keep_in_flight`` on a ring one slot larger)."""

    max_new: int
    stop: tuple = ()
    held: int = 1

    def __str__(self) -> str:
        loop = {0: "the serial loop", 1: "ZOS"}.get(self.held, f"a loop holding {self.held} rounds")
        return f"{loop}, limit {self.max_new}" + (f", stop strings {list(self.stop)}" if self.stop else "")


# lab 1: the notebook's run, a stop string, a limit reached right after the prefill, a larger limit
# under the serial loop, three rounds in flight: a policy that assumes one (or caps them at two) fails another
POLICY_RUNS = (PolicyRun(12), PolicyRun(12, (" the",)), PolicyRun(2), PolicyRun(15, held=0), PolicyRun(12, held=3))
ABORT_PROMPTS, MAX_NEW = [*pool.PROMPTS, "A little cat"], 12
# lab 2, (round, prompt) of each abort: waiting; in flight; the same again; just prefilled; finished by its stop
ABORTS = ((1, 4), (3, 1), (4, 1), (5, 3), (8, 0))
DEPTHS = (1, 2, 3)  # lab 3: rounds a loop keeps in flight, and one more drawn per check (deeper_depth)
RING_NEW = MAX_SLOTS + 1  # a loop holding MAX_SLOTS - 1 rounds reaches round MAX_SLOTS, where a ring that size races
# lab 4: stops inside a run and across two, limits inside a run; EOS inside a run, a stop on the limit's token
COMMIT_RUNS = ((tuple(pool.PROMPTS), 30, (" was", ".")),
               (("nd they all lived happily ", " all lived happily eve", "One day, the little"), 28, (" the",)))


def flushes(engine) -> int:
    return sum(s.stage == "flush" for s in engine.timeline.lane("host"))


def policy_engine(run: PolicyRun):
    """Lab 1: the pool's plain engine, or the ring engine (more host slots) for a deeper loop."""
    return pool.engine() if run.held < 2 else plugins.ring_engine()


def _policy_generate(run: PolicyRun, on_round=None):
    loop = loops.serial_loop if run.held == 0 else None if run.held == 1 else plugins.keep_in_flight(run.held)
    with plugins.ring(max(2, run.held + 1)):
        return policy_engine(run).generate(pool.PROMPTS, max_new_tokens=run.max_new, stop=list(run.stop),
                                           on_round=on_round, loop=loop)


@functools.lru_cache(maxsize=len(POLICY_RUNS))
def own_run(run: PolicyRun):
    """Lab 1: the engine's own policy under ``run``: (token ids, rounds, discarded outputs, flushes)."""
    outs, engine = _policy_generate(run), policy_engine(run)
    return [c.token_ids for c in outs], engine.stats.rounds, engine.stats.discarded_outputs, flushes(engine)


class Runaway(Exception):
    """A policy kept scheduling far past the engine's own number of rounds."""


def policy_run(policy, run: PolicyRun, cap: int):
    """Lab 1: ``run`` with the scheduler asking ``policy``: (the engine, its outputs or error, the
    policy's calls as (round, prompt, committed, in flight, finished, wanted)).  Past round ``cap``
    it raises Runaway."""
    engine, calls = policy_engine(run), []

    def spy(req):
        wanted = policy(req)
        calls.append((engine.scheduler.round, req.index, len(req.output_ids), req.num_inflight, req.finished,
                      bool(wanted)))
        return wanted

    install = plugins.per_request(wants_more=spy)

    def on_round(engine, round):
        if round > cap:
            raise Runaway(round)
        install(engine, round)
    try:
        return engine, _policy_generate(run, on_round), calls
    except Exception as err:  # noqa: BLE001 - judged by the caller
        return engine, err, calls


def at_last_schedule(events, prompt: int) -> tuple[int, int, int]:
    """Lab 1: (round, tokens committed, rounds in flight) of ``prompt`` when its last round was
    scheduled, from a run's record (no drafts: each processed round commits one token)."""
    rounds = _prompt_rounds(events, prompt)
    last = max(rounds)
    at = next(i for i, e in enumerate(events) if isinstance(e, Schedule) and e.round == last)
    done = set(_prompt_rounds(events[:at], prompt))
    return last, len(done), len(set(rounds) - done - {last})


def _prompt_rounds(events, prompt: int) -> list[int]:
    return [e.round for e in events if isinstance(e, Commit) and not e.refused and prompt in e.prompts]


@dataclass
class AbortCall:
    """Lab 2: one call of an abort: before ``round`` was scheduled, to ``prompt``, ``waiting`` then or
    not, and the device waits the call made (``waits``)."""

    round: int
    prompt: int
    waiting: bool
    waits: int = 0


def abort_run(abort, calls: list | None = None):
    """Lab 2: the abort workload with ``abort(engine, request_id)`` called per ABORTS; the completions.
    Each call is noted in ``calls`` (AbortCall)."""
    calls = [] if calls is None else calls

    def watched(engine, request_id):
        req = next((r for r in engine.requests if r.id == request_id), None)
        if req is None:  # the learner's code emptied `engine.requests`: compare() says so
            return abort(engine, request_id)
        events = engine.record.events
        call, before = AbortCall(engine.scheduler.round, req.index, req in engine.scheduler.waiting), len(events)
        calls.append(call)
        abort(engine, request_id)
        call.waits = sum(isinstance(e, Wait) for e in events[before:])
    return pool.engine().generate(ABORT_PROMPTS, max_new_tokens=MAX_NEW, stop=[" the"],
                                  on_round=plugins.aborts(watched, ABORTS))


def admitted_after(events, prompt: int, round: int) -> bool:
    """Lab 2: whether a round from ``round`` on committed tokens to ``prompt`` (it was admitted)."""
    return any(isinstance(e, Commit) and e.round >= round and prompt in e.prompts for e in events)


@functools.lru_cache(maxsize=1)
def abort_reference():
    """Lab 2: the engine's own aborts: ((token ids, finish reason) per prompt, discarded outputs)."""
    outs = abort_run(lambda engine, request_id: engine.abort(request_id))
    return [(c.token_ids, c.finish_reason) for c in outs], pool.engine().stats.discarded_outputs


def lost_blocks(engine) -> int:
    return engine.config.num_kv_blocks - len(engine.scheduler.blocks.free_ids)


def recover(engine) -> str:
    """Put a check's shared engine back whole when its run lost KV blocks, and say so: the next check
    then starts whole, with nothing to report."""
    lost = lost_blocks(engine)
    if not lost:
        return ""
    pool.heal()
    return (f" (This run left the check's engine with {lost} KV block(s) out of its pool: the check replaced it "
            f"with a fresh engine, so later checks start whole.)")


def deeper_depth() -> int:
    """Lab 3: a depth past DEPTHS, drawn per check, so that only a rule for every depth passes."""
    return random.SystemRandom().randint(DEPTHS[-1] + 1, MAX_SLOTS - 1)  # a seed set in a cell cannot fix it


@functools.lru_cache(maxsize=1)
def ring_reference():
    """Lab 3: the serial loop's tokens on the ring engine."""
    outs = plugins.ring_engine().generate(pool.PROMPTS[:3], max_new_tokens=RING_NEW, loop=loops.serial_loop)
    return [c.token_ids for c in outs]


@functools.lru_cache(maxsize=4 * MAX_SLOTS)
def ring_run(depth: int, slots: int):
    """Lab 3: tokens of a loop holding ``depth`` rounds on a ring of ``slots``, or its RaceError.
    Kept per (depth, slots): no learner code runs in it, and the race checker ignores the clock."""
    with plugins.ring(slots):
        try:
            outs = plugins.ring_engine().generate(pool.PROMPTS[:3], max_new_tokens=RING_NEW,
                                                  loop=plugins.keep_in_flight(depth))
        except RaceError as err:
            return err
    return [c.token_ids for c in outs]


def spec_engine():
    return pool.engine(num_draft_tokens=pool.DRAFTS)


def commit_run(index: int, commit=None, loop=None):
    """Lab 4: COMMIT_RUNS[index] on ZOS + speculation, with ``commit`` for each request's own."""
    prompts, max_new, stop = COMMIT_RUNS[index]
    on_round = plugins.per_request(commit=commit) if commit else None
    return spec_engine().generate(list(prompts), max_new_tokens=max_new, stop=list(stop), on_round=on_round,
                                  loop=loop)


@functools.lru_cache(maxsize=2)
def commit_reference(index: int):
    """Lab 4: the serial run's (token ids, text, finish reason) per prompt."""
    return [(c.token_ids, c.text, c.finish_reason) for c in commit_run(index, loop=loops.serial_loop)]
