"""Lesson 07 (notebook 07_bugs_that_shipped, optional): overlap bugs that real engines shipped,
brought back through the toy's plug-in points (``overlap_course.labs``).  A lab's prediction is
judged against the buggy run itself; the learner's fix runs on the shared engines, race checker
on, and is judged by what the run did: its tokens against the engine's own serial outputs, its
discarded rounds and flushes, the frees and race reports of its record.
"""

from __future__ import annotations

from collections import Counter

from overlap_course.labs import plugins
from toy_engine.races import RaceError
from toy_engine.run import EngineStalled

from . import lab_mistakes as mistakes
from . import lab_runs as runs
from . import context, pool, ring_sizes, sandbox
from .answers import int_set, items, show, whole
from .errors import checkers, engines, quoted
from .harness import exercise_check, notebook_check
from .lab_workloads import DEPTHS
from .verdict import (Verdict, fails, negative_count, no_such_round, not_implemented, passes,
                      unanswered)

__all__ = ["check_wasted_round", "check_wants_more", "check_abort_in_flight", "check_abort", "check_ring_race",
           "check_ring_slots", "check_overshoot", "check_commit"]


def _pair(answer, name: str, what: str, read) -> tuple | Verdict:
    """The answer ``name``: two items, each read by ``read`` (None when it cannot be)."""
    if answer is None:
        return unanswered(f"set `{name}` to {what}")
    if isinstance(answer, (str, bytes, set, frozenset, dict)):
        return fails("shape", f"write {what}, not {show(answer)}")
    got = items(answer, what)
    if isinstance(got, Verdict):
        return got
    pair = tuple(read(x) for x in got)
    if len(pair) != 2 or any(x is None for x in pair):
        return fails("shape", f"write {what}, not {show(answer)}")
    return pair


# ------------------------------------------------------------------ lab 1: the extra step

@notebook_check
def check_wasted_round(answer, engine, prompt: int = 0) -> Verdict:
    """Predict (07, lab 1): when the shipped policy scheduled ``prompt``'s last round in ``engine``'s
    last run, how many tokens had it committed, and how many of its rounds were in flight?"""
    got = _pair(answer, "wasted_at", "a pair (tokens committed, rounds in flight), e.g. (5, 2)", whole)
    if isinstance(got, Verdict):
        return got
    try:
        out, wasted, rounds = engine.completions[prompt], engine.stats.discarded_outputs, engine.stats.rounds
        last, committed, in_flight = runs.at_last_schedule(engine.record.events, prompt)
        plain = not engine.config.num_draft_tokens
    except (AttributeError, IndexError, TypeError, ValueError, StopIteration):
        return fails("setup", "pass the engine whose last run used the shipped policy (run the cell above first)")
    if not (wasted and plain and out.finish_reason == "length"):
        return fails("setup", "this engine's last run discarded nothing: pass the ZOS engine right after its run "
                              "with the shipped `wants_more`, no drafts")
    want = (committed, in_flight)
    if got == want:
        return passes(f"{want}: when round {last} was planned, prompt {prompt} held {committed} of its "
                      f"{len(out.token_ids)} tokens and round {last - 1}, in flight, was about to bring the last "
                      f"one. The shipped policy counts only committed tokens, so round {last} went in for "
                      f"nothing: {wasted} outputs discarded, {rounds} rounds")
    look = (f"count prompt {prompt}'s rounds in the record: those processed before round {last} was planned "
            f"(each committed its token), and those launched and not yet processed")
    if got[1] == 0:
        return fails("misses_in_flight", f"under ZOS a round is planned before the previous round's results reach "
                                         f"the host: {look}")
    if got[0] >= len(out.token_ids):
        return fails("already_processed", f"prompt {prompt} had not committed all its {len(out.token_ids)} tokens "
                                          f"when round {last} was planned: {look}")
    return fails("wrong", f"{got} is not it: {look}")


def _warm_policy_runs() -> None:
    pool.start({}, {"num_draft_tokens": pool.DRAFTS})
    for run in runs.POLICY_RUNS:
        runs.own_run(run)


