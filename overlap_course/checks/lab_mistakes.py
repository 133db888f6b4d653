"""What a lab fix's run did wrong, in the lesson's words (notebook 07; ``lesson07`` runs the fix
through ``lab_runs`` and asks here): a verdict naming the mistake, or None when the run shows none.
Lab 1: a ``wants_more`` that planned a round too many or too few; lab 2: an abort's frees, waits
and outcome against ``Engine.abort``'s; lab 4: a commit's outputs against the serial run's.
Each names the run, the prompt and how that prompt ends with the engine's own code.
"""

from __future__ import annotations

from overlap_course.labs import plugins
from toy_engine.record import Free
from toy_engine.refusals import CommitStoppedEarly
from toy_engine.run import EngineStalled

from . import lab_runs as runs
from . import lifetime_runs, sandbox
from .answers import show
from .endings import ABORT, LIMIT_AT_ROUND_END
from .errors import at, checkers, engines, quoted
from .verdict import Verdict, counted, fails, not_implemented


def extra_step(calls, engine, own, run) -> Verdict:
    """Lab 1: more outputs discarded than the engine's own policy: the first round planned for a
    request already finished, or one its rounds in flight already finish."""
    late = next((c for c in calls if c[5] and (c[4] or c[2] + c[3] >= run.max_new)), None)
    cost = (f"{engine.stats.discarded_outputs} outputs discarded (the engine's own: "
            f"{own.discarded}), {engine.stats.rounds} rounds instead of {own.rounds}")
    if late and late[4]:
        msg = (f"{run}: {runs.who(run.prompts, late[1])} had ended {own.endings[late[1]]}, before "
               f"round {late[0]}, yet your policy planned it again: {cost}. Never plan a finished "
               f"request")
        return fails("finished_scheduled", msg)
    if late:
        where = (f"before round {late[0]} {runs.who(run.prompts, late[1])} had "
                 f"{counted(late[2], 'token')} committed and {counted(late[3], 'round')} in "
                 f"flight, enough for its {run.max_new}, yet your policy planned it again")
    else:
        where = "your policy planned rounds whose outputs came back for finished requests"
    return fails("extra_step", f"{run}: {where}: {cost}")


# Why the engine stalled, per ``EngineStalled.REASONS`` (a category), in the lesson's words.
_STALLS = {"not_planned": "no round plans it again and none is in flight",
           "loop_returned_with_work": "the loop returned with it unfinished and none in flight",
           "finished_kept_blocks": "finished requests still hold their KV blocks and rows",
           "unprocessed_inflight": "a launched round's results were never processed",
           "no_progress": "its rounds commit no tokens"}


def policy_error(err: Exception, calls, run, own, engine) -> Verdict:
    """Lab 1: a run that ended in an error: the policy's own, or a stall it caused (named by its
    last refusal), or a runaway the check stopped."""
    if isinstance(err, NotImplementedError):
        return not_implemented("`wants_more`")
    if checkers(err, plugins.NotTrueOrFalse):
        when = f" before round {calls[-1][0]}" if calls else ""
        hint = " (a function that ends without `return` returns None)" if err.answer is None else ""
        return fails("shape", f"{run}: your `{err.name}` returned {show(err.answer)} for "
                              f"{runs.who(run.prompts, err.prompt)}{when}, not True or False"
                              f"{hint}: return whether the scheduler should plan it again")
    if isinstance(err, RecursionError):
        return fails("calls_itself", "your wants_more calls `req.wants_more()`, which in this run "
                                     "*is* your function: it called itself until Python gave up. "
                                     "Compute the answer from the request's fields")
    if checkers(err, runs.Runaway):
        done = next((c for c in calls if c[4] and c[5]), None)
        who = "your policy kept planning finished requests"
        if done:
            who = (f"{runs.who(run.prompts, done[1])} ended {own.endings[done[1]]}, and before "
                   f"round {done[0]} your policy planned it again, and again")
        msg = (f"{run}: {who}: the check stopped the run at round {err.args[0]} (the engine's "
               f"own run takes {own.rounds} rounds). A request ends on EOS, a stop string or its "
               f"limit: never plan a finished one again")
        return fails("finished_scheduled", msg)
    if engines(err, EngineStalled):
        left = [c for c in calls if c[1] in err.prompt_indexes]
        i = left[-1][1] if left else err.prompt_indexes[0]
        has = len(engine.requests[i].output_ids) if i < len(engine.requests) else 0
        detail = f"your policy declined {runs.who(run.prompts, i)} before it reached its limit"
        if left:
            detail = (f"before round {left[-1][0]} your policy declined {runs.who(run.prompts, i)} "
                      f"with {left[-1][2]} of its {counted(run.max_new, 'token')} and "
                      f"{counted(left[-1][3], 'round')} "
                      f"in flight")
        msg = (f"{run}: {detail}: it should have ended {own.endings[i]}, and stopped with {has}: "
               f"{_STALLS[err.reason]}, so it can never finish")
        return fails("stalled", msg)
    return fails("raised", f"your wants_more raised {quoted(err)}{at(err)}")


