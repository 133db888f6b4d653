"""Issue 34's twelfth hostile round, area `engine`, fixer `engineB`: a learner's loop misusing
the stages.  A round sampled twice and processed twice (02), a plug-in's stall blamed on a
loop that never stopped (03), stages after close() (08), a forward of an older upload (10),
commit_outputs taking any `out` (14), and the loop's objects mixed up (16)."""

from __future__ import annotations

import numpy as np
import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.labs import plugins
from toy_engine import buffers, kernels, run  # the new classes read in the tests: each fails alone
from toy_engine.run import StepProcessedTwice

PROMPTS = ["Once upon", "The cat", "A dog"]


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)) as eng:
        yield eng


def _usable(eng):
    """The engine runs right after the refusal."""
    out = eng.generate(["Once upon"], max_new_tokens=5)
    assert out[0].finish_reason == "length" and len(out[0].token_ids) == 5


def _serial(extra=None, before_forward=None):
    """A serial loop; ``extra(eng, inputs, step, n)`` after round n's processing,
    ``before_forward(eng, plan, inputs)`` before its forward."""
    def loop(eng):
        n = 0
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                continue
            inputs = eng.prepare_inputs(plan)
            if before_forward is not None:
                before_forward(eng, plan, inputs)
            eng.launch_forward(inputs)
            step = eng.launch_sample(inputs)
            eng.process_outputs(step)
            if extra is not None:
                extra(eng, inputs, step, n)
            n += 1
    return loop


# ------------------------------------------------------------------ 02: a round processed twice

def _sampled_twice(eng, inputs, step, n):
    if n == 2:
        eng.process_outputs(eng.launch_sample(inputs))  # the same round, sampled again


def test_02_a_round_sampled_twice_is_refused_at_its_second_commit(engine):
    """Before: its tokens were committed twice (num_inflight -1), then EngineStalled said the
    results were "never processed; was a deferred step dropped?"."""
    with pytest.raises(StepProcessedTwice, match="launch_sample was called more than once for "
                                                 "round 2's inputs") as err:
        engine.generate(PROMPTS[:2], max_new_tokens=10, loop=_serial(_sampled_twice))
    assert err.value.round == 2
    assert all(r.num_inflight == 0 for r in engine.requests)
    _usable(engine)


@pytest.mark.timeout(300)
def test_02_the_serial_loop_checker_names_a_round_launched_twice():
    verdict = checks.check_serial_loop(_serial(_sampled_twice))
    assert not verdict and verdict.category == "launched_twice", (verdict.category,
                                                                  verdict.message)


# ------------------------------------------------------------------ 03: a plug-in's stall

def _wants_more_off_by_one(req):
    return not req.finished and len(req.output_ids) + req.num_inflight + 1 < req.max_new_tokens


def _commit_without_length(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])


@pytest.mark.parametrize("method, fn, says", [
    ("wants_more", _wants_more_off_by_one, "its wants_more, replaced on the request by a plug-in, "
                                           "answers False"),
    ("commit", _commit_without_length, "its commit, replaced on the request by a plug-in, did not "
                                       "end it"),
])
def test_03_a_plugin_that_leaves_a_request_unplanned_is_named_not_the_loop(engine, method, fn, says):
    """Before: "the loop stopped with work left ... keep scheduling rounds", raised inside the
    engine's own loop's schedule()."""
    with pytest.raises(te.EngineStalled) as err:
        engine.generate(PROMPTS, max_new_tokens=12, on_round=plugins.per_request(**{method: fn}))
    assert err.value.reason == "not_planned", err.value
    assert "the loop stopped" not in str(err.value) and says in str(err.value), err.value
    assert "engine.schedule() found no round to plan for prompt 0" in str(err.value)
    _usable(engine)