@exercise_check(pool.ring_engine, _warm_policy_runs, calls="wants_more(req)")
def check_wants_more(wants_more) -> Verdict:
    """Lab 1's fix: ``wants_more(req)``, asked by the scheduler before each round, on runs that
    differ in limit, stop strings, stories that end, an abort, drafts and rounds in flight
    (runs.POLICY_RUNS), against the engine's own policy: no round may go in for a request the
    rounds in flight already finish, and none may be missing."""
    for run in runs.POLICY_RUNS:
        own, now, edits = runs.own_run(run), runs.InProgress(), []
        try:
            verdict = _policy_verdict(wants_more, run, own, now, edits)
        except sandbox.TimeUp as up:
            verdict = mistakes.timed_out(up, "wants_more", run, now, own.endings)
        if verdict is not None and edits:  # what went wrong came from the policy's edit
            msg = (f"{run}: before round {edits[0][0]}, {edits[0][1]}: `wants_more` only says "
                   f"whether the scheduler plans another round for the request; it must not "
                   f"change it (the engine's commit adds its tokens and ends it)")
            return fails("edits_requests", msg)
        if verdict is not None:
            return verdict
    runs_made = "; ".join(run.setting for run in runs.POLICY_RUNS)
    return passes(f"no round went in for a request the rounds in flight already finish, and none "
                  f"was missing: the engine's own rounds and discarded outputs (a stop, an EOS or "
                  f"a draft's acceptance is known only once processed), and the same tokens, in "
                  f"all {len(runs.POLICY_RUNS)} runs ({runs_made})")


def _policy_verdict(wants_more, run, own, now, edits: list) -> Verdict | None:
    """Lab 1: the policy on one run against the engine's own (``own``): a mistake, or None."""
    engine, got, calls = runs.policy_run(wants_more, run, 3 * own.rounds, now, edits)
    if isinstance(got, Exception):
        return mistakes.policy_error(got, calls, run, own, engine)
    if [c.token_ids for c in got] != own.ids:
        differ = pool.compare([c.token_ids for c in got], own.ids)
        return fails("wrong_tokens", f"{run}: {differ}")
    if engine.stats.discarded_outputs > own.discarded:
        return mistakes.extra_step(calls, engine, own, run)
    if runs.flushes(engine) > own.flushes:
        msg = (f"{run}: your policy declined rounds the engine's own plans, so the loop "
               f"ran out of rounds to launch and waited for the device: "
               f"{runs.flushes(engine)} flushes instead of {own.flushes}, the overlap lost "
               f"there. Count the rounds in flight instead of waiting for them")
        return fails("serializes", msg)
    return None


# ------------------------------------------------------------------ lab 2: an abort in flight

def _round_set(x):
    return set() if isinstance(x, dict) and not x else int_set(x)


@notebook_check
def check_abort_in_flight(answer, err) -> Verdict:
    """Predict (07, lab 2): which rounds holding the aborted prompt were launched and not processed
    when the abort came, (under ZOS, under serial)?  ``err``: the shipped abort's RaceError."""
    got = _pair(answer, "in_flight", "a pair of sets of round numbers (under ZOS, under serial), e.g. ({2}, {3})",
                _round_set)
    if isinstance(got, Verdict):
        return got
    if min(got[0] | got[1], default=0) < 0:
        return no_such_round(min(got[0] | got[1]))
    if not engines(err, RaceError) or err.kind != "free_in_use":
        return fails("setup", "pass the RaceError of the ZOS run with the shipped abort (the cell above)")
    zos, serial = got
    if (zos, serial) == ({err.round}, set()):
        return passes(f"({{{err.round}}}, set()): under ZOS round {err.round} is processed only in round "
                      f"{err.round + 1}'s pass, after round {err.round + 1}'s forward is launched, so when the abort "
                      f"arrives round {err.round}'s forward may still write the prompt's KV blocks; the serial loop "
                      f"processes each round before the next schedule: nothing is in flight, a free is safe there")
    if serial:
        return fails("serial_discards_nothing", "the serial loop waits for and processes every round before it "
                                                "schedules the next: at an abort nothing is in flight")
    if zos and max(zos) > err.round:
        return fails("not_launched_yet", f"round {max(zos)} was not launched yet: the abort came just before "
                                         f"round {err.round + 1} was scheduled")
    look = f"which rounds holding prompt {err.prompt} had been launched, and which of them processed, by then?"
    if err.round not in zos:
        return fails("misses_in_flight", f"under ZOS a round's results are processed after the next round is "
                                         f"launched: {look}")
    return fails("already_processed", f"round {min(zos)} was processed already (in round {min(zos) + 1}'s pass): "
                                      f"{look}")


