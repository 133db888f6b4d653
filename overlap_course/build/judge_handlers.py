"""The handlers the runtime calls on its own, for the judge's watch
(:mod:`overlap_course.build.judge_watch`): signal handlers and ``sys.set_asyncgen_hooks``'.
Like a weakref callback (:mod:`~overlap_course.build.judge_weakrefs`), one that is C code
(``functools.partial(max, pairs, key=vars(pool).update)``) runs no code of the submission's
when the runtime calls it -- a signal's handler between two bytecodes of whatever runs then, an
async generator's finalizer as it dies -- so no hand-back is compared: it could break
``pool.compare`` after the compare at the loop's return and mend it before the judge's last.

A signal handler is looked up as the signal arrives: to run between two compares it is set at
the first of them, so each compare (and the judge's last) names one that is C code or the
submission's, set since the watch was made (``signal.signal`` raises no audit event; 62
signals and the hooks read in 7 us).  The checker's time limit sets its own
(``sandbox._on_alarm``) and ``asyncio.run`` one of its own for SIGINT: the standard library's
and the checker's Python code, not named.  An async generator keeps the finalizer set as it
first iterates, which the hooks may no longer show at the next compare: so the submission's
code may not set them itself (refused, and named), and each time anyone sets them (asyncio's
loop, which sets its own Python methods, and puts back what it found) the ones they replace
are looked at too.

The hooks the runtime calls for an error no code catches -- ``sys.unraisablehook`` (an
exception in a ``__del__`` or a weakref's callback), ``sys.excepthook`` and
``threading.excepthook`` (a thread's) -- run inside whatever code runs then: one that is C
code, set since the watch was made, is named at each compare (round 28: the fingerprint saw
``threading.excepthook`` set to a partial, a builtin as the one it replaces, as no change);
the submission's Python code is compared as it runs, as for any call of it."""

from __future__ import annotations

import _signal  # signal's own functions, without the enum wrappers (80 us a look, not 7)
import itertools
import operator
import signal
import sys
import threading
import types

_SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals()))
#: The audit events of ``sys.set_asyncgen_hooks`` (no arguments: raised before the hook is set),
#: as CPython 3.11 names them, and as its documentation does
ASYNCGEN_EVENTS = frozenset({"sys.set_asyncgen_hook_firstiter", "sys.set_asyncgen_hook_finalizer",
                             "sys.set_asyncgen_hooks_firstiter",
                             "sys.set_asyncgen_hooks_finalizer"})


def runtime_handlers(fields: dict, signals=_SIGNALS, getsignal=_signal.getsignal,
                     hooks_now=sys.get_asyncgen_hooks, listed=list, mapped=map, zipped=zip,
                     compress=itertools.compress, count=itertools.count, is_not=operator.is_not,
                     can_call=callable, frame_at=sys._getframe, refuse=PermissionError,
                     hook_names=("firstiter", "finalizer"), builtin=types.BuiltinFunctionType,
                     name_of=types.BuiltinFunctionType.__dict__["__name__"].__get__,
                     error_hooks=((vars(sys), "sys", "unraisablehook"),
                                  (vars(sys), "sys", "excepthook"),
                                  (vars(threading), "threading", "excepthook")),
                     read=dict.get) -> dict:
    """``handlers()`` at each compare (what it found, named) and ``asyncgen_set()`` for the
    audit hook, at a ``sys.set_asyncgen_hooks`` event.  Bound as the watch is made, before the
    submission's first line, like the hooks; what is set then is not the submission's."""
    untrusted, foreign, code_of = fields["untrusted"], fields["foreign"], fields["code_of"]
    hooks, before, hooks_before = fields["hooks"], listed(mapped(getsignal, signals)), hooks_now()
    errors_before = [read(space, hook) for space, _, hook in error_hooks]

    def name(f) -> str:
        code = code_of(f)
        return (code.co_name if code is not None else name_of(f) if type(f) is builtin
                else type(f).__name__)

    def asyncgen() -> list[str]:
        return [f"sys.set_asyncgen_hooks ({kind} {name(f)})" for kind, f, was in zipped(
            hook_names, hooks_now(), hooks_before)
            if f is not was and f is not None and untrusted(f)]

    def handlers() -> list[str]:
        now = listed(mapped(getsignal, signals))
        return [f"a signal handler {name(now[i])} (signal {signals[i]}: put back the one it "
                f"replaced, `signal.signal(signum, previous)`, before the check)"
                for i in compress(count(), mapped(is_not, now, before))
                if can_call(now[i]) and untrusted(now[i])] + asyncgen() + errors()

    def errors() -> list[str]:
        """The error hooks set to C code since the watch was made."""
        return [f"{module}.{hook} set to C code ({name(f)})"
                for (space, module, hook), was in zipped(error_hooks, errors_before)
                if (f := read(space, hook)) is not was and can_call(f) and code_of(f) is None]

    def asyncgen_set() -> None:
        """The hooks replaced now, if they were C code or the submission's (an async generator
        may hold them); a set by the submission's code itself (its frame calls, or a C
        function it called) is refused: no right answer sets them but through asyncio."""
        hooks.extend(asyncgen())
        caller = frame_at(1).f_back  # 0: here, 1: the audit hook; None: a thread's C target
        if caller is None or foreign(caller.f_code):
            hooks.append("sys.set_asyncgen_hooks")
            raise refuse("the judge does not let a submission set sys.set_asyncgen_hooks: "
                         "the runtime calls them with no code of the submission's; asyncio's "
                         "loop sets its own")
    return {"handlers": handlers, "asyncgen_set": asyncgen_set}
