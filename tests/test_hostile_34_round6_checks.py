"""Issue 34's sixth hostile round, the checks: a ``sys.exit`` code with no usable repr, a
learner's exception whose ``__str__`` or class name raises, tensors on the meta device or sparse,
an earlier cell's value in the restored note, a hostile ``name=``, an int whose comparisons lie
in a context argument, and a Timeline whose spans an earlier cell changed.  Each raised (or gave
a message of megabytes) before its fix."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import toy_engine as te
from hostile_support import ROOT, a_false_verdict
from overlap_course import checks
from overlap_course.checks import sandbox
import loops_for_tests

TABLE = dict(table=[5, 2, 9], pos=9, block_size=4)


@pytest.fixture(scope="module")
def serial(small_serial_engine):
    return small_serial_engine


class ReprRaises:
    def __repr__(self):
        raise RuntimeError("repr")

    __str__ = __format__ = __repr__


class StrReprRaises(str):
    def __repr__(self):
        raise RuntimeError("repr")


# ------------------------------------------------------------------ 3: sys.exit(code)

@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [10**5000, ReprRaises(), "x" * 10_000_000],
                         ids=["huge-int", "repr-raises", "ten-megabytes"])
def test_an_exercise_check_names_a_sys_exit_code_without_a_usable_repr(code, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)
    verdict = a_false_verdict(lambda: checks.check_ring_slots(lambda *a, **k: sys.exit(code)))
    assert verdict.category == "raised" and "sys.exit(" in verdict.message
    assert len(verdict.message) < 1000


# ------------------------------------------------------------------ 4: the learner's exception

class Mine(BaseException):
    pass


class StrExits(Exception):
    def __str__(self):
        raise SystemExit(3)


class StrMine(Exception):
    def __str__(self):
        raise Mine("str")


class NameMeta(type):
    @property
    def __name__(cls):
        raise RuntimeError("name")


class NameRaises(Exception, metaclass=NameMeta):
    pass


def _raises_after_one(err):
    yield True
    raise err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error", [StrExits, StrMine, NameRaises],
                         ids=["str-raises-system-exit", "str-raises-own-base-exception",
                              "class-name-raises"])
def test_a_notebook_check_answers_a_learners_exception_whose_message_or_name_raises(error):
    verdict = a_false_verdict(
        lambda: checks.check_swapped_order(_raises_after_one(error()), True, False))
    assert verdict.category == "raised" and error.__qualname__ in verdict.message


# ------------------------------------------------------------------ 5: meta and sparse tensors

META0, META3 = torch.empty((), device="meta"), torch.empty(3, device="meta")
SPARSE = torch.tensor([1.0, 2.0]).to_sparse()
TENSOR_CALLS = {
    "check_slot(meta)": lambda e: checks.check_slot(META0, **TABLE),
    "check_overhead_gap(meta)": lambda e: checks.check_overhead_gap(META0, overhead_ms=5.0),
    "check_done_after_wait(meta[3])": lambda e: checks.check_done_after_wait(META3, waited=1),
    "check_decode_lengths(sparse)": lambda e: checks.check_decode_lengths(SPARSE, [9, 7, 3],
                                                                          [9, 7, 3]),
    "check_round_gap(meta)": lambda e: checks.check_round_gap(META0, e.timeline, round=3),
    "check_idle_fraction(-> meta)": lambda e: checks.check_idle_fraction(lambda t: META0, e),
    "check_done_after_wait(waited=meta)": lambda e: checks.check_done_after_wait({0, 1},
                                                                                 waited=META0),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", sorted(TENSOR_CALLS))
def test_a_check_answers_a_tensor_with_no_values_to_read(call, serial, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    verdict = a_false_verdict(lambda: TENSOR_CALLS[call](serial))
    assert verdict.category == ("setup" if "waited=" in call else "junk"), verdict.message


# ------------------------------------------------------------------ 6: the restored note

@pytest.mark.timeout(120)
@pytest.mark.parametrize("found", [10**5000, StrReprRaises("x"), "z" * 5_000_000],
                         ids=["huge-int", "str-repr-raises", "five-megabytes"])
def test_the_restored_note_shows_any_value_an_earlier_cell_set_shortly(found, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 10.0)
    original = te.engine.NUM_SLOTS
    te.engine.NUM_SLOTS = found  # an earlier cell's experiment
    try:
        verdict = checks.check_serial_loop(loops_for_tests.serial_loop)  # a right answer
    finally:
        te.engine.NUM_SLOTS = original
    assert verdict.passed, verdict.message
    assert "NUM_SLOTS" in verdict.message and len(verdict.message) < 2000


# ------------------------------------------------------------------ 7: name=

class StrFormatRaises(str):
    def __format__(self, spec):
        raise RuntimeError("format")


class StrStrRaises(str):
    def __str__(self):
        raise RuntimeError("str")

    def __format__(self, spec):
        return str(self)


NAMED = {
    "check_slot": lambda n: checks.check_slot(None, **TABLE, name=n),
    "check_true_key_length": lambda n: checks.check_true_key_length(None, host_seqlens_k=27,
                                                                    accepted=4, name=n),
    "check_corrected_slots": lambda n: checks.check_corrected_slots(
        None, positions=[10, 11, 12], table=[6, 0, 8, 5], accepted=2, block_size=4, name=n),
}
NAMES = {"format-raises": StrFormatRaises("second_slot"), "str-raises": StrStrRaises("second_slot"),
         "huge-int": 10**5000, "repr-raises": ReprRaises()}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("check", sorted(NAMED))
def test_a_check_answers_any_name_keyword(check, name):
    verdict = a_false_verdict(lambda: NAMED[check](NAMES[name]))
    assert verdict.category == "unanswered" and len(verdict.message) < 400, verdict.message


# ------------------------------------------------------------------ 8: an int whose comparisons lie

LYING = textwrap.dedent('''
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from overlap_course import checks

    class Lies(int):
        def __le__(self, o): return True
        def __ge__(self, o): return True
        def __lt__(self, o): return False
        def __gt__(self, o): return False
        __hash__ = int.__hash__

    try:
        verdict = {call}
        print(verdict.category, verdict.message[:200])
    except BaseException as err:
        print("raised", type(err).__name__)
''')
LYING_CALLS = {
    "num_kernels": "checks.check_done_after_wait({0, 1}, waited=1, num_kernels=Lies(10**20))",
    "pos": "checks.check_slot(37, table=[5, 2, 9], pos=Lies(10**20), block_size=4)",
}


@pytest.mark.timeout(90)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bounds memory with RLIMIT_AS")
@pytest.mark.parametrize("call", sorted(LYING_CALLS))
def test_a_context_int_whose_comparisons_lie_is_read_by_its_value(call):
    """In a child with its memory bounded: the old check built 10**20 kernels."""
    run = subprocess.run([sys.executable, "-c", LYING.replace("{call}", LYING_CALLS[call])],
                         capture_output=True, text=True, timeout=80,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = run.stdout + run.stderr[-500:]
    assert run.stdout.startswith("setup") and "must be a whole number" in run.stdout, said


# ------------------------------------------------------------------ 9: a Timeline's spans changed

CHANGES = {"none-appended": lambda t: t.spans.append(None),
           "spans-none": lambda t: setattr(t, "spans", None),
           "spans-text": lambda t: setattr(t, "spans", "abc")}
TIMELINE_CALLS = {
    "check_round_gap": lambda e, t: checks.check_round_gap(1.0, t, round=3),
    "check_largest_host_stage": lambda e, t: checks.check_largest_host_stage("prepare", t),
    "check_processed_under": lambda e, t: checks.check_processed_under(1, t, round=2),
    "check_idle_fraction": lambda e, t: checks.check_idle_fraction(lambda timeline: 0.5, e),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("check", sorted(TIMELINE_CALLS))
def test_a_timeline_whose_spans_an_earlier_cell_changed_is_a_setup_mistake(check, change, serial,
                                                                           monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 5.0)
    changed = copy.deepcopy(serial.timeline)
    CHANGES[change](changed)
    monkeypatch.setattr(serial, "timeline", changed)
    verdict = a_false_verdict(lambda: TIMELINE_CALLS[check](serial, changed))
    assert verdict.category == "setup" and ".spans" in verdict.message, verdict.message
