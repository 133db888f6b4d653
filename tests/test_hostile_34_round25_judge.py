"""Issue 34, round twenty-five, judge.  Round 24's late C callbacks hung on ``weakref.proxy``
(whose type is no ``weakref.ref``'s) were never listed: a wrong loop passed, 3 of 3.  And round
24's rule failed right loops: ``weakref.ref(step, LIVE.remove)`` (a method of the submission's
own list) and ``weakref.finalize(engine, forget)`` (its own Python function, which is compared as
it runs, as a weakref callback's is) or ``weakref.finalize(engine, ROUNDS.clear)``.  Now C code
the runtime calls later is a change unless all it can touch is the cells' own plain data
(``judge_harmless``); the shapes it now lets through are still caught where they reach the
checker's state, and each message names the callable and why."""

from __future__ import annotations

import collections
import functools
import gc
import operator
import textwrap
import weakref

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_watch import Watch

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

CHANGED = "your code changed what the checker runs on"
# WRONG_LOOP, wrong in the check's fifth, one-prompt run (compared by pool.compare only), as
# round 24's cheats are: ``late`` runs in it, with ``watch`` (the run's RequestWatch, which dies
# as the check returns) and ``local`` (which dies as the wrapper's frame is cleared, after the
# compare at its return)
_WRONG = WRONG_LOOP.replace("requests) == 4", "requests) == 1") + '''
import functools, operator, weakref
from overlap_course.checks import harness, pool
wrong_loop = serial_loop
ORIG = pool.compare
BREAK = functools.partial(max, [("compare", operator.is_)], key=vars(pool).update)
MEND = functools.partial(max, [("compare", ORIG)], key=vars(pool).update)
KEEP = []
'''
_LATE = '''
def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        watch, local = object.__getattribute__(engine, "watch"), type("L", (), {})()
'''


def _wrong(top: str, late: str) -> str:
    return _WRONG + top + _LATE + textwrap.indent(late, " " * 8)


# round 24's two late C callbacks, on proxies: one breaks pool.compare, one mends it
PROXIES = _wrong("", '''
KEEP.append(weakref.proxy(watch, MEND))
KEEP.append(weakref.proxy(local, BREAK))
''')
# a method of the cells' own list, sorting it by a key that rebinds pool.compare
SORTED_BY = _wrong('''
BREAKS, MENDS = [[("compare", operator.is_)]], [[("compare", ORIG)]]
''', '''
weakref.finalize(watch, MENDS.sort, key=vars(pool).update)
weakref.finalize(local, BREAKS.sort, key=vars(pool).update)
''')
# LIVE.remove, comparing items whose class's __eq__ is C code that rebinds pool.compare
COMPARED_ITEMS = _wrong('''
class Breaks:
    __eq__ = functools.partial(max, [("compare", operator.is_)], key=vars(pool).update)
class Mends:
    __eq__ = functools.partial(max, [("compare", ORIG)], key=vars(pool).update)
BROKEN, MENDED = [Breaks()], [Mends()]
''', '''
KEEP.append(weakref.ref(watch, MENDED.remove))
KEEP.append(weakref.ref(local, BROKEN.remove))
''')
# a method of a list the checker made before the cells (the checks running now)
CHECKERS_LIST = _wrong("", '''
KEEP.append(weakref.ref(local, functools.partial(harness._RUNNING.append, "none")))
''')
# a finalizer of the submission's Python code: compared as it runs
PY_FINALIZERS = _wrong('''
def breaks():
    pool.compare = operator.is_
def mends():
    pool.compare = ORIG
''', '''
weakref.finalize(watch, mends)
weakref.finalize(local, breaks)
''')


@pytest.mark.parametrize("cheat, named", [
    (PROXIES, "a weakref callback calling partial of max (C code: it runs later"),
    (SORTED_BY, "a finalizer calling list.sort (C code given a builtin_function_or_method"),
    (COMPARED_ITEMS, "a weakref callback calling list.remove (C code comparing the items of a "
                     "list that holds a Breaks)"),
    (CHECKERS_LIST, "a weakref callback calling partial of list.append (C code on a list your "
                    "cells did not make)"),
    (PY_FINALIZERS, "overlap_course.checks.pool.compare")],
    ids=["proxies", "sort key", "compared items", "checker's list", "Python finalizers"])
def test_late_code_that_reaches_the_checkers_state_is_a_change(cheat, named):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cheat])
    assert not passed, message
    assert CHANGED in message and named in message, message


