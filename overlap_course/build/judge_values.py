"""A value answer as it crosses between the judge's processes (:mod:`overlap_course.build.
judge_process`): tagged JSON of exact builtin types -- no pickle (whose loading runs code), no
object whose ``__eq__`` or ``__iter__`` the learner wrote -- read from the learner's value the
way the checker reads it; and a code answer made of a function the submission wrote."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import numbers
import operator
import os
import sysconfig
import types
from collections.abc import Mapping

import numpy

from overlap_course.checks.answers import MAX_ITEMS

_TAGS = {type(None): "none", bool: "bool", int: "int", float: "float", str: "str", list: "list",
         tuple: "tuple", set: "set", frozenset: "frozenset", dict: "dict"}
_MAX_ITEMS = 10_000
_MAX_DEPTH = 20
_MAX_UNWRAP = 20  # partials and decorators around a code answer
# Where a library's code lives (an `__eq__` found there is not the learner's), read at import,
# before any line of the submission runs
_LIBRARY = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                 for k in ("stdlib", "platstdlib", "purelib", "platlib"))


def encode(value, depth: int = 0, budget: list | None = None):
    """``value`` as the checker reads it: a ``str`` subclass (numpy's ``str_``) by its text, an
    integer (numpy's ``int64``, a 0-d array) by ``operator.index``, a real number by ``float``,
    any ``Mapping`` (a ``MappingProxyType``, ``UserDict``, ``ChainMap``) as a dict of its items,
    as the checker's ``dict(answer)`` reads its marks, a container (a namedtuple, a dict's keys,
    an array, a pandas Series; a dataclass with the ``__eq__`` dataclasses gave it, as a tuple)
    by its first ``MAX_ITEMS + 1`` items, as the checker's ``answers.items`` reads them and
    unpacks a pair (one more: the checker's own verdict on a longer one).
    """
    budget = [0] if budget is None else budget
    budget[0] += 1
    if depth > _MAX_DEPTH or budget[0] > _MAX_ITEMS:
        raise ValueError(f"more than {_MAX_DEPTH} levels or {_MAX_ITEMS} items: not an answer")
    tag, value = _plain(value)
    if tag == "dict":
        return [tag, [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)]
                      for k, v in value]]
    if tag in ("list", "tuple", "set", "frozenset"):
        return [tag, [encode(item, depth + 1, budget) for item in value]]
    if tag == "int":
        return [tag, str(value)]  # any size, without JSON's number limits
    if tag == "float":
        return [tag, value.hex()]
    return [tag, value]


def _plain(value) -> tuple[str, object]:
    """(tag, the value of exact builtin type, or a container's items)."""
    kind = type(value)
    if kind in (type(None), bool, int, float, str):
        return _TAGS[kind], value
    if _learners_eq(value) and not (_dataclass_eq(kind) and not isinstance(
            value, (str, numbers.Number, Mapping))):  # a record's is read below, by its items
        raise ValueError(f"a {kind.__name__} has an `__eq__` of its own: write it with sets, "
                         f"lists, tuples, dicts, strings and numbers")
    if isinstance(value, str):
        return "str", str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        raise ValueError(f"a {kind.__name__} is not a plain Python value: write a str")
    refused = f"a {kind.__name__} is not a plain Python value"
    try:
        if isinstance(value, numbers.Integral) or hasattr(kind, "__index__"):
            return "int", operator.index(value)
        if isinstance(value, numbers.Real):
            return "float", float(value)
    except TypeError as err:  # numpy's bool_ refuses its __index__ (refused below), and so
        # does an array of one or more dimensions: read below by its items, as the checker does
        refused = f"a {kind.__name__} is not a plain number ({err})"
    if isinstance(value, dict):
        if _learners_reading(kind):
            raise ValueError(f"a {kind.__name__} is a dict whose reading methods are your own "
                             f"(the checker and the judge would read it differently): write a "
                             f"plain dict")
        return "dict", list(itertools.islice(dict.items(value), MAX_ITEMS + 1))
    if isinstance(value, Mapping):  # the checker's dict(answer) reads its keys, then each item
        keys = list(itertools.islice(iter(value.keys()), MAX_ITEMS + 1))
        return "dict", [(key, value[key]) for key in keys]
    record = dataclasses.is_dataclass(kind)  # unpacked by its items, as astuple gives them
    base = next((b for b in (list, tuple, set, frozenset) if isinstance(value, b)),
                tuple if record else list)
    try:
        given = iter(value)
        items = None if given is value else list(itertools.islice(given, MAX_ITEMS + 1))
    except TypeError:
        fix = ("a tuple of its fields (dataclasses.astuple)" if record
               else "it with sets, lists, tuples, dicts, strings and numbers")
        raise ValueError(f"{refused}: write {fix}") from None
    if items is None:  # as the checker refuses it (round 39): its first reader uses it up
        raise ValueError(f"a {kind.__name__} is an iterator, which its first reader (the check) "
                         f"uses up: write a list or a tuple")
    return _TAGS[base], items


def _learners_eq(value) -> bool:
    """Whether ``value``'s ``__eq__`` is Python code outside the standard library and the
    installed packages: the learner's (pandas' or ``collections.abc.Mapping``'s is not)."""
    equals = inspect.getattr_static(value, "__eq__", None)
    if type(equals) is not types.FunctionType:
        return False
    where = equals.__code__.co_filename
    return not (where.startswith("<frozen ") or os.path.realpath(where).startswith(_LIBRARY))


# What a checker's reading of a dict may call: its iteration, ``dict(answer)``'s (``keys`` and
# ``__getitem__`` when ``__iter__`` is overridden), ``in``, ``len``, ``.get`` and the views
_READING = ("__iter__", "keys", "items", "values", "__getitem__", "__missing__", "__len__",
            "__contains__", "get", "__reversed__")
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not C's own


def _learners_reading(kind) -> bool:
    """Whether a dict subclass reads its items through code of the learner's: the judge reads
    its storage, the checker those methods (a ``Counter``'s or ``OrderedDict``'s are the
    library's and read the storage)."""
    for cls in type.__dict__["__mro__"].__get__(kind):
        if cls is dict or not type.__dict__["__flags__"].__get__(cls) & _HEAP_TYPE:
            continue
        for name in _READING:
            found = type.__dict__["__dict__"].__get__(cls).get(name)
            if found is None:
                continue
            if type(found) is not types.FunctionType:
                return True
            where = found.__code__.co_filename
            if not (where.startswith("<frozen ")
                    or os.path.realpath(where).startswith(_LIBRARY)):
                return True
    return False


def _dataclass_eq(kind) -> bool:
    """Whether ``kind``'s ``__eq__`` is the one ``dataclasses`` wrote for it (same class, and its
    compared fields equal as a tuple): the code of a twin dataclass's, with no closure, so that
    no comparison the learner wrote is taken for it."""
    equals = inspect.getattr_static(kind, "__eq__", None)
    try:
        names = tuple(f.name for f in dataclasses.fields(kind) if f.compare)
        twin = _twin_eq(names)
    except (TypeError, ValueError):  # not a dataclass, or fields no dataclass can have
        return False
    return (type(equals) is types.FunctionType and equals.__closure__ is None
            and equals.__defaults__ is None and equals.__code__ == twin)


@functools.lru_cache(maxsize=64)
def _twin_eq(names: tuple) -> types.CodeType:
    return dataclasses.make_dataclass("Twin", names).__eq__.__code__


def decode(node):
    tag, payload = node[0], node[1] if len(node) > 1 else None
    if tag == "dict":
        return {decode(k): decode(v) for k, v in payload}
    if tag in ("list", "tuple", "set", "frozenset"):
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](
            decode(item) for item in payload)
    if tag == "int":
        return int(payload)
    if tag == "float":
        return float.fromhex(payload)
    return payload


def code_answer(name: str, value, foreign):
    """The function a code answer runs, or why the judge cannot judge it: a ``def`` as it is;
    a ``def`` under what the kernel's call goes through on its way to it, remade around it as
    it was, so that the judge's call is the kernel's: a ``functools.partial`` (the same argument
    objects, of the same types), a ``functools.cache`` / ``lru_cache`` (a new cache of the same
    size: an unhashable argument raises in both), a method (``Loops().run``, a classmethod, an
    object whose ``__call__`` the submission defines, or a classmethod ``__call__``) bound to the
    submission's own object or class, a ``numpy.vectorize`` (a new one made as it was: numpy's
    code, which the judge's fingerprint watches, calls the function); a ``staticmethod``
    object, a partial stored as ``__call__`` (called without the object), or another
    decorator's ``__wrapped__``, as the function it holds.
    ``foreign(code)``: whether the code is the submission's."""
    remakes, found = [], type(value).__name__  # outermost first
    for _ in range(_MAX_UNWRAP):
        call = _own_call(type(value))  # what calling it runs
        if type(value) is types.FunctionType or value is None:
            break
        found = type(value).__name__
        if issubclass(type(value), type):
            return (f"`{name}` is a class ({value.__name__}): the judge calls a function, whose "
                    f"result is the answer: write `def {name}(...)` that returns it")
        if issubclass(type(value), functools.partial) and call is _PARTIAL_CALL:
            # a subclass that keeps partial's call: read by partial's own fields, as it calls
            remakes.append(functools.partial(_partial, _ARGS(value), _KEYWORDS(value)))
            value = _FUNC(value)
        elif type(call) is functools.partialmethod and type(call.func) is types.FunctionType:
            # __call__ = partialmethod(f, ...): f(the object, *its args, ...), as its __get__
            remakes.append(functools.partial(_partial, (value, *call.args), call.keywords))
            value = call.func
        elif type(value) is _VECTORIZE:  # before the method below: its __call__ is numpy's
            remake = _vectorize_like(value)
            if isinstance(remake, str):
                return f"`{name}` {remake}"
            remakes.append(remake)
            value = _VECTORIZE_FIELDS(value).get("pyfunc")
        elif type(call) is classmethod and type(call.__func__) is types.FunctionType:
            # __call__ = classmethod(f): f(the object's class, *args), as its __get__ binds it
            remakes.append(functools.partial(_method, type(value)))
            value = call.__func__
        elif type(call) is functools.partial:  # no __get__: called as it is, without the object
            value = call
        elif type(value) is staticmethod:  # callable since Python 3.10: its function runs
            value = value.__func__
        elif type(call) is staticmethod:  # __call__ = staticmethod(f)
            value = call.__func__
        elif type(value) is types.MethodType or type(call) in (types.FunctionType, _CACHED):
            bound, value = ((value.__self__, value.__func__) if type(value) is types.MethodType
                            else (value, call))
            remakes.append(functools.partial(_method, bound))
        elif call is None:
            break  # not callable (a classmethod object): the kernel's call raises
        else:  # read as it is stored: no property or __getattr__ of the submission's runs
            if type(value) is _CACHED:
                remakes.append(_cache_like(value))
            value = inspect.getattr_static(value, "__wrapped__", None)
    if type(value) is not types.FunctionType or not _own(value, foreign):
        if value is not None:
            found = (type(value).__name__ if type(value) is not types.FunctionType
                     else f"library function ({value.__module__}.{value.__qualname__})")
        return (f"`{name}` must be a function your cells define (with `def`, alone, in a "
                f"functools.partial or np.vectorize, under @functools.cache, or a method of a "
                f"class they define), not a {found}")
    for remake in reversed(remakes):
        value = remake(value)
    return value


def _own(function, foreign) -> bool:
    """Whether a plain function is the submission's: its code, or the code its ``__wrapped__``
    chain leads to (a library decorator's wrapper, ``@torch.no_grad()``).  Not one whose code
    claims an installed file's name: the submission's code exec'd unwatched (round 17: from a
    thread) was judged as trusted code."""
    for _ in range(_MAX_UNWRAP):
        if type(function) is not types.FunctionType:
            return False
        if foreign(function.__code__):
            return True
        function = inspect.getattr_static(function, "__wrapped__", None)
    return False


def _own_call(kind: type):
    """``__call__`` as Python finds it to call an instance of ``kind``: in the ``__dict__`` of
    ``kind`` and its bases only, never its metaclass's (which ``inspect.getattr_static`` falls
    back to: a ``__call__`` there makes the class callable, not its instances)."""
    for klass in _MRO(kind):
        found = _CLASS_DICT(klass)
        if "__call__" in found:
            return found["__call__"]
    return None


_MRO, _CLASS_DICT = type.__dict__["__mro__"].__get__, type.__dict__["__dict__"].__get__
_PARTIAL_CALL = inspect.getattr_static(functools.partial, "__call__")
_FUNC, _ARGS, _KEYWORDS = (functools.partial.__dict__[f].__get__
                           for f in ("func", "args", "keywords"))


def _partial(args: tuple, keywords: dict, function):
    return functools.partial(function, *args, **keywords)


def _method(bound, function):
    return types.MethodType(function, bound)


def _cache_like(wrapper):
    """A new ``functools.lru_cache`` made as ``wrapper``'s was, as functools' own
    ``cache_parameters`` holds it: no code of the submission's runs, and a size that is no
    number (a callable: ``lru_cache`` would call it on the function) is no size."""
    said = inspect.getattr_static(wrapper, "cache_parameters", None)
    made = said() if type(said) is types.FunctionType and said.__code__ in _PARAMETERS else {}
    maxsize = made.get("maxsize")
    return functools.lru_cache(maxsize=maxsize if type(maxsize) is int else None,
                               typed=made.get("typed") is True)


def _vectorize_like(wrapper):
    """A maker of a new ``numpy.vectorize`` around a function, with ``wrapper``'s options as
    ``np.vectorize`` stores them (read from its ``__dict__``: no code of the submission's
    runs); or why not, where one was set to something ``np.vectorize`` never stores."""
    fields = _VECTORIZE_FIELDS(wrapper)
    otypes, excluded = fields.get("otypes"), fields.get("excluded")
    cache, signature = fields.get("cache"), fields.get("signature")
    made = {"otypes": otypes is None or type(otypes) is str or (
                type(otypes) is list and all(issubclass(type(t), _DTYPE) for t in otypes)),
            "excluded": type(excluded) is set and all(type(e) in (int, str) for e in excluded),
            "cache": type(cache) is bool, "signature": signature is None or type(signature) is str}
    odd = [field for field, plain in made.items() if not plain]
    if odd:
        return (f"is an np.vectorize whose `{odd[0]}` ({type(fields.get(odd[0])).__name__}) "
                f"is not one np.vectorize stores: make it with np.vectorize(your function, "
                f"...) and leave it as made, or give the plain function")
    options = {"otypes": list(otypes) if type(otypes) is list else otypes,
               "excluded": set(excluded), "cache": cache, "signature": signature}
    return functools.partial(_vectorized, options)


def _vectorized(options: dict, function):
    return _VECTORIZE(function, **options)


# numpy's vectorize, read before any line of the submission runs, its instances' own fields, and
# the type of the dtypes its ``otypes`` holds (no Python class can subclass it)
_VECTORIZE, _DTYPE = numpy.vectorize, numpy.dtype
_VECTORIZE_FIELDS = numpy.vectorize.__dict__["__dict__"].__get__

# A function under functools.cache or lru_cache: its C wrapper (bound as a method like a
# function, it calls the function with the object first), and the code of functools' two
# ``cache_parameters`` (lru_cache(f), and lru_cache(...)(f))
_CACHED = type(functools.lru_cache(lambda: None))
_PARAMETERS = tuple(made(lambda: None).cache_parameters.__code__
                    for made in (functools.lru_cache, functools.lru_cache(typed=True)))


def report_text():
    """``text(report)``: what ``json.dumps(report)`` writes, for what a report holds (a dict of
    ``str`` keys, lists, strings, booleans and None; anything else raises), read with exact
    types and builtin types' methods only, and every name bound now."""
    kind, code, every, truth, none = type, ord, all, bool, type(None)
    plain, listed, mapped = str, list, dict
    short = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n",
             "\r": "\\r", "\t": "\\t"}.get

    def quoted(word: str) -> str:
        if word.isascii() and word.isprintable() and '"' not in word and "\\" not in word:
            return '"' + word + '"'
        out = []
        for char in word:  # as json's ensure_ascii: \uXXXX (a surrogate pair past U+FFFF)
            point = code(char)
            if 0x20 <= point < 0x7f:
                out.append(short(char) or char)
            elif point > 0xFFFF:
                point -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 | point >> 10, 0xDC00 | point & 0x3FF))
            else:
                out.append(short(char) or "\\u%04x" % point)
        return '"' + "".join(out) + '"'

    def text(value) -> str:
        what = kind(value)
        if what is truth or what is none:
            return "true" if value is True else "false" if value is False else "null"
        if what is plain:
            return quoted(value)
        if what is listed:
            return "[" + ", ".join([text(item) for item in value]) + "]"
        if what is mapped and every([kind(key) is plain for key in value]):
            return "{" + ", ".join([quoted(k) + ": " + text(v) for k, v in value.items()]) + "}"
        raise TypeError(f"a report holds no {what.__name__}")
    return text
