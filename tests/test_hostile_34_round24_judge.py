"""Issue 34, round twenty-four, judge.  A weakref callback that is a C callable runs no code of
the submission's: a loop hung one on a local of its own that rebound ``pool.compare`` as its
frame was cleared (after the compare at its return) and one on the run's ``RequestWatch`` that
put it back as the check returned (before the judge's last compare): a wrong loop passed, 3 of
3.  Now a weakref made by the cells or during the check whose callback is C code is graded as a
change at the next compare; right answers that use weakrefs still pass.  So is a signal handler
or an asyncgen hook that is C code, and an audit hook the submission adds is refused and named;
a right asyncio loop (its own hooks and SIGINT handler) still passes."""

from __future__ import annotations

import functools
import gc
import operator
import os
import weakref

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_watch import Watch

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine
from test_hostile_34_round21_grading21 import ASYNC_LOOP

# WRONG_LOOP, wrong in the check's fifth, one-prompt run (compared by pool.compare only), and
# the round's two weakrefs: one breaks pool.compare as the wrapper's frame is cleared, one
# mends it as the run's watch dies with the check's frame
LATE_WEAKREFS = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + '''
import functools, gc, operator, weakref
from overlap_course.checks import pool
wrong_loop = serial_loop
ORIG = pool.compare
BREAK = functools.partial(max, [("compare", operator.is_)], key=vars(pool).update)
MEND = functools.partial(max, [("compare", ORIG)], key=vars(pool).update)
KEEP = []
def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        KEEP.append(weakref.ref(object.__getattribute__(engine, "watch"), MEND))
        local = type("L", (), {})()
        KEEP.append(weakref.ref(local, BREAK))  # broken as this frame is cleared
'''
# the same, the weakrefs then frozen (gc.get_objects skips the permanent generation)
FROZEN = LATE_WEAKREFS + "        gc.freeze()\n"

# The same two deaths through a class's C __del__: one set in its class body, one set later on
# a class the cells made (no audit event); and through WeakMethod, whose own callback calls ours
CLASS_DELS = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + '''
import functools, operator
from overlap_course.checks import pool
wrong_loop = serial_loop
ORIG = pool.compare
class Breaks:
    __del__ = functools.partial(max, [[("compare", operator.is_)]], key=vars(pool).update)
class Mends:
    pass
def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        Mends.__del__ = functools.partial(max, [[("compare", ORIG)]], key=vars(pool).update)
        object.__getattribute__(engine, "watch").__dict__["mends"] = Mends()
        local = Breaks()  # broken as this frame is cleared
'''
WEAK_METHODS = LATE_WEAKREFS.replace("weakref.ref(", "weakref.WeakMethod(").replace(
    '"watch"), MEND', '"watch").__init__, MEND').replace("{})()", "{'m': lambda s: 0})().m")

# A right loop that uses weakrefs as a right answer may: a WeakValueDictionary, a WeakSet, a
# finalizer of the standard library's code, a weakref with no callback and one with its own
# callback, a threading.local and an isinstance of an ABC (CPython's own C callbacks)
RIGHT_WITH_WEAKREFS = RIGHT_LOOP + '''
import collections.abc, os, threading, weakref
right_loop = serial_loop
class Token: pass
class Dies:
    def __del__(self): DIED.append(self)
    def method(self): pass
SEEN, ALL, DIED = weakref.WeakValueDictionary(), weakref.WeakSet(), []
LOCAL = threading.local()
def serial_loop(engine):
    token = Token()
    SEEN[len(SEEN)], LOCAL.token = token, token
    ALL.add(token)
    weakref.finalize(token, os.path.join, "a", "b")
    plain = weakref.ref(token)
    mine = weakref.ref(token, lambda ref: DIED.append(ref))
    method = weakref.WeakMethod(Dies().method, lambda ref: DIED.append(ref))  # noqa: F841
    Dies()
    assert isinstance(type("Seq", (collections.abc.Sequence,), {
        "__getitem__": lambda s, i: i, "__len__": lambda s: 0})(), collections.abc.Iterable)
    right_loop(engine)
'''


@pytest.mark.parametrize("cheat", [LATE_WEAKREFS, FROZEN, CLASS_DELS, WEAK_METHODS],
                         ids=["late weakrefs", "frozen", "class __del__", "WeakMethod"])
def test_a_weakref_whose_callback_is_c_code_is_a_change(cheat):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cheat])
    assert not passed, message
    assert "your code changed what the checker runs on" in message


def test_a_right_loop_that_uses_weakrefs_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_WITH_WEAKREFS])
    assert passed, message


def _watched(make) -> list[str]:
    """What the watch's weakref look finds of the weakrefs ``make()`` returns, in this
    process (as the judge's check begins, and at the next compare)."""
    watch = Watch()
    watch.weakrefs_begin()
    try:
        kept = make()  # noqa: F841 - alive at the look
        return watch.weakrefs()
    finally:
        watch.weakrefs_end()


class _Token:
    pass


C_CODE = "C code: it runs later, with no code of yours for the judge to compare"


