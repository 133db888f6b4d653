"""The training text: seeded synthetic children's stories, and the drafter's table built from them.

Pure Python and deterministic: a notebook rebuilds exactly the same data (so the shipped
checkpoint stays valid) on any machine, with no downloads.  The stories are deliberately
*templated*: a ~1M-parameter character-level GPT must learn them in minutes on a couple of
CPU cores, so the text is highly regular; and the drafter of speculative decoding, a
character n-gram table, is right often enough on the refrains ("Once upon a time", "lived
happily ever after") to be worth it, and wrong often enough on the slot fillers (names,
animals, places) that rejection happens and is worth studying.

``python -m overlap_course.corpus`` rewrites the drafter's table the engine ships
(``toy_engine.drafter.NGRAM_TABLE``) from this corpus; tests/test_data.py checks they agree.
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "corpus")  # first: Ctrl-C while the imports run is one line

import random
import sys
from collections.abc import Iterable, Sequence

import torch

from overlap_course.command_line import Parser, run
from overlap_course.safe_json import write_whole
from toy_engine.data import ALPHABET, CharTokenizer
from toy_engine.drafter import NGRAM, NGRAM_TABLE

# Corpus generation.  Small word lists: big enough that the next word after "named " is
# genuinely uncertain, small enough that a tiny model memorises every option.  No word that
# follows "a" starts with a vowel, so the stories never say "a orange".
_NAMES = [  # (name, subject pronoun)
    ("Lily", "she"), ("Tom", "he"), ("Mia", "she"), ("Ben", "he"),
    ("Anna", "she"), ("Max", "he"), ("Lucy", "she"), ("Sam", "he"),
    ("Emma", "she"), ("Leo", "he"), ("Zoe", "she"), ("Jack", "he"),
    ("Rosa", "she"), ("Finn", "he"), ("Ella", "she"), ("Otto", "he"),
]
_ANIMALS = ["cat", "dog", "rabbit", "bird", "fox", "bear", "mouse", "duck", "frog", "owl", "pig", "lion", "turtle",
            "squirrel"]
_ADJECTIVES = ["gentle", "happy", "brave", "kind", "curious", "shy", "clever", "sleepy", "tiny", "friendly"]
_COLOURS = ["red", "blue", "green", "yellow", "pink", "purple", "golden", "white", "brown", "black"]
_PLACES = ["forest", "park", "garden", "river", "field", "village", "woods", "valley", "meadow", "lake", "town", "cave"]
_OBJECTS = ["ball", "kite", "hat", "box", "book", "boat", "cake", "flower", "drum", "shell", "key", "balloon", "stone",
            "cup"]
_VERBS = ["play", "run", "jump", "sing", "dance", "swim", "read", "draw", "climb", "hide"]
_FEELINGS = ["happy", "sad", "scared", "excited", "proud", "angry", "tired", "surprised"]
_SAD_FEELINGS = ["sad", "scared", "angry", "lonely"]
_WEATHER = ["it started to rain", "the wind blew hard", "the sun came out", "it got dark", "it began to snow"]

# Sentence templates (str.format).  {name}/{he}/{He} are the hero, {animal} its species; {name2}
# is a friend; {animal2..4} are other animals.  Lots of "the", "named", "in the {place}" and
# fixed refrains keep the text predictable for a character n-gram draft; the slots keep it
# from being trivially so.
_ONCE_OPENINGS = [
    "Once upon a time, there was a {adj} little {animal} named {name}.",
    "Once upon a time, there was a {adj} little {animal} named {name}.",
    "Once upon a time, in a land far away, there lived a {colour} {animal} named {name}.",
    "Once upon a time, near the {place}, there lived a {adj} {animal} named {name}.",
]
_OTHER_OPENINGS = [
    "One day, a {adj} {animal} named {name} went to the {place}.",
    "There was a {adj} {animal} called {name} who lived near the {place}.",
    "Long ago, a {colour} {animal} named {name} lived by the {place}.",
    "{name} was a {adj} little {animal}.",
]
_MIDDLES = [
    "Every day, {name} the {animal} liked to {verb} in the {place}.",
    "{He} liked to {verb} with the {colour} {object}.",
    "Every morning, {name} the {animal} went to the {place} to {verb} with the other animals.",
    "One day, {he} found the {colour} {object} near the {place}.",
    "Then {name} met the {adj} {animal2} named {name2}, and they became the best of friends.",
    "{name} the {animal} wanted to {verb}, but the {object} was lost.",
    "Then {name} saw the big {colour} {object} and felt {feeling}.",
    "{name} asked the {animal2}, can we {verb} in the {place} today?",
    "But then {weather}, and the little {animal} felt {feeling}.",
    "{He} looked for the {object} in the {place}, but {he} could not find it.",
    "Then the {animal2} said: let us {verb} together in the {place}!",
    "They went to the {place} and played with the {colour} {object} all day long.",
    "{name} the {animal} was very {feeling}, so {he} sat down under the big tree.",
    "{name} asked the {animal2}, the {animal3} and the {animal4} to come and {verb} in the {place}.",
    "But the {animal3} said no, and the {animal4} said no, and the {animal2} said no too.",
]
_ENDINGS = [  # the classic ending is weighted: it is the best draft target
    "And they all lived happily ever after.",
    "And they all lived happily ever after.",
    "And they all lived happily ever after.",
    "And they all lived happily ever after.",
    "From that day on, {name} was never {sad_feeling} again.",
    "In the end, {name} went home and slept well.",
    "{name} smiled. It was the best day ever.",
    "And {name} and {name2} played together in the {place} every day.",
]
# Slots that may change from one middle sentence to the next, so a story does not repeat one
# place/object/colour/verb throughout.
_REROLLED = {"place": _PLACES, "object": _OBJECTS, "colour": _COLOURS, "verb": _VERBS, "adj": _ADJECTIVES}


def _index(rng: random.Random, n: int) -> int:
    """Uniform index in ``range(n)`` built only on ``rng.random()``: Python promises the same
    ``random()`` sequence for a seed across versions (``choice``/``sample``/``randrange`` do
    not), so the corpus, and any checkpoint trained on it, is reproducible everywhere."""
    return int(rng.random() * n)


def _choice(rng: random.Random, seq: Sequence):
    return seq[_index(rng, len(seq))]


def _distinct(rng: random.Random, seq: Sequence, k: int) -> list:
    """``k`` different items of ``seq`` (no "the cat, the cat and the cat")."""
    pool = list(seq)
    return [pool.pop(_index(rng, len(pool))) for _ in range(k)]


def _story(rng: random.Random) -> str:
    """Build one story: an opening, 2-4 middle sentences, an ending."""
    (name, he), (name2, _) = _distinct(rng, _NAMES, 2)
    animal, animal2, animal3, animal4 = _distinct(rng, _ANIMALS, 4)
    slots = {"name": name, "he": he, "He": he.capitalize(), "name2": name2, "animal": animal, "animal2": animal2,
             "animal3": animal3, "animal4": animal4, "feeling": _choice(rng, _FEELINGS),
             "sad_feeling": _choice(rng, _SAD_FEELINGS), "weather": _choice(rng, _WEATHER)}
    for key, words in _REROLLED.items():
        slots[key] = _choice(rng, words)

    # About 70% of stories open with "Once upon a time": the prompt "Once" has one likely continuation.
    openings = _ONCE_OPENINGS if rng.random() < 0.7 else _OTHER_OPENINGS
    sentences = [_choice(rng, openings).format(**slots)]
    middles = _distinct(rng, _MIDDLES, 2 + _index(rng, 3))
    for template in middles:
        sentences.append(template.format(**slots))
        for key, words in _REROLLED.items():
            if rng.random() < 0.5:
                slots[key] = _choice(rng, words)
    # The ending goes on its own line: it gives the newline character a job, and
    # "\nAnd they all lived happily ever after." is easy to draft.
    ending = _choice(rng, _ENDINGS).format(**slots)
    text = " ".join(sentences) + "\n" + ending
    return text[0].upper() + text[1:]


def generate_corpus(seed: int = 0, num_chars: int = 300_000) -> list[str]:
    """Short stories, about ``num_chars`` in all (less than one story more), byte-identical for
    a seed on every machine and Python version: all randomness comes from
    ``random.Random(seed).random()`` (no ``hash()``, no set order; see ``_index``)."""
    rng = random.Random(seed)
    docs: list[str] = []
    total = 0
    while total < num_chars:
        doc = _story(rng)
        docs.append(doc)
        total += len(doc)
    return docs


def corpus_token_stream(docs: Iterable[str], tokenizer: CharTokenizer) -> list[int]:
    """``docs`` as one flat token list, each followed by EOS: it teaches the model to stop at
    the end of a story, which lets the engine finish requests before ``max_new_tokens``."""
    stream: list[int] = []
    for doc in docs:
        stream.extend(tokenizer.encode(doc))
        stream.append(tokenizer.eos_id)
    return stream


def split_train_val(tokens: Sequence[int], val_fraction: float = 0.05):
    """``(train, val)``: the last ``val_fraction`` of any sliceable sequence is validation.  A
    contiguous tail keeps the split deterministic and the validation text unseen in training
    (only the story cut at the boundary is shared)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if len(tokens) < 2:
        raise ValueError("need at least 2 tokens to split")
    n_val = max(1, int(len(tokens) * val_fraction))
    split = len(tokens) - n_val
    return tokens[:split], tokens[split:]


