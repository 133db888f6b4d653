"""Issue 34, round thirteen (engine, part A): batch_queue's before_sample could reorder or shorten
the engine's own plan (tokens to the wrong prompts, or a message naming commit_outputs); a
per_request commit could put a str or an id off the vocabulary into output_ids (a torch error, a
replaced device); request fields edited mid-run gave bare errors or ran silently greedy; an abort
from a signal handler, mid-stage, lost another prompt; stages were taken from another thread and
from inside plug-ins (a false "deferred step dropped", a RecursionError); a loop calling
``engine.scheduler.schedule()`` skipped on_round and queued aborts silently."""

from __future__ import annotations

import math
import sys
import threading
import time
import warnings

import pytest

import toy_engine as te
import toy_engine.scheduler as scheduler_module
from overlap_course.labs import plugins, plugins_2026
from toy_engine.config import MAX_SLOTS

PROMPTS = ["Once upon", "The cat", "A dog"]


def texts(outs):
    return [c.text for c in outs]


@pytest.fixture(scope="module")
def ring_engine(shipped):
    model, alphabet = shipped
    with plugins.ring(MAX_SLOTS):
        engine = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3), model=model,
                           tokenizer=te.CharTokenizer(alphabet))
    yield engine
    engine.close()


# ------------------------------------------------------------------ 01: before_sample's plan

def _shortest_first(engine, plan, held):
    plan.requests.sort(key=lambda r: len(r.prompt))
    return 0


def _drop_one(engine, plan, held):
    if len(plan.requests) > 1:
        plan.requests.pop()
    return 0


@pytest.mark.parametrize("before_sample", [_shortest_first, _drop_one])
def test_a_before_sample_that_changes_the_plan_is_refused_by_name(ring_engine, before_sample):
    reference = texts(ring_engine.generate(PROMPTS, max_new_tokens=12))
    with plugins.ring(3):
        with pytest.raises(plugins_2026.BadAnswer,
                           match=rf"before_sample={before_sample.__name__} changed plan "):
            ring_engine.generate(PROMPTS, max_new_tokens=12,
                                 loop=plugins_2026.batch_queue(2, before_sample))
    assert texts(ring_engine.generate(PROMPTS, max_new_tokens=12)) == reference


def test_a_before_sample_that_sorts_a_copy_runs_right(ring_engine):
    reference = texts(ring_engine.generate(PROMPTS, max_new_tokens=12))

    def reads(engine, plan, held):
        sorted(plan.requests, key=lambda r: len(r.prompt))
        return len(held)
    with plugins.ring(3):
        out = ring_engine.generate(PROMPTS, max_new_tokens=12,
                                   loop=plugins_2026.batch_queue(2, reads))
    assert texts(out) == reference


# ------------------------------------------------------------------ 02: a commit's output_ids

def _commit_storing(convert):
    def commit(req, tokens, eos_id, decode):
        for tok in tokens:
            if tok == eos_id:
                req.finish_reason = "eos"
                return
            req.output_ids.append(convert(tok, decode))
            req.text += decode([tok])
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
                return
    return commit


@pytest.mark.parametrize("convert", [lambda tok, decode: decode([tok]),
                                     lambda tok, decode: tok + 1000, lambda tok, decode: -1,
                                     lambda tok, decode: float(tok)])
