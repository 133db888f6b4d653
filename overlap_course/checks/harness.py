"""What makes a function a public check: a learner's answer or code can neither crash it nor
hang it, and its verdict is recorded in the learner's progress (``overlap_course/progress.py``),
exactly once.

* :func:`notebook_check` -- an answer that is junk gets its sentence (``answers.Junk``), and no
  message grows with the answer; so does an argument disguised as another class (its
  ``__class__`` says str or Tensor), which ``isinstance`` would believe.
* Both -- an answer whose own code raises while the check reads or runs it gets a verdict that
  says so (:func:`learner_raised`).
* :func:`exercise_check` -- the learner's code runs under the time limit on the shared engines
  (``pool``), put back as they were first: what an earlier cell had changed is named in the
  verdict; what the check's own run changed makes it fail (``sandbox``).
"""

from __future__ import annotations

import _signal  # signal's own functions: the handlers as they are set
import dataclasses
import functools
import inspect
import itertools
import signal
import sys

import torch

from overlap_course import progress
from toy_engine.interrupts import hold_sigint
from toy_engine.validate import never_runs

from . import answers, errors, other_engine, pool, sandbox, thread_errors
from .verdict import Verdict, article, fails, unanswered

_PRISTINE = sandbox.Pristine()
PLAIN = "a plain value (a number, a string, a list or set of them)"  # what a value answer is
_RUNNING: list[str] = []  # the exercise check running now (any thread): they share the engines


def notebook_check(check):
    @functools.wraps(check)
    def bounded(*args, **kwargs) -> Verdict:
        limit, stopped, stop, previous = sandbox.TIME_LIMIT_S, None, _not_started, sys.gettrace()
        modes = torch._C._len_torch_function_stack()
        if "name" in kwargs:  # the notebook's name for a second question, put in messages
            kwargs["name"] = plain_name(kwargs["name"])
        try:
            with hold_sigint():  # a Ctrl-C as the alarm is set waits till `stop` is known
                stop = sandbox.start_time_limit(limit, trace=False)
            verdict = _disguised(check, args, kwargs)  # a Verdict is false when it fails
            verdict = check(*args, **kwargs) if verdict is None else verdict
        except sandbox.TimeUp as exc:  # no call in here: a TimeUp due fires at a call's entry
            if stop is sandbox.no_limit:
                raise  # an outer check's limit (none of this check's own)
            stopped = exc
        except answers.Junk as junk:  # the checker's, or one the learner's code raised
            verdict = _junk(junk)
            if verdict is None:
                raise
        except KeyboardInterrupt:
            raise  # the person at the keyboard
        except BaseException as err:  # noqa: BLE001 - the learner's code raised it (else: raised)
            verdict = learner_raised(err)  # also GeneratorExit, SystemExit, a learner's own
            if verdict is None:
                raise
        finally:
            # inline, not a helper: a TimeUp due fires at a call's entry
            ended, ctrl_c = False, None
            while not ended:
                try:
                    sandbox.end_time_limit(stop)
                    ended = True
                except sandbox.TimeUp:
                    pass
                except KeyboardInterrupt as pressed:  # the limit is ended first, then raised
                    ctrl_c = pressed
            if sys.gettrace() is not previous:  # a limit that ran out traces the learner's code
                sys.settrace(previous)
            torch_modes_back_to(modes)
            if ctrl_c is not None:
                raise ctrl_c
        if stopped is not None:
            verdict = (_answer_time_up(stopped, limit) if sandbox.is_limits(stopped)
                       else _learners_time_up(stopped))
        return _cut(verdict)
    return progress.recorded(bounded)


def torch_modes_back_to(depth: int) -> None:
    """Leave as many torch function modes entered as before the check: a time-up or a Ctrl-C
    between a mode's push and its pop (``with torch.device("meta")``, the checker's
    ``HostReads``), or a learner's code that entered one and never left, would leave every later
    tensor of the kernel on the meta device (a test run on an overloaded machine: hundreds of
    later tests in one process failed on meta tensors)."""
    while torch._C._len_torch_function_stack() > depth:
        torch._C._pop_torch_function_stack()


def _given(check, args, kwargs) -> dict:
    """The check's arguments by parameter name; none where the call does not bind (the check's
    call then raises Python's own message, naming the argument)."""
    try:
        return inspect.signature(check).bind(*args, **kwargs).arguments
    except TypeError:
        return {}


