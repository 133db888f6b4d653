"""Lesson 02 (notebook 02_serial_engine, exercise 02_serial_loop): the serial engine.  The
device sits idle while the host works; the notebook's questions read those gaps off the
run's timeline, and the exercise's checkers run the learner's serial loop and idle-fraction
function on the shared engines.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections import defaultdict

from toy_engine import loops
from toy_engine.engine import Engine
from toy_engine.timeline import Timeline

from . import context, pool
from .answers import name, one_number, returned_real, show
from .errors import at, quoted
from .gap_mistakes import gap_mistakes, nearer_gap, round_extent
from .given_timeline import BuiltInRan, Given, built_in
from .harness import exercise_check, notebook_check
from .host_order import serial_order
from .learner_code import loop_verdict, run_loop
from .whose_loop import engine_loop
from .run_edits import run_verdict, serial_same_run
from .readings import (decimals, gap_in_microseconds, gap_in_seconds, hover_gaps, idle_slips, near,
                       no_gap, shortened, slip_reading)
from .verdict import Verdict, fails, not_implemented, passes, unanswered

__all__ = ["check_round_gap", "check_largest_host_stage", "check_overhead_gap", "host_ms_per_round",
           "host_cpu_ms_per_round", "check_serial_loop", "check_idle_fraction"]


# The one precision rule of check_round_gap: two decimals of a millisecond (as 03b says of its
# numbers), so a reading within half a hundredth of the gap is the gap, or of the gap as the
# hover gives it (start minus end, both to three decimals: readings.hover_gaps).
GAP_PRECISION_MS = 0.005


@notebook_check
@context.given(timeline=context.timeline("the serial run's timeline (engine.timeline)"),
               round=context.whole(0, context.BIG, "the round asked about (10)"))
def check_round_gap(gap_ms, timeline, round: int) -> Verdict:
    """Your turn (02): the device gap (ms) between the end of round ``round - 1``'s last
    device span and the start of round ``round``'s first one."""
    gap_ms = one_number(gap_ms, "set `gap_ms` to the gap in milliseconds", "write the gap as a number of milliseconds")
    if isinstance(gap_ms, Verdict):
        return gap_ms
    first_start, last_end = round_extent(timeline)
    if round not in first_start or round - 1 not in last_end:
        return fails("setup", f"this timeline has no rounds {round - 1} and {round} on its device lane")
    want = first_start[round] - last_end[round - 1]
    if near(gap_ms, want):
        return passes(f"{want:.3f} ms between the end of round {round - 1}'s sample and the start of round "
                      f"{round}'s upload: the device had nothing queued")
    # Written to the rule's two decimals, it passes even where another gap of the run lies as
    # near (0.82 matched the gap before round 9 too in a test run); written to more, an answer
    # that is another gap is named (0.426983 passed as 0.424478's neighbour, blind round 11).
    within = abs(gap_ms - want) <= GAP_PRECISION_MS
    hover = next((h for h in hover_gaps(want) if abs(gap_ms - h) <= GAP_PRECISION_MS + 1e-9), None)
    read = (f"within {GAP_PRECISION_MS} ms of the gap, {want:.3f} ms" if within or hover is None
            else f"within {GAP_PRECISION_MS} ms of start minus end as the hover shows them, "
                 f"{hover:.3f} ms (the gap is {want:.3f} ms)")
    close = (f"close: {gap_ms:g} ms is {read}: the check's one rule is two decimals of a "
             f"millisecond, from the hover or from the spans. It runs from the end of round "
             f"{round - 1}'s sample to the start of round {round}'s upload: the device had "
             f"nothing queued")
    if (within or hover is not None) and decimals(gap_ms) <= 2:
        return passes(close)
    if not within and abs(gap_ms * 1e3 - want) <= 1e-3 * abs(want):  # the very gap, in seconds
        return gap_in_seconds(gap_ms, want, GAP_PRECISION_MS)
    # to three decimals unless that would show a value the check passes (np.float16's 0.38 is
    # 0.37988, 0.00502 ms from a gap of 0.385: "0.380" would hide why it failed, blind round 13)
    shown = f"{gap_ms:.3f}" if float(f"{gap_ms:.3f}") == gap_ms else f"{gap_ms:.6g}"
    for value, category, why in gap_mistakes(timeline, round, want):
        if near(gap_ms, value):
            return fails(category, f"{shown} ms: {why}")
    other = nearer_gap(timeline, gap_ms, want, hover)
    if other is not None:  # blind round 51: round 25's gap, to the ns, passed as round 10's
        return fails("wrong_round", f"{shown} ms: that is the gap before round {other}, to "
                                    f"{decimals(gap_ms)} decimals; the question asks for the gap "
                                    f"before round {round}, {want:.3f} ms")
    if within:
        return passes(close)
    if gap_ms == 0:
        return no_gap(round)
    how = shortened(gap_ms, want)
    if how is not None:
        return fails("too_few_digits",
                     f"close: {gap_ms:.{decimals(gap_ms)}f} ms is the gap {how}, but "
                     f"the check's rule is two decimals (within {GAP_PRECISION_MS} ms). Read it "
                     f"to more digits: the hover shows start and end to three decimals, or "
                     f"subtract the two spans' times in code (timeline.lane(\"device\"))")
    # A short reading in seconds comes after the measured mistakes: a tiny one may be as near.
    for unit in (gap_in_seconds, gap_in_microseconds):  # a failing Verdict is falsy: no `or`
        verdict = unit(gap_ms, want, GAP_PRECISION_MS)
        if verdict is not None:
            return verdict
    return fails("wrong", f"{shown} ms is not the gap: take the start of round {round}'s first "
                          f"device span minus the end of round {round - 1}'s last device span "
                          f"(timeline.lane(\"device\"))")


