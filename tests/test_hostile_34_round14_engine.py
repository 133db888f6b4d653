"""Round fourteen's engine cases (issue 34): a plan changed after engine.schedule() returned it
is refused by the stage given it, not committed to the wrong prompts."""

import pytest

from toy_engine.config import EngineConfig
from toy_engine.engine import Engine

PROMPTS = ["Once upon", "There was", "The cat sat"]


@pytest.fixture(scope="module")
def engine():
    with Engine(EngineConfig(mode="zos", max_batch_size=3)) as eng:
        yield eng


def _reversing_process_outputs(engine, step):
    step.plan.requests.reverse()  # "commit in another order"
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


def _loop_reversing_after_prepare(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        plan.requests.reverse()
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def _loop_sorting_before_prepare(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        plan.requests.sort(key=lambda r: -r.index)
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


# Refused at the first stage that reads the plan after the change (round 20: every stage checks
# it, not only prepare and commit)
@pytest.mark.parametrize("plugins, stage", [
    (dict(process_outputs=_reversing_process_outputs),
     "read_outputs was given round \\d+'s step, its"),
    (dict(loop=_loop_reversing_after_prepare), "launch_forward was given round \\d+'s inputs, its"),
    (dict(loop=_loop_sorting_before_prepare), "prepare_inputs was given round \\d+'s"),
])
def test_a_plan_changed_after_schedule_is_refused(engine, plugins, stage):
    reference = [c.text for c in engine.generate(PROMPTS, 12)]
    with pytest.raises(ValueError, match=rf"{stage} plan changed since "
                       r"engine.schedule\(\) returned it.*sort a copy"):
        engine.generate(PROMPTS, 12, **plugins)
    assert [c.text for c in engine.generate(PROMPTS, 12)] == reference  # the engine goes on


def _sample_first(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        step = engine.launch_sample(inputs)
        engine.launch_forward(inputs)
        engine.process_outputs(step)


def _no_forward(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            continue
        engine.process_outputs(engine.launch_sample(engine.prepare_inputs(plan)))


@pytest.mark.parametrize("loop", [_sample_first, _no_forward])
def test_a_sample_before_its_forward_is_refused_on_the_host(engine, loop):
    from toy_engine.run import SampleBeforeForward
    serial = engine.device.serial
    with pytest.raises(SampleBeforeForward, match=r"launch_sample was given round 0's inputs "
                       r"before their forward was launched.*launch_forward\(inputs\) first"):
        engine.generate(PROMPTS, 12, loop=loop)
    assert engine.device.serial == serial  # nothing reached the device: it was not replaced
    assert len(engine.generate(PROMPTS, 12)) == 3


def _schedules_twice(engine):
    while engine.scheduler.has_work():
        peek = engine.schedule()  # "just to see the plan"
        if peek is None:
            continue
        plan = engine.schedule() or peek
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def test_a_plan_never_launched_is_named_not_a_dropped_deferred_step(engine):
    from toy_engine.run import EngineStalled
    with pytest.raises(EngineStalled) as caught:
        engine.generate(PROMPTS, 12, loop=_schedules_twice)
    message = str(caught.value)
    assert "round 0's plan was scheduled but never prepared or launched" in message
    assert "deferred step" not in message and "launched rounds" not in message


def _scheduling_cases(engine):
    from overlap_course.labs import plugins, plugins_2026
    from toy_engine.sequence import Request

    def process_outputs(eng, step):
        eng.device.wait(step.sample_done)
        for req in eng.commit_outputs(step, eng.read_outputs(step)):
            eng.scheduler.release_if_done(req)
        if step.plan.round == 3:
            eng.schedule()  # "what runs next?"

    def commit(req, tokens, eos_id, decode):
        Request.commit(req, tokens, eos_id, decode)
        if req.index == 0 and len(req.output_ids) == 3:
            engine.schedule()

    def wants_more(req):
        if req.index == 0 and len(req.output_ids) == 3:
            engine.schedule()
        return Request.wants_more(req)

    def key(req, b):
        if b == 0 and len(req.output_ids) == 4:
            engine.schedule()
        return req.row
    return {"the plug-in process_outputs=process_outputs": dict(process_outputs=process_outputs),
            "the plug-in per_request(commit=commit)": dict(
                on_round=plugins.per_request(commit=commit)),
            "engine.schedule() (a plug-in it calls": dict(
                on_round=plugins.per_request(wants_more=wants_more)),
            "the plug-in future_key: key=key": dict(loop=plugins_2026.future_key(key))}


def test_a_stage_called_from_any_plug_in_is_refused_by_name(engine):
    for where, plugins in _scheduling_cases(engine).items():
        with pytest.raises(RuntimeError) as caught:
            engine.generate(PROMPTS, 12, **plugins)
        assert f"engine.schedule() was called from inside {where}" in str(caught.value), where
    assert len(engine.generate(PROMPTS, 12)) == 3
