"""Tests for overlap_course.train and the shipped checkpoint it produces."""

import math

import pytest
import torch

from toy_engine.data import ALPHABET, CharTokenizer
from toy_engine.model import CHECKPOINT, load_model
from overlap_course.train import evaluate, load_data, lr_at, main, sample_text, train

# Small enough to run in a second or two; one thread avoids oversubscription
# slowdowns when the machine is busy (determinism holds for any fixed count).
TINY = dict(batch_size=4, block_size=32, progress=False, evals=1, threads=1)

# Measured val loss of the shipped checkpoint on VAL_WINDOWS windows of 256 tokens
# (float64): 0.2162 (0.2243 on 64 windows, as stored in the checkpoint info).
# The bound leaves room for a retrained, slightly worse model.
VAL_WINDOWS = 16
VAL_BOUND = 0.4


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def shipped():
    return load_model()


@pytest.fixture
def one_thread():
    """torch on one thread while the shipped model writes: its 250 full forwards took 28.7 s on
    two threads beside two busy processes (29 s in CI), 2.6 s on one; 1.9 s and 2.8 s unloaded.
    What it writes is the same (greedy, float64)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- training ---------------------------------------------------------------

def test_same_seed_gives_bit_identical_weights():
    a, info_a = train(steps=6, seed=3, **TINY)
    b, info_b = train(steps=6, seed=3, **TINY)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert info_a["val_loss"] == info_b["val_loss"]
    c, _ = train(steps=6, seed=4, **TINY)
    assert not torch.equal(c.tok_emb.weight, a.tok_emb.weight)


def test_loss_decreases(tok):
    _, val = load_data(tok)
    torch.manual_seed(0)
    model, info = train(steps=40, seed=0, lr=5e-3, **TINY)
    # An untrained model predicts ~uniformly: loss ~ ln(vocab_size) ~ 4.1.
    assert info["val_loss"] < math.log(tok.vocab_size) - 1.0
    assert info["train_loss"] < math.log(tok.vocab_size) - 1.0
    assert evaluate(model, val, 32) == pytest.approx(info["val_loss"])


def test_train_restores_thread_count():
    before = torch.get_num_threads()
    train(steps=1, **{**TINY, "threads": 3})
    assert torch.get_num_threads() == before


def test_lr_schedule_warmup_then_cosine():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_cli_writes_a_loadable_checkpoint(tmp_path, tok, capsys):
    out = tmp_path / "sub" / "ckpt.pt"
    main(["--steps", "2", "--batch-size", "2", "--block-size", "16", "--sample", "0",
          "--out", str(out)])
    assert "parameters" in capsys.readouterr().out
    model, alphabet = load_model(out)  # weights_only load: info must be plain data
    assert alphabet == ALPHABET
    info = torch.load(out, weights_only=True)["info"]
    assert info["steps"] == 2 and info["block_size"] == 16
    assert set(info) >= {"seed", "train_loss", "val_loss", "train_seconds", "torch_version"}
    assert sample_text(model, tok, "Once", 5).startswith("Once")


# --- the shipped checkpoint -------------------------------------------------

def test_shipped_checkpoint_matches_tokenizer_and_is_small(shipped, tok):
    model, alphabet = shipped
    assert alphabet == ALPHABET
    assert model.cfg.vocab_size == tok.vocab_size
    assert model.cfg.context_len >= 256
    assert CHECKPOINT.stat().st_size <= 5 * 1024 * 1024


def test_shipped_checkpoint_generates_corpus_like_text(shipped, tok, one_thread):
    model, _ = shipped
    text = sample_text(model, tok, "Once", 250)
    # ~70% of corpus stories open with "Once upon a time, ..."; greedy must follow.
    assert text.startswith("Once upon a time, there ")
    assert " named " in text and "." in text
    assert set(text) <= set(ALPHABET)
    assert len(text) > 100


def test_shipped_checkpoint_val_loss(shipped, tok):
    model, _ = shipped
    _, val = load_data(tok)
    assert evaluate(model, val, 256, max_windows=VAL_WINDOWS) < VAL_BOUND
