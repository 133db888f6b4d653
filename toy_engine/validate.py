"""Argument checks shared by ``EngineConfig`` and ``Engine.generate``: every error names the
argument, the value and what would be accepted (wrong types raise ``TypeError``, values ``ValueError``).
Integers go through ``operator.index`` (NumPy ints pass, 1.5 does not) and refuse bools; floats must be
finite (an infinite ``host_overhead_ms`` would spin forever, a NaN temperature silently run greedy).
"""

import decimal
import functools
import inspect
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


# What a call of a function with these code flags makes instead of running its body.
_NEVER_RUNS = ((inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR,
                "an async function (`async def`): calling it only makes a coroutine that nothing "
                "here awaits, so its body would never run; define it with a plain `def`"),
               (inspect.CO_GENERATOR,
                "a generator function (it contains `yield`): calling it only makes a generator, "
                "so its body would never run; use `return`, not `yield`"))
MAX_WRAPPERS = 100  # partials and bound methods around a function (a partial may wrap itself)


def never_runs(value) -> str | None:
    """Why calling ``value`` would not run its body (it would answer a generator or coroutine,
    taken for a true answer or ignored), or None.  Reads types only: the attributes of a
    learner's object are its own code, which may raise."""
    for _ in range(MAX_WRAPPERS):
        if type(value) is functools.partial:
            value = value.func
        elif type(value) is types.MethodType:
            value = value.__func__
        else:
            break
    if type(value) is not types.FunctionType:  # an object: its class's own __call__
        value = inspect.getattr_static(type(value), "__call__", None)
    if type(value) is not types.FunctionType:  # a builtin, a class, a C type's call
        return None
    code = value.__code__
    return next((f"{code.co_qualname} is {why}" for flags, why in _NEVER_RUNS
                 if code.co_flags & flags), None)
