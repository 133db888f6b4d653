"""The draft model of speculative decoding: an n-gram table over the training corpus.

A decode round feeds each request its newest token plus k drafts; the target model checks them in
one forward and keeps the longest prefix it agrees with (``kernels.sample``).  Drafts must be cheap:
the most frequent next character after the last NGRAM - 1, chained k times, looked up on the device.
"""

import functools
from pathlib import Path

import torch

NGRAM = 4  # the drafter predicts a token from the NGRAM - 1 tokens before it
#: For every (NGRAM-1)-token context, the most frequent next token in the shipped model's corpus;
#: built by the course (``overlap_course/corpus.py``).
NGRAM_TABLE = Path(__file__).parent / "checkpoints" / "ngram_table.pt"


@functools.lru_cache(maxsize=4)
def ngram_table(alphabet: str) -> torch.Tensor:
    """The shipped table, for a tokenizer of ``alphabet`` (loaded once)."""
    saved = torch.load(NGRAM_TABLE, weights_only=True)
    if alphabet != saved["alphabet"]:
        raise ValueError(f"speculative decoding drafts from the shipped n-gram table, built for the alphabet "
                         f"{saved['alphabet']!r}, not this tokenizer's {alphabet!r}: use num_draft_tokens=0")
    return saved["table"].long()


def propose_drafts(table: torch.Tensor, history: torch.Tensor, k: int) -> torch.Tensor:
    """k drafts per row by chaining an n-gram table: each draft extends the context."""
    vocab = round(table.numel() ** (1 / (NGRAM - 1)))
    context, drafts = history, []
    for _ in range(k):
        key = torch.zeros_like(context[:, 0])
        for j in range(NGRAM - 1):
            key = key * vocab + context[:, j]
        drafts.append(table[key])
        context = torch.cat([context[:, 1:], drafts[-1][:, None]], dim=1)
    return torch.stack(drafts, dim=1)


def prefill_history(input_ids: torch.Tensor, seqlens_q: torch.Tensor, newest: torch.Tensor) -> torch.Tensor:
    """The context after a prefill: the prompt's last tokens (a short one repeats its first), the newest."""
    n = NGRAM - 1
    last = torch.cumsum(seqlens_q, 0) - 1  # each prompt's last packed token
    first = last - seqlens_q + 1
    ar = torch.arange(n, device=seqlens_q.device)
    window = input_ids[torch.maximum(last[:, None] - n + 1 + ar, first[:, None])]
    return torch.cat([window[:, 1:], newest[:, None]], dim=1)


def decode_history(history: torch.Tensor, targets: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """The context after a decode round: the last NGRAM-1 tokens once ``1 + accepted`` are kept."""
    seq = torch.cat([history, targets], dim=1)  # [B, NGRAM - 1 + 1 + k]
    return seq.gather(1, accepted[:, None] + 1 + torch.arange(NGRAM - 1, device=history.device))