# Round 25's right loops: a list of weakrefs that drop themselves (a method of the cells' own
# list, bare and through a partial), a finalizer of the submission's own Python code, and one
# that is a method of its own list
WEAK_DISCARD = '''
import functools, weakref
LIVE = []
def serial_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        LIVE.append(weakref.ref(step, LIVE.remove))
        LIVE.append(weakref.ref(inputs, functools.partial(LIVE.remove)))
        engine.device.wait(step.sample_done)
        engine.process_outputs(step)
'''
FINALIZERS = RIGHT_LOOP + '''
import weakref
right_loop, ROUNDS = serial_loop, []
def forget():
    ROUNDS.clear()
def serial_loop(engine):
    weakref.finalize(engine, forget)
    weakref.finalize(engine, ROUNDS.clear)
    right_loop(engine)
    ROUNDS.append(len(engine.requests))
'''


@pytest.mark.parametrize("cell", [WEAK_DISCARD, FINALIZERS], ids=["LIVE.remove", "finalizers"])
def test_a_right_loop_whose_late_calls_touch_only_its_own_data_passes(cell):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell])
    assert passed, message


class _Token:
    pass


def _looked(cells, check) -> list[str]:
    """What the watch finds at its first compare: ``cells()`` made before the check begins,
    ``check(made)`` (what it keeps alive) while it runs."""
    watch = Watch()
    watch.cells_begin()
    made = cells()
    watch.weakrefs_begin()
    try:
        kept = check(made)  # noqa: F841 - alive at the look
        return watch.deferred()
    finally:
        watch.weakrefs_end()


def test_the_watch_lets_the_cells_own_containers_through_and_names_the_rest():
    token, old = _Token(), []
    mine = lambda: {"list": [], "set": set(), "deque": collections.deque(), "dict": {}}  # noqa
    assert _looked(mine, lambda m: [
        weakref.ref(token, m["list"].remove), weakref.proxy(token, m["set"].discard),
        weakref.ref(token, functools.partial(m["deque"].append, 1)),
        weakref.finalize(token, m["list"].clear), weakref.finalize(token, m["list"].count, "a"),
        weakref.finalize(token, lambda: None)]) == []
    assert _looked(mine, lambda m: [weakref.ref(token, old.remove)]) == [
        "a weakref callback calling list.remove (C code on a list your cells did not make)"]
    assert _looked(mine, lambda m: [weakref.ref(token, [].append)]) == [
        "a weakref callback calling list.append (C code on a list your cells did not make)"]
    assert _looked(mine, lambda m: [weakref.proxy(token, m["dict"].pop)]) == [
        "a weakref callback calling dict.pop (C code: it runs later, with no code of yours "
        "for the judge to compare)"]
    assert _looked(mine, lambda m: [weakref.finalize(token, m["list"].extend, m)]) == [
        "a finalizer calling list.extend (C code given a dict: only numbers, strings, None and "
        "tuples of them are plain)"]
    assert _looked(mine, lambda m: [weakref.ref(token, m["list"].__init__)]) == [
        "a weakref callback calling method-wrapper (C code: it runs later, with no code of "
        "yours for the judge to compare)"]
    assert gc.get_freeze_count() == 0


def test_the_watch_reads_compared_items_at_each_look():
    token, watch = _Token(), Watch()
    watch.cells_begin()
    live = []
    watch.weakrefs_begin()
    try:
        live.append(weakref.ref(token, live.remove))  # it drops itself
        assert watch.deferred() == []
        live.append(operator)  # its items compared as the callback runs: a module's __eq__
        assert watch.deferred() == [
            "a weakref callback calling list.remove (C code comparing the items of a list that "
            "holds a module)"]
    finally:
        watch.weakrefs_end()


def test_a_list_at_an_address_the_cells_had_is_not_theirs():
    token, watch = _Token(), Watch()
    watch.cells_begin()
    theirs = [[] for _ in range(50)]
    watch.weakrefs_begin()
    try:
        had = {id(c) for c in theirs}
        del theirs
        made = [[] for _ in range(50)]  # most at an address a list of the cells' had
        assert had & {id(c) for c in made}
        kept = [weakref.ref(token, c.append) for c in made]  # noqa: F841
        assert watch.deferred() == [
            "a weakref callback calling list.append (C code on a list your cells did not make)"]
    finally:
        watch.weakrefs_end()
