"""Issue 34, round thirty-four (the engine): what a correction carries to the CPU stand-in's
device process, which receives a notebook's function by value with what it reads, at every
launch (round 33 refused one carrying more than 10 MB as ``generate`` starts).

- A heavy correction with a closure cell never filled: the refusal itself raised a bare
  ``ValueError: Cell is empty``.
- The refusal named the wrong thing: a small global, where a default argument, a closure
  variable or a global read only inside a comprehension made it heavy; or a large global that
  the code never reads (an attribute of the same name, ``.data``), not even sent.
- A correction that grows during the run (``on_round`` adds to what it reads) was checked only
  as the run started: sent unrefused, 57 MB a launch; and one that takes in a lock mid-run ended
  in cloudpickle's bare ``TypeError: cannot pickle '_thread.lock' object``.  Both are now named
  at the launch that would send them (``device.sendable``), with the run's label and round, and
  the engine stays usable."""

from __future__ import annotations

import threading

import pytest
import torch

import toy_engine as te
from toy_engine.kernels import correct_seqlens_qk

PROMPTS = ["hello world", "the cat sat"]


def _notebook(source: str, **names):
    """Functions as a notebook defines them (``__main__``: sent by value), with ``names``."""
    space = {"__name__": "__main__", "torch": torch, "correct": correct_seqlens_qk, **names}
    exec(compile(source, "<cell>", "exec"), space)
    return space


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=2)) as built:
        built.reference = [c.text for c in built.generate(PROMPTS, max_new_tokens=8)]
        yield built


def _refused(engine, correction, **plugins) -> str:
    with pytest.raises(TypeError) as raised:
        engine.generate(PROMPTS, max_new_tokens=8, correction=correction, **plugins)
    assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=8)] == engine.reference
    return str(raised.value)


MB = 1_000_000 // 8  # float64 entries per MB


def test_an_empty_closure_cell_does_not_break_the_refusal(engine):
    space = _notebook('''
def outer():
    def correction(meta, accepted, block_size):
        if False:
            print(late)
        BIG.sum()
        return correct(meta, accepted, block_size)
    return correction
    late = 1
''', BIG=torch.zeros(15 * MB, dtype=torch.float64))
    said = _refused(engine, space["outer"]())
    assert "carries 15.0 MB" in said and "global `BIG` (15.0 MB)" in said, said


@pytest.mark.parametrize("source, named", [
    ("def correction(meta, accepted, block_size, table=torch.zeros(30 * MB, dtype=torch.float64)):"
     "\n    SMALL.sum(); table.sum()\n    return correct(meta, accepted, block_size)\n",
     "default `table` (30.0 MB)"),
    ("def outer():\n    table = torch.zeros(30 * MB, dtype=torch.float64)\n"
     "    def correction(meta, accepted, block_size):\n        SMALL.sum(); table.sum()\n"
     "        return correct(meta, accepted, block_size)\n    return correction\n"
     "correction = outer()\n", "closure variable `table` (30.0 MB)"),
    ("def correction(meta, accepted, block_size):\n    SMALL.sum()\n"
     "    [t.sum() for t in TABLES]\n    return correct(meta, accepted, block_size)\n",
     "global `TABLES` (20.0 MB)"),
])
def test_the_refusal_names_what_makes_it_heavy_first(engine, source, named):
    space = _notebook(source, MB=MB, SMALL=torch.zeros(2 * MB, dtype=torch.float64),
                      TABLES=[torch.zeros(10 * MB, dtype=torch.float64) for _ in range(2)])
    said = _refused(engine, space["correction"])
    assert f"with what it reads: {named}" in said, said


def test_an_attribute_named_like_a_large_global_is_not_named(engine):
    space = _notebook('''
def correction(meta, accepted, block_size):
    TABLE.sum()
    meta["seqlens_k"].data
    return correct(meta, accepted, block_size)
''', TABLE=torch.zeros(15 * MB, dtype=torch.float64),
        data=torch.zeros(40 * MB, dtype=torch.float64))
    said = _refused(engine, space["correction"])
    assert "carries 15.0 MB" in said and "global `TABLE` (15.0 MB)" in said, said
    assert "`data`" not in said, said


def test_a_correction_that_grows_mid_run_is_refused_at_that_launch(engine):
    space = _notebook('''
def correction(meta, accepted, block_size):
    len(HISTORY)
    return correct(meta, accepted, block_size)
''', HISTORY=[])

    def grow(engine, round):
        space["HISTORY"].append(torch.zeros(3 * MB, dtype=torch.float64))
    said = _refused(engine, space["correction"], on_round=grow)
    assert said.startswith("correction=correction (round "), said
    assert "launch) carries" in said and "global `HISTORY`" in said, said


def test_a_correction_that_takes_in_a_lock_mid_run_is_named(engine):
    space = _notebook('''
def correction(meta, accepted, block_size):
    len(HELD)
    return correct(meta, accepted, block_size)
''', HELD={})

    def take_lock(engine, round):
        if round == 3:
            space["HELD"]["lock"] = threading.Lock()
    said = _refused(engine, space["correction"], on_round=take_lock)
    assert said.startswith("correction=correction (round 3's correct launch) cannot be sent"), said
    assert "not an engine, a lock, a file or a generator" in said, said
