"""Exercise 04's hand-made cases: the notebook's worked case (k = 2, three requests) and its
variants, then cases beyond it: other draft counts (0, 1, 3, 4), batches of 1, 2, 4 and 5
requests, history lengths that differ per request, and rows and accepted counts drawn so that
each likely slip gives another answer than the right one (k or the batch size written in,
``accepted[:B]``, pending ignored, blocks of 4, a correction done only for the worked case's
shape), and last two cases for slips all those let through: requests that feed different
numbers of tokens, and a request not pending whose row is not its batch position."""

from __future__ import annotations

import torch

from toy_engine import kernels
from toy_engine.kernels import FROM_DEVICE

FIELDS = ("seqlens_q", "seqlens_k", "positions", "slot_mapping")
# accepted drafts by row (8 rows), per k: each row its own count, none of them the next row's
_ACCEPTED = {0: [0] * 8, 1: [0, 1, 1, 1, 0, 1, 0, 1], 3: [0, 1, 3, 1, 2, 2, 0, 3],
             4: [2, 3, 0, 1, 3, 2, 4, 1]}
# (k, block_size, rows, first positions, pending): the block tables are drawn from the rows
CASES = ((3, 4, [5], [6], [1]),
          (1, 4, [3, 0], [4, 9], [1, 1]),
          (4, 8, [6, 1, 2, 7], [3, 20, 9, 14], [1, 0, 1, 1]),
          (0, 4, [2, 7, 4, 0, 1], [5, 1, 12, 8, 3], [1, 1, 1, 1, 1]))
# (k, block_size, rows, first positions, pending, drafts per request, label): the last cases,
# for slips the others let through (blind round 30); each request accepted at most its drafts
LAST = ((3, 4, [5, 0, 3], [6, 9, 2], [1, 1, 1], [2, 0, 1],
         "with requests that feed different numbers of tokens (seqlens_q = [3, 1, 2], as from a "
         "drafter that finds fewer drafts for some requests: a request's tokens are its own "
         "`seqlens_q` tokens, packed request after request, not `seqlens_q[0]` tokens each)"),
        (4, 4, [1, 4, 3, 6], [5, 2, 11, 7], [1, 1, 0, 1], None,
         "with request 2 not pending and in row 3, while batch position 3 (row 6) is pending "
         "(`pending` is per request in batch order, `meta['pending'][b]`, like `seqlens_q`: "
         "only `accepted` is indexed by row)"))


# The worked case, as the host prepared it: k = 2, three pending requests in rows 0, 2, 5
# whose previous round accepted 1, 0 and 2 drafts.  Block tables are per request.
WORKED = dict(rows=[0, 2, 5], first=[6, 3, 10],
              tables=[[3, 7, 1, 0], [2, 4, 9, 0], [6, 0, 8, 5]],
              accepted=[1, 0, 0, 0, 0, 2, 0, 0], k=2)
# The fourth case's first positions: request 1 starts where request 0 stops (3, 4, 5 | 6, 7, 8).
RUN_ON = [3, 6, 9]
# (block_size, pending, first positions, label): the worked requests in the checker's next cases
_WORKED_VARIANTS = (
    (4, [0, 1, 1], None, "with request 0 not pending (pending = [0, 1, 1])"),
    (8, [1, 1, 1], None, "with block_size = 8"),
    (4, [1, 1, 1], RUN_ON, "with positions that run on from one request to the next (request 0 "
                           "at 3, 4, 5, request 1 at 6, 7, 8: a request's tokens are its "
                           "`seqlens_q` tokens, not a run of positions)"))


