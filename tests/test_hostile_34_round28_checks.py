"""Round 28 (blind attacker, exercise checks): what was wrong.

Ex03: a loop that made a call the engine refuses -- `prepare_inputs(plan)` twice, junk
`commit_outputs(previous, [0])` -- and caught the refusal passed (only a caught StaleInputs was
named).  Now any refusal of the engine the loop caught is named with the call and the round.

Ex05: the same in a `process_outputs` plug-in (`commit_outputs(step, [0])`, `schedule()`):
named now, as a caught refused read is.

Ex04: `signal.signal(SIGINT, SIG_IGN)` in a correction left the kernel ignoring Interrupts (and
was told as a TypeError in the device process).  Now a check puts back every signal handler its
code changed and names it; in the device process such calls are noted and not made
(device_state.signals_kept).  Every check left the checker's SIGALRM handler installed where
SIG_DFL was: it puts back SIG_DFL too.
"""

import signal

import pytest
import toy_engine as te

from overlap_course import checks
import loops_for_tests


def _zos(extra):
    def zos_loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            inputs = engine.prepare_inputs(plan)
            try:
                extra(engine, plan, previous)
            except Exception:  # noqa: BLE001 - the learner's mistake under test
                pass
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None:
                engine.process_outputs(previous)
                previous = None
            step = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(step)
            else:
                previous = step
        engine.flush(previous)
    return zos_loop


def _prepare_again(engine, plan, previous):
    engine.prepare_inputs(plan)


def _commit_junk(engine, plan, previous):
    if previous is not None:
        engine.commit_outputs(previous, [0])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("extra, call, why", [
    (_prepare_again, "prepare_inputs", "PreparedTwice"),
    (_commit_junk, "commit_outputs", "BadOutputs")], ids=["prepared_twice", "bad_outputs"])
def test_a_refusal_the_loop_caught_is_named(extra, call, why):
    verdict = checks.check_zos_loop(_zos(extra))
    assert not verdict and verdict.category == "refusal_caught", verdict
    for said in (f"your loop called `engine.{call}` and the engine refused it", why,
                 "your loop caught the error and went on", "in round "):
        assert said in verdict.message, verdict


@pytest.mark.timeout(200)
def test_a_check_puts_back_the_alarm_handler_it_found():
    found = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        assert checks.check_zos_loop(loops_for_tests.zos_loop()), "the right loop passes"
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGALRM, found)


def _right(meta, accepted, block_size):
    import torch
    B = meta["seqlens_q"].shape[0]
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    tok = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device),
                                  meta["seqlens_q"], output_size=len(meta["positions"]))
    meta["positions"] += delta[tok]
    p = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][tok, p // block_size] * block_size
                               + p % block_size)


def _ignores_interrupt(meta, accepted, block_size):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _right(meta, accepted, block_size)


@pytest.mark.timeout(250)
def test_a_correction_s_signal_handler_is_named_and_put_back():
    interrupt = signal.getsignal(signal.SIGINT)
    verdict = checks.check_correction(_ignores_interrupt)
    assert not verdict and verdict.category == "signals", verdict
    assert "set the handler of SIGINT" in verdict.message, verdict
    assert "TypeError" not in verdict.message, verdict
    assert signal.getsignal(signal.SIGINT) == interrupt
    assert checks.check_correction(_right), "the right correction passes"


def _process_outputs(extra):
    def process_outputs(engine, step):
        try:
            extra(engine, step)
        except Exception:  # noqa: BLE001 - the learner's mistake under test
            pass
        engine.device.wait(step.sample_done)
        out = engine.read_outputs(step)
        for req in engine.commit_outputs(step, out):
            if req.finished and req.num_inflight == 0:
                engine.scheduler.free(req)
    return process_outputs


@pytest.mark.timeout(250)
@pytest.mark.parametrize("extra, call, why", [
    (lambda e, s: e.commit_outputs(s, [0]), "commit_outputs", "BadOutputs"),
    (lambda e, s: e.schedule(), "schedule", "StageInPlugin")], ids=["commit", "schedule"])
def test_a_refusal_process_outputs_caught_is_named(extra, call, why):
    verdict = checks.check_process_outputs(_process_outputs(extra))
    assert not verdict and verdict.category == "refusal_caught", verdict
    for said in (f"your process_outputs called `engine.{call}` and the engine refused it", why,
                 "your code caught the error and went on"):
        assert said in verdict.message, verdict


@pytest.mark.timeout(250)
def test_the_right_process_outputs_passes():
    assert checks.check_process_outputs(_process_outputs(lambda e, s: None))
