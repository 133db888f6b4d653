"""Whether a check saw every tensor operation of a learner's call (exercise 04): a dispatch mode
that records which storages the operations it saw wrote or made, and counts them into the
function mode counting the same call (``host_waits.HostReads``).  Code run in another thread or
with torch's modes switched off writes where it never looked (round 52)."""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .correction_cases import FIELDS
from .verdict import Verdict, fails


class Watch(TorchDispatchMode):
    """Whether any tensor operation ran with ``look_for(frame)`` true of its caller's frame (the
    engine's correction on the stack: ``whose_fix``), and which storages the operations it saw
    wrote or made; and into ``counted`` (a ``host_waits.HostReads`` counting the same call),
    how many operations ran, and how many of them without passing through it.  A dispatch mode:
    ``torch._C.DisableTorchFunction()`` hides an operation from a function mode, not from it;
    what hides one from both (another thread, torch's modes switched off) leaves writes it never
    saw (round 52)."""

    def __init__(self, counted: HostReads | None = None, look_for=None):
        super().__init__()
        self.counted, self.look_for = counted, look_for
        self.found, self.storages = False, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.look_for is not None and not self.found:
            self.found = self.look_for(sys._getframe(1))
        if self.counted is not None:
            self.counted.dispatched += 1
            self.counted.unaccounted += not self.counted.inside  # `torch.from_numpy` too
        result = func(*args, **(kwargs or {}))
        with torch._C.DisableTorchFunction():  # not counted as the learner's `.untyped_storage()`
            self.storages.update(_storage(t) for t in (*_written(func, args, kwargs or {}),
                                                       *tree_leaves(result))
                                 if isinstance(t, torch.Tensor))
        return result


def hidden_ops(meta: dict, given: dict, watch: Watch) -> Verdict | None:
    """The verdict on a call that changed fields of ``meta`` (``given``: their values before)
    with operations ``watch`` never saw, or None: whatever a rule counts, such code runs where
    it is not counted (round 52: a loop over requests, a host tensor, the engine's own
    correction, each run in a thread or with torch's modes switched off, passed)."""
    unseen = [name for name in FIELDS if not torch.equal(meta[name], given[name])
              and _storage(meta[name]) not in watch.storages]
    if not unseen:
        return None
    return fails("hidden_ops",
                 f"your correction changed {', '.join(f'`meta[{n!r}]`' for n in unseen)} with "
                 f"operations the check could not watch (run in another thread, or with torch's "
                 f"modes switched off), so it cannot tell what they were or whose correction "
                 f"computed them: run your tensor operations in the call itself")


def _written(func, args, kwargs) -> list:
    """The arguments an operation writes (``add_``'s self, ``copy_``'s, an ``out=``)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    return [args[i] if i < len(args) else kwargs.get(a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata
