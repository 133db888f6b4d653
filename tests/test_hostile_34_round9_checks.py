"""Issue 34's ninth hostile round, the checks (cases 10 to 14 of the round's engine report).  An
answer whose own ``__len__`` or ``__iter__`` returns what the interpreter refuses; an object whose
``__class__`` says it is a str or a tensor; a trace argument nested 100,000 deep; a run's engine
or race report an earlier cell changed; an observer a wrong loop appended to the toy's
``RUN_OBSERVERS`` in place.  Each made a check raise, or a later right answer fail, before its
fix: a check answers each with a verdict naming what is wrong."""

from __future__ import annotations

import math
import types

import pytest
import torch

import toy_engine as te
from hostile_support import a_false_verdict
from overlap_course import checks, safe_json
from overlap_course.checks import harness, sandbox
from overlap_course.labs import plugins, shipped
import loops_for_tests

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]


# ------------------------------------------------------------------ 10: protocol methods

class IterNonIterator(list):
    def __iter__(self):
        return 5


class LenNegative(list):
    def __len__(self):
        return -1


class LenText(list):
    def __len__(self):
        return "3"


class TensorLenNegative(torch.Tensor):
    def __len__(self):
        return -1


class TensorLenHuge(torch.Tensor):
    def __len__(self):
        return 2**70


def _tensor(cls):
    return torch.tensor([1, 1, 1]).as_subclass(cls)


KV, PROMPT_LENGTHS = [10, 8, 4], [9, 7, 3]
# (the call, the category, a word the message must hold)
PROTOCOL = {
    "answer iter": (lambda: checks.check_decode_lengths(IterNonIterator([1, 1, 1]), KV,
                                                        PROMPT_LENGTHS), "junk", "iteration"),
    "answer set iter": (lambda: checks.check_done_after_wait(IterNonIterator([1]), waited=1),
                        "junk", "IterNonIterator"),
    "answer tensor len -1": (lambda: checks.check_decode_lengths(_tensor(TensorLenNegative), KV,
                                                                 PROMPT_LENGTHS), "junk", "length"),
    "answer tensor len 2**70": (lambda: checks.check_decode_lengths(_tensor(TensorLenHuge), KV,
                                                                    PROMPT_LENGTHS), "junk",
                                "length"),
    "answer order iter": (lambda: checks.check_race(IterNonIterator(["launch", "read"]),
                                                    _serial_device()), "junk", "iteration"),
    "context len -1": (lambda: checks.check_slot(37, table=LenNegative([5, 2, 9]), pos=9,
                                                 block_size=4), "setup", "`table`"),
    "context len text": (lambda: checks.check_decode_lengths([1, 1, 1], KV,
                                                             LenText(PROMPT_LENGTHS)),
                         "setup", "`prompt_lengths`"),
    "context iter": (lambda: checks.check_corrected_slots([1], IterNonIterator([10, 11, 12]),
                                                          [6, 0, 8, 5], 2, 4),
                     "setup", "`positions`"),
}


_DEVICE = []


def _serial_device():
    if not _DEVICE:
        engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
        engine.generate(PROMPTS[:1], max_new_tokens=2)
        _DEVICE.append(engine)
    return _DEVICE[0].device


@pytest.fixture(scope="module", autouse=True)
def _close_device():
    yield
    for engine in _DEVICE:
        engine.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(PROTOCOL))
def test_an_answer_whose_protocol_methods_return_junk_gets_a_verdict(case):
    call, category, word = PROTOCOL[case]
    verdict = a_false_verdict(call)
    assert verdict.category == category and word in verdict.message, verdict.message


# ------------------------------------------------------------------ 11: __class__ spoofing

class SaysStr:
    __class__ = property(lambda self: str)


class SaysTensor:
    __class__ = property(lambda self: torch.Tensor)


class SaysList:
    __class__ = property(lambda self: list)


class SaysFloatByGetattribute:
    def __getattribute__(self, name):
        return float if name == "__class__" else object.__getattribute__(self, name)


SPOOFED = {
    "overhead tensor": lambda: checks.check_overhead_gap(SaysTensor(), overhead_ms=5.0),
    "slot tensor": lambda: checks.check_slot(SaysTensor(), table=[5, 2, 9], pos=9, block_size=4),
    "idle_sync str": lambda: checks.check_idle_sync(SaysStr(), "a100_event_sync"),
    "largest stage str in a list": lambda: checks.check_largest_host_stage([SaysStr()], None),
    "accepted tensor": lambda: checks.check_true_key_length(1, 27, accepted=SaysTensor()),
    "table list": lambda: checks.check_slot(37, table=SaysList(), pos=9, block_size=4),
    "done set in a dict": lambda: checks.check_done_after_wait({0: SaysTensor()}, waited=1),
    "overhead getattribute": lambda: checks.check_overhead_gap(SaysFloatByGetattribute()),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(SPOOFED))
def test_an_object_that_says_it_is_another_class_is_junk(case):
    verdict = a_false_verdict(SPOOFED[case])
    assert verdict.category == "junk" and "`__class__`" in verdict.message, verdict.message


@pytest.mark.timeout(120)
def test_an_idle_fraction_returning_a_disguised_tensor_is_no_number(small_serial_engine):
    verdict = a_false_verdict(lambda: checks.check_idle_fraction(lambda timeline: SaysTensor(),
                                                                 small_serial_engine))
    assert verdict.category == "not_a_number", verdict.message


