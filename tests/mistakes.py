"""The mutation corpus: wrong answers to exercises 02-05, each with the verdict category
its checker must give, and correct alternatives that must pass.

Each wrong answer is one classic mistake, written the way a learner would write it,
next to the solution it breaks.  ``tests/test_mistakes.py`` runs every entry; the
instructor guide's "common mistakes" table lists the same entries by name.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import torch

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine import kernels


@dataclass
class Answer:
    exercise: str   # "02a", "02b", "03a", "03b", "04a", "04b", "05"
    name: str
    answer: object
    category: str = "passed"  # the verdict category a wrong answer must get
    what: str = ""            # the mistake, in a few words (the instructor guide's table)


# ---------------------------------------------------------------- 02a: the serial loop

def serial(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)


def serial_while_true(engine):
    while True:
        if not engine.scheduler.has_work():
            break
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def serial_break_on_none(engine):
    while True:
        plan = engine.schedule()
        if plan is None:  # the serial loop only gets None when no work is left
            break
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def serial_through_the_class(engine):  # notebook 02 prints te.Engine.process_outputs
    while engine.scheduler.has_work():
        plan = te.Engine.schedule(engine)
        inputs = te.Engine.prepare_inputs(engine, plan)
        te.Engine.launch_forward(engine, inputs)
        te.Engine.process_outputs(engine, te.Engine.launch_sample(engine, inputs))


def serial_never_processes(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)


def serial_sample_first(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        step = engine.launch_sample(inputs)
        engine.launch_forward(inputs)
        engine.process_outputs(step)


def serial_processes_twice(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)
        engine.process_outputs(step)


def serial_ten_rounds(engine):
    for _ in range(10):
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def serial_no_forward(engine):
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        engine.process_outputs(engine.launch_sample(inputs))


def serial_forward_twice(engine):
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def serial_schedules_twice(engine):
    while engine.scheduler.has_work():
        engine.schedule()  # "just to see the plan"
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def serial_processes_at_the_end(engine):
    steps = []
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        steps.append(engine.launch_sample(inputs))
    for step in steps:
        engine.process_outputs(step)


def serial_one_round_late(engine):
    previous = None
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        previous = step
        if not engine.scheduler.waiting and all(r.num_inflight for r in engine.scheduler.running):
            engine.process_outputs(previous)
            previous = None


def serial_processes_prefill_only(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(step)


def serial_until_admitted(engine):
    while engine.scheduler.waiting:
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def serial_two_rounds_at_a_time(engine):
    while engine.scheduler.has_work():
        first = engine.prepare_inputs(engine.schedule())
        plan = engine.schedule()  # the next round planned and prepared too, "to save a pass"
        second = engine.prepare_inputs(plan) if plan is not None else None
        for inputs in (first, second) if second is not None else (first,):
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))


def serial_samples_twice(engine):
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        if engine.scheduler.round == 3:
            engine.process_outputs(engine.launch_sample(inputs))  # "sample it again to compare"


# ---------------------------------------------------------------- 02b: the idle fraction

def idle(timeline):
    idle_ms = sum(end - start for start, end in timeline.device_gaps())
    return idle_ms / (idle_ms + timeline.device_busy_ms())


def idle_end_minus_start(timeline):
    device = timeline.lane("device")
    span = max(s.end_ms for s in device) - min(s.start_ms for s in device)
    return sum(end - start for start, end in timeline.device_gaps()) / span


def idle_summed_durations(timeline):  # the stream runs one launch at a time: spans never overlap
    busy = sum(s.end_ms - s.start_ms for s in timeline.lane("device"))
    idle_ms = sum(end - start for start, end in timeline.device_gaps())
    return idle_ms / (idle_ms + busy)


def idle_one_minus_busy(timeline):
    idle_ms = sum(end - start for start, end in timeline.device_gaps())
    return 1 - timeline.device_busy_ms() / (idle_ms + timeline.device_busy_ms())


def idle_busy_fraction(timeline):
    idle_ms = sum(end - start for start, end in timeline.device_gaps())
    return timeline.device_busy_ms() / (idle_ms + timeline.device_busy_ms())


def idle_over_busy(timeline):
    return sum(end - start for start, end in timeline.device_gaps()) / timeline.device_busy_ms()


def idle_in_ms(timeline):
    return sum(end - start for start, end in timeline.device_gaps())


def idle_over_first_gap(timeline):
    start, end = timeline.device_gaps()[0]
    return (end - start) / (end - start + timeline.device_busy_ms())


def idle_over_the_whole_run(timeline):
    everything = timeline.spans
    return idle_in_ms(timeline) / (max(s.end_ms for s in everything) - min(s.start_ms for s in everything))


def idle_from_time_zero(timeline):
    """Counts the run's start-up, before the device's first span, as idle (blind round 44)."""
    return 1 - timeline.device_busy_ms() / max(s.end_ms for s in timeline.lane("device"))


def idle_from_the_built_in(timeline):
    """The timeline's own method: the exercise asks for the computation (grading round 44)."""
    return timeline.device_idle_fraction()


def idle_through_the_class(timeline):
    """The built-in called through the class: refused as the method is (grading round 46)."""
    return te.Timeline.device_idle_fraction(timeline)


