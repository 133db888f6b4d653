"""What a learner's loop did to a run beyond its tokens (exercises 02 and 03): the requests'
settings it changed, tokens it removed or requests it ended itself, a reordered scheduler queue
(the rounds' plans), completions rewritten after the engine's commit -- each named, where a
token difference alone would blame the stage order (blind round 16).
"""

from __future__ import annotations

import collections
import copy

from . import pool
from .verdict import Verdict, fails


_SETTINGS = ("prompt", "prompt_ids", "max_new_tokens", "stop", "temperature", "seed")


def settings(requests) -> list[tuple]:
    """Each request's settings as the run gave them, before the learner's loop ran."""
    return [tuple(copy.copy(getattr(r, f)) for f in _SETTINGS) for r in requests]


def settings_edit(before: list[tuple], requests) -> str | None:
    """The first request setting the learner's loop changed, in words; None if none was."""
    for r, was in zip(requests, before):
        for field, old in zip(_SETTINGS, was):
            if getattr(r, field) != old:
                return f"prompt {r.index}'s `{field}` from {old!r:.40} to {getattr(r, field)!r:.40}"
    return None


def edited_requests(log, outs, reference) -> str | None:
    """Why a run's tokens fell short of ``reference`` when its loop edited the requests, in
    words; None where it did not (the stage order is then to blame).  A setting changed, tokens
    removed after the engine's commit, or a request ended before its limit by the loop."""
    fix = ("a loop must not edit the requests: the engine's commit adds their tokens and "
           "ends them (EOS, a stop string or the limit)")
    if log.settings_edit:
        return f"your loop changed {log.settings_edit}: {fix}"
    handed = collections.Counter()
    for c in log.record_commits:
        for j, prompt in enumerate(c.prompts):
            handed[prompt] += c.offered[j] if c.offered else 1
    for i, (c, req, want) in enumerate(zip(outs, log.requests, reference)):
        got = len(c.token_ids)
        short = got < len(want) and list(want[:got]) == list(c.token_ids)
        if not short or c.finish_reason in (None, "abort"):
            continue
        if c.finish_reason == "length" and got < min(handed[i], req.max_new_tokens):
            return (f"prompt {i} holds {got} tokens, but the engine's commits handed it "
                    f"{min(handed[i], req.max_new_tokens)}: your loop removed tokens; {fix}")
        return (f"prompt {i} ended {c.finish_reason!r} with {got} tokens, where the reference "
                f"went on to {len(want)}: your loop ended it itself (`req.finish_reason`); {fix}")
    return None


def same_run(commits, outs, reference: SerialRun, rounds: bool = True) -> str | None:
    """Where a run (its ``record.Commit`` events, its completions) whose tokens are the
    reference's still differs from it, in words, or None: the rounds' prompts (a loop that
    reordered or edited the scheduler's queues; ``rounds``: a serial run without drafts, as
    drafts or ZOS's extra steps change them), then each completion's text and finish reason
    (a loop that rewrote them after the engine's commit)."""
    ran_rounds = pool.SerialRun.rounds_of(commits)
    if rounds and ran_rounds != reference.rounds:
        r = next((i for i, (a, b) in enumerate(zip(ran_rounds, reference.rounds)) if a != b),
                 min(len(ran_rounds), len(reference.rounds)))
        ran = list(ran_rounds[r]) if r < len(ran_rounds) else "nothing"
        want = list(reference.rounds[r]) if r < len(reference.rounds) else "nothing"
        return (f"the tokens are right, but round {r} committed prompts {ran} where the "
                f"reference's round {r} committed {want} ({len(ran_rounds)} rounds against "
                f"{len(reference.rounds)}): your loop changed what the scheduler holds "
                f"(`engine.scheduler.waiting` or `running`). A loop must not reorder or edit "
                f"the scheduler's queues: `engine.schedule()` admits first come, first served")
    for i, (c, e) in enumerate(zip(outs, reference.ends)):
        if (c.text, c.finish_reason) != (e.text, e.finish_reason):
            return (f"prompt {i}'s tokens are right, but its completion has text {c.text!r:.60} "
                    f"and finish_reason {c.finish_reason!r}, where the reference's has "
                    f"{e.text!r:.60} and {e.finish_reason!r}: the engine's commit writes "
                    f"`req.text` and `req.finish_reason`; your loop must not change them")
    return None


def serial_same_run(log, outs, second: bool, endings: bool, config: dict) -> Verdict | None:
    """What a run whose tokens are right still did differently from the serial loop's run of
    the same workload (:func:`pool.same_run`), or None."""
    drafts = config.get("num_draft_tokens", 0)
    reference = pool.serial_run(second=second, endings=endings)
    why = same_run(log.record_commits, outs, reference, rounds=not drafts)
    if why is None:
        return None
    where = (pool.endings_label(drafts) if endings else
             f"in the second run (stop string {pool.SECOND_RUN['stop']!r})" if second
             else "in the main run")
    return fails("edits_run", f"{where}: {why}")
