"""Lesson 07's runs on the shared engines (``pool``): the labs' workloads (``lab_workloads``) run
as the engine's own runs a learner's are compared with, and as the learner's runs with the lab's
plug-in in place (``overlap_course.labs.plugins``).  Short runs: a check makes several, and CI
times them."""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

from overlap_course.labs import plugins
from toy_engine import loops
from toy_engine.config import MAX_SLOTS
from toy_engine.engine import Engine
from toy_engine.races import RaceError
from toy_engine.record import Commit, Free, Schedule, Wait

from . import endings, pool, run_edits
from .pool_reading import pool_after, pool_before
from .lab_workloads import (ABORT_RUNS, COMMIT_RUNS, POLICY_RUNS, RING_NEW, RING_PROMPTS,
                            RING_STOP, AbortRun, CommitRun, PolicyRun)



@dataclass(frozen=True)
class Ended:
    """How one request of a lab's reference run ended (``how``: one of ``endings.HOW``, read from
    the run by ``endings.run_endings``), with the tokens it kept: what a lab's messages say it
    should do."""

    how: str
    tokens: int

    def __str__(self) -> str:
        tokens = f"{self.tokens} token{'s' * (self.tokens != 1)}"  # round 40: "1 tokens"
        limit = f"on its limit, {tokens},"
        return {endings.EOS: f"on EOS after {tokens}",
                endings.STOP: f"on a stop string after {tokens}",
                endings.LIMIT_AT_ROUND_END: f"{limit} the last of a round's run",
                endings.LIMIT_IN_SPEC_STEP: f"{limit} inside a round's accepted run",
                endings.ABORT: f"by its abort, with {tokens}"}[self.how]


def ended(engine, completions) -> tuple[Ended, ...]:
    """How each request of ``engine``'s last run (``completions``) ended."""
    hows = {i: e.how for i, e in endings.run_endings(engine)}
    return tuple(Ended(hows.get(i, endings.ABORT), len(c.token_ids))
                 for i, c in enumerate(completions))


def who(prompts, i: int) -> str:
    """A prompt named by its index and its text, as a lab's messages name it."""
    return f"prompt {i} ({prompts[i]!r})" if 0 <= i < len(prompts) else f"prompt {i}"


def flushes(engine) -> int:
    return sum(s.stage == "flush" for s in engine.timeline.lane("host"))


def policy_engine(run: PolicyRun):
    """Lab 1: the pool's engine with the run's drafts, or the ring engine (more host slots) for a
    deeper loop."""
    if run.held >= 2:
        return pool.ring_engine()
    return pool.engine(num_draft_tokens=run.drafts) if run.drafts else pool.engine()


def _policy_generate(run: PolicyRun, on_round=None):
    loop = loops.serial_loop if run.held == 0 else None if run.held == 1 else plugins.keep_in_flight(run.held)
    if run.aborts:
        own_abort = plugins.aborts(lambda engine, request_id: engine.abort(request_id), run.aborts)
        on_round = _then(on_round, own_abort)
    with plugins.ring(max(2, run.held + 1)):
        return policy_engine(run).generate(list(run.prompts), max_new_tokens=run.max_new,
                                           stop=list(run.stop), on_round=on_round, loop=loop)


def _then(first, second):
    """An ``on_round`` calling ``first`` (if any), then ``second``."""
    def both(engine, round):
        if first is not None:
            first(engine, round)
        second(engine, round)
    return both


@dataclass(frozen=True)
class OwnRun:
    """Lab 1: the engine's own policy on a run: its tokens, rounds, discarded outputs, flushes, and
    how each request ended."""

    ids: list
    rounds: int
    discarded: int
    flushes: int
    endings: tuple


