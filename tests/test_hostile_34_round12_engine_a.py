"""Issue 34, round twelve (engine, part A): ``engine.config`` replaced during a run went live in
its stages (wrong text, a bare IndexError); ``abort`` compared ids with the learner's ``__eq__``
and named an attribute that does not exist; a step kept from a run whose device was replaced
hung ``flush`` forever; generator plug-ins under a decorator, a cache, a staticmethod or a lambda
slipped through; an engine serving from a daemon thread started a device process as Python
exited (SIGABRT, tracebacks); a falsy correction object was replaced by the default; two rings
in two threads left ``NUM_SLOTS`` changed; ``generate``'s plug-ins were not checked for their
arguments; the labs' deep loops ran drafts uncorrected; a Decimal was "not a number"."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import textwrap
import threading
from decimal import Decimal
from pathlib import Path

import pytest

import toy_engine as te
from overlap_course.labs import plugins, plugins_2026
from toy_engine import engine as engine_module
from toy_engine.config import MAX_SLOTS
from toy_engine import device as device_module
from loops_for_tests import zos_loop

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Once upon", "The cat", "A dog"]


def texts(outs):
    return [c.text for c in outs]


# ------------------------------------------------------------------ 01: engine.config during a run

@pytest.mark.parametrize("change", [dict(num_draft_tokens=2), dict(block_size=32),
                                    dict(block_size=8)])
def test_a_config_replaced_from_a_plug_in_is_refused_and_the_run_keeps_its_own(engine_pool, change):
    engine = engine_pool(mode="serial")
    reference = texts(engine.generate(PROMPTS, max_new_tokens=30))
    built = engine.config

    def on_round(eng, round):
        if round == 3:
            eng.config = dataclasses.replace(eng.config, **change)
    (field, value), = change.items()
    with pytest.raises(RuntimeError, match=rf"engine\.config cannot be replaced while generate "
                                           rf"runs.*{field}={value}"):
        engine.generate(PROMPTS, max_new_tokens=30, on_round=on_round)
    assert engine.config is built
    assert texts(engine.generate(PROMPTS, max_new_tokens=30)) == reference


def test_a_config_replaced_from_another_thread_is_refused_there_and_the_run_is_right(engine_pool):
    engine = engine_pool(mode="serial")
    reference = texts(engine.generate(PROMPTS, max_new_tokens=30))
    started, replaced, errors = threading.Event(), threading.Event(), []

    def on_round(eng, round):
        if round == 2:
            started.set()
            replaced.wait(10)

    def cell():
        started.wait(10)
        try:
            engine.config = dataclasses.replace(engine.config, block_size=32)
        except RuntimeError as err:
            errors.append(err)
        replaced.set()
    thread = threading.Thread(target=cell)
    thread.start()
    outs = engine.generate(PROMPTS, max_new_tokens=30, on_round=on_round)
    thread.join(10)
    assert texts(outs) == reference
    assert len(errors) == 1 and "block_size=32" in str(errors[0])
    # Between runs the assignment is taken, and generate refuses it by name, as before.
    engine.config = dataclasses.replace(engine.config, block_size=32)
    with pytest.raises(ValueError, match=r"engine\.config was replaced"):
        engine.generate(PROMPTS, max_new_tokens=3)
    engine.config = engine._built_with


# ------------------------------------------------------------------ 04, 13: abort's id

class _Lying(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__


class _Raising(int):
    def __eq__(self, other):
        raise RuntimeError("the learner's __eq__")
    __hash__ = int.__hash__


@pytest.mark.parametrize("cls", [_Lying, _Raising])
def test_abort_compares_the_plain_value_of_an_int_subclass(engine_pool, cls):
    engine = engine_pool(mode="serial")

    def on_round(eng, round):
        if round == 1:
            eng.abort(cls(eng.requests[2].id))
    outs = engine.generate(PROMPTS, max_new_tokens=10, on_round=on_round)
    assert [c.finish_reason for c in outs] == ["length", "length", "abort"]


def test_abort_refusal_names_an_attribute_a_completion_has(engine_pool):
    engine = engine_pool(mode="serial")
    completion = engine.generate("Once", max_new_tokens=3)[0]
    with pytest.raises(TypeError, match=r"Completion\.request_id") as refused:
        engine.abort("0")
    assert "Completion.id" not in str(refused.value)
    assert isinstance(completion.request_id, int)


# ------------------------------------------------------------------ 05: a step of a replaced device

@pytest.mark.timeout(120)
def test_a_step_kept_from_a_run_whose_device_was_replaced_is_refused_not_waited_for(make_engine):
    engine = make_engine(mode="zos", num_draft_tokens=2)
    kept = []

    def bad_correction(meta, accepted, block_size):
        raise ValueError("the learner's correction has a bug")

    loop = zos_loop(seen=lambda inputs, step: kept.append(step))  # keeps each step
    pid = engine.device.pid
    with pytest.raises(te.DeviceError, match="the learner's correction has a bug"):
        engine.generate(PROMPTS, max_new_tokens=20, loop=loop, correction=bad_correction)
    assert engine.device.pid != pid and kept  # replaced; steps of the old device kept
    answer = []

    def flush():
        try:
            engine.flush(kept[-1])
            answer.append("returned")
        except Exception as err:  # noqa: BLE001 - the answer under test
            answer.append(err)
    thread = threading.Thread(target=flush, daemon=True)
    thread.start()
    thread.join(20)
    assert answer, "engine.flush(a step of the replaced device) still waits after 20 s"
    assert isinstance(answer[0], device_module.ForeignEvent), answer
    assert "another device" in str(answer[0])
    with pytest.raises(device_module.ForeignEvent):
        engine.process_outputs(kept[-1])
    assert texts(engine.generate(PROMPTS, max_new_tokens=8)) == texts(
        engine.generate(PROMPTS, max_new_tokens=8, loop=te.loops.serial_loop))


# ------------------------------------------------------------------ 06: bodies that never run

def _gen_on_round(engine, round):
    yield


async def _async_on_round(engine, round):
    pass


def _gen_abort(engine, request_id):
    engine.abort(request_id)
    yield


def _timed(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


WRAPPED = {
    "a functools.wraps decorator around a generator": _timed(_gen_on_round),
    "functools.lru_cache(generator)": functools.lru_cache(_gen_on_round),
    "functools.cache(generator)": functools.cache(_gen_on_round),
    "staticmethod(generator)": staticmethod(_gen_on_round),
    "a functools.wraps decorator around an async def": _timed(_async_on_round),
    "a partial of a decorated generator": functools.partial(_timed(_gen_on_round)),
}


@pytest.mark.parametrize("kind", WRAPPED)
def test_a_wrapped_generator_or_async_plug_in_is_refused_before_the_run(engine_pool, kind):
    engine = engine_pool(mode="zos")
    with pytest.raises(TypeError, match=r"on_round must be a plain function, but "
                                        r"_(gen|async)_on_round"):
        engine.generate(["Once"], max_new_tokens=5, on_round=WRAPPED[kind])
    with pytest.raises(TypeError, match=r"aborts: abort must be a plain function"):
        plugins.aborts(_timed(_gen_abort), [(2, 1)])
    with pytest.raises(TypeError, match=r"per_request: commit must be a plain function"):
        plugins.per_request(commit=WRAPPED[kind])


def test_a_plug_in_that_returns_a_generator_is_refused_when_called(engine_pool):
    """A lambda returning a generator expression cannot be told from a plain function before
    the call: its answer is checked, and refused naming the plug-in."""
    engine = engine_pool(mode="zos")
    reference = texts(engine.generate(PROMPTS, max_new_tokens=8))
    ran = []
    lazy = {  # what each plug-in would do, if its body ran
        "on_round": lambda engine, round: (ran.append(round) for _ in "x"),
        "loop": lambda engine: (te.loops.zos_loop(engine) for _ in "x"),
        "process_outputs": lambda engine, step: (ran.append(step) for _ in "x"),
    }
    for name, plugin in lazy.items():
        with pytest.raises(TypeError, match=rf"{name}=<lambda> returned a generator .*its body "
                                            rf"never ran"):
            engine.generate(PROMPTS, max_new_tokens=8, **{name: plugin})
    with pytest.raises(TypeError, match=r"aborts: abort=<lambda> returned a generator"):
        engine.generate(PROMPTS, max_new_tokens=8, on_round=plugins.aborts(
            lambda engine, request_id: (engine.abort(request_id) for _ in "x"), [(2, 1)]))
    with pytest.raises(TypeError, match=r"per_request: commit=<lambda> returned a generator"):
        engine.generate(PROMPTS, max_new_tokens=8, on_round=plugins.per_request(
            commit=lambda req, tokens, eos_id, decode: (req for _ in "x")))
    assert not ran
    assert texts(engine.generate(PROMPTS, max_new_tokens=8)) == reference  # ready again


def test_a_decorated_plain_plug_in_still_runs(engine_pool):
    engine = engine_pool(mode="zos")
    seen = []

    @_timed
    def on_round(engine, round):
        seen.append(round)
    engine.generate(["Once"], max_new_tokens=5, on_round=on_round)
    engine.generate(["Once"], max_new_tokens=5, on_round=staticmethod(on_round))
    assert seen


# ------------------------------------------------------------------ 07: quiet exit

SERVING_AT_EXIT = textwrap.dedent("""
    import threading
    import toy_engine as te
    from overlap_course.labs import plugins

    engine = {build}
    started = threading.Event()

    def serve():
        while True:  # a learner's little server: a daemon thread serving prompts, run after run
            engine.generate(["Once upon"] * 3, max_new_tokens=30)
            started.set()

    threading.Thread(target=serve, daemon=True).start()
    started.wait()
    print("main ends")
