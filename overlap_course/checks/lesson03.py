"""Lesson 03 (notebooks 03a_zos_order and 03b_zos_measured, exercise 03_zos_loop): the
overlapped (ZOS) loop.  The host launches round N+1's forward, then processes round N under
it, then launches round N+1's sample; the last step is flushed.  The notebooks' questions
read that order and its cost off the run; the exercise's checkers run the learner's loop and
judge its order, its overlap and its tokens.
"""

from __future__ import annotations

import math
import operator

from overlap_course.measure.bench import ideal_ratio
from toy_engine.kernels import FROM_DEVICE
from toy_engine.runinfo import RunStats

from . import context, pool
from .answers import (bool_pair, flag_list, int_list, items, name, one_number, round_number, show,
                      whole)
from .harness import exercise_check, notebook_check
from .host_order import correction_mistake, deferred, waits_beyond_sample, zos_overlapped
from .learner_code import loop_verdict, run_loop
from .whose_loop import engine_loop
from .plan_order import flushed_with_a_plan
from .run_edits import run_verdict, same_run
from .lesson03_mistakes import order_mistake, ratio_mistakes
from .zos_runs import SPEC, endings_run
from .verdict import (Verdict, fails, joined, no_such_round, not_implemented, passes,
                      unanswered)

__all__ = ["check_processed_under", "check_swapped_order", "check_tokens_lost", "check_future_inputs",
           "check_ideal_ratio", "check_zos_loop", "expected_three_rounds", "check_three_rounds"]


def rounds_processed_in_pass(timeline, round: int) -> list[int]:
    """Rounds whose results the host waits on or processes between launching round
    ``round``'s forward and its sample (in ZOS: the deferred previous decode step)."""
    rounds, inside = [], False
    for span in timeline.lane("host"):
        if span.stage == "launch_forward" and span.round == round:
            inside = True
        elif inside and span.stage == "launch_sample":
            break
        elif inside and span.stage in ("wait", "postprocess", "flush") and span.round not in rounds:
            rounds.append(span.round)
    return rounds


@notebook_check
@context.given(timeline=context.timeline("the ZOS run's timeline (small.timeline)"),
               round=context.whole(0, context.BIG, "the round asked about (2)"))
def check_processed_under(answer, timeline, round: int) -> Verdict:
    """Predict (03a): in the ZOS pass that launches round ``round``'s forward, whose
    results does the host wait on and postprocess before it launches that round's sample?"""
    if answer is None:
        return unanswered("set `processed` to a round number")
    got = round_number(answer)
    if got is None:
        return fails("shape", f"write the round as one whole number (or as its owner, \"StepState(round=N)\"), "
                              f"not {show(answer)}")
    if got < 0:
        return no_such_round(got)
    processed = rounds_processed_in_pass(timeline, round)
    launched = sorted({s.round for s in timeline.lane("host") if s.stage == "launch_forward"})
    if round not in launched:  # e.g. the run above was interrupted, or the engine ran something else since
        return fails("setup", f"the run this check reads has no round {round} (its rounds: "
                              f"{f'0 to {launched[-1]}' if launched else 'none'}): run the cell above to the end, "
                              f"then this one")
    if not processed:
        return fails("setup", f"in this run the host processed nothing between round {round}'s forward and sample "
                              f"launches (was round {round - 1} a prefill, or is this not a ZOS run?): ask about a "
                              f"later decode round")
    want = processed[0]
    if got == want:
        return passes(f"round {want}: its StepState waited in `previous`, and the host waits on its event and "
                      f"commits its tokens while round {round}'s forward is queued or running on the device")
    if got == round:
        return fails("serial_order",
                     f"round {round}'s own sample is not launched yet at that point (it comes after the "
                     f"postprocess): its results are processed in the next pass. Processing a round in its "
                     f"own pass is the serial order")
    if got > round:
        return fails("not_launched_yet",
                     f"round {got} is not even launched yet: the host can only process a round whose "
                     f"sample is already queued on the device")
    if got < want:
        return fails("earlier_round",
                     f"round {got} was processed in an earlier pass: ZOS defers a decode step by one round "
                     f"only. Which round's StepState does `previous` hold when round {round} is launched?")
    return fails("wrong", f"round {got} is not it: the host processes the step kept in `previous`, the round "
                          f"launched one pass earlier")