def _disguised(check, args, kwargs) -> Verdict | None:
    """The verdict on an argument that passes for another class, or None: an object whose
    ``__class__`` names another class than its own, given or inside a list, tuple, set or dict.
    ``isinstance`` believes ``__class__``: a "str" or "tensor" in name only breaks the reading
    of every check that takes it for one."""
    for param, value in _given(check, args, kwargs).items():
        found = _passing_for(value)
        if found is not None:
            obj, claimed = found
            where = f"`{param}` is" if obj is value else f"`{param}` holds"
            said = (f"says it is {article(_NAME(claimed))}" if issubclass(type(claimed), type)
                    else f"is {answers.show(claimed)}")
            kind = article(answers.type_name(obj))
            return fails("junk", f"{where} {answers.show(obj)}, {kind} whose "
                                 f"`__class__` {said}: a check reads a value by what it is. Give "
                                 f"a plain value (a number, a string, a list or set of them)")
    return None


_NAME = type.__dict__["__name__"].__get__  # a class's name, whatever its metaclass says
# The containers a disguised item is looked for in, each read by its own base class's method
# (a subclass's __iter__ is the learner's code, read by the check itself if at all).
_CONTAINERS = ((dict, lambda d: itertools.chain.from_iterable(dict.items(d))),
               (list, list.__iter__), (tuple, tuple.__iter__), (set, set.__iter__),
               (frozenset, frozenset.__iter__))


def _passing_for(value) -> tuple | None:
    """(the object, the class it claims) of the first disguised object in ``value``, looking at
    most at MAX_ITEMS items (an endless or self-containing list ends the search there)."""
    todo, budget = [value], answers.MAX_ITEMS
    while todo:
        x = todo.pop()
        claimed = x.__class__  # a learner's property here raises in their frame: "raised"
        if claimed is not type(x):
            return x, claimed
        read = next((read for kind, read in _CONTAINERS if issubclass(type(x), kind)), None)
        if read is not None and budget > 0:
            more = list(itertools.islice(read(x), budget))
            budget -= len(more)
            todo.extend(more)
    return None


def exercise_check(*warm, calls: str | None = None, answer: str = PLAIN):
    """``warm`` runs before the time limit starts (engines started, references computed: the
    checker's own time).  ``calls``: how the check calls the function it is given first, as
    the exercise names it (``"commit(req, tokens, eos_id, decode)"``); anything that cannot be
    called is refused with it (:func:`not_a_function`), not judged as the function raising.
    ``answer``: what a value answer is, as an answer whose own code raised is told to give."""
    def wrap(check):
        @functools.wraps(check)
        def guarded(*args, **kwargs) -> Verdict:
            if _RUNNING:  # its heal would take the busy engines from under the outer run
                return _nested(check.__name__)
            try:  # appended inside: a Ctrl-C right after it must not leave the name behind
                _RUNNING.append(check.__name__)
                changed, was = _PRISTINE.restore()
                note = restored_note(changed, was, pool.heal())
                verdict = not_a_function(check, args, kwargs, calls)
                if verdict is None:
                    verdict = _never_runs(check, args, kwargs)
                if verdict is None:
                    for step in warm:
                        step()
                    ran = calls.partition("(")[0] if calls else None
                    verdict = _cut(_time_limited(check, args, kwargs, ran, answer))
            finally:
                _RUNNING.clear()  # only this check's name: a nested one returned above
            patched, _ = _PRISTINE.restore()
            if patched:
                names = ", ".join(f"`{n}`" for n in patched[:4])
                verdict = fails("edits_engine",
                                f"your code replaced or changed {names} while the check ran: the "
                                f"checkers share the toy with every check, so an answer may call "
                                f"its functions but not replace them (restored now). Try such "
                                f"experiments on an engine of your own, "
                                f"`Engine(EngineConfig(...))`")
            verdict.message += note
            return verdict
        return progress.recorded(guarded)
    return wrap


def not_a_function(check, args, kwargs, calls: str | None) -> Verdict | None:
    """The verdict on a check's first argument, given where a function belongs (``calls``:
    its call), that cannot be called; None otherwise, and when none was given (Python's own
    message for the call then names it).  The learner's code never ran: not "your ... raised";
    None, the stub, is "not answered yet"."""
    given = _given(check, args, kwargs)
    if calls is None or not given:
        return None
    value = next(iter(given.values()))
    if callable(value):
        return None
    name = calls.partition("(")[0]
    if value is None:  # the stub still in place: not answered, as each check said before
        return unanswered(f"{name} must be a function, {calls}; define it")
    return fails("shape", f"{name} must be a function, {calls}; got {answers.show(value)}")


