"""The ways a request ends, and which of them each checker's runs produce.

A mistake in handling finished requests shows only in a run where requests end that way: a
loop that keeps an EOS-finished request's blocks passes every run whose stories never end,
a limit test written with ``>`` passes every run whose limit falls inside a speculative step.
So each checker declares here the endings its runs produce (:data:`DECLARED`), and
``tests/test_endings.py`` runs every checker on right answers under :func:`observe` and
asserts that each declared ending really occurred.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from toy_engine import engine as engine_module
from toy_engine.record import Commit

from . import sandbox
from .verdict import counted

EOS = "eos"
STOP = "stop"
LIMIT_AT_ROUND_END = "limit at a round's end"  # the limit's token was the last the round sampled
LIMIT_IN_SPEC_STEP = "limit inside a speculative step"  # the round sampled tokens past the limit
ABORT = "abort"
HOW = (EOS, STOP, LIMIT_AT_ROUND_END, LIMIT_IN_SPEC_STEP, ABORT)


@dataclass(frozen=True)
class Ending:
    """How one request of a run ended, and whether the engine drafted tokens (speculation)."""

    how: str
    drafts: bool

    def __post_init__(self) -> None:
        if self.how not in HOW:
            raise ValueError(f"unknown ending {self.how!r}: one of {HOW}")
        if self.how == LIMIT_IN_SPEC_STEP and not self.drafts:
            raise ValueError("without drafts a round samples one token: the limit cannot fall "
                             "inside it")

    def __str__(self) -> str:
        return f"{self.how}, {'with' if self.drafts else 'without'} drafts"


def endings(*hows: str, drafts: bool) -> frozenset[Ending]:
    return frozenset(Ending(how, drafts) for how in hows)


_ALL_PLAIN = endings(EOS, STOP, LIMIT_AT_ROUND_END, drafts=False)
_ALL_DRAFTED = endings(EOS, STOP, LIMIT_AT_ROUND_END, LIMIT_IN_SPEC_STEP, drafts=True)

#: checker name (its function's ``__name__``) -> the endings its runs produce on a right answer
DECLARED: dict[str, frozenset[Ending]] = {
    "check_serial_loop": _ALL_PLAIN | _ALL_DRAFTED,
    "check_zos_loop": _ALL_PLAIN | _ALL_DRAFTED,
    # the correction runs only where there are drafts: a run without them never calls it
    "check_correction": _ALL_DRAFTED,
    "check_process_outputs": _ALL_PLAIN | _ALL_DRAFTED | endings(ABORT, drafts=False)
    | endings(ABORT, drafts=True),
    # notebook 03a's three rounds: one prompt to its limit
    "check_three_rounds": endings(LIMIT_AT_ROUND_END, drafts=False),
    # notebook 07's lab fixes (checks/lab_workloads.py: POLICY_RUNS, ABORT_RUNS, ring runs,
    # COMMIT_RUNS)
    "check_wants_more": _ALL_PLAIN | _ALL_DRAFTED | endings(ABORT, drafts=False),
    "check_abort": _ALL_PLAIN | _ALL_DRAFTED | endings(ABORT, drafts=False)
    | endings(ABORT, drafts=True),
    "check_ring_slots": _ALL_PLAIN | _ALL_DRAFTED,
    "check_commit": _ALL_PLAIN | _ALL_DRAFTED,
}


def _limit_ending(req, commits) -> str | None:
    """Where a length-limited request met its limit: at the end of the round whose tokens reached
    it, or inside it (the round sampled more); None if no commit of the record reached it."""
    total = 0
    for commit in commits:
        if req.index in commit.prompts and not commit.refused and commit.offered:
            total += commit.offered[commit.prompts.index(req.index)]
            if total >= req.max_new_tokens:
                return LIMIT_AT_ROUND_END if total == req.max_new_tokens else LIMIT_IN_SPEC_STEP
    return None


def run_endings(engine) -> list[tuple[int, Ending]]:
    """(prompt index, ending) of each request of ``engine``'s last run, read from the requests'
    finish reasons and the run's record (``Commit.offered``): what the run did, not what it
    asked."""
    drafts = bool(engine.config.num_draft_tokens)
    commits = engine.record.of(Commit)
    found = []
    for req in engine._run.requests:
        how = {"eos": EOS, "stop": STOP, "abort": ABORT}.get(req.finish_reason)
        if req.finish_reason == "length":
            how = _limit_ending(req, commits)
        if how is not None:
            found.append((req.index, Ending(how, drafts)))
    return found


@contextlib.contextmanager
def observe():
    """Collect the endings of every run any engine finishes inside the block: yields a set."""
    seen: set[Ending] = set()

    def observer(engine, phase: str) -> None:
        if phase == "end":
            seen.update(ending for _, ending in run_endings(engine))

    sandbox.OWN_HOOKS.append(observer)  # a check's restore of the toy keeps it
    engine_module.RUN_OBSERVERS.append(observer)
    try:
        yield seen
    finally:
        engine_module.RUN_OBSERVERS.remove(observer)
        sandbox.OWN_HOOKS.remove(observer)


def _by(completion, max_new: int) -> str:
    """How a reference completion ended, in words."""
    words = {"eos": "on EOS (its story ended)", "stop": "at a stop string",
             "length": f"at the limit of {max_new} new tokens"}
    return words.get(completion.finish_reason, "by an abort")


def stopped_at(requests, reference, indexes) -> str:
    """For prompts ``indexes`` of a run that did not finish: how each should have ended (the
    ``reference`` completions) and where it stopped (``requests``: the run's, after it ended)."""
    parts = []
    for i in list(indexes)[:3]:
        req, ref = requests[i], reference[i]
        should = (f"should end {_by(ref, req.max_new_tokens)} after "
                  f"{counted(len(ref.token_ids), 'token')}")
        if req.finish_reason == ref.finish_reason and req.output_ids == list(ref.token_ids):
            where = "it did, but was never released"
        elif not req.output_ids:
            where = "it stopped before its first token (it never got a batch row)"
        else:
            where = f"it stopped after {len(req.output_ids)}"
        parts.append(f"prompt {i} ({req.prompt!r}) {should}; {where}")
    return "; ".join(parts)
