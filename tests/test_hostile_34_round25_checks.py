"""Round twenty-five's blind cases on the exercise checks (issue 34).

N1: exercise 05's verdict named the checker's wrapper ("process_outputs=StepWatch") and the
engine's refusal classes (HandedBeside, OtherTokens, EndTakenBack): the learner's function is
named as the engine names it without the checker, and those refusals are told in the lesson's
words. N2: `engine.schedule()` called in process_outputs was reported as `engine.schedule(step)`,
"would process the step again": each stage is named as called, with its own reason. N3: an
`engine.abort(req.id)` in process_outputs was told it "set finish_reason to 'abort'", and that an
abort is a right way to end: a results step ends no request; an abort is its user's call.
N4: exercise 04 (b) told an answer whose own code raised to give "a function that returns one",
which it refuses. N5: `rows` was given the lengths' reason. N6: exercise 04 (a) named torch's
meta-tensor error for `torch.equal`, `torch.allclose`, a tensor output_size or slice bound.
N7: exercise 02 told a loop that appended a token to "set req.finish_reason". Weak spots:
check_three_rounds reads stage names as every check does ("FORWARD"), and names a `wait` entry.
"""

import pytest
import torch

from overlap_course import checks


def _commit(engine, step, out=None):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step) if out is None else out
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
    return out


def appends_again(engine, step):
    out = _commit(engine, step)
    for i, req in enumerate(step.plan.requests):
        if not req.finished:
            req.output_ids.append(out[i])


