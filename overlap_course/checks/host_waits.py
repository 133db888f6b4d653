"""The instruments of exercise 04's host-wait rule: the tensor operations a function makes, and
the ones that would make the host wait for the device on a GPU (a value read on the host, or a
result whose size depends on the values).  Counted on the CPU, where nothing waits, so the rule
holds on any machine; and a run on tensors that hold no values, which any such read fails."""

from __future__ import annotations

import importlib
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from toy_engine.sending import globals_read

from . import correction_cases, sandbox
from .answers import cut
from .errors import learner_line
from .correction_cases import FIELDS, WORKED, worked_requests
from .op_watch import Watch, hidden_ops
from .verdict import Verdict, counted, fails


class HostReads(TorchFunctionMode):
    """Counts the tensor operations a function makes, and the ones that make the host wait for
    the device's values (on a GPU): those that bring values to the host, and those whose output's
    shape depends on the values, which the host must learn before it can allocate the result (the
    operations torch's CUDA sync-debug mode reports: ``torch.cuda.set_sync_debug_mode``)."""

    # each as the learner wrote it: a dunder is Python's own call (blind round 27 was told
    # "`__bool__`: 2 times" for `max(t)`, which compares the elements with bool())
    HOST = {"item": "`.item()`", "tolist": "`.tolist()`", "numpy": "`.numpy()`",
            "cpu": "`.cpu()`", "__int__": "`int(...)` of a tensor",
            "__float__": "`float(...)` of a tensor", "__complex__": "`complex(...)` of a tensor",
            "__array__": "`numpy.asarray(...)` of a tensor",
            "__bool__": "a tensor read as a bool (an `if` or `while` on it, `and` / `or` / "
                        "`not`, or Python's `max(...)`, `min(...)` or `sorted(...)` over its "
                        "elements, which compare them one by one)",
            "__index__": "a tensor used as a Python int (`range(t)`, a list's index or "
                         "length)",
            # blind round 46: pickle.dumps(t) and torch.save(t, f) read the bytes through it
            "untyped_storage": "`pickle`, `torch.save` or `.untyped_storage()` of a tensor (its "
                               "bytes are copied to the host)",
            "storage": "`.storage()` of a tensor (its bytes are read on the host)"}
    # print(t), f"{t}", repr(t), str(t): the values are copied to the host to be written out
    SHOWN = frozenset({"__format__", "__repr__", "__str__"})
    DATA_SHAPED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
                             "bincount", "masked_scatter"})
    # torch.equal(a, b), torch.allclose(a, b): a Python bool, compared from the values
    BOOL = frozenset({"equal", "allclose", "is_nonzero"})

    def __init__(self):
        super().__init__()
        self.ops, self.host, self.inside = 0, [], 0  # inside: an operation of ours running
        self.dispatched = self.unaccounted = 0  # counted by a Watch of the same call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.inside += 1
        try:
            return self._counted(func, args, kwargs)
        finally:
            self.inside -= 1

    def _counted(self, func, args, kwargs):
        self.ops += 1
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        # a device named "cpu" in the code; not `.to(x.device)`, which on this CPU says "cpu"
        # too and on a GPU moves nothing (round 51): the run without values refuses the rest
        to_host = name == "to" and any(isinstance(a, str) and a.split(":")[0] == "cpu"
                                       for a in (*args[1:], *kwargs.values()))
        if name in self.HOST or to_host:
            self.host.append(self.HOST.get(name, "`.to('cpu')`"))
        elif name in self.SHOWN:
            self.host.append("`print`, `str`, `repr` or an f-string of a tensor (printing or "
                             "formatting a tensor copies its values to the host)")
        elif name in self.BOOL:
            called = f"torch.{name}" if getattr(torch, name, None) is func else f".{name}(...)"
            self.host.append(f"`{called}` (it returns a Python bool, so the values are "
                             "compared on the host)")
        elif name == "repeat_interleave" and isinstance(kwargs.get("output_size"), torch.Tensor):
            self.host.append("`repeat_interleave` with a tensor as output_size (a size is a "
                             "Python int: its value is read on the host)")
        elif name in ("__getitem__", "__setitem__") and _tensor_bound(args[1:2]):
            self.host.append("a tensor as a slice bound (`x[:n]` reads n's value on the host)")
        elif name in self.DATA_SHAPED:
            self.host.append(f"`{name}` (its output's shape depends on the values)")
        elif name == "where" and len(args) + len(kwargs) == 1:
            self.host.append("`where(condition)` (nonzero: its shape depends on the values)")
        elif name == "repeat_interleave" and _tensor_repeats(args, kwargs) and \
                "output_size" not in kwargs:
            self.host.append("`repeat_interleave` without output_size (its length is the "
                             "repeats' sum)")
        elif name in ("__getitem__", "__setitem__", "index_put_",
                      "index_put") and _bool_index(args[1:2]):
            self.host.append("indexing with a boolean mask (the result's size is the number of "
                             "True values)")
        return func(*args, **kwargs)


