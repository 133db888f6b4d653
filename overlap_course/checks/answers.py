"""Reading a learner's answer: the one set of rules every check uses.

Where a number is asked, it may come as a plain int or float, a NumPy scalar, a 0-d or
one-element tensor or array, or a list/tuple holding one number: `[37]`, `tensor([37])`,
`torch.tensor(37)`, `np.int64(37)`, `Decimal(37)` and `37.0` all mean 37 (a whole number written
as a float is that number); :func:`real` says what counts as one, for every check.  Where a
list is asked (one value per request), a list, tuple, range, 1-d tensor/array or a finite
iterator (a generator, ``map(...)``) is a list; where a set is asked, any of those or a set, but
not one bare number (it cannot say whether it means "item 2" or "two items").  A pair is any
two-item list or tuple; a yes/no flag is a bool or 0/1.  Names (stages, buffers, steps, calls)
are read without case, spaces or quotes (:func:`name`); a round may be written as its owner,
``"StepState(round=3)"`` (:func:`round_number`); a share may be written as a percentage string,
``"79%"`` (:func:`share`).
Junk -- a number no question here can have (10**400, 1e300), nan, inf, a list far longer than any
answer -- raises :class:`Junk`, whose message is the verdict; and no message quotes more than a
short excerpt of an answer (:func:`show`).
"""

from __future__ import annotations

import collections.abc
import decimal
import itertools
import math
import numbers
import re
import reprlib

import numpy as np
import torch

from . import sandbox
from .verdict import Verdict, article, fails, unanswered

MAX_MESSAGE = 800  # characters: a check's message never grows with the answer
LIMIT = 1e12       # no answer in this course comes near it (slots, ms, rounds, ratios)
MAX_ITEMS = 4096   # the longest list any check asks for has a few dozen values
SHOW = 60          # characters of the learner's answer quoted in a message


class Junk(Exception):
    """An answer no question here can have: its message is the check's verdict."""


def show(x) -> str:
    """A short, safe repr of a learner's answer for a message (never raises, never long)."""
    try:
        return _shown(x)
    except (KeyboardInterrupt, sandbox.TimeUp):
        raise
    except BaseException:  # noqa: BLE001 -- a repr that fails (even with SystemExit) still gets one
        return article(type_name(x))


def _shown(x) -> str:
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        try:  # int's own value of an int subclass: its __int__ may lie or fail
            n = abs(int.__index__(x) if isinstance(x, int) else int(x))
        except Exception:  # noqa: BLE001 -- an integer whose own __int__ fails: shown by its repr
            n = 0
        if n >= 10**30:
            if n.bit_length() >= 14000:  # str() refuses more than 4300 digits
                return "a number with thousands of digits"
            return f"a {len(str(n))}-digit number"
    short = reprlib.Repr()
    short.maxstring = short.maxother = 40
    short.maxlist = short.maxtuple = short.maxset = short.maxfrozenset = short.maxdict = 6
    text = str.__str__(short.repr(x))
    return text if len(text) <= SHOW else text[:SHOW - 4] + " ..."


