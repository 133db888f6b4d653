"""Lesson 07's runs on the shared engines (``pool``): the labs' workloads, the engine's own runs a
learner's are compared with, and the learner's runs with the lab's plug-in in place
(``overlap_course.labs.plugins``).  Short runs: a check makes several, and CI times them."""

from __future__ import annotations

import functools

from overlap_course.labs import plugins
from toy_engine import loops
from toy_engine.races import RaceError
from toy_engine.record import Commit, Schedule

from . import pool

MAX_NEW = 12
STOPS = ((), (" the",))  # lab 1: a length limit alone, and a stop string too
ABORT_PROMPTS = [*pool.PROMPTS, "A little cat"]
# lab 2, (round, prompt) of each abort: waiting; in flight; the same again; just prefilled; finished by its stop
ABORTS = ((1, 4), (3, 1), (4, 1), (5, 3), (8, 0))
DEPTHS = (1, 2, 3)  # lab 3: rounds a loop keeps in flight
# lab 4: stops inside a run and across two, limits inside a run; EOS inside a run, a stop on the limit's token
COMMIT_RUNS = ((tuple(pool.PROMPTS), 30, (" was", ".")),
               (("nd they all lived happily ", " all lived happily eve", "One day, the little"), 28, (" the",)))


def flushes(engine) -> int:
    return sum(s.stage == "flush" for s in engine.timeline.lane("host"))


@functools.lru_cache(maxsize=2)
def own_run(stop: tuple):
    """Lab 1: the engine's own ZOS run of PROMPTS, (token ids, rounds, discarded outputs, flushes)."""
    engine = pool.engine()
    outs = engine.generate(pool.PROMPTS, max_new_tokens=MAX_NEW, stop=list(stop))
    return [c.token_ids for c in outs], engine.stats.rounds, engine.stats.discarded_outputs, flushes(engine)


class Runaway(Exception):
    """A policy kept scheduling far past the engine's own number of rounds."""


def policy_run(policy, stop: tuple, cap: int):
    """Lab 1: a ZOS run whose scheduler asks ``policy``; (its outputs or error, the policy's calls as
    (round, prompt, committed, in flight, finished, wanted)).  Past round ``cap`` it raises Runaway."""
    engine, calls = pool.engine(), []

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
        return engine.generate(pool.PROMPTS, max_new_tokens=MAX_NEW, stop=list(stop), on_round=on_round), calls
    except Exception as err:  # noqa: BLE001 - judged by the caller
        return err, calls


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


def abort_run(abort):
    """Lab 2: the abort workload with ``abort(engine, request_id)`` called per ABORTS; the completions."""
    return pool.engine().generate(ABORT_PROMPTS, max_new_tokens=MAX_NEW, stop=[" the"],
                                  on_round=plugins.aborts(abort, ABORTS))


@functools.lru_cache(maxsize=1)
def abort_reference():
    """Lab 2: the engine's own aborts: ((token ids, finish reason) per prompt, discarded outputs)."""
    outs = abort_run(lambda engine, request_id: engine.abort(request_id))
    return [(c.token_ids, c.finish_reason) for c in outs], pool.engine().stats.discarded_outputs


@functools.lru_cache(maxsize=1)
def ring_reference():
    """Lab 3: the serial loop's tokens on the ring engine."""
    outs = plugins.ring_engine().generate(pool.PROMPTS[:3], max_new_tokens=8, loop=loops.serial_loop)
    return [c.token_ids for c in outs]


def ring_run(depth: int, slots: int):
    """Lab 3: tokens of a loop holding ``depth`` rounds on a ring of ``slots``, or its RaceError."""
    with plugins.ring(slots):
        try:
            outs = plugins.ring_engine().generate(pool.PROMPTS[:3], max_new_tokens=8,
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
