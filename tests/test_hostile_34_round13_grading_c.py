"""Issue 34, round thirteen, grading (c): the judge compared the checker's world by identity
only, so a cell that changed a check's workload in place (``lesson02._LONG_RUN[1]
["max_new_tokens"] = 24``) passed a loop that stops too early; ``torch.set_default_dtype``
(which rebinds ``torch.Storage``) and ``torch.set_default_device('cpu')`` (whose device mode,
imported by the cell, counted as the submission's code, and whose slowness let the time limit's
own trace hook be blamed on the learner) failed right loops; and an answer whose metaclass alone
defines ``__call__`` was called by the judge, where the kernel cannot call it.  Each failed
when written."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_fingerprint import Snapshot, _compare, _fingerprint
from overlap_course.build.judge_values import code_answer
from overlap_course.build.judge_watch import Watch
from overlap_course.checks import lesson02, lifetime_runs, pool, sandbox

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine


_CAPPED_LOOP = '''
def serial_loop(engine):   # wrong: stops after 48 rounds, whatever work is left
    for _ in range(48):
        if not engine.scheduler.has_work():
            break
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        engine.process_outputs(step)
'''
_SHORTEN = '''
from overlap_course.checks import lesson02 as _l2
_l2._LONG_RUN[1]["max_new_tokens"] = 24    # the check's own workload, changed in place
'''


def test_a_workload_changed_in_place_does_not_pass_a_loop_that_stops_early():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _CAPPED_LOOP, _SHORTEN])
    assert passed is False, message
    assert "changed what the checker runs on (overlap_course.checks.lesson02._LONG_RUN)" in message


_IN_PLACE = [("overlap_course.checks.pool.PROMPTS", lambda: pool.PROMPTS, 0, "Once"),
             ("overlap_course.checks.pool.ENDINGS_PROMPTS", lambda: pool.ENDINGS_PROMPTS, 2, "x"),
             ("overlap_course.checks.pool.SECOND_RUN", lambda: pool.SECOND_RUN,
              "max_new_tokens", 4),
             ("overlap_course.checks.pool.ENDINGS_RUN", lambda: pool.ENDINGS_RUN, "stop", ("a",)),
             ("overlap_course.checks.lesson02._SERIAL_RUNS", lambda: lesson02._SERIAL_RUNS[3][2],
              "num_draft_tokens", 1),
             ("overlap_course.checks.lifetime_runs.STOP_RUN", lambda: lifetime_runs.STOP_RUN,
              "max_new_tokens", 24.0)]  # equal to 24, but not the int the checker holds


@pytest.mark.parametrize("name, box, key, value", _IN_PLACE, ids=[c[0] for c in _IN_PLACE])
def test_each_workload_changed_in_place_is_named_by_the_fingerprint_and_the_snapshot(
        name, box, key, value):
    before, snapshot = _fingerprint(), Snapshot()
    held = box()[key]
    box()[key] = value
    try:
        assert name in _compare(before, _fingerprint())
        assert not snapshot.same()
    finally:
        box()[key] = held
    assert _compare(before, _fingerprint()) == [] and snapshot.same()


def test_the_checkers_books_change_freely():
    before = _fingerprint()
    pool._PRINTS["probe"] = 1
    try:
        assert _compare(before, _fingerprint()) == []
    finally:
        del pool._PRINTS["probe"]


def test_a_right_loop_after_set_default_dtype_passes_in_the_judge():
    needs_the_engine()
    dtype = "import torch\ntorch.set_default_dtype(torch.float64)  # work in double precision"
    passed, message = judge.judge("check_serial_loop", [IMPORTS, dtype, RIGHT_LOOP])
    assert passed is True, message


def test_torch_storage_rebound_by_set_default_dtype_is_torchs_own_and_another_is_not():
    import torch
    before, dtype, storage = _fingerprint(), torch.get_default_dtype(), torch.Storage
    try:
        torch.set_default_dtype(torch.float16)
        assert _compare(before, _fingerprint()) == []
        torch.Storage = type("Storage", (storage,), {})  # the learner's own class
        assert "torch.Storage" in _compare(before, _fingerprint())
    finally:
        torch.set_default_dtype(dtype)
        torch.Storage = storage
    assert _compare(before, _fingerprint()) == []


def test_a_right_loop_after_set_default_device_cpu_passes_in_the_judge():
    needs_the_engine()
    device = "import torch\ntorch.set_default_device('cpu')  # keep every tensor on the CPU"
    passed, message = judge.judge("check_serial_loop", [IMPORTS, device, RIGHT_LOOP])
    assert passed is True, message


def test_the_time_limits_trace_turned_off_is_judged_by_the_verdict_not_blamed_at_once():
    """CPython turns the time limit's trace off (a ``sys.settrace`` audit event) when its
    TimeUp fires inside the trace function, wherever the learner's code is: seen so after
    ``set_default_device('cpu')`` made a check slow.  With the limit's trace set, the event is
    judged by the verdict (a pass is voided), as a lost profile hook is; with another, blamed."""
    space = {}
    exec(compile("def call(f):\n    return f()\n", "<submission-9>", "exec"), space)
    watch = Watch()
    watch.changes = lambda: []  # the check is running
    on_call = sandbox._tracer(time.monotonic() + 60, threading.get_ident(),
                              sandbox._limits_class(60.0), threading.Event())[1]
    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        space["call"](lambda: watch.audited("sys.settrace", ()))
    finally:
        sys.settrace(previous)
    assert watch.tracing == ["sys.settrace"] and watch.hooks == []
    space["call"](lambda: watch.audited("sys.settrace", ()))
    assert watch.hooks == ["sys.settrace"]


def test_an_object_whose_metaclass_alone_has_call_is_not_called_by_the_judge():
    def share(timeline):
        return timeline.device_idle_fraction()

    class Meta(type):
        __call__ = staticmethod(share)  # the metaclass's: Python never calls an instance so

    answer = object.__new__(Meta("Answer", (), {}))
    with pytest.raises(TypeError):
        answer(None)
    found = code_answer("idle_fraction", answer, lambda code: True)
    assert isinstance(found, str) and "must be a function your cells define" in found
