"""Blind practice: wrong answers (and unusual right ones) to every check of the lesson notebooks 00-06.

Written blind: from the notebooks, the engine files they send a learner to (toy_engine/*.py) and the
checks' verdicts only, never from the checkers' code.  Each ``Answer`` is what a learner's cell would
pass to the check (``answer``), whether it is wrong, and why.  ``call`` is the notebook's check call with
``answer`` in place of the learner's variable; ``args_from`` is the notebook code that builds the check's
other arguments (an engine, a timeline, stats...).  An answer the learner computes in the cell from
those objects is a ``Computed``: ``fn(ns)`` gets the namespace ``args_from`` built.

``observed`` is the verdict seen in the blind round on a 2-CPU machine: "PASSED", "NOT YET", or
"varies" where it depends on the run's timings.  Wrong answers with ``observed == "PASSED"`` are the
false passes this corpus was written to find; right ones with "NOT YET" are wrong failures (most are
form rejections of a reasonable spelling: the verdict says what form it wants).

    from tests.blind_practice import BLIND_PRACTICE, run_all
    for answer, verdict in run_all(): ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np
import torch


@dataclass
class Computed:
    """An answer the learner's cell computes from the notebook's objects: ``fn(ns)``; ``code`` is the cell."""

    fn: Callable
    code: str

    def __call__(self, ns):
        return self.fn(ns)


@dataclass
class Answer:
    notebook: str
    check: str
    name: str
    answer: object
    wrong: bool
    why: str
    args_from: str = ""
    call: str = ""
    observed: str = ""


# --------------------------------------------------------------------------- how the notebooks build the arguments

PRELUDE = "import toy_engine as te\nfrom overlap_course import checks\n"

ARGS_00_PLAIN = PRELUDE
ARGS_00_DEVICE = PRELUDE + """\
engine = te.Engine(te.EngineConfig(device="auto", max_batch_size=1, num_kv_blocks=8))
device = engine.device
"""
ARGS_01 = PRELUDE
ARGS_02_RUN = PRELUDE + """\
from overlap_course.measure.bench import default_workload
engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
prompts = default_workload(6)
outs = engine.generate(prompts, max_new_tokens=32)
"""
ARGS_02_PLAIN = PRELUDE
PROMPTS_LINE = 'PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]\n'
ARGS_03A_SMALL = PRELUDE + PROMPTS_LINE + """\
small = te.Engine(te.EngineConfig(mode="zos", max_batch_size=2))
small.generate(PROMPTS[:3], max_new_tokens=4)
"""
ARGS_03A_SWAP = PRELUDE + PROMPTS_LINE + """\
def sample_then_postprocess(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        current = engine.launch_sample(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current

three = PROMPTS[:3]
runs = {}
for constraint in (None, "title_case"):
    for mode in ("serial", "zos"):
        with te.Engine(te.EngineConfig(mode=mode, max_batch_size=4, constraint=constraint)) as engine:
            runs[mode, constraint] = engine.generate(three, max_new_tokens=40)
            if mode == "zos":
                runs["swapped", constraint] = engine.generate(three, max_new_tokens=40, loop=sample_then_postprocess)

def ids(name, constraint):
    return [c.token_ids for c in runs[name, constraint]]

plain_same = ids("swapped", None) == ids("serial", None)
constraint_same = ids("swapped", "title_case") == ids("serial", "title_case")
"""
ARGS_03A_LOST = PRELUDE + """\
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=8))
two = ["Once upon a time", "One day"]
reference = zos.generate(two, max_new_tokens=20)
zos.flush = lambda previous: None  # the deliberate bug: drop the deferred step
try:
    zos.generate(two, max_new_tokens=20)
except te.EngineStalled as err:
    pass
finally:
    del zos.flush
dropped = zos.completions
"""
ARGS_03B_META = PRELUDE + PROMPTS_LINE + """\
from toy_engine import kernels
serial = te.Engine(te.EngineConfig(mode="serial", max_batch_size=8))
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=8))

def capture_metadata(engine, rounds, prompts, max_new_tokens):
    captured, real_prepare = {}, engine.prepare_inputs

    def spy(plan):
        inputs = real_prepare(plan)
        if plan.round in rounds:
            flat = engine.device.host(f"meta{inputs.slot}", "r")
            views = engine.layout.views(flat, inputs.num_tokens, len(plan.requests), inputs.num_blocks)
            captured[plan.round] = {name: view.tolist() for name, view in views.items()}
        return inputs

    engine.prepare_inputs = spy
    try:
        engine.generate(prompts, max_new_tokens=max_new_tokens)
    finally:
        del engine.prepare_inputs
    return captured

zos_meta = capture_metadata(zos, {1, 2}, PROMPTS[:3], 8)
serial_meta = capture_metadata(serial, {1, 2}, PROMPTS[:3], 8)
"""
ARGS_03B_IDEAL = PRELUDE + """\
from overlap_course.measure.bench import default_workload
WORKLOAD = default_workload(8)
serial = te.Engine(te.EngineConfig(mode="serial", max_batch_size=8))
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=8))
for engine in (serial, zos):
    engine.generate(WORKLOAD, max_new_tokens=48)  # warm-up
serial.generate(WORKLOAD, max_new_tokens=48)
serial_tl, serial_stats = serial.timeline, serial.stats
zos.generate(WORKLOAD, max_new_tokens=48)
zos_tl, zos_stats = zos.timeline, zos.stats
"""
ARGS_04 = PRELUDE
ARGS_05_SEEN = PRELUDE + PROMPTS_LINE + """\
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
serial = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))

