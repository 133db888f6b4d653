"""A sampling constraint computed on the host from the tokens committed so far.

Structured-output engines turn a grammar into a mask of the tokens allowed next.  The
mask depends on the text generated so far, so it can only be built once the previous
round's tokens have reached the host -- that is, after the previous round's postprocess.
The forward does not need the mask, the sampling does.  This is the dependency behind
the order *current forward, previous postprocess, current sampling*: the forward is
launched before the host processes round N-1, the sampling after it, with a mask that
includes round N-1's token.

The toy's constraint fits a character model: **title case** -- the first character after
a space must be a capital letter.  It changes the text visibly ("Once Upon A Time"), and
a mask built one token late shows it just as visibly: the capital lands on the second
letter of a word ("Once uPon a tIme"), because the stale mask still sees the space.

Speculative decoding is refused (creating the ``EngineConfig`` raises): the mask of draft
position i depends on drafts 1..i-1, and the drafts live on the device, where the host
cannot read them without a wait.  Engines that combine both advance the grammar over the
drafts on the host, which needs the drafts there; the toy proposes them on the device.
"""

from __future__ import annotations

import string

import torch

from .data import CharTokenizer

CONSTRAINTS = ("title_case",)


class TitleCase:
    """After a space only capital letters are allowed; anywhere else, anything is."""

    name = "title_case"

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