""")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("build", ["plugins.ring_engine()",
                                   "te.Engine(te.EngineConfig(mode='zos', max_batch_size=3))"])
def test_an_engine_serving_from_a_daemon_thread_exits_quietly_every_time(build):
    """Round twelve saw 5 or 6 noisy exits in 12 (SIGABRT, a device process started during
    shutdown, the forkserver's EOFError)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = SERVING_AT_EXIT.format(build=build)
    for attempt in range(6):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=100)
        assert (done.returncode, done.stdout, done.stderr) == (0, "main ends\n", ""), attempt


def test_no_device_process_starts_once_python_exits(monkeypatch, make_engine):
    engine = make_engine(mode="serial")
    monkeypatch.setattr(engine_module, "_EXITING", threading.Event())
    engine_module._EXITING.set()
    with pytest.raises(RuntimeError, match="Python is exiting"):
        te.Engine(te.EngineConfig(mode="serial"))
    assert texts(engine.generate("Once", max_new_tokens=3))  # a live device still runs


# ------------------------------------------------------------------ 09: a falsy correction object

class _Correction:
    """A correction as a callable object that keeps its calls (so its len is 0 at first)."""

    def __init__(self):
        self.calls = []

    def __call__(self, meta, accepted, block_size):
        raise RuntimeError("the learner's correction ran")

    def __len__(self):
        return len(self.calls)


