"""Issue 34, round thirty-seven, engine and grading.  A heavy plug-in that is a classmethod or a
bound method of a callable object (a ``torch.nn.Module``'s ``forward``) was named as an empty
string; one whose table sits in a function attribute, ``__slots__`` or a Module's buffer was
not named, or named by torch's ``._buffers``; a right correction under a
``@contextlib.contextmanager`` decorator was refused as carrying "a generator" the learner never
wrote; and a copy of this run's own plan was blamed on "another run"."""

from __future__ import annotations

import copy

import pytest

import toy_engine as te
from toy_engine.sending import NotSendable

# A notebook's cells (``__main__``: its classes and functions are sent by value)
CELLS = '''
import contextlib, dataclasses
import torch
from toy_engine import kernels

class C:
    table = torch.zeros(5_000_000)  # 20 MB
    @classmethod
    def corr(cls, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

class K:
    def __init__(self):
        self.table = torch.zeros(5_000_000)
    def __call__(self, meta, accepted, block_size):
        self.fix(meta, accepted, block_size)
    def fix(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.zeros(5_000_000))
    def forward(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

def with_attribute(meta, accepted, block_size):
    kernels.correct_seqlens_qk(meta, accepted, block_size)
with_attribute.table = torch.zeros(5_000_000)

class S:
    __slots__ = ("table",)
    def __init__(self):
        self.table = torch.zeros(5_000_000)
    def __call__(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

@dataclasses.dataclass(slots=True)
class DC:
    table: object
    def __call__(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

@contextlib.contextmanager
def quiet():
    yield

@quiet()
def decorated(meta, accepted, block_size):
    kernels.correct_seqlens_qk(meta, accepted, block_size)
'''


@pytest.fixture(scope="module")
def cells():
    space = {"__name__": "__main__"}
    exec(compile(CELLS, "<cell>", "exec"), space)
    return space


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(mode="zos", num_draft_tokens=2)) as it:
        yield it


@pytest.mark.parametrize("made, named", [
    (lambda c: c["C"].corr, "class attribute `.table` (20.0 MB)"),
    (lambda c: c["K"]().fix, "attribute `.table` (20.0 MB)"),
    (lambda c: c["M"]().forward, "attribute `.table` (20.0 MB)"),  # before: `._buffers`
    (lambda c: c["with_attribute"], "function attribute `.table` (20.0 MB)"),
    (lambda c: c["S"](), "attribute `.table` (20.0 MB)"),
    (lambda c: c["DC"](c["torch"].zeros(5_000_000)), "attribute `.table` (20.0 MB)"),
])
def test_a_heavy_plug_in_names_its_table_wherever_it_sits(cells, engine, made, named):
    """Before: "with what it reads:  (20.0 MB)" (an empty name), or nothing named."""
    with pytest.raises(NotSendable) as raised:
        engine.generate(["Once upon"], max_new_tokens=6, correction=made(cells))
    assert f"with what it reads: {named})" in str(raised.value), raised.value


def test_a_contextmanager_decorator_is_named_as_what_cannot_be_sent(cells, engine):
    with pytest.raises(NotSendable) as raised:
        engine.generate(["Once upon"], max_new_tokens=6, correction=cells["decorated"])
    said = str(raised.value)
    assert "a @contextlib.contextmanager decorator's state, which holds a generator" in said, said
    assert "a class-based decorator does not" in said, said
    assert len(engine.generate(["Once upon"], max_new_tokens=4)) == 1


def test_a_copy_of_this_runs_plan_is_named_a_copy(engine):
    """Before: ForeignStep, "scheduled by another run ... Was `plan` kept from that run?"."""
    def loop(eng):
        eng.prepare_inputs(copy.copy(eng.schedule()))

    with pytest.raises(ValueError) as raised:
        engine.generate(["Once upon"], max_new_tokens=4, loop=loop)
    said = str(raised.value)
    assert "gave engine.prepare_inputs() a Plan that engine.schedule() did not return (a copy" \
        in said and "another run" not in said, said
    assert [r.finish_reason for r in engine.requests] == ["abort"]
