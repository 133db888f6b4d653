"""Issue 34, round fifty-three, OPEN: exercise 04(a)'s watch (``op_watch.Watch``) records which
storages the operations it saw wrote, so a correction computed on clones with torch's dispatch
modes popped (``torch.utils._python_dispatch._disable_current_modes``) and then copied into
``meta`` with an operation it saw passes: the engine's own correction (4 of 4 points in one real
``nbgrader autograde`` run by round 53's grading helper) and a Python loop over requests.  Not
fixed: a watch that also asks where each seen operation's tensors came from caught both, but
called `torch.tensor(list, device=...)` hidden work (no seen operation makes its storage) and
walks every live object per check; see the closing note of 2026-12-07.  Strict: these fail the day the check
refuses them, so that the marker is removed."""

from __future__ import annotations

import pytest
import torch

import toy_engine as te
from overlap_course import checks

ENGINE_FIX_LAUNDERED = '''
from torch.utils._python_dispatch import _disable_current_modes

def correct_seqlens_qk(meta, accepted, block_size):
    with _disable_current_modes():
        fixed = {k: v.clone() for k, v in meta.items()}
        te.kernels.correct_seqlens_qk(fixed, accepted, block_size)
    for k in ("seqlens_k", "positions", "slot_mapping"):
        meta[k].copy_(fixed[k])
'''

# serious: a loop over requests (46 operations for 3 requests, 76 for 6 when run plainly:
# refused as python_loop) run with both kinds of modes off, its values copied in
LOOP_LAUNDERED = '''
from torch.utils._python_dispatch import _disable_current_modes

def correct_seqlens_qk(meta, accepted, block_size):
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        k, pos = meta["seqlens_k"].clone(), meta["positions"].clone()
        owner = torch.repeat_interleave(torch.arange(len(k), device=k.device), meta["seqlens_q"],
                                        output_size=len(pos))
        for i in range(len(k)):
            d = accepted.index_select(0, meta["rows"][i:i + 1]) * meta["pending"][i:i + 1]
            k[i:i + 1] += d
            pos += d * (owner == i)
        block = meta["block_tables"][owner, pos // block_size]
        slots = block * block_size + pos % block_size
    meta["seqlens_k"].copy_(k)
    meta["positions"].copy_(pos)
    meta["slot_mapping"].copy_(slots)
'''


def _answer(source: str):
    space = {"torch": torch, "te": te}
    exec(compile(source, "<cell>", "exec"), space)
    return space["correct_seqlens_qk"]


@pytest.mark.xfail(strict=True, reason="open since round 53: values computed with torch's "
                                        "dispatch modes popped, then copied in, pass 04(a)")
@pytest.mark.parametrize("source", [ENGINE_FIX_LAUNDERED, LOOP_LAUNDERED],
                         ids=["engine_fix", "loop"])
def test_values_computed_with_the_modes_popped_then_copied_in_are_refused(source):
    verdict = checks.check_correction(_answer(source))
    assert not verdict and verdict.category == "hidden_ops", verdict
