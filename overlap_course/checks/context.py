"""A check's context: the arguments a notebook passes besides the learner's answer (the run's
timeline or engine, a round number, a block table).  :func:`given` reads them before the check
does, so a cell that passes something else gets a "setup" verdict naming the argument, what it
must be and what the notebook passes there -- never a traceback from deep inside the check, nor
a set of 10**20 kernels built before anything is compared.

While an answer is still its stub (None) the check runs as it is, and says "not answered yet":
that is what the learner has to do first.  If its context is wrong too, "not answered yet" is
said here, without running the check on a context it cannot read.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from toy_engine.runinfo import RunStats
from toy_engine.runinfo import TimelineMeta
from toy_engine.timeline import LANES, Span, Timeline

from .answers import MAX_ITEMS, Junk, real, scalar, sequence, show
from .verdict import fails, unanswered

BIG = 10**9  # no position, length, block or round of the course comes near it
_BAD = object()


@dataclass(frozen=True)
class Arg:
    """What one context argument must be (``must``, for the message), how it is read (``read``:
    the value as the check uses it, or ``_BAD``) and what the notebook passes there."""

    must: str
    read: Callable[[object], object]
    passes: str
    why: Callable[[object], str] = lambda x: ""  # what is wrong with a value read as _BAD


def _scalar(x):
    """``scalar(x)``, or _BAD for a tensor with no values to read (a meta or sparse one)."""
    try:
        return scalar(x)
    except Junk:
        return _BAD


def _whole(x, low: int, high: int):
    x = _scalar(x)
    if not real(x):
        return _BAD
    if isinstance(x, numbers.Integral):
        try:  # compared as a plain int: a subclass's own comparisons may lie about its size
            value = int.__index__(x if isinstance(x, int) else operator.index(x))
        except (TypeError, ValueError, OverflowError):
            return _BAD
        return value if low <= value <= high else _BAD
    try:
        value = float(x)
    except (OverflowError, ValueError):
        return _BAD
    return int(value) if value.is_integer() and low <= value <= high else _BAD


def _bound(n: int) -> str:
    return "10**9" if n == BIG else "-10**9" if n == -BIG else str(n)


def whole(low: int, high: int, passes: str) -> Arg:
    return Arg(f"a whole number from {_bound(low)} to {_bound(high)}",
               lambda x: _whole(x, low, high), passes)


def number(low: float, high: float, passes: str) -> Arg:
    def read(x):
        x = _scalar(x)
        if not real(x):
            return _BAD
        try:
            value = float(x)
        except (OverflowError, ValueError):
            return _BAD
        return value if math.isfinite(value) and low <= value <= high else _BAD
    return Arg(f"a finite number from {low:g} to {high:g}", read, passes)


def _wholes(x, low: int, high: int, min_len: int):
    try:  # a list, tuple, range or 1-d tensor or array, read as the answers are
        values = sequence(x)
    except Junk:  # too long, or its own __len__ or __iter__ gives no length or iterator
        return _BAD
    if values is None or not min_len <= len(values) <= MAX_ITEMS:
        return _BAD
    values = [_whole(v, low, high) for v in values]
    return _BAD if any(v is _BAD for v in values) else values


def wholes(low: int, high: int, passes: str, min_len: int = 1) -> Arg:
    return Arg(f"a list of {min_len} to {MAX_ITEMS} whole numbers from {_bound(low)} to "
               f"{_bound(high)}",
               lambda x: _wholes(x, low, high, min_len), passes)


def columns(keys: tuple[str, ...], low: int, high: int, passes: str, optional: bool = False) -> Arg:
    """A dict of lists of whole numbers, one list per key in ``keys``, all of one length."""
    def read(x):
        if x is None and optional:
            return None
        if not isinstance(x, Mapping) or any(k not in x for k in keys):
            return _BAD
        lists = [_wholes(x[k], low, high, 1) for k in keys]
        if any(v is _BAD for v in lists) or len({len(v) for v in lists}) != 1:
            return _BAD
        return dict(zip(keys, lists))
    what = ", ".join(f"{k!r}" for k in keys)
    return Arg(f"{'None or ' * optional}a dict whose {what} are lists of whole numbers from "
               f"{_bound(low)} to {_bound(high)}, one per request", read, passes)


def _finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond a float's range
        return False


def _spans_problem(x, where: str = "") -> str:
    """What an earlier cell did to a Timeline (``tl.spans = None``, a None appended, a field set
    through ``object.__setattr__``, a Span made by ``Span.__new__``), or "": the checks read every
    span's fields."""
    read = plain_timeline(x, where)
    return read if isinstance(read, str) else ""


