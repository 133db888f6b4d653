"""One run of a learner's code as the host's order of stages, read from the device's record
(:class:`HostLog`), and the rules that order must keep: those of either loop, the serial
loop's, the ZOS loop's, and what waiting on more than a step's own event costs.  A rule
returns the Verdict of the first round that breaks it, or None.
"""

from __future__ import annotations

from collections import Counter

from toy_engine.engine import Engine
from toy_engine.record import Commit, Free, Launch, Refused, Schedule, Wait

from . import endings
from .plan_order import plan_order, planned_early
from .pool import CONSTRAINT, MAX_NEW_TOKENS, PROMPTS
from .verdict import Verdict, fails


class HostLog:
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
        # calls, refused ones too (a second sample's mask write races the first's read)
        self.sample_calls = Counter(s.round for s in timeline.lane("host")
                                    if s.stage == "launch_sample")
        self.events, self.launches, planned = [], {}, 0
        self.constraint = engine.config.constraint  # None in the runs without one
        self.found_plan: set[int] = set()  # the events of schedule() calls that returned a plan
        for e in record.events:
            if isinstance(e, Schedule):  # one that found nothing belongs to the last planned round
                planned = planned if e.round is None else e.round
                if e.round is not None:
                    self.found_plan.add(len(self.events))
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
        self.corrections = Counter(e.round for e in record.of(Launch) if e.stage == "correct")
        self.device_order = [(e.stage, e.round) for e in record.of(Launch)
                             if e.stage in ("correct", "forward", "sample")]
        self.refused = record.of(Refused) + [f for f in record.of(Free) if f.refused]
        self.prefill = set(timeline.meta.prefill_rounds)
        # the rounds `prepare_inputs` was called for, in order, refused calls too
        self.prepare_calls = [s.round for s in timeline.lane("host") if s.stage == "prepare"]
        self.plans = plans
        self.rounds = sorted({r for s, r in self.events if s in ("prepare", "launch_forward", "launch_sample")})
        self.requests = engine._run.requests  # the run's, in prompt order, as they ended
        self.other_thread = engine._run.other_thread  # a stage refused in a thread it started
        self.committed: dict[int, list[int]] = {}  # prompt -> the rounds whose tokens it was handed
        for commit in record.of(Commit):
            for prompt in commit.prompts if not commit.refused else ():
                self.committed.setdefault(prompt, []).append(commit.round)
        # the serial completions of the same workload, where the checker has them
        self.reference = None

    def stopped_at(self, indexes) -> str:
        """How prompts ``indexes`` should have ended and where they stopped (" ..." or "")."""
        if self.reference is None or not indexes:
            return ""
        return f" ({endings.stopped_at(self.requests, self.reference, indexes)})"

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


def common_mistakes(log: HostLog) -> Verdict | None:
    """Mistakes either loop can make: launches out of order or twice, a plan dropped,
    a step processed twice."""
    last = max(log.rounds, default=-1)
    for r in log.rounds:
        fwd, smp, done = log.pos("launch_forward", r), log.pos("launch_sample", r), log.processing(r)
        if smp and (not fwd or smp[0] < fwd[0]):
            return sample_before_forward(log, r, "came before `launch_forward`" if fwd else
                                         "was called but `launch_forward` never was")
        calls = max(len(smp), log.sample_calls[r])
        if len(fwd) > 1 or calls > 1:
            stage = "launch_forward" if len(fwd) > 1 else "launch_sample"
            refused = (" (the engine refused each call after the first: it rewrites the round's "
                       "constraint mask while the first sample still reads it)"
                       if len(fwd) < 2 and calls > len(smp) else "")
            return fails("launched_twice",
                         f"{log.who(r)}: `{stage}` was called {max(len(fwd), calls)} times"
                         f"{refused}. Each round is launched once: one forward, one sample, and "
                         f"its step processed once")
        if log.corrections[r] > 1:
            return fails("launched_twice",
                         f"{log.who(r)}: `correct_on_device` was called {log.corrections[r]} times. A "
                         f"round's lengths are corrected once, by the drafts the round in flight "
                         f"accepts: each further correction adds them again")
        if len(done) > 1:
            stages = " and ".join(f"`{log.events[i][0]}`" for i in done)
            return fails("processed_twice",
                         f"{log.who(r)}: its step was processed {len(done)} times ({stages}). Processing "
                         f"commits the step's tokens and lowers each request's count of launched rounds, so a "
                         f"second time corrupts both. Process each StepState once; in the ZOS loop, clear "
                         f"`previous` once it is processed (`previous = engine.flush(previous)`, and "
                         f"`previous = None` after a prefill)")
    dropped = plan_order(log, last)  # a Verdict that fails is falsy: no `or`
    return corrected_launched_round(log) if dropped is None else dropped