HOST_WORK_STAGES = ("schedule", "prepare", "launch_forward", "launch_sample", "postprocess")
_DEVICE_STAGE_NAMES = ("upload", "correct", "forward", "sample")


def _per_round(timeline, cpu: bool) -> dict[str, float]:
    total, rounds = defaultdict(float), defaultdict(set)
    for span in timeline.lane("host"):
        if span.stage in HOST_WORK_STAGES:
            total[span.stage] += span.cpu_ms if cpu and span.cpu_ms is not None else span.duration_ms
            rounds[span.stage].add(span.round)
    return {stage: total[stage] / len(rounds[stage]) for stage in HOST_WORK_STAGES if rounds[stage]}


def host_ms_per_round(timeline) -> dict[str, float]:
    """Mean host wall-clock ms per round for each stage that is host work (waiting is not
    work).  Wall time includes any moment the host thread was ready but had no core."""
    return _per_round(timeline, cpu=False)


def host_cpu_ms_per_round(timeline) -> dict[str, float]:
    """Mean host CPU ms per round for each host-work stage: the CPU time the host thread
    itself used in the stage (``span.cpu_ms``), which a busy machine cannot inflate.  A span
    recorded without CPU time (the engine times ``schedule`` by the clock only) counts its
    wall time, an upper bound of its CPU time."""
    return _per_round(timeline, cpu=True)


def _table(per_round: dict[str, float]) -> str:
    return ", ".join(f"{s} {ms:.3f} ms" for s, ms in sorted(per_round.items(), key=lambda kv: -kv[1]))