def idle_that_falls_back(timeline):
    """Tries the built-in, and computes it where that is refused: judged by what it computed."""
    try:
        return timeline.device_idle_fraction()
    except Exception:  # noqa: BLE001 - the answer's own fallback
        return idle(timeline)


def idle_as_text(timeline):
    return f"{idle(timeline):.1%}"


# ---------------------------------------------------------------- 03a: the ZOS loop

def make_zos(*, flush="flush", process_first=False, defer=True, sample_first=False, correct="before",
             defer_prefill=False, reset_previous=True, on_none="continue", launch_sample_first=False,
             retry_none=False):
    """The solution, or one of its classic mistakes (``retry_none``: schedule() asked again at
    once when it returns None, the deferred step still held: blind round 48)."""
    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None and retry_none:
                plan = engine.schedule()
            if plan is None:
                if flush == "flush":
                    if reset_previous:
                        previous = engine.flush(previous)
                    else:
                        engine.flush(previous)
                elif flush == "process":
                    engine.process_outputs(previous)
                    previous = None
                else:  # the deferred step is dropped
                    previous = None
                if on_none == "break":
                    break
                if on_none == "continue":
                    continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None and process_first:
                engine.process_outputs(previous)
            if correct == "always" or (previous is not None and correct == "before"):
                engine.correct_on_device(inputs)
            if launch_sample_first:
                current = engine.launch_sample(inputs)
                engine.launch_forward(inputs)
            else:
                engine.launch_forward(inputs)
            if previous is not None and correct == "after":
                engine.correct_on_device(inputs)
            if not launch_sample_first and sample_first:
                current = engine.launch_sample(inputs)
            if previous is not None and not process_first:
                if flush == "always":
                    engine.flush(previous)
                else:
                    engine.process_outputs(previous)
            if not launch_sample_first and not sample_first:
                current = engine.launch_sample(inputs)
            if (plan.is_prefill and not defer_prefill) or not defer:
                engine.process_outputs(current)
                if reset_previous:
                    previous = None
            else:
                previous = current
    return loop


def zos_while_true(engine):
    previous = None
    while True:
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
        previous = None if plan.is_prefill else current
        if plan.is_prefill:
            engine.process_outputs(current)


def zos_flush_after_the_loop_too(engine):
    make_zos()(engine)
    engine.flush(None)


# ---------------------------------------------------------------- 03b: three rounds drawn

THREE_ROUNDS = [("forward", 1), ("sample", 1),
                ("forward", 2), ("postprocess", 1), ("sample", 2),
                ("forward", 3), ("postprocess", 2), ("sample", 3),
                ("flush", 3)]


# ---------------------------------------------------------------- 04a: the correction

def correction(meta, accepted, block_size):
    _shifted_by(meta, accepted[meta["rows"]] * meta["pending"], block_size)


def _shifted_by(meta, delta, block_size):
    """The correction's steps once each request's shift ``delta`` is known."""
    owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                    meta["seqlens_q"], output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def correction_arange_on_the_host(meta, accepted, block_size):  # right on a CPU, an error on a GPU
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.repeat_interleave(torch.arange(len(delta)), meta["seqlens_q"],
                                    output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def correction_calls_the_engines(meta, accepted, block_size):  # right values, not written
    kernels.correct_seqlens_qk(meta, accepted, block_size)


def correction_with_python_loop(meta, accepted, block_size):  # right values, read on the host: breaks the rule
    start = 0
    for b in range(len(meta["rows"])):
        q = int(meta["seqlens_q"][b])
        d = int(accepted[meta["rows"][b]] * meta["pending"][b])
        meta["seqlens_k"][b] += d
        for t in range(start, start + q):
            meta["positions"][t] += d
            p = int(meta["positions"][t])
            meta["slot_mapping"][t] = meta["block_tables"][b, p // block_size] * block_size + p % block_size
        start += q


def _shift(meta, delta, block_size, slots=True):
    owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                    meta["seqlens_q"])
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    if slots:
        block = meta["block_tables"][owner, meta["positions"] // block_size]
        meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def correction_stale(meta, accepted, block_size):
    pass


def correction_not_in_place(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    meta = dict(meta)
    meta["seqlens_k"] = meta["seqlens_k"] + delta  # a new tensor, in a copied dict


def correction_positions_only(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]] * meta["pending"], block_size, slots=False)


def correction_slot_plus_delta(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                    meta["seqlens_q"])
    _shift(meta, delta, block_size, slots=False)
    meta["slot_mapping"] += delta[owner]


def correction_grows_queries(meta, accepted, block_size):
    correction(meta, accepted, block_size)
    meta["seqlens_q"] += accepted[meta["rows"]] * meta["pending"]


def correction_by_batch_position(meta, accepted, block_size):
    _shift(meta, accepted[: len(meta["rows"])] * meta["pending"], block_size)


def correction_ignores_pending(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]], block_size)


def correction_off_by_one(meta, accepted, block_size):
    _shift(meta, (accepted[meta["rows"]] + 1) * meta["pending"], block_size)


def correction_first_token_only(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    starts = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    meta["seqlens_k"] += delta
    meta["positions"][starts] += delta
    owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                    meta["seqlens_q"])
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def correction_block_size_4(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]] * meta["pending"], 4)


def correction_lengths_only(meta, accepted, block_size):
    meta["seqlens_k"] += accepted[meta["rows"]] * meta["pending"]


# ---------------------------------------------------------------- 05: process_outputs

