"""What a learner's loop did to a run beyond its tokens (exercises 02 and 03): the requests'
settings it changed, tokens it removed or requests it ended itself, a reordered scheduler queue
(the rounds' plans), completions rewritten after the engine's commit -- each named, where a
token difference alone would blame the stage order (blind round 16).
"""

from __future__ import annotations

import collections
import copy
import functools
import types

from toy_engine.sequence import Request

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


class RequestWatch:
    """A learner's loop's own edits of the run's requests: their tokens, text and finish reason
    looked at before and after each call of the engine's methods (``around``), so that a change
    between two calls is the loop's (``edit``, the first, in words), and the requests it aborted
    (``aborted``: prompt, tokens, limit), with ``engine.abort`` or between two calls.  Where the
    tokens alone would blame the stage order or say the engine ended a request (blind round 17)."""

    def __init__(self, requests):
        self.requests, self.aborted = requests, []
        self.edit, self.edited = None, None  # the first edit in words, and its prompt
        self.seen = self._state()

    def _state(self) -> list[tuple]:
        return [_state_of(r) for r in self.requests]

    def look(self) -> None:
        """Note the first change since the engine's last call returned (the loop's own)."""
        now = self._state()
        for r, was, new in zip(self.requests, self.seen, now):
            if was[2] is None and new[2] == "abort":  # engine.scheduler.abort(req), say
                self.aborted.append((r.index, len(was[0]), r.max_new_tokens))
            elif self.edit is None and was != new:
                self.edit, self.edited = _edit_words(r, was, new), r.index
        self.seen = now

    def around(self, method):
        """``method`` of the engine, with the requests looked at before it and noted after."""
        @functools.wraps(method)
        def call(*args, **kwargs):
            self.look()
            if method.__name__ == "abort":
                self._note_abort(args[0] if args else kwargs.get("request_id"))
            try:
                return method(*args, **kwargs)
            finally:
                self.seen = self._state()
        return call

    def _note_abort(self, request_id) -> None:
        req = next((r for r in self.requests if type(request_id) is int and r.id == request_id
                    and not r.finished), None)
        if req is not None:
            self.aborted.append((req.index, len(req.output_ids), req.max_new_tokens))


def _state_of(req) -> tuple:
    """What a request's commit writes: its tokens, text and finish reason."""
    return list(req.output_ids), req.text, req.finish_reason


def snapshot(req) -> tuple:
    """A request's settings and what its commit writes, before a learner's function is called."""
    return settings([req])[0], _state_of(req)


def edit_of(req, before: tuple, by: str, state: bool = True) -> str | None:
    """What ``by`` (the learner's function, in words) changed in ``req`` since ``before``
    (:func:`snapshot`): a setting, or (``state``) what the engine's commit writes; None if
    nothing."""
    setting = settings_edit([before[0]], [req])
    if setting:
        return f"{by} changed {setting}"
    now = _state_of(req)
    return _edit_words(req, before[1], now, by) if state and now != before[1] else None


def commit_slip(req, before: tuple, tokens: list, eos_id: int, decode) -> tuple | None:
    """What a lab 4 commit left in ``req`` (``before``: its :func:`snapshot`) that no commit of
    the round's run ``tokens`` can, as (category, words), or None.  Its tokens are compared with
    the engine's own commit of the same call: what the run then does depends on memory no round
    wrote (blind round 20: the verdict changed with the checks run before)."""
    (_, _, limit, stop, *_), (ids, text, _) = before
    got, given, who = req.output_ids, len(ids) + len(tokens), f"prompt {req.index}'s commit"
    if type(got) is not list or len(got) <= len(ids) and got == ids[: len(got)]:
        return None  # not a list: the engine's guard names it; nothing appended
    if len(got) > given:
        again = " (the run's last token a second time)" if got[given:] == tokens[-1:] else ""
        return "extra_tokens", (
            f"{who} was handed a run of {len(tokens)} token(s) {list(tokens)!r:.60} and left "
            f"{len(got)} tokens where it had {len(ids)}: {len(got) - given} more than the run "
            f"gave{again}. Append each token of the run once, in order, and stop where the "
            f"request ends (EOS, a stop string or the limit)")
    own = types.SimpleNamespace(output_ids=list(ids), text=text, finish_reason=None, stop=stop,
                                max_new_tokens=limit)
    Request.commit(own, list(tokens), eos_id, decode)
    end = len(own.output_ids)
    kept = got == (list(ids) + list(tokens))[: len(got)]  # a stop string left uncut, say
    if kept or own.finish_reason != "stop" or len(got) <= end or got[:end] != own.output_ids:
        return None  # any other difference: judged by the run's end
    return "past_stop", (
        f"{who} cut a stop string off, leaving {end} tokens, and then went on appending the "
        f"run's tokens after it ({len(got)} tokens): the stop string ends the request, so "
        f"nothing after it is committed. Return once you set `req.finish_reason = 'stop'`")