def build_ngram_table(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Most frequent next token for every (NGRAM-1)-token context (a dense lookup table).

    Contexts never seen in the corpus fall back to the bigram guess from their last
    token.  Ties go to the larger token id, so the table is deterministic.
    """
    n = NGRAM - 1
    key = torch.zeros(len(tokens) - n, dtype=torch.long)
    for j in range(n):
        key = key * vocab + tokens[j: len(tokens) - n + j]
    pairs, counts = torch.unique(key * vocab + tokens[n:], return_counts=True)
    score = counts * vocab + pairs % vocab  # the best next token has the highest score
    best = torch.full((vocab**n,), -1, dtype=torch.long).scatter_reduce(0, pairs // vocab, score, "amax")
    bigram = torch.bincount(tokens[:-1] * vocab + tokens[1:], minlength=vocab * vocab).view(vocab, vocab)
    fallback = bigram.argmax(1)[torch.arange(vocab**n) % vocab]
    return torch.where(best >= 0, best % vocab, fallback)


def ngram_table_of_the_corpus() -> torch.Tensor:
    """The drafter's table over the corpus the shipped model was trained on (seed 0)."""
    tok = CharTokenizer(ALPHABET)
    return build_ngram_table(torch.tensor(corpus_token_stream(generate_corpus(0), tok)), tok.vocab_size)


def save_whole(obj, path) -> None:
    """``torch.save(obj, path)``, whole or not at all (:func:`write_whole`).  torch reports a
    failed write (a full disk) as a ``RuntimeError`` ("unexpected pos ..."): it is an
    ``OSError`` naming ``path`` here, so the commands say it in one line."""
    def save(part):
        try:
            torch.save(obj, part)
        except RuntimeError as err:
            raise OSError(0, f"torch.save could not write it, is the disk full? "
                             f"({str(err).splitlines()[0][:200]})", part) from None
    write_whole(path, save)


def write_ngram_table(path=NGRAM_TABLE) -> None:
    """Store the table as the engine loads it (``toy_engine.drafter.ngram_table``): one byte per entry."""
    save_whole({"alphabet": ALPHABET, "table": ngram_table_of_the_corpus().to(torch.uint8)}, path)


def main(argv=None) -> int:
    Parser(prog="corpus", description="rewrite the drafter's n-gram table from the corpus "
                                      "(takes no arguments)").parse_args(argv)
    write_ngram_table()  # an OSError (a full disk) is one line naming the table (``run``)
    print(f"wrote {NGRAM_TABLE}")
    return 0


if __name__ == "__main__":
    run("corpus", main)
