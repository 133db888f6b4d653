"""Issue 34, round thirty-six, blind learner.  Exercise 03's checker judged the host's waits and
``engine.flush`` only in its first (title-case) run: a loop that called
``engine.device.synchronize()`` after the forward, or flushed a step though ``schedule()`` had
returned a plan, only with drafts or only in the endings runs PASSED (decode device idle 0.30
against the engine's 0.14).  And a loop the engine refused was named ``loop=watched``, the
checker's wrapper."""

from __future__ import annotations

import pytest

from overlap_course import checks


def _zos(only: str, misuse: str, prefill: str = "engine.process_outputs(step)"):
    """Exercise 03's loop that does ``misuse`` after the forward when ``only`` holds."""
    space: dict = {}
    exec(f'''
def zos_loop(engine):
    odd = {only}
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if odd:
            {misuse}
        if previous is not None:
            engine.process_outputs(previous)
            previous = None
        step = engine.launch_sample(inputs)
        if plan.is_prefill:
            {prefill}
        else:
            previous = step
''', space)
    return space["zos_loop"]


DRAFTS = "bool(engine.config.num_draft_tokens)"
ENDINGS = "engine.config.constraint is None and not engine.config.num_draft_tokens"
SYNC = "engine.device.synchronize()"
FLUSH = "previous = engine.flush(previous)"


@pytest.mark.parametrize("only, misuse, prefill, said", [
    (DRAFTS, SYNC, "engine.process_outputs(step)",
     "with speculative decoding (3 drafts per round): round 1 (decode, prompts [0, 1, 2]): the "
     "host waited on a device event that is not a step's `sample_done`"),
    (ENDINGS, SYNC, "engine.process_outputs(step)", "the host waited on a device event"),
    (DRAFTS, FLUSH, "engine.process_outputs(step)",
     "with speculative decoding (3 drafts per round): round 1 (decode, prompts [0, 1, 2]): your "
     "loop processed its step with `engine.flush`, though"),
    (DRAFTS, "pass", "engine.flush(step) if odd else engine.process_outputs(step)",
     "round 0 (prefill, prompts [0, 1, 2]): your loop processed its step with `engine.flush`"),
])
def test_every_run_of_exercise_03_is_judged_by_the_same_rules(only, misuse, prefill, said):
    v = checks.check_zos_loop(_zos(only, misuse, prefill))
    assert not v.passed and said in v.message, v.message


def test_the_right_loop_still_passes():
    v = checks.check_zos_loop(_zos("False", "pass"))
    assert v.passed, v.message


def test_a_loop_the_engine_refuses_is_named_by_its_own_name():
    def serial_loop(engine):
        while engine.scheduler.has_work():
            inputs = engine.prepare_inputs(engine.schedule())
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            engine.device.wait(step.sample_done)
            out = engine.read_outputs(step)
            out[0] = (out[0] + 1) % 50  # the learner "fixes" a token
            for req in engine.commit_outputs(step, out):
                engine.scheduler.release_if_done(req)

    v = checks.check_serial_loop(serial_loop)
    assert not v.passed and "loop=serial_loop gave engine.commit_outputs()" in v.message, v
    assert "watched" not in v.message, v.message
