"""Issue 34's seventh hostile round, the engine and the checks: a wrong loop that changes the
shared device (its weights through a kernel of its own, a pending launch, its bookkeeping); a
Ctrl-C as a check starts or ends its limit; a nested tensor returned; a timeline whose spans
were changed past their types; an argument whose repr raises.  Each failed when written."""

from __future__ import annotations

import copy
import math
import numbers

import pytest
import torch

import toy_engine as te
import loops_for_tests
from hostile_support import a_false_verdict, run_python
from overlap_course import checks
from overlap_course.checks import sandbox
from overlap_course.labs import plugins
from toy_engine.races import PendingLaunch
from toy_engine.timeline import Span, Timeline


def _spoil(ctx):
    with torch.no_grad():
        for p in ctx.model.parameters():
            p.mul_(-1.0)


def _weights(engine):
    engine.device.launch(_spoil, round=0, stage="forward")
    engine.device.synchronize()


def _pending(engine):
    engine.device.races.pending.append(
        PendingLaunch(10**9, "upload", 0, frozenset({"meta0"}), frozenset({"meta0"}), frozenset()))


def _latencies(engine):
    engine.device._latencies_ns.append(None)


def _last_end(engine):
    engine.device._last_end_ns = "late"


@pytest.mark.parametrize("change", [_weights, _pending, _latencies, _last_end],
                         ids=["weights", "pending", "latencies", "last_end"])
def test_a_wrong_loop_that_changes_the_device_never_fails_a_later_right_answer(change,
                                                                               monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 60.0)

    def wrong(engine):
        engine.abort(engine.requests[0].id)  # a wrong answer: the check stops after this run
        loops_for_tests.serial_loop(engine)
        change(engine)

    assert not checks.check_serial_loop(wrong).passed
    right = checks.check_serial_loop(loops_for_tests.serial_loop)
    assert right.passed, right.message


def test_launch_latencies_stay_bounded():
    engine = checks.pool.engine()
    device = engine.device
    for _ in range(3):
        engine.generate(["Once"], max_new_tokens=2)
    device._latencies_ns.extend([1] * 5000)
    assert len(device._latencies_ns) <= 4096
    checks.pool.heal()


def _run_interrupted(after: str, call: str, limit: float = 2.0):
    """A Ctrl-C at the first line run after the line holding ``after``; then a later cell."""
    code = f"""
import signal, sys, time
import toy_engine as te
from overlap_course import checks
from overlap_course.checks import harness, sandbox
sandbox.TIME_LIMIT_S = {limit}
fired, last = [], {{}}
def hook(frame, event, arg):
    if frame.f_code.co_filename not in (sandbox.__file__, harness.__file__):
        return None
    lines = open(frame.f_code.co_filename).read().splitlines()
    def local(frame, event, arg):
        if event == "line" and not fired:
            if {after!r} in lines[last.get(id(frame), 1) - 1]:
                fired.append(1); sys.settrace(None); signal.raise_signal(signal.SIGINT)
            last[id(frame)] = frame.f_lineno
        return local
    return local
sys.settrace(hook)
try:
    {call}
except KeyboardInterrupt:
    pass
sys.settrace(None)
assert fired, "never interrupted"
time.sleep({limit} + 1.0)
assert not sandbox._CURRENT, "the alarm is still registered"
assert not harness._RUNNING, harness._RUNNING
v = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
assert isinstance(v, checks.Verdict)
print("held")
"""
    run = run_python(code, timeout=240)
    assert run.returncode == 0 and "held" in run.stdout, run.stdout[-800:] + run.stderr[-1500:]


@pytest.mark.parametrize("after", ["_CURRENT.append(alarm)", "self.ending = True"],
                         ids=["start", "end"])
def test_a_ctrl_c_as_a_notebook_check_starts_or_ends_its_limit_leaves_no_alarm(after):
    _run_interrupted(after, "checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)")


def test_a_ctrl_c_right_after_an_exercise_check_registers_leaves_no_name():
    _run_interrupted("_RUNNING.append(check.__name__)",
                     "checks.check_idle_fraction(lambda t: 0.5, None)", limit=5.0)


def test_a_nested_tensor_returned_gets_a_verdict():
    engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
    try:
        engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
        answer = torch.nested.nested_tensor([torch.tensor([0.5])])
        a_false_verdict(lambda: checks.check_idle_fraction(lambda timeline: answer, engine))
    finally:
        engine.close()


class _Mine(Timeline):
    def lane(self, lane):
        return None  # a learner's unfinished override


