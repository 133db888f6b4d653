"""The in-notebook checks (overlap_course/checks/lessonNN.py): every plausible wrong answer in the
corpus below is rejected with its mistake's category and a message that names it, every correct
way of writing the answer passes, and no learner input makes a check raise."""

import math

import numpy as np
import pytest
import torch

import toy_engine as te
from toy_engine import kernels
from overlap_course import checks
from overlap_course.checks import lesson00, lesson03
from overlap_course.measure.bench import ideal_ratio
from toy_engine.runinfo import RunStats
from toy_engine.timeline import Timeline

# Inputs a learner might type by accident; no check may raise on any of them.
JUNK = [None, "", "12", 3.5, True, [], [None], {"a": 1}, object(), float("nan"), torch.zeros(2, 2)]


def rejects(verdict, category, *phrases):
    assert not verdict.passed, verdict
    assert verdict.category == category, (category, verdict.category, verdict.message)
    for phrase in phrases:
        assert phrase in verdict.message, (phrase, verdict.message)
    return verdict


# ---- 00: which kernels are finished when wait(event 1) returns ------------------------

@pytest.mark.parametrize("answer", [{0, 1}, [1, 0], (0, 1), {np.int64(0), 1}, range(2), [0.0, 1.0]])
def test_done_after_wait_accepts(answer):
    assert checks.check_done_after_wait(answer).passed


@pytest.mark.parametrize("answer, category, phrase", [
    ({1}, "misses_earlier_kernel", "a kernel is missing"),
    (1, "shape", "does not say whether you mean kernel 1 or how many"),   # a bare number: an item or a count?
    (2, "shape", "does not say whether you mean kernel 2 or how many"),
    ({0}, "misses_earlier_kernel", "a kernel is missing"),
    ({0, 1, 2}, "includes_later_kernel", "kernel 2 was launched after event 1"),
    ({2}, "includes_later_kernel", "kernel 2 was launched after event 1"),
    ({1, 2}, "includes_later_kernel", "kernel 2 was launched after event 1"),
    (set(), "misses_earlier_kernel", "a kernel is missing"),
    ({0, 1, 3}, "no_such_kernel", "there is no kernel 3"),
    (["a"], "shape", "write a set of whole kernel numbers"),
    ({0, 1.9}, "shape", "write a set of whole kernel numbers"),
    ("01", "shape", "not the string '01'"),
])
def test_done_after_wait_rejects(answer, category, phrase):
    rejects(checks.check_done_after_wait(answer), category, phrase)


def test_done_after_wait_other_event():
    assert checks.check_done_after_wait({0, 1, 2}, waited=2).passed
    rejects(checks.check_done_after_wait({0, 1}, waited=0), "includes_later_kernel",
            "kernel 1 was launched after event 0")


# ---- 00: cause a race, then fix it (run on the real device) ---------------------------

@pytest.fixture(scope="module")
def device(engine_pool):
    return engine_pool(max_batch_size=1, num_kv_blocks=8).device


RACY = [
    ["launch", "read"],
    ["launch", "read", "record", "wait"],
    ["launch", "record", "read", "wait"],
    ["record", "launch", "wait", "read"],
    ["launch", "record", "read"],
    ["Launch", " READ "],
]
SAFE = [
    ["launch", "record", "wait", "read"],
    ("launch", "record", "wait", "read", "read"),
    ["record", "launch", "record", "wait", "read"],
    ["record", "wait", "launch", "record", "wait", "read"],
    ["launch", "record", "record", "wait", "read"],
]


@pytest.mark.parametrize("order", RACY)
def test_race_orders_race_and_are_not_fixes(order, device):
    v = checks.check_race(order, device)
    assert v.passed and "race on buffer 'out0'" in v.message, v
    rejects(checks.check_race_fixed(order, device), "still_races", "still a race")


@pytest.mark.parametrize("order", SAFE)
def test_safe_orders_are_fixes_and_no_race(order, device):
    assert checks.check_race_fixed(order, device).passed
    rejects(checks.check_race(order, device), "no_race", "no race")


@pytest.mark.parametrize("order, phrase", [
    (["launch", "read", "record", "wait"], "a read comes before the wait"),
    (["record", "launch", "wait", "read"], "recorded before the launch"),
    (["launch", "read"], "no event is recorded after the launch"),
    (["launch", "record", "read"], "did not wait on it"),
])
def test_fix_attempts_get_the_reason(order, phrase, device):
    rejects(checks.check_race_fixed(order, device), "still_races", phrase)


@pytest.mark.parametrize("order, category, phrase", [
    (["read", "launch", "record", "wait"], "read_before_launch", "before the launch"),
    (["launch", "wait", "read"], "wait_without_event", "\"record\" one before it"),
    (["launch", "launch", "record", "wait", "read"], "launch_count", "exactly once"),
    (["launch", "record", "wait"], "no_read", "never reads"),
    (["launch", "sync", "read"], "shape", "'sync' is not a step"),
    ("launch, wait, read", "shape", "list of steps"),
])
def test_race_order_mistakes(order, category, phrase, device):
    rejects(checks.check_race_fixed(order, device), category, phrase)


def test_read_before_launch_is_no_race(device):
    rejects(checks.check_race(["read", "launch", "record", "wait"], device), "read_before_launch", "no race",
            "before the launch")


def test_race_checks_need_the_race_checker(make_engine):
    quiet = make_engine(max_batch_size=1, num_kv_blocks=8, race_check=False)
    rejects(checks.check_race(["launch", "read"], quiet.device), "setup", "race_check=False")
    rejects(checks.check_race(["launch", "read"], "engine"), "setup", "engine.device")


def test_the_device_is_usable_after_the_checks(device):
    checks.check_race(["launch", "read"], device)
    device.launch(lesson00._write_answer, 7, round=0, stage="answer", writes={"out0"})
    device.wait(device.record_event())
    assert int(device.host("out0", "r")[0]) == 7
    device.spans()


# ---- 01: slot through the block table ---------------------------------------------------

TABLE, POS, BS = [0, 7, 11], 6, 4   # block index 1 = block 7, offset 2 -> slot 30


@pytest.mark.parametrize("answer", [30, np.int64(30), torch.tensor(30), torch.tensor([30])])
def test_slot_accepts(answer):
    assert checks.check_slot(answer, TABLE, POS, BS).passed


@pytest.mark.parametrize("answer, category, phrase", [
    (6, "position_as_slot", "position itself"),                 # pos
    (7, "block_number", "block's number"),                      # table[pos // bs]
    (28, "missing_offset", "block's first slot"),               # table[...] * bs
    (9, "offset_on_block_number", "multiply the block number"),  # table[...] + offset
    (45, "swapped_div_mod", "swapped // and %"),                # table[pos % bs] * bs + pos // bs
    (2, "wrong_block", "right offset, wrong block"),            # table[0] * bs + offset
    (46, "wrong_block", "right offset, wrong block"),           # table[2] * bs + offset
    (31, "wrong", "is not it"),                                 # off by one
    (29, "wrong", "is not it"),
])
def test_slot_rejects(answer, category, phrase):
    rejects(checks.check_slot(answer, TABLE, POS, BS), category, phrase)


def test_slot_position_equal_to_identity_mapping():
    # position 1 of a request owning block 0 first: identity and the real answer coincide
    assert checks.check_slot(1, [0, 5], 1, 4).passed
    rejects(checks.check_slot(5, [3, 9], 5, 4), "position_as_slot", "position itself")  # 5 // 4 = 1 -> block 9: slot 37
    assert checks.check_slot(37, [3, 9], 5, 4).passed


