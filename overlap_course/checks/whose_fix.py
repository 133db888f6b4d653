"""Whose correction computed exercise 04(a)'s values: the engine's own
``te.kernels.correct_seqlens_qk``, which the exercise asks the learner to write, or the learner's.
The same rule as exercises 02 and 03's loops (``whose_loop``): what ran decides, not the name."""

from __future__ import annotations

import sys

from torch.utils._python_dispatch import TorchDispatchMode

from toy_engine import kernels

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


class _Watch(TorchDispatchMode):
    """Whether any tensor operation ran with the engine's correction on the stack.  A dispatch
    mode, not a function mode: ``torch._C.DisableTorchFunction()`` does not hide an operation
    from it."""

    def __init__(self):
        super().__init__()
        self.ran = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.ran:
            self.ran = _engine_fix_above(sys._getframe(1))
        return func(*args, **(kwargs or {}))


def engine_fix(fn, meta: dict, accepted, block_size: int) -> Verdict | None:
    """The verdict on a correction whose call ran the engine's own, or None.  Last, after the
    engine's run: a correction that hands over after a mistake of its own hears of that mistake."""
    watch = _Watch()
    with watch:
        fn(meta, accepted, block_size)
    if not watch.ran:
        return None
    return fails("engine_fix",
                 "your function's values come from the engine's own correction, "
                 "`te.kernels.correct_seqlens_qk`, which it ran: the exercise is to write that "
                 "fix yourself from the rules above (read `accepted` by row, shift only pending "
                 "requests, recompute slots through the block table); the engine's is there to "
                 "compare yours with once yours passes")