def _edit_words(req, was: tuple, new: tuple, by: str = "your loop") -> str:
    """What ``by`` did to ``req`` (between two of the engine's calls, for a loop), in words."""
    (ids, text, reason), (new_ids, new_text, new_reason) = was, new
    who = f"prompt {req.index}"
    if ids != new_ids:
        n = len(new_ids) - len(ids)
        if new_ids[: len(ids)] == ids:
            return f"{by} appended {n} token(s) to {who}'s `req.output_ids` itself"
        if ids[: len(new_ids)] == new_ids:
            return f"{by} removed tokens from {who}'s `req.output_ids` ({-n} of them)"
        j = next(j for j, (a, b) in enumerate(zip(ids, new_ids)) if a != b)
        return f"{by} changed {who}'s token {j} in `req.output_ids`"
    if reason != new_reason:
        if reason is None:
            return (f"{who} had {len(ids)} of its {req.max_new_tokens} tokens when {by} ended "
                    f"it itself (`req.finish_reason = {new_reason!r}`)")
        return f"{by} changed {who}'s `req.finish_reason` from {reason!r} to {new_reason!r}"
    return f"{by} changed {who}'s `req.text` from {text!r:.40} to {new_text!r:.40}"


_FIX = ("a loop must not edit the requests: the engine's commit adds their tokens and ends them "
        "(EOS, a stop string or the limit)")


def loop_aborted(watch: RequestWatch, prompt: int | None = None) -> str | None:
    """The request (``prompt``, or the first) the learner's loop aborted itself, in words."""
    for index, tokens, limit in watch.aborted:
        if prompt in (None, index):
            return (f"your loop aborted prompt {index} itself, with {tokens} of its {limit} "
                    f"tokens: a loop must not end requests itself; the engine's commit "
                    f"ends them (EOS, a stop string or the limit), and an abort is the user's "
                    f"call (notebook 07, lab 2)")
    return None


def loop_edit(watch: RequestWatch) -> str | None:
    """The first edit of a request the learner's loop made (``watch``), and the fix; or None."""
    return f"{watch.edit}: {_FIX}" if watch.edit else None


def end_taken_back(err) -> Verdict:
    """The engine refused the loop's ``req.finish_reason = None`` on a finished request
    (``EndTakenBack``): that edit, named as the watch names one it saw."""
    return fails("edits_requests", f"your loop changed prompt {err.prompt}'s "
                                   f"`req.finish_reason` from {err.was!r} to None (the engine "
                                   f"refused it: a request ends once): {_FIX}")


def dropped_at_prefill(log, r: int, so: str) -> Verdict:
    """Round ``r``'s deferred decode step, dropped when the prefill after it came; ``so``:
    what that did to the run."""
    return fails("dropped_at_prefill",
                 f"{log.who(r)}: its step was still deferred when prefill {log.who(r + 1)} was "
                 f"launched, and it was never processed, {so}. A prefill round is processed at "
                 f"once, but that does not replace the deferred step: process `previous` under "
                 f"the prefill's forward as in any round, then the prefill's own step")


def drafts_too_deep(log, err) -> Verdict | None:
    """The engine refused a drafting round whose request had two rounds in flight
    (``DraftsTooDeep``): where a deferred step was dropped at a prefill before it, that step
    (round 24: the loop was told only the refusal's class and text)."""
    dropped = [r for r in log.rounds if r < err.round and r not in log.prefill
               and r + 1 in log.prefill and log.first("launch_sample", r) is not None
               and not log.processing(r)]
    if not dropped:
        return None
    return dropped_at_prefill(log, dropped[0], f"so prompt {err.prompt} still had "
                                               f"{err.earlier} rounds in flight when round "
                                               f"{err.round} was prepared (the engine refused it "
                                               f"with drafts on: its lengths would be wrong)")


def spun_by_edit(log, calls: int) -> Verdict | None:
    """A loop the checker stopped after ``calls`` schedules, where it edited the requests: that
    edit named (tokens removed every round keep a request from its limit: blind round 20), not
    a guess at caught errors; None where the loop edited none."""
    why = (f"your loop changed {log.settings_edit}" if log.settings_edit else log.watch.edit)
    if why is None:
        return None
    return fails("edits_requests",
                 f"your loop called `engine.schedule()` {calls} times without finishing (the "
                 f"reference loops need about 50 rounds here), so the checker stopped it. "
                 f"First, {why}: {_FIX}")


