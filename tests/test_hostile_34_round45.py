"""Issue 34, round forty-five.  Round 44's refusal of a queue no round can be planned from ran
before the round's ``on_round`` plug-in, so a plug-in that queued a request of another run, a
copy or junk met the bare errors again; and exercise 05 read a read's order from the record of
``engine.device.host`` accesses, which an answer bypassed by reading ``engine.device.buffers``
itself or by swapping the device's books for the read (4/4 in real nbgrader, both).  Each
failed when written."""

from __future__ import annotations

import copy
import time

import pytest

import toy_engine as te
from overlap_course import checks
from toy_engine import buffers


@pytest.mark.parametrize("queue, said", [
    (lambda e, earlier: e.scheduler.waiting.appendleft(earlier[0]),
     "request 0 is not one of this run's requests"),
    (lambda e, earlier: e.scheduler.waiting.appendleft(copy.copy(e.scheduler.running[0])),
     "is not one of this run's requests"),
    (lambda e, earlier: e.scheduler.running.append(42), "42 is not one of this run's requests"),
])
def test_what_an_on_round_plug_in_queues_is_refused_by_name(queue, said):
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        first = engine.generate(["ab", "cd"], max_new_tokens=4)
        earlier = list(engine.requests)

        def on_round(engine, rnd):
            if rnd == 1:
                queue(engine, earlier)
        with pytest.raises(RuntimeError, match=said):
            engine.generate(["ab", "cd"], max_new_tokens=4, on_round=on_round)
        assert all(r.finish_reason == "abort" for r in engine.requests)
        again = engine.generate(["ab", "cd"], max_new_tokens=4)
        assert [c.token_ids for c in again] == [c.token_ids for c in first]


def _commit(engine, step, out):
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def _reads_the_buffer_itself(engine, step):
    n = len(step.plan.requests)
    k = 0 if step.plan.is_prefill else engine.config.num_draft_tokens
    time.sleep(0.03)  # the device has written it by now, most often: right tokens
    out = engine.device.buffers[buffers.out_buffer(step.slot)][:buffers.outputs_size(n, k)]
    engine.device.wait(step.sample_done)
    _commit(engine, step, out.tolist())


def _swaps_the_books_for_the_whole_step(engine, step):
    device = engine.device
    races, record = device.races, device.run_record
    device.races, device.run_record = type(races)(True), type(record)()
    try:  # the wait first here (right tokens): with its books swapped no order can be read
        device.wait(step.sample_done)
        out = engine.read_outputs(step)
        _commit(engine, step, out)
    finally:
        device.races, device.run_record = races, record


@pytest.mark.parametrize("answer", [_reads_the_buffer_itself, _swaps_the_books_for_the_whole_step])
def test_a_read_the_record_cannot_see_is_refused(answer):
    verdict = checks.check_process_outputs(answer)
    assert not verdict.passed and verdict.category == "unchecked_read", verdict.message
    assert "did not read through the engine" in verdict.message


def test_a_right_answer_that_reads_through_host_after_its_wait_passes():
    def process_outputs(engine, step):
        engine.device.wait(step.sample_done)
        n = len(step.plan.requests)
        k = 0 if step.plan.is_prefill else engine.config.num_draft_tokens
        out = engine.device.host(buffers.out_buffer(step.slot))[:buffers.outputs_size(n, k)]
        _commit(engine, step, out.tolist())
    assert checks.check_process_outputs(process_outputs).passed


@pytest.mark.parametrize("replace", [
    lambda s: setattr(s, "waiting", ()), lambda s: setattr(s, "running", ()),
    lambda s: setattr(s, "free_rows", ()),
])
def test_a_clean_run_that_replaced_the_schedulers_queues_leaves_the_next_generate_working(replace):
    """Round 45: the run returned, and the next generate failed on the queue it left."""
    def loop(engine):
        te.loops.serial_loop(engine)
        replace(engine.scheduler)
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        engine.generate(["ab", "cd"], max_new_tokens=4, loop=loop)
        assert [c.finish_reason for c in engine.generate(["ab"], max_new_tokens=4)] == ["length"]


def _raises_after_its_read(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    return out[len(step.plan.requests) * 200]


def _loop_that_raises(engine):
    while engine.scheduler.has_work():
        engine.schedule()
        return [1][5]


@pytest.mark.parametrize("check, answer, said", [
    (checks.check_process_outputs, _raises_after_its_read,
     "of `_raises_after_its_read`, `return out[len(step.plan.requests) * 200]`)"),
    (checks.check_serial_loop, _loop_that_raises,
     "of `_loop_that_raises`, `return [1][5]`)"),
])
def test_an_answer_that_raises_is_told_its_line(check, answer, said):
    verdict = check(answer)
    assert not verdict.passed and verdict.category == "raised", verdict.message
    assert " (at line " in verdict.message and said in verdict.message, verdict.message
