"""Issue 34, round twenty-eight (learner): exercises 03, 04 and 05 as a learner meets them.

F2: exercise 04 (a): a correction that cancelled the device process's alarm (`signal.alarm(0)`,
`setitimer(ITIMER_REAL, 0)`, `signal.signal(SIGALRM, SIG_IGN)`), then looped forever in the
engine's run, was stopped by the host's limit and told "at line 1 of `<lambda>`" (the host's
own wait): those calls are now noted, not made, while a correction runs in a device process, so
the limit there names the learner's line, and the call. `os._exit(0)` in a correction gave the
engine's DeviceError: it is named, with its line. F3: exercise 03 (a): a loop that launched the
previous round's stage again in a later round, inside try/except (the engine refused it,
StaleInputs), passed; the same call within one round was named: both are now. F1: an Interrupt
inside torch._dynamo's own import (made here the same way, an import that raises
KeyboardInterrupt halfway, in a process of its own) left torch half-loaded, and every later
check blamed the learner's host read: it says to restart the kernel, naming the module. Small:
exercise 05's advice for `req.output_ids = tuple(...)` after `engine.commit_outputs` told the
learner to append what the commit appends; "1 tokens" / "1 times" counts in lab 2's and
exercise 04's messages; the `check-time-limit` watchdog outlived a check that hung in C.
"""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
import threading

import pytest
import torch

from overlap_course import checks
from overlap_course.checks import lab_mistakes, sandbox
from toy_engine.refusals import StateReplaced


def right(meta, accepted, block_size):
    B = meta["seqlens_q"].shape[0]
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    tok = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device), meta["seqlens_q"],
                                  output_size=len(meta["positions"]))
    meta["positions"] += delta[tok]
    blk = meta["block_tables"][tok, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(blk * block_size + meta["positions"] % block_size)


def _line(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# F2: the device process's alarm turned off, then an endless loop in the engine's run

def alarm_off(meta, accepted, block_size):
    right(meta, accepted, block_size)
    if block_size == 16:
        signal.alarm(0)
        while True:
            pass


def alarm_ignored(meta, accepted, block_size):
    right(meta, accepted, block_size)
    if block_size == 16:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            pass


def exits(meta, accepted, block_size):
    right(meta, accepted, block_size)
    if block_size == 16:
        import os
        os._exit(0)


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 10.0)  # the device's stop comes at 80 %: 8 s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fn, calls", [
    (alarm_off, {"signal.alarm(0)": "signal.alarm(0)"}),
    (alarm_ignored, {"signal.setitimer(signal.ITIMER_REAL, ...)": "signal.setitimer(",
                     "signal.signal(signal.SIGALRM, ...)": "signal.signal("})],
    ids=["alarm", "ignored"])
def test_a_correction_that_turns_the_alarm_off_is_named_at_its_line(short_limit, fn, calls):
    verdict = checks.check_correction(fn)
    assert not verdict and verdict.category == "time_limit", verdict
    assert any(f"at line {_line(fn, text)} of `{fn.__name__}`" in verdict.message
               for text in ("while True", "pass")), verdict  # the loop's lines, either
    for call, text in calls.items():
        said = f"`{call}` at line {_line(fn, text)} of `{fn.__name__}`"
        assert said in verdict.message, verdict
    assert "<lambda>" not in verdict.message
    assert checks.check_correction(right), "the right answer, next, passes"


@pytest.mark.timeout(120)
def test_os_exit_in_a_correction_is_named_at_its_line():
    verdict = checks.check_correction(exits)
    assert not verdict and verdict.category == "engine_error", verdict
    assert (f"called `os._exit(0)`, at line {_line(exits, 'os._exit')} of `exits`"
            in verdict.message), verdict
    assert "DeviceError" not in verdict.message
    assert checks.check_correction(right)


# F3: a stage of the round before launched again in a later round, its refusal caught

