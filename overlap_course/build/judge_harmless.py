"""Which code the runtime calls later for the submission is a change (for the judge's watch:
:mod:`~overlap_course.build.judge_weakrefs`, and the finalizers of
:mod:`~overlap_course.build.judge_watch`).  Python code is not: the submission's is compared as
it runs (a call and a return through the profile hook), the standard library's is trusted.  C
code runs no frame of the submission's, so no compare sees what it does (round 24:
``partial(max, pairs, key=vars(pool).update)`` broke ``pool.compare`` after the compare at a
loop's return); but round 25's right loops hung ``LIVE.remove`` on a weakref and
``ROUNDS.clear`` on a finalizer.  So a C callable is harmless when all it can touch is the
submission's own plain data, and a change otherwise:

- a public method of a ``list``, ``set`` or ``deque`` (that type exactly) made while the cells
  ran: not one alive before them (the checker's, the judge's), nor one made since (the
  check's; or one at an address an object of the cells' had, as ids are reused), nor a dict (a
  module's or an object's attributes are one: ``vars(obj)`` makes it as it is asked, in 3.11);
- through ``functools.partial``\\ s whose arguments, as a finalizer's, are plain values
  (numbers, strings, bytes, None: nothing with code of its own, and no weakref, as two live
  ones compare their referents), handed only a weakref of the runtime's own types;
- one that compares or hashes the items (``remove``, ``discard``...) only while each item is a
  plain value or a weakref (a class's C ``__eq__`` would run): read at each look, as long as
  the check runs, even once the callback is gone (erring on the side of a change).

Also harmless, as a weakref's callback (handed the weakref alone, no data of the cell's): the
C callbacks libraries hang on their own objects, a pybind11 function of torch's (bound to its
function record: torch keeps a tensor's patient alive with one) and ctypes' ``DictRemover`` (a
static type of ``_ctypes``); a right loop below a cell that ran ``torch.profiler.profile()``
hangs both (round 24's rule failed it).  Not as a finalizer, which hands them what the cell
chose (round 26: ``finalize(x, torch._C._awaitable_wait, _awaitable(vars(pool).update, ...))``
called the checker's dict's ``update`` late).  Every other C callable (a builtin function, a
method-wrapper, a class, a method of anything else) is a change, named with why, but a
finalizer's ``print`` given plain values while ``sys.stdout`` and ``sys.stderr`` are the judge's
own, as they were, at each look (round 26's right loop: ``finalize(step, print, "freed")``; a
stream the cells made, even a ``TextIOWrapper`` around a buffer of theirs, calls what they chose
(round 27b), and a weakref's or ``__del__``'s is handed an object whose ``__name__`` or
``__repr__`` the cells chose)."""

from __future__ import annotations

import collections
import functools
import itertools
import sys
import types
import weakref

CONTAINERS = frozenset({list, set, collections.deque})
PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})
#: what a compared item may be: a dead weakref compares by identity, a WeakMethod's ``__eq__``
#: is the standard library's (round 26: a list of WeakMethods dropping themselves)
ITEMS = PLAIN | {weakref.ref, weakref.WeakMethod}
#: what the runtime may hand a callback: the weakref whose callback it is
HANDED = frozenset({weakref.ref, weakref.ProxyType, weakref.CallableProxyType,
                    weakref.WeakMethod})
#: the containers' methods that never compare nor hash an item
MOVES = frozenset({"append", "appendleft", "clear", "copy", "extend", "extendleft", "insert",
                   "pop", "popleft", "reverse", "rotate"})
#: the methods that only store what they are given (never call, compare nor iterate it): any
#: value may be handed to them (round 26: ``finalize(step, EVENTS.append, Event.FREED)``)
STORES = frozenset({"append", "appendleft"})
#: the C callbacks CPython hangs itself, bound to a weakref: ``_abc``'s and ``threading.local``'s
_CPYTHONS = frozenset({"_destroy", "_localdummy_destroyed"})
_MAX_UNWRAP = 20
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a static type is made by C code, never by a cell