def sample_before_forward(log: HostLog, r: int, what: str) -> Verdict:
    """Round ``r``'s sample launched (or, refused by the engine, asked for) before its forward."""
    return fails("sample_before_forward",
                 f"{log.who(r)}: `launch_sample` {what}. Sampling picks tokens from the logits "
                 f"that the round's forward computes, so the forward must be launched first (the "
                 f"engine refuses a sample whose forward was not launched)")


def corrected_launched_round(log: HostLog) -> Verdict | None:
    """A correction given the inputs of a round whose forward and sample were launched already.
    Notebook 03: "`engine.correct_on_device(inputs)` | fixes stale lengths on the device; needed
    before `launch_forward`": the inputs of the round about to be launched."""
    sampled = set()
    for i, (stage, r) in enumerate(log.device_order):
        if stage == "sample":
            sampled.add(r)
        if stage != "correct" or r not in sampled:
            continue
        after = next((f", just before round {n}'s forward" for s, n in log.device_order[i + 1:]
                      if s == "forward"), "")
        return corrected_old_inputs(log, r, after)
    return None


def corrected_old_inputs(log: HostLog, r: int, after: str) -> Verdict:
    """``correct_on_device`` given the inputs of round ``r``, already launched (``after``: when)."""
    return fails("correction",
                 f"{log.who(r)}: `engine.correct_on_device` was given round {r}'s inputs "
                 f"after that round's forward and sample had been launched{after}. It fixes "
                 f"the lengths of the round about to run: call it with this iteration's "
                 f"`inputs`, right before `engine.launch_forward(inputs)`")


def prepared_twice(log: HostLog, r: int, latest: int) -> Verdict:
    """``prepare_inputs`` was given round ``r``'s plan again (the engine refused it), after
    round ``latest``'s was scheduled."""
    if latest > r:
        return fails("prepared_twice",
                     f"{log.who(r)}: your loop gave `prepare_inputs` its plan again after "
                     f"`engine.schedule()` had returned round {latest}'s plan, so round "
                     f"{latest}'s plan never ran (the engine refused the call). Prepare the plan "
                     f"this iteration's `engine.schedule()` returned, not one kept from an "
                     f"earlier round")
    return fails("prepared_twice",
                 f"{log.who(r)}: `prepare_inputs` was called twice for the same plan. Each call "
                 f"writes the round's metadata into the round's host buffer slot and launches an "
                 f"upload that reads it, so the second call would rewrite the slot while the first "
                 f"upload may still be reading it (the engine refused it). Prepare each plan once "
                 f"and launch with those inputs")


def serial_order(log: HostLog) -> Verdict | None:
    """The serial rule: each step processed before the next round is scheduled."""
    for r in log.rounds:
        done, nxt, planned = log.processing(r), log.first("prepare", r + 1), log.first("schedule", r + 1)
        if done and planned is not None and nxt is not None and planned < done[0] < nxt:
            return fails("scheduled_before_processing",
                         f"{log.who(r)}: round {r + 1} was scheduled before round {r}'s results were processed. "
                         f"The plan was made from stale state: a request that finished in round {r} (a stop, "
                         f"its last token) is still in round {r + 1}'s plan and gets a wasted extra step. The "
                         f"serial loop processes each step before it asks `engine.schedule()` for the next "
                         f"round: that is what makes its plans exact")
        if done and nxt is not None and done[0] > nxt:
            return fails("not_serial",
                         f"{log.who(r)}: its results were processed after round {r + 1} was prepared and "
                         f"launched. That is the overlapped (ZOS) order of notebook 03a; the serial loop "
                         f"processes each step (`engine.process_outputs(step)`) before scheduling the next "
                         f"round, so that no launch of round {r + 1} comes before round {r}'s results")
    return None


def deferred(log: HostLog) -> int:
    """Decode steps processed under the next round: after its forward launch, before its sample."""
    count = 0
    for r in log.rounds:
        done, fwd, smp = log.processing(r), log.first("launch_forward", r + 1), log.first("launch_sample", r + 1)
        count += bool(done and fwd is not None and smp is not None and fwd < done[0] < smp)
    return count


def _zos_order(log: HostLog) -> Verdict | None:
    """The ZOS rules, round by round: prefill at once, decode deferred under the next
    forward and before the next sample, and processed when nothing is left to launch, each
    before the next round is planned (:func:`plan_order.planned_early`).  Which
    method processed a step (``process_outputs``, ``flush``, code written inline) does not
    matter here: a deferred step flushed where it belongs is judged last
    (:func:`plan_order.flushed_with_a_plan`)."""
    for r in log.rounds:
        done = log.processing(r)
        if done:
            verdict = _prefill_at_once(log, r, done[0]) if r in log.prefill else _decode_deferred(log, r, done[0])
            verdict = planned_early(log, r, done[0]) if verdict is None else verdict
            if verdict is not None:
                return verdict
    return None


