"""Checkers for the course's exercises.

Each ``check_*`` plugs a learner's code into the engine (race checker on) and judges
*behaviour*, not only tokens: the order of the host's stages read from the run's
timeline, which event the host waited on, what each processed step did to its
requests, and the engine's structured errors (``EngineStalled.reason``,
``RaceError.kind``...), never their message text.  Tokens alone let wrong answers
pass: a loop that never overlaps, or processes before it samples, still produces the
reference text when nothing depends on the order.

A ``Verdict`` says what went wrong *in terms of the lesson*, naming the stage, the round
and the prompt indexes, and carries a ``category`` (the mutation corpus in
``tests/mistakes.py`` pins one per wrong answer).  A checker never raises for a
learner's mistake, so an exercise notebook runs top to bottom and shows the message.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import itertools
import math
import numbers
import operator
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from toy_engine import kernels, loops
from overlap_course import progress
from toy_engine.device import DeviceError, RaceError
from toy_engine.data import CharTokenizer
from toy_engine.config import EngineConfig
from toy_engine.engine import Engine
from toy_engine.run import EngineStalled, StepProcessedTwice
from toy_engine.kernels import FROM_DEVICE
from toy_engine.model import load_model
from toy_engine.timeline import Timeline
from toy_engine.record import Commit, Free, Launch, Refused, Schedule, Wait
from overlap_course.checks.sandbox import TIME_LIMIT_S, Pristine, TimeUp, absorb_time_up, restored_note, start_time_limit

__all__ = ["Verdict", "close_engines", "check_serial_loop", "check_zos_loop", "check_idle_fraction",
           "worked_case", "check_correction", "check_metadata_answer", "expected_three_rounds",
           "check_three_rounds", "check_process_outputs"]

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]
MAX_NEW_TOKENS = 24
DRAFTS = 3  # the ZOS checker's speculative run: stale lengths show only with drafts
CONSTRAINT = "title_case"  # the ZOS checker's constrained run: a wrong order shows in the text


@dataclass
class Verdict:
    passed: bool
    message: str
    category: str = "passed"  # what kind of mistake, for the mutation corpus

    def __repr__(self) -> str:
        return ("PASSED: " if self.passed else "NOT YET: ") + self.message

    def __bool__(self) -> bool:
        return self.passed


def _fail(category: str, message: str) -> Verdict:
    return Verdict(False, message, category)


def _not_implemented(what: str) -> Verdict:
    return _fail("not_implemented", f"not implemented yet: fill in {what} (it still raises NotImplementedError)")


_ENGINES: dict = {}


def _engine(**config) -> Engine:
    """Small ZOS-mode engines shared by all checks, one per configuration, on one loaded
    model.  Starting a device is the slow part of a first check (1-5 s on a busy 2-core
    machine), so there are only three: plain, constrained, and with drafts; a serial run
    is the same engine given ``loop=loops.serial_loop`` (the mode only picks the default loop).
    """
    key = tuple(sorted(config.items()))
    if key not in _ENGINES:
        model, alphabet = _model()
        _ENGINES[key] = Engine(EngineConfig(mode="zos", max_batch_size=3, race_check=True, **config),
                               model=model, tokenizer=CharTokenizer(alphabet))
        _CONFIGS[key] = _ENGINES[key].config
    return _ENGINES[key]


_CONFIGS: dict = {}


def _heal_engines() -> list[str]:
    """Make every shared engine whole again before a check: its config, its race checker
    on, and a cache pool with each block exactly once.  Returns what had to be put back."""
    changed = []
    for key, engine in list(_ENGINES.items()):
        if engine.config is not _CONFIGS[key]:
            changed.append("engine.config")
            engine.config = _CONFIGS[key]  # the frozen config, not a learner's replace()
        if not engine.device.races.enabled:
            changed.append("engine.device.races.enabled")
            engine.device.races.enabled = True
        pool, n = engine.scheduler.blocks.free_ids, engine.config.num_kv_blocks
        if engine.device.failure() or sorted(pool) != list(range(n)) or engine.scheduler.has_work():
            changed.append(f"the shared engine's KV pool ({len(pool)} free blocks of {n}; a fresh engine was started)")
            _ENGINES.pop(key).close()
            _engine(**dict(key))
    return changed


_PRISTINE = Pristine()


def _guarded(*warm):
    """A public check: the toy and the shared engines put back as they were, ``warm`` run
    (engines started, references computed: the checker's own time), then the check under
    the time limit.  What an earlier cell had changed is named in the verdict; what the
    check's own run changed makes it fail."""
    def wrap(check):
        @functools.wraps(check)
        def guarded(*args, **kwargs) -> Verdict:
            note = restored_note(_PRISTINE.restore() + _heal_engines())
            for step in warm:
                step()
            previous, stopped = sys.gettrace(), None
            try:
                start_time_limit(TIME_LIMIT_S)
                verdict = check(*args, **kwargs)
            except (SystemExit, TimeUp) as exc:
                stopped = exc
            finally:
                try:
                    absorb_time_up()
                except TimeUp:
                    pass
                sys.settrace(previous)
            if isinstance(stopped, SystemExit):
                verdict = _fail("raised",
                                f"your code called `exit()` / `sys.exit({stopped.code!r})` (SystemExit), which would "
                                f"end the notebook's kernel: the checker stopped it there. Return from your function "
                                f"instead")
            elif stopped is not None:
                verdict = _fail("time_limit",
                                f"your code was {stopped} (the check allows {TIME_LIMIT_S:.0f} s; the reference takes "
                                f"a few): the checker stopped it there. A loop that never ends usually keeps going "
                                f"after the work is done, or catches the errors that would stop it; the shared "
                                f"engines were recovered and the next check runs normally")
            patched = _PRISTINE.restore()
            if patched:
                verdict = _fail("edits_engine",
                                f"your code replaced {', '.join(f'`{n}`' for n in patched[:4])} while the check ran: "
                                f"the checkers share the toy with every check, so an answer may call its functions "
                                f"but not replace them (restored now). Try such experiments on an engine of your "
                                f"own, `Engine(EngineConfig(...))`")
            verdict.message += note
            return progress.record(verdict, check=check.__name__)  # issue 27: every verdict recorded
        return guarded
    return wrap


@functools.lru_cache(maxsize=1)
def _model():
    return load_model()


def _start(*configs: dict) -> None:
    """Start the engines a check needs at the same time: a first check then waits for its
    slowest device, not their sum (3 engines, measured at load 11 on 2 cores: 5.0 s vs 9.4 s)."""
    missing = [c for c in configs if tuple(sorted(c.items())) not in _ENGINES]
    if len(missing) > 1:
        _model()
        with ThreadPoolExecutor(len(missing)) as pool:
            list(pool.map(lambda config: _engine(**config), missing))


@atexit.register
def close_engines() -> None:
    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()


@functools.lru_cache(maxsize=2)
def _reference(constraint: str | None = None):
    """The serial loop's tokens for PROMPTS (greedy, optionally constrained), computed once."""
    engine = _engine(**({"constraint": constraint} if constraint else {}))
    outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, loop=loops.serial_loop)
    return [c.token_ids for c in outs]


def _compare(got, expected) -> str | None:
    """Describe the first difference between two runs' token lists in words."""
    if len(got) != len(expected):
        return (f"the run returned {len(got)} completions for {len(expected)} prompts: every prompt must end with "
                f"one (did your code remove requests from `engine.requests`? it is the run's own list)")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g == e:
            continue
        if e[: len(g)] == g:
            return f"prompt {i} lost its last {len(e) - len(g)} token(s)"
        first = next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
        return f"prompt {i} differs from the reference from its token {first} on"
    return None


# ------------------------------------------------------------------ reading a loop's run

class _Observed:
    """The engine as a learner's loop sees it: every call goes through to the engine;
    ``schedule`` also notes each round's prompt indexes, so messages can name them."""

    # A loop that swallows the engine's errors may never finish: stop it after far more
    # schedule() calls than the reference loops make (48 serial rounds on PROMPTS, a few
    # more None plans in ZOS) and judge the spin.
    MAX_SCHEDULES = 1000

    def __init__(self, engine: Engine):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "plans", {})
        object.__setattr__(self, "edits", [])
        object.__setattr__(self, "schedules", 0)

    def schedule(self):
        object.__setattr__(self, "schedules", self.schedules + 1)
        if self.schedules > self.MAX_SCHEDULES:
            raise _Spinning(self.schedules - 1)
        plan = self._engine.schedule()
        if plan is not None:
            self.plans[plan.round] = [r.index for r in plan.requests]
        return plan

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        self.edits.append(name)
        raise _EngineEdited(name)


class _Spinning(BaseException):
    """Stops a learner's loop that keeps going: a BaseException, so that an ``except
    Exception`` in the loop cannot swallow it."""


