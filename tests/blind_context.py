"""Blind learner answers for the checks that take context arguments besides the answer
(issue 34's blind round on `context.given`).

Written by a helper who saw only notebooks/, exercises/ and toy_engine/ -- never the checkers --
so it does not share their blind spots: wrong answers (misread formulas, off by one, wrong units,
partial answers), stubs (None) given odd context (the wrong variable, a stale object, a closed
engine's device), and a few unusual right ones.  Each case_NAME() returns
("check_name", args, kwargs); CASES and EXTRA_CASES list (case, wrong, why).
"""

import atexit
import functools
from fractions import Fraction

import numpy as np
import torch

import toy_engine as te
from toy_engine import kernels

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]


def _keep(engine):
    """An engine the check may still read; closed when the interpreter exits."""
    atexit.register(engine.close)
    return engine


# ---------------------------------------------------------------- shared small runs

@functools.lru_cache(maxsize=None)
def _serial_run():
    """Notebook 02 style: a serial engine, 4 prompts, 16 rounds (round 10 exists)."""
    engine = _keep(te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)))
    engine.generate(PROMPTS, max_new_tokens=16)
    return engine


@functools.lru_cache(maxsize=None)
def _zos_run():
    engine = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)))
    engine.generate(PROMPTS, max_new_tokens=16)
    return engine


def _round_gap(timeline, rnd):
    """Start of round rnd's first device span minus end of round rnd-1's last (the notebook's
    definition)."""
    dev = timeline.lane("device")
    first = min(s.start_ms for s in dev if s.round == rnd)
    last = max(s.end_ms for s in dev if s.round == rnd - 1)
    return first - last


def _watch_launches(engine, prompt, max_new_tokens=6):
    """Notebook 05's spy, copied: (round, committed, num_inflight, text) after each
    launch_forward."""
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


def _capture_metadata(engine, rounds, prompts, max_new_tokens):
    """Notebook 03b's capture_metadata, copied."""
    captured, real_prepare = {}, engine.prepare_inputs

    def spy(plan):
        inputs = real_prepare(plan)
        if plan.round in rounds:
            flat = engine.device.host(f"meta{inputs.slot}", "r")
            views = engine.layout.views(flat, inputs.num_tokens, len(plan.requests),
                                        inputs.num_blocks)
            captured[plan.round] = {name: view.tolist() for name, view in views.items()}
        return inputs

    engine.prepare_inputs = spy
    try:
        engine.generate(prompts, max_new_tokens=max_new_tokens)
    finally:
        del engine.prepare_inputs
    return captured


@functools.lru_cache(maxsize=None)
def _metas():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=8)) as zos, \
            te.Engine(te.EngineConfig(mode="serial", max_batch_size=8)) as serial:
        z = _capture_metadata(zos, {1, 2}, PROMPTS[:3], 8)
        s = _capture_metadata(serial, {1, 2}, PROMPTS[:3], 8)
    return z, s


@functools.lru_cache(maxsize=None)
def _bench_stats():
    """Notebook 03b section 4, smaller: serial and zos stats of the same workload."""
    out = {}
    for mode in ("serial", "zos"):
        with te.Engine(te.EngineConfig(mode=mode, max_batch_size=4)) as e:
            e.generate(PROMPTS, max_new_tokens=12)  # warm-up
            e.generate(PROMPTS, max_new_tokens=12)
            out[mode] = (e.timeline, e.stats)
    return out


@functools.lru_cache(maxsize=None)
def _single_buffer_error():
    """Notebook 05 section 4: ZOS with NUM_SLOTS = 1 -> RaceError on meta0, round 1's upload."""
    err = None
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as zos:
        te.engine.NUM_SLOTS = 1
        try:
            zos.generate(PROMPTS, max_new_tokens=8)
        except te.RaceError as e:
            err = e
        finally:
            te.engine.NUM_SLOTS = 2
    return err


def _small_processed_timeline(mode="zos"):
    """Notebook 03a section 5: 3 prompts, two at a time, 4 new tokens."""
    with te.Engine(te.EngineConfig(mode=mode, max_batch_size=2)) as small:
        small.generate(PROMPTS[:3], max_new_tokens=4)
        return small.timeline


