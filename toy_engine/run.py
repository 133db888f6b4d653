"""A run's state: the ``Run`` of one ``generate`` call (a fresh one per call, so nothing of
an interrupted run leaks into the next), the rounds in flight in it, and the check that the
loop keeps making progress."""

import operator
import threading
import warnings
import weakref
from dataclasses import dataclass, field

from . import kernels
from .device import Event
from .flights import Flights
from .refusals import (FixedChanged, ForeignStep, InflightChanged,  # noqa: F401
                       PlacementChanged, PlannedSince, PreparedTwice, RunEnded, SampleBeforeForward,
                       StageInPlugin, StaleInputs, StateReplaced,  # exported: the checks'
                       StepProcessedTwice)
from .scheduler import Plan
from .sequence import Request
from .stalls import (EngineStalled, stalled,  # noqa: F401 - exported: the engine's, the checks'
                     uncommitted_step)
from .validate import plugin_label, shown


class _SetOnce:
    """A round's record whose fields are set once, as the engine made it: they say where the
    round's inputs and results live (plan, slot, event, run), so one changed after would launch,
    read or commit another round's, silently; the engine sets its own flags through ``Run.flag``.
    object.__setattr__ and vars() get around this: ``Run.check_made`` checks where they are used."""

    def __setattr__(self, name, value):
        if name not in vars(self):  # as the dataclass's __init__ sets it
            return object.__setattr__(self, name, value)
        run, what = vars(self).get("run"), type(self).__name__
        who = run.who() if isinstance(run, Run) else "the loop"
        raise AttributeError(
            f"{who} set {what}.{name} of round {self.plan.round}: a {what}'s fields are the "
            f"engine's, set as it was made (they say where round {self.plan.round}'s inputs "
            f"and results live: its plan, slot, event), and one changed would read another "
            f"round's tokens as this one's; read them, never change them")


@dataclass
class RoundInputs(_SetOnce):
    """What the host prepared for one round (it lives in host buffer slot ``slot``)."""

    plan: Plan
    slot: int
    num_tokens: int
    num_blocks: int
    max_q: int
    blocks: frozenset  # the KV blocks its launches touch, as the race checker is told
    run: "Run" = field(default=None, repr=False, compare=False)  # the generate call that made it
    forwarded: bool = field(default=False, repr=False)  # launch_forward was given it

    NAME, MADE_BY = "inputs", "prepare_inputs(plan)"  # as messages name it, and what makes it


@dataclass
class StepState(_SetOnce):
    """A launched round whose results the host has not processed yet: it owns the round's
    output slot and the event that says the sample is done (nobody may read the slot, reuse
    it or free the requests' KV blocks before waiting on it), and commits them once."""

    plan: Plan
    slot: int
    sample_done: Event
    run: "Run" = field(repr=False, compare=False)  # the generate call that launched it
    committed: bool = field(default=False, repr=False)

    NAME, MADE_BY = "step", "launch_sample(inputs)"

    @property
    def owner(self) -> int:
        """What owns the round's results, as spans and race reports name it: its round."""
        return self.plan.round


