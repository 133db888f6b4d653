"""Issue 34's ninth hostile round, helper `blind` (answers written from the notebooks only):
four false passes (04's correction guessing requests from positions, or formatting a tensor;
03's correction of the previous round's inputs; 02's loop capped at the rounds it saw), a right
answer refused (a Decimal idle fraction), 04(b)'s dict read by its keys only, and 05's short
commit blamed on num_inflight."""

from __future__ import annotations

from decimal import Decimal

import pytest
import torch

from overlap_course import checks


def _owner(meta):
    return torch.repeat_interleave(torch.arange(len(meta["rows"]), device=meta["seqlens_q"].device),
                                   meta["seqlens_q"],
                                   output_size=len(meta["positions"]))


def _correct(meta, accepted, block_size, owner):
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, pos // block_size] * block_size
                               + pos % block_size)


def from_position_breaks(meta, accepted, block_size):
    """Finds where a request starts from where positions stop rising by one: wrong when one
    request's positions run on from the previous one's."""
    pos = meta["positions"]
    starts = torch.ones_like(pos)
    starts[1:] = (pos[1:] != pos[:-1] + 1).long()
    _correct(meta, accepted, block_size, torch.cumsum(starts, 0) - 1)


def formats_a_tensor(meta, accepted, block_size):
    """Right values, but an f-string of a tensor: a device-to-host read on a GPU."""
    _debug = f"rows={meta['rows']}"  # noqa: F841 - the read is the point
    _correct(meta, accepted, block_size, _owner(meta))


def reprs_a_tensor(meta, accepted, block_size):
    repr(meta["pending"])
    _correct(meta, accepted, block_size, _owner(meta))


@pytest.mark.timeout(120)
def test_04_a_correction_that_guesses_requests_from_positions_fails():
    verdict = checks.check_correction(from_position_breaks)
    assert not verdict and verdict.category == "positions", (verdict.category, verdict.message)
    assert "run on" in verdict.message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fn", [formats_a_tensor, reprs_a_tensor], ids=["format", "repr"])
def test_04_formatting_a_tensor_is_a_host_read(fn):
    verdict = checks.check_correction(fn)
    assert not verdict and verdict.category == "host_read", (verdict.category, verdict.message)
    assert "printing or formatting" in verdict.message


@pytest.mark.timeout(60)
def test_04b_a_dict_is_read_by_its_true_false_values():
    right = {"input_ids": True, "positions": True, "slot_mapping": True, "seqlens_k": True,
             "seqlens_q": False, "cu_seqlens_q": False, "block_tables": False, "rows": False}
    assert checks.check_metadata_answer(right)
    wrong = {"input_ids": False, "positions": True, "slot_mapping": True, "seqlens_k": True}
    verdict = checks.check_metadata_answer(wrong)
    assert not verdict and verdict.category == "missing_field", verdict.message
    assert "input_ids" in verdict.message
    odd = checks.check_metadata_answer({"input_ids": "yes", "positions": 1})
    assert not odd and odd.category == "shape", odd.message


@pytest.mark.timeout(120)
def test_02_a_decimal_idle_fraction_is_a_number(small_serial_engine):
    def idle_fraction(timeline):
        idle = sum((Decimal(b) - Decimal(a) for a, b in timeline.device_gaps()), Decimal(0))
        return idle / (idle + Decimal(timeline.device_busy_ms()))

    verdict = checks.check_idle_fraction(idle_fraction, small_serial_engine)
    assert verdict, verdict.message


@pytest.mark.timeout(180)
def test_05_a_short_commit_is_named():
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        out = list(engine.read_outputs(step))[:-1]  # drops the last request's accepted count
        for req in engine.commit_outputs(step, out):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)

    verdict = checks.check_process_outputs(process_outputs)
    assert not verdict and verdict.category == "short_commit", (verdict.category, verdict.message)
    assert "2 of the round's 3 requests" in verdict.message


def corrects_previous_inputs(engine):
    previous = last_inputs = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(last_inputs)  # round N-1's inputs
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
            previous = None
        step = engine.launch_sample(inputs)
        last_inputs = inputs
        if plan.is_prefill:
            engine.process_outputs(step)
        else:
            previous = step


@pytest.mark.timeout(180)
def test_03_a_correction_given_the_previous_rounds_inputs_fails():
    verdict = checks.check_zos_loop(corrects_previous_inputs)
    assert not verdict and verdict.category == "correction", (verdict.category, verdict.message)
    assert "inputs after that round's forward and sample" in verdict.message


def capped_loop(engine):
    for _ in range(48):  # the rounds of the workload the notebook shows
        if not engine.scheduler.has_work():
            break
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


@pytest.mark.timeout(180)
def test_02_a_loop_capped_at_48_rounds_fails():
    verdict = checks.check_serial_loop(capped_loop)
    assert not verdict, verdict.message
    assert "in a longer run" in verdict.message
