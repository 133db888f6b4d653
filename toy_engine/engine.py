"""The engine: ``generate`` runs prompts through a loop (``loops.py``, read it first) built from the
stages of a round (``stages.py``); any exception or Interrupt ends with the device drained (or replaced).
Who owns what: the scheduler owns rows and KV blocks, the ``Run`` (one per call) the call's requests,
plug-ins and counters, ``buffers`` the host <-> device layout, the device its process.
"""

import atexit
import contextlib
import contextvars
import copy
import dataclasses
import numbers
import operator
import threading
import time
import warnings
import weakref

from . import buffers, kernels, loops
from .buffers import MetaLayout
from .config import (MAX_SLOTS, MAX_TEMPERATURE, EngineConfig, check_correction,
                     check_kv_cache_size, plain_config, replaced_config)
from .constraint import make_constraint
from .data import CharTokenizer
from .device import DeviceError, make_device
from .drafter import ngram_table
from .interrupts import hold_sigint
from .model import TinyGPT, load_model
from .record import RunRecord
from .run import Run, stalled
from .scheduler import BlockManager, Scheduler, whole
from .sequence import Completion, Request, check_prompts, check_stop
from .stages import RoundStages
from .runinfo import RunStats, TimelineMeta, Workload
from .timeline import Stage, Timeline, run_stats
from .validate import (body_checked, check_callable, check_float, check_int, check_seed,
                       check_takes, plugin_label, shown)

__all__ = ["Engine", "NUM_SLOTS", "RUN_OBSERVERS"]

# Host buffer slots: round N uses slot N % 2; read at build and per run (fewer: notebook 05's race).
NUM_SLOTS = 2
#: The host buffer slots of builds and runs started in this thread (or task) instead of
#: NUM_SLOTS, while set: the labs' ``plugins.ring``.  Per thread: rings in two threads at once
#: neither mix nor leave one of theirs behind.
RING_SLOTS: contextvars.ContextVar = contextvars.ContextVar("toy_engine_ring_slots", default=None)
# How long a recovery waits for queued device work: ~1000 rounds (docs/measurements/engine.md).
RECOVER_TIMEOUT_S = 10.0
#: Callables ``observer(engine, phase)`` told when a run starts ("start") and when its timeline
#: and stats are final ("end"): the course measures the machine around runs.  Must not raise.
RUN_OBSERVERS: list = []
#: The arguments ``generate`` gives each of its plug-ins, by position.
PLUGIN_CALLS = dict(on_round=["engine", "round"], loop=["engine"],
                    correction=["meta", "accepted", "block_size"],
                    process_outputs=["engine", "step"])
#: How long Python's exit waits for an engine still running in another thread (its requests
#: aborted: the run ends within a round or two) before leaving it to its device's finalizer.
EXIT_WAIT_S = 2.0
_LIVE: weakref.WeakSet = weakref.WeakSet()  # the engines not collected yet: closed at exit
_EXITING = threading.Event()  # Python is exiting: no device process starts from now on