def _never_runs(check, args, kwargs) -> Verdict | None:
    """The verdict on a function given to an exercise check that a call would not run (a
    generator or async function: the check would judge the generator or coroutine it makes
    as if it were the function's work), or None."""
    for param, value in _given(check, args, kwargs).items():
        why = never_runs(value)
        if why is not None:
            return fails("shape", f"your `{param}` must be a plain function, but {why}")
    return None


def restored_note(changed: list[str], was: dict | None = None, healed: list[str] = ()) -> str:
    """The sentence a verdict adds when an earlier cell had patched the toy: what was changed
    (with the values, where they are plain; ``healed``: what :func:`pool.heal` put back, each
    already in words), and that the check put the original back for good."""
    if not changed and not healed:
        return ""
    was = was or {}
    show = answers.show  # short and safe: the value found is any an earlier cell set

    def shown(n: str) -> str:
        if n not in was:
            return f"`{n}`"
        found, original = was[n]
        if isinstance(found, tuple):  # a list or dict changed in place
            return f"`{n}` (it held {len(found)} items, now {len(original)} again)"
        return f"`{n}` (it was {show(found)}, now {show(original)} again)"

    items = [*map(shown, changed), *healed]
    more = f" and {len(items) - 4} more" if len(items) > 4 else ""
    names = ", ".join(items[:4]) + more
    return (f" (Note: an earlier cell had replaced {names}; before it ran your code, this check "
            "put the "
            f"toy's original back, and it stays back for every later cell. Run that cell again to "
            f"repeat the experiment.)")


def _cut(verdict: Verdict) -> Verdict:
    """At most :data:`answers.MAX_MESSAGE` characters: a message never grows with the answer,
    and is never cut inside a word (:func:`answers.cut`)."""
    if len(verdict.message) <= answers.MAX_MESSAGE:
        return verdict
    return dataclasses.replace(verdict, message=answers.cut(verdict.message, answers.MAX_MESSAGE))


def _nested(name: str) -> Verdict:
    return fails("nested",
                 f"`{name}` was called while `{_RUNNING[0]}` was running your code (your code "
                 f"calls a check): a check cannot run inside another check's run, since both use "
                 f"the same shared engines. Call checks from a notebook cell, not from your answer")


def plain_name(x) -> str:
    """A ``name=`` as a check's message shows it: a plain, short str (a subclass's own
    ``__format__`` or ``__str__`` may raise), or the short repr of what is not a str."""
    if not isinstance(x, str):
        return answers.show(x)
    text = str.__str__(x)
    return text if len(text) <= answers.SHOW else text[:answers.SHOW - 4] + " ..."


def _answer_time_up(stopped: BaseException, limit: float) -> Verdict:
    return fails("time_limit",
                 f"your answer's own code was {stopped} (the check allows {limit:.0f} s): the "
                 f"checker stopped it there. An object whose `__len__`, `__iter__` or `__eq__` "
                 f"never returns, or an iterator that never ends, cannot be read: give a plain "
                 f"value (a number, a string, a list or set of them)")


def _learners_time_up(err: BaseException, ran: str | None = None) -> Verdict:
    """A TimeUp no time limit raised: the learner's own class (its ``__str__``, its
    ``seconds``), read as any exception of theirs."""
    verdict = learner_raised(err, ran)  # None where the innermost frame is not the learner's
    if verdict is not None:
        return verdict
    return fails("raised", f"your code raised {errors.quoted(err)}: raise an exception of your "
                           f"own, not a subclass of the checker's TimeUp")


def _handlers() -> dict:
    """Each signal's handler now (None: one Python cannot read or set)."""
    return {s: _signal.getsignal(s) for s in signal.valid_signals()}


def _handlers_put_back(handlers: dict) -> list[str]:
    """Puts back each signal handler a check's code changed (round 28: SIGINT left ignored in
    the kernel, its Interrupt gone); returns the signals' names.  Not by stand-ins for
    ``signal.signal``: the grading judge trusts a check only while the standard library's
    module attributes are the objects it found."""
    changed = [s for s, was in handlers.items()
               if was is not None and _signal.getsignal(s) is not was]
    for s in changed:
        _signal.signal(s, handlers[s])
    return [signal.Signals(s).name for s in changed]


def _signals_kept(noted: list[str]) -> Verdict:
    return fails("signals", f"your code set the handler of {', '.join(noted)}: a check's code "
                            f"leaves the process's signals alone (the checker's time limit and "
                            f"the kernel's Interrupt use them), so the checker put back the "
                            f"handler{'s' if len(noted) > 1 else ''} it found. Remove that call")


def _not_started() -> None:
    pass