# ================================================================ exercise 02: check_idle_fraction

def case_idle_busy_fraction():
    """Slip: returns busy / (idle + busy), the complement."""
    def idle_fraction(timeline):
        idle = sum(b - a for a, b in timeline.device_gaps())
        busy = timeline.device_busy_ms()
        return busy / (idle + busy)
    return ("check_idle_fraction", (idle_fraction, _serial_run()), {})


def case_idle_over_busy():
    """Slip: idle / busy instead of idle / (idle + busy)."""
    def idle_fraction(timeline):
        idle = sum(b - a for a, b in timeline.device_gaps())
        return idle / timeline.device_busy_ms()
    return ("check_idle_fraction", (idle_fraction, _serial_run()), {})


def case_idle_whole_run():
    """Slip: denominator is the whole span from the first host span to the last one (includes
    start-up)."""
    def idle_fraction(timeline):
        idle = sum(b - a for a, b in timeline.device_gaps())
        t0 = min(s.start_ms for s in timeline.spans)
        t1 = max(s.end_ms for s in timeline.spans)
        return idle / (t1 - t0)
    return ("check_idle_fraction", (idle_fraction, _serial_run()), {})


def case_idle_count_gaps():
    """Slip: counts gaps (len) as idle time instead of summing their durations."""
    def idle_fraction(timeline):
        gaps = timeline.device_gaps()
        busy = timeline.device_busy_ms()
        return len(gaps) / (len(gaps) + busy)
    return ("check_idle_fraction", (idle_fraction, _serial_run()), {})


def case_idle_stub_fresh_engine():
    """Stub function (still raises NotImplementedError) with an engine that has never run."""
    def idle_fraction(timeline):
        raise NotImplementedError("exercise: write this part")
    engine = _keep(te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)))
    return ("check_idle_fraction", (idle_fraction, engine), {})


def case_idle_timeline_instead_of_engine():
    """Stub answer None and engine.timeline passed where the engine is expected."""
    return ("check_idle_fraction", (None, _serial_run().timeline), {})


# ================================================================ notebook 01: check_slot

def case_slot_block_index_not_id():
    """Uses the block's index in the table (2) instead of its id (9): 2*4 + 1 = 9."""
    return ("check_slot", (9,), dict(table=[5, 2, 9], pos=9, block_size=4))


def case_slot_first_block_plus_pos():
    """Treats blocks as contiguous from the first block: 5*4 + 9 = 29."""
    return ("check_slot", (29,), dict(table=[5, 2, 9], pos=9, block_size=4))


def case_second_slot_off_by_one():
    """Second request: thinks the first decoded token sits at position 9 (prompt 8 + 1): 6*4 + 1 =
    25."""
    return ("check_slot", (25,), dict(table=[3, 8, 6, 1], pos=8, block_size=4, name="second_slot"))


def case_slot_stub_tensor_table_str_pos():
    """Stub None; the table passed as a torch tensor and pos as the string '9'."""
    return ("check_slot", (None,), dict(table=torch.tensor([5, 2, 9]), pos="9", block_size=4))