class _EngineEdited(AttributeError):
    """A learner's loop tried to replace an attribute of a checker's shared engine."""


def _edited(names: list[str]) -> Verdict:
    return _fail("edits_engine",
                 f"your loop set `engine.{names[0]}`: the checkers' engines are shared by every check, so a "
                 f"loop may call the engine's methods but not replace them (nothing was changed, and the run "
                 f"stopped there). Try such experiments on an engine of your own, `Engine(EngineConfig(...))`")


def _spinning(calls: int) -> Verdict:
    return _fail("spins",
                 f"your loop called `engine.schedule()` {calls} times without finishing (the reference loops need "
                 f"about 50 rounds here), so the checker stopped it. It probably catches the engine's errors and "
                 f"tries again (`except Exception: pass`): let them out, and the checker says what went wrong")


def _forget_edits(engine: Engine, attributes: set[str]) -> None:
    """Undo what a learner's code set on a shared engine over one of its methods (e.g.
    ``engine.process_outputs = ...`` inside a plug-in), so that a later check runs on the
    engine it expects.  (A run's own new attributes, ``stats``, ``completions``, stay.)"""
    for name in _shadowing(engine, attributes):
        delattr(engine, name)


def _shadowing(engine: Engine, attributes: set[str]) -> list[str]:
    return sorted(n for n in set(vars(engine)) - attributes if hasattr(type(engine), n))


class _HostLog:
    """One run as the ordered list of (stage, round) it did, read from the device's record
    (``toy_engine.record``): ``schedule``, ``prepare`` (the round's upload), ``launch_forward``,
    ``launch_sample``, and one processing entry per commit of a round's tokens.  A commit made
    inside the engine's ``process_outputs``/``flush`` carries that span's name
    (``postprocess``/``flush``); one a loop wrote out inline is a ``commit``.  So a stage is
    judged by what happened, whichever code did it."""

    PROCESSING = ("postprocess", "flush", "commit")
    _LAUNCHES = {"upload": "prepare", "forward": "launch_forward", "sample": "launch_sample"}

    def __init__(self, engine: Engine, plans: dict):
        record, timeline = engine.record, engine.timeline
        spans = [s for s in timeline.lane("host") if s.stage in ("postprocess", "flush")]
        self.events, self.launches, planned = [], {}, 0
        for e in record.events:
            if isinstance(e, Schedule):  # one that found nothing belongs to the last planned round
                planned = planned if e.round is None else e.round
                self.events.append(("schedule", planned))
            elif isinstance(e, Launch) and e.stage in self._LAUNCHES:
                self.events.append((self._LAUNCHES[e.stage], e.round))
                self.launches.setdefault((e.stage, e.round), e)
            elif isinstance(e, Commit):
                at = timeline.ns_to_ms(e.t_ns)
                label = next((s.stage for s in spans if s.round == e.round and s.start_ms <= at <= s.end_ms),
                             "commit")
                self.events.append((label, e.round))
        self.waits = record.of(Wait)
        self.refused = record.of(Refused) + [f for f in record.of(Free) if f.refused]
        self.prefill = set(timeline.meta.get("prefill_rounds", ()))
        self.plans = plans
        self.rounds = sorted({r for s, r in self.events if s in ("prepare", "launch_forward", "launch_sample")})

    def pos(self, stage: str, rnd: int) -> list[int]:
        return [i for i, e in enumerate(self.events) if e == (stage, rnd)]

    def first(self, stage: str, rnd: int) -> int | None:
        found = self.pos(stage, rnd)
        return found[0] if found else None

    def processing(self, rnd: int) -> list[int]:
        return [i for i, (s, r) in enumerate(self.events) if r == rnd and s in self.PROCESSING]

    def who(self, rnd: int) -> str:
        kind = "prefill" if rnd in self.prefill else "decode"
        prompts = self.plans.get(rnd)
        return f"round {rnd} ({kind}" + (f", prompts {prompts})" if prompts is not None else ")")

    def between(self, lo: int, hi: int) -> list[tuple[str, int]]:
        return self.events[lo + 1: hi]


def _common_mistakes(log: _HostLog) -> Verdict | None:
    """Mistakes either loop can make: launches out of order or twice, a plan dropped,
    a step processed twice."""
    last = max(log.rounds, default=-1)
    for r in log.rounds:
        fwd, smp, done = log.pos("launch_forward", r), log.pos("launch_sample", r), log.processing(r)
        if smp and (not fwd or smp[0] < fwd[0]):
            what = "came before `launch_forward`" if fwd else "was called but `launch_forward` never was"
            return _fail("sample_before_forward",
                         f"{log.who(r)}: `launch_sample` {what}. Sampling picks tokens "
                         f"from the logits that the round's forward computes, so the forward must be launched "
                         f"first (on the device the sample then read a stale or missing forward's logits)")
        if len(log.pos("prepare", r)) > 1:
            return _prepared_twice(log, r)
        if len(fwd) > 1 or len(smp) > 1:
            stage = "launch_forward" if len(fwd) > 1 else "launch_sample"
            return _fail("launched_twice",
                         f"{log.who(r)}: `{stage}` was called {max(len(fwd), len(smp))} times. Each round is "
                         f"launched once: one forward, one sample, and its step processed once")
        if len(done) > 1:
            stages = " and ".join(f"`{log.events[i][0]}`" for i in done)
            return _fail("processed_twice",
                         f"{log.who(r)}: its step was processed {len(done)} times ({stages}). Processing "
                         f"commits the step's tokens and lowers each request's count of launched rounds, so a "
                         f"second time corrupts both. Process each StepState once; in the ZOS loop, clear "
                         f"`previous` once it is processed (`previous = engine.flush(previous)`, and "
                         f"`previous = None` after a prefill)")
    for r in range(last):
        if log.first("schedule", r) is not None and log.first("prepare", r) is None:
            return _fail("plan_dropped",
                         f"{log.who(r)} was scheduled but never prepared or launched: its requests now count "
                         f"a launched round that will never produce a token. Run every plan that "
                         f"`engine.schedule()` returns")
    return None


def _prepared_twice(log: _HostLog, r: int) -> Verdict:
    return _fail("prepared_twice",
                 f"{log.who(r)}: `prepare_inputs` was called twice for the same plan. Each call writes the "
                 f"round's metadata into the round's host buffer slot and launches an upload that reads it, so "
                 f"the second call rewrites the slot while the first upload may still be reading it. Prepare "
                 f"each plan once and launch with those inputs")


def _serial_order(log: _HostLog) -> Verdict | None:
    for r in log.rounds:
        done, nxt, planned = log.processing(r), log.first("prepare", r + 1), log.first("schedule", r + 1)
        if done and planned is not None and nxt is not None and planned < done[0] < nxt:
            return _fail("scheduled_before_processing",
                         f"{log.who(r)}: round {r + 1} was scheduled before round {r}'s results were processed. "
                         f"The plan was made from stale state: a request that finished in round {r} (a stop, "
                         f"its last token) is still in round {r + 1}'s plan and gets a wasted extra step. The "
                         f"serial loop processes each step before it asks `engine.schedule()` for the next "
                         f"round: that is what makes its plans exact")
        if done and nxt is not None and done[0] > nxt:
            return _fail("not_serial",
                         f"{log.who(r)}: its results were processed after round {r + 1} was prepared and "
                         f"launched. That is the overlapped (ZOS) order of notebook 03a; the serial loop "
                         f"processes each step (`engine.process_outputs(step)`) before scheduling the next "
                         f"round, so that no launch of round {r + 1} comes before round {r}'s results")
    return None


def _deferred(log: _HostLog) -> int:
    """Decode steps processed under the next round: after its forward launch, before its sample."""
    count = 0
    for r in log.rounds:
        done, fwd, smp = log.processing(r), log.first("launch_forward", r + 1), log.first("launch_sample", r + 1)
        count += bool(done and fwd is not None and smp is not None and fwd < done[0] < smp)
    return count


