"""Lesson 07b (notebook 07b_bugs_of_2026, optional): two overlap bugs of 2025-2026, brought back
through the loops of ``overlap_course.labs.plugins_2026``.  A prediction is judged against the
buggy run itself; a fix runs on its own workloads, race checker on, and is judged by what the
runs did: their tokens against the serial run's, the rounds still in flight at each sample (read
from the run's record), and the drafts the device accepted.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping

from overlap_course.labs import plugins, plugins_2026
from toy_engine import loops
from toy_engine.device import DeviceError
from toy_engine.races import RaceError
from toy_engine.record import Commit, Launch, Wait
from toy_engine.run import StepProcessedTwice

from . import context, pool
from .answers import items, show, whole
from .errors import engines, quoted, said
from .harness import exercise_check, notebook_check
from .verdict import Verdict, fails, no_such_round, not_implemented, passes, unanswered

__all__ = ["check_stale_mask", "check_before_sample", "check_token_leak", "check_future_key"]

QUEUE_NEW = 12
# lab 5: (title case on?, steps the queue holds, stop strings): the constraint at two depths, and
# without it; the stop " Ben" ends two requests early, so a batch shrinks while a step is held
# (the blind round's false pass: a fix that waited only when the batch had not changed)
QUEUE_RUNS = ((True, 2, ()), (True, 2, (" Ben",)), (True, 3, (" Ben",)), (False, 2, (" Ben",)),
              (False, 3, ()))
LEAK_PROMPTS = (*pool.PROMPTS, "A little cat")
# lab 6: (prompts, limit, stop strings, drafts): requests leaving the batch at different rounds
# and a fifth admitted mid-run; then speculation, whose drafts and accepted counts are keyed
# too (a key that differs between a request's prefill and its decodes loses its drafts: only
# acceptance shows it)
KEY_RUNS = ((LEAK_PROMPTS, 16, (" the",), 0), (LEAK_PROMPTS, 16, (" was", "."), 0),
            (LEAK_PROMPTS, 16, ("a",), 0), (LEAK_PROMPTS, 24, (), pool.DRAFTS))


def first_stray_capital(text: str) -> int | None:
    """Index of the first capital letter that no space precedes (title case broken), or None."""
    return next((j for j in range(1, len(text)) if text[j].isupper() and text[j - 1] != " "),
                None)


def in_flight_at_samples(events) -> list[int]:
    """For each sample launched, in order: the rounds whose sample went in before it and whose
    tokens were not committed yet (the steps a batch queue still held)."""
    sampled, counts = set(), []
    for e in events:
        if isinstance(e, Launch) and e.stage == "sample":
            counts.append(len(sampled))
            sampled.add(e.round)
        elif isinstance(e, Commit) and not e.refused:
            sampled.discard(e.round)
    return counts


def leaks(events) -> list[tuple[int, int, int]]:
    """(round, reader, owner) where a request whose previous round was still in flight took the
    token another request left under the key of its batch place (the key of the shipped map)."""
    plans = {e.round: e.prompts for e in events if isinstance(e, Commit) and not e.refused}
    first = {}
    for r in sorted(plans):
        for p in plans[r]:
            first.setdefault(p, r)
    found = []
    for r in sorted(plans):
        before = plans.get(r - 1, ())
        # a prefill round admits new prompts only
        decode_before = any(first[p] < r - 1 for p in before)
        for b, p in enumerate(plans[r]):
            if decode_before and p in before and before[b] != p:
                found.append((r, p, before[b]))
    return found


# ------------------------------------------------------------------ lab 5: a sampler a step behind

@notebook_check
def check_stale_mask(answer, engine, prompt: int = 0) -> Verdict:
    """Predict (07b, lab 5): at which character of ``prompt``'s text does the shipped batch queue
    put its first capital letter that no space precedes?  ``engine``: the title-case engine
    right after that run."""
    if answer is None:
        return unanswered("set `stray_at` to the index of a character in prompt 0's text")
    got = whole(answer)
    if got is None:
        return fails("shape", f"write one whole number, a character's index in the text, "
                              f"not {show(answer)}")
    run = context.run_fields(engine, ("completions[].text", context.text),
                             ("constraint", context.present))
    if isinstance(run, str) or type(prompt) is not int or not -len(run[0]) <= prompt < len(run[0]):
        found = (f": {run}" if isinstance(run, str)
                 else f" (its last run has no prompt {show(prompt)})")
        return fails("setup", f"pass the title-case engine right after its run with the shipped "
                              f"queue{found}")
    text, constrained = run[0][prompt], run[1] is not None
    want = first_stray_capital(text)
    if not constrained or want is None:
        return fails("setup", "this engine's last run kept title case: pass the title-case "
                              "engine right after the shipped queue's run (the cell above)")
    space = text.rfind(" ", 0, want - 1)
    if want != space + 2:
        return fails("setup", f"this engine's last run built its masks {want - space - 1} tokens "
                              f"late, not the notebook's queue of two steps (a Try-it run?): run "
                              f"the shipped queue's cell above again, then this one")
    if got == want:
        return passes(f"{want}: when round N's sample goes in, round N - 1 is still held, so "
                      f"its mask is built from round N - 2's token, one token late. The letter "
                      f"after the space at {space} was sampled unmasked, and the space forced "
                      f"a capital one token later, at {want} ({text[:want + 1]!r})")
    if got == space + 1:
        return fails("at_the_space",
                     f"index {got} is where title case wants the capital; the mask that should "
                     f"force it was built from an older token. Which token had the host "
                     f"committed when that sample went in?")
    if got == want + 1:
        return fails("off_by_one",
                     "one past it: count the text's characters from 0. (Counted from 0 already? "
                     "Then that is a mask two tokens late: the queue processes its oldest step "
                     "once it is full, before the sample, so at round N's sample only round "
                     "N - 1's token is missing)")
    return fails("wrong", f"{got} is not it: find the first space in prompt {prompt}'s text "
                          f"and count how many tokens late the mask is when the queue holds two "
                          f"steps")


def _title_engine():
    return pool.ring_engine(constraint=pool.CONSTRAINT)


def _queue_engine(constrained: bool):
    return _title_engine() if constrained else pool.ring_engine()


def _queue_generate(constrained: bool, loop, stop=()):
    return _queue_engine(constrained).generate(pool.PROMPTS, max_new_tokens=QUEUE_NEW,
                                               stop=list(stop), loop=loop)


@functools.lru_cache(maxsize=4)
def queue_serial(constrained: bool, stop=()) -> list[list[int]]:
    """Lab 5: the serial loop's tokens (nothing in flight: every mask is built from the newest)."""
    return [c.token_ids for c in _queue_generate(constrained, loops.serial_loop, stop)]