def test_a_commit_storing_no_token_id_is_refused_before_the_device(engine_pool, convert):
    engine = engine_pool(mode="serial", max_batch_size=2)
    pid = engine.device.pid
    with pytest.raises(TypeError, match=r"prompt 0's commit, replaced on the request by a "
                                        r"plug-in \(per_request\(commit=commit\)\), stored .* at "
                                        r"req\.output_ids\[0\].*vocabulary has"):
        engine.generate(PROMPTS[:2], max_new_tokens=8,
                        on_round=plugins.per_request(commit=_commit_storing(convert)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no device replaced
        engine.generate(PROMPTS[:2], max_new_tokens=2)
    assert engine.device.pid == pid


def test_a_commit_storing_token_ids_runs_as_the_engines_own(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=2)
    reference = texts(engine.generate(PROMPTS[:2], max_new_tokens=8))
    out = engine.generate(PROMPTS[:2], max_new_tokens=8, on_round=plugins.per_request(
        commit=_commit_storing(lambda tok, decode: tok)))
    assert texts(out) == reference


# ------------------------------------------------------------------ 03: fields edited mid-run

def _edit(field, value):
    def on_round(engine, r):
        if r == 3:
            for req in engine.requests:
                setattr(req, field, value)
    return on_round


@pytest.mark.parametrize("field, value", [("max_new_tokens", 300), ("stop", None), ("row", 7),
                                          ("temperature", math.nan), ("prompt_ids", [1, 2])])
def test_a_fixed_field_changed_by_on_round_is_refused_naming_it(engine_pool, field, value):
    engine = engine_pool(mode="zos", max_batch_size=2)
    reference = texts(engine.generate(PROMPTS, max_new_tokens=12))
    pid = engine.device.pid
    with pytest.raises(ValueError, match=rf"prompt 0's req\.{field} was changed from .* by "
                                         rf"on_round=on_round"):
        engine.generate(PROMPTS, max_new_tokens=12, temperature=0.8, on_round=_edit(field, value))
    assert engine.device.pid == pid
    assert texts(engine.generate(PROMPTS, max_new_tokens=12)) == reference


def test_a_field_changed_by_a_process_outputs_plug_in_is_refused_naming_it(engine_pool):
    """Refused as the plug-in returns (round 19; it was at the next round's schedule)."""
    engine = engine_pool(mode="serial", max_batch_size=2)

    def process(eng, step):
        eng.device.wait(step.sample_done)
        for req in eng.commit_outputs(step, eng.read_outputs(step)):
            req.stop = None
            eng.scheduler.release_if_done(req)
    with pytest.raises(ValueError, match=r"req\.stop was changed from \(\) to None by "
                                         r"process_outputs=process"):
        engine.generate(PROMPTS, max_new_tokens=8, process_outputs=process)


def test_max_new_tokens_lowered_mid_run_ends_the_request_sooner(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=2)
    out = engine.generate(PROMPTS, max_new_tokens=12, on_round=_edit("max_new_tokens", 4))
    assert [len(c.token_ids) for c in out] == [4, 4, 4]


# ------------------------------------------------------------------ 04: abort in a signal handler

def test_an_abort_from_a_handler_mid_schedule_waits_for_the_round_boundary(engine_pool):
    """The handler runs where a signal may land: at the scheduler's pop of the request it has
    just sized (a trace function stands in for the signal's timing)."""
    engine = engine_pool(mode="zos", max_batch_size=1)
    reference = [(c.text, c.finish_reason) for c in engine.generate(PROMPTS, max_new_tokens=6)]
    lines = open(scheduler_module.__file__).read().splitlines()
    aborted = []

    def handler():
        waiting = engine.scheduler.waiting
        if not aborted and len(waiting) >= 2:
            aborted.append(waiting[0].index)
            engine.abort(waiting[0].id)

    def local(frame, event, arg):
        if event == "line" and "self.waiting.popleft()" in lines[frame.f_lineno - 1]:
            handler()
        return local

    def tracer(frame, event, arg):
        code = frame.f_code
        if code.co_filename == scheduler_module.__file__ and code.co_name in ("schedule",
                                                                              "plan_round"):
            return local
        return None
    sys.settrace(tracer)
    try:
        out = engine.generate(PROMPTS, max_new_tokens=6)
    finally:
        sys.settrace(None)
    assert aborted == [0]
    assert out[0].finish_reason == "abort"
    assert [(c.text, c.finish_reason) for c in out[1:]] == reference[1:]


# ------------------------------------------------------------------ 05: another thread's stages

def test_a_stage_from_another_thread_during_a_run_is_refused_and_the_run_is_right(engine_pool):
    engine = engine_pool(mode="zos", max_batch_size=2)
    reference = texts(engine.generate(PROMPTS[:2], max_new_tokens=8))
    in_round, go_on, loop_thread, result = threading.Event(), threading.Event(), [], {}

    def on_round(eng, r):
        if r == 2 and threading.get_ident() == loop_thread[0]:
            in_round.set()
            go_on.wait(30)

    def serve():
        loop_thread.append(threading.get_ident())
        try:
            result["out"] = texts(engine.generate(PROMPTS[:2], max_new_tokens=8,
                                                  on_round=on_round))
        except Exception as err:  # noqa: BLE001 - reported below
            result["err"] = err
    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert in_round.wait(30)
        with pytest.raises(RuntimeError, match=r"engine\.schedule\(\) was called from another "
                                               r"thread than the one running generate"):
            engine.schedule()
    finally:
        go_on.set()
        thread.join(60)
    assert result == {"out": reference}


# ------------------------------------------------------------------ 10: a plug-in's stages

def _peek(engine, plan, held):
    engine.schedule()
    return 0


def test_a_before_sample_calling_schedule_is_refused_naming_it(ring_engine):
    with plugins.ring(3), pytest.raises(RuntimeError, match=r"engine\.schedule\(\) was called "
                                                            r"from inside the plug-in batch_queue: "
                                                            r"before_sample=_peek"):
        ring_engine.generate(PROMPTS, max_new_tokens=10, loop=plugins_2026.batch_queue(2, _peek))


@pytest.mark.parametrize("guarded", [True, False])
def test_on_round_calling_schedule_is_refused_naming_it(engine_pool, guarded):
    engine = engine_pool(mode="zos", max_batch_size=3)
    reference = texts(engine.generate(PROMPTS, max_new_tokens=10))
    once = []

    def peeks(eng, r):
        if r == 2 and not (guarded and once):
            once.append(r)
            eng.schedule()
    with pytest.raises(RuntimeError, match=r"engine\.schedule\(\) was called from inside the "
                                           r"plug-in on_round=peeks") as caught:
        engine.generate(PROMPTS, max_new_tokens=10, on_round=peeks)
    assert "dropped" not in str(caught.value)
    assert texts(engine.generate(PROMPTS, max_new_tokens=10)) == reference


def test_a_process_outputs_plug_in_calling_process_outputs_is_refused_by_name(engine_pool):
    """Round nineteen: refused as StageInPlugin (it was a RecursionError ~1000 frames deep),
    which the checks name as calls_itself (checks/lesson05.py)."""
    engine = engine_pool(mode="serial", max_batch_size=3)
    with pytest.raises(RuntimeError, match=r"engine\.process_outputs\(\) was called from "
                                           r"inside the plug-in process_outputs=.*, the stage "
                                           r"it replaces"):
        engine.generate(PROMPTS, max_new_tokens=4,
                        process_outputs=lambda eng, step: eng.process_outputs(step))


# ------------------------------------------------------------------ 13: scheduler.schedule()

def _bypassing_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.scheduler.schedule()
        if plan is None:
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))


def test_a_loop_calling_the_schedulers_schedule_is_refused_naming_engine_schedule(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=3)
    reference = texts(engine.generate(PROMPTS, max_new_tokens=8))
    with pytest.raises(RuntimeError,
                       match=r"engine\.scheduler\.schedule\(\) plans a round behind the "
                             r"engine's back.*plan = engine\.schedule\(\)"):
        engine.generate(PROMPTS, max_new_tokens=8, loop=_bypassing_loop,
                        on_round=plugins.aborts(lambda eng, rid: eng.abort(rid), [(2, 0)]))
    assert texts(engine.generate(PROMPTS, max_new_tokens=8)) == reference


def test_an_abort_from_another_thread_is_applied_with_the_engines_schedule(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=3)
    started = threading.Event()

    def slow(eng, r):
        started.set()
        time.sleep(0.01)
    aborter = threading.Thread(
        target=lambda: (started.wait(30), engine.abort(engine.requests[0].id)))
    aborter.start()
    out = engine.generate(PROMPTS, max_new_tokens=60, on_round=slow)
    aborter.join(30)
    assert out[0].finish_reason == "abort" and len(out[0].token_ids) < 60