def _zos(stage: str | None):
    def zos_loop(engine):
        previous = prev_inputs = None
        n = 0
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            n += 1
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None:
                engine.process_outputs(previous)
                previous = None
            step = engine.launch_sample(inputs)
            if n == 4 and stage is not None:  # round 3: round 2's stage a second time
                try:
                    getattr(engine, stage)(prev_inputs)
                except Exception:  # noqa: BLE001 - the mistake: the refusal swallowed
                    pass
            prev_inputs = inputs
            if plan.is_prefill:
                engine.process_outputs(step)
            else:
                previous = step
        engine.flush(previous)
    return zos_loop


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage", ["launch_forward", "launch_sample"])
def test_a_stage_relaunched_in_a_later_round_and_caught_is_named(stage):
    verdict = checks.check_zos_loop(_zos(stage))
    assert not verdict and verdict.category == "inputs_replaced", verdict
    assert verdict.message.startswith("round 2 "), verdict
    for said in (f"`engine.{stage}` again with its inputs after round 3's were prepared",
                 "the engine refused it, and your loop caught the error and went on"):
        assert said in verdict.message, verdict


@pytest.mark.timeout(120)
def test_the_same_loop_without_the_second_launch_passes():
    assert checks.check_zos_loop(_zos(None))


# F1: torch._dynamo's import interrupted halfway

HALF_LOADED = '''
import importlib.abc, sys

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch._inductor.exc":  # Jupyter's Interrupt, halfway through the import
            raise KeyboardInterrupt

sys.meta_path.insert(0, Interrupt())
try:
    import torch._dynamo
except KeyboardInterrupt:
    pass
del sys.meta_path[0]
from overlap_course import checks
from tests_right import right
print(checks.check_correction(right))
'''


@pytest.mark.timeout(300)
def test_torch_half_loaded_by_an_interrupt_says_to_restart_the_kernel(tmp_path):
    (tmp_path / "tests_right.py").write_text(
        "import torch\n" + inspect.getsource(right), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", HALF_LOADED], capture_output=True, text=True,
                          timeout=280, cwd=tmp_path)
    said = done.stdout.strip()
    assert said.startswith("NOT YET"), (said[-2000:], done.stderr[-2000:])
    for text in ("`torch._dynamo`", "restart the kernel (Kernel > Restart)"):
        assert text in said, said
    assert "on the host" not in said


# Small: exercise 05's advice, counts, the watchdog

def test_a_tuple_left_after_commit_outputs_is_not_told_to_append():
    via = "by process_outputs=f, committing prompt 0's tokens through engine.commit_outputs,"
    told = str(StateReplaced(0, "output_ids", (4,), via))
    assert "append" not in told.split("must stay")[1].replace("the engine appends", ""), told
    assert "engine.commit_outputs already adds each kept token to it" in told
    itself = str(StateReplaced(0, "output_ids", (4,), "by f, committing prompt 0's tokens itself,"))
    assert "req.output_ids.append(tok)" in itself, "a commit by hand still appends"


def test_one_is_counted_in_the_singular():
    went = lab_mistakes._abort_request("prompt 0", ([1, 2], "length"), ([1], "abort"), "x")
    assert "was aborted with 1 token but" in went.message, went
    short = lab_mistakes._abort_request("prompt 0", ([7], "eos"), ([8, 9], "eos"), "x")
    assert "prompt 0: 1 token (eos)" in short.message, short
    slots = checks.check_corrected_slots([1, 2], positions=[10], table=[6, 0, 8, 5],
                                         accepted=0, block_size=4)
    assert "feeds 1 token this round" in slots.message and "give 1 slot," in slots.message


def hangs_in_c(meta, accepted, block_size):
    signal.pause()


@pytest.mark.timeout(60)
def test_the_watchdog_ends_with_its_check(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 1.0)
    for _ in range(2):
        verdict = checks.check_correction(hangs_in_c)
        assert verdict.category == "time_limit", verdict
        left = [t.name for t in threading.enumerate() if t.name == "check-time-limit"]
        assert not left, "the watchdog thread outlived its check"