def _pybind_records() -> frozenset:
    """The types of torch's pybind11 function records (what its functions are bound to)."""
    import torch  # the judge has imported it for the checker by now

    found = {type(f.__self__) for f in vars(torch._C).values()
             if type(f) is types.BuiltinFunctionType}
    return frozenset(t for t in found if t.__module__ == "pybind11_builtins")


_RECORDS = _pybind_records()


def _extension_own(f, kind=type, builtin=types.BuiltinFunctionType,
                   self_of=types.BuiltinFunctionType.__dict__["__self__"].__get__,
                   flags_of=type.__dict__["__flags__"].__get__,
                   module_of=type.__dict__["__module__"].__get__,
                   type_name=type.__dict__["__name__"].__get__, records=_RECORDS) -> bool:
    """Whether ``f`` is a library's own C callback: a pybind11 function of torch's, or ctypes'
    ``DictRemover`` (read with C descriptors only: ``f`` may be anything)."""
    if kind(f) is builtin:
        return kind(self_of(f)) in records
    t = kind(f)
    return (not flags_of(t) & _HEAP_TYPE and type_name(t) == "DictRemover"
            and module_of(t) == "_ctypes")
_GENERIC = "C code: it runs later, with no code of yours for the judge to compare"


def harm_rule(code_of, kind=type, ident=id, listed=list, mapped=map,
              compress=itertools.compress, partial=functools.partial,
              builtin=types.BuiltinFunctionType, module=types.ModuleType, ref=weakref.ref,
              self_of=types.BuiltinFunctionType.__dict__["__self__"].__get__,
              name_of=types.BuiltinFunctionType.__dict__["__name__"].__get__,
              type_name=type.__dict__["__name__"].__get__, containers=CONTAINERS, plain=PLAIN,
              items=ITEMS, handed=HANDED, moves=MOVES, stores=STORES, cpythons=_CPYTHONS,
              extension_own=_extension_own, records=_RECORDS, printer=print,
              system=sys, attr=getattr) -> dict:
    """``harm(f, what, args, weak)``: why ``f`` (``what``: "a finalizer calling" ...; called
    with ``args``, or with ``weak``, the weakref whose callback it is) is a change, or None.
    ``owned``: the class whose instance a ``__del__`` is handed (``LIVE.remove`` compares it
    with the items: its own ``__eq__`` runs).  ``before(objs)`` before the cells, ``began(objs)``
    as the check begins and ``seen(young)`` at each look (every object then; those made since
    the last); ``held()``: the compared containers' items, at each look.  Bound as the watch is
    made, like its hooks."""
    cells: set[int] = set()
    alive: list = []  # the containers alive before the cells, held until the check begins
    held: dict[int, tuple] = {}  # id -> (a container whose items a callback compares, what)
    printing: list[str] = []  # the print callbacks: each look reads the streams they write to
    # the judge's own streams, as the watch is made, and how they encode (a codec or an error
    # handler the cells register is code too)
    first = (system.stdout, system.stderr)
    encoded = [(attr(s, "encoding", None), attr(s, "errors", None)) for s in first]

    def containers_in(objs) -> list:
        return listed(compress(objs, mapped(containers.__contains__, mapped(kind, objs))))

    def before(objs) -> None:
        alive[:] = containers_in(objs)  # held: no address of theirs is the cells' too

    def began(objs) -> None:
        cells.clear()
        cells.update(mapped(ident, containers_in(objs)))
        cells.difference_update(mapped(ident, alive))
        alive.clear()
        held.clear()
        printing.clear()

    def seen(young) -> None:
        cells.difference_update(mapped(ident, containers_in(young)))  # an address reused

    def named(f) -> str:
        """``max``, ``list.remove``, ``partial of dict.update``, a function's or a type's name."""
        wrapped = ""
        for _ in range(_MAX_UNWRAP):
            if kind(f) is not partial:
                break
            wrapped, f = wrapped + "partial of ", f.func
        if kind(f) is builtin:
            owner = self_of(f)
            return wrapped + (name_of(f) if owner is None or kind(owner) is module
                              or kind(owner) in records  # torch's: bound to its record
                              else f"{type_name(kind(owner))}.{name_of(f)}")
        code = code_of(f)
        return wrapped + (code.co_name if code is not None else type_name(kind(f)))

    def odd(values, depth: int = 4) -> str | None:
        """The name of the first value's type that is not plain (a tuple is as its items are:
        round 26's ``finalize(step, S.discard, (n, slot))``)."""
        for v in values:
            if kind(v) is tuple and depth:
                found = odd(v, depth - 1)
            else:
                found = None if kind(v) in plain else type_name(kind(v))
            if found is not None:
                return found
        return None

    def items_of(container, what: str) -> str | None:
        other = next((found for v in listed(container) if (found := odd((v,)) if kind(
            v) is tuple else None if kind(v) in items else type_name(kind(v)))), None)
        return None if other is None else (
            f"{what} (C code comparing the items of a {type_name(kind(container))} that holds "
            f"{'an' if other[:1] in 'AEIOUaeiou' else 'a'} {other})")

    def streams_of(what: str) -> str | None:
        now = (system.stdout, system.stderr)
        if now[0] is first[0] and now[1] is first[1] and [
                (attr(s, "encoding", None), attr(s, "errors", None)) for s in now] == encoded:
            return None
        return (f"{what} (C code writing to a standard stream your cells replaced or "
                f"reconfigured: print is plain only to the judge's own, as they were)")

    def stray(given: list, weak, stored: bool, owned) -> str | None:
        """Why what a callback is handed is not plain: its values' type, the weakref's, or the
        type of the instance a ``__del__`` is handed (``owned``)."""
        bad = not stored and (odd(given) or owned is not None and type_name(owned)) or (
            weak is not None and kind(weak) not in handed and type_name(kind(weak)))
        return bad and (f"C code given {'an' if bad[:1] in 'AEIOUaeiou' else 'a'} {bad}: only "
                        f"numbers, strings, None and tuples of them are plain")

    def harm(f, what: str, args: tuple = (), weak=None, owned=None) -> str | None:
        if f is None or code_of(f) is not None or (kind(f) is builtin and kind(
                self_of(f)) is ref and name_of(f) in cpythons) or (
                weak is not None and extension_own(f)):
            return None  # Python code, or CPython's own, or a library's own
        what, given = f"{what} {named(f)}", listed(args)
        for _ in range(_MAX_UNWRAP):
            if kind(f) is not partial:
                break
            given += [*f.args, *f.keywords.values()]
            f = f.func
        if f is printer and weak is None and owned is None:  # a weakref's repr reads its
            if bad := stray(given, None, False, None):  # referent's __name__: cells' code
                return f"{what} ({bad})"
            printing.append(what)
            return streams_of(what)
        owner = self_of(f) if kind(f) is builtin else None
        if kind(owner) not in containers or name_of(f)[:1] == "_":
            return f"{what} ({_GENERIC})"
        if ident(owner) not in cells:
            return f"{what} (C code on a {type_name(kind(owner))} your cells did not make)"
        if bad := stray(given, weak, name_of(f) in stores, owned):
            return f"{what} ({bad})"
        if name_of(f) in moves:
            return None
        held[ident(owner)] = (owner, what)
        return items_of(owner, what)

    def compared() -> list[str]:
        found = [found for owner, what in listed(held.values())
                 if (found := items_of(owner, what)) is not None]
        return found + ([why] if printing and (why := streams_of(printing[0])) else [])

    def end() -> None:
        held.clear()
        printing.clear()
    return {"harm": harm, "harm_before": before, "harm_began": began, "harm_seen": seen,
            "harm_held": compared, "harm_end": end}