def case_slot_numpy_right():
    """RIGHT: slot of position 9 = table[9 // 4] * 4 + 9 % 4 = 9*4 + 1 = 37, as a numpy int64."""
    table = np.array([5, 2, 9])
    return ("check_slot", (table[9 // 4] * 4 + 9 % 4,), dict(table=[5, 2, 9], pos=9, block_size=4))


# ================================================================ notebook 01: check_decode_lengths

def case_decode_k_stale_prompt_lengths():
    """Gives seqlens_k = the prompt lengths (forgets the new token counts as a key)."""
    return ("check_decode_lengths", ([1, 1, 1], [9, 7, 3]), dict(prompt_lengths=[9, 7, 3]))


def case_decode_q_full_lengths():
    """Thinks a decode round re-feeds the whole sequence: seqlens_q = seqlens_k = [10, 8, 4]."""
    return ("check_decode_lengths", ([10, 8, 4], [10, 8, 4]), dict(prompt_lengths=[9, 7, 3]))


def case_decode_stub_scalar_context():
    """Stubs left None, prompt_lengths passed as one total (19) instead of a list."""
    return ("check_decode_lengths", (None, None), dict(prompt_lengths=19))


# ================================================================ notebook 02

def case_largest_stage_wait():
    """Picks 'wait' although the question says waiting is excluded."""
    return ("check_largest_host_stage", ("wait", _serial_run().timeline), {})


def case_largest_stage_device_stage():
    """Names a device stage ('forward'), not a host stage."""
    return ("check_largest_host_stage", ("forward", _serial_run().timeline), {})


def case_largest_stage_stub_list():
    """Stub None with timeline.lane('host') (a list of spans) instead of the Timeline."""
    return ("check_largest_host_stage", (None, _serial_run().timeline.lane("host")), {})


def case_round_gap_next_round():
    """Off by one: measures the gap before round 11 (between rounds 10 and 11)."""
    tl = _serial_run().timeline
    return ("check_round_gap", (_round_gap(tl, 11), tl), dict(round=10))


def case_round_gap_seconds():
    """Wrong units: the right gap in seconds."""
    tl = _serial_run().timeline
    return ("check_round_gap", (_round_gap(tl, 10) / 1000.0, tl), dict(round=10))


def case_round_gap_tenth_gap():
    """Takes device_gaps()[10] (gaps inside rounds count too, so that is not round 10's
    boundary)."""
    tl = _serial_run().timeline
    a, b = tl.device_gaps()[10]
    return ("check_round_gap", (b - a, tl), dict(round=10))


def case_round_gap_stub_short_run():
    """Stub None with the timeline of a run that never reached round 10 (3 rounds)."""
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) as e:
        e.generate(PROMPTS[:2], max_new_tokens=3)
        tl = e.timeline
    return ("check_round_gap", (None, tl), dict(round=10))


def case_round_gap_right_from_gaps():
    """RIGHT: the device_gaps() interval that ends where round 10's first device span starts,
    rounded to 2 decimals (within 0.005) and as numpy float64."""
    tl = _serial_run().timeline
    start10 = min(s.start_ms for s in tl.lane("device") if s.round == 10)
    a, b = min(tl.device_gaps(), key=lambda g: abs(g[1] - start10))
    return ("check_round_gap", (np.round(np.float64(b - a), 2), tl), dict(round=10))


def case_overhead_gap_seconds():
    """Wrong units: 5 ms written as 0.005 (seconds)."""
    return ("check_overhead_gap", (0.005,), dict(overhead_ms=5.0))


def case_overhead_gap_doubled():
    """Thinks the overhead is paid on both sides of a boundary: 10 ms."""
    return ("check_overhead_gap", (10.0,), dict(overhead_ms=5.0))


def case_overhead_gap_stub_str():
    """Stub None with overhead_ms passed as the string '5 ms'."""
    return ("check_overhead_gap", (None,), dict(overhead_ms="5 ms"))


# ================================================================ notebook 03a

def case_processed_under_own_round():
    """Answers 2: thinks the pass launching round 2's forward processes round 2 itself (the serial
    order)."""
    return ("check_processed_under", (2, _small_processed_timeline()), dict(round=2))


def case_processed_under_prefill():
    """Answers 0: the prefill round, which was processed at once, before round 1."""
    return ("check_processed_under", (0, _small_processed_timeline()), dict(round=2))


def case_processed_under_serial_timeline():
    """Answer 1 (right for ZOS) but checked against a serial run's timeline, where nothing is
    deferred."""
    return ("check_processed_under", (1, _small_processed_timeline("serial")), dict(round=2))


def case_swapped_order_inverted():
    """Gets both halves backwards: (False, True)."""
    return ("check_swapped_order", ((False, True), True, False), {})


def case_swapped_order_partial():
    """Partial answer: one boolean (True) instead of a pair."""
    return ("check_swapped_order", (True, True, False), {})


def case_swapped_order_stub_strings():
    """Stub None; the comparisons passed as strings from printed output."""
    return ("check_swapped_order", (None, "True", "False"), {})


def _lost_runs():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=8)) as zos:
        two = ["Once upon a time", "One day"]
        reference = zos.generate(two, max_new_tokens=20)
        zos.flush = lambda previous: None
        try:
            zos.generate(two, max_new_tokens=20)
        except te.EngineStalled:
            pass
        finally:
            del zos.flush
        dropped = zos.completions
    return reference, dropped