def _time_limited(check, args, kwargs, ran: str | None = None, answer: str = "") -> Verdict:
    """``ran``: the name of the function answer the check runs (None: a value it reads, of
    the kind ``answer`` says)."""
    limit = sandbox.TIME_LIMIT_S
    previous, stopped, stop = sys.gettrace(), None, lambda: None
    modes, watch = torch._C._len_torch_function_stack(), other_engine.Watch()
    threads, handlers = thread_errors.ThreadErrors(), _handlers()
    try:
        threads.start()
        with hold_sigint():
            stop = sandbox.start_time_limit(limit, watched=watch.codes)
        verdict = check(*args, **kwargs)
    except (SystemExit, sandbox.TimeUp, other_engine.Stopped) as exc:  # no call in here
        stopped = exc
    except answers.Junk as junk:  # a value the learner's function returned (or its own Junk)
        verdict = _junk(junk, ran, answer)
        if verdict is None:
            raise
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - as in notebook_check
        verdict = learner_raised(err, ran, answer)
        if verdict is None:
            raise
    finally:
        ended, ctrl_c = False, None
        while not ended:
            try:
                sandbox.end_time_limit(stop)
                ended = True
            except sandbox.TimeUp:
                pass
            except KeyboardInterrupt as pressed:  # as in notebook_check
                ctrl_c = pressed
        sys.settrace(previous)
        torch_modes_back_to(modes)
        threads.end()
        noted = _handlers_put_back(handlers)
        if ctrl_c is not None:
            raise ctrl_c
    if watch.found is not None:  # first: what the other engine did next follows from it
        return other_engine.verdict(*watch.found)
    if noted:  # before what followed: the calls would have changed the check (round 28)
        return _signals_kept(noted)
    if isinstance(stopped, SystemExit):
        code = SystemExit.code.__get__(stopped)  # the slot itself: a subclass's property may raise
        return fails("raised",
                     f"your code called `exit()` / `sys.exit({answers.show(code)})` "
                     f"(SystemExit), which would end the notebook's kernel: the checker stopped it "
                     f"there. Return from your function instead")
    if stopped is not None and not sandbox.is_limits(stopped):
        return _learners_time_up(stopped, ran)
    if stopped is not None and threads.refusal is not None:  # it went on without its rounds
        return thread_errors.other_thread(threads.refusal, f"which kept going though no round "
                                          f"ran: it was {stopped}, when the checker stopped it")
    if stopped is not None:
        return fails("time_limit",
                     f"your code was {stopped} (the check allows {limit:.0f} s; the reference takes "
                     f"a few): the checker stopped it there. A loop that never ends usually keeps going "
                     f"after the work is done, or catches the errors that would stop it; the shared "
                     f"engines were recovered and the next check runs normally")
    return verdict


def _junk(junk: answers.Junk, ran: str | None = None, answer: str = "") -> Verdict | None:
    """The checker's Junk is its verdict on a value; the learner's is an error like any other."""
    if errors.checkers(junk, answers.Junk):
        return fails("junk", errors.said(junk))
    return learner_raised(junk, ran, answer)


def learner_raised(err: BaseException, ran: str | None = None,
                   answer: str = "") -> Verdict | None:
    """The verdict on an answer whose own code raised while the check read or ran it (an
    object whose ``__len__`` or ``__eq__`` raises, a function the check calls): the learner's
    code is on the traceback.  None when it is not: an error of the check's own is a bug, raised.
    A BaseException of another kind (a class of the learner's) counts only when raised in the
    learner's own frame: one raised by a signal handler the learner's code was interrupted by
    (pytest-timeout's) is not the learner's.  SystemExit and GeneratorExit count as Exceptions.
    ``ran``: the function answer the check ran (its name), so no advice to give a value;
    ``answer``: the value the check asks for (no check reads a function for a value: blind
    round 25 was told "or a function that returns one", then refused it)."""
    where, tb, innermost = None, err.__traceback__, None
    while tb is not None:
        innermost = tb.tb_frame.f_code.co_filename
        if sandbox._is_learners(innermost):
            where = tb.tb_frame.f_code.co_name  # the innermost of the learner's frames
        tb = tb.tb_next
    ordinary = isinstance(err, (Exception, SystemExit, GeneratorExit))
    if where is None or not ordinary and not sandbox._is_learners(innermost):
        return None
    said = errors.said(err, answers.SHOW)
    if ran is not None:  # a function answer the check ran: its error, as any other it raises
        inner = f" (in `{where}`)" if where != ran else ""
        return fails("raised", f"your `{ran}` raised {answers.type_name(err)}: {said}{inner}")
    return fails("raised", f"your answer's own code raised {answers.type_name(err)}: {said} (in "
                           f"`{where}`) while the check read it: give {answer or PLAIN}")
