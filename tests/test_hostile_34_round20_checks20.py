"""Round twenty's blind round (issue 34): notebook 07's check_commit names a commit that appends
the run's last token twice (its verdict changed with the checks run before it, none naming the
token) and one that goes on appending after a stop string's cut (it said "your commit raised
ValueError", the engine's guard); the loop checks name the edit of a loop the checker stopped
after 1000 schedules (they guessed `except Exception: pass`); check_token_leak takes a
read-only mapping."""

import types

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import pool
from overlap_course.labs import plugins_2026, shipped_2026
from toy_engine.sequence import Request

from loops_for_tests import zos_loop


def _right(req, tokens, eos_id, decode):
    Request.commit(req, tokens, eos_id, decode)


def _twice(req, tokens, eos_id, decode):
    """The engine's commit, then the run's last token again while the request is unfinished."""
    Request.commit(req, tokens, eos_id, decode)
    if req.finish_reason is None and tokens:
        req.output_ids.append(tokens[-1])


def _on_after_stop(req, tokens, eos_id, decode):
    """The engine's commit with no `return` after a stop string's cut."""
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"


def test_check_commit_names_a_token_appended_twice_whatever_ran_before():
    alone = checks.check_commit(_twice)
    assert not alone.passed and alone.category == "extra_tokens", alone
    assert "1 more than the run gave (the run's last token a second time)" in alone.message
    assert "Check the limit" not in alone.message and "cut both alike" not in alone.message
    assert checks.check_commit(_right).passed
    assert repr(checks.check_commit(_twice)) == repr(alone)
    assert not checks.check_commit(lambda req, tokens, eos_id, decode: (req, tokens))
    assert repr(checks.check_commit(_twice)) == repr(alone)


def test_check_commit_names_a_commit_that_goes_on_after_a_stop_string():
    v = checks.check_commit(_on_after_stop)
    assert not v.passed and v.category == "past_stop", v
    assert "raised" not in v.message and "cut a stop string off" in v.message, v
    assert "went on appending" in v.message, v


def test_check_commit_still_names_a_stop_string_left_uncut():
    def uncut(req, tokens, eos_id, decode):
        for tok in tokens:
            if tok == eos_id:
                req.finish_reason = "eos"
                return
            req.output_ids.append(tok)
            req.text += decode([tok])
            if any(req.text.endswith(s) for s in req.stop):
                req.finish_reason = "stop"
                return
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
                return
    v = checks.check_commit(uncut)
    assert not v.passed and v.category not in ("past_stop", "extra_tokens", "raised"), v


def _serial_pops(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
        for r in plan.requests:
            if len(r.output_ids) > 3 and not r.finished:
                r.output_ids.pop()


def _zos_pops(engine):
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
        for r in plan.requests:
            if len(r.output_ids) > 3 and not r.finished:
                r.output_ids.pop()


@pytest.mark.parametrize("check, loop", [(checks.check_serial_loop, _serial_pops),
                                         (checks.check_zos_loop, _zos_pops)],
                         ids=["serial", "zos"])
def test_a_loop_stopped_after_1000_schedules_is_told_its_edit(check, loop):
    v = check(loop)
    assert not v.passed and v.category == "edits_requests", v
    assert "removed tokens from prompt 0's `req.output_ids`" in v.message, v
    assert "except Exception" not in v.message and "catches" not in v.message, v
    assert "1000 times" in v.message, v


def test_a_loop_that_swallows_errors_is_still_told_so():
    def swallows(engine):
        while engine.scheduler.has_work():
            try:
                engine.prepare_inputs(engine.schedule())
            except Exception:  # noqa: BLE001 - the mistake under test
                pass
    v = checks.check_zos_loop(swallows)
    assert not v.passed and v.category == "spins" and "except Exception" in v.message, v
    assert zos_loop is not None  # the shared right loop still imports


@pytest.fixture(scope="module")
def leaked():
    zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3))
    zos.generate(pool.PROMPTS + ["A little cat"], max_new_tokens=16, stop=[" the"],
                 loop=plugins_2026.future_key(shipped_2026.key))
    yield zos
    zos.close()


def test_check_token_leak_takes_a_read_only_mapping(leaked):
    assert checks.check_token_leak((6, {1: 0, 2: 1}), leaked).passed
    v = checks.check_token_leak((6, types.MappingProxyType({1: 0, 2: 1})), leaked)
    assert v.passed, v
    wrong = checks.check_token_leak((6, types.MappingProxyType({1: 0, 2: 2})), leaked)
    assert not wrong.passed and wrong.category == "wrong_owner", wrong
    whole = checks.check_token_leak(types.MappingProxyType({6: {1: 0}}), leaked)
    assert not whole.passed and whole.category == "shape", whole
