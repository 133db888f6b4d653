"""What a verdict may read of an exception out of the learner's code.  Its message is the
learner's (``__str__`` may return a number, or raise), and it may be one of the toy's own
classes that the learner raised: a subclass whose ``__init__`` skips the engine's, or the class
itself with other attributes.  Only an error the engine raised is read as the engine's."""

from __future__ import annotations

import linecache
import os
import sys

import toy_engine
from toy_engine.races import RaceError
from toy_engine.buffers import BadOutputs
from toy_engine.refusals import (CommitStoppedEarly, DraftsTooDeep, EndTakenBack, HandedBeside,
                                  OtherTokens, PlannedSince)
from toy_engine.run import (EngineStalled, ForeignStep, PreparedTwice, SampleBeforeForward,
                            StageInPlugin, StaleInputs, StepProcessedTwice)
from toy_engine.timeline import Stage

from . import sandbox
from .answers import MAX_MESSAGE, cut, type_name

UNREAD = "(its message could not be read)"
_TOY = os.path.dirname(os.path.abspath(toy_engine.__file__)) + os.sep


def said(err: BaseException, most: int = MAX_MESSAGE) -> str:
    """``str(err)``, at most ``most`` characters (:func:`answers.cut`); never raises (but for
    Ctrl-C)."""
    try:
        text = str.__str__(str(err))
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - a message that raises, even SystemExit or a TimeUp
        text = UNREAD
    return cut(text, most)


def quoted(err: BaseException) -> str:
    """``"ValueError: its message"``, as a verdict names what the learner's code raised."""
    return f"{type_name(err)}: {said(err)}"


def learner_line(err: BaseException) -> str:
    """Where the learner's code raised ``err``: "at line 3 of `fn`, `x = rows[7]`", the innermost
    of the learner's frames; "" when none of them is on its traceback."""
    line, tb = "", err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if sandbox._is_learners(code.co_filename):
            text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            shown = f", `{cut(text, 80)}`" if text else ""
            line = f"at line {tb.tb_lineno} of `{code.co_name}`{shown}"
        tb = tb.tb_next
    return line


def at(err: BaseException) -> str:
    """" (at line 3 of `fn`, `x = rows[7]`)" for a verdict that says the learner's code raised
    ``err``, or "" (rounds 43 and 45: a raise in an answer named no line)."""
    line = learner_line(err)
    return f" ({line})" if line else ""


def _ints(x) -> bool:
    return type(x) is list and all(type(i) is int and i >= 0 for i in x)


def _name(x) -> bool:
    """A launch's or buffer's name as the engine keeps it: a str, or a Stage (a StrEnum)."""
    return type(x) in (str, Stage)


def _name_or_none(x) -> bool:
    return x is None or _name(x)


def _int_or_none(x) -> bool:
    return x is None or type(x) is int