@functools.lru_cache(maxsize=4)
def queue_depths(depth: int, stop=()) -> list[int]:
    """Lab 5: the steps still held at each sample of the shipped queue, no constraint (full
    depth)."""
    with plugins.ring(depth + 1):
        _queue_generate(False, plugins_2026.batch_queue(depth, lambda engine, plan, held: 0), stop)
    return in_flight_at_samples(pool.ring_engine().record.events)


def _warm_queue():
    for constrained, depth, stop in QUEUE_RUNS:
        queue_serial(constrained, stop)
        if not constrained:
            queue_depths(depth, stop)


def _run_error(err: Exception, what: str) -> Verdict:
    """A run that raised: the plug-in's own refusal, the race checker, the device, or the
    code."""
    if isinstance(err, NotImplementedError):
        return not_implemented(what)
    if isinstance(err, plugins_2026.BadAnswer):
        return fails("shape", said(err))
    if engines(err, StepProcessedTwice):
        return fails("processed_twice", f"a held step was processed twice ({err}): return how "
                                        f"many to process and let the loop do it")
    if engines(err, RaceError):
        return fails("race", f"the race checker stopped the run: {err}")
    if isinstance(err, DeviceError):
        return fails("device_error", f"the device failed: {said(err)}")
    return fails("raised", f"your code raised {quoted(err)}")


@exercise_check(pool.ring_engine, _title_engine, _warm_queue,
                calls="before_sample(engine, plan, held)")
def check_before_sample(before_sample) -> Verdict:
    """Lab 5's fix: ``before_sample(engine, plan, held)`` in queues holding 2 and 3 steps, with and
    without the title-case constraint: the constrained runs must give the serial run's tokens, and
    the others keep the queue as deep as the shipped one (no step processed early)."""
    title = _title_engine()
    constraint = title.constraint  # as healed before the check
    verdict = _queue_verdict(before_sample)
    if title.constraint is not constraint:
        title.constraint = constraint
        return fails("edits_engine", "your code replaced the engine's `constraint` while the "
                                     "check ran (put back now): the sampler's mask is the "
                                     "engine's; decide only how many held steps to process")
    return verdict