@notebook_check
@context.given(timeline=context.timeline("the serial run's timeline (engine.timeline)"))
def check_largest_host_stage(answer, timeline) -> Verdict:
    """Predict (02): which host stage uses the most host CPU time per round (waiting
    excluded)?  CPU time, not wall time: on a busy machine the host thread can lose its core
    inside any stage, and that lost time lands in whichever stage it hit.  A wrong try is told
    where to look, never the ranking (the next cell prints it)."""
    if answer is None:
        return unanswered(f"set `largest` to one of {', '.join(repr(s) for s in HOST_WORK_STAGES)}")
    stage = name(answer)
    if stage is None:
        return fails("shape", f"write the stage's name as a string, e.g. \"schedule\", not {show(answer)}")
    cpu, wall = host_cpu_ms_per_round(timeline), host_ms_per_round(timeline)
    if not cpu:
        return fails("setup", "this timeline has no host spans: run the engine first")
    largest = max(cpu, key=cpu.get)
    if stage == largest:
        return passes(f"{largest} does the most host work per round here. Host CPU time per round: {_table(cpu)}")
    if stage == "wait":
        return fails("wait_is_not_work", "waiting is the host doing nothing: the question is about host work. "
                                         "Compare the other stages' CPU time (span.cpu_ms)")
    if stage in _DEVICE_STAGE_NAMES:
        return fails("device_stage",
                     f"{show(answer)} is a device stage; the host stages are {', '.join(HOST_WORK_STAGES)}")
    if stage not in cpu:
        return fails("not_a_stage", f"{show(answer)} is not a host stage of this run; choose from {', '.join(cpu)}")
    if stage == max(wall, key=wall.get):
        return fails("wall_time",
                     f"by wall-clock time {stage} took the longest on this run, but {wall[stage] - cpu[stage]:.3f} "
                     f"ms of its {wall[stage]:.3f} ms per round the host thread was waiting for a core (the machine "
                     f"was busy): the question asks for CPU time, span.cpu_ms")
    if stage.startswith("launch"):
        return fails("launch_only_queues", "a launch only queues work and returns: which stage computes something "
                                           "on the host before anything is launched? Compare span.cpu_ms")
    return fails("wrong", f"{stage} is not the stage with the most CPU time per round on this run: add up each host "
                          f"stage's span.cpu_ms over the run's rounds (waiting excluded) and compare")


@notebook_check
@context.given(overhead_ms=context.number(1e-3, 1e6, "the host overhead its run added (5.0 ms)"))
def check_overhead_gap(answer_ms, overhead_ms: float = 5.0) -> Verdict:
    """Predict (02): in the serial loop, how many ms longer does each round-boundary gap
    get when ``host_overhead_ms`` adds ``overhead_ms`` of host work per round?  The growth, not
    the new gap: 4 % of tolerance is less than the gap there already was (docs/measurements/checks.md)."""
    answer_ms = one_number(answer_ms, "set `longer_by_ms` to a number of milliseconds",
                           "write a number of milliseconds")
    if isinstance(answer_ms, Verdict):
        return answer_ms
    if abs(answer_ms - overhead_ms) <= 0.04 * overhead_ms + 1e-9:
        return passes(f"about {overhead_ms:g} ms: in the serial loop the device has nothing queued while "
                      f"the host works, so every millisecond of host work is a millisecond of device idle")
    if abs(1000 * answer_ms - overhead_ms) <= 0.04 * overhead_ms:
        return fails("seconds", f"{answer_ms:g} is in seconds: write the growth in milliseconds")
    if abs(answer_ms) <= 0.1 * overhead_ms:
        return fails("hidden_by_device", "the device cannot hide it: in the serial loop the next round is "
                                         "launched only after the host finishes its work")
    if answer_ms < 0:
        return fails("negative", "more host work cannot shorten the gap: the device waits for the host")
    if answer_ms < overhead_ms:
        return fails("partly_hidden", "none of the extra host work overlaps the device in the serial loop: "
                                      "is any part of it hidden?")
    if answer_ms <= overhead_ms + 3:
        return fails("new_gap", f"{answer_ms:g} ms is more than the work added: if you added the gap there already "
                                f"was, that is the new gap; the question asks by how much the gap grows")
    return fails("more_than_overhead", "the overhead is added once per round, in `schedule`: can a gap grow by "
                                       "more than the work added inside it?")


# ------------------------------------------------------------------ exercise 02

# exercise 02's runs: (second, endings, engine config)
_SERIAL_RUNS = ((False, False, {}), (True, False, {}), (False, True, {}),
                (False, True, {"num_draft_tokens": pool.DRAFTS}))
# One request for more rounds than any run above (48 at most): the notebook's loop runs "while
# `engine.scheduler.has_work()`", so a loop capped at the rounds of the workload it saw stops here.
_LONG_RUN = (["Once upon a time"], {"max_new_tokens": 50})


@functools.lru_cache(maxsize=1)
def _long_reference() -> tuple[tuple[int, ...]]:
    outs = pool.engine().generate(_LONG_RUN[0], loop=loops.serial_loop, **_LONG_RUN[1])
    return tuple(tuple(c.token_ids) for c in outs)  # immutable: see pool.Ended


@exercise_check(lambda: pool.start({}, {"num_draft_tokens": pool.DRAFTS}), pool.reference,
                lambda: pool.reference(second=True), pool.endings_reference, _long_reference,
                calls="serial_loop(engine)")