def cut(text: str, most: int) -> str:
    """``text`` in at most ``most`` characters, ended " ..." where it is cut: at the last space
    that fits, never inside a word.  A "word" longer than half of it is a value quoted whole (a
    path, a repr): cut where it must, so that the excerpt still shows some of it."""
    if len(text) <= most:
        return text
    end = text.rfind(" ", 0, most - 3)
    return (text[:end].rstrip() if end > most // 2 else text[:most - 4]) + " ..."


def type_name(x) -> str:
    """``x``'s class's name as the interpreter keeps it (a metaclass's ``__name__`` may raise)."""
    return _TYPE_NAME.__get__(type(x))


_TYPE_NAME = type.__dict__["__name__"]


def _far(x) -> Junk:
    return Junk(f"{show(x)} is far outside anything this question's answer can be (every answer here is "
                f"smaller than 10**12): write the value itself")


def _odd(x, what: str, err: BaseException) -> Junk:
    """The verdict on an answer whose own ``__int__``, ``__float__`` or ``__len__`` gives what no
    number or length can be (the interpreter refuses it in the check's frame, not the learner's)."""
    said = cut(str(err), SHOW)
    return Junk(f"{show(x)} cannot be read: its class, {type_name(x)}, breaks its {what} "
                f"({type_name(err)}: {said}): write a plain value, a number or a list of them")


def _learners(err: BaseException) -> bool:
    """Whether the learner's own code raised ``err`` (then it is theirs to hear about)."""
    tb = err.__traceback__
    while tb is not None:
        if sandbox._is_learners(tb.tb_frame.f_code.co_filename):
            return True
        tb = tb.tb_next
    return False


def _convert(kind, x):
    """``int(x)`` or ``float(x)`` (a plain int or float: never the learner's subclass), or Junk
    when the answer's own conversion returns the wrong type; an OverflowError is raised."""
    try:
        return kind(x)
    except (TypeError, ValueError) as err:
        if _learners(err):
            raise
        raise _odd(x, f"conversion to {kind.__name__}", err) from None


def length(x) -> int:
    """``len(x)``, or Junk where the answer's ``__len__`` gives no length (-1, 2**70, a str)."""
    try:
        return len(x)
    except (TypeError, ValueError, OverflowError) as err:
        if _learners(err):
            raise
        raise _odd(x, "length", err) from None


def scalar(x):
    """A 0-d or one-element tensor or NumPy array, or a NumPy scalar, as a Python number;
    anything else unchanged."""
    if _tensor(x) and x.numel() == 1:
        return read_tensor(x, x.item)
    if type(x).__module__ == "numpy" and getattr(x, "size", None) == 1 and hasattr(x, "item"):
        return read_tensor(x, x.item)
    return x


def _tensor(x) -> bool:
    """A torch tensor by its type: ``isinstance`` believes an object whose ``__class__`` claims
    to be one, and the check would then call tensor methods it has not got."""
    return issubclass(type(x), torch.Tensor)


def read_tensor(x, read):
    """``read()`` (``x.item``, ``x.tolist``, ...) of a tensor or array, or Junk where torch
    refuses (a meta tensor has no values, a sparse one no storage): never torch's error."""
    try:
        return read()
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
        if _learners(err):
            raise
        said = cut(str(err).split("\n")[0], SHOW)
        raise Junk(f"{show(x)} holds no values the check can read ({said}): a tensor on the meta "
                   f"device has none, and a sparse one must be made dense first (`.to_dense()`); "
                   f"write the numbers themselves") from None


def _one(x):
    """One number however it is wrapped: [x], (x,), tensor(x), tensor([x]), np.array([x])."""
    for _ in range(4):
        x = scalar(x)
        if isinstance(x, (list, tuple)) and length(x) == 1:
            x = x[0]
        else:
            break
    return x


def real(x) -> bool:
    """Whether ``x`` is one real number: a Python, NumPy or Fraction one, or a ``decimal.Decimal``
    (rounding half up to two decimals is written with one; ``numbers.Real`` leaves it out), not a
    bool.  The one test of every check that reads a number."""
    return not isinstance(x, bool) and isinstance(x, (numbers.Real, decimal.Decimal))


def _to_float(x) -> float:
    """``float(x)`` of a real number (:func:`real`); a Decimal's by Decimal's own methods (a
    subclass's may lie): nan for its NaNs (``float`` refuses a signaling one), and OverflowError,
    as for an int, where it is beyond a float's range (``float`` says inf)."""
    if not isinstance(x, decimal.Decimal):
        return _convert(float, x)
    if decimal.Decimal.is_nan(x):
        return math.nan
    value = decimal.Decimal.__float__(x)
    if math.isinf(value) and decimal.Decimal.is_finite(x):
        raise OverflowError(f"{show(x)} is beyond a float's range")
    return value


def number(x, whole: bool = False) -> int | float | None:
    """The answer as one number (an int if ``whole``), or None if it is not one.  Raises
    ``Junk`` for nan, inf and numbers no question here can have."""
    x = _one(x)
    if not real(x):
        return None
    if isinstance(x, numbers.Integral):
        value = _convert(int, x)  # a plain int: the answer's own __eq__ never judges it
        if abs(value) > LIMIT:
            raise _far(x)
        return value
    try:
        value = _to_float(x)
    except OverflowError:
        raise _far(x) from None
    if not math.isfinite(value):
        raise Junk(f"write a finite number, not {show(x)}")
    if abs(value) > LIMIT:
        raise _far(x)
    if whole:
        return int(value) if value.is_integer() else None
    return value


def whole(x) -> int | None:
    return number(x, whole=True)


def one_number(answer, stub: str, what: str, whole: bool = False) -> int | float | Verdict:
    """A question's answer read as one number, or the Verdict on why it is none: ``stub`` says
    what to set while the stub (None) is in place, ``what`` what the answer must be ("a slot is
    one whole number")."""
    if answer is None:
        return unanswered(stub)
    value = number(answer, whole)
    return fails("shape", f"{what}, not {show(answer)}") if value is None else value


def returned_real(x) -> float | None:
    """What a learner's *function* returned, as a float: a Python or NumPy real, or a 0-d
    tensor/array; None for anything else (a bool, a string, a list: a function that returns
    a list has a bug to name, not an answer to unwrap).  An int too large for a float is an
    infinity; a number whose own ``__float__`` gives no float raises Junk."""
    if real(x):
        try:
            return _to_float(x)
        except OverflowError:  # an int beyond 1.8e308 (copysign would convert it again)
            return math.inf if x > 0 else -math.inf
    if _tensor(x):  # a nested or sparse tensor's shape can raise: read_tensor
        if x.is_nested or read_tensor(x, x.dim) or x.dtype == torch.bool or x.is_complex():
            return None
        return read_tensor(x, x.__float__)
    if isinstance(x, np.ndarray):  # read as a plain array: a subclass's own shape may raise
        plain = np.ndarray.view(x, np.ndarray)
        return float(plain.item()) if plain.shape == () and plain.dtype.kind in "iuf" else None
    return None


def returned_whole(x) -> int | None:
    """What a learner's *function* returned, as a plain int: a Python or NumPy integer (not a
    bool), else None; an integer whose own ``__int__`` gives no int raises Junk."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        return None
    return _convert(int, x)


def _as_list(x):
    """A 1-d torch tensor or NumPy array as a plain list (``np.full(3, -1)`` is a natural
    answer); anything else unchanged, and an array of any other shape as None."""
    if _tensor(x) or type(x).__module__ == "numpy" and hasattr(x, "ndim"):
        if x.ndim != 1:
            return None
        if length(x) > MAX_ITEMS:
            raise Junk(f"that is {length(x)} values: this question's answer has a few")
        return read_tensor(x, x.tolist)
    return x


def _item(v, rounds: bool = False) -> int | None:
    """One item of a list or set as an int (a whole float counts; with ``rounds``, so does a
    round's owner, ``"StepState(round=3)"``), else None."""
    if rounds and _text(v):
        return round_number(v)
    v = scalar(v)
    return whole(v) if real(v) else None


def sequence(x, kinds=(list, tuple)) -> list | None:
    """A list, tuple, range, 1-d tensor/array or finite iterator (or another of ``kinds``) as a
    plain list, else None; Junk for one whose own ``__len__`` or ``__iter__`` gives what no length
    or iterator is.  An iterator counts as every reader of pairs (:func:`items`) counts it: a
    generator of the right values is right wherever a list or set is asked (blind round 19)."""
    if isinstance(x, range) and max(abs(x.start), abs(x.stop)) > LIMIT:
        raise _far(x.stop if abs(x.stop) > LIMIT else x.start)
    x = _as_list(x)
    once = issubclass(type(x), collections.abc.Iterator)  # no len(); read below, at most once
    if not (once or issubclass(type(x), (range, *kinds))):  # by type: see _tensor
        return None
    if not once and length(x) > MAX_ITEMS:
        raise Junk(f"that is {length(x)} values: this question's answer has a few")
    try:
        values = iter(x)
    except TypeError as err:  # iter() refuses an __iter__ that returned no iterator
        if _learners(err):
            raise
        raise _odd(x, "iteration", err) from None
    values = list(itertools.islice(values, MAX_ITEMS + 1))  # a plain list (no second __len__)
    if len(values) > MAX_ITEMS:
        raise Junk(f"that is more than {MAX_ITEMS} values: this question's answer has a few")
    return values


def int_list(x, rounds: bool = False, kinds=(list, tuple)) -> list[int] | None:
    """``x`` as a list of ints (a list, tuple, range or 1-d tensor/array of whole numbers, or
    another of ``kinds``), else None."""
    values = sequence(x, kinds)
    if values is None:
        return None
    values = [_item(v, rounds) for v in values]
    return None if None in values else values


def flag_list(x) -> list[int] | None:
    """``x`` as a list of 0/1 flags: booleans (Python, NumPy) count as 0 and 1, else :func:`int_list`."""
    values = sequence(x)
    if values and all(_is_bool(v) for v in values):
        return [int(bool(v)) for v in values]
    return None if values is None else int_list(values)


def _is_bool(v) -> bool:
    """A Python or NumPy bool (``np.bool_``, named ``bool`` in NumPy 2), not a learner's class
    of the same name."""
    kind = type(v)
    return isinstance(v, bool) or kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def bare_number(x) -> bool:
    """One number with no collection around it (5, ``np.int64(5)``, a 0-d tensor): where a set is
    asked, it cannot say whether it means an item or a count."""
    x = x if getattr(x, "ndim", 0) else scalar(x)
    return real(x)


_SET_VIEWS = (type({}.keys()), type({}.values()))  # ``d.keys()`` of round numbers is a set too


def int_set(x, rounds: bool = False) -> set[int] | None:
    """``x`` as a set of ints (a set, list, tuple, range, dict's keys or values, or 1-d
    tensor/array of whole numbers), else None -- also for one bare number, which does not say
    whether it means an item or a count."""
    values = int_list(x, rounds, kinds=(list, tuple, set, frozenset, *_SET_VIEWS))
    return None if values is None else set(values)


def bool_pair(x) -> tuple[bool, bool] | None:
    """``x`` as a pair of yes/no flags (Python or NumPy bools, one-element tensors, or 0 and 1),
    else None.  A set is never a pair: it has no order, so it cannot say which answer is which."""
    if isinstance(x, (dict, set, frozenset, str, bytes)):
        return None
    try:
        pair = list(itertools.islice(iter(x), 3))
    except TypeError:
        return None
    if len(pair) != 2:
        return None
    out = []
    for item in pair:
        item = scalar(item)
        if not _is_bool(item):
            item = whole(item) if real(item) else None
            if item not in (0, 1):
                return None
        out.append(bool(item))
    return out[0], out[1]


def name(x) -> str | None:
    """A name (a stage, buffer, step or call) as every check compares it: lower case, without
    surrounding spaces or quotes; None if ``x`` is not a string.  Read as a plain str: a
    subclass's own ``strip``, ``lower`` or ``__eq__`` never decide the answer."""
    return str.__str__(x).strip().strip("'\"`").strip().lower() if _text(x) else None


def _text(x) -> bool:
    """A str by its type (see :func:`_tensor`)."""
    return issubclass(type(x), str)


_OWNER = re.compile(r"\s*StepState\(\s*round\s*=\s*(-?\d{1,12})\s*\)\s*", re.IGNORECASE)


def round_number(x) -> int | None:
    """A round: a whole number, or the round's owner as the engine names it, ``"StepState(round=3)"``."""
    if _text(x):
        found = _OWNER.fullmatch(str.__str__(x))
        return int(found.group(1)) if found else None
    return whole(x)


def share(x) -> float | None:
    """A share: one number, or a percentage string, ``"79%"``, read as the fraction 0.79."""
    if not _text(x):
        return number(x)
    text = str.__str__(x).strip()
    try:
        value = float(text[:-1]) if text.endswith("%") and len(text) < 40 else None
    except ValueError:
        return None
    return None if value is None else number(value) / 100


def items(answer, shape: str, has: str = "a few") -> list | Verdict:
    """The items of a collection the learner gave, or the Verdict on why it is not one
    (``shape``: what the question asks for; ``has``: how many items its answer has).  An endless
    iterable stops after MAX_ITEMS: ``list`` would spin in C, out of reach of the time limit.  An
    iterator is refused: this check would use it up (round 39: a figure then drew nothing)."""
    try:
        given = iter(answer)
        out = None if given is answer else list(itertools.islice(given, MAX_ITEMS + 1))
    except TypeError:
        return fails("shape", f"write {shape}; got {show(answer)} ({article(type_name(answer))})")
    if out is None:
        return fails("shape", f"write {shape} as a list or a tuple: yours is "
                              f"{article(type_name(answer))}, an iterator, which its first reader "
                              f"(this check) uses up, leaving the cells below it nothing to read")
    if len(out) > MAX_ITEMS:
        many = (f"has {length(answer)} items" if isinstance(answer, (list, tuple)) else
                f"gave more than {MAX_ITEMS} items (endless?)")
        return fails("shape", f"write {shape}; yours {many}, and the answer has {has}")
    return out