def _zos_order(log: _HostLog) -> Verdict | None:
    """The ZOS rules, round by round: prefill at once, decode deferred under the next
    forward and before the next sample, and processed when nothing is left to launch.  Which
    method processed a step (``process_outputs``, ``flush``, code written inline) does not
    matter: ``flush`` is ``process_outputs`` under the name the timeline gives that step."""
    for r in log.rounds:
        done = log.processing(r)
        if not done:
            continue
        at, stage = done[0], log.events[done[0]][0]
        nxt_prep = log.first("prepare", r + 1)
        fwd, smp = log.first("launch_forward", r + 1), log.first("launch_sample", r + 1)
        if r in log.prefill:
            if nxt_prep is not None and at > nxt_prep:
                return _fail("prefill_deferred",
                             f"{log.who(r)} was deferred (processed by `{stage}` during a later round). "
                             f"Prefill steps are processed at once, right after their sample launch: the "
                             f"first token reaches the request a round earlier, and there is little to hide")
            continue
        before_next = nxt_prep is None or at < nxt_prep
        if before_next:
            # A flush is right only when a schedule() since the step's sample found nothing to
            # launch: the engine records such a schedule under the last launched round (r), one
            # that found a plan under the plan's round.
            since = log.between(log.first("launch_sample", r), at)
            schedules = [q for s, q in since if s == "schedule"]
            found_plan = [q for q in schedules if q > r]
            if schedules and not found_plan:
                continue  # nothing was left to launch: processing it now is the flush, whatever its name
            how = "flushed" if stage == "flush" else "processed"
            if found_plan:
                return _fail("not_deferred",
                             f"{log.who(r)} was {how} right after `engine.schedule()` returned round "
                             f"{found_plan[0]}'s plan, before that round was prepared and its forward launched: "
                             f"the host waited for the step with the device idle, so nothing overlapped. Keep it as "
                             f"`previous` and process it after round {found_plan[0]}'s `launch_forward`, before "
                             f"its `launch_sample`" + ("; `flush` is only for when `schedule()` returns None"
                                                       if stage == "flush" else ""))
            return _fail("not_deferred",
                         f"{log.who(r)} was {how} before round {r + 1} was even scheduled (right after its own "
                         f"sample, or first thing in the next pass): no round was on the device to hide it under, "
                         f"so no decode step was deferred. Keep the StepState as `previous` and process it during "
                         f"the next round, after that round's forward launch" +
                         ("; `flush` is only for when `engine.schedule()` returns None (nothing left to "
                          "launch)" if stage == "flush" else ""))
        if fwd is None or at < fwd:
            return _fail("process_before_forward",
                         f"{log.who(r)}: its results were processed before round {r + 1}'s forward was "
                         f"launched, so the device sat idle while the host waited and committed. Launch "
                         f"this round's forward first, then process the previous step")
        if smp is not None and at > smp and r + 1 in log.prefill:
            return _fail("deferred_past_prefill",
                         f"{log.who(r)}: its step was still deferred when prefill {log.who(r + 1)} was launched, "
                         f"and it was processed only after that prefill's sample, a round late. A prefill round "
                         f"is a round like any other for the step deferred before it: process `previous` under "
                         f"the prefill's forward, before its sample, then the prefill's own step")
        if smp is not None and at > smp:
            return _fail("sample_before_process",
                         f"{log.who(r)}: round {r + 1}'s sample was launched before round {r}'s results were "
                         f"processed (host order: launch_forward {r + 1} -> launch_sample {r + 1} -> "
                         f"postprocess {r}). Sampling may depend on the text committed so far (a grammar "
                         f"mask, a penalty): with the `{CONSTRAINT}` constraint on, round {r + 1}'s mask was "
                         f"built without round {r}'s token. The order is: this round's forward, the previous "
                         f"round's postprocess, this round's sample")
    return None


def _overlapped(log: _HostLog) -> Verdict | None:
    """Each decode round's successor forward must go in while the round's sample is still
    outstanding: a host wait on it (or on anything later) before that launch means the
    device had nothing queued behind the sample while the host waited."""
    for r in log.rounds:
        sample, forward = log.launches.get(("sample", r)), log.launches.get(("forward", r + 1))
        if r in log.prefill or sample is None or forward is None or forward.enqueued_before_waiting_for(sample):
            continue
        found_nothing = [q for s, q in log.between(log.first("launch_sample", r), log.first("launch_forward", r + 1))
                         if s == "schedule" and q <= r]
        if found_nothing:
            continue  # a schedule found nothing to launch until round r was processed: nothing to overlap with
        wait = next((w for w in log.waits if w.seq >= sample.seq), None)
        on = (f"on round {wait.round}'s `{wait.stage}`" if wait is not None else "on the device")
        return _fail("waits_before_forward",
                     f"{log.who(r)}: the host waited {on} before it launched round {r + 1}'s forward, so "
                     f"round {r + 1}'s forward went in only after round {r}'s sample had finished, and the "
                     f"device sat idle for as long as that wait, the commit and round {r + 1}'s preparation "
                     f"took. The tokens are right, but nothing overlapped: launch round {r + 1}'s forward "
                     f"first, and only then wait for round {r}'s results (processing them waits for exactly "
                     f"what it needs)")
    return None


def _zos_overlapped(log: _HostLog) -> Verdict | None:
    """The ZOS order first (its messages are the more specific), then the overlap itself."""
    verdict = _zos_order(log)
    return _overlapped(log) if verdict is None else verdict


def _crash(log: _HostLog, err: BaseException, mode: str) -> Verdict:
    """A lesson-level message for an exception out of a learner's loop."""
    if isinstance(err, NotImplementedError):
        return _not_implemented("`serial_loop`" if mode == "serial" else "`zos_loop`")
    unprocessed = [r for r in log.rounds if log.first("launch_sample", r) is not None and not log.processing(r)]
    if isinstance(err, EngineStalled):
        if err.reason == "loop_returned_with_work":
            return _fail("loop_returned",
                         f"your loop returned after round {max(log.rounds, default=0)} while prompts "
                         f"{err.prompt_indexes} still had tokens to produce: loop while "
                         f"`engine.scheduler.has_work()` (or `while True` with a `break` only when it has none)")
        if err.reason == "unprocessed_inflight" and unprocessed:
            r = unprocessed[0]
            if mode == "zos" and r not in log.prefill and r + 1 in log.prefill:
                return _fail("dropped_at_prefill",
                             f"{log.who(r)}: its step was still deferred when prefill {log.who(r + 1)} was launched, "
                             f"and it was never processed, so prompts {err.prompt_indexes} lost its tokens. A "
                             f"prefill round is processed at once, but that does not replace the deferred step: "
                             f"process `previous` under the prefill's forward as in any round, then the prefill's "
                             f"own step")
            if mode == "zos":
                return _fail("no_flush",
                             f"{log.who(r)}: its step was launched but never processed, so prompts "
                             f"{err.prompt_indexes} lost their last token(s). When `engine.schedule()` returns "
                             f"None there is no next round to hide the deferred step under: process it with "
                             f"`previous = engine.flush(previous)`, then keep looping")
            return _fail("never_processed",
                         f"{log.who(r)}: its step was launched but never processed, so prompts "
                         f"{err.prompt_indexes} never received its tokens: every launched step must be waited "
                         f"for and processed (`engine.process_outputs(step)`)")
        return _fail("stalled", f"the engine could not go on ({err.reason}, prompts {err.prompt_indexes}): {err}")
    if isinstance(err, RaceError):
        planned = max((q for s, q in log.events if s == "schedule"), default=-1)
        if err.kind == "buffer" and err.access == "w" and err.launch == "upload" and err.round == planned:
            return _prepared_twice(log, planned)  # the second prepare of a plan was refused
        if err.kind == "buffer" and err.access == "w":
            r = err.round
            return _fail("never_processed",
                         f"{log.who(r)}: its step was never waited for and processed, and round {r + 2} "
                         f"reuses its host buffer `{err.buffer}` (rounds alternate between two buffers) while, "
                         f"as far as the host knows, round {r}'s `{err.launch}` may still use it. Every "
                         f"launched step must go through `engine.process_outputs(step)` before its buffer "
                         f"comes round again")
        return _fail("race", f"the race checker stopped your loop ({err.kind}, round {err.round}'s "
                             f"`{err.launch}`): {err}")
    schedules = [i for i, (s, _) in enumerate(log.events) if s == "schedule"]
    last = schedules[-1] if schedules else None
    r = log.events[last][1] if last is not None else -1
    empty = last is not None and any(e == ("prepare", r) for e in log.events[:last])  # a None plan
    if empty and isinstance(err, (AttributeError, TypeError)) and ("prepare", r + 1) not in log.events[last:]:
        if mode == "serial":
            return _fail("never_processed",
                         f"after round {r}, `engine.schedule()` returned None and your loop went on with it "
                         f"({type(err).__name__}: {err}). In the serial loop that only happens when launched "
                         f"steps were never processed: every request is still waiting for its results, so no "
                         f"round can be planned. Waiting for the device (`synchronize()`) is not enough: "
                         f"process each step (`engine.process_outputs(step)`) before the next `schedule()`")
        return _fail("none_plan",
                     f"after round {r}, `engine.schedule()` returned None (nothing can be launched until "
                     f"outstanding results are processed) and your loop went on with it: {type(err).__name__}: "
                     f"{err}. When there is no plan, flush the deferred step and ask again")
    if isinstance(err, DeviceError):
        return _fail("device_error", f"a launch failed on the device: {err}. Check that each round is "
                                     f"prepared, then its forward launched, then its sample")
    return _fail("raised", f"your loop raised {type(err).__name__}: {err}")