def test_the_notebooks_second_slot_sits_at_block_offset_0_so_an_off_by_one_fails():
    """Notebook 01's second request decodes at position 8 of blocks of 4: block index 2, offset 0.
    `(pos - 1) // bs` picks block index 1 there (slot 32, or 35 with `(pos - 1) % bs`)."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_tiny_gpt.ipynb")
                       .read_text())["cells"]
    call = ('checks.check_slot(second_slot, table=[3, 8, 6, 1], pos=8, block_size=4, '
            'name="second_slot")')
    assert any(call in "".join(c["source"]) for c in cells)
    table, pos, bs = [3, 8, 6, 1], 8, 4
    assert checks.check_slot(table[pos // bs] * bs + pos % bs, table, pos, bs).passed
    early = table[(pos - 1) // bs] * bs
    for off_by_one in (early + pos % bs, early + (pos - 1) % bs):
        assert not checks.check_slot(off_by_one, table, pos, bs).passed


# ---- 01: decode-round lengths -----------------------------------------------------------

PROMPT_LENGTHS = [9, 7, 3]


@pytest.mark.parametrize("q, k", [([1, 1, 1], [10, 8, 4]), ((1, 1, 1), torch.tensor([10, 8, 4])), ([1.0, 1, 1], [10.0, 8, 4]),
                                  (torch.ones(3, dtype=torch.long), [10, 8, 4])])
def test_decode_lengths_accept(q, k):
    assert checks.check_decode_lengths(q, k, PROMPT_LENGTHS).passed


@pytest.mark.parametrize("q, k, category, phrase", [
    ([9, 7, 3], [10, 8, 4], "prefill_lengths", "prefill's query lengths"),
    ([10, 8, 4], [10, 8, 4], "query_not_one", "exactly one token"),
    ([1, 1, 1], [9, 7, 3], "key_misses_new_token", "counts this round's token"),
    ([1, 1, 1], [1, 1, 1], "key_only_new_token", "whole past"),
    ([1, 1, 1], [11, 9, 5], "key_one_too_many", "one too many"),
    ([1, 1, 1], [10, 8, 5], "wrong", "its own cached past plus this round's token"),
    ([1, 1], [10, 8], "shape", "there are 3 requests"),
    ([1.5, 1, 1], [10, 8, 4], "shape", "whole numbers"),
    (1, 10, "shape", "whole numbers"),
])
def test_decode_lengths_reject(q, k, category, phrase):
    rejects(checks.check_decode_lengths(q, k, PROMPT_LENGTHS), category, phrase)


# ---- 02: the gap between two rounds -----------------------------------------------------

def synthetic_timeline():
    """Three serial rounds with known times: round r's device work, then a host gap."""
    tl = Timeline()
    t = 0.0
    for r in range(4):
        tl.add("host", "schedule", r, t, t + 0.05)
        tl.add("host", "prepare", r, t + 0.05, t + 0.20)
        tl.add("host", "launch_forward", r, t + 0.20, t + 0.22)
        tl.add("host", "launch_sample", r, t + 0.22, t + 0.24)
        dev0 = t + 0.25
        tl.add("device", "upload", r, dev0, dev0 + 0.02)
        tl.add("device", "forward", r, dev0 + 0.05, dev0 + 3.0)
        tl.add("device", "sample", r, dev0 + 3.0, dev0 + 3.3)
        tl.add("host", "wait", r, t + 0.24, dev0 + 3.32)
        tl.add("host", "postprocess", r, dev0 + 3.32, dev0 + 3.42)
        t = dev0 + 3.42
    return tl


def gap_before(tl, r):
    dev = tl.lane("device")
    return min(s.start_ms for s in dev if s.round == r) - max(s.end_ms for s in dev if s.round == r - 1)


@pytest.fixture(scope="module")
def real_run(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=4)
    engine.generate(["Once upon a time", "The fox", "Max"], max_new_tokens=12)
    return engine.timeline


def test_round_gap_accepts_synthetic_and_real(real_run):
    tl = synthetic_timeline()
    assert checks.check_round_gap(gap_before(tl, 2), tl, 2).passed
    assert checks.check_round_gap(np.float64(gap_before(tl, 2)), tl, 2).passed
    assert checks.check_round_gap(gap_before(real_run, 5), real_run, 5).passed
    # the way the notebook's own helper (and a learner using device_gaps) might get it
    dev = {(s.stage, s.round): s for s in real_run.lane("device")}
    assert checks.check_round_gap(dev[("upload", 5)].start_ms - dev[("sample", 4)].end_ms, real_run, 5).passed


def _round_gap_mistakes(tl, r=2):
    dev = {(s.stage, s.round): s for s in tl.lane("device")}
    host = {(s.stage, s.round): s for s in tl.lane("host")}
    right = gap_before(tl, r)
    return [
        (-right, "sign_flipped", "sign is flipped"),
        (right / 1e3, "seconds", "in seconds"),
        (gap_before(tl, r + 1) + 0.5, "wrong", "is not the gap"),
        (dev[("forward", r)].start_ms - dev[("upload", r)].end_ms, "inside_round", "inside round"),
        (dev[("forward", r)].start_ms - dev[("sample", r - 1)].end_ms, "up_to_forward",
         "upload is already device work"),
        (dev[("upload", r)].start_ms - host[("wait", r - 1)].end_ms, "host_lane", "end of the host's wait"),
        (dev[("upload", r)].start_ms - dev[("sample", r - 1)].start_ms, "from_sample_start", "start of round"),
        (dev[("upload", r)].start_ms - dev[("upload", r - 1)].start_ms, "start_to_start", "includes"),
        (right + 0.1, "wrong", "is not the gap"),
    ]


def test_round_gap_rejects_the_corpus():
    tl = synthetic_timeline()
    for value, category, phrase in _round_gap_mistakes(tl):
        rejects(checks.check_round_gap(value, tl, 2), category, phrase)


def test_round_gap_rejects_neighbouring_gaps_on_a_varied_timeline():
    # make the gaps differ so "the gap after" / "the gap before the previous" are recognisable
    tl = Timeline()
    t = 0.0
    for r, gap in enumerate([0.3, 0.5, 0.9, 1.4]):
        tl.add("device", "upload", r, t, t + 0.02)
        tl.add("device", "forward", r, t + 0.05, t + 3.0)
        tl.add("device", "sample", r, t + 3.0, t + 3.3)
        t += 3.3 + gap
    rejects(checks.check_round_gap(0.9, tl, 2), "wrong_round", "gap after round 2")
    rejects(checks.check_round_gap(0.3, tl, 2), "wrong_round", "gap before round 1")
    assert checks.check_round_gap(0.5, tl, 2).passed


def test_round_gap_on_the_real_run_rejects_its_mistakes(real_run):
    for value, category, phrase in _round_gap_mistakes(real_run, r=5):
        v = checks.check_round_gap(value, real_run, 5)
        assert not v.passed, (value, phrase, v)


def test_round_gap_bad_round():
    rejects(checks.check_round_gap(0.5, synthetic_timeline(), 9), "setup", "no rounds 8 and 9")


# ---- 02: largest host stage; overhead prediction -----------------------------------------

def test_largest_host_stage():
    tl = synthetic_timeline()  # prepare 0.15 ms per round is the largest
    assert checks.check_largest_host_stage("prepare", tl).passed
    assert checks.check_largest_host_stage(" prepare ", tl).passed
    assert checks.check_largest_host_stage("Prepare", tl).passed
    rejects(checks.check_largest_host_stage("wait", tl), "wait_is_not_work", "waiting is the host doing nothing")
    rejects(checks.check_largest_host_stage("launch_forward", tl), "launch_only_queues", "only queues work")
    rejects(checks.check_largest_host_stage("postprocess", tl), "wrong", "is not the stage with the most CPU")
    rejects(checks.check_largest_host_stage("schedule", tl), "wrong", "is not the stage with the most CPU")
    for other in ("wait", "launch_forward", "postprocess", "schedule"):  # a wrong try is not told the answer
        assert "prepare" not in checks.check_largest_host_stage(other, tl).message
    rejects(checks.check_largest_host_stage("forward", tl), "device_stage", "device stage")
    rejects(checks.check_largest_host_stage("flush", tl), "not_a_stage", "not a host stage of this run")
    rejects(checks.check_largest_host_stage(["prepare"], tl), "shape", "as a string")
    rejects(checks.check_largest_host_stage("prepare", Timeline()), "setup", "no host spans")


