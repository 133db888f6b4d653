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
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from dataclasses import dataclass, field

import torch

from . import kernels
from .data import CharTokenizer, corpus_token_stream, generate_corpus
from .device import DeviceError, Event, make_device
from .kernels import FROM_DEVICE, MetaLayout
from .model import load_model
from .scheduler import BlockManager, Plan, Scheduler
from .sequence import Completion, Request
from .timeline import Timeline

MODES = ("serial", "zos")
NUM_SLOTS = 2  # host buffers are double-buffered: round N uses slot N % 2


@dataclass
class EngineConfig:
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

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}: use one of {MODES}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"unknown device {self.device!r}: use 'auto', 'cuda' or 'cpu'")
        for name in ("max_batch_size", "num_kv_blocks", "block_size", "device_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if self.host_overhead_ms < 0:
            raise ValueError(f"host_overhead_ms must be >= 0, got {self.host_overhead_ms}")


class EngineStalled(RuntimeError):
    """The loop cannot make progress.

    ``reason`` says why, as data a checker can branch on: ``"unprocessed_inflight"``
    (launched rounds whose results were never processed: a deferred step dropped or
    not flushed), ``"finished_kept_blocks"`` (finished requests still hold KV blocks
    and rows, so waiting ones can never start) or ``"loop_returned_with_work"`` (the
    loop stopped while the scheduler had work).  ``prompt_indexes`` are the requests'
    positions in the ``generate`` call, ``request_ids`` their ids.
    """

    REASONS = ("unprocessed_inflight", "finished_kept_blocks", "loop_returned_with_work")

    def __init__(self, message: str, *, reason: str, requests=()):
        super().__init__(message)
        assert reason in self.REASONS, reason
        self.reason = reason
        self.prompt_indexes = [r.index for r in requests]
        self.request_ids = [r.id for r in requests]


@dataclass
class Run:
    """What one ``generate`` call owns: its requests, plug-ins and counters.

    ``generate`` creates a fresh one, so nothing of a previous (maybe interrupted) run
    leaks into the next; an engine that never ran has an empty one, so a stage or a
    learner's loop can be tried on a fresh engine.
    """

    requests: list[Request] = field(default_factory=list)
    on_round: object = None
    correction: object = kernels.correct_seqlens_qk
    process_outputs: object = None
    counts: dict = field(default_factory=lambda: dict(tokens=0, decode_steps=0, proposed=0, accepted=0,
                                                      discarded=0))
    prefill_rounds: set = field(default_factory=set)
    unproductive_schedule: bool = False  # the last schedule found nothing and nothing was processed since


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
    """

    plan: Plan
    slot: int
    sample_done: Event

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
        self.config = config = config or EngineConfig()
        config.validate()
        if model is None:
            model, alphabet = load_model()
            tokenizer = tokenizer or CharTokenizer(alphabet)
        self.tokenizer = tokenizer or CharTokenizer()
        self.model = copy.deepcopy(model).double().eval().requires_grad_(False)
        vocab = self.model.cfg.vocab_size
        if vocab != self.tokenizer.vocab_size:
            raise ValueError(f"model vocab ({vocab}) does not match the tokenizer ({self.tokenizer.vocab_size})")
        self.context_len = self.model.cfg.context_len
        k = config.num_draft_tokens
        self.layout = MetaLayout(max_tokens=config.max_batch_size * self.context_len,
                                 max_batch=config.max_batch_size,
                                 max_blocks=-(-self.context_len // config.block_size))
        self.buffer_specs = {}
        for s in range(NUM_SLOTS):
            self.buffer_specs[f"meta{s}"] = ((self.layout.size,), torch.long)
            self.buffer_specs[f"temps{s}"] = ((config.max_batch_size,), torch.float64)
            self.buffer_specs[f"out{s}"] = ((config.max_batch_size * (k + 2),), torch.long)
        self.ngram = _ngram_table(self.tokenizer.alphabet) if k else None
        self.device = None
        self._start_device()
        self.timeline = Timeline(meta=self._meta())
        self.stats: dict = {}
        self.completions: list[Completion] = []
        self._run = Run()
        self._next_id = 0

    @property
    def requests(self) -> list[Request]:
        """The current (or last) run's requests, in prompt order."""
        return self._run.requests

    # ------------------------------------------------------------------ the loops

    def serial_loop(self) -> None:
        """Prepare, launch, wait, process: one round at a time."""
        while self.scheduler.has_work():
            plan = self.schedule()
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
        start = self.timeline.now_ms()
        run = self._run
        if run.on_round is not None:
            run.on_round(self, self.scheduler.round)
        plan = self.scheduler.schedule()
        # A schedule that finds nothing to launch belongs to the last round, not a new one.
        self.timeline.add("host", "schedule", plan.round if plan else max(0, self.scheduler.round - 1),
                          start, self.timeline.now_ms())
        if plan is not None and plan.is_prefill:
            run.prefill_rounds.add(plan.round)
        if plan is None:
            # Legal only while launched results are outstanding, and only if the loop
            # then processes something before asking again.
            if run.unproductive_schedule or not any(r.num_inflight for r in self.scheduler.running):
                raise self._stalled()
            run.unproductive_schedule = True
        if plan is not None and self.config.host_overhead_ms:
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
                                       (len(ids), start + len(ids), req.row, pending, req.seed)):
                    cols[name].append(value)
                tables.append(req.blocks)
                temps.append(req.temperature)
            # Enough block-table columns for the furthest position a correction can reach.
            nb = min(self.layout.max_blocks, -(-(max(cols["seqlens_k"]) + k) // bs))
            cols["block_tables"] = [b for t in tables for b in (t + [0] * nb)[:nb]]
            inputs = RoundInputs(plan, plan.round % NUM_SLOTS, len(cols["input_ids"]), nb,
                                 max(cols["seqlens_q"]), {b for t in tables for b in t})
            views = self.layout.views(self.device.host(f"meta{inputs.slot}", "w"),
                                      inputs.num_tokens, len(plan.requests), nb)
            for name, values in cols.items():
                views[name].view(-1).copy_(torch.tensor(values, dtype=torch.long))
            self.device.host(f"temps{inputs.slot}", "w")[: len(temps)] = torch.tensor(temps, dtype=torch.float64)
            self.device.launch(kernels.upload_inputs, inputs.slot, inputs.num_tokens, len(plan.requests), nb,
                               round=plan.round, stage="upload",
                               reads={f"meta{inputs.slot}", f"temps{inputs.slot}"})
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
        r, slot = inputs.plan.round, inputs.slot
        with self.timeline.host_span("launch_sample", r):
            sample_done = self.device.launch(kernels.sample, slot, inputs.plan.is_prefill, round=r,
                                             stage="sample", writes={f"out{slot}"}, record_event=True,
                                             owner=StepState.owner_of(r))
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
        return self.device.host(f"out{step.slot}", "r")[: len(step.plan.requests) * (k + 2)].tolist()

    def commit_outputs(self, step: StepState, out: list[int]) -> list[Request]:
        """Hand a step's tokens to its requests; returns them.  A request that already
        finished in an earlier round is in this step only as the extra step: discarded."""
        plan, run = step.plan, self._run
        run.unproductive_schedule = False
        counts = run.counts
        k = 0 if plan.is_prefill else self.config.num_draft_tokens
        B = len(plan.requests)
        for i, req in enumerate(plan.requests):
            req.num_inflight -= 1
            accepted = out[B * (k + 1) + i]
            if req.finished:
                counts["discarded"] += 1
                continue
            before = len(req.output_ids)
            req.commit(out[i * (k + 1): i * (k + 1) + accepted + 1], self.tokenizer.eos_id, self.tokenizer.decode)
            counts["tokens"] += len(req.output_ids) - before
            if not plan.is_prefill:
                counts["decode_steps"] += 1
                counts["proposed"] += k
                counts["accepted"] += accepted
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

        Plug-ins, for this call only (each a callable or None, checked before anything runs):
        ``on_round(engine, round)`` is called before each round is scheduled (it may call
        ``engine.abort``); ``loop(engine)`` replaces the mode's loop (the exercises plug a
        learner's loop in here); ``correction(meta, accepted, block_size)`` replaces the
        device's seqlen correction; ``process_outputs(engine, step)`` replaces the engine's
        own processing of a launched step.  Bad input raises TypeError/ValueError naming
        the argument before anything runs.
        """
        for name, plugin in (("on_round", on_round), ("loop", loop), ("correction", correction),
                             ("process_outputs", process_outputs)):
            if plugin is not None and not callable(plugin):
                raise TypeError(f"{name} must be a callable or None, got {type(plugin).__name__} {plugin!r}")
        requests = self._make_requests(prompts, max_new_tokens, stop, temperature, seed)
        self._run = Run(requests, on_round, correction or kernels.correct_seqlens_qk, process_outputs)
        self.timeline = Timeline(meta=self._meta())
        self.scheduler.round = 0
        for req in requests:
            self.scheduler.add(req)
        start = time.perf_counter()
        try:
            if loop is not None:
                loop(self)
            else:
                (self.zos_loop if self.config.mode == "zos" else self.serial_loop)()
            if self.scheduler.has_work():
                raise self._stalled()
        except BaseException:
            self._recover()
            raise
        finally:
            self.completions = [r.completion() for r in requests]
            self._finish_stats(time.perf_counter() - start)
        return self.completions

    def abort(self, request_id: int) -> None:
        """Stop a request; results already in flight for it are discarded when they land."""
        req = next((r for r in self.requests if r.id == request_id), None)
        if req is None:
            raise ValueError(f"no request {request_id} in the current run")
        if req.finished:
            return
        req.finish_reason = "abort"
        if req in self.scheduler.waiting:
            self.scheduler.waiting.remove(req)
        self.scheduler.release_if_done(req)

    def close(self) -> None:
        if self.device is not None:
            self.device.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals

    def _start_device(self) -> None:
        c = self.config
        self.device = make_device(c.device, self.model, c.num_kv_blocks, c.block_size, self.buffer_specs,
                                  c.race_check, c.device_threads)
        self.device.launch(kernels.setup_state, self.layout, c.max_batch_size, c.num_draft_tokens,
                           self.ngram, round=0, stage="setup")
        self.device.synchronize()
        self.device.spans()  # start-up work is not part of any run
        blocks = BlockManager(c.num_kv_blocks, c.block_size, self.device.races.on_alloc, self.device.races.on_free)
        self.scheduler = Scheduler(c.max_batch_size, blocks, self._positions_needed)

    def _positions_needed(self, req: Request) -> int:
        """Cache positions a request may touch: prompt, new tokens, and room for the
        drafts of an in-flight round plus the next one."""
        return len(req.prompt_ids) + req.max_new_tokens + 2 * self.config.num_draft_tokens

    def _make_requests(self, prompts, max_new_tokens, stop, temperature, seed) -> list[Request]:
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("generate() needs at least one prompt; got an empty list")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        stop = tuple([stop] if isinstance(stop, str) else stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        requests = []
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"prompt {i} is empty (or not a string): the model needs at least one token")
            try:
                ids = self.tokenizer.encode(prompt)
            except ValueError as err:
                raise ValueError(f"prompt {i}: {err}") from None
            req = Request(self._next_id + i, i, prompt, ids, max_new_tokens, stop, float(temperature),
                          self.config.seed if seed is None else seed)
            need = self._positions_needed(req)
            if len(ids) >= self.context_len or need > self.context_len:
                slack = f" + 2 x {self.config.num_draft_tokens} draft slots" if self.config.num_draft_tokens else ""
                raise ValueError(f"prompt {i} is too long: {len(ids)} prompt tokens + max_new_tokens "
                                 f"{max_new_tokens}{slack} = {need} positions, but the model's context "
                                 f"is {self.context_len}")
            blocks = self.scheduler.blocks.blocks_needed(need)
            if blocks > self.config.num_kv_blocks:
                raise ValueError(f"prompt {i} can never fit the KV cache: it needs {blocks} blocks of "
                                 f"{self.config.block_size} slots, the cache has {self.config.num_kv_blocks}")
            requests.append(req)
        self._next_id += len(prompts)
        return requests

    def _stalled(self) -> EngineStalled:
        """Why the loop cannot go on, naming the prompts involved (``err.prompt_indexes``)."""
        def names(reqs):
            return ", ".join(f"prompt {r.index}" for r in reqs[:5]) + (" ..." if len(reqs) > 5 else "")

        stuck = [r for r in self.scheduler.running if r.num_inflight]
        kept = [r for r in self.scheduler.running if r.finished]
        left = [r for r in self.scheduler.running if not r.finished] + list(self.scheduler.waiting)
        if stuck:
            reason, reqs, msg = "unprocessed_inflight", stuck, (f"{names(stuck)} still wait for launched rounds whose results were never "
                                f"processed; was a deferred step dropped instead of processed or flushed?")
        elif kept and self.scheduler.waiting:
            reason, reqs, msg = "finished_kept_blocks", kept, (f"{names(kept)} finished but still hold their KV blocks and rows, so waiting "
                               f"requests can never start; free finished requests")
        else:
            reason, reqs, msg = "loop_returned_with_work", left, (f"the loop stopped with work left: {names(left)} unfinished and nothing in "
                               f"flight; keep scheduling rounds while the scheduler has work")
        return EngineStalled(f"the engine cannot make progress: {msg}", reason=reason, requests=reqs)

    def _recover(self) -> None:
        """After an exception: drain the device, release every request, stay usable."""
        try:
            self.device.synchronize()
        except DeviceError:  # sticky, like a CUDA error: start a fresh device
            self.device.close()
            self._start_device()
            return
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            if not req.finished:
                req.finish_reason = "abort"
            req.num_inflight = 0
            self.scheduler.release_if_done(req)
        self.scheduler.waiting.clear()

    def _meta(self) -> dict:
        c = self.config
        return dict(mode=c.mode, device=self.device.name, num_draft_tokens=c.num_draft_tokens,
                    max_batch_size=c.max_batch_size, host_overhead_ms=c.host_overhead_ms)

    def _finish_stats(self, wall_s: float) -> None:
        tl = self.timeline
        for stage, rnd, start_ns, end_ns, cpu_ns in self.device.spans():
            tl.add_device_ns(stage, rnd, start_ns, end_ns, owner=f"StepState(round={rnd})" if stage == "sample" else "",
                             cpu_ns=cpu_ns)
        tl.finish_run()  # the contention meter's machine-load part
        run = self._run
        tl.meta["prefill_rounds"] = sorted(run.prefill_rounds)
        rounds = sorted({s.round for s in tl.spans if s.stage == "forward"})
        decode_rounds = [r for r in rounds if r not in run.prefill_rounds]
        c = run.counts
        self.stats = dict(
            tl.summary(),
            wall_ms=wall_s * 1e3,
            tokens=c["tokens"],
            tokens_per_s=c["tokens"] / wall_s if wall_s > 0 else 0.0,
            prefill_rounds=len(rounds) - len(decode_rounds),
            decode_rounds=len(decode_rounds),
            decode_device_idle_fraction=tl.device_idle_fraction(decode_rounds) if decode_rounds else 0.0,
            draft_tokens_proposed=c["proposed"],
            draft_tokens_accepted=c["accepted"],
            # per request and decode round, as speculative-decoding papers report it
            mean_accepted_per_round=c["accepted"] / c["decode_steps"] if c["decode_steps"] else 0.0,
            tokens_per_forward=c["tokens"] / len(rounds) if rounds else 0.0,
            discarded_outputs=c["discarded"],
        )
        latencies = getattr(self.device, "launch_latencies_ms", lambda: [])()
        if latencies:
            self.stats["launch_latency_ms"] = statistics.median(latencies)
