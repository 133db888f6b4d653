"""Lesson 05 (notebook 05_ownership, exercise 05_lifetime): who owns a request's tokens, its
buffers and its KV cache while a round is in flight.  The notebook's questions are judged
against the learner's own run; the exercise's checker plugs the learner's
``process_outputs`` into the engine and judges what it did to each step.
"""

from __future__ import annotations

from toy_engine.races import RaceError
from toy_engine.engine import Engine
from toy_engine.buffers import BadOutputs
from toy_engine.run import EngineStalled, StageInPlugin, StepProcessedTwice

from . import context, lifetime_runs, pool
from .answers import bare_number, int_set, length, name, one_number, round_number, show
from .errors import at, engines, refused_or_raised
from .harness import exercise_check, notebook_check
from .step_watch import StepWatch, engine_frames, refusal_mistake, text_mistake
from .thread_errors import other_thread
from .verdict import (Verdict, fails, negative_count, no_such_round, not_implemented, passes,
                      unanswered)

__all__ = ["check_uncommitted_rounds", "check_discarded", "check_race_report", "check_process_outputs"]


@notebook_check
@context.given(round=context.whole(0, context.BIG, "the round asked about (4)"))
def check_uncommitted_rounds(answer, launches, round: int) -> Verdict:
    """Predict (05): right after round ``round``'s forward is launched, which rounds were
    launched for the request but not processed yet (their tokens are uncommitted)?

    ``launches`` is the notebook's record of a one-prompt run: per launched forward a tuple
    ``(round, committed tokens, rounds in flight, ...)``.  The prompt is in every round, so
    the rounds in flight are the newest ``in flight`` rounds up to ``round``."""
    if answer is None:
        return unanswered("set `uncommitted` to the set of round numbers, e.g. {1, 2}")
    if bare_number(answer):
        return fails("shape", f"write the set of round numbers, such as {{2, 5}}: one number, {show(answer)}, does "
                              f"not say whether you mean round {show(answer)} or how many rounds")
    got = int_set(answer, rounds=True)
    if got is None:
        return fails("shape", f"write a set of whole round numbers such as {{2, 5}}, not {show(answer)}")
    if min(got, default=0) < 0:
        return no_such_round(min(got))
    rows = {}
    try:
        for row in launches:
            rows[int(row[0])] = (int(row[1]), int(row[2]))
    except (TypeError, ValueError, IndexError):
        return fails("setup", "pass the record of watch_launches: one (round, committed, in flight, text) per launch")
    if round not in rows:
        return fails("setup", f"this record has no launch of round {round} (it has rounds {sorted(rows)}): "
                              f"run it with more new tokens")
    committed, in_flight = rows[round]
    want = set(range(round - in_flight + 1, round + 1))
    shown = sorted(want)
    if got == want:
        if in_flight == 1:
            return passes(f"{shown}: only the round just launched; every earlier round was waited for and "
                          f"processed before it, so the request already holds {committed} tokens")
        return passes(f"{shown}: round {round} was just launched, and round {round - 1}'s token is on the "
                      f"device, in StepState(round={round - 1})'s output slot, until the host processes it "
                      f"after this launch. The request holds {committed} committed tokens")
    unknown = sorted(r for r in got if r > round)
    if unknown:
        return fails("not_launched_yet",
                     f"round {unknown[0]} was not launched yet when round {round}'s forward was: only "
                     f"rounds 0 to {round} exist at that moment")
    if round not in got:
        return fails("misses_current_round",
                     f"round {round} itself counts: its forward was just launched, so none of its tokens "
                     f"can be committed yet")
    if want - got:
        return fails("misses_in_flight",
                     f"a launched round is missing: under ZOS the host processes a decode round only after "
                     f"launching the next round's forward, so its token waits on the device in its StepState's "
                     f"output slot. The request holds {committed} committed tokens at this moment")
    extra = sorted(got - want)
    return fails("already_processed",
                 f"round {extra[-1]} is already processed: its token is among the {committed} the request "
                 f"holds (the host waited for it {'before' if in_flight == 1 else 'one iteration before'} "
                 f"this launch)")


