"""Notebook 07b's corpus ("bugs of 2026"): per lab, wrong fixes a learner might write, each with the
verdict category its checker must give, and right fixes written differently from the reference
that must pass.  ``tests/test_labs07b_corpus.py`` runs every entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Fix:
    lab: str        # "5" before_sample, "6" key
    name: str
    answer: object
    category: str = "passed"


# ------------------------------------------------- lab 5: before_sample(engine, plan, held)

def before_sample(engine, plan, held):  # the reference: with a mask to build, every held step
    return len(held) if engine.constraint is not None else 0


def before_sample_sharing(engine, plan, held):
    """Only up to the newest held step that holds one of this round's requests."""
    if engine.constraint is None:
        return 0
    mine = {r.id for r in plan.requests}
    sharing = [i + 1 for i, step in enumerate(held) if mine & {r.id for r in step.plan.requests}]
    return max(sharing, default=0)


def before_sample_one_at_a_time(engine, plan, held):
    """Never more than one held at a sample: one each time is all of them."""
    return 1 if engine.constraint is not None and held else 0


def before_sample_config(engine, plan, held):
    return len(held) * (engine.config.constraint == "title_case")


def before_sample_pending(engine, plan, held):
    """Wait while one of the round's requests has an earlier round in flight."""
    if engine.constraint is None or not any(r.num_inflight > 1 for r in plan.requests):
        return 0
    return len(held)


def before_sample_always(engine, plan, held):
    return len(held)


def before_sample_all_but_newest(engine, plan, held):
    return max(0, len(held) - 1) if engine.constraint is not None else 0


def before_sample_itself(engine, plan, held):
    """Processes the steps itself and says nothing: the loop processes them again."""
    if engine.constraint is not None:
        for step in held:
            engine.process_outputs(step)
    return 0


def before_sample_bool(engine, plan, held):
    return engine.constraint is not None and bool(held)


def before_sample_prefill_only(engine, plan, held):
    return len(held) if plan.is_prefill else 0


def before_sample_no_constraint(engine, plan, held):
    """Switches the constraint off instead of waiting for its tokens."""
    engine.constraint = None
    return 0


def before_sample_unwritten(engine, plan, held):
    raise NotImplementedError


def before_sample_numpy(engine, plan, held):
    return np.int64(len(held) if engine.constraint is not None else 0)


def before_sample_too_many(engine, plan, held):
    return len(held) + 1


# ---------------------------------------------------------------- lab 6: key(req, b)

def key(req, b):  # the reference
    return req.row


def key_mirrored(req, b):
    return 2 - req.row


def key_numpy(req, b):
    return np.int64(req.row)


def key_index_mod(req, b):
    return req.index % 3


def key_index(req, b):
    return req.index


def key_id_mod(req, b):
    return req.id % 3


def key_prefill_place(req, b):
    """The row, except in the prefill round: the request's first drafts land under another key."""
    return b if not req.output_ids else req.row


def key_zero(req, b):
    return 0


def key_float(req, b):
    return float(req.row) + 0.5


def key_unwritten(req, b):
    raise NotImplementedError


WRONG = [
    Fix("5", "the shipped bug: sample right behind the forward", lambda e, p, h: 0, "wrong_tokens"),
    Fix("5", "always process every held step", before_sample_always, "waits_without_need"),
    Fix("5", "all but the newest held step", before_sample_all_but_newest, "wrong_tokens"),
    Fix("5", "processes the steps itself", before_sample_itself, "processed_twice"),
    Fix("5", "a bool instead of a count", before_sample_bool, "shape"),
    Fix("5", "only before a prefill's sample", before_sample_prefill_only, "wrong_tokens"),
    Fix("5", "still the stub", before_sample_unwritten, "not_implemented"),
    Fix("5", "switches the constraint off", before_sample_no_constraint, "edits_engine"),
    Fix("5", "more than it holds", before_sample_too_many, "shape"),
    Fix("6", "the shipped bug: the batch place", lambda req, b: b, "leaked_tokens"),
    Fix("6", "the prompt's index, past the rows", key_index, "shape"),
    Fix("6", "the prompt's index modulo the rows", key_index_mod, "leaked_tokens"),
    Fix("6", "the request id modulo the rows", key_id_mod, "leaked_tokens"),
    Fix("6", "every request under key 0", key_zero, "leaked_tokens"),
    Fix("6", "the batch place in the prefill round only", key_prefill_place, "drafts_lost"),
    Fix("6", "a float key", key_float, "shape"),
    Fix("6", "still the stub", key_unwritten, "not_implemented"),
]

RIGHT = [
    Fix("5", "the reference", before_sample),
    Fix("5", "only the steps holding this round's requests", before_sample_sharing),
    Fix("5", "one at a time (never more than one held)", before_sample_one_at_a_time),
    Fix("5", "reads the engine's config", before_sample_config),
    Fix("5", "only while a request has an earlier round in flight", before_sample_pending),
    Fix("5", "a NumPy integer", before_sample_numpy),
    Fix("6", "the reference", key),
    Fix("6", "the rows in reverse", key_mirrored),
    Fix("6", "a NumPy integer", key_numpy),
]
