"""Host <-> device buffers, in one place, so the host code cannot drift from the kernels.

Per slot ``s`` (round N uses slot ``N % num_slots``): ``meta{s}``, the round's metadata in one flat
int64 buffer (``MetaLayout``: one upload per round); ``temps{s}``, temperatures; ``out{s}``, what
sampling writes back: ``tokens[B, 1 + k]`` then ``accepted[B]`` (``pack_outputs``/``unpack_outputs``).
"""

import numbers
import operator
from dataclasses import dataclass

import torch


def meta_buffer(slot: int) -> str:
    return f"meta{slot}"


def temps_buffer(slot: int) -> str:
    return f"temps{slot}"


def out_buffer(slot: int) -> str:
    return f"out{slot}"


def allowed_buffer(slot: int) -> str:
    """The sampling constraint's mask ``allowed[B, vocab]`` (constraint.py), when one is on."""
    return f"allowed{slot}"


@dataclass(frozen=True)
class MetaLayout:
    """Where each metadata field lives in one flat int64 buffer (per packed token, or per request)."""

    max_tokens: int
    max_batch: int
    max_blocks: int

    TOKEN_FIELDS = ("input_ids", "positions", "slot_mapping")
    REQUEST_FIELDS = ("seqlens_q", "seqlens_k", "rows", "pending", "seeds")

    @property
    def size(self) -> int:
        return (len(self.TOKEN_FIELDS) * self.max_tokens + len(self.REQUEST_FIELDS) * self.max_batch
                + self.max_batch * self.max_blocks)

    def views(self, flat: torch.Tensor, T: int, B: int, NB: int) -> dict[str, torch.Tensor]:
        """Named views (no copies) of a metadata buffer holding T tokens, B requests."""
        out, offset = {}, 0
        for name in self.TOKEN_FIELDS:
            out[name] = flat[offset: offset + T]
            offset += self.max_tokens
        for name in self.REQUEST_FIELDS:
            out[name] = flat[offset: offset + B]
            offset += self.max_batch
        out["block_tables"] = flat[offset: offset + B * NB].view(B, NB)
        return out


def buffer_specs(layout: MetaLayout, num_slots: int, num_drafts: int, mask_vocab: int = 0) -> dict:
    """Shape and dtype of every host buffer (``mask_vocab`` > 0 adds the constraint's masks)."""
    specs = {}
    for s in range(num_slots):
        specs[meta_buffer(s)] = ((layout.size,), torch.long)
        specs[temps_buffer(s)] = ((layout.max_batch,), torch.float64)
        specs[out_buffer(s)] = ((outputs_size(layout.max_batch, num_drafts),), torch.long)
        if mask_vocab:
            specs[allowed_buffer(s)] = ((layout.max_batch, mask_vocab), torch.bool)
    return specs


def write_inputs(device, layout: MetaLayout, slot: int, columns: dict, temperatures: list[float],
                 num_blocks: int) -> None:
    """Write a round's metadata and temperatures into ``slot`` (``device.host``: race-checked)."""
    B = len(temperatures)
    views = layout.views(device.host(meta_buffer(slot), "w"), len(columns["input_ids"]), B, num_blocks)
    for name, values in columns.items():
        views[name].view(-1).copy_(torch.tensor(values, dtype=torch.long))
    device.host(temps_buffer(slot), "w")[:B] = torch.tensor(temperatures, dtype=torch.float64)


def pack_outputs(tokens: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """Device side: ``tokens[B, 1 + k]`` and ``accepted[B]`` as one flat tensor."""
    return torch.cat([tokens.reshape(-1), accepted])


def outputs_size(num_requests: int, num_drafts: int) -> int:
    return num_requests * (num_drafts + 2)


def unpack_outputs(flat: list[int], num_requests: int, num_drafts: int) -> list[list[int]]:
    """Host side: each request's kept tokens, ``tokens[b, : 1 + accepted[b]]``."""
    width = num_drafts + 1
    accepted = flat[num_requests * width: num_requests * (width + 1)]
    return [flat[b * width: b * width + 1 + a] for b, a in enumerate(accepted)]


class BadOutputs(ValueError):
    """``commit_outputs`` was given an ``out`` that is not round ``round``'s list of ``expected``
    ints (``length``: its length, None when it is not a list or tuple)."""

    def __init__(self, message: str, *, round: int, expected: int, length: int | None):
        super().__init__(message)
        self.round, self.expected, self.length = round, expected, length


def checked_outputs(out, n: int, k: int, vocab: int, round: int) -> list[int]:
    """``out`` as plain ints if it is what the host reads from round ``round``'s output slot
    (``n`` requests, ``k`` drafts): ``tokens[n, 1 + k]`` in the vocabulary, then ``accepted[n]``
    from 0 to k; else BadOutputs."""
    size, tokens = outputs_size(n, k), n * (k + 1)

    def refuse(got: str, length: int | None) -> BadOutputs:
        return BadOutputs(f"commit_outputs takes round {round}'s outputs as engine.read_outputs("
                          f"step) returns them, a list of {size} ints ({n} x {k + 1} tokens, then "
                          f"{n} accepted counts); got {got}", round=round, expected=size,
                          length=length)
    if not isinstance(out, (list, tuple)):
        view = (" (read_outputs copies the output slot out as ints: a view of it changes as later "
                "rounds write it)" if isinstance(out, torch.Tensor) else "")
        raise refuse(f"a {type(out).__name__}{view}", None)
    out, values = list(out), []  # read once: what is checked is what is used
    if len(out) != size:
        raise refuse(f"{len(out)} values", len(out))
    for i, x in enumerate(out):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise refuse(f"out[{i}], a {type(x).__name__}, not an int", size)
        value, high = int(operator.index(x)), vocab - 1 if i < tokens else k
        if not 0 <= value <= high:
            what = "a token" if i < tokens else "an accepted count"
            raise refuse(f"out[{i}] = {value}, {what} outside 0 to {high}", size)
        values.append(value)
    return values
