"""Issue 34, round thirty-eight, engine.  A callable object that grew past the limit mid-run (or
took in a lock) was named at its launch as the engine's own wrapper's ``closure variable
`plugin```; a plug-in whose ``__class__`` property raises had that error replace the refusal;
and a ``functools.cache`` correction ran until its first launch failed on the device with
"unhashable type: 'dict'"."""

from __future__ import annotations

import functools
import threading

import pytest
import torch

import toy_engine as te
from toy_engine import kernels
from toy_engine.sending import NotSendable

CELLS = '''
from toy_engine import kernels

class Fix:
    def __call__(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

class Proxyish:
    @property
    def __class__(self):
        raise RuntimeError("my __class__ ran")
    def __reduce__(self):
        raise RuntimeError("my __class__ ran")
    def __call__(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)
'''


@pytest.fixture(scope="module")
def cells():
    space = {"__name__": "__main__"}
    exec(compile(CELLS, "<cell>", "exec"), space)
    return space


@pytest.mark.parametrize("grown, said", [
    (lambda: torch.zeros(5_000_000), "with what it reads: attribute `.table` (20.0 MB))"),
    (threading.Lock, "(in attribute `.table`: a lock)"),
])
def test_a_plug_in_grown_mid_run_is_named_by_its_attribute(cells, grown, said):
    """Before: "closure variable `plugin` (20.0 MB)", the engine's wrapper's."""
    fix = cells["Fix"]()

    def on_round(engine, rnd):
        if rnd == 3:
            fix.table = grown()

    with te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=2)) as engine:
        with pytest.raises(NotSendable) as raised:
            engine.generate(["Once upon", "The cat"], max_new_tokens=8, correction=fix,
                            on_round=on_round)
        assert "round 3's correct launch" in str(raised.value) and said in str(raised.value)
        assert "plugin" not in str(raised.value), raised.value


def test_a_plug_ins_own_error_never_replaces_the_refusal(cells):
    with te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=2)) as engine:
        with pytest.raises(NotSendable, match="cannot be sent to the CPU stand-in"):
            engine.generate(["Once upon"], max_new_tokens=4, correction=cells["Proxyish"]())
        assert len(engine.generate(["Once upon"], max_new_tokens=4)) == 1


def test_a_cached_correction_is_refused_as_the_run_starts():
    """Before: ``DeviceError: TypeError: unhashable type: 'dict' (in kernel 'correct')``."""
    @functools.cache
    def correct(meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

    with te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=2)) as engine:
        with pytest.raises(TypeError, match=r"correction=correct is cached \(functools.cache"):
            engine.generate(["Once upon"], max_new_tokens=4, correction=correct)
        assert engine.requests == [] or all(r.finish_reason for r in engine.requests)
        assert len(engine.generate(["Once upon"], max_new_tokens=4)) == 1