@notebook_check
def check_tokens_lost(answer, reference, without_flush) -> Verdict:
    """Predict (03a): how many tokens does each request lose when the flush drops the
    deferred step?  ``reference`` and ``without_flush`` are the two runs' completions."""
    if answer is None:
        return unanswered("set `lost` to a number of tokens per request")
    try:
        want = [len(r.token_ids) - len(g.token_ids) for r, g in zip(reference, without_flush)]
    except (TypeError, AttributeError):
        return fails("setup", "pass the completions of the normal run and of the run without the flush")
    if not want:
        return fails("setup", "run the two generate() calls above first: there are no completions to compare")
    one = whole(answer)
    got = [one] * len(want) if one is not None else int_list(answer)
    if got is None:
        return fails("shape", f"write the number of tokens lost per request as a whole number (or a list, one "
                              f"per request), not {show(answer)}")
    if len(got) != len(want):
        return fails("shape", f"the run has {len(want)} requests: give one number, or a list of {len(want)}")
    if got == want:
        counts = f"{want[0]} token{'s' * (want[0] != 1)}" if len(set(want)) == 1 else f"{want} tokens"
        return passes(f"{counts} per request: the final decode step was sampled on the device into an "
                      f"output slot, but nobody waited on its event and committed it")
    total = [len(r.token_ids) for r in reference]
    if all(g == 0 for g in got):
        return fails("nothing_lost", "the last decode step is still held in `previous` when the scheduler has nothing "
                                     "left to launch; without the flush nobody commits it, so its token is lost")
    if got == total:
        return fails("all_lost", "only the last decode step has no next round to be processed under: every earlier "
                                 "one was processed in the following pass, so its tokens reached the requests")
    if any(g < 0 for g in got):
        return fails("negative", "a request cannot gain tokens by losing the flush")
    if got == [len(g.token_ids) for g in without_flush]:
        return fails("tokens_kept", "that is how many tokens the requests kept; the question asks how many they lost")
    if one is not None and len(want) > 1 and one == sum(want):  # blind round 44
        return fails("total_not_per_request",
                     f"{one} is what the {len(want)} requests lost together; the question asks "
                     f"how many tokens each request loses")
    if all(g > w for g, w in zip(got, want)):
        return fails("more_than_one_step",
                     "ZOS defers one decode step at a time (`previous` holds one StepState): how many tokens "
                     "does one decode step add to a request?")
    return fails("wrong", f"{got} is not it: compare each request's token count in the two runs the cell printed, "
                          f"with the flush and without")


@notebook_check
def check_swapped_order(answer, plain_same: bool, constraint_same: bool) -> Verdict:
    """Predict (03a): does launching round N+1's sample before round N's postprocess keep
    the serial tokens, (without a constraint, with the title-case constraint)?  The two
    truths are the measured comparisons of the demo run."""
    if answer is None:
        return unanswered("set `same_tokens` to a pair of booleans: (without a constraint, with title_case)")
    got = bool_pair(answer)
    if isinstance(answer, (set, frozenset)):
        return fails("shape",
                     f"a set has no order, so {show(answer)} cannot say which answer is which: write a pair of "
                     f"True/False values as a tuple, (without a constraint, with title_case)")
    if got is None:
        return fails("shape", f"write a pair of True/False values, (without a constraint, with title_case), "
                              f"not {show(answer)}")
    want = (bool(plain_same), bool(constraint_same))
    if got == want:
        return passes(f"{want}: without a constraint the sample reads only the logits on the device, so when "
                      f"the host processes round N cannot change it; with title_case the mask is built from "
                      f"the committed text, which lacks round N's token when the sample is launched first")
    if got[0] != want[0]:
        if want[0]:
            return fails("plain_changes",
                         "without a constraint the sample reads only what is on the device (the logits); "
                         "when the host processes round N does not change what the device samples")
        return fails("against_measurement", "this run's measurement disagrees with your first value: look at the "
                                            "demo's output without a constraint")
    if want[1]:
        return fails("against_measurement", "this run's measurement disagrees with your second value: look at the "
                                            "demo's title_case output")
    return fails("constraint_unaffected",
                 "with title_case, launch_sample builds the mask from the tokens committed so far; "
                 "swapped, round N is not committed yet, so the mask is one token late and the capital "
                 "comes one character late")


