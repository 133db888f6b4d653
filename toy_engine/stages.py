"""The stages of a round, as a loop calls them: ``engine.schedule()``, ``engine.prepare_inputs(plan)``,
``engine.launch_forward(inputs)``, ``engine.launch_sample(inputs)``, ``engine.process_outputs(step)``.
Each records itself (host span, launches, commits); the loops (loops.py) only choose the order.
"""

import contextlib
import functools
import itertools
import operator
import time

from . import buffers, kernels
from .buffers import MetaLayout
from .config import EngineConfig
from .constraint import TitleCase
from .data import CharTokenizer
from .device import Device, ForeignEvent
from .kernels import FROM_DEVICE
from .races import RaceError
from .record import RunRecord
from .refusals import (CommitOtherTokens, DraftsTooDeep, EndTakenBack, ForeignStep,
                       PlannedPastLimit, RunEnded, SampleBeforeForward, StaleInputs, StateReplaced,
                       StepProcessedTwice)
from .run import FIXED_FIELDS, RoundInputs, Run, StepState
from .scheduler import Plan, Scheduler
from .stage_args import takes
from .sequence import Request
from .timeline import Stage, Timeline, processing
from .validate import check_committed, check_rows, plugin_label as _label

_MAX = FIXED_FIELDS.index("max_new_tokens")  # a request's as generate made it, in Run.fixed
def _stage(method):
    """A stage of the run: refused from another thread or inside a plug-in (``Run.enter``);
    while it runs, an abort from its own thread (a signal handler) waits for the next round."""
    name = method.__name__

    @functools.wraps(method)
    def stage(self, *args, **kwargs):
        if not isinstance(self, RoundStages):  # Engine.<stage>(view, ...): the view's own stage
            return _own_stage(self, name, stage)(*args, **kwargs)
        run = self._run
        previous = run.enter(name)
        try:
            return method(self, *args, **kwargs)
        finally:
            run.stage = previous
    return stage


def _own_stage(obj, name: str, stage):
    """``Engine.<name>(obj, ...)`` given an object that is not an engine but stands for one (the
    course's checkers hand a learner's loop a view of theirs, and notebook 02 prints
    ``te.Engine.process_outputs``): that object's own stage, as ``obj.<name>(...)`` calls it."""
    own = target = getattr(obj, name, None)
    while isinstance(target, functools.partial):  # one bound to ``obj`` again: endless
        target = target.func
    if not callable(own) or getattr(target, "__func__", target) is stage:
        raise TypeError(f"Engine.{name} takes an engine first, got {type(obj).__name__!r}: "
                        f"call it as engine.{name}(...)")
    return own


def _ids(req: Request) -> list:
    """A copy of ``req.output_ids`` before a plug-in commits ([] for no list: refused after).
    It holds plain ints: the engine commits them, and the check stores what it passes as such."""
    return req.output_ids[:] if type(req.output_ids) is list else []


