"""What a plug-in sends to the CPU stand-in's device process, which receives a notebook's function
by value (cloudpickle) at every launch: how it is pickled (a notebook's ``lru_cache`` function by
value), what is refused (what cannot be copied; more than ``MAX_SENT_BYTES``), and how a refusal
names what the plug-in carries -- read as stored, running none of the plug-in's code."""

from __future__ import annotations

import contextlib
import dis
import functools
import io
import pickle
import sys
import types
from collections import ChainMap

import cloudpickle

from .validate import shown


def _lru_cached(function, maxsize, typed):
    return functools.lru_cache(maxsize, typed)(function)


def _lru_by_value(wrapper):
    """A ``functools.lru_cache`` function: pickle sends it by its name, which a device process
    cannot find where a notebook (``__main__``) or a judge's cells made it; such a one travels
    by value instead, rebuilt there around its function, with an empty cache."""
    if _by_name(wrapper):
        return wrapper.__reduce__()
    params = wrapper.cache_parameters()
    return _lru_cached, (wrapper.__wrapped__, params["maxsize"], params["typed"])


def _by_name(function) -> bool:
    """Whether pickle sends ``function`` by its module and name (nothing it holds travels):
    found under them, in a module that is not a notebook's (``__main__``) nor a judge's cells'."""
    module = None if function.__module__ == "__main__" else sys.modules.get(function.__module__)
    try:
        return functools.reduce(getattr, function.__qualname__.split("."), module) is function
    except AttributeError:  # not found by its name (a module or a cell that is not imported)
        return False


#: The type of a ``functools.cache`` or ``lru_cache`` function
LRU_CACHED = type(functools.lru_cache(len))


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({LRU_CACHED: _lru_by_value},
                              cloudpickle.Pickler.dispatch_table)


def dumps(value) -> bytes:
    """``cloudpickle.dumps``, with a notebook's ``functools.lru_cache`` functions by value."""
    with io.BytesIO() as file:
        _Pickler(file).dump(value)
        return file.getvalue()


#: The most a plug-in may carry to the CPU stand-in's device process: it is pickled, sent and
#: unpickled at every launch (round 33: a correction reading an 8 MB table took exercise 04's
#: check 7.5 s instead of 4 s, 64 MB 25.8 s, and 128 MB ran past its 30 s limit).
MAX_SENT_BYTES = 10_000_000


class NotSendable(TypeError):
    """A plug-in the engine refused to send to the device process: its message names why."""


def sendable(label: str, plugin, value) -> bytes:
    """``value`` (``plugin``, or a launch's arguments that hold it) pickled for the CPU stand-in's
    device process, which receives a notebook's function by value, with what it reads; refused
    with a message naming ``label`` if it cannot be, or carries more than ``MAX_SENT_BYTES``:
    checked as a run starts and at each launch (a plug-in can grow, or take in a lock, mid-run)."""
    try:
        data = dumps(value)
    except Exception as err:  # noqa: BLE001 - whatever the value's own pickling raises
        where = _naming(lambda: next((f" (in {what or 'it'}: {_kind(part)})"
                                      for what, part in _sent(plugin) if not _copies(part)), ""))
        raise NotSendable(f"{label} cannot be sent to the CPU stand-in's device process, which "
                          f"receives it by value (cloudpickle): {shown(err)}{where}; have it use "
                          f"only what can be copied (not an engine, a lock, a file or a "
                          f"generator: a @contextlib.contextmanager decorator holds one, a "
                          f"class-based decorator does not)") from None
    if len(data) > MAX_SENT_BYTES:
        heavy = _naming(lambda: ", ".join(f"{what} ({size / 1e6:.1f} MB)"
                                          for size, what in _carried(plugin)[:2]))
        raise NotSendable(f"{label} carries {len(data) / 1e6:.1f} MB to the CPU stand-in's "
                          f"device process at every launch (it receives a notebook's function "
                          f"by value, with what it reads{': ' + heavy if heavy else ''}); at "
                          f"most {MAX_SENT_BYTES / 1e6:.0f} MB: make such a table inside the "
                          f"function from the call's sizes (torch.arange(len(...))), or keep "
                          f"what it reads small")
    return data


def _naming(name) -> str:
    """``name()``, or nothing if it raises: a plug-in's own code (a ``__class__`` property, a
    ``__dict__`` of its own) never replaces the refusal it names (round 38)."""
    try:
        return name()
    except Exception:  # noqa: BLE001 - whatever the plug-in's code raises
        return ""


def _carried(plugin) -> list[tuple[int, str]]:
    """What a plug-in sends with it, over a tenth of the limit, largest first (:func:`_sent`)."""
    found = {}
    for what, value in _sent(plugin):
        try:
            found[what] = len(dumps(value))
        except Exception:  # noqa: BLE001 - what cannot be pickled was not sent either
            continue
    return sorted(((size, what) for what, size in found.items()
                   if size > MAX_SENT_BYTES / 10), reverse=True)