def _batch(drafts, block_size: int, rows, first, pending, tables) -> dict:
    """The metadata ``prepare_inputs`` writes for a decode batch: 1 + k tokens per request
    (``drafts``: each request's k) from its ``first`` position; FROM_DEVICE where the host does
    not know a token (a pending request's every token, the others' drafts), else any real token
    id (37)."""
    qs = [k + 1 for k in drafts]
    positions = torch.tensor([p for f, q in zip(first, qs) for p in range(f, f + q)])
    owner = torch.arange(len(rows)).repeat_interleave(torch.tensor(qs))
    return {
        "input_ids": torch.tensor([FROM_DEVICE if j or p else 37 for p, q in zip(pending, qs)
                                   for j in range(q)]),
        "positions": positions,
        "slot_mapping": (tables[owner, positions // block_size] * block_size
                         + positions % block_size),
        "seqlens_q": torch.tensor(qs),
        "seqlens_k": torch.tensor([f + q for f, q in zip(first, qs)]),
        "rows": torch.tensor(rows),
        "pending": torch.tensor(pending),
        "block_tables": tables,
    }


def worked_requests(block_size: int, pending, copies: int = 1, first=None,
                    drafts=None) -> tuple[dict, torch.Tensor]:
    """The worked case's requests with another block size or other ``pending`` flags, as
    ``prepare_inputs`` writes them (a request that is not pending feeds its newest token,
    known on the host, then FROM_DEVICE draft slots); ``copies`` > 1 repeats the requests
    in other rows (the case for telling a loop over requests from tensor operations);
    ``first``: other first positions; ``drafts``: each request's k (else the worked k)."""
    first = (first or WORKED["first"]) * copies
    tables = torch.tensor(WORKED["tables"] * copies)
    rows = WORKED["rows"] + [1, 3, 4, 6, 7][: 3 * copies - 3]
    meta = _batch(list(drafts or [WORKED["k"]] * 3) * copies, block_size, rows, first,
                  list(pending) * copies, tables)
    return meta, torch.tensor(WORKED["accepted"])


# The worked requests with 1 + [3, 1, 2] tokens each: as many requests and tokens as the worked
# case's 1 + [2, 2, 2], so only seqlens_q tells the two apart (blind round 31: a map from
# tokens to requests cached by (batch size, token count) passed every case)
SAME_SHAPE = [3, 1, 2]


def same_shape_case(copies: int) -> tuple:
    """(meta, accepted, the engine's correction of each field) of ``copies`` times the worked
    requests with ``SAME_SHAPE``'s drafts, in blocks of 4."""
    meta, accepted, _, expected, _ = _answered(
        *worked_requests(4, [1, 1, 1], copies, drafts=SAME_SHAPE), 4, "")
    return meta, accepted, expected


def unseen_batch() -> tuple[dict, torch.Tensor]:
    """A decode batch of 7 requests (k = 1, blocks of 4), a size no other call of the check
    gives: a cache the correction keys by the batch size misses it, so what it makes for it is
    made in this call, where the check sees how (round 51: a `functools.lru_cache` of
    `torch.arange(B)`, filled on tensors with values, was never seen made on the host)."""
    return decode_case(1, 4, list(range(7)), [2 + 3 * r for r in range(7)], [1] * 7)


def fresh_shape() -> tuple:
    """A case of 8 requests feeding 1 + [1, 3, 3, 2, 2, 2, 1, 3] tokens (k = 3, blocks of 4), a
    size no other call gives: (meta, accepted, block_size, the engine's correction, label)."""
    return _answered(*decode_case(3, 4, list(range(8)), [5, 11, 2, 17, 9, 22, 14, 6], [1] * 8,
                                  drafts=[1, 3, 3, 2, 2, 2, 1, 3]), 4, "")


def worked_case():
    """The notebook's worked case (block size 4, k = 2): three pending decode requests
    whose previous round accepted 1, 0 and 2 drafts.  Returns (meta, accepted, expected)."""
    meta, accepted = worked_requests(4, [1, 1, 1])
    expected = {"seqlens_q": [3, 3, 3], "seqlens_k": [10, 6, 15],
                "positions": [7, 8, 9, 3, 4, 5, 12, 13, 14],
                "slot_mapping": [31, 4, 5, 11, 16, 17, 20, 21, 22]}
    return meta, accepted, expected


def decode_case(k: int, block_size: int, rows, first, pending,
                drafts=None) -> tuple[dict, torch.Tensor]:
    """A decode batch as ``prepare_inputs`` writes it: 1 + k tokens per request (``drafts``:
    each request's own k, where they differ) from its ``first`` position, FROM_DEVICE where the
    host does not know a token (a pending request's every token, the others' drafts); the
    accepted counts of ``k``."""
    tables = torch.tensor([[(3 * r + 5 * j + 1) % 32 for j in range(8)] for r in rows])
    meta = _batch(drafts or [k] * len(rows), block_size, rows, first, pending, tables)
    return meta, torch.tensor(_ACCEPTED[k])


def _answered(meta, accepted, block_size: int, label: str) -> tuple:
    """A case with the engine's correction of each field as its expected values."""
    want = {n: t.clone() for n, t in meta.items()}
    kernels.correct_seqlens_qk(want, accepted.clone(), block_size)
    return meta, accepted, block_size, {n: want[n].tolist() for n in FIELDS}, label


def cases() -> list[tuple]:
    """(meta, accepted, block_size, the engine's correction of each field, label) per case."""
    made = []
    for k, block_size, rows, first, pending in CASES:
        label = (f"with k = {k} ({k + 1} tokens per request), {len(rows)} request(s) in rows "
                 f"{rows}, pending {pending}, accepted = {_ACCEPTED[k]} by row, blocks of "
                 f"{block_size}")
        made.append(_answered(*decode_case(k, block_size, rows, first, pending), block_size,
                              label))
    return made


def every_case() -> list[tuple]:
    """The checker's cases in its order, made afresh (a correction changes them in place, and a
    slip is named only when a second run shows it in every case): the worked case, the worked
    requests not all pending, in blocks of 8 and with positions running on, ``cases()``, then
    ``LAST``."""
    meta, accepted, expected = worked_case()
    made = [(meta, accepted, 4, expected, "in the worked case")]
    for block_size, pending, first, label in _WORKED_VARIANTS:
        made.append(_answered(*worked_requests(block_size, pending, first=first), block_size,
                              label))
    last = [_answered(*decode_case(*case[:6]), case[1], case[6]) for case in LAST]
    return made + cases() + last


# The worked case's rows' next accepted counts, each another than before (blind round 32: a
# correction that cached `accepted` by `id(accepted)` passed, as the engine's `accepted` is one
# tensor on the device, rewritten in place every round)
NEXT_ACCEPTED = [2, 0, 1, 0, 0, 1, 0, 0]


def next_round(accepted: torch.Tensor) -> tuple[dict, dict]:
    """The worked requests again, ``accepted`` (the tensor a call before was given) rewritten in
    place with ``NEXT_ACCEPTED``, as the engine does: (meta, the engine's correction of each
    field)."""
    accepted.copy_(torch.tensor(NEXT_ACCEPTED))
    meta, _, _, expected, _ = _answered(worked_requests(4, [1, 1, 1])[0], accepted, 4, "")
    return meta, expected