class RoundStages:
    """The stages of a round, as methods of ``Engine``; what they use of it is declared here."""

    config: EngineConfig
    tokenizer: CharTokenizer
    layout: MetaLayout
    constraint: TitleCase | None
    scheduler: Scheduler
    device: Device
    timeline: Timeline
    record: RunRecord
    _run: Run
    _closed: bool

    def _open(self, stage: str) -> None:
        """A closed engine's stages refuse at once: its device and buffers are gone."""
        if self._closed:
            raise RuntimeError(f"{stage}: this engine is closed (engine.close() or the end of its "
                               f"`with` block): create a new Engine")

    @contextlib.contextmanager
    def calling(self, plugin: str):
        """A loop's plug-in runs inside (``plugin``: its name in messages), as the engine's do:
        a round's stage it calls is refused, an abort it makes is applied at once."""
        run = self._run
        previous, run.plugin = run.plugin, plugin
        try:
            yield
        except EndTakenBack as err:
            raise err.by(plugin) from None
        finally:
            run.plugin = previous

    @_stage
    def schedule(self) -> Plan | None:
        """The next round's plan; None when nothing can be launched now (or no work is left).
        Aborts queued (from other threads, or a signal handler mid-stage) are applied first, at
        this round boundary; a request's fixed fields changed since are refused."""
        self._open("schedule")
        run, placed = self._run, self.scheduler.placed
        for req in run.take_aborts():
            self.scheduler.abort(req)
        self.scheduler.check_queue(run.fixed)
        since = self._suspects()
        run.check_fields(self.scheduler.running + self._next_admitted(), placed, since)
        self.scheduler.check_pool(self.config.max_batch_size, self.config.num_kv_blocks, since)
        if not self.scheduler.has_work():
            return None
        run.check_progress(self.scheduler)
        start = self.timeline.now_ms()
        if run.on_round is not None:
            with self.calling(run.labels["on_round"]):
                run.on_round(self, self.scheduler.round)
            self.scheduler.check_queue(run.fixed)  # round 45: what on_round queued, too
            run.check_fields(self.scheduler.running + list(self.scheduler.waiting), placed,
                             who := f"by {run.labels['on_round']}")
            self.scheduler.check_pool(self.config.max_batch_size, self.config.num_kv_blocks, who)
        self._end_lowered(since)
        plan = self._plan()
        self.record.schedule(plan.round if plan else None)
        # A schedule that finds nothing belongs to the last round: before round 0 there is none.
        if (rnd := plan.round if plan else self.scheduler.round - 1) >= 0:
            self.timeline.add("host", Stage.SCHEDULE, rnd, start, self.timeline.now_ms())
        if plan is None:
            if self.scheduler.has_work():
                run.note_idle_schedule(self.scheduler)
            return None
        run.planned(plan)
        if self.config.host_overhead_ms:
            with self.timeline.host_span(Stage.OVERHEAD, plan.round):
                end = time.perf_counter() + self.config.host_overhead_ms / 1e3
                while time.perf_counter() < end:  # deliberate busy host work, for teaching
                    pass
        return plan

    @_stage
    def prepare_inputs(self, plan: Plan, rows=None) -> RoundInputs:
        """Write the round's metadata into its slot and launch its upload.  A ``pending`` request (its
        last round in flight) has input FROM_DEVICE, its lengths assume that round adds one token.
        ``rows``: the metadata's row of each planned request, under which the device keeps its
        newest token, drafts and accepted count (lab 7b's keys); by default its own ``req.row``."""
        self._open("prepare_inputs")
        takes("prepare_inputs", plan, Plan)
        rows = check_rows(rows, plan.requests, self.config.max_batch_size)
        run = self._run
        rnd = run.check_next(plan)
        k = 0 if plan.is_prefill else self.config.num_draft_tokens
        run.check_planned(plan)
        if k and (deep := next((r for r in plan.requests if r.num_inflight > 2), None)):
            raise run.explained(DraftsTooDeep(plan.round, deep.index, deep.num_inflight - 1, k))
        self._check_blocks(plan, k)
        with self.timeline.host_span(Stage.PREPARE, plan.round):
            cols = self._metadata(plan, k, rows or [r.row for r in plan.requests])
            # Enough block-table columns for the furthest position a correction can reach.
            nb = min(self.layout.max_blocks, -(-(max(cols["seqlens_k"]) + k) // self.config.block_size))
            cols["block_tables"] = [b for r in plan.requests for b in (r.blocks + [0] * nb)[:nb]]
            blocks = frozenset(b for r in plan.requests for b in r.blocks)
            inputs = run.keep(RoundInputs(plan, plan.round % run.num_slots, len(cols["input_ids"]),
                                          nb, max(cols["seqlens_q"]), blocks, run))
            try:
                buffers.write_inputs(self.device, self.layout, inputs.slot, cols,
                                     [r.temperature for r in plan.requests], nb)
            except RaceError as err:  # the cause, if a plan before this one was dropped
                raise run.explained(err)
            run.prepared.add(rnd)  # not before: a refused plan, its cause mended, may come again
            self.device.launch(kernels.upload_inputs, inputs.slot, inputs.num_tokens, len(plan.requests), nb,
                               round=plan.round, stage=Stage.UPLOAD,
                               reads={buffers.meta_buffer(inputs.slot), buffers.temps_buffer(inputs.slot)})
        self._run.uploaded = inputs
        return inputs

    def _uploaded(self, stage: str, inputs: RoundInputs) -> tuple:
        """Launch only the latest upload, unchanged (its plan too: its record is returned)."""
        self._open(stage)
        takes(stage, inputs, RoundInputs)
        run = self._run
        if inputs.run is not run:
            raise StaleInputs(stage, inputs.plan.round, None, foreign=True)
        if run.ended:
            raise RunEnded(stage, inputs.plan.round, "inputs")
        run.check_made(stage, inputs)
        planned = run.check_plan(stage, inputs.plan, "inputs")
        if inputs is not run.uploaded:
            raise StaleInputs(stage, planned[0], run.uploaded.plan.round)
        return planned

    def _check_blocks(self, plan: Plan, k: int) -> None:
        """Refuse a plan whose request's row or KV blocks differ from those the scheduler placed
        it at (changed, even if put back after: the round would read and write another's cache
        and state; lab 7b's keys go in ``rows``), or that has no KV block for a position the
        round writes: freed since (a plan kept), or past its reservation (``PlannedPastLimit``)."""
        self._run.check_fields(plan.requests, self.scheduler.placed, "since engine.schedule() "
                               "planned it (by the loop or a plug-in)")
        freed = next((r for r in plan.requests if not r.blocks), None)
        bs = self.config.block_size  # a decode writes up to position planned_len - 2 + k
        past = next((r for r in plan.requests if not plan.is_prefill and (
            r.planned_len - 2 + k >= len(r.blocks) * bs
            or not r.finished and len(r.output_ids) >= r.max_new_tokens)), None)
        if freed is not None:  # a plan kept, never prepared, past the round that freed it
            raise ValueError(f"prepare_inputs was given round {plan.round}'s plan, but prompt "
                             f"{freed.index} in it no longer holds KV blocks (freed since): "
                             f"prepare the plan engine.schedule() just returned")
        if past is not None:
            run = self._run
            raise PlannedPastLimit(plan.round, past, past.planned_len - 2 + k,
                                   len(past.blocks) * bs, run.labels.get("process_outputs"),
                                   run.fixed[id(past)][_MAX], run.who())

    def _plan(self) -> Plan | None:
        """The scheduler's plan: it asks each running request's wants_more, so an end taken
        back there is by one a plug-in replaced on a request, named."""
        try:
            return self.scheduler.note_admitted(self.scheduler.plan_round())
        except EndTakenBack as err:
            raise err.by(" or ".join(sorted({_label(vars(r)["wants_more"]) for r in
                                             self.scheduler.running if "wants_more" in vars(r)})
                                            ) or "a wants_more") from None

    def _suspects(self) -> str:
        """Who may have changed a request since the last checks (each plug-in's changes are
        checked as it returns): the loop, or a commit or wants_more set on a request."""
        run = self._run
        return (f"by {run.labels.get('loop', 'the loop')}" + (
            f", or a commit or wants_more {run.labels['on_round']} set on a request"
            if run.on_round is not None else ""))

    def _next_admitted(self) -> list:
        """The waiting requests a prefill planned now may admit: one per free row."""
        return list(itertools.islice(self.scheduler.waiting, len(self.scheduler.free_rows)))

    def _end_lowered(self, who: str) -> None:
        """End "length" a request whose max_new_tokens was lowered to the tokens it has, with no
        round in flight whose commit would end it (lowered, it only ends sooner, in every mode);
        and one the next prefill may admit lowered to 0 or below, never admitted (an admitted
        one makes a token), its fields checked first (``who`` changed them, if any: the checks
        after on_round saw every waiting one): the scheduler sizes its KV blocks by them."""
        run, waiting = self._run, self.scheduler.waiting
        for req in list(self.scheduler.running):
            if (not req.finished and type(n := req.num_inflight) is int and not n
                    and type(req.output_ids) is list and id(req) in run.fixed
                    and len(req.output_ids) >= req.max_new_tokens < run.fixed[id(req)][_MAX]):
                req.finish_reason = "length"
                self.scheduler.release_if_done(req)
        i = 0
        while i < min(len(waiting), len(self.scheduler.free_rows)):
            req = waiting[i]
            run.check_fields([req], self.scheduler.placed, who)
            if id(req) not in run.fixed or req.max_new_tokens > 0:
                i += 1
                continue
            del waiting[i]
            if not req.finished:
                req.finish_reason = "length"

    def _metadata(self, plan: Plan, k: int, rows: list[int]) -> dict[str, list[int]]:
        """The round's metadata columns (MetaLayout's fields but the block tables)."""
        bs = self.config.block_size
        cols = {name: [] for name in MetaLayout.TOKEN_FIELDS + MetaLayout.REQUEST_FIELDS}
        for req, row in zip(plan.requests, rows):
            if plan.is_prefill:
                start, ids, pending = 0, list(req.prompt_ids), 0
            else:
                known = req.planned_len - 1  # tokens that exist before this round
                pending = int(req.num_inflight > 1)
                last = FROM_DEVICE if pending else (req.prompt_ids + req.output_ids)[-1]
                start, ids = known - 1, [last] + [FROM_DEVICE] * k
            positions = range(start, start + len(ids))
            cols["input_ids"] += ids
            cols["positions"] += positions
            cols["slot_mapping"] += [req.blocks[p // bs] * bs + p % bs for p in positions]
            for name, value in zip(MetaLayout.REQUEST_FIELDS,
                                   (len(ids), start + len(ids), row, pending, req.sampling_stream)):
                cols[name].append(value)
        return cols

    @_stage
    def correct_on_device(self, inputs: RoundInputs) -> None:
        """Fix stale lengths on the device (only speculation makes them stale)."""
        self._uploaded("correct_on_device", inputs)
        if self.config.num_draft_tokens and self.config.correct_seqlens and not inputs.plan.is_prefill:
            self.device.launch(kernels.correct, self._run.correction, round=inputs.plan.round, stage=Stage.CORRECT)

    @_stage
    def launch_forward(self, inputs: RoundInputs) -> None:
        self._uploaded("launch_forward", inputs)
        with self.timeline.host_span(Stage.LAUNCH_FORWARD, inputs.plan.round):
            self.device.launch(kernels.forward, inputs.max_q, round=inputs.plan.round, stage=Stage.FORWARD,
                               blocks=inputs.blocks)
        self._run.flag(inputs, "forwarded")

    @_stage
    def launch_sample(self, inputs: RoundInputs) -> StepState:
        """A constraint's mask is built here, from the tokens committed *now* (under ZOS: round N-1's)."""
        r, prefill, requests = self._uploaded("launch_sample", inputs)
        if not inputs.forwarded:
            raise SampleBeforeForward(r)
        slot = inputs.slot
        with self.timeline.host_span(Stage.LAUNCH_SAMPLE, r):
            reads = set()
            if self.constraint is not None:
                reads = {buffers.allowed_buffer(slot)}
                allowed = self.constraint.masks(requests)
                self.device.host(buffers.allowed_buffer(slot), "w")[: len(allowed)] = allowed
            sample_done = self.device.launch(kernels.sample, slot, prefill, bool(reads), round=r,
                                             stage=Stage.SAMPLE, reads=reads, writes={buffers.out_buffer(slot)},
                                             record_event=True, owner=r)
        self._run.sampled.add(r)
        return self._run.keep(StepState(inputs.plan, slot, sample_done, self._run))

    @_stage
    def process_outputs(self, step: StepState, stage: str = Stage.POSTPROCESS) -> None:
        """Wait for the step's sample event, read its tokens, commit them to the requests, and free
        the cache of those finished and in no launched round; a ``process_outputs`` plug-in given to
        ``generate`` does all of that instead."""
        # Before the wait: another device's event may never come on this one.
        self._own(processing(stage), step)
        custom, label = self._run.process_outputs, self._run.labels.get("process_outputs")
        if custom is not None:
            self._custom_process(custom, label, step, stage)
            return
        with self.timeline.host_span(Stage.WAIT, step.plan.round, step.owner):
            self.device.wait(step.sample_done)
        with self.timeline.host_span(stage, step.plan.round, step.owner):
            out = self.read_outputs(step)
            for req in self.commit_outputs(step, out):
                self.scheduler.release_if_done(req)

    def _custom_process(self, custom, label: str, step: StepState, stage: str) -> None:
        """A process_outputs plug-in processes ``step`` (its round committed once, by
        engine.commit_outputs or by the plug-in itself).  What it commits is checked after, on
        every request the run admitted (it can reach them all: one outside its step must stay as
        it was), and progress is judged from their state then, not from its calls
        (``Run.note_progress``: a token it committed through engine.commit_outputs and took back
        is none)."""
        run = self._run
        planned = r, prefill, requests = run.check_plan(stage, step.plan, "step")  # as recorded
        if step.committed or r in run.committed:
            raise StepProcessedTwice(r, requests, same_step=step.committed)
        mine = {id(req) for req in requests}
        before = [(req, _ids(req), req.finished) for req in run.admitted]
        run.flights.held = {id(req): ids for req, ids, _ in before if id(req) in mine}
        with self.timeline.host_span(stage, r, step.owner), self.calling(label):
            custom(self, step)
        how = "through engine.commit_outputs" if r in run.committed else "itself"
        for req, ids, _ in before:  # it may commit itself: the device reads what it kept
            now = req.output_ids
            if id(req) in mine:
                self._check_committed(req, ids, f"{label}, committing prompt {req.index}'s "
                                                f"tokens {how},")
            elif not (type(now) is list and len(now) == len(ids)
                      and all(map(operator.is_, ids, now))):  # most rounds: none changed
                self._check_outside(req, ids, f"{label}, given round {r}'s step (prompt "
                                              f"{req.index} is not in it),")
            run.note_progress(req, self.scheduler.round)
        k = 0 if prefill else self.config.num_draft_tokens
        run.after_process(step, planned, label, before,
                          lambda: run.flights.kept(self.device, step, k))
        run.flights.held = {}
        run.check_fields(self.scheduler.running + list(self.scheduler.waiting),
                         self.scheduler.placed, f"by {label}")

    def _check_outside(self, req: Request, old: list, plugin: str) -> None:
        """Refuse a change ``plugin`` made to the tokens of a request outside its step."""
        self._check_committed(req, old, plugin)
        if len(req.output_ids) != len(old):
            raise ValueError(f"{plugin} changed prompt {req.index}'s req.output_ids from "
                             f"{len(old)} to {len(req.output_ids)} tokens: a step's tokens go "
                             f"to its own requests (step.plan.requests), in their order")

    def _own(self, stage: str, step: StepState) -> tuple:
        """Refuse what is not a step of this run: another run's requests are not this run's, its
        event not this device's, and may never come on it (``ForeignStep``); nor one changed (its
        plan too: its record, (round, is_prefill, requests), is returned)."""
        self._open(stage)
        takes(stage, step, StepState)
        if step.run is not self._run:
            raise ForeignStep(step.plan.round)
        self._run.check_made(stage, step)
        planned = self._run.check_plan(stage, step.plan, "step")
        if step.sample_done.device != self.device.serial:  # its device was replaced since
            raise ForeignEvent(planned[0], step.sample_done.stage)
        if step.run.ended:
            raise RunEnded(stage, planned[0], "step")
        return planned

    @_stage
    def read_outputs(self, step: StepState) -> list[int]:
        """The step's output slot: ``tokens[B, 1 + k]`` then ``accepted[B]``, as a list."""
        _, prefill, requests = self._own("read_outputs", step)
        k = 0 if prefill else self.config.num_draft_tokens
        size = buffers.outputs_size(len(requests), k)
        return self.device.host(buffers.out_buffer(step.slot), "r")[:size].tolist()

    @_stage
    def commit_outputs(self, step: StepState, out: list[int]) -> list[Request]:
        """Hand a step's tokens to its requests (a finished one's are the extra round: discarded).
        A round is committed once, whichever StepState of it brings it (``StepProcessedTwice``)."""
        run, (rnd, prefill, requests) = self._run, self._own("commit_outputs", step)
        k = 0 if prefill else self.config.num_draft_tokens
        n = len(requests)
        sampled = buffers.unpack_outputs(
            buffers.checked_outputs(out, n, k, self.tokenizer.vocab_size, rnd), n, k)
        twice = step.committed or rnd in run.committed
        if not twice:
            run.flights.check_outputs((rnd, prefill, requests), sampled,
                                      run.flights.kept(self.device, step, k), run.who())
        self.record.commit(rnd, [r.index for r in requests], twice, sampled)
        if twice:
            raise StepProcessedTwice(rnd, requests, same_step=step.committed)
        for req in requests:  # its own commit adds to them
            StateReplaced.check(req, run.flights.prompts[id(req)], f"by {run.who()}, before "
                                                                   f"engine.commit_outputs")
        run.flights.check_held(rnd, requests, run.who(), self.tokenizer.vocab_size)
        run.flag(step, "committed")
        run.done(rnd)
        for req, kept in zip(requests, sampled):  # as recorded: a commit plug-in may reorder
            req.num_inflight -= 1
            if req.finished:
                run.counts["discarded"] += 1
                continue
            before, n = len(req.output_ids), len(kept)  # the commit may consume ``kept``
            self._commit(req, kept, rnd)
            run.note_progress(req, self.scheduler.round)
            run.counts["tokens"] += len(req.output_ids) - before
            if not prefill:
                run.counts["request_decode_rounds"] += 1
                run.counts["proposed"] += k
                run.counts["accepted"] += n - 1
        held = run.flights.held  # a plug-in's call: what it hands out beside it is refused after
        held.update((id(r), _ids(r)) for r in requests if id(r) in held)
        return list(requests)

    def _commit(self, req: Request, kept: list, rnd: int) -> None:
        """Hand ``req`` the tokens round ``rnd`` kept through its commit; one a plug-in replaced
        on the request is checked after: it appends them, in order, or fewer as the request
        ends, taking tokens back only as a stop string ends it (the device goes on from what
        it kept); an EOS the round kept, left out or kept, is lab 4's mistake to judge
        (past_eos, eos_kept), as a stop string left uncut is."""
        if "commit" not in vars(req):
            req.commit(kept, self.tokenizer.eos_id, self.tokenizer.decode)
            return
        ids = _ids(req)
        want = ids + kept  # before the call: the commit may change the list it is given
        with self.calling(label := _label(vars(req)["commit"])):
            req.commit(kept, self.tokenizer.eos_id, self.tokenizer.decode)
        who = f"prompt {req.index}'s commit, replaced on the request by a plug-in"
        self._run.flights.check([req], f"by {who} ({label})")
        self._check_committed(req, ids, f"{who} ({label}),")
        now = len(req.output_ids)  # fewer than ``ids``: a stop string's cut, if it ended
        CommitOtherTokens.check(rnd, req.index, req.output_ids[len(ids):], want[len(ids):],
                                label, self.tokenizer.eos_id, max(0, len(ids) - now),
                                req.finish_reason, now >= req.max_new_tokens)

    def _check_committed(self, req: Request, old: list, plugin: str) -> None:
        """Refuse what ``plugin`` put in ``req.output_ids`` (``old`` before the call) other than
        token ids appended, or the newest removed (``validate.check_committed``)."""
        StateReplaced.check(req, req.index, f"by {plugin.rstrip(',')}")
        check_committed(req, old, plugin, self.tokenizer.vocab_size)

    @_stage
    def flush(self, previous: StepState | None) -> StepState | None:
        """Process a deferred step now: there is no next round to overlap it with.  Returns
        what stays deferred, nothing, so ``previous = engine.flush(previous)`` also clears it."""
        self._open("flush")
        takes("flush", previous, StepState, or_none=True)
        if previous is not None:
            self.process_outputs(previous, stage=Stage.FLUSH)
        return None