def _tensor_repeats(args, kwargs) -> bool:
    repeats = kwargs.get("repeats", args[1] if len(args) > 1 else args[0] if args else None)
    return isinstance(repeats, torch.Tensor) and repeats.dim() > 0


def _tensor_bound(index) -> bool:
    """Whether an index (a slice, or a tuple of them) has a tensor as a slice's bound."""
    parts = index[0] if index and isinstance(index[0], tuple) else index
    return any(isinstance(part, slice) and any(isinstance(b, torch.Tensor) for b in (
        part.start, part.stop, part.step)) for part in parts)


def _bool_index(index) -> bool:
    """Whether an index (a tensor, or a tuple / list of them) holds a boolean mask."""
    stack = list(index)
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor) and item.dtype in (torch.bool, torch.uint8):
            return True
        if isinstance(item, (tuple, list)):
            stack.extend(item)
    return False


#: The checks that run a learner's code on meta tensors (``valueless_failure``): torch's Python
#: meta kernels import torch._dynamo on first use, which rebinds ``torch.manual_seed``.  A judge
#: imports it before its fingerprint for these checks only: the import costs every judge process
#: 1.2-2.3 s (measured on these 2-core machines, under load 2-5), and most judges never need it.
ON_META_TENSORS = frozenset({"check_correction"})


def half_imports_dropped(modules=sys.modules, roots=("sympy", "mpmath")) -> None:
    """An Interrupt while the first run on meta tensors imports torch._dynamo (and sympy, about
    a second) left sympy half-made: submodules in ``sys.modules`` not set on their package, or
    whose package is gone, and every later run failed a right answer ("module 'sympy' has no
    attribute 'core'", or 'printing', told as a host read) until the kernel restarted (round
    27b).  Then sympy's and mpmath's modules are dropped, to be imported whole (a whole import
    sets each on its package).  Read as plain modules' dicts: no code of a cell's runs here."""
    names = [n for n in list(modules) if type(n) is str and n.split(".")[0] in roots]

    def on_its_package(name: str) -> bool:
        package, _, child = name.rpartition(".")
        made = modules.get(package)
        return type(made) is types.ModuleType and child in vars(made)
    if all(on_its_package(n) for n in names if "." in n):
        return
    for name in names + [n for n in list(modules)
                         if type(n) is str and n.startswith("torch.utils._sympy")]:
        modules.pop(name, None)


def half_loaded_torch(modules=sys.modules) -> str | None:
    """The torch package an Interrupt stopped halfway through its import, or None: the package
    is gone from ``sys.modules``, its submodules made so far stay, and importing it again fails
    ("partially initialized module 'torch._dynamo' has no attribute 'utils'", told as the
    learner's host read: round 28).  Unlike sympy's, torch's modules cannot be dropped and
    imported again (its pytree registrations refuse a second time): the kernel must restart.
    One whose import works now was not stopped for good (round 28: a learner's alarm, and the
    next right answer passed): it is imported whole, and None returned."""
    gone = {n.rpartition(".")[0] for n in list(modules)
            if type(n) is str and n.startswith("torch.") and n.rpartition(".")[0] not in modules}
    for name in sorted(gone):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any failure: the half-made modules are in the way
            return name
    return None


