"""What the judge watches while a code answer's check runs beside the submission's code (used
by :mod:`overlap_course.build.judge_process`): which code is the submission's, what it changed
each time it handed control back, and which threads it left."""

from __future__ import annotations

import functools
import gc
import sys
import threading
import types
import weakref

from overlap_course.build.judge_frames import CHECKER_DIRS as _CHECKER_DIRS, frame_rules
from overlap_course.build.judge_handlers import runtime_handlers
from overlap_course.build.judge_threads import _STARTERS, thread_starts
from overlap_course.build.judge_weakrefs import c_callbacks
from overlap_course.checks import sandbox

_MAX_UNWRAP = 20  # partials and bound methods around a thread's target


# Audit events that make code, give a function other code, or set a hook that runs code at
# every call.
CODE_EVENTS = {"exec", "function.__new__", "object.__setattr__", "sys.settrace",
               "sys.setprofile"}
# Audit events that reach the judge's memory (the run's secret, its report's writer): every
# object, every thread's frames and exceptions; and those that hand their caller a frame, whose
# ``f_back`` and ``f_locals`` lead to the judge's (a traceback's, a generator's, a coroutine's).
MEMORY_EVENTS = {"gc.get_objects", "gc.get_referrers", "gc.get_referents",
                 "sys._current_frames", "sys._current_exceptions"}
FRAME_EVENTS = {"sys._getframe", "object.__getattr__"}
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}


_CLASS_DICT, _NAME = type.__dict__["__dict__"].__get__, type.__dict__["__name__"].__get__
_BOOTSTRAP = threading.Thread._bootstrap.__code__  # a thread's first frame, under threading


def _first(frame):
    """The first frame of the stack ``frame`` is on."""
    while frame.f_back is not None:
        frame = frame.f_back
    return frame

# The code of the time limit's trace functions (the checker's, read at import)
_TIME_LIMITS = tuple(c for c in sandbox._tracer.__code__.co_consts if type(c) is types.CodeType)


#: The event the profile hook raises: the hook is ``sys.audit`` bound to this name, which hands
#: whoever reads it (``sys.getprofile()``) nothing of the judge's; the judge's audit hook, which
#: no code can reach, answers it (round 20: the hook was the watch's bound method, and its
#: ``__self__`` let the loop set ``foreign`` and walk gc to the report's writer).
PROFILE_EVENT = "overlap_course.judge.profile"


class Watch:
    """The submission's code while the check runs.  A replacement made and undone inside the
    check (a checker's helper swapped on the first call, put back on the last) leaves nothing
    for a fingerprint at the end to see; so the checker's world is compared each time code of
    the submission returns (or yields) to code that is not, through a profile hook (the checks'
    time limit uses the trace hook) -- quickly, as that time counts against the learner's limit
    (``judge_fingerprint.watcher``).  The submission's code: its cells, and every code object
    executed or made into a function while a frame of it is on the stack (``exec`` and
    ``function.__new__`` audit events: ``compile``, ``code.replace``, ``marshal``, an import of
    its own module, a ``dataclass`` it declares), whatever file name it claims, or in a
    thread of the submission's (round 17: ``Thread(target=exec, args=(code, ns))`` ran code
    that no frame of the submission's was under).  What the audit hook and the profile hook run
    (``foreign``, ``audited``, ``reaches_memory``, ``profile``) is made with the watch: closures
    over its own fields, with the types and builtins they use bound then, so that no name a cell
    can rebind (this module's, this class's attributes, a builtin) is looked up as they run
    (round 20: a cell's ``Watch.foreign = lambda self, code: False`` let it walk gc)."""

    def __init__(self) -> None:
        self.codes: dict[int, types.CodeType] = {}  # id -> code (kept: an id is not reused)
        self.main = _first(sys._getframe())  # the main thread's first frame
        self.modes = _TorchModes()  # before the submission's first line
        self.changed: list[str] = []
        self.hooks: list[str] = []
        self.tracing: list[str] = []  # trace hooks set or unset while the time limit's was set
        self.changes = None
        self.lost = False  # the hook, turned off by an exception raised in it
        self.called = False  # whether the check has called code of the submission's yet
        self.pending: set[int] = set()  # threads whose submission's code handed back to other
        # code than the checker's (compared as the checker's code runs next in them)
        # what was registered before the submission's first line (a finalizer its cells
        # register may fire during the check)
        self.finalizers = set(weakref.finalize._registry)
        self.callbacks = list(gc.callbacks)
        self.looking: set[int] = set()  # threads in reaches_memory: its own look is not asked
        fields = object.__getattribute__(self, "__dict__")  # no descriptor a cell sets
        fields.update(_sees(fields))
        fields.update(frame_rules(fields))
        fields.update(c_callbacks(fields))
        fields.update(runtime_handlers(fields))
        fields.update(_audits(fields))
        fields.update(_profiles(fields))
        self.hook = self.profile  # the hook set; ``sealed`` makes it one that hands out nothing

    def sealed(self):
        """The profile hook for a judge whose audit hook answers :data:`PROFILE_EVENT`."""
        self.hook = types.MethodType(sys.audit, PROFILE_EVENT)
        return self.hook

    def running(self, thread: threading.Thread) -> bool:
        """Whether the thread is running the submission's code now (a pool's worker)."""
        frame = sys._current_frames().get(thread.ident)
        while frame is not None:
            if self.foreign(frame.f_code):
                return True
            frame = frame.f_back
        return False

    def start(self, changes) -> None:
        """Watch from now on; ``changes()``: what changed since the judge began."""
        self.changes = changes
        self.weakrefs_begin()
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)

    def stop(self) -> None:
        """Stop watching.  A hook gone, or turned off while it was set (``audited``), is lost:
        CPython turns it off when a profile function raises, as the time limit's TimeUp does
        when it fires at the hook's entry (scheduled at the learner's last line, or sent by the
        watchdog into a ``time.sleep``); the verdict judges it (a pass is voided)."""
        self.lost = self.lost or sys.getprofile() is not self.hook
        sys.setprofile(None)
        threading.setprofile(None)
        self.weakrefs_end()
        self.changes = None


