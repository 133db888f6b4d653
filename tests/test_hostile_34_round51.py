"""Issue 34, round fifty-one: the engine's own correction handed in as exercise 04(a)'s answer
(the text says "you write the on-device fix"; ruled now, as for the loops of 02 and 03), the
host-tensor rule's gaps (a host tensor copied, computed from, made from NumPy, made when the
cell ran, cached by the batch size, copied to the device), a `.to(x.device)` read as a host
read, and the blind round's findings: another round's exact gap passing as the asked one's, and
five messages that named the wrong thing."""

import functools
import inspect
import types

import numpy as np
import pytest
import torch

import toy_engine as te
from overlap_course import checks
from toy_engine import kernels

from mistakes import correction

_HOST_ARANGE = torch.arange(4096)  # made when the cell ran, on the host


def _correction(make_rows):
    """The solution's correction with the per-request index 0..B-1 made by ``make_rows``."""
    def correct_seqlens_qk(meta, accepted, block_size):
        delta = accepted[meta["rows"]] * meta["pending"]
        owner = torch.repeat_interleave(make_rows(len(delta), delta), meta["seqlens_q"],
                                        output_size=len(meta["positions"]))
        meta["seqlens_k"] += delta
        meta["positions"] += delta[owner]
        block = meta["block_tables"][owner, meta["positions"] // block_size]
        meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)
    return correct_seqlens_qk


def _engine_fix(fn) -> None:
    verdict = checks.check_correction(fn)
    assert not verdict and verdict.category == "engine_fix", verdict
    assert "te.kernels.correct_seqlens_qk" in verdict.message, verdict


# -- serious: the engine's own correction got full marks (the text: "you write the fix") --

def test_the_engines_correction_handed_in_or_called_is_refused():
    _engine_fix(kernels.correct_seqlens_qk)

    def mine(meta, accepted, block_size):
        te.kernels.correct_seqlens_qk(meta, accepted, block_size)
    _engine_fix(mine)


def test_the_engines_correction_copied_rebuilt_or_hidden_is_refused():
    code = kernels.correct_seqlens_qk.__code__
    _engine_fix(types.FunctionType(code.replace(co_name="mine"), vars(kernels)))
    whole = {**vars(kernels)}
    exec(compile(inspect.getsource(kernels.correct_seqlens_qk), "<cell>", "exec"), whole)
    _engine_fix(whole["correct_seqlens_qk"])  # pasted whole, docstring and all

    def hidden(meta, accepted, block_size):
        with torch._C.DisableTorchFunction():
            kernels.correct_seqlens_qk(meta, accepted, block_size)
    _engine_fix(hidden)


def test_a_copy_with_its_own_docstring_is_new_code_and_passes():
    source = inspect.getsource(kernels.correct_seqlens_qk).replace('"""Fix', '"""My fix', 1)
    names = {**vars(kernels)}
    exec(compile(source, "<cell>", "exec"), names)
    assert checks.check_correction(names["correct_seqlens_qk"])


def test_a_mistake_of_its_own_is_named_before_the_handing_over():
    def plus_one(meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)
        meta["seqlens_k"] += 1
    verdict = checks.check_correction(plus_one)
    assert not verdict and verdict.category not in ("engine_fix", "passed"), verdict


# -- serious: host tensors the rule did not see (each an error on a GPU) --

@pytest.mark.parametrize("make_rows", [
    lambda B, d: torch.arange(B).clone(),
    lambda B, d: torch.arange(B) + 0,
    lambda B, d: torch.from_numpy(np.arange(B)),
    lambda B, d: _HOST_ARANGE[:B],
], ids=["clone", "plus-zero", "from-numpy", "made-when-the-cell-ran"])
def test_a_host_tensor_mixed_with_the_metadata_is_named(make_rows):
    verdict = checks.check_correction(_correction(make_rows))
    assert not verdict and verdict.category == "host_tensor", verdict
    assert "mixes a tensor it made on the host" in verdict.message, verdict


def test_a_host_tensor_as_a_default_argument_is_named():
    def rows(B, d, ar=torch.arange(4096)):
        return ar[:B]
    verdict = checks.check_correction(_correction(rows))
    assert not verdict and verdict.category == "host_tensor", verdict


def test_a_stack_of_host_scalars_is_refused():
    verdict = checks.check_correction(_correction(
        lambda B, d: torch.stack([torch.tensor(i) for i in range(B)])))
    assert not verdict and verdict.category in ("host_tensor", "python_loop"), verdict


def test_a_cache_of_host_aranges_by_batch_size_is_named_and_one_on_the_device_passes():
    @functools.lru_cache(maxsize=None)
    def host_rows(B):
        return torch.arange(B)
    verdict = checks.check_correction(_correction(lambda B, d: host_rows(B)))
    assert not verdict and verdict.category == "host_tensor", verdict

    @functools.lru_cache(maxsize=None)
    def device_rows(B, device):
        return torch.arange(B, device=device)
    assert checks.check_correction(_correction(lambda B, d: device_rows(B, d.device)))


