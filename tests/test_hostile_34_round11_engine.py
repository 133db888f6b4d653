"""Issue 34, round eleven (fixed in the twelfth): a generator or async function given as a plug-in
was accepted and did nothing; ``wants_more`` answering numpy's ``np.True_`` was refused, and the
checker's verdict on a wrong answer said the function "raised" and named its own wrapper; an
``engine.abort`` from another thread changed the run under the loop; the atexit close of a
lab's engine still running in a daemon thread printed a traceback."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from overlap_course.checks import lesson07
from overlap_course.labs import plugins, plugins_2026
from toy_engine.sequence import Request

ROOT = Path(__file__).resolve().parent.parent


def _generator(*args):
    yield True


async def _coroutine(*args):
    return True


class _Yields:
    def __call__(self, *args):
        yield True

    def method(self, *args):
        yield True


NEVER_RUN = {"a generator function": _generator, "an async function": _coroutine,
             "an object whose __call__ yields": _Yields(), "a bound method that yields": _Yields().method,
             "a partial of a generator function": functools.partial(_generator)}

# Each builder of a plug-in the labs and the engine accept, and the argument its refusal names.
BUILDERS = {
    "per_request(wants_more=)": (lambda f: plugins.per_request(wants_more=f), "wants_more"),
    "per_request(commit=)": (lambda f: plugins.per_request(commit=f), "commit"),
    "aborts(abort)": (lambda f: plugins.aborts(f, [(1, 0)]), "abort"),
    "batch_queue(before_sample)": (lambda f: plugins_2026.batch_queue(2, f), "before_sample"),
    "future_key(key)": (lambda f: plugins_2026.future_key(f), "key"),
}


@pytest.mark.parametrize("kind", NEVER_RUN)
@pytest.mark.parametrize("builder", BUILDERS)
def test_a_plug_in_that_a_call_would_not_run_is_refused_when_built(builder, kind):
    build, argument = BUILDERS[builder]
    with pytest.raises(TypeError, match=f"{argument} must be a plain function") as caught:
        build(NEVER_RUN[kind])
    assert "would never run" in str(caught.value)


@pytest.mark.parametrize("kind", ["a generator function", "an async function"])
@pytest.mark.parametrize("plug_in", ["on_round", "loop", "process_outputs"])
def test_generate_refuses_a_plug_in_that_a_call_would_not_run(engine_pool, plug_in, kind):
    engine = engine_pool(mode="serial")
    with pytest.raises(TypeError, match=f"{plug_in} must be a plain function"):
        engine.generate("Once upon a time", max_new_tokens=2, **{plug_in: NEVER_RUN[kind]})


def test_plain_functions_partials_and_builtins_are_still_taken():
    def wants_more(req, extra=None):
        return not req.finished

    plugins.per_request(wants_more=functools.partial(wants_more, extra=1))
    plugins.per_request(wants_more=lambda req: True)
    plugins.aborts(print, [(1, 0)])


@pytest.mark.parametrize("check, kind", [(lesson07.check_wants_more, "a generator function"),
                                         (lesson07.check_abort, "an async function"),
                                         (lesson07.check_commit, "a generator function")])
def test_a_check_says_the_function_never_runs(check, kind):
    verdict = check(NEVER_RUN[kind])
    assert verdict.category == "shape", verdict.message
    assert "must be a plain function" in verdict.message and kind in verdict.message


# ------------------------------------------------------------------ wants_more's answer


def _own_policy_as_numpy(req):
    wanted = np.int64(len(req.output_ids) + req.num_inflight) < req.max_new_tokens
    return np.logical_and(not req.finished, wanted)  # np.True_ / np.False_


def test_per_request_takes_numpy_bools(engine_pool):
    engine = engine_pool(mode="zos")
    prompts = ["Once upon a time", "The dog"]
    own = [c.token_ids for c in engine.generate(prompts, max_new_tokens=8)]
    outs = engine.generate(prompts, max_new_tokens=8,
                           on_round=plugins.per_request(wants_more=_own_policy_as_numpy))
    assert [c.token_ids for c in outs] == own


def test_check_wants_more_passes_a_policy_answering_numpy_bools():
    verdict = lesson07.check_wants_more(_own_policy_as_numpy)
    assert verdict.passed, verdict.message


def answers_two(req):
    return 2  # 1 and 0 are taken as True and False (round sixteen): 2 is neither


def answers_none(req):
    pass


def test_check_wants_more_names_a_wrong_answer_and_the_learners_function():
    verdict = lesson07.check_wants_more(answers_two)
    assert verdict.category == "shape", verdict.message
    message = verdict.message
    assert "`answers_two` returned 2" in message and "not True or False" in message, message
    assert "spy" not in message and "raised" not in message and "None" not in message, message


def test_check_wants_more_gives_the_none_hint_only_for_none():
    verdict = lesson07.check_wants_more(answers_none)
    assert verdict.category == "shape", verdict.message
    assert "`answers_none` returned None" in verdict.message
    assert "without `return` returns None" in verdict.message


def test_per_request_names_the_function_and_gives_the_none_hint_only_for_none(engine_pool):
    engine = engine_pool(mode="zos")
    with pytest.raises(plugins.NotTrueOrFalse) as caught:
        engine.generate("Once upon a time", max_new_tokens=4,
                        on_round=plugins.per_request(wants_more=answers_two))
    assert "wants_more=answers_two) returned 2" in str(caught.value)
    assert "None" not in str(caught.value)


# ------------------------------------------------------------------ abort from another thread


def _from_another_thread(call, *args) -> list:
    """Run ``call(*args)`` in another thread, to its end (the loop's thread waits: the abort
    lands exactly there); what it raised."""
    raised = []

    def run():
        try:
            call(*args)
        except Exception as err:  # noqa: BLE001 - reported by the test
            raised.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised


def test_an_abort_from_another_thread_waits_for_the_round_boundary(engine_pool):
    """Mid-commit, the abort of the request being committed: it used to end "abort" there, then
    the commit ended it again ("length")."""
    engine, seen = engine_pool(mode="serial", max_batch_size=2), []

    def commit(req, tokens, eos_id, decode):
        if req.index == 0 and len(req.output_ids) == 4:  # this commit reaches its limit, 5
            seen.append(_from_another_thread(engine.abort, req.id))
            seen.append(req.finish_reason)
        Request.commit(req, tokens, eos_id, decode)

    outs = engine.generate(["Once upon a time", "The dog"], max_new_tokens=5,
                           on_round=plugins.per_request(commit=commit))
    assert seen == [[], None], f"the abort changed the request mid-round: {seen}"
    assert [(c.finish_reason, len(c.token_ids)) for c in outs] == [("length", 5), ("length", 5)]


def test_an_abort_from_another_thread_while_the_scheduler_plans(engine_pool):
    """While the scheduler asks each running request ``wants_more``, the abort of one already
    planned: it used to free that request's blocks under the plan (an IndexError)."""
    engine = engine_pool(mode="serial", max_batch_size=3)
    raised = []

    def wants_more(req):
        if req.index == 1 and len(req.output_ids) == 2:
            raised.extend(_from_another_thread(engine.abort, engine.requests[0].id))
        return Request.wants_more(req)

    outs = engine.generate(["Once upon a time", "The dog", "A cat"], max_new_tokens=5,
                           on_round=plugins.per_request(wants_more=wants_more))
    assert raised == []
    assert [(c.finish_reason, len(c.token_ids)) for c in outs] == [
        ("abort", 3), ("length", 5), ("length", 5)]
    s = engine.scheduler
    assert not s.running and not s.waiting
    assert len(s.blocks.free_ids) == engine.config.num_kv_blocks