def _sees(fields: dict, ident=id, kind=type, is_a=isinstance, frame_at=sys._getframe,
          function=types.FunctionType, partial=functools.partial, methods=(
              types.MethodType, classmethod, staticmethod), class_dict=type.__dict__[
              "__dict__"].__get__, thread_type=threading.Thread, thread_run=threading.Thread.run,
          mro_of=type.__dict__["__mro__"].__get__, instance_dict=object.__getattribute__,
          bootstrap=_BOOTSTRAP, time_limits=_TIME_LIMITS, any_=any,
          function_code=types.FunctionType.__dict__["__code__"].__get__) -> dict:
    """``foreign(code)``: whether code is the submission's; ``untrusted(callable)``: whether what
    it runs is (or is a builtin); ``on_stack()``: whether a frame of the submission's is on this
    thread's stack, or (``threads``) this thread is the submission's."""
    codes, main, unwrap = fields["codes"], fields["main"], _MAX_UNWRAP

    def foreign(code) -> bool:
        return code.co_filename.startswith("<submission") or ident(code) in codes

    def code_of(f):
        """The code a callable runs, read through partials and bound methods; None for a
        builtin (or anything the judge cannot read without running it)."""
        for _ in range(unwrap):
            f = f.func if kind(f) is partial else f.__func__ if kind(f) in methods else f
        if kind(f) is function:
            return f.__code__
        call = class_dict(kind(f)).get("__call__")
        return call.__code__ if kind(call) is function else None

    def untrusted(f) -> bool:
        code = code_of(f)
        return code is None or foreign(code)

    def from_thread(thread) -> bool:
        """A thread's target (a Timer's function, a partial's, a bound method's, an overridden
        ``run``), or a callable with no code the judge can read (``Timer(1, setattr, ...)``)."""
        own = instance_dict(thread, "__dict__")  # no property of the submission's
        target = own.get("_target") or own.get("function")
        run = next((class_dict(c)["run"] for c in mro_of(kind(thread))
                    if "run" in class_dict(c)), None)
        target = run if target is None and run is not thread_run else target
        return target is not None and untrusted(target)

    def theirs(first) -> bool:
        """Whether the thread whose first frame is ``first`` is the submission's: one threading
        runs for a target of the submission's or a builtin (``exec``), or one that no Python
        thread starts (``_thread.start_new_thread(exec, ...)``) but the main thread."""
        if first.f_code is bootstrap:  # threading's first frame, which holds the thread
            thread = first.f_locals.get("self")
            return is_a(thread, thread_type) and from_thread(thread)
        return first is not main

    def on_stack(threads: bool = True) -> bool:
        frame = frame_at(2)
        while frame is not None:
            if foreign(frame.f_code):
                return True
            if frame.f_back is None and threads:
                return theirs(frame)
            frame = frame.f_back
        return False

    def is_time_limit(f) -> bool:
        """Whether ``f`` is a trace function of the checker's time limit."""
        return (kind(f) is function and any_(function_code(f) is c for c in time_limits)
                and not foreign(function_code(f)))
    return {"foreign": foreign, "untrusted": untrusted, "on_stack": on_stack,
            "from_thread": from_thread, "code_of": code_of, "is_time_limit": is_time_limit}


