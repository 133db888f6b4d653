"""Issue 34, round twenty-eight, threads: three wrong loops the real judge gave full marks.

The judge compares the checker's world at each hand-back and at the end, and graded as a change
only a thread the submission's code was seen starting (a profile event ``c_call`` of
``_thread.start_new_thread``) while the check ran.  A thread a cell started before the check --
a raw ``_thread.start_new_thread(poller, ())`` or a daemon ``threading.Thread``, neither of
which any profile hook watches -- or one the loop started through C code
(``list(map(_thread.start_new_thread, [poller], [()]))``: the hook saw a ``c_call`` of
``list``) was never looked at: it waited for the compare at the loop's last return, rebound
``pool.compare`` to a C partial (no hand-back), and put it back before the judge's last look.
Now every thread alive at a compare and at the end (``sys._current_frames()``: raw threads
too) that was not alive before the cells and that the checker's or the engine's code was not
seen starting is a change, named by its first function.

And ``threading.excepthook``, which the runtime calls inside whatever code runs, set to a C
partial by a cell, was seen by no look (the fingerprint took it for no change: a builtin, as
the one it replaced); it, ``sys.unraisablehook`` and ``sys.excepthook`` set to C code are now a
change, as a signal handler is (``judge_handlers``).

A right loop that starts and joins its own thread, below a cell whose threads ended before the
check, still passes."""

from __future__ import annotations

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine
from test_hostile_34_round28_judge import _LAST_LINE, _LOOP_LINE

from overlap_course.build import judge

# the wrong loop (its last run's first token overwritten), and a poller that breaks
# pool.compare after the compare at the loop's last return and mends it before the end
POLLER = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + f'''
import inspect, _thread, threading, time, io, functools
from overlap_course.checks import pool
__import__("sys").setswitchinterval(1e-5)
ORIG = pool.compare
FAKE = functools.partial(print, file=io.StringIO())   # C: returns None for any args
FRAMES = {{}}
wrong_loop = serial_loop

def poller():
    while "watched" not in FRAMES:
        time.sleep(0.0005)
    w, c = FRAMES["watched"], FRAMES["check"]
    while w.f_lineno == {_LOOP_LINE}:  # the loop has not returned yet
        time.sleep(0.00002)
    pool.compare = FAKE               # after the compare at the loop's return
    while c.f_lineno <= {_LAST_LINE}:  # until _serial_run_verdict(log_long, ...) is done
        time.sleep(0.00002)
    pool.compare = ORIG

START_IN_LOOP = False

def serial_loop(engine):
    if len(engine.requests) == 1:
        if START_IN_LOOP:
            list(map(_thread.start_new_thread, [poller], [()]))
        f = inspect.currentframe()
        while f is not None:
            if f.f_code.co_name == "watched":
                FRAMES.setdefault("w", f)
            if f.f_code.co_name == "check_serial_loop":
                FRAMES["check"] = f
            f = f.f_back
        FRAMES["watched"] = FRAMES.pop("w")
    wrong_loop(engine)
'''
STARTS = {"a raw thread from a cell": "_thread.start_new_thread(poller, ())\n",
          "a daemon thread from a cell": "threading.Thread(target=poller, daemon=True).start()\n",
          "a thread the loop starts through map": "START_IN_LOOP = True\n"}
ERROR_HOOKS = RIGHT_LOOP + '''
import functools, io, threading
threading.excepthook = functools.partial(print, file=io.StringIO())
'''
# right: a cell's threads that ended before the check, and a loop that starts a thread and
# joins it before returning
RIGHT_WITH_THREADS = '''
import _thread, threading, time
done = _thread.allocate_lock()
done.acquire()
alive = _thread._count()
_thread.start_new_thread(done.release, ())
done.acquire()
while _thread._count() >= alive + 1:
    time.sleep(0.01)
time.sleep(0.2)  # its last frame gone
t = threading.Thread(target=sum, args=([1, 2],))
t.start()
t.join()

def serial_loop(engine):
    rounds = []
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        counter = threading.Thread(target=rounds.append, args=(1,))
        counter.start()
        engine.device.wait(step.sample_done)
        counter.join()
        engine.process_outputs(step)
'''


def _not_passed(cells: list[str], *named: str) -> None:
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, *cells])
    assert passed is False, message
    assert "your code changed what the checker runs on" in message, message
    for name in named:
        assert name in message, message


def test_a_raw_thread_a_cell_started_is_a_change():
    _not_passed([POLLER + STARTS["a raw thread from a cell"]], "running poller()",
                "stop the threads your cells start before the check runs")


def test_a_daemon_thread_a_cell_started_is_a_change():
    _not_passed([POLLER + STARTS["a daemon thread from a cell"]], "(poller)'")


def test_a_thread_the_loop_starts_through_c_code_is_a_change():
    _not_passed([POLLER + STARTS["a thread the loop starts through map"]], "running poller()",
                "join those your code starts before returning")


def test_error_hooks_set_to_c_code_are_a_change():
    _not_passed([ERROR_HOOKS], "threading.excepthook set to C code (partial)")


def test_a_right_loop_with_threads_it_joins_and_a_cell_s_ended_threads_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_WITH_THREADS])
    assert passed is True, message
