"""Issue 34, round fifty-two: exercise 04(a)'s engine_fix rule evaded by hiding the engine's
correction from the check's watch (torch's modes switched off, a thread, doing nothing while
watched), and host tensors the host-tensor rule did not see (made on the host from the device's
tensors, held by the correction object, a partial, a module, four helpers deep), and a host
tensor copied into a device tensor told it is an error on a GPU."""

import functools
import threading
import types

import pytest
import torch

from overlap_course import checks
from overlap_course.build import judge
from toy_engine import kernels

from judged import IMPORTS, needs_the_engine


def _refused(fn, category=None):
    verdict = checks.check_correction(fn)
    assert not verdict, f"false pass: {verdict}"
    if category is not None:
        assert verdict.category == category, verdict
    return verdict


# -- serious: the engine's own correction run where the dispatch-mode watch does not see it --

def _modes_disabled(meta, accepted, block_size):
    with torch.utils._python_dispatch._disable_current_modes():
        kernels.correct_seqlens_qk(meta, accepted, block_size)


def _quiet_when_watched(meta, accepted, block_size):
    if torch._C._len_torch_dispatch_stack():  # engine_fix's _Watch is the only dispatch mode
        return
    kernels.correct_seqlens_qk(meta, accepted, block_size)


def _in_a_thread(meta, accepted, block_size):
    flag = torch.is_inference_mode_enabled()  # mode stacks are thread-local

    def run():
        with torch.inference_mode(flag):
            kernels.correct_seqlens_qk(meta, accepted, block_size)
    t = threading.Thread(target=run)
    t.start()
    t.join()


@pytest.mark.parametrize("fn,category", [(_modes_disabled, "hidden_ops"),
                                         (_quiet_when_watched, "stopped"),
                                         (_in_a_thread, "hidden_ops")])
def test_the_engines_correction_hidden_from_the_watch_is_refused(fn, category):
    verdict = _refused(fn, category)
    if category == "hidden_ops":
        assert "`meta['seqlens_k']`" in verdict.message and "another thread" in verdict.message


# -- serious: host tensors the host-tensor rule does not see (wrong on a GPU, passed here) --