def _audits(fields: dict, ident=id, frame_at=sys._getframe, me_now=threading.get_ident, kind=type,
            code_type=types.CodeType, function=types.FunctionType, refuse=PermissionError,
            parts=("__code__", "__defaults__", "__kwdefaults__"), any_=any, listed=list,
            code_of=types.FunctionType.__dict__["__code__"].__get__,
            globals_of=types.FunctionType.__dict__["__globals__"].__get__, modules=sys.modules,
            space_of=types.ModuleType.__dict__["__dict__"].__get__, module=types.ModuleType,
            profile_now=sys.getprofile, trace_now=sys.gettrace,
            frame_attributes=frozenset(_FRAME_ATTRIBUTES),
            frame_events=frozenset(FRAME_EVENTS)) -> dict:
    """``audited(event, args)`` and ``reaches_memory(event, args)``, for the audit hook."""
    foreign, on_stack, codes, is_time_limit = (fields[k] for k in (
        "foreign", "on_stack", "codes", "is_time_limit"))
    looking = fields["looking"]

    def reaches_memory(event: str, args: tuple) -> bool:
        """Whether code of the submission's asks for the judge's memory (round 19: a cell found
        the report's writer with ``gc.get_objects``, and signed a verdict of its own with the
        secret in its closure).  ``gc``'s walks and other threads' frames: with a frame of the
        submission's anywhere on the stack, or in a thread of its own, as no right answer needs
        them and a library function it calls could hand them on.  A frame: to the submission's
        code itself only (the direct caller), as ``logging``, ``warnings``, ``traceback``,
        ``inspect`` and the checker read frames around the learner's code at its request."""
        if event == "object.__getattr__" and args[1] not in frame_attributes:
            return False  # at each read of a code object: quick
        me = me_now()
        if me in looking:  # the frames read below
            return False
        looking.add(me)
        try:
            if event in frame_events:
                return foreign(frame_at(2).f_code)  # 1: the audit hook
            return on_stack()
        finally:
            looking.discard(me)

    def audited(event: str, args: tuple) -> None:
        """Notes the code the submission makes; refuses anyone a module's function's code or
        defaults swapped in place, but the submission's own (round 19: the judge's
        ``_compare.__code__``, which no module's names show, nor putting them back undoes; a
        function made from a string, as ``namedtuple``'s ``__new__``, is not a module's)."""
        if event == "object.__setattr__" and args[1] in parts and kind(args[0]) is function and (
                not foreign(code_of(args[0]))) and any_(
                kind(m) is module and space_of(m) is globals_of(args[0])
                for m in listed(modules.values())):
            raise refuse(f"the judge does not let code change {args[1]} of a function that is "
                         f"not the submission's ({code_of(args[0]).co_name})")
        if event == "object.__setattr__" and args[1:2] != ("__code__",):
            return  # a class's attribute set: not code
        # a hook set in a thread of the submission's is judged by the frames that set it: the
        # watch's own, set by threading as a thread starts, is not the submission's change
        if not on_stack(threads=event not in ("sys.settrace", "sys.setprofile")):
            return
        if event in ("sys.settrace", "sys.setprofile"):
            if fields["changes"] is None:  # only while the check runs (cells may run checks)
                return
            if event == "sys.setprofile" and profile_now() is fields["hook"]:
                # also CPython turning this hook off, as it does when the time limit's TimeUp
                # fires inside it (round 15: a time-out read as "your code changed
                # sys.setprofile"): a lost hook, judged by the verdict
                fields["lost"] = True
            elif event == "sys.settrace" and is_time_limit(trace_now()):
                # also CPython turning the time limit's trace off, as it does when its TimeUp
                # fires inside the trace function (round 13: a slow check read as "your code
                # changed sys.settrace"): judged as a lost profile hook is, by the verdict
                fields["tracing"].append(event)
            else:
                fields["hooks"].append(event)
            return
        made = args[2] if event == "object.__setattr__" else args[0]  # f.__code__ = made
        stack = [made] if kind(made) is code_type else []
        while stack:  # the code and every function, class and comprehension defined in it
            code = stack.pop()
            codes[ident(code)] = code
            stack += [c for c in code.co_consts if kind(c) is code_type]
    return {"audited": audited, "reaches_memory": reaches_memory}