def case_tokens_lost_total():
    """Counts over both requests (2) though the question asks per request (1)."""
    reference, dropped = _lost_runs()
    return ("check_tokens_lost", (2, reference, dropped), {})


def case_tokens_lost_stub_same_run():
    """Stub None; passes the reference twice (the 'dropped' cell was not re-run)."""
    reference, _ = _lost_runs()
    return ("check_tokens_lost", (None, reference, reference), {})


# ================================================================ notebook 03b

def case_future_inputs_serial_values():
    """Copies the serial round 2 values (real ids, pending 0): ignores that ZOS round 1 is in
    flight."""
    z, s = _metas()
    return ("check_future_inputs", (list(s[2]["input_ids"]), [0, 0, 0], z[2], s[2]), {})


def case_future_inputs_pending_zero():
    """Right ids (FROM_DEVICE) but pending 0 for all: confuses 'placeholder' with 'not pending'."""
    z, s = _metas()
    return ("check_future_inputs", ([-1, -1, -1], [0, 0, 0], z[2], s[2]), {})


def case_future_inputs_stub_round1():
    """Stubs None with zos_meta[1] (the wrong round) and the metas swapped."""
    z, s = _metas()
    return ("check_future_inputs", (None, None, s[2], z[1]), {})


def case_ideal_inverse():
    """Inverts the ratio: max(host, device) / (host + device)."""
    st = _bench_stats()
    ss, zs = st["serial"][1], st["zos"][1]
    h, d = ss.mean_host_ms_per_round, ss.mean_device_ms_per_round
    return ("check_ideal_ratio", (max(h, d) / (h + d), ss, zs), {})


def case_ideal_min():
    """Divides by min(host, device) instead of max: (host + device) / min(host, device)."""
    st = _bench_stats()
    ss, zs = st["serial"][1], st["zos"][1]
    h, d = ss.mean_host_ms_per_round, ss.mean_device_ms_per_round
    return ("check_ideal_ratio", ((h + d) / min(h, d), ss, zs), {})


def case_ideal_stub_timelines():
    """Stub None with the timelines passed instead of the stats objects."""
    st = _bench_stats()
    return ("check_ideal_ratio", (None, st["serial"][0], st["zos"][0]), {})


def case_ideal_right_numpy():
    """RIGHT: (host + device) / max(host, device) of the serial stats, computed with numpy
    (np.float64)."""
    st = _bench_stats()
    ss, zs = st["serial"][1], st["zos"][1]
    v = np.array([ss.mean_host_ms_per_round, ss.mean_device_ms_per_round])
    return ("check_ideal_ratio", (v.sum() / v.max(), ss, zs), {})


# ================================================================ notebook 04

def case_true_k_plus_bonus():
    """Adds accepted + 1 (counts the bonus token, which the host already assumed): 27 + 5 = 32."""
    return ("check_true_key_length", (32,), dict(host_seqlens_k=27, accepted=4))


def case_true_k_minus():
    """Subtracts the accepted drafts: 27 - 4 = 23."""
    return ("check_true_key_length", (23,), dict(host_seqlens_k=27, accepted=4))


def case_second_k_first_answer():
    """Pastes the first request's answer (31) into the second (19 planned, 2 accepted -> 21)."""
    return ("check_true_key_length", (31,),
            dict(host_seqlens_k=19, accepted=2, name="second_seqlens_k"))


def case_true_k_stub_list_context():
    """Stub None with host_seqlens_k as a one-element list and accepted as a tensor."""
    return ("check_true_key_length", (None,), dict(host_seqlens_k=[27], accepted=torch.tensor([4])))


def case_slots_uncorrected():
    """Slots of the stale positions [10, 11, 12]: [34, 35, 20] (no correction)."""
    return ("check_corrected_slots", ([34, 35, 20],),
            dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4))


