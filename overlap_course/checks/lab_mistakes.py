"""What a lab fix's run did wrong, in the lesson's words (notebook 07; ``lesson07`` runs the fix
through ``lab_runs`` and asks here): a verdict naming the mistake, or None when the run shows none.
Lab 1: a ``wants_more`` that planned a round too many or too few; lab 2: an abort's frees, waits
and outcome against ``Engine.abort``'s; lab 4: a commit's outputs against the serial run's.
"""

from __future__ import annotations

from toy_engine.record import Free
from toy_engine.run import EngineStalled

from . import lab_runs as runs
from .answers import show
from .verdict import Verdict, fails, not_implemented


def extra_step(calls, engine, rounds: int, discarded: int, run) -> Verdict:
    """Lab 1: more outputs discarded than the engine's own policy: the first round planned for a request
    already finished, or one its rounds in flight already finish."""
    late = next((c for c in calls if c[5] and (c[4] or c[2] + c[3] >= run.max_new)), None)
    cost = (f"{engine.stats.discarded_outputs} outputs discarded (the engine's own: {discarded}), "
            f"{engine.stats.rounds} rounds instead of {rounds}")
    if late and late[4]:
        return fails("finished_scheduled", f"{run}: prompt {late[1]} had finished before round {late[0]}, yet your "
                                           f"policy planned it again: {cost}. Never plan a finished request")
    where = (f"before round {late[0]} prompt {late[1]} had {late[2]} tokens committed and {late[3]} round(s) in "
             f"flight, enough for its {run.max_new}, yet your policy planned it again" if late else
             "your policy planned rounds whose outputs came back for finished requests")
    return fails("extra_step", f"{run}: {where}: {cost}")


def policy_error(err: Exception, calls, run) -> Verdict:
    """Lab 1: a run that ended in an error: the policy's own, or a stall it caused (named by its last
    refusal), or a runaway the check stopped."""
    if isinstance(err, NotImplementedError):
        return not_implemented("`wants_more`")
    if isinstance(err, RecursionError):
        return fails("calls_itself", "your wants_more calls `req.wants_more()`, which in this run *is* your "
                                     "function: it called itself until Python gave up. Compute the answer from "
                                     "the request's fields")
    if isinstance(err, runs.Runaway):
        done = [c for c in calls if c[4] and c[5]]
        who = f"prompt {done[0][1]} had finished before round {done[0][0]}" if done else "a finished request"
        return fails("finished_scheduled", f"{run}: {who}, and your policy kept planning it: past round "
                                           f"{err.args[0]} the check stopped the run. Never plan a finished "
                                           f"request again")
    if isinstance(err, EngineStalled):
        left = [c for c in calls if c[1] in err.prompt_indexes]
        detail = (f"before round {left[-1][0]} your policy declined prompt {left[-1][1]} with {left[-1][2]} of its "
                  f"{run.max_new} tokens and {left[-1][3]} round(s) in flight" if left else
                  f"your policy declined prompts {err.prompt_indexes} before they reached their limit")
        return fails("stalled", f"{run}: {detail}: it can never finish ({err.reason})")
    return fails("raised", f"your wants_more raised {type(err).__name__}: {err}")


def waited(calls) -> Verdict | None:
    """Lab 2: an abort that waits for the device gives up the overlap at every abort."""
    call = next((c for c in calls if c.waits), None)
    if call is None:
        return None
    return fails("serializes", f"your abort of prompt {call.prompt} before round {call.round} waited for the device "
                               f"({call.waits} wait(s)): each abort then stalls the host until the device is idle, "
                               f"and the overlap is lost. Mark the request aborted and let the round in flight free "
                               f"it when it is processed")


def freed_wrongly(record) -> Verdict | None:
    """Lab 2: a free the race checker saw under a launched round, or a second free, from the record
    (there even when the learner's code swallowed the RaceError)."""
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


def abort_error(err: Exception) -> Verdict:
    """Lab 2: a run that ended in an error no free explains."""
    if isinstance(err, EngineStalled) and err.reason == "finished_kept_blocks":
        return fails("kept_blocks", f"prompts {err.prompt_indexes} were aborted with no round in flight and "
                                    f"nobody freed them: only processing a round frees its requests, and an "
                                    f"aborted request is never scheduled again. Free it at once when "
                                    f"`num_inflight == 0`")
    if isinstance(err, EngineStalled):
        return fails("stalled", f"the engine could not go on ({err.reason}, prompts {err.prompt_indexes}): {err}")
    return fails("raised", f"your abort raised {type(err).__name__}: {err}")


def abort_outcome(got, want, engine, discarded: int, calls) -> Verdict | None:
    """Lab 2: a run that ended: its pool, each request against the engine's own abort, then what the
    record says of the aborted waiting requests and the discarded outputs."""
    lost = runs.lost_blocks(engine)
    if lost:
        return fails("kept_blocks", f"after the run {lost} KV blocks never came back to the pool: an aborted "
                                    f"request left `running` without its blocks being freed")
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
    started = next((c for c in calls if c.waiting and runs.admitted_after(engine.record.events, c.prompt, c.round)),
                   None)
    if started:
        return fails("aborted_scheduled", f"prompt {started.prompt} was aborted while waiting (before round "
                                          f"{started.round}), yet a later round admitted and prefilled it for "
                                          f"nothing: take it out of `engine.scheduler.waiting`")
    if engine.stats.discarded_outputs > discarded:
        return fails("wrong", f"{engine.stats.discarded_outputs} outputs discarded, the engine's own abort: "
                              f"{discarded}: rounds went in for requests already aborted")
    return None


def commit_mistake(i: int, got, ref, max_new: int, stop, engine) -> Verdict | None:
    """Lab 4: prompt ``i``'s (tokens, text, reason) against the serial run's, the first mistake named."""
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
            return fails("wrong_reason", f"{who}: the token that completed a stop string was also the limit's, and "
                                         f"your commit ended the request as 'length' with the stop string still in "
                                         f"{show(text)}: the serial run looks at each token, once appended, for a "
                                         f"stop string, then for the limit")
        return fails("kept_stop" if kept else "missed_stop",
                     f"{who}: the serial run ends at {show(ref_text)} (stop); yours {show(text)}: "
                     + ("the stop string stays in the text: cut it off" if kept else
                        "the stop string was completed inside a round's run, or across two, and missed"))
    if ref_ids[: len(ids)] == ids:
        return fails("stopped_early", f"{who}: it stops at {len(ids)} tokens, the serial run at {len(ref_ids)}")
    return fails("wrong_tokens", f"{who}: {show(text)} where the serial run gives {show(ref_text)}")
