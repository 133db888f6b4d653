"""A blind corpus about how requests END: EOS, stop strings, the length limit (at a round's end
and inside a speculative step), aborts, freeing rows and KV blocks, committing, the extra step
and the flush, with and without drafts.  Written from the notebooks only.

How the notebooks call each checker (the answer is always the first argument):

    checks.check_serial_loop(serial_loop)                      # exercise 02
    checks.check_idle_fraction(idle_fraction, engine)           # exercise 02; engine = a serial
        # te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) after
        # engine.generate(["Once upon a time", "The bird said", "There was a fox"],
        #                 max_new_tokens=24)
    checks.check_zos_loop(zos_loop)                             # exercise 03 (a)
    checks.check_three_rounds(order)                            # exercise 03 (b)
    checks.check_correction(correct_seqlens_qk)                 # exercise 04 (a)
    checks.check_metadata_answer(needs_correction)              # exercise 04 (b)
    checks.check_process_outputs(process_outputs)               # exercise 05
    # notebook 07 (zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)),
    #              spec = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3,
    #                                               num_draft_tokens=3))):
    checks.check_wasted_round(wasted_at, zos)      # zos right after lab 1's run(shipped.wants_more)
    checks.check_wants_more(wants_more)
    checks.check_abort_in_flight(in_flight, race)  # race = the RaceError of lab 2's ZOS run
    checks.check_abort(abort)
    checks.check_ring_race(race_at, ring_race, ring=3)   # ring_race: lab 3's RaceError
                                                         # (4 rounds held, ring of 3)
    checks.check_ring_slots(ring_slots)
    checks.check_overshoot(overshoot, spec)        # spec right after lab 4's texts(...) cell
    checks.check_commit(commit)
"""

from collections import deque
from dataclasses import dataclass

import torch


@dataclass
class Answer:
    check: str      # the checker's name as the notebook calls it, e.g. "check_process_outputs"
    name: str       # short unique id
    answer: object  # what the learner passes as the checker's first argument
    wrong: bool     # True if the answer is wrong by the notebook's own text
    why: str        # one sentence: what is wrong (or why it is right though unusual)


BLIND: list[Answer] = []


def add(check, name, wrong, why):
    def deco(obj):
        BLIND.append(Answer(check, name, obj, wrong, why))
        return obj
    return deco


def value(check, name, wrong, why, answer):
    """For answers that are data, not functions."""
    BLIND.append(Answer(check, name, answer, wrong, why))


# ---------------------------------------------------------------------------------------------
# Exercise 02: check_serial_loop
# ---------------------------------------------------------------------------------------------
SL = "check_serial_loop"


@add(SL, "sl_for_max_tokens", True, "counts rounds (24 = max_new_tokens) instead of asking "
     "has_work: the fourth prompt waits for a row and needs more rounds")
def sl_for_max_tokens(engine):
    for _ in range(24):
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@add(SL, "sl_while_running", True, "loops while scheduler.running is non-empty: nothing is "
     "admitted before the first schedule, so it returns at once")
def sl_while_running(engine):
    while engine.scheduler.running:
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@add(SL, "sl_until_batch_done", True, "stops when every request of the last plan is finished, "
     "though a waiting prompt has not started yet")
def sl_until_batch_done(engine):
    while True:
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        if all(req.finished for req in plan.requests):
            return


@add(SL, "sl_until_any_finished", True, "ends the loop as soon as one request finishes (the stop "
     "string 'a' ends one early), leaving the others unfinished")