@notebook_check
@context.given(answers=2, meta=context.columns(("input_ids", "pending"), -context.BIG, context.BIG,
                                               "the ZOS run's captured round (zos_meta[2])"),
               serial_meta=context.columns(("input_ids",), -context.BIG, context.BIG,
                                           "the serial run's captured round (serial_meta[2])",
                                           optional=True))
def check_future_inputs(input_ids, pending, meta, serial_meta=None) -> Verdict:
    """Predict (03b): ``input_ids`` and ``pending`` of a decode round the ZOS host prepared
    while the previous round was in flight (``meta``: the captured metadata of that round;
    ``serial_meta``: the same round of the serial run, to recognise its real ids)."""
    if input_ids is None or pending is None:
        return unanswered("set `input_ids` and `pending` to lists, one value per request "
                           "(write FROM_DEVICE as -1)")
    ids, flags = int_list(input_ids), flag_list(pending)
    if ids is None or flags is None:
        return fails("shape", "write `input_ids` and `pending` as lists of whole numbers, one per request "
                              "(FROM_DEVICE is -1; pending is 0 or 1)")
    want_ids, want_pending = [int(v) for v in meta["input_ids"]], [int(v) for v in meta["pending"]]
    n = len(want_ids)
    if len(ids) != n or len(flags) != n:
        return fails("shape", f"this decode round has {n} requests feeding one token each: give {n} input ids and "
                              f"{n} pending flags, not {len(ids)} and {len(flags)}")
    if ids == want_ids and flags == want_pending:
        return passes(f"input_ids {want_ids}, pending {want_pending}: the previous round is still in flight, "
                      f"so the host writes the placeholder FROM_DEVICE ({FROM_DEVICE}) and marks the request "
                      f"pending; the forward reads the real token from last_tokens on the device")
    if ids != want_ids:
        if serial_meta is not None and ids == [int(v) for v in serial_meta["input_ids"]]:
            return fails("serial_ids",
                         f"{ids} are the serial run's ids: there the previous round was processed first. "
                         f"In ZOS those tokens are still on the device (or not sampled yet) when this round "
                         f"is prepared")
        known = [i for i, (g, w) in enumerate(zip(ids, want_ids)) if w == FROM_DEVICE and g != FROM_DEVICE]
        if known:
            return fails("host_knows_token",
                         f"request {known[0]}: the host cannot know that token, it is sampled by the round "
                         f"still in flight; it writes FROM_DEVICE ({FROM_DEVICE})")
        return fails("placeholder_for_known",
                     f"request {[g == w for g, w in zip(ids, want_ids)].index(False)}: its previous round "
                     f"was already processed, so the host writes the real token id")
    if all(f == 0 for f in flags) and any(want_pending):
        return fails("pending_unset",
                     "pending = 1 marks a request whose previous round is still in flight: the device must "
                     "take its newest token (and, with drafts, its lengths) from its own state")
    if flags == [1 - f for f in want_pending]:
        return fails("pending_inverted",
                     "the flags are inverted: pending = 1 where the previous round is still in flight, "
                     "0 where it was processed")
    return fails("wrong", f"pending {flags} is not it: a request is pending (1) exactly where its input id is "
                          f"FROM_DEVICE")


