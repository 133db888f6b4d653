"""Blind corpus of learner answers for the "Overlap the Pipeline" exercise checkers.

Written from the exercise notebooks and the engine modules a learner is told to read only.
Each entry is what a learner would pass to the notebook's checker cell:

    02a  checkers.check_serial_loop(answer)
    02b  checkers.check_idle_fraction(answer, engine)    (engine: the notebook's serial run)
    03a  checkers.check_zos_loop(answer)
    03b  checkers.check_three_rounds(answer)
    04a  checkers.check_correction(answer)
    04b  checkers.check_metadata_answer(answer)
    05   checkers.check_process_outputs(answer)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

import toy_engine as te
from toy_engine import buffers as te_buffers
from toy_engine.kernels import FROM_DEVICE


@dataclass
class Answer:
    exercise: str
    name: str
    answer: object
    wrong: bool
    why: str


BLIND: list[Answer] = []


def add(exercise, name, wrong, why):
    def deco(obj):
        BLIND.append(Answer(exercise, name, obj, wrong, why))
        return obj
    return deco


def value(exercise, name, wrong, why, obj):
    BLIND.append(Answer(exercise, name, obj, wrong, why))


# ============================================================================ shared inline helpers

def _inline_process(engine, step):
    """Processing written out: wait on the step's own event, read, commit, release."""
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


# ============================================================================ 02a serial loop: WRONG

@add("02a", "serial_one_round_late_inline", True,
     "processes round N inline only after round N+1 is prepared and launched (one round late): the ZOS order, not serial")
def serial_one_round_late_inline(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if previous is not None:
                _inline_process(engine, previous)
                previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if previous is not None:
            _inline_process(engine, previous)
        previous = step
    if previous is not None:
        _inline_process(engine, previous)


@add("02a", "serial_one_round_late_stage_methods", True,
     "processes each round after the next round's launches (one round late) using process_outputs")
def serial_one_round_late_stage_methods(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if previous is not None:
                engine.process_outputs(previous)
                previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        previous = step
    if previous is not None:
        engine.process_outputs(previous)


@add("02a", "serial_schedule_next_before_processing", True,
     "schedules round N+1 before round N's results are processed: the next round is planned while one is in flight")
def serial_schedule_next_before_processing(engine):
    plan = engine.schedule()
    while plan is not None:
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        next_plan = engine.schedule() if engine.scheduler.has_work() else None
        engine.process_outputs(step)
        plan = next_plan
        if plan is None and engine.scheduler.has_work():
            plan = engine.schedule()


@add("02a", "serial_prepare_next_before_processing", True,
     "schedules and prepares round N+1 (writes its metadata) before processing round N")
def serial_prepare_next_before_processing(engine):
    step = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if step is not None:
                engine.process_outputs(step)
                step = None
            continue
        inputs = engine.prepare_inputs(plan)
        if step is not None:
            engine.process_outputs(step)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
    if step is not None:
        engine.process_outputs(step)


@add("02a", "serial_sample_before_forward", True,
     "launches the sample before the forward: the sample reads logits of a forward not launched yet")
def serial_sample_before_forward(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        step = engine.launch_sample(inputs)
        engine.launch_forward(inputs)
        engine.process_outputs(step)


@add("02a", "serial_ten_rounds", True, "for _ in range(10): stops after ten rounds with prompts unfinished")
def serial_ten_rounds(engine):
    for _ in range(10):
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@add("02a", "serial_processed_twice", True, "processes every step twice (commit twice)")
def serial_processed_twice(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)
        if plan.is_prefill:
            engine.process_outputs(step)


@add("02a", "serial_inline_read_before_wait", True,
     "inline processing reads the output slot before waiting on sample_done")
def serial_inline_read_before_wait(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        out = engine.read_outputs(step)
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, out):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)


@add("02a", "serial_inline_never_frees", True,
     "inline processing waits, reads and commits but never frees finished requests: the 4th prompt never gets a row")
def serial_inline_never_frees(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            return
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        engine.commit_outputs(step, engine.read_outputs(step))


@add("02a", "serial_sync_between_forward_and_sample", True,
     "synchronizes after launch_forward: an extra host wait that leaves the device idle between forward and sample")
def serial_sync_between_forward_and_sample(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.device.synchronize()
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)


@add("02a", "serial_calls_engine_loop", True,
     "does not write the loop: calls the engine's own serial_loop")
def serial_calls_engine_loop(engine):
    te.loops.serial_loop(engine)


@add("02a", "serial_calls_zos_loop", True,
     "calls the engine's zos_loop: overlapped order, not serial")
def serial_calls_zos_loop(engine):
    te.loops.zos_loop(engine)


@add("02a", "serial_skip_prefill_processing_until_next", True,
     "defers prefill steps to the next round (processes prefill after the first decode launch)")
def serial_skip_prefill_processing_until_next(engine):
    deferred = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if deferred is not None:
                engine.process_outputs(deferred)
                deferred = None
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if deferred is not None:
            engine.process_outputs(deferred)
            deferred = None
        if plan.is_prefill:
            deferred = step
        else:
            engine.process_outputs(step)
    if deferred is not None:
        engine.process_outputs(deferred)


@add("02a", "serial_patch_num_slots", True,
     "patches the toy's module (toy_engine.engine.NUM_SLOTS = 1) before running the loop")
def serial_patch_num_slots(engine):
    import toy_engine.engine as eng
    eng.NUM_SLOTS = 1
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@add("02a", "serial_patch_engine_class", True,
     "patches Engine.process_outputs on the class to a no-op-free version, then calls the engine's own loop")
def serial_patch_engine_class(engine):
    te.Engine.process_outputs = lambda self, step, stage="postprocess": _inline_process(self, step)
    te.loops.serial_loop(engine)


@add("02a", "serial_disable_race_checker_then_forget", True,
     "turns the race checker off and never processes the steps (then clears the scheduler)")
def serial_disable_race_checker_then_forget(engine):
    engine.device.races.enabled = False
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            break
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)
    engine.scheduler.running.clear()
    engine.scheduler.waiting.clear()


@add("02a", "serial_clears_requests", True,
     "runs the right loop, then drops the completions: clears engine.requests")
def serial_clears_requests(engine):
    te.loops.serial_loop(engine)
    engine.requests.clear()


@add("02a", "serial_forever", True, "loops forever (while True without break): a checker must time it out")
def serial_forever(engine):
    while True:
        if engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))
        else:
            time.sleep(0.01)


@add("02a", "serial_catch_baseexception_forever", True,
     "swallows BaseException (KeyboardInterrupt, SystemExit) inside an endless loop")
def serial_catch_baseexception_forever(engine):
    while True:
        try:
            if engine.scheduler.has_work():
                plan = engine.schedule()
                inputs = engine.prepare_inputs(plan)
                engine.launch_forward(inputs)
                engine.process_outputs(engine.launch_sample(inputs))
            else:
                time.sleep(0.05)
        except BaseException:
            pass


@add("02a", "serial_sys_exit", True, "calls exit() when done: raises SystemExit out of the checker")
def serial_sys_exit(engine):
    te.loops.serial_loop(engine)
    sys.exit(0)


@add("02a", "serial_endless_iterator", True,
     "drives rounds from itertools.count() and never stops when the work is done")
def serial_endless_iterator(engine):
    for _ in itertools.count():
        if engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))


@add("02a", "serial_flush_previous_step_before_schedule", True,
     "launches a round, then processes it at the top of the next pass, after the next schedule(): one stage late")
def serial_flush_previous_step_before_schedule(engine):
    step = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if step is not None:
            engine.process_outputs(step)
            step = None
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
    if step is not None:
        engine.process_outputs(step)


# ============================================================================ 02a serial loop: RIGHT (unusual)