def sl_until_any_finished(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        if any(req.finished for req in plan.requests):
            break


@add(SL, "sl_inline_free_length_only", True, "writes process_outputs inline but frees only "
     "requests finished by the length limit: a stop-finished request keeps its row forever")
def sl_inline_free_length_only(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        out = engine.read_outputs(step)
        for req in engine.commit_outputs(step, out):
            if req.finish_reason == "length":
                engine.scheduler.free(req)


@add(SL, "sl_inline_never_free", True, "inline processing that commits but never frees a finished "
     "request: its row is never given back and the scheduler keeps work forever")
def sl_inline_never_free(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            break
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        engine.commit_outputs(step, engine.read_outputs(step))


@add(SL, "sl_until_none", False, "loops until schedule() returns None: in the serial loop, with no "
     "on_round hook, that happens only once no work is left (the notebook's own words)")
def sl_until_none(engine):
    while True:
        plan = engine.schedule()
        if plan is None:
            return
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@add(SL, "sl_inline_free_all_finished", False, "inline stages that free every finished request "
     "without the num_inflight test: in serial no later round is ever in flight (notebook 05 try "
     "4)")
def sl_inline_free_all_finished(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished:
                engine.scheduler.free(req)


@add(SL, "sl_waiting_or_running", False, "spells has_work() out as waiting-or-running, and skips a "
     "None plan like the engine's own loop")
def sl_waiting_or_running(engine):
    while engine.scheduler.waiting or engine.scheduler.running:
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@add(SL, "sl_release_if_done_all_running", False, "inline processing that then releases every "
     "running request that is done (a superset of the step's), using release_if_done")
def sl_release_if_done_all_running(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        engine.commit_outputs(step, engine.read_outputs(step))
        for req in list(engine.scheduler.running):
            engine.scheduler.release_if_done(req)


@add(SL, "sl_recursive", False, "one round per call, then recursion while work is left: the same "
     "order, written without a while loop (4 prompts x 24 tokens stays far below the recursion "
     "limit)")
def sl_recursive(engine):
    if not engine.scheduler.has_work():
        return
    inputs = engine.prepare_inputs(engine.schedule())
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))
    sl_recursive(engine)


# ---------------------------------------------------------------------------------------------
# Exercise 02: check_idle_fraction (the end of the run: tear-down is not idle)
# ---------------------------------------------------------------------------------------------
IF = "check_idle_fraction"


@add(IF, "if_until_last_host_span", True, "counts time after the last device span, until the "
     "host's last span ended, as idle: the notebook says tear-down does not count")
def if_until_last_host_span(timeline):
    gaps = sum(b - a for a, b in timeline.device_gaps())
    busy = timeline.device_busy_ms()
    host_end = max(s.end_ms for s in timeline.lane("host"))
    dev_end = max(s.end_ms for s in timeline.lane("device"))
    idle = gaps + max(0.0, host_end - dev_end)
    return idle / (idle + busy)


@add(IF, "if_drop_last_gap", True, "leaves out the last gap, thinking it is the flush at the end "
     "of the run: every gap between pieces of device work counts")
def if_drop_last_gap(timeline):
    idle = sum(b - a for a, b in timeline.device_gaps()[:-1])
    busy = timeline.device_busy_ms()
    return idle / (idle + busy)


@add(IF, "if_one_minus_busy_share", False, "1 - busy / (busy + idle): the same number, written "
     "from the busy side")
def if_one_minus_busy_share(timeline):
    idle = sum(end - start for start, end in timeline.device_gaps())
    busy = timeline.device_busy_ms()
    return 1.0 - busy / (busy + idle)


@add(IF, "if_fsum_generator", False, "math.fsum over the gaps, then idle / (idle + busy)")
def if_fsum_generator(timeline):
    import math
    idle = math.fsum(b - a for a, b in timeline.device_gaps())
    return idle / (idle + timeline.device_busy_ms())


# ---------------------------------------------------------------------------------------------
# Exercise 03 (a): check_zos_loop
# ---------------------------------------------------------------------------------------------
ZL = "check_zos_loop"


@add(ZL, "zl_no_flush", True, "drops `previous` when schedule() returns None: the last decode step "
     "is never processed, its prompts lose their last token")
def zl_no_flush(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_flush_then_break", True, "flushes on None but then breaks: the fourth prompt waits "
     "for the row the flush just freed")
def zl_flush_then_break(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            break
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_flush_after_loop_only", True, "flushes only after the while loop; but finished "
     "requests keep their rows until that step is processed, so schedule() returns None forever "
     "inside it")
def zl_flush_after_loop_only(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current
    engine.flush(previous)


@add(ZL, "zl_skip_flush_all_finished", True, "skips the flush of a deferred step whose requests "
     "had all finished (the extra step, 'its output is discarded anyway'): its rounds in flight "
     "never drop to 0, so those rows and KV blocks are never freed")
def zl_skip_flush_all_finished(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if previous is not None and all(r.finished for r in previous.plan.requests):
                previous = None
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_skip_postprocess_all_finished", True, "does not process a deferred step whose "
     "requests all finished in the round before (the extra step): a launched step must be "
     "processed anyway")
def zl_skip_postprocess_all_finished(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None and not all(r.finished for r in previous.plan.requests):
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_flush_no_clear", True, "processes `previous` on None with process_outputs but never "
     "clears it, so the next None processes the same step again")
def zl_flush_no_clear(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if previous is not None:
                engine.process_outputs(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_prefill_keeps_previous", True, "when a waiting prompt is admitted (a prefill round, "
     "after a request ended) it leaves the deferred decode step for the round after: step N must "
     "be processed in round N+1")
def zl_prefill_keeps_previous(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if plan.is_prefill:
            engine.process_outputs(engine.launch_sample(inputs))
            continue
        if previous is not None:
            engine.process_outputs(previous)
        previous = engine.launch_sample(inputs)


@add(ZL, "zl_flush_before_prefill", True, "flushes the deferred step before a prefill round is "
     "prepared ('a new request starts, finish the old round first'): it is processed before the "
     "next forward went in, the serial gap")
def zl_flush_before_prefill(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None or plan.is_prefill:
            previous = engine.flush(previous)
            if plan is None:
                continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_flush_when_batch_shrinks", True, "flushes the deferred step right after a schedule() "
     "that found a smaller plan (a request ended), before preparing it: flush only when the plan "
     "is None")
def zl_flush_when_batch_shrinks(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None or (previous is not None
                            and len(plan.requests) < len(previous.plan.requests)):
            previous = engine.flush(previous)
            if plan is None:
                continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_flush_last_by_wants_more", True, "flushes a decode step right after its own sample "
     "when none of its requests wants more ('the last round, nothing to hide under'): the notebook "
     "says flush only after schedule() returned None")
def zl_flush_last_by_wants_more(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill or not any(r.wants_more() for r in plan.requests):
            engine.flush(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_correct_only_same_batch", True, "corrects on the device only when the plan's requests "
     "equal the previous plan's (thinking a shrunk batch after a request ended needs none): with "
     "drafts the remaining requests' lengths stay stale")
def zl_correct_only_same_batch(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None and previous.plan.requests == plan.requests:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_sync_before_flush", True, "calls engine.device.synchronize() before each postprocess "
     "'so the finished requests can be freed safely': it waits for the forward just launched")
def zl_sync_before_flush(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.device.synchronize()
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_inline_flush", False, "the flush written out as process_outputs(previous) and "
     "previous = None: the notebook says it is judged alike")
def zl_inline_flush(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if previous is not None:
                engine.process_outputs(previous)
                previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_deque_pending", False, "keeps the deferred step in a deque of at most one, and "
     "corrects on the device on every round (the notebook says it is harmless otherwise)")
def zl_deque_pending(engine):
    pending = deque()
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            while pending:
                engine.flush(pending.popleft())
            continue
        inputs = engine.prepare_inputs(plan)
        engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        while pending:
            engine.process_outputs(pending.popleft())
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            pending.append(current)


@add(ZL, "zl_flush_and_loop_flush", False, "flushes on None and again (a no-op) after the loop, "
     "with `previous = engine.flush(previous)` both times: harmless belt and braces")
def zl_flush_and_loop_flush(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current
    previous = engine.flush(previous)


@add(ZL, "zl_inline_postprocess", False, "the deferred step's processing written inline (wait on "
     "its sample_done, read, commit, release_if_done) in both places")
def zl_inline_postprocess(engine):
    def finish(step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)

    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if previous is not None:
                finish(previous)
            previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            finish(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            finish(current)
            previous = None
        else:
            previous = current


@add(ZL, "zl_while_true_return", False, "while True; on None flush, then return only if the "
     "scheduler has no work left, else go on")
def zl_while_true_return(engine):
    previous = None
    while True:
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            if not engine.scheduler.has_work():
                return
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        previous = None
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            previous = current


@add(ZL, "zl_return_when_nothing_waits", False, "after the flush, returns when no prompt is "
     "waiting: schedule() found nothing, so every running request was in the flushed step or "
     "already done, and the flush finished and freed them")
def zl_return_when_nothing_waits(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            if not engine.scheduler.waiting:
                return
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


# ---------------------------------------------------------------------------------------------
# Exercise 03 (b): check_three_rounds  (one prompt, max_new_tokens=4; decode rounds 1-3)
# ---------------------------------------------------------------------------------------------
TR = "check_three_rounds"
_RIGHT3 = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
           ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]

value(TR, "tr_postprocess_last", True, "the last round processed as a postprocess, as if a round 4 "
      "hid it: it has no next round and is flushed",
      _RIGHT3[:-1] + [("postprocess", 3)])
value(TR, "tr_no_flush", True, "leaves the last round unprocessed (8 steps): its token would be "
      "lost",
      _RIGHT3[:-1])
value(TR, "tr_extra_round_4", True, "adds an extra step (round 4 launched, then flushed) at the "
      "length limit: without drafts the scheduler counts rounds in flight, so no round 4 goes in",
      _RIGHT3[:-1] + [("forward", 4), ("postprocess", 3), ("sample", 4), ("flush", 4)])
value(TR, "tr_flush_before_sample", True, "flushes round 3 before launching its sample",
      _RIGHT3[:7] + [("flush", 3), ("sample", 3)])
value(TR, "tr_flush_round_2", True, "flushes round 2 (thinking the flush belongs to the round "
      "before the last) and postprocesses round 3",
      _RIGHT3[:6] + [("flush", 2), ("sample", 3), ("postprocess", 3)])
value(TR, "tr_postprocess_and_flush", True, "processes round 3 twice, once as a postprocess and "
      "once as the flush", _RIGHT3[:-1] + [("postprocess", 3), ("flush", 3)])
value(TR, "tr_late_postprocess", True, "processes round 2 after round 3's sample",
      _RIGHT3[:6] + [("sample", 3), ("postprocess", 2), ("flush", 3)])
value(TR, "tr_tuple_of_tuples", False, "the right order as a tuple of pairs instead of a list",
      tuple(_RIGHT3))
value(TR, "tr_lists_as_pairs", False, "the right order with each pair written as a two-item list",
      [list(p) for p in _RIGHT3])


# ---------------------------------------------------------------------------------------------
# Exercise 04 (a): check_correction (a batch that shrinks as requests end)
# ---------------------------------------------------------------------------------------------
CC = "check_correction"


def _slots(meta, block_size, req_of_token):
    """KV slots recomputed from positions through each token's request's block table."""
    table = meta["block_tables"][req_of_token]
    pos = meta["positions"]
    return torch.gather(table, 1, (pos // block_size).long().unsqueeze(1)).squeeze(1) * block_size \
        + pos % block_size


@add(CC, "cc_fixed_batch_of_3", True, "maps tokens to requests with torch.arange(3): right on the "
     "worked case, but breaks when finished requests leave a smaller batch in the engine run")
def cc_fixed_batch_of_3(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    req = torch.repeat_interleave(torch.arange(3, device=meta["rows"].device), meta["seqlens_q"])
    meta["seqlens_k"] += delta
    meta["positions"] += delta[req]
    meta["slot_mapping"].copy_(_slots(meta, block_size, req))


@add(CC, "cc_no_pending", True, "shifts every request by its accepted drafts, pending or not")
def cc_no_pending(meta, accepted, block_size):
    B = meta["rows"].numel()
    delta = accepted[meta["rows"]]
    req = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device), meta["seqlens_q"])
    meta["seqlens_k"] += delta
    meta["positions"] += delta[req]
    meta["slot_mapping"].copy_(_slots(meta, block_size, req))


@add(CC, "cc_old_slots_plus", True, "adds the shift to the old slots instead of recomputing them "
     "through the block table")
def cc_old_slots_plus(meta, accepted, block_size):
    B = meta["rows"].numel()
    delta = accepted[meta["rows"]] * meta["pending"]
    req = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device), meta["seqlens_q"])
    meta["seqlens_k"] += delta
    meta["positions"] += delta[req]
    meta["slot_mapping"] += delta[req]


@add(CC, "cc_len_of_seqlens", False, "the batch size from seqlens_q's length (any batch, one "
     "request too) and pending as a boolean mask through torch.where")
def cc_len_of_seqlens(meta, accepted, block_size):
    B = meta["seqlens_q"].shape[0]
    delta = torch.where(meta["pending"].bool(), accepted[meta["rows"]],
                        torch.zeros_like(meta["seqlens_k"]))
    req = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device), meta["seqlens_q"])
    meta["seqlens_k"] += delta
    meta["positions"] += delta[req]
    meta["slot_mapping"].copy_(_slots(meta, block_size, req))


@add(CC, "cc_new_tensors_same_keys", False, "stores new tensors under the same keys (allowed by "
     "the rules) and uses integer division through torch.div")
def cc_new_tensors_same_keys(meta, accepted, block_size):
    n = meta["rows"].numel()
    delta = accepted.index_select(0, meta["rows"].long()) * meta["pending"]
    req = torch.arange(n, device=meta["rows"].device).repeat_interleave(meta["seqlens_q"])
    positions = meta["positions"] + delta[req]
    blocks = meta["block_tables"][req, torch.div(positions, block_size, rounding_mode="floor")]
    meta["seqlens_k"] = meta["seqlens_k"] + delta
    meta["positions"] = positions
    slots = blocks * block_size + positions % block_size
    meta["slot_mapping"] = slots.to(meta["slot_mapping"].dtype)


# ---------------------------------------------------------------------------------------------
# Exercise 04 (b): check_metadata_answer
# ---------------------------------------------------------------------------------------------
MA = "check_metadata_answer"
value(MA, "ma_no_slots", True, "forgets slot_mapping, which follows the positions",
      {"positions", "seqlens_k", "input_ids"})
value(MA, "ma_with_block_tables", True, "adds block_tables, reserved up front with room for drafts",
      {"positions", "seqlens_k", "slot_mapping", "input_ids", "block_tables"})
value(MA, "ma_with_cu_seqlens_k", False, "adds cu_seqlens_k, which the notebook says is stale too "
      "and accepted", {"positions", "seqlens_k", "slot_mapping", "input_ids", "cu_seqlens_k"})
value(MA, "ma_no_input_ids", True, "leaves out input_ids: the host wrote FROM_DEVICE there, not "
      "the bonus token and drafts the forward uses", {"positions", "seqlens_k", "slot_mapping"})
value(MA, "ma_with_seqlens_q", True, "adds seqlens_q and cu_seqlens_q: each request still feeds 1 "
      "+ k tokens",
      {"positions", "seqlens_k", "slot_mapping", "input_ids", "seqlens_q", "cu_seqlens_q"})
value(MA, "ma_frozenset", False, "the right fields as a frozenset",
      frozenset({"input_ids", "positions", "slot_mapping", "seqlens_k"}))


# ---------------------------------------------------------------------------------------------
# Exercise 05: check_process_outputs
# ---------------------------------------------------------------------------------------------
PO = "check_process_outputs"


@add(PO, "po_free_stop_only", True, "frees only requests that hit a stop string: the ones that "
     "reach the length limit keep their rows and KV blocks")
def po_free_stop_only(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finish_reason == "stop" and req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_free_length_only", True, "frees only length-finished requests: the stop-finished "
     "prompt keeps its KV blocks")
def po_free_length_only(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finish_reason == "length" and req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_free_stop_or_length", True, "frees stop- and length-finished requests but not EOS "
     "ones (a story whose text ends): they keep their row and blocks")
def po_free_stop_or_length(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finish_reason in ("stop", "length") and req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_free_ignoring_inflight", True, "frees every finished request at once: a stop is "
     "learned one round late and the extra step's forward still uses the blocks")
def po_free_ignoring_inflight(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished:
            engine.scheduler.free(req)


@add(PO, "po_inflight_one", True, "frees at num_inflight == 1, thinking commit_outputs has not "
     "counted this step yet: it has, so the free comes one round early (and never at the end)")
def po_inflight_one(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 1:
            engine.scheduler.free(req)


@add(PO, "po_free_unfinished_idle", True, "frees any request with no round in flight, finished or "
     "not")
def po_free_unfinished_idle(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_free_only_newly_finished", True, "frees only requests that finished in this very "
     "step; a request that finished a round earlier (its extra step lands now) is never freed")
def po_free_only_newly_finished(engine, step):
    before = [req.finished for req in step.plan.requests]
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req, was_done in zip(engine.commit_outputs(step, out), before):
        if req.finished and not was_done and req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_free_only_discarded", True, "frees only the requests whose output was discarded "
     "(already finished before this step): a request finished in its last round with nothing after "
     "it keeps its blocks")
def po_free_only_discarded(engine, step):
    before = [req.finished for req in step.plan.requests]
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req, was_done in zip(engine.commit_outputs(step, out), before):
        if was_done and req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_never_free", True, "never frees: the engine runs out of rows and stalls")
def po_never_free(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))


@add(PO, "po_blocks_not_row", True, "gives the KV blocks back through the block manager but keeps "
     "the request's batch row")
def po_blocks_not_row(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0 and req.blocks:
            engine.scheduler.blocks.free(req.blocks, req.index)
            req.blocks = []


@add(PO, "po_row_not_blocks", True, "gives the batch row back by hand but forgets the KV blocks")
def po_row_not_blocks(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    sched = engine.scheduler
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0 and req in sched.running:
            sched.running.remove(req)
            sched.free_rows.append(req.row)
            sched.free_rows.sort()
            req.row = -1


@add(PO, "po_free_before_commit", True, "frees before committing, when num_inflight is still 1 for "
     "a request finished earlier: a request that finishes in this step is never freed")
def po_free_before_commit(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in step.plan.requests:
        if req.finished and req.num_inflight == 1:
            engine.scheduler.free(req)
    engine.commit_outputs(step, out)


@add(PO, "po_read_then_wait", True, "reads the output slot before waiting (the exercise's first "
     "mistake), though it frees correctly")
def po_read_then_wait(engine, step):
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


@add(PO, "po_release_if_done", False, "waits, reads, commits, and hands every committed request to "
     "scheduler.release_if_done")
def po_release_if_done(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


@add(PO, "po_not_inflight", False, "finished and `not req.num_inflight`: the same test, spelled "
     "differently")
def po_not_inflight(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finish_reason is not None and not req.num_inflight:
            engine.scheduler.free(req)


@add(PO, "po_sweep_running", False, "after committing, sweeps every running request (a copy of the "
     "list) and frees those finished with no round in flight")
def po_sweep_running(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))
    for req in list(engine.scheduler.running):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add(PO, "po_not_wants_more", False, "frees a request that wants no more rounds and has none in "
     "flight: with nothing in flight that means it is finished")
def po_not_wants_more(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    done = engine.commit_outputs(step, out)
    for req in done:
        if req.num_inflight == 0 and not req.wants_more():
            engine.scheduler.free(req)


@add(PO, "po_all_reasons_listed", False, "lists every finish reason explicitly (length, stop, eos, "
     "abort) and tests num_inflight <= 0")
def po_all_reasons_listed(engine, step):
    engine.device.wait(step.sample_done)
    tokens = engine.read_outputs(step)
    for req in engine.commit_outputs(step, tokens):
        if req.finish_reason in {"length", "stop", "eos", "abort"} and req.num_inflight <= 0:
            engine.scheduler.free(req)


@add(PO, "po_collect_then_free", False, "collects the requests to free into a list first, then "
     "frees them after the loop over the committed requests")
def po_collect_then_free(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    to_free = [r for r in engine.commit_outputs(step, out) if r.finished and r.num_inflight == 0]
    for req in to_free:
        engine.scheduler.free(req)


# ---------------------------------------------------------------------------------------------
# Notebook 07, lab 1: check_wasted_round and check_wants_more
# ---------------------------------------------------------------------------------------------
WR = "check_wasted_round"
value(WR, "wr_at_limit", True, "thinks the limit was already reached (12 committed): the policy "
      "planned it while it was still short", (12, 1))
value(WR, "wr_two_in_flight", True, "counts two rounds in flight, the planned one too", (11, 2))
value(WR, "wr_none_in_flight", True, "thinks nothing was in flight, as in the serial loop", (11, 0))
value(WR, "wr_ten_two", True, "counts committed tokens one round too early", (10, 2))
value(WR, "wr_swapped", True, "the pair in the wrong order (in flight, committed)", (1, 11))
value(WR, "wr_list_pair", False, "the right pair written as a list", [11, 1])

WM = "check_wants_more"


@add(WM, "wm_le", True, "`<=` at the limit: plans one more round when the rounds in flight already "
     "reach it")
def wm_le(req):
    return not req.finished and len(req.output_ids) + req.num_inflight <= req.max_new_tokens


@add(WM, "wm_one_short", True, "stops one token early: `< max_new_tokens - 1`")
def wm_one_short(req):
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens - 1


@add(WM, "wm_wait_idle", True, "plans a request only when nothing of it is in flight: no waste, "
     "but no overlap either")
def wm_wait_idle(req):
    return not req.finished and req.num_inflight == 0 and len(req.output_ids) < req.max_new_tokens


@add(WM, "wm_no_finished_test", True, "forgets the finished test: a request stopped by a stop "
     "string short of its limit is planned again")
def wm_no_finished_test(req):
    return len(req.output_ids) + req.num_inflight < req.max_new_tokens


@add(WM, "wm_only_stop_finished", True, "treats only a stop as finished: an EOS- or abort-finished "
     "request short of its limit is planned again")
def wm_only_stop_finished(req):
    if req.finish_reason == "stop":
        return False
    return len(req.output_ids) + req.num_inflight < req.max_new_tokens


@add(WM, "wm_at_most_one_inflight", True, "counts at most one round in flight (min(num_inflight, "
     "1)), as in plain ZOS: a loop holding three rounds overshoots")
def wm_at_most_one_inflight(req):
    return not req.finished and len(req.output_ids) + min(req.num_inflight, 1) < req.max_new_tokens


@add(WM, "wm_committed_only_minus_one", True, "subtracts one from the limit instead of counting "
     "the rounds in flight: right for one round held, wrong for the serial loop and for three held")
def wm_committed_only_minus_one(req):
    return not req.finished and len(req.output_ids) < req.max_new_tokens - 1


@add(WM, "wm_not_stop_or_eos", True, "treats stop and EOS as finished but not abort: an aborted "
     "request short of its limit is planned again")
def wm_not_stop_or_eos(req):
    if req.finish_reason in ("stop", "eos", "length"):
        return False
    return len(req.output_ids) + req.num_inflight < req.max_new_tokens


@add(WM, "wm_remaining", False, "the tokens still owed compared with the rounds in flight, and "
     "finish_reason is None for 'unfinished'")
def wm_remaining(req):
    return req.finish_reason is None and req.max_new_tokens - len(req.output_ids) > req.num_inflight


@add(WM, "wm_planned_len", False, "uses the request's planned_len (prompt + committed + in flight) "
     "against prompt + limit")
def wm_planned_len(req):
    if req.finished:
        return False
    return req.planned_len < len(req.prompt_ids) + req.max_new_tokens


@add(WM, "wm_early_returns", False, "early returns for each case, with the extra harmless test "
     "that a request with no tokens left is never planned")
def wm_early_returns(req):
    if req.finish_reason is not None:
        return False
    left = req.max_new_tokens - len(req.output_ids)
    if left <= 0:
        return False
    return req.num_inflight < left


# ---------------------------------------------------------------------------------------------
# Notebook 07, lab 2: check_abort_in_flight and check_abort
# ---------------------------------------------------------------------------------------------
AI = "check_abort_in_flight"
value(AI, "ai_serial_also", True, "thinks the serial loop also holds round 4 when the abort comes",
      ({4}, {4}))
value(AI, "ai_two_rounds", True, "counts rounds 3 and 4 under ZOS: round 3 was processed in round "
      "4's pass", ({3, 4}, set()))
value(AI, "ai_round_5", True, "names round 5, which is about to be scheduled, not launched",
      ({5}, set()))
value(AI, "ai_swapped", True, "the pair in the wrong order (serial first)", (set(), {4}))
value(AI, "ai_serial_4_5", True, "thinks round 4 in flight under ZOS and round 5 under serial",
      ({4}, {5}))
value(AI, "ai_frozensets", False, "the right answer with frozensets", (frozenset({4}), frozenset()))

AB = "check_abort"


@add(AB, "ab_never_free", True, "marks the request and leaves the freeing to a later round's "
     "processing: a request with nothing in flight (just prefilled) is never freed")
def ab_never_free(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)


@add(AB, "ab_keep_in_waiting", True, "marks a waiting request aborted but leaves it in the queue: "
     "it is admitted and prefilled later")
def ab_keep_in_waiting(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    engine.scheduler.release_if_done(req)


@add(AB, "ab_overwrites_finished", True, "re-marks a request its stop string already finished as "
     "'abort': a finished one must be left alone")
def ab_overwrites_finished(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


@add(AB, "ab_sync_then_free", True, "waits for the whole device, then frees at once: safe, but the "
     "host stalls at every abort")
def ab_sync_then_free(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.device.synchronize()
    engine.scheduler.free(req)


@add(AB, "ab_by_index", True, "looks the request up by its index in engine.requests instead of its "
     "id: ids keep counting across generate calls, so it aborts the wrong request (or none)")
def ab_by_index(engine, request_id):
    reqs = engine.requests
    if not 0 <= request_id < len(reqs):
        return
    req = reqs[request_id]
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


@add(AB, "ab_as_length", True, "ends the request by lowering its limit to what it has: the round "
     "in flight is then committed, not discarded, and it finishes as 'length', not 'abort'")
def ab_as_length(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    req.max_new_tokens = len(req.output_ids)
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        req.finish_reason = "abort"


@add(AB, "ab_drop_tokens", True, "clears the tokens the request already has: an abort keeps what "
     "it has")
def ab_drop_tokens(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    req.output_ids.clear()
    req.text = ""
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


@add(AB, "ab_free_if_inflight_le1", True, "frees when at most one round is in flight ('that one is "
     "about to be processed'): it may still write the blocks")
def ab_free_if_inflight_le1(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    if req.num_inflight <= 1:
        engine.scheduler.free(req)


@add(AB, "ab_inline_release", False, "the release written inline: free now only if no launched "
     "round holds it, else a later processed round frees it")
def ab_inline_release(engine, request_id):
    req = next(r for r in engine.requests if r.id == request_id)
    if req.finish_reason is not None:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    elif req.num_inflight == 0:
        engine.scheduler.free(req)


@add(AB, "ab_rebuild_waiting", False, "rebuilds the waiting queue without the request (a new "
     "deque) and uses a dict from id to request")
def ab_rebuild_waiting(engine, request_id):
    by_id = {r.id: r for r in engine.requests}
    req = by_id[request_id]
    if req.finished:
        return
    req.finish_reason = "abort"
    sched = engine.scheduler
    sched.waiting = deque(r for r in sched.waiting if r is not req)
    sched.release_if_done(req)


@add(AB, "ab_remove_then_mark", False, "takes a waiting request out of the queue before marking "
     "it, then releases it through release_if_done: the order of these host steps does not matter")
def ab_remove_then_mark(engine, request_id):
    for req in engine.requests:
        if req.id != request_id or req.finished:
            continue
        if req in engine.scheduler.waiting:
            engine.scheduler.waiting.remove(req)
        req.finish_reason = "abort"
        engine.scheduler.release_if_done(req)


@add(AB, "ab_engine_abort", False, "calls the engine's own Engine.abort: judged by what the run "
     "did")
def ab_engine_abort(engine, request_id):
    engine.abort(request_id)


# ---------------------------------------------------------------------------------------------
# Notebook 07, lab 3: check_ring_race and check_ring_slots
# ---------------------------------------------------------------------------------------------
RR = "check_ring_race"
value(RR, "rr_swapped", True, "the pair in the wrong order (prepared round first)", (4, 1))
value(RR, "rr_prefill", True, "names round 0, the prefill, which is processed at once", (0, 3))
value(RR, "rr_one_late", True, "thinks the collision comes a round later", (2, 5))
value(RR, "rr_list", False, "the right pair as a list", [1, 4])

RS = "check_ring_slots"


@add(RS, "rs_depth", True, "one slot per round held: the round being prepared needs its own")
def rs_depth(depth):
    return depth


@add(RS, "rs_twice", True, "two slots per round held: enough, but not the fewest")
def rs_twice(depth):
    return 2 * depth


@add(RS, "rs_plus_two", True, "depth + 2, one spare 'for the flush': not the fewest")
def rs_plus_two(depth):
    return depth + 2


@add(RS, "rs_max_two", False, "max(2, depth + 1): the same as depth + 1 for depth >= 1")
def rs_max_two(depth):
    return max(2, depth + 1)


@add(RS, "rs_int_sum", False, "int(depth) + 1 with a harmless cast")
def rs_int_sum(depth):
    return int(depth) + 1


# ---------------------------------------------------------------------------------------------
# Notebook 07, lab 4: check_overshoot and check_commit
# ---------------------------------------------------------------------------------------------
OS = "check_overshoot"
value(OS, "os_four", True, "counts the whole 1 + k run as past the limit; one of them is needed to "
      "reach it", 4)
value(OS, "os_two", True, "the largest overshoot the run above showed (32 of 30), not the most "
      "possible", 2)
value(OS, "os_zero", True, "thinks the limit check stops it", 0)
value(OS, "os_one", True, "thinks at most the bonus token goes past", 1)
value(OS, "os_numpy", False, "the right number as a numpy integer", __import__("numpy").int64(3))

CM = "check_commit"


@add(CM, "cm_limit_before_stop", True, "checks the limit before the stop strings after each token "
     "(SGLang's order): a stop string ending on the limit's token finishes as length and keeps it")
def cm_limit_before_stop(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return


@add(CM, "cm_keep_eos", True, "appends the EOS token before finishing: EOS is never kept")
def cm_keep_eos(req, tokens, eos_id, decode):
    for tok in tokens:
        req.output_ids.append(tok)
        req.text += decode([tok])
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_eos_no_return", True, "marks EOS but goes on appending the run's later tokens")
def cm_eos_no_return(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            continue
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_eos_skipped_silently", True, "skips the EOS token without finishing: the story goes "
     "on past its end")
def cm_eos_skipped_silently(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            continue
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_limit_once", True, "checks stop strings per token but the limit once after the run: a "
     "run that crosses the limit is kept whole")
def cm_limit_once(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
    if len(req.output_ids) >= req.max_new_tokens:
        req.finish_reason = "length"


@add(CM, "cm_gt_limit", True, "`>` instead of `>=` at the limit: keeps one token too many")
def cm_gt_limit(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) > req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_stop_text_only", True, "cuts the stop string off the text but keeps its tokens")
def cm_stop_text_only(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_stop_kept", True, "finishes on a stop string but keeps it in the text and tokens")
def cm_stop_kept(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if any(req.text.endswith(s) for s in req.stop):
            req.finish_reason = "stop"
            return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_break_inner_only", True, "a `break` after the stop leaves only the loop over stop "
     "strings: the run's later tokens are still appended")
def cm_break_inner_only(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                break
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_stop_in_run_text", True, "looks for stop strings only in this round's decoded run: a "
     "stop string split across two runs is missed")
def cm_stop_in_run_text(req, tokens, eos_id, decode):
    run = ""
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        piece = decode([tok])
        run += piece
        req.text += piece
        for s in req.stop:
            if run.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_limit_at_top", True, "tests the limit before appending each token: a run that ends "
     "exactly on the limit leaves the request unfinished")
def cm_limit_at_top(req, tokens, eos_id, decode):
    for tok in tokens:
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return


@add(CM, "cm_eos_as_stop", True, "finishes on EOS with finish_reason 'stop'")
def cm_eos_as_stop(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "stop"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_eos_then_pop", False, "appends every token, and on EOS pops it back off before "
     "finishing")
def cm_eos_then_pop(req, tokens, eos_id, decode):
    for tok in tokens:
        req.output_ids.append(tok)
        if tok == eos_id:
            req.output_ids.pop()
            req.finish_reason = "eos"
            return
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_stop_in_text", True, "`s in req.text` instead of endswith, then cuts at the earliest "
     "occurrence: where two strings end on one token it cuts the longest, the engine the first "
     "in `req.stop` (round 17's run: 'as' before ' was')")
def cm_stop_in_text(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        hits = [req.text.find(s) for s in req.stop if s in req.text]
        if hits:
            cut = min(hits)
            drop = len(req.text) - cut
            req.text = req.text[:cut]
            del req.output_ids[len(req.output_ids) - drop:]
            req.finish_reason = "stop"
            return
        if len(req.output_ids) == req.max_new_tokens:
            req.finish_reason = "length"
            return


@add(CM, "cm_local_then_assign", False, "builds the kept tokens and text in locals, token by "
     "token, then writes them to the request once")
def cm_local_then_assign(req, tokens, eos_id, decode):
    ids, text, reason = list(req.output_ids), req.text, None
    for tok in tokens:
        if tok == eos_id:
            reason = "eos"
            break
        ids.append(tok)
        text += decode([tok])
        stop = next((s for s in req.stop if text.endswith(s)), None)
        if stop is not None:
            text = text[: -len(stop)]
            ids = ids[: len(ids) - len(stop)]
            reason = "stop"
            break
        if len(ids) >= req.max_new_tokens:
            reason = "length"
            break
    req.output_ids[:] = ids
    req.text = text
    if reason is not None:
        req.finish_reason = reason


@add(CM, "cm_tail_compare", False, "compares the text's tail slice with each stop string, and uses "
     "a while loop with an index over the run")
def cm_tail_compare(req, tokens, eos_id, decode):
    i = 0
    while i < len(tokens) and not req.finished:
        tok = tokens[i]
        i += 1
        if tok == eos_id:
            req.finish_reason = "eos"
            break
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if len(req.text) >= len(s) and req.text[-len(s):] == s:
                req.text = req.text[: len(req.text) - len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                break
        if not req.finished and len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
