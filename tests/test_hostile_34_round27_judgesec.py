"""Issue 34, round twenty-seven, judge: two wrong loops got full marks from the real judge.

* A trace function on the checker's frame.  The loop found ``check_serial_loop``'s frame with
  ``traceback.walk_stack`` (the judge lets it: ``logging`` and ``traceback`` read frames for
  right answers) and set its ``f_trace``.  The check's time limit is a global trace hook, so
  CPython called that function at each line of the checker's frame, with profiling off (no
  hand-back saw it), and wrote the ``verdict`` it set to None back into the frame.  No audit
  event is raised as ``f_trace`` is set: the watch now reads the ``f_trace`` of every frame at
  each compare and at the end, and of a frame not the submission's as it is called or resumed.
* ``ctypes`` writing the checker's cached reference tuples in place
  (``c_void_p.from_address(id(t) + 24 + 8 * i).value = id(v)``, ``pythonapi.Py_IncRef``).
  ctypes' audit events that reach memory by address or call C functions are now refused with
  the submission's code on the stack (what stays open is in the judge's docstring)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from overlap_course.build import judge
from overlap_course.build.judge_watch import Watch
from overlap_course.checks import sandbox

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

CHANGED = "your code changed what the checker runs on"
_WRONG_MAIN = '''
CALLS = []
def serial_loop(engine):   # wrong in the main run: the first sampled token of a round overwritten
    CALLS.append(1)
    main = len(CALLS) == 1
{before}
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        if main:
            engine.device.host(buffers.out_buffer(step.slot), "w")[0] = 5
        engine.process_outputs(step)
{after}
'''


def _wrong_main(top: str, before: str = "", after: str = "") -> str:
    return top + _WRONG_MAIN.format(before=textwrap.indent(before, " " * 4),
                                    after=textwrap.indent(after, " " * 4))


TRACED = _wrong_main('''
import traceback
from toy_engine import buffers

def _keep_passing(frame, event, arg):
    v = frame.f_locals.get("verdict")
    if v is not None and not getattr(v, "passed", True):
        frame.f_locals["verdict"] = None   # written back into the checker's frame
    return _keep_passing
''', before='''
for frame, _ in traceback.walk_stack(None):
    if frame.f_code.co_name == "check_serial_loop":
        frame.f_trace = _keep_passing
''')
WRITTEN = _wrong_main('''
import ctypes
from toy_engine import buffers
from overlap_course.checks import pool

_KEEP = []
def _set(t, i, value):   # a tuple's item written in place
    _KEEP.append(value)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))
    ctypes.c_void_p.from_address(id(t) + 24 + 8 * i).value = id(value)
''', after='''
if main:
    ref, ends = pool.reference(), pool.serial_run().ends
    for i, r in enumerate(engine.requests):
        got = tuple(r.output_ids)
        _set(ref, i, got)
        _set(ends[i], 1, got)
        _set(ends[i], 3, r.text)
''')


def test_a_trace_function_set_on_the_checkers_frame_is_a_change():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, TRACED])
    assert not passed and CHANGED in message, message
    assert "a trace function (_keep_passing) set on the frame of check_serial_loop" in message


def test_ctypes_writing_the_checkers_references_is_refused():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRITTEN])
    assert not passed and "use ctypes' raw memory (ctypes.dlsym)" in message, message


def test_the_plain_wrong_loop_still_fails():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP])
    assert not passed and "differs from the reference" in message, message


def test_a_right_loop_logging_its_function_names_passes():
    """``%(funcName)s`` reads the caller's frame, as ``traceback.walk_stack`` does."""
    needs_the_engine()
    cell = '''
import logging, traceback
logging.basicConfig(format="%(funcName)s:%(lineno)d %(message)s", level=logging.INFO)
log = logging.getLogger("loop")
''' + RIGHT_LOOP.replace("        engine.process_outputs(step)\n", '''\
        engine.process_outputs(step)
        log.info("%d deep", len(list(traceback.walk_stack(None))))
''')
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell])
    assert passed is True, message


