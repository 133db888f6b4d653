"""Lesson 07 (notebook 07_bugs_that_shipped, optional): overlap bugs that real engines shipped,
brought back through the toy's plug-in points (``overlap_course.labs``).  A lab's prediction is
judged against the buggy run itself; the learner's fix runs on the shared engines, race checker
on, and is judged by what the run did: its tokens against the engine's own serial outputs, its
discarded rounds and flushes, the frees and race reports of its record.
"""

from __future__ import annotations

import numbers

from toy_engine.config import MAX_SLOTS
from toy_engine.races import RaceError
from toy_engine.record import Free
from toy_engine.run import EngineStalled

from . import lab_runs as runs
from . import pool
from .answers import int_set, items, show, whole
from .harness import exercise_check, notebook_check
from .lab_runs import ABORTS, DEPTHS, MAX_NEW, STOPS
from .verdict import Verdict, fails, not_implemented, passes, unanswered

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
    if got[1] == 0:
        return fails("misses_in_flight", f"under ZOS round {last} is planned while round {last - 1} is still on the "
                                         f"device: count the rounds launched for the prompt and not processed yet")
    if got[0] >= len(out.token_ids):
        return fails("already_processed", f"its last token was not committed yet: round {last - 1}, which "
                                          f"produced it, was processed only after round {last} was planned")
    return fails("wrong", f"{got} is not it: one round of a decoding request is in flight under ZOS, and each "
                          f"processed round committed one token")


@exercise_check(pool.engine, lambda: [runs.own_run(stop) for stop in STOPS])
def check_wants_more(wants_more) -> Verdict:
    """Lab 1's fix: ``wants_more(req)``, asked by the scheduler before each round, on ZOS runs with and
    without a stop string; no round may go in for a request the rounds in flight already finish."""
    for stop in STOPS:
        ids, rounds, discarded, flushes = runs.own_run(stop)
        got, calls = runs.policy_run(wants_more, stop, cap=3 * rounds)
        engine = pool.engine()
        if isinstance(got, Exception):
            return _policy_error(got, calls)
        if [c.token_ids for c in got] != ids:
            return fails("wrong_tokens", f"{pool.compare([c.token_ids for c in got], ids)} (stop strings {list(stop)})")
        if engine.stats.discarded_outputs > discarded:
            return _extra_step(calls, engine, rounds, discarded)
        if runs.flushes(engine) > flushes:
            return fails("serializes", f"your policy never plans a request while one of its rounds is in flight, "
                                       f"so each ZOS round waits for the one before: {runs.flushes(engine)} flushes "
                                       f"instead of {flushes}, no overlap left. Count the rounds in flight instead")
    return passes(f"no round went in for a request the rounds in flight already finish: the engine's own rounds "
                  f"and discarded outputs ({discarded} with a stop string: the host learns of a stop only when it "
                  f"processes it), and the same tokens")


def _extra_step(calls, engine, rounds: int, discarded: int) -> Verdict:
    late = next((c for c in calls if c[5] and (c[4] or c[2] + c[3] >= MAX_NEW)), None)
    cost = (f"{engine.stats.discarded_outputs} outputs discarded (the engine's own: {discarded}), "
            f"{engine.stats.rounds} rounds instead of {rounds}")
    if late and late[4]:
        return fails("finished_scheduled", f"prompt {late[1]} had finished before round {late[0]}, yet your policy "
                                           f"planned it again: {cost}. Never plan a finished request")
    where = (f"before round {late[0]} prompt {late[1]} had {late[2]} tokens committed and {late[3]} round(s) in "
             f"flight, enough for its {MAX_NEW}, yet your policy planned it again" if late else
             "your policy planned rounds whose outputs came back for finished requests")
    return fails("extra_step", f"{where}: {cost}")


