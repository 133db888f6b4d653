"""The weakrefs and classes whose death runs C code, for the judge's profile hook
(:mod:`overlap_course.build.judge_watch`).  A weakref callback or a class's ``__del__`` that is
C code (``functools.partial(max, pairs, key=vars(pool).update)``, a builtin's bound method) runs
no code of the submission's when its referent dies, so no hand-back is compared: round 24's
loop hung one that rebound ``pool.compare`` on a local of its own (fired as its frame was
cleared, after the compare at its return) and one that put it back on the run's
``RequestWatch`` (fired as the check returned, before the judge's last compare): a wrong loop
passed; round 25's did the same through ``weakref.proxy`` (a proxy's type is no
``weakref.ref``'s: listed too, its callback read as its one referent).  So such a weakref or
proxy, or a class whose own ``__del__`` is such (in its body, or set later:
``Cls.__del__ = partial(...)``, which Python 3.11 audits not), made or set by the cells or while
the check runs, is graded as a change at the next compare, named with why
(:mod:`~overlap_course.build.judge_harmless`: not a method of a list, set or deque the cells
made, as ``LIVE.remove``); ``WeakMethod``'s callback is read out of its closure.  A callback
of Python code is not: the submission's is compared as it is called, and the standard
library's (``WeakValueDictionary``, ``WeakSet``, ``weakref.finalize``, whose functions the
watch reads from its registry) is trusted (but not bound to an object, nor another class's
set as a ``__del__``: :func:`_bound_rule`), as are the C callbacks CPython hangs itself
(``_abc``'s caches, at each ``isinstance`` of an ABC; ``threading.local``).  ``__del__`` is the
one method the runtime calls as an object dies (``tp_finalize``; 3.11 has no
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

import functools
import gc
import itertools
import operator
import threading
import types
import weakref

from overlap_course.build.judge_harmless import harm_rule

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
                proxies=frozenset({weakref.ProxyType, weakref.CallableProxyType}),
                mark_type=_Mark, objects=gc.get_objects, referents=gc.get_referents,
                freeze=gc.freeze, unfreeze=gc.unfreeze, me_now=threading.get_ident) -> dict:
    """``weakrefs_begin()`` as the check begins, ``weakrefs()`` at each compare (what it found,
    named), ``weakrefs_end()`` as it ends, and ``cells_begin()`` before the cells (what is
    alive then is not theirs: :func:`~overlap_course.build.judge_harmless.harm_rule`); the
    weakrefs of C callbacks alive as the watch is made (before the submission's first line:
    torch's), and the classes' ``__del__`` then, are not the submission's.  Bound as the watch
    is made, like the hooks (no name a cell can rebind is looked up as they run)."""
    looking = fields["looking"]
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

    def weakrefs_in(objs: list) -> list:
        """Weakrefs and proxies (a proxy's type is no ``weakref.ref``'s)."""
        types_of = listed(mapped(kind, objs))
        return [*compress(objs, mapped(is_sub, types_of, repeat(ref))),
                *compress(objs, mapped(proxies.__contains__, types_of))]

    def callback(r):
        """A weakref's callback; a proxy's is its one referent (``__callback__`` refuses it)."""
        return callback_of(r) if is_sub(kind(r), ref) else next(iter(unwatched(referents, r)),
                                                                None)

    rules = harm_rule(fields["code_of"])
    harm, called, objs = _bound_rule(rules["harm"], fields), _weak_method_calls(), young()
    rules["harm_before"](objs)
    before = {ident(r): callback(r) for r in weakrefs_in(objs)
              if harm(called(callback(r)), "", weak=r) is not None}
    deaths = _class_deaths(objs, harm, lambda *spaces: unwatched(referents, *spaces))
    del objs

    def made(first: bool = False) -> list[str]:
        objs = young()
        rules["harm_began" if first else "harm_seen"](objs)  # (an id reused: not the cells')
        refs = weakrefs_in(objs)
        if mark and not any_(r is mark[0] for r in refs):
            found.append("gc.freeze (it hides weakrefs from the judge)")
        found.extend(why for r in refs if before.get(ident(r)) is not callback(r) and (
            why := harm(called(callback(r)), "a weakref callback calling", weak=r)))
        found.extend(deaths(objs) + rules["harm_held"]())
        found[:] = dict.fromkeys(found)  # once each (a WeakMethod hangs its callback twice)
        del objs, refs
        freeze()
        mark[:] = [mark_type(mark_type)]
        return listed(found)

    def begin() -> None:
        unfreeze()  # what the cells froze: looked at as well
        found.clear()
        mark.clear()
        made(first=True)

    def end() -> None:
        unfreeze()
        rules["harm_end"]()
    return {"weakrefs": made, "weakrefs_begin": begin, "weakrefs_end": end, "harm": harm,
            "cells_begin": lambda: rules["harm_before"](young())}


_BOUND = ("the library's Python code bound to an object of your cells': it calls what that "
          "object holds, C code too, with no code of yours for the judge to compare. If your "
          "answer is right, end that object before the check runs -- a `with` block, or its "
          "`close()` or `cleanup()` -- so that nothing of it is left to run inside the checker")


def _bound_rule(harm, fields: dict, kind=type, partial=functools.partial,
                method=types.MethodType, function=types.FunctionType,
                func_of=types.MethodType.__dict__["__func__"].__get__,
                self_of=types.MethodType.__dict__["__self__"].__get__,
                module_of=types.FunctionType.__dict__["__module__"].__get__,
                type_module=type.__dict__["__module__"].__get__,
                globals_of=types.FunctionType.__dict__["__globals__"].__get__,
                type_name=type.__dict__["__qualname__"].__get__, is_sub=issubclass,
                own=type.__dict__["__dict__"].__get__, get=dict.get,
                own_get=types.MappingProxyType.get, values=dict.values, any_=any):
    """``harm`` (:func:`~overlap_course.build.judge_harmless.harm_rule`'s) that also grades as
    a change what runs Python code not the submission's on an object of the cells' (round 28:
    a weakref callback ``q.put``, ``queue.Queue``'s, of a queue whose ``not_empty.notify`` was
    a partial of ``setattr``): a method of the library's bound to any object (the runtime's
    calls make none the checker's), and a ``__del__`` of the library's on a class that is not the
    one whose body defined it (``__del__ = queue.Queue.put``): that class is found by identity,
    through the function's own module namespace and qualname (round 28: a cells' class that
    named itself ``queue.Queue`` passed a test of names)."""
    foreign, code_of = fields["foreign"], fields["code_of"]

    def theirs(code) -> bool:
        return code is None or foreign(code)

    def owner(f, code, owned):
        """The class whose body defined ``f``, read from its module's namespace, or None; in a
        function's body (``<locals>``: no namespace holds it), ``owned`` if named as that class."""
        names = code.co_qualname.split(".")[:-1]
        if "<locals>" in names:
            module, named = module_of(f), type_module(owned)  # strings alone: no __eq__ of theirs
            same = kind(module) is kind(named) is str and module == named
            return owned if same and ".".join(names) == type_name(owned) else None
        found = get(globals_of(f), names[0]) if names else None
        for name in names[1:]:
            found = own_get(own(found), name) if is_sub(kind(found), type) else None
        if found is not owned and len(names) == 1 and code.co_name == "__del__" and any_(
                value is owned for value in values(globals_of(f))):
            return owned  # under another name there (asyncio's _PyFuture, named Future)
        return found

    def graded(f, what: str, args: tuple = (), weak=None, owned=None) -> str | None:
        if (why := harm(f, what, args, weak=weak, owned=owned)) is not None:
            return why
        if owned is not None and not theirs(code := code_of(f)) and (
                kind(f) is not function or owner(f, code, owned) is not owned):
            return f"{what} {code.co_qualname} ({_BOUND})"
        for _ in range(_MAX_UNWRAP):
            if kind(f) is partial:
                f = f.func
            elif kind(f) is method and theirs(code_of(func_of(f))):
                f = func_of(f)
            elif kind(f) is method:
                return (f"{what} {code_of(func_of(f)).co_qualname} of a "
                        f"{type_name(kind(self_of(f)))} ({_BOUND})")
            else:
                return None
        return None
    return graded


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


def _class_deaths(objs: list, harm, dicts, kind=type, ident=id, listed=list, mapped=map,
                  is_sub=issubclass, compress=itertools.compress, repeat=itertools.repeat,
                  is_not=operator.is_not, count=itertools.count, own=type.__dict__[
                      "__dict__"].__get__, get=dict.get, key="__del__",
                  flags_of=type.__dict__["__flags__"].__get__, immutable=_IMMUTABLE,
                  type_name=type.__dict__["__name__"].__get__,
                  wrapper=types.WrapperDescriptorType,
                  objclass_of=types.WrapperDescriptorType.__dict__["__objclass__"].__get__):
    """``deaths(young)``: the classes whose own ``__del__`` became C code since the last look
    (named), of those alive now (``objs``: their ``__del__`` now is not the submission's) and
    those ``young`` lists made since.  Every class a cell can set an attribute of is read at
    each look (``Cls.__del__ = partial(...)`` raises no audit event in Python 3.11), from its
    dict (``dicts(*mappingproxies)``: ``gc.get_referents``; three times quicker).  A C type's
    own finalizer (a slot wrapper of that very class: ``os.scandir``'s iterator) is not one:
    a class the cells make holds a function there, and one copied from another class wraps
    that class (a full run of the tests, whose earlier ones had frozen the type, named it)."""
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
        return [why for i in changed
                if not (kind(now[i]) is wrapper and objclass_of(now[i]) is classes[i])
                and (why := harm(now[i], f"a class {type_name(classes[i])} whose __del__ is",
                                 owned=classes[i]))]

    learn(objs)
    dels[:] = listed(mapped(get, spaces, repeat(key)))
    return deaths