def check_serial_loop(loop) -> Verdict:
    """Exercise 2: ``loop(engine)`` runs the serial engine with the stage methods.  Five runs: the
    main one, where every request ends by length; a second whose requests end at a stop string
    at different rounds (so a loop that counts rounds or tokens fails); the endings run, whose
    requests end every way (EOS, stop, limit), without drafts and with them; one request for
    more rounds than any of those (a loop capped at a number of rounds fails)."""
    runs, logs = [], []
    for second, endings, config in _SERIAL_RUNS:
        engine, log, outs, err = run_loop(loop, second=second, endings=endings, **config)
        logs.append(log)
        verdict = _serial_run_verdict(log, outs, err, second,
                                      config.get("num_draft_tokens", 0) if endings
                                      else None)
        if verdict is None:
            verdict = serial_same_run(log, outs, second, endings, config)
        if verdict is not None:
            return verdict
        runs.append(engine.stats.rounds)
    _, log_long, outs, err = run_loop(loop, workload=_LONG_RUN)
    verdict = _serial_run_verdict(log_long, outs, err, False, None, _long_reference())
    if verdict is not None:
        verdict.message = (f"in a longer run (the prompt {_LONG_RUN[0][0]!r} alone, "
                           f"{_LONG_RUN[1]['max_new_tokens']} new tokens, one round each): "
                           f"{verdict.message}")
        return verdict
    verdict = engine_loop([*logs, log_long], "serial")
    if verdict is not None:
        return verdict
    note = ""
    if any(stage == "flush" for stage, _ in log.events):
        note = (" (your loop processes each step with `engine.flush`, so the timeline names that work `flush`, "
                "ZOS's name for processing a last step, where the engine's serial loop records `postprocess`)")
    return passes(f"your serial loop's runs are the reference's, round for round: "
                  f"{len(pool.PROMPTS)} prompts, {runs[0]} rounds, a "
                  f"second run whose prompts end at a stop string, {runs[1]} rounds, and runs "
                  "whose requests "
                  f"end on EOS, a stop string and the limit ({runs[2]} rounds, {runs[3]} with "
                  "drafts); every "
                  f"step processed before the next round{note}")


def _serial_run_verdict(log, outs, err, second: bool, drafts: int | None,
                        reference=None) -> Verdict | None:
    """What one run of a learner's serial loop got wrong, or None (``second``: the stop-string run;
    ``drafts``: None, or the endings run's drafts per round; ``reference``: another run's
    tokens)."""
    verdict = loop_verdict(log, err, "serial", serial_order)
    extra = [w for w in log.waits if w.stage != "sample"]
    if verdict is None and extra:
        verdict = fails("waits_later_event",
                        f"{log.who(extra[0].round)}: the host waited for round {extra[0].round}'s "
                        f"`{extra[0].stage}` ({len(extra)} such waits in this run: `engine.device.synchronize()`, "
                        f"or an event recorded after a launch), though nothing on the host needed it yet. The "
                        f"tokens are right, but the device sat idle while the host waited and then launched the "
                        f"next stage. The serial loop waits once per round, inside `process_outputs`, on the "
                        f"step's `sample_done`")
    if reference is None:
        reference = pool.reference(second=True) if second else pool.reference()
    if drafts is not None:
        reference = [c.token_ids for c in pool.endings_reference()]
    if verdict is None:
        verdict = run_verdict(log, outs, reference)
    diff = pool.compare([c.token_ids for c in outs], reference) if verdict is None else None
    if diff:
        verdict = fails("wrong_tokens", f"{diff}: each round must prepare, launch forward, launch sample, then "
                                        f"process that step before the next round")
    if verdict is not None and drafts is not None:
        verdict.message = f"{pool.endings_label(drafts)}: {verdict.message}"
    if verdict is not None and second:
        verdict.message = (f"in the second run (prompts that end at the stop string {pool.SECOND_RUN['stop']!r}, "
                           f"at most {pool.SECOND_RUN['max_new_tokens']} new tokens): {verdict.message}")
    return verdict


