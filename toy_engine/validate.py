"""Argument checks shared by ``EngineConfig`` and ``Engine.generate``: every error names the
argument, the value and what would be accepted (wrong types raise ``TypeError``, values ``ValueError``).
Integers go through ``operator.index`` (NumPy ints pass, 1.5 does not) and refuse bools; floats must be
finite (an infinite ``host_overhead_ms`` would spin forever, a NaN temperature silently run greedy).
"""

import collections.abc
import contextlib
import decimal
import functools
import gc
import inspect
import itertools
import math
import numbers
import operator
import types

SEED_LIMIT = 2**63  # seeds travel to the device as int64
SHOWN_CHARS = 80  # how much of a rejected value a message repeats


def shown(value) -> str:
    """``repr(value)``, cut to SHOWN_CHARS; its class if its repr raises (a refusal names it)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**SHOWN_CHARS:
        return f"{'-' if value < 0 else ''}an integer of {len(format(value, 'x')) * 4} bits"
    try:
        text = str.__str__(repr(value))
    except Exception:  # noqa: BLE001 - the value's own __repr__
        return f"<a {type.__dict__['__name__'].__get__(type(value))} whose repr raised>"
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 20]}... ({len(text)} characters)"


def check_int(name: str, value, minimum: int, maximum: int | None = None, why: str = "") -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}")
    try:
        number = int.__index__(operator.index(value))
    except Exception:  # noqa: BLE001 - a registered Integral or an int whose __index__ raises
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {shown(value)}") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bound}, got {shown(number)}{why}")
    return number


def check_rows(rows, requests: list, max_rows: int) -> list[int] | None:
    """prepare_inputs' ``rows``: None, or one device row per planned request, in the plan's
    order, each copied as a plain int (what is checked is what is sent)."""
    if rows is None:
        return None
    if type(rows) not in (list, tuple) or len(rows) != len(requests):
        raise (ValueError if type(rows) in (list, tuple) else TypeError)(
            f"prepare_inputs' rows must be a list of {len(requests)} rows, one per planned "
            f"request in the plan's order (or None: each request's own req.row), got "
            f"{type(rows).__name__} {shown(rows)}")
    return [check_int(f"prepare_inputs' rows[{b}]", row, 0, max_rows - 1,
                      f" (the device keeps {max_rows} rows)") for b, row in enumerate(rows)]


def check_float(name: str, value, minimum: float, maximum: float, unit: str = "") -> float:
    """``value`` as a plain float: a real number (an int, a float, a Fraction, a Decimal -- not
    a numbers.Real, but a number all the same -- or a NumPy scalar)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        # a complex number is a number, just not a real one
        real = not isinstance(value, bool) and isinstance(value, numbers.Complex)
        kind = "real number" if real else "number"
        raise TypeError(f"{name} must be a {kind}, got {type(value).__name__} {shown(value)}")
    try:
        number = float.__float__(float(value))
    except Exception:  # noqa: BLE001 - beyond 1.8e308, a signalling NaN, a Real's own __float__
        number = math.inf
    if not math.isfinite(number) or not minimum <= number <= maximum:
        raise ValueError(f"{name} must be a finite number in [{minimum}, {maximum}]{unit}, got {shown(value)}")
    return number


def check_seed(name: str, value) -> int:
    return check_int(name, value, 0, SEED_LIMIT - 1)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {shown(value)}")
    return value


def check_choice(name: str, value, choices: tuple) -> str:
    """``value`` as the plain str of one of ``choices`` (a str subclass's ``__eq__`` may lie)."""
    plain = str.__str__(value) if isinstance(value, str) else None
    if plain is None or plain not in choices:
        raise ValueError(f"unknown {name} {shown(value if plain is None else plain)}: use one of "
                         f"{choices}")
    return plain


def check_callable(name: str, value, allow_none: bool = True):
    if callable(value):
        why = never_runs(value)
        if why is not None:
            raise TypeError(f"{name} must be a plain function, but {why}")
        return value
    if allow_none and value is None:
        return value
    what = "a function or None" if allow_none else "a function"
    raise TypeError(f"{name} must be {what}, got {type(value).__name__} {shown(value)}")


def check_takes(name: str, function, params: list[str]) -> None:
    """Refuse, before the run, a ``function`` that cannot be called with the arguments the run
    will give it (``params``, by position): the call would otherwise fail rounds later with an
    error that names neither the plug-in nor the argument."""
    check_callable(name, function, allow_none=False)
    for wrapper in (False, True):  # the function, then what a decorator put around it (round 36)
        try:
            signature = inspect.signature(function, follow_wrapped=not wrapper)
        except Exception:  # noqa: BLE001 - a builtin without one, an object whose attributes raise
            continue  # the run will tell
        try:
            signature.bind(*params)
        except TypeError:
            call = f"{name.rpartition(' ')[2]}({', '.join(params)})"
            raise TypeError(f"{name}: the run calls it as {call}, and {_label(function)}{signature}"
                            f"{_WRAPPER if wrapper else ''} cannot take those {len(params)} "
                            f"argument(s)") from None


