"""Exercise 04's wrong values, named: a correction left stale, one that shifted nothing, a
classic slip (``accepted[:B]``, pending ignored, 1 + accepted, old slots shifted, only the first
token moved, blocks of 4 written in), or else the first wrong field and what it must be.

A case's values can coincide with a slip the learner did not make (a shift capped at 2 gives
``accepted[:B]``'s key lengths in one batch), so a slip is named only when the correction gives
its values in every hand-made case (``confirmed``)."""

from __future__ import annotations

import torch

from .correction_cases import FIELDS, every_case
from .verdict import Verdict, fails

_WHY = {
    "seqlens_k": "the key length must grow by the accepted drafts of the in-flight round",
    "positions": "every query token moves right by the accepted drafts",
    "slot_mapping": "slots must be recomputed from the corrected positions through the block "
                    "table",
    "seqlens_q": "query lengths must not change: a decode request always feeds 1 + k tokens",
}


def variants(meta, accepted, block_size) -> dict:
    """What the classic wrong corrections produce on a case: category -> (values, why)."""
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.arange(len(delta)).repeat_interleave(meta["seqlens_q"])

    def applied(delta_, slots="table", first_only=False, bs=block_size):
        m = {n: t.clone() for n, t in meta.items()}
        shift = delta_[owner]
        if first_only:
            starts = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
            shift = torch.zeros_like(shift).index_copy(0, starts, delta_)
        m["seqlens_k"] += delta_
        m["positions"] += shift
        if slots == "table":
            m["slot_mapping"] = (m["block_tables"][owner, m["positions"] // bs] * bs
                                 + m["positions"] % bs)
        else:
            m["slot_mapping"] += shift
        return {n: m[n].tolist() for n in FIELDS}

    B = len(delta)
    return {
        "accepted_by_batch": (applied(accepted[:B] * meta["pending"]),
                              "you took `accepted[:B]` (batch positions) instead of "
                              "`accepted[meta['rows']]`: accepted is indexed by the request's row"),
        "pending_ignored": (applied(accepted[meta["rows"]]),
                            "a request with pending = 0 was processed before this round was "
                            "prepared, so its host lengths are already right: shift only pending "
                            "requests (`accepted[meta['rows']] * meta['pending']`)"),
        "off_by_one": (applied(delta + meta["pending"]),
                       "you shifted by 1 + accepted: the host already counted the in-flight "
                       "round's one token; only the accepted drafts are missing"),
        "slots_shifted": (applied(delta, slots="add"),
                          "you added the shift to the old slots: a position that crosses into "
                          "the next block lives in another block, so recompute slots through "
                          "the block table"),
        "first_token_only": (applied(delta, first_only=True),
                             "you moved only each request's first token: every one of its 1 + k "
                             "query tokens moves (expand the per-request shift to tokens)"),
        # in a case with blocks of 4 these are the right values, so they never match a wrong one
        "block_size_hardcoded": (applied(delta, bs=4),
                                 "these are the slots for blocks of 4: use the `block_size` "
                                 "argument (the engine runs with 16, this case with "
                                 f"{block_size})"),
    }


def confirmed(fn, category: str, field: str) -> bool:
    """Whether ``fn`` gives slip ``category``'s ``field`` in every hand-made case, run afresh:
    then naming the slip is true; a correction that raises in a case is not confirmed."""
    for meta, accepted, block_size, _, _ in every_case():
        slip = variants(meta, accepted, block_size)[category][0][field]
        try:
            fn(meta, accepted, block_size)
            if meta[field].tolist() != slip:
                return False
        except Exception:  # noqa: BLE001 - the learner's code; its own error is named elsewhere
            return False
    return True


def wrong_values(fn, got, expected, before, wrote, slips, label, inputs) -> Verdict:
    """Name a case's wrong values: untouched (``wrote``: whether the correction wrote into
    ``meta``'s tensors or replaced them), a classic slip (``slips``, this case's ``variants``)
    in every field or in the first wrong one, if ``fn`` makes it in every case, or the first
    wrong field."""
    wrong = next(n for n in FIELDS if got[n] != expected[n])
    said = f"{label}: {wrong} is {got[wrong]}, expected {expected[wrong]}"
    if got == before and not wrote:
        return fails("stale", f"{said} (still the host's stale values): change the `meta` you "
                              "were given, its tensors in place (`+=`, `.copy_`) or new ones "
                              "under its keys; a copy of it, or a dict returned, is never seen")
    if got == before:
        meta, accepted = inputs
        return fails("no_shift", f"{said}: your correction wrote into `meta`, but it shifted "
                                 f"nothing here: a pending request moves by its accepted drafts, "
                                 f"`accepted[meta['rows']] * meta['pending']` (accepted "
                                 f"{accepted[meta['rows']].tolist()} for rows "
                                 f"{meta['rows'].tolist()}, pending {meta['pending'].tolist()})")
    matching = [c for c, (result, _) in slips.items() if got == result]
    matching += [c for c, (result, _) in slips.items() if got[wrong] == result[wrong]]
    for category in dict.fromkeys(matching):
        if confirmed(fn, category, wrong):
            return fails(category, f"{said}: {slips[category][1]}")
    return fails(wrong, f"{said}: {_moved(wrong, got, expected, before) or _WHY[wrong]}")


def _moved(field: str, got, expected, before) -> str | None:
    """How far the first wrong key length or position moved against how far it must move
    (round 43: a correction that grew a request with pending 0 was told "it must grow")."""
    if field not in ("seqlens_k", "positions"):
        return None
    i = next((i for i, (g, e) in enumerate(zip(got[field], expected[field])) if g != e), None)
    if i is None or len(got[field]) != len(expected[field]):
        return None
    moved, must = got[field][i] - before[field][i], expected[field][i] - before[field][i]
    what = f"request {i}'s key length" if field == "seqlens_k" else f"query token {i}"
    if must == 0:
        return (f"{what} must not move here ({moved:+d}): its request has no accepted drafts "
                f"to add, or is not pending (processed before this round was prepared)")
    return f"{what} moved by {moved:+d}, and must move by {must:+d}: {_WHY[field]}"