def _run_loop(loop, **config):
    """Run a learner's loop on PROMPTS; returns (engine, log, outputs or None, exception or None)."""
    engine = _engine(**config)
    observed, attributes = {}, set(vars(engine))

    def watched(real_engine):
        view = _Observed(real_engine)
        observed["plans"], observed["edits"] = view.plans, view.edits
        loop(view)

    try:
        outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, loop=watched)
        err = None
    except (Exception, _Spinning) as exc:  # noqa: BLE001 - judged below, never raised to the learner
        outs, err = None, exc
    finally:
        _forget_edits(engine, attributes)
    if observed.get("edits"):
        err = _EngineEdited(observed["edits"][0])
    return engine, _HostLog(engine, observed.get("plans", {})), outs, err


def _stopped_by_checker(err) -> Verdict | None:
    """The verdict for a run the checker itself stopped: the loop edited the engine, or spun."""
    if isinstance(err, _EngineEdited):
        return _edited(err.args)
    if isinstance(err, _Spinning):
        return _spinning(err.args[0])
    return None


def _loop_verdict(log: _HostLog, err, mode: str, in_order) -> Verdict | None:
    """What went wrong in a learner's loop run, first thing first: not written yet, stopped
    by the checker, a mistake either loop makes, this mode's order (``in_order``), a crash.
    (Verdicts are falsy when failed, hence the explicit ``is None`` chain.)"""
    if isinstance(err, NotImplementedError):
        return _not_implemented("`serial_loop`" if mode == "serial" else "`zos_loop`")
    verdict = _stopped_by_checker(err)
    if verdict is None:
        verdict = _common_mistakes(log)
    if verdict is None:
        verdict = in_order(log)
    if verdict is None and err is not None:
        verdict = _crash(log, err, mode)
    if verdict is None and log.refused:
        verdict = _swallowed(log.refused[0])
    return verdict


def _swallowed(refusal) -> Verdict:
    """The race checker refused something and the learner's code caught the error."""
    if isinstance(refusal, Refused):
        what = (f"a host {'read' if refusal.access == 'r' else 'write'} of `{refusal.buffer}` while round "
                f"{refusal.round}'s `{refusal.launch}` still used it")
    else:
        what = f"a free of KV blocks {list(refusal.blocks)} while round {refusal.in_use[0][0]}'s `{refusal.in_use[0][1]}` still used them" \
            if refusal.in_use else f"a second free of KV blocks {list(refusal.double)}"
    return _fail("race",
                 f"the race checker refused {what}, and your code caught the error and went on. The refusal is "
                 f"the bug report: with race checking off (as in benchmarks, or on a real GPU) that access "
                 f"happens, and it races with the device. Wait on the right event first instead of catching "
                 f"the error")


def _waits_beyond(engine: Engine, log: _HostLog) -> Verdict | None:
    """The host may wait only on a step's sample event: a wait on a later point (a
    ``device.synchronize()``, an event recorded after the next forward) also waits for
    launches the host has not processed, and the overlap is gone."""
    later = [w for w in log.waits if w.stage != "sample"]
    if not later:
        return None
    clock = engine.timeline.ns_to_ms
    waited = sum(clock(w.end_ns) - clock(w.start_ns) for w in later)
    idle = engine.stats.get("decode_device_idle_fraction", 0.0)
    engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)  # the engine's own zos_loop, for the cost
    ref_idle = engine.stats.get("decode_device_idle_fraction", 0.0)
    first = next((w for w in later if w.round not in log.prefill), later[0])
    deferred = {r for r in log.rounds if r not in log.prefill and r + 1 in log.rounds}
    lost = len(deferred & {w.round - 1 for w in later if w.stage in ("forward", "correct")})
    return _fail("waits_later_event",
                 f"{log.who(first.round)}: the host waited on a device event that is not a step's `sample_done` "
                 f"({len(later)} such waits in this run: `engine.device.synchronize()`, or an event recorded "
                 f"after a launch), so it also waited for round {first.round}'s `{first.stage}`, which no "
                 f"processing needed yet. The tokens are right, but the overlap is lost: in this run {lost} of "
                 f"{len(deferred)} deferred decode steps were processed only after the next round's forward "
                 f"had finished (nothing left to hide them under), the host spent {waited:.1f} ms in those waits and the device was idle {idle:.0%} of the decode phase (the "
                 f"engine's own zos_loop on the same prompts, just after: {ref_idle:.0%}). Only "
                 f"`engine.process_outputs` needs to wait, and it waits only on its step's `sample_done`")


@_guarded(_engine, _reference)
def check_serial_loop(loop) -> Verdict:
    """Exercise 2: ``loop(engine)`` runs the serial engine with the stage methods."""
    engine, log, outs, err = _run_loop(loop)
    verdict = _loop_verdict(log, err, "serial", _serial_order)
    if verdict is not None:
        return verdict
    extra = [w for w in log.waits if w.stage != "sample"]
    if extra:
        return _fail("waits_later_event",
                     f"{log.who(extra[0].round)}: the host waited for round {extra[0].round}'s "
                     f"`{extra[0].stage}` ({len(extra)} such waits in this run: `engine.device.synchronize()`, "
                     f"or an event recorded after a launch), though nothing on the host needed it yet. The "
                     f"tokens are right, but the device sat idle while the host waited and then launched the "
                     f"next stage. The serial loop waits once per round, inside `process_outputs`, on the "
                     f"step's `sample_done`")
    diff = _compare([c.token_ids for c in outs], _reference())
    if diff:
        return _fail("wrong_tokens", f"{diff}: each round must prepare, launch forward, launch sample, then "
                                     f"process that step before the next round")
    return Verdict(True, f"the serial loop reproduces the reference: {len(PROMPTS)} prompts, "
                         f"{engine.stats['rounds']} rounds, every step processed before the next round")


def _correction_mistake(engine: Engine, log: _HostLog) -> str:
    """Why a speculative run's tokens differ, read from its device lane."""
    device = engine.timeline.lane("device")
    for r in log.rounds:
        prev_done, prepared = log.processing(r - 1), log.first("prepare", r)
        if r in log.prefill or not prev_done or prepared is None or prev_done[0] < prepared:
            continue  # nothing in flight when round r was prepared: its lengths are right
        stages = [s.stage for s in device if s.round == r]
        if "correct" not in stages:
            return (f"{log.who(r)} was prepared while round {r - 1} was in flight, and its lengths were never "
                    f"corrected on the device: call `engine.correct_on_device(inputs)` when a step is in "
                    f"flight")
        if "forward" in stages and stages.index("correct") > stages.index("forward"):
            return (f"{log.who(r)}: the correction ran after the forward had used the stale lengths: call "
                    f"`engine.correct_on_device(inputs)` before `engine.launch_forward(inputs)`")
    return ""


@_guarded(lambda: _start({"constraint": CONSTRAINT}, {"num_draft_tokens": DRAFTS}, {}),
          lambda: _reference(CONSTRAINT), _reference)
def check_zos_loop(loop) -> Verdict:
    """Exercise 3: ``loop(engine)`` is the overlapped loop, flush included.

    Two runs: greedy with the title-case constraint (the sample's mask depends on the
    previous round's committed token, so the order matters for the text), and greedy
    with 3 drafts per round (lengths are stale unless corrected on the device).  Both
    must equal the serial engine; the first run's host lane must show the ZOS order.
    """
    _start({"constraint": CONSTRAINT}, {"num_draft_tokens": DRAFTS}, {})
    engine, log, outs, err = _run_loop(loop, constraint=CONSTRAINT)
    verdict = _loop_verdict(log, err, "zos", _zos_overlapped)
    if verdict is None:
        verdict = _waits_beyond(engine, log)
    if verdict is not None:
        return verdict
    diff = _compare([c.token_ids for c in outs], _reference(CONSTRAINT))
    if diff:
        return _fail("wrong_tokens", f"with the `{CONSTRAINT}` constraint on, {diff}: process every step exactly "
                                     f"once, in round order, before the next sample")
    spec, spec_log, spec_outs, err = _run_loop(loop, num_draft_tokens=DRAFTS)
    verdict = _loop_verdict(spec_log, err, "zos", _zos_overlapped)  # its rounds end differently: a new order
    if verdict is not None:
        return verdict
    diff = _compare([c.token_ids for c in spec_outs], _reference())
    if diff:
        why = _correction_mistake(spec, spec_log)
        return _fail("correction" if why else "wrong_tokens",
                     f"with speculative decoding ({DRAFTS} drafts per round) {diff} compared with plain greedy "
                     f"decoding: {why or 'process every step exactly once, in round order'}")
    return Verdict(True, f"ZOS loop matches the serial tokens with the `{CONSTRAINT}` constraint and with "
                         f"{DRAFTS} drafts per round; {_deferred(log)} decode steps were processed under the next "
                         f"round's forward, before its sample, and the last one was flushed")