def test_a_falsy_correction_object_is_the_one_that_runs(make_engine):
    engine = make_engine(mode="zos", num_draft_tokens=2)
    with pytest.raises(te.DeviceError, match="the learner's correction ran"):
        engine.generate(["Once upon"], max_new_tokens=20, correction=_Correction())


class _FalsyTokenizer(te.CharTokenizer):
    def __len__(self):
        return 0


def test_a_falsy_tokenizer_is_the_one_the_engine_uses(shipped):
    model, alphabet = shipped
    tokenizer = _FalsyTokenizer(alphabet)
    engine = te.Engine(te.EngineConfig(mode="serial"), model=model, tokenizer=tokenizer)
    try:
        assert engine.tokenizer is tokenizer
    finally:
        engine.close()


# ------------------------------------------------------------------ 11: rings in two threads

def test_rings_in_two_threads_each_keep_their_own_and_leave_nothing_changed():
    before = te.engine.NUM_SLOTS
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with plugins.ring(4):
            a_in.set()
            b_in.wait(10)
            seen["a"] = engine_module._num_slots()
        a_out.set()

    def b():
        a_in.wait(10)
        with plugins.ring(3):
            b_in.set()
            a_out.wait(10)
            seen["b"] = engine_module._num_slots()
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"a": 4, "b": 3}
    assert te.engine.NUM_SLOTS == before and engine_module._num_slots() == before