def _profiles(fields: dict, frame_type=types.FrameType, kind=type, listed=list,
              registry=weakref.finalize._registry, callbacks=gc.callbacks,
              starts=str.startswith, places=_CHECKER_DIRS, me_now=threading.get_ident,
              values=dict.values, ident=id, starters=_STARTERS) -> dict:
    """``profile(frame, event, arg)`` and ``deferred()``."""
    foreign, harm, code_of = fields["foreign"], fields["harm"], fields["code_of"]
    codes = fields["codes"]
    finalizers, before, entered = fields["finalizers"], fields["callbacks"], fields["modes"].entered
    pending, weakrefs, handlers = fields["pending"], fields["weakrefs"], fields["handlers"]
    traced, traced_call = fields["traced"], fields["traced_call"]

    def name(f) -> str:
        code = code_of(f)
        return code.co_name if code is not None else kind(f).__name__

    def deferred() -> list[str]:
        """Calls the submission left for trusted code to make later, when no code of its own
        returns: garbage-collector callbacks registered since the watch was made, and C code
        (``judge_harmless``) that a finalizer registered since calls (``weakref.finalize(x,
        setattr, ...)``; its Python code is compared as it runs), a weakref's callback or a
        class's ``__del__`` (``judge_weakrefs``: read first, as it notes the objects made since
        the last look); signal handlers and async generators' hooks (``judge_handlers``)."""
        found = weakrefs()
        for key, info in listed(registry.items()):
            args, keywords = info.args, info.kwargs  # (read without running code of theirs)
            given = [*(args if kind(args) is tuple else [args]), *(
                values(keywords) if kind(keywords) is dict else [keywords])]
            if key not in finalizers and (why := harm(info.func, "a finalizer calling", given)):
                found.append(why)
        return found + [f"a gc callback {name(c)}" for c in listed(callbacks)
                        if c not in before] + handlers()

    def profile(frame, event: str, arg) -> None:
        """At each hand-back, and as the check first calls code of the submission's: what the
        cells left is compared then, before that code runs, not only once it returns (round
        15: a cell's ``pool.reference = f``, which the check called, put back by ``f`` itself
        before any hand-back, after filling the references with a wrong loop's tokens).  A
        hand-back to other code than the checker's or the engine's (asyncio's event loop, at
        each step of a task) is compared as control next reaches theirs from code not the
        submission's (round 21: compared at each step, a right asyncio loop ran 20 times slower
        and failed the time limit).  A frame that is not one (``sys.audit`` of the event by the
        submission), or one raised while no check runs (by a cell), is not looked at."""
        if kind(frame) is not frame_type or fields["changes"] is None or fields["changed"]:
            return
        # Most events end here, quickly: over a million in one judged serial loop, where each
        # call of noted() or foreign() made the judge 0.1-0.2 s slower (a C call or return is
        # looked at for a thread starting only: noted() acts on one only while a start is
        # pending or for a call of a thread-start function)
        if starting or event == "c_call" and ident(arg) in starters:
            noted(frame, event, arg)  # a thread the submission starts (round 22)
        if event == "c_return" or event == "c_call" or event == "c_exception":
            return
        code = frame.f_code  # foreign(code), inlined (see _sees)
        theirs = starts(code.co_filename, "<submission") or ident(code) in codes
        if event == "call":
            if frame.f_trace is not None and (why := traced_call(frame)):
                fields["changed"] = [why]  # a frame traced since it last ran (a generator's)
                return
            if not pending and not theirs:
                return
            # the submission's code called by the checker's, its first call by
            # any; or, a hand-back pending, the checker's code
            caller = frame.f_back  # entered from other code
            if theirs and (caller is None or not foreign(caller.f_code)):
                pending.discard(me_now())  # the submission's code resumed: not handed back
                if not fields["called"] or caller is None or checkers(caller.f_code):
                    fields["called"] = True  # (round 23: a change made after the compare at
                    compare()  # its return, by a thread or a weakref callback, and put back
                    # by its next call, was seen by no compare)
            elif not theirs and me_now() in pending and checkers(frame.f_code) and (
                    caller is None or not foreign(caller.f_code) and not checkers(caller.f_code)):
                compare()
        elif event == "return" and theirs:
            caller = frame.f_back
            if caller is None or checkers(caller.f_code):
                compare()
            elif not foreign(caller.f_code):
                pending.add(me_now())
        elif event == "return" and me_now() in pending and not checkers(frame.f_code):
            caller = frame.f_back  # other code returning into the checker's
            if caller is not None and checkers(caller.f_code):
                compare()
            elif caller is not None and foreign(caller.f_code):
                pending.discard(me_now())  # back in the submission's code: not handed back

    def compare() -> None:
        pending.clear()  # the checker's world, all threads', is compared now
        fields["changed"] = (fields["changes"]() + deferred() + entered(True) + running()
                             + traced())

    def checkers(code) -> bool:
        """Whether ``code`` is the checker's or the engine's (and not the submission's)."""
        return starts(code.co_filename, places) and not foreign(code)
    threads = thread_starts(fields, checkers)
    noted, running, starting = threads["noted"], threads["running"], threads["starting"]
    weakrefs_begin, threads_begin = fields["cells_begin"], threads["cells_begin"]
    return {"profile": profile, "deferred": deferred, "threads_left": running,
            "cells_begin": lambda: (weakrefs_begin(), threads_begin())}