def test_a_right_loop_with_numpy_below_the_torch_profiler_passes():
    """numpy and torch load ctypes, and a cell ran torch's profiler: a right run raises none of
    ctypes' refused events.  (The profiler entered inside the loop imports its modules under
    the check's watch and runs past the time limit, before this round's change too.)"""
    needs_the_engine()
    cell = """import numpy as np, torch, torch.profiler
with torch.profiler.profile():
    torch.ones(4).sum()
""" + RIGHT_LOOP.replace("    while engine.scheduler.has_work():\n",
                         "    counts = np.zeros(1, dtype=np.int64)\n"
                         "    while engine.scheduler.has_work():\n        counts += 1\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell])
    assert passed is True, message


def _trace(frame, event, arg):
    return _trace


class _NOT_ENDED:  # the time limit's "stopped" (read as it is made)
    is_set = staticmethod(lambda: False)


def _rounds():
    yield 1
    yield 2


def test_the_watch_names_a_trace_on_a_running_frame_not_the_submissions():
    watch, frame = Watch(), sys._getframe()
    in_learners_frame = sandbox._tracer(0.0, 0, sandbox._limits_class(1.0), _NOT_ENDED)[0]
    try:
        frame.f_trace = in_learners_frame  # the time limit's own: not named
        assert watch.traced() == []
        frame.f_trace = _trace
        found = watch.traced()
    finally:
        frame.f_trace = None
    assert found == [f"a trace function (_trace) set on the frame of {frame.f_code.co_name}, "
                     f"which is not your code's: it runs unseen at each of its lines"]


def test_a_trace_set_on_a_suspended_frame_is_named_as_it_resumes():
    """Set while no stack holds the frame (a checker's generator), it runs once resumed."""
    watch, rounds = Watch(), _rounds()
    next(rounds)
    rounds.gi_frame.f_trace = _trace
    watch.start(lambda: [])
    try:
        next(rounds)
    finally:
        watch.stop()
    assert watch.changed and watch.changed[0].startswith(
        "a trace function (_trace) set on the frame of _rounds"), watch.changed


_RAW = '''
import ctypes, _ctypes, sys, threading
from overlap_course.build.judge_frames import RAW_MEMORY_EVENTS
from overlap_course.build.judge_watch import Watch
from overlap_course.checks import sandbox
watch = Watch()
A = ctypes.cast(ctypes.pythonapi.Py_GetVersion, ctypes.c_void_p).value  # no arguments
sys.addaudithook(lambda event, args: event in RAW_MEMORY_EVENTS and watch.raw_memory(event))
TRIES = ["ctypes.c_void_p.from_address(id(T) + 24).value", "ctypes.string_at(id(T), 8)",
         "ctypes.wstring_at(id(T), 1)", "_ctypes.PyObj_FromPtr(id(T))",
         "_ctypes.call_function(A, ())", "ctypes.pythonapi.Py_IncRef", "ctypes.CDLL(None)",
         "ctypes.py_object(T).value", "tracer(sys._getframe(), 'line', None)"]
tracer = sandbox._tracer(0.0, 0, sandbox._limits_class(1.0), threading.Event())[0]
for i, expr in enumerate(TRIES):
    space = dict(ctypes=ctypes, _ctypes=_ctypes, sys=sys, tracer=tracer, T=(1, 2), A=A)
    exec(compile(f"def f():\\n    return {expr}\\n", f"<submission-{i}>", "exec"), space)
    try:
        space["f"]()
        print("let through")
    except PermissionError as err:
        print(str(err).split("(")[1].split(")")[0])
'''


def test_ctypes_raw_memory_is_refused_to_the_submission_and_let_through_to_the_time_limit():
    """Each audited way the submission's code reaches memory by address or C functions is
    refused; a ctypes object of its own (``py_object(T).value``) and the time limit's
    ``PyThreadState_SetAsyncExc``, called from its trace function on the submission's frame,
    are let through.  (Calls of function pointers already made, ``ctypes.memmove``, raise no
    event: the judge's docstring lists them as open.)"""
    ran = subprocess.run([sys.executable, "-c", _RAW], capture_output=True, text=True,
                         timeout=300, check=True)
    assert ran.stdout.split("\n")[:-1] == [
        "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr",
        "ctypes.call_function", "ctypes.dlsym", "ctypes.dlopen", "let through",
        "let through"], ran.stdout