def _policy_error(err: Exception, calls) -> Verdict:
    if isinstance(err, NotImplementedError):
        return not_implemented("`wants_more`")
    if isinstance(err, RecursionError):
        return fails("calls_itself", "your wants_more calls `req.wants_more()`, which in this run *is* your "
                                     "function: it called itself until Python gave up. Compute the answer from "
                                     "the request's fields")
    if isinstance(err, runs.Runaway):
        done = [c for c in calls if c[4] and c[5]]
        who = f"prompt {done[0][1]} had finished before round {done[0][0]}" if done else "a finished request"
        return fails("finished_scheduled", f"{who}, and your policy kept planning it: past round {err.args[0]} "
                                           f"the check stopped the run. Never plan a finished request again")
    if isinstance(err, EngineStalled):
        left = [c for c in calls if c[1] in err.prompt_indexes]
        detail = (f"before round {left[-1][0]} your policy declined prompt {left[-1][1]} with {left[-1][2]} of its "
                  f"{MAX_NEW} tokens and {left[-1][3]} round(s) in flight" if left else
                  f"your policy declined prompts {err.prompt_indexes} before they reached their limit")
        return fails("stalled", f"{detail}: it can never finish ({err.reason})")
    return fails("raised", f"your wants_more raised {type(err).__name__}: {err}")


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
    if not isinstance(err, RaceError) or err.kind != "free_in_use":
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
    if err.round not in zos:
        return fails("misses_in_flight", f"round {err.round} had been launched and not processed: the report "
                                         f"names it")
    return fails("already_processed", f"round {min(zos)} was processed already (in round {min(zos) + 1}'s pass): "
                                      f"under ZOS one round of a decoding request is in flight at a time")


@exercise_check(pool.engine, runs.abort_reference)
def check_abort(abort) -> Verdict:
    """Lab 2's fix: ``abort(engine, request_id)`` before chosen rounds of a ZOS run (a waiting request,
    one in flight, the same again, one just prefilled, one finished by its stop), against the engine's
    own ``Engine.abort``."""
    engine, (want, discarded) = pool.engine(), runs.abort_reference()
    try:
        outs, err = runs.abort_run(abort), None
    except NotImplementedError:
        return not_implemented("`abort`")
    except Exception as exc:  # noqa: BLE001 - judged below
        outs, err = None, exc
    verdict = _freed_wrongly(engine.record)
    if verdict is None and err is not None:
        verdict = _abort_error(err)
    if verdict is None:
        verdict = _abort_outcome([(c.token_ids, c.finish_reason) for c in outs], want, engine, discarded)
    if verdict is None:
        verdict = passes("each aborted request stopped at once and kept what it had; its cache went back when no "
                         "launched round could touch it, once; a waiting one never started, and a finished one "
                         "kept its reason")
    return verdict


def _freed_wrongly(record) -> Verdict | None:
    for free in record.of(Free):
        if free.in_use:
            rnd, stage = free.in_use[0]
            return fails("free_in_use", f"your abort freed prompt {free.prompt}'s KV blocks {list(free.blocks)} "
                                        f"while round {rnd}'s `{stage}`, launched and not processed, may still "
                                        f"write them. Mark it aborted now, free it when `num_inflight == 0`")
        if free.double:
            return fails("double_free", f"prompt {free.prompt}'s KV blocks {list(free.double)} were freed a second "
                                        f"time: a pool that takes a block back twice hands it to two requests")
    return None


def _abort_error(err: Exception) -> Verdict:
    if isinstance(err, EngineStalled) and err.reason == "finished_kept_blocks":
        return fails("kept_blocks", f"prompts {err.prompt_indexes} were aborted with no round in flight and "
                                    f"nobody freed them: only processing a round frees its requests, and an "
                                    f"aborted request is never scheduled again. Free it at once when "
                                    f"`num_inflight == 0`")
    if isinstance(err, EngineStalled):
        return fails("stalled", f"the engine could not go on ({err.reason}, prompts {err.prompt_indexes}): {err}")
    return fails("raised", f"your abort raised {type(err).__name__}: {err}")


def _abort_outcome(got, want, engine, discarded: int) -> Verdict | None:
    for i, ((ids, reason), (ref_ids, ref_reason)) in enumerate(zip(got, want)):
        if reason == "abort" and ref_reason != "abort":
            return fails("overwrote_finish", f"prompt {i} had finished ({ref_reason}) before its abort arrived; "
                                             f"your abort replaced the reason by \"abort\". Leave a finished "
                                             f"request alone")
        if len(ids) > len(ref_ids) and ref_reason == "abort":
            return fails("still_running", f"prompt {i} was aborted but went on to {len(ids)} tokens "
                                          f"({reason}): set its `finish_reason` to \"abort\" so that no round "
                                          f"plans it again")
        if ids == ref_ids and reason != ref_reason:
            return fails("wrong_reason", f"prompt {i} stopped where the engine's own abort stops it, but finished "
                                         f"as {reason!r}: an aborted request's reason is \"abort\"")
        if ids != ref_ids:
            return fails("wrong_tokens", f"prompt {i}: {len(ids)} tokens, the engine's own abort keeps "
                                         f"{len(ref_ids)}")
    if engine.stats.discarded_outputs > discarded:
        return fails("aborted_scheduled", f"prompt {ABORTS[0][1]} was aborted while waiting, yet it was admitted "
                                          f"and prefilled for nothing ({engine.stats.discarded_outputs} outputs "
                                          f"discarded, the engine's abort: {discarded}): take it out of "
                                          f"`engine.scheduler.waiting`")
    lost = engine.config.num_kv_blocks - len(engine.scheduler.blocks.free_ids)
    if lost:
        return fails("kept_blocks", f"after the run {lost} KV blocks never came back to the pool: an aborted "
                                    f"request left `running` without its blocks being freed")
    return None


