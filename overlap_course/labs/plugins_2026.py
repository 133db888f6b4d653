"""How notebook 07b's labs put a learner's function into a run: two loops, each the ZOS loop with
one decision handed to the learner (the engine's own stages do the rest).

* ``batch_queue(depth, before_sample)``: a loop holding up to ``depth`` decode steps, like vLLM's
  batch queue; just before round N's sample it asks ``before_sample(engine, plan, held)`` how many
  of the oldest held steps to process first.
* ``future_key(key)``: the ZOS loop in which the device keeps each request's newest token, drafts
  and accepted count under ``key(req, b)`` (``b``: its place in the round's batch) instead of its
  batch row.
"""

from __future__ import annotations

import numbers
import operator

from toy_engine.config import EngineConfig
from toy_engine.engine import Engine
from toy_engine.validate import check_int, plugin_label, shown

from .plugins import (AN_INT, NOT_A_BOOL, a_bool, check_takes, deep_loop, learners_engine,
                      whole_float, zero_d)


class BadAnswer(ValueError):
    """The learner's function returned something its loop cannot use; the message says what."""


def batch_queue(depth: int, before_sample):
    """A loop holding up to ``depth`` decode steps: round N's forward goes in, round N - depth is
    processed once the queue is full, then ``before_sample(engine, plan, held)`` (``held``: the
    steps still unprocessed, oldest first, as a tuple) says how many of the oldest to process
    before round N's sample is launched.  Run it on a ring of at least ``depth + 1`` slots."""
    depth = check_int("depth", depth, 1, None, " (decode steps the loop holds)")
    check_takes("batch_queue: before_sample", before_sample, ["engine", "plan", "held"])

    label = f"batch_queue: before_sample={plugin_label(before_sample)}"

    def to_process(engine, plan, held):
        was = _plans(plan, held)
        with engine.calling(label):
            n = before_sample(engine, plan, held)
        _check_plans(was, _plans(plan, held), label)
        return _count(n, len(held))
    return deep_loop(depth, to_process, f"batch_queue_{depth}")


def _plans(plan, held) -> list:
    """What the loop goes on with, of ``plan`` and the held steps' plans: their rounds, kinds
    and requests (by identity, in order)."""
    return [p.snapshot() for p in (plan, *(step.plan for step in held))]


def _check_plans(was: list, now: list, label: str) -> None:
    """Refuse plans ``before_sample`` changed: the round's tokens are committed to the requests
    in its plan's order, so a sorted or shortened plan gives them to the wrong prompts."""
    for i, (before, after) in enumerate(zip(was, now)):
        if before != after:
            what = "plan" if i == 0 else f"held[{i - 1}].plan"
            raise BadAnswer(f"{label} changed {what} (round {before[0]}): its requests, "
                            f"round or kind were changed, but the round's metadata went to the "
                            f"device in the plan's order and its tokens are handed out in that "
                            f"order, so they would reach the wrong prompts; read the plan and "
                            f"the held steps, do not change them (sort a copy: "
                            f"sorted(plan.requests, key=...))")


def _whole(value) -> int | None:
    """``value`` as a plain int (what is checked is then what is used: an int subclass's
    comparisons or ``__int__`` may lie), or None if it is no whole number; a 0-d integer tensor
    or array is the number it holds."""
    value = zero_d(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    try:
        return operator.index(value)
    except TypeError:  # an Integral without __index__
        return None


def _count(n, held: int) -> int:
    """``before_sample``'s answer, checked: a whole number of held steps, 0 to ``held``."""
    count = _whole(n)
    if count is None or not 0 <= count <= held:
        got = shown(n if count is None else count)
        if whole_float(zero_d(n)):
            raise BadAnswer(f"before_sample returned {got}, a float: the loop processes that many "
                            f"held steps, and a count must be {AN_INT} (from 0 to {held})")
        if a_bool(zero_d(n)):
            raise BadAnswer(f"before_sample returned {got}, a bool: the loop processes that many "
                            f"held steps (0 to {held}), and a count must be {NOT_A_BOOL}")
        raise BadAnswer(f"before_sample returned {got}: return how many of the {held} held step(s) "
                        f"to process before this sample, a whole number from 0 to {held}")
    return count


def future_key(key):
    """The ZOS loop, with the device keeping each request's newest token (the future-token map),
    its drafts and accepted count under ``key(req, b)`` rather than ``req.row``: the round's
    metadata carries the key in the row field, and the scheduler keeps its own rows."""
    check_takes("future_key: key", key, ["req", "b"])

    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous)
                continue
            inputs = _prepare_keyed(engine, plan, key)
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None:
                engine.process_outputs(previous)
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
                previous = None
            else:
                previous = current
    loop.__name__ = loop.__qualname__ = "future_key_loop"
    return loop


def _prepare_keyed(engine, plan, key):
    """``engine.prepare_inputs(plan)`` with each request's key as its row in the round's metadata
    (``rows``): the scheduler keeps its own, which the engine checks unchanged."""
    rows = engine.config.max_batch_size
    keys, label = [], f"future_key: key={plugin_label(key)}"
    for b, req in enumerate(plan.requests):
        with engine.calling(label):
            k = key(req, b)
        whole = _whole(k)
        where = f"for prompt {req.index} (place {b} in round {plan.round}'s batch)"
        if whole_float(zero_d(k)):
            raise BadAnswer(f"key returned {shown(k)}, a float, {where}: the device indexes its "
                            f"{rows} rows with it, and an index must be {AN_INT} (from 0 to "
                            f"{rows - 1})")
        if a_bool(zero_d(k)):
            raise BadAnswer(f"key returned {shown(k)}, a bool, {where}: the device indexes its "
                            f"{rows} rows with it (0 to {rows - 1}), and an index must be "
                            f"{NOT_A_BOOL}")
        if whole is None or not 0 <= whole < rows:
            raise BadAnswer(f"key returned {shown(k if whole is None else whole)} {where}: the "
                            f"device keeps {rows} rows, so return a whole number from 0 to "
                            f"{rows - 1}")
        keys.append(whole)
    return engine.prepare_inputs(plan, rows=keys)


def title_ring_engine() -> Engine:
    """A ZOS engine with the title-case constraint (batches of 3, race checker on), built with
    MAX_SLOTS host slots so that a deeper queue can run on it; a new one once it is closed
    (:func:`plugins.learners_engine`)."""
    return learners_engine("title_ring", EngineConfig(mode="zos", max_batch_size=3,
                                                      constraint="title_case"))