def contended_timeline():
    """Notebook 02's run as measured at load ~3 (issue 20): the host thread lost its core right
    after waking the device in launch_forward, so that stage has the longest wall time, while
    prepare still does most of the work (CPU time)."""
    tl = Timeline()
    t = 0.0
    for r in range(4):
        for stage, wall, cpu in (("schedule", 0.01, None), ("prepare", 0.28, 0.25), ("launch_forward", 0.40, 0.03),
                                 ("launch_sample", 0.03, 0.03), ("wait", 4.0, 0.1), ("postprocess", 0.07, 0.07)):
            tl.add("host", stage, r, t, t + wall, cpu_ms=cpu)
            t += wall
    return tl


def test_largest_host_stage_asks_for_cpu_time_so_contention_cannot_flip_it():
    tl = contended_timeline()
    v = checks.check_largest_host_stage("prepare", tl)
    assert v.passed, v
    assert "CPU" in v.message and "launch_forward" in v.message
    rejects(checks.check_largest_host_stage("launch_forward", tl), "wall_time", "by wall-clock time", "CPU time",
            "waiting for a core")
    cpu, wall = checks.host_cpu_ms_per_round(tl), checks.host_ms_per_round(tl)
    assert max(cpu, key=cpu.get) == "prepare" and max(wall, key=wall.get) == "launch_forward"
    assert cpu["schedule"] == pytest.approx(0.01)  # no CPU time recorded: its wall time, an upper bound


def test_largest_host_stage_on_a_real_run(real_run):
    per_round = checks.host_cpu_ms_per_round(real_run)
    largest = max(per_round, key=per_round.get)
    assert checks.check_largest_host_stage(largest, real_run).passed
    for other in set(per_round) - {largest}:
        assert not checks.check_largest_host_stage(other, real_run).passed


@pytest.mark.parametrize("answer", [5, 5.0, 4.8, np.float32(5.2)])
def test_overhead_gap_accepts(answer):
    assert checks.check_overhead_gap(answer).passed


@pytest.mark.parametrize("answer, category, phrase", [
    (0, "hidden_by_device", "cannot hide it"), (2.5, "partly_hidden", "any part of it hidden"),
    (10, "more_than_overhead", "more than the work added"), (-5, "negative", "cannot shorten"),
    (1, "partly_hidden", "any part of it hidden"), (5.5, "new_gap", "that is the new gap"),  # the old gap added
    (0.005, "seconds", "in seconds"),
    ("5", "shape", "a number"), (math.nan, "junk", "a finite number"), (math.inf, "junk", "a finite number")])
def test_overhead_gap_rejects(answer, category, phrase):
    rejects(checks.check_overhead_gap(answer), category, phrase)


# ---- 04: stale lengths -------------------------------------------------------------------

def test_true_key_length():
    assert checks.check_true_key_length(31, host_seqlens_k=27, accepted=4).passed
    assert checks.check_true_key_length(np.int64(31), host_seqlens_k=27, accepted=4).passed
    rejects(checks.check_true_key_length(27, 27, 4), "stale", "stale value")
    rejects(checks.check_true_key_length(32, 27, 4), "off_by_one", "one too many")
    rejects(checks.check_true_key_length(28, 27, 4), "plus_one", "number of accepted drafts")
    rejects(checks.check_true_key_length(23, 27, 4), "subtracted", "too short, not too long")
    rejects(checks.check_true_key_length(30, 27, 4), "wrong", "is not it")
    assert checks.check_true_key_length(31.0, 27, 4).passed  # a whole number written as a float is that number
    rejects(checks.check_true_key_length(31.5, 27, 4), "shape", "whole number")


WORKED = dict(positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4)


@pytest.mark.parametrize("answer", [[20, 21, 22], (20, 21, 22), torch.tensor([20, 21, 22]), range(20, 23),
                                    [20.0, 21, 22]])
def test_corrected_slots_accept(answer):
    assert checks.check_corrected_slots(answer, **WORKED).passed


def test_corrected_slots_match_the_engines_correction():
    meta, accepted, _ = checks.worked_case()
    kernels.correct_seqlens_qk(meta, accepted, 4)
    assert checks.check_corrected_slots(meta["slot_mapping"][6:9], **WORKED).passed
    assert checks.check_corrected_slots(meta["slot_mapping"][0:3], positions=[6, 7, 8], table=[3, 7, 1, 0],
                                          accepted=1, block_size=4).passed


@pytest.mark.parametrize("answer, category, phrase", [
    ([34, 35, 20], "stale", "stale slots"),
    ([36, 37, 22], "slots_shifted", "old slots is wrong"),
    ([12, 13, 14], "positions_not_slots", "corrected positions"),
    ([21, 22, 23], "off_by_one", "shifted by 1 + accepted"),
    ([35, 20, 21], "shifted_by_one", "shifted by 1"),
    ([20, 21], "shape", "give 3 slots"),
    ([20, 21, 23], "wrong", "is not it"),
    ([20.5, 21, 22], "shape", "whole numbers"),
])
def test_corrected_slots_reject(answer, category, phrase):
    rejects(checks.check_corrected_slots(answer, **WORKED), category, phrase)


def test_corrected_slots_accepted_one():
    # request 0 of the worked case: the one-accepted-draft case; +1 and 1+accepted coincide with other mistakes
    case = dict(positions=[6, 7, 8], table=[3, 7, 1, 0], accepted=1, block_size=4)
    assert checks.check_corrected_slots([31, 4, 5], **case).passed
    rejects(checks.check_corrected_slots([31, 32, 5], **case), "slots_shifted", "old slots is wrong")
    rejects(checks.check_corrected_slots([30, 31, 4], **case), "stale", "stale slots")


# ---- 03a: whose results the host processes under round r's forward ----------------------

def synthetic_zos_timeline(decode_rounds=4):
    """A ZOS run: prefill round 0 processed at once, decode rounds 1..n each processed in the
    next pass (after that pass's launch_forward), the last one flushed."""
    tl = Timeline()
    t = [0.0]

    def host(stage, r, ms=0.1, owner=None):
        tl.add("host", stage, r, t[0], t[0] + ms, owner)
        t[0] += ms

    for r in range(decode_rounds + 1):
        host("schedule", r)
        host("prepare", r)
        host("launch_forward", r)
        tl.add("device", "forward", r, t[0], t[0] + 3.0)
        if r >= 2:
            host("wait", r - 1, 0.5, r - 1)
            host("postprocess", r - 1, 0.1, r - 1)
        host("launch_sample", r)
        tl.add("device", "sample", r, t[0] + 3.0, t[0] + 3.3)
        if r == 0:
            host("wait", 0, 3.3, 0)
            host("postprocess", 0, 0.1, 0)
    host("schedule", decode_rounds + 1)
    host("flush", decode_rounds, 0.5, decode_rounds)
    return tl


@pytest.fixture(scope="module")
def zos_log_run(engine_pool):
    """The run of notebook 03a's log: three prompts, room for two, 4 new tokens."""
    engine = engine_pool(mode="zos", max_batch_size=2)
    engine.generate(["Once upon a time", "One day, the little", "There was a fox"], max_new_tokens=4)
    return engine.timeline


@pytest.mark.parametrize("answer", [2, np.int64(2), torch.tensor(2), "StepState(round=2)", " StepState(round=2) ",
                                    2.0, torch.tensor(2.0)])