def test_03_a_loop_that_returns_early_is_still_told_so(engine):
    def loop(eng):
        plan = eng.schedule()
        eng.process_outputs(eng.launch_sample(_launched(eng, plan)))

    with pytest.raises(te.EngineStalled, match="the loop stopped with work left") as err:
        engine.generate(PROMPTS, max_new_tokens=4, loop=loop)
    assert err.value.reason == "loop_returned_with_work"


def _launched(eng, plan):
    inputs = eng.prepare_inputs(plan)
    eng.launch_forward(inputs)
    return inputs


# ------------------------------------------------------------------ 08: stages after close()

def _kept_from_a_run():
    eng, kept = te.Engine(te.EngineConfig(mode="zos")), {}

    def loop(e):
        while e.scheduler.has_work():
            plan = e.schedule()
            if plan is None:
                continue
            inputs = e.prepare_inputs(plan)
            e.launch_forward(inputs)
            step = e.launch_sample(inputs)
            kept.update(plan=plan, inputs=inputs, step=step)
            e.process_outputs(step)
    eng.generate(["Once"], max_new_tokens=4, loop=loop)
    return eng, kept


STAGES = {
    "schedule": lambda e, k: e.schedule(),
    "prepare_inputs": lambda e, k: e.prepare_inputs(k["plan"]),
    "correct_on_device": lambda e, k: e.correct_on_device(k["inputs"]),
    "launch_forward": lambda e, k: e.launch_forward(k["inputs"]),
    "launch_sample": lambda e, k: e.launch_sample(k["inputs"]),
    "process_outputs": lambda e, k: e.process_outputs(k["step"]),
    "read_outputs": lambda e, k: e.read_outputs(k["step"]),
    "commit_outputs": lambda e, k: e.commit_outputs(k["step"], [0, 0]),
    "flush": lambda e, k: e.flush(k["step"]),
}


def test_08_every_stage_of_a_closed_engine_says_it_is_closed():
    """Before: KeyError 'out1', IndexError, a RaceError about a free block, and a launch_sample
    that left a phantom launch behind its DeviceError."""
    eng, kept = _kept_from_a_run()
    eng.close()
    for stage, call in STAGES.items():
        with pytest.raises(RuntimeError, match=rf"^{stage}: this engine is closed") as err:
            call(eng, kept)
        assert type(err.value) is RuntimeError, (stage, err.value)


def test_08_a_failed_launch_leaves_no_pending_launch():
    eng, _ = _kept_from_a_run()
    eng.close()
    with pytest.raises(te.DeviceError):
        eng.device.launch(kernels.forward, 1, round=9, stage="forward", writes={"out1"})
    assert eng.device.races.pending == []
    eng.device.races.check_access("out1", "r")  # no phantom writer left


def test_08_a_plan_kept_from_an_earlier_run_is_refused_by_prepare_inputs():
    eng, kept = _kept_from_a_run()
    with eng:
        with pytest.raises(RuntimeError, match=r"prepare_inputs was given round \d+'s plan of a "
                                               r"run that has ended"):  # as its inputs and step
            eng.prepare_inputs(kept["plan"])
        _usable(eng)


# ------------------------------------------------------------------ 10: the latest upload

def _two_rounds_prepared(eng):
    """Prepares round B before launching round A (the device then holds B's inputs)."""
    while eng.scheduler.has_work():
        a = eng.schedule()
        if a is None:
            continue
        inputs_a = eng.prepare_inputs(a)
        b = eng.schedule()
        inputs_b = eng.prepare_inputs(b) if b is not None else None
        eng.launch_forward(inputs_a)
        eng.process_outputs(eng.launch_sample(inputs_a))
        if inputs_b is not None:
            eng.launch_forward(inputs_b)
            eng.process_outputs(eng.launch_sample(inputs_b))


def test_10_a_forward_of_inputs_replaced_by_a_later_upload_is_refused():
    """Before: round A ran on round B's metadata: wrong text, no error."""
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=2)) as eng:
        with pytest.raises(run.StaleInputs, match=r"launch_forward was given round 0's inputs, but "
                                              r"round 1's inputs were prepared since") as err:
            eng.generate(PROMPTS + ["She said"], max_new_tokens=12, loop=_two_rounds_prepared)
        assert (err.value.round, err.value.latest, err.value.foreign) == (0, 1, False)
        _usable(eng)