# ------------------------------------------------------------------ 12: plug-ins' arguments

@pytest.mark.parametrize("name, plugin, call", [
    ("on_round", lambda engine: None, r"on_round\(engine, round\)"),
    ("loop", lambda engine, rounds: None, r"loop\(engine\)"),
    ("process_outputs", lambda step: None, r"process_outputs\(engine, step\)"),
    ("correction", lambda meta: None, r"correction\(meta, accepted, block_size\)"),
])
def test_generates_plug_ins_of_the_wrong_arity_are_refused_before_the_run(engine_pool, name,
                                                                           plugin, call):
    engine = engine_pool(mode="zos", num_draft_tokens=2)
    pid, record = engine.device.pid, engine.record
    with pytest.raises(TypeError, match=rf"{name}: the run calls it as {call}, and <lambda>"):
        engine.generate("Once upon", max_new_tokens=8, **{name: plugin})
    assert engine.device.pid == pid and engine.record is record  # nothing ran


# ------------------------------------------------------------------ 15: deep loops with drafts

def test_the_labs_deep_loops_correct_one_round_of_drafts_and_refuse_more():
    with plugins.ring(MAX_SLOTS):
        engine = te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=3, max_batch_size=3))
    try:
        prompts = PROMPTS + ["She said"]
        serial = texts(engine.generate(prompts, max_new_tokens=20, loop=te.loops.serial_loop))
        with plugins.ring(2):
            assert texts(engine.generate(prompts, max_new_tokens=20,
                                         loop=plugins.keep_in_flight(1))) == serial
            assert texts(engine.generate(prompts, max_new_tokens=20, loop=plugins_2026.batch_queue(
                1, lambda engine, plan, held: 0))) == serial
        for loop in (plugins.keep_in_flight(2), plugins_2026.batch_queue(2, lambda e, p, h: 0)):
            with plugins.ring(3), pytest.raises(ValueError, match=r"holds 2 decode steps.*"
                                                                  r"num_draft_tokens=3"):
                engine.generate(prompts, max_new_tokens=20, loop=loop)
    finally:
        engine.close()


# ------------------------------------------------------------------ 17: a Decimal is a number

def test_a_decimal_is_taken_as_the_number_it_is(engine_pool):
    config = te.EngineConfig(host_overhead_ms=Decimal("2.5"))
    assert type(config.host_overhead_ms) is float and config.host_overhead_ms == 2.5
    engine = engine_pool(mode="serial")
    assert texts(engine.generate(PROMPTS, max_new_tokens=10, temperature=Decimal("0.7"))) == texts(
        engine.generate(PROMPTS, max_new_tokens=10, temperature=0.7))
    with pytest.raises(ValueError, match="finite"):
        engine.generate(PROMPTS, temperature=Decimal("NaN"))
    with pytest.raises(TypeError, match="temperature must be a real number, got complex"):
        engine.generate(PROMPTS, temperature=1 + 2j)
    with pytest.raises(TypeError, match="temperature must be a number, got str"):
        engine.generate(PROMPTS, temperature="0.7")
