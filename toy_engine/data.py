"""The character tokenizer, and the alphabet the shipped model was trained on.

Character tokens keep the vocabulary tiny (small embedding and output layers) and make the
drafter a lookup table.  The training text, seeded synthetic stories, is the course's
(``overlap_course/corpus.py``): the engine only reads and writes text.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

#: Every character the corpus uses, sorted by code point.  Token ids are positions in this
#: string, so a trained checkpoint depends on it: do not reorder or extend it without retraining.
ALPHABET: str = "\n !',-.:?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    """Maps each character of an alphabet to one token id, plus an EOS id: ids
    ``0..len(alphabet)-1`` are the characters in order, ``len(alphabet)`` is end-of-sequence
    (it ends training documents and finishes requests)."""

    def __init__(self, alphabet: str = ALPHABET) -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet contains duplicate characters")
        self.alphabet = alphabet
        self.eos_id = len(alphabet)
        self.vocab_size = len(alphabet) + 1
        self._char_to_id = {ch: i for i, ch in enumerate(alphabet)}

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (no EOS added).  An unknown character is an error, not
        dropped, and the message names them all (the first 20): the prompt is fixed in one go."""
        lookup = self._char_to_id
        try:
            return [lookup[ch] for ch in text]
        except KeyError:
            unknown = list(dict.fromkeys(ch for ch in text if ch not in lookup))  # in order, once each
            noun = "character" if len(unknown) == 1 else "characters"
            more = f" and {len(unknown) - 20:,} more" if len(unknown) > 20 else ""  # a bounded message
            raise ValueError(f"unknown {noun} {', '.join(map(repr, unknown[:20]))}{more} in text; "
                             f"the tokenizer knows only: {self.alphabet!r}") from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (any integer-like ids); EOS decodes to nothing, so a finished
        request's whole output decodes without special-casing its last token."""
        chars = []
        for raw in ids:
            i = operator.index(raw)
            if i == self.eos_id:
                continue
            if not 0 <= i < self.eos_id:
                raise ValueError(f"token id {i} is outside the vocabulary (valid ids: 0..{self.vocab_size - 1})")
            chars.append(self.alphabet[i])
        return "".join(chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, alphabet={self.alphabet!r})"
