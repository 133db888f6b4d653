"""Every public check answers any value a learner can hand it with a verdict, never an
exception, and junk never passes (issue 34): huge and non-finite numbers, negatives, strings,
None, nested and self-containing lists, objects whose ``__eq__``/``__float__``/``__index__``/
``__len__`` raise, functions that raise or return junk.  The value goes where the learner's
answer goes (the first argument; both answers of a two-answer question); the other arguments
are the notebook's.  Bounded: a few seconds per check (exercise checks run the learner's
function on the shared engines, under a 3 s time limit here instead of 30 s)."""

import decimal
import fractions
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import sandbox
from overlap_course.labs import plugins, shipped

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]


# ------------------------------------------------------------------ junk a learner's cell can make

def _raise(*args, **kwargs):
    raise RuntimeError("the learner's object raised")


class RaisesEverywhere:
    """Every operation a check might try on an answer raises (but ``repr``: hypothesis
    reports a failing example by it; ReprRaises raises there too)."""

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _raise
    __float__ = __index__ = __int__ = __len__ = __iter__ = __bool__ = _raise
    __str__ = __getitem__ = __contains__ = __format__ = _raise
    __hash__ = object.__hash__

    def __repr__(self):
        return "RaisesEverywhere()"


class ReprRaises(RaisesEverywhere):
    __repr__ = __hash__ = _raise


class FloatRaises(float):
    __float__ = __eq__ = __lt__ = __gt__ = _raise
    __hash__ = float.__hash__


class IntRaises(int):
    __index__ = __int__ = __eq__ = __lt__ = __gt__ = _raise
    __hash__ = int.__hash__


class ListRaises(list):
    __len__ = __iter__ = __getitem__ = _raise


class StrRaises(str):
    strip = lower = __eq__ = _raise
    __hash__ = str.__hash__


def _nested(depth):
    x = []
    for _ in range(depth):
        x = [x]
    return x


def _self_containing():
    x = []
    x.append(x)
    return x


def _function_returning(value):
    def answer(*args, **kwargs):
        return value
    return answer


def _function_raising(error):
    def answer(*args, **kwargs):
        raise error("the learner's function raised")
    return answer


# A number no question's answer can be: huge, non-finite or negative (every answer here is >= 0)
numbers_junk = st.one_of(
    st.integers(min_value=10**13), st.integers(max_value=-1),
    st.sampled_from([10**400, -10**400, 2**63, 2**64]),
    st.floats(min_value=1e13), st.floats(max_value=-1e-3),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308]),
    st.sampled_from([np.float64("nan"), np.int64(2**62), decimal.Decimal("nan"),
                     decimal.Decimal("1e9999"), fractions.Fraction(10**400, 3), 1j]),
)
# Text that no name, stage or share can be: a NUL and a snowman are never part of one
text_junk = st.one_of(st.text(max_size=30).map(lambda s: s + "\x00\u2603"), st.just("x" * 100_000))
leaves = st.one_of(numbers_junk, text_junk, st.sampled_from([None, b"bytes", object()]))
raising = st.sampled_from([RaisesEverywhere(), FloatRaises(1.0), IntRaises(1), ListRaises([1, 2]),
                           StrRaises("wait")])
containers = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=8)
special = st.sampled_from([_nested(50), _nested(10_000), _self_containing(), list(range(100_000)),
                           range(10**15), np.array([np.nan, 1.0]), np.zeros((2, 2)),
                           torch.tensor([math.inf]), torch.tensor(math.nan), iter([1, 2]),
                           (x for x in [-1])])
errors = st.sampled_from([ValueError, ZeroDivisionError, KeyError, RuntimeError])
functions = st.one_of(leaves.map(_function_returning), raising.map(_function_returning),
                      errors.map(_function_raising))
JUNK = st.one_of(leaves, raising, containers, special, functions)


# ------------------------------------------------------------------ the notebooks' other arguments

@pytest.fixture(scope="module")
def notebook():
    """What the notebooks' cells leave for the checks, on small runs."""
    serial = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
    zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
    spec = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=3))
    serial.generate(PROMPTS, max_new_tokens=8)
    reference = zos.generate(PROMPTS[:2], max_new_tokens=8)
    ns = dict(serial=serial, zos=zos, spec=spec, reference=reference, serial_tl=serial.timeline,
              serial_stats=serial.stats, launches=[(r, max(0, r - 1), 1, "x") for r in range(6)])
    zos.flush = lambda previous: None  # notebook 03a's deliberate bug: the deferred step dropped
    try:
        zos.generate(PROMPTS[:2], max_new_tokens=8)
    except te.EngineStalled:
        ns["dropped"] = zos.completions
    finally:
        del zos.flush
    te.engine.NUM_SLOTS = 1
    try:
        zos.generate(PROMPTS, max_new_tokens=8)
    except te.RaceError as err:
        ns["single_buffer_error"] = err
    finally:
        te.engine.NUM_SLOTS = 2
    try:
        zos.generate(PROMPTS, max_new_tokens=12, on_round=plugins.aborts(shipped.abort, [(5, 1)]))
    except te.RaceError as err:
        ns["abort_race"] = err
    ns["meta"] = dict(input_ids=[5, 6, 7], pending=[0, 0, 0])
    zos.generate(PROMPTS, max_new_tokens=8)
    ns.update(zos_tl=zos.timeline, zos_stats=zos.stats)
    spec.generate(PROMPTS, max_new_tokens=30, stop=[" was", "."],
                  on_round=plugins.per_request(commit=shipped.commit))
    yield ns
    for engine in (serial, zos, spec):
        engine.close()


