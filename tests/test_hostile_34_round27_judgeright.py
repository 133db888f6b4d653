"""Issue 34, round twenty-seven: two right loops the real judge failed.

* A loop logging through ``logging.handlers.QueueHandler``, its ``QueueListener`` started at the
  top of ``serial_loop`` and stopped (its thread joined) in a ``finally``: "a thread your code
  started ... still running as control came back to the checker", now and then.  The judge knew
  the threads the submission started by ident alone, and the system gives a joined thread's
  ident to the next thread started: a thread not the loop's that got the listener's ident was
  graded as the listener still running (a right loop with a ``ThreadPoolExecutor`` in a
  ``with`` block passed only where none did).  A thread is now known by its first frame too.
* A loop timing each round with a ``@contextlib.contextmanager`` (``with timed("round"):``) ran
  in 1-3 s plainly but 27-44 s in the judge, against the check's 30 s limit.  Each ``yield``
  handed control to ``contextlib`` (not the checker): the watch then compared the checker's
  world at every return of torch's Python code into the engine's, until the submission's code
  was next *called*; control coming back to it by a return (``__enter__`` returning into the
  ``with``) now ends the hand-back, as a call does.
"""

from __future__ import annotations

import _thread
import concurrent.futures.thread as futures_thread
import queue
import sys
import threading
import time

from overlap_course.build import judge
from overlap_course.build.judge_threads import thread_starts

from judged import IMPORTS, needs_the_engine

QUEUE_LISTENER = '''import logging, logging.handlers, queue, sys
q = queue.Queue(-1)
log = logging.getLogger("bg")
log.setLevel(logging.INFO)
log.addHandler(logging.handlers.QueueHandler(q))
def serial_loop(engine):
    listener = logging.handlers.QueueListener(q, logging.StreamHandler(sys.stderr))
    listener.start()
    try:
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            engine.device.wait(step.sample_done)
            engine.process_outputs(step)
            log.info("round")
    finally:
        listener.stop()
'''
TIMED = '''import contextlib, sys, time
TIMINGS = {}

@contextlib.contextmanager
def timed(name):
    t = time.perf_counter()
    try:
        yield
    finally:
        TIMINGS[name] = TIMINGS.get(name, 0.0) + time.perf_counter() - t

def serial_loop(engine):
    while engine.scheduler.has_work():
        with timed("schedule"):
            plan = engine.schedule()
        with timed("prepare"):
            inputs = engine.prepare_inputs(plan)
        with timed("launch"):
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
        with timed("wait"):
            engine.device.wait(step.sample_done)
        with timed("process"):
            engine.process_outputs(step)
    print(TIMINGS, file=sys.stderr)
'''
ENDLESS_TIMED = TIMED.replace("    print(TIMINGS", """    while True:  # wrong: never returns
        with timed("idle"):
            engine.scheduler.has_work()
    print(TIMINGS""")


def _started_by_submission():
    """``noted`` and ``running`` of a watch's thread rules, a thread started from a frame of
    ``<submission>`` code, that thread's ident, and its (set) event to end it."""
    rules = thread_starts({"foreign": lambda code: code.co_filename == "<submission>",
                           "looking": set()}, checkers=lambda code: False)
    scope = {"rules": rules, "start": _thread.start_new_thread, "sys": __import__("sys")}
    exec(compile("frame = sys._getframe()\nrules['noted'](frame, 'c_call', start)",
                 "<submission>", "exec"), scope)
    end = threading.Event()
    thread = threading.Thread(target=end.wait)
    thread.start()
    for _ in range(300):  # the events after the start call, until the new thread shows
        rules["noted"](scope["frame"], "c_return", None)
    return rules, thread, end


def test_a_joined_thread_s_ident_given_to_another_thread_is_not_still_running():
    rules, thread, end = _started_by_submission()
    assert rules["running"](), "the submission's thread, running, is seen"
    end.set()
    thread.join()
    assert rules["running"]() == []
    for _ in range(50):  # the system reuses a joined thread's ident, nearly always at once
        # one of the course's threads (an executor's worker), started by code not the
        # submission's (round 28: else not the checker's), ended by a None on its queue
        work = queue.SimpleQueue()
        other = threading.Thread(target=futures_thread._worker, args=(type(None), work, None, ()))
        sys.setprofile(rules["noted"])
        try:
            other.start()
        finally:
            sys.setprofile(None)
        for _ in range(300):
            rules["noted"](sys._getframe(), "c_return", None)
        try:
            if other.ident == thread.ident:
                assert rules["running"]() == [], "another thread with the joined one's ident"
                return
        finally:
            work.put(None)
            other.join()
    raise AssertionError("no thread got the joined thread's ident: nothing was tested")


def test_the_submission_s_thread_still_running_is_still_found():
    rules, thread, end = _started_by_submission()
    try:
        assert any(f"ident {thread.ident}" in why and "still running" in why
                   for why in rules["running"]())
    finally:
        end.set()
        thread.join()


def test_a_right_loop_with_a_queue_listener_it_stops_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, QUEUE_LISTENER])
    assert passed is True, message


def test_a_right_loop_timing_its_rounds_with_a_contextmanager_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, TIMED])
    assert passed is True, message


def test_an_endless_loop_timing_its_rounds_still_fails_in_bounded_time():
    needs_the_engine()
    began = time.monotonic()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, ENDLESS_TIMED])
    assert not passed and "still running after 30 s" in message, message
    assert time.monotonic() - began < judge.JUDGE_TIMEOUT_S  # the check's limit ended it