def test_processed_under_accepts(answer):
    assert checks.check_processed_under(answer, synthetic_zos_timeline(), round=3).passed


@pytest.mark.parametrize("answer, category, phrase", [
    (3, "serial_order", "serial order"),
    ("StepState(round=3)", "serial_order", "serial order"),
    (4, "not_launched_yet", "not even launched"),
    (1, "earlier_round", "earlier pass"),
    (0, "earlier_round", "earlier pass"),
    (2.5, "shape", "one whole number"),
    ("2", "shape", "not '2'"),
    ("round 2", "shape", "not 'round 2'"),
    (torch.tensor(2.5), "shape", "one whole number"),
    (-1, "no_such_round", "there is no round -1"),
    ("StepState(round=-1)", "no_such_round", "there is no round -1"),
])
def test_processed_under_rejects(answer, category, phrase):
    rejects(checks.check_processed_under(answer, synthetic_zos_timeline(), round=3), category, phrase)


def test_processed_under_on_the_notebooks_run(zos_log_run):
    # rounds 0 and 4 are prefills processed at once; decode round r is processed under r + 1
    assert lesson03.rounds_processed_in_pass(zos_log_run, 2) == [1]
    assert lesson03.rounds_processed_in_pass(zos_log_run, 6) == [5]
    assert lesson03.rounds_processed_in_pass(zos_log_run, 1) == []
    assert checks.check_processed_under(1, zos_log_run, round=2).passed
    assert checks.check_processed_under(5, zos_log_run, round=6).passed
    rejects(checks.check_processed_under(2, zos_log_run, round=2), "serial_order", "serial order")
    rejects(checks.check_processed_under(0, zos_log_run, round=1), "setup", "processed nothing")


def test_processed_under_a_run_without_that_round():
    # an interrupted (or too short) run: name the missing round, not "was round N-1 a prefill"
    rejects(checks.check_processed_under(2, synthetic_zos_timeline(decode_rounds=1), round=3), "setup",
            "has no round 3", "0 to 1", "run the cell above to the end")
    rejects(checks.check_processed_under(2, Timeline(), round=3), "setup", "has no round 3", "none")


def test_processed_under_a_serial_run_processes_nothing_in_the_pass(real_run):
    rejects(checks.check_processed_under(4, real_run, round=5), "setup", "processed nothing")


# ---- 03a: tokens lost without the flush ---------------------------------------------------

def completions(lengths):
    return [te.Completion(i, "p", "x" * n, list(range(n)), "length") for i, n in enumerate(lengths)]


@pytest.mark.parametrize("answer", [1, np.int64(1), [1, 1], (1, 1), torch.tensor([1, 1]), torch.tensor(1),
                                    np.array([1, 1]), np.ones(2, dtype=np.int32), 1.0, [1.0, 1.0]])
def test_tokens_lost_accepts(answer):
    assert checks.check_tokens_lost(answer, completions([20, 20]), completions([19, 19])).passed


@pytest.mark.parametrize("answer, category, phrase", [
    (0, "nothing_lost", "still held in `previous`"),
    ([0, 0], "nothing_lost", "still held in `previous`"),
    (20, "all_lost", "only the last decode step"),
    ([20, 20], "all_lost", "only the last decode step"),
    (19, "tokens_kept", "how many tokens the requests kept"),
    (2, "total_not_per_request", "what the 2 requests lost together"),  # blind round 44
    (3, "more_than_one_step", "one decode step at a time"),
    ([2, 2], "more_than_one_step", "one decode step at a time"),
    (-1, "negative", "cannot gain tokens"),
    ([1, 1, 1], "shape", "give one number, or a list of 2"),
    ([1, 0], "wrong", "is not it"),
    (1.5, "shape", "whole number"),
    ("1", "shape", "whole number"),
])
def test_tokens_lost_rejects(answer, category, phrase):
    rejects(checks.check_tokens_lost(answer, completions([20, 20]), completions([19, 19])), category, phrase)


def test_tokens_lost_uses_the_runs_numbers():
    assert checks.check_tokens_lost([1, 2], completions([20, 12]), completions([19, 10])).passed
    rejects(checks.check_tokens_lost(1, completions([20, 12]), completions([19, 10])), "wrong", "is not it")
    rejects(checks.check_tokens_lost(1, [], []), "setup", "no completions")


# ---- 03a: does the swapped order keep the serial tokens? ---------------------------------

@pytest.mark.parametrize("answer", [(True, False), [True, False], (np.bool_(True), np.bool_(False)),
                                    (torch.tensor(True), torch.tensor(False)), (1, 0), [np.int64(1), 0]])
def test_swapped_order_accepts(answer):
    assert checks.check_swapped_order(answer, True, False).passed


@pytest.mark.parametrize("answer, category, phrase", [
    ((True, True), "constraint_unaffected", "mask is one token late"),
    ((False, False), "plain_changes", "reads only what is on the device"),
    ((False, True), "plain_changes", "reads only what is on the device"),
    ((2, 0), "shape", "True/False"),
    (("True", "False"), "shape", "True/False"),
    ([True], "shape", "True/False"),
    ((True, False, False), "shape", "True/False"),
    (True, "shape", "True/False"),
    ({"plain": True, "title_case": False}, "shape", "True/False"),
    ({True, False}, "shape", "a set has no order"),
    (frozenset({True, False}), "shape", "a set has no order"),
])
def test_swapped_order_rejects(answer, category, phrase):
    rejects(checks.check_swapped_order(answer, True, False), category, phrase)


def test_swapped_order_follows_the_measurement():
    # a set iterates as (False, True) whatever the learner meant: it must not pass where that is the truth
    rejects(checks.check_swapped_order({False, True}, False, True), "shape", "a set has no order")
    assert checks.check_swapped_order((True, True), True, True).passed
    rejects(checks.check_swapped_order((True, False), True, True), "against_measurement",
            "disagrees with your second value")
    rejects(checks.check_swapped_order((True, False), False, False), "against_measurement",
            "disagrees with your first value")


# ---- 03b: FROM_DEVICE placeholders and pending flags ---------------------------------------

ZOS_ROUND_2 = {"input_ids": [-1, -1, -1], "pending": [1, 1, 1]}
SERIAL_ROUND_2 = {"input_ids": [1, 40, 37], "pending": [0, 0, 0]}
MIXED = {"input_ids": [-1, 7, -1], "pending": [1, 0, 1]}  # request 1 was just prefilled


@pytest.mark.parametrize("ids, pending", [
    ([-1, -1, -1], [1, 1, 1]),
    ((kernels.FROM_DEVICE,) * 3, (1, 1, 1)),
    (torch.tensor([-1, -1, -1]), torch.tensor([1, 1, 1])),
    ([-1, -1, -1], [True, True, True]),
    (np.array([-1, -1, -1]).tolist(), torch.tensor([True, True, True])),
    (np.full(3, kernels.FROM_DEVICE), np.ones(3, dtype=int)),
    (np.array([-1, -1, -1]), np.array([True, True, True])),
    ([-1.0, -1.0, -1.0], np.full(3, 1.0)),
])
def test_future_inputs_accepts(ids, pending):
    assert checks.check_future_inputs(ids, pending, ZOS_ROUND_2, SERIAL_ROUND_2).passed


