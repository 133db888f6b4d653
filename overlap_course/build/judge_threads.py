"""The threads the submission's code starts while its check runs, for the judge's profile hook
(:mod:`overlap_course.build.judge_watch`).  The watch compares the checker's world when control
comes back to the checker; a thread the submission started and left running can change that
world afterwards, while the checker's own code runs (round 22: a loop's thread waited for the
compare at the loop's return, then rebound two of the checker's helpers with C callables, which
hand nothing back, and the loop's next call put them back: a wrong loop passed).  So a thread it
started that still runs when control comes back is graded as a change: join threads, and shut
executors down, before returning.  A thread is known by its first frame, not its ident alone:
the system reuses a joined thread's ident for the next thread started (round 27: a right loop
that started and joined a ``QueueListener`` failed when a thread not its own later got that
ident, and a right loop with an executor passed only as none did).  Only hand-backs are
compared, so a thread started and joined between two of them (around the loop's own code or
its calls to the engine) is the loop's own business, as any code of its own there is.

A thread is the checker's only if it was alive before the cells, or is one of the course's own
(a ``threading.Thread``, no subclass, running the time limit's watchdog or ``pool.start``'s
executor's worker, as it was started) that the checker's or the engine's code was seen starting:
the one thread whose first frame holds the very ``Thread`` that start call started (round 28: a
cell's thread started its own while the checker's start waited, and it was taken for the
watchdog; a ``Thread`` subclass of the cells' whose ``__del__``, or whose ``__class__``
property, was ``Thread.start`` was started by the checker's code as it dropped the loop's return
value or asked ``inspect.ismethod``).  Every other thread alive at a compare or at the end is
graded as a change (round 28: a thread a cell started -- a daemon ``threading.Thread`` or a
raw ``_thread`` one, which no profile hook watches -- or one the loop started through C code,
``list(map(_thread.start_new_thread, ...))``, rebound ``pool.compare`` between two compares and
put it back before the last; ``sys._current_frames()`` lists raw threads too).  Not seen: a raw
thread whose target is C code, which has no Python frame to list."""

from __future__ import annotations

import _thread
import concurrent.futures.thread as futures_thread
import sys
import threading
import types

from overlap_course.checks import sandbox

#: The C functions every Python thread starts through (threading's, and ``_thread``'s own)
_STARTERS = frozenset(id(f) for f in (getattr(_thread, name, None) for name in (
    "start_new_thread", "start_joinable_thread")) if f is not None)
#: Events of the starting thread after the start call within which the new thread shows (as
#: ``threading.Thread.start`` waits for it); one that ended sooner did nothing since
_LOOKS = 256
#: What the course's own threads in the judge's process run (a ``threading.Thread``'s target's
#: code -> the identity of the globals it runs with, and of what it is bound to): the check's
#: time limit and ``pool.start``'s executor (not the library's server of file descriptors: no
#: engine starts it since its device gets its buffers as it starts, and round 28b's loop had it
#: run callables of its own).  Identities, not the objects: the judge fingerprints this module's names by
#: their contents, and a module's globals hold ``__builtins__``, to which a cell may add a
#: helper of its own (round 28: a right loop beside ``builtins.my_helper = len`` was failed)
_COURSE_TARGETS = {
    id(next(c for c in sandbox.start_time_limit.__code__.co_consts
            if type(c) is types.CodeType and c.co_name == "watchdog")): (id(vars(sandbox)), None),
    id(futures_thread._worker.__code__): (id(vars(futures_thread)), None)}


