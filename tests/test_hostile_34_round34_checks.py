"""Issue 34, round thirty-four (exercise 03's loop checker): a prefill step flushed though a plan
was found, and a free the race checker stopped, told in its own words.

a: a ZOS loop that processed each PREFILL step with ``engine.flush(step)`` right after its
sample, though ``schedule()`` had returned a plan, passed ``check_zos_loop`` with no note; the
same misuse for a decode step is refused (``flushed_with_a_plan``), and the lesson keeps flush
for when ``schedule()`` returns None. ``host_order.flushed_with_a_plan`` skipped prefill rounds
("a prefill flushed at once is a process_outputs"): it reads every round now, and names the
prefill round and its fix (``engine.process_outputs(step)`` at once after the sample).
b: a ZOS loop that wrote its step processing out inline (allowed) and freed every finished
request without the ``num_inflight == 0`` test was told the race checker's raw text ("the race
checker stopped your loop (free_in_use, round 10's `forward`): ... free ... only after waiting
on round 10's event"): internal kinds, and a wait that would throw the overlap away
(``learner_code._raced`` handed every race but a buffer write through). A ``free_in_use`` is now
told in the lesson's words, as exercise 05's checker does (the extra step; free a finished
request only when ``req.num_inflight == 0``), and a ``double_free`` (a loop freeing what
``process_outputs`` freed, in exercise 02 or 03) is told to free each request once. A
``launch_on_free`` needs a step processed before the next forward, which the order names first.
"""

from __future__ import annotations

import re

from loops_for_tests import zos_loop as right_zos_loop
from overlap_course import checks


def _inline(check: bool):
    """Step processing written out: wait, read, commit, free the finished requests (only those
    no launched round uses when ``check``)."""
    def process(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and (not check or req.num_inflight == 0):
                engine.scheduler.free(req)
    return process


def _processed(engine, step):
    engine.process_outputs(step)


def _freed_twice(engine, step):
    """``process_outputs`` frees the finished requests no launched round uses: so does this."""
    engine.process_outputs(step)
    for req in step.plan.requests:
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def _zos(process=_processed, prefill=None):
    """The lesson's ZOS loop, each step processed by ``process`` (a prefill's by ``prefill``)."""
    prefill = prefill or process

    def zos_loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None:
                process(engine, previous)
                previous = None
            step = engine.launch_sample(inputs)
            if plan.is_prefill:
                prefill(engine, step)
            else:
                previous = step
    return zos_loop


def test_a_a_prefill_step_flushed_though_a_plan_was_found_is_refused():
    v = checks.check_zos_loop(_zos(prefill=lambda engine, step: engine.flush(step)))
    assert not v.passed and v.category == "flushed_with_a_plan", v
    assert v.message.startswith("round 0 (prefill, prompts [0, 1, 2]): your loop processed its "
                                "step with `engine.flush`, though the last `engine.schedule()` "
                                "had returned a plan (round 0's)"), v.message
    assert "`engine.process_outputs(step)`, at once after the prefill's sample" in v.message
    assert "`previous = engine.flush(previous)` for the None plan" in v.message


def test_a_right_loops_that_flush_only_at_the_none_plan_pass():
    for loop in (right_zos_loop(), _zos(), _zos(_inline(True))):
        v = checks.check_zos_loop(loop)
        assert v.passed, v


def test_b_a_free_under_the_next_round_is_told_in_the_lessons_words():
    v = checks.check_zos_loop(_zos(_inline(False)))
    assert not v.passed and v.category == "free_in_use", v
    assert re.match(r"with speculative decoding \(3 drafts per round\): "  # (round 37: named)
                    r"round 9 \(decode, prompts \[0, 1, 2\]\): your loop freed the KV cache of "
                    r"prompt 0 \(blocks \[\d+, \d+, \d+\]\) while round 10's `forward`, launched "
                    r"and not yet waited for, still uses it \(the extra step: under ZOS the "
                    r"finished request is already in the next launched round\)\. Free a finished "
                    r"request only when `req\.num_inflight == 0`", v.message), v.message
    assert "race checker" not in v.message and "free_in_use" not in v.message
    assert "after waiting on" not in v.message


def test_b_a_second_free_is_told_to_free_once_in_exercises_02_and_03():
    def serial_loop(engine):
        while engine.scheduler.has_work():
            inputs = engine.prepare_inputs(engine.schedule())
            engine.launch_forward(inputs)
            _freed_twice(engine, engine.launch_sample(inputs))

    for v in (checks.check_serial_loop(serial_loop), checks.check_zos_loop(_zos(_freed_twice))):
        assert not v.passed and v.category == "double_free", v
        assert "your loop freed the KV cache of prompt 0 (blocks [" in v.message, v.message
        assert "a second time" in v.message and "Free each finished request once" in v.message
        assert "race checker" not in v.message and "double_free" not in v.message
