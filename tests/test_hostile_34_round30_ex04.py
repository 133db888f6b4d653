"""Issue 34, round thirty (exercise 04): two wrong corrections passed check_correction.

a: a correction that maps tokens to requests as ``arange(N) // seqlens_q[0]`` (every request
feeding as many tokens as the first) passed "the 8 cases": every hand-made case had equal
``seqlens_q``, although the exercise packs tokens "request after request, `seqlens_q` tokens
each". A case with seqlens_q = [3, 1, 2] (as from a drafter that finds fewer drafts for some
requests) now fails it, its message naming the mistake.
b: a correction that reads ``pending`` by row (``meta["pending"][rows.clamp(max=B - 1)]``), as
it must read ``accepted``, passed: in every case a request that was not pending sat at a batch
index equal to its row. A case with request 2 not pending in row 3, while batch position 3 is
pending, now fails it.

Right corrections (the engine's, and the solution's shape of answer) pass the 10 cases."""

from __future__ import annotations

import torch

from overlap_course import checks

from mistakes import correction


def equal_lengths(meta, accepted, block_size):
    """Wrong: token t belongs to request t // seqlens_q[0]."""
    d = accepted[meta["rows"]] * meta["pending"]
    t = torch.div(torch.arange(meta["positions"].shape[0], device=meta["seqlens_q"].device),
                  meta["seqlens_q"][0],
                  rounding_mode="floor")
    meta["seqlens_k"] += d
    meta["positions"] += d[t]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][t, pos // block_size] * block_size
                               + pos % block_size)


def pending_by_row(meta, accepted, block_size):
    """Wrong: pending read by row (clamped into range), not by batch position."""
    B = meta["rows"].shape[0]
    d = accepted[meta["rows"]] * meta["pending"][meta["rows"].clamp(max=B - 1)]
    t = torch.repeat_interleave(torch.arange(B, device=meta["seqlens_q"].device), meta["seqlens_q"],
                                output_size=len(meta["positions"]))
    meta["seqlens_k"] += d
    meta["positions"] += d[t]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][t, pos // block_size] * block_size
                               + pos % block_size)


def by_cumsum(meta, accepted, block_size):
    """Right, unusually: each token's request counted from the requests' end offsets."""
    d = accepted[meta["rows"]] * meta["pending"]
    ends = torch.cumsum(meta["seqlens_q"], 0)
    device = meta["seqlens_q"].device
    t = torch.searchsorted(ends, torch.arange(meta["positions"].shape[0], device=device),
                           right=True)
    meta["seqlens_k"].add_(d)
    meta["positions"].add_(d[t])
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][t, pos // block_size] * block_size
                               + pos % block_size)


def test_a_a_token_to_request_map_for_equal_lengths_fails_naming_it():
    v = checks.check_correction(equal_lengths)
    assert not v, v
    assert "different numbers of tokens" in v.message and "seqlens_q = [3, 1, 2]" in v.message
    assert "not `seqlens_q[0]` tokens each" in v.message, v.message


def test_b_pending_read_by_row_fails_naming_it():
    v = checks.check_correction(pending_by_row)
    assert not v, v
    assert "request 2 not pending and in row 3" in v.message
    assert "`pending` is per request in batch order" in v.message, v.message


def test_right_corrections_pass_the_10_cases():
    for right in (correction, by_cumsum):  # the engine's own is refused since 2026-12-07
        v = checks.check_correction(right)
        assert v and "the 10 cases are right" in v.message, (right.__name__, v)