# ------------------------------------------------------------------ idle fraction

def _real(x) -> float | None:
    """A learner's number as a float: a Python or NumPy real, or a 0-d tensor/array; None
    for anything else (a bool, a string, a list)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Real):
        return float(x)
    if isinstance(x, torch.Tensor) and x.ndim == 0 and x.dtype != torch.bool and not x.is_complex():
        return float(x)
    if getattr(x, "shape", None) == () and getattr(getattr(x, "dtype", None), "kind", "") in "iuf":
        return float(x)  # a 0-d NumPy array
    return None


@_guarded()
def check_idle_fraction(idle_fraction, engine: Engine) -> Verdict:
    """Exercise 2(b): ``idle_fraction(timeline)`` against engine.stats['device_idle_fraction']."""
    timeline, expected = engine.timeline, engine.stats["device_idle_fraction"]
    try:
        got = idle_fraction(timeline)
    except NotImplementedError:
        return _not_implemented("`idle_fraction`")
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return _fail("raised", f"your idle_fraction raised {type(err).__name__}: {err}")
    number = _real(got)
    if number is None:
        return _fail("not_a_number", f"idle_fraction should return a number, got {type(got).__name__}")
    if not math.isfinite(number):
        return _fail("not_a_number", f"idle_fraction returned {number}: divide the idle time by idle + busy "
                                     f"(both from the timeline, and busy is never 0 after a run)")
    got = number

    def close(a, b):  # float32 or a 0-d tensor of the right value passes: 1e-6 is far below any mistake's gap
        return abs(a - b) < 1e-6

    if close(got, expected):
        return _same_on_another_timeline(idle_fraction, timeline)
    idle = sum(b - a for a, b in timeline.device_gaps())
    busy = timeline.device_busy_ms()
    if close(got, 100 * expected):
        return _fail("percentage", f"that is a percentage ({got:.2f}%): return the fraction itself, "
                                   f"idle / (idle + busy), a number between 0 and 1 ({expected:.4f} here)")
    if close(got, 1 - expected):
        return _fail("busy_fraction", "that is the busy fraction; the idle fraction is idle / (idle + busy)")
    if busy and close(got, idle / busy):
        return _fail("idle_over_busy", "divide by idle + busy (the whole time between the first and the last "
                                       "device work), not by busy")
    if close(got, idle):
        return _fail("idle_ms", "that is the idle time in ms; divide it by idle + busy to get a fraction")
    extent = max(s.end_ms for s in timeline.spans) - min(s.start_ms for s in timeline.spans)
    if any(close(got, idle / wall) for wall in (engine.stats["wall_ms"], extent)):
        return _fail("wall_denominator", "wall_ms also counts host-only time before the first and after the last "
                                         "device work; use idle + busy as the denominator")
    return _fail("wrong_value", f"got {got:.4f}, expected {expected:.4f}: idle / (idle + busy) from "
                                f"timeline.device_gaps() and timeline.device_busy_ms()")


def _same_on_another_timeline(idle_fraction, timeline) -> Verdict:
    """A right value on the run's timeline; now on one the function cannot have seen the
    stats of: the same run without its prefill round."""
    decode = Timeline(origin_ns=timeline.origin_ns, meta=dict(timeline.meta))
    for span in timeline.spans:
        if span.round > 0:
            decode.spans.append(span)
    expected = decode.device_idle_fraction()
    try:
        got = _real(idle_fraction(decode))
    except Exception as err:  # noqa: BLE001 - reported, not raised
        got, why = None, f"it raised {type(err).__name__}: {err}"
    else:
        why = f"it returned {got!r:.40}"
    if got is None or not abs(got - expected) < 1e-6:
        return _fail("not_from_timeline",
                     f"your function gave the run's idle fraction, but not on another timeline: for the same "
                     f"run without its prefill round (round 0) the idle fraction is {expected:.4f}, and {why}. "
                     f"Compute it from the timeline you are given (its device gaps and busy time), not from "
                     f"the engine's stats or a number you saw")
    return Verdict(True, "your idle fraction equals engine.stats['device_idle_fraction'], and it follows the "
                         "timeline it is given (checked on the same run without its prefill)")


# ------------------------------------------------------------------ seqlen correction

# The worked case, as the host prepared it: k = 2, three pending requests in rows 0, 2, 5
# whose previous round accepted 1, 0 and 2 drafts.  Block tables are per request.
_CASE = dict(rows=[0, 2, 5], first=[6, 3, 10], tables=[[3, 7, 1, 0], [2, 4, 9, 0], [6, 0, 8, 5]],
             accepted=[1, 0, 0, 0, 0, 2, 0, 0], k=2)


def _case(block_size: int, pending, copies: int = 1) -> tuple[dict, torch.Tensor]:
    """The worked case's requests with another block size or other ``pending`` flags, as
    ``prepare_inputs`` writes them (a request that is not pending feeds its newest token,
    known on the host, then FROM_DEVICE draft slots); ``copies`` > 1 repeats the requests
    in other rows (the case for telling a loop over requests from tensor operations)."""
    q, B = _CASE["k"] + 1, 3 * copies
    first = _CASE["first"] * copies
    positions = torch.tensor([p for f in first for p in range(f, f + q)])
    tables = torch.tensor(_CASE["tables"] * copies)
    owner = torch.arange(B).repeat_interleave(q)
    pending = list(pending) * copies
    newest = 37  # any real token id
    meta = {
        "input_ids": torch.tensor([FROM_DEVICE if j or p else newest for p in pending for j in range(q)]),
        "positions": positions,
        "slot_mapping": tables[owner, positions // block_size] * block_size + positions % block_size,
        "seqlens_q": torch.tensor([q] * B),
        "seqlens_k": torch.tensor([f + q for f in first]),
        "rows": torch.tensor(_CASE["rows"] + [1, 3, 4, 6, 7][: B - 3]),
        "pending": torch.tensor(pending),
        "block_tables": tables,
    }
    return meta, torch.tensor(_CASE["accepted"])


class _HostReads(TorchFunctionMode):
    """Counts the tensor operations a function makes, and the ones that bring a tensor's
    values to the host (on a GPU each of those waits for the device)."""

    HOST = frozenset({"item", "tolist", "numpy", "cpu", "__int__", "__float__", "__bool__", "__index__",
                      "__complex__", "__array__"})

    def __init__(self):
        super().__init__()
        self.ops, self.host = 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = getattr(func, "__name__", "")
        to_host = name == "to" and any(str(a) == "cpu" for a in (*args[1:], *(kwargs or {}).values()))
        if name in self.HOST or to_host:
            self.host.append(name)
        return func(*args, **(kwargs or {}))


def _stays_on_device(fn) -> Verdict | None:
    """Exercise 04's rule, on the worked case and on twice as many requests: no value read
    on the host, and as many tensor operations for 6 requests as for 3 (no loop over them)."""
    counts = []
    for copies in (1, 2):
        meta, accepted = _case(4, [1, 1, 1], copies)
        with _HostReads() as seen:
            fn(meta, accepted, 4)
        if seen.host:
            names = sorted(set(seen.host), key=seen.host.index)
            return _fail("host_read",
                         f"your correction computes the right values, but it reads tensor values on the host "
                         f"({', '.join(f'`{n}`' for n in names)}: {len(seen.host)} times for "
                         f"{3 * copies} requests). On a GPU each such read makes the host wait until the device "
                         f"has computed that value, which is exactly the wait ZOS removes. Keep every step a "
                         f"tensor operation: no `.item()`, `.tolist()`, `.cpu()`, `int(...)` or `if` on a tensor")
        counts.append(seen.ops)
    if counts[1] > counts[0]:
        return _fail("python_loop",
                     f"your correction computes the right values, but it makes {counts[0]} tensor operations "
                     f"for 3 requests and {counts[1]} for 6: it loops over requests (or tokens) in Python. On "
                     f"a GPU every one of those operations is a kernel launch, so the correction's cost grows "
                     f"with the batch. Write it with whole-tensor operations (the hints' repeat_interleave "
                     f"and indexing with tensors), whose count does not depend on the batch size")
    return None


def worked_case():
    """The notebook's worked case (block size 4, k = 2): three pending decode requests
    whose previous round accepted 1, 0 and 2 drafts.  Returns (meta, accepted, expected)."""
    meta, accepted = _case(4, [1, 1, 1])
    expected = {"seqlens_q": [3, 3, 3], "seqlens_k": [10, 6, 15],
                "positions": [7, 8, 9, 3, 4, 5, 12, 13, 14],
                "slot_mapping": [31, 4, 5, 11, 16, 17, 20, 21, 22]}
    return meta, accepted, expected


_FIELDS = ("seqlens_q", "seqlens_k", "positions", "slot_mapping")
_WHY = {
    "seqlens_k": "the key length must grow by the accepted drafts of the in-flight round",
    "positions": "every query token moves right by the accepted drafts",
    "slot_mapping": "slots must be recomputed from the corrected positions through the block table",
    "seqlens_q": "query lengths must not change: a decode request always feeds 1 + k tokens",
}


def _variants(meta, accepted, block_size) -> dict:
    """What the classic wrong corrections produce on a case, to name them when seen."""
    delta = accepted[meta["rows"]] * meta["pending"]
    owner = torch.arange(len(delta)).repeat_interleave(meta["seqlens_q"])

    def applied(delta_, slots="table", first_only=False, queries=False, bs=block_size):
        m = {n: t.clone() for n, t in meta.items()}
        shift = delta_[owner]
        if first_only:
            starts = torch.cumsum(meta["seqlens_q"], 0) - meta["seqlens_q"]
            shift = torch.zeros_like(shift).index_copy(0, starts, delta_)
        m["seqlens_k"] += delta_
        m["positions"] += shift
        if slots == "table":
            m["slot_mapping"] = m["block_tables"][owner, m["positions"] // bs] * bs + m["positions"] % bs
        else:
            m["slot_mapping"] += shift
        if queries:
            m["seqlens_q"] += delta_
        return {n: m[n].tolist() for n in _FIELDS}

    B = len(delta)
    return {
        "accepted_by_batch": (applied(accepted[:B] * meta["pending"]),
                              "you took `accepted[:B]` (batch positions) instead of `accepted[meta['rows']]`: "
                              "accepted is indexed by the request's row"),
        "pending_ignored": (applied(accepted[meta["rows"]]),
                            "a request with pending = 0 was processed before this round was prepared, so its "
                            "host lengths are already right: shift only pending requests "
                            "(`accepted[meta['rows']] * meta['pending']`)"),
        "off_by_one": (applied(delta + meta["pending"]),
                       "you shifted by 1 + accepted: the host already counted the in-flight round's one token; "
                       "only the accepted drafts are missing"),
        "slots_shifted": (applied(delta, slots="add"),
                          "you added the shift to the old slots: a position that crosses into the next block "
                          "lives in another block, so recompute slots through the block table"),
        "first_token_only": (applied(delta, first_only=True),
                             "you moved only each request's first token: every one of its 1 + k query tokens "
                             "moves (expand the per-request shift to tokens)"),
        "block_size_hardcoded": (applied(delta, bs=4) if block_size != 4 else None,
                                 f"these are the slots for blocks of 4: use the `block_size` argument (the engine "
                                 f"runs with 16, this case with {block_size})"),
    }


def _judge_case(fn, meta, accepted, block_size, expected, label: str) -> Verdict | None:
    before = {n: meta[n].tolist() for n in _FIELDS}
    variants = _variants(meta, accepted, block_size)
    fn(meta, accepted, block_size)
    got = {n: meta[n].tolist() for n in _FIELDS}
    if got == expected:
        return None
    if got == before:
        wrong = next(n for n in _FIELDS if got[n] != expected[n])
        return _fail("stale", f"{label}: {wrong} is {got[wrong]}, expected {expected[wrong]} (still the host's stale "
                              f"values): change the tensors in `meta` in place (`+=`, `.copy_`), do not build "
                              f"new ones")
    for category, (result, why) in variants.items():
        if result is not None and got == result:
            wrong = next(n for n in _FIELDS if got[n] != expected[n])
            return _fail(category, f"{label}: {wrong} is {got[wrong]}, expected {expected[wrong]}: {why}")
    for name in _FIELDS:
        if got[name] != expected[name]:
            return _fail(name, f"{label}: {name} is {got[name]}, expected {expected[name]}: {_WHY[name]}")
    return None


@_guarded(lambda: _start({"num_draft_tokens": DRAFTS}, {}), _reference)
def check_correction(correct_seqlens_qk) -> Verdict:
    """Exercise 4: ``correct_seqlens_qk(meta, accepted, block_size)`` fixes meta in place.

    Three hand-made cases (the worked case; one request not pending; blocks of 8), then
    a ZOS engine with 3 drafts per round whose text must equal plain greedy decoding.
    """
    meta, accepted, expected = worked_case()
    cases = [(meta, accepted, 4, expected, "in the worked case")]
    for block_size, pending, label in ((4, [0, 1, 1], "with request 0 not pending (pending = [0, 1, 1])"),
                                       (8, [1, 1, 1], "with block_size = 8")):
        m, a = _case(block_size, pending)
        want = {n: t.clone() for n, t in m.items()}
        kernels.correct_seqlens_qk(want, a, block_size)
        cases.append((m, a, block_size, {n: want[n].tolist() for n in _FIELDS}, label))
    for meta, accepted, block_size, expected, label in cases:
        try:
            verdict = _judge_case(correct_seqlens_qk, meta, accepted, block_size, expected, label)
        except NotImplementedError:
            return _not_implemented("`correct_seqlens_qk`")
        except Exception as err:  # noqa: BLE001
            return _fail("raised", f"{label} your correction raised {type(err).__name__}: {err}")
        if verdict is not None:
            return verdict
    try:
        verdict = _stays_on_device(correct_seqlens_qk)
    except Exception as err:  # noqa: BLE001
        return _fail("raised", f"with 6 requests instead of 3 your correction raised {type(err).__name__}: {err}")
    if verdict is not None:
        return verdict
    engine = _engine(num_draft_tokens=DRAFTS)
    try:
        outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, correction=correct_seqlens_qk)
    except Exception as err:  # noqa: BLE001
        return _fail("engine_error", f"in the engine (block_size {engine.config.block_size}, {DRAFTS} drafts, "
                                     f"batches of 1 to 3 requests) your correction failed on the device: "
                                     f"{type(err).__name__}: {err}")
    diff = _compare([c.token_ids for c in outs], _reference())
    if diff:
        return _fail("engine_mismatch", f"with your correction in ZOS + speculation ({DRAFTS} drafts), {diff}")
    return Verdict(True, f"the three cases are right and ZOS + speculation (k={DRAFTS}) matches plain greedy "
                         f"decoding; {engine.stats['mean_accepted_per_round']:.2f} drafts accepted per "
                         f"request-round")


CORRECTED = {"seqlens_k", "positions", "slot_mapping", "input_ids"}
UNCHANGED = {"seqlens_q", "cu_seqlens_q", "block_tables", "rows"}
DERIVED = {"cu_seqlens_k"}  # taught in notebook 01: the running sum of seqlens_k, so it moves too
INPUTS = {"pending"}  # shown in the worked case: says whether to correct a row, never corrected itself


_MAX_ITEMS = 1000


class _TooLong(Exception):
    pass


def _bounded_list(items) -> list:
    """``list(items)``, but an endless iterator stops after _MAX_ITEMS (``list`` would spin in C,
    out of reach of the time limit)."""
    out = list(itertools.islice(iter(items), _MAX_ITEMS + 1))
    if len(out) > _MAX_ITEMS:
        raise _TooLong
    return out


@_guarded()
def check_metadata_answer(answer) -> Verdict:
    """Try-it: which metadata must be corrected when the previous round accepted one draft?"""
    if answer is None or answer is NotImplemented:
        return _not_implemented("the set of field names")
    shape = 'a set of field names as strings, e.g. {"seqlens_q", "rows"}'
    if isinstance(answer, (str, bytes)):
        return _fail("shape", f"write {shape}, not one string ({answer!r}): a string is read letter by letter")
    try:
        names = _bounded_list(answer)
    except _TooLong:
        return _fail("shape", f"write {shape}; yours gave more than {_MAX_ITEMS} items (an endless iterator?)")
    except TypeError:
        return _fail("shape", f"write {shape}; got {type(answer).__name__} {answer!r}")
    if not all(isinstance(a, str) for a in names):
        odd = next(a for a in names if not isinstance(a, str))
        return _fail("shape", f"write {shape}; {odd!r} is a {type(odd).__name__}, not a field name")
    answer = set(names)
    if answer & INPUTS:
        return _fail("input_field",
                     f"`pending` does not change: it is one of the correction's inputs (which rows had a round in "
                     f"flight when this one was prepared, as in the worked case), not a length the device must "
                     f"correct. Leave it out and name the fields that move when a draft is accepted")
    unknown = answer - CORRECTED - UNCHANGED - DERIVED
    if unknown:
        return _fail("unknown_field", f"not a metadata field of the batch: {sorted(unknown)}; choose from "
                                      f"{sorted(CORRECTED | UNCHANGED | DERIVED)}")
    missing, extra = CORRECTED - answer, answer & UNCHANGED
    if missing:
        return _fail("missing_field",
                     f"also stale: {sorted(missing)} (hint: what depends on where the sequence ends?)")
    if extra:
        return _fail("unchanged_field", f"{sorted(extra)} do not change: each decode request still feeds 1 + k "
                                        f"tokens and its blocks were reserved at admission")
    aside = (". And yes, cu_seqlens_k moves with seqlens_k (it is their running sum): the toy reads keys "
             "through block tables and never builds it, but an engine that packs keys must correct it too"
             if "cu_seqlens_k" in answer else
             ". (cu_seqlens_k, the running sum of seqlens_k from notebook 01, would move too; the toy never "
             "builds it)")
    return Verdict(True, "seqlens_k, positions and slot_mapping shift by the accepted count; input_ids take "
                         "the bonus token and new drafts from the device" + aside)


# ------------------------------------------------------------------ three rounds

def expected_three_rounds() -> list[tuple[str, int]]:
    """What the host issues in a ZOS run of one prefill and three decode rounds."""
    engine = _engine()
    engine.generate(["Once upon a time"], max_new_tokens=4)
    rename = {"launch_forward": "forward", "launch_sample": "sample"}
    return [(rename.get(s.stage, s.stage), s.round) for s in engine.timeline.lane("host")
            if s.round and s.stage in ("launch_forward", "launch_sample", "postprocess", "flush")]


@_guarded(_engine)
def check_three_rounds(order) -> Verdict:
    """Try-it: the order of forward / sample / postprocess / flush for decode rounds 1-3."""
    if order is None or order is NotImplemented:
        return _not_implemented("the list of (stage, round) pairs")
    shape = 'a list of (stage, round) pairs, e.g. [("forward", 1), ("sample", 1), ...]'
    if isinstance(order, (str, bytes)):
        return _fail("shape", f"write {shape}, not one string: each step is a pair of a stage name (a string) "
                              f"and a round number")
    try:
        items = _bounded_list(order)
    except _TooLong:
        return _fail("shape", f"write {shape}; yours gave more than {_MAX_ITEMS} items (an endless iterator?)")
    except TypeError:
        return _fail("shape", f"write {shape}; got {type(order).__name__} {order!r:.60}")
    order = []
    for item in items:
        try:
            stage, rnd = item if not isinstance(item, (str, bytes)) else (None, None)
            if not isinstance(stage, str) or isinstance(rnd, bool):
                raise TypeError
            order.append((stage, operator.index(rnd)))
        except (TypeError, ValueError):
            return _fail("shape", f"write {shape}; {item!r:.60} is not a (stage, round) pair of a string and "
                                  f"an integer")
    expected = expected_three_rounds()
    if order == expected:
        return Verdict(True, "that is the order the engine just recorded: " +
                       ", ".join(f"{s} {r}" for s, r in expected))
    if any(r == 0 for _, r in order):
        return _fail("includes_prefill", "leave out round 0: it is the prefill, processed at once before round 1 "
                                         "is scheduled")
    for i, (got, want) in enumerate(zip(order, expected)):
        if got != want:
            category, why = "order", ""
            if want[0] == "postprocess" and got[0] == "sample":
                category, why = "sample_before_postprocess", (
                    ": the previous step is processed after this forward is launched, before this sample "
                    "(the sample may need the tokens it commits, as the title-case demo of notebook 03a shows)")
            elif want[0] == "flush":
                category, why = "no_flush", ": the last round has no next round to hide under, so it is flushed"
            elif got[0] == "flush" and want == ("sample", got[1]):
                category, why = "flush_before_sample", (
                    f": round {got[1]} is the last round, and it is flushed, but only after its sample is "
                    f"launched: a step can be processed only once it exists")
            elif got[0] == "flush":
                category, why = "flush_mid_run", (": a flush is only for the last round, when no next round is "
                                                  "left to hide it under; the others are postprocessed")
            elif got[0] == "forward" and want == ("sample", got[1] - 1):
                category, why = "forward_before_sample", (
                    f": round {got[1]}'s forward needs round {got[1] - 1}'s sampled token as its input (it stays on "
                    f"the device, FROM_DEVICE), so round {got[1] - 1}'s sample is launched first, and the host "
                    f"plans round {got[1]} only after that")
            elif got[0] in ("postprocess", "flush") and want[0] == "forward":
                category, why = "serial_order", (": a decode step is processed in the next round, after that "
                                                 "round's forward is launched, not in its own")
            return _fail(category, f"step {i}: you wrote {got}, the engine did {want}{why}")
    return _fail("length", f"you listed {len(order)} steps, the engine did {len(expected)}: each round is launched "
                           f"once (forward, sample) and processed once (postprocess or flush)")


# ------------------------------------------------------------------ ownership / lifetime

class _StepWatch:
    """Records what a learner's ``process_outputs`` did to each step it was given: which
    events it waited on, and each request's launched-round count and cache before/after."""

    def __init__(self, engine: Engine, process_outputs):
        self.engine, self.learner, self.calls = engine, process_outputs, []

    def __call__(self, engine: Engine, step) -> None:
        reqs = tuple(step.plan.requests)  # a copy: the learner's code may change the plan's list
        call = dict(step=step, requests=reqs, waits=[], before=[(r.num_inflight, r.finished) for r in reqs],
                    after=None, holders={b: r.index for r in engine.requests for b in r.blocks})
        self.calls.append(call)
        record, first = engine.record, len(engine.record.events)
        try:
            self.learner(engine, step)
        except BaseException:
            call["raised"] = True  # judged by the exception (the engine then recovers)
            raise
        finally:
            clock, events = engine.timeline.ns_to_ms, record.events[first:]
            call["waits"] = [(w.seq, clock(w.start_ns), clock(w.end_ns), w.round) for w in events
                             if isinstance(w, Wait)]
            call["commits"] = [c for c in events if isinstance(c, Commit)]
            call["frees"] = [f for f in events if isinstance(f, Free)]
            call["refused"] = [r for r in events if isinstance(r, Refused)]
            call["plan_changed"] = tuple(step.plan.requests) != reqs
            call["after"] = [(r.num_inflight, r.finished, bool(r.blocks), r in engine.scheduler.running)
                             for r in reqs]


