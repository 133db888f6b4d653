"""Two ways below the judge's hand-backs, for its watch (:mod:`overlap_course.build.judge_watch`):
a trace function set on a frame that is not the submission's, and ``ctypes``' raw memory.

A frame's ``f_trace`` is called at each of its lines while any global trace is set -- and the
checks' time limit is one (``sandbox``'s ``sys.settrace``) -- with profiling off, so no
hand-back sees it run, and CPython 3.11 writes the frame's ``f_locals`` back after each call
(round 27: a wrong loop found ``check_serial_loop``'s frame through ``traceback.walk_stack``,
which ``logging`` and ``traceback`` use for right answers, set its ``f_trace``, and reset the
checker's ``verdict`` to None; setting ``f_trace`` raises no audit event).  So each compare,
and the judge's last look, reads the ``f_trace`` of every frame on every thread's stack, and
each call (or resumption: a generator's frame, set while it was suspended) of code not the
submission's reads its own: one that is not None, not the submission's frame and not the time
limit's own trace function is a change, named (24 us a look at 50 frames in 3 threads,
measured on 2 busy cores; at a call, one attribute read unless it is set).

``ctypes`` reaches any memory: round 27's wrong loop wrote its own tokens into the checker's
cached reference tuples (``c_void_p.from_address(id(t) + 24).value = id(v)``, with
``pythonapi.Py_IncRef``).  Its audit events that read or write an address (``from_address``,
``string_at``, ``wstring_at``, ``PyObj_FromPtr``), load a library or find a C function by name
(``CDLL``, ``pythonapi.X``) or call one by address (``_ctypes.call_function``) are refused
with the submission's code on the stack, or in a thread of its own; torch's, numpy's and
``logging``'s own work in a right run raises none of them.  What stays open (the judge's
docstring says so): a call of a C function pointer already made raises no event (ctypes' own
``memmove``, ``memset`` and ``cast``, one a library looked up, or a ``CFUNCTYPE`` made from an
address), nor do ctypes objects that alias an address (a ``Union`` of a ``c_void_p`` and a
pointer type, ``c_char_p(address).value``) or numpy's ``__array_interface__`` given one."""

from __future__ import annotations

import os
import sys
import threading

import overlap_course
import toy_engine

#: ctypes' audit events (CPython 3.11) that reach memory by address, or C functions
RAW_MEMORY_EVENTS = frozenset({"ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at",
                               "ctypes.PyObj_FromPtr", "ctypes.dlopen", "ctypes.dlsym",
                               "ctypes.dlsym/handle", "ctypes.call_function"})
#: Where the checker's and the engine's code lives (the watch also compares a hand-back into
#: other code, asyncio's event loop, when control next reaches it)
CHECKER_DIRS = tuple(os.path.dirname(package.__file__) + os.sep
                     for package in (overlap_course, toy_engine))


def frame_rules(fields: dict, current_frames=sys._current_frames, me_now=threading.get_ident,
                kind=type, values=dict.values, listed=list, refuse=PermissionError) -> dict:
    """``traced()``: the trace functions set on frames not the submission's, on every stack;
    ``traced_call(frame)``: the one on a frame of such code as it is called or resumed;
    ``raw_memory(event)``: for the audit hook, refuses a ctypes event the submission's code
    asks for.  Bound as the watch is made, like its hooks."""
    foreign, code_of, on_stack, looking, is_time_limit = (fields[k] for k in (
        "foreign", "code_of", "on_stack", "looking", "is_time_limit"))

    def traced_call(frame) -> str | None:
        trace = frame.f_trace
        if trace is None or foreign(frame.f_code) or is_time_limit(trace):
            return None
        code = code_of(trace)
        return (f"a trace function ({code.co_name if code is not None else kind(trace).__name__})"
                f" set on the frame of {frame.f_code.co_name}, which is not your code's: it "
                f"runs unseen at each of its lines")

    def traced() -> list[str]:
        me = me_now()
        looking.add(me)  # the audit hook lets the judge's own look through
        try:
            tops = listed(values(current_frames()))
        finally:
            looking.discard(me)
        found = []
        while tops:  # emptied as read: it holds this very frame, whose locals would hold it
            frame = tops.pop()  # (a cycle, which kept the checker's frames and their locals
            while frame is not None:  # alive past their return, until gc ran)
                if (why := traced_call(frame)) is not None:
                    found.append(why)
                frame = frame.f_back
        return found

    def raw_memory(event: str) -> None:
        if on_stack():
            raise refuse(f"the judge does not let a submission's code use ctypes' raw memory "
                         f"({event}): it reaches the checker's and the judge's own memory; a "
                         f"right answer needs none")
    return {"traced": traced, "traced_call": traced_call, "raw_memory": raw_memory}
