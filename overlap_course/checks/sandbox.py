"""What keeps a check fair when the learner's code misbehaves: a time limit, and the
toy's modules, classes and shared engines restored to what they were.

A check runs code that may loop forever, catch ``BaseException``, or have patched the
toy in an earlier cell (``toy_engine.kernels.correct_seqlens_qk = stub``,
``toy_engine.engine.NUM_SLOTS = 1``, ``Engine.process_outputs = ...``).  None of that
may hang the notebook, or make a later, correct answer fail with a message that blames
its author: the limit stops the code and says where it was, and what an earlier cell
changed is put back and named in the verdict.
"""

from __future__ import annotations

import ctypes
import functools
import _signal  # signal's own functions, without the enum wrappers (the quick path counts)
import os
import signal
import sys
import sysconfig
import threading
import time
import types
import weakref

import toy_engine

TIME_LIMIT_S = 30.0
# The engine and the course are never the learner's code.
_PACKAGE_DIRS = (os.path.dirname(os.path.abspath(toy_engine.__file__)),
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


class TimeUp(BaseException):
    """Raised in the learner's own code once a check's time is up.  A BaseException, and
    raised again after every line of that code that catches it, so no ``except`` keeps it running."""

    seconds, function, line = 0.0, "?", 0  # set on the subclass each time_limit raises

    def __str__(self) -> str:
        return f"still running after {self.seconds:.0f} s, at line {self.line} of `{self.function}`"


def _limits_class(seconds: float) -> type:
    """The TimeUp class of one time limit (where it stopped the code is set on the class)."""
    up = type("TimeUp", (TimeUp,), {"seconds": seconds})
    _LIMITS_CLASSES.add(up)
    return up


_LIMITS_CLASSES: weakref.WeakSet = weakref.WeakSet()  # changed in place (see _CURRENT)


def is_limits(exc: BaseException) -> bool:
    """Whether a time limit raised ``exc``.  A TimeUp of a class of the learner's (whose
    ``__str__`` or ``seconds`` are theirs) is the learner's exception, for a "raised" verdict."""
    return type(exc) in _LIMITS_CLASSES


# PyThreadState_SetAsyncExc(thread, exception type): raise it in that thread at its next check.
# (Never called with NULL to cancel: on CPython 3.11 that leaves the thread's eval breaker set
# with nothing to handle, and the next function entry spins forever.  absorb_time_up cancels.)
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


def absorb_time_up() -> None:
    """Called inside ``try: ... except TimeUp: pass``: a TimeUp still scheduled fires at this
    function's entry, where the caller catches it, instead of later in code that must not
    be interrupted."""


@functools.lru_cache(maxsize=512)
def _is_learners(filename: str) -> bool:
    """Code that is neither the toy's nor a library's: a notebook cell, an exercise, a test corpus.
    A frozen module is the standard library's (round 27: a time limit named ``<frozen abc>``'s
    ``__instancecheck__`` as the learner's line)."""
    if filename.startswith("<frozen "):
        return False
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return not (path.startswith(_PACKAGE_DIRS) or path.startswith(_LIBRARY_DIRS))


def start_time_limit(seconds: float = TIME_LIMIT_S, trace: bool = True, watched=None):
    """Stop the learner's code once ``seconds`` have passed; returns ``stop``, to call when the
    check ends.  At each line of the learner's code after that, TimeUp is scheduled in this thread.
    On the main thread (a notebook's kernel, a script) an alarm also raises TimeUp from
    ``_GRACE_S`` after the deadline (:class:`_Alarm`): code blocked in C -- ``time.sleep``,
    ``Event().wait()``, a lock taken twice -- never reaches a line, but a signal wakes it.
    ``trace=False`` (a notebook check, whose quick path must stay quick): on the main thread,
    the alarm alone, at the deadline; elsewhere (or with no setitimer), as with ``trace``.
    ``watched`` (traced only): {code: hook}, each hook called with a frame of that code as it
    starts (``other_engine.Watch``).

    Not raised by the trace function itself: Python turns tracing off for good when a trace
    function raises, and a learner's ``except BaseException`` would then spin on untraced.
    The toy's own frames are never traced, so TimeUp lands in the learner's code, or at the
    entry of the toy function it was calling, before that function has done anything: the
    engine is between two of its calls, as after an Interrupt.

    A scheduled TimeUp can still fire at the entry of the trace function's next call (a line
    with no call or jump in it, like ``pass``), which turns tracing off: measured, 3 of 3 runs
    of an ``except BaseException`` loop hung that way within 5 tries at a 50 ms limit.  So a
    watchdog thread schedules TimeUp again every ``_RETRY_S`` from ``_GRACE_S`` after the
    deadline until ``stop`` is called: it fires wherever the code is, as an Interrupt would.

    The caller ends the limit in a ``finally`` clause with :func:`end_time_limit`, then restores
    the previous trace function.

    Not stopped (Ctrl-C still is): code spinning in C (``sum(range(10**10))``), and code that
    sabotages the limit itself -- ignores or blocks SIGALRM, disarms the timer in a notebook
    check (which has no watchdog to send the alarm again), or, in an exercise check, turns
    tracing off and catches every TimeUp around a blocking call.
    """
    main = threading.current_thread() is threading.main_thread()
    if not trace and main and _CAN_ALARM:
        alarm = _Alarm.start(seconds, seconds, TimeUp, escalate=True)
        return alarm.end if alarm is not None else no_limit  # None: inside another check's
    deadline, thread = time.monotonic() + seconds, threading.get_ident()
    up = _limits_class(seconds)
    stopped, lock = threading.Event(), threading.Lock()
    on_call = _tracer(deadline, thread, up, stopped, watched)[1]

    def watchdog():
        if stopped.wait(seconds + _GRACE_S):
            return
        _locate(up, sys._current_frames().get(thread))  # blocked in C: no line said where
        while True:
            with lock:
                if stopped.is_set():
                    return
                _set_async_exc(thread, up)
                if alarm is not None:  # the alarm again, if the learner's code disarmed it
                    _signal.pthread_kill(thread, _SIGALRM)
            stopped.wait(_RETRY_S)

    alarm = _Alarm.start(seconds + _GRACE_S, seconds, up) if main else None
    watcher = threading.Thread(target=watchdog, daemon=True, name="check-time-limit")

    def stop():
        with lock:
            stopped.set()
        if alarm is not None:
            alarm.end()
        watcher.join()  # it ends at once (round 28: it outlived a check that hung in C)

    watcher.start()
    sys.settrace(on_call)
    return stop


_GRACE_S, _RETRY_S = 0.5, 0.02


def _tracer(deadline: float, thread: int, up: type, stopped, watched: dict | None = None):
    """The trace functions of a time limit: (for a learner's frame, for every call).  Past the
    deadline, each line of the learner's code schedules ``up`` in ``thread`` until ``stopped``
    is set; a call of a ``watched`` code runs its hook.  What they read is in their defaults
    (a tuple, a bound method), never a closure cell (round 28: the loop took ``sys.gettrace()``'s
    closure and added hooks to the watch's dict, which ran C partials at the checker's own
    calls; a cell's contents can be swapped too): no hook can be added, no value replaced."""

    def in_learners_frame(frame, event, arg, limit=(deadline, thread, up, stopped.is_set)):
        if event == "line" and time.monotonic() > limit[0] and not limit[3]():
            up = limit[2]
            if not up.line:  # the first of the learner's lines past the deadline: where it was
                up.function, up.line = frame.f_code.co_name, frame.f_lineno
            _set_async_exc(limit[1], up)
        return frame.f_trace  # this function: it is called as the frame's own

    def on_call(frame, event, arg, hook_of=types.MappingProxyType(dict(watched or {})).get,
                local=in_learners_frame):
        hook = hook_of(frame.f_code)
        if hook is not None:
            hook(frame)
        return local if _is_learners(frame.f_code.co_filename) else None

    return in_learners_frame, on_call


def no_limit() -> None:
    """The ``stop`` of a time limit not started (inside another check's, or no alarm here)."""


class _Alarm:
    """SIGALRM on the main thread while a check runs: from ``delay`` on, and every ``_RETRY_S``
    after (so an ``except BaseException`` cannot keep the code going), it raises TimeUp where
    the main thread is -- also inside ``time.sleep`` or a lock's wait, which a signal interrupts.

    The process has one such timer: one that was armed when the check began (pytest-timeout,
    a learner's own alarm) keeps its time -- its handler is called at it -- and is put back
    when the check ends, as is the handler, SIG_DFL too (round 28: ours left installed turned a
    later timer of the learner's into a TimeUp): the timer is disarmed first, and a signal
    caught but not yet handled is then dropped by Python, never the default action.
    A check inside a check keeps the outer one's alarm.  Not on Windows (no setitimer)."""

    __slots__ = ("deadline", "seconds", "up", "previous", "found", "ending", "ended", "found_fired",
                 "traced", "escalate", "tracers")

    def __init__(self, delay, seconds, up, previous, found):
        self.deadline, self.seconds = time.monotonic() + delay, seconds
        self.up, self.previous = up, previous
        self.found = (self.deadline - delay + found[0], found[1]) if found[0] > 0 else None
        self.ending = self.ended = self.found_fired = False
        self.traced, self.tracers = [], None  # the learner's frames traced once time was up

    def is_set(self) -> bool:  # for _tracer: the check is ending
        return self.ending

    def trace(self, frame) -> None:
        """Time is up on a limit with no tracing of its own (a notebook check's): trace the
        learner's frames from here on, as an exercise check's limit does, so that an ``except
        BaseException`` around a blocking call cannot keep catching the alarm's TimeUp.  Again
        at each alarm: a TimeUp landing in a trace function turns tracing off."""
        if self.tracers is None:
            self.up = _limits_class(self.seconds)
            self.tracers = _tracer(self.deadline, threading.get_ident(), self.up, self)
        in_learners_frame, on_call = self.tracers
        while frame is not None:
            if _is_learners(frame.f_code.co_filename) and frame.f_trace is not in_learners_frame:
                frame.f_trace = in_learners_frame
                self.traced.append(frame)
            frame = frame.f_back
        sys.settrace(on_call)

    @classmethod
    def start(cls, delay: float, seconds: float, up: type, escalate: bool = False):
        if _CURRENT or not _CAN_ALARM:
            return None
        previous = _signal.getsignal(_SIGALRM)
        if previous is not _on_alarm:
            _signal.signal(_SIGALRM, _on_alarm)
        found = _signal.setitimer(_REAL, delay, _RETRY_S)
        alarm = cls(delay, seconds, up, previous, found)
        _CURRENT.append(alarm)
        alarm.escalate = escalate
        if 0 < found[0] < delay:  # the timer found goes off first: keep its time
            _signal.setitimer(_REAL, found[0], _RETRY_S)
        return alarm

    def end(self) -> None:
        """Disarm, and put back what the check found.  May be called again (a TimeUp landing
        in here is caught by the caller, who calls it again)."""
        if self.ended:
            return
        self.ending = True  # from here on the handler never raises
        _signal.setitimer(_REAL, 0)
        for frame in self.traced:
            frame.f_trace = None
        self.traced.clear()
        if self.previous is not _on_alarm and self.previous is not None:
            _signal.signal(_SIGALRM, self.previous)  # SIG_DFL too: no timer is armed now
        if self.found is not None and not self.found_fired:
            left = max(self.found[0] - time.monotonic(), 1e-6)
            _signal.setitimer(_REAL, left, self.found[1])
        elif self.found is not None and self.found[1] > 0:
            _signal.setitimer(_REAL, self.found[1], self.found[1])
        _CURRENT.clear()
        self.ended = True


_CAN_ALARM = hasattr(signal, "setitimer")
# The alarm of the check running now, if any.  In a list changed in place, not a class
# attribute rebound: the grading judge trusts a verdict only if the checker's classes and
# module attributes are the same objects as before the submission ran.
_CURRENT: list[_Alarm] = []
_SIGALRM, _REAL = (signal.SIGALRM.value, signal.ITIMER_REAL) if _CAN_ALARM else (0, 0)


def _on_alarm(signum, frame) -> None:
    alarm = _CURRENT[0] if _CURRENT else None
    if alarm is None or alarm.ending:
        return
    now = time.monotonic()
    if now < alarm.deadline:  # the timer the check found: its time, its handler
        alarm.found_fired = True
        _signal.setitimer(_REAL, alarm.deadline - now, _RETRY_S)
        if callable(alarm.previous):
            alarm.previous(signum, frame)
        return
    if alarm.escalate:
        alarm.trace(frame)
    _locate(alarm.up, frame)
    up = alarm.up()
    up.seconds = alarm.seconds
    raise up


def _locate(up: type, frame) -> None:
    """Where the code was when time ran out, if no line of the learner's said so yet: the
    innermost of the learner's frames from ``frame`` out (not the library's wait)."""
    if up is TimeUp:
        return  # never the shared class: each limit has its own
    while not up.line and frame is not None and not _is_learners(frame.f_code.co_filename):
        frame = frame.f_back
    if not up.line and frame is not None:
        up.function, up.line = frame.f_code.co_name, frame.f_lineno


def end_time_limit(stop) -> None:
    """Stop the watchdog, then absorb a TimeUp still scheduled.  Call it in a loop that catches
    TimeUp until it returns: one scheduled before ``stop`` can fire at any call in here."""
    stop()
    absorb_time_up()


def _public_state(module: types.ModuleType) -> dict:
    return {name: value for name, value in vars(module).items() if not name.startswith("__")}


def _toy_modules() -> list[types.ModuleType]:
    return [m for name, m in sorted(sys.modules.items())
            if m is not None and (name == "toy_engine" or name.startswith("toy_engine."))]


class Pristine:
    """The toy's modules and classes as they were when the checkers were imported."""

    def __init__(self) -> None:
        self.modules = {m.__name__: (m, _public_state(m)) for m in _toy_modules()}
        self.classes = {(name, cls_name): (cls, dict(vars(cls)))
                        for name, (m, state) in self.modules.items()
                        for cls_name, cls in state.items()
                        if isinstance(cls, type) and cls.__module__ == name}
        # Their lists and dicts (RUN_OBSERVERS): one changed in place is still the same object
        boxes = [*((f"{n}.{a}", v) for n, (_, state) in self.modules.items()
                   for a, v in state.items()),
                 *((f"{n}.{c}.{a}", v) for (n, c), (_, state) in self.classes.items()
                   for a, v in state.items())]
        self.contents = {path: (v, _held(v)) for path, v in boxes if type(v) in (list, dict)}

    def restore(self) -> tuple[list[str], dict]:
        """Put back every changed or added module attribute and class attribute; returns
        their names (``toy_engine.engine.NUM_SLOTS``) for the verdict, and per name the value
        found, where it is a plain number or string (the note shows it).  Returned, not kept:
        the grading judge reads this record by value, which a restore must not change.
        An attribute put on a class with the very value it inherits (a learner's "put it back",
        ``Engine.flush = RoundStages.flush``) changes nothing: removed silently."""
        changed, was = [], {}
        for name, (module, state) in self.modules.items():
            now = vars(module)
            for attr, value in state.items():
                if now.get(attr, _MISSING) is not value:
                    changed.append(f"{name}.{attr}")
                    _note(was, changed[-1], now.get(attr, _MISSING), value)
                    setattr(module, attr, value)
        for (name, cls_name), (cls, state) in self.classes.items():
            now = dict(vars(cls))
            for attr in now.keys() - state.keys():
                if attr.startswith("__"):
                    continue  # Python's own caches, e.g. copyreg's __slotnames__
                if now[attr] is not _inherited(cls, attr):
                    changed.append(f"{name}.{cls_name}.{attr}")
                delattr(cls, attr)
            for attr, value in state.items():
                if now.get(attr, _MISSING) is not value:
                    changed.append(f"{name}.{cls_name}.{attr}")
                    setattr(cls, attr, value)
        for path, (box, held) in self.contents.items():
            now = _held(box)  # what it held, and the course's own hooks added since (OWN_HOOKS)
            want = held + tuple(x for x in now if type(box) is list
                                and any(x[0] is hook for hook in OWN_HOOKS))
            if len(now) != len(want) or any(a is not b for p, q in zip(now, want)
                                            for a, b in zip(p, q)):
                changed.append(path)
                was[path] = (now, want)
                box.clear()  # put back in place: the engine and others hold this very object
                if type(box) is dict:
                    box.update(want)
                else:
                    box.extend(x for x, in want)
        return changed, was


def _note(was: dict, name: str, found, original) -> None:
    if isinstance(found, (int, float, str)) and isinstance(original, (int, float, str)):
        was[name] = (found, original)


# Hooks the course itself puts in the toy's lists for a while (endings.observe's observer):
# restore() keeps them there.
OWN_HOOKS: list = []


def _held(box) -> tuple:
    """What a list or dict holds: its items, or its (key, value) pairs, each as a tuple."""
    return tuple(dict.items(box)) if type(box) is dict else tuple((x,) for x in box)


def _inherited(cls: type, attr: str):
    """What ``cls.attr`` resolves to without ``cls``'s own entry."""
    for base in cls.__mro__[1:]:
        if attr in vars(base):
            return vars(base)[attr]
    return _MISSING


_MISSING = object()