_WRAPPER = (" (the wrapper a decorator put around your function, named after it by "
            "functools.wraps)")


def body_checked(name: str, plugin):
    """``plugin`` called through a check of its answer, which the run ignores: a generator or
    coroutine says its body never ran (a lambda returning a generator expression; a decorator
    that hides a generator or an ``async def`` from never_runs), which only the call shows; a
    lazy iterator (``map``, ``filter``, itertools') that its work never happened."""
    def checked(*args):
        answer = plugin(*args)
        kind = type(answer)  # the exact types: a learner's class may claim another
        if kind in _NOT_RUN:
            if kind is not types.AsyncGeneratorType:
                answer.close()  # never started, so none of its body runs: no "never awaited"
            raise TypeError(f"{name}={_label(plugin)} returned {_NOT_RUN[kind]} instead of "
                            f"doing its work, so its body never ran (a function that returns "
                            f"a generator expression, or a decorator around a generator or an "
                            f"`async def`, does that): do the work in a plain function, with "
                            f"`return`, not `yield`")
        if issubclass(kind, collections.abc.Iterator) and _holds_calls(answer):
            raise TypeError(f"{name}={_label(plugin)} returned a lazy iterator ({_label(answer)}) "
                            f"that nothing iterates (the run ignores what it returns), so the "
                            f"calls it holds never happened: map, filter, zip and itertools call "
                            f"nothing until iterated; call the function in a `for` loop")
        return answer
    checked.label = f"{name}={plugin_label(plugin)}"  # what a message names (as the run's labels)
    checked.__wrapped__ = plugin  # what a refusal to send it names (round 38: its closure's)
    return checked


_NOT_RUN = {types.GeneratorType: "a generator", types.CoroutineType: "a coroutine",
            types.AsyncGeneratorType: "an async generator"}
# Iterators whose next() calls a function: a plug-in's answer the run ignores, their calls never
# happen.  Iterators of these modules' types only walk what they hold (round 39).
_CALLING = {map, filter, itertools.starmap, itertools.filterfalse, itertools.takewhile,
            itertools.dropwhile, itertools.accumulate, itertools.groupby, *_NOT_RUN}
_WALKED = ("builtins", "itertools", "collections", "_io")
MAX_WALKED = 1000  # objects looked at in one answer: past them, taken as holding calls


def _holds_calls(answer) -> bool:
    """Whether iterating ``answer`` would run code: a ``map``, ``filter`` or generator in it
    (``enumerate(map(f, xs))``), or an iterator of a class of the learner's, whose ``__next__``
    never ran.  ``iter(engine.completions)`` or ``zip(a, b)`` over lists calls nothing: a loop
    that did its work and returned one was refused, its finished run lost (round 39).  Walks
    what the iterators hold through the collector's view (C code: none of the learner's runs)."""
    seen, todo = set(), [answer]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        kind = type(item)
        if kind in _CALLING or len(seen) > MAX_WALKED:
            return True
        if issubclass(kind, collections.abc.Iterator):
            if type.__dict__["__module__"].__get__(kind) not in _WALKED:
                return True  # a class of the learner's: its __next__ is code that never ran
            todo.extend(gc.get_referents(item))
        elif kind is tuple:
            todo.extend(gc.get_referents(item))
    return False


def plugin_label(function) -> str:
    """A plug-in's name for a message: a partial or function a lab labelled (its ``label``)
    by that label, another as ``_label`` names it."""
    if type(function) in (functools.partial, types.FunctionType):
        label = vars(function).get("label")
        if type(label) is str:
            return label
    return _label(function)


def _label(function) -> str:
    """A function's name for a message; another callable's class (its own attributes may
    raise)."""
    if type(function) is types.MethodType:
        function = function.__func__
    if type(function) is types.FunctionType:
        return function.__name__
    return type.__dict__["__name__"].__get__(type(function))


# What a call of a function with these code flags makes instead of running its body.
_NEVER_RUNS = ((inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR,
                "an async function (`async def`): calling it only makes a coroutine that nothing "
                "here awaits, so its body would never run; define it with a plain `def`"),
               (inspect.CO_GENERATOR,
                "a generator function (it contains `yield`): calling it only makes a generator, "
                "so its body would never run; use `return`, not `yield`"))
#: Wrappers followed around a function: partials, methods, caches, decorators (a partial may
#: wrap itself, a decorator's __wrapped__ point back at it).
MAX_WRAPPERS = 100
_CACHE = type(functools.lru_cache()(lambda: None))  # functools.cache's and lru_cache's wrapper