@pytest.mark.parametrize("stage", ["launch_sample", "correct_on_device"])
def test_10_every_launch_checks_its_inputs_are_the_latest(engine, stage):
    def before_forward(eng, plan, inputs):
        if plan.round == 1:
            getattr(eng, stage)(kept[0])
        kept[:] = [inputs]

    kept = []
    with pytest.raises(run.StaleInputs, match=rf"{stage} was given round 0's inputs"):
        engine.generate(PROMPTS, max_new_tokens=4, loop=_serial(before_forward=before_forward))


def test_10_inputs_of_another_run_are_named_as_such(engine):
    kept = []
    engine.generate(PROMPTS, max_new_tokens=3,
                    loop=_serial(before_forward=lambda e, p, i: kept.append(i)))

    def loop(eng):
        eng.launch_forward(kept[-1])

    with pytest.raises(run.StaleInputs, match="which another run prepared") as err:
        engine.generate(PROMPTS, max_new_tokens=3, loop=loop)
    assert err.value.foreign
    _usable(engine)


@pytest.mark.timeout(300)
def test_10_the_serial_loop_checker_names_inputs_replaced():
    verdict = checks.check_serial_loop(_two_rounds_prepared)
    assert not verdict and verdict.category == "inputs_replaced", (verdict.category,
                                                                   verdict.message)
    assert "after round 1's were prepared" in verdict.message


# ------------------------------------------------------------------ 14: commit_outputs' `out`

def _processing(read):
    def process(eng, step):
        eng.device.wait(step.sample_done)
        for req in eng.commit_outputs(step, read(eng, step)):
            eng.scheduler.release_if_done(req)
    return process


@pytest.mark.parametrize("read, says", [
    (lambda e, s: e.device.host(f"out{s.slot}"), "got a Tensor (read_outputs copies"),
    (lambda e, s: e.read_outputs(s)[:len(s.plan.requests)], "got 3 values"),
    (lambda e, s: [], "got 0 values"),
    (lambda e, s: [float(x) for x in e.read_outputs(s)], "got out[0], a float, not an int"),
    (lambda e, s: [9999] + e.read_outputs(s)[1:], "got out[0] = 9999, a token outside 0 to"),
    (lambda e, s: e.read_outputs(s)[:-1] + [5], "got out[5] = 5, an accepted count outside 0 to 0"),
])
def test_14_commit_outputs_refuses_anything_but_the_rounds_list_of_ints(engine, read, says):
    """Before: the slot tensor made token_ids live views of the slot, a short list stalled with
    "never processed ... dropped?", floats gave a bare TypeError on slice indices."""
    with pytest.raises(buffers.BadOutputs, match=r"commit_outputs takes round 0's outputs as "
                                         r"engine\.read_outputs\(step\) returns them, a list of 6 "
                                         r"ints \(3 x 1 tokens, then 3 accepted counts\)") as err:
        engine.generate(PROMPTS, max_new_tokens=6, process_outputs=_processing(read))
    assert says in str(err.value), err.value
    assert err.value.expected == 6
    _usable(engine)


def test_14_numpy_ints_are_committed_as_plain_ints(engine):
    reference = [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=6)]
    out = engine.generate(PROMPTS, max_new_tokens=6, process_outputs=_processing(
        lambda e, s: list(np.array(e.read_outputs(s), dtype=np.int64))))
    assert [c.token_ids for c in out] == reference
    assert {type(t) for c in out for t in c.token_ids} == {int}


@pytest.mark.timeout(300)
def test_14_the_process_outputs_checker_names_the_slot_tensor():
    """Before: "commit every step's tokens exactly once, from its own output slot", which the
    answer did."""
    verdict = checks.check_process_outputs(_processing(lambda e, s: e.device.host(f"out{s.slot}")))
    assert not verdict and verdict.category == "bad_outputs", (verdict.category, verdict.message)
    assert "got a Tensor" in verdict.message


