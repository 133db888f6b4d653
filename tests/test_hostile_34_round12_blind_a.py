"""Issue 34, round twelve's blind cases (fixed in the thirteenth): after a check's time limit
stopped the learner's code in one blocking call, the next verdict said an earlier cell had
replaced the "engine's run state"; lab 1's stall message ended in the checker's category
"(loop_returned_with_work)"; a ``decimal.Decimal`` answer was "not a number" to most checks;
``without_main_module()`` put the original back under a thread still starting its device
process, whose child then re-imported the learner's script; lab 1's PASSED message was cut
mid-word at 800 characters before it said what was compared."""

from __future__ import annotations

import re
import threading
import time
import types
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from multiprocessing import spawn as mp_spawn

import numpy as np
import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import answers, errors, harness, lab_mistakes, pool, sandbox
from toy_engine import process_device
from toy_engine.run import EngineStalled
import loops_for_tests

_CATEGORY = re.compile(r"\([a-z]+(_[a-z]+)+\)")  # "(loop_returned_with_work)": a checker's name


# ---------------------------------------------------------------- case 1: a time-up, then a note


def _serial_loop_that_blocks(engine):
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        time.sleep(40)  # a debugging pause left in: one call the limit stops
        engine.process_outputs(step)


def _blocks(req):
    time.sleep(40)
    return True


def _one_short(req):
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens - 1


def _right_policy(req):
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens


@pytest.mark.timeout(300)
@pytest.mark.parametrize("check, stopped, then, passed", [
    ("check_serial_loop", _serial_loop_that_blocks, loops_for_tests.serial_loop, True),
    ("check_wants_more", _blocks, _one_short, False),
], ids=["02-serial-loop", "07-wants-more"])
def test_a_verdict_after_a_time_up_in_a_blocking_call_blames_no_earlier_cell(
        check, stopped, then, passed, monkeypatch):
    """The limit raises TimeUp again every few ms until the check ends: one landed in the engine's
    own recovery from the first, and the next check's heal read the unfinished recovery as a
    learner's change (on main: 6 of 6 runs at a 1 s limit)."""
    limit = sandbox.TIME_LIMIT_S
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 1.0)
    first = getattr(checks, check)(stopped)
    assert first.category == "time_limit", first.message
    # the right answer gets the usual limit: at 1 s it timed out on a loaded 2-core machine
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", limit)
    verdict = getattr(checks, check)(then)
    assert verdict.passed is passed, verdict.message
    assert "earlier cell" not in verdict.message, verdict.message
    assert "run state" not in verdict.message, verdict.message


class _Cut(BaseException):
    """A TimeUp of the limit's, landing where the engine recovers from the first."""


def test_an_engine_recovery_cut_short_is_finished_by_the_next_check_without_a_note():
    """Deterministic: the engine's recovery is cut where the time limit's second TimeUp lands
    (the device's wait); the next check finishes it as the engine's next run would."""
    shared = pool.engine()

    def cut(*args, **kwargs):
        raise _Cut

    def launches_then_stops(engine):
        inputs = engine.prepare_inputs(engine.schedule())
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)
        engine.device.synchronize = cut  # on the instance: removed before the check reads it
        raise _Cut

    try:
        with pytest.raises(_Cut):
            shared.generate(["Once upon a time"], max_new_tokens=4, loop=launches_then_stops)
    finally:
        del shared.device.synchronize
    assert shared._clean is False  # the recovery was cut short, as on main after a time-up
    verdict = checks.check_serial_loop(loops_for_tests.serial_loop)
    assert verdict.passed, verdict.message
    assert "earlier cell" not in verdict.message, verdict.message
    assert pool.engine() is shared  # recovered in place, not replaced


# ---------------------------------------------------------------- case 2: a category in a message


@pytest.mark.timeout(300)
def test_a_policy_one_token_short_is_told_why_it_stalls_in_the_lessons_words():
    verdict = checks.check_wants_more(_one_short)
    assert verdict.category == "stalled", verdict.message
    assert not _CATEGORY.search(verdict.message), verdict.message
    assert "no round plans it again and none is in flight, so it can never finish" in \
        verdict.message, verdict.message


def test_every_reason_the_engine_stalls_has_words_in_the_labs_messages():
    assert set(lab_mistakes._STALLS) == set(EngineStalled.REASONS)
    assert not any(_CATEGORY.search(f"({words})") for words in lab_mistakes._STALLS.values())


# ---------------------------------------------------------------- case 5: a Decimal answer


def _timeline_with_gap(gap_ms: float) -> te.Timeline:
    """Rounds 0 to 11 of 1.5 ms on the device, ``gap_ms`` between two rounds."""
    tl = te.Timeline(meta=te.TimelineMeta(mode="serial", device="cpu-process"))
    t = 1.0
    for rnd in range(12):
        for stage, ms in (("upload", 0.1), ("forward", 1.2), ("sample", 0.2)):
            start = tl.origin_ns + round(t * 1e6)
            tl.add_device_ns(stage, rnd, start, start + round(ms * 1e6), cpu_ns=round(ms * 1e6))
            t += ms
        t += gap_ms
    return tl


def _completions(lengths):
    return [types.SimpleNamespace(token_ids=list(range(n))) for n in lengths]


