"""The four bugs, in the shape the engines cited in notebook 07 shipped them, written for the toy.

Each is right in the situation its authors had in mind (one round at a time, a loop holding one
step, one token per round) and wrong in the one overlap or speculation adds; notebook 07's learner
cells start from a copy of each (tests/test_labs.py keeps the copies equal to these).
"""

from __future__ import annotations


def wants_more(req) -> bool:
    """Schedule a request for another decode round while it is unfinished and short of its limit."""
    return not req.finished and len(req.output_ids) < req.max_new_tokens


def abort(engine, request_id: int) -> None:
    """Stop a request and give its batch row and KV blocks back at once."""
    req = next(r for r in engine.requests if r.id == request_id)
    req.finish_reason = "abort"
    if req in engine.scheduler.waiting:
        engine.scheduler.waiting.remove(req)
    engine.scheduler.free(req)


def ring_slots(depth: int) -> int:
    """Host buffer slots for a loop that keeps ``depth`` rounds in flight: the toy's two."""
    return 2


def commit(req, tokens, eos_id: int, decode) -> None:
    """Append one round's accepted tokens (EOS ends the request), then check the stop strings
    and the length limit once, on the run as a whole."""
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