class Engine(RoundStages):
    """An inference engine: the stages of a round (``RoundStages``) and ``generate``, which runs them."""

    def __init__(self, config: EngineConfig | None = None, model=None, tokenizer: CharTokenizer | None = None):
        config = EngineConfig() if config is None else config
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        config = plain_config(config)  # a subclass's checked values, not what its attributes say
        self._config = self._built_with = config  # generate refuses another config
        self._config_lock = threading.Lock()  # a replacement against the start of a run
        self._config_in_use = False  # a run's stages read it: a replacement is refused
        self.model, self.tokenizer = _own_copy(model, tokenizer)
        self.context_len = self.model.cfg.context_len
        check_kv_cache_size(config, self.model)
        k = config.num_draft_tokens
        self.layout = MetaLayout(max_tokens=config.max_batch_size * self.context_len,
                                 max_batch=config.max_batch_size,
                                 max_blocks=-(-self.context_len // config.block_size))
        self.constraint = make_constraint(config.constraint, self.tokenizer)
        self.num_slots = _num_slots()
        self.buffer_specs = buffers.buffer_specs(self.layout, self.num_slots, k,
                                                 self.model.cfg.vocab_size if self.constraint is not None else 0)
        self.ngram = ngram_table(self.tokenizer.alphabet) if k else None
        self._running = threading.Lock()  # one generate at a time
        self._closed = False
        self._clean = True  # False from a run's start until it ended or was recovered
        self.record = RunRecord()  # what the current (or last) run did: launches, waits, commits, frees
        self.stats: RunStats | None = None  # the last run's, also in its timeline's meta
        self.completions: list[Completion] = []
        self._run = Run(num_slots=self.num_slots)
        self._next_id = 0
        self._start_device()
        try:  # cut short (Ctrl-C), the device ends now: a traceback kept in Jupyter would keep it
            self.timeline = Timeline(meta=self._meta(()))
        except BaseException:
            self.device.close()
            raise
        _LIVE.add(self)
        # Registered (again) once a device exists: atexit runs the last registered first, and
        # the devices' finalizers (weakref.finalize's, registered with the first) after this.
        atexit.unregister(_close_at_exit)
        atexit.register(_close_at_exit)

    @property
    def config(self) -> EngineConfig:
        """What the engine runs with; a replacement is refused while a run reads it, and by the
        next ``generate`` if it changes what the engine was built from (``config.BUILT_FROM``)."""
        return self._config

    @config.setter
    def config(self, value) -> None:
        with self._config_lock:
            if not self._config_in_use:
                self._config = value  # generate refuses it if it changed anything
                return
            changed = _changes(self._config, value)
            if changed:
                raise RuntimeError(
                    f"engine.config cannot be replaced while generate runs on this engine "
                    f"({changed}): the run's stages read it every round, and the engine's "
                    f"buffers, cache and device were sized from the config it was built with; "
                    f"once generate returns, build a new engine from the new config")

    @property
    def requests(self) -> list[Request]:
        """The current (or last) run's requests, in prompt order (the run keeps its own copy)."""
        return self._run.visible

    # ------------------------------------------------------------------ public API

    def generate(self, prompts, max_new_tokens: int = 32, stop=None, temperature: float = 0.0,
                 seed: int | None = None, *, on_round=None, loop=None, correction=None,
                 process_outputs=None) -> list[Completion]:
        """Run prompts (a str or a list/tuple of str) to completion; one Completion per prompt, in order.

        ``stop``: None, a str or a list of str.  With ``temperature > 0`` each request samples from its
        own stream, from ``seed`` (default: the config's) and its index: the same texts in every mode.
        Plug-ins for this call: ``on_round(engine, round)`` before each round is scheduled (it may call
        ``engine.abort``); ``loop(engine)`` instead of the mode's loop; ``correction(meta, accepted,
        block_size)`` the device's seqlen correction; ``process_outputs(engine, step)`` the processing.
        Bad input raises TypeError/ValueError before anything runs, a second call while one runs
        RuntimeError.  After any exception or Interrupt the run's requests end as ``"abort"`` and the
        engine is ready; a dead device process raises DeviceError (naming its exit code) and is replaced."""
        _wait_for_exit()  # a thread's next run as Python exits: its device is closing
        try:
            return self._generate(prompts, max_new_tokens, stop, temperature, seed,
                                  dict(on_round=on_round, loop=loop, correction=correction,
                                       process_outputs=process_outputs))
        except BaseException:
            _wait_for_exit()  # a run in another thread, cut by Python's exit: nothing to report
            raise

    def _check_correction(self, correction, loop) -> None:
        """A correction this engine can call, and send to its device at every launch."""
        check_correction(correction, self.config, loop)
        self.device.check_sendable(f"correction={plugin_label(correction)}", correction)

    def _generate(self, prompts, max_new_tokens, stop, temperature, seed, plugins: dict):
        self._check_config()
        for name, plugin in plugins.items():
            check_callable(name, plugin)
            if plugin is not None:
                check_takes(name, plugin, PLUGIN_CALLS[name])
        correction = plugins["correction"]
        if correction is not None:  # refused now, not rounds into the run at its first launch
            self._check_correction(correction, plugins["loop"])
        requests = self._make_requests(prompts, max_new_tokens, stop, temperature, seed)
        # Each called through a check of its answer: one that never ran its body is refused.
        checked = {name: None if plugin is None else body_checked(name, plugin)
                   for name, plugin in plugins.items()}
        correction = checked["correction"]  # `is None`: a falsy callable object is a correction
        run = Run(requests, checked["on_round"], kernels.correct_seqlens_qk if correction is None
                  else correction, checked["process_outputs"], self._slots(),
                  labels={name: f"{name}={plugin_label(plugin)}"
                          for name, plugin in plugins.items() if plugin is not None})
        # An Interrupt waits while the lock is taken or given back, never between the two.
        with hold_sigint() as held:
            if not self._running.acquire(blocking=False):
                raise RuntimeError("generate is already running on this engine (called again from a plug-in, or "
                                   "from another thread); wait for it to return, or give each thread its own Engine")
            try:
                if self._closed:  # under the lock: an argument's own code may have closed it
                    raise RuntimeError("this engine is closed (engine.close() or the end of its "
                                       "`with` block): create a new Engine")
                with self._config_lock:  # from here to the run's end, engine.config stays
                    self._check_config()  # again: another thread may have replaced it meanwhile
                    self._config_in_use = True
                try:
                    with held.let_through():
                        self._ensure_ready()
                        self._next_id += len(requests)
                        return self._execute(run, checked["loop"])
                finally:
                    self._config_in_use = False
            finally:
                self._running.release()

    def abort(self, request_id: int) -> None:
        """Stop a request; results already in flight for it are discarded when they land.  Called
        from another thread than the one running ``generate``, or from the loop's own thread in
        the middle of a stage (a signal handler), it is queued and applied as the next round is
        scheduled (before ``on_round``): the run changes at round boundaries only."""
        wanted = None
        if not isinstance(request_id, bool) and isinstance(request_id, numbers.Integral):
            with contextlib.suppress(Exception):  # an Integral without __index__, or raising
                wanted = int.__index__(operator.index(request_id))  # plain: its __eq__ may lie
        if wanted is None:
            raise TypeError(f"abort() takes a request's id, an integer (Completion.request_id; "
                            f"req.id in a plug-in), got {type(request_id).__name__} "
                            f"{shown(request_id)}")
        run = self._run  # read once: another thread may start the next run meanwhile
        req = next((r for r in run.requests if r.id == wanted), None)
        if req is None:
            raise ValueError(f"no request {wanted} in the current run (its ids: "
                             f"{shown([r.id for r in run.requests])})")
        if not run.queue_abort(req):
            self.scheduler.abort(req)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran: a closed engine refuses runs (a lab hands out a new one)."""
        return self._closed

    def close(self) -> None:
        """Stop the device process, its pipe and shared memory (as dropping the engine does)."""
        with hold_sigint():
            if not self._running.acquire(blocking=False):
                raise RuntimeError("close() was called while generate is running on this engine; call it after "
                                   "generate returns")
            try:
                self._closed = True
                self.device.close()
            finally:
                self._running.release()

    def _close_when_idle(self, deadline: float) -> None:
        """Close, as Python exits; a run going on in another thread is first ended (its
        requests aborted, applied at its next round) until ``deadline``, then left to the
        device's finalizer."""
        aborted = set()
        while True:
            try:
                self.close()
                return
            except Exception:  # noqa: BLE001 - generate still runs, or a device a learner replaced
                if not self._running.locked() or time.monotonic() > deadline:
                    return  # nothing may be printed now: the finalizer stops the device process
            with contextlib.suppress(Exception):  # a new run meanwhile, a learner's objects
                for req in list(self._run.requests):
                    if not req.finished and id(req) not in aborted:
                        aborted.add(id(req))
                        self.abort(req.id)
            time.sleep(0.01)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals

    def _execute(self, run: Run, loop) -> list[Completion]:
        # Interrupts wait throughout but in the loop: one while the run is registered is raised
        # as the loop starts, inside the try, so the run is recovered before the call returns.
        with hold_sigint() as held:
            self._clean = False
            run.loop_thread = threading.get_ident()  # before the run is seen: aborts queue from now
            self._run, self.timeline = run, Timeline(meta=self._meta(run.requests))
            self.record = self.device.run_record = RunRecord()
            self.device.spans()  # device work from before the run (a probe, a late recovery) is not part of it
            self.device.take_launch_latencies_ms()  # nor are its launches' latencies
            self.scheduler.round, self.scheduler.freed = 0, {}  # (round 47: junk left in it)
            start = time.perf_counter()
            try:
                for req in run.requests:  # queued only once the run owns them
                    self.scheduler.add(req)
                for observer in RUN_OBSERVERS:
                    observer(self, "start")
                with held.let_through():
                    if loop is None:
                        loop = loops.zos_loop if self.config.mode == "zos" else loops.serial_loop
                    loop(self)
                    if self.scheduler.has_work():
                        raise stalled(self.scheduler, dropped=run.dropped(),
                                      uncommitted=run.uncommitted()) from run.other_thread
                self._clean = True
            except BaseException:
                self._recover()  # held: a second Interrupt cannot cut it short
                raise
            finally:
                run.end()
                self.completions, self.stats = [], None  # none of the last run's stays
                try:  # whatever a request's data makes its completion raise, observers hear "end"
                    self.completions = [r.completion() for r in run.requests]
                    self._finish_stats(time.perf_counter() - start)
                finally:
                    for observer in RUN_OBSERVERS:
                        observer(self, "end")
        run.warn_lost()
        return self.completions

    def _check_config(self) -> None:
        """Take a config replaced between runs as a plain one (the stages read it), unless it
        changed what the engine was built from (``config.BUILT_FROM``)."""
        if self.config is not self._built_with:
            self._config = replaced_config(self._built_with, self.config)

    def _ensure_ready(self) -> None:
        """Before a run: replace a device that died while idle, finish an interrupted recovery, take
        back rows and KV blocks the last run's loop left with requests it took out of the scheduler
        (kept until now: a check reads what the run lost)."""
        failure = self.device.probe(RECOVER_TIMEOUT_S)
        if failure is not None:
            warnings.warn(f"{failure}; starting a new device process (its cache and state start empty)",
                          RuntimeWarning, stacklevel=3)
            self._restart_device()
        elif not self._clean or self._lost_rows_or_blocks():
            self._recover()

    def _lost_rows_or_blocks(self) -> bool:  # or its scheduler replaced or written (45, 46)
        return not whole(self.scheduler, self._new_scheduler())

    def _recover(self) -> None:
        """After an exception: let the device finish (or give it up), forget the run, be ready."""
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
        failed = self.device.failure() is not None  # dead, out of step or sticky
        if failed and _EXITING.is_set():  # no new process as Python exits: the error is the news
            self._closed = True
        elif failed:  # a fresh "context"
            self._restart_device()
        self._clean = True

    def _start_device(self) -> None:
        if _EXITING.is_set():
            raise RuntimeError("Python is exiting: no new device process is started (it would be "
                               "stopped at once, or outlive the interpreter)")
        c = self.config
        device = make_device(c.device, self.model, c.num_kv_blocks, c.block_size, self.buffer_specs,
                             c.race_check, c.device_threads)
        try:  # a failed or interrupted start ends the device it started
            device.launch(kernels.setup_state, self.layout, c.max_batch_size, c.num_draft_tokens,
                          None if self.ngram is None else self.ngram.numpy(),  # by value: no fd
                          round=0, stage=Stage.SETUP)
            device.synchronize()
            device.spans()  # start-up work is not part of any run
            device.run_record = self.record  # restarted mid-run, it records into the run's record
            self.device = device
            self.scheduler = self._new_scheduler()
        except BaseException:
            device.close()
            raise

    def _restart_device(self) -> None:
        self.device.close()
        self._start_device()
        self._clean = True

    def _new_scheduler(self) -> Scheduler:
        c = self.config
        return Scheduler(c.max_batch_size, BlockManager(c.num_kv_blocks, c.block_size, self.device.races.on_alloc,
                                                        self.device.free_blocks), c.num_draft_tokens)

    def _slots(self) -> int:
        """The host buffer slots a run uses, read once per run: at most the engine's."""
        slots = _num_slots()
        if slots > self.num_slots and RING_SLOTS.get() is not None:
            raise ValueError(f"this run was started in a ring of {slots} host slots, but this "
                             f"engine was built with {self.num_slots} buffer slots: build the "
                             f"engine inside the ring (or use a lab's ring_engine())")
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

    def _meta(self, requests) -> TimelineMeta:
        c = self.config
        workload = Workload(len(requests), requests[0].max_new_tokens, requests[0].temperature) if requests else None
        return TimelineMeta(mode=c.mode, device=self.device.name, num_draft_tokens=c.num_draft_tokens,
                            max_batch_size=c.max_batch_size, host_overhead_ms=c.host_overhead_ms, workload=workload,
                            pacing=copy.deepcopy(getattr(self.device, "pacing", None)))  # its own

    def _finish_stats(self, wall_s: float) -> None:
        tl, run = self.timeline, self._run
        for stage, rnd, start_ns, end_ns, cpu_ns, paced_ns in self.device.spans(paced=True):
            tl.add_device_ns(stage, rnd, start_ns, end_ns, rnd if stage == Stage.SAMPLE else None, cpu_ns, paced_ns)
        tl.meta.prefill_rounds = sorted(run.prefill_rounds)
        latencies = self.device.take_launch_latencies_ms()  # of this run's launches only
        self.stats = tl.meta.stats = run_stats(tl, run.counts, run.prefill_rounds, wall_s, latencies)


def _num_slots() -> int:
    ring = RING_SLOTS.get()
    if ring is not None:
        return check_int("the ring's slots", ring, 1, MAX_SLOTS, " (engine.RING_SLOTS)")
    return check_int("NUM_SLOTS", NUM_SLOTS, 1, MAX_SLOTS, " (te.engine.NUM_SLOTS: host buffer slots)")


def _changes(built: EngineConfig, value) -> str:
    """What ``value``, put in ``engine.config``, changes of ``built``, for a message ("" for
    nothing: the same values)."""
    if type(value) is not EngineConfig:  # a subclass's attributes may say anything
        return f"a {type(value).__name__}"
    return ", ".join(f"{f.name}={shown(getattr(value, f.name))}" for f in dataclasses.fields(built)
                     if getattr(value, f.name) != getattr(built, f.name))


def _wait_for_exit() -> None:
    """As Python exits, a thread other than the main one that would start (or report) a run
    waits here to be stopped with the process: its engine and device are being closed, and a
    new run, device process or traceback now would only be noise."""
    if _EXITING.is_set() and threading.current_thread() is not threading.main_thread():
        threading.Event().wait()


def _close_at_exit() -> None:
    """As Python exits: no device process starts from now on, and every engine is closed,
    quietly (one running in another thread once its run, aborted, returns; EXIT_WAIT_S for all)."""
    _EXITING.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    for engine in list(_LIVE):
        engine._close_when_idle(deadline)


def _own_copy(model, tokenizer) -> tuple[TinyGPT, CharTokenizer]:
    """The engine's own float64 copy of ``model`` (default: the shipped one) and its tokenizer."""
    if model is not None and not isinstance(model, TinyGPT):
        raise TypeError(f"model must be a TinyGPT or None (te.load_model() returns one and its alphabet), got "
                        f"{type(model).__name__}")
    if tokenizer is not None and not isinstance(tokenizer, CharTokenizer):
        raise TypeError(f"tokenizer must be a CharTokenizer or None, got {type(tokenizer).__name__}")
    if model is None:  # `is None`, not `or`: a tokenizer subclass may be falsy (a __len__ of 0)
        model, alphabet = load_model()
        tokenizer = CharTokenizer(alphabet) if tokenizer is None else tokenizer
    tokenizer = CharTokenizer() if tokenizer is None else tokenizer
    model = copy.deepcopy(model).double().eval().requires_grad_(False)
    if model.cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"model vocab ({model.cfg.vocab_size}) does not match the tokenizer ({tokenizer.vocab_size})")
    return model, tokenizer