def _engine_frames(err: BaseException) -> set[str]:
    """Names of the engine's functions on ``err``'s traceback."""
    names, tb = set(), err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _ENGINE_FILE:
            names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


_ENGINE_FILE = inspect.getsourcefile(Engine)


def _who_step(step) -> str:
    kind = "prefill" if step.plan.is_prefill else "decode"
    return f"round {step.plan.round} ({kind}, prompts {[r.index for r in step.plan.requests]})"


def _step_mistake(call) -> Verdict | None:
    """The first rule a single call broke: wait on the step's own event, commit once, free
    exactly the finished requests no launched round uses."""
    step, who = call["step"], _who_step(call["step"])
    later = [seq for seq, _, _, _ in call["waits"] if seq > step.sample_done.seq]
    if later:
        return _fail("waits_later_event", who)  # the message, with its cost, is written by the caller
    earlier = [rnd for seq, _, _, rnd in call["waits"] if seq < step.sample_done.seq]
    if earlier and all(seq != step.sample_done.seq for seq, _, _, _ in call["waits"]):
        return _fail("waits_other_event",
                     f"{who}: your process_outputs waited on another step's event (one of round {earlier[-1]}) "
                     f"instead of this step's own `step.sample_done`: round {step.plan.round}'s sample may still "
                     f"be writing the tokens you then read. Wait on the `sample_done` of the step you were given")
    early = [r for r in call["refused"] if r.buffer.startswith("out")]
    if early and not call.get("raised"):
        return _fail("read_before_wait",
                     f"{who}: you read the step's sampled tokens (`{early[0].buffer}`) before waiting on its "
                     f"completion event; the race checker refused that read, and your code caught the error and "
                     f"read again after a wait. The refusal is the bug: with race checking off (benchmarks, a "
                     f"real GPU) the first read returns whatever the slot held. Wait on `step.sample_done` "
                     f"first: the wait is the permission to read")
    holders = call["holders"]
    for free in call["frees"]:
        prompts = sorted({holders[b] for b in free.blocks if b in holders})
        if free.double:
            return _fail("double_free",
                         f"{who}: your process_outputs freed the KV blocks of prompt(s) {prompts} a second time "
                         f"(blocks {list(free.double)} were already free). The engine refused it, but a pool that "
                         f"took them back twice would hand one block to two requests. Free each finished request "
                         f"once: `engine.scheduler.release_if_done(req)` frees only what is still held")
        if free.in_use:
            rnd, stage = free.in_use[0]
            swallowed = " (the race checker refused it; catching its error does not make the free safe)" \
                if free.refused and not call.get("raised") else ""
            return _fail("free_in_use",
                         f"{who}: you freed the KV cache of prompt(s) {prompts} (blocks {sorted(free.blocks)}) "
                         f"while round {rnd}'s `{stage}`, launched and not yet waited for, still uses it{swallowed} "
                         f"(the extra step: under ZOS the finished request is already in the next launched round). "
                         f"Free a finished request only when `req.num_inflight == 0`")
    if call.get("raised"):
        return None  # judged by its exception
    reqs = call["requests"]
    commits = [c for c in call["commits"] if c.round == step.plan.round]
    if len(commits) > 1:
        return _fail("committed_twice",
                     f"{who}: your process_outputs had the step committed {len(commits)} times (prompts "
                     f"{[r.index for r in reqs]}); a second commit would add its tokens twice. Call "
                     f"`engine.commit_outputs(step, out)` exactly once per step")
    if call["plan_changed"]:
        return _fail("plan_changed",
                     f"{who}: your process_outputs changed `step.plan.requests`. The plan is the record of what "
                     f"was launched in round {step.plan.round}: its output slot holds one row per request in it, "
                     f"in that order, so `commit_outputs` needs it whole. Leave the plan alone and decide per "
                     f"request what to free after committing")
    for req, (n0, _), (n1, finished, holds, running) in zip(reqs, call["before"], call["after"]):
        if not commits:
            return _fail("never_committed",
                         f"{who}: after your process_outputs, prompt {req.index} still counts round "
                         f"{step.plan.round} as launched and unprocessed: the step's tokens were never committed. "
                         f"Call `engine.commit_outputs(step, out)` once per step")
        if n1 != n0 - 1:
            return _fail("inflight_changed",
                         f"{who}: prompt {req.index}'s count of launched, unprocessed rounds went from {n0} to "
                         f"{n1} in your process_outputs, though the step was committed once. `commit_outputs` "
                         f"already lowers `num_inflight` by one per request; changing it yourself makes the host's "
                         f"plan for the next rounds wrong (how many tokens are in flight). Leave it to the commit")
    for req, (_, finished, holds, running) in zip(reqs, call["after"]):
        if not finished and not running:
            return _fail("freed_unfinished",
                         f"{who}: your process_outputs freed prompt {req.index}, which is not finished: it "
                         f"lost its batch row and cache and can never produce its next tokens. Free only "
                         f"finished requests (`req.finished and req.num_inflight == 0`)")
    for req, (n1, finished, holds, running) in zip(reqs, call["after"]):
        if finished and n1 == 0 and holds:
            return _fail("kept_blocks",
                         f"{who}: prompt {req.index} is finished and no launched round uses it any more "
                         f"(num_inflight == 0), but it still holds its KV blocks and batch row after your "
                         f"process_outputs: free it after committing (`engine.scheduler.free(req)` or "
                         f"`engine.scheduler.release_if_done(req)`), or waiting requests never start")
    return None


