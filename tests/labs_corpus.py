"""The labs' corpus (notebook 07, "bugs that shipped"): per lab, wrong fixes a learner might write,
each with the verdict category its checker must give, and right fixes written differently from the
reference (inline, another structure, the engine's own function called) that must pass.
``tests/test_labs_corpus.py`` runs every entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlap_course.labs import shipped
from toy_engine.sequence import Request


@dataclass
class Fix:
    lab: str        # "1" wants_more, "2" abort, "3" ring_slots, "4" commit
    name: str
    answer: object
    category: str = "passed"


# ---------------------------------------------------------------- lab 1: wants_more(req)

def wants_more(req):  # the reference
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens


def wants_more_remaining(req):
    return req.finish_reason is None and req.max_new_tokens - len(req.output_ids) > req.num_inflight


def wants_more_planned(req):
    return not req.finished and req.planned_len - len(req.prompt_ids) < req.max_new_tokens


def wants_more_engines_own(req):
    return Request.wants_more(req)


def wants_more_at_most(req):
    return not req.finished and len(req.output_ids) + req.num_inflight <= req.max_new_tokens


def wants_more_unfinished(req):
    return not req.finished


def wants_more_no_finished_check(req):
    return len(req.output_ids) + req.num_inflight < req.max_new_tokens


def wants_more_idle_only(req):
    return not req.finished and req.num_inflight == 0 and len(req.output_ids) < req.max_new_tokens


def wants_more_caps_in_flight_at_two(req):
    """Counts the rounds in flight, but at most two: a loop holding three plans one round too many."""
    return not req.finished and len(req.output_ids) + min(req.num_inflight, 2) < req.max_new_tokens


def wants_more_one_short(req):
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens - 1


def wants_more_planned_len(req):
    return not req.finished and req.planned_len < req.max_new_tokens


def wants_more_asks_itself(req):
    return req.wants_more() and req.num_inflight < 2


# lab 1, ways a request ends: EOS, a stop string, the limit (at a round's end; inside a round's run
# with drafts)

def wants_more_stop_only_finished(req):
    """Counts only a stop as finished: an EOS-finished request is planned round after round."""
    return req.finish_reason != "stop" and \
        len(req.output_ids) + req.num_inflight < req.max_new_tokens


def wants_more_stop_or_length_finished(req):
    return req.finish_reason not in ("stop", "length") and \
        len(req.output_ids) + req.num_inflight < req.max_new_tokens


def wants_more_abort_not_finished(req):
    """Counts stop, EOS and the limit as finished, but plans an aborted request again."""
    return req.finish_reason not in ("stop", "eos", "length") and \
        len(req.output_ids) + req.num_inflight < req.max_new_tokens


def wants_more_all_drafts_accepted(req):
    """Assumes every round in flight brings 1 + 3 tokens: declines rounds still needed."""
    return not req.finished and len(req.output_ids) + 4 * req.num_inflight < req.max_new_tokens


def wants_more_one_in_flight_at_most(req):
    return not req.finished and len(req.output_ids) + min(req.num_inflight, 1) < req.max_new_tokens


def wants_more_assumes_one_in_flight(req):
    return not req.finished and len(req.output_ids) + 1 < req.max_new_tokens


def wants_more_text_length(req):
    """Counts characters of the text (one per token here), but not the rounds in flight."""
    return not req.finished and len(req.text) < req.max_new_tokens


def wants_more_reason_none(req):
    return req.finish_reason is None and req.max_new_tokens > len(req.output_ids) + req.num_inflight


def wants_more_negated(req):
    return not (req.finished or len(req.output_ids) + req.num_inflight >= req.max_new_tokens)


def wants_more_every_reason_listed(req):
    done = req.finish_reason in ("stop", "eos", "length", "abort")
    return not done and req.max_new_tokens - req.num_inflight - len(req.output_ids) > 0


def wants_more_room_left(req):
    room = max(0, req.max_new_tokens - len(req.output_ids) - req.num_inflight)
    return bool(room) and not req.finished



# ---------------------------------------------------------------- lab 2: abort(engine, request_id)

def _find(engine, request_id):
    return next(r for r in engine.requests if r.id == request_id)


def abort(engine, request_id):  # the reference
    req = _find(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def abort_engines_own(engine, request_id):
    engine.abort(request_id)


def abort_inline(engine, request_id):
    for req in list(engine.scheduler.waiting) + engine.scheduler.running:
        if req.id == request_id and not req.finished:
            req.finish_reason = "abort"
            if req in engine.scheduler.waiting:
                engine.scheduler.waiting.remove(req)
            elif req.num_inflight == 0:
                engine.scheduler.free(req)


def abort_never_frees(engine, request_id):
    req = _find(engine, request_id)
    if not req.finished:
        req.finish_reason = "abort"
        if req in engine.scheduler.waiting:
            engine.scheduler.waiting.remove(req)


def abort_keeps_waiting(engine, request_id):
    req = _find(engine, request_id)
    if not req.finished:
        req.finish_reason = "abort"
        engine.scheduler.release_if_done(req)


def abort_not_marked(engine, request_id):
    req = _find(engine, request_id)
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    elif req.num_inflight == 0:
        engine.scheduler.free(req)


def abort_overwrites(engine, request_id):
    req = _find(engine, request_id)
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def abort_frees_twice(engine, request_id):
    req = _find(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    elif req.num_inflight == 0:
        engine.scheduler.blocks.free(req.blocks, req.index)
        engine.scheduler.free(req)


def abort_drops_from_running(engine, request_id):
    req = _find(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    elif req.num_inflight == 0:
        engine.scheduler.running.remove(req)


def abort_as_stop(engine, request_id):
    req = _find(engine, request_id)
    if not req.finished:
        req.finish_reason = "stop"
        if req in engine.scheduler.waiting:
            engine.scheduler.waiting.remove(req)
        engine.scheduler.release_if_done(req)


# lab 2, finished requests of every kind: EOS, stop, limit; with drafts and without

def abort_keeps_only_stop_and_length(engine, request_id):
    """Leaves stop- and limit-finished requests alone, but overwrites an EOS-finished one."""
    req = _find(engine, request_id)
    if req.finish_reason in ("stop", "length"):
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def abort_keeps_only_stop_and_eos(engine, request_id):
    req = _find(engine, request_id)
    if req.finish_reason in ("stop", "eos"):
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def abort_frees_under_one_round(engine, request_id):
    """Thinks one round in flight is harmless: frees under it."""
    req = _find(engine, request_id)
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    elif req.num_inflight <= 1:
        engine.scheduler.free(req)


def abort_frees_finished_at_once(engine, request_id):
    """Leaves a finished request's reason alone, but frees its blocks at once, under its extra
    round."""
    req = _find(engine, request_id)
    if req.finished:
        engine.scheduler.free(req)
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def abort_by_the_limit(engine, request_id):
    """Ends the request by lowering its limit to what it has: it finishes as "length"."""
    req = _find(engine, request_id)
    if req.finished:
        return
    req.max_new_tokens = len(req.output_ids)
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
        req.finish_reason = "abort"


def abort_id_as_position(engine, request_id):
    """Takes the id for a position in engine.requests: ids keep counting across runs (the check's
    reference runs first on the same engine, so no id of the checked run is a position)."""
    if request_id >= len(engine.requests):
        return
    req = engine.requests[request_id]
    if req.finished:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.release_if_done(req)


def abort_reason_is_none(engine, request_id):
    req = _find(engine, request_id)
    if req.finish_reason is not None:
        return
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    if req.num_inflight == 0:
        engine.scheduler.free(req)


def abort_scans_running(engine, request_id):
    """Looks the request up in the scheduler's queues, not in engine.requests."""
    waiting = [r for r in engine.scheduler.waiting if r.id == request_id]
    running = [r for r in engine.scheduler.running if r.id == request_id]
    for req in waiting:
        req.finish_reason = "abort"
        engine.scheduler.waiting.remove(req)
    for req in running:
        if req.finish_reason is None:
            req.finish_reason = "abort"
        engine.scheduler.release_if_done(req)



