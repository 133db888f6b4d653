"""The weakrefs whose callback is C code, for the judge's profile hook
(:mod:`overlap_course.build.judge_watch`).  Such a callback (``functools.partial(max, pairs,
key=vars(pool).update)``, a builtin's bound method) runs no code of the submission's when its
referent dies, so no hand-back is compared: round 24's loop hung one that rebound
``pool.compare`` on a local of its own (fired as its frame was cleared, after the compare at its
return) and one that put it back on the run's ``RequestWatch`` (fired as the check returned,
before the judge's last compare): a wrong loop passed.  So such a weakref, made by the cells or
while the check runs, is graded as a change at the next compare.  A callback of Python code is
not: the submission's is compared as it is called, and the standard library's
(``WeakValueDictionary``, ``WeakSet``, ``weakref.finalize``) is trusted, as are the C callbacks
CPython hangs itself (``_abc``'s caches, at each ``isinstance`` of an ABC; ``threading.local``).

Weakrefs are registered nowhere, and the garbage collector lists every object of the process
(300,000 here, 30 ms): so each look lists only what was made since the last one, which it then
freezes (``gc.freeze``: ``gc.get_objects`` skips the permanent generation; a weakref's callback
is read-only).  A look whose mark, made after the last freeze, is gone finds that the
submission froze it too (hiding its weakrefs).  Nothing is collected as garbage in cycles while
the check runs; ``end`` unfreezes it all."""

from __future__ import annotations

import gc
import itertools
import threading
import types
import weakref

#: The C callbacks CPython hangs itself, bound to a weakref: ``_abc``'s and ``threading.local``'s
_CPYTHONS = frozenset({"_destroy", "_localdummy_destroyed"})


class _Mark(weakref.ref):
    """A weakref made after each freeze (no callback; one of a subclass is never shared)."""

    __slots__ = ()


def c_callbacks(fields: dict, kind=type, ident=id, listed=list, mapped=map, any_=any,
                is_sub=issubclass, compress=itertools.compress, repeat=itertools.repeat,
                ref=weakref.ref, callback_of=weakref.ref.__dict__["__callback__"].__get__,
                builtin=types.BuiltinFunctionType, mark_type=_Mark, cpythons=_CPYTHONS,
                self_of=types.BuiltinFunctionType.__dict__["__self__"].__get__,
                name_of=types.BuiltinFunctionType.__dict__["__name__"].__get__,
                objects=gc.get_objects, freeze=gc.freeze, unfreeze=gc.unfreeze,
                type_name=type.__dict__["__name__"].__get__, me_now=threading.get_ident) -> dict:
    """``weakrefs_begin()`` as the check begins, ``weakrefs()`` at each compare (what it found,
    named), ``weakrefs_end()`` as it ends; the weakrefs of C callbacks alive as the watch is
    made (before the submission's first line: torch's) are not the submission's.  Bound as the
    watch is made, like the hooks (no name a cell can rebind is looked up as they run)."""
    looking, code_of = fields["looking"], fields["code_of"]
    found: list[str] = []
    mark: list = []

    def weakrefs() -> list:
        """The weakrefs not frozen (the audit hook lets the judge's own look through)."""
        me = me_now()
        looking.add(me)
        try:
            young = objects()
        finally:
            looking.discard(me)
        return listed(compress(young, mapped(is_sub, mapped(kind, young), repeat(ref))))

    def in_c(callback) -> bool:
        return callback is not None and code_of(callback) is None and not (
            kind(callback) is builtin and kind(self_of(callback)) is ref
            and name_of(callback) in cpythons)

    def named(callback) -> str:
        return name_of(callback) if kind(callback) is builtin else type_name(kind(callback))

    before = {ident(r): callback_of(r) for r in weakrefs() if in_c(callback_of(r))}

    def made() -> list[str]:
        refs = weakrefs()
        if mark and not any_(r is mark[0] for r in refs):
            found.append("gc.freeze (it hides weakrefs from the judge)")
        found.extend(f"a weakref callback calling {named(callback_of(r))}" for r in refs
                     if in_c(callback_of(r)) and before.get(ident(r)) is not callback_of(r))
        freeze()
        mark[:] = [mark_type(mark_type)]
        return listed(found)

    def begin() -> None:
        unfreeze()  # what the cells froze: looked at as well
        found.clear()
        mark.clear()
        made()

    return {"weakrefs": made, "weakrefs_begin": begin, "weakrefs_end": unfreeze}
