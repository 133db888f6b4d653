"""What the checker runs on, as the judge (:mod:`overlap_course.build.judge_process`) reads it:
a fingerprint by identity taken before the submission's first line, and a quick way to tell,
each time the submission's code hands control back to the checker, that nothing in it changed."""

from __future__ import annotations

import builtins
import functools
import operator
import sys
import types

from overlap_course.build.judge_benign import REDUCERS, made_by_reading, sent

# Modules whose state the checker depends on: ours whole; the functions of the others it calls;
# and the classes of ours, of all the standard library (``inspect.Signature.bind`` runs at
# every check), ``torch.Tensor`` and ``numpy.vectorize`` (a code answer may be one: its Python
# methods, and the functions of their module, call the learner's function).  Not every
# standard function: some are rebound as they are first used (``multiprocessing.spawn``'s,
# ``logging._loggerClass``).
_OURS = ("overlap_course", "toy_engine")
_THEIRS = ("builtins", "torch", "json", "os", "io", "math", "operator", "functools", "threading",
           "dataclasses", "copy", "collections", "itertools", "types", "sys", "numpy",
           "inspect", "numpy.lib._function_base_impl", "cloudpickle", "cloudpickle.cloudpickle",
           "multiprocessing.util", "multiprocessing.forkserver", "multiprocessing.connection",
           "multiprocessing.popen_forkserver", "multiprocessing.reduction")
# (cloudpickle: what the device process gets goes through it; multiprocessing's: how it starts)
_THEIR_CLASSES = ("Tensor", "vectorize", "Pickler")


def _fingerprint() -> dict[str, tuple]:
    """What the checker reads, by identity: every module of the course and the toy (each name
    in it, each class's attributes), and the functions of the modules it calls; and the course's
    data by value (:class:`_Reader`).  Read without running any code of the objects read (no
    ``getattr``, ``isinstance`` or ``vars`` that a ``__getattr__``, a ``__class__`` or a
    metaclass of the submission's could answer)."""
    marks, seen = {}, set()
    read = _Reader(_our_classes())
    for name, module, ours, theirs, std in _watched(marks):
        for attr, value in list(_MODULE_DICT(module).items()):
            # a module a module of theirs holds too: round 43 gave popen_forkserver a copy of
            # multiprocessing.spawn whose preparation data ran its code in the device processes
            if ours or (theirs and (callable(value) or type(value) is types.ModuleType)):
                marks[f"{name}.{attr}"] = _mark(value) + read.contents(name, attr, value)
            if (issubclass(type(value), type) and (ours or std or attr in _THEIR_CLASSES)
                    and (ours or id(value) not in seen)):
                seen.add(id(value))  # a class the standard library imports again: once
                marks[f"{name}.{attr}.__dict__"] = tuple(sorted(
                    (str.__str__(key), _mark(item)) for key, item in _CLASS_DICT(value).items()
                    if not made_by_reading(key, item)))
                # re-based (``__bases__`` assigned) or given another metaclass: same __dict__
                marks[f"{name}.{attr}.__bases__"] = (id(type(value)), *map(id, _BASES(value)))
                for key, item in list(_CLASS_DICT(value).items()) if ours else ():
                    if read.is_data(f"{name}.{attr}", key, item):  # ``HostLog._LAUNCHES``
                        marks[f"{name}.{attr}.{key}"] = (read.plain(item, 0),)
    return marks


# The course's module-level and class-level containers and objects that change as the checker
# runs (its registries, books and caches, the engine's observers, the machine's watch, what the
# sandbox restored): every other one is its data (a check's workload, a reference's prompts),
# compared by value as well as by identity.
_BOOKS = {"overlap_course.build.judge_fingerprint": {"_KEPT"},
          "overlap_course.checks.harness": {"_RUNNING"},
          "overlap_course.checks.ring_sizes": {"ASKED"},
          "overlap_course.measure.contention": {"_WATCH"},
          "overlap_course.checks.pool": {"_ENGINES", "_CONFIGS", "_BUILT", "_PRINTS", "_DEVICES"},
          "overlap_course.checks.sandbox": {"_CURRENT", "OWN_HOOKS"},
          "overlap_course.checks.thread_errors": {"_RECORDING"},
          "overlap_course.labs.plugins": {"_LEARNERS"},
          "overlap_course.progress": {"_said", "_service_trouble"},
          "toy_engine.engine": {"RUN_OBSERVERS"},
          "toy_engine.process_device": {"_MAIN_PATCH"}}
_PLAIN = (str, int, float, complex, bool, bytes, type(None), type(Ellipsis))
_CONTAINERS = (list, tuple, dict, set, frozenset, bytearray)
_MAX_DEPTH = 8
_MAX_OBJECTS = 20_000  # read by value in one pass; past it, by identity (about 10 ms)


