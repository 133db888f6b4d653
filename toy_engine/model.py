"""A tiny GPT (nanoGPT-style) with two forwards: training and serving.

``forward(idx)`` recomputes everything (training, the reference).  ``forward_packed(batch, kv_cache)``
is what an engine runs: requests packed into one flat token list, each with its query length (new
tokens) and key length (cached plus new), K/V in a paged cache (``slot_mapping``: where each new
token's K/V goes; ``block_tables``: which blocks hold each request's history).  The engine computes
in float64: the greedy argmax is then independent of batching, so all engines agree token for token.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

CHECKPOINT = Path(__file__).parent / "checkpoints" / "tiny_gpt.pt"


@dataclass
class GPTConfig:
    vocab_size: int
    context_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128


@dataclass
class PackedBatch:
    """Metadata of one forward over B requests, their T = sum(seqlens_q) tokens packed back to back."""

    input_ids: torch.Tensor     # [T] token ids
    positions: torch.Tensor     # [T] position of each token in its request
    seqlens_q: torch.Tensor     # [B] new tokens per request this round
    seqlens_k: torch.Tensor     # [B] cached + new tokens per request (what attention sees)
    slot_mapping: torch.Tensor  # [T] KV-cache slot each new token's K/V is written to
    block_tables: torch.Tensor  # [B, NB] cache blocks of each request, in order
    max_q: int                  # max(seqlens_q), known to the host: no device sync needed


def token_layout(seqlens_q: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed token: its request and its offset in it (``num_tokens`` from the host: no sync)."""
    owner = torch.repeat_interleave(torch.arange(len(seqlens_q), device=seqlens_q.device), seqlens_q,
                                    output_size=num_tokens)
    offset = torch.arange(num_tokens, device=seqlens_q.device) - (torch.cumsum(seqlens_q, 0) - seqlens_q)[owner]
    return owner, offset


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        width = 4 * cfg.n_embd
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, width), nn.GELU(), nn.Linear(width, cfg.n_embd))

    def split_heads(self, x):
        q, k, v = self.qkv(self.ln_1(x)).split(x.shape[-1], dim=-1)
        shape = x.shape[:-1] + (self.n_head, -1)
        return q.view(shape), k.view(shape), v.view(shape)

    def forward(self, x):
        """Full causal self-attention over [B, T, C]: the training/reference path."""
        B, T, C = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.split_heads(x))  # [B, H, T, D]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln_2(x))

    def forward_packed(self, x, batch: PackedBatch, kv_layer, keys_at, grid, visible):
        """Attention for packed tokens [T, C] against the paged ``kv_layer`` [2, H, num_slots, D]: new K/V written
        first, each request's history gathered from its slots ``keys_at`` [B, L], queries padded into a [B, max_q]
        grid (``grid``: each token's place there), masked by position (``visible`` [B, max_q, L])."""
        T, C = x.shape
        q, k, v = (t.transpose(0, 1) for t in self.split_heads(x))  # [H, T, D]
        kv_layer[0].index_copy_(1, batch.slot_mapping, k)
        kv_layer[1].index_copy_(1, batch.slot_mapping, v)
        H, D, (B, L) = q.shape[0], q.shape[2], keys_at.shape
        keys = kv_layer[0].index_select(1, keys_at.view(-1)).view(H, B, L, D)
        values = kv_layer[1].index_select(1, keys_at.view(-1)).view_as(keys)  # [H, B, L, D]
        q_pad = q.new_zeros(H, B * batch.max_q, D).index_copy_(1, grid, q).view(H, B, batch.max_q, D)
        att = (q_pad @ keys.transpose(-2, -1)) / math.sqrt(D)  # [H, B, max_q, L]
        att = att.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        y = (att @ values).view(H, B * batch.max_q, D)[:, grid]  # [H, T, D]
        x = x + self.proj(y.transpose(0, 1).reshape(T, C))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.context_len, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] for token ids [B, T], recomputing everything (no cache)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def new_kv_cache(self, num_blocks: int, block_size: int, device=None, dtype=None):
        """Preallocated cache [n_layer, 2, H, num_blocks * block_size, D]."""
        cfg, p = self.cfg, self.tok_emb.weight
        return torch.zeros(cfg.n_layer, 2, cfg.n_head, num_blocks * block_size, cfg.n_embd // cfg.n_head,
                           device=device or p.device, dtype=dtype or p.dtype)

    def forward_packed(self, batch: PackedBatch, kv_cache: torch.Tensor, block_size: int):
        """Logits [T, V] for a packed batch; reads and writes kv_cache in place.  Which cache slots each request
        attends to and where its queries go (index arithmetic only) is worked out once, for every layer."""
        B, NB = batch.block_tables.shape
        key_pos = torch.arange(NB * block_size, device=batch.positions.device)  # [L]
        keys_at = batch.block_tables[:, key_pos // block_size] * block_size + key_pos % block_size  # [B, L]
        owner, offset = token_layout(batch.seqlens_q, len(batch.input_ids))
        grid = owner * batch.max_q + offset
        pos_pad = batch.positions.new_zeros(B * batch.max_q).index_copy_(0, grid, batch.positions)
        visible = key_pos.view(1, 1, -1) <= pos_pad.view(B, batch.max_q, 1)  # causal by position
        x = self.tok_emb(batch.input_ids) + self.pos_emb(batch.positions)
        for layer, block in enumerate(self.blocks):
            x = block.forward_packed(x, batch, kv_cache[layer], keys_at, grid, visible)
        return self.head(self.ln_f(x))


def load_model(path=None, dtype=torch.float64) -> tuple[TinyGPT, str]:
    """(model in eval mode, alphabet) from a checkpoint (default: the shipped one; the course trains them)."""
    path = Path(path or CHECKPOINT)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; train one with `python -m overlap_course.train`")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyGPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["state_dict"])
    return model.to(dtype).eval().requires_grad_(False), ckpt["alphabet"]