@notebook_check
@context.given(serial_stats=context.run_stats("the serial run's stats (serial_stats)"),
               zos_stats=context.run_stats("the ZOS run's stats (zos_stats)", optional=True))
def check_ideal_ratio(answer, serial_stats: RunStats, zos_stats: RunStats | None = None) -> Verdict:
    """Your turn (03b): the ideal ZOS speed-up from the serial run's own per-round host and
    device times.  Compared with the learner's run's stats, to two decimals."""
    answer = one_number(answer, "set `ideal` to a number, e.g. 1.25", "write the ratio as a number")
    if isinstance(answer, Verdict):
        return answer
    host, dev = serial_stats.mean_host_ms_per_round, serial_stats.mean_device_ms_per_round
    want = ideal_ratio(host, dev)

    def close(value):
        return abs(answer - value) <= max(0.006, 0.005 * abs(value))

    if close(want):
        bound = "device" if dev >= host else "host"
        return passes(f"({host:.2f} + {dev:.2f}) / {max(host, dev):.2f} = x{want:.2f}: at best the {bound} "
                      f"time of a round remains, everything else is hidden under it")
    mistakes = ratio_mistakes(serial_stats, zos_stats)
    # The ratio itself cut short, unless a mistake gives that very number: a mistake is only
    # near it (blind round 46: 1.3, the ideal 1.346 cut, was blamed on the idle fraction's 1.299)
    if not any(abs(answer - value) < 1e-9 for value, _, _ in mistakes):
        if any(abs(answer - cut) < 1e-9 for cut in (round(want, 1), math.floor(want * 10) / 10)):
            return fails("one_decimal", f"{answer:.3g} is the ratio cut to one decimal: that hides "
                                        f"the part this question is about, give two decimals")
        if abs(answer - math.floor(want * 100) / 100) < 1e-9:  # blind 44: int(x * 100) / 100
            return fails("cut_two_decimals", f"{answer:.3g} is the ratio cut to two decimals "
                                             f"(x{want:.4f}): round it instead, x{want:.2f}")
    for value, category, why in mistakes:
        if close(value):
            return fails(category, f"{answer:.3g}: {why}")
    if abs(answer / 100 - want) <= 0.006:
        return fails("percentage", f"{answer:.3g} is a percentage: write the ratio itself (as in 1.25, not 125)")
    return fails("wrong", f"{answer:.3g} is not it: read serial_stats.mean_host_ms_per_round and "
                          f".mean_device_ms_per_round, then compute (host + device) / max(host, device)")


# ------------------------------------------------------------------ exercise 03

@exercise_check(lambda: pool.start({"constraint": pool.CONSTRAINT}, {"num_draft_tokens": pool.DRAFTS}, {}),
                lambda: pool.reference(pool.CONSTRAINT), pool.reference, pool.endings_reference,
                calls="zos_loop(engine)")