_SPAN_CHANGES = {
    "start None": lambda t: object.__setattr__(t.spans[0], "start_ms", None),
    "start str": lambda t: object.__setattr__(t.spans[0], "start_ms", "x"),
    "start nan": lambda t: object.__setattr__(t.spans[0], "start_ms", math.nan),
    "end huge int": lambda t: object.__setattr__(t.spans[0], "end_ms", 10**400),
    "round str": lambda t: object.__setattr__(t.spans[0], "round", "x"),
    "lane None": lambda t: object.__setattr__(t.spans[0], "lane", None),
    "bare Span": lambda t: t.spans.append(Span.__new__(Span)),
    "subclass": lambda t: setattr(t, "__class__", _Mine),
    "meta None": lambda t: setattr(t, "meta", None),
}


@pytest.fixture(scope="module")
def serial_engine(small_serial_engine):
    return small_serial_engine


@pytest.mark.parametrize("change", list(_SPAN_CHANGES), ids=list(_SPAN_CHANGES))
@pytest.mark.parametrize("check", ["round_gap", "largest_host_stage", "idle_fraction"])
def test_a_timeline_changed_past_its_types_gets_a_verdict(change, check, serial_engine):
    t = copy.deepcopy(serial_engine.timeline)
    _SPAN_CHANGES[change](t)
    calls = {"round_gap": lambda: checks.check_round_gap(1.0, t, round=3),
             "largest_host_stage": lambda: checks.check_largest_host_stage("prepare", t),
             "idle_fraction": lambda: checks.check_idle_fraction(lambda tl: 0.5, serial_engine)}
    saved, serial_engine.timeline = serial_engine.timeline, t
    try:
        verdict = calls[check]()
    except BaseException as err:  # noqa: BLE001 - the bug
        pytest.fail(f"the check raised {type(err).__name__}: {str(err)[:200]}")
    finally:
        serial_engine.timeline = saved
    assert isinstance(verdict, checks.Verdict)
    if change != "subclass":  # read through the base class, a subclass's timeline is fine
        assert verdict.category == "setup", verdict.message


class _Odd:
    def __repr__(self):
        raise RuntimeError("repr")


class _RealOdd:
    def __float__(self):
        raise RuntimeError("float")

    def __repr__(self):
        raise RuntimeError("repr")


class _IntegralOdd:
    def __repr__(self):
        raise RuntimeError("repr")


numbers.Real.register(_RealOdd)
numbers.Integral.register(_IntegralOdd)


class _FloatRaises(float):
    def __float__(self):
        raise RuntimeError("float")


def _abort(engine, request_id):
    engine.abort(request_id)


_CALLS = {
    "aborts list": (lambda e: plugins.aborts(_abort, [_Odd()]), "at"),
    "aborts": (lambda e: plugins.aborts(_abort, _Odd()), "at"),
    "ring": (lambda e: plugins.ring(_Odd()).__enter__(), "slots"),
    "keep_in_flight": (lambda e: plugins.keep_in_flight(_Odd()), "depth"),
    "max_batch_size": (lambda e: te.EngineConfig(max_batch_size=_Odd()), "max_batch_size"),
    "max_batch_size Integral": (lambda e: te.EngineConfig(max_batch_size=_IntegralOdd()),
                                "max_batch_size"),
    "seed Real": (lambda e: te.EngineConfig(seed=_RealOdd()), "seed"),
    "host_overhead_ms Real": (lambda e: te.EngineConfig(host_overhead_ms=_RealOdd()),
                              "host_overhead_ms"),
    "host_overhead_ms float": (lambda e: te.EngineConfig(host_overhead_ms=_FloatRaises(1.0)),
                               "host_overhead_ms"),
    "mode": (lambda e: te.EngineConfig(mode=_Odd()), "mode"),
    "generate": (lambda e: e.generate(_Odd()), "prompts"),
    "stop": (lambda e: e.generate(["Once"], stop=[_Odd()]), "stop"),
    "abort": (lambda e: e.abort(_Odd()), "abort"),
}


@pytest.mark.parametrize("name", list(_CALLS), ids=list(_CALLS))
def test_an_argument_whose_repr_raises_is_refused_by_name(name, serial_engine):
    call, word = _CALLS[name]
    raised = None
    try:
        call(serial_engine)
    except (TypeError, ValueError) as err:
        raised = str(err)
    except BaseException as err:  # noqa: BLE001 - the bug
        pytest.fail(f"{type(err).__name__}: {err}")
    assert raised is not None and word in raised, raised
