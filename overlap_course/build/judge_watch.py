"""What the judge watches while a code answer's check runs beside the submission's code (used
by :mod:`overlap_course.build.judge_process`): which code is the submission's, what it changed
each time it handed control back, and which threads it left."""

from __future__ import annotations

import functools
import sys
import threading
import types

_MAX_UNWRAP = 20  # partials and bound methods around a thread's target


# Audit events that make code, or set a hook that runs code at every call.
CODE_EVENTS = {"exec", "function.__new__", "sys.settrace", "sys.setprofile"}


class Watch:
    """The submission's code while the check runs.  A replacement made and undone inside the
    check (a checker's helper swapped on the first call, put back on the last) leaves nothing
    for a fingerprint at the end to see; so the fingerprint is compared each time code of the
    submission returns (or yields) to code that is not, through a profile hook (the checks'
    time limit uses the trace hook).  The submission's code: its cells, and every code object
    executed or made into a function while a frame of it is on the stack (``exec`` and
    ``function.__new__`` audit events: ``compile``, ``code.replace``, ``marshal``, an import of
    its own module, a ``dataclass`` it declares), whatever file name it claims."""

    def __init__(self) -> None:
        self.codes: dict[int, types.CodeType] = {}  # id -> code (kept: an id is not reused)
        self.changed: list[str] = []
        self.hooks: list[str] = []
        self.before: dict | None = None
        self.compare = None
        self.hook = self.profile  # one bound method, to know it again

    def foreign(self, code) -> bool:
        return code.co_filename.startswith("<submission") or id(code) in self.codes

    def _on_stack(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if self.foreign(frame.f_code):
                return True
            frame = frame.f_back
        return False

    def audited(self, event: str, args: tuple) -> None:
        if not self._on_stack():
            return
        if event in ("sys.settrace", "sys.setprofile"):
            if self.before is not None:  # while the check runs (its cells may run checks too)
                self.hooks.append(event)
            return
        stack = [args[0]] if isinstance(args[0], types.CodeType) else []
        while stack:  # the code and every function, class and comprehension defined in it
            code = stack.pop()
            self.codes[id(code)] = code
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]

    def profile(self, frame, event: str, arg) -> None:
        if event != "return" or self.changed or not self.foreign(frame.f_code):
            return
        caller = frame.f_back
        if caller is None or not self.foreign(caller.f_code):
            self.changed = self.compare(self.before)

    def start(self, before: dict, compare) -> None:
        """Watch from now on; ``compare(before)``: what changed since ``before`` was taken."""
        self.before, self.compare = before, compare
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)

    def stop(self) -> None:
        if sys.getprofile() is not self.hook:
            self.hooks.append("sys.setprofile")
        sys.setprofile(None)
        threading.setprofile(None)
        self.before = None


def from_submission(thread: threading.Thread, watch: Watch) -> bool:
    """Whether a thread runs the submission's code: its target's (a Timer's function, a
    partial's, a bound method's, an overridden ``run``), or a callable with no code the judge
    can read (a builtin, as in ``Timer(1, setattr, ...)``)."""
    target = getattr(thread, "_target", None) or getattr(thread, "function", None)
    if target is None and type(thread).run is not threading.Thread.run:
        target = type(thread).run
    if target is None:
        return False  # a thread with nothing to run
    for _ in range(_MAX_UNWRAP):
        if isinstance(target, functools.partial):
            target = target.func
        elif hasattr(target, "__func__"):
            target = target.__func__
        else:
            break
    code = getattr(target, "__code__", None)
    if code is None and not isinstance(target, types.BuiltinFunctionType):
        code = getattr(getattr(type(target), "__call__", None), "__code__", None)
    return code is None or watch.foreign(code)