class _TorchModes:
    """The modes on torch's function-mode and dispatch-mode stacks of this thread: a mode runs
    its own code at every torch call, the checker's too (round 17: a ``TorchFunctionMode``
    entered and left so made ``Engine.read_outputs``'s ``.tolist()`` agree with a wrong loop);
    torch's C state, which no fingerprint reads.  Read with torch's functions as they were
    before the submission's first line."""

    def __init__(self) -> None:
        import torch
        from torch.utils import _device
        c = torch._C
        self.stacks = ((c._len_torch_function_stack, c._get_function_stack_at, "function"),
                       (c._len_torch_dispatch_stack, c._get_dispatch_stack_at, "dispatch"))
        self.device = _device.DeviceContext
        self.device_call = _CLASS_DICT(self.device).get("__torch_function__")
        self.before = {id(mode): mode for _, mode in self._on()}
        # the checker's own modes as they were (host_waits.HostReads, entered around the
        # answer's call: on the stack at its hand-back, which is not the submission's change)
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode
        classes = [TorchFunctionMode, TorchDispatchMode]
        for cls in classes:
            classes += type.__subclasses__(cls)
        self.own = {cls: _mode_calls(cls) for cls in classes
                    if str(_CLASS_DICT(cls).get("__module__", "")).startswith(_CHECKER)}

    def _on(self) -> list[tuple[str, object]]:
        return [(kind, at(i)) for length, at, kind in self.stacks for i in range(length())]

    def entered(self, checkers: bool = False) -> list[str]:
        """Modes entered since the judge began, but torch's device mode
        (``torch.set_default_device``: a right answer may set it) as torch defines it, and
        (``checkers``: at a hand-back, inside the check) the checker's own, as they were."""
        return [f"a torch {kind} mode ({_NAME(type(mode))}) left entered"
                for kind, mode in self._on() if id(mode) not in self.before
                and not (type(mode) is self.device and _CLASS_DICT(self.device).get(
                    "__torch_function__") is self.device_call)
                and not (checkers and self.own.get(type(mode), ()) == _mode_calls(type(mode)))]


def _mode_calls(cls) -> tuple:
    """What a mode class runs at torch's calls: its own methods, as objects (a change is seen)."""
    return tuple(_CLASS_DICT(cls).get(name) for name in ("__torch_function__",
                                                         "__torch_dispatch__", "__enter__",
                                                         "__exit__", "__init__"))


_CHECKER = ("overlap_course.", "toy_engine.")


def from_submission(thread: threading.Thread, watch: Watch) -> bool:
    """Whether a thread runs the submission's code (the watch's ``from_thread``)."""
    return watch.from_thread(thread)
