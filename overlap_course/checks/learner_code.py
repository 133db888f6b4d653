"""Running a learner's loop on a shared engine (exercises 02 and 03), watched as it runs, and
what stopped it named in the lesson's terms -- never raised to the learner.  Exercise 05's
``process_outputs`` plug-in is watched by ``step_watch``.
"""

from __future__ import annotations

from toy_engine.device import DeviceError
from toy_engine.races import RaceError
from toy_engine.run import (EngineStalled, ForeignStep, PreparedTwice, SampleBeforeForward,
                            StaleInputs)
from toy_engine.record import Commit, Refused, Schedule
from toy_engine.refusals import DraftsTooDeep, EndTakenBack, PlannedSince
from toy_engine.validate import plugin_label

from . import pool
from .engine_view import EngineEdited, EngineView, Spinning
from .run_edits import (RequestWatch, drafts_too_deep, dropped_at_prefill, end_taken_back,
                        kept_by_edit, settings, settings_edit, spun_by_edit, unplanned_by_edit)
from .errors import at, engines, quoted, said
from .refusals_caught import caught_refusal
from .thread_errors import other_thread
from .host_order import (HostLog, common_mistakes, corrected_old_inputs, prepared_twice,
                         sample_before_forward)
from .plan_order import plan_order, planned_since, scheduled_ahead
from .verdict import Verdict, counted, fails, not_implemented
from .whose_loop import around_view


class _PastTheEnd(Exception):
    """A learner's loop went on after ``schedule()`` returned None with every request finished:
    with that None (``args``: last round, the error it hit, calls after), or, skipping it, with
    more ``schedule()`` calls (last round, None or the checker's Spinning, how many): a loop
    of a fixed number of rounds, which a longer run would cut short (blind round 23)."""


def _edited(name: str, what: str) -> Verdict:
    return fails("edits_engine",
                 f"your loop set `engine.{name}`, {what}: the checkers' engines are shared by "
                 f"every check, so a loop may call the engine's methods and read its attributes "
                 f"but not replace them (nothing was changed, and the run stopped there). The "
                 f"loop's own state is fine in local variables (`previous = None`) or on the "
                 f"engine under a new name of your own (`engine.previous`). Try replacing the "
                 f"engine's parts on an engine of your own, `Engine(EngineConfig(...))`")


def _spinning(calls: int) -> Verdict:
    return fails("spins",
                 f"your loop called `engine.schedule()` {calls} times without finishing (the reference loops need "
                 f"about 50 rounds here), so the checker stopped it. It probably catches the engine's errors and "
                 f"tries again (`except Exception: pass`): let them out, and the checker says what went wrong")


def run_loop(loop, second: bool = False, endings: bool = False, workload=None, **config):
    """Run a learner's loop on the pool's PROMPTS (``second``: exercise 02's second run, with a
    stop string; ``endings``: the endings run instead, ENDINGS_PROMPTS; ``workload``: a check's
    own (prompts, generate's arguments)): (engine, its HostLog, outputs or None, the exception
    that stopped it or None)."""
    engine = pool.engine(**config)
    prompts, args = (pool.ENDINGS_PROMPTS,
                     pool.ENDINGS_RUN) if endings else (pool.PROMPTS, pool.run_args(second))
    if workload is not None:
        prompts, args = workload
    observed, attributes = {}, pool.names_of(engine)

    def watched(real_engine):
        view = EngineView(real_engine, RequestWatch(real_engine._run.requests))
        observed["view"], observed["settings"] = view, settings(real_engine._run.requests)
        try:
            loop(view)
        finally:
            view.watch.look()
    watched.label = plugin_label(loop)  # the engine's messages name the learner's loop

    try:
        outs = engine.generate(prompts, loop=watched, **args)
        err = None
    except (Exception, Spinning) as exc:  # noqa: BLE001 - judged below, never raised to the learner
        outs, err = None, exc
    finally:
        pool.forget_edits(attributes)
    view = observed.get("view")
    if view is not None and view.edits:
        err = EngineEdited(*view.edits[0])
    elif view is not None and view.done_at is not None and (
            isinstance(err, (AttributeError, TypeError)) or view.past_end and (
                err is None or isinstance(err, Spinning))):
        err = _PastTheEnd(view.done_at, err, view.past_end)
    log = HostLog(engine, view.plans if view else {})
    log.stale, log.caught = (view.stale, view.caught) if view is not None else ([], [])
    log.engine_loop = view.engine_loop if view is not None else None
    planned = {e.round for e in engine.record.of(Schedule) if e.round is not None}
    log.around_view = sorted(planned - set(view.plans)) if view is not None else []
    log.settings_edit = settings_edit(observed.get("settings", []), log.requests)
    log.watch = view.watch if view is not None else RequestWatch([])
    log.record_commits = engine.record.of(Commit)
    if endings:
        log.reference = pool.endings_reference()
    return engine, log, outs, err


