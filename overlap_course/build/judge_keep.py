"""The judge's own modules as they were before the submission's first line, put back after its
cells, at each hand-back of the check and after it (used by
:mod:`overlap_course.build.judge_process`).  The judge's code after the cells looks its
functions up by name in its modules' globals, which a cell can rebind with no audit event
(round 19: ``judge_process._verdict = lambda *a, **k: {"passed": True, ...}`` gave a wrong
loop full marks); the fingerprint sees such a change only if the genuine comparer runs.  And
the modules the cells or the check imported from elsewhere than the installed files, and the
caches the cells could have filled (``forget_caches``)."""

from __future__ import annotations

import gc
import os
import sys
import types
from pathlib import Path

from overlap_course.build.judge_fingerprint import _CACHE, _OURS, _part

#: Modules whose code decides the verdict after the cells (the judge's, and the standard
#: modules its comparer reads; not ``sys``, ``os`` or ``threading``, whose attributes the checker
#: and the watch set as they run), put back whole; and ``builtins``, whose names the cells may add
#: to (a helper), put back name by name.
_JUDGES = ("overlap_course.build.judge_process", "overlap_course.build.judge_fingerprint",
           "overlap_course.build.judge_watch", "overlap_course.build.judge_values",
           "overlap_course.build.judge_benign", "overlap_course.build.judge_cells",
           "overlap_course.build.judge_keep", "overlap_course.build.judge_threads",
           "overlap_course.build.landlock",
           "overlap_course.build.graded", "types", "functools", "operator", "gc", "weakref",
           "inspect")
_ADDED_TO = ("builtins",)


def keeper():
    """``restore()``: puts back every name of the modules above, and every attribute of the
    judge's classes (``Watch.foreign``), as they are now (before the cells), and returns those
    the submission had changed (``module.name``).  Made only of what is bound now, C functions
    and the builtin types' methods (no name a cell can rebind: not even a builtin's), and it runs
    none of the submission's code: what it takes out is held, not freed (no finalizer runs), and
    a module's keys are compared only once they are exact strings (no ``__eq__`` or ``__hash__``
    of the submission's; a class's always are)."""
    modules = [(name, module) for name in _JUDGES + _ADDED_TO
               if type(module := sys.modules.get(name)) is type(sys)]
    space_of = type(sys).__dict__["__dict__"].__get__
    class_space = type.__dict__["__dict__"].__get__
    items, clear, update, copy, get = dict.items, dict.clear, dict.update, dict.copy, dict.get
    listed, mapping, kind, text, join = list, dict, type, str, str.__add__
    put, take = type.__setattr__, type.__delattr__
    saved = [(name, space_of(module), copy(space_of(module)), name in _ADDED_TO)
             for name, module in modules]
    classes = [(join(join(name, "."), key), value, mapping(class_space(value)))
               for name, module in modules if name.startswith("overlap_course.")
               for key, value in listed(space_of(module).items())
               if type(value) is type and class_space(value).get("__module__") == name]
    held = []  # what the cells put there: kept alive until the judge ends
    hold, missing = held.append, object()
    pythons = ("__slotnames__", "__annotations__")  # what Python adds to a class as it is read

    def restore() -> list[str]:
        changed = []
        note = changed.append
        for name, space, was, adds in saved:
            now = listed(items(space))
            hold(now)
            clear(space)
            update(space, was)
            for key, value in now:
                if kind(key) is not text:
                    note(join(name, ". (a name that is not a string)"))
                elif get(was, key, missing) is value:
                    continue
                elif get(was, key, missing) is not missing:
                    note(join(join(name, "."), key))
                elif adds:
                    space[key] = value  # a name the cells added to builtins: theirs to use
                elif not key.startswith("__"):  # else Python's own (``__warningregistry__``)
                    note(join(join(name, "."), key))
        for name, cls, was in classes:
            now = mapping(class_space(cls))
            hold(now)
            for key, value in items(now):
                if get(was, key, missing) is value or key in pythons:
                    continue
                note(join(join(name, "."), key))
                take(cls, key) if get(was, key, missing) is missing else put(cls, key, was[key])
            for key, value in items(was):
                if get(now, key, missing) is missing:
                    note(join(join(name, "."), key))
                    put(cls, key, value)
        return changed
    return restore


def strange_modules(before: set[str], trusted: list[Path]) -> list[str]:
    """Modules first imported after the judge's fingerprint, under a name the checker could
    import (the course's, the toy's, the standard library's, torch's, numpy's), that do not
    come from the installed files: put in ``sys.modules`` by the submission, or loaded from a
    file it wrote.  A learner's own helper module under another name is not judged."""
    names = _OURS + ("torch", "numpy")
    strange = []
    for name in sorted(set(sys.modules) - before):
        top = name.partition(".")[0]
        if top not in names and top not in sys.stdlib_module_names:
            continue
        if not (_installed(sys.modules.get(name), trusted) or _registered(name, trusted)):
            strange.append(name)
    return strange


def _installed(module, trusted: list[Path]) -> bool:
    """Whether ``module`` was loaded from the installed files (or is built in)."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if origin in ("built-in", "frozen"):
        return True
    places = [origin] if origin else list(getattr(spec, "submodule_search_locations", None)
                                          or [])
    real = [Path(os.path.realpath(p)) for p in places if isinstance(p, str)]
    return bool(real) and all(any(r.is_relative_to(t) for t in trusted) for r in real)


def _registered(name: str, trusted: list[Path]) -> bool:
    """Whether ``name`` is a module with no ``__spec__`` that an installed module (not a
    package) holds as its attribute and put in ``sys.modules`` (pyexpat's C code registers
    ``pyexpat.errors`` and ``pyexpat.model`` so): no import from a file can reach that name."""
    parent_name, _, attr = name.rpartition(".")
    parent, module = sys.modules.get(parent_name), sys.modules.get(name)
    if (type(parent) is not types.ModuleType or type(module) is not types.ModuleType
            or not _installed(parent, trusted)):
        return False
    space = types.ModuleType.__dict__["__dict__"].__get__(parent)
    return "__path__" not in space and space.get(attr) is module


_CLEAR = _CACHE.cache_clear  # the type's own: a cache's attribute of that name may be replaced


def forget_caches(foreign) -> None:
    """Empties every ``functools`` cache but the submission's own (code ``foreign``), after its
    cells, before the check.  A cell could fill the checker's cache (``pool.reference()``) while
    a name the cached function reads was its own, and put the name back: the check compared a
    wrong answer with itself (round 13).  Emptied, each is filled again under the watch."""
    for cache in gc.get_objects():
        if type(cache) is _CACHE:
            wrapped = _part(cache, "__wrapped__")
            if not (type(wrapped) is types.FunctionType and foreign(_part(wrapped, "__code__"))):
                _CLEAR(cache)
