"""Round twenty-seven's blind cases on exercise 04's checks (issue 34).

A1: a right correction that then stored a plain list in a field (`.tolist()`), None or a
string, deleted one (`del meta["slot_mapping"]`) or cleared `meta` was told "your correction
raised AttributeError: 'list' object has no attribute 'tolist'" / "raised KeyError": the
learner's code raised nothing, the checker's read of the result did. It is told which field is
now what, and that each must stay a tensor of the host's dtype and shape.
A2: right values in the wrong shape (`.unsqueeze(0)`, `.sum()`) were told "the key length must
grow by the accepted drafts": the shape change is named.
A3: a correction that hangs only in the engine's device run (block_size 16) was reported "at
line 1 of `<lambda>`" (a namedtuple's, in the host's wait on the device): the device stops it
and names the learner's function and line.
A4: exercise 04 (b) gave `cu_seqlens_q` (and `seqlens_q`) the block tables' reason: each field
has its own.
A5: host reads were named by their dunders ("`__bool__`" for `max(t)`) and `torch.equal` as
"`equal (it returns ...)`": named as written, the explanation outside the code.
"""

import time

import pytest
import torch

from overlap_course import checks
from overlap_course.checks import sandbox


def _owner(meta):
    device = meta["seqlens_q"].device
    return torch.repeat_interleave(torch.arange(len(meta["seqlens_q"]), device=device),
                                   meta["seqlens_q"],
                                   output_size=len(meta["positions"]))


def _right(meta, accepted, block_size):
    shift = accepted[meta["rows"]] * meta["pending"]
    tok = _owner(meta)
    meta["seqlens_k"] += shift
    meta["positions"] += shift[tok]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][tok, pos // block_size] * block_size
                               + pos % block_size)


def _then(edit):
    def correct_seqlens_qk(meta, accepted, block_size):
        _right(meta, accepted, block_size)
        edit(meta)
    return correct_seqlens_qk


def _as_list(meta):
    meta["seqlens_k"] = meta["seqlens_k"].tolist()


def _deleted(meta):
    del meta["slot_mapping"]


def _none(meta):
    meta["positions"] = None


def _string(meta):
    meta["seqlens_k"] = "10, 6, 15"


def _unsqueezed(meta):
    meta["seqlens_k"] = meta["seqlens_k"].unsqueeze(0)


def _summed(meta):
    meta["seqlens_k"] = meta["seqlens_k"].sum()


def _on_meta(meta):  # round 27b: told "not implemented yet" (torch's, as the checker read it)
    meta["seqlens_k"] = torch.empty_like(meta["seqlens_k"], device="meta")


@pytest.mark.parametrize("edit, said", [
    (_as_list, "`meta['seqlens_k']` is now a list ([10, 6, 15]), not a tensor"),
    (_deleted, "your correction removed `meta['slot_mapping']`"),
    (_none, "`meta['positions']` is now None, not a tensor"),
    (_string, "`meta['seqlens_k']` is now a str ('10, 6, 15'), not a tensor"),
    (dict.clear, "your correction removed `meta['input_ids']`, `meta['positions']`"),
    (_unsqueezed, "`meta['seqlens_k']` now has shape [1, 3] ([[10, 6, 15]]); the host wrote "
                  "shape [3]"),
    (_summed, "`meta['seqlens_k']` now has shape [] (31); the host wrote shape [3]"),
    (_on_meta, "`meta['seqlens_k']` is now a tensor on device 'meta', which holds no values; "
               "the host wrote it on 'cpu'"),
])
def test_exercise_04a_a_field_no_longer_a_tensor_of_its_shape_is_named(edit, said):
    v = checks.check_correction(_then(edit))
    assert not v.passed and v.category == "shape", v
    assert said in v.message, v
    assert "tensor of the host's dtype and shape" in v.message, v
    for wrong in ("raised", "must grow by the accepted drafts"):
        assert wrong not in v.message, v


def _hangs_in_the_engine(meta, accepted, block_size):
    _right(meta, accepted, block_size)
    while block_size == 16:  # only the engine's blocks are 16
        pass