def _shifted(meta, delta, rows, block_size):
    """The solution's steps from a per-request shift ``delta`` and index ``rows`` (0..B-1)."""
    owner = torch.repeat_interleave(rows, meta["seqlens_q"], output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def _body(meta, accepted, block_size, rows):
    _shifted(meta, accepted[meta["rows"]] * meta["pending"], rows, block_size)


def _like_on_cpu(meta, accepted, block_size):
    rows = torch.ones_like(meta["rows"], device="cpu").cumsum(0) - 1  # made on the host
    _body(meta, accepted, block_size, rows)


def _new_on_cpu(meta, accepted, block_size):
    rows = meta["rows"].new_ones(len(meta["rows"]), device="cpu").cumsum(0) - 1
    _body(meta, accepted, block_size, rows)


@pytest.mark.parametrize("fn", [_like_on_cpu, _new_on_cpu])
def test_a_factory_given_a_tensor_and_device_cpu_is_a_host_tensor(fn):
    _refused(fn, "host_tensor")


def _with_table(meta, accepted, block_size, table):
    _body(meta, accepted, block_size, table[:len(meta["rows"])])


class _Fix:
    table = torch.arange(4096)  # host, made when the cell ran

    def __call__(self, meta, accepted, block_size):
        _body(meta, accepted, block_size, self.table[:len(meta["rows"])])


_MOD = types.ModuleType("helpers")
_MOD.T = torch.arange(4096)


def _module_attr(meta, accepted, block_size):
    _body(meta, accepted, block_size, _MOD.T[:len(meta["rows"])])


@pytest.mark.parametrize("fn", [functools.partial(_with_table, table=torch.arange(4096)), _Fix(),
                                _module_attr], ids=["partial", "instance", "module_attr"])
def test_a_host_tensor_held_by_the_correction_object_is_seen(fn):
    _refused(fn, "host_tensor")


_DEEP = torch.arange(4096)


def _d1(n):
    return _DEEP[:n]


def _d2(n):
    return _d1(n)


def _d3(n):
    return _d2(n)


def _d4(n):
    return _d3(n)


def _four_deep(meta, accepted, block_size):
    _body(meta, accepted, block_size, _d4(len(meta["rows"])))


def test_a_global_host_tensor_four_helpers_deep_is_seen():
    _refused(_four_deep, "host_tensor")


# -- medium: a host tensor copied INTO a device tensor is told "an error on a GPU" --

def _copied_in(meta, accepted, block_size):
    rows = torch.empty_like(meta["rows"]).copy_(torch.arange(len(meta["rows"])))
    _body(meta, accepted, block_size, rows)


def test_copy_from_a_host_tensor_is_told_as_a_copy_not_a_device_error():
    verdict = _refused(_copied_in, "host_tensor")
    assert "copies a tensor it made on the host" in verdict.message, verdict.message
    assert "is an error (tensors on two devices)" not in verdict.message, verdict.message


# -- grading helper: the same rules broken in a thread or with torch's modes off --

_THREAD = '''
import threading
import torch
import toy_engine as te

def in_a_thread(f, *args):
    inference = torch.is_inference_mode_enabled()  # the device runs corrections in it
    def run():
        with torch.inference_mode(inference):
            f(*args)
    t = threading.Thread(target=run)
    t.start()
    t.join()
'''
ENGINE_FIX_IN_A_THREAD = _THREAD + '''
def correct_seqlens_qk(meta, accepted, block_size):
    """mine"""
    in_a_thread(te.kernels.correct_seqlens_qk, meta, accepted, block_size)
'''
_LOOP = '''
def loop_body(meta, accepted, block_size):
    B, T = meta["rows"].shape[0], meta["positions"].shape[0]
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.repeat_interleave(torch.arange(B, device=delta.device), meta["seqlens_q"],
                                    output_size=T)
    shift = torch.zeros_like(meta["positions"])
    for b in range(B):  # a Python loop over requests: one kernel launch per request
        shift += torch.where(owner == b, delta[b], 0)
    meta["seqlens_k"] += delta
    meta["positions"] += shift
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)
'''
LOOP_IN_A_THREAD = _THREAD + _LOOP + '''
def correct_seqlens_qk(meta, accepted, block_size):
    in_a_thread(loop_body, meta, accepted, block_size)
'''
LOOP_UNDER_DISABLE = "import torch\n" + _LOOP + '''
def correct_seqlens_qk(meta, accepted, block_size):
    with torch._C.DisableTorchFunction():
        loop_body(meta, accepted, block_size)
'''
HOST_TENSOR_IN_A_THREAD = _THREAD + '''
def body(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.repeat_interleave(torch.arange(len(delta)).to(delta.device),  # host arange
                                    meta["seqlens_q"], output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)

def correct_seqlens_qk(meta, accepted, block_size):
    in_a_thread(body, meta, accepted, block_size)
'''
ENGINE_FIX_UNMODED = '''
import toy_engine as te
from torch.utils._python_dispatch import _disable_current_modes

def correct_seqlens_qk(meta, accepted, block_size):
    with _disable_current_modes():  # pops engine_fix's TorchDispatchMode
        te.kernels.correct_seqlens_qk(meta, accepted, block_size)
'''
ENGINE_FIX_UNLESS_WATCHED = '''
import toy_engine as te
from torch.utils._python_dispatch import _get_current_dispatch_mode

def correct_seqlens_qk(meta, accepted, block_size):
    if _get_current_dispatch_mode() is None:  # only engine_fix's call is watched
        te.kernels.correct_seqlens_qk(meta, accepted, block_size)
'''


def _answer(source: str):
    space = {}
    exec(compile(source, "<cell>", "exec"), space)
    return space["correct_seqlens_qk"]


@pytest.mark.parametrize("source, category", [
    (ENGINE_FIX_IN_A_THREAD, "hidden_ops"),
    (ENGINE_FIX_UNMODED, "hidden_ops"),
    (ENGINE_FIX_UNLESS_WATCHED, "stopped"),
    (LOOP_IN_A_THREAD, "hidden_ops"),
    (LOOP_UNDER_DISABLE, "python_loop"),
    (HOST_TENSOR_IN_A_THREAD, "hidden_ops"),
], ids=["engine_fix_thread", "engine_fix_disable_modes", "engine_fix_unless_watched",
        "loop_thread", "loop_disable_torch_function", "host_tensor_thread"])
def test_exercise_04_rules_hold_in_a_thread_or_with_modes_off(source, category):
    verdict = checks.check_correction(_answer(source))
    assert not verdict and verdict.category == category, verdict
    if category == "python_loop":
        assert "torch's function modes were switched off" in verdict.message, verdict


@pytest.mark.parametrize("source", [ENGINE_FIX_IN_A_THREAD, LOOP_IN_A_THREAD],
                         ids=["engine_fix_thread", "loop_thread"])
def test_the_judge_refuses_exercise_04_rules_broken_in_a_thread(source):
    needs_the_engine()
    passed, message = judge.judge("check_correction", [IMPORTS, source])
    assert not passed and "could not watch" in message, message


# -- blind helper: host tensors mixed by arithmetic, a stateless mistake told a cache, `.data =` --


def _host_mix_variants():
    """Corrections that are right on this CPU but mix a host-made 1-D tensor with device tensors."""

    def _finish(meta, d, block_size):
        _shifted(meta, d, torch.arange(len(meta["rows"]), device=meta["rows"].device), block_size)

    def where_host_zeros(meta, accepted, block_size):
        # the notebook says "use torch.where(cond, a, b)"; b made on the host
        B = len(meta["rows"])
        d = torch.where(meta["pending"] > 0, accepted[meta["rows"]],
                        torch.zeros(B, dtype=torch.long))
        _finish(meta, d, block_size)

    def add_host_zeros(meta, accepted, block_size):
        B = len(meta["rows"])
        d = accepted[meta["rows"]] * meta["pending"] + torch.zeros(B, dtype=torch.long)
        _finish(meta, d, block_size)

    def mul_host_ones(meta, accepted, block_size):
        B = len(meta["rows"])
        d = accepted[meta["rows"]] * meta["pending"] * torch.ones(B, dtype=torch.long)
        _finish(meta, d, block_size)

    def cat_host(meta, accepted, block_size):
        d = torch.cat([accepted[meta["rows"]] * meta["pending"], torch.zeros(0, dtype=torch.long)])
        _finish(meta, d, block_size)

    def stack_host(meta, accepted, block_size):
        B = len(meta["rows"])
        d = torch.stack([accepted[meta["rows"]] * meta["pending"],
                         torch.zeros(B, dtype=torch.long)]).sum(0)
        _finish(meta, d, block_size)

    def positions_from_host_arange(meta, accepted, block_size):
        # recompute positions from the corrected key length; offsets from a host arange
        def offsets(T, req):
            start = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
            return torch.arange(T) - start[req]  # host arange minus a device tensor
        _rebuilt(meta, accepted, block_size, offsets)

    def index_add_host_index(meta, accepted, block_size):
        B = len(meta["rows"])
        T = len(meta["positions"])
        d = accepted[meta["rows"]] * meta["pending"]
        meta["seqlens_k"].index_add_(0, torch.arange(B), d)  # host index into a device tensor
        req = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device),
                                      meta["seqlens_q"],
                                      output_size=T)
        meta["positions"] += d[req]
        p = meta["positions"]
        meta["slot_mapping"].copy_(meta["block_tables"][req, p // block_size] * block_size
                                   + p % block_size)

    return [where_host_zeros, add_host_zeros, mul_host_ones, cat_host, stack_host,
            positions_from_host_arange, index_add_host_index]


@pytest.mark.parametrize("fix", _host_mix_variants(), ids=lambda f: f.__name__)
def test_04a_host_tensor_mixed_by_arithmetic_where_cat_index_add_is_refused(fix):
    """Serious (false pass): on a GPU each of these raises (tensors on two devices)."""
    verdict = checks.check_correction(fix)
    assert not verdict and verdict.category == "host_tensor", verdict


def _rebuilt(meta, accepted, block_size, offsets):
    """Positions rebuilt from the corrected key lengths, each token's ``offsets(T, req)`` in its
    request (``req``: each token's request), then the slots."""
    T = len(meta["positions"])
    d = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += d
    req = torch.repeat_interleave(torch.arange(len(d), device=d.device), meta["seqlens_q"],
                                  output_size=T)
    meta["positions"].copy_((meta["seqlens_k"] - meta["seqlens_q"])[req] + offsets(T, req))
    p = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][req, p // block_size] * block_size
                               + p % block_size)


