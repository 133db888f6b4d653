"""Issue 34, round ten: seven of the fifteen new cases, fixed (the others: the closing note).
The engine's side of exercise 03(b)'s order printed as an enum; a ``staticmethod`` answer
passed in the kernel and scored 0 in the judge, named "member_descriptor"; a Chromium stuck
printing the handout ended in a ``TimeoutExpired`` traceback; the progress service opened
``--db /dev/null`` and SQLite wrote ``/dev/null-journal``; a pacing entry for
``setup_state`` killed the device process at start, naming nothing; a ``wants_more`` that forgot
its ``return`` stopped the run blaming the loop; a lab's engine, once closed, came back closed."""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from overlap_course import checks
from overlap_course.build import handout, judge_values

RIGHT_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
               ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


@pytest.mark.parametrize("order", [
    RIGHT_ORDER[:-1] + [("postprocess", 3)],
    [("forward", 1), ("sample", 1), ("forward", 2), ("sample", 2), ("postprocess", 1),
     ("forward", 3), ("sample", 3), ("postprocess", 2), ("flush", 3)],
    [("forward", 1), ("sample", 1), ("forward", 2), ("flush", 1), ("sample", 2),
     ("forward", 3), ("flush", 2), ("sample", 3), ("flush", 3)],
], ids=["postprocess-for-flush", "sample-first", "flush-mid-run"])
def test_three_rounds_quotes_the_engines_step_as_the_notebook_does(order):
    verdict = checks.check_three_rounds(order)
    assert not verdict.passed
    assert "<Stage." not in verdict.message and "the engine did ('" in verdict.message, \
        verdict.message


def _mine(code_owner):
    return lambda code: code is code_owner.__code__


def test_a_staticmethod_answer_is_judged_as_its_function():
    def loop(engine):
        return engine

    judged = judge_values.code_answer("serial_loop", staticmethod(loop), _mine(loop))
    assert judged is loop


def test_an_object_whose_call_is_a_staticmethod_is_judged_as_that_function():
    def loop(engine):
        return engine

    class Runner:
        __call__ = staticmethod(loop)

    judged = judge_values.code_answer("serial_loop", Runner(), _mine(loop))
    assert judged is loop


def test_a_library_staticmethod_is_still_refused_naming_what_it_wraps():
    judged = judge_values.code_answer("serial_loop", staticmethod(textwrap.dedent),
                                      lambda code: False)
    assert isinstance(judged, str) and "member_descriptor" not in judged, judged
    assert "textwrap.dedent" in judged, judged


@pytest.mark.skipif(os.name != "posix", reason="the stand-in browser is a shell script")
def test_a_chromium_stuck_printing_the_handout_is_one_line(tmp_path, monkeypatch):
    stuck = tmp_path / "chromium"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n", encoding="utf-8")
    stuck.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(stuck))
    monkeypatch.setattr(handout, "PRINT_TIMEOUT_S", 1)
    page = tmp_path / "three_rounds.html"
    page.write_text("<p>x</p>", encoding="utf-8")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        handout.print_pdf(page, tmp_path / "three_rounds.pdf")
    assert time.monotonic() - start < 30
    message = str(err.value)
    assert "\n" not in message and "did not print three_rounds.html within 1 s" in message
    assert not (tmp_path / "three_rounds.pdf").exists()


@pytest.mark.skipif(not os.path.exists("/dev/null") or os.name != "posix",
                    reason="needs /dev/null (POSIX)")
@pytest.mark.parametrize("link", [False, True], ids=["device", "link-to-device"])
def test_the_progress_store_refuses_a_device_before_sqlite_writes_beside_it(tmp_path, link):
    """Before: SQLite opened /dev/null, wrote /dev/null-journal and the refusal blamed the folder."""
    from overlap_course.progress_store import open_store

    path = "/dev/null"
    if link:
        os.symlink(path, tmp_path / "room.sqlite")
        path = str(tmp_path / "room.sqlite")
    journal = "/dev/null-journal"
    existed = os.path.exists(journal)
    try:
        with pytest.raises(ValueError) as err:
            open_store(path)
        assert "a pipe or a device, not a file" in str(err.value), err.value
        assert existed or not os.path.exists(journal), "SQLite wrote a journal beside /dev/null"
    finally:
        if not existed and os.path.exists(journal):
            os.remove(journal)


@pytest.mark.parametrize("kernel", ["setup_state", "Forward", "draft"])
def test_a_pacing_entry_for_a_kernel_the_model_cannot_price_is_refused_when_built(kernel):
    """Before: ``setup_state`` was accepted, then the device process died at start on a
    ``KeyError: 'inputs'`` (the round's packed tokens do not exist yet), naming nothing."""
    from toy_engine.process_device import ProcessDevice, checked_pacing

    with pytest.raises(ValueError, match=rf"PACED_MS\['{kernel}'\]: only launch, upload_inputs"):
        checked_pacing(dict(ProcessDevice.PACED_MS, **{kernel: [1.0, 0.0]}))
    assert checked_pacing(dict(ProcessDevice.PACED_MS)) == ProcessDevice.PACED_MS


def test_a_wants_more_that_forgot_its_return_is_named_and_the_engine_stays_usable():
    """Before: the run stopped with "the loop stopped with work left ... keep scheduling rounds",
    blaming a loop the learner never wrote."""
    from overlap_course.labs import plugins
    from toy_engine.config import EngineConfig
    from toy_engine.engine import Engine

    def wants_more(req):
        not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens

    with Engine(EngineConfig(device="cpu", mode="zos")) as engine:
        with pytest.raises(TypeError, match=r"per_request\(wants_more=wants_more\) returned "
                                            r"None for prompt 0, not True or False \(no `return` "
                                            r"gives None\)"):
            engine.generate(["Once upon a time", "The"], 6,
                            on_round=plugins.per_request(wants_more=wants_more))
        assert not engine.scheduler.has_work()
        assert all(r.finish_reason == "abort" for r in engine.requests)
        again = engine.generate(["The"], 4)
        assert again[0].finish_reason == "length" and len(again[0].token_ids) == 4


@pytest.mark.parametrize("hand_out", ["ring_engine", "title_ring_engine"])
def test_a_labs_engine_closed_by_the_learner_is_handed_out_new(hand_out):
    """Before: cached, the closed engine came back on every call (notebook 07's cell re-run
    included) and refused every run until the kernel restarted."""
    from overlap_course.labs import plugins, plugins_2026

    get = getattr(plugins if hand_out == "ring_engine" else plugins_2026, hand_out)
    first = get()
    assert get() is first
    with first:
        pass
    again = get()
    assert again is not first and not again.closed and get() is again
    assert again.generate(["The"], 3)[0].finish_reason == "length"