@functools.lru_cache(maxsize=len(POLICY_RUNS))
def own_run(run: PolicyRun) -> OwnRun:
    """Lab 1: the engine's own policy under ``run``."""
    engine = policy_engine(run)
    outs = _policy_generate(run)
    return OwnRun([c.token_ids for c in outs], engine.stats.rounds, engine.stats.discarded_outputs,
                  flushes(engine), ended(engine, outs))


@dataclass
class InProgress:
    """The learner's call a lab run is in, noted before each call: a check its time limit stops can
    then say where (before ``round``, for ``prompt``, which had ``tokens`` committed); and what a
    call raised (``raised``), so an error the engine raised after it returned is not put on it."""

    round: int | None = None
    prompt: int | None = None
    tokens: int = 0
    raised: BaseException | None = None

    def at(self, engine, req) -> None:
        self.round, self.prompt = engine.scheduler.round, req.index
        self.tokens = len(req.output_ids)


class Runaway(Exception):
    """A run kept scheduling far past the engine's own number of rounds (``args``: the round)."""


class CommitSlip(Exception):
    """A commit left what no commit of its run can (``run_edits.commit_slip``: ``args`` are the
    category and the words); the run stops there, before it reads what no round wrote."""


def capped(on_round, cap: int):
    """``on_round`` that raises Runaway past round ``cap``: a run whose requests never end is a
    verdict, not a hang."""
    def bounded(engine, round):
        if round > cap:
            raise Runaway(round)
        if on_round is not None:
            on_round(engine, round)
    return bounded