def kept_by_edit(log, prompts) -> str | None:
    """A stall on finished requests that kept their blocks (``prompts``), where the loop ended
    one of them itself: that edit named, not the frees (the loop was told "free it" before)."""
    if log.watch.edited not in prompts:
        return None
    return (f"the engine could not go on: {log.watch.edit}, and no step processed after that "
            f"found it finished and freed it: it kept its KV blocks and batch row, and the run "
            f"could not end. {_FIX[0].upper()}{_FIX[1:]}")


def unplanned_by_edit(log, prompts) -> str | None:
    """A stall on unfinished requests that no round plans (``prompts``), where the loop edited
    one of them: that edit named, not the engine's "set req.finish_reason" (blind round 25: the
    loop had appended a token, and the same check refuses a loop that ends a request)."""
    if log.watch.edited not in prompts:
        return None
    req = log.requests[log.watch.edited]
    return (f"the engine could not go on: {log.watch.edit}, and it now holds "
            f"{len(req.output_ids)} of its {req.max_new_tokens} tokens with no finish_reason: "
            f"it wants no more rounds, and only the engine's commit ends a request (its limit, "
            f"a stop string or EOS). {_FIX[0].upper()}{_FIX[1:]}")


def run_verdict(log, outs, reference, where: str = "") -> Verdict | None:
    """What a loop's run (its completions ``outs``) did to its requests, first thing first: a
    request let go unfinished (one the loop aborted itself named), then tokens that differ from
    ``reference`` where the loop edited the requests; None where neither (a check then judges a
    difference by the stage order).  One path for exercises 02 and 03 (blind round 17)."""
    aborted = next((i for i, c in enumerate(outs) if c.finish_reason == "abort"), None)
    why = loop_aborted(log.watch, aborted) if aborted is not None else None
    if why is None and aborted is not None and log.watch.edited == aborted:  # it reopened it
        why = loop_edit(log.watch)
    if why:
        return fails("edits_requests", f"{where}prompt {aborted} never finished: {why}")
    unfinished = pool.left_unfinished(outs, reference)
    if unfinished:
        return fails("left_unfinished", f"{where}{unfinished}")
    diff = pool.compare([c.token_ids for c in outs], reference)
    edited = edited_requests(log, outs, reference) if diff else None
    return fails("edits_requests", f"{where}{diff}: {edited}") if edited else None


def edited_requests(log, outs, reference) -> str | None:
    """Why a run's tokens fell short of ``reference`` when its loop edited the requests, in
    words; None where it did not (the stage order is then to blame).  A setting changed, an edit
    or abort the loop's RequestWatch saw, or (made where no watch sees it) tokens removed after
    the engine's commit or a request ended before its limit."""
    if log.settings_edit:
        return f"your loop changed {log.settings_edit}: {_FIX}"
    if log.watch.edit or log.watch.aborted:
        return loop_edit(log.watch) or loop_aborted(log.watch)
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
                    f"{min(handed[i], req.max_new_tokens)}: your loop removed tokens; {_FIX}")
        return (f"prompt {i} ended {c.finish_reason!r} with {got} tokens, where the reference "
                f"went on to {len(want)}: your loop ended it itself (`req.finish_reason`); {_FIX}")
    return None


def same_run(log, outs, reference: SerialRun, rounds: bool = True) -> str | None:
    """Where a run (its HostLog, its completions) whose tokens are the reference's still
    differs from it, in words, or None: the rounds' prompts (a request the loop edited, seen by
    its RequestWatch, else a loop that reordered or edited the scheduler's queues; ``rounds``: a
    serial run without drafts, as drafts or ZOS's extra steps change them), then each
    completion's text and finish reason (a loop that rewrote them after the engine's commit),
    then an edit that changed neither (a finish reason reset, then set again: blind round 18)."""
    ran_rounds = pool.SerialRun.rounds_of(log.record_commits)
    if rounds and ran_rounds != reference.rounds and log.watch.edit:  # not the queues' doing
        return f"the tokens are right, but {loop_edit(log.watch)}"
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
    return f"the tokens are right, but {loop_edit(log.watch)}" if log.watch.edit else None


def serial_same_run(log, outs, second: bool, endings: bool, config: dict) -> Verdict | None:
    """What a run whose tokens are right still did differently from the serial loop's run of
    the same workload (:func:`pool.same_run`), or None."""
    drafts = config.get("num_draft_tokens", 0)
    reference = pool.serial_run(second=second, endings=endings)
    why = same_run(log, outs, reference, rounds=not drafts)
    if why is None:
        return None
    where = (pool.endings_label(drafts) if endings else
             f"in the second run (stop string {pool.SECOND_RUN['stop']!r})" if second
             else "in the main run")
    return fails("edits_run", f"{where}: {why}")