def process(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def process_release_if_done(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


def process_scanning_running(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))
    for req in list(engine.scheduler.running):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def process_waits_twice(engine, step):
    engine.device.wait(step.sample_done)
    engine.device.wait(step.sample_done)
    process(engine, step)


def process_buggy(engine, step):  # the notebook's buggy version: two mistakes
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        if req.finished:
            engine.scheduler.free(req)


def process_reads_first(engine, step):
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


def process_never_waits(engine, step):
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


def process_frees_early(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            engine.scheduler.free(req)


def process_never_frees(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))


def process_synchronizes(engine, step):
    engine.device.synchronize()
    process_release_if_done_after_wait(engine, step)


def process_waits_on_a_fresh_event(engine, step):
    engine.device.wait(engine.device.record_event())
    process_release_if_done_after_wait(engine, step)


def process_release_if_done_after_wait(engine, step):
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


def process_forgets_commit(engine, step):
    engine.device.wait(step.sample_done)
    engine.read_outputs(step)
    for req in step.plan.requests:
        engine.scheduler.release_if_done(req)


def process_commits_twice(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    engine.commit_outputs(step, out)
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


def process_commits_the_slot(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.device.host(f"out{step.slot}")):
        engine.scheduler.release_if_done(req)


def process_commits_the_tokens_only(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)[:len(step.plan.requests)]
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


def process_frees_when_nothing_in_flight(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.num_inflight == 0:
            engine.scheduler.free(req)


def process_frees_before_commit(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in step.plan.requests:
        engine.scheduler.release_if_done(req)
    engine.commit_outputs(step, out)


def process_frees_finished_before_commit(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in step.plan.requests:
        if req.finished:
            engine.scheduler.free(req)
    engine.commit_outputs(step, out)


# ---------------------------------------------------------------- the corpus

# ---------------------------------------------------------------- found by the learner review

def zos_flush_each_step(engine):
    """No overlap at all: every decode step is flushed right after its own sample."""
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(step)
        else:
            engine.flush(step)


def make_zos_process_after_schedule(stage="process"):
    """The deferred step processed right after schedule() found a plan, before prepare."""
    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if stage == "flush":
                previous = engine.flush(previous)
            elif previous is not None:
                engine.process_outputs(previous)
                previous = None
            if plan is None:
                continue
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
            else:
                previous = current
    return loop


def zos_flush_prefill(engine):
    """The solution, but the prefill step goes through flush."""
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
            previous = engine.flush(current)
        else:
            previous = current


def make_zos_waits_beyond(how="synchronize"):
    """The solution, plus a wait "to be safe" after the forward launch."""
    def loop(engine):
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
            if how == "synchronize":
                engine.device.synchronize()
            else:
                engine.device.wait(engine.device.record_event())
            if previous is not None:
                engine.process_outputs(previous)
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
                previous = None
            else:
                previous = current
    return loop


def make_process_outputs_waits_previous():
    """Waits on the previous step's event (kept between calls), not on this step's."""
    kept = {}

    def process_outputs(engine, step):
        event = kept.get("event", step.sample_done)
        kept["event"] = step.sample_done
        engine.device.wait(event)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
    return process_outputs


def process_outputs_calls_the_engine(engine, step):
    engine.process_outputs(step)


def zos_replaces_process_outputs(engine):
    engine.process_outputs = engine.flush  # an experiment on the checker's engine
    make_zos()(engine)


def serial_replaces_schedule(engine):
    engine.schedule = engine.scheduler.schedule
    serial(engine)


def process_outputs_replaces_the_method(engine, step):
    engine.process_outputs = process  # an experiment on the checker's engine
    process(engine, step)





def serial_prepares_twice(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def idle_percent(timeline):
    return 100 * idle(timeline)


def idle_nan(timeline):
    return float("nan")


def idle_from_the_timelines_stats(timeline):  # a run's timeline carries its stats: nothing computed
    return timeline.meta.stats.device_idle_fraction


def serial_swallows_errors(engine):
    while engine.scheduler.has_work():
        try:
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_sample(inputs)
            engine.launch_forward(inputs)
        except Exception:
            pass


def make_zos_swallows_errors():
    def loop(engine):
        while engine.scheduler.has_work():
            try:
                make_zos(flush="drop")(engine)
            except Exception:
                pass
    return loop


# ---------------------------------------------------------------- judged from the run's record (issue 20)

def inline_process(engine, step):
    """process_outputs written out, as notebook 02 prints it: wait, read, commit, release."""
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


def serial_inline(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        inline_process(engine, engine.launch_sample(inputs))


def serial_inline_one_round_late(engine):
    """Each round's results processed (inline) after the next round is launched."""
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            inline_process(engine, previous)
            previous = None
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        if previous is not None:
            inline_process(engine, previous)
        previous = step


def serial_synchronizes_instead(engine):
    """Waits for the device instead of processing the step."""
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)
        engine.device.synchronize()


def make_zos_inline(*, serial_order=False, wait="none"):
    """The ZOS loop with processing written out inline; or in serial order; or with a wait
    on the previous step before the next forward ("before_forward") or right after the
    sample ("after_sample")."""
    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                if previous is not None:
                    inline_process(engine, previous)
                previous = None
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                engine.correct_on_device(inputs)
                if wait == "before_forward":
                    engine.device.wait(previous.sample_done)
            engine.launch_forward(inputs)
            if previous is not None:
                inline_process(engine, previous)
            current = engine.launch_sample(inputs)
            if wait == "after_sample":
                engine.device.wait(current.sample_done)
            if plan.is_prefill or serial_order:
                inline_process(engine, current)
                previous = None
            else:
                previous = current
    return loop


def zos_generator_of_stages(engine):
    """Unusual but right: the rounds as a generator that yields each launched step."""
    def launched():
        while engine.scheduler.has_work():
            plan = engine.schedule()
            yield plan, (None if plan is None else engine.prepare_inputs(plan))

    previous = None
    for plan, inputs in launched():
        if plan is None:
            previous = engine.flush(previous)
            continue
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        pending = {True: None, False: current}[plan.is_prefill]
        if pending is None:
            engine.process_outputs(current)
        previous = pending


def zos_recursive(engine, previous=None):
    """Unusual but right: one round per call, the deferred step passed down."""
    if not engine.scheduler.has_work():
        return
    plan = engine.schedule()
    if plan is None:
        return zos_recursive(engine, engine.flush(previous))
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
    return zos_recursive(engine, current)


def zos_dict_of_steps(engine):
    """Unusual but right: in-flight steps kept in a dict by round."""
    inflight = {}
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            for r in sorted(inflight):
                inline_process(engine, inflight.pop(r))
            continue
        inputs = engine.prepare_inputs(plan)
        if inflight:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        for r in sorted(inflight):
            inline_process(engine, inflight.pop(r))
        inflight[plan.round] = engine.launch_sample(inputs)
        if plan.is_prefill:
            inline_process(engine, inflight.pop(plan.round))


def zos_drops_deferred_at_prefill(engine):
    """The deferred decode step is skipped when a prefill round comes."""
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
        if previous is not None and not plan.is_prefill:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current


def correction_loop_over_requests(meta, accepted, block_size):
    """Right values, tensor operations only, but one Python iteration per request."""
    device = meta["seqlens_q"].device
    owner = torch.arange(len(meta["rows"]), device=device).repeat_interleave(meta["seqlens_q"],
                                                              output_size=len(meta["positions"]))
    for b in range(len(meta["rows"])):
        d = accepted[meta["rows"][b]] * meta["pending"][b]
        meta["seqlens_k"][b] += d
        meta["positions"] += d * (owner == b)  # request b's seqlens_q tokens
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, pos // block_size] * block_size
                               + pos % block_size)


def correction_checks_any_pending(meta, accepted, block_size):
    """Right values, but an `if` on a tensor: a host read."""
    if meta["pending"].any():
        correction(meta, accepted, block_size)


def correction_pending_from_input_ids(meta, accepted, block_size):
    """Right: a pending request's first input is FROM_DEVICE (prepare_inputs writes it so)."""
    starts = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    pending = (meta["input_ids"][starts] == kernels.FROM_DEVICE).long()
    _shifted_by(meta, accepted[meta["rows"]] * pending, block_size)


def correction_gather_form(meta, accepted, block_size):
    """Right: the per-token shift through searchsorted on the query boundaries."""
    delta = accepted.index_select(0, meta["rows"]) * meta["pending"]
    ends = torch.cumsum(meta["seqlens_q"], 0)
    device = meta["seqlens_q"].device
    owner = torch.searchsorted(ends, torch.arange(meta["positions"].numel(), device=device),
                               right=True)
    meta["seqlens_k"].add_(delta)
    meta["positions"].add_(delta.gather(0, owner))
    slots = meta["block_tables"][owner, torch.div(meta["positions"], block_size, rounding_mode="floor")]
    meta["slot_mapping"].copy_(slots * block_size + torch.remainder(meta["positions"], block_size))


def process_swallows_the_race(engine, step):
    """Frees every finished request and hides the race checker's refusal."""
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            try:
                engine.scheduler.free(req)
            except te.RaceError:
                pass


def process_turns_race_checking_off(engine, step):
    engine.device.races.enabled = False
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished:
            engine.scheduler.free(req)


def process_double_free(engine, step):
    """Frees a finished request's blocks through the block manager, then again through the scheduler."""
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.blocks.free(req.blocks, req.index)
            engine.scheduler.free(req)


def process_lowers_inflight_too(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in step.plan.requests:
        req.num_inflight -= 1
    for req in engine.commit_outputs(step, out):
        req.num_inflight += 0
        engine.scheduler.release_if_done(req)


def process_edits_the_plan(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)
    step.plan.requests[:] = [r for r in step.plan.requests if not r.finished]


def process_flushes(engine, step):
    engine.flush(step)


def process_clears_requests(engine, step):
    inline_process(engine, step)
    if all(r.finished for r in step.plan.requests):
        engine.requests.clear()


def process_inline_with_swallowed_commit(engine, step):
    """Commits twice, hiding the engine's refusal of the second commit."""
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    engine.commit_outputs(step, out)
    try:
        engine.commit_outputs(step, out)
    except Exception:
        pass
    for req in step.plan.requests:
        engine.scheduler.release_if_done(req)


def zos_loops_forever(engine):
    """Keeps looping after the work is done, and swallows even BaseException."""
    make_zos()(engine)
    while True:
        try:
            engine.scheduler.has_work()
        except BaseException:
            pass


def process_waits_for_the_race_checker(engine, step):
    """Polls until the race checker stops refusing the read: it never does without a wait."""
    while True:
        try:
            out = engine.read_outputs(step)
            break
        except te.RaceError:
            continue
    for req in engine.commit_outputs(step, out):
        engine.scheduler.release_if_done(req)


def endless_order():
    while True:
        yield ("forward", 1)


WRONG = [
    Answer("02a", "never processes a step", serial_never_processes, "never_processed",
           "launches every round, drops the StepState"),
    Answer("02a", "launch_sample before launch_forward", serial_sample_first, "sample_before_forward",
           "the two launches swapped (the exercise's try-it 1)"),
    Answer("02a", "a step processed twice", serial_processes_twice, "processed_twice",
           "process_outputs(step) called twice"),
    Answer("02a", "the ZOS loop handed in", make_zos(), "not_serial",
           "the overlapped loop given as the serial one"),
    Answer("02a", "the engine's own loop", lambda engine: te.loops.serial_loop(engine),
           "engine_loop", "def serial_loop(engine): te.loops.serial_loop(engine)"),
    Answer("02a", "the engine's loop handed in", te.loops.serial_loop, "engine_loop",
           "serial_loop = te.loops.serial_loop"),
    Answer("02a", "the engine's loop's code in a new function",
           types.FunctionType(te.loops.serial_loop.__code__, {}), "engine_loop",
           "FunctionType(te.loops.serial_loop.__code__, globals())"),
    Answer("02a", "the loop on the engine behind the view", lambda engine: serial(engine._engine),
           "edits_engine", "every stage called on engine._engine"),
    Answer("03a", "the lab's loop", lambda engine: plugins.keep_in_flight(1)(engine),
           "engine_loop", "def zos_loop(engine): plugins.keep_in_flight(1)(engine) (notebook 07)"),
    Answer("03a", "the engine's own loop", lambda engine: te.loops.zos_loop(engine),
           "engine_loop", "def zos_loop(engine): te.loops.zos_loop(engine)"),
    Answer("02a", "ten rounds only", serial_ten_rounds, "loop_returned",
           "for _ in range(10) instead of while has_work (try-it 2)"),
    Answer("02a", "no forward", serial_no_forward, "sample_before_forward", "launch_forward forgotten"),
    Answer("02a", "forward launched twice", serial_forward_twice, "launched_twice", "launch_forward twice per round"),
    Answer("02a", "a plan dropped", serial_schedules_twice, "plan_dropped", "schedule() called twice per round"),
    Answer("02a", "steps processed at the end", serial_processes_at_the_end, "never_processed",
           "all StepStates kept in a list, processed after the loop"),
    Answer("02a", "one round late", serial_one_round_late, "not_serial",
           "each step processed after the next round's launches"),
    Answer("02a", "decode steps never processed", serial_processes_prefill_only, "never_processed",
           "only prefill steps processed"),
    Answer("02a", "stops once all are admitted", serial_until_admitted, "loop_returned",
           "while scheduler.waiting instead of has_work()"),
    Answer("02a", "two rounds at a time", serial_two_rounds_at_a_time, "inputs_replaced",
           "the next round prepared before this one is launched"),
    Answer("02a", "a round sampled twice", serial_samples_twice, "launched_twice",
           "launch_sample called again for a round's inputs, both steps processed"),
    Answer("02b", "busy fraction", idle_busy_fraction, "busy_fraction", "busy / (idle + busy)"),
    Answer("02b", "idle over busy", idle_over_busy, "idle_over_busy", "idle / busy"),
    Answer("02b", "idle in ms", idle_in_ms, "idle_ms", "the idle time, not a fraction"),
    Answer("02b", "whole run as denominator", idle_over_the_whole_run, "wall_denominator",
           "idle / (first to last span of both lanes)"),
    Answer("02b", "counted from time 0", idle_from_time_zero, "counts_startup",
           "1 - busy / the last device span's end"),
    Answer("02b", "the built-in", idle_from_the_built_in, "built_in",
           "returns timeline.device_idle_fraction()"),
    Answer("02b", "the built-in through the class", idle_through_the_class, "built_in",
           "returns te.Timeline.device_idle_fraction(timeline)"),
    Answer("02b", "first gap only", idle_over_first_gap, "wrong_value", "device_gaps()[0] only"),
    Answer("02b", "a formatted string", idle_as_text, "not_a_number", "returns '12.3%'"),
    Answer("02b", "the timeline's own stats", idle_from_the_timelines_stats, "not_from_timeline",
           "returns timeline.meta.stats.device_idle_fraction"),
    Answer("03a", "no flush", make_zos(flush="drop"), "no_flush", "previous dropped when schedule() returns None"),
    Answer("03a", "schedule retried after None", make_zos(retry_none=True), "no_flush",
           "schedule() asked again before the held step is flushed"),
    Answer("03a", "break without flush", make_zos(flush="drop", on_none="break"), "no_flush",
           "break when schedule() returns None"),
    Answer("03a", "process before the forward", make_zos(process_first=True), "process_before_forward",
           "previous processed before launch_forward (try-it 1)"),
    Answer("03a", "never defers", make_zos(defer=False), "not_deferred", "decode steps processed at once"),
    Answer("03a", "the serial loop handed in", serial, "not_deferred", "the serial loop given as the ZOS one"),
    Answer("03a", "forward, sample, then postprocess", make_zos(sample_first=True), "sample_before_process",
           "this round's sample launched before the previous postprocess"),
    Answer("03a", "no correct_on_device", make_zos(correct="never"), "correction",
           "the correction left out (text differs only with drafts)"),
    Answer("03a", "correction after the forward", make_zos(correct="after"), "correction",
           "correct_on_device after launch_forward"),
    Answer("03a", "flush used mid-run, last step dropped", make_zos(flush="always"), "no_flush",
           "flush(previous) under the next forward; nothing when schedule() returns None"),
    Answer("03a", "prefill deferred", make_zos(defer_prefill=True), "prefill_deferred",
           "prefill steps kept as previous (try-it 4)"),
    Answer("03a", "flush result not assigned", make_zos(reset_previous=False), "processed_twice",
           "engine.flush(previous) without previous = ..."),
    Answer("03a", "break after the flush", make_zos(on_none="break"), "loop_returned",
           "flush, then break: waiting prompts never start"),
    Answer("03a", "goes on with a None plan", make_zos(on_none="fall_through"), "none_plan",
           "flush, then prepare_inputs(None)"),
    Answer("03a", "launch_sample before launch_forward", make_zos(launch_sample_first=True),
           "sample_before_forward", "the launches swapped"),
    Answer("03b", "the serial order", [("forward", 1), ("sample", 1), ("postprocess", 1), ("forward", 2),
                                       ("sample", 2), ("postprocess", 2), ("forward", 3), ("sample", 3),
                                       ("postprocess", 3)], "serial_order", "each round processed in itself"),
    Answer("03b", "sample before postprocess", [("forward", 1), ("sample", 1), ("forward", 2), ("sample", 2),
                                                ("postprocess", 1), ("forward", 3), ("sample", 3),
                                                ("postprocess", 2), ("flush", 3)], "sample_before_postprocess",
           "forward, sample, postprocess previous"),
    Answer("03b", "no flush", THREE_ROUNDS[:-1] + [("postprocess", 3)], "no_flush", "the last round postprocessed"),
    Answer("03b", "round 0 included", [("forward", 0), ("sample", 0), ("postprocess", 0)] + THREE_ROUNDS,
           "includes_prefill", "the prefill round listed"),
    Answer("03b", "last round left out", THREE_ROUNDS[:-1], "length", "round 3 never processed"),
    Answer("03b", "flush every round", [("flush", r) if s == "postprocess" else (s, r) for s, r in THREE_ROUNDS],
           "flush_mid_run", "flush instead of postprocess"),
    Answer("04a", "arange on the host", correction_arange_on_the_host, "host_tensor",
           "torch.arange(B) without device=: mixed with the metadata's device tensors"),
    Answer("04a", "the engine's correction called", correction_calls_the_engines, "engine_fix",
           "def correct_seqlens_qk(...): te.kernels.correct_seqlens_qk(...)"),
    Answer("04a", "the engine's correction handed in", te.kernels.correct_seqlens_qk, "engine_fix",
           "checks.check_correction(te.kernels.correct_seqlens_qk)"),
    Answer("04a", "no correction", correction_stale, "stale", "the function does nothing"),
    Answer("04a", "not in place", correction_not_in_place, "stale", "new tensors in a copied dict"),
    Answer("04a", "positions but not slots", correction_positions_only, "slot_mapping", "slot_mapping left stale"),
    Answer("04a", "slot + delta", correction_slot_plus_delta, "slots_shifted", "slots shifted, not recomputed"),
    Answer("04a", "seqlens_q corrected", correction_grows_queries, "seqlens_q", "query lengths stretched"),
    Answer("04a", "accepted[:B]", correction_by_batch_position, "accepted_by_batch",
           "accepted indexed by batch position"),
    Answer("04a", "pending ignored", correction_ignores_pending, "pending_ignored", "no pending factor"),
    Answer("04a", "off by one", correction_off_by_one, "off_by_one", "shift by 1 + accepted"),
    Answer("04a", "first token only", correction_first_token_only, "first_token_only",
           "only each request's first position shifted"),
    Answer("04a", "block size hard-coded", correction_block_size_4, "block_size_hardcoded",
           "block_size 4 written in"),
    Answer("04a", "lengths only", correction_lengths_only, "positions", "only seqlens_k shifted"),
    Answer("04b", "slot_mapping missing", {"seqlens_k", "positions", "input_ids"}, "missing_field",
           "slot_mapping forgotten"),
    Answer("04b", "input_ids missing", {"seqlens_k", "positions", "slot_mapping"}, "missing_field",
           "the FROM_DEVICE ids forgotten"),
    Answer("04b", "seqlens_q included", {"seqlens_k", "positions", "slot_mapping", "input_ids", "seqlens_q"},
           "unchanged_field", "query lengths counted as stale"),
    Answer("04b", "cu_seqlens_q included", {"seqlens_k", "positions", "slot_mapping", "input_ids", "cu_seqlens_q"},
           "unchanged_field", "the packed layout counted as stale"),
    Answer("04b", "block_tables included", {"seqlens_k", "positions", "slot_mapping", "input_ids", "block_tables"},
           "unchanged_field", "block tables counted as stale"),
    Answer("04b", "a typo", {"seqlen_k", "positions", "slot_mapping", "input_ids"}, "unknown_field",
           "a name that is not a field"),
    Answer("05", "the notebook's buggy version", process_buggy, "read_before_wait", "read, wait, free finished"),
    Answer("05", "read before wait", process_reads_first, "read_before_wait", "read_outputs before the wait"),
    Answer("05", "no wait", process_never_waits, "read_before_wait", "never waits"),
    Answer("05", "free without num_inflight", process_frees_early, "free_in_use",
           "every finished request freed (the extra step)"),
    Answer("05", "never frees", process_never_frees, "kept_blocks", "finished requests keep their cache"),
    Answer("05", "synchronize", process_synchronizes, "waits_later_event",
           "device.synchronize() instead of the step's event"),
    Answer("05", "a fresh event", process_waits_on_a_fresh_event, "waits_later_event",
           "waits on device.record_event()"),
    Answer("05", "commit forgotten", process_forgets_commit, "never_committed", "tokens read, never committed"),
    Answer("05", "commit twice", process_commits_twice, "committed_twice", "commit_outputs called twice"),
    Answer("05", "free when nothing in flight", process_frees_when_nothing_in_flight, "freed_unfinished",
           "num_inflight == 0 without finished"),
    Answer("05", "free before commit", process_frees_before_commit, "kept_blocks",
           "release_if_done before commit_outputs"),
    Answer("05", "free finished before commit", process_frees_finished_before_commit, "kept_blocks",
           "finished requests freed before commit"),
    Answer("05", "commits the output slot", process_commits_the_slot, "bad_outputs",
           "commit_outputs given engine.device.host(f\"out{step.slot}\")"),
    Answer("05", "tokens without the accepted counts", process_commits_the_tokens_only, "short_commit",
           "read_outputs(step) cut to one token per request"),
    Answer("03a", "flush right after each sample", zos_flush_each_step, "not_deferred",
           "each decode step flushed in its own round"),
    Answer("03a", "processed right after schedule", make_zos_process_after_schedule(), "not_deferred",
           "previous processed after schedule(), before prepare"),
    Answer("03a", "flushed right after schedule", make_zos_process_after_schedule("flush"), "not_deferred",
           "previous = engine.flush(previous) after every schedule()"),
    Answer("03a", "synchronize after the forward", make_zos_waits_beyond(), "waits_later_event",
           "engine.device.synchronize() after launch_forward"),
    Answer("03a", "wait on a fresh event", make_zos_waits_beyond("event"), "waits_later_event",
           "engine.device.wait(engine.device.record_event()) after launch_forward"),
    Answer("05", "waits on the previous step's event", make_process_outputs_waits_previous(), "waits_other_event",
           "device.wait on the step before's sample_done"),
    Answer("05", "calls engine.process_outputs", process_outputs_calls_the_engine, "calls_itself",
           "engine.process_outputs(step) inside the plug-in"),
    Answer("03a", "sets engine.process_outputs", zos_replaces_process_outputs, "edits_engine",
           "engine.process_outputs = engine.flush in the loop"),
    Answer("02a", "sets engine.schedule", serial_replaces_schedule, "edits_engine",
           "engine.schedule replaced in the loop"),
    Answer("05", "sets engine.process_outputs", process_outputs_replaces_the_method, "edits_engine",
           "engine.process_outputs replaced inside the plug-in"),
    Answer("03b", "one string", "forward 1, sample 1, forward 2", "shape",
           "the order typed as one string"),
    Answer("03b", "a number", 5, "shape",
           "not a list at all"),
    Answer("03b", "stage names without rounds", ["forward", "sample"], "shape",
           "stages without their round numbers"),
    Answer("04b", "one comma-separated string", "seqlens_k, positions, slot_mapping, input_ids", "shape",
           "the fields typed as one string"),
    Answer("04b", "a number", 5, "shape",
           "not a set at all"),
    Answer("04b", "pending included", {"seqlens_k", "positions", "slot_mapping", "input_ids", "pending"}, "input_field",
           "the worked case's pending flag listed as stale"),
    Answer("02a", "prepares twice", serial_prepares_twice, "prepared_twice",
           "prepare_inputs called twice per round"),
    Answer("02b", "a percentage", idle_percent, "percentage",
           "100 x the fraction"),
    Answer("02b", "not a number (nan)", idle_nan, "not_a_number",
           "returns nan"),
    Answer("02a", "swallows every error", serial_swallows_errors, "spins",
           "try/except Exception: pass around each round"),
    Answer("03a", "swallows every error", make_zos_swallows_errors(), "spins",
           "the loop retried inside try/except Exception: pass"),
    Answer("04a", "a Python loop with int()", correction_with_python_loop, "host_read",
           "right values, read on the host with int() per request"),
    Answer("04a", "a loop over requests", correction_loop_over_requests, "python_loop",
           "right values, tensor indexing, one iteration per request"),
    Answer("04a", "if on pending.any()", correction_checks_any_pending, "host_read",
           "an if on a tensor reads it on the host"),
    Answer("02a", "processing inline, one round late", serial_inline_one_round_late, "not_serial",
           "wait/read/commit written out, each round processed after the next launch"),
    Answer("02a", "synchronize instead of processing", serial_synchronizes_instead, "never_processed",
           "engine.device.synchronize() in place of process_outputs"),
    Answer("03a", "inline processing in serial order", make_zos_inline(serial_order=True), "not_deferred",
           "wait/read/commit written out right after each sample"),
    Answer("03a", "waits for previous before the forward", make_zos_inline(wait="before_forward"),
           "waits_before_forward", "device.wait(previous.sample_done) before launch_forward"),
    Answer("03a", "waits right after the sample", make_zos_inline(wait="after_sample"), "waits_before_forward",
           "device.wait(current.sample_done) right after launch_sample"),
    Answer("03a", "drops the deferred step at a prefill", zos_drops_deferred_at_prefill, "dropped_at_prefill",
           "previous skipped in a prefill round"),
    Answer("03a", "loops forever after the work", zos_loops_forever, "time_limit",
           "while True with except BaseException after the loop"),
    Answer("03a", "prefill through flush", zos_flush_prefill, "flushed_with_a_plan",
           "engine.flush(step) for each prefill step, schedule() having returned a plan"),
    Answer("03b", "flush before the last sample", THREE_ROUNDS[:7] + [("flush", 3), ("sample", 3)],
           "flush_before_sample", "the last round flushed before its sample is launched"),
    Answer("03b", "two forwards before a sample", [("forward", 1), ("forward", 2)] + THREE_ROUNDS[1:],
           "forward_before_sample", "round 2's forward queued before round 1's sample"),
    Answer("03b", "an endless iterator", endless_order(), "shape",
           "a generator that never ends"),
    Answer("05", "swallows the race checker's refusal", process_swallows_the_race, "free_in_use",
           "free in try/except RaceError: pass"),
    Answer("05", "race checking turned off", process_turns_race_checking_off, "free_in_use",
           "engine.device.races.enabled = False, then frees early"),
    Answer("05", "double free", process_double_free, "double_free",
           "blocks.free then scheduler.free of the same request"),
    Answer("05", "lowers num_inflight itself", process_lowers_inflight_too, "inflight_changed",
           "num_inflight -= 1 beside commit_outputs"),
    Answer("05", "edits step.plan.requests", process_edits_the_plan, "plan_changed",
           "finished requests removed from the plan"),
    Answer("05", "calls engine.flush", process_flushes, "calls_itself",
           "engine.flush(step) inside the plug-in"),
    Answer("05", "commits twice, swallowing the refusal", process_inline_with_swallowed_commit, "committed_twice",
           "a second commit_outputs inside try/except"),
    Answer("05", "polls until the race checker gives up", process_waits_for_the_race_checker, "time_limit",
           "read_outputs retried in a loop instead of waiting"),
]

RIGHT = [
    Answer("02a", "the solution", serial),
    Answer("02a", "while True with break", serial_while_true),
    Answer("02a", "break when schedule() returns None", serial_break_on_none),
    Answer("02a", "stages called through the class", serial_through_the_class),
    Answer("02b", "the solution", idle),
    Answer("02b", "end - start denominator", idle_end_minus_start),
    Answer("02b", "summed span durations", idle_summed_durations),
    Answer("02b", "1 - busy share", idle_one_minus_busy),
    Answer("02b", "a NumPy float32", lambda timeline: np.float32(idle(timeline))),
    Answer("02b", "a 0-d tensor", lambda timeline: torch.tensor(idle(timeline))),
    Answer("02b", "the built-in tried, computed where refused", idle_that_falls_back),
    Answer("03a", "the solution", make_zos()),
    Answer("03a", "while True with break", zos_while_true),
    Answer("03a", "correct_on_device every round", make_zos(correct="always")),
    Answer("03a", "a harmless flush after the loop", zos_flush_after_the_loop_too),
    Answer("03b", "the solution", THREE_ROUNDS),
    Answer("03b", "as lists", [list(x) for x in THREE_ROUNDS]),
    Answer("04a", "the solution", correction),
    Answer("04b", "the solution", {"seqlens_k", "positions", "slot_mapping", "input_ids"}),
    Answer("04b", "with cu_seqlens_k", {"seqlens_k", "positions", "slot_mapping", "input_ids", "cu_seqlens_k"}),
    Answer("04b", "as a list", ["input_ids", "positions", "slot_mapping", "seqlens_k"]),
    Answer("05", "the solution", process),
    Answer("05", "release_if_done", process_release_if_done),
    Answer("05", "scanning running", process_scanning_running),
    Answer("05", "waits twice", process_waits_twice),
    Answer("02a", "processing written out inline", serial_inline),
    Answer("03a", "processing written out inline", make_zos_inline()),
    Answer("03a", "a generator of rounds", zos_generator_of_stages),
    Answer("03a", "recursion, one round per call", zos_recursive),
    Answer("03a", "a dict of in-flight steps", zos_dict_of_steps),
    Answer("04a", "pending from input_ids == FROM_DEVICE", correction_pending_from_input_ids),
    Answer("04a", "searchsorted and gather", correction_gather_form),
    Answer("05", "written out with release_if_done", inline_process),
    # flush is process_outputs under the name the timeline gives the step processed when nothing is
    # left to launch: processing that last step with process_outputs is no mistake (flush where a
    # plan was found is: "prefill through flush" above)
    Answer("03a", "process_outputs instead of flush", make_zos(flush="process")),
    # harmless since the run keeps its own tuple of requests: one completion per prompt whatever a plug-in does
    Answer("05", "clears engine.requests", process_clears_requests),
]