TIME_LIMIT_MS = 1e12  # no span of a run starts or ends this far from its origin
_SPAN_TEXT = {"lane": LANES, "stage": None, "label": None}


def plain_timeline(x, where: str = ""):
    """A base-class Timeline rebuilt from ``x``'s fields, each read as a plain value and checked
    (a Timeline subclass's own methods and a Span's changed fields are never trusted), or a str
    saying what is wrong (for the setup verdict)."""
    if not isinstance(x, Timeline):
        return ""
    fields = object.__getattribute__(x, "__dict__")
    spans, origin, meta = (fields.get(k, _BAD) for k in ("spans", "origin_ns", "meta"))
    if type(spans) is not list:  # noqa: E721 - not a subclass, whose own iteration may lie
        found = show(spans) if spans is not _BAD else "gone"
        return f" (its `{where}.spans` is {found}, not a list of Spans)"
    if not isinstance(origin, int) or isinstance(origin, bool) or type(meta) is not TimelineMeta:
        return f" (its `{where}.origin_ns` or `{where}.meta` is not what a run leaves)"
    plain = Timeline(origin_ns=int.__index__(origin), meta=meta)
    for i, span in enumerate(spans):
        copy = _plain_span(span) if type(span) is Span else None  # noqa: E721
        if copy is None:
            return f" (its `{where}.spans[{i}]` is {show(span)}, not a Span as a run records it)"
        plain.spans.append(copy)
    return plain


def _plain_span(span: Span) -> Span | None:
    """A new Span from ``span``'s fields as plain values (its own checks run again), or None."""
    fields = object.__getattribute__(span, "__dict__")
    values = {}
    for name in ("lane", "stage", "round", "start_ms", "end_ms", "owner", "cpu_ms", "label",
                 "paced_ms"):
        value = fields.get(name, _BAD)
        if name in _SPAN_TEXT:
            value = str.__str__(value) if isinstance(value, str) else _BAD
        elif name in ("round", "owner"):
            value = None if value is None and name == "owner" else _whole(value, 0, BIG)
        elif value is not None or name in ("start_ms", "end_ms"):
            value = _time(value)
        if value is _BAD:
            return None
        values[name] = value
    try:
        return Span(**values)
    except (TypeError, ValueError):
        return None


def _time(x):
    """A span's time as a plain float within TIME_LIMIT_MS, or _BAD."""
    if not _finite(x):
        return _BAD
    if not isinstance(x, (int, float)):
        return _BAD
    value = float.__float__(x) if isinstance(x, float) else float(int.__index__(x))
    return value if abs(value) <= TIME_LIMIT_MS else _BAD


def _timeline(x):
    read = plain_timeline(x)
    return read if isinstance(read, Timeline) else _BAD


def _run(x):
    """An engine after a run: its timeline, and its stats' idle fraction (and wall time)."""
    stats = getattr(x, "stats", None)
    if _timeline(getattr(x, "timeline", None)) is _BAD:
        return _BAD
    idle = getattr(stats, "device_idle_fraction", None)
    if not _finite(idle) or not 0 <= idle <= 1 or not _finite(getattr(stats, "wall_ms", 0.0)):
        return _BAD
    return x


def _stats(x, optional: bool):
    if x is None and optional:
        return None
    names = ("mean_host_ms_per_round", "mean_device_ms_per_round", "tokens_per_s",
             "decode_device_idle_fraction")
    if not isinstance(x, RunStats) or not all(_finite(getattr(x, n)) for n in names):
        return _BAD
    return x if x.mean_host_ms_per_round > 0 and x.mean_device_ms_per_round > 0 else _BAD


def timeline(passes: str) -> Arg:
    return Arg("a Timeline (toy_engine.timeline.Timeline) with its list of Spans", _timeline,
               passes, _spans_problem)


def engine_run(passes: str) -> Arg:
    return Arg("an engine that has run (its .timeline a Timeline with its list of Spans, its "
               ".stats.device_idle_fraction a number from 0 to 1)", _run, passes,
               lambda x: _spans_problem(getattr(x, "timeline", None), ".timeline"))