@add("02a", "serial_inline_stages", False, "processing written out inline (wait, read, commit, free) in the right place")
def serial_inline_stages(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        out = engine.read_outputs(step)
        for req in engine.commit_outputs(step, out):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)


@add("02a", "serial_inline_free_all_finished", False,
     "inline, frees every finished request without the num_inflight test: always 0 in serial (05's try-it #4)")
def serial_inline_free_all_finished(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished:
                engine.scheduler.free(req)


@add("02a", "serial_generator", False, "a generator yields launched steps; the caller processes each at once")
def serial_generator(engine):
    def launched(eng):
        while eng.scheduler.has_work():
            inputs = eng.prepare_inputs(eng.schedule())
            eng.launch_forward(inputs)
            yield eng.launch_sample(inputs)

    for step in launched(engine):
        engine.process_outputs(step)


@add("02a", "serial_recursive", False, "recursion instead of a while loop (one round per call)")
def serial_recursive(engine):
    if not engine.scheduler.has_work():
        return
    plan = engine.schedule()
    inputs = engine.prepare_inputs(plan)
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))
    serial_recursive(engine)


@add("02a", "serial_while_true_break", False, "while True with a break when the scheduler has no work")
def serial_while_true_break(engine):
    while True:
        if not engine.scheduler.has_work():
            break
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)


@add("02a", "serial_dict_of_steps", False, "keeps steps in a dict keyed by round and pops each at once")
def serial_dict_of_steps(engine):
    steps = {}
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        steps[plan.round] = engine.launch_sample(inputs)
        engine.process_outputs(steps.pop(plan.round))


class SerialLoopObject:
    """A class with __call__, counting its rounds."""

    def __init__(self):
        self.rounds = 0

    def __call__(self, engine):
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))
            self.rounds += 1


value("02a", "serial_callable_object", False, "an instance of a class with __call__", SerialLoopObject())


@add("02a", "serial_schedule_at_bottom", False,
     "schedules the first round before the loop and the next one at the bottom, after processing")
def serial_schedule_at_bottom(engine):
    plan = engine.schedule() if engine.scheduler.has_work() else None
    while plan is not None:
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        plan = engine.schedule() if engine.scheduler.has_work() else None


@add("02a", "serial_sync_after_sample", False,
     "waits with engine.device.synchronize() after the sample (the last launch, so same as its event) before process_outputs")
def serial_sync_after_sample(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.synchronize()
        engine.process_outputs(step)


@add("02a", "serial_itertools_takewhile", False, "itertools.takewhile over itertools.count() instead of while")
def serial_itertools_takewhile(engine):
    for _ in itertools.takewhile(lambda _: engine.scheduler.has_work(), itertools.count()):
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def _serial_with_hook(engine, hook):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        hook(step)
        engine.process_outputs(step)


value("02a", "serial_functools_partial", False, "a functools.partial of a two-argument loop with a no-op hook",
      functools.partial(_serial_with_hook, hook=lambda step: None))


@add("02a", "serial_flush_instead_of_process", False,
     "uses engine.flush(step) (process now, stage 'flush') in place of process_outputs; same calls underneath")
def serial_flush_instead_of_process(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        step = engine.flush(step)


@add("02a", "serial_release_if_done_inline", False,
     "inline processing using scheduler.release_if_done (found in scheduler.py) for the free")
def serial_release_if_done_inline(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done, timeout=60)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)


# ============================================================================ 02b idle fraction

value("02b", "idle_busy_fraction", True, "returns the busy fraction busy / (idle + busy)",
      lambda tl: tl.device_busy_ms() / (sum(b - a for a, b in tl.device_gaps()) + tl.device_busy_ms()))
value("02b", "idle_over_busy", True, "divides idle by busy, not by idle + busy",
      lambda tl: sum(b - a for a, b in tl.device_gaps()) / tl.device_busy_ms())
value("02b", "idle_percent", True, "returns a percentage (x100) instead of a fraction",
      lambda tl: 100 * sum(b - a for a, b in tl.device_gaps())
      / (sum(b - a for a, b in tl.device_gaps()) + tl.device_busy_ms()))
value("02b", "idle_gap_count", True, "uses the number of gaps as the idle time",
      lambda tl: len(tl.device_gaps()) / (len(tl.device_gaps()) + tl.device_busy_ms()))
value("02b", "idle_seconds_mixed", True, "converts idle to seconds but leaves busy in ms",
      lambda tl: (sum(b - a for a, b in tl.device_gaps()) / 1000)
      / (sum(b - a for a, b in tl.device_gaps()) / 1000 + tl.device_busy_ms()))


def _idle_whole_run(tl):
    """Whole run (first span of any lane to last span) as the denominator."""
    idle = sum(b - a for a, b in tl.device_gaps())
    start = min(s.start_ms for s in tl.spans)
    end = max(s.end_ms for s in tl.spans)
    return idle / (end - start)


value("02b", "idle_whole_run_denominator", True,
      "divides by the whole run including host start-up/tear-down, not idle + busy", _idle_whole_run)


def _idle_decode_only(tl):
    prefill = set(tl.meta.prefill_rounds)
    rounds = [r for r in tl.rounds() if r not in prefill]
    return tl.device_idle_fraction(rounds)


value("02b", "idle_decode_only", True, "measures the decode rounds only (decode_device_idle_fraction)",
      _idle_decode_only)


def _idle_unmerged_busy(tl):
    """Busy as the plain sum of device span lengths and idle from raw consecutive spans."""
    spans = tl.lane("device")
    busy = sum(s.end_ms - s.start_ms for s in spans)
    idle = sum(max(0.0, b.start_ms - a.end_ms) for a, b in zip(spans, spans[1:]))
    return idle / (idle + busy)


value("02b", "idle_unmerged_spans", True,
      "sums raw device span lengths (overlaps counted twice) and raw gaps, not merged ones", _idle_unmerged_busy)


def _idle_host_gaps(tl):
    spans = tl.lane("host")
    busy = sum(s.end_ms - s.start_ms for s in spans)
    idle = sum(max(0.0, b.start_ms - a.end_ms) for a, b in zip(spans, spans[1:]))
    return idle / (idle + busy)


value("02b", "idle_host_lane", True, "measures the host lane's gaps instead of the device's", _idle_host_gaps)


def _idle_including_edges(tl):
    idle = sum(b - a for a, b in tl.device_gaps())
    dev = tl.lane("device")
    host = tl.lane("host")
    idle += max(0.0, dev[0].start_ms - host[0].start_ms)  # start-up counted as idle
    return idle / (idle + tl.device_busy_ms())


value("02b", "idle_including_startup", True, "counts the time before the first device span as idle",
      _idle_including_edges)


def _idle_engine_stats_closure(tl):
    # reads the engine's number instead of computing it from the timeline it is given
    import gc
    for obj in gc.get_objects():
        if isinstance(obj, te.Engine) and obj.timeline is tl:
            return obj.stats.device_idle_fraction
    return 0.0


value("02b", "idle_reads_engine_stats", True,
      "does not compute anything: finds the engine and returns engine.stats.device_idle_fraction",
      _idle_engine_stats_closure)

value("02b", "idle_rounded_2dp", True, "rounds the fraction to 2 decimals before returning",
      lambda tl: round(sum(b - a for a, b in tl.device_gaps())
                       / (sum(b - a for a, b in tl.device_gaps()) + tl.device_busy_ms()), 2))

# right, unusual
value("02b", "idle_builtin_method", True, "calls timeline.device_idle_fraction(), the built-in "
      "the exercise asks to compute yourself (real nbgrader gave it 2/2: grading round 44)",
      lambda tl: tl.device_idle_fraction())


def _idle_window(tl):
    dev = tl.lane("device")
    window = max(s.end_ms for s in dev) - dev[0].start_ms
    return 1 - tl.device_busy_ms() / window


value("02b", "idle_one_minus_busy_over_window", False,
      "1 - busy / (last device end - first device start): equal to idle / (idle + busy)", _idle_window)


def _idle_numpy(tl):
    g = np.asarray(tl.device_gaps(), dtype=float).reshape(-1, 2)
    idle = float(np.diff(g, axis=1).sum())
    return idle / (idle + tl.device_busy_ms())


value("02b", "idle_numpy", False, "numpy diff over the gap array", _idle_numpy)


def _idle_fsum_seconds(tl):
    idle_s = math.fsum((b - a) / 1e3 for a, b in tl.device_gaps())
    busy_s = tl.device_busy_ms() / 1e3
    return idle_s / (idle_s + busy_s)


value("02b", "idle_seconds_both", False, "converts both idle and busy to seconds (ratio unchanged), math.fsum",
      _idle_fsum_seconds)


def _idle_from_gaps_complement(tl):
    gaps = tl.device_gaps()
    idle = sum(e - s for s, e in gaps)
    busy = tl.device_busy_ms()
    return 1.0 / (1.0 + busy / idle) if idle else 0.0


value("02b", "idle_reciprocal_form", False, "1 / (1 + busy / idle), an algebraically equal form",
      _idle_from_gaps_complement)


def _idle_torch(tl):
    g = torch.tensor(tl.device_gaps(), dtype=torch.float64).reshape(-1, 2)
    idle = (g[:, 1] - g[:, 0]).sum()
    return (idle / (idle + tl.device_busy_ms())).item()


value("02b", "idle_torch_tensor", False, "torch tensor arithmetic, returns a Python float via .item()", _idle_torch)


# ============================================================================ 03a ZOS loop helpers

def _zos_template(engine, *, process=None, flush=None, correct=True):
    """The lesson's ZOS loop with pluggable processing (used by several answers)."""
    process = process or engine.process_outputs
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if flush is None:
                previous = engine.flush(previous)
            else:
                flush(previous)
                previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None and correct:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            process(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            process(current)
            previous = None
        else:
            previous = current


# ============================================================================ 03a ZOS loop: WRONG

@add("03a", "zos_wait_previous_before_forward", True,
     "waits on previous.sample_done before launching this round's forward: the device idles, overlap lost, tokens right")
def zos_wait_previous_before_forward(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
            engine.device.wait(previous.sample_done)  # "to be safe"
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_wait_right_after_sample", True,
     "waits on the round's own sample_done right after launching it: every round is finished before the next starts")
def zos_wait_right_after_sample(engine):
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
        engine.device.wait(current.sample_done)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_synchronize_after_sample", True,
     "engine.device.synchronize() after each launch_sample: serialises everything, tokens right")
def zos_synchronize_after_sample(engine):
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
        engine.device.synchronize()
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_synchronize_before_schedule", True,
     "synchronizes at the top of every pass (before schedule): the previous sample is done before anything new is launched")
