"""Issue 34, round twenty-eight, judge: four wrong loops the real judge gave full marks.

A thread counted as the checker's when the checker's or the engine's code was seen starting it,
whatever it ran.  So the submission had the checker's code start its own thread: a
``threading.Thread`` subclass whose ``__class__`` was a property with ``Thread.start`` as getter,
hung on the engine and read through the checker's view (``inspect.ismethod`` reads
``__class__``), or whose ``__del__`` was ``Thread.start``, returned by the loop and dropped by the
checker.  And as the checker's ``Thread.start`` of its time limit's watchdog waited, every
thread that showed was taken for the watchdog: a cell's thread held the watchdog's ``_started``
condition and started a raw thread of its own in that window.  Each thread waited for the
compare at the loop's last return, rebound ``pool.compare`` to a C partial (no hand-back) and
put it back before the judge's last look.  Now a thread is the checker's only if it is one of
the course's own by what it runs (a ``threading.Thread``, no subclass, whose target is the time
limit's watchdog, ``pool.start``'s executor's worker or ``multiprocessing``'s descriptor
server, and still is), and only the one thread whose first frame holds the very ``Thread`` the
start call started.

And a weakref callback that was the standard library's Python code, ``queue.Queue.put`` bound
to a queue of the cells' whose ``not_empty.notify`` was ``partial(next, map(setattr, ...))``,
was trusted as Python code: each callback rebound ``pool.compare`` with no hand-back.  Now a
callback (weakref, finalizer, ``__del__``) that runs the library's code bound to an object (or a
``__del__`` of the library's not from its own class's body) is a change; the cells' own bound
methods are compared as they run.

A right loop with an executor, a ``QueueListener``, a ``Timer``, a per-round thread, and
weakref callbacks and a ``__del__`` of its own code still passes."""

from __future__ import annotations

import inspect

from judged import IMPORTS, WRONG_LOOP, needs_the_engine

from overlap_course.build import judge
from overlap_course.checks import learner_code, lesson02

# the lines the poller waits on: the checker's call of the loop, and its last run's verdict
_LOOP_LINE = next(i for i, line in enumerate(inspect.getsourcelines(learner_code)[0], 1)
                  if line.strip() == "loop(view)")
_LAST_LINE = next(i for i, line in enumerate(inspect.getsourcelines(lesson02)[0], 1)
                  if "_serial_run_verdict(log_long" in line)