def timed_out(up, what: str, run, now, endings) -> Verdict:
    """A lab run the check's time limit stopped inside the learner's ``what``: where, for which
    prompt, and how that prompt should have ended.  A TimeUp of the learner's own class is
    raised again: the harness's "raised" verdict."""
    if not sandbox.is_limits(up):
        raise up
    where = f"{run}: your {what} was {up}"
    if now.prompt is not None:
        where += (f", called for {runs.who(run.prompts, now.prompt)} before round {now.round}, "
                  f"with {counted(now.tokens, 'token')} committed; it should have ended "
                  f"{endings[now.prompt]}")
    return fails("time_limit", f"{where}. The check stopped it there (it allows "
                               f"{sandbox.TIME_LIMIT_S:.0f} s; the engine's own takes well under "
                               f"one): a loop inside it never ends")


def waited(calls, run) -> Verdict | None:
    """Lab 2: an abort that waits for the device gives up the overlap at every abort; a free
    after that wait raced nothing (nothing still ran), so the stall is what to name."""
    call = next((c for c in calls if c.waits), None)
    if call is None:
        return None
    freed = (f" and then gave its KV blocks {list(call.freed)} back: that wait left no launched "
             f"round to touch them, but" if call.freed else ":")
    msg = (f"{run}: your abort of {runs.who(run.prompts, call.prompt)} before round {call.round} "
           f"waited for the device ({call.waits} wait(s), such as "
           f"`engine.device.synchronize()`){freed} each abort then stalls the host until "
           f"the device is idle, and the overlap is lost. Mark the request aborted and let the "
           f"round in flight free it when it is processed")
    return fails("serializes", msg)


def aborted_another(calls, run) -> Verdict | None:
    """Lab 2: an abort that stopped a request other than the one its id names, or that left every
    request it was given as it was: unfinished, in its queue (it never found them, or it changed
    a setting of theirs and no more)."""
    call = next((c for c in calls if c.others), None)
    judged = [c for c in calls if c.untouched is not None]
    if call is None and judged and all(c.untouched for c in judged):
        call = next((c for c in judged if c.changed), judged[0])
    if call is None:
        return None
    asked = f"{run}: asked to abort {runs.who(run.prompts, call.prompt)} before round {call.round}"
    if not call.others and call.changed:
        msg = (f"{asked}, your abort found it and changed its "
               f"{', '.join(f'`{k}`' for k in call.changed[:3])}, but left it unfinished, still "
               f"{'waiting' if call.waiting else 'running'}: it never marked it finished. An "
               f"abort stops the request at once: set `req.finish_reason = \"abort\"`"
               f"{' and take it out of `engine.scheduler.waiting`' if call.waiting else ''}")
        return fails("not_marked", msg)
    if not call.others:
        msg = (f"{asked}, your abort left it as it was: unfinished, still "
               f"{'waiting' if call.waiting else 'running'}. Did it find the request? Look it up "
               f"by its id (`r.id == request_id` in `engine.requests`): ids keep counting across "
               f"`generate` calls")
        return fails("wrong_request", msg)
    msg = (f"{asked}, your abort stopped {runs.who(run.prompts, call.others[0])}: find the request "
           f"by its id (`r.id == request_id`); ids keep counting across `generate` calls, so an id "
           f"is not a position in `engine.requests`")
    return fails("wrong_request", msg)