# ------------------------------------------------------------------ lab 3: the ring of host slots

@notebook_check
def check_ring_race(answer, err, ring: int) -> Verdict:
    """Predict (07, lab 3): with a ring of ``ring`` slots too small for the loop's depth, which round's
    upload does the race report name, and the prepare of which round collides with it?"""
    got = _pair(answer, "race_at", "a pair (the round the report names, the round being prepared), e.g. (2, 5)",
                whole)
    if isinstance(got, Verdict):
        return got
    if not isinstance(err, RaceError) or err.kind != "buffer":
        return fails("setup", "pass the RaceError of the run above (a ring too small for its depth)")
    want = (err.round, err.round + ring)
    if got == want:
        return passes(f"{want}: round {want[1]} writes slot {want[1]} % {ring} = {want[1] % ring}, the slot of "
                      f"round {want[0]}, whose step the loop still holds: its upload was never waited for. "
                      f"The checker: {err}")
    if got[1] - got[0] != ring:
        return fails("wrong_slot", f"round N writes slot N % {ring}: two rounds share a slot only {ring} rounds "
                                   f"apart")
    return fails("earlier_round" if got[0] < want[0] else "not_launched_yet",
                 f"the first collision is earlier or later than that: the loop holds its oldest step until "
                 f"the next forward is launched, and a slot comes round again after {ring} rounds")


@exercise_check(runs.ring_reference)
def check_ring_slots(ring_slots) -> Verdict:
    """Lab 3's fix: ``ring_slots(depth)``, the host slots for a loop holding ``depth`` rounds; each
    depth runs on a ring that size, race checker on, and the ring one slot smaller is run too."""
    sizes = []
    for depth in DEPTHS:
        try:
            slots = ring_slots(depth)
        except NotImplementedError:
            return not_implemented("`ring_slots`")
        except Exception as err:  # noqa: BLE001
            return fails("raised", f"ring_slots({depth}) raised {type(err).__name__}: {err}")
        if isinstance(slots, bool) or not isinstance(slots, numbers.Integral) or not 1 <= slots <= MAX_SLOTS:
            return fails("shape", f"ring_slots({depth}) returned {show(slots)}: return a whole number of slots "
                                  f"from 1 to the engine's limit, {MAX_SLOTS}")
        slots = int(slots)
        got = runs.ring_run(depth, slots)
        if isinstance(got, RaceError):
            return fails("race", f"a loop holding {depth} round(s) on a ring of {slots}: preparing round "
                                 f"{got.round + slots} writes `{got.buffer}` while round {got.round}'s upload, a "
                                 f"step the loop still holds, may read it (the race checker: {got})")
        if got != runs.ring_reference():
            return fails("wrong_tokens", f"depth {depth}, ring {slots}: {pool.compare(got, runs.ring_reference())}")
        if slots > 1 and not isinstance(runs.ring_run(depth, slots - 1), RaceError):
            return fails("too_many", f"ring_slots({depth}) = {slots}, but a ring of {slots - 1} already runs a loop "
                                     f"holding {depth} round(s) race-free: each slot is host and device memory "
                                     f"(metadata, temperatures, outputs)")
        sizes.append(slots)
    return passes(f"depths {list(DEPTHS)} need rings of {sizes}: every held round keeps its slot until it is "
                  f"waited for, and the round being prepared needs one more")


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
    try:
        k, limit = engine.config.num_draft_tokens, engine.requests[0].max_new_tokens
        seen = max(len(c.token_ids) - limit for c in engine.completions)
    except (AttributeError, IndexError, ValueError):
        return fails("setup", "pass the speculative engine whose last run used the shipped commit")
    if not k:
        return fails("setup", "this engine has no drafts: pass the speculative one")
    if got == k:
        return passes(f"{k}: a round brings 1 + {k} tokens at most, and a request is planned only while it is "
                      f"short of its limit, so at least one of them is within it; the shipped commit keeps all. "
                      f"This run kept up to {seen} too many")
    if got == k + 1:
        return fails("off_by_one", f"the round was planned while the request was short of its limit, so its "
                                   f"first token is within it: at most {k} past it")
    if got < k:
        return fails("too_few", f"a round may accept all {k} drafts plus its bonus token, each kept by the "
                                f"shipped commit (this run kept up to {seen} too many)")
    return fails("too_many", f"a round brings at most 1 + {k} tokens: the overshoot is bounded by one round")


