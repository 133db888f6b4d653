"""A blind round of answers against notebook 07's eight checks (4 predictions, 4 fixes).

Written by an automated learner who saw only notebooks 00-07 and ``toy_engine/*.py`` (never the
checkers, the labs' plug-ins, ``tests/``, ``solutions/``, ``source/``, ``docs/`` or git history).
Each ``Answer`` is exactly what the notebook cell would pass to its check; ``wrong`` is the
learner's own judgement, ``observed`` the verdict's category and the first 100 characters of its
message when the answer went through the check in the notebook's state (``run_all`` reproduces it).

Nothing runs at import.  ``python tests/blind_labs.py`` runs every answer (about 20 s) and prints,
per answer, whether the observed verdict still matches; ``tests/test_blind_labs.py`` holds every
answer to its judgement.  ``observed`` is what this round saw: the checks answered these findings
since (their messages changed), and lab 3's prediction cell now runs a loop holding 4 rounds on a
ring of 3 where the round ran 3 (the same right pair, (1, 4)).

Findings of this round (2026-12-01): 99 answers, 76 judged wrong and 23 right.  Five wrong answers
pass: ``check_wants_more`` accepts ``assume_one_in_flight``, ``inflight_capped_at_one`` and
``hard_coded_limit`` (its runs all use ZOS holding one round and ``max_new_tokens=12``);
``check_ring_slots`` accepts ``table`` and ``capped`` (it runs depths 1-3 only, as it says).  No right
answer fails.  ``check_abort`` rejects ``synchronize`` for a reason it does not have (the waiting
queue).
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Answer:
    lab: str
    check: str
    name: str
    answer: object
    wrong: bool
    why: str
    observed: str


# ---------------------------------------------------------------------------------------------------
# Lab 1 fixes: wants_more(req) -> bool
# ---------------------------------------------------------------------------------------------------

def wm_shipped(req) -> bool:
    return not req.finished and len(req.output_ids) < req.max_new_tokens


def wm_nothing_in_flight(req) -> bool:
    return not req.finished and req.num_inflight == 0 and len(req.output_ids) < req.max_new_tokens


def wm_le(req) -> bool:
    return not req.finished and len(req.output_ids) + req.num_inflight <= req.max_new_tokens


def wm_one_early(req) -> bool:
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens - 1


def wm_assume_one_in_flight(req) -> bool:
    return not req.finished and len(req.output_ids) + 1 < req.max_new_tokens


def wm_forget_finished(req) -> bool:
    return len(req.output_ids) + req.num_inflight < req.max_new_tokens


def wm_planned_len(req) -> bool:
    return not req.finished and req.planned_len < req.max_new_tokens


def wm_finish_early(req) -> bool:
    if req.finished:
        return False
    if len(req.output_ids) + req.num_inflight >= req.max_new_tokens:
        req.finish_reason = "length"  # "it is done as far as the host can tell"
        return False
    return True


def wm_inflight_capped(req) -> bool:
    return not req.finished and len(req.output_ids) + min(req.num_inflight, 1) < req.max_new_tokens


def wm_hard_coded_limit(req) -> bool:
    return not req.finished and len(req.output_ids) + req.num_inflight < 12  # the notebook's limit


def wm_planned_len_minus_prompt(req) -> bool:
    return req.finish_reason is None and req.planned_len - len(req.prompt_ids) < req.max_new_tokens


def wm_remaining(req) -> bool:
    if req.finished:
        return False
    remaining = req.max_new_tokens - len(req.output_ids)
    return remaining > req.num_inflight


def wm_call_engine(req) -> bool:
    from toy_engine.sequence import Request
    return Request.wants_more(req)


# ---------------------------------------------------------------------------------------------------
# Lab 2 fixes: abort(engine, request_id) -> None
# ---------------------------------------------------------------------------------------------------

def _req(engine, request_id):
    return next(r for r in engine.requests if r.id == request_id)


def ab_shipped(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.free(req)


def ab_never_free(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    # "the round in flight frees it when it lands"


def ab_keep_waiting(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    engine.scheduler.release_if_done(req)


def ab_overwrite_finished(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def ab_inflight_le_one(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    if req.num_inflight <= 1:
        engine.scheduler.free(req)


def ab_swallow_race(engine, request_id: int) -> None:
    import toy_engine as te
    req = _req(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    try:
        engine.scheduler.free(req)
    except te.RaceError:
        pass  # "the round in flight will free it"


def ab_release_before_mark(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)
    req.finish_reason = "abort"


def ab_cap_limit(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        req.finish_reason = "abort"
        return
    req.max_new_tokens = len(req.output_ids)  # "no more rounds": wants_more turns False
    if req.num_inflight == 0:
        req.finish_reason = "abort"
        engine.scheduler.free(req)


def ab_synchronize(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.device.synchronize()  # drain the device: nothing launched can touch the blocks now
    engine.scheduler.free(req)


def ab_drop_from_running(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    if req.num_inflight == 0:
        engine.scheduler.free(req)
    elif req in engine.scheduler.running:
        engine.scheduler.running.remove(req)  # "so that no round plans it": its row and blocks leak


def ab_running_only(engine, request_id: int) -> None:
    req = _req(engine, request_id)
    if req.finished or req not in engine.scheduler.running:
        return  # "a waiting request has nothing to free"
    req.finish_reason = "abort"
    engine.scheduler.release_if_done(req)


def ab_inline_free(engine, request_id: int) -> None:
    for req in engine.requests:
        if req.id != request_id:
            continue
        if req.finish_reason is not None:
            return
        req.finish_reason = "abort"
        sched = engine.scheduler
        sched.waiting = type(sched.waiting)(r for r in sched.waiting if r is not req)
        if req.num_inflight == 0:
            sched.free(req)  # the in-flight case: release_if_done when its round is processed
        return


def ab_reason_or(engine, request_id: int) -> None:
    (req,) = [r for r in engine.requests if r.id == request_id]
    req.finish_reason = req.finish_reason or "abort"  # a finished request keeps its reason
    try:
        engine.scheduler.waiting.remove(req)
    except ValueError:
        pass  # not waiting
    engine.scheduler.release_if_done(req)  # frees once nothing is in flight; a finished one is gone already


def ab_call_engine(engine, request_id: int) -> None:
    engine.abort(request_id)


# ---------------------------------------------------------------------------------------------------
# Lab 3 fixes: ring_slots(depth) -> int
# ---------------------------------------------------------------------------------------------------

def rs_shipped(depth: int) -> int:
    return 2


def rs_depth(depth: int) -> int:
    return depth


def rs_twice(depth: int) -> int:
    return 2 * depth


def rs_plus_two(depth: int) -> int:
    return depth + 2


def rs_max2(depth: int) -> int:
    return max(2, depth)


def rs_pow2(depth: int) -> int:
    return 2 ** depth


def rs_table(depth: int) -> int:
    return {1: 2, 2: 3, 3: 4}[depth]


def rs_capped(depth: int) -> int:
    return min(depth + 1, 4)


def rs_float(depth: int) -> int:
    return depth + 1.0


def rs_plus_one(depth: int) -> int:
    return len(range(depth + 1))


def rs_at_least_two(depth: int) -> int:
    return max(depth + 1, 2)


# ---------------------------------------------------------------------------------------------------
# Lab 4 fixes: commit(req, tokens, eos_id, decode) -> None
# ---------------------------------------------------------------------------------------------------

def cm_shipped(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
    for s in req.stop:
        if req.text.endswith(s):
            req.text = req.text[: -len(s)]
            del req.output_ids[len(req.output_ids) - len(s):]
            req.finish_reason = "stop"
            return
    if len(req.output_ids) >= req.max_new_tokens:
        req.finish_reason = "length"


def cm_limit_first(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return


def cm_limit_per_token_stop_once(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            break
    for s in req.stop:
        if req.text.endswith(s):
            req.text = req.text[: -len(s)]
            del req.output_ids[len(req.output_ids) - len(s):]
            req.finish_reason = "stop"
            return


def cm_stop_per_token_limit_once(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
    if len(req.output_ids) >= req.max_new_tokens:
        req.finish_reason = "length"


def cm_keep_eos(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        req.output_ids.append(tok)
        req.text += decode([tok])
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_text_only_cut(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]  # the tokens of the stop string stay
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_limit_gt(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) > req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_break_inner_only(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                break  # leaves the stop-string loop only: the run's next tokens are still appended
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_run_text_only(req, tokens, eos_id: int, decode) -> None:
    run_text = ""
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        ch = decode([tok])
        req.text += ch
        run_text += ch
        for s in req.stop:
            if run_text.endswith(s):  # only this round's text: a stop across two rounds is missed
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_first_token_only(req, tokens, eos_id: int, decode) -> None:
    # "with one token per round the shipped commit is right": keep only the first token of each run
    cm_shipped(req, list(tokens)[:1], eos_id, decode)


def cm_detect_anywhere_cut_tail(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            break
    for s in req.stop:
        if s in req.text:  # finds a stop anywhere in the text now...
            req.text = req.text[: -len(s)]  # ...but still cuts the tail, as the shipped code did
            del req.output_ids[len(req.output_ids) - len(s):]
            req.finish_reason = "stop"
            return


def cm_check_before_append(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        for s in req.stop:  # looks at the text before this token is added: one token late
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_eos_continue(req, tokens, eos_id: int, decode) -> None:
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            continue  # skips the EOS token, but the run's later tokens are still appended
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def cm_one_at_a_time(req, tokens, eos_id: int, decode) -> None:
    from overlap_course.labs import shipped  # the notebook's own import: right for one token a round
    for tok in tokens:
        shipped.commit(req, [tok], eos_id, decode)
        if req.finished:
            return


def cm_vectorised(req, tokens, eos_id: int, decode) -> None:
    tokens = list(tokens)
    eos = eos_id in tokens
    if eos:
        tokens = tokens[: tokens.index(eos_id)]
    old = len(req.output_ids)  # == len(req.text): one character a token
    text = req.text + decode(tokens)
    ends = []  # (where the text first ends with a stop string after the committed text, order, string)
    for order, s in enumerate(req.stop):
        i = text.find(s, max(0, old - len(s) + 1))
        if i >= 0:
            ends.append((i + len(s), order, s))
    end, _, s = min(ends, default=(None, None, None))
    if end is not None and end <= req.max_new_tokens:
        req.output_ids += tokens[: end - old]
        del req.output_ids[end - len(s):]
        req.text = text[: end - len(s)]
        req.finish_reason = "stop"
    elif old + len(tokens) >= req.max_new_tokens:
        keep = req.max_new_tokens - old
        req.output_ids += tokens[:keep]
        req.text = text[: old + keep]
        req.finish_reason = "length"
    else:
        req.output_ids += tokens
        req.text = text
        if eos:
            req.finish_reason = "eos"


# ---------------------------------------------------------------------------------------------------
# The answers
# ---------------------------------------------------------------------------------------------------

Pair = namedtuple("Pair", "committed in_flight")
L1, L2, L3, L4 = "lab1 length limit", "lab2 abort", "lab3 ring", "lab4 spec stop"

BLIND_LABS: list[Answer] = [
    # ---- lab 1, prediction: (tokens committed, rounds in flight) when prompt 0's last round was planned
    Answer(L1, "check_wasted_round", "limit_reached", (12, 1), True,
           "thinks the request had already reached its limit when the wasted round was planned",
           'already_processed: its last token was not committed yet: round 11, which produced it, was proce'
           'ssed only after round 12'),
    Answer(L1, "check_wasted_round", "nothing_in_flight", (11, 0), True,
           "forgets the round in flight (the whole point of the lab)",
           'misses_in_flight: under ZOS round 12 is planned while round 11 is still on the device: count th'
           'e rounds launched for t'),
    Answer(L1, "check_wasted_round", "two_in_flight", (10, 2), True,
           "thinks ZOS holds two rounds",
           'wrong: (10, 2) is not it: one round of a decoding request is in flight under ZOS, and each proc'
           'essed round '),
    Answer(L1, "check_wasted_round", "swapped", (1, 11), True, "the pair in the wrong order",
           'wrong: (1, 11) is not it: one round of a decoding request is in flight under ZOS, and each proc'
           'essed round '),
    Answer(L1, "check_wasted_round", "batch_in_flight", (11, 3), True,
           "counts every request of the batch in flight, not prompt 0's rounds",
           'wrong: (11, 3) is not it: one round of a decoding request is in flight under ZOS, and each proc'
           'essed round '),
    Answer(L1, "check_wasted_round", "prefill_counted_twice", (12, 0), True,
           "counts the prefill's token and the in-flight round both as committed",
           'misses_in_flight: under ZOS round 12 is planned while round 11 is still on the device: count th'
           'e rounds launched for t'),
    Answer(L1, "check_wasted_round", "string", "11, 1", True, "a string, not a pair of numbers",
           "shape: write a pair (tokens committed, rounds in flight), e.g. (5, 2), not '11, 1'"),
    Answer(L1, "check_wasted_round", "bool_in_flight", (11, True), True,
           "'is a round in flight? yes' - a bool where a count is asked (True == 1 in Python)",
           'shape: write a pair (tokens committed, rounds in flight), e.g. (5, 2), not (11, True)'),
    Answer(L1, "check_wasted_round", "rounds_not_tokens", (10, 1), True,
           "counts prompt 0's committed decode rounds (10), forgetting the prefill's token",
           'wrong: (10, 1) is not it: one round of a decoding request is in flight under ZOS, and each proc'
           'essed round '),
    Answer(L1, "check_wasted_round", "right_namedtuple", Pair(11, 1), False,
           "right: a named pair",
           'passed: (11, 1): when round 12 was planned, prompt 0 held 11 of its 12 tokens and round 11, in '
           'flight, was a'),
    Answer(L1, "check_wasted_round", "right_numpy", (np.int64(11), np.int64(1)), False,
           "right: numpy integers, as from counting the record with numpy",
           'passed: (11, 1): when round 12 was planned, prompt 0 held 11 of its 12 tokens and round 11, in '
           'flight, was a'),
    Answer(L1, "check_wasted_round", "right_list", [11, 1], False,
           "right in substance: a list of two (the cell asks for 'a pair')",
           'passed: (11, 1): when round 12 was planned, prompt 0 held 11 of its 12 tokens and round 11, in '
           'flight, was a'),

    # ---- lab 1, fix
    Answer(L1, "check_wants_more", "shipped_unchanged", wm_shipped, True, "the shipped policy itself",
           'extra_step: before round 12 prompt 0 had 11 tokens committed and 1 round(s) in flight, enough f'
           'or its 12, yet yo'),
    Answer(L1, "check_wants_more", "nothing_in_flight", wm_nothing_in_flight, True,
           "waits for nothing in flight: no waste, and no overlap",
           'serializes: your policy never plans a request while one of its rounds is in flight, so each ZOS'
           ' round waits for '),
    Answer(L1, "check_wants_more", "off_by_one_le", wm_le, True,
           "<= instead of <: still plans the extra round",
           'extra_step: before round 12 prompt 0 had 11 tokens committed and 1 round(s) in flight, enough f'
           'or its 12, yet yo'),
    Answer(L1, "check_wants_more", "one_early", wm_one_early, True,
           "stops one round early: the request never reaches its limit (stalls)",
           'stalled: before round 11 your policy declined prompt 2 with 11 of its 12 tokens and 0 round(s) '
           'in flight: it '),
    Answer(L1, "check_wants_more", "assume_one_in_flight", wm_assume_one_in_flight, True,
           "hard-codes ZOS's one round in flight; wrong when none is (right after a prefill): checked by hand, "
           "ZOS with max_new_tokens=2 and the serial loop with 12 both end in EngineStalled",
           "passed: no round went in for a request the rounds in flight already finish: the engine's own ro"
           'unds and disc'),
    Answer(L1, "check_wants_more", "forget_finished", wm_forget_finished, True,
           "counts the rounds in flight but keeps planning a request a stop string finished",
           'finished_scheduled: prompt 0 had finished before round 6, yet your policy planned it again: 8 o'
           'utputs discarded (the eng'),
    Answer(L1, "check_wants_more", "planned_len", wm_planned_len, True,
           "planned_len includes the prompt: stops far too early",
           'stalled: before round 1 your policy declined prompt 2 with 1 of its 12 tokens and 0 round(s) in'
           ' flight: it ca'),
    Answer(L1, "check_wants_more", "finish_early", wm_finish_early, True,
           "marks the request finished from the policy: the in-flight round's token is discarded",
           'wrong_tokens: prompt 0 lost its last 1 token(s) (stop strings [])'),
    Answer(L1, "check_wants_more", "inflight_capped_at_one", wm_inflight_capped, True,
           "min(num_inflight, 1): right while at most one round is in flight; checked by hand on "
           "keep_in_flight(2) with a ring of 3: 3 outputs discarded where the engine's policy discards 0",
           "passed: no round went in for a request the rounds in flight already finish: the engine's own ro"
           'unds and disc'),
    Answer(L1, "check_wants_more", "hard_coded_limit", wm_hard_coded_limit, True,
           "the notebook's 12 written in place of max_new_tokens; checked by hand: max_new_tokens=8 "
           "discards 4 outputs, 20 ends in EngineStalled",
           "passed: no round went in for a request the rounds in flight already finish: the engine's own ro"
           'unds and disc'),
    Answer(L1, "check_wants_more", "right_planned_len_minus_prompt", wm_planned_len_minus_prompt, False,
           "right: planned_len minus the prompt is committed + in flight",
           "passed: no round went in for a request the rounds in flight already finish: the engine's own ro"
           'unds and disc'),
    Answer(L1, "check_wants_more", "right_remaining", wm_remaining, False,
           "right: tokens remaining must exceed the rounds in flight",
           "passed: no round went in for a request the rounds in flight already finish: the engine's own ro"
           'unds and disc'),
    Answer(L1, "check_wants_more", "right_call_engine", wm_call_engine, False,
           "right: the engine's own Request.wants_more, called",
           "passed: no round went in for a request the rounds in flight already finish: the engine's own ro"
           'unds and disc'),

    # ---- lab 2, prediction: (rounds under ZOS, rounds under serial)
    Answer(L2, "check_abort_in_flight", "serial_too", ({4}, {4}), True,
           "thinks the serial loop also has round 4 in flight",
           'serial_discards_nothing: the serial loop waits for and processes every round before it schedule'
           's the next: at an abort nothin'),
    Answer(L2, "check_abort_in_flight", "abort_round", ({5}, set()), True,
           "names the round the abort comes before",
           'not_launched_yet: round 5 was not launched yet: the abort came just before round 5 was schedule'
           'd'),
    Answer(L2, "check_abort_in_flight", "two_rounds", ({3, 4}, set()), True,
           "thinks ZOS holds two rounds",
           "already_processed: round 3 was processed already (in round 4's pass): under ZOS one round of a "
           'decoding request is in f'),
    Answer(L2, "check_abort_in_flight", "swapped", (set(), {4}), True, "the pair in the wrong order",
           'serial_discards_nothing: the serial loop waits for and processes every round before it schedule'
           's the next: at an abort nothin'),
    Answer(L2, "check_abort_in_flight", "every_round_so_far", ({1, 2, 3, 4}, set()), True,
           "every round that held prompt 1 so far, processed or not",
           "already_processed: round 1 was processed already (in round 2's pass): under ZOS one round of a "
           'decoding request is in f'),
    Answer(L2, "check_abort_in_flight", "ints", (4, None), True, "numbers and None, not sets",
           'shape: write a pair of sets of round numbers (under ZOS, under serial), e.g. ({2}, {3}), not (4'
           ', None)'),
    Answer(L2, "check_abort_in_flight", "serial_next", ({4}, {5}), True,
           "serial: the round about to be launched",
           'serial_discards_nothing: the serial loop waits for and processes every round before it schedule'
           's the next: at an abort nothin'),
    Answer(L2, "check_abort_in_flight", "strings", ({"4"}, set()), True, "round numbers as strings",
           'shape: write a pair of sets of round numbers (under ZOS, under serial), e.g. ({2}, {3}), not ({'
           "'4'}, set())"),
    Answer(L2, "check_abort_in_flight", "right_frozensets", (frozenset({4}), frozenset()), False,
           "right: frozensets",
           "passed: ({4}, set()): under ZOS round 4 is processed only in round 5's pass, after round 5's fo"
           'rward is laun'),
    Answer(L2, "check_abort_in_flight", "right_lists", ([4], []), False,
           "right in substance: lists of round numbers",
           "passed: ({4}, set()): under ZOS round 4 is processed only in round 5's pass, after round 5's fo"
           'rward is laun'),
    Answer(L2, "check_abort_in_flight", "right_dict_as_empty", ({4}, {}), False,
           "intended right: `{}` is the classic way to write an empty set by mistake (it is a dict); "
           "debatable",
           "passed: ({4}, set()): under ZOS round 4 is processed only in round 5's pass, after round 5's fo"
           'rward is laun'),
    Answer(L2, "check_abort_in_flight", "right_range", (set(range(4, 5)), set(range(0))), False,
           "right: sets built from ranges",
           "passed: ({4}, set()): under ZOS round 4 is processed only in round 5's pass, after round 5's fo"
           'rward is laun'),

    # ---- lab 2, fix
    Answer(L2, "check_abort", "shipped_unchanged", ab_shipped, True, "frees at once",
           "free_in_use: your abort freed prompt 1's KV blocks [98, 99] while round 2's `forward`, launched"
           ' and not processed'),
    Answer(L2, "check_abort", "never_free", ab_never_free, True,
           "never frees: a request with nothing in flight keeps its cache forever",
           'kept_blocks: prompts [3] were aborted with no round in flight and nobody freed them: only proce'
           'ssing a round free'),
    Answer(L2, "check_abort", "keep_waiting", ab_keep_waiting, True,
           "leaves a waiting request in the queue: it is admitted and prefilled anyway",
           'aborted_scheduled: prompt 4 was aborted while waiting, yet it was admitted and prefilled for no'
           'thing (3 outputs discard'),
    Answer(L2, "check_abort", "overwrite_finished", ab_overwrite_finished, True,
           "aborts a finished request too: its finish reason becomes 'abort'",
           'overwrote_finish: prompt 0 had finished (stop) before its abort arrived; your abort replaced th'
           'e reason by "abort". Le'),
    Answer(L2, "check_abort", "inflight_le_one", ab_inflight_le_one, True,
           "off by one: frees with one round still in flight",
           "free_in_use: your abort freed prompt 1's KV blocks [20, 21] while round 2's `forward`, launched"
           ' and not processed'),
    Answer(L2, "check_abort", "swallow_race", ab_swallow_race, True,
           "frees at once and swallows the race checker's refusal: with the checker off (a real engine) this "
           "is the shipped use after free",
           "free_in_use: your abort freed prompt 1's KV blocks [2, 3] while round 2's `forward`, launched a"
           'nd not processed, '),
    Answer(L2, "check_abort", "release_before_mark", ab_release_before_mark, True,
           "calls release_if_done before marking the request finished: nothing is freed",
           'kept_blocks: prompts [3] were aborted with no round in flight and nobody freed them: only proce'
           'ssing a round free'),
    Answer(L2, "check_abort", "cap_limit", ab_cap_limit, True,
           "stops planning by lowering max_new_tokens: the round in flight still adds a token, and the "
           "reason becomes 'length'",
           'still_running: prompt 1 was aborted but went on to 3 tokens (length): set its `finish_reason` t'
           'o "abort" so that no'),
    Answer(L2, "check_abort", "synchronize", ab_synchronize, True,
           "drains the device on every abort, then frees at once: safe, but gives up the overlap (it fails, "
           "but the message blames the waiting queue, which this abort does empty)",
           'aborted_scheduled: prompt 4 was aborted while waiting, yet it was admitted and prefilled for no'
           'thing (3 outputs discard'),
    Answer(L2, "check_abort", "drop_from_running", ab_drop_from_running, True,
           "removes the request from `running` so that no round plans it: its row and blocks leak",
           "wrong_tokens: prompt 3: 0 tokens, the engine's own abort keeps 1"),
    Answer(L2, "check_abort", "running_only", ab_running_only, True,
           "ignores waiting requests: they start and run to their limit",
           'still_running: prompt 4 was aborted but went on to 6 tokens (stop): set its `finish_reason` to '
           '"abort" so that no r'),
    Answer(L2, "check_abort", "right_inline_free", ab_inline_free, False,
           "right: release_if_done written inline, the waiting queue rebuilt",
           'passed: each aborted request stopped at once and kept what it had; its cache went back when no '
           'launched roun'),
    Answer(L2, "check_abort", "right_reason_or", ab_reason_or, False,
           "right: `reason or 'abort'`, the waiting queue's ValueError swallowed, release_if_done",
           'passed: each aborted request stopped at once and kept what it had; its cache went back when no '
           'launched roun'),
    Answer(L2, "check_abort", "right_call_engine", ab_call_engine, False,
           "right: calls the engine's own Engine.abort",
           'passed: each aborted request stopped at once and kept what it had; its cache went back when no '
           'launched roun'),

    # ---- lab 3, prediction: (the round the report names, the round being prepared)
    Answer(L3, "check_ring_race", "depth_two_copy", (1, 3), True,
           "copies the depth-2 report from the cell above",
           'wrong_slot: round N writes slot N % 3: two rounds share a slot only 3 rounds apart'),
    Answer(L3, "check_ring_race", "one_later", (2, 5), True, "starts counting at the second decode",
           'not_launched_yet: the first collision is earlier or later than that: the loop holds its oldest '
           'step until the next for'),
    Answer(L3, "check_ring_race", "swapped", (4, 1), True, "the pair in the wrong order",
           'wrong_slot: round N writes slot N % 3: two rounds share a slot only 3 rounds apart'),
    Answer(L3, "check_ring_race", "prefill_round", (0, 3), True,
           "thinks the prefill round's slot is held",
           'earlier_round: the first collision is earlier or later than that: the loop holds its oldest ste'
           'p until the next for'),
    Answer(L3, "check_ring_race", "one_past", (1, 5), True, "off by one on the ring",
           'wrong_slot: round N writes slot N % 3: two rounds share a slot only 3 rounds apart'),
    Answer(L3, "check_ring_race", "buffer_name", ("meta1", 4), True, "the buffer's name, not a round",
           "shape: write a pair (the round the report names, the round being prepared), e.g. (2, 5), not ('"
           "meta1', 4)"),
    Answer(L3, "check_ring_race", "slot_numbers", (1, 1), True, "slot numbers, not rounds",
           'wrong_slot: round N writes slot N % 3: two rounds share a slot only 3 rounds apart'),
    Answer(L3, "check_ring_race", "single", 4, True, "one number, not a pair",
           'shape: write a pair (the round the report names, the round being prepared), e.g. (2, 5); got in'
           't 4'),
    Answer(L3, "check_ring_race", "right_list", [1, 4], False, "right in substance: a list",
           'passed: (1, 4): round 4 writes slot 4 % 3 = 1, the slot of round 1, whose step the loop still h'
           'olds: its upl'),
    Answer(L3, "check_ring_race", "right_numpy", (np.int64(1), np.int64(4)), False, "right: numpy ints",
           'passed: (1, 4): round 4 writes slot 4 % 3 = 1, the slot of round 1, whose step the loop still h'
           'olds: its upl'),
    Answer(L3, "check_ring_race", "right_namedtuple", namedtuple("Race", "named prepared")(1, 4), False,
           "right: a named pair",
           'passed: (1, 4): round 4 writes slot 4 % 3 = 1, the slot of round 1, whose step the loop still h'
           'olds: its upl'),

    # ---- lab 3, fix
    Answer(L3, "check_ring_slots", "shipped_unchanged", rs_shipped, True, "the toy's two, always",
           "race: a loop holding 2 round(s) on a ring of 2: preparing round 3 writes `meta1` while round 1'"
           's upload, a'),
    Answer(L3, "check_ring_slots", "depth", rs_depth, True, "one slot per held round, none for the next",
           "race: a loop holding 1 round(s) on a ring of 1: preparing round 2 writes `meta0` while round 1'"
           's upload, a'),
    Answer(L3, "check_ring_slots", "twice", rs_twice, True, "double buffering per held round: not the fewest",
           'too_many: ring_slots(2) = 4, but a ring of 3 already runs a loop holding 2 round(s) race-free: '
           'each slot is ho'),
    Answer(L3, "check_ring_slots", "plus_two", rs_plus_two, True, "safe, not the fewest",
           'too_many: ring_slots(1) = 3, but a ring of 2 already runs a loop holding 1 round(s) race-free: '
           'each slot is ho'),
    Answer(L3, "check_ring_slots", "max_two", rs_max2, True, "never fewer than the toy's two: one short",
           "race: a loop holding 2 round(s) on a ring of 2: preparing round 3 writes `meta1` while round 1'"
           's upload, a'),
    Answer(L3, "check_ring_slots", "pow2", rs_pow2, True, "powers of two: too many from depth 2",
           'too_many: ring_slots(2) = 4, but a ring of 3 already runs a loop holding 2 round(s) race-free: '
           'each slot is ho'),
    Answer(L3, "check_ring_slots", "table", rs_table, True,
           "a table for the depths the check runs (KeyError at depth 4; the check runs depths 1-3 only)",
           'passed: depths [1, 2, 3] need rings of [2, 3, 4]: every held round keeps its slot until it is w'
           'aited for, an'),
    Answer(L3, "check_ring_slots", "capped", rs_capped, True,
           "right for depths 1-3 only: checked by hand, depth 4 on its ring of 4 raises the RaceError on "
           "meta1",
           'passed: depths [1, 2, 3] need rings of [2, 3, 4]: every held round keeps its slot until it is w'
           'aited for, an'),
    Answer(L3, "check_ring_slots", "float", rs_float, True, "a float number of slots",
           "shape: ring_slots(1) returned 2.0: return a whole number of slots from 1 to the engine's limit,"
           ' 8'),
    Answer(L3, "check_ring_slots", "right_len_range", rs_plus_one, False, "right: depth + 1 written oddly",
           'passed: depths [1, 2, 3] need rings of [2, 3, 4]: every held round keeps its slot until it is w'
           'aited for, an'),
    Answer(L3, "check_ring_slots", "right_at_least_two", rs_at_least_two, False,
           "right: max(depth + 1, 2) equals depth + 1 for every depth >= 1",
           'passed: depths [1, 2, 3] need rings of [2, 3, 4]: every held round keeps its slot until it is w'
           'aited for, an'),
    Answer(L3, "check_ring_slots", "right_lambda", lambda depth: depth + 1, False, "right: a lambda",
           'passed: depths [1, 2, 3] need rings of [2, 3, 4]: every held round keeps its slot until it is w'
           'aited for, an'),

    # ---- lab 4, prediction: tokens past max_new_tokens
    Answer(L4, "check_overshoot", "whole_round", 4, True, "1 + 3 drafts: forgets one token is within the limit",
           'off_by_one: the round was planned while the request was short of its limit, so its first token '
           'is within it: at '),
    Answer(L4, "check_overshoot", "observed_run", 2, True,
           "reads the cell's output (32 for a limit of 30), the most this run kept, not the most possible",
           'too_few: a round may accept all 3 drafts plus its bonus token, each kept by the shipped commit '
           '(this run kept'),
    Answer(L4, "check_overshoot", "one", 1, True, "'one extra token, as at the limit without drafts'",
           'too_few: a round may accept all 3 drafts plus its bonus token, each kept by the shipped commit '
           '(this run kept'),
    Answer(L4, "check_overshoot", "zero", 0, True, "'the limit is checked, so none'",
           'too_few: a round may accept all 3 drafts plus its bonus token, each kept by the shipped commit '
           '(this run kept'),
    Answer(L4, "check_overshoot", "two_rounds", 6, True, "thinks the next (ZOS) round's run is kept too",
           'too_many: a round brings at most 1 + 3 tokens: the overshoot is bounded by one round'),
    Answer(L4, "check_overshoot", "two_full_rounds", 7, True, "two rounds of 4, less one within the limit",
           'too_many: a round brings at most 1 + 3 tokens: the overshoot is bounded by one round'),
    Answer(L4, "check_overshoot", "string", "3", True, "a string",
           "shape: write one whole number of tokens, not '3'"),
    Answer(L4, "check_overshoot", "float", 3.0, True, "a float where a whole number is asked (harmless)",
           'shape: write one whole number of tokens, not 3.0'),
    Answer(L4, "check_overshoot", "right_numpy", np.int64(3), False, "right: a numpy integer",
           'passed: 3: a round brings 1 + 3 tokens at most, and a request is planned only while it is short'
           ' of its limit'),
    Answer(L4, "check_overshoot", "right_tensor", torch.tensor(3), False,
           "right: a 0-d tensor, as from `(lengths - limit).max()` over a bound worked out in torch",
           'passed: 3: a round brings 1 + 3 tokens at most, and a request is planned only while it is short'
           ' of its limit'),

    # ---- lab 4, fix
    Answer(L4, "check_commit", "shipped_unchanged", cm_shipped, True, "checks once per run",
           "missed_stop: prompt 0 (limit 30, stop strings [' was', '.']): the serial run ends at ', there' "
           "(stop); yours ', t"),
    Answer(L4, "check_commit", "limit_first", cm_limit_first, True,
           "per token, but the limit before the stop strings (SGLang's order)",
           "wrong_reason: prompt 2 (limit 28, stop strings [' the']): the stop string and the limit came wi"
           'th the same token, '),
    Answer(L4, "check_commit", "stop_once", cm_limit_per_token_stop_once, True,
           "limit per token, stop strings once per run: misses a stop inside a run",
           "missed_stop: prompt 0 (limit 30, stop strings [' was', '.']): the serial run ends at ', there' "
           "(stop); yours ', t"),
    Answer(L4, "check_commit", "limit_once", cm_stop_per_token_limit_once, True,
           "stop strings per token, limit once per run: keeps a run past the limit",
           "past_limit: prompt 2 (limit 30, stop strings [' was', '.']): 32 tokens, 2 past its limit: a rou"
           "nd's accepted run"),
    Answer(L4, "check_commit", "keep_eos", cm_keep_eos, True, "appends the EOS token",
           "eos_kept: prompt 0 (limit 28, stop strings [' the']): its tokens hold the EOS id 61: EOS ends a"
           ' request, it is'),
    Answer(L4, "check_commit", "text_only_cut", cm_text_only_cut, True,
           "cuts the stop string from the text, not from the tokens",
           "text_mismatch: prompt 0 (limit 30, stop strings [' was', '.']): its text ', there' is not the t"
           'ext of its 11 tokens'),
    Answer(L4, "check_commit", "limit_gt", cm_limit_gt, True, "> instead of >=: one token past the limit",
           "past_limit: prompt 1 (limit 30, stop strings [' was', '.']): 31 tokens, 1 past its limit: a rou"
           "nd's accepted run"),
    Answer(L4, "check_commit", "break_inner_only", cm_break_inner_only, True,
           "`break` leaves the stop-string loop only: tokens after the stop are appended",
           "missed_stop: prompt 0 (limit 30, stop strings [' was', '.']): the serial run ends at ', there' "
           "(stop); yours ', t"),
    Answer(L4, "check_commit", "run_text_only", cm_run_text_only, True,
           "looks for stop strings in this round's text only: misses one across two rounds",
           "missed_stop: prompt 0 (limit 30, stop strings [' was', '.']): the serial run ends at ', there' "
           "(stop); yours ', t"),
    Answer(L4, "check_commit", "first_token_only", cm_first_token_only, True,
           "keeps one token a round: gives up speculation's accepted tokens",
           "wrong_tokens: prompt 0 (limit 30, stop strings [' was', '.']): ', re tealier rabbn na i il d e'"
           ' where the serial r'),
    Answer(L4, "check_commit", "detect_anywhere_cut_tail", cm_detect_anywhere_cut_tail, True,
           "finds a stop anywhere in the text (`in`), but still cuts the tail: keeps what follows the stop "
           "and cuts the wrong characters",
           "missed_stop: prompt 0 (limit 30, stop strings [' was', '.']): the serial run ends at ', there' "
           "(stop); yours ', t"),
    Answer(L4, "check_commit", "check_before_append", cm_check_before_append, True,
           "checks the stop strings before appending each token: a stop is seen one token late, or at "
           "the end of a run not at all",
           "wrong_reason: prompt 2 (limit 28, stop strings [' the']): the stop string and the limit came wi"
           'th the same token, '),
    Answer(L4, "check_commit", "eos_continue", cm_eos_continue, True,
           "`continue` on EOS: skips the EOS token but appends the run's tokens after it",
           "past_eos: prompt 0 (limit 28, stop strings [' the']): it goes on after the EOS the serial run s"
           "tops at: 'ever "),
    Answer(L4, "check_commit", "right_one_at_a_time", cm_one_at_a_time, False,
           "right: the shipped commit, one token at a time (right for one token a round)",
           'passed: each run stops exactly where the serial run does: a stop string, EOS or the length limi'
           't inside a ro'),
    Answer(L4, "check_commit", "right_vectorised", cm_vectorised, False,
           "right: no per-token loop; finds the earliest stop end in the new text and cuts once "
           "(one character a token)",
           'passed: each run stops exactly where the serial run does: a stop string, EOS or the length limi'
           't inside a ro'),
]


# ---------------------------------------------------------------------------------------------------
# Running them as the notebook does
# ---------------------------------------------------------------------------------------------------

def _observed(verdict) -> str:
    return f"{verdict.category}: {verdict.message[:100]}"


def _same(got: str, observed: str) -> bool:
    """Equal but for KV block numbers: the checks share one engine, whose free blocks rotate with
    every run before (so a block list depends on which answers ran earlier in the process)."""
    import re
    def blocks(text):
        return re.sub(r"blocks \[[\d, ]*\]?", "blocks [..]", text)
    return blocks(got) == blocks(observed)


class NotebookState:
    """What notebook 07's cells leave for each check, built once: its two engines (the ZOS one's last
    run the shipped policy's, cell 3; the speculative one's the shipped commit's, cell 21), the
    shipped abort's RaceError (cell 9) and the race of a loop holding 4 rounds on a ring of 3
    (cell 17).  The prediction checks only read them; the fix checks run on the checks' own engines."""

    PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]
    RING, DEPTH = 3, 4

    def __init__(self) -> None:
        import toy_engine as te
        from overlap_course.labs import plugins, shipped

        self.zos = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3))
        self.spec = te.Engine(te.EngineConfig(mode="zos", max_batch_size=3, num_draft_tokens=3))
        self.race = self.ring_race = None
        try:
            self.zos.generate(self.PROMPTS, max_new_tokens=12, on_round=plugins.aborts(shipped.abort, [(5, 1)]))
        except te.RaceError as err:
            self.race = err
        with plugins.ring(self.RING):
            try:
                plugins.ring_engine().generate(self.PROMPTS[:3], max_new_tokens=8,
                                               loop=plugins.keep_in_flight(self.DEPTH))
            except te.RaceError as err:
                self.ring_race = err
        self.zos.generate(self.PROMPTS, max_new_tokens=12,
                          on_round=plugins.per_request(wants_more=shipped.wants_more))
        self.spec.generate(self.PROMPTS, max_new_tokens=30, stop=[" was", "."],
                           on_round=plugins.per_request(commit=shipped.commit))

    def verdict(self, a: Answer):
        from overlap_course import checks
        if a.check == "check_wasted_round":
            return checks.check_wasted_round(a.answer, self.zos)
        if a.check == "check_abort_in_flight":
            return checks.check_abort_in_flight(a.answer, self.race)
        if a.check == "check_ring_race":
            return checks.check_ring_race(a.answer, self.ring_race, ring=self.RING)
        if a.check == "check_overshoot":
            return checks.check_overshoot(a.answer, self.spec)
        return getattr(checks, a.check)(a.answer)

    def close(self) -> None:  # the ring engine is the plug-ins' own: left open, as the notebook does
        for e in (self.zos, self.spec):
            e.close()


def run_all(answers=None, verbose=True) -> list[tuple[Answer, str]]:
    """Each answer through its check, in the state the notebook's cells leave (about 20 s)."""
    state, results = NotebookState(), []
    try:
        for a in answers or BLIND_LABS:
            got = _observed(state.verdict(a))
            results.append((a, got))
            if verbose:
                flag = "" if _same(got, a.observed) else "   <- observed differs"
                print(f"{a.check:22} {a.name:32} wrong={a.wrong!s:5} {got}{flag}")
    finally:
        state.close()
    return results


if __name__ == "__main__":
    run_all()