def _stopped_by_checker(err) -> Verdict | None:
    """The verdict for a run the checker itself stopped: the loop edited the engine, or spun."""
    if isinstance(err, EngineEdited):
        return _edited(*err.args)
    if isinstance(err, Spinning):
        return _spinning(err.args[0])
    if isinstance(err, _PastTheEnd):
        last, cause, again = err.args
        went = (f"went on with it ({quoted(cause)})" if isinstance(cause, Exception) else
                f"went on: it called `engine.schedule()` {again} more time(s)")
        return fails("none_plan",
                     f"after round {last} every request had finished, so `engine.schedule()` returned None, and "
                     f"your loop {went}. A request can end early, at a "
                     f"stop string or EOS, so neither a number of rounds nor a number of tokens says when the work "
                     f"is done: loop while `engine.scheduler.has_work()`")
    return None


def loop_verdict(log: HostLog, err, mode: str, in_order) -> Verdict | None:
    """What went wrong in a learner's loop run, first thing first: not written yet, stopped
    by the checker, a mistake either loop makes, this mode's order (``in_order``), a crash.
    (Verdicts are falsy when failed, hence the explicit ``is None`` chain.)"""
    if isinstance(err, NotImplementedError):
        return not_implemented("`serial_loop`" if mode == "serial" else "`zos_loop`")
    if log.around_view:  # first: nothing the checker read of such a run is the loop's own
        return around_view(log.around_view)
    if log.other_thread is not None:  # first: what followed is the refused call's absence
        return other_thread(log.other_thread,
                            None if err is log.other_thread else
                            f"which returned with prompts {err.prompt_indexes} unfinished"
                            if engines(err, EngineStalled) else
                            "which went on as though the call had been made")
    verdict = _stopped_by_checker(err)
    if verdict is not None and verdict.category == "spins":  # an edit, what was left unfinished
        edited = spun_by_edit(log, err.args[0])
        verdict = verdict if edited is None else edited
        left = [r.index for r in log.requests if r.finish_reason == "abort"]
        verdict.message += log.stopped_at(left)
    if verdict is None and engines(err, ForeignStep):
        verdict = _foreign_step(log, err)
    if verdict is None and engines(err, SampleBeforeForward):
        # the run stopped at the refused sample: whether a forward would have come later is
        # not known (blind round 51: a loop with none was told the sample "came before" it)
        verdict = sample_before_forward(log, err.round, "was called with no `launch_forward` "
                                                        "of the round before it")
    if verdict is None and engines(err, PreparedTwice):
        verdict = prepared_twice(log, err.round, err.latest)
    if verdict is None and engines(err, PlannedSince):
        verdict = planned_since(log, err.round)
    if verdict is None and (since := next((c for _, _, c in log.caught
                                           if engines(c, PlannedSince)), None)):
        verdict = scheduled_ahead(log, since.round, f" with `PlannedSince`, and your loop caught "
                                                    f"the error and went on without round "
                                                    f"{since.round}")
    if verdict is None and engines(err, EndTakenBack):
        verdict = end_taken_back(err)
    if verdict is None and engines(err, DraftsTooDeep):
        verdict = drafts_too_deep(log, err)
    if verdict is None:
        verdict = common_mistakes(log)
    if verdict is None:
        verdict = in_order(log)
    if verdict is None and err is not None:
        verdict = _crash(log, err, mode)
    if verdict is None and log.refused:
        verdict = _swallowed(log.refused[0])
    if verdict is None and log.stale:  # refused, caught: the loop went on as though it ran
        verdict = _stale_inputs(log, log.stale[0], ", and your loop caught the error and went on")
    if verdict is None and log.caught:
        verdict = caught_refusal(log.caught[0])
    return verdict