@notebook_check
def check_discarded(answer, engine, name: str = "discarded") -> Verdict:
    """Predict (05): how many outputs did ``engine``'s last run discard (its
    ``stats.discarded_outputs``): rounds that came back for requests already finished?
    ``name`` is the answer's variable in the notebook, for the unanswered message."""
    answer = one_number(answer, f"set `{name}` to a whole number of discarded outputs",
                        "a count of discarded outputs is one whole number", whole=True)
    if isinstance(answer, Verdict):
        return answer
    run = context.run_fields(engine, ("stats.discarded_outputs", context.count),
                             ("config.mode", context.text),
                             ("config.num_draft_tokens", context.count),
                             ("requests[].finish_reason", context.text_or_none))
    if isinstance(run, str):
        return fails("setup", f"pass the engine whose run the question is about (and run it "
                              f"first): {run}")
    want, mode, drafts, reasons = run
    early = sum(r in ("stop", "eos", "abort") for r in reasons)
    ended = (f"in this run {early} request(s) ended by a stop string, EOS or abort and "
             f"{reasons.count('length')} by the length limit")
    if answer == want:
        if want == 0 and mode == "serial":
            why = ("the serial host processes every round before launching the next, so a finished request is "
                   "never in a launched round")
        elif want == 0:
            why = "no launched round held a request when the host learned that it had finished"
        else:
            why = ("each is a round that was launched with a request before the host learned that the request had "
                   "finished (the extra step); its tokens are dropped when they land")
        return passes(f"{want}: {why}; {ended}")
    if answer < 0:
        return negative_count(answer)
    if want > 0 and answer == 0 and reasons.count("abort") and early == reasons.count("abort"):
        return fails("missed_abort_round",
                     f"an abort takes effect at once, but under ZOS was a round with the request in it already "
                     f"launched and not yet processed? Its output would come back to a finished request; {ended}")
    if want > 0 and answer == 0:
        return fails("missed_extra_step",
                     f"under ZOS the host learns that a request finished only when it processes that round, after "
                     f"the next round was launched: was the request in it? Count the outputs that came back for "
                     f"finished requests; {ended}")
    if want == 0 and mode == "serial":
        return fails("serial_discards_nothing",
                     f"the serial host waits for and processes each round before launching the next: can a "
                     f"finished request be in a launched round? {ended}")
    if want == 0:
        return fails("nothing_discarded",
                     f"a prefill round is processed at once, and a length limit is counted in advance: which "
                     f"launched round could still hold a request when it finished? {ended}")
    if answer > want and not drafts:
        return fails("too_many", f"too many: without drafts a request that ends by stop, EOS or abort is in at most "
                                 f"one launched round the host did not know about, and a length limit never causes "
                                 f"one (the scheduler counts in-flight rounds); {ended}")
    return fails("wrong", f"{answer} is not it: count the launched rounds that still held a request when the host "
                          f"learned that it had finished; {ended}")


def _race_answer(answer) -> tuple[tuple[str, int] | None, str | None]:
    pair = (answer.get("buffer"), answer.get("round")) if isinstance(answer, dict) else answer
    if isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or length(pair) != 2:
        return None, f"write a pair (buffer name, round), e.g. (\"out1\", 3), not {show(answer)}"
    buffer, round = name(pair[0]), round_number(pair[1])
    if buffer is None or round is None:
        return None, f"write the buffer's name as a string and the round as a whole number, e.g. (\"out1\", 3), " \
                     f"not {show(answer)}"
    return (buffer, round), None


@notebook_check
def check_race_report(answer, err) -> Verdict:
    """Predict (05): with NUM_SLOTS = 1, which buffer will the race checker name, and the
    launch of which round still uses it?  ``err`` is the RaceError the run raised."""
    if answer is None:
        return unanswered("set `race_guess` to a pair (buffer name, round)")
    parsed, problem = _race_answer(answer)
    if parsed is None:
        return fails("shape", problem)
    if not engines(err, RaceError) or err.kind != "buffer":
        return fails("setup", "this run raised no buffer race: run it with te.engine.NUM_SLOTS = 1 on an engine "
                              "with the race checker on (race_check=True)")
    buffer, round = parsed
    want_buffer, want_round, launch = err.buffer, err.round, err.launch
    kind = want_buffer.rstrip("0123456789")
    if round < 0:
        return no_such_round(round)
    if (buffer, round) == (want_buffer, want_round):
        return passes(f"{want_buffer} and round {want_round}: round {want_round + 1}'s prepare writes the "
                      f"one metadata slot while round {want_round}'s {launch}, the step the loop still holds "
                      f"as `previous`, may not have read it yet. The checker: {err}")
    if buffer.rstrip("0123456789") == kind and buffer != want_buffer:
        return fails("wrong_slot", f"{show(buffer)}: with NUM_SLOTS = 1, which slot does every round use?")
    if buffer != want_buffer:
        if buffer.startswith("out"):
            why = ("the host reads an output slot only after waiting on its round's event: which buffer does the "
                   "next round's prepare write before anyone waited?")
        else:
            why = "which buffer does prepare write first? The race checker stops at the first unordered access"
        return fails("wrong_buffer", f"{show(buffer)}: {why}")
    if round == want_round + 1:
        return fails("writing_round",
                     f"round {round} is the round whose prepare writes {buffer}; the report names the launch that "
                     f"still reads it, one the host has not waited for yet")
    if round < want_round:
        return fails("earlier_round", f"round {round} was waited for before the host touched {want_buffer} again (the "
                                      f"prefill is processed at once, and ZOS waits on round N-1 in iteration N): the "
                                      f"first unordered access is one round later")
    return fails("wrong", f"round {round} is not it: the checker stops at the first host write that no wait has "
                          f"ordered after a launch using {want_buffer}")


