"""Why a run cannot go on (``EngineStalled``): the requests that wait and what they wait for,
named for the learner -- a round dropped, finished requests that keep their blocks, a loop that
returned with work left, or a plug-in's ``wants_more`` or ``commit``."""

from .sequence import Request


class EngineStalled(RuntimeError):
    """The loop cannot make progress; ``reason``, for a checker: ``"unprocessed_inflight"`` (a
    round in flight never processed: a deferred step dropped, a plan never launched),
    ``"finished_kept_blocks"`` (finished requests keep blocks and rows),
    ``"loop_returned_with_work"``, ``"not_planned"`` (a schedule found no
    round for unfinished requests with nothing in flight: a plug-in's ``wants_more`` or
    ``commit``, or changed fields); ``"no_progress"``: rounds commit nothing (a per_request
    commit or a process_outputs plug-in, ``Run.check_progress``).  ``prompt_indexes``:
    positions in the call; ``request_ids``: ids."""

    REASONS = ("unprocessed_inflight", "finished_kept_blocks", "loop_returned_with_work",
               "not_planned", "no_progress")

    def __init__(self, message: str, *, reason: str, requests=()):
        super().__init__(message)
        assert reason in self.REASONS, reason
        self.reason = reason
        self.prompt_indexes = [r.index for r in requests]
        self.request_ids = [r.id for r in requests]


def uncommitted_step(rnd: int, label: str) -> str:
    """A step given to a process_outputs plug-in (``label``) that it never committed."""
    return (f"{label} was given round {rnd}'s step and returned without committing it, so its "
            f"requests still count that round in flight: commit each step it is given "
            f"(engine.commit_outputs(step, tokens))")


def stalled(scheduler, scheduling: bool = False, dropped=(), uncommitted=()) -> EngineStalled:
    """Why the loop cannot go on, naming the prompts involved; ``scheduling``: a schedule found
    nothing to launch (the loop is still going), else the loop returned; ``dropped``: rounds
    planned but never launched (``Run.dropped``), whose requests wait for them;
    ``uncommitted``: steps a process_outputs plug-in was given and did not commit."""
    stuck = [r for r in scheduler.running if r.num_inflight]
    kept = [r for r in scheduler.running if r.finished]
    left = [r for r in scheduler.running if not r.finished] + list(scheduler.waiting)
    if stuck:
        reason, reqs, msg = "unprocessed_inflight", stuck, _waiting(stuck, dropped, uncommitted)
    elif kept:
        blocked = ("waiting requests can never start" if scheduler.waiting else
                   "the scheduler always has work")
        reason, reqs, msg = "finished_kept_blocks", kept, (
            f"{_names(kept)} finished but still hold their KV blocks and rows, so {blocked}; "
            f"free finished requests")
    elif scheduling:
        reason, reqs, msg = "not_planned", left, (
            f"engine.schedule() found no round to plan for {_names(left)}, unfinished with "
            f"nothing in flight: {_unplanned(left[0])}")
    else:
        reason, reqs, msg = "loop_returned_with_work", left, (
            f"the loop stopped with work left: {_names(left)} unfinished and nothing in flight; "
            f"keep scheduling rounds while the scheduler has work")
    return EngineStalled(f"the engine cannot make progress: {msg}", reason=reason, requests=reqs)


def _names(reqs) -> str:
    return ", ".join(f"prompt {r.index}" for r in reqs[:5]) + (" ..." if len(reqs) > 5 else "")


def _waiting(stuck, dropped, uncommitted) -> str:
    """What requests with rounds in flight wait for: a plan dropped, a step a plug-in did not
    commit, or (neither known) a deferred step never processed."""
    s = "s" * (len(stuck) == 1)
    if dropped:
        r, prepared = dropped[0]
        how = ("was prepared but its sample never launched (engine.launch_forward(inputs), "
               "then engine.launch_sample(inputs), then process the step)" if prepared else
               "was scheduled but never prepared or launched (was engine.schedule() called "
               "again before it ran?)")
        return (f"{_names(stuck)} still count{s} a round that will never run: round {r}'s plan "
                f"{how}; run every plan engine.schedule() returns, once")
    if uncommitted:
        return f"{_names(stuck)} still wait{s} for a launched round: " + uncommitted_step(
            *uncommitted[0])
    return (f"{_names(stuck)} still wait{s} for launched rounds whose results were never "
            f"processed; was a deferred step dropped instead of processed or flushed?")


def _unplanned(req) -> str:
    """Why no round plans ``req``, unfinished with nothing in flight: a plug-in may set its own
    ``wants_more`` or ``commit`` on a request (as the course's ``per_request`` does)."""
    if req.row < 0:
        return (f"prompt {req.index} waits for a batch row and KV blocks that never come free "
                f"(were rows or blocks taken out of engine.scheduler?)")
    has = f"prompt {req.index} has {len(req.output_ids)} of its {req.max_new_tokens} tokens"
    if "wants_more" in vars(req) and Request.wants_more(req):  # the engine's own would say yes
        return (f"{has} and no finish_reason, yet its wants_more, replaced on the request by a "
                f"plug-in, answers False: it must want more rounds until it is finished")
    why = ("its commit, replaced on the request by a plug-in, did not end it"
           if "commit" in vars(req) else
           "its fields were changed outside the engine's commit (by a plug-in or the loop)")
    return (f"{has} and no finish_reason: {why}, so it wants no more rounds and nothing ends it; "
            f"set req.finish_reason where a request ends")