def _prefill_at_once(log: HostLog, r: int, at: int) -> Verdict | None:
    """Processed before the next ``schedule()``: the scheduler must see the first tokens (a
    request that stops at its first token is scheduled again otherwise, for a wasted round)."""
    nxt_prep = log.first("prepare", r + 1)
    if nxt_prep is not None and at > nxt_prep:
        return fails("prefill_deferred",
                     f"{log.who(r)} was deferred (processed by `{log.events[at][0]}` during a later round). "
                     f"Prefill steps are processed at once, right after their sample launch: the "
                     f"first token reaches the request a round earlier, and there is little to hide")
    sample = log.first("launch_sample", r)
    if sample is not None and any(s == "schedule" for s, _ in log.between(sample, at)):
        return fails("prefill_deferred",
                     f"{log.who(r)} was processed only after the next `engine.schedule()`. Prefill "
                     f"steps are processed at once, right after their sample launch: the scheduler "
                     f"then plans the next round knowing the first tokens (a request that stops at "
                     f"its first token is otherwise scheduled again, for a wasted round)")
    return None


def _decode_deferred(log: HostLog, r: int, at: int) -> Verdict | None:
    nxt_prep = log.first("prepare", r + 1)
    if nxt_prep is None or at < nxt_prep:
        return _processed_before_next(log, r, at)
    fwd, smp = log.first("launch_forward", r + 1), log.first("launch_sample", r + 1)
    if fwd is None or at < fwd:
        return fails("process_before_forward",
                     f"{log.who(r)}: its results were processed before round {r + 1}'s forward was "
                     f"launched, so the device sat idle while the host waited and committed. Launch "
                     f"this round's forward first, then process the previous step")
    if smp is not None and at > smp and r + 1 in log.prefill:
        return fails("deferred_past_prefill",
                     f"{log.who(r)}: its step was still deferred when prefill {log.who(r + 1)} was launched, "
                     f"and it was processed only after that prefill's sample, a round late. A prefill round "
                     f"is a round like any other for the step deferred before it: process `previous` under "
                     f"the prefill's forward, before its sample, then the prefill's own step")
    if smp is not None and at > smp:
        return fails("sample_before_process",
                     f"{log.who(r)}: round {r + 1}'s sample was launched before round {r}'s results were "
                     f"processed (host order: launch_forward {r + 1} -> launch_sample {r + 1} -> "
                     f"postprocess {r}). Sampling may depend on the text committed so far (a grammar "
                     f"mask, a penalty): " + (
                         f"with the `{log.constraint}` constraint on, round {r + 1}'s mask was "
                         f"built without round {r}'s token" if log.constraint else
                         f"with the `{CONSTRAINT}` constraint of this check's first run, round "
                         f"{r + 1}'s mask would be built without round {r}'s token")
                     + ". The order is: this round's forward, the previous round's postprocess, "
                       "this round's sample")
    return None


def _processed_before_next(log: HostLog, r: int, at: int) -> Verdict | None:
    """A decode step processed before the next round was prepared: right only as the flush,
    when a schedule() since the step's forward (its sample changes no plan) found nothing to
    launch.  The engine records such a schedule under the last launched round (r), one that
    found a plan under the plan's round."""
    stage = log.events[at][0]
    schedules = [q for s, q in log.between(log.first("launch_forward", r), at) if s == "schedule"]
    found_plan = [q for q in schedules if q > r]
    if schedules and not found_plan:
        return None  # nothing was left to launch: processing it now is the flush, whatever its name
    # no round came after it to hide it under (round 35: a flush once none wants more)
    if not found_plan and not any(s == "launch_forward" for s, _ in log.events[at + 1:]):
        return None
    how = "flushed" if stage == "flush" else "processed"
    if found_plan:
        return fails("not_deferred",
                     f"{log.who(r)} was {how} right after `engine.schedule()` returned round "
                     f"{found_plan[0]}'s plan, before that round was prepared and its forward launched: "
                     f"the host waited for the step with the device idle, so nothing overlapped. Keep it as "
                     f"`previous` and process it after round {found_plan[0]}'s `launch_forward`, before "
                     f"its `launch_sample`" + ("; `flush` is only for when `schedule()` returns None"
                                               if stage == "flush" else ""))
    if stage == "flush":  # kept as `previous`, then flushed though a round came next
        return fails("not_deferred",
                     f"{log.who(r)} was flushed before `engine.schedule()` was asked for round "
                     f"{r + 1}, which then came: processed under round {r + 1}'s forward, it would "
                     f"have overlapped it. `flush` is only for when `engine.schedule()` returns "
                     f"None (nothing left to launch): ask for the next plan first")
    return fails("not_deferred",
                 f"{log.who(r)} was {how} before round {r + 1} was even scheduled (right after its own "
                 f"sample, or first thing in the next pass): no round was on the device to hide it under, "
                 f"so no decode step was deferred. Keep the StepState as `previous` and process it during "
                 f"the next round, after that round's forward launch")