def _warm_abort_runs() -> None:
    pool.start({}, {"num_draft_tokens": pool.DRAFTS})
    for i in range(len(runs.ABORT_RUNS)):
        runs.abort_reference(i)


@exercise_check(_warm_abort_runs, calls="abort(engine, request_id)")
def check_abort(abort) -> Verdict:
    """Lab 2's fix: ``abort(engine, request_id)`` before chosen rounds of ZOS runs with and without
    drafts (a waiting request, one in flight, the same again, one just prefilled, ones finished by
    a stop, EOS or the limit), against the engine's own ``Engine.abort``, and each call watched:
    whether it waited for the device."""
    for index, run in enumerate(runs.ABORT_RUNS):
        verdict = _abort_verdict(abort, index, run)
        pool.whole_again(runs.abort_engine(run))
        if verdict is not None:
            return verdict
    return passes("each aborted request stopped at once and kept what it had; its cache went back "
                  "when no launched round could touch it, once; a waiting one never started, and a "
                  "finished one kept its reason (a stop, EOS or the limit), with drafts and "
                  "without")


def _abort_verdict(abort, index: int, run) -> Verdict | None:
    """Lab 2: one run's verdict, or None when it shows no mistake."""
    engine, ref = runs.abort_engine(run), runs.abort_reference(index)
    calls, now = [], runs.InProgress()
    try:
        outs, err = runs.abort_run(abort, run, calls, 3 * ref.rounds, now), None
    except sandbox.TimeUp as up:
        return mistakes.timed_out(up, "abort", run, now, ref.endings)
    except NotImplementedError:
        return not_implemented("`abort`")
    except Exception as exc:  # noqa: BLE001 - judged below
        outs, err = None, exc
    verdict = mistakes.freed_wrongly(engine.record, run)
    if verdict is None:
        verdict = mistakes.pool_misused(calls, run)
    if verdict is None:
        verdict = mistakes.aborted_another(calls, run)
    if verdict is None:
        verdict = mistakes.left_unmarked(calls, run)
    if verdict is None:
        verdict = mistakes.waited(calls, run)
    if verdict is None and err is not None:
        verdict = mistakes.abort_error(err, run, ref, engine, calls)
    if verdict is None:
        got = [(c.token_ids, c.finish_reason) for c in outs]
        verdict = mistakes.abort_outcome(got, ref, engine, calls, run)
    return verdict


# ------------------------------------------------------------------ lab 3: the ring of host slots

@notebook_check
def check_ring_race(answer, err, ring: int) -> Verdict:
    """Predict (07, lab 3): with a ring of ``ring`` slots too small for the loop's depth, which round's
    upload does the race report name, and the prepare of which round collides with it?"""
    got = _pair(answer, "race_at", "a pair (the round the report names, the round being prepared), e.g. (2, 5)",
                whole)
    if isinstance(got, Verdict):
        return got
    if not engines(err, RaceError) or err.kind != "buffer":
        return fails("setup", "pass the RaceError of the run above (a ring too small for its depth)")
    want = (err.round, err.round + ring)
    if got == want:
        return passes(f"{want}: round {want[1]} writes slot {want[1]} % {ring} = {want[1] % ring}, the slot of "
                      f"round {want[0]}, whose step the loop still holds: its upload was never waited for. "
                      f"The checker: {err}")
    named, prepared = got
    if min(got) < 0:
        return no_such_round(min(got))
    if prepared <= named:
        return fails("order", f"the round being prepared comes after the round whose upload the report names: "
                              f"write (that earlier round, the round being prepared)")
    if (prepared - named) % ring:
        return fails("wrong_slot", f"round {prepared} writes slot {prepared % ring}, round {named} slot "
                                   f"{named % ring}: no collision there. Which slot does each round write, and "
                                   f"which rounds does the loop still hold when it prepares the next?")
    if named < want[0]:
        return fails("earlier_round", f"round {named}'s upload was no longer held when round {prepared} was "
                                      f"prepared (a prefill round is processed at once): the report names a round "
                                      f"whose step the loop still held")
    return fails("not_launched_yet", f"rounds {named} and {prepared} do share a slot, but an earlier pair collides "
                                     f"first, and the run stops at its first race")