# ------------------------------------------------------------------ exercise 05

def _who_step(step) -> str:
    kind = "prefill" if step.plan.is_prefill else "decode"
    return f"round {step.plan.round} ({kind}, prompts {[r.index for r in step.plan.requests]})"


def _step_mistake(call, reference) -> Verdict | None:
    """The first rule a single call broke: wait on the step's own event, commit once, free
    exactly the finished requests no launched round uses, leave the pool whole, end no request
    (``reference``: the run's completions, as the engine's own process_outputs ends them)."""
    who = _who_step(call["step"])
    for rule in (_wait_mistake, _free_mistake, lifetime_runs.pool_mistake, _commit_mistake,
                 text_mistake, refusal_mistake):
        verdict = rule(call, who)
        if verdict is not None:
            return verdict
    return lifetime_runs.reason_mistake(call, who, reference)


def _wait_mistake(call, who: str) -> Verdict | None:
    step = call["step"]
    if call.get("forgotten"):
        return fails("edits_race_checker",
                     f"{who}: your process_outputs took launch(es) {call['forgotten']} off the "
                     f"engine's list of unwaited launches (`engine.device.races`, "
                     f"`engine.device.run_record`) without waiting on them: those books are the "
                     f"engine's, and only a wait clears them. Wait on `step.sample_done`, then "
                     f"read, commit and free")
    later = [seq for seq, _, _, _ in call["waits"] if seq > step.sample_done.seq]
    if later:
        return fails("waits_later_event", who)  # the message, with its cost, is written by the caller
    earlier = [rnd for seq, _, _, rnd in call["waits"] if seq < step.sample_done.seq]
    if earlier and all(seq != step.sample_done.seq for seq, _, _, _ in call["waits"]):
        return fails("waits_other_event",
                     f"{who}: your process_outputs waited on another step's event (one of round {earlier[-1]}) "
                     f"instead of this step's own `step.sample_done`: round {step.plan.round}'s sample may still "
                     f"be writing the tokens you then read. Wait on the `sample_done` of the step you were given")
    if call.get("unread_commit"):  # a read the run's record did not see (round 45)
        return fails("unchecked_read",
                     f"{who}: your process_outputs committed tokens it did not read through the "
                     f"engine (`engine.read_outputs(step)`, or `engine.device.host(...)`): a read "
                     f"of the shared buffer behind the race checker's back (`engine.device."
                     f"buffers`, or with the device's books swapped) can come before the device "
                     f"wrote it. Wait on `step.sample_done`, then `engine.read_outputs(step)`")
    if call.get("unwaited_reads") and not call["refused"]:  # the checker's books were changed
        return fails("read_before_wait",
                     f"{who}: you read the step's sampled tokens (`{call['unwaited_reads'][0]}`) "
                     f"before any wait on its completion event: with race checking off "
                     f"(benchmarks, a real GPU) that read returns whatever the slot held. Wait "
                     f"on `step.sample_done` first: the wait is the permission to read")
    early = [r for r in call["refused"] if r.buffer.startswith("out")]
    if early and not call.get("raised"):
        return fails("read_before_wait",
                     f"{who}: you read the step's sampled tokens (`{early[0].buffer}`) before waiting on its "
                     f"completion event; the race checker refused that read, and your code caught the error and "
                     f"read again after a wait. The refusal is the bug: with race checking off (benchmarks, a "
                     f"real GPU) the first read returns whatever the slot held. Wait on `step.sample_done` "
                     f"first: the wait is the permission to read")
    return None