def watch_launches(engine, prompt, max_new_tokens=6):
    rows = []
    launch = engine.launch_forward

    def spy(inputs):
        launch(inputs)
        req = engine.requests[0]
        rows.append((inputs.plan.round, len(req.output_ids), req.num_inflight, req.text))

    engine.launch_forward = spy
    try:
        engine.generate([prompt], max_new_tokens=max_new_tokens)
    finally:
        del engine.launch_forward
    return rows

seen = {"serial": watch_launches(serial, PROMPTS[0]), "zos": watch_launches(zos, PROMPTS[0])}
"""
ARGS_05_DISCARDED = PRELUDE + PROMPTS_LINE + """\
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
serial = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
traced = {name: engine.generate(PROMPTS, max_new_tokens=24, stop=[" the"])  # (the notebook wraps this in spies)
          for name, engine in (("serial", serial), ("zos", zos))}
"""
ARGS_05_RACE = PRELUDE + PROMPTS_LINE + """\
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
serial = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
te.engine.NUM_SLOTS = 1  # every round now shares meta0 / temps0 / out0
single_buffer_error = None
try:
    outs = serial.generate(PROMPTS, max_new_tokens=8)
    zos.generate(PROMPTS, max_new_tokens=8)
except te.RaceError as err:
    single_buffer_error = err
finally:
    te.engine.NUM_SLOTS = 2
"""
ARGS_05_ABORT = PRELUDE + PROMPTS_LINE + """\
zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))

def abort_prompt_1(engine, round):
    if round == 5:
        engine.abort(engine.requests[1].id)

reference = zos.generate(PROMPTS, max_new_tokens=24)
aborted = zos.generate(PROMPTS, max_new_tokens=24, on_round=abort_prompt_1)
"""
ARGS_06_REAL = PRELUDE + """\
from overlap_course.traces import kineto
REAL = "a100_event_sync"
"""
ARGS_06_MINE = PRELUDE + """\
import tempfile
from pathlib import Path
from overlap_course.traces import kineto
from overlap_course.measure.bench import default_workload
WORKLOAD = default_workload(8)
out = Path(tempfile.mkdtemp(prefix="toy_engine_traces"))
runs, exported = {}, {}
for mode in ("serial", "zos"):
    with te.Engine(te.EngineConfig(mode=mode, max_batch_size=8, host_overhead_ms=2.0)) as engine:
        engine.generate(WORKLOAD, max_new_tokens=32)  # warm-up
        engine.generate(WORKLOAD, max_new_tokens=32)
        runs[mode] = engine.timeline
    exported[mode] = out / f"06_my_{mode}.json"
    kineto.export(runs[mode], exported[mode])
"""

# --------------------------------------------------------------------------- helpers the answers use


def _device(tl):
    return tl.lane("device")


def _first_start(tl, rnd):
    return min(s.start_ms for s in _device(tl) if s.round == rnd)


def _last_end(tl, rnd):
    return max(s.end_ms for s in _device(tl) if s.round == rnd)


def round_gap(tl, rnd):
    """The right gap: start of round rnd's first device span minus end of round rnd-1's last."""
    return _first_start(tl, rnd) - _last_end(tl, rnd - 1)


def gap_from_device_gaps(tl, rnd):
    """Right, another way: the device_gaps() interval that starts where round rnd-1's work ends."""
    end = _last_end(tl, rnd - 1)
    start, stop = min(tl.device_gaps(), key=lambda g: abs(g[0] - end))
    return stop - start


def gap_to_forward(tl, rnd):
    """Wrong: from round rnd-1's sample to round rnd's *forward*, skipping its upload."""
    return (min(s.start_ms for s in _device(tl) if s.round == rnd and s.stage == "forward")
            - max(s.end_ms for s in _device(tl) if s.round == rnd - 1 and s.stage == "sample"))


def gap_from_host_wait(tl, rnd):
    """Wrong: from the end of the host's wait for round rnd-1 (not the device's end of work)."""
    wait_end = max(s.end_ms for s in tl.lane("host") if s.round == rnd - 1 and s.stage == "wait")
    return _first_start(tl, rnd) - wait_end


def median_boundary_gap(tl):
    """Wrong: the median over every round boundary, not the one asked for."""
    rounds = sorted({s.round for s in _device(tl)})
    return float(np.median([round_gap(tl, r) for r in rounds[1:]]))


def stage_by(tl, field):
    """Host stage with the largest total of ``field`` (cpu_ms or duration_ms), waiting excluded; a span
    without CPU time (``schedule``) counts its wall time, as notebook 02 says."""
    totals: dict[str, float] = {}
    for s in tl.lane("host"):
        if s.stage == "wait":
            continue
        value = getattr(s, field, None)
        if value is None:
            value = s.duration_ms
        totals[str(s.stage)] = totals.get(str(s.stage), 0.0) + value
    return max(totals, key=totals.get)


def host_device_ms(stats):
    return stats.mean_host_ms_per_round, stats.mean_device_ms_per_round


def race_pair_from_error(err):
    """Right but read off the printed RaceError: ("meta0", 1)."""
    m = re.search(r"buffer '(\w+)'.*?round (\d+)", str(err))
    return (m.group(1), int(m.group(2)))


def uncommitted_from_rows(rows, rnd):
    """Right, computed from the spy's row: the last num_inflight rounds up to rnd."""
    _, _, in_flight, _ = next(row for row in rows if row[0] == rnd)
    return {rnd - i for i in range(in_flight)}


# --------------------------------------------------------------------------- serial loops for check_serial_loop

def textbook_serial_loop(engine):
    """(not an answer: the plain loop, for reference)"""
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)


def loop_delegates(engine):
    import toy_engine as te
    te.loops.serial_loop(engine)


def loop_zos(engine):
    import toy_engine as te
    te.loops.zos_loop(engine)


def loop_forgetful(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)