def _foreign_step(log: HostLog, err: ForeignStep) -> Verdict:
    """The loop processed a step (or prepared a plan) another run made: the engine refused it,
    so this run's own rounds were not processed twice (what the record alone would say)."""
    at = f"at round {max(log.rounds)} of this run, " if log.rounds else ""
    if err.what == "plan":
        return fails("foreign_step",
                     f"{at}your loop prepared round {err.round}'s plan, which this run never "
                     f"scheduled: it is left from another run (an earlier generate or check, on "
                     f"this engine or another), kept in a global, a default argument or an "
                     f"attribute. Its requests, KV blocks and rows are that run's, so the engine "
                     f"refused it. Prepare the plan this iteration's `engine.schedule()` returned")
    return fails("foreign_step",
                 f"{at}your loop processed round {err.round}'s StepState, which this run never "
                 f"launched: it is left from another run (an earlier generate or check, on this "
                 f"engine or another, that returned or was interrupted), kept in a global, a "
                 f"default argument or an attribute. Its event, output slot and requests are that "
                 f"run's, so the engine refused it. Keep `previous` a local of the loop, `None` at "
                 f"its start")


def _swallowed(refusal) -> Verdict:
    """The race checker refused something and the learner's code caught the error: what was
    refused, with the refusal's own fix (no wait is missing before a second free: free once)."""
    if isinstance(refusal, Refused):
        what = (f"a host {'read' if refusal.access == 'r' else 'write'} of `{refusal.buffer}` while round "
                f"{refusal.round}'s `{refusal.launch}` still used it")
    elif refusal.in_use:
        what = (f"a free of KV blocks {list(refusal.blocks)} while round {refusal.in_use[0][0]}'s "
                f"`{refusal.in_use[0][1]}` still used them")
    else:
        return fails("double_free",
                     f"the engine refused a second free of KV blocks {list(refusal.double)} "
                     f"(prompt {refusal.prompt}'s), and your code caught the error and went on. "
                     f"The refusal is the bug report: they were freed already, and a pool that "
                     f"took them back twice would hand a block to two requests. Free a request "
                     f"once (`engine.process_outputs(step)` frees the finished ones; "
                     f"`engine.scheduler.release_if_done(req)` frees only what is still held) "
                     f"instead of catching the error")
    return fails("race",
                 f"the race checker refused {what}, and your code caught the error and went on. The refusal is "
                 f"the bug report: with race checking off (as in benchmarks, or on a real GPU) that access "
                 f"happens, and it races with the device. Wait on the right event first instead of catching "
                 f"the error")


def _crash(log: HostLog, err: BaseException, mode: str) -> Verdict:
    """A lesson-level message for an exception out of a learner's loop."""
    if engines(err, EngineStalled):
        return _stalled(log, err, mode)
    if engines(err, RaceError):
        return _raced(log, err)
    if engines(err, StaleInputs):
        return _stale_inputs(log, err)
    verdict = _went_on_without_plan(log, err, mode)
    if verdict is not None:
        return verdict
    if isinstance(err, DeviceError):
        return fails("device_error", f"a launch failed on the device: {said(err)}. Check that "
                                     f"each round is prepared, then its forward launched, then "
                                     f"its sample")
    return fails("raised", f"your loop raised {quoted(err)}{at(err)}")


def _stale_inputs(log: HostLog, err: StaleInputs, caught: str = "") -> Verdict:
    """A launch given inputs that are not the device's latest upload (the engine refused it;
    ``caught``: said where the loop caught the refusal and went on)."""
    if err.foreign:
        return fails("foreign_step",
                     f"your loop called `engine.{err.stage}` with round {err.round}'s inputs, "
                     f"which this run never prepared: they are left from another run (an earlier "
                     f"generate or check), kept in a global, a default argument or an attribute. "
                     f"Launch what this iteration's `engine.prepare_inputs(plan)` returned")
    if err.stage == "correct_on_device" and log.first("launch_sample", err.round) is not None:
        return corrected_old_inputs(log, err.round, f", after round {err.latest}'s were prepared"
                                                    f" (the engine refused it{caught})")
    again = " again" if log.first(err.stage, err.round) is not None else ""
    return fails("inputs_replaced",
                 f"{log.who(err.round)}: your loop called `engine.{err.stage}`{again} with its "
                 f"inputs after round {err.latest}'s were prepared. The device holds one round's "
                 f"inputs, the latest upload, so it would have worked on round {err.latest}'s "
                 f"metadata as round {err.round}'s (the engine refused it{caught}). Launch a round "
                 f"(`launch_forward(inputs)`, `launch_sample(inputs)`) with the inputs that "
                 f"`prepare_inputs(plan)` just returned, before preparing the next round")