def case_slots_shift_three():
    """Shifts by accepted + 1 = 3: positions [13, 14, 15] -> [21, 22, 23]."""
    return ("check_corrected_slots", ([21, 22, 23],),
            dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4))


def case_second_slots_contiguous():
    """Second request: corrected positions [3, 4, 5] but assumes the next slots follow
    contiguously: [39, 40, 41]."""
    return ("check_corrected_slots", ([39, 40, 41],),
            dict(name="second_slots", positions=[1, 2, 3], table=[9, 4, 2], accepted=2,
                 block_size=4))


def case_slots_positions_not_slots():
    """Partial: gives the corrected positions [12, 13, 14] instead of their slots."""
    return ("check_corrected_slots", ([12, 13, 14],),
            dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4))


def case_slots_right_tensor():
    """RIGHT: positions shifted by accepted (2) -> [12, 13, 14];
    slot = table[p // 4] * 4 + p % 4 -> [20, 21, 22],
    computed vectorised in torch and passed as a tensor."""
    table = torch.tensor([6, 0, 8, 5])
    pos = torch.tensor([10, 11, 12]) + 2
    return ("check_corrected_slots", (table[pos // 4] * 4 + pos % 4,),
            dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4))


# ================================================================ notebook 05

@functools.lru_cache(maxsize=None)
def _seen():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)) as zos, \
            te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)) as serial:
        return {"serial": _watch_launches(serial, PROMPTS[0]),
                "zos": _watch_launches(zos, PROMPTS[0])}


def case_uncommitted_only_previous():
    """Only round 3 (forgets that round 4 itself is now launched and unprocessed)."""
    return ("check_uncommitted_rounds", ({3}, _seen()["zos"]), dict(round=4))


def case_uncommitted_count():
    """Answers the count 2 (num_inflight) instead of the set of rounds."""
    return ("check_uncommitted_rounds", (2, _seen()["zos"]), dict(round=4))


def case_uncommitted_stub_serial_rows():
    """Stub None with the serial run's rows (seen['serial']) and round given as a string."""
    return ("check_uncommitted_rounds", (None, _seen()["serial"]), dict(round="4"))


def case_uncommitted_right_frozenset():
    """RIGHT: after round 4's forward ZOS has rounds 3 and 4 in flight
    (num_inflight == 2 in the spy's row),
    derived from the row and given as a frozenset."""
    rows = _seen()["zos"]
    r, _, inflight, _ = next(row for row in rows if row[0] == 4)
    answer = frozenset(range(r - inflight + 1, r + 1))
    return ("check_uncommitted_rounds", (answer, rows), dict(round=4))


def _discard_engine():
    zos = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)))
    zos.generate(PROMPTS, max_new_tokens=24, stop=[" the"])
    return zos


def case_discarded_zero():
    """Thinks tokens equal serial's, so nothing is discarded: 0."""
    return ("check_discarded", (0, _discard_engine()), {})


def case_discarded_per_prompt():
    """Thinks every prompt discards one output at its end: 4."""
    return ("check_discarded", (4, _discard_engine()), {})


def case_discarded_stub_serial_engine():
    """Stub None with the serial engine instead of the ZOS one."""
    serial = _keep(te.Engine(te.EngineConfig(mode="serial", max_batch_size=4)))
    serial.generate(PROMPTS, max_new_tokens=24, stop=[" the"])
    return ("check_discarded", (None, serial), {})


def case_discarded_abort_two():
    """Abort case: counts both rounds 4 and 5 as holding prompt 1: 2."""
    zos = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=4)))

    def abort_prompt_1(engine, round):
        if round == 5:
            engine.abort(engine.requests[1].id)

    zos.generate(PROMPTS, max_new_tokens=24, on_round=abort_prompt_1)
    return ("check_discarded", (2, zos), dict(name="discarded_by_abort"))


def case_race_report_out_buffer():
    """Names the output buffer out0 (the example's kind) instead of the metadata buffer."""
    return ("check_race_report", (("out0", 1), _single_buffer_error()), {})


