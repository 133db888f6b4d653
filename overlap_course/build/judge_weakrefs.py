"""The weakrefs and classes whose death runs C code, for the judge's profile hook
(:mod:`overlap_course.build.judge_watch`).  A weakref callback or a class's ``__del__`` that is
C code (``functools.partial(max, pairs, key=vars(pool).update)``, a builtin's bound method) runs
no code of the submission's when its referent dies, so no hand-back is compared: round 24's
loop hung one that rebound ``pool.compare`` on a local of its own (fired as its frame was
cleared, after the compare at its return) and one that put it back on the run's
``RequestWatch`` (fired as the check returned, before the judge's last compare): a wrong loop
passed.  So such a weakref, or a class whose own ``__del__`` is such (in its body, or set later:
``Cls.__del__ = partial(...)``, which Python 3.11 audits not), made or set by the cells or while
the check runs, is graded as a change at the next compare; ``WeakMethod``'s callback is read out
of its closure.  A callback of Python code is not: the submission's is compared as it is called,
and the standard library's (``WeakValueDictionary``, ``WeakSet``, ``weakref.finalize``, whose
functions the watch reads from its registry) is trusted, as are the C callbacks CPython hangs
itself (``_abc``'s caches, at each ``isinstance`` of an ABC; ``threading.local``).  ``__del__``
is the one method the runtime calls as an object dies (``tp_finalize``; 3.11 has no
``__release_buffer__``).

Weakrefs are registered nowhere, and the garbage collector lists every object of the process
(300,000 here, 30 ms): so each look lists only what was made since the last one, which it then
freezes (``gc.freeze``: ``gc.get_objects`` skips the permanent generation; a weakref's callback
is read-only).  A look whose mark, made after the last freeze, is gone finds that the
submission froze it too (hiding its weakrefs).  A class's ``__del__`` can be set at any time, so
each look reads it again of every class it knows (those alive as the watch is made, and those
each look found made since: 4,000 with torch, under a millisecond, in C loops).  Nothing is
collected as garbage in cycles while the check runs; ``end`` unfreezes it all."""

from __future__ import annotations

import gc
import itertools
import operator
import threading
import types
import weakref

#: The C callbacks CPython hangs itself, bound to a weakref: ``_abc``'s and ``threading.local``'s
_CPYTHONS = frozenset({"_destroy", "_localdummy_destroyed"})
#: ``WeakMethod``'s own callback, which calls the one it was handed (a cell of its closure)
_WEAK_METHOD_CB = next(c for c in weakref.WeakMethod.__new__.__code__.co_consts
                       if type(c) is types.CodeType and c.co_name == "_cb")
_IMMUTABLE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a class no code can set an attribute of
_MAX_UNWRAP = 20


class _Mark(weakref.ref):
    """A weakref made after each freeze (no callback; one of a subclass is never shared)."""

    __slots__ = ()