# ---------------------------------------------------------------- lab 3: ring_slots(depth)

def ring_slots(depth):  # the reference
    return depth + 1


def ring_slots_table(depth):  # every depth a ring of at most MAX_SLOTS (8) can hold
    return {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7, 7: 8}[depth]


def ring_slots_numpy(depth):
    return np.int64(len(range(depth + 1)))


def ring_slots_depth(depth):
    return depth


def ring_slots_at_least_two(depth):
    return max(2, depth)


def ring_slots_two_spare(depth):
    return depth + 2


def ring_slots_double(depth):
    return 2 * depth


def ring_slots_text(depth):
    return str(depth + 1)


def ring_slots_float(depth):
    return depth + 1.0


def ring_slots_largest(depth):
    return 8


# ---------------------------------------------------------------- lab 4: commit(req, tokens, eos_id, decode)

def commit(req, tokens, eos_id, decode):  # the reference: each token checked as it is appended
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
            return


def commit_engines_own(req, tokens, eos_id, decode):
    Request.commit(req, tokens, eos_id, decode)


def commit_shipped_per_token(req, tokens, eos_id, decode):
    for tok in tokens:
        shipped.commit(req, [tok], eos_id, decode)
        if req.finished:
            return


def commit_cut_first(req, tokens, eos_id, decode):
    """Find where the run must end, then append that much at once."""
    keep = tokens.index(eos_id) if eos_id in tokens else len(tokens)
    keep = min(keep, req.max_new_tokens - len(req.output_ids))
    reason = "eos" if keep < len(tokens) and tokens[keep] == eos_id else None
    for n in range(1, keep + 1):
        text = req.text + decode(tokens[:n])
        hit = next((s for s in req.stop if text.endswith(s)), None)
        if hit:
            req.output_ids += tokens[:n]
            del req.output_ids[len(req.output_ids) - len(hit):]
            req.text, req.finish_reason = text[: -len(hit)], "stop"
            return
    req.output_ids += tokens[:keep]
    req.text += decode(tokens[:keep])
    if reason or len(req.output_ids) >= req.max_new_tokens:
        req.finish_reason = reason or "length"