def _warm_ring_runs() -> None:
    runs.ring_reference()
    runs.ring_engine(pool.DRAFTS)


@exercise_check(_warm_ring_runs, calls="ring_slots(depth)")
def check_ring_slots(ring_slots) -> Verdict:
    """Lab 3's fix: ``ring_slots(depth)``, the host slots for a loop holding ``depth`` rounds;
    every depth in DEPTHS, each run on a ring that size, race checker on, and one slot smaller;
    depth 1 also with drafts (the ZOS loop).  Each depth is asked a random number of times, in a
    shuffled order, before the runs and once more after: a size that depends on more than the
    depth (state kept between calls) is named where it changed."""
    counts = Counter()  # calls per depth, over both askings: a change names its call
    sizes = ring_sizes.asked(ring_slots, counts=counts)
    if isinstance(sizes, Verdict):
        return sizes
    for depth, slots in zip(DEPTHS, sizes):
        if isinstance(slots, Verdict):  # what it returned the first time, in depth order
            return slots
        for drafts in (0, pool.DRAFTS) if depth == 1 else (0,):
            verdict = _ring_verdict(depth, slots, drafts)
            if verdict is not None:
                return verdict
    again = ring_sizes.asked(ring_slots, calls=(1, 1), again=True, counts=counts)
    if isinstance(again, Verdict):
        again.message = f"asked again after the runs, {again.message}"
        return again
    return passes(f"depths {list(DEPTHS)} need rings of {sizes} (depth 1 with drafts too): every "
                  f"held round keeps its slot until it is waited for, and the round being prepared "
                  f"needs one more")


def _ring_verdict(depth: int, slots: int, drafts: int) -> Verdict | None:
    """Lab 3: a ring of ``slots`` for a loop holding ``depth`` rounds: a race, other tokens, or a
    ring one slot smaller that would do."""
    loop = f"a loop holding {depth} round(s)" + (f" (ZOS with {drafts} drafts)" if drafts else "")
    got = runs.ring_run(depth, slots, drafts)
    if isinstance(got, RaceError):
        msg = (f"{loop} on a ring of {slots}: preparing round {got.round + slots} writes "
               f"`{got.buffer}` while round {got.round}'s upload, a step the loop still holds, may "
               f"read it (the race checker: {got})")
        return fails("race", msg)
    if got != runs.ring_reference():
        differ = pool.compare(got, runs.ring_reference())
        return fails("wrong_tokens", f"{loop}, ring {slots}: {differ}")
    if slots > 1 and not isinstance(runs.ring_run(depth, slots - 1, drafts), RaceError):
        msg = (f"ring_slots({depth}) = {slots}, but a ring of {slots - 1} already runs {loop} "
               f"race-free: each slot is host and device memory (metadata, temperatures, outputs)")
        return fails("too_many", msg)
    return None


# ------------------------------------------------------------------ lab 4: a stop inside a run