def _our_classes() -> dict[int, type]:
    """The classes defined in the course's and the toy's modules (each found in the module
    that names it as its ``__module__``), and those defined in them: the only classes whose
    instances are read by value, through their own ``__dict__`` and slot descriptors."""
    found, todo = {}, []
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in _OURS and type(module) is types.ModuleType:
            todo += [(name, value) for value in list(_MODULE_DICT(module).values())]
    while todo:
        name, value = todo.pop()
        if (issubclass(type(value), type) and id(value) not in found
                and _CLASS_DICT(value).get("__module__") == name):
            found[id(value)] = value
            todo += [(name, item) for item in list(_CLASS_DICT(value).values())]
    return found


class _Reader:
    """The course's data by value: containers, and instances of the course's and the toy's
    classes (their ``__dict__`` and slots: a frozen dataclass's fields, which
    ``object.__setattr__`` changes), to ``_MAX_DEPTH`` and ``_MAX_OBJECTS``, each object once
    (cycles).  Anything else (a tensor, a function, an object of the submission's classes) is
    read by identity.  One reader per pass: the same data read in the same order reads the
    same."""

    def __init__(self, ours: dict[int, type]) -> None:
        self.ours, self.left, self.seen = ours, _MAX_OBJECTS, set()
        self.books = _book_ids()

    def contents(self, where: str, attr: str, value) -> tuple:
        """``value`` by value if it is data, else nothing."""
        return (self.plain(value, 0),) if self.is_data(where, attr, value) else ()

    def is_data(self, where: str, attr: str, value) -> bool:
        """Whether ``value`` can change in place and is not one of the books above (a tuple of
        strings cannot; a module's ``__builtins__`` is the builtins' names, watched as such)."""
        return (self.mutable(value, 0) and not attr.startswith("__")
                and attr not in _BOOKS.get(where, ()))

    def mutable(self, value, depth: int) -> bool:
        kind = type(value)
        if kind in (tuple, frozenset) and depth <= _MAX_DEPTH:
            return any(self.mutable(item, depth + 1) for item in value)
        return kind in _CONTAINERS or id(kind) in self.ours

    def plain(self, value, depth: int):
        """``value`` as nested tuples of plain values, types and ids (an object that is
        neither is read by identity, and kept so that its id is not reused): compared with
        ``==``, no code of the submission's runs."""
        kind = type(value)
        if kind in _PLAIN:
            return (kind, value)  # 50.0 is not 50, nor True 1
        ours = id(kind) in self.ours
        if ((kind not in _CONTAINERS and not ours) or depth > _MAX_DEPTH or self.left <= 0
                or id(value) in self.seen or id(value) in self.books):
            _KEPT[id(value)] = value
            return (object, id(value))
        self.left -= 1
        self.seen.add(id(value))
        deeper = functools.partial(self.plain, depth=depth + 1)
        if ours:
            return (object, id(kind), *_fields(value, kind, deeper))
        if kind is dict:
            return (dict, *((deeper(k), deeper(v)) for k, v in value.items()
                            if id(value) not in REDUCERS or sent(k)))
        if kind in (set, frozenset):
            return (kind, frozenset(map(deeper, value)))
        return (kind, *map(deeper, value))


def _book_ids() -> set[int]:
    """The books' objects, read by identity wherever they are reached: the sandbox's record of
    the toy (``harness._PRISTINE``, data: what its ``restore()`` puts back) holds the engine's
    observers, which change as the checker runs."""
    ids = set()
    for name, attrs in _BOOKS.items():
        module = sys.modules.get(name)
        if type(module) is types.ModuleType:
            space = _MODULE_DICT(module)
            ids.update(id(space[attr]) for attr in attrs if attr in space)
    return ids


def _fields(value, kind: type, deeper) -> list:
    """An instance of one of our classes, read by its classes' own slot and ``__dict__``
    descriptors (C code: no property of anyone's runs)."""
    fields = []
    for cls in _MRO(kind):
        for key, entry in list(_CLASS_DICT(cls).items()):
            if type(entry) is types.MemberDescriptorType:
                try:
                    fields.append((key, deeper(entry.__get__(value, kind))))
                except AttributeError:  # a slot never set
                    fields.append((key, None))
            elif key == "__dict__" and type(entry) is types.GetSetDescriptorType:
                fields.append((key, deeper(entry.__get__(value, kind))))
    return fields


_MRO = type.__dict__["__mro__"].__get__
_KEPT: dict[int, object] = {}