def valueless_failure(fn, meta: dict, accepted: torch.Tensor, block_size: int,
                      counted_ops: int) -> str | None:
    """Why ``fn`` failed on copies of its tensors that hold no values (torch's meta device, where
    the tensors it makes go too), or None.  Every read of a value on the host fails there,
    whatever the code switched off on the way: ``torch._C.DisableTorchFunction`` hides a read
    from :class:`HostReads`, not from this (a hostile round's wrong answer scored full marks
    that way).  Code that does its work only where values exist (``if accepted.is_meta:
    return``, round nine) changes none of the tensors there, or makes far fewer or more tensor
    operations than the ``counted_ops`` of its run with values."""
    half_imports_dropped()
    copies = {name: t.to("meta") for name, t in meta.items()}
    given = dict(copies)
    versions = {name: (t._version, t.untyped_storage()._cdata)  # an in-place change bumps
                for name, t in given.items()}  # the version; `t.data = new` swaps the storage
    try:
        with torch.device("meta"), HostReads() as seen:
            fn(copies, accepted.to("meta"), block_size)
    except Exception as err:  # noqa: BLE001 - the learner's code failed without values
        return _failed_where(err)
    if all(copies.get(n) is t and (t._version, t.untyped_storage()._cdata) == versions[n]
           for n, t in given.items()):
        return "it changed none of the tensors in `meta`, which it corrects when they hold values"
    if seen.ops * 2 < counted_ops or seen.ops > 2 * counted_ops + 2:
        return (f"it made {seen.ops} tensor operations there and {counted_ops} on tensors "
                f"with values: it does its work differently when the values exist")
    return None


def _failed_where(err: Exception) -> str:
    """Where the learner's code failed on tensors without values, and why: torch's own
    complaint about meta tensors names the checker's probe, not the learner's read (blind
    round 25: "aten::equal: attempted to run this operator with Meta tensors ...", cut)."""
    line = learner_line(err)
    try:
        said = str.__str__(str(err))
    except (KeyboardInterrupt, sandbox.TimeUp):
        raise
    except BaseException:  # noqa: BLE001 - a message that cannot be read
        said = "(its message could not be read)"
    if "copy out of meta" in said:  # .to("cpu"), .cpu(), a host tensor's copy_ from it
        why = "it copies a tensor's values to the host there (`.cpu()`, `.to(\"cpu\")`)"
    elif "meta" in said.lower():
        why = ("it needs a tensor's value there: a Python number, bool or size taken from a "
               "tensor")
    else:
        why = f"{type(err).__name__}: {cut(said, 160)}"
    return f"{line}: {why}" if line else why


def python_loop(ops: list[int], hidden: bool) -> Verdict:
    """The verdict on a correction that makes more tensor operations for 6 requests than for 3
    (``hidden``: counted at dispatch, torch's function modes having been switched off)."""
    where = ", counted where torch's function modes were switched off" * hidden
    return fails("python_loop",
                 f"your correction computes the right values, but it makes "
                 f"{counted(ops[0], 'tensor operation')} for 3 requests and {ops[1]} for 6 (each "
                 f"on its second call of that size{where}): it loops over requests (or tokens) "
                 f"in Python. On a GPU every one of those operations is a kernel launch, so the "
                 f"correction's cost grows with the batch. Write it with whole-tensor operations "
                 f"(the hints' repeat_interleave and indexing with tensors), whose count does "
                 f"not depend on the batch size")


def torch_half_loaded(half: str) -> Verdict:
    """The verdict when an Interrupt stopped torch's import of ``half`` halfway."""
    return fails("setup", f"an Interrupt stopped the import of `{half}` halfway (torch imports "
                          "it the first time a check runs tensors that hold no values), so torch "
                          "is half-loaded in this kernel and cannot import it again: restart "
                          "the kernel (Kernel > Restart), run your cells again, then this check. "
                          "Your correction was not judged")


