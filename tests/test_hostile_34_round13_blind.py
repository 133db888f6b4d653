"""Round thirteen, area blind: a leak through `req.blocks` before the free, a ring size wrong at
one depth, a stage called on another engine, a second free in a later step, the note after a
leak, a float's trailing 0 in a count of decimals, and 0-d tensors from plug-ins."""

import numpy as np
import torch

import toy_engine as te
from overlap_course import checks
from overlap_course.checks.readings import shortened
from loops_for_tests import zos_loop


def _blocks_cleared(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            req.blocks = []
            engine.scheduler.free(req)


def _one_block_kept(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            req.blocks = req.blocks[:-1]
            engine.scheduler.free(req)


def _right(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def test_blocks_emptied_or_shortened_before_the_free_fail_naming_the_lost_blocks():
    for fn in (_blocks_cleared, _one_block_kept):
        verdict = checks.check_process_outputs(fn)
        assert not verdict.passed, fn.__name__
        assert verdict.category == "kept_blocks"
        assert "never came back to the pool" in verdict.message
        assert "held by prompt(s) [" in verdict.message


def test_after_a_leaking_answer_the_next_verdicts_carry_no_note_about_an_earlier_cell():
    assert not checks.check_process_outputs(_blocks_cleared).passed
    verdict = checks.check_process_outputs(_right)
    assert verdict.passed, verdict.message
    assert "earlier cell" not in verdict.message and "shared engine" not in verdict.message


_FREED = []


def _refrees_last_steps(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for r in _FREED:
        engine.scheduler.free(r)
    _FREED.clear()
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
            _FREED.append(req)


def _scans_every_request(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    engine.commit_outputs(step, out)
    for req in list(engine.requests):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def test_a_second_free_in_a_later_step_names_the_prompt():
    for fn in (_refrees_last_steps, _scans_every_request):
        verdict = checks.check_process_outputs(fn)
        assert verdict.category == "double_free", verdict.message
        assert "prompt(s) []" not in verdict.message and "prompt(s) [0]" in verdict.message


def test_ring_slots_wrong_only_at_a_deep_depth_never_passes():
    """Every depth is run, so the verdict does not depend on a draw."""
    for wrong in (lambda d: min(d + 1, 7), lambda d: min(d + 1, 6),
                  lambda d: d + 1 if d <= 4 else d + 2, lambda d: d + 2 if d == 6 else d + 1):
        for _ in range(2):
            assert not checks.check_ring_slots(wrong).passed
    verdict = checks.check_ring_slots(lambda depth: depth + 1)
    assert verdict.passed and "[1, 2, 3, 4, 5, 6, 7]" in verdict.message


def _loop_calling(global_engine):
    # the held-back round processed on the notebook's engine, not `eng`
    return zos_loop(finish=lambda eng, step: global_engine.process_outputs(step))


def test_a_stage_called_on_another_engine_is_named_so_open_or_closed():
    engine = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
    loop = _loop_calling(engine)
    try:
        verdict = checks.check_zos_loop(loop)
    finally:
        engine.close()
    closed = checks.check_zos_loop(loop)
    for v in (verdict, closed):
        assert v.category == "other_engine", v.message
        assert "`.process_outputs(...)` on an engine other than" in v.message
        assert "`eng`" in v.message
        assert "left from another run" not in v.message and "create a new Engine" not in v.message
    assert "a closed one" in closed.message and "a closed one" not in verdict.message


def test_a_count_of_decimals_a_trailing_zero_hides_is_not_named_alone():
    assert shortened(0.606, 0.60595453, whole=None) == "rounded to 3 or more decimals"
    assert shortened(0.6059, 0.60595453, whole=None) == "cut to 4 decimals"
    assert shortened(0.61, 0.60595453, whole=None) == "rounded to 2 decimals"


def test_zero_d_tensors_and_arrays_from_plugins_are_taken_as_their_values():
    def before_sample(engine, plan, held):
        return torch.tensor(len(held) if engine.constraint is not None else 0)

    def before_sample_np(engine, plan, held):
        return np.array(len(held) if engine.constraint is not None else 0)

    for fn in (before_sample, before_sample_np):
        verdict = checks.check_before_sample(fn)
        assert verdict.passed, verdict.message

    def wants(req):
        return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens

    for wrap in (np.array, torch.tensor):
        verdict = checks.check_wants_more(lambda req, wrap=wrap: wrap(wants(req)))
        assert verdict.passed, verdict.message
    float_count = checks.check_before_sample(lambda engine, plan, held: torch.tensor(0.0))
    assert not float_count.passed and "tensor(0.), a float" in float_count.message
    number = checks.check_wants_more(lambda req: torch.tensor(2 * int(wants(req))))  # 1/0 are bools
    assert not number.passed and "not True or False" in number.message


def _blocks_back_row_kept(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0 and req.blocks:
            engine.scheduler.blocks.free(req.blocks, req.index)
            req.blocks = []


def test_a_free_that_keeps_only_the_row_is_told_only_the_row_was_kept():
    verdict = checks.check_process_outputs(_blocks_back_row_kept)
    assert verdict.category == "kept_blocks"
    assert "kept its batch row" in verdict.message
    assert "KV blocks and batch row" not in verdict.message


def test_a_dicts_keys_are_a_set_of_rounds():
    from overlap_course.checks.answers import int_set
    assert int_set({3: "a", 4: "b"}.keys()) == {3, 4}
