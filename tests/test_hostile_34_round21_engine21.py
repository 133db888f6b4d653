"""Round twenty-one's engine cases: a step's event changed before process_outputs, and a plan's
request changed just before prepare_inputs and put back just after, gave wrong tokens silently;
each is now refused by name."""

import pytest

import toy_engine as te

PROMPTS = ["Once upon", "The king said", "She ", "A"]


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(mode="serial", device="cpu")) as eng:
        yield eng


def _loop(before=lambda plan: None, after=lambda plan, st: None, step_hook=lambda step: None):
    """A serial loop= plug-in calling ``before``/``after`` around prepare_inputs."""
    def loop(engine):
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                continue
            st = before(plan)
            inputs = engine.prepare_inputs(plan)
            after(plan, st)
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            step_hook(step)
            engine.process_outputs(step)
    return loop


def _refused(engine, loop, *words):
    right = [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)]
    with pytest.raises(ValueError) as err:
        engine.generate(PROMPTS, max_new_tokens=8, loop=loop)
    for word in words:
        assert word in str(err.value)
    assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)] == right


def test_event_handle_changed_before_process_outputs_is_refused(engine):
    def zero(step):
        step.sample_done.handle = 0
    _refused(engine, _loop(step_hook=zero), "step.sample_done.handle changed", "round 0")


def test_event_seq_changed_before_process_outputs_is_refused(engine):
    def lower(step):
        step.sample_done.seq -= 5
    _refused(engine, _loop(step_hook=lower), "step.sample_done.seq changed")


def _around(name, change):
    def before(plan):
        req = plan.requests[0]
        if name == "num_inflight" and plan.is_prefill:
            return None
        was = getattr(req, name)
        saved = list(was) if type(was) is list else was
        change(req)
        return req, saved

    def after(plan, st):
        if st is not None:
            req, saved = st
            if type(saved) is list:
                getattr(req, name)[:] = saved
            else:
                setattr(req, name, saved)
    return _loop(before, after)


def test_temperature_changed_around_prepare_inputs_is_refused(engine):
    _refused(engine, _around("temperature", lambda r: setattr(r, "temperature", 5.0)),
             "req.temperature was changed from 0.0 to 5.0", "since engine.schedule()")


def test_prompt_ids_edited_in_place_around_prepare_inputs_is_refused(engine):
    def edit(req):
        req.prompt_ids[:] = [48] * len(req.prompt_ids)
    _refused(engine, _around("prompt_ids", edit), "req.prompt_ids was changed")


def test_num_inflight_raised_around_prepare_inputs_is_refused(engine):
    def raise_(req):
        req.num_inflight += 1
    _refused(engine, _around("num_inflight", raise_), "req.num_inflight is 2, but the run counts 1",
             "prompt 0")


def test_num_inflight_raised_by_a_process_outputs_plugin_is_refused(engine):
    def lifts(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
        step.plan.requests[0].num_inflight += 1
    right = [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)]
    with pytest.raises(ValueError, match="num_inflight is 1, but the run counts 0 .* it was "
                                         "changed by process_outputs=lifts"):
        engine.generate(PROMPTS, max_new_tokens=8, process_outputs=lifts)
    assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)] == right


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_right_runs_still_pass(mode):
    with te.Engine(te.EngineConfig(mode=mode, device="cpu", num_draft_tokens=0)) as eng:
        ref = [c.text for c in eng.generate(PROMPTS, max_new_tokens=12)]
        assert [c.text for c in eng.generate(PROMPTS, max_new_tokens=12, loop=_loop())] == ref
