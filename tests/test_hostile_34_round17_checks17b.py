"""Round 17, blind tester B: exercise 04's check named a slip (``accepted[:B]``, 1 + accepted)
from one case whose values merely coincided with it.  A slip is now named only when the
correction gives its values in every hand-made case; otherwise the message states the wrong
field, its values and what it must be."""

import torch

from overlap_course import checks


def _shift(meta, delta, block_size, key_delta=None):
    """A correction's body: positions and slots from ``delta``, seqlens_k from ``key_delta``."""
    owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                    meta["seqlens_q"],
                                    output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta if key_delta is None else key_delta
    meta["positions"] += delta[owner]
    pos = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, pos // block_size] * block_size
                               + pos % block_size)


def _key_length_of_first_request_only(meta, accepted, block_size):
    d = accepted[meta["rows"]] * meta["pending"]
    _shift(meta, d, block_size, key_delta=torch.cat([d[:1], torch.zeros_like(d[1:])]))


def _shift_capped_at_two(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]].clamp(max=2) * meta["pending"], block_size)


def _key_length_plus_queries_minus_three(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]] * meta["pending"], block_size)
    meta["seqlens_k"] += meta["seqlens_q"] - 3


def _by_batch_position_and_blocks_of_4(meta, accepted, block_size):
    _shift(meta, accepted[: len(meta["rows"])] * meta["pending"], 4)


def test_a_key_length_slice_slip_is_not_called_accepted_by_batch():
    v = checks.check_correction(_key_length_of_first_request_only)
    assert not v and v.category == "seqlens_k", v.message
    assert "accepted[:B]" not in v.message
    assert ("in the worked case: seqlens_k is [10, 6, 13], expected [10, 6, 15]: request 2's "
            "key length moved by +0, and must move by +2: the key length must grow by the "
            "accepted drafts") in v.message


def test_a_shift_capped_at_two_is_not_called_accepted_by_batch():
    v = checks.check_correction(_shift_capped_at_two)
    assert not v and v.category == "seqlens_k", v.message
    assert "accepted[:B]" not in v.message
    assert "with k = 4" in v.message and "expected [12, 25, 14, 20]" in v.message


def test_a_key_length_right_only_for_k_2_is_not_called_one_plus_accepted():
    v = checks.check_correction(_key_length_plus_queries_minus_three)
    assert not v and v.category == "seqlens_k", v.message
    assert "1 + accepted" not in v.message and "with k = 3" in v.message


def test_a_slip_made_in_every_case_is_still_named_beside_another():
    v = checks.check_correction(_by_batch_position_and_blocks_of_4)
    assert not v and v.category == "accepted_by_batch", v.message
    assert "you took `accepted[:B]`" in v.message