def _overlap_lost(engine: Engine, waits) -> tuple[int, int]:
    """Deferred decode steps, and how many of them lost their overlap: the host's wait for
    step N returned only after round N+1's forward had finished on the device.  ``waits``
    holds (round, wait start, wait end) in ms for each processed step."""
    forward_end = {s.round: s.end_ms for s in engine.timeline.lane("device") if s.stage == "forward"}
    prefill = set(engine.timeline.meta["prefill_rounds"])
    steps = lost = 0
    for rnd, start, end in waits:
        if rnd in prefill or rnd + 1 not in forward_end or start > forward_end[rnd + 1]:
            continue  # a prefill, or processed when nothing was left to overlap with (a flush)
        steps += 1
        lost += end >= forward_end[rnd + 1]
    return steps, lost


@_guarded(_engine)
def check_process_outputs(process_outputs) -> Verdict:
    """Exercise 5: ``process_outputs(engine, step)`` waits, reads, commits and frees."""
    engine = _engine()
    reference = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, stop=[" the"])
    ref_idle = engine.stats["decode_device_idle_fraction"]
    ref_cost = _overlap_lost(engine, [(s.round, s.start_ms, s.end_ms) for s in engine.timeline.lane("host")
                                      if s.stage == "wait"])
    watch, attributes = _StepWatch(engine, process_outputs), set(vars(engine))
    try:
        outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, stop=[" the"], process_outputs=watch)
        err = None
    except NotImplementedError:
        return _not_implemented("`process_outputs`")
    except Exception as exc:  # noqa: BLE001 - judged below
        outs, err = None, exc
    finally:
        edits = _shadowing(engine, attributes)
        _forget_edits(engine, attributes)
    if edits:
        return _fail("edits_engine",
                     f"your process_outputs set `engine.{edits[0]}`: the checkers' engines are shared by every "
                     f"check, so a plug-in may call the engine's methods but not replace them (the change was "
                     f"undone). Try such experiments on an engine of your own, `Engine(EngineConfig(...))`")
    mistake = next((m for m in map(_step_mistake, watch.calls) if m is not None), None)
    if mistake is not None and mistake.category == "waits_later_event":
        steps, lost = _overlap_lost(engine, [(c["step"].plan.round, c["waits"][0][1], c["waits"][-1][2])
                                             for c in watch.calls if c["waits"]])
        idle = engine.stats.get("decode_device_idle_fraction", 0.0)
        mistake.message = (
            f"{mistake.message}: your process_outputs waited on an event recorded after the step's sample "
            f"(`engine.device.synchronize()`, or a freshly recorded event) instead of `step.sample_done`. The "
            f"tokens are right, but the host now also waits for the next round's forward before it commits: in "
            f"this run {lost} of {steps} deferred decode steps were no longer overlapped with the next forward "
            f"(the engine's own process_outputs, just before: {ref_cost[1]} of {ref_cost[0]}), and the device "
            f"was idle {idle:.0%} of the decode phase (vs {ref_idle:.0%}). Wait on exactly "
            f"`step.sample_done`: it covers the step's sample and nothing after it")
        return mistake
    if mistake is not None:
        return mistake
    if isinstance(err, RaceError):
        call = watch.calls[-1] if watch.calls else {}
        who = _who_step(call["step"]) if call else f"round {err.round}"
        if err.kind == "buffer" and err.buffer.startswith("out"):
            return _fail("read_before_wait",
                         f"{who}: you read the step's sampled tokens (`{err.buffer}`) before waiting on its "
                         f"completion event (`step.sample_done`): round {err.round}'s `{err.launch}` may still be "
                         f"writing them. The wait is the permission to read: wait first")
        if err.kind == "free_in_use":
            owners = sorted({call["holders"][b] for b in err.blocks if b in call.get("holders", {})})
            return _fail("free_in_use",
                         f"{who}: you freed the KV cache of prompt(s) {owners} (blocks {err.blocks}) while round "
                         f"{err.round}'s `{err.launch}`, launched and not yet waited for, still uses it (the "
                         f"extra step: under ZOS the finished request is already in the next launched round). "
                         f"Free a finished request only when `req.num_inflight == 0`")
        return _fail("race", f"{who}: the race checker stopped the run ({err.kind}): {err}")
    if isinstance(err, StepProcessedTwice):
        call = watch.calls[-1] if watch.calls else {}
        who = _who_step(call["step"]) if call else f"round {err.round}"
        return _fail("committed_twice",
                     f"{who}: your process_outputs had the step committed 2 times (prompts "
                     f"{err.prompt_indexes}); the engine refused, since the tokens would be added twice. Call "
                     f"`engine.commit_outputs(step, out)` exactly once per step")
    if isinstance(err, EngineStalled):
        return _fail("stalled", f"the engine could not go on ({err.reason}, prompts {err.prompt_indexes}): {err}")
    if isinstance(err, RecursionError):
        called = "flush" if _engine_frames(err) & {"flush"} else "process_outputs"
        via = " (`flush` processes the step through `process_outputs`)" if called == "flush" else ""
        return _fail("calls_itself",
                     f"your process_outputs called `engine.{called}(step)`{via}: in this run the engine's "
                     "`process_outputs` calls *your* function (that is how it is plugged in), so each call started "
                     "another one until Python gave up (RecursionError). Do the steps yourself: "
                     "`engine.device.wait(step.sample_done)`, `engine.read_outputs(step)`, "
                     "`engine.commit_outputs(step, out)`, then free what is finished")
    if err is not None:
        return _fail("raised", f"your process_outputs raised {type(err).__name__}: {err}")
    diff = _compare([c.token_ids for c in outs], [c.token_ids for c in reference])
    if diff:
        return _fail("wrong_tokens", f"{diff}: commit every step's tokens exactly once, from its own output slot")
    leaked = [r.index for r in engine.requests if r.blocks]
    if leaked:
        return _fail("kept_blocks", f"prompts {leaked} finished but kept their KV blocks at the end of the run: "
                                    f"free them once no launched round uses them")
    return Verdict(True, "each step's results are read only after waiting on its own event, committed once, "
                         "and caches are freed as soon as no launched round can touch them")
