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
