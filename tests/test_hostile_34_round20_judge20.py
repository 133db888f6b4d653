"""Issue 34, round twenty, judge.  The audit hook ran the judge's Python code while the cells ran,
and that code looked names up in ``judge_watch``'s globals and ``Watch``'s class attributes, which
a cell rebinds with no audit event: ``Watch.foreign = lambda self, code: False`` made the hook let
the cell walk ``gc`` to the report's writer and sign a pass for a wrong loop.  And during the
check ``sys.getprofile()`` handed the submission the watch (``.__self__``): setting its
``foreign`` did the same from inside the loop.  Now what the hook calls is bound as the watch is
made (closures over the watch's own fields, builtins as defaults), and the profile hook is
``sys.audit`` bound to an event's name, answered by the audit hook, which no code can reach.  Each
cheat failed when written; right loops still pass.  Real nbgrader grades two of them in round
nineteen's course (``test_hostile_34_round19_grading19``), beside that round's cheats."""

from __future__ import annotations

import pytest

from overlap_course.build import judge

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

# Once the hook is loosened: the report's writer found by gc, and a signed pass written
_FORGE = '''
import gc as _gc, types as _t
for _f in _gc.get_objects():
    if type(_f) is _t.FunctionType and _f.__name__ == "write" and _f.__closure__:
        _f({"passed": True, "message": "ok"})
'''
_WATCH = "from overlap_course.build import judge_watch as _jw\n"
CELL_CHEATS = {
    "class_foreign": _WATCH + "_jw.Watch.foreign = lambda self, code: False\n" + _FORGE,
    "class_on_stack": _WATCH + "_jw.Watch._on_stack = lambda *a, **k: False\n"
                               "_jw.Watch.foreign = lambda self, code: False\n" + _FORGE,
    "module_events": _WATCH + "_jw.FRAME_EVENTS.clear()\n_jw._IDENT = lambda: 0\n"
                              "_jw.Watch.foreign = lambda self, code: False\n" + _FORGE,
    "builtin_any": "import builtins\n_any = builtins.any\n" + _WATCH
                   + "_jw.Watch.foreign = lambda self, code: False\n" + _FORGE,
}
# During the check, from the loop itself: the watch, reached from the profile hook
_IN_LOOP = '''
import sys as _s
_real_loop = serial_loop
def serial_loop(engine):
    _p = _s.getprofile()
    _w = getattr(_p, "__self__", None)
    if _w is not None and not isinstance(_w, str):
        _w.foreign = lambda code: False
        _w.changes = lambda: []
''' + "\n".join("    " + line for line in _FORGE.splitlines()) + '''
    return _real_loop(engine)
'''
CHECK_CHEATS = {"profile_self": _IN_LOOP}


@pytest.mark.parametrize("cheat", sorted(CELL_CHEATS))
def test_a_cell_cannot_loosen_the_audit_hook(cheat):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, CELL_CHEATS[cheat]])
    assert not passed and message != "ok", message


@pytest.mark.parametrize("cheat", sorted(CHECK_CHEATS))
def test_the_check_does_not_hand_the_watch_to_the_loop(cheat):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, CHECK_CHEATS[cheat]])
    assert not passed and message != "ok", message


UNUSUAL_LOOP = '''
import functools, sys
class _Steps:
    def __init__(self, engine):
        self.engine = engine
    def __iter__(self):
        while self.engine.scheduler.has_work():
            yield self.engine.schedule()
def serial_loop(engine):
    for plan in _Steps(engine):
        inputs = functools.partial(engine.prepare_inputs)(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        assert sys.getprofile() is not None
        engine.process_outputs(step)
'''


@pytest.mark.parametrize("loop", [RIGHT_LOOP, UNUSUAL_LOOP], ids=["right", "unusual"])
def test_right_loops_still_pass(loop):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, loop])
    assert passed, message
