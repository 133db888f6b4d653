"""Issue 34's third hostile round, the judge's and the engine's cases (the checks' are in
tests/test_hostile_34_round3_checks.py, the command lines' and files' in
tests/test_hostile_34_round3_files.py): each failed before its fix.  A submission that swaps a
checker's helper and puts it back before the check ends, that reshapes the engine it hands the
check, or leaves a Timer running; prompts and abort ids the engine took without a word."""

from __future__ import annotations

import pytest

from overlap_course import checks
from hostile_support import SELF_RESTORING, SERIAL_LOOP
from hostile_support import a_false_verdict as _a_false_verdict


@pytest.mark.timeout(120)
def test_a_self_restoring_patch_does_not_pass_the_judge():
    """``judge.judge('check_serial_loop', [SELF_RESTORING])`` is ``(True, 'the serial loop
    reproduces the reference: 4 prompts, 0 rounds, ...')``: a loop that does nothing, graded
    as passed (in 5 s, through the real fresh judge process)."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [SELF_RESTORING])
    assert not passed, message


@pytest.mark.timeout(60)
def test_control_a_loop_that_runs_no_round_fails_the_check():
    _a_false_verdict(lambda: checks.check_serial_loop(lambda engine: None))


@pytest.mark.timeout(60)
def test_generate_refuses_a_huge_range_of_prompts_by_its_first_item(make_engine):
    """``engine.generate(range(10**10))`` raised MemoryError: ``check_prompts`` copies the whole
    sequence (``list(prompts)``) before it looks at one item."""
    engine = make_engine(mode="serial", max_batch_size=2)
    with pytest.raises(TypeError, match="prompt"):  # "prompt 0 must be a str" or "prompts must"
        engine.generate(range(10**10), max_new_tokens=1)
    assert engine.generate(["Once"], max_new_tokens=2)[0].finish_reason == "length"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("request_id", [True, 1.0], ids=["bool", "float"])
def test_abort_refuses_an_id_that_is_not_an_integer(make_engine, request_id):
    """``engine.abort(True)`` / ``engine.abort(1.0)`` from ``on_round`` aborts request 1 (found
    by ``r.id == request_id``), where every other integer argument of the engine refuses a bool
    or a float with a TypeError naming it."""
    engine = make_engine(mode="serial", max_batch_size=2)
    errors = []

    def on_round(engine, round):
        if round == 1:
            try:
                engine.abort(request_id)
            except (TypeError, ValueError) as err:
                errors.append(err)
    out = engine.generate(["Once upon a time", "The bird said"], max_new_tokens=6,
                          on_round=on_round)
    assert [c.finish_reason for c in out] == ["length", "length"] and errors, out


# A wrong idle_fraction (it returns 0.0 whatever the timeline), judged on an `engine` the
# submission's own cells reshaped: the run's device spans laid end to end, its stats set to 0.
FORGED_ENGINE = '''
import dataclasses
import toy_engine as te

engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
_t, _spans = 0.0, []
for _s in engine.timeline.spans:
    if _s.lane == "device":
        _d = _s.end_ms - _s.start_ms
        _s = dataclasses.replace(_s, start_ms=_t, end_ms=_t + _d)
        _t += _d
    _spans.append(_s)
engine.timeline.spans[:] = _spans
engine.stats = dataclasses.replace(engine.stats, device_idle_fraction=0.0)


def idle_fraction(timeline):
    return 0.0
'''


@pytest.mark.timeout(120)
def test_the_judge_does_not_take_the_submissions_engine_on_trust():
    """``judge.judge('check_idle_fraction', [FORGED_ENGINE])`` is ``(True, 'your idle fraction
    equals engine.stats.device_idle_fraction, and it follows the timeline ...')``: the graded
    call's ``engine`` comes from the submission's cells, which may reshape its timeline and
    stats until a constant function is right (only its type is checked)."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_idle_fraction", [FORGED_ENGINE])
    assert not passed, message


@pytest.mark.timeout(120)
def test_control_the_judge_fails_a_constant_idle_fraction_on_a_plain_run():
    from overlap_course.build import judge
    plain = FORGED_ENGINE.split("_t, _spans")[0] + "def idle_fraction(timeline):\n    return 0.0\n"
    passed, message = judge.judge("check_idle_fraction", [plain])
    assert not passed, message


# The judge trusts a verdict only if no thread of the submission still runs; it knows a
# submission's thread by its target's code (``<submission cell N>``), which a Timer (target
# None, run in threading.py) or a Thread around functools.partial does not show.
DELEGATES = "import functools, threading, time\n" + SERIAL_LOOP


LEFT_THREADS = {
    "timer": "threading.Timer(100, lambda: None).start()\n",
    "partial": "threading.Thread(target=functools.partial(time.sleep, 100), daemon=True).start()\n",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thread", sorted(LEFT_THREADS))
def test_the_judge_sees_every_thread_the_submission_leaves_running(thread):
    """``(True, 'the serial loop reproduces the reference ...')`` with a Timer / a partial's
    thread still running (the same cell with ``Thread(target=lambda: ...)``: not trusted)."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [DELEGATES + LEFT_THREADS[thread]])
    assert not passed and "thread" in message, message


@pytest.mark.timeout(120)
def test_control_the_judge_sees_a_plain_thread_left_running():
    from overlap_course.build import judge
    cell = DELEGATES + "threading.Thread(target=lambda: time.sleep(100), daemon=True).start()\n"
    passed, message = judge.judge("check_serial_loop", [cell])
    assert not passed and "thread" in message, message
