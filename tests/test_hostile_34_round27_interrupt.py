"""Issue 34, round twenty-seven b: an Interrupt pressed while exercise 04's first run on
valueless (meta) tensors imported torch._dynamo left ``sympy`` half-made in ``sys.modules``, and
every later check of a right correction failed ("module 'sympy' has no attribute 'core'", told
as a host read) until the kernel restarted.  Here the half-made state is made the same way (a
``sympy`` whose ``core`` submodule is in ``sys.modules`` but not set on it), in a process of its
own, as an Interrupt's timing cannot be made exact."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = '''
import sys
import sympy
del sympy.core  # what the interrupted import left: sympy.core in sys.modules, not on sympy
from overlap_course import checks
import torch

def correct_seqlens_qk(meta, accepted, block_size):
    B = meta["seqlens_q"].shape[0]
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    tok = torch.repeat_interleave(torch.arange(B, device=meta["rows"].device), meta["seqlens_q"],
                                  output_size=len(meta["positions"]))
    meta["positions"] += delta[tok]
    blk = meta["block_tables"][tok, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(blk * block_size + meta["positions"] % block_size)

verdict = checks.check_correction(correct_seqlens_qk)
print("PASSED" if verdict.passed else verdict)
'''


@pytest.mark.timeout(300)
def test_a_right_correction_passes_after_an_interrupted_import():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=280)
    assert done.stdout.strip().endswith("PASSED"), (done.stdout[-2000:], done.stderr[-2000:])
