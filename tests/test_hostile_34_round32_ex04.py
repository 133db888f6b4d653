"""Issue 34, round thirty-two (exercise 04): state kept between calls, and an lru_cache helper.

a: wrong corrections with state between calls passed check_correction: a call counter that
stops correcting after 40 calls, and one that caches `accepted` by `id(accepted)` (the engine's
`accepted` is one tensor, rewritten in place every round). The checker called the correction
some 15 times on the host, and the CPU stand-in unpickles it afresh for every launch, so no
state built up there (a GPU's device, a thread of the host's process, would keep it). The
cases now run 60 calls more, then one whose `accepted` is the tensor of the call before,
rewritten in place: 'stopped' or 'cached', naming the call and state kept between calls. A
right correction that caches `torch.arange(B)` by B still passes.
b: a right correction whose helper is a `functools.lru_cache` function made in a notebook
(`__main__`) failed in the engine run: pickle sends such a function by its name, which the
device process cannot find ("Can't get attribute 'batch_index' on <module '__main__'>", or a
PicklingError in the judge). The CPU stand-in now sends it by value (``device.dumps``), rebuilt
around its function with an empty cache; one found by its name in an imported module still
travels by reference."""

from __future__ import annotations

import fnmatch
import functools
import pickle

import torch

from overlap_course import checks
from toy_engine import kernels


def counter():
    """Wrong: stops correcting after 40 calls."""
    calls = [0]

    def correct(meta, accepted, block_size):
        calls[0] += 1
        if calls[0] <= 40:
            kernels.correct_seqlens_qk(meta, accepted, block_size)
    return correct


def by_id():
    """Wrong: the accepted counts cached by `id(accepted)` (each tensor held, so no id is
    reused: only a tensor rewritten in place shows it)."""
    seen = {}

    def correct(meta, accepted, block_size):
        held = seen.setdefault(id(accepted), (accepted, accepted.clone()))
        kernels.correct_seqlens_qk(meta, held[1], block_size)
    return correct


def arange_by_size():
    """Right: `torch.arange(B)` made once per batch size."""
    made = {}

    def correct(meta, accepted, block_size):
        B = meta["seqlens_q"].shape[0]
        delta = accepted[meta["rows"]] * meta["pending"]
        device = meta["seqlens_q"].device
        owner = torch.repeat_interleave(made.setdefault(B, torch.arange(B, device=device)),
                                        meta["seqlens_q"],
                                        output_size=meta["positions"].shape[0])
        meta["seqlens_k"] += delta
        meta["positions"] += delta[owner]
        pos = meta["positions"]
        meta["slot_mapping"].copy_(meta["block_tables"][owner, pos // block_size] * block_size
                                   + pos % block_size)
    return correct


def test_a_a_counter_that_stops_after_40_calls_fails_stopped():
    v = checks.check_correction(counter())
    assert not v and v.category == "stopped", v
    assert "of the cases again" in v.message and "keep state between calls" in v.message


def test_a_accepted_cached_by_its_id_fails_on_the_tensor_rewritten_in_place():
    v = checks.check_correction(by_id())
    assert not v and v.category == "cached", v
    assert "rewritten in place" in v.message and "id(accepted)" in v.message, v.message
    assert "keeps state between calls" in v.message, v.message


def test_a_a_cache_of_arange_by_batch_size_still_passes():
    v = checks.check_correction(arange_by_size())
    assert v and "the 10 cases are right" in v.message, v


LRU = '''
import functools, torch
@functools.lru_cache(maxsize=None)
def batch_index(B, device=None):  # made where the metadata lives (round 51: host_tensor)
    return torch.arange(B, device=device)
def correct_seqlens_qk(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    B, device = len(meta["seqlens_q"]), meta["seqlens_q"].device
    owner = torch.repeat_interleave(batch_index(B, device), meta["seqlens_q"],
                                    output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, meta["positions"] // block_size]
                               * block_size + meta["positions"] % block_size)
'''


def notebook_cell(source: str) -> dict:
    """What a notebook's cell defines: functions of `__main__`."""
    names = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), names)
    return names


def test_b_a_notebooks_lru_cache_helper_passes():
    v = checks.check_correction(notebook_cell(LRU)["correct_seqlens_qk"])
    assert v and "the 10 cases are right" in v.message, v


def test_b_an_lru_cache_function_travels_by_value_only_where_its_name_cannot_find_it():
    from toy_engine.sending import dumps  # the CPU stand-in's pickling (round 32)
    helper = notebook_cell(LRU)["batch_index"]
    sent = pickle.loads(dumps(helper))
    assert sent is not helper and sent(3).tolist() == [0, 1, 2]
    assert sent.cache_parameters() == helper.cache_parameters()
    typed = notebook_cell("import functools\n@functools.lru_cache(8, typed=True)\n"
                          "def f(x):\n    return x\n")["f"]
    assert pickle.loads(dumps(typed)).cache_parameters() == {"maxsize": 8, "typed": True}
    assert pickle.loads(dumps(fnmatch._compile_pattern)) is fnmatch._compile_pattern
    assert isinstance(fnmatch._compile_pattern, type(functools.lru_cache(len)))