NOTEBOOK_CHECKS = {
    "check_done_after_wait": lambda ns, v: checks.check_done_after_wait(v, waited=1),
    "check_race": lambda ns, v: checks.check_race(v, ns["serial"].device),
    "check_race_fixed": lambda ns, v: checks.check_race_fixed(v, ns["serial"].device),
    "check_slot": lambda ns, v: checks.check_slot(v, table=[5, 2, 9], pos=9, block_size=4),
    "check_decode_lengths q": lambda ns, v: checks.check_decode_lengths(v, [10, 8, 4], [9, 7, 3]),
    "check_decode_lengths k": lambda ns, v: checks.check_decode_lengths([1, 1, 1], v, [9, 7, 3]),
    "check_round_gap": lambda ns, v: checks.check_round_gap(v, ns["serial_tl"], round=3),
    "check_largest_host_stage": lambda ns, v: checks.check_largest_host_stage(v, ns["serial_tl"]),
    "check_overhead_gap": lambda ns, v: checks.check_overhead_gap(v, overhead_ms=5.0),
    "check_processed_under": lambda ns, v: checks.check_processed_under(v, ns["zos_tl"], round=2),
    "check_tokens_lost": lambda ns, v: checks.check_tokens_lost(v, ns["reference"], ns["dropped"]),
    "check_swapped_order": lambda ns, v: checks.check_swapped_order(v, True, False),
    "check_future_inputs ids": lambda ns, v: checks.check_future_inputs(v, [1, 1, 1], ns["meta"]),
    "check_future_inputs pending": lambda ns, v: checks.check_future_inputs([5, 6, 7], v,
                                                                             ns["meta"]),
    "check_ideal_ratio": lambda ns, v: checks.check_ideal_ratio(v, ns["serial_stats"],
                                                                ns["zos_stats"]),
    "check_true_key_length": lambda ns, v: checks.check_true_key_length(v, 27, accepted=4),
    "check_corrected_slots": lambda ns, v: checks.check_corrected_slots(v, [10, 11, 12],
                                                                        [6, 0, 8, 5], 2, 4),
    "check_uncommitted_rounds": lambda ns, v: checks.check_uncommitted_rounds(v, ns["launches"], 4),
    "check_discarded": lambda ns, v: checks.check_discarded(v, ns["zos"]),
    "check_race_report": lambda ns, v: checks.check_race_report(v, ns["single_buffer_error"]),
    "check_idle_share": lambda ns, v: checks.check_idle_share(v, "a100_event_sync"),
    "check_idle_sync": lambda ns, v: checks.check_idle_sync(v, "a100_event_sync"),
    "check_wasted_round": lambda ns, v: checks.check_wasted_round(v, ns["zos"]),
    "check_abort_in_flight": lambda ns, v: checks.check_abort_in_flight(v, ns["abort_race"]),
    "check_ring_race": lambda ns, v: checks.check_ring_race(v, ns["single_buffer_error"], ring=3),
    "check_overshoot": lambda ns, v: checks.check_overshoot(v, ns["spec"]),
    # 07b: a run of another loop than the lab's is "setup"; junk answers fail either way
    "check_stale_mask": lambda ns, v: checks.check_stale_mask(v, ns["zos"]),
    "check_token_leak": lambda ns, v: checks.check_token_leak(v, ns["zos"]),
    # exercise checks whose answer is data, not a function
    "check_three_rounds": lambda ns, v: checks.check_three_rounds(v),
    "check_metadata_answer": lambda ns, v: checks.check_metadata_answer(v),
}
# exercise checks whose answer is the learner's function, run on the shared engines
FUNCTION_CHECKS = {
    "check_serial_loop": lambda ns, v: checks.check_serial_loop(v),
    "check_idle_fraction": lambda ns, v: checks.check_idle_fraction(v, ns["serial"]),
    "check_zos_loop": lambda ns, v: checks.check_zos_loop(v),
    "check_correction": lambda ns, v: checks.check_correction(v),
    "check_process_outputs": lambda ns, v: checks.check_process_outputs(v),
    "check_wants_more": lambda ns, v: checks.check_wants_more(v),
    "check_abort": lambda ns, v: checks.check_abort(v),
    "check_ring_slots": lambda ns, v: checks.check_ring_slots(v),
    "check_commit": lambda ns, v: checks.check_commit(v),
    "check_before_sample": lambda ns, v: checks.check_before_sample(v),
    "check_future_key": lambda ns, v: checks.check_future_key(v),
}