def _watched(marks: dict | None = None):
    """(name, module, ours, theirs, std) of each module the checker may run, ``marks`` given
    the module's identity under its name in ``sys.modules``."""
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        ours, std = top in _OURS, top in sys.stdlib_module_names
        theirs = name in _THEIRS
        if not (ours or std or theirs):
            continue
        if marks is not None:
            marks[f"sys.modules[{name!r}]"] = (id(module),)
        if type(module) is types.ModuleType:  # else: its id is all there is to trust
            yield name, module, ours, theirs, std


_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_CLASS_DICT = type.__dict__["__dict__"].__get__
# What a function, a method or a classmethod is made of, read from the objects themselves.  A
# holder's function is read to its ``__code__`` (an lru_cache's ``__wrapped__`` is the function
# it calls: swapping that one's ``__code__`` changed what the cache computes).
_PARTS = {types.FunctionType: ("__code__", "__defaults__", "__kwdefaults__"),
          types.MethodType: ("__func__", "__self__"), classmethod: ("__func__",),
          staticmethod: ("__func__",), property: ("fget", "fset", "fdel"),
          functools._lru_cache_wrapper: ("__wrapped__",)}
_CACHE = functools._lru_cache_wrapper
_BASES = type.__dict__["__bases__"].__get__


def _mark(value, depth: int = 0) -> tuple:
    """``value``'s identity and its parts'; a function's closure cells by what they hold, and a
    function held there as a function (a check is a wrapper around a wrapper around the
    lesson's function: swapping ``cell_contents`` changed the check and no name)."""
    parts = [_part(value, a) for a in _PARTS.get(type(value), ())]
    if depth > 4:
        return (id(value), *map(id, parts))
    if type(value) is not types.FunctionType:  # a holder: the functions it holds, whole
        return (id(value), *(_mark(part, depth + 1) for part in parts))
    mark = (id(value), *map(id, parts))
    cells = object.__getattribute__(value, "__closure__") or ()
    return (*mark, *(_mark(_held(cell), depth + 1) for cell in cells))


def _part(value, name: str):
    """``value``'s part ``name`` as stored (None where it was deleted: an lru_cache's
    ``__wrapped__`` can be)."""
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        return None


