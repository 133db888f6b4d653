"""Lesson 04 (notebook 04_stale_lengths, exercise 04_seqlen_correction): with speculative
decoding, a round prepared while the previous one is in flight has stale lengths, and the
device corrects them before the forward.  The notebook's questions compute the corrected
values by hand; the exercise's checker runs the learner's correction on hand-made cases and
then inside a ZOS engine with drafts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from overlap_course.device_state import (ChangedInputs, EndsProcess, StillRunning,
                                         WrongKeyLengths, changed_inputs, watched_message,
                                         watched_correction)
from toy_engine.sending import NotSendable

from . import context, correction_cases, pool, sandbox
from .correction_cases import FIELDS, worked_case, worked_requests
from .correction_slips import variants, wrong_values
from .answers import int_list, items, one_number, show
from .errors import at, quoted
from .harness import exercise_check, notebook_check
from .device_homes import host_made
from .host_waits import (HostReads, changes_nothing, half_imports_dropped, half_loaded_torch,
                         host_read, python_loop, scripted, scripted_part, second_call,
                         state_kept, stopped, torch_half_loaded, valueless_failure, versions,
                         wrote)
from .op_watch import Watch, hidden_ops
from .verdict import Verdict, article, counted, fails, not_implemented, passes, unanswered
from .whose_fix import engine_fix

__all__ = ["check_true_key_length", "check_corrected_slots", "worked_case", "check_correction",
           "check_metadata_answer"]


@notebook_check
@context.given(host_seqlens_k=context.whole(1, context.BIG, "the host's planned key length (27)"),
               accepted=context.whole(0, context.BIG, "the in-flight round's accepted drafts (4)"))
def check_true_key_length(answer, host_seqlens_k: int, accepted: int, name: str = "true_seqlens_k") -> Verdict:
    """Predict (04): the host planned ``host_seqlens_k`` for a request whose in-flight
    round accepted ``accepted`` drafts; what is the real key length?  (``name``: the answer's
    variable; the notebook's second request, with another accepted count, is a second question.)"""
    answer = one_number(answer, f"set `{name}` to a number", "a key length is one whole number", whole=True)
    if isinstance(answer, Verdict):
        return answer
    want = host_seqlens_k + accepted
    if answer == want:
        return passes(f"{host_seqlens_k} + {accepted} = {want}: the host already counted one token for the "
                      f"in-flight round; the {accepted} accepted drafts are the part it could not know")
    if answer == host_seqlens_k:
        return fails("stale", "that is the host's stale value: the in-flight round added its accepted drafts too")
    if answer == host_seqlens_k + accepted + 1:
        return fails("off_by_one", "one too many: the host's plan already counts the in-flight round's bonus token "
                                   "(it assumed one token per in-flight round); add only the accepted drafts")
    if answer == host_seqlens_k + 1:
        return fails("plus_one", "the host already assumed one token for the in-flight round; what it missed is the "
                                 "number of accepted drafts")
    if answer == host_seqlens_k - accepted:
        return fails("subtracted",
                     "the host's value is too short, not too long: accepted drafts make the sequence longer")
    return fails("wrong", f"{answer} is not it: the real key length is the host's plan plus the accepted drafts "
                          f"of the in-flight round")


def _in_table(a: dict) -> str | None:
    last = max(a["positions"]) + a["accepted"]
    if last // a["block_size"] < len(a["table"]):
        return None
    return (f"position {last} (the last stale one plus accepted={a['accepted']}) is past the "
            f"{len(a['table'])} blocks of table {show(a['table'])}")


@notebook_check
@context.given(positions=context.wholes(0, context.BIG, "the stale positions ([10, 11, 12])"),
               table=context.wholes(0, context.BIG, "the request's block table ([6, 0, 8, 5])"),
               accepted=context.whole(0, context.BIG, "the in-flight round's accepted drafts (2)"),
               block_size=context.whole(1, context.BIG, "the KV cache's block size (4)"),
               agree=_in_table)
def check_corrected_slots(answer, positions, table, accepted: int, block_size: int, name: str = "new_slots") -> Verdict:
    """Your turn (04): the corrected slot_mapping of one request whose stale positions are
    ``positions`` and whose in-flight round accepted ``accepted`` drafts.  (``name``: the answer's
    variable; the notebook's second request, whose positions cross a block boundary, is a second question.)"""
    if answer is None:
        return unanswered(f"set `{name}` to a list of slots, one per fed token")
    got = int_list(answer)
    if got is None:
        return fails("shape", "write the slots as a list of whole numbers, one per fed token")
    table, positions = [int(b) for b in table], [int(p) for p in positions]
    if len(got) != len(positions):
        return fails("shape", f"the request feeds {counted(len(positions), 'token')} this round "
                              f"(seqlens_q does not change), so give "
                              f"{counted(len(positions), 'slot')}, not {len(got)}")

    def slots(pos_list):
        return [table[p // block_size] * block_size + p % block_size if 0 <= p // block_size < len(table) else None
                for p in pos_list]

    want = slots([p + accepted for p in positions])
    if got == want:
        return passes(f"positions {[p + accepted for p in positions]} go through the block table to slots "
                      f"{want}")
    stale = slots(positions)
    mistakes = [
        (stale, "stale", "those are the host's stale slots: positions move right by the accepted count first"),
        ([s + accepted for s in stale], "slots_shifted",
         "adding the accepted count to the old slots is wrong where a position crosses into the next block: "
         "recompute each slot from the new position through the block table"),
        ([p + accepted for p in positions], "positions_not_slots",
         "those are the corrected positions; now turn each into a slot through the block table"),
        (slots([p + accepted + 1 for p in positions]), "off_by_one",
         "you shifted by 1 + accepted: the host's plan already counts one token for the in-flight round"),
    ]
    if accepted != 1:
        mistakes.append((slots([p + 1 for p in positions]), "shifted_by_one",
                         f"you shifted by 1: this request's in-flight round accepted {accepted} drafts"))
    for value, category, why in mistakes:
        if got == value:
            return fails(category, f"{got}: {why}")
    return fails("wrong", f"{got} is not it: shift each position by the accepted count ({accepted}), then slot = "
                          f"table[pos // {block_size}] * {block_size} + pos % {block_size} with table {table}")


# ------------------------------------------------------------------ exercise 04

def _stays_on_device(fn) -> Verdict | None:
    """Exercise 04's rule, on the worked case and on twice as many requests: no value read
    on the host, and as many tensor operations for 6 requests as for 3 (no loop over them),
    each counted on a second call of its size (``host_waits.second_call``: a cache that missed
    on the first is warm); then run on tensors without values, which no read can hide from."""
    half_imports_dropped()  # a dispatch mode watches each call: torch may import sympy for it
    if (half := half_loaded_torch()) is not None:  # and torch._dynamo (round 28's Interrupt)
        return torch_half_loaded(half)
    calls = []  # each size's counted call: its HostReads
    for copies in (1, 2):
        meta, accepted = worked_requests(4, [1, 1, 1], copies)
        given = {name: t.clone() for name, t in meta.items()}
        with HostReads() as seen, Watch(seen) as watch:
            fn(meta, accepted, 4)
        verdict = hidden_ops(meta, given, watch)
        if verdict is None:
            verdict = host_read(seen, copies)
        if verdict is None:
            verdict, seen = second_call(fn, copies)
        if verdict is not None:
            return verdict
        calls.append(seen)
    counts = [call.ops for call in calls]
    hidden = any(call.unaccounted for call in calls)  # torch's function modes switched off:
    ops = [call.dispatched for call in calls] if hidden else counts  # counted at dispatch,
    if ops[1] > ops[0] and not hidden:  # after the run without values, which names a host
        return python_loop(ops, hidden)  # read first (round 52: a loop there passed)
    failed = valueless_failure(fn, *worked_requests(4, [1, 1, 1]), 4, counts[0])
    half = half_loaded_torch() if failed is not None else None
    if half is not None:
        return torch_half_loaded(half)
    if failed is not None and changes_nothing(fn):
        return stopped("its last two calls (on tensors that hold no values, then on tensors "
                       "that do)")
    if failed is not None:
        return fails("host_read",
                     f"your correction computes the right values, but it needs them on the host: "
                     f"run on tensors that hold no values (as a GPU's are to the host) it failed "
                     f"({failed}). On a GPU such a read makes the host wait for the device, "
                     f"which is what ZOS removes: keep every step a tensor operation")
    if ops[1] > ops[0]:
        return python_loop(ops, hidden)
    seen = host_made(fn, *correction_cases.unseen_batch(), 4)
    if seen.copied:
        return fails("host_tensor",
                     f"your correction computes the right values on this CPU, but `{seen.mixed}` "
                     f"copies a tensor it made on the host (a factory such as `torch.arange(n)` "
                     f"without `device=`) to the device. On a GPU such a copy waits for "
                     f"everything queued on the device first, the wait ZOS removes: make it where "
                     f"the metadata lives, `device=meta[\"rows\"].device`")
    if seen.mixed is not None:
        return fails("host_tensor",
                     f"your correction computes the right values on this CPU, but `{seen.mixed}` "
                     f"mixes a tensor it made on the host (a factory such as `torch.arange(n)` "
                     f"without `device=`, or one made when its cell ran) with the metadata's "
                     f"tensors, which live on the device. On a GPU that is an error (tensors on "
                     f"two devices): make it where the metadata lives, "
                     f"`device=meta[\"rows\"].device`")
    return None


def _judge_case(fn, meta, accepted, block_size, expected, label: str) -> Verdict | None:
    """One hand-made case: the corrected fields' values, then what the correction must leave
    alone (``device_state.changed_inputs``)."""
    given, was = {n: t.clone() for n, t in meta.items()}, accepted.clone()
    held = versions(meta)
    slips = variants(meta, accepted, block_size)
    fn(meta, accepted, block_size)
    kept = _not_kept(meta, given)
    if kept is not None:
        return fails("shape", f"{label}: {kept}")
    got = {n: meta[n].tolist() for n in FIELDS}
    if got != expected:
        return wrong_values(fn, got, expected, {n: given[n].tolist() for n in FIELDS},
                            wrote(meta, held), slips, label, (given, was))
    changed = changed_inputs(given, was, meta, accepted)
    return None if changed is None else fails("changed_input", f"{label}: {changed}")


def _not_kept(meta: dict, given: dict) -> str | None:
    """What a correction made of a field that must stay a tensor of the host's shape (removed
    it, stored a list, None or a string, moved it to another device, changed its shape), or
    None: read by the checker, not raised by the learner's code (blind round 27: "your
    correction raised KeyError")."""
    keep = ("each field must stay a tensor of the host's dtype and shape, corrected in place "
            "(`+=`, `.copy_`): the forward reads them all")
    gone = [n for n in given if n not in meta]
    if gone:
        return f"your correction removed {', '.join(f'`meta[{n!r}]`' for n in gone)}: {keep}"
    for name, held in given.items():
        now = meta[name]
        if not isinstance(now, torch.Tensor):
            what = "None" if now is None else f"a {type(now).__name__} ({show(now)})"
            return f"`meta[{name!r}]` is now {what}, not a tensor: {keep}"
        if now.device != held.device:  # round 27b: read, torch's meta device said "not
            empty = ", which holds no values" if now.is_meta else ""  # implemented yet"
            return (f"`meta[{name!r}]` is now a tensor on device {now.device.type!r}{empty}; the "
                    f"host wrote it on {held.device.type!r}: {keep}")
        if now.shape != held.shape:
            return (f"`meta[{name!r}]` now has shape {list(now.shape)} ({show(now.tolist())}); "
                    f"the host wrote shape {list(held.shape)}: {keep}")
    return None


@exercise_check(lambda: pool.start({"num_draft_tokens": pool.DRAFTS}, {}), pool.reference,
                pool.endings_reference, calls="correct_seqlens_qk(meta, accepted, block_size)")
def check_correction(correct_seqlens_qk) -> Verdict:
    """Exercise 4: ``correct_seqlens_qk(meta, accepted, block_size)`` fixes meta in place.

    Four hand-made cases (the worked case; one request not pending; blocks of 8; positions
    that run on from one request to the next, so only ``seqlens_q`` tells where a request
    starts: the notebook packs tokens "request after request, `seqlens_q` tokens each"), four
    with other k and batch sizes, two for slips those let through (requests that feed different
    numbers of tokens; a request not pending whose row is not its batch position:
    ``correction_cases.LAST``); the same cases 60 calls more and one whose ``accepted`` was
    rewritten in place (``host_waits.state_kept``); then a ZOS engine with 3 drafts per round
    whose text must equal plain greedy decoding and whose every batch's seqlens_k must be the
    engine's own correction's (``device_state.watched_correction``).
    """
    started, cases = time.monotonic(), correction_cases.every_case()
    if (helper := scripted_part(correct_seqlens_qk)) is not None:
        return scripted(helper)
    for meta, accepted, block_size, expected, label in cases:
        try:
            verdict = _judge_case(correct_seqlens_qk, meta, accepted, block_size, expected, label)
        except NotImplementedError:
            return not_implemented("`correct_seqlens_qk`")
        except Exception as err:  # noqa: BLE001
            return fails("raised", f"{label} your correction raised {quoted(err)}{at(err)}")
        if verdict is not None:
            return verdict
    try:
        verdict = _stays_on_device(correct_seqlens_qk)
    except Exception as err:  # noqa: BLE001
        return fails("raised", f"with 6 requests instead of 3 your correction raised "
                                f"{quoted(err)}{at(err)}")
    if verdict is not None:
        return verdict
    try:
        verdict = state_kept(correct_seqlens_qk)
    except Exception as err:  # noqa: BLE001
        return fails("raised", f"called on the cases again your correction raised "
                                f"{quoted(err)}{at(err)}")
    if verdict is not None:
        return verdict
    engine = pool.engine(num_draft_tokens=pool.DRAFTS)
    watched = watched_correction(correct_seqlens_qk, started + _ON_DEVICE * sandbox.TIME_LIMIT_S)
    run = (f"in the engine (block_size {engine.config.block_size}, {pool.DRAFTS} drafts, "
           f"batches of 1 to 3 requests)")
    try:
        outs = engine.generate(pool.PROMPTS, max_new_tokens=pool.MAX_NEW_TOKENS, correction=watched)
    except Exception as err:  # noqa: BLE001
        return _engine_failed(err, engine, run)
    diff = pool.compare([c.token_ids for c in outs], pool.reference())
    if diff:
        return fails("engine_mismatch", f"with your correction in ZOS + speculation ({pool.DRAFTS} drafts), {diff}")
    # requests that end on EOS, a stop string, the limit inside a speculative step and at its end
    try:
        outs = engine.generate(pool.ENDINGS_PROMPTS, correction=watched, **pool.ENDINGS_RUN)
    except Exception as err:  # noqa: BLE001
        return _engine_failed(err, engine, pool.endings_label(pool.DRAFTS))
    diff = pool.compare([c.token_ids for c in outs],
                        [c.token_ids for c in pool.endings_reference()])
    if diff:
        return fails("engine_mismatch", f"{pool.endings_label(pool.DRAFTS)}, with your "
                                        f"correction: {diff}")
    try:
        meta, accepted, expected = worked_case()
        verdict = engine_fix(correct_seqlens_qk, meta, accepted, 4, expected)
    except Exception as err:  # noqa: BLE001
        return fails("raised", f"called once more on the worked requests your correction raised "
                                f"{quoted(err)}{at(err)}")
    if verdict is not None:
        return verdict
    return passes(f"the {len(cases)} cases are right and ZOS + speculation (k={pool.DRAFTS}) "
                  f"matches plain greedy decoding; {engine.stats.mean_accepted_per_round:.2f} "
                  f"drafts accepted per request-round")


# The share of the check's time limit after which a correction still running on the device is
# stopped there, naming its line: the rest leaves time to report it before the host's limit.
_ON_DEVICE = 0.8


def _engine_failed(err: BaseException, engine, run: str) -> Verdict:
    """A run that failed: a batch's wrong seqlens_k, a changed input, a correction stopped on
    the device (``StillRunning``, where it was), or another error of the learner's code."""
    if watched_message(err, WrongKeyLengths):
        return _wrong_key_lengths(err, engine)
    if watched_message(err, ChangedInputs):
        return fails("changed_input", f"in the engine: {watched_message(err, ChangedInputs)}")
    hung = watched_message(err, StillRunning)
    if hung:
        return fails("time_limit",
                     f"{run} your correction was {hung} (the hand-made cases had passed): the "
                     f"checker stopped it there. A loop that never ends only in the engine's run "
                     f"usually waits on a condition that holds there (its block_size, its batch)")
    if watched_message(err, EndsProcess):
        return fails("engine_error", f"{run} your correction {watched_message(err, EndsProcess)}"
                                     f": the checker stopped it there. Return from it instead")
    if isinstance(err, NotSendable):  # refused on the host, before or between launches
        return fails("engine_error", f"{run} the engine refused to send your correction to its "
                                     f"device: {quoted(err)}")
    return fails("engine_error", f"{run} your correction failed on the device: {quoted(err)}")


def _wrong_key_lengths(err: BaseException, engine) -> Verdict:
    """A run's batch whose corrected seqlens_k was wrong (``device_state.watched_correction``)."""
    return fails("seqlens_k",
                 f"in the engine (block_size {engine.config.block_size}, {pool.DRAFTS} drafts), "
                 f"{watched_message(err, WrongKeyLengths)}. The toy's attention masks keys by "
                 "position, so its "
                 "tokens do not show it, but a real attention kernel reads seqlens_k to know how "
                 "many keys each request has: it must grow by the accepted drafts of every pending "
                 "request, whatever k and the batch size")


def _marked(answer: Mapping, shape: str) -> set | Verdict:
    """The fields a dict {field: True/False} marks True (iterating it would give every key,
    the fields marked False too); a dict with any other value, None included (``dict.fromkeys``
    gives None), is refused as a dict: its keys are not read as the answer."""
    marks = dict(answer)
    odd = [(field, v) for field, v in marks.items() if not isinstance(v, bool)]
    if odd:
        field, value = odd[0]
        return fails("shape", f"write {shape}, not a dict: a dict is read as {{field: True or "
                              f"False}}, and yours maps {show(field)} to {show(value)}, not a "
                              f"bool")
    return {field for field, stale in marks.items() if stale}


CORRECTED = {"seqlens_k", "positions", "slot_mapping", "input_ids"}
UNCHANGED = {"seqlens_q", "cu_seqlens_q", "block_tables", "rows"}
DERIVED = {"cu_seqlens_k"}  # taught in notebook 01: the running sum of seqlens_k, so it moves too
INPUTS = {"pending"}  # shown in the worked case: says whether to correct a row, never corrected itself

_FIELD_SET = 'a set of field names as strings, e.g. {"seqlens_q", "rows"}'


# Why each field that stays does, in the notebook's words: each its own (blind round 25 gave
# `rows` the lengths' and blocks' reason, round 27 gave `cu_seqlens_q` the blocks')
_STAYS = {"seqlens_q": "each decode request still feeds 1 + k tokens",
          "cu_seqlens_q": "`cu_seqlens_q` is the running sum of `seqlens_q`, which stays",
          "block_tables": "a request's blocks were reserved at admission, with room for drafts",
          "rows": "`rows` identify the request, not its length"}


def _unchanged_why(fields: set) -> str:
    """Why the fields that stay do, one reason per field, in the notebook's order."""
    return "; ".join(why for field, why in _STAYS.items() if field in fields)


@exercise_check(answer=f"a plain {_FIELD_SET[2:]}")
def check_metadata_answer(answer) -> Verdict:
    """Try-it: which metadata must be corrected when the previous round accepted one draft?"""
    if answer is None or answer is NotImplemented:
        return not_implemented("the set of field names", f"`needs_correction` is still {answer}")
    shape = _FIELD_SET
    if isinstance(answer, (str, bytes)):
        return fails("shape", f"write {shape}, not one string ({show(answer)}): a string is read letter by letter")
    if isinstance(answer, Mapping):  # "Answer with a set of field names": a dict's keys are not it
        answer = _marked(answer, shape)
        if isinstance(answer, Verdict):
            return answer
    names = items(answer, shape)
    if isinstance(names, Verdict):
        return names
    if not all(isinstance(a, str) for a in names):
        odd = next(a for a in names if not isinstance(a, str))
        return fails("shape", f"write {shape}; {show(odd)} is {article(type(odd).__name__)}, not "
                              f"a field name")
    answer = set(names)
    if answer & INPUTS:
        return fails("input_field",
                     "`pending` does not change: it is one of the correction's inputs (which rows had a round in "
                     "flight when this one was prepared, as in the worked case), not a length the device must "
                     "correct. Leave it out and name the fields that move when a draft is accepted")
    unknown = answer - CORRECTED - UNCHANGED - DERIVED
    if unknown:
        return fails("unknown_field", f"not a metadata field of the batch: {sorted(unknown)}; choose from "
                                      f"{sorted(CORRECTED | UNCHANGED | DERIVED)}")
    missing, extra = CORRECTED - answer, answer & UNCHANGED
    if missing:
        return fails("missing_field",
                     f"also stale: {sorted(missing)} (hint: what depends on where the sequence ends?)")
    if extra:
        return fails("unchanged_field", f"{sorted(extra)} do not change: {_unchanged_why(extra)}")
    aside = (". And yes, cu_seqlens_k moves with seqlens_k (it is their running sum): the toy reads keys "
             "through block tables and never builds it, but an engine that packs keys must correct it too"
             if "cu_seqlens_k" in answer else
             ". (cu_seqlens_k, the running sum of seqlens_k from notebook 01, would move too; the toy never "
             "builds it)")
    return passes("seqlens_k, positions and slot_mapping shift by the accepted count; input_ids take "
                  "the bonus token and new drafts from the device" + aside)


