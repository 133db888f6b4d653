"""Round nineteen's blind round B (issue 34): a function answer (a loop, process_outputs, a
correction) that raises its own BaseException subclass gets "your `...` raised", not the advice
for value answers; a loop whose rounds run in a thread it started is told the engine refused
that thread's call (kept by the run as the stall's cause), not that it returned early; a loop
that frees twice inside ``try/except`` is told to free once, not to wait on an event."""

import threading

import pytest

import toy_engine as te
from overlap_course import checks
from toy_engine.run import EngineStalled
import loops_for_tests

PROMPTS = ["Once upon a time", "The bird said"]


class Stop(BaseException):
    """A learner's own BaseException: not an Exception, so no check's ``except`` takes it."""


def _serial_round(engine):
    plan = engine.schedule()
    inputs = engine.prepare_inputs(plan)
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))
    return plan


def stops_early(engine):
    _serial_round(engine)
    raise Stop("done early")


def process_outputs(engine, step):
    raise Stop("oops")


def correct_seqlens_qk(meta, accepted, block_size):
    raise Stop("no correction")


@pytest.mark.parametrize("check, answer, name", [
    (checks.check_serial_loop, stops_early, "serial_loop"),
    (checks.check_zos_loop, stops_early, "zos_loop"),
    (checks.check_process_outputs, process_outputs, "process_outputs"),
    (checks.check_correction, correct_seqlens_qk, "correct_seqlens_qk"),
])
def test_a_function_answer_raising_its_own_base_exception_is_told_it_raised(check, answer, name):
    v = check(answer)
    assert not v.passed and v.category == "raised", v
    assert f"your `{name}` raised Stop: " in v.message, v
    assert "plain value" not in v.message and "while the check read it" not in v.message, v
    if name == "zos_loop":  # the learner's function has another name: the frame is named
        assert "(in `stops_early`)" in v.message, v


def test_a_value_answer_whose_own_code_raises_still_gets_the_value_advice():
    class Rounds(list):
        def __iter__(self):
            raise Stop("unreadable")
    v = checks.check_three_rounds(Rounds([1, 2, 3]))
    assert not v.passed and v.category == "raised", v
    assert "your answer's own code raised Stop: unreadable" in v.message, v
    assert "give a plain list of (stage, round) pairs" in v.message, v  # its value, named


def _in_a_thread(engine):
    """The serial loop, run in a thread the loop starts and joins."""
    def body():
        while engine.scheduler.has_work():
            _serial_round(engine)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()


_REFUSED = "engine.schedule() was called from another thread than the one running generate"
# The refusal is raised in the loop's own thread, as a learner's would be: pytest reports it.
_THREADS_ERROR = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


@_THREADS_ERROR
def test_a_loop_run_in_its_own_thread_is_told_the_engine_refused_that_thread():
    for check in (checks.check_serial_loop, checks.check_zos_loop):
        v = check(_in_a_thread)
        assert not v.passed and v.category == "other_thread", v
        assert _REFUSED in v.message and "Run the rounds in the thread that calls" in v.message, v
        assert "loop while" not in v.message, v
    assert checks.check_serial_loop(loops_for_tests.serial_loop).passed  # the engines recovered


@_THREADS_ERROR
def test_the_engine_makes_a_refused_thread_call_the_cause_of_the_stall(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=2)
    reference = [c.text for c in engine.generate(PROMPTS, max_new_tokens=6)]
    with pytest.raises(EngineStalled) as stalled:
        engine.generate(PROMPTS, max_new_tokens=6, loop=_in_a_thread)
    assert stalled.value.reason == "loop_returned_with_work"
    cause = stalled.value.__cause__
    assert type(cause) is RuntimeError and str(cause).startswith(_REFUSED), cause
    with pytest.raises(EngineStalled) as plain:  # a loop that just returns: no cause
        engine.generate(PROMPTS, max_new_tokens=6, loop=lambda eng: None)
    assert plain.value.__cause__ is None
    assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=6)] == reference


def _frees_again(guarded):
    """The serial loop, then each finished request of the round freed again (process_outputs
    freed it already); ``guarded``: inside ``try/except Exception: pass``."""
    def serial_loop(engine):
        while engine.scheduler.has_work():
            for r in _serial_round(engine).requests:
                if not r.finished:
                    continue
                if not guarded:
                    engine.scheduler.free(r)
                    continue
                try:
                    engine.scheduler.free(r)
                except Exception:  # noqa: BLE001 - the mistake under test
                    pass
    return serial_loop


def test_a_second_free_caught_is_told_to_free_once_not_to_wait():
    v = checks.check_serial_loop(_frees_again(guarded=True))
    assert not v.passed and v.category == "double_free", v
    assert "refused a second free of KV blocks" in v.message, v
    assert "your code caught the error and went on" in v.message, v
    assert "Free a request once" in v.message and "Wait on the right event" not in v.message, v
    v = checks.check_serial_loop(_frees_again(guarded=False))  # uncaught: the lesson's words
    assert not v.passed and "a second time: it was freed already" in v.message, v
    assert "Free each finished request once" in v.message, v