def host_read(seen: HostReads, copies: int) -> Verdict | None:
    """The verdict on a run for ``3 * copies`` requests that read values on the host, or None."""
    if not seen.host:
        return None
    names = sorted(set(seen.host), key=seen.host.index)
    return fails("host_read",
                 f"your correction computes the right values, but it reads tensor values on "
                 f"the host ({', '.join(names)}: {counted(len(seen.host), 'time')} for "
                 f"{3 * copies} requests). On a GPU each such read makes the host wait until "
                 f"the device has computed that value, which is exactly the wait ZOS removes. "
                 "Keep every step a tensor operation: no `.item()`, `.tolist()`, `.cpu()`, "
                 "`int(...)` or `if` on a tensor, and no operation whose result's size depends "
                 "on the values (a boolean mask, `nonzero`, `repeat_interleave` without "
                 "`output_size`): use `torch.where(cond, a, b)`")


def second_call(fn, copies: int) -> tuple[Verdict | None, HostReads]:
    """A second call for ``3 * copies`` requests and as many tokens, with other seqlens_q
    (``correction_cases.same_shape_case``): its host reads and values, and its count."""
    meta, accepted, expected = correction_cases.same_shape_case(copies)
    held, given = versions(meta), {n: t.clone() for n, t in meta.items()}
    with HostReads() as seen, Watch(seen) as watch:
        fn(meta, accepted, 4)
    got = {n: meta[n].tolist() for n in FIELDS}
    hidden = hidden_ops(meta, given, watch)
    if hidden is not None:
        return hidden, seen
    if seen.host or got == expected:
        return host_read(seen, copies), seen
    if not wrote(meta, held):
        return stopped(f"a later call (for {3 * copies} requests)"), seen
    wrong = next(n for n in FIELDS if got[n] != expected[n])
    fresh = _fresh_shape_wrong(fn)
    if fresh is not None:  # blind round 52: wrong on a shape never seen too: no cache to blame
        return fails("uneven_queries",
                     f"your correction passed the cases, but with seqlens_q = "
                     f"{meta['seqlens_q'].tolist()} {wrong} is {got[wrong]}, expected "
                     f"{expected[wrong]}, and it is wrong on a batch of a shape it never saw "
                     f"({fresh}): it assumes something about where each request's tokens start "
                     f"that the earlier cases happened to hold. A request's tokens follow those "
                     f"of the requests before it, `seqlens_q` of each, whatever their positions"), seen
    return fails("cached", f"your correction passed the cases, but on a second call for "
                           f"{3 * copies} requests and {len(meta['positions'])} tokens, as the "
                           f"call before, with seqlens_q = {meta['seqlens_q'].tolist()} (the "
                           f"call before had {[WORKED['k'] + 1] * 3 * copies}), {wrong} is "
                           f"{got[wrong]}, expected {expected[wrong]}: something it kept from "
                           "an earlier call of the same shape (a map from tokens to requests, "
                           "cached by the batch size or token count?) does not fit this one. "
                           "Keep only what the shape alone decides (`torch.arange(B)`), or build "
                           "the map on every call from `meta['seqlens_q']`"), seen


def _fresh_shape_wrong(fn) -> str | None:
    """What ``fn`` gets wrong on ``correction_cases.fresh_shape()``, a batch of a size no other
    call gives (so nothing kept from an earlier call fits it), or None: a mistake there is the
    code's own, not a cache's."""
    meta, accepted, block_size, expected, _ = correction_cases.fresh_shape()
    fn(meta, accepted, block_size)
    got = {n: meta[n].tolist() for n in FIELDS}
    wrong = next((n for n in FIELDS if got[n] != expected[n]), None)
    return None if wrong is None else (f"seqlens_q = {meta['seqlens_q'].tolist()}: {wrong} is "
                                       f"{got[wrong]}, expected {expected[wrong]}")


# How many more calls of the cases (blind round 32: a counter that stopped correcting after 40
# calls passed; the CPU stand-in unpickles the correction afresh for each launch, so no state
# builds up there, where a GPU's device, one thread of this process, would keep it)
MORE_CALLS = 60