# ------------------------------------------------------------------ 16: the loop's objects mixed up

MIXUPS = {
    "launch_forward(plan)": (lambda e, p, i, s: e.launch_forward(p),
                             "launch_forward takes the RoundInputs that engine.prepare_inputs(plan) "
                             "returned, got a Plan"),
    "launch_sample(plan)": (lambda e, p, i, s: e.launch_sample(p),
                            "launch_sample takes the RoundInputs"),
    "correct_on_device(plan)": (lambda e, p, i, s: e.correct_on_device(p),
                                "correct_on_device takes the RoundInputs"),
    "prepare_inputs(None)": (lambda e, p, i, s: e.prepare_inputs(None),
                             "prepare_inputs takes the Plan that engine.schedule() returned, got "
                             "None"),
    "prepare_inputs(inputs)": (lambda e, p, i, s: e.prepare_inputs(i),
                               "prepare_inputs takes the Plan that engine.schedule() returned, got "
                               "a RoundInputs"),
    "process_outputs(inputs)": (lambda e, p, i, s: e.process_outputs(i),
                                "process_outputs takes the StepState that "
                                "engine.launch_sample(inputs) returned, got a RoundInputs"),
    "flush(inputs)": (lambda e, p, i, s: e.flush(i), "flush takes the StepState"),
    "process_outputs([step])": (lambda e, p, i, s: e.process_outputs([s]),
                                "process_outputs takes the StepState that "
                                "engine.launch_sample(inputs) returned, got a list"),
    "read_outputs(plan)": (lambda e, p, i, s: e.read_outputs(p), "read_outputs takes the StepState"),
    "commit_outputs(inputs, out)": (lambda e, p, i, s: e.commit_outputs(i, []),
                                    "commit_outputs takes the StepState"),
}


def _mixing_up(wrong):
    def loop(eng):
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                continue
            inputs = eng.prepare_inputs(plan)
            eng.launch_forward(inputs)
            step = eng.launch_sample(inputs)
            wrong(eng, plan, inputs, step)
            eng.process_outputs(step)
    return loop


@pytest.mark.parametrize("name", list(MIXUPS))
def test_16_a_stage_given_the_wrong_object_names_itself_and_what_it_takes(engine, name):
    """Before: AttributeErrors about the toy's internals ("'Plan' object has no attribute
    'plan'"), and correct_on_device(plan) ran without a word."""
    wrong, says = MIXUPS[name]
    with pytest.raises(TypeError) as err:
        engine.generate(PROMPTS[:2], max_new_tokens=4, loop=_mixing_up(wrong))
    assert type(err.value) is TypeError and says in str(err.value), err.value
    _usable(engine)


@pytest.mark.timeout(300)
def test_16_the_serial_loop_checker_passes_the_stages_words_on():
    """Before: "your loop raised AttributeError: 'Plan' object has no attribute 'plan'"."""
    verdict = checks.check_serial_loop(_mixing_up(MIXUPS["launch_forward(plan)"][0]))
    assert not verdict and verdict.category == "raised", (verdict.category, verdict.message)
    assert "launch_forward takes the RoundInputs" in verdict.message


@pytest.mark.timeout(300)
def test_10_the_serial_loop_checker_names_inputs_kept_from_another_run():
    kept = []

    def loop(eng):
        first = True
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                continue
            inputs = eng.prepare_inputs(plan)
            eng.launch_forward(kept[-1] if first and kept else inputs)  # the last run's, kept
            eng.process_outputs(eng.launch_sample(inputs))
            kept.append(inputs)
            first = False

    verdict = checks.check_serial_loop(loop)
    assert not verdict and verdict.category == "foreign_step", (verdict.category, verdict.message)
    assert "inputs, which this run never prepared" in verdict.message
