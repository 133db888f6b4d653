"""Round nineteen's engine cases: a process_outputs plug-in that changes a request's KV blocks
is refused by name (it was told to end the request at max_new_tokens, 15 tokens short), and
one that changes a StepState's slot is refused (it silently got another round's tokens)."""
import pytest

from loops_for_tests import engine_per_mode, processed_by_hand

PROMPTS = ["Hello there", "The cat"]


def po_blocks(engine, step):
    processed_by_hand(engine, step)
    for r in step.plan.requests:
        r.blocks = r.blocks[:1]


def po_blocks_in_place(engine, step):
    processed_by_hand(engine, step)
    for r in step.plan.requests:
        if not r.finished:
            r.blocks.pop()


def po_slot(engine, step):
    step.slot = (step.slot + 1) % 2
    processed_by_hand(engine, step)


def po_event(engine, step):
    step.sample_done = None
    processed_by_hand(engine, step)


engine = engine_per_mode(PROMPTS)


@pytest.mark.parametrize("plugin", [po_blocks, po_blocks_in_place])
def test_a_plugin_changing_req_blocks_is_refused_by_name_not_told_about_max_new_tokens(
        engine, plugin):
    with pytest.raises(ValueError) as err:
        engine.generate(PROMPTS, 20, process_outputs=plugin)
    msg = str(err.value)
    assert "req.blocks was changed from [" in msg
    assert f"by process_outputs={plugin.__name__}: a request's row and KV blocks" in msg
    assert "must end it" not in msg and "max_new_tokens" in msg
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


@pytest.mark.parametrize("plugin, field", [(po_slot, "slot"), (po_event, "sample_done")])
def test_a_plugin_changing_its_steps_slot_or_event_is_refused_never_given_other_tokens(
        engine, plugin, field):
    with pytest.raises(AttributeError) as err:
        engine.generate(PROMPTS, 20, process_outputs=plugin)
    assert str(err.value).startswith(f"process_outputs={plugin.__name__} set StepState.{field} "
                                     f"of round 0: a StepState's fields are the engine's")
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_a_loop_changing_its_inputs_slot_or_a_steps_committed_flag_is_refused(engine):
    def loop(eng):
        plan = eng.schedule()
        inputs = eng.prepare_inputs(plan)
        inputs.slot = 1
    with pytest.raises(AttributeError, match=r"set RoundInputs\.slot of round 0: a RoundInputs"):
        engine.generate(PROMPTS, 20, loop=loop)

    def marks(eng, step):
        step.committed = True
    with pytest.raises(AttributeError, match=r"marks set StepState\.committed of round 0"):
        engine.generate(PROMPTS, 20, process_outputs=marks)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


def test_a_loop_cutting_blocks_between_schedule_and_prepare_is_told_so(engine):
    def loop(eng):
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if not plan.is_prefill:
                plan.requests[0].blocks = []  # was "freed since"
            eng.launch_forward(inputs := eng.prepare_inputs(plan))
            eng.process_outputs(eng.launch_sample(inputs))
    with pytest.raises(ValueError, match=r"req\.blocks was changed from \[\d+, \d+\] to \[\] "
                                         r"since engine\.schedule\(\) planned it"):
        engine.generate(PROMPTS, 20, loop=loop)
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want