@notebook_check
def check_overshoot(answer, engine) -> Verdict:
    """Predict (07, lab 4): with the shipped commit and k drafts, at most how many tokens past
    ``max_new_tokens`` can a request keep?  ``engine``: the ZOS + speculation engine just run."""
    if answer is None:
        return unanswered("set `overshoot` to a whole number of tokens")
    got = whole(answer)
    if got is None:
        return fails("shape", f"write one whole number of tokens, not {show(answer)}")
    run = context.run_fields(engine, ("config.num_draft_tokens", context.count),
                             ("requests[].max_new_tokens", context.count),
                             ("completions[].token_ids", context.size))
    if isinstance(run, str) or not (run[1] and run[2]):
        found = f": {run}" if isinstance(run, str) else " (its last run has no requests)"
        return fails("setup", f"pass the speculative engine whose last run used the shipped "
                              f"commit{found}")
    k, (limit, *_), sizes = run
    seen = max(n - limit for n in sizes)
    if not k:
        return fails("setup", "this engine has no drafts: pass the speculative one")
    if got < 0:
        return negative_count(got)
    if got == k:
        return passes(f"{k}: a round brings 1 + {k} tokens at most, and a request is planned only while it is "
                      f"short of its limit, so at least one of them is within it; the shipped commit keeps all. "
                      f"This run kept up to {seen} too many")
    look = f"how many tokens can one round bring with {k} drafts, and how many of them can lie past the limit?"
    if got == k + 1:
        return fails("off_by_one", f"that counts the whole round past the limit, but the round was planned while "
                                   f"the request was still short of it: {look}")
    if got < k:
        return fails("too_few", f"a run can keep more than that (this one kept up to {seen} too many): {look}")
    return fails("too_many", f"a request at its limit is never planned again, so only one round's run crosses "
                             f"it: {look}")


def _warm_commit_runs() -> None:
    pool.start({}, {"num_draft_tokens": pool.DRAFTS})
    for i in range(len(runs.COMMIT_RUNS)):
        runs.commit_reference(i)
        runs.commit_endings(i)


@exercise_check(_warm_commit_runs, calls="commit(req, tokens, eos_id, decode)")
def check_commit(commit) -> Verdict:
    """Lab 4's fix: ``commit(req, tokens, eos_id, decode)``, called by the engine's commit_outputs
    with each round's accepted run, on ZOS runs with and without drafts against the serial run's
    outputs."""
    for index, run in enumerate(runs.COMMIT_RUNS):
        (endings, rounds), now = runs.commit_endings(index), runs.InProgress()
        engine, edits = runs.commit_engine(run), []
        try:
            outs = runs.commit_run(index, commit, cap=3 * rounds, now=now, edits=edits)
        except sandbox.TimeUp as up:
            return mistakes.timed_out(up, "commit", run, now, endings)
        except NotImplementedError:
            return not_implemented("`commit`")
        except RecursionError:
            return fails("calls_itself", "your commit calls `req.commit(...)`, which in this run *is* your function: "
                                         "it called itself until Python gave up. Append to the request's fields")
        except Exception as err:  # noqa: BLE001
            stalled = engines(err, EngineStalled) or checkers(err, runs.Runaway)
            if edits and (stalled or err is not now.raised):  # the engine's, after an edit
                return _commit_edited(run, edits)
            if checkers(err, runs.CommitSlip):
                return fails(err.args[0], f"{run}: {err.args[1]}")
            if stalled:
                return mistakes.commit_never_ended(err, engine, run, endings)
            refused = mistakes.commit_refused(err, run)
            return refused if refused is not None else fails("raised",
                                                             f"your commit raised {quoted(err)}")
        for i, (c, ref) in enumerate(zip(outs, runs.commit_reference(index))):
            got = (c.token_ids, c.text, c.finish_reason)
            verdict = mistakes.commit_mistake(i, got, ref, run, endings[i], engine)
            if verdict is not None and edits:  # what went wrong came from the commit's edit
                return _commit_edited(run, edits)
            if verdict is not None:
                return verdict
    return passes(f"each run stops exactly where the serial run does: a stop string, EOS or the "
                  f"length limit inside a round's accepted run ({pool.DRAFTS} drafts) cuts it "
                  f"there, a limit at a round's end (one token a round, without drafts) ends it, "
                  f"and the text matches the tokens")


def _commit_edited(run, edits: list) -> Verdict:
    """Lab 4: a run that went wrong where the learner's commit changed a request's setting (a
    lowered limit was told to set the finish reason, round 17): that edit named."""
    return fails("edits_requests", f"{run}: {edits[0]}: a commit appends the round's tokens and "
                                   f"ends the request (`req.output_ids`, `req.text`, "
                                   f"`req.finish_reason`); it must not change its settings")
