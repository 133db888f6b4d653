"""What each stage takes: the object the stage before it returned (a ``Plan``, ``RoundInputs``, a
``StepState``), refused by name when it is anything else, a subclass included."""

from .refusals import ClassChanged
from .run import RoundInputs, StepState
from .scheduler import Plan

# What returns each stage's argument: a refusal of anything else names it.
_MADE_BY = {Plan: "engine.schedule()", RoundInputs: "engine.prepare_inputs(plan)",
            StepState: "engine.launch_sample(inputs)"}


def takes(stage: str, value, cls: type, or_none: bool = False) -> None:
    """Refuse a ``value`` that is not a ``cls`` (a mix-up of a loop's objects) by name, nor one
    of a subclass: the stages read its fields, and a subclass's code would decide what they see."""
    if type(value) is cls or (or_none and value is None):
        return
    if issubclass(type(value), cls):  # not isinstance: a __class__ property would answer it
        raise ClassChanged(stage, cls, type(value), _MADE_BY[cls])
    got = "None" if value is None else f"a {type(value).__name__}"
    hint = (": schedule() returns None when nothing can be launched now; check `if plan is None`"
            if value is None and cls is Plan else
            f" (what {_MADE_BY[type(value)]} returns)" if type(value) in _MADE_BY else "")
    raise TypeError(f"{stage} takes the {cls.__name__} that {_MADE_BY[cls]} returned, "
                    f"got {got}{hint}")