@dataclass
class Run:
    """What one ``generate`` call owns: its requests (in prompt order; a plug-in that changes
    ``engine.requests``, ``visible``, cannot lose one), plug-ins, buffer slots and counters."""

    requests: tuple[Request, ...] = ()
    on_round: object = None
    correction: object = kernels.correct_seqlens_qk
    process_outputs: object = None
    num_slots: int = 2  # host buffer slots: round N uses slot N % num_slots
    # per request and round; discarded: outputs of already-finished requests (the extra round under ZOS)
    counts: dict = field(default_factory=lambda: dict(tokens=0, request_decode_rounds=0, proposed=0,
                                                      accepted=0, discarded=0))
    prefill_rounds: set = field(default_factory=set)
    admitted: list = field(default_factory=list)  # requests a prefill plan took in, in order
    committed: set = field(default_factory=set)  # rounds whose tokens were handed out
    uploaded: RoundInputs | None = None  # the latest prepared round: the inputs the device holds
    idle_schedule: bool = False  # the last schedule found nothing to launch, and nothing was processed since
    loop_thread: int | None = None  # the thread running the loop (its ident), until the run ends
    other_thread: RuntimeError | None = None  # the first stage call refused from another thread
    # each stage refused in a plug-in, (stage, error): one caught there leaves no other trace
    stage_refusals: list = field(default_factory=list)
    ended: bool = False  # generate returned: its stages take none of its objects any more
    queued_aborts: list = field(default_factory=list)  # requests aborted from other threads
    # Reentrant: a signal handler in the loop's thread may abort while the loop holds it.
    _aborts_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    labels: dict = field(default_factory=dict)  # generate's plug-ins, as messages name them
    stage: str | None = None  # the engine's stage running now in the loop's thread
    plugin: str | None = None  # the plug-in called now from a stage or a lab's loop
    # The run's record of what its stages made, by id: a plan -> (plan, (round, is_prefill,
    # requests)); inputs or a step -> (it, its fields); held while its round is in flight, and
    # after by a weak reference (``done``): the record lives as long as the learner keeps them.
    made: dict = field(default_factory=dict)
    inflight: dict = field(default_factory=dict)  # round -> the ids of what was made for it
    latest: int = -1  # the last round engine.schedule() planned
    prepared: set = field(default_factory=set)  # rounds in flight whose plan was prepared
    sampled: set = field(default_factory=set)  # rounds in flight whose sample was launched
    handed: dict = field(default_factory=dict)  # round -> the process_outputs plug-in given it
    live: int = 64  # record entries past which the dead ones are dropped (``done``)
    progress_round: int = 0  # the scheduler's round when a commit last added a token or ended one
    marks: dict = field(default_factory=dict)  # id(request) -> (most tokens it had, ended)
    limits: dict = field(default_factory=dict)  # id(request) -> lowest max_new_tokens seen
    lost: list = field(default_factory=list)  # ids of requests end() found freed unfinished

    def __post_init__(self) -> None:
        self.requests = tuple(self.requests)
        self.visible = list(self.requests)
        self.fixed = {id(r): tuple(_copy(getattr(r, f)) for f in FIXED_FIELDS)
                      for r in self.requests}
        # Each request's rounds in flight (a process_outputs plug-in may commit one itself).
        self.flights = Flights({key: fixed[1] for key, fixed in self.fixed.items()})

    def queue_abort(self, req: Request) -> bool:
        """Queue ``req``'s abort if it comes from another thread than the loop's (a server's
        client), or from the loop's own thread in the middle of a stage (a signal handler: a
        timeout, a Ctrl-C handler): the loop applies it at the next round's schedule, as vLLM's
        and SGLang's loops drain theirs, so the scheduler is changed at round boundaries only.
        False: apply it now (between stages, from a plug-in; or the run is over)."""
        with self._aborts_lock:
            if self.loop_thread is None or (self.loop_thread == threading.get_ident() and (
                    self.stage is None or self.plugin is not None)):
                return False
            self.queued_aborts.append(req)
            return True

    def enter(self, stage: str) -> str | None:
        """``stage`` starts (the previous stage, to restore, is returned): refused from another
        thread than the run's loop (kept: a stall's cause), a round's stage from a plug-in, and
        process_outputs from the plug-in that replaces it (it would call itself, endlessly)."""
        if self.loop_thread not in (None, threading.get_ident()):
            refused = RuntimeError(
                f"engine.{stage}() was called from another thread than the one running generate "
                f"on this engine: only the run's loop calls the stages (a round planned or "
                f"launched here is one the loop never sees); from another thread call only "
                f"engine.abort(request_id), or give each thread its own Engine")
            self.other_thread = self.other_thread or refused  # that thread's caller never sees it
            raise refused
        inside = (f"the plug-in {self.plugin}" if self.plugin is not None else
                  f"engine.{self.stage}() (a plug-in it calls, such as per_request's wants_more)")
        if stage in ROUND_STAGES and (self.plugin is not None or self.stage is not None) or (
                stage == "process_outputs" and self.plugin is not None
                and self.plugin == self.labels.get("process_outputs")):  # it would call itself
            self.stage_refusals.append((stage, StageInPlugin(stage, inside)))
            raise self.stage_refusals[-1][1]
        previous, self.stage = self.stage, stage
        return previous

    def planned(self, plan: Plan) -> None:
        """``plan``, as engine.schedule() returns it, is kept to check it is not changed after."""
        rnd, plan.run = plan.round, self
        self.made[id(plan)] = plan, (rnd, plan.is_prefill, tuple(plan.requests))
        self.inflight[rnd], self.latest = [id(plan)], rnd
        self.flights.planned(plan.requests)
        if plan.is_prefill:
            self.prefill_rounds.add(rnd)
            self.admitted += plan.requests

    def check_plan(self, stage: str, plan, what: str = "plan") -> tuple:
        """Refuse a plan engine.schedule() did not return (a copy), or changed since (its class;
        its requests reordered, added or removed; its round or kind, around Plan's guard): the
        round's tokens are committed in its requests' order, and its metadata went to the
        device in the order prepare_inputs saw.  Read through vars() against the record, so no
        code of a class put in Plan's place runs.  Returns (round, is_prefill, requests)."""
        kept, rec = self._kept(plan)
        if kept is not plan and type(plan) is Plan and vars(plan).get("run") is self:
            raise ValueError(f"{self.who()} gave engine.{stage}() a Plan that engine.schedule() "
                             f"did not return (a copy, dataclasses.replace() or one built by "
                             f"hand): only the one it returned is this run's record of its "
                             f"round; pass that one")  # (round 37: told "another run")
        if kept is not plan:
            rnd = vars(plan).get("round") if type(plan) is Plan else None
            raise ForeignStep(rnd if type(rnd) is int else -1, what="plan")
        rnd, prefill, reqs = rec
        now = vars(plan) if type(plan) is Plan else {}
        ids, was = now.get("requests"), now.get("round")
        if now.get("is_prefill") is prefill and type(ids) is list and len(ids) == len(reqs) and (
                all(map(operator.is_, ids, reqs)) and type(was) is int and was == rnd):
            return rec
        why = next((f"plan.{name} changed from {shown(b)} to {shown(a)}, around Plan's guard "
                    f"(object.__setattr__ or vars()), by {self.who()} or before: a plan's round "
                    f"and kind are the engine's (the stages find and size the round's inputs "
                    f"and results by them); read them, never change them"
                    for name, a, b in zip(("round", "is_prefill"), (was, now.get("is_prefill")),
                                          (rnd, prefill)) if not (type(a) is type(b) and a == b)),
                   None) if now else (
            f"plan.__class__ changed from Plan to {type(plan).__name__}, by {self.who()} or "
            f"before: the engine reads its plans as it made them, and code of a class put in "
            f"its place would decide what the stages see; leave a plan's class as it is")
        raise ValueError(
            f"{stage} was given round {rnd}'s "
            + ("plan" if what == "plan" else f"{what}, its plan") + " changed since "
            "engine.schedule() returned it ("
            + (why or "its requests reordered, added or removed: the round's metadata goes to "
               "the device in the plan's order and its tokens are handed out in that order, so "
               "they would reach the wrong prompts; do not change a plan, sort a copy: "
               "sorted(plan.requests, key=...)") + ")")

    def check_next(self, plan) -> int:
        """The round of ``plan``, which prepare_inputs may prepare now: this run's, as made, not
        prepared before, and the last plan made: planning counts a round in flight for its
        requests, so a plan prepared after a later one reads lengths already moved past it
        (round 32: other text, or a bare race on ``meta1``)."""
        if plan.run is not self:  # as a step's run is checked (stages' _own)
            raise ForeignStep(plan.round, what="plan")
        if self.ended:
            raise RunEnded("prepare_inputs", plan.round, "plan")
        rnd = self.check_plan("prepare_inputs", plan)[0]
        if rnd in self.prepared or rnd in self.committed:
            raise PreparedTwice(rnd, self.latest, rnd in self.committed)
        if rnd != self.latest:
            raise PlannedSince(rnd, self.latest)
        return rnd

    def explained(self, err: Exception) -> Exception:
        """``err`` (a race on a host buffer, drafts too deep), raised as a later round is
        prepared, with its cause when an earlier plan was dropped (``continue`` before its
        sample): the step deferred under it was never processed, and its requests still count
        that round (round 33: the engine named only the race)."""
        dropped = [(r, prepared) for r, prepared in self.dropped() if r < self.latest]
        kept = [(r, label) for r, label in self.uncommitted() if r < self.latest]
        if dropped:
            r, prepared = dropped[0]
            how = ("prepared but its sample never launched" if prepared else
                   "scheduled but never prepared or launched")
            err.args = (f"{err.args[0]}. The cause: round {r}'s plan was {how}, so its requests "
                        f"still count it in flight and the step deferred before it was never "
                        f"processed; run every plan engine.schedule() returns, once",)
        elif kept:  # round 35: the loop was blamed for a plug-in's missing commit
            err.args = (f"{err.args[0]}. The cause: {uncommitted_step(*kept[0])}",)
        return err

    def uncommitted(self) -> list[tuple[int, str]]:
        """Rounds whose step a process_outputs plug-in was given and returned uncommitted (it
        may commit one later, by engine.commit_outputs), with the plug-in's label."""
        return [(r, label) for r, label in self.handed.items() if r not in self.committed]

    def who(self) -> str:
        """Who calls the stages now, as messages name it: the plug-in running, else the loop."""
        return self.plugin or self.labels.get("loop", "the loop")

    def keep(self, made):
        """``made``, a RoundInputs or StepState a stage returns, as made (``check_made``); a
        step's event too: the device waits on its handle and seq, so one changed reads early."""
        fields = dict(vars(made))
        if type(made) is StepState:
            fields.update({f"sample_done.{f}": v for f, v in vars(made.sample_done).items()})
            self.flights.samples[made.slot] = made.sample_done.seq
        self.made[id(made)] = made, fields
        self.inflight.setdefault(made.plan.round, []).append(id(made))
        return made

    def _kept(self, obj) -> tuple:
        """The object recorded under ``obj``'s id (None: none alive) and its record."""
        kept, rec = self.made.get(id(obj), (None, None))
        if type(kept) is weakref.ref:  # its round was committed (``done``)
            kept = kept()
        return kept, rec

    def flag(self, made, name: str) -> None:
        """Set the engine's flag ``name`` (``forwarded``, ``committed``) of ``made``, as kept."""
        vars(made)[name] = self.made[id(made)][1][name] = True

    def done(self, rnd: int) -> None:
        """Round ``rnd``'s tokens were handed out (progress: a schedule may find nothing to
        launch again): what was made for it is recorded from now on by a weak reference, while
        the learner keeps it (to refuse it given again: a step processed twice, a plan prepared
        twice); the dead are dropped as the record grows."""
        self.committed.add(rnd)
        self.prepared.discard(rnd)
        self.sampled.discard(rnd)
        self.idle_schedule = False
        made = self.made
        self.flights.committed(made[self.inflight[rnd][0]][1][2])  # the plan's requests
        for key in self.inflight.pop(rnd, ()):
            kept, rec = made[key]
            made[key] = weakref.ref(kept), rec
        if len(made) > self.live:
            self.made = {key: entry for key, entry in made.items()
                         if type(entry[0]) is not weakref.ref or entry[0]() is not None}
            self.live = 2 * len(self.made) + 64

    def check_made(self, stage: str, given) -> None:
        """Refuse inputs or a step this run's stages did not make (a copy, dataclasses.replace),
        or whose fields were changed around their set-once guard (object.__setattr__, vars()):
        its plan, slot or event would launch, read or commit another round's, silently."""
        kept, fields = self._kept(given)
        what, maker = type(given).NAME, f"engine.{type(given).MADE_BY}"
        if kept is not given:
            raise ValueError(f"{self.who()} gave engine.{stage}() a {type(given).__name__} "
                             f"that {maker} did not return (a copy, dataclasses.replace() or "
                             f"one built by hand): only the one it returned says where its "
                             f"round's inputs and results live; pass that one")
        now = dict(vars(given))
        if type(given) is StepState and isinstance(now.get("sample_done"), Event):
            now.update({f"sample_done.{f}": v for f, v in vars(now["sample_done"]).items()})
        name = next((f for f, v in fields.items() if f not in now or now[f] is not v and not (
            type(v) in (int, str) and type(now[f]) is type(v) and now[f] == v)), None)
        if name is None:
            return
        how = ("removed" if name not in now else f"changed from {shown(fields[name])} to "
               f"{shown(now[name])}" if type(fields[name]) in (int, bool, str) else "replaced")
        rnd = self.made[id(fields["plan"])][1][0]
        raise ValueError(
            f"{self.who()} gave engine.{stage}() round {rnd}'s {what} with {what}.{name} {how} "
            f"since {maker} made it (object.__setattr__ and vars() get around its set-once "
            f"fields): its plan, slot and event say where round {rnd}'s inputs and results "
            f"live, and one changed would read another round's tokens as this one's; read "
            f"them, never change them")

    def check_planned(self, plan: Plan) -> None:
        """Refuse a plan's request whose num_inflight changed since engine.schedule() planned it:
        prepare_inputs sizes the round from it (changed and put back around it, the round would
        run silently wrong).  Its fixed fields, row and blocks: ``_check_blocks``."""
        self.flights.check(plan.requests, "since engine.schedule() planned it (by the loop or a "
                                          "plug-in)")

    def after_process(self, step: StepState, planned: tuple, label: str, before, kept) -> None:
        """After a process_outputs plug-in (``label``): a round it committed itself, as
        ``Flights.after_process`` judges, is committed as engine.commit_outputs commits one."""
        if self.flights.after_process(planned, label, planned[0] in self.committed, before, kept):
            self.flag(step, "committed")
            self.done(planned[0])
        elif planned[0] not in self.committed:  # named if its requests wait for it (round 35)
            self.handed[planned[0]] = label

    def check_fields(self, requests, placed: dict, who: str) -> None:
        """Refuse a request whose fixed fields (checked by generate, sized, reserved or sent
        at admission) changed, or whose max_new_tokens rose above the lowest it had (lowered, it
        only ends sooner), or whose output_ids or text is of another type; ``who`` may have."""
        for req in requests:
            fixed = self.fixed.get(id(req))
            if fixed is None:  # not this run's: another run's, or the loop's own object
                continue
            # Admitted by the scheduler: its row, and an unfinished one's blocks (a finished
            # one's are freed by the loop: how is lesson 5's to judge).
            held = placed[id(req)][:1 + (not req.finished)] if id(req) in placed else ()
            for name, was in zip(FIXED_FIELDS + ("row", "blocks"), fixed + held):
                now = getattr(req, name)
                if name == "max_new_tokens":  # the limit in force: the lowest it had
                    was = self.limits.get(id(req), was)
                    self.limits[id(req)] = now if type(now) is int and now < was else was
                if type(now) is type(was) and (now == was or name == "max_new_tokens"
                                               and now < was):
                    continue
                if name in ("row", "blocks"):
                    raise PlacementChanged(fixed[1], name, was, now, who)
                raise FixedChanged(fixed[1], name, was, now, who, FIXED_FIELDS[2:], bool(held),
                                   fixed[FIXED_FIELDS.index("max_new_tokens")])
            StateReplaced.check(req, fixed[1], who)

    def take_aborts(self) -> list[Request]:
        """The aborts queued since the last call, oldest first (the loop's thread applies them).
        Most rounds have none: read without the lock (one queued meanwhile waits a round), so a
        KeyboardInterrupt between a round's lines never finds it held (a trace hook's may
        come between a `with` block's last line and its release)."""
        if not self.queued_aborts:
            return []
        with self._aborts_lock:
            taken, self.queued_aborts = self.queued_aborts, []
        return taken

    def end(self) -> None:
        """Drop the plug-ins once the call returns (a closure over the engine here is a cycle); a
        request a loop took out of the scheduler unfinished, or whose queued abort no round
        boundary applied, ends "abort", as its completion says."""
        self.on_round = self.process_outputs = None
        self.correction = kernels.correct_seqlens_qk
        asked = {id(r) for r in self.queued_aborts}
        self.lost = [r.id for r in self.requests if not r.finished and id(r) not in asked]
        for req in self.requests:
            if not req.finished:
                req.finish_reason = "abort"
        with self._aborts_lock:  # every request has ended: an abort from now on has nothing to do
            self.loop_thread, self.queued_aborts, self.ended = None, [], True
        self.stage = self.plugin = None

    def warn_lost(self) -> None:
        """Once a clean run has returned its completions: name the requests its loop took out of
        the scheduler unfinished with no abort asked, which ended "abort" (round 43: silently)."""
        if self.lost:
            warnings.warn(f"generate: request(s) {shown(self.lost)} left the scheduler unfinished "
                          f"with no abort asked (the loop or a process_outputs plug-in freed "
                          f"them): they end as \"abort\"", RuntimeWarning,
                          stacklevel=5)  # generate's caller

    def dropped(self) -> list[tuple[int, bool]]:
        """Rounds engine.schedule() planned whose sample was never launched, each with whether
        its plan was prepared."""
        return [(r, r in self.prepared) for r in sorted(self.inflight) if r not in self.sampled]

    def check_progress(self, scheduler) -> None:
        """Stall a run whose commits added no token and ended no request in
        MAX_ROUNDS_WITHOUT_PROGRESS rounds, naming what commits (rounds are planned on)."""
        rounds = scheduler.round - self.progress_round
        if rounds < MAX_ROUNDS_WITHOUT_PROGRESS:
            return
        commits = [vars(r)["commit"] for r in scheduler.running if "commit" in vars(r)]
        if self.process_outputs is not None:
            who, hint = self.labels["process_outputs"], (
                "it never commits, or takes back what it committed: does it hand each "
                "round's tokens to its requests (engine.commit_outputs(step, tokens), or append "
                "each kept token to req.output_ids), keep them, and set req.finish_reason when "
                "a request ends?")
        elif commits:
            who, hint = plugin_label(commits[0]), ("does your function append each kept token "
                                                   "to req.output_ids and set req.finish_reason "
                                                   "when the request ends?")
        else:
            who, hint = self.labels.get("loop", "the loop"), (
                "does it process each round's step (engine.process_outputs(step))?")
        unfinished = [r for r in self.requests if not r.finished]
        raise EngineStalled(
            f"{who}: {rounds} rounds in a row in which no request gained a token or ended "
            f"({len(unfinished)} unfinished), so the run would never end: {hint}",
            reason="no_progress", requests=unfinished)

    def note_progress(self, req: Request, rnd: int) -> None:
        """Progress at the scheduler's round ``rnd`` if ``req`` has more tokens than it ever had,
        or ended for the first time: one whose tokens are taken back and given again, or that
        is set back to unfinished around the guard (vars()) and ends again, makes none (such a
        run would never stall)."""
        most, ended = self.marks.get(id(req), (0, False))
        n = len(req.output_ids) if type(req.output_ids) is list else 0
        if n > most or req.finished and not ended:
            self.progress_round = rnd
        self.marks[id(req)] = max(n, most), ended or req.finished

    def note_idle_schedule(self, scheduler) -> None:
        """Nothing to launch while work is left: legal once, while launched results are outstanding."""
        if self.idle_schedule or not any(r.num_inflight for r in scheduler.running):
            raise stalled(scheduler, scheduling=True, dropped=self.dropped(),
                          uncommitted=self.uncommitted()) from self.other_thread
        self.idle_schedule = True


#: Rounds in a row in which no request gained a token or ended before a run is stalled: a right
#: run has at most max_new_tokens rounds in flight (the model has 256 positions), so this is
#: never reached by one, drafts, stop strings or constraint included.
MAX_ROUNDS_WITHOUT_PROGRESS = 1000
#: A request's fields that stay as generate made them (a plug-in changing one is refused).
FIXED_FIELDS = ("id", "index", "prompt", "prompt_ids", "max_new_tokens", "stop", "temperature",
                "seed")
#: The stages that plan or launch a round: never called from inside a plug-in.
ROUND_STAGES = {"schedule", "prepare_inputs", "correct_on_device", "launch_forward",
                "launch_sample", "flush"}


def _copy(value):
    """A field's value as it is now (a list is copied: it may be changed in place)."""
    return list(value) if type(value) is list else value
