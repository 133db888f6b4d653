"""The stages of a round, as a loop calls them: ``engine.schedule()``, ``engine.prepare_inputs(plan)``,
``engine.launch_forward(inputs)``, ``engine.launch_sample(inputs)``, ``engine.process_outputs(step)``.
Each records itself (host span, launches, commits); the loops (loops.py) only choose the order.
"""

import time

from . import buffers, kernels
from .buffers import MetaLayout
from .config import EngineConfig
from .constraint import TitleCase
from .data import CharTokenizer
from .device import Device
from .kernels import FROM_DEVICE
from .record import RunRecord
from .run import ForeignStep, RoundInputs, Run, StepProcessedTwice, StepState
from .scheduler import Plan, Scheduler
from .sequence import Request
from .timeline import Stage, Timeline


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

    def schedule(self) -> Plan | None:
        """The next round's plan; None when nothing can be launched now (or no work is left).
        Aborts queued from other threads are applied first, at this round boundary."""
        for req in self._run.take_aborts():
            self.scheduler.abort(req)
        if not self.scheduler.has_work():
            return None
        start, run = self.timeline.now_ms(), self._run
        if run.on_round is not None:
            run.on_round(self, self.scheduler.round)
        plan = self.scheduler.schedule()
        self.record.schedule(plan.round if plan else None)
        # A schedule that finds nothing to launch belongs to the last round, not a new one.
        self.timeline.add("host", Stage.SCHEDULE, plan.round if plan else max(0, self.scheduler.round - 1),
                          start, self.timeline.now_ms())
        if plan is None:
            if self.scheduler.has_work():
                run.note_idle_schedule(self.scheduler)
            return None
        if plan.is_prefill:
            run.prefill_rounds.add(plan.round)
        if self.config.host_overhead_ms:
            with self.timeline.host_span(Stage.OVERHEAD, plan.round):
                end = time.perf_counter() + self.config.host_overhead_ms / 1e3
                while time.perf_counter() < end:  # deliberate busy host work, for teaching
                    pass
        return plan

    def prepare_inputs(self, plan: Plan) -> RoundInputs:
        """Write the round's metadata into its slot and launch its upload.  A ``pending`` request (its
        last round in flight) has input FROM_DEVICE, its lengths assume that round adds one token."""
        with self.timeline.host_span(Stage.PREPARE, plan.round):
            k = 0 if plan.is_prefill else self.config.num_draft_tokens
            cols = self._metadata(plan, k)
            # Enough block-table columns for the furthest position a correction can reach.
            nb = min(self.layout.max_blocks, -(-(max(cols["seqlens_k"]) + k) // self.config.block_size))
            cols["block_tables"] = [b for r in plan.requests for b in (r.blocks + [0] * nb)[:nb]]
            inputs = RoundInputs(plan, plan.round % self._run.num_slots, len(cols["input_ids"]), nb,
                                 max(cols["seqlens_q"]), {b for r in plan.requests for b in r.blocks})
            buffers.write_inputs(self.device, self.layout, inputs.slot, cols,
                                 [r.temperature for r in plan.requests], nb)
            self.device.launch(kernels.upload_inputs, inputs.slot, inputs.num_tokens, len(plan.requests), nb,
                               round=plan.round, stage=Stage.UPLOAD,
                               reads={buffers.meta_buffer(inputs.slot), buffers.temps_buffer(inputs.slot)})
        return inputs

    def _metadata(self, plan: Plan, k: int) -> dict[str, list[int]]:
        """The round's metadata columns (MetaLayout's fields but the block tables)."""
        bs = self.config.block_size
        cols = {name: [] for name in MetaLayout.TOKEN_FIELDS + MetaLayout.REQUEST_FIELDS}
        for req in plan.requests:
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
                                   (len(ids), start + len(ids), req.row, pending, req.sampling_stream)):
                cols[name].append(value)
        return cols

    def correct_on_device(self, inputs: RoundInputs) -> None:
        """Fix stale lengths on the device (only speculation makes them stale)."""
        if self.config.num_draft_tokens and self.config.correct_seqlens and not inputs.plan.is_prefill:
            self.device.launch(kernels.correct, self._run.correction, round=inputs.plan.round, stage=Stage.CORRECT)

    def launch_forward(self, inputs: RoundInputs) -> None:
        with self.timeline.host_span(Stage.LAUNCH_FORWARD, inputs.plan.round):
            self.device.launch(kernels.forward, inputs.max_q, round=inputs.plan.round, stage=Stage.FORWARD,
                               blocks=inputs.blocks)

    def launch_sample(self, inputs: RoundInputs) -> StepState:
        """A constraint's mask is built here, from the tokens committed *now* (under ZOS: round N-1's)."""
        r, slot = inputs.plan.round, inputs.slot
        with self.timeline.host_span(Stage.LAUNCH_SAMPLE, r):
            reads = set()
            if self.constraint is not None:
                reads = {buffers.allowed_buffer(slot)}
                allowed = self.constraint.masks(inputs.plan.requests)
                self.device.host(buffers.allowed_buffer(slot), "w")[: len(allowed)] = allowed
            sample_done = self.device.launch(kernels.sample, slot, inputs.plan.is_prefill, bool(reads), round=r,
                                             stage=Stage.SAMPLE, reads=reads, writes={buffers.out_buffer(slot)},
                                             record_event=True, owner=r)
        return StepState(inputs.plan, slot, sample_done, self._run)

    def process_outputs(self, step: StepState, stage: str = Stage.POSTPROCESS) -> None:
        """Wait for the step's sample event, read its tokens, commit them to the requests, and free
        the cache of those finished and in no launched round; a ``process_outputs`` plug-in given to
        ``generate`` does all of that instead."""
        self._own(step)  # before the wait: another device's event may never come on this one
        custom = self._run.process_outputs
        if custom is not None:
            with self.timeline.host_span(stage, step.plan.round, step.owner):
                custom(self, step)
            return
        with self.timeline.host_span(Stage.WAIT, step.plan.round, step.owner):
            self.device.wait(step.sample_done)
        with self.timeline.host_span(stage, step.plan.round, step.owner):
            out = self.read_outputs(step)
            for req in self.commit_outputs(step, out):
                self.scheduler.release_if_done(req)

    def _own(self, step: StepState) -> None:
        """Refuse a step of another run: its requests are not this run's, its event not this
        device's (``ForeignStep``)."""
        if isinstance(step, StepState) and step.run is not self._run:
            raise ForeignStep(step.plan.round)

    def read_outputs(self, step: StepState) -> list[int]:
        """The step's output slot: ``tokens[B, 1 + k]`` then ``accepted[B]``, as a list."""
        k = 0 if step.plan.is_prefill else self.config.num_draft_tokens
        size = buffers.outputs_size(len(step.plan.requests), k)
        return self.device.host(buffers.out_buffer(step.slot), "r")[:size].tolist()

    def commit_outputs(self, step: StepState, out: list[int]) -> list[Request]:
        """Hand a step's tokens to its requests (a finished one's are the extra round: discarded)."""
        self._own(step)
        plan, run = step.plan, self._run
        k = 0 if plan.is_prefill else self.config.num_draft_tokens
        sampled = buffers.unpack_outputs(out, len(plan.requests), k)
        self.record.commit(plan.round, [r.index for r in plan.requests], step.committed, sampled)
        if step.committed:
            raise StepProcessedTwice(plan.round, plan.requests)
        step.committed = True
        run.idle_schedule = False  # progress: a schedule may find nothing to launch again
        for req, kept in zip(plan.requests, sampled):
            req.num_inflight -= 1
            if req.finished:
                run.counts["discarded"] += 1
                continue
            before = len(req.output_ids)
            req.commit(kept, self.tokenizer.eos_id, self.tokenizer.decode)
            run.counts["tokens"] += len(req.output_ids) - before
            if not plan.is_prefill:
                run.counts["request_decode_rounds"] += 1
                run.counts["proposed"] += k
                run.counts["accepted"] += len(kept) - 1
        return plan.requests

    def flush(self, previous: StepState | None) -> StepState | None:
        """Process a deferred step now: there is no next round to overlap it with.  Returns
        what stays deferred, nothing, so ``previous = engine.flush(previous)`` also clears it."""
        if previous is not None:
            self.process_outputs(previous, stage=Stage.FLUSH)
        return None