@pytest.mark.parametrize("ids, pending, category, phrase", [
    ([1, 40, 37], [1, 1, 1], "serial_ids", "serial run's ids"),
    ([1, 40, 37], [0, 0, 0], "serial_ids", "serial run's ids"),
    ([4, 1, 1], [1, 1, 1], "host_knows_token", "request 0: the host cannot know"),
    ([17, 20, 16], [1, 1, 1], "host_knows_token", "request 0: the host cannot know"),
    ([-1, 40, -1], [1, 1, 1], "host_knows_token", "request 1: the host cannot know"),
    ([-1, -1, -1], [0, 0, 0], "pending_unset", "pending = 1 marks"),
    ([-1, -1, -1], [1, 0, 1], "wrong", "is not it"),
    ([-1, -1], [1, 1], "shape", "give 3 input ids"),
    ([-1, -1, -1], [1, 1, 1, 1], "shape", "give 3 input ids"),
    ("-1, -1, -1", [1, 1, 1], "shape", "lists of whole numbers"),
    ([-1.5, -1.0, -1.0], [1, 1, 1], "shape", "lists of whole numbers"),
    (np.full(3, -1.5), [1, 1, 1], "shape", "lists of whole numbers"),
    (np.full((1, 3), -1), [1, 1, 1], "shape", "lists of whole numbers"),
])
def test_future_inputs_rejects(ids, pending, category, phrase):
    rejects(checks.check_future_inputs(ids, pending, ZOS_ROUND_2, SERIAL_ROUND_2), category, phrase)


def test_future_inputs_with_a_request_just_prefilled():
    assert checks.check_future_inputs([-1, 7, -1], [1, 0, 1], MIXED).passed
    rejects(checks.check_future_inputs([-1, -1, -1], [1, 0, 1], MIXED), "placeholder_for_known",
            "request 1: its previous round")
    rejects(checks.check_future_inputs([-1, 7, -1], [1, 1, 1], MIXED), "wrong", "is not it")
    rejects(checks.check_future_inputs([-1, 7, -1], [0, 1, 0], MIXED), "pending_inverted", "inverted")


def test_future_inputs_on_a_real_zos_round(engine_pool):
    engine = engine_pool(mode="zos", max_batch_size=4)
    captured, real_prepare = {}, engine.prepare_inputs

    def spy(plan):
        inputs = real_prepare(plan)
        if plan.round == 2:
            flat = engine.device.host(f"meta{inputs.slot}", "r")
            views = engine.layout.views(flat, inputs.num_tokens, len(plan.requests), inputs.num_blocks)
            captured.update({name: view.tolist() for name, view in views.items()})
        return inputs

    engine.prepare_inputs = spy
    try:
        engine.generate(["Once upon a time", "One day", "There was a fox"], max_new_tokens=8)
    finally:
        del engine.prepare_inputs
    assert checks.check_future_inputs([-1, -1, -1], [1, 1, 1], captured).passed


# ---- 03b: the ideal speed-up from the serial run's own times ------------------------------

def _stats(host_ms: float, device_ms: float, decode_idle: float, tokens_per_s: float) -> RunStats:
    """A run's stats with the numbers check_ideal_ratio reads; the rest plausible."""
    return RunStats(rounds=21, wall_ms=100.0, device_busy_ms=90.0, device_idle_fraction=decode_idle,
                    mean_host_ms_per_round=host_ms, mean_device_ms_per_round=device_ms, tokens=150,
                    tokens_per_s=tokens_per_s, prefill_rounds=1, decode_rounds=20,
                    decode_device_idle_fraction=decode_idle,
                    draft_tokens_proposed=0, draft_tokens_accepted=0, mean_accepted_per_round=0.0,
                    tokens_per_forward=7.0, discarded_outputs=0)


SERIAL_STATS = _stats(0.5, 4.5, 0.15, 1500.0)
ZOS_STATS = _stats(0.9, 4.6, 0.04, 1776.0)


@pytest.mark.parametrize("answer", [5.0 / 4.5, 1.11, 1.111, 1 + 0.5 / 4.5, np.float32(1.11), torch.tensor(1.11),
                                    np.float64(1.1111)])
def test_ideal_ratio_accepts(answer):
    assert checks.check_ideal_ratio(answer, SERIAL_STATS, ZOS_STATS).passed


@pytest.mark.parametrize("answer, category, phrase", [
    (10.0, "divides_by_smaller", "divide by the larger"),
    (0.9, "upside_down", "upside down"),
    (9.0, "device_over_host", "device over host"),
    (0.5 / 4.5, "gain", "the ratio minus 1"),  # here also host / device: the message names both
    (5.0, "serial_round_time", "serial round's time"),
    (1 / 0.85, "from_idle_fraction", "idle fraction"),
    (5.5 / 4.6, "zos_times", "ZOS run's times"),
    (1776 / 1500, "measured_speedup", "measured speed-up"),
    (1.3, "wrong", "is not it"),
    (1.0, "wrong", "is not it"),
    (1.25, "wrong", "mean_host_ms_per_round"),
    (-1.11, "wrong", "is not it"),
    (2, "wrong", "is not it"),
    ("1.11", "shape", "as a number"),
    (float("inf"), "junk", "finite"),
    (111.1, "percentage", "a percentage"),
    (111, "percentage", "a percentage"),
    (1.1, "one_decimal", "one decimal"),
])
def test_ideal_ratio_rejects(answer, category, phrase):
    rejects(checks.check_ideal_ratio(answer, SERIAL_STATS, ZOS_STATS), category, phrase)


def test_ideal_ratio_when_the_host_is_the_bottleneck():
    stats = _stats(4.0, 2.0, 0.15, 1500.0)
    assert "host" in checks.check_ideal_ratio(1.5, stats).message
    rejects(checks.check_ideal_ratio(3.0, stats), "divides_by_smaller", "divide by the larger")  # (h + d) / d
    rejects(checks.check_ideal_ratio(2.0, stats), "host_over_device", "host over device")
    rejects(checks.check_ideal_ratio(0.5, stats), "gain", "the ratio minus 1")


def test_ideal_ratio_matches_the_bench_formula():
    assert ideal_ratio(SERIAL_STATS.mean_host_ms_per_round,
                       SERIAL_STATS.mean_device_ms_per_round) == pytest.approx(5.0 / 4.5)


# ---- every check: unanswered stubs and junk never raise ---------------------------------

def all_checks(device):
    tl = synthetic_timeline()
    return {
        "done_after_wait": lambda a: checks.check_done_after_wait(a),
        "race": lambda a: checks.check_race(a, device),
        "race_fixed": lambda a: checks.check_race_fixed(a, device),
        "slot": lambda a: checks.check_slot(a, TABLE, POS, BS),
        "decode_q": lambda a: checks.check_decode_lengths(a, [10, 8, 4], PROMPT_LENGTHS),
        "decode_k": lambda a: checks.check_decode_lengths([1, 1, 1], a, PROMPT_LENGTHS),
        "round_gap": lambda a: checks.check_round_gap(a, tl, 2),
        "largest": lambda a: checks.check_largest_host_stage(a, tl),
        "overhead": lambda a: checks.check_overhead_gap(a),
        "true_k": lambda a: checks.check_true_key_length(a, 27, 4),
        "slots": lambda a: checks.check_corrected_slots(a, **WORKED),
        "processed_under": lambda a: checks.check_processed_under(a, synthetic_zos_timeline(), 3),
        "tokens_lost": lambda a: checks.check_tokens_lost(a, completions([20, 20]), completions([19, 19])),
        "swapped_order": lambda a: checks.check_swapped_order(a, True, False),
        "future_ids": lambda a: checks.check_future_inputs(a, [1, 1, 1], ZOS_ROUND_2, SERIAL_ROUND_2),
        "future_pending": lambda a: checks.check_future_inputs([-1, -1, -1], a, ZOS_ROUND_2, SERIAL_ROUND_2),
        "ideal_ratio": lambda a: checks.check_ideal_ratio(a, SERIAL_STATS, ZOS_STATS),
    }


def test_stubs_say_not_answered(device):
    for name, check in all_checks(device).items():
        v = check(None)
        assert isinstance(v, checks.Verdict) and v.category == "unanswered", name
        assert v.message.startswith("not answered yet"), (name, v.message)


