"""A sampling constraint built on the host from the tokens committed so far.

Like a structured-output grammar, its mask depends on the text so far, so it exists only once the
previous round's tokens reached the host; only sampling needs it.  Hence the order *current forward,
previous postprocess, current sampling*.  The toy's is **title case** (after a space, only a capital):
a mask built one token late shows as a capital on a word's second letter ("Once uPon a tIme").
Speculative decoding is refused with it: draft i's mask depends on drafts 1..i-1, on the device.
"""

import string

import torch

from .data import CharTokenizer

CONSTRAINTS = ("title_case",)


class TitleCase:
    """After a space only capital letters are allowed; anywhere else, anything is."""

    def __init__(self, tokenizer: CharTokenizer):
        self.vocab_size = tokenizer.vocab_size
        self.space_id = tokenizer.encode(" ")[0]
        self.after_space = torch.zeros(self.vocab_size, dtype=torch.bool)
        self.after_space[tokenizer.encode(string.ascii_uppercase)] = True

    def masks(self, requests) -> torch.Tensor:
        """``allowed[b, token]`` for the next token of each request, from its committed text."""
        allowed = torch.ones(len(requests), self.vocab_size, dtype=torch.bool)
        for b, req in enumerate(requests):
            newest = req.output_ids[-1] if req.output_ids else req.prompt_ids[-1]
            if newest == self.space_id:
                allowed[b] = self.after_space
        return allowed


def make_constraint(name: str | None, tokenizer: CharTokenizer) -> TitleCase | None:
    """The constraint called ``name`` (validated by ``EngineConfig``), or None."""
    return None if name is None else TitleCase(tokenizer)
