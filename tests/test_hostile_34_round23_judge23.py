"""Issue 34, round twenty-three, judge.  The judge compared the checker's world as the check first
called the submission's code and each time control came back; a change made after the compare
at a loop's return (by a thread started through ``functools.partial``, which the start-call
watch missed, or by a ``weakref.ref`` callback, a C callable, as the loop's frame was cleared)
and put back by the loop's next call was seen by no compare: a wrong loop passed, 2 of 2 each.
Now every call of the submission's code by the checker's or the engine's code is compared
first.  Each cell below is the round's repro: the wrong loop of tests/judged.py and its cheat."""

from __future__ import annotations

import pytest

from overlap_course.build import judge

from judged import IMPORTS, THREAD_CHEAT, WRONG_LOOP, needs_the_engine

WEAKREF_CALLBACK = WRONG_LOOP + '''
# + no thread: a weakref callback that is a C callable, fired as the
# loop's own frame is cleared (after the judge's compare at the loop's return), rebinds
# pool.compare and lesson02.serial_same_run; the loop's next call puts them back first thing
# (calls 2..5 are not compared at entry).  max(pairs, ref, key=dict.update) updates the module
# dict with the pairs, then raises on the ref (a weakref callback's error is ignored).
import functools, io, operator, weakref
wrong_loop = serial_loop
from overlap_course.checks import lesson02 as L, pool
ORIG = (pool.compare, L.serial_same_run)
QUIET = functools.partial(print, file=io.StringIO())  # C callable: None for any arguments
CB_POOL = functools.partial(max, [("compare", operator.is_)], key=vars(pool).update)
CB_L = functools.partial(max, [("serial_same_run", QUIET)], key=vars(L).update)
class Token: pass
refs = []
state = {"calls": 0}
def serial_loop(engine):
    state["calls"] += 1
    if state["calls"] > 1:
        pool.compare, L.serial_same_run = ORIG
    refs.clear()
    a, b = Token(), Token()   # die as this frame is cleared, after its return is compared
    if state["calls"] < 5:
        refs.extend([weakref.ref(a, CB_POOL), weakref.ref(b, CB_L)])
    wrong_loop(engine)
'''

# Round 22's thread cheat, its thread started from C (a partial: no c_call event of the start)
THREAD_STARTED_THROUGH_A_PARTIAL = THREAD_CHEAT.replace(
    "import functools,", "import _thread, functools,").replace(
    'state["t"] = threading.Thread(target=spy, daemon=True); state["t"].start()',
    "functools.partial(_thread.start_new_thread, spy, ())()").replace(
    'state["t"].join()', "pass")


@pytest.mark.parametrize("cheat", [WEAKREF_CALLBACK, THREAD_STARTED_THROUGH_A_PARTIAL],
                         ids=["weakref callback", "thread started through a partial"])
def test_a_change_put_back_by_the_loops_next_call_is_seen_as_the_check_calls_it(cheat):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cheat])
    assert not passed, message
    assert "your code changed what the checker runs on" in message
