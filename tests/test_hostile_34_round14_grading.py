"""Issue 34, round fourteen, grading: the judge compared the course's module-level lists, dicts
and sets by value, but not what they hold past a tuple of dataclass instances, nor a class's
attributes.  A cell that set a field of exercise 05's frozen ``Run`` with
``object.__setattr__`` (``lifetime_runs.RUNS``), or emptied ``HostLog._LAUNCHES``, kept every
identity, and a wrong answer then got full marks.  Each failed when written."""

from __future__ import annotations

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_fingerprint import Snapshot, _compare, _fingerprint
from overlap_course.checks import host_order, lifetime_runs

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine

_RIGHT_OUTPUTS = '''
def process_outputs(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
'''
_WRONG_OUTPUTS = _RIGHT_OUTPUTS.replace("num_inflight == 0:",
                                        "num_inflight == 0 and req.output_ids:")
_EASY_RUN = '''
from overlap_course.checks import lifetime_runs as _lr
object.__setattr__(_lr.RUNS[5], "prompts", _lr.RUNS[0].prompts)   # the no-token run, made easy
object.__setattr__(_lr.RUNS[5], "args", _lr.RUNS[0].args)
'''
_OVERLAPPED_AS_SERIAL = '''
def serial_loop(engine):   # wrong: this is the overlapped loop, not the serial one
    previous = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:
            engine.process_outputs(current)
            previous = None
        else:
            previous = current
'''
_NO_LAUNCHES = '''
from overlap_course.checks import host_order as _ho
_ho.HostLog._LAUNCHES.clear()      # the checker's map of launches, emptied in place
'''
_CHANGED = "your code changed what the checker runs on"


def _named(change, undo, name: str) -> None:
    """``change`` is seen by the fingerprint (naming ``name``) and by a snapshot taken before."""
    before, snapshot = _fingerprint(), Snapshot()
    assert snapshot.same() and _compare(before, _fingerprint()) == []
    change()
    try:
        assert not snapshot.same()
        assert name in _compare(before, _fingerprint())
    finally:
        undo()
    assert snapshot.same() and _compare(before, _fingerprint()) == []


def test_a_frozen_dataclass_field_set_in_place_is_named():
    run, prompts = lifetime_runs.RUNS[5], lifetime_runs.RUNS[5].prompts
    _named(lambda: object.__setattr__(run, "prompts", lifetime_runs.RUNS[0].prompts),
           lambda: object.__setattr__(run, "prompts", prompts),
           "overlap_course.checks.lifetime_runs.RUNS")


def test_a_class_attribute_dict_cleared_is_named():
    launches = dict(host_order.HostLog._LAUNCHES)
    _named(host_order.HostLog._LAUNCHES.clear,
           lambda: host_order.HostLog._LAUNCHES.update(launches),
           "overlap_course.checks.host_order.HostLog._LAUNCHES")


@pytest.mark.parametrize("check, answer, cell, name", [
    ("check_process_outputs", _WRONG_OUTPUTS, _EASY_RUN, "lifetime_runs.RUNS"),
    ("check_serial_loop", _OVERLAPPED_AS_SERIAL, _NO_LAUNCHES, "HostLog._LAUNCHES")])
def test_the_judge_fails_a_wrong_answer_after_the_checkers_data_changed(check, answer, cell,
                                                                        name):
    needs_the_engine()
    passed, message = judge.judge(check, [IMPORTS, answer, cell])
    assert passed is False and _CHANGED in message and name in message, message


@pytest.mark.parametrize("check, answer", [("check_process_outputs", _RIGHT_OUTPUTS),
                                           ("check_serial_loop", RIGHT_LOOP)])
def test_a_right_answer_still_passes(check, answer):
    needs_the_engine()
    passed, message = judge.judge(check, [IMPORTS, answer])
    assert passed is True, message