def run_stats(passes: str, optional: bool = False) -> Arg:
    return Arg(f"{'None or ' * optional}a run's RunStats (engine.stats, after the run) with host "
               f"and device times above 0", lambda x: _stats(x, optional), passes)


# ------------------------------------------------------------------ fields of a run's engine

def count(x):
    """A whole number from 0 to 10**9 (a run's count, limit or number of drafts), or _BAD."""
    return _whole(x, 0, BIG)


def text(x):
    """A plain str (a mode, a finish reason, a completion's text), or _BAD."""
    return str.__str__(x) if issubclass(type(x), str) else _BAD


def text_or_none(x):
    return None if x is None else text(x)


def size(x):
    """The length of a list of whole numbers (a completion's token ids), or _BAD."""
    values = _wholes(x, 0, BIG, 0)
    return _BAD if values is _BAD else len(values)


def present(x):
    """Any value: the check itself asks what it is (``engine.constraint is not None``)."""
    return x


_GONE = object()


def run_fields(engine, *fields: tuple[str, Callable]) -> tuple | str:
    """The fields a check reads off the engine a notebook cell ran, as plain values: each field
    is (its path, ``"stats.discarded_outputs"``, or one per item, ``"completions[].text"``; its
    reader, which returns the value or _BAD).  Or, in words, the first field that is not what a
    run leaves there, for the check's setup verdict: an earlier cell may have changed any of
    them (``engine.completions = None``, ``engine.stats.discarded_outputs = nan``)."""
    out = []
    for path, read in fields:
        head, _, tail = path.partition("[].")
        value = _attributes(engine, head)
        if not tail:
            out.append(_BAD if value is _GONE else read(value))
            if out[-1] is _BAD:
                return _not_a_run(head, value)
            continue
        if type(value) not in (list, tuple) or len(value) > MAX_ITEMS:
            return _not_a_run(head, value)
        out.append([])
        for i, item in enumerate(value):
            field = _attributes(item, tail)
            out[-1].append(_BAD if field is _GONE else read(field))
            if out[-1][-1] is _BAD:
                return _not_a_run(f"{head}[{i}].{tail}", field)
    return tuple(out)


def _attributes(x, path: str):
    """``x.a.b`` for the path ``"a.b"``, or _GONE where an attribute is missing."""
    for name in path.split("."):
        x = getattr(x, name, _GONE)
        if x is _GONE:
            break
    return x


def _not_a_run(path: str, value) -> str:
    found = "missing" if value is _GONE else show(value)
    return f"its `engine.{path}` is {found}, not what a run leaves there"


def setup_verdict(param: str, value, must: str, passes: str):
    """The verdict on a context argument that is not what the check needs."""
    return fails("setup", f"this check was given `{param}` = {show(value)}, but `{param}` must be "
                          f"{must}; the notebook passes {passes} there. Run the notebook's cell as "
                          f"it is written")


def given(answers: int = 1, agree: Callable[[dict], str | None] | None = None, **specs: Arg):
    """Read a check's context arguments (``specs``: parameter name -> :class:`Arg`) before the
    check runs; pass it the values as read.  ``answers``: how many leading parameters are the
    learner's answers; ``agree``: what the arguments must say together (a problem, or None)."""
    def wrap(check):
        signature = inspect.signature(check)
        first = list(signature.parameters)[:answers]

        @functools.wraps(check)
        def guarded(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return check(*args, **kwargs)  # Python's own message names the argument
            bound.apply_defaults()
            stubs = [p for p in first if bound.arguments[p] is None]
            if stubs and all(spec.read(bound.arguments[param]) is not _BAD
                             for param, spec in specs.items()):
                return check(*args, **kwargs)  # the stub: "not answered yet" comes first
            if stubs:  # and a context the check cannot read: the stub is still the first thing
                return unanswered(f"`{stubs[0]}` is None: give it your answer")
            for param, spec in specs.items():
                value = spec.read(bound.arguments[param])
                if value is _BAD:
                    found = bound.arguments[param]
                    return setup_verdict(param, found, spec.must + spec.why(found), spec.passes)
                bound.arguments[param] = value
            problem = agree(bound.arguments) if agree is not None else None
            if problem is not None:
                return fails("setup", f"this check was given arguments that disagree: {problem}. "
                                      f"Run the notebook's cell as it is written")
            return check(*bound.args, **bound.kwargs)
        return guarded
    return wrap