def _sleeps_in_the_engine(meta, accepted, block_size):
    _right(meta, accepted, block_size)
    if block_size == 16:
        time.sleep(1000)


@pytest.mark.parametrize("fn, below", [(_hangs_in_the_engine, 2), (_sleeps_in_the_engine, 3)])
def test_exercise_04a_a_hang_in_the_engine_names_the_learners_line(fn, below, monkeypatch):
    """``below``: the hanging line's place under the ``def``.  A right correction first, so that
    the check's engine and reference are made (3.9 s cold, 0.2 s after): the limit then only has
    to cover the check's host cases before the hang, and 8 s (not 20 s) leaves them 30 times
    their 0.2 s; the hang is stopped after 6.4 s, not 16 s."""
    assert checks.check_correction(_right).passed
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 8.0)  # stopped on the device at 80% of it
    line = fn.__code__.co_firstlineno + below
    v = checks.check_correction(fn)
    assert not v.passed and v.category == "time_limit", v
    assert f"at line {line} of `{fn.__name__}`" in v.message, v
    assert "<lambda>" not in v.message and "block_size 16" in v.message, v


@pytest.mark.parametrize("extra, why", [
    ("cu_seqlens_q", "`cu_seqlens_q` is the running sum of `seqlens_q`, which stays"),
    ("block_tables", "a request's blocks were reserved at admission, with room for drafts"),
    ("seqlens_q", "each decode request still feeds 1 + k tokens"),
])
def test_exercise_04b_each_unchanged_field_has_its_own_reason(extra, why):
    right = {"positions", "seqlens_k", "slot_mapping", "input_ids"}
    v = checks.check_metadata_answer(right | {extra})
    assert not v.passed and v.category == "unchanged_field", v
    assert v.message == f"[{extra!r}] do not change: {why}", v


def _reads(read):
    def correct_seqlens_qk(meta, accepted, block_size):
        read(meta)
        _right(meta, accepted, block_size)
    return correct_seqlens_qk


def _max_of(meta):
    max(meta["seqlens_k"])


def _equal(meta):
    torch.equal(meta["pending"], torch.ones_like(meta["pending"]))


def _method_equal(meta):
    meta["pending"].equal(torch.ones_like(meta["pending"]))


def _as_int(meta):
    int(meta["seqlens_k"][0])


@pytest.mark.parametrize("read, named", [
    (_max_of, "Python's `max(...)`"),
    (_equal, "`torch.equal` (it returns a Python bool"),
    (_method_equal, "`.equal(...)` (it returns a Python bool"),
    (_as_int, "`int(...)` of a tensor"),
])
def test_exercise_04a_host_reads_are_named_as_written(read, named):
    v = checks.check_correction(_reads(read))
    assert not v.passed and v.category == "host_read", v
    assert named in v.message, v
    assert "`__" not in v.message and "`equal (" not in v.message, v


def _searchsorted(meta, accepted, block_size):
    shift = accepted[meta["rows"]] * meta["pending"]
    ends = torch.cumsum(meta["seqlens_q"], 0)
    device = meta["seqlens_q"].device
    tok = torch.searchsorted(ends, torch.arange(len(meta["positions"]), device=device),
                             right=True)
    meta["seqlens_k"] += shift
    meta["positions"] += shift[tok]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][tok, pos // block_size] * block_size
                               + pos % block_size)


def _index_add(meta, accepted, block_size):
    shift = accepted[meta["rows"]] * meta["pending"]
    starts = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
    marks = torch.zeros_like(meta["positions"]).index_add_(0, starts[1:],
                                                          torch.ones_like(starts[1:]))
    tok = torch.cumsum(marks, 0)
    meta["seqlens_k"].add_(shift)
    meta["positions"].add_(shift[tok])
    pos = meta["positions"]
    meta["slot_mapping"][:] = (meta["block_tables"][tok, pos // block_size] * block_size
                               + pos % block_size)


@pytest.mark.parametrize("fn", [_right, _searchsorted, _index_add])
def test_exercise_04a_right_corrections_still_pass(fn):
    v = checks.check_correction(fn)
    assert v.passed, v
