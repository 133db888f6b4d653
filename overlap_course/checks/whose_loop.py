"""Whose loop ran a check's rounds (exercises 02 and 03): the engine's own (``te.loops``),
which the exercises ask the learner to write instead, or the learner's loop on the engine behind
the checker's view, which the checker cannot watch."""

from __future__ import annotations

import types

from overlap_course.labs import plugins, plugins_2026
from toy_engine import loops

from .verdict import Verdict, fails

# The loops the course ships, by their code: the engine's own (``te.loops``) and the labs'
# (notebook 07's ``keep_in_flight``, 07b's ``batch_queue`` and ``future_key``: closures whose
# inner loop asks for the rounds).  A run whose rounds one of them asked for is not the
# learner's loop (the exercises ask for a loop written from the stage methods).  Its code copied
# (``code.replace``, ``marshal``, its source pasted whole, docstring and all) is still its code:
# compared by what it runs and holds, not by the object or its name.  A loop typed from notebook
# 02's listing is new code (its own docstring, or none).


def _loops_of(module, shown: str) -> list[tuple]:
    """(code, name) of each function of ``module``, nested ones too, that asks for rounds."""
    todo = [f.__code__ for f in vars(module).values()
            if isinstance(f, types.FunctionType) and f.__module__ == module.__name__]
    found = []
    while todo:
        code = todo.pop()
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        if "schedule" in code.co_names:
            found.append((code, f"{shown}.{code.co_qualname.split('.<locals>')[0]}"))
    return found


SHIPPED_LOOPS = (*_loops_of(loops, "te.loops"), *_loops_of(plugins, "plugins"),
                 *_loops_of(plugins_2026, "plugins_2026"))
# Their files: code that says it comes from one of them, above a schedule() call, is one of
# those loops rebuilt from its code object with a part changed (round 50: an extra constant,
# renamed locals, another docstring), whatever its content.  Code built by hand, its file name
# included, is the learner's own.
SHIPPED_FILES = {code.co_filename: shown.rpartition(".")[0] for code, shown in SHIPPED_LOOPS}


# Their content, for a copy pasted whole into a cell (a cell's file name): looked up by bytecode,
# then compared by what else it holds.  Dict look-ups, no call: this runs at every schedule().
_BY_BYTECODE = {code.co_code: (code.co_consts, code.co_names, code.co_varnames, shown)
                for code, shown in SHIPPED_LOOPS}


def engine_loop_above(frame) -> str | None:
    """Which of SHIPPED_LOOPS is on the stack above a ``schedule()`` call, or None: anywhere above,
    so that a proxy of the learner's own between the engine's loop and this view changes
    nothing."""
    while frame is not None:
        code = frame.f_code
        held = _BY_BYTECODE.get(code.co_code)
        if held is not None and held[:3] == (code.co_consts, code.co_names, code.co_varnames):
            return held[3]
        if code.co_filename in SHIPPED_FILES:
            return f"{SHIPPED_FILES[code.co_filename]}.{code.co_name}"
        frame = frame.f_back
    return None


def around_view(rounds: list[int]) -> Verdict:
    """Rounds planned on the engine behind the one the loop was handed (``engine._engine``)."""
    shown = ", ".join(map(str, rounds[:5])) + (f" and {len(rounds) - 5} more" * (len(rounds) > 5))
    which = f"round {shown} was" if len(rounds) == 1 else f"rounds {shown} were"
    return fails("edits_engine",
                 f"{which} planned on `engine._engine`, the shared engine behind the one the "
                 f"checker handed your loop, so the checker could not watch them: call every "
                 f"stage on `engine` itself")


def engine_loop(logs, mode: str) -> Verdict | None:
    """Whether the engine's own loop asked for the rounds of runs that were otherwise right:
    the exercise is the loop itself.  Last, so a loop that hands over after a mistake of its
    own hears of that mistake."""
    name = next((log.engine_loop for log in logs if log.engine_loop is not None), None)
    if name is None:
        return None
    mine = "serial_loop" if mode == "serial" else "zos_loop"
    whose = "the engine's own loop" if name.startswith("te.") else "a loop the course ships"
    return fails("engine_loop",
                 f"the rounds were asked for by {whose}, `{name}`, not by a loop of "
                 f"yours: its tokens are right because it is the course's answer. Write `{mine}` "
                 f"yourself from the stage methods in the table above (`engine.schedule()`, "
                 f"`engine.prepare_inputs(plan)`, ...); `{name}` is there to compare yours with "
                 f"once yours passes")
