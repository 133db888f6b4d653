"""The character tokenizer, and the alphabet the shipped model was trained on.  Character tokens
keep the vocabulary tiny and make the drafter a lookup table; the training text is the course's
(``overlap_course/corpus.py``)."""

import operator
from collections.abc import Iterable

#: Every character the corpus uses, sorted by code point.  Token ids are positions in this
#: string, so a trained checkpoint depends on it: do not reorder or extend it without retraining.
ALPHABET: str = "\n !',-.:?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    """Ids ``0..len(alphabet)-1`` are the characters in order, ``len(alphabet)`` is EOS (ends a document)."""

    def __init__(self, alphabet: str = ALPHABET) -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet contains duplicate characters")
        self.alphabet = alphabet
        self.eos_id = len(alphabet)
        self.vocab_size = len(alphabet) + 1
        self._char_to_id = {ch: i for i, ch in enumerate(alphabet)}

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (no EOS); unknown characters are an error naming them all (up to 20)."""
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
        """The text of ``ids``; EOS decodes to nothing (a finished request's output decodes whole)."""
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