def test_a_host_tensor_copied_to_the_device_is_named_as_a_copy():
    verdict = checks.check_correction(_correction(lambda B, d: torch.arange(B).to(d.device)))
    assert not verdict and verdict.category == "host_tensor", verdict
    assert "copies a tensor it made on the host" in verdict.message, verdict
    assert "`.to('cpu')`" not in verdict.message, verdict


# -- medium: a right `.to(x.device)` was told it read values on the host --

def test_to_the_inputs_device_is_not_a_host_read():
    right = _correction(lambda B, d: torch.arange(B, device=d.device).to(device=d.device,
                                                                        dtype=torch.long))
    assert checks.check_correction(right)


def test_a_copy_to_the_host_by_a_device_object_is_still_a_host_read():
    verdict = checks.check_correction(_correction(
        lambda B, d: torch.arange(B, device=d.device).to(torch.device("cpu"))))
    assert not verdict and verdict.category == "host_read", verdict
    assert "copies a tensor's values to the host" in verdict.message, verdict


def test_the_solution_passes():
    assert checks.check_correction(correction)


# -- blind round 51 --

def _timeline(gap_ns):
    timeline = te.Timeline(meta=te.TimelineMeta(mode="serial", device="cpu"))
    t = 0
    for r in range(30):
        t += gap_ns.get(r, 0)
        for stage, d in (("upload", 100_000), ("forward", 1_500_000), ("sample", 300_000)):
            timeline.add_device_ns(stage, r, t, t + d, cpu_ns=d)
            t += d
    return timeline


def test_another_rounds_exact_gap_is_not_the_asked_one():
    gaps = {r: 700_000 + (r % 7) * 40_123 for r in range(1, 30)}
    gaps[10], gaps[25] = 823_000, 825_123  # round 25's gap, 0.002 ms from round 10's
    timeline = _timeline(gaps)
    assert checks.check_round_gap(0.823, timeline, round=10)
    assert checks.check_round_gap(0.82, timeline, round=10)  # the rule's two decimals
    verdict = checks.check_round_gap(0.825123, timeline, round=10)
    assert not verdict and verdict.category == "wrong_round", verdict
    assert "the gap before round 25" in verdict.message, verdict


def test_a_slot_that_skips_the_block_table_or_takes_another_block_is_named():
    verdict = checks.check_slot(9, table=[5, 2, 9], pos=9, block_size=4)
    assert not verdict and "block table" in verdict.message, verdict
    verdict = checks.check_slot(21, table=[5, 2, 9], pos=9, block_size=4)  # table[0] * 4 + 1
    assert not verdict and verdict.category == "wrong_block", verdict


def test_a_serial_loop_without_a_forward_is_told_it_never_launched_one():
    def no_forward(engine):
        while engine.scheduler.has_work():
            inputs = engine.prepare_inputs(engine.schedule())
            engine.process_outputs(engine.launch_sample(inputs))
    verdict = checks.check_serial_loop(no_forward)
    assert not verdict and "came before" not in verdict.message, verdict
    assert "with no `launch_forward` of the round before it" in verdict.message, verdict


def test_a_zos_loop_two_rounds_deep_is_not_told_its_step_was_never_processed():
    def two_deep(engine):
        queue = []
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                while queue:
                    engine.flush(queue.pop(0))
                continue
            inputs = engine.prepare_inputs(plan)
            engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if len(queue) >= 2:
                engine.process_outputs(queue.pop(0))
            step = engine.launch_sample(inputs)
            if plan.is_prefill:
                while queue:
                    engine.process_outputs(queue.pop(0))
                engine.process_outputs(step)
            else:
                queue.append(step)
    verdict = checks.check_zos_loop(two_deep)
    assert not verdict and "never waited for" not in verdict.message, verdict
    assert "had not been waited for and processed when round" in verdict.message, verdict


def test_process_outputs_in_the_three_rounds_is_read_as_postprocess():
    order = [("launch_forward", 1), ("launch_sample", 1), ("launch_forward", 2),
             ("process_outputs", 1), ("launch_sample", 2), ("launch_forward", 3),
             ("process_outputs", 2), ("launch_sample", 3), ("flush", 3)]
    verdict = checks.check_three_rounds(order)
    assert not verdict and verdict.category == "host_names", verdict
    assert "with those names it is the engine's order" in verdict.message, verdict
    assert "`process_outputs`" in verdict.message, verdict


def test_a_correction_returning_a_new_dict_is_not_told_new_tensors_are_forbidden():
    def returns_new(meta, accepted, block_size):
        mine = dict(meta)
        mine["seqlens_k"] = mine["seqlens_k"] + accepted[mine["rows"]] * mine["pending"]
        return mine
    verdict = checks.check_correction(returns_new)
    assert not verdict and verdict.category == "stale", verdict
    assert "do not build new ones" not in verdict.message, verdict
    assert "new ones under its keys" in verdict.message, verdict