def check_zos_loop(loop) -> Verdict:
    """Exercise 3: ``loop(engine)`` is the overlapped loop, flush included.

    Two runs: greedy with the title-case constraint (the sample's mask depends on the
    previous round's committed token, so the order matters for the text), and greedy
    with 3 drafts per round (lengths are stale unless corrected on the device).  Both
    must equal the serial engine; the first run's host lane must show the ZOS order.
    Then the endings run (EOS, a stop string, the limit), without drafts and with them.
    """
    pool.start({"constraint": pool.CONSTRAINT}, {"num_draft_tokens": pool.DRAFTS}, {})
    engine, log, outs, err = run_loop(loop, constraint=pool.CONSTRAINT)
    verdict = loop_verdict(log, err, "zos", zos_overlapped)
    if verdict is None:
        verdict = waits_beyond_sample(engine, log)
    if verdict is not None:
        return verdict
    verdict = run_verdict(log, outs, pool.reference(pool.CONSTRAINT),
                          f"with the `{pool.CONSTRAINT}` constraint on, ")
    if verdict is not None:
        return verdict
    diff = pool.compare([c.token_ids for c in outs], pool.reference(pool.CONSTRAINT))
    if diff:
        return fails("wrong_tokens", f"with the `{pool.CONSTRAINT}` constraint on, {diff}: process every step "
                                     f"exactly once, in round order, before the next sample")
    why = same_run(log, outs, pool.serial_run(pool.CONSTRAINT), rounds=False)
    if why:
        return fails("edits_run", f"with the `{pool.CONSTRAINT}` constraint on, {why}")
    spec, spec_log, spec_outs, err = run_loop(loop, num_draft_tokens=pool.DRAFTS)
    verdict = loop_verdict(spec_log, err, "zos", zos_overlapped)  # its rounds end differently: a new order
    if verdict is None:
        verdict = waits_beyond_sample(spec, spec_log)  # each run's (round 36: only with drafts)
    if verdict is not None:
        verdict.message = f"{SPEC}: {verdict.message}"  # named (round 37: read as the first run's)
        return verdict
    verdict = run_verdict(spec_log, spec_outs, pool.reference(),
                          f"with speculative decoding ({pool.DRAFTS} drafts per round) ")
    if verdict is not None:
        return verdict
    diff = pool.compare([c.token_ids for c in spec_outs], pool.reference())
    if diff:
        why = correction_mistake(spec, spec_log)
        return fails("correction" if why else "wrong_tokens",
                     f"with speculative decoding ({pool.DRAFTS} drafts per round) {diff} compared with plain greedy "
                     f"decoding: {why or 'process every step exactly once, in round order'}")
    logs = {"": log, f"{SPEC}: ": spec_log}
    for drafts in (0, pool.DRAFTS):
        verdict, logs[f"{pool.endings_label(drafts)}: "] = endings_run(loop, drafts)
        if verdict is not None:
            verdict.message = f"{pool.endings_label(drafts)}: {verdict.message}"
            return verdict
    for label, run_log in logs.items():  # every run's (round 36: misused only with drafts)
        verdict = flushed_with_a_plan(run_log)
        if verdict is not None:
            verdict.message = label + verdict.message
            return verdict
    verdict = engine_loop(logs.values(), "zos")
    if verdict is not None:
        return verdict
    return passes(f"ZOS loop matches the serial tokens with the `{pool.CONSTRAINT}` constraint and with "
                  f"{pool.DRAFTS} drafts per round; {deferred(log)} decode steps were processed under the next "
                  f"round's forward, before its sample, and the last one was flushed")


def expected_three_rounds() -> list[tuple[str, int]]:
    """What the host issues in a ZOS run of one prefill and three decode rounds."""
    engine = pool.engine()
    engine.generate(["Once upon a time"], max_new_tokens=4)
    rename = {"launch_forward": "forward", "launch_sample": "sample"}
    stages = [(str.__str__(s.stage), s.round) for s in engine.timeline.lane("host") if s.round]
    # plain names (a Stage member would print as <Stage.FLUSH: 'flush'> in a message)
    return [(rename.get(stage, stage), rnd) for stage, rnd in stages
            if stage in ("launch_forward", "launch_sample", "postprocess", "flush")]


_PAIRS = 'a list of (stage, round) pairs, e.g. [("forward", 1), ("sample", 1), ...]'


