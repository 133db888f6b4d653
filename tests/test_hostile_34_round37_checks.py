"""Issue 34, round thirty-seven, blind learner.  Exercise 03's verdicts on its speculative run
(its second) carried no run label, so a mistake made only there read as the first run's, with
that run's round numbers; and "sample before the previous step" blamed the `title_case`
constraint in runs that have none."""

from __future__ import annotations

import pytest

from overlap_course import checks

SPEC = "with speculative decoding (3 drafts per round): "


def _zos(only: str, sample_first: bool = False, process_early: bool = False):
    """Exercise 03's loop: the previous step processed before the forward (``process_early``)
    or after this round's sample (``sample_first``) in the runs where ``only`` holds."""
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
        if previous is not None:
            engine.correct_on_device(inputs)
        if odd and {process_early} and previous is not None:
            engine.process_outputs(previous)
            previous = None
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs) if odd and {sample_first} else None
        if previous is not None:
            engine.process_outputs(previous)
            previous = None
        step = step or engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(step)
        else:
            previous = step
''', space)
    return space["zos_loop"]


SPEC_RUN = ("engine.config.num_draft_tokens > 0 and engine.config.constraint is None and not "
            "any(r.prompt.startswith('Tom was happy') for r in engine.requests)")
ENDINGS_NO_DRAFTS = "engine.config.constraint is None and not engine.config.num_draft_tokens"


@pytest.mark.parametrize("kwargs", [{"process_early": True}, {"sample_first": True}])
def test_a_mistake_only_in_the_speculative_run_is_named_with_that_run(kwargs):
    """Before: "round 1 (decode, prompts [0, 1, 2]): its results were processed before ...",
    read as the first run's."""
    v = checks.check_zos_loop(_zos(SPEC_RUN, **kwargs))
    assert not v.passed and v.message.startswith(SPEC), v.message


def test_sample_first_names_the_constraint_only_where_it_is_on():
    """Before: "with the `title_case` constraint on, round 2's mask was built without ..." in
    the endings run, which has no constraint."""
    v = checks.check_zos_loop(_zos(ENDINGS_NO_DRAFTS, sample_first=True))
    assert not v.passed and "in the endings run" in v.message, v.message
    assert "constraint on" not in v.message, v.message
    assert "with the `title_case` constraint of this check's first run" in v.message, v.message
    v = checks.check_zos_loop(_zos("True", sample_first=True))
    assert not v.passed and "with the `title_case` constraint on, round" in v.message, v.message