def _stalled(log: HostLog, err: EngineStalled, mode: str) -> Verdict:
    unprocessed = [r for r in log.rounds if log.first("launch_sample", r) is not None and not log.processing(r)]
    if err.reason == "loop_returned_with_work":  # an empty stub never reached round 0
        when = f"after round {max(log.rounds)}" if log.rounds else "before it ran any round"
        return fails("loop_returned",
                     f"your loop returned {when} while prompts "
                     f"{err.prompt_indexes} still had tokens to produce: loop while "
                     f"`engine.scheduler.has_work()` (or `while True` with a `break` only when it has none)")
    if err.reason == "unprocessed_inflight" and unprocessed:
        r = unprocessed[0]
        held = [log.requests[i] for i in log.plans.get(r, ())]
        if held and all(q.finish_reason in ("eos", "stop",
                                            "length") and max(log.committed.get(q.index, [r])) < r
                        for q in held):  # finished before round r, whose step then held only them
            return fails("skipped_extra_step", skipped_step_message(log, r, held))
        if mode == "zos" and r not in log.prefill and r + 1 in log.prefill:
            return dropped_at_prefill(log, r, f"so prompts {err.prompt_indexes} lost its tokens"
                                              f"{log.stopped_at(err.prompt_indexes)}")
        if mode == "zos":
            return fails("no_flush",
                         f"{log.who(r)}: its step was launched but never processed, so prompts "
                         f"{err.prompt_indexes} lost their last "
                         f"token(s){log.stopped_at(err.prompt_indexes)}. "
                         f"When `engine.schedule()` returns "
                         f"None there is no next round to hide the deferred step under: process it with "
                         f"`previous = engine.flush(previous)` before you call `engine.schedule()` "
                         f"again (a second call plans nothing either), then keep looping")
        return fails("never_processed",
                     f"{log.who(r)}: its step was launched but never processed, so prompts "
                     f"{err.prompt_indexes} never received its "
                     f"tokens{log.stopped_at(err.prompt_indexes)}: "
                     f"every launched step must be waited "
                     f"for and processed (`engine.process_outputs(step)`)")
    if err.reason == "finished_kept_blocks":
        edit = kept_by_edit(log, err.prompt_indexes)
        return fails("edits_requests", edit) if edit else fails("kept_blocks",
                                                                kept_blocks_message(log, err))
    edit = unplanned_by_edit(log, err.prompt_indexes) if err.reason == "not_planned" else None
    if edit is not None:
        return fails("edits_requests", edit)
    unlaunched = [r for r in log.rounds if log.first("launch_sample", r) is None]
    if err.reason == "unprocessed_inflight" and unlaunched:
        return never_launched(log, unlaunched[0])
    return fails("stalled", f"the engine could not go on (prompts {err.prompt_indexes})"
                            f"{log.stopped_at(err.prompt_indexes)}: {err}")


def never_launched(log: HostLog, r: int, then: str = "") -> Verdict:
    """Round ``r`` was prepared, and its sample never launched: its requests wait for it (or,
    ``then``: what the loop did next)."""
    forward = (", its forward launched but never its sample"
               if log.first("launch_forward", r) is not None else "")
    then = then or (": its requests now count a round in flight that will never produce a "
                    "token, so the run could not go on")
    return fails("never_launched",
                 f"{log.who(r)} was prepared but never launched{forward}{then}. Launch every "
                 f"round you prepare, `engine.launch_forward(inputs)` then "
                 f"`engine.launch_sample(inputs)`, and process its step")


def skipped_step_message(log: HostLog, r: int, held) -> str:
    """A step whose requests had all finished was never processed (thought to be only discarded)."""
    ended = "; ".join(f"prompt {q.index} ({q.prompt!r}) had ended {_ENDED.get(q.finish_reason)} "
                      f"after {counted(len(q.output_ids), 'token')}" for q in held[:3])
    return (f"{log.who(r)}: its step was never processed, and the engine could not go on: {ended}. "
            f"The round was launched before the host knew that (the extra step), so its tokens are "
            f"discarded, but only processing it says so: `commit_outputs` lowers each request's "
            f"`num_inflight`, and a finished request is freed only once that is 0. Process every "
            f"launched step, even one whose requests have all finished")


def kept_blocks_message(log: HostLog, err: EngineStalled) -> str:
    """Finished requests kept their rows and blocks: name each one's ending and who waited."""
    kept = [log.requests[i] for i in err.prompt_indexes]
    ended = "; ".join(f"prompt {r.index} ({r.prompt!r}) ended "
                      f"{_ENDED.get(r.finish_reason, 'by an abort')} "
                      f"after {counted(len(r.output_ids), 'token')}" for r in kept[:3])
    waiting = [r.index for r in log.requests if not r.output_ids and r not in kept]
    blocked = (f", so prompts {waiting} never got a batch row" if waiting else
               ", so the scheduler always had work and the run could not end")
    return (f"the engine could not go on: {ended}, but kept its KV blocks and batch row{blocked}. "
            "A "
            "request can finish four ways, by its limit, a stop string, EOS or an abort, and "
            "every "
            f"finished request must be freed once no launched round uses it (`req.finished and "
            f"req.num_inflight == 0`: `engine.scheduler.release_if_done(req)`)")


