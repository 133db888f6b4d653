"""Issue 34, round thirty-three (exercise 04): a correction compiled by ``torch.jit.script``.

TorchScript runs the function where no ``TorchFunctionMode`` sees its operations: the checker
counted none on tensors with values and the run on tensors without values failed, so a
correction with the right values was told it reads its values on the host (round 32's
finding).  It is now told that a scripted correction cannot be checked, and to pass the plain
function; the same function, plain, passes."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from overlap_course import checks

SCRIPTED = textwrap.dedent('''
    from typing import Dict
    import torch

    def correct_seqlens_qk(meta: Dict[str, torch.Tensor], accepted: torch.Tensor,
                           block_size: int):
        delta = accepted[meta["rows"]] * meta["pending"]
        owner = torch.repeat_interleave(torch.arange(delta.size(0), device=delta.device),
                                        meta["seqlens_q"], output_size=meta["positions"].size(0))
        meta["seqlens_k"].add_(delta)
        meta["positions"].add_(delta[owner])
        column = torch.div(meta["positions"], block_size, rounding_mode="floor")
        block = meta["block_tables"][owner, column]
        meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)

    scripted = torch.jit.script(correct_seqlens_qk)
''')


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "scripted_correction.py"  # TorchScript compiles from the source file
    path.write_text(SCRIPTED)
    spec = importlib.util.spec_from_file_location("scripted_correction", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def test_a_scripted_correction_is_told_it_cannot_be_checked(module):
    v = checks.check_correction(module.scripted)
    assert not v.passed and v.category == "scripted", v
    assert "torch.jit.script" in v.message and "plain function" in v.message, v.message
    assert "on the host:" not in v.message, v.message


def test_the_same_correction_plain_passes(module):
    v = checks.check_correction(module.correct_seqlens_qk)
    assert v.passed, v.message


# A correction that slices its token map from a table made once in the notebook: the CPU
# stand-in's device process receives a notebook's function by value, its globals with it, at
# every launch (round 33: 128 MB made exercise 04's check run past its 30 s limit and be told
# its code never ended; 64 MB took 25.8 s).  The table is made on the host, so exercise 04's
# check refuses it as a host tensor since round 51 (an error on a GPU); the engine still
# refuses to send a large one, naming it.
TABLE_CORRECTION = '''
def correct_seqlens_qk(meta, accepted, block_size):
    B = len(meta["seqlens_q"])
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.repeat_interleave(TABLE[:B], meta["seqlens_q"],
                                    output_size=len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    p = meta["positions"]
    meta["slot_mapping"].copy_(meta["block_tables"][owner, p // block_size] * block_size
                               + p % block_size)
'''


def _notebook_correction(entries: int):
    """The correction as a notebook defines it (``__main__``: sent by value), with a table."""
    import torch
    space = {"__name__": "__main__", "torch": torch, "TABLE": torch.arange(entries)}
    exec(compile(TABLE_CORRECTION, "<cell>", "exec"), space)
    return space["correct_seqlens_qk"]


def test_a_correction_carrying_a_large_table_is_refused_naming_it():
    import toy_engine as te
    config = te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=2)
    with te.Engine(config) as engine:
        with pytest.raises(TypeError) as raised:
            engine.generate(["Once upon"], max_new_tokens=4,
                            correction=_notebook_correction(2_000_000))
        said = str(raised.value)
        assert "carries 16.0 MB" in said and "`TABLE` (16.0 MB)" in said, said
        assert "at most 10 MB" in said and "inside the function" in said, said
        small = _notebook_correction(100_000)  # 0.8 MB: sent, and right
        outs = engine.generate(["Once upon"], max_new_tokens=4, correction=small)
        assert outs[0].finish_reason == "length"
    v = checks.check_correction(_notebook_correction(2_000_000))
    assert not v.passed and v.category == "host_tensor", v
    assert "still running" not in v.message and "failed on the device" not in v.message, v