def _free_mistake(call, who: str) -> Verdict | None:
    holders = call["holders"]
    for free in call["frees"]:
        # a request freed in an earlier step holds nothing now: the free itself names it
        prompts = sorted({holders[b] for b in free.blocks if b in holders}) or [free.prompt]
        if free.double:
            return fails("double_free",
                         f"{who}: your process_outputs freed the KV blocks of prompt(s) {prompts} "
                         f"a second time (blocks {list(free.double)} were freed already). The "
                         f"engine refused it, but a pool that took them back twice would hand one "
                         f"block to two requests. Free each finished request once: "
                         f"`engine.scheduler.release_if_done(req)` frees only what is still held")
        if free.in_use:
            rnd, stage = free.in_use[0]
            swallowed = " (the race checker refused it; catching its error does not make the free safe)" \
                if free.refused and not call.get("raised") else ""
            return fails("free_in_use",
                         f"{who}: you freed the KV cache of prompt(s) {prompts} (blocks {sorted(free.blocks)}) "
                         f"while round {rnd}'s `{stage}`, launched and not yet waited for, still uses it{swallowed} "
                         f"(the extra step: under ZOS the finished request is already in the next launched round). "
                         f"Free a finished request only when `req.num_inflight == 0`")
    return None


def _commit_mistake(call, who: str) -> Verdict | None:
    step = call["step"]
    if call.get("raised"):
        return None  # judged by its exception
    reqs = call["requests"]
    commits = [c for c in call["commits"] if c.round == step.plan.round]
    if len(commits) > 1:
        return fails("committed_twice",
                     f"{who}: your process_outputs had the step committed {len(commits)} times (prompts "
                     f"{[r.index for r in reqs]}); a second commit would add its tokens twice. Call "
                     f"`engine.commit_outputs(step, out)` exactly once per step")
    if call["plan_changed"]:
        return fails("plan_changed",
                     f"{who}: your process_outputs changed `step.plan.requests`. The plan is the record of what "
                     f"was launched in round {step.plan.round}: its output slot holds one row per request in it, "
                     f"in that order, so `commit_outputs` needs it whole. Leave the plan alone and decide per "
                     f"request what to free after committing")
    for req, (n0, _), (n1, finished, holds, running) in zip(reqs, call["before"], call["after"]):
        if not commits:
            return fails("never_committed",
                         f"{who}: after your process_outputs, prompt {req.index} still counts round "
                         f"{step.plan.round} as launched and unprocessed: the step's tokens were never committed. "
                         f"Call `engine.commit_outputs(step, out)` once per step")
        if n1 != n0 - 1:
            return fails("inflight_changed",
                         f"{who}: prompt {req.index}'s count of launched, unprocessed rounds went from {n0} to "
                         f"{n1} in your process_outputs, though the step was committed once. `commit_outputs` "
                         f"already lowers `num_inflight` by one per request; changing it yourself makes the host's "
                         f"plan for the next rounds wrong (how many tokens are in flight). Leave it to the commit")
    for req, (_, finished, holds, running) in zip(reqs, call["after"]):
        if not finished and not running:
            return fails("freed_unfinished",
                         f"{who}: your process_outputs freed prompt {req.index}, which is not finished: it "
                         f"lost its batch row and cache and can never produce its next tokens. Free only "
                         f"finished requests (`req.finished and req.num_inflight == 0`)")
    for req, (n1, finished, holds, running) in zip(reqs, call["after"]):
        if finished and n1 == 0 and holds:
            return fails("kept_blocks",
                         f"{who}: {lifetime_runs.ended([req])}, and no launched round uses it "
                         "any more (num_inflight == 0), but your process_outputs kept "
                         f"{lifetime_runs.kept(holds, running)}: a request finishes at its "
                         "limit, at a stop string, on EOS or by an abort, and each must be "
                         "freed: free it after committing (`engine.scheduler.free(req)` or "
                         "`engine.scheduler.release_if_done(req)`), or waiting requests never "
                         "start")
    return None


@exercise_check(lifetime_runs.warm, calls="process_outputs(engine, step)")
def check_process_outputs(process_outputs) -> Verdict:
    """Exercise 5: ``process_outputs(engine, step)`` waits, reads, commits and frees; judged on
    runs whose requests end at the limit, a stop string, EOS and by an abort, with drafts or not."""
    for run in lifetime_runs.RUNS:
        verdict = _judge_run(process_outputs, run)
        pool.whole_again(lifetime_runs.run_engine(run))
        if verdict is not None:
            if run.label:
                verdict.message = f"{run.label}: {verdict.message}"
            return verdict
    return passes("each step's results are read only after waiting on its own event, committed "
                  "once, and caches are freed as soon as no launched round can touch them, for "
                  "requests that end at the limit, a stop string, EOS and by an abort, with drafts "
                  "and without")