_ENDED = {"eos": "on EOS (its story ended)", "stop": "at a stop string", "length": "at its limit"}


def _raced(log: HostLog, err: RaceError) -> Verdict:
    if err.kind == "buffer" and err.access == "w":
        r, dropped = err.round, plan_order(log, err.round + 2)
        if dropped is not None:  # round r + 1's plan dropped left round r unprocessed (round 31)
            return dropped
        if log.first("prepare", r + 1) is not None and log.first("launch_sample", r + 1) is None:
            return never_launched(log, r + 1, f", and its step never processed: your loop "
                                              f"went on to round {r + 2} without it, and round "
                                              f"{r}'s step, deferred under it, was left "
                                              f"unprocessed, so round {r + 2} reused round {r}'s "
                                              f"host buffer `{err.buffer}` while its "
                                              f"`{err.launch}` may still use it")
        return fails("never_processed",
                     f"{log.who(r)}: its step had not been waited for and processed when round "
                     f"{r + 2} reused its host buffer `{err.buffer}` (rounds alternate between two "
                     f"buffers), so as far as the host knows, round {r}'s `{err.launch}` may still "
                     f"use it. Every launched step must go through `engine.process_outputs(step)` "
                     f"before its buffer comes round again")
    if err.kind in ("free_in_use", "double_free"):
        return _freed_early(log, err)
    return fails("race", f"the race checker stopped your loop ({err.kind}, round {err.round}'s "
                         f"`{err.launch}`): {err}")


def _freed_early(log: HostLog, err: RaceError) -> Verdict:
    """A free the race checker stopped, in the lesson's words (blind round 34: its own text
    named its kinds and advised a wait on the next round's event, which loses the overlap).
    (A ``launch_on_free`` needs a step processed before the next forward: the order names it.)"""
    done = [r for s, r in log.events if s in log.PROCESSING]
    who = f"{log.who(done[-1])}: your loop" if done else "your loop"
    blocks = f"the KV cache of prompt {err.prompt} (blocks {err.blocks})"
    if err.kind == "double_free":
        return fails("double_free",
                     f"{who} freed {blocks} a second time: it was freed already, and a pool that "
                     f"took it back twice would hand a block to two requests. Free each finished "
                     f"request once: `engine.process_outputs(step)` frees the finished ones, "
                     f"`engine.scheduler.release_if_done(req)` only what is still held")
    extra = (" (the extra step: under ZOS the finished request is already in the next launched "
             "round)" if done and err.round > done[-1] else "")
    return fails("free_in_use",
                 f"{who} freed {blocks} while round {err.round}'s `{err.launch}`, launched and "
                 f"not yet waited for, still uses it{extra}. Free a finished request only when "
                 f"`req.num_inflight == 0` (`engine.scheduler.release_if_done(req)`, as "
                 f"`engine.process_outputs` does), not after an extra wait")


def _went_on_without_plan(log: HostLog, err: BaseException, mode: str) -> Verdict | None:
    """The loop used the None that ``schedule()`` returned as if it were a plan."""
    schedules = [i for i, (s, _) in enumerate(log.events) if s == "schedule"]
    last = schedules[-1] if schedules else None
    r = log.events[last][1] if last is not None else -1
    empty = last is not None and any(e == ("prepare", r) for e in log.events[:last])  # a None plan
    # the error is the None's (round 35: a typo in the flush that follows None was told it)
    used = isinstance(err, (AttributeError, TypeError)) and any(
        mark in quoted(err) for mark in ("NoneType", "got None"))
    if empty and used and ("prepare", r + 1) not in log.events[last:]:
        if mode == "serial":
            return fails("never_processed",
                         f"after round {r}, `engine.schedule()` returned None and your loop went on with it "
                         f"({quoted(err)}). In the serial loop that only happens when launched "
                         f"steps were never processed: every request is still waiting for its results, so no "
                         f"round can be planned. Waiting for the device (`synchronize()`) is not enough: "
                         f"process each step (`engine.process_outputs(step)`) before the next `schedule()`")
        return fails("none_plan",
                     f"after round {r}, `engine.schedule()` returned None (nothing can be launched until "
                     f"outstanding results are processed) and your loop went on with it: "
                     f"{quoted(err)}. When there is no plan, flush the deferred step and ask again")
    return None