def case_race_report_wrong_round():
    """Right buffer, but the round being prepared (2) instead of the launch still reading it (1)."""
    return ("check_race_report", (("meta0", 2), _single_buffer_error()), {})


def case_race_report_stub_no_error():
    """Stub None with single_buffer_error still None (the race cell was not run / NUM_SLOTS
    restored)."""
    return ("check_race_report", (None, None), {})


def case_race_report_string_error():
    """Answer as one string 'meta0 1' and the error as its str() instead of the RaceError."""
    return ("check_race_report", ("meta0 1", str(_single_buffer_error())), {})


# ==================== notebook 06 (no shipped trace here: context slips)

def case_idle_share_stub_typo_trace():
    """Stub None with a misspelled trace name."""
    return ("check_idle_share", (None, "a100_event_synch"), {})


def case_idle_share_percent_str():
    """Answer as a string '40%' with a toy Timeline passed instead of the trace name."""
    return ("check_idle_share", ("40%", _serial_run().timeline), {})


def case_idle_sync_timeline_not_path():
    """culprit_mine: a device stage name with the toy Timeline (runs['serial']) instead of the
    exported path."""
    return ("check_idle_sync", ("sample", _serial_run().timeline), dict(name="culprit_mine"))


def case_idle_sync_toy_json():
    """Stub None with a path to the toy's own JSON (Timeline.to_json), not a Kineto export."""
    import os
    import tempfile
    path = os.path.join(tempfile.gettempdir(), "blind_r34_toy_timeline.json")
    _serial_run().timeline.to_json(path)
    return ("check_idle_sync", (None, path), dict(name="culprit_mine"))


# ==================== notebook 07 / 07b (labs unavailable: stale engines)

def case_wasted_round_plain_engine():
    """(12, 1): a guess, checked against a zos engine whose last run used the engine's own
    policy."""
    zos = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)))
    zos.generate(PROMPTS, max_new_tokens=12)
    return ("check_wasted_round", ((12, 1), zos), {})


def case_abort_in_flight_stub_none():
    """Stub None with race still None (no RaceError was caught)."""
    return ("check_abort_in_flight", (None, None), {})


def case_abort_in_flight_wrong_error():
    """Sets in the right shape but with notebook 05's buffer RaceError (a stale object) as the
    race."""
    return ("check_abort_in_flight", (({5}, {5}), _single_buffer_error()), {})


def case_ring_race_stale_error():
    """(1, 3) with notebook 05's single-buffer RaceError passed as ring_race."""
    return ("check_ring_race", ((1, 3), _single_buffer_error()), dict(ring=3))


def case_overshoot_bonus_counted():
    """Counts drafts + bonus: 4 tokens past the limit (at most 3: one token must still be
    wanted)."""
    spec = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=3)))
    spec.generate(PROMPTS, max_new_tokens=30, stop=[" was", "."], loop=te.loops.serial_loop)
    return ("check_overshoot", (4, spec), {})


def case_overshoot_stub_no_drafts():
    """Stub None with the zos engine without drafts instead of spec."""
    zos = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)))
    return ("check_overshoot", (None, zos), {})


def case_stale_mask_stub_unrun():
    """Stub None with a title_case ZOS engine that has not run."""
    title = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=3, constraint="title_case")))
    return ("check_stale_mask", (None, title), {})


def case_token_leak_wrong_shape():
    """A dict only, no round, with a plain zos engine run without the shipped key."""
    zos = _keep(te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)))
    zos.generate(PROMPTS + ["A little cat"], max_new_tokens=16, stop=[" the"])
    return ("check_token_leak", ({1: 0}, zos), {})


# ================================================================ notebook 00

def case_done_after_wait_only_waited():
    """Only the kernel waited on: {1} (forgets the stream is in order)."""
    return ("check_done_after_wait", ({1},), dict(waited=1))


def case_done_after_wait_all():
    """All three: {0, 1, 2}."""
    return ("check_done_after_wait", ({0, 1, 2},), dict(waited=1))


def case_done_after_wait_stub_str():
    """Stub None with waited as the string 'events[1]'."""
    return ("check_done_after_wait", (None,), dict(waited="events[1]"))


