"""Issue 34, round thirty-one (a blind learner): three messages that named the wrong mistake.

a: exercise 04's loop rule counted a correction's tensor operations on one call for 3 requests
and one for 6. A right correction that caches ``torch.arange(B)`` by the batch size B (valid
for every call) made one more operation on each first call of a size, and was failed as "it
loops over requests (or tokens) in Python". Each size is now counted on a second call of that
size, with other seqlens_q (``correction_cases.same_shape_case``), once any cache is warm;
a real loop over requests is still caught. The second call's values are checked too: a wrong
correction that caches its token-to-request map by (batch size, token count), which the cases
never showed twice with other seqlens_q, now fails naming that call (it had passed once the
counts were taken warm, and got the loop's message before).
b: a correction with a call counter that stops correcting after its 10th call was told "it
needs the values on the host ... it changed none of the tensors in `meta`": no value was read;
it corrected the earlier calls and changed nothing on the later ones. It is now told so (state
kept between calls?), whether it stops before the loop rule's calls or on the run without values.
c: exercise 03, a ZOS loop that calls ``engine.schedule()`` once more at the first decode round
(a look-ahead whose plan it drops) was told round 1's step was never processed and its buffer
reused by round 3; the cause is round 2's plan, scheduled and never run. The race now names the
dropped plan between, as the same slip at a prefill is named. Since round 33 the engine refuses
round 1's plan, prepared after round 2's was planned: the loop is told it scheduled ahead.

Right answers pass: the cached-arange correction, one with a counter that corrects every call,
and a right ZOS loop."""

from __future__ import annotations

import torch

from mistakes import correction_loop_over_requests
from loops_for_tests import zos_loop as right_zos_loop
from overlap_course import checks


def _correct(meta, accepted, block_size, owner):
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    p = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, p // block_size] * block_size
                               + p % block_size)


def arange_cached():
    """Right: torch.arange(B) cached by the batch size, the map built on every call."""
    aranges = {}

    def correct_seqlens_qk(meta, accepted, block_size):
        B = len(meta["seqlens_q"])
        if B not in aranges:
            aranges[B] = torch.arange(B, device=meta["rows"].device)
        owner = torch.repeat_interleave(aranges[B], meta["seqlens_q"],
                                        output_size=len(meta["positions"]))
        _correct(meta, accepted, block_size, owner)
    return correct_seqlens_qk


def map_cached_by_shape():
    """Wrong: the token-to-request map cached by (B, T), stale for other seqlens_q."""
    maps = {}

    def correct_seqlens_qk(meta, accepted, block_size):
        B, T = len(meta["seqlens_q"]), len(meta["positions"])
        if (B, T) not in maps:
            maps[B, T] = torch.repeat_interleave(torch.arange(B, device=meta["seqlens_q"].device),
                                                 meta["seqlens_q"], output_size=T)
        _correct(meta, accepted, block_size, maps[B, T])
    return correct_seqlens_qk


def loop_with_cache():
    """Wrong: one Python iteration per request, its index tensors cached by the batch size."""
    owners = {}

    def correct_seqlens_qk(meta, accepted, block_size):
        B = len(meta["seqlens_q"])
        owner = torch.repeat_interleave(torch.arange(B, device=meta["seqlens_q"].device),
                                        meta["seqlens_q"],
                                        output_size=len(meta["positions"]))
        if B not in owners:
            owners[B] = [torch.tensor(b) for b in range(B)]
        for b in owners[B]:
            d = accepted[meta["rows"][b]] * meta["pending"][b]
            meta["seqlens_k"][b] += d
            meta["positions"] += d * (owner == b)
        p = meta["positions"]
        meta["slot_mapping"].copy_(meta["block_tables"][owner, p // block_size] * block_size
                                   + p % block_size)
    return correct_seqlens_qk


def counting(stops_after=None):
    """A call counter; wrong when it stops correcting after ``stops_after`` calls."""
    calls = [0]

    def correct_seqlens_qk(meta, accepted, block_size):
        calls[0] += 1
        if stops_after is not None and calls[0] > stops_after:
            return
        device = meta["seqlens_q"].device
        owner = torch.repeat_interleave(torch.arange(len(meta["seqlens_q"]), device=device),
                                        meta["seqlens_q"],
                                        output_size=len(meta["positions"]))
        _correct(meta, accepted, block_size, owner)
    return correct_seqlens_qk


def test_a_a_cached_arange_passes_and_loops_over_requests_are_still_caught():
    v = checks.check_correction(arange_cached())
    assert v.passed, v.message
    for loop in (correction_loop_over_requests, loop_with_cache()):
        v = checks.check_correction(loop)
        assert not v.passed and v.category == "python_loop", v
        assert "loops over requests" in v.message and "second call" in v.message, v.message


def test_a_a_map_cached_by_shape_fails_naming_the_call_that_differs():
    v = checks.check_correction(map_cached_by_shape())
    assert not v.passed and v.category == "cached", v
    assert "loops over" not in v.message, v.message
    assert "seqlens_q = [4, 2, 3]" in v.message and "[3, 3, 3]" in v.message, v.message
    assert "3 requests and 9 tokens" in v.message and "cached" in v.message, v.message


def test_b_a_counter_that_stops_correcting_is_told_so_not_a_host_read():
    for stops_after, when in ((10, "a later call"), (14, "its last two calls")):
        v = checks.check_correction(counting(stops_after))
        assert not v.passed and v.category == "stopped", (stops_after, v)
        assert "host" not in v.message and when in v.message, v.message
        assert "state between calls" in v.message, v.message
    v = checks.check_correction(counting())
    assert v.passed, v.message


def look_ahead_dropped(engine):
    """Wrong: one extra schedule() at the first decode round, its plan (round 2) never run."""
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        if not plan.is_prefill and previous is None:
            engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
            previous = None
        step = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(step)
        else:
            previous = step


def test_c_a_decode_plan_dropped_is_named_not_the_buffer_race_it_causes():
    v = checks.check_zos_loop(look_ahead_dropped)
    # Since round 33 the engine refuses round 1's plan, prepared after round 2's was planned
    # (PlannedSince): the loop stops there, and the look-ahead is what it is told.
    assert not v.passed and v.category == "scheduled_ahead", v
    assert v.message.startswith("round 1 (decode"), v.message
    assert "round 2's plan before it prepared round 1's" in v.message, v.message
    assert "one `engine.schedule()` per pass" in v.message and "buffer" not in v.message
    v = checks.check_zos_loop(right_zos_loop())
    assert v.passed, v.message
