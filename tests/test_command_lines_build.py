"""The instructor's and maintainer's command lines (slides, handout, notebooks, train, corpus)
answer junk with one line and exit 2, like the learner's ones (issue 34, hostile round three):
before, each of these cases ended in a traceback from nbformat, torch or pathlib, or (corpus)
ignored its arguments.  Training writes its checkpoint whole or not at all."""

import zipfile

import pytest
import torch

from overlap_course import corpus, train
from overlap_course.build import handout, notebooks, slides


def _refused(main, argv, capsys):
    """Run ``main(argv)``: it must stop with exit 2 and one line on stderr; returns the line."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def junk(tmp_path):
    (tmp_path / "plain").write_text("x")
    (tmp_path / "text.ipynb").write_text("# not JSON")
    (tmp_path / "empty.ipynb").write_text("{}")
    (tmp_path / "cells.ipynb").write_text('{"cells": 5}')
    (tmp_path / "bytes.ipynb").write_bytes(b"\xff\xfe")
    return tmp_path


CASES = [
    (slides.main, ["{d}/nope.ipynb"], "no such notebook"),
    (slides.main, ["{d}"], "is not a file"),
    (slides.main, ["{d}/text.ipynb"], "is not a notebook (NotJSONError"),
    (slides.main, ["{d}/empty.ipynb"], "is not a notebook (ValidationError"),
    (slides.main, ["--out", "{d}/plain"], "is a file, not a folder"),
    (slides.main, ["--out", "{d}/plain/x"], "which is a file, not a directory"),
    (slides.main, ["--out", ""], "--out is empty"),
    (handout.main, ["--out", "{d}/plain"], "is a file, not a folder"),
    (handout.main, ["--out", "{d}/plain/deeper/x"], "which is a file, not a directory"),
    (notebooks.main, ["execute", "{d}/nope.ipynb"], "no such notebook"),
    (notebooks.main, ["execute", "{d}/text.ipynb"], "is not a notebook"),
    (notebooks.main, ["images", "{d}/cells.ipynb"], "is not a notebook (TypeError"),
    (notebooks.main, ["images", "{d}/bytes.ipynb"], "is not a notebook (UnicodeDecodeError"),
    (notebooks.main, ["images", "/dev/zero"], "is not a file"),
    (notebooks.main, ["check", "extra"], "unrecognized arguments: extra"),
    (corpus.main, ["--nope"], "unrecognized arguments: --nope"),
    (corpus.main, ["x"], "unrecognized arguments: x"),
    (train.main, ["--steps", "0"], "--steps: must be from 1 to 1000000, got 0"),
    (train.main, ["--steps", "-5"], "--steps: must be from 1 to 1000000"),
    (train.main, ["--lr", "nan"], "--lr: must be a finite number"),
    (train.main, ["--batch-size", "0"], "--batch-size: must be from 1"),
    (train.main, ["--threads", "0"], "--threads: must be from 1"),
    (train.main, ["--block-size", "100000"], "--block-size: must be from 1 to 256"),
    (train.main, ["--sample", "-3"], "--sample: must be from 0"),
    (train.main, ["--out", "{d}"], "names a folder: name a file in it"),
    (train.main, ["--out", "{d}/plain/x.pt"], "which is a file, not a directory"),
    (train.main, ["--out", ""], "--out is empty"),
    (train.main, ["--out", "/proc/x.pt", "--steps", "1"], "cannot write the checkpoint"),
]


@pytest.mark.parametrize("main,argv,says", CASES,
                         ids=[f"{m.__module__.rsplit('.', 1)[-1]}-{' '.join(a)}"
                              for m, a, _ in CASES])
def test_a_build_command_refuses_junk_in_one_line(main, argv, says, junk, capsys):
    err = _refused(main, [arg.format(d=junk) for arg in argv], capsys)
    assert says in err, err


def _quick_fit(*args):
    model = train.TinyGPT(train.GPTConfig(vocab_size=train.CharTokenizer().vocab_size))
    return model, {"train_loss": 1.0, "val_loss": 1.0, "train_seconds": 0.0}


def test_a_checkpoint_is_written_whole_under_the_archive_name_torch_gives_it(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(train, "_fit", _quick_fit)
    out = tmp_path / "tiny_gpt.pt"
    train.train(out=out)
    assert zipfile.ZipFile(out).namelist()[0].startswith("tiny_gpt/")  # as the shipped one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_gpt.pt"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_a_training_stopped_keeps_the_old_checkpoint_and_leaves_nothing(stop, tmp_path,
                                                                        monkeypatch, capsys):
    out = tmp_path / "tiny_gpt.pt"
    out.write_bytes(b"the old checkpoint")

    def stopped(*args):
        raise stop
    monkeypatch.setattr(train, "_fit", stopped)
    code = train.main(["--out", str(out), "--sample", "0"])
    err = capsys.readouterr().err
    assert code == (130 if stop is KeyboardInterrupt else 2), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out.read_bytes() == b"the old checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny_gpt.pt"]


def test_a_save_stopped_halfway_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "tiny_gpt.pt"
    out.write_bytes(b"the old checkpoint")
    monkeypatch.setattr(train, "_fit", _quick_fit)

    def torn(obj, path):
        open(path, "wb").write(b"half")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(KeyboardInterrupt):
        train.train(out=out)
    assert out.read_bytes() == b"the old checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny_gpt.pt"]