def _device():
    engine = _keep(te.Engine(te.EngineConfig(device="auto", max_batch_size=1, num_kv_blocks=8)))
    return engine.device


def case_race_safe_given_as_racy():
    """Racy answer that is actually safe: launch, record, wait, read."""
    return ("check_race", (["launch", "record", "wait", "read"], _device()), {})


def case_race_fixed_event_before_launch():
    """'Safe' answer with the event recorded before the launch: the wait orders nothing after the
    kernel."""
    return ("check_race_fixed", (["record", "launch", "wait", "read"], _device()), {})


def case_race_fixed_partial():
    """Partial: launch and read only."""
    return ("check_race_fixed", (["launch", "read"], _device()), {})


def case_race_stub_engine_not_device():
    """Stub None with the Engine passed instead of engine.device."""
    engine = _keep(te.Engine(te.EngineConfig(device="auto", max_batch_size=1, num_kv_blocks=8)))
    return ("check_race", (None, engine), {})


def case_race_fixed_closed_device():
    """A correct-looking order, but on the device of an engine closed in an earlier cell."""
    engine = te.Engine(te.EngineConfig(device="auto", max_batch_size=1, num_kv_blocks=8))
    device = engine.device
    engine.close()
    return ("check_race_fixed", (["launch", "record", "wait", "read"], device), {})


# The main set (41 cases). EXTRA_CASES: more of the same kind, same format, if wanted.
CASES = [
    (case_idle_busy_fraction, True, "busy fraction instead of idle fraction"),
    (case_idle_over_busy, True, "idle / busy instead of idle / (idle + busy)"),
    (case_idle_stub_fresh_engine, True, "stub function, engine that never ran"),
    (case_slot_block_index_not_id, True, "block index 2 instead of block id 9 -> 9"),
    (case_slot_stub_tensor_table_str_pos, True, "None, tensor table, string pos"),
    (case_slot_numpy_right, False, "37 = 9*4+1 as np.int64"),
    (case_decode_k_stale_prompt_lengths, True,
     "seqlens_k = prompt lengths (missing the new token)"),
    (case_largest_stage_stub_list, True, "None with a list of spans instead of the Timeline"),
    (case_round_gap_next_round, True, "gap before round 11, not 10"),
    (case_round_gap_seconds, True, "seconds instead of ms"),
    (case_round_gap_stub_short_run, True, "None with a run that has no round 10"),
    (case_round_gap_right_from_gaps, False,
     "device gap ending at round 10's first span, 2 decimals, np.float64"),
    (case_overhead_gap_seconds, True, "0.005: seconds"),
    (case_processed_under_own_round, True, "2: the serial order"),
    (case_processed_under_serial_timeline, True, "1 but against a serial timeline"),
    (case_swapped_order_stub_strings, True, "None with string context"),
    (case_tokens_lost_total, True, "2: total over both requests"),
    (case_future_inputs_serial_values, True, "serial ids, pending 0"),
    (case_future_inputs_stub_round1, True, "None with wrong-round, swapped metas"),
    (case_ideal_inverse, True, "max/(host+device), the inverse"),
    (case_ideal_stub_timelines, True, "None with timelines instead of stats"),
    (case_ideal_right_numpy, False, "(h+d)/max(h,d) of serial stats via numpy"),
    (case_true_k_plus_bonus, True, "27+4+1 = 32 double-counts the assumed token"),
    (case_slots_uncorrected, True, "uncorrected slots [34, 35, 20]"),
    (case_slots_right_tensor, False, "[20, 21, 22] as a torch tensor"),
    (case_uncommitted_only_previous, True, "{3}: forgets round 4 itself"),
    (case_uncommitted_stub_serial_rows, True, "None, serial rows, round as str"),
    (case_uncommitted_right_frozenset, False, "frozenset({3, 4}) derived from num_inflight"),
    (case_discarded_stub_serial_engine, True, "None with the serial engine"),
    (case_discarded_abort_two, True, "abort: 2 instead of 1"),
    (case_race_report_wrong_round, True, "round being prepared (2), not the launch's (1)"),
    (case_race_report_stub_no_error, True, "None with error None"),
    (case_idle_share_stub_typo_trace, True, "None with misspelled trace name"),
    (case_idle_sync_toy_json, True, "None with a toy JSON path, not Kineto"),
    (case_wasted_round_plain_engine, True, "engine whose last run used the own policy"),
    (case_abort_in_flight_wrong_error, True, "stale buffer RaceError from notebook 05"),
    (case_ring_race_stale_error, True, "stale buffer RaceError as ring_race"),
    (case_overshoot_stub_no_drafts, True, "None with an engine without drafts"),
    (case_done_after_wait_only_waited, True, "{1}: only the waited kernel"),
    (case_race_fixed_event_before_launch, True, "event before launch: not safe"),
    (case_race_stub_engine_not_device, True, "None with the Engine as device"),
]