def test_junk_never_raises_and_never_passes(device):
    for name, check in all_checks(device).items():
        for junk in JUNK:
            v = check(junk)
            assert not v.passed and v.message, (name, junk, v)


# ---- the contention meter notebook 00 reads ------------------------------------------

def test_machine_report_fields_notebook_00_reads():
    from overlap_course.measure import machine
    report = machine.machine_report()
    assert set(report) >= {"affinity", "cgroup_quota", "load_average", "usable", "live_overlap"}
    assert 0 <= report["usable"] <= report["affinity"]
    assert report["live_overlap"] == (report["usable"] >= report["needed"])
    assert isinstance(machine.usable_cpus(), float)


def test_machine_report_counts_other_load(monkeypatch):
    from overlap_course.measure import machine
    from toy_engine import device as engine_device
    monkeypatch.setattr(engine_device, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(machine, "_load_average", lambda: 1.0)   # our own kernel only
    assert machine.machine_report()["usable"] == 2.0 and machine.machine_report()["live_overlap"]
    monkeypatch.setattr(machine, "_load_average", lambda: 2.5)   # someone else uses 1.5 cores
    assert machine.machine_report()["usable"] == 0.5 and not machine.machine_report()["live_overlap"]
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: 1.0)   # a 1-CPU hub container: paced
    monkeypatch.setattr(machine, "_load_average", lambda: 0.2)
    report = machine.machine_report()
    assert report["usable"] == 1.0 and report["stand_in"] == "paced" and report["live_overlap"]


# ---- 05: ownership and lifetime -----------------------------------------------------------
# The checks judge the learner's run itself (the spy's record, the engine's stats, the
# RaceError it raised), so each corpus runs the notebook's scenario on a real engine first.

PROMPTS_05 = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]


def watch_launches(engine, prompt, max_new_tokens=6):
    """Notebook 05's spy: (round, committed, in flight, text) right after each launched forward."""
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


@pytest.fixture(scope="module")
def launches(engine_pool):
    return {mode: watch_launches(engine_pool(mode=mode, max_batch_size=4), "Once upon a time")
            for mode in ("serial", "zos")}


@pytest.mark.parametrize("answer", [{3, 4}, [4, 3], (3, 4), frozenset({3, 4}), range(3, 5),
                                    torch.tensor([3, 4]), {np.int64(3), 4}, np.array([3, 4]), [3.0, 4],
                                    {"StepState(round=3)", 4}])
def test_uncommitted_accepts(answer, launches):
    assert checks.check_uncommitted_rounds(answer, launches["zos"], round=4).passed


def test_uncommitted_judges_the_record(launches):
    # the record itself says how many rounds were in flight: two under ZOS from round 2 on, one in serial
    for r in range(2, 6):
        assert checks.check_uncommitted_rounds({r - 1, r}, launches["zos"], round=r).passed
        assert checks.check_uncommitted_rounds({r}, launches["serial"], round=r).passed
        assert checks.check_uncommitted_rounds([r], launches["serial"], round=r).passed
        rejects(checks.check_uncommitted_rounds({r}, launches["zos"], round=r), "misses_in_flight",
                "a launched round is missing")
        rejects(checks.check_uncommitted_rounds({r - 1, r}, launches["serial"], round=r), "already_processed",
                "already processed")
    # round 1 follows the prefill, which was processed at once: only round 1 is in flight
    assert checks.check_uncommitted_rounds({1}, launches["zos"], round=1).passed
    # a hand-made record of the same shape (3-tuples are enough)
    assert checks.check_uncommitted_rounds({6, 7}, [(7, 5, 2)], round=7).passed


@pytest.mark.parametrize("answer, category, phrase", [
    ({4}, "misses_in_flight", "a launched round is missing"),         # the serial answer
    (4, "shape", "does not say whether you mean round 4 or how many"),
    ({3}, "misses_current_round", "round 4 itself counts"),           # only the one whose token is on the device
    (2, "shape", "does not say whether you mean round 2 or how many"),  # a count, not rounds
    (set(), "misses_current_round", "round 4 itself counts"),
    ({2, 3}, "misses_current_round", "round 4 itself counts"),
    ({2, 3, 4}, "already_processed", "round 2 is already processed"),  # one round too many
    ({0, 1, 2, 3, 4}, "already_processed", "already processed"),       # every launched round
    ({1, 4}, "misses_in_flight", "a launched round is missing"),
    ({3, 4, 5}, "not_launched_yet", "round 5 was not launched yet"),
    ({5}, "not_launched_yet", "round 5 was not launched yet"),
    ({-1, 4}, "no_such_round", "there is no round -1"),
    ([3.5, 4], "shape", "whole round numbers"),
    ("3, 4", "shape", "whole round numbers"),
])
def test_uncommitted_rejects(answer, category, phrase, launches):
    rejects(checks.check_uncommitted_rounds(answer, launches["zos"], round=4), category, phrase)


def test_uncommitted_bad_record(launches):
    rejects(checks.check_uncommitted_rounds({3, 4}, launches["zos"], round=9), "setup", "no launch of round 9")
    rejects(checks.check_uncommitted_rounds({3, 4}, "record", round=4), "setup", "record of watch_launches")
    rejects(checks.check_uncommitted_rounds({3, 4}, [(4, None)], round=4), "setup", "record of watch_launches")


def abort_before(round_no, prompt=1):
    def on_round(engine, round):
        if round == round_no:
            engine.abort(engine.requests[prompt].id)
    return on_round


# (mode, generate kwargs, the right count, wrong answers with their category and a phrase of their message)
DISCARD_SCENARIOS = {
    "zos, stop": ("zos", dict(max_new_tokens=24, stop=[" the"]), 1,
                  [(0, "missed_extra_step", "under ZOS the host learns"), (2, "too_many", "too many"),
                   (4, "too_many", "too many"), (3, "too_many", "too many")]),
    "serial, stop": ("serial", dict(max_new_tokens=24, stop=[" the"]), 0,
                     [(1, "serial_discards_nothing", "serial host waits"),
                      (4, "serial_discards_nothing", "serial host waits")]),
    "zos, abort before round 5": ("zos", dict(max_new_tokens=24, on_round=abort_before(5)), 1,
                                  [(0, "missed_abort_round", "an abort takes effect at once"),
                                   (2, "too_many", "too many"), (4, "too_many", "too many")]),
    "zos, abort before round 1": ("zos", dict(max_new_tokens=24, on_round=abort_before(1)), 0,
                                  [(1, "nothing_discarded", "which launched round could still hold"),
                                   (2, "nothing_discarded", "which launched round could still hold")]),
    "zos, length only": ("zos", dict(max_new_tokens=24), 0,
                         [(4, "nothing_discarded", "length limit is counted in advance"),
                          (1, "nothing_discarded", "which launched round could still hold")]),
}


@pytest.mark.parametrize("scenario", DISCARD_SCENARIOS)
def test_discarded_judges_the_run(scenario, engine_pool):
    mode, kw, want, wrong = DISCARD_SCENARIOS[scenario]
    engine = engine_pool(mode=mode, max_batch_size=4)
    engine.generate(PROMPTS_05, **kw)
    assert engine.stats.discarded_outputs == want, "the scenario's count changed: update the corpus"
    for right in (want, np.int64(want), torch.tensor(want)):
        assert checks.check_discarded(right, engine).passed, right
    for value, category, phrase in wrong:
        rejects(checks.check_discarded(value, engine), category, phrase)
    assert checks.check_discarded(float(want), engine).passed  # a whole number written as a float
    for value, category, phrase in [(-1, "negative", "cannot be negative"), (want + 0.5, "shape", "whole number"),
                                    (str(want), "shape", "whole number")]:
        rejects(checks.check_discarded(value, engine), category, phrase)
    for value, _, _ in wrong:  # a wrong try is told where to look, not the count
        assert f"discarded {want}" not in checks.check_discarded(value, engine).message