def _sent(plugin):
    """(what, value): what a plug-in sends by value -- a function's globals its code reads
    (nested code too: a comprehension's), its defaults, its closure's values and its own
    attributes; a partial's arguments; an object's (a bound method's) attributes, its notebook
    class's too.  A function among them (a checker's wrapper holds yours; a partial's) is looked
    into in turn, unless pickle sends it by name (an imported module's: nothing it reads
    travels)."""
    holders, seen = [plugin], {id(plugin)}
    for holder in holders:
        for what, value in _parts(holder):
            # code, what calls code, or what a decorator wraps: looked into, not sized
            if type(value) in _HOLDERS or what == "function attribute `.__wrapped__`":
                if id(value) not in seen and not (  # by identity: a plug-in's == may run code
                        type(value) is types.FunctionType and _by_name(value)):
                    seen.add(id(value))
                    holders.append(value)
            elif id(value) not in seen:  # once: pickle sends an object once (a decorator's
                seen.add(id(value))  # closure holds what it wraps too)
                yield what, value


def _copies(value) -> bool:
    try:
        dumps(value)
    except Exception:  # noqa: BLE001 - whatever its pickling raises
        return False
    return True


def _kind(value) -> str:
    """A value's class, for a message (``contextlib``'s generator decorator named as such)."""
    kind = type(value)
    return ("a @contextlib.contextmanager decorator's state, which holds a generator"
            if kind.__name__ == "_GeneratorContextManager" else f"a {kind.__name__}")


_HOLDERS = (types.FunctionType, functools.partial, types.MethodType)


def _parts(holder) -> list[tuple[str, object]]:
    """(what, value): what ``holder`` (a function, partial, method or object) holds by value."""
    kind = type(holder)  # its type, not its __class__ (a property of the plug-in's may run)
    if issubclass(kind, functools.partial):
        return ([(f"the partial's argument {i}", a) for i, a in enumerate(holder.args)]
                + [(f"the partial's `{k}=`", v) for k, v in holder.keywords.items()]
                + [("", holder.func)])
    if issubclass(kind, types.MethodType):  # its object's (a class's, for a classmethod)
        obj = holder.__self__
        owned = _class_parts(obj) if issubclass(type(obj), type) else _object_parts(obj)
        return owned + [("", holder.__func__)]
    if not issubclass(kind, types.FunctionType):
        return _object_parts(holder)
    own = holder.__dict__  # under functools.wraps, a copy of what it wraps's: named there
    code, parts = holder.__code__, _named(
        {"__wrapped__": own["__wrapped__"]} if "__wrapped__" in own else own, "function attribute")
    parts += [(f"global `{n}`", holder.__globals__[n]) for n in globals_read(code)
              if n in holder.__globals__]
    parts += [(f"default `{n}`", v) for n, v in zip(reversed(code.co_varnames[
        :code.co_argcount]), reversed(holder.__defaults__ or ()))]
    parts += [(f"default `{n}`", v) for n, v in (holder.__kwdefaults__ or {}).items()]
    for name, cell in zip(code.co_freevars, holder.__closure__ or ()):
        try:
            parts.append((f"closure variable `{name}`", cell.cell_contents))
        except ValueError:  # a cell never filled
            continue
    return parts


def _object_parts(obj) -> list[tuple[str, object]]:
    return _attributes(obj) + _class_parts(type(obj))


def _attributes(obj) -> list[tuple[str, object]]:
    """An object's attributes, read as stored: no ``__getattr__`` of the plug-in's runs (a
    ``__dict__`` property of its own may: what it raises leaves them unnamed); its
    ``__slots__``' values, read by their descriptors."""
    try:
        found = _named(object.__getattribute__(obj, "__dict__"), "attribute") if hasattr(
            type(obj), "__dict__") else []
    except Exception:  # noqa: BLE001 - whatever it raises, the refusal names nothing
        found = []
    for cls in type.__dict__["__mro__"].__get__(type(obj)):
        for name, slot in type.__dict__["__dict__"].__get__(cls).items():
            if type(slot) is types.MemberDescriptorType:
                with contextlib.suppress(AttributeError):  # a slot never set
                    found.append((f"attribute `.{name}`", slot.__get__(obj)))
    return found


def _named(space, what: str) -> list[tuple[str, object]]:
    """A namespace's values by name; a private dict of named values in it (a torch Module's
    ``_parameters`` and ``_buffers``) by its entries' names, as the code reads them."""
    found = []
    for name, value in space.items():
        if type(value) is dict and str(name).startswith("_") and all(
                type(k) is str for k in value):
            found += [(f"{what} `.{k}`", v) for k, v in value.items()]
        else:
            found.append((f"{what} `.{name}`", value))
    return found


def _class_parts(cls: type) -> list[tuple[str, object]]:
    """A notebook's class, sent by value with an instance of it: its functions (looked into:
    ``__call__`` reads globals) and its other attributes (round 36: neither was named)."""
    space = type.__dict__["__dict__"].__get__(cls)  # read as stored, as _attributes does
    module = space.get("__module__")
    if type(module) is str and module != "__main__" and sys.modules.get(module) is not None:
        return []  # an imported module's class: sent by its name
    return [("" if type(v) is types.FunctionType else f"class attribute `.{n}`", v)
            for n, v in space.items() if type(n) is str and not n.startswith("__")
            or n == "__call__"]


def globals_read(code) -> set[str]:
    """The global names ``code`` reads, with its nested code's (attribute names are not)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL",
                                                                          "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= globals_read(const)
    return names


class _PlainValues(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a device message holds plain values only, not "
                                     f"{module}.{name}")


def received(data: bytes):
    """A device process's message (tuples, lists, numbers, strings, None), read with no global
    looked up: a process running a plug-in's code (the judge's check of a correction runs the
    learner's on the device) could send a pickle that runs code here (round 43 forged a
    judge's signed verdict so)."""
    return _PlainValues(io.BytesIO(data)).load()
