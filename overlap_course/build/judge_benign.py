"""What Python and torch change by themselves in what the judge's fingerprint
(:mod:`overlap_course.build.judge_fingerprint`) reads, as an ordinary cell runs: not the
submission's change, so not one that fails its answer."""

from __future__ import annotations

import copyreg
import sys
import types
from multiprocessing.reduction import ForkingPickler


def made_by_reading(key: str, item) -> bool:
    """Whether a class's entry is one Python adds as the class is read: copyreg's cache
    ``__slotnames__``, filled by the first copy, and (Python 3.11) an empty ``__annotations__``,
    made by reading it (``help(te.Engine)``, round 15).  One that holds names is a change."""
    return key == "__slotnames__" or (key == "__annotations__" and type(item) is dict
                                      and not item)


# The picklers' tables of reducers by type, which the device's messages go through: only the
# entries for types the checker sends are its world.  torch registers one for sympy's
# ``UndefinedFunction`` as ``torch.compile`` or ``torch.profiler`` first imports sympy (round
# 15: a right answer was failed for it); a reducer for a tensor or a function still counts.
REDUCERS = {id(copyreg.dispatch_table), id(ForkingPickler._extra_reducers)}
_SENDERS = ("overlap_course", "toy_engine", "torch", "numpy", "builtins")
_MODULE_OF = type.__dict__["__module__"].__get__
_SUBCLASSES = type.__dict__["__subclasses__"]
_FIRST = types.MappingProxyType({})  # id -> (class, its __module__ then): remember_modules()


def remember_modules() -> None:
    """Keep every class's ``__module__`` as it reads now (the judge: before the submission's first
    line), which ``sent`` decides by: a cell that renamed a class of torch's
    (``torch.UntypedStorage.__module__ = "elsewhere"``) hid a reducer for it (round 16)."""
    global _FIRST
    found, stack = {}, [object]
    while stack:
        cls = stack.pop()
        if id(cls) not in found:
            found[id(cls)] = (cls, _MODULE_OF(cls))
            stack.extend(_SUBCLASSES(cls))
    _FIRST = types.MappingProxyType(found)


def sent(key) -> bool:
    """Whether a reducer's key is a type of the checker's world (the toy's, the course's, torch's,
    numpy's, Python's) by its module when the judge began, or not a type at all."""
    if not issubclass(type(key), type):
        return True
    first = _FIRST.get(id(key))
    module = first[1] if first is not None and first[0] is key else _MODULE_OF(key)
    top = module.partition(".")[0] if type(module) is str else ""
    return top in _SENDERS or top in sys.stdlib_module_names