def loop_sample_first(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        step = engine.launch_sample(inputs)
        engine.launch_forward(inputs)
        engine.process_outputs(step)


def loop_one_round(engine):
    if engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def loop_schedule_ahead(engine):
    plan = engine.schedule()
    while plan is not None:
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        nxt = engine.schedule()  # planned before this round's tokens are committed
        engine.process_outputs(step)
        if nxt is None and engine.scheduler.has_work():
            nxt = engine.schedule()
        plan = nxt


def loop_commit_without_free(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        engine.commit_outputs(step, engine.read_outputs(step))


def loop_read_without_wait(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)


def loop_waits_on_forward(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.device.wait(engine.device.record_event())  # "make sure the logits are there"
        engine.process_outputs(engine.launch_sample(inputs))


def loop_fixed_48_rounds(engine):
    for _ in range(48):  # the number of rounds the checker's run took
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def loop_until_24_tokens(engine):
    while not all(len(r.output_ids) >= 24 for r in engine.requests):
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def loop_flush_as_process(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.flush(engine.launch_sample(inputs))


def loop_manual_processing(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)


def loop_synchronize(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.synchronize()
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)


def loop_recursive(engine):
    if not engine.scheduler.has_work():
        return
    plan = engine.schedule()
    inputs = engine.prepare_inputs(plan)
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))
    loop_recursive(engine)


def loop_break_on_none(engine):
    while True:
        plan = engine.schedule()
        if plan is None:
            break
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


# --------------------------------------------------------------------------- the answers

L, R, W, D = "launch", "record", "wait", "read"
BLIND_PRACTICE: list[Answer] = []


def _add(notebook, check, args_from, call, rows):
    for name, answer, wrong, why, observed in rows:
        BLIND_PRACTICE.append(Answer(notebook, check, name, answer, wrong, why, args_from, call, observed))


P, N, V = "PASSED", "NOT YET", "varies"

# ---- 00 · check_done_after_wait
_add("00_start_here", "check_done_after_wait", ARGS_00_PLAIN, "checks.check_done_after_wait(answer, waited=1)", [
    ("only_the_waited_kernel", {1}, True, "an event covers everything queued before it, not only the last kernel", N),
    ("all_launched", {0, 1, 2}, True, "kernel 2 was launched after event 1: nothing is known about it", N),
    ("off_by_one_before", {0}, True, "thinks event 1 marks the end of kernel 0 (events numbered from the gaps)", N),
    ("nothing_is_certain", set(), True, "launches are asynchronous, so 'nothing' - but the wait is exactly what makes 0 and 1 certain", N),
    ("count_not_set", 2, True, "answers how many kernels are done (2) instead of which; the verdict then talks about kernel 2", N),
    ("range_of_waited", range(2), False, "range(waited + 1): the right set, as a range", P),
    ("list_reversed", [1, 0], False, "a list in any order", P),
    ("numpy_ints", {np.int64(0), np.int64(1)}, False, "numpy integers from an array computation", P),
])

# ---- 00 · check_race and check_race_fixed
_add("00_start_here", "check_race", ARGS_00_DEVICE, "checks.check_race(answer, device)", [
    ("safe_order", [L, R, W, D], True, "the textbook safe order: no race at all", N),
    ("read_before_launch", [D, L, R, W], True, "reads before the kernel exists: stale, but nothing is writing out0 then", N),
    ("read_before_launch_at_end", [R, W, D, L], True, "the read comes before the launch, so it cannot race with it", N),
    ("no_read", [L, R, W], True, "drops the read: no host access, no race", N),
    ("one_string", "launch read record wait", True, "a string, not a list of steps", N),
    ("stale_event", [R, L, W, D], False, "the notebook's hint: waiting on an event recorded before the launch still races", P),
    ("read_after_record_before_wait", [L, R, D, W], False, "recording is not waiting: the read still races", P),
    ("capitalised_tuple", ("Launch", "Read", "Record", "Wait"), False, "a tuple, capitalised", P),
    ("two_steps", [L, D], False, "racy with only two of the four words (the task says all four)", P),
])
_add("00_start_here", "check_race_fixed", ARGS_00_DEVICE, "checks.check_race_fixed(answer, device)", [
    ("stale_event", [R, L, W, D], True, "waits on an event recorded before the launch: says nothing about the kernel", N),
    ("read_before_wait", [L, R, D, W], True, "recorded but not waited: the read races", N),
    ("read_before_launch", [D, L, R, W], True, "no race, but reads the old out0, not the kernel's value", N),
    ("wait_before_record", [L, W, R, D], True, "waits before any event is recorded after the launch", N),
    ("no_read", [L, R, W], True, "never reads the result", N),
    ("relaunch_then_read", [L, R, W, D, L, D], True, "a second launch and an unguarded read", N),
    ("extra_record_before_launch", [R, L, R, W, D], False, "an extra event before the launch; the wait is on the last one, after it", P),
    ("double_wait", [L, R, W, W, D], False, "waits twice on the same event: harmless", P),
    ("tuple", (L, R, W, D), False, "a tuple", P),
])

# ---- 00 · check_serial_loop (the exercise 02 checker, shown in 00)
_SERIAL = [
    ("zos_loop", loop_zos, True, "the overlapped loop of 03a: processes round N after round N+1 is launched", N),
    ("forgetful", loop_forgetful, True, "launches every round, never waits for or processes a step", N),
    ("sample_before_forward", loop_sample_first, True, "launches the sample before the forward it samples from", N),
    ("one_round_only", loop_one_round, True, "`if` instead of `while`: returns after the first round", N),
    ("schedule_ahead", loop_schedule_ahead, True, "schedules round N+1 before committing round N (stale plans)", N),
    ("commit_without_free", loop_commit_without_free, True, "processes by hand but never frees finished requests", N),
    ("read_without_wait", loop_read_without_wait, True, "reads the output slot without waiting on sample_done", N),
    ("waits_on_forward", loop_waits_on_forward, True, "an extra wait after every forward: right tokens, needless idle", N),
    ("fixed_48_rounds", loop_fixed_48_rounds, True,
     "hard-codes the checker's 48 rounds instead of `while engine.scheduler.has_work()`: any other workload "
     "(EOS, stop strings, other prompts) crashes or stops early. FALSE PASS: the checker runs one fixed workload", P),
    ("until_24_tokens", loop_until_24_tokens, True,
     "loops until every request holds 24 tokens (the checker's max_new_tokens): a request that ends by EOS or a stop "
     "string never reaches 24, and schedule() then returns None into prepare_inputs. FALSE PASS: the checker's "
     "prompts all end by length", P),
    ("flush_as_process", loop_flush_as_process, True,
     "calls engine.flush(step) instead of process_outputs(step): same tokens, but every round's processing is "
     "recorded as a `flush` span, so notebook 02's per-stage host times lose `postprocess`. FALSE PASS (arguable)", P),
    ("delegates", loop_delegates, False, "calls te.loops.serial_loop(engine): right, if not much of an exercise", P),
    ("manual_processing", loop_manual_processing, False, "process_outputs written out: wait, read, commit, release_if_done", P),
    ("synchronize_instead_of_event", loop_synchronize, False, "device.synchronize() instead of the step's event (same here)", P),
    ("recursive", loop_recursive, False, "one round per call, recursing (48 deep here)", P),
    ("break_on_none", loop_break_on_none, False, "`while True` with a break when schedule() returns None", P),
]
_add("00_start_here", "check_serial_loop", ARGS_00_PLAIN, "checks.check_serial_loop(answer)", _SERIAL)

# ---- 01 · check_slot
_add("01_tiny_gpt", "check_slot", ARGS_01, "checks.check_slot(answer, table=[5, 2, 9], pos=9, block_size=4)", [
    ("block_start", 36, True, "forgot the offset pos % block_size", N),
    ("block_number", 9, True, "the block's number, not a slot", N),
    ("block_plus_offset", 10, True, "added the offset to the block number without multiplying", N),
    ("first_block", 5 * 4 + 9, True, "treats the cache as contiguous from the first block: 5 * 4 + 9", N),
    ("offset_plus_one", 38, True, "off by one in the offset (counts positions from 1)", N),
    ("pos_times_block_size", 9 * 4 + 9 % 4, True,
     "slot = pos * block_size + pos % block_size, never looking at the table. FALSE PASS: in this example the "
     "block holding position 9 happens to be block 9, so the wrong formula gives 37 too", P),
    ("last_block_of_table", [5, 2, 9][-1] * 4 + 9 % 4, True,
     "'a decoded token goes into the request's last block': wrong once a request owns more blocks than it has "
     "filled (the engine reserves blocks for max_new_tokens up front). FALSE PASS: here the last block is the one", P),
    ("numpy_int", np.int64(37), False, "37 from numpy arithmetic", P),
    ("tensor", torch.tensor(37), False, "37 as a 0-d tensor (the notebook's slot_of on a tensor table)", P),
    ("float", 37.0, False, "the right slot written as a float; rejected: 'a slot is one whole number, not 37.0'", N),
])

# ---- 01 · check_decode_lengths (answer is the pair (seqlens_q, seqlens_k))
_add("01_tiny_gpt", "check_decode_lengths", ARGS_01,
     "checks.check_decode_lengths(answer[0], answer[1], prompt_lengths=[9, 7, 3])", [
    ("k_without_new_token", ([1, 1, 1], [9, 7, 3]), True, "key length = cached past only, forgetting the new token", N),
    ("q_is_prefill", ([9, 7, 3], [10, 8, 4]), True, "query lengths of the prefill, not of a decode round", N),
    ("swapped", ([10, 8, 4], [1, 1, 1]), True, "q and k swapped", N),
    ("k_two_ahead", ([1, 1, 1], [11, 9, 5]), True, "counts the prefill's token and the decode token separately on top", N),
    ("cumulative_k", ([1, 1, 1], [10, 18, 22]), True, "cumulative key lengths (cu_seqlens without the 0)", N),
    ("scalar_q", (1, [10, 8, 4]), True, "one number for all requests", N),
    ("tensors", (torch.tensor([1, 1, 1]), torch.tensor([10, 8, 4])), False, "tensors, as PackedBatch holds them", P),
    ("computed_tuples", (tuple([1] * 3), tuple(p + 1 for p in [9, 7, 3])), False, "tuples, computed from the prompt lengths", P),
])

# ---- 02 · check_largest_host_stage
_add("02_serial_engine", "check_largest_host_stage", ARGS_02_RUN,
     "checks.check_largest_host_stage(answer, engine.timeline)", [
    ("wait", "wait", True, "the longest host span is the wait, but waiting is not work", N),
    ("postprocess", "postprocess", True, "guesses the token processing", N),
    ("method_name", "prepare_inputs", True, "the method's name, not the stage's", N),
    ("device_stage", "forward", True, "a device stage", N),
    ("launch_forward_wall", "launch_forward", True, "by wall time on a busy machine launch_forward is longest (waiting for a core)", N),
    ("argmax_wall_time", Computed(lambda ns: stage_by(ns["engine"].timeline, "duration_ms"),
                                  "largest = max over host stages of summed span.duration_ms (wait excluded)"), True,
     "ranks by wall time, not CPU time: 'prepare' on a quiet machine, 'launch_forward' on a busy one. FALSE PASS "
     "whenever the machine is quiet (the check cannot see the method)", V),
    ("argmax_cpu_ms", Computed(lambda ns: stage_by(ns["engine"].timeline, "cpu_ms"),
                               "largest = max over host stages of summed span.cpu_ms (wait excluded)"), False,
     "computed from the spans' cpu_ms, as the question defines work", P),
    ("capitalised", "Prepare", False, "the right stage, capitalised; rejected as 'not a host stage' (check_race accepts 'Launch')", N),
])

# ---- 02 · check_round_gap
_add("02_serial_engine", "check_round_gap", ARGS_02_RUN, "checks.check_round_gap(answer, engine.timeline, round=10)", [
    ("gap_after_round_10", Computed(lambda ns: round_gap(ns["engine"].timeline, 11), "gap between rounds 10 and 11"),
     True, "the gap after round 10", N),
    ("sign_flipped", Computed(lambda ns: -round_gap(ns["engine"].timeline, 10), "end of 9 minus start of 10"),
     True, "subtracted the wrong way", N),
    ("to_forward", Computed(lambda ns: gap_to_forward(ns["engine"].timeline, 10), "sample end to next forward start"),
     True, "skips round 10's upload, which is device work", N),
    ("from_host_wait", Computed(lambda ns: gap_from_host_wait(ns["engine"].timeline, 10), "host wait end to upload start"),
     True, "starts the gap on the host lane", N),
    ("median_of_all", Computed(lambda ns: median_boundary_gap(ns["engine"].timeline), "median over all boundaries"),
     True, "the median boundary gap, not the one asked for", N),
    ("seconds", Computed(lambda ns: round_gap(ns["engine"].timeline, 10) / 1000, "converted to seconds"),
     True, "the timeline is already in ms", N),
    ("truncated", Computed(lambda ns: int(round_gap(ns["engine"].timeline, 10)), "int(gap)"),
     True, "int() truncates the gap; on a quiet machine (gap < 1 ms) that gives 0 and the verdict says "
     "'0.000 ms: that is in seconds', a wrong diagnosis; on a busy one it gets the generic message", N),
    ("device_gaps_index", Computed(lambda ns: (lambda g: g[1] - g[0])(ns["engine"].timeline.device_gaps()[9]),
                                   "timeline.device_gaps()[9]"),
     True, "indexes device_gaps() by round, but it also lists the gaps inside rounds", N),
    ("stored_value", 0.576, True, "a number copied from an earlier run; fails unless this run happens to match", V),
    ("via_device_gaps", Computed(lambda ns: gap_from_device_gaps(ns["engine"].timeline, 10),
                                 "the device_gaps() interval starting at round 9's last end"), False,
     "picks the right interval out of device_gaps()", P),
    ("hover_values", Computed(lambda ns: round(_first_start(ns["engine"].timeline, 10), 3)
                              - round(_last_end(ns["engine"].timeline, 9), 3), "times read off the hover, 3 decimals"),
     False, "subtracts the two times as the figure's hover shows them (3 decimals)", P),
])

# ---- 02 · check_overhead_gap
_add("02_serial_engine", "check_overhead_gap", ARGS_02_PLAIN, "checks.check_overhead_gap(answer, overhead_ms=5.0)", [
    ("hidden", 0, True, "thinks the device hides host work (that is ZOS, not serial)", N),
    ("twice", 10, True, "counts the overhead twice (schedule and prepare)", N),
    ("half", 2.5, True, "assumes half of it overlaps the device", N),
    ("seconds", 0.005, True, "writes seconds", N),
    ("string", "5 ms", True, "a string", N),
    ("new_total_gap", 5.5, True,
     "answers the new gap (5 ms + the ~0.5 ms gap there already was) instead of its growth. FALSE PASS: accepted "
     "within the check's +-0.5 ms tolerance", P),
    ("int", 5, False, "5 as an int", P),
    ("fraction", Fraction(5), False, "a Fraction", P),
    ("numpy", np.float64(5.0), False, "numpy float", P),
])

# ---- 03a · check_processed_under
_add("03a_zos_order", "check_processed_under", ARGS_03A_SMALL,
     "checks.check_processed_under(answer, small.timeline, round=2)", [
    ("the_prefill", 0, True, "thinks the prefill is deferred too", N),
    ("this_round", 2, True, "the serial habit: process the round in its own pass", N),
    ("next_round", 3, True, "confuses 'processed under' with 'launched next'", N),
    ("string", "1", True, "the round as a string", N),
    ("both_earlier", [0, 1], True, "every earlier round", N),
    ("process_before_forward", 1, True,
     "the learner's model: 'prepare round 2, process round 1, then launch round 2's forward' (the order reversed). "
     "Same number, so FALSE PASS: the question asks which round, not where in the pass", P),
    ("owner_name", "StepState(round=1)", False, "the owner's name as the log prints it", P),
    ("numpy", np.int64(1), False, "a numpy int", P),
])

# ---- 03a · check_swapped_order
_add("03a_zos_order", "check_swapped_order", ARGS_03A_SWAP,
     "checks.check_swapped_order(answer, plain_same, constraint_same)", [
    ("inverted", (False, True), True, "both halves reversed", N),
    ("order_never_matters", (True, True), True, "thinks only the device decides tokens", N),
    ("order_always_matters", (False, False), True, "thinks any reordering changes tokens", N),
    ("yes_no", ("yes", "no"), True, "words, not booleans", N),
    ("one_bool", True, True, "a single boolean for the pair", N),
    ("list", [True, False], False, "a list", P),
    ("numpy_bools", (np.True_, np.False_), False, "numpy booleans (e.g. from np.array_equal)", P),
    ("copied_result", Computed(lambda ns: (ns["plain_same"], ns["constraint_same"]), "(plain_same, constraint_same)"),
     False, "copies the cell's own computed result: right, and no prediction at all (the cell prints it before checking)", P),
    ("ints", (1, 0), False, "1/0 for yes/no; rejected: 'write a pair of True/False values'", N),
])

# ---- 03a · check_tokens_lost
_add("03a_zos_order", "check_tokens_lost", ARGS_03A_LOST, "checks.check_tokens_lost(answer, reference, dropped)", [
    ("total", 2, True, "both requests together, not per request", N),
    ("none", 0, True, "thinks the engine recovers the deferred step", N),
    ("all", 20, True, "thinks the whole run is lost", N),
    ("kept", 19, True, "the tokens kept, not lost", N),
    ("per_request_wrong", [1, 0], True, "only the first request loses one", N),
    ("per_request_list", [1, 1], False, "one number per request", P),
    ("computed_difference", Computed(lambda ns: [len(a.token_ids) - len(b.token_ids)
                                                 for a, b in zip(ns["reference"], ns["dropped"])],
                                     "[len(r.token_ids) - len(d.token_ids) for r, d in zip(reference, dropped)]"),
     False, "computed from the two runs' completions", P),
    ("numpy", np.int64(1), False, "numpy int", P),
])

# ---- 03b · check_future_inputs (answer is the pair (input_ids, pending))
_add("03b_zos_measured", "check_future_inputs", ARGS_03B_META,
     "checks.check_future_inputs(answer[0], answer[1], zos_meta[2], serial_meta[2])", [
    ("serial_ids", Computed(lambda ns: (ns["serial_meta"][2]["input_ids"], [1, 1, 1]),
                            "input_ids = serial_meta[2]['input_ids']"), True, "the serial run's ids: the host does not have them under ZOS", N),
    ("round_1_copied", Computed(lambda ns: (ns["zos_meta"][1]["input_ids"], ns["zos_meta"][1]["pending"]),
                                "the printed ZOS round 1"), True, "copies round 1, where the prefill was already processed", N),
    ("placeholder_not_pending", ([-1, -1, -1], [0, 0, 0]), True, "placeholders, but not marked pending", N),
    ("four_requests", ([-1] * 4, [1] * 4), True, "PROMPTS has four, the run used three", N),
    ("scalars", (-1, 1), True, "one value for all requests", N),
    ("names", (["FROM_DEVICE"] * 3, [1] * 3), True, "the constant's name as a string", N),
    ("constant_and_bools", Computed(lambda ns: ([ns["kernels"].FROM_DEVICE] * 3, [True] * 3),
                                    "([kernels.FROM_DEVICE] * 3, [True] * 3)"), False, "the constant itself, booleans for pending", P),
    ("tensors", (torch.tensor([-1, -1, -1]), torch.tensor([1, 1, 1])), False, "tensors", P),
    ("read_the_capture", Computed(lambda ns: (ns["zos_meta"][2]["input_ids"], ns["zos_meta"][2]["pending"]),
                                  "(zos_meta[2]['input_ids'], zos_meta[2]['pending'])"), False,
     "reads the captured metadata the next cell prints: right, no prediction", P),
])

# ---- 03b · check_ideal_ratio
def _ideal(ns):
    h, d = host_device_ms(ns["serial_stats"])
    return (h + d) / max(h, d)


_add("03b_zos_measured", "check_ideal_ratio", ARGS_03B_IDEAL, "checks.check_ideal_ratio(answer, serial_stats, zos_stats)", [
    ("measured_ratio", Computed(lambda ns: ns["zos_stats"].tokens_per_s / ns["serial_stats"].tokens_per_s,
                                "zos tokens/s over serial tokens/s"), True, "the measured speed-up, not the ideal", N),
    ("zos_times", Computed(lambda ns: (lambda h, d: (h + d) / max(h, d))(*host_device_ms(ns["zos_stats"])),
                           "the formula on zos_stats"), True, "uses the overlapped run's times", N),
    ("host_over_device", Computed(lambda ns: (lambda h, d: h / d)(*host_device_ms(ns["serial_stats"])), "host / device"),
     True, "a share, not the ratio", N),
    ("percent", Computed(lambda ns: 100 * _ideal(ns), "ideal in percent"), True, "a percentage", N),
    ("one_decimal", Computed(lambda ns: round(_ideal(ns), 1), "round(ideal, 1)"), True, "too coarse (the verdict asks for two)", V),
    ("the_example", 1.25, True, "the example from the cell's comment", N),
    ("device_bound_formula", Computed(lambda ns: (lambda h, d: (h + d) / d)(*host_device_ms(ns["serial_stats"])),
                                      "(host + device) / device"), True,
     "assumes the device is always the longer lane. FALSE PASS on the CPU stand-in, where device > host; wrong on a "
     "GPU or with host_overhead_ms, where the host is the longer lane", V),
    ("two_decimals", Computed(lambda ns: round(_ideal(ns), 2), "round(ideal, 2)"), False, "two decimals, as asked", P),
    ("host_share_form", Computed(lambda ns: (lambda s: 1 / max(s, 1 - s))((lambda h, d: h / (h + d))(
        *host_device_ms(ns["serial_stats"]))), "1 / max(s, 1 - s) with s = h / (h + d)"), False,
     "the optional section's form of the same formula", P),
    ("tensor", Computed(lambda ns: torch.tensor(_ideal(ns)), "a 0-d tensor"), False, "a tensor", P),
])

# ---- 04 · check_true_key_length
_add("04_stale_lengths", "check_true_key_length", ARGS_04,
     "checks.check_true_key_length(answer, host_seqlens_k=27, accepted=4)", [
    ("plus_bonus", 32, True, "adds the bonus token again: the host already counted it", N),
    ("stale", 27, True, "the host's value", N),
    ("one_more", 28, True, "one token per round, ignoring drafts", N),
    ("minus", 23, True, "thinks accepted drafts shorten the sequence", N),
    ("plus_k_and_accepted", 35, True, "adds k drafts fed and the accepted ones", N),
    ("plus_k_drafts", 27 + 4, True,
     "adds K, the drafts *proposed* per round (K = 4 in this notebook), not the accepted count. FALSE PASS: the "
     "example's in-flight round accepted all 4 drafts, so accepted == K", P),
    ("numpy", np.int64(31), False, "numpy int", P),
    ("one_item_list", [31], False, "a one-item list", P),
])

# ---- 04 · check_corrected_slots
_add("04_stale_lengths", "check_corrected_slots", ARGS_04,
     "checks.check_corrected_slots(answer, positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4)", [
    ("old_slots_plus_2", [36, 37, 22], True, "adds accepted to the old slots: wrong across a block boundary", N),
    ("stale_slots", [34, 35, 20], True, "the host's stale slots", N),
    ("positions", [12, 13, 14], True, "the corrected positions, not slots", N),
    ("shift_by_1", [35, 20, 21], True, "shifts by one token", N),
    ("shift_by_3", [21, 22, 23], True, "shifts by 1 + accepted", N),
    ("consecutive_from_first", Computed(lambda ns: (lambda s: [s, s + 1, s + 2])(5 * 4 + 12 % 4),
                                        "first slot through the table, the rest = first + 1, + 2"), True,
     "looks up only the first token's slot and assumes the others follow consecutively; wrong whenever the three "
     "positions straddle a block boundary (the very case the notebook warns about). FALSE PASS: 12, 13, 14 all sit "
     "in block index 3", P),
    ("tuple", (20, 21, 22), False, "a tuple", P),
    ("computed_list", [[6, 0, 8, 5][p // 4] * 4 + p % 4 for p in (12, 13, 14)], False, "the formula in a list comprehension", P),
    ("range", range(20, 23), False, "a range; rejected: 'write the slots as a list' (check_done_after_wait accepts a range)", N),
])

# ---- 05 · check_uncommitted_rounds
_add("05_ownership", "check_uncommitted_rounds", ARGS_05_SEEN,
     "checks.check_uncommitted_rounds(answer, seen['zos'], round=4)", [
    ("only_previous", {3}, True, "forgets the round just launched", N),
    ("only_this", {4}, True, "serial thinking: one round in flight", N),
    ("three_rounds", {2, 3, 4}, True, "thinks ZOS is two rounds behind", N),
    ("next_too", {4, 5}, True, "counts the round about to be scheduled", N),
    ("count", 2, True, "answers how many (2, the right count) instead of which; the verdict reads it as {2} and says "
     "'round 4 itself counts', which does not address the mistake", N),
    ("everything", {0, 1, 2, 3, 4}, True, "all launched rounds", N),
    ("range", range(3, 5), False, "a range", P),
    ("computed_from_spy", Computed(lambda ns: uncommitted_from_rows(ns["seen"]["zos"], 4),
                                   "{4 - i for i in range(in_flight of round 4's row)}"), False, "from the spy's num_inflight", P),
    ("list_reversed", [4, 3], False, "a list", P),
])

# ---- 05 · check_discarded (stop string run)
_add("05_ownership", "check_discarded", ARGS_05_DISCARDED, "checks.check_discarded(answer, zos)", [
    ("none", 0, True, "serial thinking: nothing is launched after a stop. The verdict says 'The run discarded 1': it "
     "gives the answer away", N),
    ("one_per_request", 4, True, "every request gets an extra step at the end, length limit included", N),
    ("two", 2, True, "the stopped request and its neighbour", N),
    ("rounds", 24, True, "one per round", N),
    ("float", 1.0, False, "the right count as a float; rejected: 'a count of discarded outputs is one whole number'", N),
    ("read_stats", Computed(lambda ns: ns["zos"].stats.discarded_outputs, "zos.stats.discarded_outputs"),
     False, "reads the engine's counter: right by construction, no prediction", P),
    ("numpy", np.int64(1), False, "numpy int", P),
])

# ---- 05 · check_race_report
_add("05_ownership", "check_race_report", ARGS_05_RACE, "checks.check_race_report(answer, single_buffer_error)", [
    ("writer_round", ("meta0", 2), True, "the round whose prepare writes, not the launch that still reads", N),
    ("output_slot", ("out0", 1), True, "thinks the output slot races", N),
    ("other_slot", ("meta1", 1), True, "forgets NUM_SLOTS = 1", N),
    ("temps", ("temps0", 1), True, "the second metadata buffer", N),
    ("prefill_round", ("meta0", 0), True, "the prefill's upload", N),
    ("stage_name", ("upload", 1), True, "the launch's stage, not the buffer", N),
    ("buffer_only", "meta0", True, "the buffer without the round", N),
    ("list", ["meta0", 1], False, "a list", P),
    ("capitalised", ("Meta0", 1), False, "capitalised", P),
    ("parsed_from_error", Computed(lambda ns: race_pair_from_error(ns["single_buffer_error"]),
                                   "parsed from the RaceError the cell prints"), False,
     "read off the error printed above the check in the same cell", P),
    ("owner_name", ("meta0", "StepState(round=1)"), False,
     "the round as its owner's name; rejected here, though check_processed_under accepts 'StepState(round=1)'", N),
])

# ---- 05 · check_discarded (abort run)
_add("05_ownership", "check_discarded", ARGS_05_ABORT, "checks.check_discarded(answer, zos, name='discarded_by_abort')", [
    ("none", 0, True, "thinks an abort takes effect before anything else is launched", N),
    ("two_rounds", 2, True, "rounds 3 and 4 both hold prompt 1", N),
    ("rest_of_request", 19, True, "counts the tokens prompt 1 never produced", N),
    ("all_requests", 4, True, "one per request in the batch", N),
    ("read_stats", Computed(lambda ns: ns["zos"].stats.discarded_outputs, "zos.stats.discarded_outputs"),
     False, "reads the counter", P),
    ("one_item_list", [1], False, "a one-item list", P),
])

# ---- 06 · check_idle_share
_add("06_real_traces", "check_idle_share", ARGS_06_REAL, "checks.check_idle_share(answer, REAL)", [
    ("busy_share", 0.21, True, "the busy share", N),
    ("busy_percent", 21, True, "the busy share in percent", N),
    ("idle_over_busy", 207 / 56, True, "idle / busy", N),
    ("idle_us", 207, True, "the idle time in microseconds", N),
    ("coin_flip", 0.5, True, "a guess", N),
    ("whole_trace_window", (372 - 56) / 372, True,
     "idle over the whole trace, first host call to last, instead of first to last device event (0.85). FALSE PASS: "
     "within the stated 10-point tolerance", P),
    ("percent", 78.7, False, "a percentage", P),
    ("fraction", Fraction(207, 263), False, "an exact Fraction", P),
    ("kernels_only", 0.806, False, "kernels, copies and memsets only (the notebook's second definition)", P),
    ("read_summary", Computed(lambda ns: ns["kineto"].summary(ns["REAL"])["device_idle_fraction"],
                              "kineto.summary(REAL)['device_idle_fraction']"), False, "reads the next cell's summary", P),
    ("percent_string", "79%", False, "a percent string; rejected: 'write the share as a number'", N),
])

# ---- 06 · check_idle_sync on the A100 trace
_add("06_real_traces", "check_idle_sync", ARGS_06_REAL, "checks.check_idle_sync(answer, REAL)", [
    ("the_copy", "cudaMemcpyAsync", True, "the call before the gap, which does not block", N),
    ("event_sync", "cudaEventSynchronize", True, "the other sync, which returns while the device is busy", N),
    ("pytorch_op", "aten::item", True, "the PyTorch operator, not the runtime call", N),
    ("device_sync", "cudaDeviceSynchronize", True, "the last sync, after the last device event", N),
    ("launch", "cudaLaunchKernel", True, "the launch after the gap", N),
    ("first_sync_in_trace", Computed(lambda ns: ns["kineto"].host_syncs(ns["REAL"])[0],
                                     "the first sync the trace lists"), True,
     "takes the first sync of the trace without measuring any gap. FALSE PASS: in this trace the first sync is the "
     "culprit", P),
    ("lowercase", "cudastreamsynchronize", False, "lower case", P),
    ("with_parens", "cudaStreamSynchronize()", False, "with parentheses", P),
    ("measured", Computed(lambda ns: max((d := ns["kineto"].idle_after_syncs(ns["REAL"])["by_sync_us"]), key=d.get),
                          "max of kineto.idle_after_syncs(REAL)['by_sync_us']"), False, "measured with the next cell's tool", P),
])

# ---- 06 · check_idle_sync on the learner's own serial export
_add("06_real_traces", "check_idle_sync", ARGS_06_MINE, "checks.check_idle_sync(answer, exported['serial'], name='culprit_mine')", [
    ("the_a100_answer", "cudaStreamSynchronize", True, "copies the A100's culprit", N),
    ("engine_stage", "wait", True, "the engine's own name for the wait", N),
    ("engine_method", "process_outputs", True, "the method that waits", N),
    ("launch", "cudaLaunchKernel", True, "the launch", N),
    ("upload", "cudaMemcpyAsync", True, "the upload's runtime call", N),
    ("only_sync_listed", Computed(lambda ns: ns["kineto"].host_syncs(ns["exported"]["serial"])[0],
                                  "kineto.host_syncs(path)[0]"), True,
     "the first (here the only) sync the export lists, nothing measured. FALSE PASS: the export has one kind of "
     "sync, so 'which sync' has one candidate; every NOT YET verdict above also lists it ('its host syncs are: "
     "cudaEventSynchronize')", P),
    ("with_parens", "cudaEventSynchronize()", False, "with parentheses", P),
    ("measured", Computed(lambda ns: max((d := ns["kineto"].idle_after_syncs(ns["exported"]["serial"])["by_sync_us"]),
                                         key=d.get), "max of idle_after_syncs(path)['by_sync_us']"), False, "measured", P),
])


# --------------------------------------------------------------------------- running them

def build_namespace(args_from: str) -> dict:
    ns: dict = {}
    exec(args_from, ns)  # noqa: S102 - the notebooks' own code
    return ns


def close_engines(ns: dict) -> None:
    import toy_engine as te
    for value in list(ns.values()):
        if isinstance(value, te.Engine):
            try:
                value.close()
            except Exception:  # noqa: BLE001
                pass


def evaluate(answer: Answer, ns: dict):
    """The check's verdict for one answer, in a namespace built from its args_from."""
    value = answer.answer(ns) if isinstance(answer.answer, Computed) else answer.answer
    ns["answer"] = value
    return eval(answer.call, ns)  # noqa: S307


def run_all(answers: list[Answer] | None = None):
    """Yield (answer, verdict), building each distinct args_from once and closing its engines after."""
    answers = BLIND_PRACTICE if answers is None else answers
    groups: dict[str, list[Answer]] = {}
    for a in answers:
        groups.setdefault(a.args_from, []).append(a)
    for args_from, group in groups.items():
        ns = build_namespace(args_from)
        try:
            for a in group:
                yield a, evaluate(a, ns)
        finally:
            close_engines(ns)