def _overlapped(log: HostLog) -> Verdict | None:
    """Each decode round's successor forward must go in while the round's sample is still
    outstanding: a host wait on it (or on anything later) before that launch means the
    device had nothing queued behind the sample while the host waited."""
    for r in log.rounds:
        sample, forward = log.launches.get(("sample", r)), log.launches.get(("forward", r + 1))
        if r in log.prefill or sample is None or forward is None or forward.enqueued_before_waiting_for(sample):
            continue
        since = log.between(log.first("launch_forward", r), log.first("launch_forward", r + 1))
        if any(s == "schedule" and q <= r for s, q in since):  # its sample changes no plan
            continue  # a schedule found nothing to launch until round r was processed: nothing to overlap with
        wait = next((w for w in log.waits if w.seq >= sample.seq), None)
        on = (f"on round {wait.round}'s `{wait.stage}`" if wait is not None else "on the device")
        return fails("waits_before_forward",
                     f"{log.who(r)}: the host waited {on} before it launched round {r + 1}'s forward, so "
                     f"round {r + 1}'s forward went in only after round {r}'s sample had finished, and the "
                     f"device sat idle for as long as that wait, the commit and round {r + 1}'s preparation "
                     f"took. The tokens are right, but nothing overlapped: launch round {r + 1}'s forward "
                     f"first, and only then wait for round {r}'s results (processing them waits for exactly "
                     f"what it needs)")
    return None


def zos_overlapped(log: HostLog) -> Verdict | None:
    """The ZOS order first (its messages are the more specific), then the overlap itself."""
    verdict = _zos_order(log)
    return _overlapped(log) if verdict is None else verdict


def waits_beyond_sample(engine: Engine, log: HostLog) -> Verdict | None:
    """The host may wait only on a step's sample event: a wait on a later point (a
    ``device.synchronize()``, an event recorded after the next forward) also waits for
    launches the host has not processed, and the overlap is gone."""
    later = [w for w in log.waits if w.stage != "sample"]
    if not later:
        return None
    clock = engine.timeline.ns_to_ms
    waited = sum(clock(w.end_ns) - clock(w.start_ns) for w in later)
    idle = engine.stats.decode_device_idle_fraction
    engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)  # the engine's own zos_loop, for the cost
    ref_idle = engine.stats.decode_device_idle_fraction
    first = next((w for w in later if w.round not in log.prefill), later[0])
    deferred_rounds = {r for r in log.rounds if r not in log.prefill and r + 1 in log.rounds}
    lost = len(deferred_rounds & {w.round - 1 for w in later if w.stage in ("forward", "correct")})
    return fails("waits_later_event",
                 f"{log.who(first.round)}: the host waited on a device event that is not a step's `sample_done` "
                 f"({len(later)} such waits in this run: `engine.device.synchronize()`, or an event recorded "
                 f"after a launch), so it also waited for round {first.round}'s `{first.stage}`, which no "
                 f"processing needed yet. The tokens are right, but the overlap is lost: in this run {lost} of "
                 f"{len(deferred_rounds)} deferred decode steps were processed only after the next round's "
                 f"forward had finished (nothing left to hide them under), the host spent {waited:.1f} ms in "
                 f"those waits and the device was idle {idle:.0%} of the decode phase (the engine's own "
                 f"zos_loop on the same prompts, just after: {ref_idle:.0%}). Only "
                 f"`engine.process_outputs` needs to wait, and it waits only on its step's `sample_done`")


def correction_mistake(engine: Engine, log: HostLog) -> str:
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


def overlap_lost(engine: Engine, waits) -> tuple[int, int]:
    """Deferred decode steps, and how many of them lost their overlap: the host's wait for
    step N returned only after round N+1's forward had finished on the device.  ``waits``
    holds (round, wait start, wait end) in ms for each processed step."""
    forward_end = {s.round: s.end_ms for s in engine.timeline.lane("device") if s.stage == "forward"}
    prefill = set(engine.timeline.meta.prefill_rounds)
    steps = lost = 0
    for rnd, start, end in waits:
        if rnd in prefill or rnd + 1 not in forward_end or start > forward_end[rnd + 1]:
            continue  # a prefill, or processed when nothing was left to overlap with (a flush)
        steps += 1
        lost += end >= forward_end[rnd + 1]
    return steps, lost