def _held(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _compare(before: dict, after: dict) -> list[str]:
    """Names replaced or removed, and names added to a course module that shadow a builtin."""
    changed = [key for key, mark in before.items()
               if after.get(key) != mark and not _torchs_own(key, mark, before)]
    shadow = []
    for key in after.keys() - before.keys():
        module, _, attr = key.rpartition(".")
        if (f"sys.modules[{module!r}]" in before and module.startswith(_OURS)
                and attr in vars(builtins) and not attr.startswith("__")):
            shadow.append(key)
    return changed + sorted(shadow)


def _torchs_own(key: str, mark: tuple, before: dict) -> bool:
    """Whether ``key`` was rebound by torch itself: importing ``torch._dynamo`` (which
    ``torch.compile``, ``torch.profiler`` and a meta tensor do) wraps ``torch.manual_seed`` in
    ``torch._disable_dynamo``'s ``inner``, around the very function marked before; and
    ``torch.set_default_dtype`` rebinds ``torch.Storage`` to that dtype's storage class."""
    torch = sys.modules.get("torch")
    if key == "torch.Storage" and type(torch) is types.ModuleType:
        return _torchs_storage(torch, before)
    if key != "torch.manual_seed" or "torch._dynamo" not in sys.modules:
        return False
    now = _MODULE_DICT(torch).get("manual_seed")
    if type(now) is not types.FunctionType or _DISABLE_INNER is None:
        return False
    cells = object.__getattribute__(now, "__closure__") or ()
    held = dict(zip(now.__code__.co_freevars, map(_held, cells)))
    return (now.__code__ is _DISABLE_INNER and now.__defaults__ is None
            and now.__kwdefaults__ is None and held.get("recursive") is True
            and set(held) == {"fn", "recursive"} and _mark(held["fn"]) == mark
            and held["fn"] is _MODULE_DICT(sys.modules["torch.random"]).get("manual_seed"))


def _torchs_storage(torch, before: dict) -> bool:
    """Whether ``torch.Storage`` is one of torch's own ``<dtype>Storage`` classes, as marked
    before under its own name (``set_default_dtype(torch.float64)``: ``DoubleStorage``)."""
    now = _MODULE_DICT(torch).get("Storage")
    if not issubclass(type(now), type):
        return False
    name = _NAME(now)
    return (type(name) is str and name.endswith("Storage") and name != "Storage"
            and _MODULE_DICT(torch).get(name) is now and before.get(f"torch.{name}") == _mark(now))


_NAME = type.__dict__["__name__"].__get__


def _disable_inner():
    """The code of ``torch._disable_dynamo``'s wrapper, read before the submission runs."""
    try:
        from torch import _compile
    except ImportError:
        return None
    return next((c for c in _compile._disable_dynamo.__code__.co_consts
                 if type(c) is types.CodeType and c.co_name == "inner"), None)


_DISABLE_INNER = _disable_inner()


class Snapshot:
    """Every object the fingerprint reads (the modules, their names and values, the classes'
    entries, bases and metaclasses, the functions' parts, the closure cells' contents), read in
    bulk at C speed: about 10 ms where the fingerprint takes 120 (both idle), at each of the
    hundreds of hand-backs of a check.  The same objects read again mean the same fingerprint;
    anything else (a module imported, a cache filled) only costs a full comparison.  It holds
    what it read, so that none is freed and another made where it was."""

    def __init__(self) -> None:
        self.dicts, classes, parts = [], {}, {kind: {} for kind in (*_PARTS, "cell")}
        self.ours = _our_classes()
        self.boxes = self._boxes()  # the course's data by value: (the container, what it held)
        for name, module, ours, theirs, std in _watched():
            self.dicts.append(_MODULE_DICT(module))
            for attr, value in list(self.dicts[-1].items()):
                if ours or (theirs and callable(value)):
                    _collect(value, parts)
                if issubclass(type(value), type) and (ours or std or attr in _THEIR_CLASSES):
                    classes[id(value)] = value
                    for item in list(_CLASS_DICT(value).values()):
                        _collect(item, parts)
        self.classes = list(classes.values())
        self.cells = list(parts.pop("cell").values())
        self.parts = [(operator.attrgetter(a) if kind is not _CACHE  # C speed; __wrapped__
                       else functools.partial(_part, name=a),  # can be deleted
                       list(group.values()))
                      for kind, group in parts.items() for a in _PARTS[kind]]
        self.held = self._read()

    def _read(self) -> list:
        found = [*sys.modules, *sys.modules.values()]
        for names in self.dicts:
            found += names
            found += names.values()
        for cls in self.classes:
            names = _CLASS_DICT(cls)
            found += names
            found += names.values()
            found.append(type(cls))
            found += _BASES(cls)
        for read, group in self.parts:
            found += map(read, group)
        found += map(_held, self.cells)
        return found

    def same(self) -> bool:
        """Whether each object read now is the one read then (``is``: no ``__eq__`` runs), and the
        course's data holds what it held."""
        now, read = self._read(), _Reader(self.ours)
        return (len(now) == len(self.held) and all(map(operator.is_, now, self.held))
                and all(read.plain(box, 0) == held for box, held in self.boxes))

    def _boxes(self) -> list[tuple]:
        """The course's data, module-level and class attributes, each once, as the fingerprint
        reads it."""
        boxes, read, classes = [], _Reader(self.ours), set()
        for name, module, ours, _, _ in _watched():
            for attr, value in list(_MODULE_DICT(module).items()) if ours else ():
                if read.is_data(name, attr, value):
                    boxes.append(value)
                if issubclass(type(value), type) and id(value) not in classes:
                    classes.add(id(value))
                    boxes += [item for key, item in list(_CLASS_DICT(value).items())
                              if read.is_data(f"{name}.{attr}", key, item)]
        read = _Reader(self.ours)
        return [(box, read.plain(box, 0)) for box in boxes]


def _collect(value, parts: dict) -> None:
    """``value`` and, for a function, what its closure cells hold (at any depth: more than the
    fingerprint reads), into ``parts`` by type."""
    group = parts.get(type(value))
    if group is None or id(value) in group:
        return
    group[id(value)] = value
    if type(value) is not types.FunctionType:  # a holder: the functions it holds too
        for attr in _PARTS[type(value)]:
            _collect(_part(value, attr), parts)
    else:
        for cell in object.__getattribute__(value, "__closure__") or ():
            parts["cell"][id(cell)] = cell
            _collect(_held(cell), parts)


def watcher(before: dict):
    """``changed()``: what changed since ``before`` -- by the fingerprint only when the snapshot
    taken at the last clean comparison no longer reads the same.  Other threads wait meanwhile
    (a long switch interval), so that the snapshot and the comparison see one state."""
    kept: list[Snapshot] = []

    def changed() -> list[str]:
        interval = sys.getswitchinterval()
        sys.setswitchinterval(_QUIET_S)
        try:
            if kept and kept[0].same():
                return []
            kept.clear()
            snapshot = Snapshot()
            found = _compare(before, _fingerprint())
            if not found and snapshot.same():
                kept.append(snapshot)
            return found
        finally:
            sys.setswitchinterval(interval)
    return changed


_QUIET_S = 5.0
