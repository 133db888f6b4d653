"""Tests for the tokenizer (toy_engine.data), the training corpus and its splitting
(overlap_course.corpus), and the drafter's table the engine ships, built from that corpus."""

from collections import Counter, defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overlap_course.corpus import corpus_token_stream, generate_corpus, ngram_table_of_the_corpus, split_train_val
from toy_engine.data import ALPHABET, CharTokenizer
from toy_engine.drafter import NGRAM_TABLE, ngram_table


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(seed=0)


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


# --- alphabet / tokenizer ---------------------------------------------------

def test_alphabet_sorted_unique_and_has_basics():
    assert ALPHABET == "".join(sorted(set(ALPHABET)))
    for ch in " \n.,!?'abcxyzABCXYZ":
        assert ch in ALPHABET


def test_vocab_and_eos(tok):
    assert tok.alphabet == ALPHABET
    assert tok.vocab_size == len(ALPHABET) + 1
    assert tok.eos_id == len(ALPHABET)
    assert tok.encode("") == []
    assert tok.decode([]) == ""
    assert tok.decode([tok.eos_id]) == ""
    ids = tok.encode("Hi.")
    assert tok.decode(ids + [tok.eos_id]) == "Hi."
    assert tok.decode([tok.eos_id] + ids + [tok.eos_id]) == "Hi."
    assert "CharTokenizer" in repr(tok) and str(tok.vocab_size) in repr(tok)


def test_ids_follow_alphabet_order(tok):
    assert tok.encode(ALPHABET) == list(range(len(ALPHABET)))


def test_round_trip_on_corpus(tok, corpus):
    for doc in corpus[:200]:
        assert tok.decode(tok.encode(doc)) == doc


def test_unknown_characters_named_in_error(tok):
    with pytest.raises(ValueError) as exc:
        tok.encode("a#b é #")
    msg = str(exc.value)
    assert "'#'" in msg and "'é'" in msg
    assert msg.index("'#'") < msg.index("'é'")  # order of first appearance
    assert msg.count("'#'") == 1  # deduplicated
    assert "knows only" in msg


@pytest.mark.parametrize("bad", [-1, len(ALPHABET) + 1, 10_000])
def test_decode_out_of_range_raises(tok, bad):
    with pytest.raises(ValueError, match=str(bad)):
        tok.decode([0, bad])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=ALPHABET))
def test_round_trip_property(text):
    tok = CharTokenizer()
    assert tok.decode(tok.encode(text)) == text


# --- corpus ---------------------------------------------------------------

def test_corpus_deterministic_and_seed_dependent(corpus):
    assert generate_corpus(seed=0) == corpus
    assert generate_corpus(seed=1) != corpus


@pytest.mark.parametrize("num_chars", [5_000, 50_000, 300_000])
def test_corpus_size(num_chars):
    docs = generate_corpus(seed=0, num_chars=num_chars)
    total = sum(map(len, docs))
    assert 0.8 * num_chars <= total <= 1.2 * num_chars


def test_corpus_characters_and_shape(corpus):
    assert set("".join(corpus)) <= set(ALPHABET)
    for doc in corpus:
        assert doc.endswith(".")
        assert 100 <= len(doc) <= 600
    lengths = sorted(map(len, corpus))
    median = lengths[len(lengths) // 2]
    assert 150 <= median <= 500


def test_corpus_mostly_once_upon_a_time(corpus):
    frac = sum(d.startswith("Once upon a time") for d in corpus) / len(corpus)
    assert 0.5 <= frac < 0.95  # many, but not all: other openings exist
    assert all(d.startswith("Once upon a time") for d in corpus if d.startswith("Once"))


def test_corpus_bigram_draftable_but_not_trivial(corpus):
    """A most-frequent-next-char table should be right often, not always."""
    table = defaultdict(Counter)
    for doc in corpus:
        for a, b in zip(doc, doc[1:]):
            table[a][b] += 1
    hits = sum(c.most_common(1)[0][1] for c in table.values())
    total = sum(sum(c.values()) for c in table.values())
    accuracy = hits / total
    print(f"bigram next-char accuracy: {accuracy:.4f}")
    assert 0.35 <= accuracy <= 0.9


# --- token stream / split -------------------------------------------------

def test_token_stream(tok):
    docs = ["Once.", "Hi there."]
    stream = corpus_token_stream(docs, tok)
    assert stream == tok.encode("Once.") + [tok.eos_id] + tok.encode("Hi there.") + [tok.eos_id]
    assert tok.decode(stream) == "Once.Hi there."


def test_token_stream_on_corpus(tok, corpus):
    stream = corpus_token_stream(corpus, tok)
    assert stream.count(tok.eos_id) == len(corpus)
    assert len(stream) == sum(map(len, corpus)) + len(corpus)
    assert stream[-1] == tok.eos_id


def test_split_train_val():
    tokens = list(range(1000))
    train, val = split_train_val(tokens)
    assert train + val == tokens
    assert len(val) == 50
    train2, val2 = split_train_val(tokens, val_fraction=0.1)
    assert len(val2) == 100 and val2 == tokens[-100:]
    assert split_train_val(tokens) == (train, val)
    _, tiny_val = split_train_val([1, 2, 3])
    assert tiny_val == [3]
    with pytest.raises(ValueError):
        split_train_val(tokens, val_fraction=0.0)
    with pytest.raises(ValueError):
        split_train_val(tokens, val_fraction=1.0)


# --- the drafter's shipped table ------------------------------------------

def test_the_shipped_ngram_table_is_the_one_the_corpus_builds():
    assert torch.equal(ngram_table(ALPHABET), ngram_table_of_the_corpus()), (
        f"{NGRAM_TABLE} is not the table of overlap_course/corpus.py's corpus: rebuild it with "
        f"`python -m overlap_course.corpus`")


def test_the_shipped_ngram_table_refuses_another_alphabet():
    with pytest.raises(ValueError, match="built for the alphabet .* use num_draft_tokens=0"):
        ngram_table(ALPHABET + "~")
