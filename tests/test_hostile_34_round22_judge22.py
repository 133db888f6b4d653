"""Issue 34, round twenty-two, judge.  The judge compared the checker's world each time control
came back to the checker; a thread the loop started on its first call waited for the compare at
the loop's return, then rebound two of the checker's helpers with C callables (nothing of the
submission's returns, so nothing is compared), and the loop's next call put them back: a wrong
loop passed, 3 of 3.  Now a thread the submission started (from its code, through the standard
library, or from a thread of its own) that still runs as control comes back to the checker is
a change (``judge_threads``); the checker's and the engine's own threads are not."""

from __future__ import annotations

import gc

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_watch import Watch

from judged import IMPORTS, THREAD_CHEAT, needs_the_engine

RIGHT_WITH_AN_EXECUTOR = '''
import asyncio, concurrent.futures
async def serial(engine, pool):
    loop = asyncio.get_running_loop()
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        await loop.run_in_executor(pool, engine.device.wait, step.sample_done)
        engine.process_outputs(step)
def serial_loop(engine):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asyncio.run(serial(engine, pool))
'''

RIGHT_WITH_A_THREAD_PER_WAIT = '''
import threading
def serial_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        waiter = threading.Thread(target=engine.device.wait, args=(step.sample_done,))
        waiter.start()
        waiter.join()
        engine.process_outputs(step)
'''


def _submission(source: str) -> dict:
    space: dict = {}
    exec(compile(source, "<submission-1>", "exec"), space)  # as the judge names the cells' code
    return space


def _watched(run) -> Watch:
    watch = Watch()
    watch.start(lambda: [])
    try:
        run()
    finally:
        watch.stop()
    return watch


@pytest.mark.parametrize("how", ["its own code", "a Timer of the standard library",
                                 "a thread it started"])
def test_a_thread_the_submission_left_running_is_a_change_when_control_comes_back(how):
    gc.collect()  # earlier tests' garbage (sqlalchemy's class registry) not collected mid-watch
    space = _submission('''
import threading, time
stop = threading.Event()
def answer(how):
    if how == "its own code":
        threading.Thread(target=stop.wait, daemon=True).start()
    elif how == "a Timer of the standard library":
        threading.Timer(30, setattr, (stop, "x", 1)).start()
    else:
        def parent():
            threading.Thread(target=stop.wait, daemon=True).start()
        t = threading.Thread(target=parent)
        t.start()
        t.join()
''')
    try:
        watch = _watched(lambda: space["answer"](how))
    finally:
        space["stop"].set()
    assert any("a thread your code started" in c for c in watch.changed), watch.changed


def test_a_thread_joined_before_returning_is_no_change():
    space = _submission('''
import threading
def answer():
    t = threading.Thread(target=sum, args=([1, 2],))
    t.start()
    t.join()
''')
    assert _watched(space["answer"]).changed == []


def test_the_judge_fails_a_wrong_loop_whose_thread_changes_the_checker_between_runs():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, THREAD_CHEAT])
    assert not passed, message
    assert "a thread your code started" in message


@pytest.mark.parametrize("loop", [RIGHT_WITH_AN_EXECUTOR, RIGHT_WITH_A_THREAD_PER_WAIT],
                         ids=["asyncio and an executor", "a thread per wait"])
def test_the_judge_passes_right_loops_that_join_their_threads(loop):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, loop])
    assert passed, message