def test_an_abort_from_another_thread_of_a_waiting_request_keeps_it_from_starting(engine_pool):
    engine = engine_pool(mode="zos", max_batch_size=1)
    raised = []

    def on_round(engine, round):
        if round == 1:
            raised.extend(_from_another_thread(engine.abort, engine.requests[1].id))

    outs = engine.generate(["Once upon a time", "The dog"], max_new_tokens=4, on_round=on_round)
    assert raised == []
    assert [(c.finish_reason, len(c.token_ids)) for c in outs] == [("length", 4), ("abort", 0)]


def test_an_abort_queued_as_the_run_ends_leaves_the_next_run_alone(engine_pool):
    engine = engine_pool(mode="serial", max_batch_size=2)

    def commit(req, tokens, eos_id, decode):
        if len(req.output_ids) == 2:  # the last commit of each request: nothing plans again
            _from_another_thread(engine.abort, req.id)
        Request.commit(req, tokens, eos_id, decode)

    outs = engine.generate(["Once upon a time", "The dog"], max_new_tokens=3,
                           on_round=plugins.per_request(commit=commit))
    assert [c.finish_reason for c in outs] == ["length", "length"]
    again = engine.generate(["Once upon a time", "The dog"], max_new_tokens=3)
    assert [c.token_ids for c in again] == [c.token_ids for c in outs]
    assert [c.finish_reason for c in again] == ["length", "length"]


# ------------------------------------------------------------------ the labs' engines at exit

BUSY_AT_EXIT = textwrap.dedent("""
    import threading
    from overlap_course.labs import plugins

    engine = plugins.ring_engine()
    print(engine.device.pid if hasattr(engine.device, "pid") else -1, flush=True)
    running = threading.Event()

    def work():
        engine.generate(["Once upon a time"] * 3, max_new_tokens=200,
                        on_round=lambda engine, round: running.set())

    threading.Thread(target=work, daemon=True).start()
    running.wait()
""")


@pytest.mark.timeout(120)
def test_a_labs_engine_busy_in_a_daemon_thread_at_exit_closes_quietly():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BUSY_AT_EXIT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert done.stderr == "", done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while pid > 0 and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # reaped by init once its parent is gone
    assert pid < 0 or not _running(pid), f"the device process {pid} outlived Python"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