EXTRA_CASES = [
    (case_idle_whole_run, True, "whole run (host spans included) as denominator"),
    (case_idle_count_gaps, True, "number of gaps used as idle milliseconds"),
    (case_idle_timeline_instead_of_engine, True, "None answer, timeline where the engine goes"),
    (case_slot_first_block_plus_pos, True, "contiguous from first block -> 29"),
    (case_second_slot_off_by_one, True, "second slot at position 9 instead of 8 -> 25"),
    (case_decode_q_full_lengths, True, "seqlens_q = full lengths (re-feeding the past)"),
    (case_decode_stub_scalar_context, True, "None, None with prompt_lengths a scalar"),
    (case_largest_stage_wait, True, "'wait' is excluded"),
    (case_largest_stage_device_stage, True, "'forward' is a device stage"),
    (case_round_gap_tenth_gap, True, "device_gaps()[10] includes in-round gaps"),
    (case_overhead_gap_doubled, True, "10 ms: counted twice"),
    (case_overhead_gap_stub_str, True, "None with overhead_ms='5 ms'"),
    (case_processed_under_prefill, True, "0: the prefill was processed at once"),
    (case_swapped_order_inverted, True, "(False, True): both backwards"),
    (case_swapped_order_partial, True, "a single bool"),
    (case_tokens_lost_stub_same_run, True, "None with reference passed twice"),
    (case_future_inputs_pending_zero, True, "FROM_DEVICE ids but pending 0"),
    (case_ideal_min, True, "divides by min instead of max"),
    (case_true_k_minus, True, "27-4 = 23"),
    (case_second_k_first_answer, True, "first answer 31 pasted into the second"),
    (case_true_k_stub_list_context, True, "None with list/tensor context"),
    (case_slots_shift_three, True, "shift by accepted+1 -> [21, 22, 23]"),
    (case_second_slots_contiguous, True, "contiguous slots across a block boundary [39, 40, 41]"),
    (case_slots_positions_not_slots, True, "positions [12, 13, 14] instead of slots"),
    (case_uncommitted_count, True, "2: a count, not a set"),
    (case_discarded_zero, True, "0: nothing discarded"),
    (case_discarded_per_prompt, True, "4: one per prompt"),
    (case_race_report_out_buffer, True, "out0 instead of meta0"),
    (case_race_report_string_error, True, "string answer, str(error)"),
    (case_idle_share_percent_str, True, "'40%' string with a Timeline as trace"),
    (case_idle_sync_timeline_not_path, True, "device stage name, Timeline instead of path"),
    (case_abort_in_flight_stub_none, True, "None with race None"),
    (case_overshoot_bonus_counted, True, "4: drafts plus bonus"),
    (case_stale_mask_stub_unrun, True, "None with an unrun title_case engine"),
    (case_token_leak_wrong_shape, True, "dict without round, plain zos run"),
    (case_done_after_wait_all, True, "{0, 1, 2}: all"),
    (case_done_after_wait_stub_str, True, "None with waited a string"),
    (case_race_safe_given_as_racy, True, "a safe order as the racy answer"),
    (case_race_fixed_partial, True, "launch, read only"),
    (case_race_fixed_closed_device, True, "right order on a closed engine's device"),
]
