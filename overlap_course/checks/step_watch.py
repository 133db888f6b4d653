"""A learner's ``process_outputs`` plug-in (exercise 05) watched as the engine calls it: what it
did to each step (:class:`StepWatch`), and which engine functions an error came through.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import warnings
from collections import Counter

from toy_engine.buffers import out_buffer
from toy_engine.engine import Engine
from toy_engine.record import Access, Commit, Free, Refused, Wait
from toy_engine.sequence import Request
from toy_engine.validate import plugin_label

from .answers import show
from .pool_reading import pool_after, pool_before
from .refusals_caught import REFUSALS, refused_and_caught
from .verdict import Verdict, fails


class StepWatch:
    """Records what a learner's ``process_outputs`` did to each step it was given: which
    events it waited on, each request's launched-round count and cache before/after, and the
    requests whose finish_reason changed (``reasons``: :func:`_reasons`)."""

    def __init__(self, engine: Engine, process_outputs):
        self.engine, self.learner, self.calls = engine, process_outputs, []
        self.held: dict[int, int] = {}  # each KV block's last holder seen: names a block lost later
        self.waited: list = [None, 0, -1]  # see _unwaited_reads

    def _unwaited_reads(self, record, first: int, seq: int) -> list[str]:
        """The output buffers read from ``record``'s event ``first`` on before it held a wait at
        or after launch ``seq`` (the step's sample); the waits before are read once per run."""
        if self.waited[0] is not record:
            self.waited = [record, 0, -1]  # the record read so far: up to event n, waited upto
        _, n, waited = self.waited
        early = []
        for i, event in enumerate(record.events[n:], start=n):
            if isinstance(event, Wait):
                waited = max(waited, event.seq)
            elif (i >= first and isinstance(event, Access) and event.buffer.startswith("out")
                  and waited < seq):
                early.append(event.buffer)
        self.waited = [record, len(record.events), waited]
        return early

    def plugin(self) -> functools.partial:
        """This watch as generate's ``process_outputs``, labelled as the learner's function: a
        refusal the engine words names it as it would without the watch, never this class
        (blind round 25: "process_outputs=StepWatch")."""
        watched = functools.partial(self)
        watched.label = plugin_label(self.learner)
        return watched

    def generate(self, prompts: list, **args) -> list:
        """The engine's run with the learner's plug-in, the engine's warning for requests freed
        unfinished left to the verdict to name (blind round 47: it showed at a checker's line)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"generate: request\(s\) .* left the scheduler",
                                    RuntimeWarning)
            return self.engine.generate(prompts, process_outputs=self.plugin(), **args)

    def __call__(self, engine: Engine, step) -> None:
        reqs = tuple(step.plan.requests)  # a copy: the learner's code may change the plan's list
        call = dict(step=step, requests=reqs, waits=[],
                    before=[(r.num_inflight, r.finished) for r in reqs], after=None,
                    holders={b: r.index for r in engine.requests for b in r.blocks},
                    reasons={r.index: (r.finish_reason, _ids(r), r.text) for r in engine.requests},
                    **pool_before(engine))
        self.held.update(call["holders"])
        self.calls.append(call)
        record, first = engine.record, len(engine.record.events)
        pending = _pending(engine)
        ours, call["caught"] = _refusals_kept(engine), []
        refused_before = len(engine._run.stage_refusals)
        try:
            self.learner(engine, step)
        except BaseException:
            call["raised"] = True  # judged by the exception (the engine then recovers)
            raise
        finally:
            call["caught"] = _stand_ins_gone(engine, ours)
            # a stage called through the class (te.Engine.schedule(engine)) skips the stand-ins
            call["caught"] += [(name, err) for name, err in
                               engine._run.stage_refusals[refused_before:]
                               if all(err is not kept for _, kept in call["caught"])]
            clock, events = engine.timeline.ns_to_ms, record.events[first:]
            call["waits"] = [(w.seq, clock(w.start_ns), clock(w.end_ns), w.round) for w in events
                             if isinstance(w, Wait)]
            call["commits"] = [c for c in events if isinstance(c, Commit)]
            call["frees"] = [f for f in events if isinstance(f, Free)]
            call["refused"] = [r for r in events if isinstance(r, Refused)]
            waited = max((seq for seq, *_ in call["waits"]), default=-1)
            call["forgotten"] = sorted(s for s in pending - _pending(engine) if s > waited)
            call["unwaited_reads"] = self._unwaited_reads(record, first, step.sample_done.seq)
            # round 45: tokens committed with no read of their buffer this record saw (a read of
            # `engine.device.buffers` itself, or one made with the device's books swapped)
            read = any(isinstance(a, Access) and a.buffer == out_buffer(step.slot) for a in events)
            call["unread_commit"] = not read and any(not c.refused for c in call["commits"])
            call["plan_changed"] = tuple(step.plan.requests) != reqs
            call["after"] = [(r.num_inflight, r.finished, bool(r.blocks),
                              r in engine.scheduler.running) for r in reqs]
            call["reasons"] = [] if call.get("raised") else _reasons(engine, step, reqs,
                                                                     call["reasons"])
            call["texts"] = [] if call.get("raised") else _texts(engine, reqs)
            call.update(pool_after(engine))


def _pending(engine: Engine) -> set:
    """The launches the engine's books hold unwaited (the race checker's and the run record's):
    one leaves them only by a wait the record saw (grading round 44: an answer that emptied them,
    or told the race checker it had waited, read before its wait unrefused and scored 4/4)."""
    device = engine.device
    return ({p.seq for p in device.races.pending}
            | {p.seq for p in device.run_record.outstanding()})


def _refusals_kept(engine: Engine) -> dict:
    """The engine's stages, while the learner's code runs, each a stand-in (an attribute of the
    engine) that keeps a refusal out of the outermost call in ``ours["caught"]`` as (name,
    error): a plug-in may catch it and go on (round 28).  Returns the stand-ins."""
    depth, ours = [0], {"caught": []}

    def stand_in(name, real):
        def call(*args, **kwargs):
            depth[0] += 1
            try:
                return real(*args, **kwargs)
            except REFUSALS as err:
                if depth[0] == 1:
                    ours["caught"].append((name, err))
                raise
            finally:
                depth[0] -= 1
        return call
    for name in _STAGES:
        ours[name] = vars(engine)[name] = stand_in(name, getattr(engine, name))
    return ours


def _stand_ins_gone(engine: Engine, ours: dict) -> list:
    """Takes ``ours`` off the engine (not what the learner's code set in their place, which the
    check names); returns the refusals they kept."""
    for name in _STAGES:
        if vars(engine).get(name) is ours[name]:
            del vars(engine)[name]
    return ours["caught"]


_STAGES = ("schedule", "prepare_inputs", "correct_on_device", "launch_forward", "launch_sample",
           "process_outputs", "read_outputs", "commit_outputs", "flush")


def refusal_mistake(call: dict, who: str) -> Verdict | None:
    """A refusal of the engine that the learner's process_outputs caught and went on past."""
    if not call["caught"] or call.get("raised"):
        return None
    name, err = call["caught"][0]
    return refused_and_caught(f"{who}: your process_outputs", name, err, "your code",
                              "A plug-in waits on the step's event, reads, commits and frees: "
                              "make")


UNKNOWN = "?"  # what commit_outputs alone ended a request with, where its tokens are unknown


def _reasons(engine: Engine, step, reqs: tuple, before: dict) -> list[tuple]:
    """Each request whose finish_reason a call changed: (request, its reason before, after,
    what ``commit_outputs`` alone ends it with from its state ``before`` and the tokens the
    step's sample kept (None: it leaves it unfinished, as any request outside the step or
    finished already; UNKNOWN where the tokens cannot be read), its tokens after)."""
    changed = [r for r in engine.requests if r.finish_reason != before[r.index][0]]
    k = 0 if step.plan.is_prefill else engine.config.num_draft_tokens
    kept = engine._run.flights.kept(engine.device, step, k) if changed else None
    found = []
    for req in changed:
        reason, ids, text = before[req.index]
        place = next((i for i, r in enumerate(reqs) if r is req), None)
        by_commit = None
        if reason is None and place is not None:
            known = kept is not None and ids is not None and type(text) is str
            by_commit = _commit_alone(engine, req, ids, text, kept[place]) if known else UNKNOWN
        found.append((req, reason, req.finish_reason, by_commit, _ids(req)))
    return found


def _commit_alone(engine: Engine, req, ids: list, text: str, tokens: list) -> str | None:
    """The finish_reason ``commit_outputs`` gives ``req``, of tokens ``ids`` and ``text``, for
    ``tokens``: the engine's own ``Request.commit``, on a copy."""
    copy = dataclasses.replace(req, output_ids=list(ids), text=text, finish_reason=None,
                               blocks=[])
    Request.commit(copy, tokens, engine.tokenizer.eos_id, engine.tokenizer.decode)
    return copy.finish_reason


def _texts(engine: Engine, reqs: tuple) -> list[tuple]:
    """The requests whose ``req.text`` a call left other than the text of their tokens, where
    the tokens are as ``commit_outputs`` left them (an edit of those the engine refuses):
    (prompt, its text, its tokens' text)."""
    found = []
    for req in reqs:
        ids = _ids(req)
        if ids is None or ids != engine._run.flights.held.get(id(req)) or type(req.text) is not str:
            continue
        try:
            own = engine.tokenizer.decode(ids)
        except (TypeError, ValueError):  # a token the engine refuses as the call returns
            continue
        if str.__str__(req.text) != own:
            found.append((req.index, str.__str__(req.text), own))
    return found


def text_mistake(call: dict, who: str) -> Verdict | None:
    """A ``req.text`` the learner's process_outputs changed (blind round 27: an upper-cased
    text was told to commit each step's tokens once, from its own slot)."""
    if not call.get("texts"):
        return None
    prompt, text, own = call["texts"][0]
    return fails("edits_requests",
                 f"{who}: your process_outputs changed prompt {prompt}'s `req.text`: after the "
                 f"call it reads {show(text)}, where its tokens read {show(own)}. "
                 f"`commit_outputs` sets `req.text` to the text of the tokens it commits (a stop "
                 f"string is matched against it, and generate returns it): leave `req.text` as "
                 f"the commit set it")


def _ids(req) -> list[int] | None:
    """A copy of a request's tokens (None where the learner's code replaced the list: its own
    ``__len__`` or ``__iter__`` may raise)."""
    return list.copy(req.output_ids) if type(req.output_ids) is list else None


def engine_frames(err: BaseException) -> Counter:
    """How many frames of each of the toy engine's functions ``err``'s traceback holds (its
    stages live beside ``Engine``, in other files of the package)."""
    names, tb = Counter(), err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_TOY):
            names[tb.tb_frame.f_code.co_name] += 1
        tb = tb.tb_next
    return names


_TOY = os.path.dirname(inspect.getsourcefile(Engine)) + os.sep
