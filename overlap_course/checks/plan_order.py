"""The order of a loop's plans (exercises 02 and 03): each plan ``engine.schedule()`` returns is
prepared and launched, in the order they came, before the next one is asked for.  Scheduling
counts a round as in flight for its requests, so a plan dropped leaves them waiting, one run
after a later plan was made for a round that had not run, and one asked for ahead changes
what the round before it is prepared from.  In the ZOS loop (exercise 03) a round is planned
once the step before it is processed (:func:`planned_early`), and ``engine.flush`` only
after a ``schedule()`` that returned no plan (:func:`flushed_with_a_plan`)."""

from __future__ import annotations

from .verdict import Verdict, fails


def plan_order(log, last: int) -> Verdict | None:
    """The first round before ``last`` (``log``: a HostLog) whose plan was not run in the order
    ``schedule()`` returned it: never prepared, or prepared after a later plan; else the first
    prepared after the next plan was asked for (a plan dropped is asked for ahead too); or None."""
    scheduled = [r for r in range(last) if log.first("schedule", r) is not None]
    for r in scheduled:
        tried = log.prepare_calls
        later = next((q for q in tried[:tried.index(r)] if q > r), None) if r in tried else None
        if later is not None:
            return out_of_order(log, r, later)
        if log.first("prepare", r) is None:
            return fails("plan_dropped",
                         f"{log.who(r)} was scheduled but never prepared or launched: its "
                         f"requests now count a launched round that will never produce a token. "
                         f"Run every plan that `engine.schedule()` returns")
    ahead = next((r for r in scheduled if log.first("schedule", r + 1) is not None
                  and log.first("schedule", r + 1) < log.first("prepare", r)), None)
    return None if ahead is None else scheduled_ahead(log, ahead)


def planned_since(log, r: int, caught: str = "") -> Verdict:
    """The engine refused round ``r``'s plan at ``prepare_inputs``, a later round's planned
    since (``PlannedSince``): a later plan prepared first is named, else scheduling ahead
    (``caught``: said where the loop caught the refusal and went on)."""
    later = next((q for q in log.prepare_calls if q > r), None)
    return scheduled_ahead(log, r, caught) if later is None else out_of_order(log, r, later)


def out_of_order(log, r: int, later: int) -> Verdict:
    """Round ``r``'s plan was prepared after round ``later``'s, which was scheduled after it."""
    return fails("out_of_order",
                 f"{log.who(r)}: your loop prepared its plan only after round {later}'s, which "
                 f"`engine.schedule()` returned after it, so round {later} ran before round {r}. "
                 f"Round {later}'s plan was made for after round {r} (each request's length, its "
                 f"rounds in flight, the host buffer its round number picks). Run the plans in "
                 f"the order `engine.schedule()` returns them: prepare and launch each plan "
                 f"before asking for the next")


def scheduled_ahead(log, r: int, caught: str = "") -> Verdict:
    """Round ``r + 1``'s plan was asked for before round ``r``'s plan was prepared
    (``caught``: the engine's refusal that the loop caught, and that it went on)."""
    return fails("scheduled_ahead",
                 f"{log.who(r)}: your loop asked `engine.schedule()` for round {r + 1}'s plan "
                 f"before it prepared round {r}'s (scheduling ahead). Scheduling counts a round "
                 f"as in flight for its requests, so round {r}'s inputs would be prepared as if "
                 f"round {r + 1} had been launched already (wrong positions and lengths: the "
                 f"engine refuses it{caught}). Ask for the next plan only once this one is "
                 f"prepared and launched: one `engine.schedule()` per pass, at its top")


def planned_early(log, r: int, at: int) -> Verdict | None:
    """Exercise 03: round ``r``'s step, processed at event ``at``, must be processed before
    any plan after the one the lesson's loop makes before it: ``r``'s own for a prefill
    (processed at once), round ``r + 1``'s for a decode step (processed under round
    ``r + 1``'s forward).  A later ``schedule()`` call before ``at`` (blind round 33: one
    right after the forward launch) plans from state a round staler."""
    prefill = r in log.prefill
    since = log.first("schedule", r if prefill else r + 1)
    asked = next((i for i in range(since + 1, at) if log.events[i][0] == "schedule"),
                 None) if since is not None else None
    if asked is None:
        return None
    nxt = log.events[since][1] + 1
    stage, q = log.events[asked - 1]
    got = "" if asked in log.found_plan else " (it returned None: nothing could be planned yet)"
    how = ("a prefill's step at once, after its sample" if prefill else
           f"round {r}'s step under round {r + 1}'s forward, before its sample")
    return fails("scheduled_too_early",
                 f"{log.who(r)}: your loop asked `engine.schedule()` for round {nxt}'s plan "
                 f"right after round {q}'s `{stage}`, before it processed round {r}'s step"
                 f"{got}. The next round was planned before the previous step was processed: "
                 f"a request that ended in round {r} (a stop string, EOS, its limit) is "
                 f"planned into round {nxt} as well, for an extra wasted step. Process "
                 f"{how}, then ask for the next plan at the top of the next pass: one "
                 f"`engine.schedule()` per pass")


def flushed_with_a_plan(log) -> Verdict | None:
    """A step processed by ``engine.flush`` though the last ``schedule()`` had returned a plan:
    exercise 03 keeps flush for when ``schedule()`` returns None (blind round 24: a loop that
    flushed every deferred step passed; blind round 34: one that flushed every prefill step at
    once).  Judged once the run is right otherwise (a loop that also drops its last step is
    told that first)."""
    for r in log.rounds:
        done = log.processing(r)
        if not done or log.events[done[0]][0] != "flush":
            continue
        last = max((i for i, (s, _) in enumerate(log.events[:done[0]]) if s == "schedule"),
                   default=None)
        if last in log.found_plan:
            prefill = r in log.prefill
            return fails("flushed_with_a_plan",
                         f"{log.who(r)}: your loop processed its step with `engine.flush`, though "
                         f"the last `engine.schedule()` had returned a plan (round "
                         f"{log.events[last][1]}'s). `flush` is only for when `schedule()` returns "
                         f"None, with no round left to hide the step under, and the timeline names "
                         f"the work it does `flush`. Here process it with "
                         + ("`engine.process_outputs(step)`, at once after the prefill's sample"
                            if prefill else "`engine.process_outputs(previous)`")
                         + ", and keep `previous = engine.flush(previous)` for the None plan")
    return None
