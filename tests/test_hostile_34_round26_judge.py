"""Issue 34, round twenty-six, judge.  Round 25 let torch's pybind11 functions through as a
library's own C callbacks wherever they were hung (a right loop below a cell that ran
``torch.profiler.profile()`` hangs one on a weakref), and a wrong loop got full marks, 3 of 3:
``weakref.finalize(x, torch._C._awaitable_wait, torch._C._awaitable(vars(pool).update, ...))``
broke ``pool.compare`` after the compare at the loop's return and a second one mended it as the
check returned.  A finalizer hands its function what the cell chose, so only a weakref's
callback (handed the weakref alone) is a library's own now."""

from __future__ import annotations

import weakref

import torch

from overlap_course.build import judge

from judged import IMPORTS, needs_the_engine
from test_hostile_34_round25_judge import CHANGED, _looked, _Token, _wrong

# round 25's break and mend, each a finalizer of a torch function that calls what it is handed
AWAITED = _wrong('''
import torch
def late(fix):
    return torch._C._awaitable(vars(pool).update, {"compare": fix})
''', '''
weakref.finalize(watch, torch._C._awaitable_wait, late(ORIG))
weakref.finalize(local, torch._C._awaitable_wait, late(operator.is_))
''')


def test_a_finalizer_of_a_torch_function_that_calls_what_it_is_handed_is_a_change():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, AWAITED])
    assert not passed, message
    assert CHANGED in message and "a finalizer calling _awaitable_wait" in message, message


def test_torchs_own_weakref_callback_is_still_let_through_and_its_finalizer_is_not():
    token = _Token()
    record = next(f for f in vars(torch._C).values()
                  if type(f).__name__ == "builtin_function_or_method"
                  and type(f.__self__).__module__ == "pybind11_builtins")
    assert _looked(lambda: None, lambda m: [weakref.ref(token, record)]) == []
    found = _looked(lambda: None, lambda m: [weakref.finalize(token, record)])
    assert len(found) == 1 and found[0].startswith("a finalizer calling "), found


# Round 26's right loops the plain-data rule failed: a finalizer handed a tuple of ints, a list
# of WeakMethods that drop themselves, an Enum member appended (append stores, never compares)
RIGHT_LATE = '''
import enum, weakref
class Event(enum.Enum):
    FREED = 1
IN_FLIGHT, WATCHERS, EVENTS = set(), [], []
class Seen:
    def done(self):
        pass
def serial_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        n, seen = len(EVENTS), Seen()
        IN_FLIGHT.add((n, 1))
        weakref.finalize(step, IN_FLIGHT.discard, (n, 1))
        WATCHERS.append(weakref.WeakMethod(seen.done, WATCHERS.remove))
        weakref.finalize(step, EVENTS.append, Event.FREED)
        engine.device.wait(step.sample_done)
        engine.process_outputs(step)
'''


def test_a_right_loop_with_tuples_weak_methods_and_stored_members_passes():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LATE])
    assert passed is True, message


def test_a_stored_value_is_let_through_and_an_iterated_one_is_not():
    token = _Token()
    mine = lambda: {"list": [], "set": set()}  # noqa: E731
    assert _looked(mine, lambda m: [
        weakref.finalize(token, m["list"].append, object()),
        weakref.finalize(token, m["set"].discard, (1, ("a", 2.0)))]) == []
    assert _looked(mine, lambda m: [weakref.finalize(token, m["set"].discard, (1, [2]))]) == [
        "a finalizer calling set.discard (C code given a list: only numbers, strings, None and "
        "tuples of them are plain)"]
    assert _looked(mine, lambda m: [weakref.finalize(token, m["list"].extend, (object(),))]) == [
        "a finalizer calling list.extend (C code given an object: only numbers, strings, None and "
        "tuples of them are plain)"]