def test_every_public_check_is_fed_junk_here():
    named = {key.split()[0] for key in (*NOTEBOOK_CHECKS, *FUNCTION_CHECKS)}
    public = {name for name in checks.__all__ if name.startswith("check_")}
    assert named == public, f"checks not fed junk here: {sorted(public - named)}"


def _judged(call, ns, value):
    verdict = call(ns, value)
    assert isinstance(verdict, checks.Verdict), f"returned {type(verdict).__name__}, not a Verdict"
    assert not verdict.passed, f"junk passed: {verdict!r}"
    assert "Traceback" not in verdict.message


@pytest.mark.parametrize("check", sorted(NOTEBOOK_CHECKS))
@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=JUNK)
def test_a_notebook_check_answers_any_value_with_a_false_verdict(notebook, check, value):
    _judged(NOTEBOOK_CHECKS[check], notebook, value)


# the values an exercise check is fed: not functions at all (falsy ones too: None, "", 0, []),
# and functions that raise, return junk, or return an object whose every operation raises
NOT_FUNCTIONS = [None, "", 0, [], 5, "loop", 10**400, math.nan, RaisesEverywhere(), ReprRaises()]
FUNCTIONS = [_function_raising(ValueError), _function_returning(10**400),
             _function_returning(RaisesEverywhere())]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("check", sorted(FUNCTION_CHECKS))
def test_an_exercise_check_answers_any_value_with_a_false_verdict(notebook, check, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)
    for value in [*NOT_FUNCTIONS, *FUNCTIONS]:
        _judged(FUNCTION_CHECKS[check], notebook, value)


# ------------------------------------------------------------------ the cases

def test_an_idle_fraction_of_a_400_digit_number_gets_a_verdict(notebook):
    """It raised OverflowError (``math.copysign`` converting the int again)."""
    verdict = checks.check_idle_fraction(lambda timeline: 10**400, notebook["serial"])
    assert verdict.category == "not_a_number" and "a 401-digit number" in verdict.message


def test_an_idle_fraction_that_empties_the_timeline_is_judged_on_its_value(notebook):
    """It raised ``max() arg is an empty sequence``; the function gets a copy now, and the run's
    timeline is left whole."""
    engine = notebook["serial"]
    spans = len(engine.timeline.spans)

    def empties(timeline):  # six decimals: no slip of this run's (idle / busy ...) rounds to it
        timeline.spans.clear()
        return 0.987654
    verdict = checks.check_idle_fraction(empties, engine)
    assert verdict.category == "wrong_value" and "got 0.9877" in verdict.message
    assert len(engine.timeline.spans) == spans

    def right_then_empties(timeline):
        idle = sum(b - a for a, b in timeline.device_gaps())
        value = idle / (idle + timeline.device_busy_ms())
        timeline.spans.clear()
        return value
    assert checks.check_idle_fraction(right_then_empties, engine).passed


def test_an_idle_fraction_rounded_to_five_decimals_is_told_it_is_rounded(notebook):
    """Round eleven: it was told "got 0.3167, expected 0.3167", the same numbers twice."""
    engine = notebook["serial"]
    expected = engine.stats.device_idle_fraction
    rounded = round(expected, 5)  # what a learner prints; kept where the check can tell it
    answers = [a for a in (rounded, expected + 2e-6, expected - 2e-6)
               if abs(a - expected) >= 1e-6 and f"{a:.4f}" == f"{expected:.4f}"]
    assert len(answers) >= 1
    for answer in answers:
        verdict = checks.check_idle_fraction(lambda timeline, a=answer: a, engine)
        assert verdict.category == "wrong_value" and "rounded" in verdict.message, verdict.message
        assert f"got {answer:.8f}, expected {expected:.8f}" in verdict.message


@pytest.mark.parametrize("check", sorted(NOTEBOOK_CHECKS))
def test_an_answer_whose_repr_and_hash_raise_too_gets_a_verdict(notebook, check):
    _judged(NOTEBOOK_CHECKS[check], notebook, ReprRaises())


def test_an_answer_whose_own_code_raises_is_told_so():
    verdict = checks.check_slot(ListRaises([37]), table=[5, 2, 9], pos=9, block_size=4)
    assert verdict.category == "raised" and "RuntimeError" in verdict.message
    assert "`_raise`" in verdict.message


@pytest.mark.parametrize("junk", [None, "", 0, []])
def test_check_commit_does_not_pass_what_is_not_a_function(junk):
    """A falsy answer made the run use the engine's own commit, which passed."""
    verdict = checks.check_commit(junk)
    stub = "unanswered" if junk is None else "shape"  # None is the shipped stub
    assert verdict.category == stub and "commit must be a function" in verdict.message