def left_unmarked(calls, run) -> Verdict | None:
    """Lab 2: an abort that took its request out of every queue without a finish reason: read
    right after the call (only the run's end marks a request left so "abort")."""
    call = next((c for c in calls if c.unmarked), None)
    if call is None:
        return None
    where = "waiting" if call.waiting else "running"
    msg = (f"{run}: your abort of {runs.who(run.prompts, call.prompt)} before round {call.round} "
           f"took it out of `engine.scheduler.{where}` but left it unfinished (`finish_reason` "
           f"None, right after your abort returned): set `req.finish_reason = \"abort\"` there "
           f"too, so it ends aborted at once (the run's end reports any request left unfinished "
           f"as aborted, which hides this)")
    return fails("not_marked", msg)


def freed_wrongly(record, run) -> Verdict | None:
    """Lab 2: a free the race checker saw under a launched round, or a second free, from the record
    (there even when the learner's code swallowed the RaceError)."""
    for free in record.of(Free):
        who = runs.who(run.prompts, free.prompt)
        if free.in_use:
            rnd, stage = free.in_use[0]
            msg = (f"{run}: your abort freed {who}'s KV blocks {list(free.blocks)} while round "
                   f"{rnd}'s `{stage}`, launched and not processed, may still write them. Mark it "
                   f"aborted now, free it when `num_inflight == 0`")
            return fails("free_in_use", msg)
        if free.double:
            msg = (f"{run}: {who}'s KV blocks {list(free.double)} were freed a second time: a pool "
                   f"that takes a block back twice hands it to two requests")
            return fails("double_free", msg)
    return None


def pool_misused(calls, run) -> Verdict | None:
    """Lab 2: the pool after each abort call, judged as exercise 05 judges it after each
    process_outputs (``lifetime_runs.pool_mistake``): blocks or rows given back while a launched
    round holds the request, a block or row twice, junk, or ``req.blocks`` naming free blocks."""
    for call in calls:
        if call.pool is not None:
            who = f"{run}: aborting {runs.who(run.prompts, call.prompt)} before round {call.round}"
            verdict = lifetime_runs.pool_mistake(call.pool, who, "abort", call.waits > 0)
            if verdict is not None:
                return verdict
    return None


def abort_error(err: Exception, run, ref, engine, calls) -> Verdict:
    """Lab 2: a run that ended in an error no free explains: a stall or a runaway named by the
    first request left, how it should have ended and where it stopped; a finished request kept
    in ``running`` whose blocks its abort gave back itself is told so (blind round 19)."""
    if not (engines(err, EngineStalled) or checkers(err, runs.Runaway)):
        return fails("raised", f"your abort raised {quoted(err)}{at(err)}")
    left = [r for r in engine.requests if r.index in getattr(err, "prompt_indexes", ())]
    left = left or [r for r in engine.requests if r.finish_reason != ref.outs[r.index][1]]
    where = f"{run}: a request could not end"
    if left:
        where = (f"{run}: {runs.who(run.prompts, left[0].index)} should have ended "
                 f"{ref.endings[left[0].index]}; it stopped with "
                 f"{counted(len(left[0].output_ids), 'token')}")
    if checkers(err, runs.Runaway):
        msg = (f"{where}, and rounds kept going in for it: the check stopped the run at round "
               f"{err.args[0]} (the engine's own run takes {ref.rounds}). An aborted request is "
               f"finished: set its `finish_reason` to \"abort\"")
        return fails("still_running", msg)
    freed = left and any(c.freed for c in calls if c.prompt == left[0].index)
    if err.reason == "finished_kept_blocks" and freed:
        msg = (f"{where}, aborted with no round in flight: your abort gave its KV blocks back "
               f"itself but left the request in the scheduler (in `engine.scheduler.running`, "
               f"with its batch row), so the run could not end. Free it with "
               f"`engine.scheduler.free(req)`: that gives back its row and blocks and takes it "
               f"out of `running`")
        return fails("kept_blocks", msg)
    if err.reason == "finished_kept_blocks":
        msg = (f"{where}, aborted with no round in flight, and nobody freed it: only processing a "
               f"round frees its requests, and an aborted request is never scheduled again. Free "
               f"it at once when `num_inflight == 0`")
        return fails("kept_blocks", msg)
    if err.reason == "not_planned":
        msg = (f"{where}, unfinished, and no round plans it again, so the run cannot end: an "
               f"aborted request is finished, with the reason \"abort\" ({err})")
        return fails("stalled", msg)
    return fails("stalled", f"{where}: {_STALLS[err.reason]} ({err})")