def policy_run(policy, run: PolicyRun, cap: int, now: InProgress | None = None,
               edits: list | None = None):
    """Lab 1: ``run`` with the scheduler asking ``policy``: (the engine, its outputs or error, the
    policy's calls as (round, prompt, committed, in flight, finished, wanted)).  Past round ``cap``
    it raises Runaway; each call is noted in ``now`` first, and each change it made to the
    request in ``edits`` (the round, in words)."""
    engine, calls, now = policy_engine(run), [], now or InProgress()
    edits = [] if edits is None else edits

    def spy(req):
        now.at(engine, req)
        before = run_edits.snapshot(req)
        wanted = policy(req)
        edit = run_edits.edit_of(req, before, "your policy")
        if edit:
            edits.append((engine.scheduler.round, edit))
        calls.append((engine.scheduler.round, req.index, len(req.output_ids), req.num_inflight, req.finished,
                      bool(wanted)))
        return wanted
    # per_request's messages name the learner's function (its own name read only from a function)
    spy.__name__ = policy.__name__ if type(policy) is types.FunctionType else "wants_more"

    try:
        outs = _policy_generate(run, capped(plugins.per_request(wants_more=spy), cap))
        return engine, outs, calls
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
    not, the device waits the call made (``waits``), the other prompts it aborted (``others``), and
    whether it left the request as it was (``untouched``: unfinished, in the same queue; None for a
    request finished before the call), whether it took it out of every queue unfinished
    (``unmarked``: read right after the call; the run's end would mark it "abort" later), the
    request's fields it changed (``changed``: it found the request, whatever it left), the
    request's KV blocks it gave back itself (``freed``: the frees the race checker heard), and
    the pool before and after it (``pool``: what ``lifetime_runs.pool_mistake`` judges)."""

    round: int
    prompt: int
    waiting: bool
    waits: int = 0
    others: tuple = ()
    untouched: bool | None = None
    unmarked: bool = False
    changed: tuple = ()
    freed: tuple = ()
    pool: dict | None = None


def _fields(req) -> dict:
    """A request's fields as they are now (its lists copied: an abort may change them in place);
    none for a learner's object in ``engine.requests`` that has no ``__dict__``."""
    try:
        fields = dict(vars(req))
    except TypeError:
        return {}
    return {k: v[:] if type(v) is list else v for k, v in fields.items()}


def _changed(before: dict, req) -> tuple:
    """The names of the request's fields that differ from ``before``: plain values by value, a
    learner's object by identity (its own ``__eq__`` never runs in the check)."""
    def same(a, b):
        if type(a) is list and type(b) is list:
            return len(a) == len(b) and all(map(same, a, b))
        return a is b or type(a) is type(b) and type(a) in (int, float, str) and a == b
    return tuple(k for k, v in _fields(req).items() if k not in before or not same(before[k], v))


def _freed(events, claims: dict, prompt: int) -> tuple:
    """The KV blocks ``prompt`` held (``claims``: block -> prompt) that ``events`` gave back."""
    return tuple(b for e in events if isinstance(e, Free) and not e.refused
                 for b in e.blocks if isinstance(b, int) and claims.get(b) == prompt)


def abort_engine(run: AbortRun):
    return pool.engine(num_draft_tokens=run.drafts) if run.drafts else pool.engine()


def abort_run(abort, run: AbortRun, calls: list | None = None, cap: int | None = None,
              now: InProgress | None = None):
    """Lab 2: ``run`` with ``abort(engine, request_id)`` called per its aborts; the completions.
    Each call is noted in ``calls`` (AbortCall) and, before it is made, in ``now``; past round
    ``cap`` it raises Runaway."""
    calls, now = [] if calls is None else calls, now or InProgress()

    def watched(engine, request_id):
        req = next((r for r in engine.requests if r.id == request_id), None)
        if req is None:  # the learner's code emptied `engine.requests`: compare() says so
            return abort(engine, request_id)
        events = engine.record.events
        call, before = AbortCall(engine.scheduler.round, req.index, req in engine.scheduler.waiting), len(events)
        calls.append(call)
        unfinished = [r for r in engine.requests if r is not req and not r.finished]
        queued = (req.finished, req in engine.scheduler.waiting, req in engine.scheduler.running)
        now.at(engine, req)
        call.pool, fields = pool_before(engine), _fields(req)
        abort(engine, request_id)
        call.pool.update(pool_after(engine))
        call.changed = _changed(fields, req)
        call.waits = sum(isinstance(e, Wait) for e in events[before:])
        call.freed = _freed(events[before:], call.pool["claims"][0], req.index)
        call.others = tuple(r.index for r in unfinished if r.finish_reason == "abort")
        if not queued[0]:
            after = (req.finished, req in engine.scheduler.waiting, req in engine.scheduler.running)
            call.untouched = queued == after
            call.unmarked = after == (False, False, False)
    on_round = plugins.aborts(watched, run.aborts)
    if cap is not None:
        on_round = capped(on_round, cap)
    return abort_engine(run).generate(list(run.prompts), max_new_tokens=run.max_new,
                                      stop=list(run.stop), on_round=on_round)


def admitted_after(events, prompt: int, round: int) -> bool:
    """Lab 2: whether a round from ``round`` on committed tokens to ``prompt`` (it was admitted)."""
    return any(isinstance(e, Commit) and e.round >= round and prompt in e.prompts for e in events)


@dataclass(frozen=True)
class AbortReference:
    """Lab 2: the engine's own aborts on a run: (token ids, finish reason) per prompt, discarded
    outputs, rounds, and how each request ended."""

    outs: list
    discarded: int
    rounds: int
    endings: tuple


@functools.lru_cache(maxsize=len(ABORT_RUNS))
def abort_reference(index: int) -> AbortReference:
    """Lab 2: the engine's own ``Engine.abort`` on ABORT_RUNS[index]."""
    run = ABORT_RUNS[index]
    engine = abort_engine(run)
    outs = abort_run(lambda engine, request_id: engine.abort(request_id), run)
    return AbortReference([(c.token_ids, c.finish_reason) for c in outs],
                          engine.stats.discarded_outputs, engine.stats.rounds, ended(engine, outs))


def lost_blocks(engine) -> list[int]:
    """The KV blocks a run ended without: in the pool nowhere (a block there twice is judged per
    call, by ``lifetime_runs.pool_mistake``)."""
    return sorted(set(range(engine.config.num_kv_blocks)) - set(engine.scheduler.blocks.free_ids))


def ring_engine(drafts: int = 0) -> Engine:
    return pool.ring_engine(num_draft_tokens=pool.DRAFTS) if drafts else pool.ring_engine()


def _ring_generate(depth: int, drafts: int = 0, on_round=None, loop=None):
    """Lab 3's prompts under a loop holding ``depth`` rounds: with drafts only the ZOS loop (one
    round held), whose correction covers the drafts; ``plugins.keep_in_flight`` runs it with one
    round held and refuses drafts deeper."""
    if loop is None and not drafts:
        loop = plugins.keep_in_flight(depth)
    return ring_engine(drafts).generate(list(RING_PROMPTS), max_new_tokens=RING_NEW,
                                        stop=list(RING_STOP), on_round=on_round, loop=loop)


@functools.lru_cache(maxsize=1)
def ring_reference():
    """Lab 3: the serial loop's tokens on the ring engine."""
    return [c.token_ids for c in _ring_generate(1, loop=loops.serial_loop)]


@functools.lru_cache(maxsize=4 * MAX_SLOTS)
def ring_run(depth: int, slots: int, drafts: int = 0):
    """Lab 3: tokens of a loop holding ``depth`` rounds on a ring of ``slots``, or its RaceError.
    Kept per (depth, slots, drafts): no learner code runs in it, and the race checker ignores the
    clock."""
    with plugins.ring(slots):
        try:
            outs = _ring_generate(depth, drafts)
        except RaceError as err:
            return err
    return [c.token_ids for c in outs]


def spec_engine():
    return pool.engine(num_draft_tokens=pool.DRAFTS)


def commit_engine(run: CommitRun):
    return pool.engine(num_draft_tokens=run.drafts) if run.drafts else pool.engine()


def commit_run(index: int, commit=None, loop=None, cap: int | None = None,
               now: InProgress | None = None, edits: list | None = None):
    """Lab 4: COMMIT_RUNS[index] under ZOS (or ``loop``), with ``commit`` for each request's own,
    each call noted in ``now`` first, and each setting of the request it changed in ``edits``;
    past round ``cap`` it raises Runaway."""
    run, on_round, now = COMMIT_RUNS[index], None, now or InProgress()
    engine, edits = commit_engine(run), [] if edits is None else edits

    def noted(req, tokens, eos_id, decode):
        now.at(engine, req)
        before, given = run_edits.snapshot(req), list(tokens)
        try:
            answer = commit(req, tokens, eos_id, decode)
        except BaseException as err:
            now.raised = err
            raise
        finally:
            edit = run_edits.edit_of(req, before, "your commit", state=False)
            if edit:
                edits.append(edit)
        slip = run_edits.commit_slip(req, before, given, eos_id, decode)
        if slip is not None:
            raise CommitSlip(*slip)
        return answer
    if commit is not None:
        on_round = plugins.per_request(commit=noted)
    if cap is not None:
        on_round = capped(on_round, cap)
    return engine.generate(list(run.prompts), max_new_tokens=run.max_new, stop=list(run.stop),
                                       on_round=on_round, loop=loop)


@functools.lru_cache(maxsize=len(COMMIT_RUNS))
def commit_reference(index: int):
    """Lab 4: the serial run's (token ids, text, finish reason) per prompt."""
    return [(c.token_ids, c.text, c.finish_reason) for c in commit_run(index, loop=loops.serial_loop)]


@functools.lru_cache(maxsize=len(COMMIT_RUNS))
def commit_endings(index: int) -> tuple[tuple[Ended, ...], int]:
    """Lab 4: how each request of the ZOS run ends with the engine's own commit, and its rounds."""
    engine = commit_engine(COMMIT_RUNS[index])
    outs = commit_run(index)
    return ended(engine, outs), engine.stats.rounds