def thread_starts(fields: dict, checkers, ident=id, me_now=threading.get_ident,
                  current_frames=sys._current_frames, starters=_STARTERS, looks=_LOOKS,
                  listed=list, ordered=sorted, bootstrap=threading.Thread._bootstrap.__code__,
                  is_a=isinstance, thread_type=threading.Thread,
                  instance_dict=object.__getattribute__, kind=type, function=types.FunctionType,
                  start=threading.Thread.start.__code__, targets=_COURSE_TARGETS,
                  code_of=types.FunctionType.__dict__["__code__"].__get__,
                  globals_of=types.FunctionType.__dict__["__globals__"].__get__,
                  method=types.MethodType, func_of=types.MethodType.__dict__["__func__"].__get__,
                  self_of=types.MethodType.__dict__["__self__"].__get__) -> dict:
    """``noted(frame, event, arg)``, at each profile event: notes a course's thread started by a
    C call (``c_call``) in ``Thread.start`` of the checker's or the engine's code
    (``checkers(code)``) in a thread of theirs, found as it shows in the following events of the
    thread that started it;
    ``running()``: the threads alive now that are not theirs (nor alive before the cells:
    ``cells_begin()``, and as the watch is made).  A start from the submission's code (called
    from it, through the standard library -- an executor, ``threading.Timer`` -- or in a
    thread that is not theirs) is not noted.  Bound as the watch is made, like the hooks (no
    name a cell can rebind is looked up as they run)."""
    foreign, looking = fields["foreign"], fields["looking"]
    known: dict[int, object] = {}  # threads not the submission's: ident -> first frame
    starting: dict[int, list] = {}  # a starting thread -> [alive before, looks left, Thread]
    course: dict[int, tuple] = {}  # the course's threads started since: ident -> (Thread, target)

    def alive() -> dict:
        """The threads alive now, ident -> first frame (the audit hook lets the judge's own look
        through)."""
        me = me_now()
        looking.add(me)
        try:
            return {t: first(frame) for t, frame in current_frames().items()}
        finally:
            looking.discard(me)

    def first(frame):
        while frame.f_back is not None:
            frame = frame.f_back
        return frame

    def for_submission(frame) -> bool:
        while frame is not None:
            code = frame.f_code
            if foreign(code):
                return True
            if checkers(code):
                return False
            frame = frame.f_back
        return False

    def target(thread):
        """The target of a thread the course starts (a ``threading.Thread``, no subclass, that
        runs one of the course's functions), or None: the submission's, whoever starts it."""
        own = instance_dict(thread, "__dict__") if kind(thread) is thread_type else {"run": 0}
        f = bound = own.get("_target")
        owner, f = (self_of(f), func_of(f)) if kind(f) is method else (None, f)
        if "run" in own or kind(f) is not function:
            return None
        names, to = targets.get(ident(code_of(f)), (None, 0))  # (compared by identity)
        return bound if names == ident(globals_of(f)) and to == (
            None if owner is None else ident(owner)) else None

    def still(t: int) -> bool:
        """Whether a course's thread still runs what it was started with (or nothing more)."""
        thread, f = course[t]
        own = instance_dict(thread, "__dict__")
        return "run" not in own and own.get("_target", f) is f

    def noted(frame, event: str, arg) -> None:
        me = me_now()
        if me in starting:  # a start made: the thread it made (its own first frame), once shown
            before, left, thread = starting[me]
            new = [(t, f) for t, f in alive().items() if before.get(t) is not f and (
                f.f_code is bootstrap and f.f_locals.get("self") is thread)]
            if new or left <= 1:
                if len(new) == 1:  # (another thread of the same Thread object: neither)
                    known.update(new)
                    course[new[0][0]] = (thread, target(thread))
                del starting[me]
            else:
                starting[me][1] = left - 1
        if event == "c_call" and ident(arg) in starters and frame.f_code is start and (
                known.get(me) is first(frame)) and not for_submission(frame) and target(
                thread := frame.f_locals.get("self")) is not None:
            starting[me] = [alive(), looks, thread]

    def name(frame) -> str:
        """The thread's name (threading's, which names its target) or its first function."""
        thread = frame.f_locals.get("self") if frame.f_code is bootstrap else None
        label = instance_dict(thread, "__dict__").get("_name") if is_a(thread, thread_type) else 0
        return f"{label!r}" if kind(label) is str else f"running {frame.f_code.co_name}()"

    def running() -> list[str]:
        """Not the thread comparing: it runs the checker's code now (round 42: a right
        ``idle_fraction`` whose pool worker ran its lambda, then a timeline method, failed)."""
        me = me_now()
        return [f"a thread your code started or your cells did (ident {t}, {name(f)}) still "
                f"running as control came back to the checker (stop the threads your cells "
                f"start before the check runs, and join those your code starts before returning)"
                for t, f in ordered(listed(alive().items()))
                if t != me and (known.get(t) is not f or t in course and not still(t))]

    def cells_begin() -> None:
        course.clear()
        known.update(alive())
    known.update(alive())
    return {"noted": noted, "running": running, "starting": starting, "cells_begin": cells_begin}
