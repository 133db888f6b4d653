"""Issue 34, round twenty-one, grading.  The judge compared the checker's world each time the
submission's code handed control back to code not its own; under asyncio that is every step of
every task, so a right loop written with tasks ran about 20 times slower in the judge than in
the kernel and failed its 30 s limit ("still running ... a loop that never ends").  Now a
hand-back to other code than the checker's or the engine's (asyncio's event loop) is compared
when control next reaches theirs from that code, and not at all if the submission's own code
resumes first: what the checker runs is still compared before it runs."""

from __future__ import annotations

import asyncio

from overlap_course import checks
from overlap_course.build import judge
from overlap_course.build.judge_watch import Watch

from judged import IMPORTS, needs_the_engine

ASYNC_LOOP = '''
import asyncio
async def stage(fn, *args):
    await asyncio.sleep(0)
    return fn(*args)
async def serial(engine):
    while engine.scheduler.has_work():
        plan = await asyncio.create_task(stage(engine.schedule))
        inputs = await asyncio.create_task(stage(engine.prepare_inputs, plan))
        await asyncio.create_task(stage(engine.launch_forward, inputs))
        step = await asyncio.create_task(stage(engine.launch_sample, inputs))
        await asyncio.create_task(stage(engine.device.wait, step.sample_done))
        await asyncio.create_task(stage(engine.process_outputs, step))
def serial_loop(engine):
    asyncio.run(serial(engine))
'''


def _submission(source: str) -> dict:
    space: dict = {}
    exec(compile(source, "<submission-1>", "exec"), space)  # as the judge names the cells' code
    return space


def _watched(run, changes=lambda: []) -> tuple[Watch, int]:
    """Run ``run()`` under a watch whose comparer counts its calls."""
    calls = [0]

    def counted():
        calls[0] += 1
        return changes()
    watch = Watch()
    watch.start(counted)
    try:
        run()
    finally:
        watch.stop()
    return watch, calls[0]


def test_an_asyncio_loop_is_compared_where_it_hands_back_to_the_checker():
    loop = _submission(ASYNC_LOOP)["serial_loop"]
    verdict = None

    def check():
        nonlocal verdict
        verdict = checks.check_serial_loop(loop)
    watch, compares = _watched(check)
    assert verdict.passed, verdict.message
    assert watch.changed == []
    # before: one compare per step of each task (1,950 for this check); now one as the check
    # first calls the loop and one as each of its runs returns
    assert 1 <= compares <= 20, compares


def test_the_checkers_code_entered_from_the_event_loop_is_compared_first():
    """The submission hands back to asyncio, which calls the checker's code: compared then,
    while what the submission changed is still changed (put back before it returns)."""
    space = _submission('''
import asyncio
from toy_engine import validate
state = {"changed": False}
async def main():
    state["changed"] = True
    asyncio.get_running_loop().call_soon(validate.shown, 1)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    state["changed"] = False
def answer():
    asyncio.run(main())
''')
    watch, _ = _watched(space["answer"], lambda: ["changed"] if space["state"]["changed"] else [])
    assert watch.changed == ["changed"]


def test_a_hand_back_the_submission_resumes_from_is_not_compared_again():
    """Between the submission's steps only the event loop runs: nothing of the checker's."""
    space = _submission('''
import asyncio
async def main():
    for _ in range(200):
        await asyncio.sleep(0)
def answer():
    asyncio.run(main())
''')
    _, compares = _watched(lambda: asyncio.run(asyncio.sleep(0)) or space["answer"]())
    assert compares <= 2, compares


def test_the_judge_passes_a_right_asyncio_loop():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, ASYNC_LOOP])
    assert passed, message
