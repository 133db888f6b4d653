"""Issue 34, round thirty-five, engine.  A ``prepare_inputs`` refused (a race on a host buffer,
drafts too deep) had already counted its plan prepared, so a loop that mended the cause and
prepared the same plan again was told it "was already prepared"; a ``process_outputs`` plug-in
that never commits was never named (the engine blamed a dropped step, or the loop's depth); and
naming what a heavy plug-in carries ran its code (an element-wise ``==``, a ``__dict__``
property: their errors escaped instead of the size refusal) or named a bound method's object
as an empty string."""

from __future__ import annotations

import pytest
import torch

import toy_engine as te
from toy_engine import kernels
from toy_engine.sending import NotSendable

PROMPTS = ["Once upon", "The king"]


def _serial_text(prompts=PROMPTS, n=20) -> list[str]:
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        return [c.text for c in engine.generate(prompts, max_new_tokens=n)]


def _all_processed(engine, pending):
    for step in pending:
        engine.process_outputs(step)
    return []


def _oldest_processed(engine, pending):
    while len(pending) > 1:
        engine.process_outputs(pending.pop(0))
    return pending


@pytest.mark.parametrize("drafts, refusal, mended", [
    (0, te.RaceError, _all_processed),  # the host buffer slot of the round two before
    (2, ValueError, _oldest_processed),  # DraftsTooDeep: two decode rounds in flight
])
def test_a_refused_prepare_leaves_no_mark_and_may_come_again(drafts, refusal, mended):
    """Before: ``PreparedTwice: ... round 2's plan, which was already prepared``."""
    loop, retries = _deep_loop(refusal, mended)
    config = te.EngineConfig(mode="zos", num_draft_tokens=drafts)
    with te.Engine(config) as engine:
        outs = engine.generate(PROMPTS, max_new_tokens=20, loop=loop)
    assert retries, "the loop was never refused: the case tests nothing"
    assert [c.text for c in outs] == _serial_text()


def _deep_loop(refusal, mended):
    """A loop that keeps every decode step until a prepare is refused (case 08/09's)."""
    retries = []

    def loop(engine):
        pending = []
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                pending = _all_processed(engine, pending)
                continue
            try:
                inputs = engine.prepare_inputs(plan)
            except refusal:
                retries.append(plan.round)
                pending = mended(engine, pending)
                inputs = engine.prepare_inputs(plan)  # the same plan, its cause mended
            if pending and engine.config.num_draft_tokens:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            step = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(step)
            else:
                pending.append(step)
        _all_processed(engine, pending)
    return loop, retries


def _reads_never_commits(engine, step):
    engine.device.wait(step.sample_done)
    engine.read_outputs(step)  # the tokens read, never handed to the requests


@pytest.mark.parametrize("drafts, error", [(0, te.EngineStalled), (2, ValueError)])
def test_a_process_outputs_that_never_commits_is_named(drafts, error):
    """Before: "was a deferred step dropped instead of processed or flushed?" (no drafts) and
    drafts too deep, "hold one decode step in flight" (the engine's own ZOS loop does)."""
    config = te.EngineConfig(mode="zos", num_draft_tokens=drafts)
    with te.Engine(config) as engine:
        with pytest.raises(error) as raised:
            engine.generate(PROMPTS, max_new_tokens=20, process_outputs=_reads_never_commits)
        said = str(raised.value)
        assert ("process_outputs=_reads_never_commits was given round 0's step and returned "
                "without committing it") in said, said
        assert "engine.commit_outputs(step, tokens)" in said, said
        assert "dropped" not in said, said
        assert [r.finish_reason for r in engine.requests] == ["abort", "abort"]
        assert [c.text for c in engine.generate(PROMPTS, max_new_tokens=20)] == _serial_text()


class _ElementWise:
    """A callable whose ``==`` answers an array (numpy's vectorised functions do)."""

    def __call__(self, x):
        return x

    def __eq__(self, other):
        return torch.arange(3) == 1

    __hash__ = object.__hash__


class _HeavyObject:
    def __init__(self):
        self.table = torch.zeros(2_000_000, dtype=torch.float64)  # 16 MB
        self.helper, self.scale, self.again = (lambda m: m), _ElementWise(), _ElementWise()

    def __call__(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)


class _DictProperty:
    table = torch.zeros(1_600_000, dtype=torch.float64)  # 12.8 MB, sent by its __reduce__

    def __call__(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)

    def __reduce__(self):
        return _DictProperty, (), {"t": self.table}

    def __setstate__(self, state):
        pass

    @property
    def __dict__(self):
        raise RuntimeError("plug-in code ran: __dict__")


class _Fixer:
    def __init__(self):
        self.table = torch.zeros(1_600_000, dtype=torch.float64)  # 12.8 MB

    def fix(self, meta, accepted, block_size):
        kernels.correct_seqlens_qk(meta, accepted, block_size)


@pytest.mark.parametrize("correction, label, named", [
    (_HeavyObject(), "correction=_HeavyObject", ": attribute `.table` (16.0 MB))"),
    (_DictProperty(), "correction=_DictProperty", "with what it reads); at most"),
    (_Fixer().fix, "correction=fix", ": attribute `.table` (12.8 MB))"),
])
def test_a_heavy_plug_in_is_refused_without_running_its_code(correction, label, named):
    """Before: ``ValueError: The truth value of an array ... is ambiguous``, ``RuntimeError:
    plug-in code ran: __dict__``, and "with what it reads:  (12.8 MB)"."""
    config = te.EngineConfig(mode="zos", num_draft_tokens=2)
    with te.Engine(config) as engine:
        with pytest.raises(NotSendable) as raised:
            engine.generate(PROMPTS, max_new_tokens=8, correction=correction)
        said = str(raised.value)
        assert said.startswith(f"{label} carries ") and named in said, said
        assert len(engine.generate(PROMPTS, max_new_tokens=4)) == 2
