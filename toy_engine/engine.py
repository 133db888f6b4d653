"""The engine: a serial loop and a zero-overhead (ZOS) loop over the same stages.

Every round has the same stages -- schedule, prepare inputs, launch forward, launch
sample, wait, process outputs -- and the two loops differ only in their order:

* ``serial_loop`` processes each round's results before preparing the next round, so
  the device idles while the host does control work;
* ``zos_loop`` launches round N's forward *before* processing round N-1's results, so
  that control work runs while the device computes.  A decode round's results stay in
  a ``StepState`` (plan + output slot + completion event) owned by the loop until the
  next round processes them; prefill rounds are processed at once; when no round is
  left to overlap with, ``flush`` drains the deferred step.

Who owns what: the scheduler owns requests' rows and KV blocks, the ``Run`` (one per
``generate`` call) the call's requests, plug-ins and counters, ``buffers`` the layout of
everything exchanged with the device, the device its process and pipe.  The engine
strings the stages together and keeps itself usable whatever happens in between: an
exception or an Interrupt anywhere in a run ends with the device drained (or replaced
when it died), every request finished or aborted, and the next ``generate`` working.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch

from . import buffers, kernels
from .constraint import CONSTRAINTS, make_constraint
from .data import CharTokenizer, corpus_token_stream, generate_corpus
from .device import DeviceError, Event, make_device
from .interrupts import hold_sigint
from .buffers import MetaLayout
from .kernels import FROM_DEVICE
from .model import TinyGPT, load_model
from .record import RunRecord
from .run import EngineStalled, Run, StepProcessedTwice, stalled
from .scheduler import BlockManager, Plan, Scheduler
from .sequence import Completion, Request, check_prompts, check_stop
from .stats import run_stats
from .timeline import Timeline
from .validate import check_bool, check_callable, check_choice, check_float, check_int, check_seed, shown

__all__ = ["Engine", "EngineConfig", "EngineStalled", "StepProcessedTwice", "StepState", "MODES", "NUM_SLOTS"]

MODES = ("serial", "zos")
DEVICES = ("auto", "cuda", "cpu")
# Host buffers are double-buffered: round N uses slot N % 2.  An engine allocates NUM_SLOTS
# slots when it is built; each run reads it once and may use fewer (notebook 05's race).
NUM_SLOTS = 2
MAX_SLOTS = 8  # overlap needs 2; more only cost memory
MAX_TEMPERATURE = 100.0  # far beyond where sampling is already uniform noise (~10 for this model)
MAX_HOST_OVERHEAD_MS = 1000.0
# A decode round feeds 1 + k tokens per request and the shipped model's context is 256
# tokens: more drafts than this only burn device time on tokens that are never accepted.
MAX_DRAFT_TOKENS = 16
# The KV cache is allocated whole when the engine starts (the shipped model in float64:
# 8 KiB per token slot, so the default 128 x 16 slots take 16 MiB); refuse a size that
# would take more than this rather than fail inside the allocator.
MAX_KV_CACHE_BYTES = 4 * 2**30
# Each batch row gets a slice of every round's metadata (~790 int64 for the shipped model:
# tokens up to its 256-token context, positions, slots, block table), double-buffered on
# host and device: 4096 rows take ~50 MiB, already far past what the toy's cache can run.
MAX_BATCH_SIZE = 4096
# How long a recovering engine waits for queued device work before giving the device up;
# a round of the shipped model takes ~10 ms on a busy 2-core machine.
RECOVER_TIMEOUT_S = 10.0
#: Callables ``observer(engine, phase)`` told when a run starts ("start") and when its
#: timeline and stats are final ("end"); the course measures the machine around runs
#: with one.  An observer must not raise.
RUN_OBSERVERS: list = []


@dataclass
class EngineConfig:
    """How an engine is built.  Checked when created, and frozen: the device's buffers
    and cache were sized from it, so changing it under a running engine would corrupt
    them; make a new engine with ``dataclasses.replace(config, field=value)``."""

    mode: str = "serial"            # "serial" or "zos"
    device: str = "auto"            # "auto" (CUDA if present, else the CPU stand-in), "cuda", "cpu"
    max_batch_size: int = 8
    num_kv_blocks: int = 128
    block_size: int = 16
    seed: int = 0                   # default seed for requests sampled with temperature > 0
    num_draft_tokens: int = 0       # speculative decoding: drafts per decode round (0 = off)
    correct_seqlens: bool = True    # False is a deliberate bug, for teaching: stale lengths
    race_check: bool = True         # the course's compute-sanitizer (cheap; off in benchmarks)
    host_overhead_ms: float = 0.0   # extra, labelled host work per round (teaching knob)
    device_threads: int = 1         # torch threads of the CPU stand-in's device process
    constraint: str | None = None   # "title_case": a sampling mask built from committed text (constraint.py)

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        check_choice("device", self.device, DEVICES)
        values = dict(
            max_batch_size=check_int("max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE,
                                     " (metadata is sized per row and allocated up front)"),
            num_kv_blocks=check_int("num_kv_blocks", self.num_kv_blocks, 1),
            block_size=check_int("block_size", self.block_size, 1),
            seed=check_seed("seed", self.seed),
            num_draft_tokens=check_int("num_draft_tokens", self.num_draft_tokens, 0, MAX_DRAFT_TOKENS),
            correct_seqlens=check_bool("correct_seqlens", self.correct_seqlens),
            race_check=check_bool("race_check", self.race_check),
            host_overhead_ms=check_float("host_overhead_ms", self.host_overhead_ms, 0.0, MAX_HOST_OVERHEAD_MS,
                                         " ms"),
            device_threads=check_int("device_threads", self.device_threads, 1, os.cpu_count() or 1,
                                     f": this machine has {os.cpu_count()} CPUs, and more threads than CPUs "
                                     f"only wait for each other"),
        )
        if self.constraint is not None:
            check_choice("constraint", self.constraint, CONSTRAINTS)
            if values["num_draft_tokens"]:
                raise ValueError(f"constraint={self.constraint!r} needs num_draft_tokens=0 (got "
                                 f"{self.num_draft_tokens}): a draft position's mask depends on the drafts "
                                 f"before it, which only the device knows; use one or the other")
        for name, value in values.items():  # plain ints and floats from here on (numpy ints accepted)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value) -> None:
        if getattr(self, "_frozen", False):
            raise dataclasses.FrozenInstanceError(
                f"EngineConfig is frozen: the engine's buffers, cache and device were built from it. To "
                f"change {name}, make a new engine: Engine(dataclasses.replace(config, {name}={value!r}))")
        object.__setattr__(self, name, value)

    def __delattr__(self, name) -> None:
        raise dataclasses.FrozenInstanceError(f"EngineConfig is frozen: cannot delete {name}")


def _num_slots() -> int:
    return check_int("NUM_SLOTS", NUM_SLOTS, 1, MAX_SLOTS, " (te.engine.NUM_SLOTS: host buffer slots)")


def _check_kv_cache_size(config: EngineConfig, model) -> None:
    cfg = model.cfg
    slots = config.num_kv_blocks * config.block_size
    per_slot = cfg.n_layer * 2 * cfg.n_embd * model.tok_emb.weight.element_size()
    if slots * per_slot > MAX_KV_CACHE_BYTES:
        fit = MAX_KV_CACHE_BYTES // (per_slot * config.block_size)
        raise ValueError(f"num_kv_blocks x block_size = {config.num_kv_blocks} x {config.block_size} = {slots} "
                         f"token slots would need a KV cache of {slots * per_slot / 2**30:.1f} GiB ({per_slot} "
                         f"bytes per slot for this model), above the {MAX_KV_CACHE_BYTES / 2**30:.0f} GiB limit: "
                         f"use at most {fit} blocks of {config.block_size}")


@dataclass
class RoundInputs:
    """What the host prepared for one round (lives in host buffer slot ``slot``)."""

    plan: Plan
    slot: int
    num_tokens: int
    num_blocks: int
    max_q: int
    blocks: set


@dataclass
class StepState:
    """A launched round whose results the host has not processed yet.

    It owns the round's output slot and the event that says the sample is done; nobody
    may read the slot, reuse it or free the requests' KV blocks before waiting on it.
    Its results are committed exactly once (``committed``).
    """

    plan: Plan
    slot: int
    sample_done: Event
    committed: bool = field(default=False, repr=False)

    @property
    def owner(self) -> str:
        return self.owner_of(self.plan.round)

    @staticmethod
    def owner_of(round: int) -> str:
        return f"StepState(round={round})"


@functools.lru_cache(maxsize=4)
def _ngram_table(alphabet: str) -> torch.Tensor:
    tok = CharTokenizer(alphabet)
    return kernels.build_ngram_table(torch.tensor(corpus_token_stream(generate_corpus(0), tok)), tok.vocab_size)


class Engine:
    def __init__(self, config: EngineConfig | None = None, model=None, tokenizer: CharTokenizer | None = None):
        config = EngineConfig() if config is None else config
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        self.config = config
        if model is not None and not isinstance(model, TinyGPT):
            raise TypeError(f"model must be a TinyGPT or None (te.load_model() returns one and its alphabet), got "
                            f"{type(model).__name__}")
        if tokenizer is not None and not isinstance(tokenizer, CharTokenizer):
            raise TypeError(f"tokenizer must be a CharTokenizer or None, got {type(tokenizer).__name__}")
        if model is None:
            model, alphabet = load_model()
            tokenizer = tokenizer or CharTokenizer(alphabet)
        self.tokenizer = tokenizer or CharTokenizer()
        self.model = copy.deepcopy(model).double().eval().requires_grad_(False)
        vocab = self.model.cfg.vocab_size
        if vocab != self.tokenizer.vocab_size:
            raise ValueError(f"model vocab ({vocab}) does not match the tokenizer ({self.tokenizer.vocab_size})")
        self.context_len = self.model.cfg.context_len
        _check_kv_cache_size(config, self.model)
        k = config.num_draft_tokens
        self.layout = MetaLayout(max_tokens=config.max_batch_size * self.context_len,
                                 max_batch=config.max_batch_size,
                                 max_blocks=-(-self.context_len // config.block_size))
        self.constraint = make_constraint(config.constraint, self.tokenizer)
        self.num_slots = _num_slots()
        self.buffer_specs = buffers.buffer_specs(self.layout, self.num_slots, k,
                                                 vocab if self.constraint is not None else 0)
        self.ngram = _ngram_table(self.tokenizer.alphabet) if k else None
        self._running = threading.Lock()  # one generate at a time
        self._closed = False
        self._clean = True  # False from a run's start until it ended or was recovered
        self.device = None
        self.record = RunRecord()  # what the current (or last) run did: launches, waits, commits, frees
        self._start_device()
        self.timeline = Timeline(meta=self._meta())
        self.stats: dict = {}
        self.completions: list[Completion] = []
        self._run = Run(num_slots=self.num_slots)
        self._next_id = 0

    @property
    def requests(self) -> list[Request]:
        """The current (or last) run's requests, in prompt order (a plug-in may change
        this list: the run keeps its own)."""
        return self._run.visible

    # ------------------------------------------------------------------ the loops

    def serial_loop(self) -> None:
        """Prepare, launch, wait, process: one round at a time."""
        while self.scheduler.has_work():
            plan = self.schedule()
            if plan is None:  # on_round aborted what was left
                continue
            inputs = self.prepare_inputs(plan)
            self.launch_forward(inputs)
            step = self.launch_sample(inputs)
            self.process_outputs(step)

    def zos_loop(self) -> None:
        """Current forward, previous postprocess, current sampling."""
        previous: StepState | None = None
        while self.scheduler.has_work():
            plan = self.schedule()
            if plan is None:  # nothing left to launch: no next round to hide it under
                previous = self.flush(previous)
                continue
            inputs = self.prepare_inputs(plan)
            if previous is not None:
                self.correct_on_device(inputs)
            self.launch_forward(inputs)
            if previous is not None:
                self.process_outputs(previous)
            current = self.launch_sample(inputs)
            if plan.is_prefill:
                self.process_outputs(current)
                previous = None
            else:
                previous = current

    # ------------------------------------------------------------------ the stages

    def schedule(self) -> Plan | None:
        """The next round's plan; None when nothing can be launched now (or no work is left)."""
        if not self.scheduler.has_work():
            return None
        start, run = self.timeline.now_ms(), self._run
        if run.on_round is not None:
            run.on_round(self, self.scheduler.round)
        plan = self.scheduler.schedule()
        self.record.schedule(plan.round if plan else None)
        # A schedule that finds nothing to launch belongs to the last round, not a new one.
        self.timeline.add("host", "schedule", plan.round if plan else max(0, self.scheduler.round - 1),
                          start, self.timeline.now_ms())
        if plan is None:
            if self.scheduler.has_work():
                run.note_idle_schedule(self.scheduler)
            return None
        if plan.is_prefill:
            run.prefill_rounds.add(plan.round)
        if self.config.host_overhead_ms:
            with self.timeline.host_span("overhead", plan.round):
                end = time.perf_counter() + self.config.host_overhead_ms / 1e3
                while time.perf_counter() < end:  # deliberate busy host work, for teaching
                    pass
        return plan

    def prepare_inputs(self, plan: Plan) -> RoundInputs:
        """Write the round's metadata into its host buffer slot.

        A decode request whose previous round is still in flight (``pending``) does not
        have its newest token on the host yet: its input is FROM_DEVICE, and its lengths
        assume the in-flight round adds one token.
        """
        with self.timeline.host_span("prepare", plan.round):
            k = 0 if plan.is_prefill else self.config.num_draft_tokens
            bs = self.config.block_size
            cols = {name: [] for name in MetaLayout.TOKEN_FIELDS + MetaLayout.REQUEST_FIELDS}
            tables, temps = [], []
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
                tables.append(req.blocks)
                temps.append(req.temperature)
            # Enough block-table columns for the furthest position a correction can reach.
            nb = min(self.layout.max_blocks, -(-(max(cols["seqlens_k"]) + k) // bs))
            cols["block_tables"] = [b for t in tables for b in (t + [0] * nb)[:nb]]
            inputs = RoundInputs(plan, plan.round % self._run.num_slots, len(cols["input_ids"]), nb,
                                 max(cols["seqlens_q"]), {b for t in tables for b in t})
            buffers.write_inputs(self.device, self.layout, inputs.slot, cols, temps, nb)
            self.device.launch(kernels.upload_inputs, inputs.slot, inputs.num_tokens, len(plan.requests), nb,
                               round=plan.round, stage="upload",
                               reads={buffers.meta_buffer(inputs.slot), buffers.temps_buffer(inputs.slot)})
        return inputs

    def correct_on_device(self, inputs: RoundInputs) -> None:
        """Fix stale lengths on the device (only speculation makes them stale)."""
        if self.config.num_draft_tokens and self.config.correct_seqlens and not inputs.plan.is_prefill:
            self.device.launch(kernels.correct, self._run.correction, round=inputs.plan.round, stage="correct")

    def launch_forward(self, inputs: RoundInputs) -> None:
        with self.timeline.host_span("launch_forward", inputs.plan.round):
            self.device.launch(kernels.forward, inputs.max_q, round=inputs.plan.round, stage="forward",
                               blocks=inputs.blocks)

    def launch_sample(self, inputs: RoundInputs) -> StepState:
        """With a constraint, the mask is built here, from the tokens committed *now*:
        in the ZOS order round N-1 has just been processed, so the mask includes its token."""
        r, slot = inputs.plan.round, inputs.slot
        with self.timeline.host_span("launch_sample", r):
            reads = set()
            if self.constraint is not None:
                reads = {buffers.allowed_buffer(slot)}
                allowed = self.constraint.masks(inputs.plan.requests)
                self.device.host(buffers.allowed_buffer(slot), "w")[: len(allowed)] = allowed
            sample_done = self.device.launch(kernels.sample, slot, inputs.plan.is_prefill, bool(reads), round=r,
                                             stage="sample", reads=reads, writes={buffers.out_buffer(slot)},
                                             record_event=True, owner=StepState.owner_of(r))
        return StepState(inputs.plan, slot, sample_done)

    def process_outputs(self, step: StepState, stage: str = "postprocess") -> None:
        """Wait for the step's sample event, read its tokens, commit them to the requests,
        and free the cache of requests that are finished and in no launched round.

        A ``process_outputs`` plug-in given to ``generate`` does all of that instead."""
        custom = self._run.process_outputs
        if custom is not None:
            with self.timeline.host_span(stage, step.plan.round, step.owner):
                custom(self, step)
            return
        with self.timeline.host_span("wait", step.plan.round, step.owner):
            self.device.wait(step.sample_done)
        with self.timeline.host_span(stage, step.plan.round, step.owner):
            out = self.read_outputs(step)
            for req in self.commit_outputs(step, out):
                self.scheduler.release_if_done(req)

    def read_outputs(self, step: StepState) -> list[int]:
        """The step's output slot: ``tokens[B, 1 + k]`` then ``accepted[B]``, as a list."""
        k = 0 if step.plan.is_prefill else self.config.num_draft_tokens
        size = buffers.outputs_size(len(step.plan.requests), k)
        return self.device.host(buffers.out_buffer(step.slot), "r")[:size].tolist()

    def commit_outputs(self, step: StepState, out: list[int]) -> list[Request]:
        """Hand a step's tokens to its requests; returns them.  A request that already
        finished in an earlier round is in this step only as the extra round: discarded."""
        plan, run = step.plan, self._run
        self.record.commit(plan.round, [r.index for r in plan.requests], refused=step.committed)
        if step.committed:
            raise StepProcessedTwice(plan.round, plan.requests)
        step.committed = True
        run.note_processed()
        counts = run.counts
        k = 0 if plan.is_prefill else self.config.num_draft_tokens
        for req, kept in zip(plan.requests, buffers.unpack_outputs(out, len(plan.requests), k)):
            req.num_inflight -= 1
            if req.finished:
                counts["discarded"] += 1
                continue
            before = len(req.output_ids)
            req.commit(kept, self.tokenizer.eos_id, self.tokenizer.decode)
            counts["tokens"] += len(req.output_ids) - before
            if not plan.is_prefill:
                counts["request_decode_rounds"] += 1
                counts["proposed"] += k
                counts["accepted"] += len(kept) - 1
        return plan.requests

    def flush(self, previous: StepState | None) -> None:
        """Process a deferred step now: there is no next round to overlap it with."""
        if previous is not None:
            self.process_outputs(previous, stage="flush")
        return None

    # ------------------------------------------------------------------ public API

    def generate(self, prompts, max_new_tokens: int = 32, stop=None, temperature: float = 0.0,
                 seed: int | None = None, *, on_round=None, loop=None, correction=None,
                 process_outputs=None) -> list[Completion]:
        """Run prompts to completion; returns one Completion per prompt, in order.

        ``prompts`` is a str or a list/tuple of str; ``stop`` None, a str or a list of
        str.  With ``temperature > 0`` each request samples from its own random stream,
        derived from ``seed`` (default: the config's) and its index in ``prompts``, so
        the same call gives the same texts in every mode.

        Plug-ins, for this call only (each a callable or None): ``on_round(engine, round)``
        is called before each round is scheduled (it may call ``engine.abort``);
        ``loop(engine)`` replaces the mode's loop (the exercises plug a learner's loop in
        here); ``correction(meta, accepted, block_size)`` replaces the device's seqlen
        correction; ``process_outputs(engine, step)`` replaces the engine's own processing
        of a launched step.

        Bad input raises TypeError/ValueError naming the argument before anything runs.
        One call at a time: a second one (from a plug-in or another thread) raises
        RuntimeError.  After any exception (an Interrupt too) the device is drained, the
        run's requests end as ``"abort"`` and the engine is ready for the next call; if
        the device process died, the call raises DeviceError naming its exit code and the
        engine starts a new device process.
        """
        if self._closed:
            raise RuntimeError("this engine is closed (engine.close() or the end of its `with` block): "
                               "create a new Engine")
        plugins = dict(on_round=on_round, loop=loop, correction=correction, process_outputs=process_outputs)
        for name, plugin in plugins.items():
            check_callable(name, plugin)
        requests = self._make_requests(prompts, max_new_tokens, stop, temperature, seed)
        run = Run(requests, on_round, correction or kernels.correct_seqlens_qk, process_outputs, self._slots())
        # An Interrupt waits while the lock is taken or given back, never between the two.
        with hold_sigint() as held:
            if not self._running.acquire(blocking=False):
                raise RuntimeError("generate is already running on this engine (called again from a plug-in, or "
                                   "from another thread); wait for it to return, or give each thread its own Engine")
            try:
                with held.let_through():
                    self._ensure_ready()
                    self._next_id += len(requests)
                    return self._execute(run, loop)
            finally:
                self._running.release()

    def abort(self, request_id: int) -> None:
        """Stop a request; results already in flight for it are discarded when they land."""
        req = next((r for r in self._run.requests if r.id == request_id), None)
        if req is None:
            raise ValueError(f"no request {shown(request_id)} in the current run (its ids: "
                             f"{[r.id for r in self._run.requests]})")
        if req.finished:
            return
        req.finish_reason = "abort"
        if req in self.scheduler.waiting:
            self.scheduler.waiting.remove(req)
        self.scheduler.release_if_done(req)

    def close(self) -> None:
        """Stop the device process and release its pipe and shared memory.  Dropping the
        last reference to an engine does it too.  An Interrupt waits until it is done."""
        with hold_sigint():
            if not self._running.acquire(blocking=False):
                raise RuntimeError("close() was called while generate is running on this engine; call it after "
                                   "generate returns")
            try:
                self._closed = True
                if self.device is not None:
                    self.device.close()
            finally:
                self._running.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals

    def _execute(self, run: Run, loop) -> list[Completion]:
        with hold_sigint():  # registered whole; an Interrupt after this finds _clean False: recovered next call
            self._clean = False
            self._run, self.timeline = run, Timeline(meta=self._meta())
            self.record = self.device.run_record = RunRecord()
            self.device.spans()  # device work from before the run (a probe, a late recovery) is not part of it
            self.scheduler.round = 0
            for req in run.requests:  # queued only once the run owns them
                self.scheduler.add(req)
            for observer in RUN_OBSERVERS:
                observer(self, "start")
        start = time.perf_counter()
        try:
            if loop is not None:
                loop(self)
            else:
                (self.zos_loop if self.config.mode == "zos" else self.serial_loop)()
            if self.scheduler.has_work():
                raise stalled(self.scheduler)
            self._clean = True
        except BaseException:
            with hold_sigint():  # a second Interrupt must not cut the recovery short
                self._recover()
            raise
        finally:
            with hold_sigint():
                run.end()
                self.completions = [r.completion() for r in run.requests]
                self._finish_stats(time.perf_counter() - start)
                for observer in RUN_OBSERVERS:
                    observer(self, "end")
        return self.completions

    def _ensure_ready(self) -> None:
        """Before a run: a device that died while idle is replaced (with a warning; found by
        a round trip, as the forkserver reports a death late), and a run whose recovery
        was itself interrupted is recovered now."""
        failure = self.device.probe(RECOVER_TIMEOUT_S) if self.device is not None else "no device was started"
        if failure is not None:
            warnings.warn(f"{failure}; starting a new device process (its cache and state start empty)",
                          RuntimeWarning, stacklevel=3)
            self._restart_device()
        elif not self._clean:
            self._recover()

    def _recover(self) -> None:
        """After an exception: let the device finish (or give it up), forget the run's
        state, and leave the engine ready.  Never blocks for more than RECOVER_TIMEOUT_S
        (plus a device restart)."""
        try:
            if self.device.failure() is None:
                self.device.synchronize(timeout=RECOVER_TIMEOUT_S)
                self.device.races.reset()
        except DeviceError:
            pass  # handled below: the device is replaced
        finally:
            for req in self._run.requests:
                if not req.finished:
                    req.finish_reason = "abort"
                req.num_inflight, req.blocks, req.row = 0, [], -1
            self.scheduler = self._new_scheduler()
        if self.device.failure() is not None:  # dead, out of step or sticky: a fresh "context"
            self._restart_device()
        self._clean = True

    def _start_device(self) -> None:
        c = self.config
        device = make_device(c.device, self.model, c.num_kv_blocks, c.block_size, self.buffer_specs,
                             c.race_check, c.device_threads)
        try:
            device.launch(kernels.setup_state, self.layout, c.max_batch_size, c.num_draft_tokens,
                          self.ngram, round=0, stage="setup")
            device.synchronize()
            device.spans()  # start-up work is not part of any run
        except BaseException:
            device.close()
            raise
        device.run_record = self.record  # a device restarted during a run keeps recording into the run's record
        self.device = device
        self.scheduler = self._new_scheduler()

    def _restart_device(self) -> None:
        if self.device is not None:
            self.device.close()
        self._start_device()
        self._clean = True

    def _new_scheduler(self) -> Scheduler:
        c = self.config
        races = self.device.races
        return Scheduler(c.max_batch_size, BlockManager(c.num_kv_blocks, c.block_size, races.on_alloc,
                                                        self.device.free_blocks), c.num_draft_tokens)

    def _slots(self) -> int:
        """The host buffer slots a run uses, read once per run: at most the engine's."""
        slots = _num_slots()
        if slots > self.num_slots:
            raise ValueError(f"te.engine.NUM_SLOTS is {slots} but this engine was built with {self.num_slots} buffer "
                             f"slots: build a new Engine after changing NUM_SLOTS (or set it back to "
                             f"{self.num_slots})")
        return slots

    def _make_requests(self, prompts, max_new_tokens, stop, temperature, seed) -> list[Request]:
        prompts = check_prompts(prompts)
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        stop = check_stop(stop)
        temperature = check_float("temperature", temperature, 0.0, MAX_TEMPERATURE, " (0 = greedy)")
        seed = self.config.seed if seed is None else check_seed("seed", seed)
        requests = []
        for i, prompt in enumerate(prompts):
            try:
                ids = self.tokenizer.encode(prompt)
            except ValueError as err:
                raise ValueError(f"prompt {i}: {err}") from None
            req = Request(self._next_id + i, i, prompt, ids, max_new_tokens, stop, temperature, seed)
            need = self.scheduler.positions_needed(req)
            if len(ids) >= self.context_len or need > self.context_len:
                slack = f" + 2 x {self.config.num_draft_tokens} draft slots" if self.config.num_draft_tokens else ""
                raise ValueError(f"prompt {i} is too long: {len(ids)} prompt tokens + max_new_tokens "
                                 f"{shown(max_new_tokens)}{slack} = {shown(need)} positions, but the model's context "
                                 f"is {self.context_len}")
            blocks = self.scheduler.blocks.blocks_needed(need)
            if blocks > self.config.num_kv_blocks:
                raise ValueError(f"prompt {i} can never fit the KV cache: it needs {blocks} blocks of "
                                 f"{self.config.block_size} slots, the cache has {self.config.num_kv_blocks}")
            requests.append(req)
        return requests

    def _meta(self) -> dict:
        c = self.config
        return dict(mode=c.mode, device=self.device.name, num_draft_tokens=c.num_draft_tokens,
                    max_batch_size=c.max_batch_size, host_overhead_ms=c.host_overhead_ms)

    def _finish_stats(self, wall_s: float) -> None:
        tl, run = self.timeline, self._run
        for stage, rnd, start_ns, end_ns, cpu_ns in self.device.spans():
            tl.add_device_ns(stage, rnd, start_ns, end_ns, owner=StepState.owner_of(rnd) if stage == "sample" else "",
                             cpu_ns=cpu_ns)
        tl.meta["prefill_rounds"] = sorted(run.prefill_rounds)
        latencies = getattr(self.device, "launch_latencies_ms", lambda: [])()
        self.stats = run_stats(tl, run.counts, run.prefill_rounds, wall_s, latencies)