def test_length_limit_extra_step_only_with_drafts(engine_pool):
    """Notebook 05's claim: without drafts a length limit never causes an extra step; with drafts it can."""
    from overlap_course.measure.bench import default_workload
    workload = default_workload(8)
    for max_new in (5, 24, 48):
        plain = engine_pool(mode="zos", max_batch_size=8)
        plain.generate(workload, max_new_tokens=max_new)
        assert plain.stats.discarded_outputs == 0, max_new
    spec = engine_pool(mode="zos", max_batch_size=8, num_draft_tokens=4)
    spec.generate(workload, max_new_tokens=48)
    discarded = spec.stats.discarded_outputs
    assert discarded > 0
    assert checks.check_discarded(discarded, spec).passed
    rejects(checks.check_discarded(0, spec), "missed_extra_step", "under ZOS")
    rejects(checks.check_discarded(discarded + 1, spec), "wrong", "is not it")


def test_discarded_needs_an_engine():
    rejects(checks.check_discarded(1, "engine"), "setup", "pass the engine")
    rejects(checks.check_discarded(1, None), "setup", "pass the engine")
    assert checks.check_discarded(None, None, name="discarded_by_abort").message.startswith(
        "not answered yet: set `discarded_by_abort`")


@pytest.fixture(scope="module")
def single_buffer_race(engine_pool):
    """The RaceError of notebook 05's single-buffered ZOS run (and the serial one raises none)."""
    zos, serial = engine_pool(mode="zos", max_batch_size=4), engine_pool(mode="serial", max_batch_size=4)
    old = te.engine.NUM_SLOTS
    te.engine.NUM_SLOTS = 1
    try:
        serial.generate(PROMPTS_05, max_new_tokens=8)
        with pytest.raises(te.RaceError) as info:
            zos.generate(PROMPTS_05, max_new_tokens=8)
    finally:
        te.engine.NUM_SLOTS = old
    return info.value


@pytest.mark.parametrize("answer", [("meta0", 1), ["meta0", 1], (" 'meta0' ", 1), {"buffer": "meta0", "round": 1},
                                    ("meta0", np.int64(1)), ("Meta0", 1), ("META0 ", 1), ("meta0", torch.tensor(1)),
                                    ("meta0", 1.0), ("meta0", "StepState(round=1)"), ("meta0", torch.tensor(1.0))])
def test_race_report_accepts(answer, single_buffer_race):
    err = single_buffer_race
    assert (err.buffer, err.round) == ("meta0", 1), "the run's race changed: update the corpus"
    v = checks.check_race_report(answer, err)
    assert v.passed and str(err) in v.message, v


@pytest.mark.parametrize("answer, category, phrase", [
    (("meta0", 2), "writing_round", "round 2 is the round whose prepare writes meta0"),  # the writer, not the launch
    (("meta0", 0), "earlier_round", "round 0 was waited for"),                           # the prefill
    (("meta1", 1), "wrong_slot", "which slot does every round use"),                     # two-slot thinking
    (("meta1", 2), "wrong_slot", "which slot does every round use"),
    (("out0", 1), "wrong_buffer", "only after waiting"),                                 # the output slot
    (("out0", 2), "wrong_buffer", "only after waiting"),
    (("out1", 1), "wrong_buffer", "only after waiting"),
    (("temps0", 1), "wrong_buffer", "which buffer does prepare write first"),
    (("upload", 1), "wrong_buffer", "which buffer does prepare write first"),  # the launch's stage, not a buffer
    (("meta0", 5), "wrong", "is not it"),
    (("meta0", 3), "wrong", "is not it"),
    ("meta0", "shape", "a pair"),
    (("meta0", 1, "upload"), "shape", "a pair"),
    (("meta0", "1"), "shape", "round as a whole number"),
    ((1, "meta0"), "shape", "round as a whole number"),
    (("meta0", 1.5), "shape", "round as a whole number"),
    (("meta0", -1), "no_such_round", "there is no round -1"),
    ({"buffer": "meta0"}, "shape", "round as a whole number"),
    ({}, "shape", "not {}"),
    (("Meta1", 1), "wrong_slot", "which slot does every round use"),
    (("meta0", torch.tensor(1.5)), "shape", "round as a whole number"),
])
def test_race_report_rejects(answer, category, phrase, single_buffer_race):
    rejects(checks.check_race_report(answer, single_buffer_race), category, phrase)


def test_race_report_needs_the_buffer_race():
    from types import SimpleNamespace
    rejects(checks.check_race_report(("meta0", 1), None), "setup", "raised no buffer race")
    early_free = SimpleNamespace(kind="free_in_use", buffer=None, round=5, launch="forward")
    rejects(checks.check_race_report(("meta0", 1), early_free), "setup", "raised no buffer race")
    rejects(checks.check_race_report(("meta0", 1), "RaceError"), "setup", "raised no buffer race")


def test_05_stubs_and_junk_never_raise(launches, engine_pool, single_buffer_race):
    engine = engine_pool(mode="zos", max_batch_size=4)
    engine.generate(PROMPTS_05, max_new_tokens=24, stop=[" the"])
    cases = {
        "uncommitted": lambda a: checks.check_uncommitted_rounds(a, launches["zos"], round=4),
        "discarded": lambda a: checks.check_discarded(a, engine),
        "race_report": lambda a: checks.check_race_report(a, single_buffer_race),
    }
    for name, check in cases.items():
        v = check(None)
        assert isinstance(v, checks.Verdict) and v.category == "unanswered", name
        assert v.message.startswith("not answered yet"), (name, v.message)
        for junk in JUNK + [math.inf, -3, (None, None), {"buffer": 1, "round": "x"}]:
            v = check(junk)
            assert not v.passed and v.message, (name, junk, v)


# ---- every check: one way of reading an answer (issue 20 "answers", issue 21 item 5) -------
# A number may come as a plain number, a numpy scalar, a 0-d or one-element tensor or array,
# or a list/tuple holding one number; every check that asks for a number reads all of them
# the same way.  Junk (huge, infinite, nan, enormous lists) gets a sentence, never a traceback,
# and no message grows with the answer.

def _fake_run(discarded=1):
    """What check_discarded reads off an engine, without a device: a ZOS run with one stop."""
    from types import SimpleNamespace
    return SimpleNamespace(stats=SimpleNamespace(discarded_outputs=discarded),
                           config=SimpleNamespace(mode="zos", num_draft_tokens=0),
                           requests=[SimpleNamespace(finish_reason=r) for r in ("stop", "length", "length")])


ONE_ROUND_LAUNCHES = [(0, 0, 1, ""), (1, 1, 1, ",")]  # round 1's forward: only round 1 in flight
FAKE_RACE = None


def _fake_race():
    from types import SimpleNamespace
    return SimpleNamespace(kind="buffer", buffer="meta0", round=1, launch="upload",
                           __str__=lambda self: "race on buffer 'meta0'")


def number_checks():
    """Each check that asks for one number: (check, its right answer)."""
    tl = synthetic_timeline()
    return {
        "slot": (lambda a: checks.check_slot(a, TABLE, POS, BS), 30),
        "round_gap": (lambda a: checks.check_round_gap(a, tl, 2), gap_before(tl, 2)),
        "overhead": (lambda a: checks.check_overhead_gap(a), 5.0),
        "processed_under": (lambda a: checks.check_processed_under(a, synthetic_zos_timeline(), 3), 2),
        "tokens_lost": (lambda a: checks.check_tokens_lost(a, completions([20, 20]), completions([19, 19])), 1),
        "ideal_ratio": (lambda a: checks.check_ideal_ratio(a, SERIAL_STATS, ZOS_STATS), 1.11),
        "true_k": (lambda a: checks.check_true_key_length(a, 27, 4), 31),
        "discarded": (lambda a: checks.check_discarded(a, _fake_run(1)), 1),
    }