def test_04a_modulo_offset_message_does_not_blame_a_cache():
    """Medium (wrong message): a correction that keeps nothing between calls, but finds a token's
    offset in its request as `arange % seqlens_q[req]` (right only when every request starts at a
    multiple of its own length, as in all ten cases), is told it reused "something it kept from an
    earlier call of the same shape (a map ... cached ...?)". It caches nothing: the message should
    name the offset/start mistake (or at least not a cache)."""

    def correct_seqlens_qk(meta, accepted, block_size):
        _rebuilt(meta, accepted, block_size,
                 lambda T, req: torch.arange(T, device=req.device) % meta["seqlens_q"][req])

    verdict = checks.check_correction(correct_seqlens_qk)
    assert not verdict and verdict.category == "uneven_queries", verdict
    assert "kept from an earlier call" not in verdict.message, verdict


def test_04a_data_assignment_is_not_blamed_on_state_between_calls():
    """Right: each field updated through `tensor.data = new_values` (the same tensor objects,
    now holding the corrected values) was told it "changed none of the tensors in `meta` on its
    last two calls ... does it keep state between calls?" (it swaps the storage, bumping no
    version)."""

    def correct_seqlens_qk(meta, accepted, block_size):
        B = len(meta["rows"])
        d = accepted[meta["rows"]] * meta["pending"]
        req = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device),
                                      meta["seqlens_q"],
                                      output_size=len(meta["positions"]))
        meta["seqlens_k"].data = meta["seqlens_k"] + d
        meta["positions"].data = meta["positions"] + d[req]
        p = meta["positions"]
        meta["slot_mapping"].data = (meta["block_tables"][req, p // block_size] * block_size
                                     + p % block_size)

    assert checks.check_correction(correct_seqlens_qk)