def _judge_run(process_outputs, run: lifetime_runs.Run) -> Verdict | None:
    engine = lifetime_runs.run_engine(run)
    reference = lifetime_runs.completions(run)
    watch, attributes = StepWatch(engine, process_outputs), pool.names_of(engine)
    try:
        outs = watch.generate(list(run.prompts), on_round=lifetime_runs.aborter(run.abort),
                              **dict(run.args))
        err = None
    except NotImplementedError:
        return not_implemented("`process_outputs`")
    except Exception as exc:  # noqa: BLE001 - judged below
        outs, err = None, exc
    finally:
        edits = pool.shadowing(attributes)
        pool.forget_edits(attributes)
    if edits:
        return fails("edits_engine",
                     f"your process_outputs set `{edits[0]}`: the checkers' engines are shared "
                     f"by every check, so a plug-in may call the engine's methods but not replace "
                     f"them (the change was undone). Try such experiments on an engine of your "
                     f"own, `Engine(EngineConfig(...))`")
    if engine._run.other_thread is not None:  # first: what followed is the refused call's absence
        return other_thread(engine._run.other_thread, "which went on as though the call had "
                            "been made", "process_outputs", "Wait, read, commit and free")
    mistake = next((m for m in (_step_mistake(c, reference) for c in watch.calls)
                    if m is not None), None)
    if mistake is not None and mistake.category == "waits_later_event":
        return lifetime_runs.waited_too_long(mistake, engine, watch)
    if mistake is not None:
        return mistake
    if err is not None:
        return _raised(watch, err, engine, reference)
    diff = pool.compare([c.token_ids for c in outs], [c.token_ids for c in reference])
    if diff:
        return fails("wrong_tokens", f"{diff}: commit every step's tokens exactly once, from its own output slot")
    leaked = [r for r in engine.requests if r.blocks]
    if leaked:
        return fails("kept_blocks", f"{lifetime_runs.ended(leaked)}, but kept their KV "
                                    f"blocks at the end of "
                                    "the run: "
                                    f"free them once no launched round uses them")
    return lifetime_runs.lost_blocks(engine, watch)


def _raised(watch: StepWatch, err: Exception, engine: Engine, reference) -> Verdict:
    """A lesson-level message for an exception out of a run with the learner's plug-in."""
    if engines(err, RaceError):
        call = watch.calls[-1] if watch.calls else {}
        who = _who_step(call["step"]) if call else f"round {err.round}"
        if err.kind == "buffer" and err.buffer.startswith("out"):
            return fails("read_before_wait",
                         f"{who}: you read the step's sampled tokens (`{err.buffer}`) before waiting on its "
                         f"completion event (`step.sample_done`): round {err.round}'s `{err.launch}` may still be "
                         f"writing them. The wait is the permission to read: wait first")
        if err.kind == "free_in_use":
            owners = sorted({call["holders"][b] for b in err.blocks if b in call.get("holders", {})})
            return fails("free_in_use",
                         f"{who}: you freed the KV cache of prompt(s) {owners} (blocks {err.blocks}) while round "
                         f"{err.round}'s `{err.launch}`, launched and not yet waited for, still uses it (the "
                         f"extra step: under ZOS the finished request is already in the next launched round). "
                         f"Free a finished request only when `req.num_inflight == 0`")
        return fails("race", f"{who}: the race checker stopped the run ({err.kind}): {err}")
    if engines(err, BadOutputs) and watch.calls:  # refused in commit_outputs, in a watched call
        return lifetime_runs.bad_outputs(err, _who_step(watch.calls[-1]["step"]), watch.calls[-1])
    if engines(err, StepProcessedTwice):
        call = watch.calls[-1] if watch.calls else {}
        who = _who_step(call["step"]) if call else f"round {err.round}"
        return fails("committed_twice",
                     f"{who}: your process_outputs had the step committed 2 times (prompts "
                     f"{err.prompt_indexes}); the engine refused, since the tokens would be added twice. Call "
                     f"`engine.commit_outputs(step, out)` exactly once per step")
    if engines(err, EngineStalled):
        return lifetime_runs.stalled(err, engine, reference)
    if engines(err, StageInPlugin):  # the engine refuses a stage inside the plug-in
        return lifetime_runs.stage_called(err.stage)
    frames = engine_frames(err) if isinstance(err, RecursionError) else {}
    again = [stage for stage in ("flush", "process_outputs") if frames.get(stage, 0) > 1]
    if again:  # the engine ran the plug-in again: not the learner's own recursion
        return lifetime_runs.stage_called(again[0], refused=False)
    refused = lifetime_runs.refused_tokens(
        err, _who_step(watch.calls[-1]["step"]) if watch.calls else "in this run")
    if refused is not None:
        return refused
    return fails("raised", f"your process_outputs {refused_or_raised(err)}{at(err)}")