def _forms(x):
    dtype = torch.float64 if isinstance(x, float) else torch.long
    return [x, [x], (x,), torch.tensor(x, dtype=dtype), torch.tensor([x], dtype=dtype), np.array(x),
            np.array([x]), np.float64(x) if isinstance(x, float) else np.int64(x)]


@pytest.mark.parametrize("name", list(number_checks()))
def test_every_number_check_reads_every_form_of_one_number(name):
    check, right = number_checks()[name]
    for form in _forms(right):
        v = check(form)
        assert v.passed, (name, form, v.message)


def test_a_set_question_reads_every_collection_and_refuses_a_bare_number():
    # where a set is asked, [x], (x,), tensor([x]) and np.array([x]) are one-item sets; x alone could be a count
    for check, x in ((lambda a: checks.check_done_after_wait(a, waited=0), 0),
                     (lambda a: checks.check_uncommitted_rounds(a, ONE_ROUND_LAUNCHES, round=1), 1)):
        for form in _forms(x):
            v = check(form)
            collection = getattr(form, "ndim", None) == 1 or isinstance(form, (list, tuple))
            assert v.passed if collection else v.category == "shape" and "how many" in v.message, (form, v)


def test_a_one_element_list_is_refused_with_the_same_reason_as_the_number():
    # [37] and tensor([37]) and 37 get the same verdict wherever a number is asked
    wrong = {"slot": 31, "true_k": 30, "discarded": 3, "overhead": 2.5, "ideal_ratio": 1.3, "processed_under": 1}
    for name, value in wrong.items():
        check = number_checks()[name][0]
        plain = check(value).message
        for form in _forms(value)[1:]:
            v = check(form)
            assert not v.passed and v.message == plain, (name, form, v.message, plain)


JUNK_NUMBERS = [10**400, -10**400, 10**5000, [10**400], (10**400,), float("inf"), -math.inf, math.nan, np.nan,
                np.float64("inf"), torch.tensor(float("nan")), torch.tensor([math.inf]), np.array(math.nan),
                1e308 * 10, [math.nan], list(range(100_000)), [10**400] * 3, "9" * 100_000, b"\x00" * 10,
                [[1] * 1000] * 1000, {10**400}, {"buffer": "meta0" * 10_000, "round": 10**400},
                ("meta0", 10**400), ("meta0" * 100_000, 1), ["launch"] * 100_000, [10**5000, "read"],
                torch.zeros(1000, 1000), np.zeros((3, 3))]


def all_checks_05():
    return {
        "uncommitted": lambda a: checks.check_uncommitted_rounds(a, ONE_ROUND_LAUNCHES, round=1),
        "discarded": lambda a: checks.check_discarded(a, _fake_run(1)),
        "race_report": lambda a: checks.check_race_report(a, _fake_race()),
    }


MAX_MESSAGE = 800


def test_junk_numbers_get_a_sentence_never_a_traceback(device):
    for name, check in {**all_checks(device), **all_checks_05()}.items():
        for junk in JUNK_NUMBERS:
            try:
                v = check(junk)
            except Exception as err:  # noqa: BLE001 -- the point of the test
                pytest.fail(f"{name}({type(junk).__name__} {str(junk)[:40]}...) raised {type(err).__name__}: "
                            f"{str(err)[:200]}")
            assert not v.passed and v.message, (name, junk, v)
            assert len(v.message) <= MAX_MESSAGE, (name, len(v.message), v.message[:200])


@pytest.mark.parametrize("junk, phrase", [(10**400, "far outside"), ([10**400], "far outside"),
                                          (math.nan, "finite"), (math.inf, "finite"),
                                          (torch.tensor(float("nan")), "finite")],
                         ids=["10**400", "[10**400]", "nan", "inf", "tensor(nan)"])
def test_junk_numbers_are_named(junk, phrase):
    tl = synthetic_timeline()
    for v in (checks.check_round_gap(junk, tl, 2), checks.check_slot(junk, TABLE, POS, BS),
              checks.check_true_key_length(junk, 27, 4), checks.check_ideal_ratio(junk, SERIAL_STATS)):
        rejects(v, "junk", phrase)


def _timeline_with_gap(gap, gap_before_round_1=0.9):
    tl = Timeline()
    t = 0.0
    for r in range(3):
        tl.add("device", "upload", r, t, t + 0.02)
        tl.add("device", "forward", r, t + 0.05, t + 3.0)
        tl.add("device", "sample", r, t + 3.0, t + 3.3)
        t += 3.3 + (gap if r == 1 else gap_before_round_1)
    return tl


def test_an_answer_within_the_rule_passes_where_the_round_before_has_a_gap_as_near():
    """A run had 0.8204 ms before round 9 and 0.8234 ms before round 10: 0.82, the gap before
    round 10 to two decimals, is within the rule, and was called the gap before round 9."""
    tl = _timeline_with_gap(0.8234, gap_before_round_1=0.8204)
    verdict = checks.check_round_gap(0.82, tl, 2)
    assert verdict.passed and "within 0.005 ms" in verdict.message, verdict.message
    neighbour = checks.check_round_gap(0.8204, tl, 2)  # to more digits: that other gap, named
    assert neighbour.category == "wrong_round", neighbour.message
    wrong = checks.check_round_gap(0.7, _timeline_with_gap(0.8234, gap_before_round_1=0.7), 2)
    assert wrong.category == "wrong_round", wrong.message  # outside the rule: still named


def test_round_gap_read_to_the_hovers_rounding_gets_a_close_hint():
    tl = _timeline_with_gap(1.366)
    assert checks.check_round_gap(1.366, tl, 2).passed
    for near in (1.37, np.float32(1.37), [1.37], torch.tensor(1.37), 1.369):  # within 0.005 ms
        verdict = checks.check_round_gap(near, tl, 2)
        assert verdict.passed and "close" in verdict.message, verdict
    for near in (1.36, 1.4, 1.0):  # cut or rounded past the rule (two decimals: within 0.005 ms)
        rejects(checks.check_round_gap(near, tl, 2), "too_few_digits", "close", "more digits")
    rejects(checks.check_round_gap(1.5, tl, 2), "wrong", "is not the gap")


def _notebook_function(notebook, name):
    """A function defined in a stored notebook's code cells, with the functions the notebook
    defines beside it (a cell may use a function an earlier cell defined)."""
    import json as _json
    from pathlib import Path

    cells = _json.loads((Path(__file__).resolve().parent.parent / "notebooks" / notebook).read_text())["cells"]
    scope = {"te": te}
    for cell in cells:
        if cell["cell_type"] == "code":
            for block in "".join(cell["source"]).split("\n\n\n"):
                if block.startswith("def "):
                    exec(block, scope)  # noqa: S102 -- the course's own notebook code
    if name not in scope:
        raise AssertionError(f"{notebook} defines no {name}: its claim is not demonstrated by a run")
    return scope[name]


def test_05_early_free_claim_is_what_a_run_shows():
    """Notebook 05 says what an early free does in this toy: the freed blocks go to a waiting
    request before the host waited on the extra round, and on one in-order stream no token
    changes.  The notebook's own function demonstrates it (issue 20: the old text claimed a
    corruption that never happens)."""
    from overlap_course.measure.bench import default_workload

    run = _notebook_function("05_ownership.ipynb", "checker_off_early_free")
    safe, buggy, early, handed = run(default_workload(16), max_new_tokens=24, stop=[" the", "."])
    assert len(early) > 0 and len(handed) > 0
    assert [c.token_ids for c in buggy] == [c.token_ids for c in safe]