# the wrong loop (its last run's first token overwritten), and a poller that breaks
# pool.compare after the compare at the loop's last return and mends it before the end
POLLER = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + f'''
import inspect, _thread, threading, time, io, functools, weakref
from overlap_course.checks import pool
__import__("sys").setswitchinterval(1e-5)
ORIG = pool.compare
FAKE = functools.partial(print, file=io.StringIO())   # C: returns None for any args
FRAMES, STATE = {{}}, {{}}
wrong_loop = serial_loop

def poller():
    STATE["b"] = True
    while "watched" not in FRAMES:
        time.sleep(0.0005)
    w, c = FRAMES["watched"], FRAMES["check"]
    while w.f_lineno == {_LOOP_LINE}:
        time.sleep(0.00002)
    pool.compare = FAKE
    while c.f_lineno <= {_LAST_LINE}:
        time.sleep(0.00002)
    pool.compare = ORIG

def find_frames():
    f = inspect.currentframe()
    while f is not None:
        if f.f_code.co_name == "watched":
            FRAMES.setdefault("w", f)
        if f.f_code.co_name == "check_serial_loop":
            FRAMES["check"] = f
        f = f.f_back
    FRAMES["watched"] = FRAMES.pop("w")
'''
KICK_BY_CLASS = POLLER + '''
class Kick(threading.Thread):
    __class__ = property(threading.Thread.start)   # isinstance(kick, X) starts it

def serial_loop(engine):
    if len(engine.requests) == 1:
        real = object.__getattribute__(engine, "_engine")
        real.kick = Kick(target=poller, daemon=True, name="kicked-by-class")
        engine.kick                   # the checker's view's __getattr__ starts it
        del real.kick
        find_frames()
    wrong_loop(engine)
'''
KICK_BY_DEL = POLLER + '''
class Kick(threading.Thread):
    __del__ = threading.Thread.start   # started as the checker drops the loop's return value

def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        find_frames()
        return Kick(target=poller, daemon=True, name="kicked-by-del")
'''
RACE = POLLER + '''
def a():
    while True:
        found = [t for t in list(threading._limbo) if t._name == "check-time-limit"]
        if found:
            break
        if any(t._name == "check-time-limit" for t in list(threading._active.values())):
            _thread.start_new_thread(poller, ())  # too late: after the checker's start
            return
    with found[0]._started._cond:    # the checker's Thread.start waits
        while found[0]._ident is None:
            pass
        _thread.start_new_thread(poller, ())
        while "b" not in STATE:
            time.sleep(0)

threading.Thread(target=a, daemon=True).start()

def serial_loop(engine):
    if len(engine.requests) == 1:
        find_frames()
    wrong_loop(engine)
'''
LIBRARY_CALLBACK = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + '''
import functools, io, queue, types, weakref
from overlap_course.checks import pool
FAKE = functools.partial(print, file=io.StringIO())
q = queue.Queue()
q.not_empty = types.SimpleNamespace(notify=functools.partial(
    next, map(setattr, [pool, pool], ["compare", "compare"], [FAKE, pool.compare])))
class Token: pass
REFS = []
wrong_loop = serial_loop

def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        later, now = Token(), Token()
        engine.watch.later = later     # dies as check_serial_loop returns
        REFS.extend([weakref.ref(now, q.put), weakref.ref(later, q.put)])
        return now                     # dies as the checker drops the return value
'''
RIGHT = '''
import concurrent.futures, logging, logging.handlers, queue, threading, weakref
log = logging.getLogger("mine")

class Rounds:
    def __init__(self):
        self.freed = 0
    def forget(self, ref):
        self.freed += 1

class Step:
    def __del__(self):
        pass

def serial_loop(engine):
    q, rounds, refs = queue.Queue(), Rounds(), []
    listener = logging.handlers.QueueListener(q, logging.NullHandler())
    listener.start()
    log.addHandler(logging.handlers.QueueHandler(q)); log.setLevel(logging.INFO)
    t = threading.Timer(0.001, lambda: None); t.start()
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        while engine.scheduler.has_work():
            plan = engine.schedule()
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            engine.device.wait(step.sample_done)
            ex.submit(log.info, "round").result()
            mine = Step()
            refs.append(weakref.ref(mine, rounds.forget))
            helper = threading.Thread(target=len, args=([],)); helper.start(); helper.join()
            engine.process_outputs(step)
    t.join()
    log.handlers.clear()
    listener.stop()
'''


def _not_passed(cell: str, *named: str) -> None:
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell])
    assert passed is False, message
    assert "your code changed what the checker runs on" in message, message
    for name in named:
        assert name in message, message


def test_a_thread_subclass_the_checker_starts_through_class_is_a_change():
    _not_passed(KICK_BY_CLASS, "'kicked-by-class'")


def test_a_thread_subclass_the_checker_starts_as_it_dies_is_a_change():
    _not_passed(KICK_BY_DEL, "__del__ is Thread.start")


def test_a_thread_started_while_the_watchdog_starts_is_a_change():
    _not_passed(RACE, "running poller()")


def test_a_library_method_bound_to_the_cells_object_as_a_callback_is_a_change():
    _not_passed(LIBRARY_CALLBACK, "a weakref callback calling Queue.put of a Queue")


def test_a_right_loop_with_threads_and_callbacks_of_its_own_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT])
    assert passed is True, message