@exercise_check(runs.spec_engine, lambda: [runs.commit_reference(i) for i in range(len(runs.COMMIT_RUNS))])
def check_commit(commit) -> Verdict:
    """Lab 4's fix: ``commit(req, tokens, eos_id, decode)``, called by the engine's commit_outputs with
    each round's accepted run, on ZOS + speculation runs against the serial run's outputs."""
    engine = runs.spec_engine()
    for index, (_, max_new, stop) in enumerate(runs.COMMIT_RUNS):
        try:
            outs = runs.commit_run(index, commit)
        except NotImplementedError:
            return not_implemented("`commit`")
        except RecursionError:
            return fails("calls_itself", "your commit calls `req.commit(...)`, which in this run *is* your function: "
                                         "it called itself until Python gave up. Append to the request's fields")
        except EngineStalled as err:
            return fails("stalled", f"prompts {err.prompt_indexes} reached their limit but never finished: set "
                                    f"`req.finish_reason` where a request ends (\"length\", \"stop\", \"eos\")")
        except Exception as err:  # noqa: BLE001
            return fails("raised", f"your commit raised {type(err).__name__}: {err}")
        for i, (c, ref) in enumerate(zip(outs, runs.commit_reference(index))):
            verdict = _commit_mistake(i, (c.token_ids, c.text, c.finish_reason), ref, max_new, stop, engine)
            if verdict is not None:
                return verdict
    return passes(f"each run stops exactly where the serial run does: a stop string, EOS or the length limit "
                  f"inside a round's accepted run ({pool.DRAFTS} drafts) cuts it there, and the text matches the "
                  f"tokens")


def _commit_mistake(i: int, got, ref, max_new: int, stop, engine) -> Verdict | None:
    (ids, text, reason), (ref_ids, ref_text, ref_reason) = got, ref
    tok = engine.tokenizer
    if (ids, text, reason) == ref:
        return None
    who = f"prompt {i} (limit {max_new}, stop strings {list(stop)})"
    if tok.eos_id in ids:
        return fails("eos_kept", f"{who}: its tokens hold the EOS id {tok.eos_id}: EOS ends a request, it is not "
                                 f"one of its tokens")
    if text != tok.decode(ids):
        return fails("text_mismatch", f"{who}: its text {show(text)} is not the text of its {len(ids)} tokens "
                                      f"{show(tok.decode(ids))}: cut both alike")
    if (ids, text) == (ref_ids, ref_text):
        return fails("wrong_reason", f"{who}: the right tokens, finished as {reason!r} where the serial run "
                                     f"says {ref_reason!r}")
    if len(ids) > max_new:
        return fails("past_limit", f"{who}: {len(ids)} tokens, {len(ids) - max_new} past its limit: a round's "
                                   f"accepted run crossed it and was kept whole. Stop at the limit's token")
    if ids[: len(ref_ids)] == ref_ids and ref_reason == "eos":
        return fails("past_eos", f"{who}: it goes on after the EOS the serial run stops at: {show(text)}")
    if ids[: len(ref_ids)] == ref_ids and ref_reason == "stop":
        kept = any(text == ref_text + s for s in stop)
        if kept and reason == "length":
            return fails("wrong_reason", f"{who}: the stop string and the limit came with the same token, and your "
                                         f"commit let the limit win: the stop string stayed in {show(text)}. "
                                         f"Check the stop strings first, as the serial run does")
        return fails("kept_stop" if kept else "missed_stop",
                     f"{who}: the serial run ends at {show(ref_text)} (stop); yours {show(text)}: "
                     + ("the stop string stays in the text: cut it off" if kept else
                        "the stop string was completed inside a round's run, or across two, and missed"))
    if ref_ids[: len(ids)] == ids:
        return fails("stopped_early", f"{who}: it stops at {len(ids)} tokens, the serial run at {len(ref_ids)}")
    return fails("wrong_tokens", f"{who}: {show(text)} where the serial run gives {show(ref_text)}")