def reverses_tokens(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    n = len(step.plan.requests)
    _commit(engine, step, out[:n][::-1] + out[n:])


def reopens_finished(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
        elif req.finished:
            req.finish_reason = None


_INTERNALS = ("StepWatch", "HandedBeside", "OtherTokens", "EndTakenBack")


@pytest.mark.parametrize("process_outputs, category, said", [
    (appends_again, "tokens_beside", "Do not append them again"),
    (reverses_tokens, "wrong_tokens", "`engine.read_outputs(step)` returns, unchanged"),
    (reopens_finished, "overwrote_finish", "back from 'stop' to None"),
])
def test_exercise_05_names_the_learners_function_not_the_checkers_internals(process_outputs,
                                                                            category, said):
    v = checks.check_process_outputs(process_outputs)
    assert not v.passed and v.category == category, v
    assert said in v.message and "your process_outputs" in v.message, v
    assert not any(word in v.message for word in _INTERNALS), v


def test_exercise_05_names_the_learners_function_in_the_engines_own_words():
    """A refusal told in the engine's own words names the learner's function as the engine
    names it in the notebook's own run (no checker around it), and not the refusal's class."""
    def outside(engine, step):
        _commit(engine, step)
        mine = set(map(id, step.plan.requests))
        for r in engine.requests:
            if id(r) not in mine and r.output_ids and not r.finished:
                r.output_ids.append(r.output_ids[-1])
                break

    v = checks.check_process_outputs(outside)
    assert not v.passed and v.category == "raised", v
    assert "was refused by the engine: process_outputs=outside, given round" in v.message, v
    assert "StepWatch" not in v.message and "ValueError" not in v.message, v


def test_exercise_05_names_schedule_as_called_with_its_own_reason():
    def peeks(engine, step):
        _commit(engine, step)
        engine.schedule()

    v = checks.check_process_outputs(peeks)
    assert not v.passed and v.category == "calls_stage", v
    assert "`engine.schedule()`" in v.message and "schedule(step)" not in v.message, v
    assert "process the step again" not in v.message, v


@pytest.mark.parametrize("stage", ["flush", "process_outputs"])
def test_exercise_05_still_tells_a_stage_that_runs_the_plugin_again(stage):
    def calls(engine, step):
        getattr(engine, stage)(step)

    v = checks.check_process_outputs(calls)
    assert not v.passed and v.category == "calls_itself", v
    assert f"`engine.{stage}`" in v.message and "run your function again" in v.message, v


def test_exercise_05_tells_an_abort_from_process_outputs_as_an_abort():
    def cuts_long(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)
            elif len(req.output_ids) >= 20:
                engine.abort(req.id)

    v = checks.check_process_outputs(cuts_long)
    assert not v.passed and v.category == "ended_unfinished", v
    assert "aborted prompt 1 after 20 tokens" in v.message, v
    assert "set prompt" not in v.message and "A results step ends no request" in v.message, v


def test_exercise_05_a_reason_set_early_is_not_told_an_abort_ends_it():
    def ends_early(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if not req.finished and len(req.output_ids) >= 20:
                req.finish_reason = "length"
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)

    v = checks.check_process_outputs(ends_early)
    assert not v.passed and v.category == "ended_unfinished", v
    assert "set prompt 1's finish_reason to 'length'" in v.message, v
    assert "or by an abort" not in v.message, v


class _Raises:
    def __iter__(self):
        raise RuntimeError("boom")


def test_exercise_04b_an_answer_that_raises_is_told_the_set_it_asks_for():
    v = checks.check_metadata_answer(_Raises())
    assert not v.passed and v.category == "raised", v
    assert "a function that returns one" not in v.message, v
    assert "a plain set of field names as strings" in v.message, v


def test_exercise_03b_an_answer_that_raises_is_told_the_list_it_asks_for():
    v = checks.check_three_rounds(_Raises())
    assert not v.passed and v.category == "raised", v
    assert "a plain list of (stage, round) pairs" in v.message, v


def test_exercise_04b_rows_is_given_its_own_reason():
    right = {"positions", "seqlens_k", "slot_mapping", "input_ids"}
    v = checks.check_metadata_answer(right | {"rows"})
    assert not v.passed and v.category == "unchanged_field", v
    assert "identify the request, not its length" in v.message, v
    assert "1 + k tokens" not in v.message, v
    v = checks.check_metadata_answer(right | {"seqlens_q"})  # the notebook quotes this one
    assert v.message == ("['seqlens_q'] do not change: each decode request still feeds 1 + k "
                         "tokens"), v  # round 27: each field its own reason, the blocks' too


def _correction(read):
    """A right correction, with ``read(meta)`` put where a learner would: a guard, a size."""
    def correct_seqlens_qk(meta, accepted, block_size):
        n = read(meta)
        if n is False:
            return
        b = len(meta["seqlens_q"])
        delta = accepted[meta["rows"]] * meta["pending"]
        size = len(meta["positions"]) if n is None or n is True else n
        tok = torch.repeat_interleave(torch.arange(b, device=meta["seqlens_q"].device),
                                      meta["seqlens_q"], output_size=size)
        meta["seqlens_k"] += delta
        meta["positions"] += delta[tok]
        pos = meta["positions"]
        slots = meta["block_tables"][tok, pos // block_size] * block_size + pos % block_size
        meta["slot_mapping"].copy_(slots)
    return correct_seqlens_qk


def _some_pending(meta):
    return not torch.equal(meta["pending"], torch.zeros_like(meta["pending"]))


def _some_pending_close(meta):
    return not torch.allclose(meta["pending"], torch.zeros_like(meta["pending"]))


def _tensor_size(meta):
    return meta["seqlens_q"].sum()


def _sliced(meta):
    meta["positions"][:meta["seqlens_q"].sum()]


def _arange(meta):
    torch.arange(meta["seqlens_q"].sum())  # read where no op of torch's names it


@pytest.mark.parametrize("read, named", [
    (_some_pending, "`torch.equal` (it returns a Python bool"),
    (_some_pending_close, "`torch.allclose` (it returns a Python bool"),
    (_tensor_size, "a tensor as output_size"),
    (_sliced, "a tensor as a slice bound"),
    (_arange, "torch.arange(meta[\"seqlens_q\"].sum())"),
])
def test_exercise_04a_names_the_host_read_the_learner_wrote(read, named):
    v = checks.check_correction(_correction(read))
    assert not v.passed and v.category == "host_read", v
    assert named in v.message, v
    for internal in ("Meta", "meta tensors", "fake impl", "Tensor.item()"):
        assert internal not in v.message, v


def test_exercise_02_a_loop_that_appends_a_token_is_told_so_not_to_end_requests():
    def serial_loop(engine):
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            engine.process_outputs(step)
            for r in plan.requests:
                if not r.finished and r.output_ids:
                    r.output_ids.append(r.output_ids[-1])
                    break

    v = checks.check_serial_loop(serial_loop)
    assert not v.passed and v.category == "edits_requests", v
    assert "appended 1 token(s) to prompt 0's" in v.message, v
    assert "set req.finish_reason" not in v.message, v


_RIGHT_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
                ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


def test_exercise_03b_reads_stage_names_as_every_check_does():
    assert checks.check_three_rounds(_RIGHT_ORDER)
    shouted = [(" " + s.upper() + " ", r) for s, r in _RIGHT_ORDER]
    v = checks.check_three_rounds(shouted)
    assert v.passed, v


def test_exercise_03b_tells_a_wait_entry_to_be_left_out():
    v = checks.check_three_rounds(_RIGHT_ORDER[:3] + [("wait", 1)] + _RIGHT_ORDER[3:])
    assert not v.passed and v.category == "not_a_stage", v
    assert "leave out ('wait', 1)" in v.message, v


def test_exercise_05_a_plugins_own_recursion_is_not_told_it_called_the_engine():
    def recurses(engine, step, depth=0):
        return recurses(engine, step, depth + 1)

    v = checks.check_process_outputs(recurses)
    assert not v.passed and v.category == "raised", v
    assert "RecursionError" in v.message and "called `engine." not in v.message, v