def _queue_verdict(before_sample) -> Verdict:
    for constrained, depth, stop in QUEUE_RUNS:
        what = (f"a queue holding {depth} steps, {'title case' if constrained else 'no constraint'}"
                + (f", stop {list(stop)}" if stop else ""))
        answers = []
        try:
            with plugins.ring(depth + 1):
                loop = plugins_2026.batch_queue(depth, _kept(before_sample, answers))
                outs = _queue_generate(constrained, loop, stop)
        except Exception as err:  # noqa: BLE001 - judged below
            return _run_error(err, "`before_sample`")
        got, want = [c.token_ids for c in outs], queue_serial(constrained, stop)
        if got != want:
            why = _by_name(before_sample, answers) or (
                "(title case broken: a mask was built before the token it depends on reached "
                "the host)")
            return fails("wrong_tokens", f"{what}: {pool.compare(got, want)} {why}")
        held, shipped = in_flight_at_samples(_queue_engine(constrained).record.events), None
        if not constrained:
            shipped = queue_depths(depth, stop)
        waited = _waited(what, answers)
        if waited is not None:
            return waited
        if shipped is not None and held != shipped:
            at = next(i for i, (a, b) in enumerate(zip(held, shipped)) if a != b)
            return fails("waits_without_need",
                         f"{what}: at sample {at} the queue held {held[at]} step(s), the shipped "
                         f"queue {shipped[at]}: with no constraint the sampler reads nothing the "
                         f"host holds, so processing a step early only makes the host wait and "
                         f"the queue shallower")
    return passes("with title case every mask was built from the request's newest token, as in "
                  "the serial run; without it the queue stayed as deep as it was built: the host "
                  "waits only for what the sampler reads")


def _kept(before_sample, answers: list):
    """``before_sample`` as the queue calls it, each call's (plan, held, answer, the device waits
    it made: record.Wait) kept in ``answers``; the plug-in still checks the learner's own
    function (its signature)."""
    if not callable(before_sample):
        return before_sample  # the plug-in refuses it, named

    @functools.wraps(before_sample)
    def kept(engine, plan, held):
        events = engine.record.events
        before = len(events)
        answer = before_sample(engine, plan, held)
        waits = [e for e in events[before:] if isinstance(e, Wait)]
        answers.append((plan, held, answer, waits))
        return answer
    return kept


def _waited(what: str, answers: list) -> Verdict | None:
    """A run where ``before_sample`` itself waited for the device past the held steps it returned
    to process (read from the run's record, as lab 2's abort is judged): the host stalls at that
    sample for work the sampler does not read, and the overlap the queue keeps is lost."""
    calls = []
    for plan, held, answer, waits in answers:
        n = min(max(whole(answer) or 0, 0), len(held))
        last = held[n - 1].sample_done.seq if n else -1  # what the loop then waits for itself
        beyond = [w for w in waits if w.seq > last]
        if beyond:
            calls.append((plan.round, n, beyond[0]))
    if not calls:
        return None
    rnd, n, first = calls[0]
    return fails("serializes",
                 f"{what}: your before_sample waited for the device itself in {len(calls)} of "
                 f"its {len(answers)} calls, first before round {rnd}'s sample, on round "
                 f"{first.round}'s `{first.stage}`, beyond the {n} held step(s) it returned to "
                 f"process: the host stalls there though the sampler does not read that work, "
                 f"and the overlap is lost. Only return how many held steps to process; the "
                 f"loop waits for those it processes")


def _by_name(before_sample, answers: list) -> str:
    """Why a title-case run got 0 at every sample, where the function tests the constraint by
    its name (blind round 12: `engine.constraint == "title_case"` is never true): it is asked
    again with an engine whose constraint is that name.  "" if it is not that."""
    asked = [(plan, held) for plan, held, _, _ in answers if held]
    if not asked or any(whole(answer) != 0 for _, _, answer, _ in answers):
        return ""
    title = _title_engine()
    named = types.SimpleNamespace(constraint=pool.CONSTRAINT, config=title.config)
    try:
        answer = whole(before_sample(named, *asked[-1]))
    except Exception:  # noqa: BLE001 - a function that needs the real engine: no diagnosis
        return ""
    if not answer:
        return ""
    return (f"(title case broken): your before_sample returned 0 at every sample, so every mask "
            f"was built a step late. `engine.constraint` is the constraint itself, a "
            f"{type(title.constraint).__name__} object, never its name {pool.CONSTRAINT!r} (the "
            f"name `EngineConfig` takes): test `engine.constraint is not None`")


# ------------------------------------------------------------------ lab 6: whose token is it?

def _leak_answer(answer) -> tuple | Verdict:
    """The answer as (round, {reader: owner}), or the Verdict on its shape or on a round below 0;
    an empty dict is the right shape (check_token_leak says what it claims)."""
    what = "a pair (round, {reader prompt: prompt whose token it took, ...}), e.g. (4, {2: 1})"
    if answer is None:
        return unanswered(f"set `leak` to {what}")
    if isinstance(answer, (str, bytes, set, frozenset, Mapping)):
        return fails("shape", f"write {what}, not {show(answer)}")
    got = items(answer, what)
    if isinstance(got, Verdict):
        return got
    round_ = whole(got[0]) if len(got) == 2 else None
    if round_ is None or not isinstance(got[1], Mapping):  # any mapping: dict, mappingproxy
        return fails("shape", f"write {what}, not {show(answer)}")
    read = items(got[1].items(), what)  # read once, as far as MAX_ITEMS: a mapping may be odd
    if isinstance(read, Verdict):
        return read
    pairs = {whole(k): whole(v) for k, v in read[:16]}
    if None in pairs or None in pairs.values():
        return fails("shape", f"write {what}: the dict maps prompt numbers to prompt numbers")
    if round_ < 0:
        return no_such_round(round_)
    return round_, pairs