def never_runs(value) -> str | None:
    """Why calling ``value`` would not run its body (it would answer a generator or coroutine,
    taken for a true answer or ignored), or None.  Follows partials, bound methods,
    staticmethods, functools' caches and decorators (``functools.wraps``' ``__wrapped__``)
    and a callable object's class's ``__call__``.  Reads types only: the attributes of a
    learner's object are its own code, which may raise."""
    through, looked_up_call = "", False
    for _ in range(MAX_WRAPPERS):
        kind = type(value)
        if kind is functools.partial:
            value = value.func
        elif kind is types.MethodType or kind is staticmethod:
            value = value.__func__
        elif kind is types.FunctionType or kind is _CACHE:
            if kind is types.FunctionType:
                code = value.__code__
                why = next((why for flags, why in _NEVER_RUNS if code.co_flags & flags), None)
                if why is not None:
                    return f"{code.co_qualname}{through} is {why}"
            wrapped = vars(value).get("__wrapped__", _NOTHING)  # a decorator's, a cache's
            if wrapped is _NOTHING:
                return None
            outer = "functools.lru_cache" if kind is _CACHE else value.__code__.co_qualname
            through, value = f" (wrapped by {outer})", wrapped
        elif not looked_up_call:  # an object: its class's own __call__
            looked_up_call = True
            value = inspect.getattr_static(kind, "__call__", None)
        else:  # a builtin, a class, a C type's call
            return None
    return None


_NOTHING = object()


def changed_at(old: list, ids: list) -> int | None:
    """The first index where ``ids`` no longer holds ``old``'s token id (None: one is a prefix
    of the other); equal values in other objects (numpy integers) are put back as ``old``'s.
    ``old`` holds plain ints, which never change in place: the same object is the same value
    (most rounds: checked at C speed), another object is compared by its value."""
    if all(map(operator.is_, old, ids)):
        return None
    i = next((i for i, (a, b) in enumerate(zip(old, ids)) if a is not b and token_value(b) != a),
             None)
    if i is None:
        n = min(len(old), len(ids))
        ids[:n] = old[:n]
    return i


def token_value(tok) -> int | None:
    """``tok``'s value as a plain int if it is an integer (an int or a numpy integer, not a
    bool), else None: a 0-d Tensor or array is no token id (a Tensor read from the output
    slot is a view of it, which later rounds overwrite)."""
    if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
        return None
    with contextlib.suppress(Exception):  # no __index__, or one that raises
        return operator.index(tok)
    return None


def bad_token(tok, vocab_size: int) -> bool:
    """Whether ``tok`` is no token id: an integer (not a bool) from 0 to ``vocab_size - 1``."""
    value = token_value(tok)
    return value is None or not 0 <= value < vocab_size


def check_committed(req, old: list, plugin: str, vocab: int) -> None:
    """Refuse what ``plugin`` (a per_request commit, a process_outputs) put in
    ``req.output_ids`` (``old`` before the call) other than token ids appended, or the
    newest removed (a stop string): the device's cache holds the tokens committed, the next
    round sends it the newest, and generate returns them.  What passes is stored as plain
    ints (what was checked is what is sent and returned).  ``output_ids`` is a list: the
    caller checked its type."""
    ids = req.output_ids
    new = ids[len(old):]
    values = [token_value(tok) for tok in new]
    bad = next((i for i, v in enumerate(values) if v is None or not 0 <= v < vocab), None)
    if bad is not None:
        tok = new[bad]
        fix = (f"append int(tok), not the {type(tok).__name__}, even 0-d (a Tensor read "
               f"from the output slot is a view of it, which later rounds overwrite),"
               if hasattr(type(tok), "shape") else "append the token id (tok)")
        raise TypeError(f"{plugin} stored {type(tok).__name__} {shown(tok)} at "
                        f"req.output_ids[{len(old) + bad}]: output_ids holds token ids, "
                        f"ints from 0 to {vocab - 1} (the vocabulary has {vocab}), and the "
                        f"next round sends them to the device; {fix} and add decode([tok]) "
                        f"to req.text")
    if any(type(tok) is not int for tok in new):  # numpy integers: as plain ints
        ids[len(old):] = values
    i = changed_at(old, ids)
    if i is not None:
        was, now = old[i], ids[i]
        raise (TypeError if bad_token(now, vocab) else ValueError)(
            f"{plugin} changed req.output_ids[{i}] from {shown(was)} to {type(now).__name__} "
            f"{shown(now)}: a committed token stays as it is (the device's cache holds it, "
            f"the next round sends the newest, generate returns them); append new tokens "
            f"only (a stop string may remove the newest from the end)")