@exercise_check(calls="idle_fraction(timeline)")
@context.given(engine=context.engine_run("the serial engine after its run (`engine`)"))
def check_idle_fraction(idle_fraction, engine: Engine) -> Verdict:
    """Exercise 2(b): ``idle_fraction(timeline)`` against ``engine.stats.device_idle_fraction``.
    The function gets a copy: one that empties or edits it changes neither the run nor the check."""
    timeline = context.plain_timeline(engine.timeline)  # as given() read it: plain values only
    expected = engine.stats.device_idle_fraction
    given = copy.deepcopy(timeline)
    given.__class__ = Given
    try:
        got = idle_fraction(given)
    except NotImplementedError:
        return not_implemented("`idle_fraction`")
    except BuiltInRan:
        return built_in()
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return fails("raised", f"your idle_fraction raised {quoted(err)}{at(err)}")
    value = returned_real(got)
    if value is None:
        return fails("not_a_number", f"idle_fraction should return a number, got {type(got).__name__}")
    if not math.isfinite(value):
        return fails("not_a_number", f"idle_fraction returned {show(got)}: divide the idle time by "
                                     f"idle + busy (both from the timeline, and busy is never 0 "
                                     f"after a run)")
    got = value
    if not timeline.lane("device"):
        return context.setup_verdict("engine", engine, "an engine that has run",
                                     "the serial engine after its run (`engine`)")

    def close(a, b):  # float32 or a 0-d tensor of the right value passes: 1e-6 is far below any mistake's gap
        return abs(a - b) < 1e-6

    if close(got, expected):
        return _same_on_another_timeline(idle_fraction, timeline)
    slips = idle_slips(timeline, engine.stats, expected)
    for category, value, what, fix, _ in slips:
        if close(got, value):
            return fails(category, f"that is {what}: {fix}")
    verdict = slip_reading(got, expected, "the idle fraction", slips)
    if verdict is not None:
        return verdict
    how = shortened(got, expected, whole=None)
    if how is not None:  # 0.32 for 0.3167 (round 11)
        return fails("wrong_value", f"got {got:.8f}, expected {expected:.8f}: the fraction "
                                    f"{how}; the check allows 1e-6, so return it unrounded")
    if f"{got:.4f}" == f"{expected:.4f}":  # "got 0.3167, expected 0.3167" said nothing (round 11)
        return fails("wrong_value", f"got {got:.8f}, expected {expected:.8f}: the fraction rounded "
                                    f"or cut; the check allows 1e-6, so return it unrounded")
    if 1 < got <= 100:  # no slip's percentage, but no fraction either (round 13)
        return fails("percentage", f"got {got:g}, which looks like a percentage: give a fraction "
                                   f"from 0 to 1, idle / (idle + busy) from timeline.device_gaps() "
                                   f"and timeline.device_busy_ms(), not times 100")
    return fails("wrong_value", f"got {got:.4f}, expected {expected:.4f}: idle / (idle + busy) from "
                                f"timeline.device_gaps() and timeline.device_busy_ms()")


def _same_on_another_timeline(idle_fraction, timeline) -> Verdict:
    """A right value on the run's timeline; now on one the function cannot have seen the
    stats of: the same run without its prefill round (and without the stats in its meta)."""
    decode = Timeline(origin_ns=timeline.origin_ns, meta=dataclasses.replace(timeline.meta, stats=None))
    for span in timeline.spans:
        if span.round > 0:
            decode.spans.append(span)
    expected = decode.device_idle_fraction()
    decode.__class__ = Given
    try:
        got = returned_real(idle_fraction(decode))
    except BuiltInRan:
        return built_in()
    except Exception as err:  # noqa: BLE001 - reported, not raised
        got, why = None, f"it raised {quoted(err)}"
    else:
        why = f"it returned {got!r:.40}"
    if got is None or not abs(got - expected) < 1e-6:
        return fails("not_from_timeline",
                     f"your function gave the run's idle fraction, but not on another timeline: for the same "
                     f"run without its prefill round (round 0) the idle fraction is {expected:.4f}, and {why}. "
                     f"Compute it from the timeline you are given (its device gaps and busy time), not from "
                     f"the engine's stats or a number you saw")
    return passes("your idle fraction equals engine.stats.device_idle_fraction, and it follows the "
                  "timeline it is given (checked on the same run without its prefill)")