@notebook_check
def check_token_leak(answer, engine) -> Verdict:
    """Predict (07b, lab 6): in the first round where a request took another's token from the
    shipped map (keyed by batch place), which requests took whose?  ``engine``: right after it."""
    got = _leak_answer(answer)
    if isinstance(got, Verdict):
        return got
    try:
        found = leaks(engine.record.events)
    except AttributeError:
        return fails("setup", "pass the engine right after the run with the shipped key")
    if not found:
        return fails("setup", "this engine's last run took no token from another request: pass "
                              "the engine right after the shipped key's run (the cell above)")
    first = found[0][0]
    want = {p: q for r, p, q in found if r == first}
    round_, pairs = got
    if not pairs:
        return fails("wrong_reader", "an empty dict says no request took another's token, but the "
                                     "question asks about the first round where one did: in that "
                                     "round, which requests read a token another request left?")
    if (round_, pairs) == (first, want):
        return passes(f"({first}, {want}): round {first} is the first whose batch lost a request "
                      f"while the round before was still in flight; each request behind the gap "
                      f"moved up a place, and its newest token, still on the device, was read "
                      f"under its new place: the token the request that sat there left")
    if round_ != first:
        return fails("wrong_round", f"round {round_} is not the first: look for the first decode "
                                    f"round whose batch differs from the round before it while "
                                    f"that round was still in flight")
    if set(pairs) != set(want):
        return fails("wrong_reader", f"in round {first}, which requests sit at a place another "
                                     f"request held in round {first - 1}?")
    return fails("wrong_owner", f"right requests, wrong owners: under the shipped map a request "
                                f"reads the key of its place in round {first}; who sat at that "
                                f"place in round {first - 1}?")


def _key_engine(drafts: int):
    return pool.engine(num_draft_tokens=drafts) if drafts else pool.engine()


def _key_generate(index: int, loop=None):
    prompts, limit, stop, drafts = KEY_RUNS[index]
    return _key_engine(drafts).generate(list(prompts), max_new_tokens=limit, stop=list(stop),
                                        loop=loop)


@functools.lru_cache(maxsize=len(KEY_RUNS))
def key_reference(index: int) -> tuple[list[list[int]], int]:
    """Lab 6: the engine's own ZOS run: (token ids, drafts accepted)."""
    outs = _key_generate(index)
    accepted = _key_engine(KEY_RUNS[index][3]).stats.draft_tokens_accepted
    return [c.token_ids for c in outs], accepted


def _warm_keys():
    pool.start({}, {"num_draft_tokens": pool.DRAFTS})
    for index in range(len(KEY_RUNS)):
        key_reference(index)


@exercise_check(_warm_keys, calls="key(req, b)")
def check_future_key(key) -> Verdict:
    """Lab 6's fix: ``key(req, b)``, under which the device keeps each request's newest token,
    drafts and accepted count, on runs where requests leave the batch, one joins mid-run, and
    drafts are on: the engine's own tokens and accepted drafts."""
    for index, (prompts, limit, stop, drafts) in enumerate(KEY_RUNS):
        what = (f"{len(prompts)} prompts on 3 rows, limit {limit}"
                + (f", stop {list(stop)}" if stop else "")
                + (f", {drafts} drafts" if drafts else ""))
        try:
            outs = _key_generate(index, plugins_2026.future_key(key))
        except Exception as err:  # noqa: BLE001 - judged below
            return _run_error(err, "`key`")
        want, accepted = key_reference(index)
        got = [c.token_ids for c in outs]
        if got != want:
            return fails("leaked_tokens", f"{what}: {pool.compare(got, want)}: a request read a "
                                          f"newest token, draft or accepted count another "
                                          f"request had left under its key")
        mine = _key_engine(drafts).stats.draft_tokens_accepted
        if mine != accepted:
            return fails("drafts_lost",
                         f"{what}: the tokens are right (the target model checks every draft) "
                         f"but {mine} drafts were accepted, the engine's own run {accepted}: "
                         f"requests proposed from another request's history")
    return passes("every request found its own newest token, drafts and accepted count under its "
                  "key, whoever left or joined the batch: a key must stay the same for a "
                  "request's whole life and differ from every other live request's")