@exercise_check(pool.engine, answer=f"a plain {_PAIRS[2:]}")
def check_three_rounds(order) -> Verdict:
    """Try-it: the order of forward / sample / postprocess / flush for decode rounds 1-3."""
    if order is None or order is NotImplemented:
        return not_implemented("the list of (stage, round) pairs", f"`order` is still {order}")
    shape = _PAIRS
    if isinstance(order, (str, bytes)):
        return fails("shape", f"write {shape}, not one string: each step is a pair of a stage name (a string) "
                              f"and a round number")
    if isinstance(order, (set, frozenset)):
        return fails("shape", f"write {shape}, in the order the host issues them: a set keeps no "
                              f"order")
    expected = expected_three_rounds()
    pairs = items(order, shape, str(len(expected)))
    if isinstance(pairs, Verdict):
        return pairs
    order = []
    for item in pairs:
        try:
            stage, rnd = item if not isinstance(item, (str, bytes)) else (None, None)
            if not isinstance(stage, str) or isinstance(rnd, bool):
                raise TypeError
            stage = name(stage)  # as every check reads a stage: "FORWARD", " forward " too
            order.append((stage, operator.index(rnd)))
        except (TypeError, ValueError):
            return fails("shape", f"write {shape}; {show(item)} is not a (stage, round) pair of a string and "
                                  f"an integer")
    if order == expected:
        return passes("that is the order the engine just recorded: " +
                      ", ".join(f"{s} {r}" for s, r in expected))
    if any(stage in _HOST_NAMES for stage, _ in order):
        return _host_names(order, expected)
    return _three_rounds_mistake(order, expected)


def _three_rounds_mistake(order, expected) -> Verdict:
    """The first way ``order`` (plain (stage, round) pairs) differs from the engine's."""
    rounds, last = sorted({r for _, r in order}), expected[-1][1]
    if rounds and rounds[0] == 0 and last not in rounds:  # decode rounds counted from 0
        shifted = [(s, r + 1) for s, r in order] == expected
        return fails("rounds_from_zero", f"you numbered the decode rounds 0-{rounds[-1]}; the "
                     f"engine numbers them 1-{last}, as its timeline shows: round 0 is the prefill "
                     f"(left out here, as asked), processed at once before round 1 is scheduled"
                     + (". Add 1 to each round and your order is right" * shifted))
    if any(r == 0 for _, r in order):
        return fails("includes_prefill", "leave out round 0: it is the prefill, processed at once before round 1 "
                                         "is scheduled")
    other = next(((s, r) for s, r in order if s in _LEFT_OUT), None)
    if other is not None:
        return fails("not_a_stage",
                     f"leave out {other}: the question asks for the forward, sample, postprocess "
                     f"and flush steps only, without the other host stages (`schedule`, "
                     f"`prepare`, `wait`)")
    wrong = next((i for i, (got, want) in enumerate(zip(order, expected)) if got != want), None)
    if wrong is not None:
        return order_mistake(wrong, order[wrong], expected[wrong])
    return fails("length", f"you listed {len(order)} steps, the engine did {len(expected)}: each round is launched "
                           f"once (forward, sample) and processed once (postprocess or flush)")


# The host stages the question leaves out (the host lane's names and the question's)
_LEFT_OUT = frozenset({"schedule", "prepare", "prepare_inputs", "wait"})
# The engine's method names for the steps (the host lane shows the launches' names), and the
# exercise's names for them (blind round 51: `process_outputs` read as a wrong step).
_HOST_NAMES = {"launch_forward": "forward", "launch_sample": "sample",
               "process_outputs": "postprocess"}


def _host_names(order, expected) -> Verdict:
    """An order written with the engine's method names: the names named, then the order."""
    renamed = [(_HOST_NAMES.get(stage, stage), rnd) for stage, rnd in order]
    if renamed == expected:
        then = "with those names it is the engine's order"
    else:
        then = "with those names: " + _three_rounds_mistake(renamed, expected).message
    used = [name for name in _HOST_NAMES if any(stage == name for stage, _ in order)]
    return fails("host_names", f"you wrote the engine's method names "
                               f"({joined([f'`{name}`' for name in used])}): this exercise "
                               f"calls those steps "
                               f"{joined([f'{chr(34)}{_HOST_NAMES[n]}{chr(34)}' for n in used])}"
                               f"; {then}")
