"""Round sixteen, checks16b (second blind round): exercise 04's check_correction compares what
the correction must leave alone (``accepted``, the fields it does not correct, the corrected
fields' dtypes) before and after each hand-made case and in the engine runs; "stale" is said only
when the correction wrote nothing into ``meta``; a request that is not pending but moved is named
as such; notebook 07's wants_more may answer 1 and 0."""

import time

import numpy as np
import pytest
import torch

from overlap_course import checks, device_state
from overlap_course.checks import correction_cases


def _token_owner(meta):
    b = meta["seqlens_q"].shape[0]
    device = meta["seqlens_q"].device
    return torch.arange(b, device=device).repeat_interleave(meta["seqlens_q"],
                                                            output_size=len(meta["positions"]))


def _shift(meta, delta, block_size):
    t = _token_owner(meta)
    meta["seqlens_k"] += delta
    meta["positions"] += delta[t]
    p = meta["positions"]
    meta["slot_mapping"] = meta["block_tables"][t, p // block_size] * block_size + p % block_size


def _right(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]] * meta["pending"], block_size)


def _then_zeroes_accepted(meta, accepted, block_size):
    _right(meta, accepted, block_size)
    accepted.zero_()


def _mutates_accepted(meta, accepted, block_size):
    accepted[meta["rows"]] *= meta["pending"]
    _shift(meta, accepted[meta["rows"]], block_size)


def _then_clears_pending(meta, accepted, block_size):
    _right(meta, accepted, block_size)
    meta["pending"].zero_()


def _float_seqlens_k(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    _shift(meta, delta, block_size)
    meta["seqlens_k"] = meta["seqlens_k"].float()


def _pending_inverted(meta, accepted, block_size):
    _shift(meta, accepted[meta["rows"]] * (1 - meta["pending"]), block_size)


def _pending_ignored_on_positions(meta, accepted, block_size):
    a = accepted[meta["rows"]]
    t = _token_owner(meta)
    meta["seqlens_k"] += a * meta["pending"]
    meta["positions"] += a[t]
    p = meta["positions"] - (a * (1 - meta["pending"]))[t]
    meta["slot_mapping"] = meta["block_tables"][t, p // block_size] * block_size + p % block_size


def _noop(meta, accepted, block_size):
    pass


def test_a_correction_that_zeroes_accepted_afterwards_is_named():
    v = checks.check_correction(_then_zeroes_accepted)
    assert not v and v.category == "changed_input", v.message
    assert ("changed `accepted`: it held [1, 0, 0, 0, 0, 2, 0, 0] and now holds "
            "[0, 0, 0, 0, 0, 0, 0, 0]") in v.message


def test_a_correction_that_multiplies_accepted_in_place_is_named():
    v = checks.check_correction(_mutates_accepted)
    assert not v and v.category == "changed_input", v.message
    assert "now holds [0, 0, 0, 0, 0, 2, 0, 0]" in v.message and "`accepted`" in v.message


def test_a_correction_that_clears_pending_is_named():
    v = checks.check_correction(_then_clears_pending)
    assert not v and v.category == "changed_input", v.message
    assert "changed `meta['pending']`: it held [1, 1, 1] and now holds [0, 0, 0]" in v.message


def test_a_float_key_length_is_refused_with_its_dtype():
    v = checks.check_correction(_float_seqlens_k)
    assert not v and v.category == "changed_input", v.message
    assert "`meta['seqlens_k']` is now torch.float32, the host wrote torch.int64" in v.message


def test_a_zero_shift_written_in_place_is_not_called_stale():
    v = checks.check_correction(_pending_inverted)
    assert not v and v.category == "no_shift", v.message
    assert "stale" not in v.message and "a dict returned, is never seen" not in v.message
    assert "accepted [1, 0, 2] for rows [0, 2, 5], pending [1, 1, 1]" in v.message


def test_a_correction_that_writes_nothing_is_still_stale():
    v = checks.check_correction(_noop)
    assert not v and v.category == "stale", v.message
    assert "a dict returned, is never seen" in v.message


def test_a_request_not_pending_that_moved_is_named():
    v = checks.check_correction(_pending_ignored_on_positions)
    assert not v and v.category == "pending_ignored", v.message
    assert "positions is [7, 8, 9" in v.message and "shift only pending requests" in v.message
    assert "every query token moves right" not in v.message


def _batch():
    return correction_cases.decode_case(4, 8, [6, 1, 2, 7], [3, 20, 9, 14], [1, 0, 1, 1])


def test_the_engine_runs_watch_the_inputs_too():
    """In a batch shaped like no hand-made case, a correction that clears `pending` raises."""
    def sly(meta, accepted, block_size):
        _right(meta, accepted, block_size)
        if len(meta["rows"]) == 4:
            meta["pending"].zero_()
    with pytest.raises(device_state.ChangedInputs, match=r"changed `meta\['pending'\]`"):
        device_state.watched_correction(sly, time.monotonic() + 60)(*_batch(), 8)
    device_state.watched_correction(_right, time.monotonic() + 60)(*_batch(), 8)  # right: no error
    told = RuntimeError("ChangedInputs: in a batch, x (in kernel 'correct', launch 3)")
    assert device_state.watched_message(told, device_state.ChangedInputs) == "in a batch, x"
    assert device_state.watched_message(told, device_state.WrongKeyLengths) is None


def _wants(req):
    return req.finish_reason is None and len(req.output_ids) + req.num_inflight < req.max_new_tokens


@pytest.mark.parametrize("as_number", [int, np.int64], ids=["int", "numpy int"])
def test_wants_more_may_answer_one_and_zero(as_number):
    v = checks.check_wants_more(lambda req: as_number(_wants(req)))
    assert v, v.message


def test_wants_more_answering_another_number_is_still_refused():
    v = checks.check_wants_more(lambda req: 2 * int(_wants(req)))
    assert not v and v.category == "shape", v.message
    assert "returned 2" in v.message and "not True or False" in v.message