def state_kept(fn) -> Verdict | None:
    """The cases again, ``MORE_CALLS`` calls, then a call whose ``accepted`` is the tensor of the
    call before, rewritten in place (``correction_cases.next_round``): wrong values where the first
    calls were right are state kept between calls."""
    cases = []
    for call in range(1, MORE_CALLS + 2):
        if call <= MORE_CALLS:
            cases = cases or correction_cases.every_case()
            meta, accepted, block_size, expected, label = cases.pop(0)
            when = f"call {call} of the cases again, {label}"
        else:
            meta, expected = correction_cases.next_round(accepted)
            block_size, when = 4, ("a call whose `accepted` is the tensor of the call before, "
                                   "rewritten in place with other counts, as the engine's is "
                                   "every round (one tensor on the device)")
        held = versions(meta)
        fn(meta, accepted, block_size)
        wrong = next((n for n in FIELDS if meta[n].tolist() != expected[n]), None)
        if wrong is not None and not wrote(meta, held):
            return stopped(when)
        if wrong is not None:
            return fails("cached", f"your correction passed the cases, but on {when}, {wrong} "
                                   f"is {meta[wrong].tolist()}, expected {expected[wrong]}: it "
                                   "keeps state between calls (a counter, a cache keyed by "
                                   "`id(accepted)` or by anything but the batch's shape). The "
                                   "engine calls it for every decode round, and each call must "
                                   "correct its own batch")
    return None


def versions(meta: dict) -> dict:
    """Each of ``meta``'s tensors, its version (an in-place change bumps ``_version``) and its
    storage (`t.data = new` swaps it and bumps nothing: blind round 52)."""
    return {n: (t, t._version, t.untyped_storage()._cdata) for n, t in meta.items()}


def wrote(meta: dict, held: dict) -> bool:
    """Whether a correction wrote into or replaced any of the tensors ``versions`` saw."""
    return any(meta.get(n) is not t or t._version != v or t.untyped_storage()._cdata != s
               for n, (t, v, s) in held.items())


def changes_nothing(fn) -> bool:
    """Whether ``fn``, run again on the worked case (tensors with values), changes nothing."""
    meta, accepted = worked_requests(4, [1, 1, 1])
    held = versions(meta)
    fn(meta, accepted, 4)
    return not wrote(meta, held)


def stopped(when: str) -> Verdict:
    """A correction that passed the cases and changed nothing on ``when`` (blind round 31: a
    call counter that stops correcting was told it read values on the host)."""
    return fails("stopped", f"your correction passed the cases, but changed none of the "
                            f"tensors in `meta` on {when}: does it keep state between calls "
                            "(a counter, a flag)? The engine calls it for every decode round, "
                            "and each call must correct its own batch")


_SCRIPTED = (torch.jit.ScriptFunction, torch.jit.ScriptModule)


def scripted_part(fn) -> str | None:
    """What of ``fn`` is compiled by ``torch.jit.script``: ``fn`` itself (``""``), or the name
    of a scripted helper its code reads (a global, nested code's too, or a closure variable;
    plain functions among them looked into in turn); None when nothing is (round 34: a right
    correction calling a scripted helper was called a host read)."""
    if isinstance(fn, _SCRIPTED):
        return ""
    functions = [fn] if isinstance(fn, types.FunctionType) else []
    for function in functions:
        code, found = function.__code__, function.__globals__
        parts = [(n, found[n]) for n in globals_read(code) if n in found]
        for name, cell in zip(code.co_freevars, function.__closure__ or ()):
            try:
                parts.append((name, cell.cell_contents))
            except ValueError:  # a cell never filled
                continue
        for name, value in parts:
            if isinstance(value, _SCRIPTED):
                return name
            if isinstance(value, types.FunctionType) and value not in functions:
                functions.append(value)
    return None


def scripted(helper: str = "") -> Verdict:
    """A correction compiled by ``torch.jit.script``, or calling a helper that is: TorchScript
    runs it where no ``TorchFunctionMode`` sees its operations, so neither the counts nor the
    run on tensors without values can tell whether it reads the host (round 32 called one a
    host read)."""
    what = (f"your correction calls `{helper}`, compiled by `torch.jit.script`" if helper else
            "your correction is compiled by `torch.jit.script`")
    return fails("scripted", f"{what}: TorchScript runs it outside the Python the checker "
                             f"watches, so the checker can neither count its tensor operations "
                             f"nor run it on tensors that hold no values, and cannot tell "
                             f"whether it reads the host. Pass plain functions (`def`, without "
                             f"`torch.jit.script`): the engine calls them as they are")