def abort_outcome(got, ref, engine, calls, run) -> Verdict | None:
    """Lab 2: a run that ended: its pool, the aborted waiting requests (one admitted shifts every
    later round), each request against the engine's own abort, then the discarded outputs."""
    lost = runs.lost_blocks(engine)
    if lost:
        msg = (f"{run}: after the run {len(lost)} KV block(s) never came back to the pool (blocks "
               f"{lost[:12]}{' ...' if len(lost) > 12 else ''}): an aborted request left "
               f"`running` without its blocks being freed")
        return fails("kept_blocks", msg)
    events = engine.record.events
    started = next((c for c in calls
                    if c.waiting and runs.admitted_after(events, c.prompt, c.round)), None)
    if started:
        msg = (f"{run}: {runs.who(run.prompts, started.prompt)} was aborted while waiting (before "
               f"round {started.round}), yet a later round admitted and prefilled it for nothing: "
               f"take it out of `engine.scheduler.waiting`")
        return fails("aborted_scheduled", msg)
    for i, ((ids, reason), (ref_ids, ref_reason)) in enumerate(zip(got, ref.outs)):
        verdict = _abort_request(f"{run}: {runs.who(run.prompts, i)}", (ids, reason),
                                 (ref_ids, ref_reason), ref.endings[i])
        if verdict is not None:
            return verdict
    if engine.stats.discarded_outputs > ref.discarded:
        msg = (f"{run}: {engine.stats.discarded_outputs} outputs discarded, the engine's own "
               f"abort: {ref.discarded}: rounds went in for requests already aborted")
        return fails("wrong", msg)
    return None


def _abort_request(who: str, got, ref, ending) -> Verdict | None:
    """Lab 2: one request's (tokens, reason) against the engine's own abort's."""
    (ids, reason), (ref_ids, ref_reason) = got, ref
    if reason == "abort" and ref_reason != "abort":
        msg = (f"{who} had ended {ending} before its abort arrived; your abort replaced the reason "
               f"by \"abort\". Leave a finished request alone")
        return fails("overwrote_finish", msg)
    if len(ids) > len(ref_ids) and ref_reason == "abort":
        msg = (f"{who} was aborted with {counted(len(ref_ids), 'token')} but went on to {len(ids)} "
               f"({reason}): set its `finish_reason` to \"abort\" so that no round plans it again")
        return fails("still_running", msg)
    if ids == ref_ids and reason != ref_reason:
        msg = f"{who} should have ended {ending}, but finished as {reason!r}"
        if ref_reason == "abort":
            msg = (f"{who} stopped where the engine's own abort stops it, but finished as "
                   f"{reason!r}: an aborted request's reason is \"abort\"")
        return fails("wrong_reason", msg)
    if ids != ref_ids:
        return fails("wrong_tokens", f"{who}: {counted(len(ids), 'token')} ({reason}), where "
                                     f"it should have ended {ending}")
    return None


