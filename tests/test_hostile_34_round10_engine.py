"""Issue 34, round ten (fixed in the eleventh): a Ctrl-C while ``Engine()`` started left its device
process running for as long as the interrupt's traceback was kept (Jupyter keeps the last one);
a right loop checked after a stopped wrong one was told an earlier cell had replaced
``engine.device.buffers[0]``; exercise 05's "See it work" cell ended in a traceback on two
mistakes its own checker names."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import multiprocessing as mp
from pathlib import Path

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.checks import pool, sandbox
from toy_engine import process_device
from toy_engine.config import EngineConfig
from toy_engine.engine import Engine
from toy_engine.process_device import ProcessDevice

from blind_corpus import po_commit_twice as _committed_twice  # exercise 05: commits twice
import loops_for_tests

ROOT = Path(__file__).resolve().parent.parent


def _device_processes() -> list:
    return [p for p in mp.active_children() if p.name == "toy-engine-device"]


def _interrupt_at(monkeypatch, where: str) -> None:
    """Raise KeyboardInterrupt where a real Ctrl-C lands while ``Engine()`` starts."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "pickling the model":
        monkeypatch.setattr(process_device.cloudpickle, "dumps", interrupt)
    elif where == "waiting for ready":
        poll = ProcessDevice._poll
        monkeypatch.setattr(ProcessDevice, "_poll", lambda self, deadline, what: (
            interrupt() if what == "start" else poll(self, deadline, what)))
    else:  # the device is up; the engine builds its first timeline
        monkeypatch.setattr(Engine, "_meta", interrupt)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where",
                         ["pickling the model", "waiting for ready", "the engine's timeline"])
def test_an_engine_start_cut_short_by_ctrl_c_ends_its_device_process(monkeypatch, where):
    before = _device_processes()
    _interrupt_at(monkeypatch, where)
    with pytest.raises(KeyboardInterrupt) as caught:
        Engine(EngineConfig(device="cpu"))
    monkeypatch.undo()
    kept = caught.value.__traceback__  # as IPython keeps sys.last_traceback
    gc.collect()
    left = [p for p in _device_processes() if p not in before]
    for proc in left:
        proc.kill()
    assert kept is not None and not left, \
        f"Ctrl-C while {where}: the device process outlives the interrupt: {left}"


@pytest.mark.timeout(60)
def test_a_device_process_that_cannot_start_is_reported_as_it_was(monkeypatch):
    def refuse(*args):
        raise OSError("cannot start the device process: no room")

    monkeypatch.setattr(process_device, "_start", refuse)
    with pytest.raises(OSError, match="no room") as caught:  # not an AttributeError from close()
        Engine(EngineConfig(device="cpu"))
    assert caught.value.__context__ is None, repr(caught.value.__context__)


def _zos_loop(sample_first=False, correct_twice=False, change=None):
    """Exercise 03's loop, or one of two wrong ones (the run fails on the device and the engine
    starts a new device process); ``change(engine)`` first, as a wrong answer's experiment."""
    def zos_loop(engine):
        if change is not None:
            change(engine)
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                for _ in range(1 + correct_twice):
                    engine.correct_on_device(inputs)
            if sample_first:
                step = engine.launch_sample(inputs)
            engine.launch_forward(inputs)
            if previous is not None:
                engine.process_outputs(previous)
                previous = None
            if not sample_first:
                step = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(step)
            else:
                previous = step
    return zos_loop


def _serial_sample_first(engine):
    while engine.scheduler.has_work():
        inputs = engine.prepare_inputs(engine.schedule())
        step = engine.launch_sample(inputs)
        engine.launch_forward(inputs)
        engine.process_outputs(step)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("check, wrong, right, category", [
    ("check_serial_loop", _serial_sample_first, loops_for_tests.serial_loop,
     "sample_before_forward"),
    ("check_zos_loop", _zos_loop(sample_first=True), _zos_loop(), "sample_before_forward"),
    ("check_zos_loop", _zos_loop(correct_twice=True), _zos_loop(), "launched_twice"),
], ids=["02-sample-first", "03-sample-first", "03-correct-twice"])
def test_a_right_loop_after_a_wrong_one_that_failed_the_device_carries_no_note(
        check, wrong, right, category, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 60.0)
    wrong_verdict = getattr(checks, check)(wrong)
    assert wrong_verdict.category == category, wrong_verdict.message
    verdict = getattr(checks, check)(right)
    assert verdict.passed, verdict.message
    assert "earlier cell" not in verdict.message, verdict.message


@pytest.mark.timeout(240)
def test_a_change_beside_a_failed_device_is_still_named(monkeypatch):
    """The engine's new device is no change of the learner's; the tokenizer's EOS id is."""
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 60.0)
    wrong = _zos_loop(sample_first=True, change=lambda e: setattr(e.tokenizer, "eos_id", 5))
    assert not checks.check_zos_loop(wrong).passed
    verdict = checks.check_zos_loop(_zos_loop())
    assert verdict.passed, verdict.message
    assert "earlier cell had replaced `engine.tokenizer.eos_id" in verdict.message, \
        verdict.message


@pytest.mark.timeout(240)
def test_a_host_buffer_a_cell_replaced_is_still_named(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 60.0)
    assert checks.check_zos_loop(_zos_loop()).passed
    buffers = pool.engine().device.buffers
    name = next(iter(buffers))
    buffers[name] = buffers[name].clone()  # the device process never sees this one
    verdict = checks.check_zos_loop(_zos_loop())
    assert verdict.passed, verdict.message
    assert "earlier cell had replaced `engine.device.buffers[0]" in verdict.message, \
        verdict.message


def _calls_the_engines(engine, step):
    engine.process_outputs(step)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("notebook", ["exercises", "solutions"])
@pytest.mark.parametrize("answer, said", [
    (_committed_twice, "not yet: StepProcessedTwice - round 0's step was already processed"),
    (_calls_the_engines, "not yet: StageInPlugin - engine.process_outputs() was called from "
                         "inside the plug-in process_outputs=_calls_the_engines, the stage it "
                         "replaces"),
], ids=["committed-twice", "calls-itself"])
def test_exercise_05_see_it_work_names_what_its_checker_names(notebook, answer, said):
    """The cell caught only RaceError and EngineStalled: these ended in a traceback.  (A plug-in
    calling the stage it replaces recursed until round 19; the engine refuses it by name now.)"""
    nb = json.loads((ROOT / notebook / "05_lifetime.ipynb").read_text(encoding="utf-8"))
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    setup = next(c for c in cells if "PROMPTS = [" in c)
    see_it_work = next(c for c in cells if "process_outputs=process_outputs" in c)
    names: dict = {}
    exec(setup, names)  # noqa: S102 - the notebook's own cells
    names["process_outputs"] = answer
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        exec(see_it_work, names)  # noqa: S102
    assert shown.getvalue().startswith(said), shown.getvalue()
