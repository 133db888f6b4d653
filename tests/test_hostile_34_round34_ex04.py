"""Issue 34, round thirty-four (exercise 04, a blind learner).

- A right correction (a plain ``def``) calling a small helper compiled by ``torch.jit.script``
  was told it reads its values on the host: TorchScript runs the helper where the checker's
  operation counts cannot see.  It now gets round 33's ``scripted`` verdict, naming the helper.
- A correction carrying 16 MB in a ``functools.partial``'s argument or a callable object's
  attribute was refused as ``correction=watched`` (the checker's wrapper) and blamed on "the
  globals its code reads", naming none: the refusal now names the learner's plug-in and where
  the weight is (the partial's ``table=``, the attribute ``.table``)."""

from __future__ import annotations

import functools
import importlib.util
import textwrap

import pytest
import torch

from overlap_course import checks
from toy_engine.kernels import correct_seqlens_qk

HELPER = textwrap.dedent('''
    import torch

    @torch.jit.script
    def shift_of(accepted: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
        return accepted * pending

    def correct_seqlens_qk(meta, accepted, block_size):
        delta = shift_of(accepted[meta["rows"]], meta["pending"])
        owner = torch.repeat_interleave(torch.arange(len(delta), device=meta["seqlens_q"].device),
                                        meta["seqlens_q"],
                                        output_size=len(meta["positions"]))
        meta["seqlens_k"] += delta
        meta["positions"] += delta[owner]
        p = meta["positions"]
        meta["slot_mapping"].copy_(meta["block_tables"][owner, p // block_size] * block_size
                                   + p % block_size)
''')


def test_a_correction_calling_a_scripted_helper_is_told_so(tmp_path):
    path = tmp_path / "scripted_helper.py"  # TorchScript compiles from the source file
    path.write_text(HELPER)
    spec = importlib.util.spec_from_file_location("scripted_helper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    v = checks.check_correction(module.correct_seqlens_qk)
    assert not v.passed and v.category == "scripted", v
    assert "calls `shift_of`, compiled by `torch.jit.script`" in v.message, v.message
    assert "on the host:" not in v.message, v.message


class Corrector:
    def __init__(self):
        self.table = torch.zeros(2_000_000, dtype=torch.float64)  # 16 MB

    def __call__(self, meta, accepted, block_size):
        return correct_seqlens_qk(meta, accepted, block_size)


def _with_table(meta, accepted, block_size, table=None):
    return correct_seqlens_qk(meta, accepted, block_size)


@pytest.mark.parametrize("correction, label, where", [
    (functools.partial(_with_table, table=torch.zeros(2_000_000, dtype=torch.float64)),
     "correction=partial", "the partial's `table=` (16.0 MB)"),
    (Corrector(), "correction=Corrector", "attribute `.table` (16.0 MB)"),
])
def test_a_heavy_partial_or_object_is_named_with_where_its_weight_is(correction, label, where):
    v = checks.check_correction(correction)
    assert not v.passed and f"{label} carries 16.0 MB" in v.message, v.message
    assert f"with what it reads: {where}" in v.message, v.message
    assert "watched" not in v.message, v.message
    assert "refused to send your correction" in v.message, v.message
