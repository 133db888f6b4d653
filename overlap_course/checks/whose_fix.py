"""Whose correction computed exercise 04(a)'s values: the engine's own
``te.kernels.correct_seqlens_qk``, which the exercise asks the learner to write, or the learner's
(the same rule as exercises 02 and 03's loops, ``whose_loop``: what ran decides, not the name);
and whether the check saw every operation of a call it counts."""

from __future__ import annotations

import torch

from toy_engine import kernels

from .correction_cases import FIELDS
from .host_waits import stopped
from .op_watch import Watch, hidden_ops
from .verdict import Verdict, fails

# The engine's correction by its code: its content (a copy pasted whole, docstring and all, or
# ``code.replace`` with nothing changed) or its place in its file (rebuilt from its code object
# with a part changed).  A correction typed from the rules, its own docstring or none, is new code.
_FIX = kernels.correct_seqlens_qk.__code__
_HELD = (_FIX.co_code, _FIX.co_consts, _FIX.co_names, _FIX.co_varnames)
_PLACE = (_FIX.co_filename, _FIX.co_firstlineno)


def _engine_fix_above(frame) -> bool:
    while frame is not None:
        code = frame.f_code
        if (code.co_filename, code.co_firstlineno) == _PLACE or (
                code.co_code, code.co_consts, code.co_names, code.co_varnames) == _HELD:
            return True
        frame = frame.f_back
    return False


def engine_fix(fn, meta: dict, accepted, block_size: int, expected: dict) -> Verdict | None:
    """The verdict on a correction whose call ran the engine's own (or ran where the check
    cannot see whose code ran), or None.  Last, after the engine's run: a correction that hands
    over after a mistake of its own hears of that mistake."""
    given = {name: t.clone() for name, t in meta.items()}
    with Watch(look_for=_engine_fix_above) as watch:
        fn(meta, accepted, block_size)
    got = {name: meta[name].tolist() for name in FIELDS}
    if got != expected:  # round 52: a correction that does nothing while a mode watches
        wrong = next(name for name in FIELDS if got[name] != expected[name])
        if all(torch.equal(meta[name], given[name]) for name in FIELDS):
            return stopped("a later call of the worked case (its tensor operations watched)")
        return fails("stopped", f"your correction passed the cases, but on a later call of the "
                                f"worked case (its tensor operations watched) {wrong} is "
                                f"{got[wrong]}, expected {expected[wrong]}: does it do "
                                f"differently when watched?")
    verdict = hidden_ops(meta, given, watch)
    if verdict is not None:
        return verdict
    if not watch.found:
        return None
    return fails("engine_fix",
                 "your function's values come from the engine's own correction, "
                 "`te.kernels.correct_seqlens_qk`, which it ran: the exercise is to write that "
                 "fix yourself from the rules above (read `accepted` by row, shift only pending "
                 "requests, recompute slots through the block table); the engine's is there to "
                 "compare yours with once yours passes")