def zos_synchronize_before_schedule(engine):
    previous = None
    while engine.scheduler.has_work():
        engine.device.synchronize()
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


@add("03a", "zos_wait_on_record_event_before_forward", True,
     "waits on a freshly recorded event (= synchronize) just before launch_forward: serial gap")
def zos_wait_on_record_event_before_forward(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
            engine.device.wait(engine.device.record_event())
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_inline_serial_order", True,
     "'ZOS' loop with processing written inline at the top of each pass, before prepare: actually serial order")
def zos_inline_serial_order(engine):
    previous = None
    while engine.scheduler.has_work():
        if previous is not None:
            _inline_process(engine, previous)
            previous = None
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            _inline_process(engine, current)
        else:
            previous = current
    if previous is not None:
        _inline_process(engine, previous)


@add("03a", "zos_inline_wait_before_forward", True,
     "inline processing where the wait on previous.sample_done comes before launch_forward, the commit after it")
def zos_inline_wait_before_forward(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
            engine.device.wait(previous.sample_done)
        engine.launch_forward(inputs)
        if previous is not None:
            out = engine.read_outputs(previous)
            for req in engine.commit_outputs(previous, out):
                engine.scheduler.release_if_done(req)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            _inline_process(engine, current)
            previous = None
        else:
            previous = current


@add("03a", "zos_inline_no_flush_stage", True,
     "inline processing in the right place, but the last step is processed inline too instead of through flush")
def zos_inline_no_flush_stage(engine):
    _zos_template(engine, process=lambda s: _inline_process(engine, s),
                  flush=lambda s: s is not None and _inline_process(engine, s))


@add("03a", "zos_process_before_forward", True,
     "processes previous between prepare_inputs and launch_forward: the serial gap")
def zos_process_before_forward(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
            engine.process_outputs(previous)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_sample_before_postprocess", True,
     "launches this round's sample before processing previous (title-case mask one token late)")
def zos_sample_before_postprocess(engine):
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
        current = engine.launch_sample(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_no_correction", True, "never calls correct_on_device: stale lengths under speculation")
def zos_no_correction(engine):
    _zos_template(engine, correct=False)


@add("03a", "zos_correction_after_forward", True,
     "calls correct_on_device after launch_forward: the forward already used the stale lengths")
def zos_correction_after_forward(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.correct_on_device(inputs)
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_no_flush_break", True, "breaks out when schedule() returns None without flushing previous")
def zos_no_flush_break(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
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


@add("03a", "zos_flush_then_break", True,
     "flushes on None but then breaks: the 4th prompt, waiting for a row, never runs")
def zos_flush_then_break(engine):
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


@add("03a", "zos_flush_not_cleared", True, "engine.flush(previous) without assigning: the step is processed twice later")
def zos_flush_not_cleared(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            engine.flush(previous)
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


@add("03a", "zos_process_instead_of_flush", True,
     "at schedule() None processes previous with process_outputs instead of flush (run must end in flush)")
def zos_process_instead_of_flush(engine):
    _zos_template(engine, flush=lambda s: s is not None and engine.process_outputs(s))


@add("03a", "zos_never_defer", True, "processes every step at once in its own round: the prefill rule applied to decode")
def zos_never_defer(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        engine.process_outputs(current)


@add("03a", "zos_defer_prefill", True, "defers prefill steps too (exercise rule: process prefill at once)")
def zos_defer_prefill(engine):
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
        previous = engine.launch_sample(inputs)


@add("03a", "zos_flush_every_step", True, "flushes each decode step right after its own sample")
def zos_flush_every_step(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            engine.flush(current)


@add("03a", "zos_flush_after_schedule_found_plan", True,
     "flushes previous right after schedule() returned a plan (hides nothing), before prepare")
def zos_flush_after_schedule_found_plan(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        previous = engine.flush(previous)
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            previous = current


@add("03a", "zos_skip_previous_on_prefill_round", True,
     "does not process previous in a prefill round, so a decode step can stay deferred past round N+1")
def zos_skip_previous_on_prefill_round(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None and not plan.is_prefill:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None and not plan.is_prefill:
            engine.process_outputs(previous)
            previous = None
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            previous = current


@add("03a", "zos_two_deep_pipeline", True,
     "defers decode steps by two rounds (queue of 2): step N processed in round N+2")
def zos_two_deep_pipeline(engine):
    queue = collections.deque()
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            if queue:
                engine.flush(queue.popleft())
            continue
        inputs = engine.prepare_inputs(plan)
        if queue:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if len(queue) >= 2:
            engine.process_outputs(queue.popleft())
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            queue.append(current)


@add("03a", "zos_continue_without_flush_hangs", True,
     "on None just continues without flushing: nothing can ever be scheduled again")
def zos_continue_without_flush_hangs(engine):
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


@add("03a", "zos_calls_engine_loop", True, "does not write the loop: calls te.loops.zos_loop(engine)")
def zos_calls_engine_loop(engine):
    te.loops.zos_loop(engine)


@add("03a", "zos_calls_serial_loop", True, "calls the engine's serial_loop: right tokens, serial order")
def zos_calls_serial_loop(engine):
    te.loops.serial_loop(engine)


@add("03a", "zos_patch_process_outputs_class", True,
     "patches te.Engine.process_outputs on the class (to an inline version) and runs the engine's zos_loop")
def zos_patch_process_outputs_class(engine):
    original = te.Engine.process_outputs

    def patched(self, step, stage="postprocess"):
        return original(self, step, stage)

    te.Engine.process_outputs = patched
    te.loops.zos_loop(engine)


@add("03a", "zos_disable_correction_kernel_patch", True,
     "patches toy_engine.kernels.correct_seqlens_qk to a no-op and skips correct_on_device")
def zos_disable_correction_kernel_patch(engine):
    import toy_engine.kernels as k
    k.correct_seqlens_qk = lambda meta, accepted, block_size: None
    _zos_template(engine, correct=False)


@add("03a", "zos_forever_after_done", True, "keeps looping after the work is done (while True, no break)")
def zos_forever_after_done(engine):
    previous = None
    while True:
        if not engine.scheduler.has_work():
            time.sleep(0.01)
            continue
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


@add("03a", "zos_swallow_baseexception", True,
     "wraps the loop body in try/except BaseException: pass, hiding errors (and swallowing interrupts)")
def zos_swallow_baseexception(engine):
    previous = None
    while engine.scheduler.has_work():
        try:
            plan = engine.schedule()
            if plan is None:
                engine.process_outputs(previous)  # wrong: processed, not flushed; errors swallowed
                previous = None
                continue
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            current = engine.launch_sample(inputs)
            if previous is not None:
                engine.process_outputs(previous)
            previous = None if plan.is_prefill else current
            if plan.is_prefill:
                engine.process_outputs(current)
        except BaseException:
            pass


@add("03a", "zos_inline_one_round_late_serial_like", True,
     "inline processing after launch_sample (sample before the previous postprocess)")
def zos_inline_one_round_late_serial_like(engine):
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
        current = engine.launch_sample(inputs)
        if previous is not None:
            _inline_process(engine, previous)
        if plan.is_prefill:
            _inline_process(engine, current)
            previous = None
        else:
            previous = current


@add("03a", "zos_correction_only_on_first_decode", True,
     "calls correct_on_device only when previous is None (inverted condition)")
def zos_correction_only_on_first_decode(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is None:
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


# ============================================================================ 03a ZOS loop: RIGHT (unusual)

@add("03a", "zos_inline_right_place", False,
     "processing written out inline (wait on the step's event, read, commit, release) between forward and sample; flush at the end")
def zos_inline_right_place(engine):
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
            engine.device.wait(previous.sample_done)
            out = engine.read_outputs(previous)
            for req in engine.commit_outputs(previous, out):
                if req.finished and req.num_inflight == 0:
                    engine.scheduler.free(req)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.device.wait(current.sample_done)
            for req in engine.commit_outputs(current, engine.read_outputs(current)):
                engine.scheduler.release_if_done(req)
            previous = None
        else:
            previous = current


@add("03a", "zos_generator", False, "a generator of launched rounds; the loop body handles the previous step")
def zos_generator(engine):
    def rounds(eng):
        while eng.scheduler.has_work():
            yield eng.schedule()

    previous = None
    for plan in rounds(engine):
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
        previous = None if plan.is_prefill else current


def _zos_recursive(engine, previous=None):
    if not engine.scheduler.has_work():
        return
    plan = engine.schedule()
    if plan is None:
        return _zos_recursive(engine, engine.flush(previous))
    inputs = engine.prepare_inputs(plan)
    if previous is not None:
        engine.correct_on_device(inputs)
    engine.launch_forward(inputs)
    if previous is not None:
        engine.process_outputs(previous)
    current = engine.launch_sample(inputs)
    if plan.is_prefill:
        engine.process_outputs(current)
        current = None
    return _zos_recursive(engine, current)


value("03a", "zos_recursive", False, "tail recursion carrying previous as an argument (~60 levels deep)",
      _zos_recursive)


@add("03a", "zos_while_true_break", False, "while True with a break when has_work() is False")
def zos_while_true_break(engine):
    previous = None
    while True:
        if not engine.scheduler.has_work():
            break
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


@add("03a", "zos_dict_keyed_by_round", False, "deferred steps kept in a dict keyed by round; pops round N-1")
def zos_dict_keyed_by_round(engine):
    pending = {}
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            for r in sorted(pending):
                engine.flush(pending.pop(r))
            continue
        inputs = engine.prepare_inputs(plan)
        if pending:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        for r in sorted(pending):
            engine.process_outputs(pending.pop(r))
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            pending[plan.round] = current


class ZosLoopObject:
    """A class with __call__; previous lives on the object."""

    def __call__(self, engine):
        self.previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                self.previous = engine.flush(self.previous)
                continue
            inputs = engine.prepare_inputs(plan)
            if self.previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if self.previous is not None:
                engine.process_outputs(self.previous)
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
                self.previous = None
            else:
                self.previous = current


value("03a", "zos_callable_object", False, "an instance of a class with __call__", ZosLoopObject())


@add("03a", "zos_deque_maxlen1", False, "previous held in a deque(maxlen=1)")
def zos_deque_maxlen1(engine):
    held = collections.deque(maxlen=1)
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            engine.flush(held.pop() if held else None)
            continue
        inputs = engine.prepare_inputs(plan)
        if held:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if held:
            engine.process_outputs(held.pop())
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            held.append(current)


@add("03a", "zos_flush_via_process_outputs_stage", False,
     "flushes with engine.process_outputs(previous, stage='flush'), exactly what flush does inside")
def zos_flush_via_process_outputs_stage(engine):
    _zos_template(engine, flush=lambda s: s is not None and engine.process_outputs(s, stage="flush"))


@add("03a", "zos_correct_always_on_decode", False,
     "calls correct_on_device on every decode round, also with no step in flight (shift is 0 when pending = 0)")
def zos_correct_always_on_decode(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if not plan.is_prefill:
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


@add("03a", "zos_walrus_and_return", False, "walrus on schedule(); returns when flushing empties the work")
def zos_walrus_and_return(engine):
    previous = None
    while engine.scheduler.has_work():
        if (plan := engine.schedule()) is None:
            previous = engine.flush(previous)
            if not engine.scheduler.has_work():
                return
            continue
        inputs = engine.prepare_inputs(plan)
        in_flight = previous is not None
        if in_flight:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if in_flight:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        previous = None if plan.is_prefill else current


@add("03a", "zos_closure_state_list", False, "previous kept in a one-element list shared with a nested helper")
def zos_closure_state_list(engine):
    box = [None]

    def finish_previous():
        if box[0] is not None:
            engine.process_outputs(box[0])
            box[0] = None

    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            box[0] = engine.flush(box[0])
            continue
        inputs = engine.prepare_inputs(plan)
        if box[0] is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        finish_previous()
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
        else:
            box[0] = current


@add("03a", "zos_itertools_count_break", False, "for-loop over itertools.count() with a break")
def zos_itertools_count_break(engine):
    previous = None
    for _ in itertools.count():
        if not engine.scheduler.has_work():
            break
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


value("03a", "zos_partial_template", False, "functools.partial of a keyword-configured loop",
      functools.partial(_zos_template, correct=True))


# ============================================================================ 03b three rounds order

_RIGHT_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
                ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]

value("03b", "order_serial", True, "the serial order",
      [("forward", 1), ("sample", 1), ("postprocess", 1), ("forward", 2), ("sample", 2), ("postprocess", 2),
       ("forward", 3), ("sample", 3), ("flush", 3)])
value("03b", "order_sample_before_postprocess", True, "launches each sample before the previous postprocess",
      [("forward", 1), ("sample", 1), ("forward", 2), ("sample", 2), ("postprocess", 1),
       ("forward", 3), ("sample", 3), ("postprocess", 2), ("flush", 3)])
value("03b", "order_postprocess_last", True, "processes round 3 with postprocess instead of flush",
      _RIGHT_ORDER[:-1] + [("postprocess", 3)])
value("03b", "order_missing_flush", True, "leaves out the final flush (8 steps)", _RIGHT_ORDER[:-1])
value("03b", "order_with_round0", True, "includes round 0's forward/sample/postprocess",
      [("forward", 0), ("sample", 0), ("postprocess", 0)] + _RIGHT_ORDER)
value("03b", "order_flush_before_sample3", True, "flushes round 3 before its sample is launched",
      _RIGHT_ORDER[:7] + [("flush", 3), ("sample", 3)])
value("03b", "order_postprocess_late", True, "processes round 1 after round 2's sample (postprocess one stage late)",
      [("forward", 1), ("sample", 1), ("forward", 2), ("sample", 2), ("postprocess", 1), ("forward", 3),
       ("postprocess", 2), ("sample", 3), ("flush", 3)])
value("03b", "order_rounds_off_by_one", True, "numbers the decode rounds 0-2",
      [(s, r - 1) for s, r in _RIGHT_ORDER])
value("03b", "order_as_set", True, "a set of pairs: loses the order entirely", set(_RIGHT_ORDER))
value("03b", "order_as_dict", True, "a dict stage->round: keys collapse", dict(_RIGHT_ORDER))
value("03b", "order_with_wait", True, "adds ('wait', N) before each postprocess though told to leave it out",
      [("forward", 1), ("sample", 1), ("forward", 2), ("wait", 1), ("postprocess", 1), ("sample", 2),
       ("forward", 3), ("wait", 2), ("postprocess", 2), ("sample", 3), ("wait", 3), ("flush", 3)])
value("03b", "order_swapped_pairs", True, "writes (round, stage) pairs instead of (stage, round)",
      [(r, s) for s, r in _RIGHT_ORDER])
value("03b", "order_flush_all_then_nothing", True, "flushes every round instead of postprocess",
      [("flush", r) if s == "postprocess" else (s, r) for s, r in _RIGHT_ORDER])
value("03b", "order_launch_prefix", True, "uses the timeline names 'launch_forward'/'launch_sample'",
      [("launch_" + s if s in ("forward", "sample") else s, r) for s, r in _RIGHT_ORDER])
value("03b", "order_forward2_before_sample1", True, "forward 2 launched before sample 1",
      [("forward", 1), ("forward", 2), ("sample", 1), ("postprocess", 1), ("sample", 2),
       ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)])
value("03b", "order_flat_strings", True, "a flat list of strings like 'forward 1'",
      [f"{s} {r}" for s, r in _RIGHT_ORDER])
value("03b", "order_postprocess_round_wrong", True, "writes ('postprocess', 2) in round 2's pass (its own round)",
      [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 2), ("sample", 2),
       ("forward", 3), ("postprocess", 3), ("sample", 3), ("flush", 3)])
# right, unusual containers
value("03b", "order_tuple_of_tuples", False, "a tuple of tuples", tuple(_RIGHT_ORDER))
value("03b", "order_list_of_lists", False, "a list of two-element lists", [list(p) for p in _RIGHT_ORDER])
value("03b", "order_numpy_int_rounds", False, "rounds are numpy.int64", [(s, np.int64(r)) for s, r in _RIGHT_ORDER])
value("03b", "order_namedtuples", False, "namedtuples Step(stage, round)",
      [collections.namedtuple("Step", "stage round")(s, r) for s, r in _RIGHT_ORDER])


# ============================================================================ 04a correct_seqlens_qk

def _owner(meta):
    q = meta["seqlens_q"]
    return torch.repeat_interleave(torch.arange(len(q), device=q.device), q, output_size=len(meta["positions"]))


# ---------------- wrong

@add("04a", "corr_item_loop", True, "right numbers, but a Python loop over requests with .item(): host round trips")
def corr_item_loop(meta, accepted, block_size):
    start = 0
    for b in range(len(meta["seqlens_q"])):
        q = meta["seqlens_q"][b].item()
        d = accepted[meta["rows"][b]].item() * meta["pending"][b].item()
        meta["seqlens_k"][b] += d
        for t in range(start, start + q):
            meta["positions"][t] += d
            p = meta["positions"][t].item()
            meta["slot_mapping"][t] = meta["block_tables"][b, p // block_size] * block_size + p % block_size
        start += q


@add("04a", "corr_tolist", True, "right numbers computed from .tolist() copies in Python, written back")
def corr_tolist(meta, accepted, block_size):
    rows, pend, q = meta["rows"].tolist(), meta["pending"].tolist(), meta["seqlens_q"].tolist()
    acc = accepted.tolist()
    delta = [acc[r] * p for r, p in zip(rows, pend)]
    owner = [b for b, n in enumerate(q) for _ in range(n)]
    pos = [p + delta[o] for p, o in zip(meta["positions"].tolist(), owner)]
    tables = meta["block_tables"].tolist()
    slots = [tables[o][p // block_size] * block_size + p % block_size for p, o in zip(pos, owner)]
    meta["seqlens_k"] += torch.tensor(delta, dtype=meta["seqlens_k"].dtype)
    meta["positions"].copy_(torch.tensor(pos))
    meta["slot_mapping"].copy_(torch.tensor(slots))


@add("04a", "corr_numpy_roundtrip", True, "right numbers via .numpy(): the metadata goes through host memory")
def corr_numpy_roundtrip(meta, accepted, block_size):
    q = meta["seqlens_q"].cpu().numpy()
    owner = np.repeat(np.arange(len(q)), q)
    delta = accepted.cpu().numpy()[meta["rows"].cpu().numpy()] * meta["pending"].cpu().numpy()
    pos = meta["positions"].cpu().numpy() + delta[owner]
    block = meta["block_tables"].cpu().numpy()[owner, pos // block_size]
    meta["seqlens_k"] += torch.from_numpy(delta).to(meta["seqlens_k"].device)
    meta["positions"].copy_(torch.from_numpy(pos))
    meta["slot_mapping"].copy_(torch.from_numpy(block * block_size + pos % block_size))


@add("04a", "corr_if_any_pending", True,
     "vectorised but branches on a device value (`if meta['pending'].any():`): an implicit sync")
def corr_if_any_pending(meta, accepted, block_size):
    if not meta["pending"].any():
        return
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


@add("04a", "corr_python_loop_no_item", True,
     "a Python loop over requests with tensor slicing (no .item) – still a loop per request")
def corr_python_loop_no_item(meta, accepted, block_size):
    starts = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    for b in range(len(meta["rows"])):
        d = accepted[meta["rows"][b]] * meta["pending"][b]
        sl = slice(int(starts[b]), int(starts[b] + meta["seqlens_q"][b]))
        meta["seqlens_k"][b] += d
        meta["positions"][sl] += d
        pos = meta["positions"][sl]
        meta["slot_mapping"][sl] = meta["block_tables"][b][pos // block_size] * block_size + pos % block_size


@add("04a", "corr_cpu_then_copy", True,
     "computes on .cpu() copies then copies back: host round trip (no-op on the stand-in, a sync on a GPU)")
def corr_cpu_then_copy(meta, accepted, block_size):
    m = {k: v.cpu().clone() for k, v in meta.items()}
    acc = accepted.cpu()
    delta = acc[m["rows"]] * m["pending"]
    owner = torch.repeat_interleave(torch.arange(len(m["seqlens_q"])), m["seqlens_q"])
    m["seqlens_k"] += delta
    m["positions"] += delta[owner]
    m["slot_mapping"] = m["block_tables"][owner, m["positions"] // block_size] * block_size \
        + m["positions"] % block_size
    for name in ("seqlens_k", "positions", "slot_mapping"):
        meta[name].copy_(m[name].to(meta[name].device))


@add("04a", "corr_int_max_delta", True, "early-exits with `if int(delta.max()) == 0: return`: a device sync")
def corr_int_max_delta(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    if int(delta.max()) == 0:
        return
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_rebind_dict_entries", True,
     "stores new tensors into the dict (meta[k] = meta[k] + delta) instead of changing the tensors in place")
def corr_rebind_dict_entries(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] = meta["seqlens_k"] + delta
    meta["positions"] = meta["positions"] + delta[owner]
    meta["slot_mapping"] = meta["block_tables"][owner, meta["positions"] // block_size] * block_size \
        + meta["positions"] % block_size


@add("04a", "corr_on_copy_of_dict", True, "works on a shallow copy with rebinding: the caller's meta never changes")
def corr_on_copy_of_dict(meta, accepted, block_size):
    meta = dict(meta)
    corr_rebind_dict_entries(meta, accepted, block_size)


@add("04a", "corr_accepted_by_batch_index", True, "uses accepted[:B] (batch position) instead of accepted[rows]")
def corr_accepted_by_batch_index(meta, accepted, block_size):
    B = len(meta["rows"])
    delta = accepted[:B] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_one_plus_accepted", True, "shifts by 1 + accepted (the host already counted the one token)")
def corr_one_plus_accepted(meta, accepted, block_size):
    delta = (1 + accepted[meta["rows"]]) * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_no_pending", True, "drops the pending factor: shifts requests whose lengths were already right")
def corr_no_pending(meta, accepted, block_size):
    delta = accepted[meta["rows"]]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_add_delta_to_slots", True, "adds the shift to the old slots instead of recomputing via the block table")
def corr_add_delta_to_slots(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"] += delta[owner]


@add("04a", "corr_hardcoded_block4", True, "writes 4 where block_size belongs")
def corr_hardcoded_block4(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // 4] * 4 + meta["positions"] % 4)


@add("04a", "corr_first_token_only", True, "moves only each request's first token")
def corr_first_token_only(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    first = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    meta["seqlens_k"] += delta
    meta["positions"][first] += delta
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_also_shifts_seqlens_q", True, "also changes seqlens_q (query lengths must not change)")
def corr_also_shifts_seqlens_q(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)
    meta["seqlens_q"] += delta


@add("04a", "corr_slots_from_old_positions", True, "recomputes slots before shifting positions: slots stay stale")
def corr_slots_from_old_positions(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]


@add("04a", "corr_no_mod_in_slot", True, "slot = block * block_size + position (forgot % block_size)")
def corr_no_mod_in_slot(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"])


@add("04a", "corr_hardcoded_k2_repeat", True, "expands delta with repeat_interleave(3): assumes k = 2 (the worked case)")
def corr_hardcoded_k2_repeat(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    meta["positions"] += delta.repeat_interleave(3)
    owner = torch.arange(len(meta["positions"]), device=meta["seqlens_q"].device) // 3
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_overwrites_input_ids", True,
     "also 'fixes' input_ids by replacing FROM_DEVICE with 0: the forward loses the future-token map")
def corr_overwrites_input_ids(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)
    meta["input_ids"].clamp_(min=0)


@add("04a", "corr_off_by_one_block", True, "block index from (position - 1) // block_size")
def corr_off_by_one_block(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, (pos - 1).clamp(min=0) // block_size] * block_size
                               + pos % block_size)


@add("04a", "corr_pending_from_input_ids_all_tokens", True,
     "derives 'pending' per token from input_ids == FROM_DEVICE: drafts are always FROM_DEVICE, so non-pending tokens shift too")
def corr_pending_from_input_ids_all_tokens(meta, accepted, block_size):
    owner = _owner(meta)
    tok_pending = (meta["input_ids"] == FROM_DEVICE).long()
    acc = accepted[meta["rows"]]
    meta["positions"] += acc[owner] * tok_pending
    first = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    meta["seqlens_k"] += acc * tok_pending[first]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_applies_twice", True, "applies the shift twice (calls the body twice to be sure)")
def corr_applies_twice(meta, accepted, block_size):
    for _ in range(2):
        delta = accepted[meta["rows"]] * meta["pending"]
        owner = _owner(meta)
        meta["seqlens_k"] += delta
        meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_patch_kernel_module", True,
     "patches toy_engine.kernels.correct_seqlens_qk with a no-op and then calls it")
def corr_patch_kernel_module(meta, accepted, block_size):
    import toy_engine.kernels as k
    real = k.correct_seqlens_qk
    k.correct_seqlens_qk = lambda *a: None
    real(meta, accepted, block_size)


@add("04a", "corr_calls_engine_kernel", True, "does not write it: calls toy_engine.kernels.correct_seqlens_qk")
def corr_calls_engine_kernel(meta, accepted, block_size):
    from toy_engine import kernels
    kernels.correct_seqlens_qk(meta, accepted, block_size)


@add("04a", "corr_forever", True, "spins forever (a while loop whose condition never changes)")
def corr_forever(meta, accepted, block_size):
    i = 0
    while i < len(meta["rows"]) + 1:
        i = i % len(meta["rows"])  # bug: never reaches the end


@add("04a", "corr_mutates_rows", True,
     "right shift, but also zeroes rows in place 'to mark them done' (rows must stay alone: the forward reads them)")
def corr_mutates_rows(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)
    meta["rows"].zero_()


# ---------------- right, unusual

@add("04a", "corr_repeat_interleave", False, "plain torch.repeat_interleave owner, add_ and copy_")
def corr_repeat_interleave(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                    meta["seqlens_q"])
    meta["seqlens_k"].add_(delta)
    meta["positions"].add_(delta[owner])
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, torch.div(pos, block_size, rounding_mode="floor")]
                               * block_size + torch.remainder(pos, block_size))


@add("04a", "corr_pending_from_input_ids", False,
     "derives pending per request from input_ids at each request's first token == FROM_DEVICE (the host's own rule)")
def corr_pending_from_input_ids(meta, accepted, block_size):
    q = meta["seqlens_q"]
    first = torch.cumsum(q, 0) - q
    pending = (meta["input_ids"][first] == FROM_DEVICE).to(accepted.dtype)
    delta = accepted[meta["rows"]] * pending
    owner = torch.repeat_interleave(torch.arange(len(q), device=meta["seqlens_q"].device), q)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_index_select_gather", False, "index_select for accepted, gather over the flattened block table")
def corr_index_select_gather(meta, accepted, block_size):
    delta = accepted.index_select(0, meta["rows"]) * meta["pending"]
    q = meta["seqlens_q"]
    owner = torch.repeat_interleave(torch.arange(q.numel(), device=meta["seqlens_q"].device), q)
    meta["seqlens_k"].add_(delta)
    meta["positions"].add_(delta.index_select(0, owner))
    tables = meta["block_tables"]
    flat_idx = owner * tables.shape[1] + meta["positions"] // block_size
    block = tables.reshape(-1).gather(0, flat_idx)
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


@add("04a", "corr_positions_from_seqlens_k", False,
     "shifts seqlens_k, then rebuilds positions as seqlens_k - seqlens_q + offset (equivalent)")
def corr_positions_from_seqlens_k(meta, accepted, block_size):
    q = meta["seqlens_q"]
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    owner = torch.repeat_interleave(torch.arange(len(q), device=meta["seqlens_q"].device), q)
    device = meta["seqlens_q"].device
    offset = torch.arange(len(meta["positions"]), device=device) - (torch.cumsum(q, 0) - q)[owner]
    meta["positions"].copy_((meta["seqlens_k"] - q)[owner] + offset)
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_searchsorted_owner", False, "owner from torch.searchsorted over cumulative seqlens_q")
def corr_searchsorted_owner(meta, accepted, block_size):
    q = meta["seqlens_q"]
    ends = torch.cumsum(q, 0)
    device = meta["seqlens_q"].device
    owner = torch.searchsorted(ends, torch.arange(len(meta["positions"]), device=device),
                               right=True)
    delta = torch.where(meta["pending"].bool(), accepted[meta["rows"]], torch.zeros_like(meta["pending"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"][:] = (meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_scatter_owner", False, "owner built by scattering 1s at request starts and a cumsum")
def corr_scatter_owner(meta, accepted, block_size):
    q = meta["seqlens_q"]
    T = meta["positions"].numel()
    starts = (torch.cumsum(q, 0) - q)[1:]
    marks = torch.zeros(T, dtype=torch.long).scatter_(0, starts, 1)
    owner = torch.cumsum(marks, 0)
    delta = accepted[meta["rows"]].mul(meta["pending"])
    meta["seqlens_k"].add_(delta)
    meta["positions"].add_(delta[owner])
    blk = meta["block_tables"][owner, meta["positions"].div(block_size, rounding_mode="floor")]
    meta["slot_mapping"].copy_(blk.mul(block_size).add(meta["positions"].fmod(block_size)))


@add("04a", "corr_bool_mask_where", False, "torch.where on a bool pending mask, then the lesson's steps")
def corr_bool_mask_where(meta, accepted, block_size):
    shifted = accepted[meta["rows"]]
    delta = torch.where(meta["pending"] != 0, shifted, 0)
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_einsum_onehot", False, "per-token delta via a one-hot matmul instead of indexing")
def corr_einsum_onehot(meta, accepted, block_size):
    q = meta["seqlens_q"]
    owner = torch.repeat_interleave(torch.arange(len(q), device=meta["seqlens_q"].device), q)
    onehot = torch.nn.functional.one_hot(owner, num_classes=len(q))
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    meta["positions"] += onehot @ delta
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_uses_model_token_layout", False, "reuses toy_engine.model.token_layout for the owner map")
def corr_uses_model_token_layout(meta, accepted, block_size):
    from toy_engine.model import token_layout
    owner, _ = token_layout(meta["seqlens_q"], meta["positions"].numel())
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                               + meta["positions"] % block_size)


@add("04a", "corr_clamped_block_index", False, "clamps the block index to the table width (defensive, same values)")
def corr_clamped_block_index(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = _owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    idx = (meta["positions"] // block_size).clamp(max=meta["block_tables"].shape[1] - 1)
    meta["slot_mapping"].copy_(meta["block_tables"][owner, idx] * block_size + meta["positions"] % block_size)


class CorrectionObject:
    """A callable object holding nothing but the method."""

    def __call__(self, meta, accepted, block_size):
        delta = accepted[meta["rows"]] * meta["pending"]
        owner = _owner(meta)
        meta["seqlens_k"] += delta
        meta["positions"] += delta[owner]
        meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size] * block_size
                                   + meta["positions"] % block_size)


value("04a", "corr_callable_object", False, "an instance of a class with __call__", CorrectionObject())


# ============================================================================ 04b metadata field set

_STALE = {"input_ids", "positions", "slot_mapping", "seqlens_k"}
value("04b", "meta_missing_input_ids", True, "leaves out input_ids", {"positions", "slot_mapping", "seqlens_k"})
value("04b", "meta_missing_slot_mapping", True, "leaves out slot_mapping", {"input_ids", "positions", "seqlens_k"})
value("04b", "meta_with_seqlens_q", True, "adds seqlens_q", _STALE | {"seqlens_q"})
value("04b", "meta_with_cu_seqlens_q", True, "adds cu_seqlens_q", _STALE | {"cu_seqlens_q"})
value("04b", "meta_with_block_tables", True, "adds block_tables", _STALE | {"block_tables"})
value("04b", "meta_only_correct_seqlens_qk", True, "only what correct_seqlens_qk changes (no input_ids)",
      ["seqlens_k", "positions", "slot_mapping"])
value("04b", "meta_comma_string", True, "one comma-separated string instead of a set of names",
      "input_ids, positions, slot_mapping, seqlens_k")
value("04b", "meta_with_pending", True, "adds pending (not stale)", _STALE | {"pending"})
value("04b", "meta_typo", True, "typo seq_lens_k", {"input_ids", "positions", "slot_mapping", "seq_lens_k"})
value("04b", "meta_with_rows", True, "adds rows", _STALE | {"rows"})
value("04b", "meta_dict_truthy", True, "a dict field -> True/False with the wrong field marked True",
      {"input_ids": True, "positions": True, "slot_mapping": True, "seqlens_k": True, "seqlens_q": True})
value("04b", "meta_only_seqlens_k", True, "only seqlens_k", {"seqlens_k"})
# right, unusual
value("04b", "meta_list", False, "a list instead of a set", ["input_ids", "positions", "slot_mapping", "seqlens_k"])
value("04b", "meta_tuple", False, "a tuple", ("seqlens_k", "slot_mapping", "positions", "input_ids"))
value("04b", "meta_frozenset", False, "a frozenset", frozenset(_STALE))
value("04b", "meta_with_cu_seqlens_k", False, "adds cu_seqlens_k (stale too; the notebook says it is accepted)",
      _STALE | {"cu_seqlens_k"})
value("04b", "meta_dict_keys", False, "dict.keys() view of a dict of stale fields",
      dict.fromkeys(["input_ids", "positions", "slot_mapping", "seqlens_k"]).keys())


# ============================================================================ 05 process_outputs

# ---------------- wrong

@add("05", "po_buggy_as_given", True, "the notebook's buggy version: read before wait, free without num_inflight")
def po_buggy_as_given(engine, step):
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        if req.finished:
            engine.scheduler.free(req)


@add("05", "po_free_all_finished", True, "waits first but frees every finished request (no num_inflight test)")
def po_free_all_finished(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            engine.scheduler.free(req)


@add("05", "po_swallow_race_error", True,
     "frees every finished request inside try/except RaceError: pass – the race checker stands in for the num_inflight rule")
def po_swallow_race_error(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            try:
                engine.scheduler.free(req)
            except te.RaceError:
                pass


@add("05", "po_swallow_exception_on_free", True, "except Exception: pass around an early free")
def po_swallow_exception_on_free(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        try:
            if req.finished:
                engine.scheduler.free(req)
        except Exception:
            continue


@add("05", "po_race_checker_off", True, "turns the race checker off, then frees every finished request")
def po_race_checker_off(engine, step):
    engine.device.races.enabled = False
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            engine.scheduler.free(req)


@add("05", "po_race_checker_off_read_first", True,
     "disables race checking around an early read (read before wait), then waits")
def po_race_checker_off_read_first(engine, step):
    races = engine.device.races
    races.enabled = False
    out = engine.read_outputs(step)
    races.enabled = True
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_reset_races_before_free", True, "calls races.reset() to forget pending launches before freeing early")
def po_reset_races_before_free(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            engine.device.races.reset()
            engine.scheduler.free(req)


@add("05", "po_retry_read_on_race", True,
     "reads first and only waits if the race checker complains: relies on the sanitizer for ordering")
def po_retry_read_on_race(engine, step):
    try:
        out = engine.read_outputs(step)
    except te.RaceError:
        engine.device.wait(step.sample_done)
        out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_never_free", True, "never frees finished requests: their rows and blocks are kept, the engine stalls")
def po_never_free(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))


@add("05", "po_free_only_on_stop", True, "frees only requests that stopped on a stop string, not on length")
def po_free_only_on_stop(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finish_reason == "stop" and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_inflight_eq_1", True, "off by one: frees when num_inflight == 1 (one round still uses the cache)")
def po_inflight_eq_1(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight <= 1:
            engine.scheduler.free(req)


@add("05", "po_finished_checked_before_commit", True,
     "decides who to free before commit: a request finishing in this step is never freed")
def po_finished_checked_before_commit(engine, step):
    engine.device.wait(step.sample_done)
    done = [r for r in step.plan.requests if r.finished]
    engine.commit_outputs(step, engine.read_outputs(step))
    for req in done:
        if req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_free_before_wait", True, "frees already-finished requests of the step before waiting (extra step still running)")
def po_free_before_wait(engine, step):
    for req in step.plan.requests:
        if req.finished:
            engine.scheduler.free(req)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_zero_inflight_then_free", True, "forces req.num_inflight = 0 to make the test pass, freeing early")
def po_zero_inflight_then_free(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            req.num_inflight = 0
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_double_free_blocks", True,
     "double free: gives the KV blocks back through BlockManager.free and again through scheduler.free")
def po_double_free_blocks(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.blocks.free(list(req.blocks), prompt=req.index)
            engine.scheduler.free(req)


@add("05", "po_synchronize_instead_of_wait", True,
     "waits with engine.device.synchronize(): also waits for the next round's forward, overlap lost")
def po_synchronize_instead_of_wait(engine, step):
    engine.device.synchronize()
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_sleep_instead_of_wait", True, "sleeps 50 ms instead of waiting on the event")
def po_sleep_instead_of_wait(engine, step):
    time.sleep(0.05)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_commit_twice", True, "commits the step twice")
def po_commit_twice(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    engine.commit_outputs(step, out)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_recursive_engine_call", True,
     "calls engine.process_outputs(step) inside the plug-in: recursion into itself")
def po_recursive_engine_call(engine, step):
    engine.process_outputs(step)


@add("05", "po_wait_wrong_step_event", True, "waits on an event recorded right now instead of the step's (= synchronize)")
def po_wait_wrong_step_event(engine, step):
    engine.device.wait(engine.device.record_event())
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_skip_prefill", True, "skips prefill steps entirely (only decode steps carry tokens)")
def po_skip_prefill(engine, step):
    if step.plan.is_prefill:
        return
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_clear_requests", True, "processes correctly, then clears engine.requests when all finished")
def po_clear_requests(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
    if all(r.finished for r in engine.requests):
        engine.requests.clear()


@add("05", "po_patch_engine_class", True,
     "patches te.Engine.commit_outputs on the class (a wrapper), frees every finished request and swallows RaceError")
def po_patch_engine_class(engine, step):
    if not getattr(te.Engine, "_blind_patched", False):
        real = te.Engine.commit_outputs

        def commit(self, s, out):
            reqs = real(self, s, out)
            return reqs

        te.Engine.commit_outputs = commit
        te.Engine._blind_patched = True
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            try:
                engine.scheduler.free(req)
            except te.RaceError:
                pass


@add("05", "po_config_replace_race_off", True,
     "engine.config = replace(engine.config, race_check=False), then frees every finished request")
def po_config_replace_race_off(engine, step):
    engine.config = dataclasses.replace(engine.config, race_check=False)
    engine.device.races.enabled = engine.config.race_check
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            engine.scheduler.free(req)


@add("05", "po_hang_on_finished", True, "busy-waits for num_inflight to reach 0 (it never changes while we wait)")
def po_hang_on_finished(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            while req.num_inflight:
                time.sleep(0.01)
            engine.scheduler.free(req)


@add("05", "po_catch_baseexception", True, "catches BaseException around the whole body (errors and interrupts vanish)")
def po_catch_baseexception(engine, step):
    try:
        out = engine.read_outputs(step)
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, out):
            if req.finished:
                engine.scheduler.free(req)
    except BaseException:
        engine.device.wait(step.sample_done)
        if not step.committed:
            for req in engine.commit_outputs(step, engine.read_outputs(step)):
                if req.finished and req.num_inflight == 0:
                    engine.scheduler.free(req)


# ---------------- right, unusual

@add("05", "po_release_if_done", False, "uses engine.scheduler.release_if_done(req) (scheduler.py) for the free rule")
def po_release_if_done(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


@add("05", "po_wait_with_timeout", False, "waits on sample_done with a timeout argument")
def po_wait_with_timeout(engine, step):
    engine.device.wait(step.sample_done, timeout=30.0)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_filter_lambda", False, "filter() with a lambda, then a loop of frees")
def po_filter_lambda(engine, step):
    engine.device.wait(step.sample_done)
    done = list(filter(lambda r: r.finished and not r.num_inflight,
                       engine.commit_outputs(step, engine.read_outputs(step))))
    for req in done:
        engine.scheduler.free(req)


@add("05", "po_loop_plan_requests", False, "loops over step.plan.requests after committing (same list commit returns)")
def po_loop_plan_requests(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))
    for req in step.plan.requests:
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_sweep_running", False,
     "sweeps the scheduler's running list for finished requests with no launched round (broader, same rule)")
def po_sweep_running(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))
    for req in list(engine.scheduler.running):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_manual_read_host_buffer", False,
     "reads the output slot by hand (device.host('out{slot}') + buffers.outputs_size) after the wait")
def po_manual_read_host_buffer(engine, step):
    engine.device.wait(step.sample_done)
    k = 0 if step.plan.is_prefill else engine.config.num_draft_tokens
    size = te_buffers.outputs_size(len(step.plan.requests), k)
    out = engine.device.host(te_buffers.out_buffer(step.slot), "r")[:size].tolist()
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_wait_twice", False, "waits before reading and again after (the second wait is redundant but harmless)")
def po_wait_twice(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


@add("05", "po_le_zero", False, "an any() early return, frees in reverse id order, tests num_inflight <= 0")
def po_le_zero(engine, step):
    engine.device.wait(step.sample_done)
    reqs = engine.commit_outputs(step, engine.read_outputs(step))
    if not any(r.finished for r in reqs):
        return
    for req in sorted(reqs, key=lambda r: -r.id):
        if req.finished and req.num_inflight <= 0:
            engine.scheduler.free(req)


class ProcessOutputsObject:
    def __init__(self):
        self.freed = 0

    def __call__(self, engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)
                self.freed += 1


value("05", "po_callable_object", False, "a callable object counting frees", ProcessOutputsObject())


@add("05", "po_generator_helper", False, "a generator yields the requests to free; consumed after the commit")
def po_generator_helper(engine, step):
    def to_free(reqs):
        for r in reqs:
            if r.finished and r.num_inflight == 0:
                yield r

    engine.device.wait(step.sample_done)
    for req in list(to_free(engine.commit_outputs(step, engine.read_outputs(step)))):
        engine.scheduler.free(req)


@add("05", "po_free_twice_noop", True,
     "calls scheduler.free twice: a double free, which the scheduler refuses since round 12 "
     "(notebook 07: the toy's scheduler.free refuses a second free); it was a silent no-op")
def po_free_twice_noop(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
            engine.scheduler.free(req)


value("05", "po_functools_partial", False, "functools.partial of a helper with a keyword argument",
      functools.partial(lambda engine, step, timeout: (engine.device.wait(step.sample_done, timeout=timeout),
                                                       [engine.scheduler.release_if_done(r) for r in
                                                        engine.commit_outputs(step, engine.read_outputs(step))]),
                        timeout=None))