def commit_never_ended(err, engine, run, endings) -> Verdict:
    """Lab 4: a run that stalled or ran on: the first request left unfinished, how it should have
    ended and where it stopped."""
    reqs = [r for r in engine.requests if not r.finished or r.finish_reason == "abort"]
    if engines(err, EngineStalled) and err.prompt_indexes:
        reqs = [r for r in engine.requests if r.index in err.prompt_indexes] or reqs
    req = next((r for r in reqs if endings[r.index].how != ABORT), reqs[0]) if reqs else None
    if req is None:
        return fails("stalled", f"{run}: the run could not go on ({err})")
    has, want = len(req.output_ids), endings[req.index]
    where = (f"{run}: {runs.who(run.prompts, req.index)} should have ended {want}; it stopped with "
             f"{counted(has, 'token')}, unfinished")
    if checkers(err, runs.Runaway):
        msg = (f"{where}, and the check stopped the run at round {err.args[0]}: your commit kept "
               f"it from reaching its end. Set `req.finish_reason` where a request ends")
        return fails("stalled", msg)
    if has >= run.max_new and want.how == LIMIT_AT_ROUND_END:
        msg = (f"{where}: its limit's token was the last of a round's run, and your commit did not "
               f"end the request there, so no round plans it again and it can never finish. Check "
               f"the limit after each token: `len(req.output_ids) >= req.max_new_tokens`")
        return fails("stalled", msg)
    return fails("stalled", f"{where}: no round plans it again, and it can never finish. Set "
                            f"`req.finish_reason` where a request ends (\"length\", \"stop\", "
                            f"\"eos\")")


def commit_refused(err, run) -> Verdict | None:
    """Lab 4: the engine's refusal of a commit that handed out fewer tokens than its round kept,
    or took one back, without ending the request (round 27: it was told as "your commit
    raised", naming the checker's plug-in), said of the learner's commit.  One that hands out
    other tokens is the checker's own slip first (``lab_runs.CommitSlip``)."""
    if engines(err, CommitStoppedEarly):
        kept, given = show(err.kept), show(err.appended)
        did = (f"took back {counted(err.removed, 'token')} committed before" if err.removed else
               f"appended {given}, {len(err.appended)} of the {len(err.kept)}")
        end = "left it unfinished" if err.ended is None else f"ended it {err.ended!r}"
        fix = ("tokens come back only to cut a stop string off the end, where it ends 'stop'"
               if err.removed else "append each kept token, in order, until the request ends "
               "(EOS, a stop string, its limit): the device goes on from every token the round "
               "kept, so the rest would be text the model never produced")
        return fails("stopped_early", f"{run}: prompt {err.prompt}'s round {err.round} kept "
                                      f"{kept}; your commit {did} and {end}: {fix}")
    return None


