"""Device-side work: the functions the engine launches on the stream.

A kernel is ``kernel(ctx, *small_args)``; it touches host buffers only through ``ctx.load``/``ctx.store``.
``ctx.state`` keeps, between rounds, ``last_tokens[row]`` (the *future-token map*: a decode input the
host does not know yet is written as ``FROM_DEVICE`` and read from here, so the host never waits to
build a round) and, for speculative decoding, ``accepted``, ``drafts`` and the drafter's ``history``.
No kernel calls ``.item()``: what the host must know (``max_q``) comes as arguments: no stall.
"""

import torch

from . import drafter
from .buffers import MetaLayout, allowed_buffer, meta_buffer, out_buffer, pack_outputs, temps_buffer
from .model import PackedBatch, token_layout

FROM_DEVICE = -1  # input id placeholder: "take this token from the device's state"


def setup_state(ctx, layout: MetaLayout, max_rows: int, num_drafts: int, ngram_table) -> None:
    """Allocate the device-side state once, at engine start."""
    dev = ctx.device
    ctx.state.update(
        layout=layout,
        num_drafts=num_drafts,
        last_tokens=torch.zeros(max_rows, dtype=torch.long, device=dev),
        accepted=torch.zeros(max_rows, dtype=torch.long, device=dev),
        drafts=torch.zeros(max_rows, max(num_drafts, 1), dtype=torch.long, device=dev),
        history=torch.zeros(max_rows, drafter.NGRAM - 1, dtype=torch.long, device=dev),
        ngram_table=None if ngram_table is None else torch.as_tensor(ngram_table).to(dev),
    )


def upload_inputs(ctx, slot: int, T: int, B: int, NB: int) -> None:
    """Copy round metadata from its host buffer into device memory (async on CUDA)."""
    meta = ctx.state["layout"].views(ctx.load(meta_buffer(slot)).clone(), T, B, NB)
    meta["temperature"] = ctx.load(temps_buffer(slot))[:B].clone()
    ctx.state["inputs"] = meta


def correct_seqlens_qk(meta: dict, accepted: torch.Tensor, block_size: int) -> None:
    """Fix this round's stale lengths (``meta``, in place) from the previous round's ``accepted``
    drafts (by row).  The host assumed each in-flight round adds one token; a ``pending`` request
    really advanced by ``1 + accepted``, so its key length and positions shift by ``accepted`` and
    its KV slots follow.  Query lengths do not change: a decode request always feeds 1 + k tokens."""
    delta = accepted[meta["rows"]] * meta["pending"]  # [B]
    owner, _ = token_layout(meta["seqlens_q"], len(meta["positions"]))  # per token: its request
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def correct(ctx, correction=correct_seqlens_qk) -> None:
    """The kernel: apply a correction function to the uploaded metadata."""
    correction(ctx.state["inputs"], ctx.state["accepted"], ctx.block_size)


def resolve_input_ids(meta: dict, state: dict) -> torch.Tensor:
    """Replace FROM_DEVICE placeholders: offset 0 in a request is its newest token,
    offset i > 0 its i-th draft."""
    ids, q = meta["input_ids"], meta["seqlens_q"]
    owner, offset = token_layout(q, len(ids))
    rows = meta["rows"][owner]
    from_state = torch.where(offset == 0, state["last_tokens"][rows],
                             state["drafts"][rows, (offset - 1).clamp(0, state["drafts"].shape[1] - 1)])
    return torch.where(ids == FROM_DEVICE, from_state, ids)


def forward(ctx, max_q: int) -> None:
    meta = ctx.state["inputs"]
    meta["input_ids"] = resolve_input_ids(meta, ctx.state)
    batch = PackedBatch(meta["input_ids"], meta["positions"], meta["seqlens_q"], meta["seqlens_k"],
                        meta["slot_mapping"], meta["block_tables"], max_q)
    ctx.state["logits"] = ctx.model.forward_packed(batch, ctx.kv_cache, ctx.block_size)


def _uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Random numbers in (0, 1) from (seed, position, token), never the batch: every engine agrees."""
    mask = 0xFFFFFFFF
    v = torch.arange(vocab, device=seeds.device)
    x = (seeds[..., None] * 0x9E3779B1 + positions[..., None] * 0x85EBCA77 + v * 0xC2B2AE3D) & mask
    for _ in range(3):
        x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & mask
        x = ((x ^ (x >> 13)) * 0x297A2D39) & mask
    return (x.double() + 0.5) / 2**32


def pick_tokens(logits, temperature, seeds, positions) -> torch.Tensor:
    """Greedy argmax where temperature == 0, else a Gumbel-max sample keyed by position."""
    greedy = logits.argmax(-1)
    gumbel = -torch.log(-torch.log(_uniform(seeds, positions, logits.shape[-1])))
    sampled = (logits / temperature.clamp(min=1e-6)[..., None] + gumbel).argmax(-1)
    return torch.where(temperature > 0, sampled, greedy)


def sample(ctx, slot: int, is_prefill: bool, constrained: bool = False) -> None:
    """Pick tokens, verify drafts, update the future-token map, write ``tokens[B, 1 + k]`` and
    ``accepted[B]``; ``constrained``: only tokens in the host's mask ``allowed{slot}`` are picked."""
    st, meta = ctx.state, ctx.state["inputs"]
    k = 0 if is_prefill else st["num_drafts"]
    q, rows = meta["seqlens_q"], meta["rows"]
    B = len(q)
    last = torch.cumsum(q, 0) - 1  # index of each request's last packed token
    idx = (last - k)[:, None] + torch.arange(k + 1, device=q.device)  # [B, 1 + k]
    temps = meta["temperature"][:, None].expand(B, k + 1)
    seeds = meta["seeds"][:, None].expand(B, k + 1)
    logits = st["logits"][idx]  # [B, 1 + k, vocab]
    if constrained:
        allowed = ctx.load(allowed_buffer(slot))[:B]
        logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
    targets = pick_tokens(logits, temps, seeds, meta["positions"][idx] + 1)  # [B, 1+k]

    # Accept the longest prefix of drafts that the target agrees with, plus one bonus.
    drafts = meta["input_ids"][idx[:, 1:]]  # [B, k]
    accepted = torch.cumprod((drafts == targets[:, :-1]).long(), dim=1).sum(dim=1)  # [B]
    newest = targets.gather(1, accepted[:, None])[:, 0]
    st["last_tokens"][rows] = newest
    st["accepted"][rows] = accepted
    history = (drafter.prefill_history(meta["input_ids"], q, newest) if is_prefill
               else drafter.decode_history(st["history"][rows], targets, accepted))
    st["history"][rows] = history
    if st["num_drafts"]:
        st["drafts"][rows] = drafter.propose_drafts(st["ngram_table"], history, st["num_drafts"])
    ctx.store(out_buffer(slot), pack_outputs(targets, accepted))