def commit_limit_per_run(req, tokens, eos_id, decode):
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


def commit_stop_per_run(req, tokens, eos_id, decode):
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


def commit_limit_before_stop(req, tokens, eos_id, decode):
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


def commit_keeps_eos(req, tokens, eos_id, decode):
    for tok in tokens:
        req.output_ids.append(tok)
        if tok == eos_id:
            req.finish_reason = "eos"
            return
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


def commit_stop_in_this_run(req, tokens, eos_id, decode):
    for n, tok in enumerate(tokens, 1):
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if s in decode(tokens[:n]):  # only this round's text is searched
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def commit_trims_text_only(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                req.finish_reason = "stop"
                return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def commit_keeps_stop(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if any(req.text.endswith(s) for s in req.stop):
            req.finish_reason = "stop"
            return
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def commit_eos_last_only(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok != eos_id:
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
    if tokens[-1] == eos_id:
        req.finish_reason = "eos"


def commit_never_finishes(req, tokens, eos_id, decode):
    room = req.max_new_tokens - len(req.output_ids)
    kept = [t for t in tokens if t != eos_id][:room]
    req.output_ids += kept
    req.text += decode(kept)


# lab 4, every ending with drafts and without: the limit at a round's end, inside a round's run,
# a stop past the limit in the limit's own run, EOS

def commit_limit_strictly_past(req, tokens, eos_id, decode):
    """`>` at the limit, the extra token dropped: a run ending exactly on the limit never ends."""
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) > req.max_new_tokens:
            req.output_ids.pop()
            req.text = decode(req.output_ids)
            req.finish_reason = "length"
            return
        for s in req.stop:
            if req.text.endswith(s):
                req.text = req.text[: -len(s)]
                del req.output_ids[len(req.output_ids) - len(s):]
                req.finish_reason = "stop"
                return


def commit_limit_strictly_past_kept(req, tokens, eos_id, decode):
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


def commit_limit_trimmed_after_run(req, tokens, eos_id, decode):
    """Stops per token, the limit once after the run (trimmed to it): a stop completed past the
    limit in the limit's own run wins."""
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
        del req.output_ids[req.max_new_tokens:]
        req.text = decode(req.output_ids)
        req.finish_reason = "length"


def commit_eos_skipped(req, tokens, eos_id, decode):
    """Drops EOS like padding and goes on with the run's other tokens."""
    for tok in tokens:
        if tok == eos_id:
            continue
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


def commit_eos_as_stop(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "stop"
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
            return


def commit_limit_one_early(req, tokens, eos_id, decode):
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
        if len(req.output_ids) + 1 >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def commit_eos_unfinished(req, tokens, eos_id, decode):
    """Stops at EOS but never says so: the request is planned again and goes on after it."""
    for tok in tokens:
        if tok == eos_id:
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
            return


def commit_trim_first_stop_once(req, tokens, eos_id, decode):
    """Cuts the run at the limit and at EOS, but looks for a stop string once, at the end."""
    run = tokens[: tokens.index(eos_id)] if eos_id in tokens else list(tokens)
    run = run[: req.max_new_tokens - len(req.output_ids)]
    req.output_ids += run
    req.text += decode(run)
    for s in req.stop:
        if req.text.endswith(s):
            req.text = req.text[: -len(s)]
            del req.output_ids[len(req.output_ids) - len(s):]
            req.finish_reason = "stop"
            return
    if len(run) < len(tokens) and tokens[len(run)] == eos_id:
        req.finish_reason = "eos"
    elif len(req.output_ids) >= req.max_new_tokens:
        req.finish_reason = "length"


def commit_limit_equal(req, tokens, eos_id, decode):
    """`==` at the limit: one token at a time, the count reaches it exactly."""
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
        if len(req.output_ids) == req.max_new_tokens:
            req.finish_reason = "length"
            return


def commit_counts_text(req, tokens, eos_id, decode):
    """Counts the text's characters (one per token, EOS never in the text)."""
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        hit = next((s for s in req.stop if s in req.text), None)
        if hit:
            req.text = req.text[: req.text.index(hit)]
            req.output_ids = req.output_ids[: len(req.text)]
            req.finish_reason = "stop"
            return
        if len(req.text) >= req.max_new_tokens:
            req.finish_reason = "length"
            return


def commit_trim_first_then_per_token(req, tokens, eos_id, decode):
    """Cuts the run at the limit first, then looks at each kept token."""
    room = req.max_new_tokens - len(req.output_ids)
    for tok in tokens[:room]:
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



def commit_calls_itself(req, tokens, eos_id, decode):
    req.commit(tokens[:1], eos_id, decode)


WRONG = [
    Fix("1", "the notebook's shipped version", shipped.wants_more, "extra_step"),
    Fix("1", "at most the limit", wants_more_at_most, "extra_step"),
    Fix("1", "unfinished is enough", wants_more_unfinished, "extra_step"),
    Fix("1", "no finished check", wants_more_no_finished_check, "finished_scheduled"),
    Fix("1", "only when nothing is in flight", wants_more_idle_only, "serializes"),
    Fix("1", "one short", wants_more_one_short, "stalled"),
    Fix("1", "rounds in flight capped at two", wants_more_caps_in_flight_at_two, "extra_step"),
    Fix("1", "planned_len counts the prompt", wants_more_planned_len, "stalled"),
    Fix("1", "asks req.wants_more()", wants_more_asks_itself, "calls_itself"),
    Fix("1", "only a stop counts as finished", wants_more_stop_only_finished, "finished_scheduled"),
    Fix("1", "stop and length count as finished, EOS not", wants_more_stop_or_length_finished,
        "finished_scheduled"),
    Fix("1", "an abort is not finished", wants_more_abort_not_finished, "finished_scheduled"),
    Fix("1", "every draft accepted", wants_more_all_drafts_accepted, "serializes"),
    Fix("1", "one round in flight at most", wants_more_one_in_flight_at_most, "extra_step"),
    Fix("1", "always one round in flight", wants_more_assumes_one_in_flight, "stalled"),
    Fix("1", "the text's length", wants_more_text_length, "extra_step"),
    Fix("2", "the notebook's shipped version", shipped.abort, "free_in_use"),
    Fix("2", "never frees", abort_never_frees, "kept_blocks"),
    Fix("2", "leaves it waiting", abort_keeps_waiting, "aborted_scheduled"),
    # a second abort of a request freed already frees it again: the toy's scheduler.free
    # refuses that (round 12), the first mistake the record shows
    Fix("2", "never marks it finished", abort_not_marked, "double_free"),
    Fix("2", "overwrites a finished reason", abort_overwrites, "overwrote_finish"),
    Fix("2", "frees the blocks, then the request", abort_frees_twice, "double_free"),
    Fix("2", "drops it from running", abort_drops_from_running, "kept_blocks"),
    Fix("2", "finishes it as a stop", abort_as_stop, "wrong_reason"),
    Fix("2", "leaves stop and length alone, not EOS", abort_keeps_only_stop_and_length,
        "overwrote_finish"),
    Fix("2", "leaves stop and EOS alone, not the limit", abort_keeps_only_stop_and_eos,
        "overwrote_finish"),
    Fix("2", "frees under one round in flight", abort_frees_under_one_round, "free_in_use"),
    Fix("2", "frees a finished request at once", abort_frees_finished_at_once, "double_free"),
    # it ends "length" one round on (round 22: a lowered limit ends a request; it stalled before)
    Fix("2", "lowers the limit instead", abort_by_the_limit, "still_running"),
    Fix("2", "the id taken for a position", abort_id_as_position, "wrong_request"),
    Fix("3", "the notebook's shipped version", shipped.ring_slots, "race"),
    Fix("3", "one slot per round in flight", ring_slots_depth, "race"),
    Fix("3", "at least two", ring_slots_at_least_two, "race"),
    Fix("3", "two spare", ring_slots_two_spare, "too_many"),
    Fix("3", "twice the depth", ring_slots_double, "too_many"),
    Fix("3", "the engine's limit", ring_slots_largest, "too_many"),
    Fix("3", "a string", ring_slots_text, "shape"),
    Fix("3", "a float", ring_slots_float, "shape"),
    Fix("4", "the notebook's shipped version", shipped.commit, "missed_stop"),
    Fix("4", "limit checked per run", commit_limit_per_run, "past_limit"),
    Fix("4", "stops checked per run", commit_stop_per_run, "missed_stop"),
    Fix("4", "limit before stop", commit_limit_before_stop, "wrong_reason"),
    Fix("4", "EOS kept", commit_keeps_eos, "eos_kept"),
    Fix("4", "stop searched in this round only", commit_stop_in_this_run, "missed_stop"),
    Fix("4", "text trimmed, tokens not", commit_trims_text_only, "text_mismatch"),
    Fix("4", "stop string kept", commit_keeps_stop, "kept_stop"),
    Fix("4", "EOS only as the run's last token", commit_eos_last_only, "past_eos"),
    Fix("4", "`>` at the limit, the extra token dropped", commit_limit_strictly_past, "stalled"),
    Fix("4", "`>` at the limit", commit_limit_strictly_past_kept, "past_limit"),
    Fix("4", "limit trimmed once after the run", commit_limit_trimmed_after_run, "stop_past_limit"),
    Fix("4", "EOS skipped", commit_eos_skipped, "past_eos"),
    Fix("4", "EOS finishes as a stop", commit_eos_as_stop, "wrong_reason"),
    Fix("4", "limit one token early", commit_limit_one_early, "stopped_early"),
    Fix("4", "EOS never marked", commit_eos_unfinished, "past_eos"),
    Fix("4", "cut at the limit, stop looked for once", commit_trim_first_stop_once, "missed_stop"),
    Fix("4", "calls req.commit", commit_calls_itself, "calls_itself"),
    Fix("4", "never finishes a request", commit_never_finishes, "stalled"),
]

RIGHT = [
    Fix("1", "the reference", wants_more),
    Fix("1", "tokens still to come", wants_more_remaining),
    Fix("1", "from planned_len", wants_more_planned),
    Fix("1", "the engine's own", wants_more_engines_own),
    Fix("2", "the reference", abort),
    Fix("2", "the engine's own", abort_engines_own),
    Fix("2", "scanning the queues", abort_inline),
    Fix("3", "the reference", ring_slots),
    Fix("3", "a table of every depth", ring_slots_table),
    Fix("3", "a NumPy integer", ring_slots_numpy),
    Fix("4", "the reference", commit),
    Fix("4", "the engine's own", commit_engines_own),
    Fix("4", "the shipped one, a token at a time", commit_shipped_per_token),
    Fix("4", "cut first, append once", commit_cut_first),
    Fix("1", "reason is None", wants_more_reason_none),
    Fix("1", "negated", wants_more_negated),
    Fix("1", "every reason listed", wants_more_every_reason_listed),
    Fix("1", "room left", wants_more_room_left),
    Fix("2", "reason is None, frees when nothing is in flight", abort_reason_is_none),
    Fix("2", "from the scheduler's queues", abort_scans_running),
    Fix("4", "`==` at the limit", commit_limit_equal),
    Fix("4", "counts the text, finds stops with `in`", commit_counts_text),
    Fix("4", "cut at the limit first, then per token", commit_trim_first_then_per_token),
]