DECIMAL_RIGHT = {
    "check_slot": lambda: checks.check_slot(Decimal(37), table=[5, 2, 9], pos=9, block_size=4),
    "check_slot, 37.0": lambda: checks.check_slot(Decimal("37.0"), table=[5, 2, 9], pos=9,
                                                  block_size=4),
    "check_slot, context": lambda: checks.check_slot(37, table=[5, 2, Decimal(9)],
                                                     pos=Decimal(9), block_size=Decimal(4)),
    "check_overhead_gap": lambda: checks.check_overhead_gap(Decimal("5"), overhead_ms=5.0),
    "check_true_key_length": lambda: checks.check_true_key_length(
        Decimal(31), host_seqlens_k=27, accepted=4),
    "check_round_gap, rounded half up": lambda: checks.check_round_gap(
        Decimal("0.3949").quantize(Decimal("0.01"), rounding=ROUND_HALF_UP),
        _timeline_with_gap(0.3949), round=10),
    "check_tokens_lost": lambda: checks.check_tokens_lost(
        Decimal(1), _completions([12, 12]), _completions([11, 11])),
    "check_tokens_lost, a list": lambda: checks.check_tokens_lost(
        [Decimal(1), Decimal(2)], _completions([12, 12]), _completions([11, 10])),
}


@pytest.mark.parametrize("name", DECIMAL_RIGHT)
def test_a_right_answer_written_as_a_decimal_passes(name):
    verdict = DECIMAL_RIGHT[name]()
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("answer, said", [
    (Decimal("NaN"), "write a finite number, not Decimal('NaN')"),
    (Decimal("sNaN"), "write a finite number, not Decimal('sNaN')"),
    (Decimal("-Infinity"), "write a finite number"),
    (Decimal("1e400"), "far outside"),
    (Decimal("37.5"), "a slot is one whole number, not Decimal('37.5')"),
    (Decimal(38), "38"),
])
def test_a_wrong_or_junk_decimal_gets_a_verdict_that_names_it(answer, said):
    verdict = checks.check_slot(answer, table=[5, 2, 9], pos=9, block_size=4)
    assert not verdict.passed and said in verdict.message, verdict.message
    assert verdict.category != "raised", verdict.message


@pytest.mark.parametrize("x", [Decimal(3), Fraction(3), np.int64(3), 3.0],
                         ids=["Decimal", "Fraction", "numpy", "float"])
def test_every_reader_of_a_number_takes_a_decimal_as_it_takes_the_others(x):
    assert answers.real(x)
    assert answers.number(x) == 3 and answers.whole(x) == 3
    assert answers.int_list([x, x]) == [3, 3] and answers.int_set((x,)) == {3}
    assert answers.bare_number(x)
    assert answers.returned_real(x) == 3.0
    assert answers.bool_pair([x - 3, x - 2]) == (False, True)
    assert answers.share(x) == 3
    assert not answers.real(True)


# ---------------------------------------------------------------- case 7: the main module, threads


def _inits(name: str = "toy-engine-device") -> list[str]:
    return sorted(k for k in mp_spawn.get_preparation_data(name) if k.startswith("init_main"))


def test_a_thread_leaving_first_leaves_the_main_module_out_for_one_still_starting():
    """Thread A enters, B enters, A leaves, then B starts its process (what pool.start's threads
    do): B's child must still not get the learner's main script to import.  Driven by events."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict = {}
    original = mp_spawn.get_preparation_data

    def thread_a():
        with process_device.without_main_module():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def thread_b():
        a_in.wait(10)
        with process_device.without_main_module():
            b_in.set()
            a_out.wait(10)
            seen["inits"] = _inits()  # what B's proc.start() computes now

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert a_out.is_set() and seen.get("inits") == [], seen
    assert mp_spawn.get_preparation_data is original  # the last one out put it back


def test_without_main_module_nests_and_puts_the_original_back():
    original = mp_spawn.get_preparation_data
    with process_device.without_main_module():
        with process_device.without_main_module():
            assert _inits() == []
        assert _inits() == []
    assert mp_spawn.get_preparation_data is original


# ---------------------------------------------------------------- case 10: a message cut mid-word


@pytest.mark.timeout(300)
def test_lab_1s_passed_message_says_what_was_compared_whole():
    verdict = checks.check_wants_more(_right_policy)
    assert verdict.passed, verdict.message
    assert not verdict.message.endswith("..."), verdict.message
    assert "the same tokens, in all 6 runs" in verdict.message, verdict.message
    assert len(verdict.message) <= answers.MAX_MESSAGE


_WORDS = ("the engine's own rounds and discarded outputs, a stop or an EOS known only once "
          "processed; ") * 20


@pytest.mark.parametrize("cut", [
    lambda text: harness._cut(checks.Verdict(False, text, "wrong")).message,
    lambda text: answers.cut(text, answers.MAX_MESSAGE),
    lambda text: errors.said(ValueError(text)),
], ids=["verdict", "answers.cut", "errors.said"])
@pytest.mark.parametrize("shift", [0, 1, 3, 7, 11])
def test_a_long_message_is_cut_between_words(cut, shift):
    text = "x" * shift + " " + _WORDS
    shown = cut(text)
    assert len(shown) <= answers.MAX_MESSAGE and shown.endswith(" ...")
    head = shown[:-4]
    assert text.startswith(head) and text[len(head)] == " ", shown[-40:]


def test_a_long_value_with_no_space_is_still_shown_in_part():
    shown = answers.cut("ValueError: " + "x" * 100, answers.SHOW)
    assert len(shown) <= answers.SHOW and shown.startswith("ValueError: xxxx")
