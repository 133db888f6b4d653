"""Where a correction's tensors would live on a GPU (exercise 04's host-tensor rule): a run on
tensors that hold no values, watching for a tensor made on the host -- by a factory without
`device=`, from NumPy, or when its cell ran -- that meets the metadata's tensors on the device.
On a CPU host and device are one, so the GPU's error (tensors on two devices) never shows."""

from __future__ import annotations

import dis
import functools
import types

import torch
from torch.overrides import TorchFunctionMode


class _Devices(TorchFunctionMode):
    """The first tensor operation that meets a tensor on the host with one on the device, by
    name, and how: mixed with the metadata's tensors, or copied to the device (`.to(device)`,
    `copy_`: on a GPU a copy from the host waits for the device's queue).  A host tensor here is
    one the call made by a factory (no tensor among its arguments), or computed from one
    (`.clone()`, `+ 0`, `torch.stack` of 0-d ones: round 51), one made from host memory
    (`torch.from_numpy`: storage torch did not allocate), or one of ``held``.  0-d ones aside (a
    GPU's kernels take those from the host); not any other made before the call: a cache filled
    on tensors with values holds host tensors that a GPU's run would have made on the device."""

    def __init__(self, held=()):
        super().__init__()
        self.mixed, self.copied, self.made = None, False, list(held)

    def _on_host(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and (any(t is m for m in self.made)
                                           or not t.untyped_storage().resizable())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor)]
        host = [t for t in tensors if self._on_host(t)]
        name = getattr(func, "__name__", "an operation")
        mixing = self.mixed is None and any(t.dim() for t in host)
        if mixing and any(t.device.type != "cpu" and t.dim() for t in tensors):
            # before the call: on tensors without values a mix raises (blind round 52: `+`,
            # `torch.where`, `torch.cat`, `index_add_` with a host tensor passed)
            self.mixed, self.copied = name, name in ("copy_", "to")
        result = func(*args, **kwargs)
        out = [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        if mixing and self.mixed is None and any(t.device.type != "cpu" and t.dim() for t in out):
            self.mixed, self.copied = name, True  # `.to(device)`: a copy to the device
        # made by a factory, from a host tensor, or on the host from the device's tensors
        # (`torch.ones_like(x, device="cpu")`, `x.new_ones(n, device="cpu")`: round 52)
        if not tensors or host or any(t.device.type != "cpu" for t in tensors):
            self.made += [t for t in out if t.device.type == "cpu"]
        return result


def held_on_host(fn, depth: int = 12) -> list[torch.Tensor]:
    """The host tensors (not 0-d) a correction reads as they were when its cell ran: held by
    the correction itself (a partial's arguments, an instance's or its class's attributes), or
    by its functions' globals, defaults and closure cells, a learner's module's attributes they
    name, and so on through the functions they reach (rounds 51 and 52: a module-level
    `torch.arange(4096)` sliced in the call, four helpers deep).  Not a global a function
    assigns itself (a lazily made one) nor what a container holds (a cache): those may have
    been made where the metadata lives."""
    found, seen, todo = [], set(), [(fn, 0)]
    while todo:
        obj, level = todo.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.dim() and obj.device.type == "cpu":
                found.append(obj)
        elif not _library(obj):
            todo += [(o, level + 1) for o in _reached(obj)]
    return found


_LIBRARIES = frozenset({"torch", "numpy", "toy_engine", "overlap_course", "builtins",
                        "functools", "typing", "collections"})


def _library(obj) -> bool:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(
        type(obj) if not isinstance(obj, (type, types.FunctionType)) else obj, "__module__", "")
    return str(name or "").split(".")[0] in _LIBRARIES


def _reached(obj) -> list:
    """What a part of a correction holds that its call may read."""
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        stored = _globals_stored(code)
        found = [obj.__globals__.get(n) for n in _names_read(code) if n not in stored]
        attrs = _globals(code, ("LOAD_ATTR", "LOAD_METHOD"))
        found += [getattr(m, a, None) for m in list(found) if isinstance(m, types.ModuleType)
                  and not _library(m) for a in attrs]
        found += [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
        return found + [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.MethodType):
        return [obj.__func__, obj.__self__]
    if isinstance(obj, (type, types.ModuleType)) or not callable(obj):
        return []
    return [*getattr(obj, "__dict__", {}).values(), *vars(type(obj)).values()]


def _names_read(code) -> set[str]:
    """The global names a function's code loads (not its attribute names: `x.device` is no
    read of a global `device`)."""
    return _globals(code, ("LOAD_GLOBAL", "LOAD_NAME"))


def _globals_stored(code) -> set[str]:
    return _globals(code, ("STORE_GLOBAL",))


def _globals(code, opnames) -> set[str]:
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(i.argval for i in dis.get_instructions(c) if i.opname in opnames)
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return names


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell: a name the function assigns later
        return False
    return True


def host_made(fn, meta: dict, accepted: torch.Tensor, block_size: int) -> _Devices:
    """What ``fn`` did with host tensors (``_Devices``: ``mixed`` is None when nothing).  Run on
    tensors that hold no values and without a default device, so what it makes stays where it
    says; on a CPU the two are one device and a GPU's error (tensors on two devices) never
    shows (blind round 50).  Whatever the code raises here is the run before's to judge."""
    seen = _Devices(held_on_host(fn))
    try:
        with seen:
            fn({name: t.to("meta") for name, t in meta.items()}, accepted.to("meta"), block_size)
    except Exception:  # noqa: BLE001 - judged by valueless_failure's run
        pass
    return seen