def c_callbacks(fields: dict, kind=type, ident=id, listed=list, mapped=map, any_=any,
                is_sub=issubclass, compress=itertools.compress, repeat=itertools.repeat,
                ref=weakref.ref, callback_of=weakref.ref.__dict__["__callback__"].__get__,
                builtin=types.BuiltinFunctionType, mark_type=_Mark, cpythons=_CPYTHONS,
                self_of=types.BuiltinFunctionType.__dict__["__self__"].__get__,
                name_of=types.BuiltinFunctionType.__dict__["__name__"].__get__,
                objects=gc.get_objects, referents=gc.get_referents, freeze=gc.freeze,
                unfreeze=gc.unfreeze,
                type_name=type.__dict__["__name__"].__get__, me_now=threading.get_ident) -> dict:
    """``weakrefs_begin()`` as the check begins, ``weakrefs()`` at each compare (what it found,
    named), ``weakrefs_end()`` as it ends; the weakrefs of C callbacks alive as the watch is
    made (before the submission's first line: torch's), and the classes' ``__del__`` then, are
    not the submission's.  Bound as the watch is made, like the hooks (no name a cell can rebind
    is looked up as they run)."""
    looking, code_of = fields["looking"], fields["code_of"]
    found: list[str] = []
    mark: list = []

    def unwatched(walk, *args) -> list:
        """``gc``'s walk (the audit hook lets the judge's own look through)."""
        me = me_now()
        looking.add(me)
        try:
            return walk(*args)
        finally:
            looking.discard(me)

    def young() -> list:
        """The objects not frozen."""
        return unwatched(objects)

    def in_c(callback) -> bool:
        return callback is not None and code_of(callback) is None and not (
            kind(callback) is builtin and kind(self_of(callback)) is ref
            and name_of(callback) in cpythons)

    def named(callback) -> str:
        return name_of(callback) if kind(callback) is builtin else type_name(kind(callback))

    called = _weak_method_calls()
    objs = young()
    refs = listed(compress(objs, mapped(is_sub, mapped(kind, objs), repeat(ref))))
    before = {ident(r): callback_of(r) for r in refs if in_c(called(callback_of(r)))}
    deaths = _class_deaths(objs, in_c, named, lambda *spaces: unwatched(referents, *spaces))
    del objs, refs

    def made() -> list[str]:
        objs = young()
        refs = listed(compress(objs, mapped(is_sub, mapped(kind, objs), repeat(ref))))
        if mark and not any_(r is mark[0] for r in refs):
            found.append("gc.freeze (it hides weakrefs from the judge)")
        found.extend(f"a weakref callback calling {named(called(callback_of(r)))}" for r in refs
                     if in_c(called(callback_of(r))) and before.get(ident(r)) is not
                     callback_of(r))
        found.extend(deaths(objs))
        found[:] = dict.fromkeys(found)  # once each (a WeakMethod hangs its callback twice)
        del objs, refs
        freeze()
        mark[:] = [mark_type(mark_type)]
        return listed(found)

    def begin() -> None:
        unfreeze()  # what the cells froze: looked at as well
        found.clear()
        mark.clear()
        made()

    return {"weakrefs": made, "weakrefs_begin": begin, "weakrefs_end": unfreeze}


def _weak_method_calls(kind=type, function=types.FunctionType, unwrap=_MAX_UNWRAP,
                       code_of=types.FunctionType.__dict__["__code__"].__get__,
                       closure_of=types.FunctionType.__dict__["__closure__"].__get__,
                       contents=types.CellType.__dict__["cell_contents"].__get__,
                       wm_cb=_WEAK_METHOD_CB, at=_WEAK_METHOD_CB.co_freevars.index("callback")):
    """``called(callback)``: what a weakref's callback calls, read through ``WeakMethod``'s own
    (``WeakMethod(m, partial(...))``: its callback is ``_cb``, which calls the partial)."""

    def called(callback):
        for _ in range(unwrap):
            if kind(callback) is not function or code_of(callback) is not wm_cb:
                return callback
            try:
                callback = contents(closure_of(callback)[at])
            except ValueError:  # an empty cell (a function made of _cb's code): calls nothing
                return None
        return callback
    return called


def _class_deaths(objs: list, in_c, named, dicts, kind=type, ident=id, listed=list, mapped=map,
                  is_sub=issubclass, compress=itertools.compress, repeat=itertools.repeat,
                  is_not=operator.is_not, count=itertools.count, own=type.__dict__[
                      "__dict__"].__get__, get=dict.get, key="__del__",
                  flags_of=type.__dict__["__flags__"].__get__, immutable=_IMMUTABLE,
                  type_name=type.__dict__["__name__"].__get__):
    """``deaths(young)``: the classes whose own ``__del__`` became C code since the last look
    (named), of those alive now (``objs``: their ``__del__`` now is not the submission's) and
    those ``young`` lists made since.  Every class a cell can set an attribute of is read at
    each look (``Cls.__del__ = partial(...)`` raises no audit event in Python 3.11), from its
    dict (``dicts(*mappingproxies)``: ``gc.get_referents``; three times quicker)."""
    classes: list = []
    spaces: list = []  # their own dicts
    dels: list = []
    known: set[int] = set()

    def learn(young: list) -> None:
        new = [c for c in compress(young, mapped(is_sub, mapped(kind, young), repeat(type)))
               if not flags_of(c) & immutable and ident(c) not in known]
        known.update(mapped(ident, new))
        classes.extend(new)
        spaces.extend(dicts(*mapped(own, new)))  # a mappingproxy's one referent: its dict
        dels.extend(repeat(None, len(new)))

    def deaths(young: list) -> list[str]:
        learn(young)
        now = listed(mapped(get, spaces, repeat(key)))
        changed = listed(compress(count(), mapped(is_not, now, dels)))
        dels[:] = now
        return [f"a class {type_name(classes[i])} whose __del__ is {named(now[i])}"
                for i in changed if in_c(now[i])]

    learn(objs)
    dels[:] = listed(mapped(get, spaces, repeat(key)))
    return deaths