def test_the_look_names_c_callbacks_only():
    token, update = _Token(), functools.partial(max, [], key=vars(operator).update)
    assert _watched(lambda: [weakref.ref(token, update)]) == [
        f"a weakref callback calling partial of max ({C_CODE})"]  # (round 25: why, named)
    assert _watched(lambda: [weakref.ref(token, print)]) == [
        f"a weakref callback calling print ({C_CODE})"]
    assert _watched(lambda: [weakref.ref(token), weakref.ref(token, lambda r: None),
                             weakref.finalize(token, os.path.join, "a"),
                             weakref.WeakValueDictionary({1: token})]) == []
    assert gc.get_freeze_count() == 0  # the look unfroze what it froze


def test_a_look_finds_its_weakrefs_frozen_by_the_submission():
    def frozen():
        gc.freeze()
        return []
    assert _watched(frozen) == ["gc.freeze (it hides weakrefs from the judge)"]


def test_the_look_names_classes_whose_del_is_c_code_and_weak_methods_callbacks():
    update, later = functools.partial(max, [], key=vars(operator).update), type("Later", (), {})
    class_body = (lambda: [type("Body", (), {"__del__": update})])
    assert _watched(class_body) == [f"a class Body whose __del__ is partial of max ({C_CODE})"]

    def set_later():
        later.__del__ = print
        return []
    assert _watched(set_later) == [f"a class Later whose __del__ is print ({C_CODE})"]
    method = type("Method", (), {"m": lambda self: 0, "__del__": lambda self: None})().m
    assert _watched(lambda: [weakref.WeakMethod(method, update)]) == [
        f"a weakref callback calling partial of max ({C_CODE})"]
    assert _watched(lambda: [weakref.WeakMethod(method, lambda ref: None)]) == []


# Handlers the runtime calls with no frame of the submission's: a right loop that leaves one of
# C code (a no-op here) is graded as a change, as one that breaks or mends would be
C_NOOP = "functools.partial(str.format, '')"
AUDIT_HOOK = RIGHT_LOOP + f'''
import functools, sys
sys.addaudithook({C_NOOP})  # refused: a RuntimeError makes the add fail silently
'''
SIGNAL_HANDLER = RIGHT_LOOP + f'''
import functools, signal
right_loop = serial_loop
def serial_loop(engine):
    right_loop(engine)
    signal.signal(signal.SIGUSR1, {C_NOOP})
'''
ASYNCGEN_HOOK = RIGHT_LOOP + f'''
import functools, sys
right_loop = serial_loop
def serial_loop(engine):
    right_loop(engine)
    try:
        sys.set_asyncgen_hooks(finalizer={C_NOOP})
    except PermissionError:
        pass
'''
# asyncio's loop sets the hooks it finds on itself: a subclass's C finalizer, put back at the end
ASYNCGEN_LOOP_HOOK = RIGHT_LOOP + f'''
import asyncio, functools
right_loop = serial_loop
class Loop(asyncio.SelectorEventLoop):
    _asyncgen_finalizer_hook = {C_NOOP}
async def agen():
    yield 1
async def main(engine):
    async for _ in agen():
        break
    right_loop(engine)
def serial_loop(engine):
    loop = Loop()
    try:
        loop.run_until_complete(main(engine))
    finally:
        loop.close()
'''
# round 21's asyncio loop (each stage a task), with an async generator of its own
ASYNC_RIGHT_LOOP = ASYNC_LOOP.replace("async def serial(engine):\n", """async def numbers():
    yield 1
async def serial(engine):
    async for _ in numbers():  # the loop's own asyncgen hooks
        break
""").replace("asyncio.run(serial(engine))", "asyncio.run(serial(engine))  # and its SIGINT handler")


@pytest.mark.parametrize("cheat, named", [
    (AUDIT_HOOK, "sys.addaudithook"), (SIGNAL_HANDLER, "a signal handler partial"),
    (ASYNCGEN_HOOK, "sys.set_asyncgen_hooks"),
    (ASYNCGEN_LOOP_HOOK, "sys.set_asyncgen_hooks (finalizer partial)")],
    ids=["audit hook", "signal handler", "asyncgen hook", "asyncgen hook through asyncio"])
def test_a_handler_the_runtime_calls_that_is_c_code_is_a_change(cheat, named):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cheat])
    assert not passed, message
    assert "your code changed what the checker runs on" in message and named in message


def test_a_right_asyncio_loop_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, ASYNC_RIGHT_LOOP])
    assert passed, message


def test_the_watch_names_c_signal_handlers_and_asyncgen_hooks():
    import signal
    import sys
    watch = Watch()
    c_handler, old = functools.partial(max, [], key=vars(operator).update), None
    try:
        old = signal.signal(signal.SIGUSR2, c_handler)
        assert watch.handlers() == [f"a signal handler partial (signal {int(signal.SIGUSR2)}: "
                                    f"put back the one it replaced, `signal.signal(signum, "
                                    f"previous)`, before the check)"]
        signal.signal(signal.SIGUSR2, lambda *a: None)  # Python code, not the submission's
        sys.set_asyncgen_hooks(finalizer=print)
        assert watch.handlers() == ["sys.set_asyncgen_hooks (finalizer print)"]
    finally:
        signal.signal(signal.SIGUSR2, old)
        sys.set_asyncgen_hooks(None, None)
    assert watch.handlers() == []