def test_the_search_for_a_disguise_ends_in_a_self_containing_or_long_list():
    endless = []
    endless.append(endless)
    assert harness._passing_for(endless) is None
    assert harness._passing_for([*range(100_000), SaysStr()]) is None  # past MAX_ITEMS: unread


# ------------------------------------------------------------------ 12: a deep trace argument

def _deep(n=100_000):
    x = ()
    for _ in range(n):
        x = (x,)
    return x


@pytest.mark.timeout(60)
def test_a_trace_nested_100000_deep_gets_a_setup_verdict():
    verdict = a_false_verdict(lambda: checks.check_idle_share(0.5, _deep()))
    assert verdict.category == "setup" and "nested too deep" in verdict.message, verdict.message
    assert safe_json.quoted(_deep()) == "a tuple nested too deep to show"


# ------------------------------------------------------------------ 13: a run changed after it

@pytest.fixture(scope="module")
def spec_run():
    spec = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=3))

    def run():
        spec.generate(PROMPTS[:3], max_new_tokens=30, stop=[" was", "."],
                      on_round=plugins.per_request(commit=shipped.commit))
        return spec
    yield run
    spec.close()


def _set(path, value):
    def change(engine):
        *parts, last = path.split(".")
        owner = engine
        for part in parts:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        setattr(owner, last, value)
    return change


CHANGED = {  # (what an earlier cell did, the check, the field its verdict names)
    "completions None": (_set("completions", None), checks.check_overshoot, "engine.completions"),
    "token_ids None": (_set("completions.0.token_ids", None), checks.check_overshoot,
                       "engine.completions[0].token_ids"),
    "max_new_tokens None": (_set("requests.0.max_new_tokens", None), checks.check_overshoot,
                            "engine.requests[0].max_new_tokens"),
    "text None": (_set("completions.0.text", None), checks.check_stale_mask,
                  "engine.completions[0].text"),
    "stats NaN": (_set("stats", types.SimpleNamespace(discarded_outputs=math.nan)),
                  checks.check_discarded, "engine.stats.discarded_outputs"),
    # (round 17: setting req.finish_reason to a number is refused as it is set; a cell can
    # still write it into the request's __dict__, which the check must name as well)
    "finish_reason a number": (lambda engine: vars(engine.requests[1]).update(finish_reason=5),
                               checks.check_discarded, "engine.requests[1].finish_reason"),
}


def test_a_request_s_finish_reason_set_to_a_number_is_refused_as_it_is_set(spec_run):
    with pytest.raises(TypeError, match="finish_reason = int 5"):
        _set("requests.1.finish_reason", 5)(spec_run())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CHANGED))
def test_a_check_given_an_engine_an_earlier_cell_changed_asks_for_the_run(spec_run, case):
    change, check, field = CHANGED[case]
    engine = spec_run()
    change(engine)
    verdict = a_false_verdict(lambda: check(3, engine))
    assert verdict.category == "setup" and f"`{field}`" in verdict.message, verdict.message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attribute, value", [("buffer", None), ("access", "x")])
def test_a_race_report_an_earlier_cell_changed_asks_for_the_run(attribute, value, monkeypatch):
    zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=4))
    monkeypatch.setattr(te.engine, "NUM_SLOTS", 1)  # notebook 05's single-buffered run
    try:
        with pytest.raises(te.RaceError) as raised:
            zos.generate(PROMPTS, max_new_tokens=8)
    finally:
        monkeypatch.undo()
        zos.close()
    err = raised.value
    assert checks.check_race_report((err.buffer, err.round), err).passed
    setattr(err, attribute, value)
    verdict = a_false_verdict(lambda: checks.check_race_report(("out1", 3), err))
    assert verdict.category == "setup", verdict.message


# ------------------------------------------------------------------ 14: the toy's lists in place

def _raising_observer(engine, phase):
    return 1 / 0


@pytest.mark.timeout(240)
def test_an_observer_a_wrong_loop_appends_is_named_and_taken_out(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 10.0)
    before = list(te.engine.RUN_OBSERVERS)

    def wrong_loop(engine):
        te.engine.RUN_OBSERVERS.append(_raising_observer)
        loops_for_tests.serial_loop(engine)

    verdict = a_false_verdict(lambda: checks.check_serial_loop(wrong_loop))
    assert verdict.category == "edits_engine", verdict.message
    assert "toy_engine.engine.RUN_OBSERVERS" in verdict.message
    assert te.engine.RUN_OBSERVERS == before
    right = checks.check_serial_loop(loops_for_tests.serial_loop)
    assert right.passed, right.message


@pytest.mark.timeout(240)
def test_the_toys_lists_and_dicts_an_earlier_cell_changed_in_place_are_put_back(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 10.0)
    boxes = [box for box, _ in harness._PRISTINE.contents.values()]
    assert te.engine.RUN_OBSERVERS in boxes and any(type(box) is dict for box in boxes)
    saved = [(box, box.copy()) for box in boxes]
    te.engine.RUN_OBSERVERS.append(_raising_observer)  # an earlier cell's experiments
    junk = next(box for box in boxes if type(box) is dict)
    junk["an earlier cell's key"] = None
    try:
        verdict = checks.check_serial_loop(loops_for_tests.serial_loop)
        put_back = [box == copy for box, copy in saved]
    finally:
        for box, copy in saved:  # the state as before, whatever the check did
            box.clear()
            if type(box) is dict:
                box.update(copy)
            else:
                box.extend(copy)
    assert verdict.passed, verdict.message
    assert "`toy_engine.engine.RUN_OBSERVERS` (it held" in verdict.message, verdict.message
    assert all(put_back)