def commit_mistake(i: int, got, ref, run, ending, engine) -> Verdict | None:
    """Lab 4: prompt ``i``'s (tokens, text, reason) against the serial run's, the first mistake
    named; ``ending``: how the run's request ends with the engine's own commit."""
    (ids, text, reason), (ref_ids, ref_text, ref_reason) = got, ref
    tok, max_new, stop = engine.tokenizer, run.max_new, run.stop
    if (ids, text, reason) == ref:
        return None
    who = f"{run}: {runs.who(run.prompts, i)}, which ends {ending}"
    if tok.eos_id in ids:
        return fails("eos_kept", f"{who}: its tokens hold the EOS id {tok.eos_id}: EOS ends a request, it is not "
                                 f"one of its tokens")
    if text != tok.decode(ids):
        return fails("text_mismatch", f"{who}: its text {show(text)} is not the text of its "
                                      f"{counted(len(ids), 'token')} "
                                      f"{show(tok.decode(ids))}: cut both alike")
    if (ids, text) == (ref_ids, ref_text):
        return fails("wrong_reason", f"{who}: the right tokens, finished as {reason!r} where the serial run "
                                     f"says {ref_reason!r}")
    if len(ids) > max_new:
        return fails("past_limit", f"{who}: {counted(len(ids), 'token')}, {len(ids) - max_new} "
                                   f"past its limit: a round's "
                                   f"accepted run crossed it and was kept whole. Stop at the limit's token")
    if reason == ref_reason == "stop":
        verdict = _stop_cut_mistake(who, text, ref_text, stop)
        if verdict is not None:
            return verdict
    if ids[: len(ref_ids)] == ref_ids and ref_reason == "eos":
        return fails("past_eos", f"{who}: it goes on after the EOS the serial run stops at: {show(text)}")
    if ids[: len(ref_ids)] == ref_ids and ref_reason == "stop":
        kept = any(text == ref_text + s for s in stop)
        if kept and reason == "length":
            return fails("wrong_reason", f"{who}: the token that completed a stop string was also the limit's, and "
                                         f"your commit ended the request as 'length' with the stop string still in "
                                         f"{show(text)}: the serial run looks at each token, once appended, for a "
                                         f"stop string, then for the limit")
        later = (" (or your commit ended it at a later stop string and missed this one: after "
                 "each token look for every string in `req.stop`; the first completed ends it, "
                 "whatever its place in the list)") if len(stop) > 1 else ""
        return fails("kept_stop" if kept else "missed_stop",
                     f"{who}: the serial run ends at {show(ref_text)} (stop); yours {show(text)}: "
                     + (f"the stop string stays in the text: cut it off{later}" if kept else
                        "the stop string was completed inside a round's run, or across two, and missed"))
    if reason == "stop" and ref_reason == "length" and ref_ids[: len(ids)] == ids:
        msg = (f"{who}: yours ends as 'stop' with {counted(len(ids), 'token')} {show(text)}: "
               f"a stop string completed only by a token past the limit, in the limit's own "
               f"run, ended it. One token at a time, the limit's token ends it first: check the "
               f"limit after each token, not after the run")
        return fails("stop_past_limit", msg)
    if reason == "stop" and any((ref_text + s).rstrip(s) == text != ref_text for s in stop):
        return fails("stopped_early", f"{who}: yours ends at {show(text)}, the serial run at "
                                      f"{show(ref_text)}: `str.rstrip(s)` strips any of the "
                                      f"characters of `s`, not the string; cut `len(s)` off")
    if ref_ids[: len(ids)] == ids:
        return fails("stopped_early", f"{who}: it stops at {counted(len(ids), 'token')}, the "
                                      f"serial run at {len(ref_ids)}")
    return fails("wrong_tokens", f"{who}: {show(text)} where the serial run gives {show(ref_text)}")


def _stop_cut_mistake(who: str, text: str, ref_text: str, stop) -> Verdict | None:
    """Lab 4: a stop cut in the wrong place where both runs end on a stop string: another of two
    strings that end on the same token (the engine cuts the first in ``req.stop``), or the
    whitespace before the stop string stripped too (round 17: both passed)."""
    cut = None
    for s in stop:  # each text the engine could have cut to ref_text: s, the first it ends with
        full = ref_text + s
        ends = [t for t in stop if full.endswith(t)]
        if ends[0] == s:
            cut = next((t for t in ends[1:] if full[: -len(t)] == text), cut)
        if cut is not None:
            break
    if cut is not None:
        first = show(ends[0])
        return fails("stop_tie", f"{who}: {first} and {show(cut)} both end on the same token; "
                                 f"the serial run cuts {first}, the first of them in `req.stop`, "
                                 f"and ends at {show(ref_text)}, yours cut {show(cut)} and ends "
                                 f"at {show(text)}. Look for the strings in the list's order "
                                 f"after each token and cut the first that matches")
    if text != ref_text and text == ref_text.rstrip():
        return fails("stripped_space", f"{who}: yours ends at {show(text)}, the serial run at "
                                       f"{show(ref_text)}: your commit cut the stop string, then "
                                       f"also the whitespace before it. Cut `len(s)` off the text "
                                       f"and the tokens, and nothing more")
    return None