# Per class, the attributes a verdict reads, and what the engine puts in them.
_FIELDS = {
    EngineStalled: {"reason": lambda x: type(x) is str and x in EngineStalled.REASONS,
                    "prompt_indexes": _ints, "request_ids": lambda x: type(x) is list},
    RaceError: {"kind": lambda x: type(x) is str and x in RaceError.KINDS,
                "round": lambda x: type(x) is int, "launch": _name,
                "buffer": _name_or_none, "access": _name_or_none, "blocks": _ints,
                "owner": _int_or_none, "prompt": _int_or_none},
    StepProcessedTwice: {"round": lambda x: type(x) is int, "prompt_indexes": _ints},
    ForeignStep: {"round": lambda x: type(x) is int,
                  "what": lambda x: type(x) is str and x in ("step", "plan")},
    PreparedTwice: {"round": lambda x: type(x) is int, "latest": lambda x: type(x) is int},
    PlannedSince: {"round": lambda x: type(x) is int, "latest": lambda x: type(x) is int},
    SampleBeforeForward: {"round": lambda x: type(x) is int},
    StageInPlugin: {"stage": lambda x: type(x) is str},
    StaleInputs: {"stage": lambda x: type(x) is str, "round": lambda x: type(x) is int,
                  "latest": _int_or_none, "foreign": lambda x: type(x) is bool},
    BadOutputs: {"round": lambda x: type(x) is int, "expected": lambda x: type(x) is int,
                 "length": _int_or_none},
    EndTakenBack: {"prompt": lambda x: type(x) is int, "was": lambda x: type(x) is str},
    HandedBeside: {"round": lambda x: type(x) is int, "prompt": lambda x: type(x) is int,
                   "holds": lambda x: type(x) is list, "handed": lambda x: type(x) is list},
    OtherTokens: {"round": lambda x: type(x) is int, "prompt": lambda x: type(x) is int,
                  "given": lambda x: type(x) is list,
                  "sampled": lambda x: x is None or type(x) is list},
    CommitStoppedEarly: {"round": lambda x: type(x) is int, "prompt": lambda x: type(x) is int,
                         "appended": lambda x: type(x) is list, "kept": lambda x: type(x) is list,
                         "removed": lambda x: type(x) is int,
                         "ended": lambda x: x is None or type(x) is str},
    DraftsTooDeep: {"round": lambda x: type(x) is int, "prompt": lambda x: type(x) is int,
                    "earlier": lambda x: type(x) is int, "drafts": lambda x: type(x) is int},
}
# Per kind of RaceError, what the engine always puts in the attributes that may be None:
# a buffer race names its buffer and access, the other kinds the prompt whose blocks they are.
_RACE_KINDS = {"buffer": {"buffer": _name, "access": lambda x: type(x) is str and x in ("r", "w")},
               **dict.fromkeys(("free_in_use", "launch_on_free", "double_free"),
                               {"prompt": lambda x: type(x) is int})}


def engines(err, cls: type) -> bool:
    """Whether ``err`` is the toy's ``cls`` as the engine raised it: that very class, raised in
    the toy's own code, its attributes of the types the engine sets.  Anything else the
    learner's code raised is the learner's exception (a "raised" verdict)."""
    if type(err) is not cls or not _raised_by_toy(err):
        return False
    state = vars(err)
    fields = _FIELDS[cls]
    kind = state.get("kind")  # read as a plain str: a learner's __hash__ may raise
    if cls is RaceError and type(kind) is str and kind in _RACE_KINDS:
        fields = {**fields, **_RACE_KINDS[kind]}
    return all(name in state and fits(state[name]) for name, fits in fields.items())


def _raised_by_toy(err: BaseException) -> bool:
    return _raised_in(err).startswith(_TOY)


def refused_or_raised(err: BaseException) -> str:
    """What stopped the learner's code, as "your code ..." goes on: a refusal the toy raised,
    by its message alone (its class is the engine's internals: blind round 25), else the
    learner's own error, ``quoted``."""
    if _raised_by_toy(err):
        return f"was refused by the engine: {said(err)}"
    if type(err) is AttributeError and str(err).startswith("'StepState' object has no attribute"):
        # def process_outputs(step, engine): the step was read as the engine (blind round 45)
        return (f"raised {quoted(err)}: a step was used as the engine. The engine calls it with "
                f"(engine, step), the engine first: are your parameters the other way round?")
    return f"raised {quoted(err)}"


def checkers(err, cls: type) -> bool:
    """Whether ``err`` is the checker's own ``cls`` (``answers.Junk``, ``lab_runs.Runaway``, the
    labs' ``plugins.NotTrueOrFalse``) as the checker raised it: that very class, raised in the
    module that defines it.  The learner's code may raise the class, or a subclass whose
    ``__str__`` raises: that is the learner's."""
    return type(err) is cls and _raised_in(err) == os.path.abspath(
        sys.modules[cls.__module__].__file__)


def _raised_in(err: BaseException) -> str:
    """The file of the innermost frame ``err`` was raised in ("" when it was never raised)."""
    tb = err.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename)
