"""Issue 34, round twenty-eight (b), judge: two wrong loops the real judge gave full marks.

The checks' time limit held what its trace function reads in closure cells: ``on_call`` looked
up each call's code in the very ``watched`` dict the check handed it (``other_engine.Watch``'s).
The loop took ``sys.gettrace()``, read that dict out of the closure and added hooks keyed by the
checker's own code objects (``lesson02._serial_run_verdict``, ``sandbox.end_time_limit``): C
partials that rebound ``pool.compare`` as the verdict began and put it back as the limit ended,
with no code of the submission's for the judge to compare.  A cell's contents can be swapped as
well.  Now the trace functions have no closure: what they read is in their defaults (a
read-only copy of the hooks, a bound method), which the judge refuses to let code change.

And a ``__del__`` of the library's counted as the class's own when the class was named and
placed as the one whose body defined it: a cells' class set ``__module__ = "queue"``,
``__qualname__ = "Queue"`` and ``__del__ = queue.Queue.qsize`` (``with self.mutex: return
self._qsize()``, a C partial).  Now that class is found by identity, in the function's own
module namespace by its qualname.

A right loop that keeps objects of the library's with a ``__del__`` of their own still passes."""

from __future__ import annotations

import sys
import threading

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

from overlap_course.build import judge
from overlap_course.checks import sandbox

_WRONG = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + '''
import functools, io, operator
from overlap_course.checks import pool
ORIG = pool.compare
FAKE = functools.partial(print, file=io.StringIO())   # C: returns None for any args
wrong_loop = serial_loop
'''
# hooks put where the time limit's trace function reads them
HOOKS = _WRONG + '''
import sys
from overlap_course.checks import lesson02, sandbox
def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        tr = sys.gettrace()                       # the time limit's on_call
        watched = dict(tr.__defaults__[0].__self__)
        tr.__defaults__ = (watched.get, *tr.__defaults__[1:])
        watched[lesson02._serial_run_verdict.__code__] = functools.partial(
            next, map(operator.call, [functools.partial(vars(pool).update, compare=FAKE)]))
        watched[sandbox.end_time_limit.__code__] = functools.partial(
            next, map(operator.call, [functools.partial(vars(pool).update, compare=ORIG)]))
'''
# a cells' class named and placed as queue.Queue, whose __del__ is queue.Queue.qsize
IMITATION = _WRONG + '''
import queue, threading
def imitating(action):
    class Queue:
        __del__ = queue.Queue.qsize          # with self.mutex: return self._qsize()
    Queue.__module__ = "queue"
    Queue.__qualname__ = "Queue"
    q = Queue()
    q.mutex = threading.Lock()
    q._qsize = action                        # C: rebinds pool.compare, no code to compare
    return q
def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        dog = next(t for t in threading.enumerate() if t.name == "check-time-limit")
        dog._kwargs = {"later": imitating(functools.partial(vars(pool).update, compare=ORIG))}
        return imitating(functools.partial(vars(pool).update, compare=FAKE))
'''
# right: objects of the library's kept by the cells and made in the loop
KEEPS_LIBRARY_OBJECTS = RIGHT_LOOP + '''
import queue, tempfile, weakref
KEPT = [tempfile.NamedTemporaryFile(), queue.Queue()]
right_loop = serial_loop
def serial_loop(engine):
    right_loop(engine)
    q = queue.Queue()
    q.put(len(engine.requests))
    with tempfile.TemporaryDirectory() as home:
        KEPT.append(home)
'''


def test_the_time_limits_trace_functions_read_no_closure_and_copy_the_hooks():
    hooks, seen = {}, []
    limit = sandbox._tracer(0.0, threading.get_ident(), sandbox._limits_class(1.0),
                            threading.Event(), hooks)
    assert all(f.__closure__ is None for f in limit)
    hooks[sys._getframe().f_code] = seen.append  # added after the limit began: not run
    assert limit[1](sys._getframe(), "call", None) is limit[0]
    assert seen == []


def test_hooks_put_where_the_time_limit_reads_them_are_refused():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, HOOKS])
    assert passed is False, message
    assert "__defaults__" in message and "on_call" in message, message


def test_a_cells_class_named_as_the_librarys_is_not_given_its_del():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, IMITATION])
    assert passed is False, message
    assert "a class Queue whose __del__ is Queue.qsize" in message, message


def test_a_right_loop_keeping_the_librarys_objects_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, KEEPS_LIBRARY_OBJECTS])
    assert passed is True, message
