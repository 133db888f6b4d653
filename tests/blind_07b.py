"""Blind learner corpus for notebook 07b (Bugs of 2026), wrong and unusual-right answers.

How the notebook calls each check (the answer is always the first argument):
  check_stale_mask(stray_at, title)   # title = plugins_2026.title_ring_engine(), called right
                                      # after `with plugins.ring(3): title.generate(PROMPTS,
                                      # max_new_tokens=16, loop=plugins_2026.batch_queue(2,
                                      # shipped_2026.before_sample))`
  check_before_sample(before_sample)  # before_sample(engine, plan, held) -> int
  check_token_leak(leak, zos)         # zos = te.Engine(te.EngineConfig(mode="zos",
                                      # max_batch_size=3)), called right after
                                      # zos.generate(P5, max_new_tokens=16, stop=[" the"],
                                      # loop=plugins_2026.future_key(shipped_2026.key))
  check_future_key(key)               # key(req, b) -> int in 0..2
"""
import collections
import itertools
from dataclasses import dataclass

import numpy as np

from toy_engine.constraint import TitleCase


@dataclass
class Answer:
    check: str      # checker name as the notebook calls it
    name: str       # short unique id
    answer: object  # what the learner passes as the checker's first argument
    wrong: bool     # True if wrong by the notebook's own text
    why: str        # one sentence


BLIND: list[Answer] = []


def add(check, name, wrong, why):
    def deco(obj):
        BLIND.append(Answer(check, name, obj, wrong, why))
        return obj
    return deco


def value(check, name, wrong, why, obj):
    """Register a plain value (a prediction)."""
    BLIND.append(Answer(check, name, obj, wrong, why))


SM, BS, TL, FK = "check_stale_mask", "check_before_sample", "check_token_leak", "check_future_key"

# ---------------------------------------------------------------- Lab 5, predict (stray_at)
# shipped queue, prompt 0: ', tTom tHe lAnna'; the first capital with no space before it is 'T' at 3
value(SM, "sm_lowercase_t", True,
      "2 is the 't' sampled unmasked after the space, not the stray capital itself", 2)
value(SM, "sm_the_space", True, "1 is the space whose mask went missing, not the capital", 1)
value(SM, "sm_one_based", True, "counts from 1 although the notebook says count from 0", 4)
value(SM, "sm_with_prompt", True,
      "counts the prompt's 16 characters too; the notebook says the generated text only", 19)
value(SM, "sm_second_stray", True, "8 is the second stray capital ('tHe'), not the first", 8)
value(SM, "sm_negative", True,
      "-13 names the same character from the end, but the notebook asks to count from 0", -13)
value(SM, "sm_letter", True, "passes the letter 'T' instead of its index", "T")
value(SM, "sm_numpy_int", False, "3 as a numpy integer, e.g. from np.argmax over a mask", np.int64(3))
value(SM, "sm_len_expr", False, "3 computed as the length of the text before it, ', t'", len(", t"))

# ---------------------------------------------------------------- Lab 5, fix (before_sample)


@add(BS, "bs_shipped", True, "the shipped answer: samples with the previous step still held")
def bs_shipped(engine, plan, held):
    return 0


@add(BS, "bs_always_drain", True,
     "drains the queue even without a constraint, so the queue of 2 or 3 loses its overlap")
def bs_always_drain(engine, plan, held):
    return len(held)


@add(BS, "bs_always_one", True,
     "processes one step whatever the constraint, serialising the unconstrained queue")
def bs_always_one(engine, plan, held):
    return 1 if held else 0


@add(BS, "bs_hasattr", True,
     "hasattr(engine, 'constraint') is always true (it is None without one): always drains")
def bs_hasattr(engine, plan, held):
    return len(held) if hasattr(engine, "constraint") else 0


@add(BS, "bs_config_typo", True,
     "compares the config to 'title' instead of 'title_case', so it never waits")
def bs_config_typo(engine, plan, held):
    return len(held) if engine.config.constraint == "title" else 0


@add(BS, "bs_minus_one", True, "off by one: leaves the newest held step, the one the mask needs")
def bs_minus_one(engine, plan, held):
    return max(0, len(held) - 1) if engine.constraint is not None else 0


@add(BS, "bs_if_committed_space", True,
     "waits only when the committed text ends with a space, but the held token may be the space")
def bs_if_committed_space(engine, plan, held):
    if engine.constraint is None:
        return 0
    return len(held) if any(r.text.endswith(" ") for r in plan.requests) else 0


@add(BS, "bs_prefill_only", True, "waits only for prefills, whose masks come from the prompt anyway")
def bs_prefill_only(engine, plan, held):
    return len(held) if engine.constraint is not None and plan.is_prefill else 0


@add(BS, "bs_skip_early", True,
     "skips the first decode rounds as 'warm-up', so round 2's mask is a token late")
def bs_skip_early(engine, plan, held):
    if engine.constraint is None or plan.round <= 2:
        return 0
    return len(held)


@add(BS, "bs_not_last_round", True,
     "skips a request's last round (wants_more is false then), so the final token is unmasked")
def bs_not_last_round(engine, plan, held):
    if engine.constraint is None or not all(r.wants_more() for r in plan.requests):
        return 0
    return len(held)


@add(BS, "bs_batch_changed", True,
     "waits only when the batch changed (lab 6's bug), though every mask needs the newest token")
def bs_batch_changed(engine, plan, held):
    if engine.constraint is None or not held:
        return 0
    same = [r.id for r in held[-1].plan.requests] == [r.id for r in plan.requests]
    return 0 if same else len(held)


@add(BS, "bs_wait_event_only", True,
     "waits for the held step's event but does not process it: the tokens never reach the requests")
def bs_wait_event_only(engine, plan, held):
    if engine.constraint is not None and held:
        engine.device.wait(held[-1].sample_done)
    return 0


@add(BS, "bs_process_inside", True,
     "processes the held steps itself and returns 0, so the queue processes them a second time")
def bs_process_inside(engine, plan, held):
    if engine.constraint is not None:
        for step in held:
            engine.process_outputs(step)
    return 0


@add(BS, "bs_half", True, "len(held) // 2 processes nothing with one step held")
def bs_half(engine, plan, held):
    return len(held) // 2 if engine.constraint is not None else 0


@add(BS, "bs_count_requests", True, "counts the plan's requests, not the held steps")
def bs_count_requests(engine, plan, held):
    return len(plan.requests) if engine.constraint is not None else 0


@add(BS, "bs_one_even_if_empty", True,
     "always asks for 1 step with title case, even when none is held")
def bs_one_even_if_empty(engine, plan, held):
    return 1 if engine.constraint is not None else 0


@add(BS, "bs_mixed_batches_only", True,
     "after vllm#27910 waits only in batches of several requests; a lone request stays a step late")
def bs_mixed_batches_only(engine, plan, held):
    if engine.constraint is None or len(plan.requests) < 2:
        return 0
    return len(held)


@add(BS, "bs_inflight_gt2", True,
     "off by one on num_inflight (it counts the current round): never waits with 2 in flight")
def bs_inflight_gt2(engine, plan, held):
    if engine.constraint is None:
        return 0
    return len(held) if any(r.num_inflight > 2 for r in plan.requests) else 0


@add(BS, "bs_trim_unconstrained", True,
     "without a constraint still processes one step of a queue of 3, making it a queue of 2")
def bs_trim_unconstrained(engine, plan, held):
    if engine.constraint is not None:
        return len(held)
    return max(0, len(held) - 1)


@add(BS, "bs_last_sharing", False,
     "processes up to the newest held step that shares a request with the plan, no further")
def bs_last_sharing(engine, plan, held):
    if engine.constraint is None:
        return 0
    ids = {r.id for r in plan.requests}
    needed = 0
    for i, step in enumerate(held):
        if ids & {r.id for r in step.plan.requests}:
            needed = i + 1
    return needed


@add(BS, "bs_config_and_sum", False,
     "reads the config's constraint name and counts held steps with a generator")
def bs_config_and_sum(engine, plan, held):
    if engine.config.constraint != "title_case":
        return 0
    return sum(1 for _ in held)


@add(BS, "bs_by_inflight", False,
     "waits when a plan request has an earlier round in flight (num_inflight > 1), and then fully")
def bs_by_inflight(engine, plan, held):
    if engine.constraint is None:
        return 0
    return len(held) if any(r.num_inflight > 1 for r in plan.requests) else 0


@add(BS, "bs_min_one", False,
     "processing at most one step is enough: draining every round keeps at most one step held")
def bs_min_one(engine, plan, held):
    return min(1, len(held)) if engine.constraint is not None else 0


@add(BS, "bs_isinstance_checked", False,
     "isinstance test on the constraint, prefills skipped, and a harmless order assertion")
def bs_isinstance_checked(engine, plan, held):
    rounds = [s.plan.round for s in held]
    assert rounds == sorted(rounds), rounds
    if not isinstance(engine.constraint, TitleCase) or plan.is_prefill:
        return 0
    return len(held)


# ---------------------------------------------------------------- Lab 6, predict (leak)
value(TL, "tl_round_before", True,
      "names round 5, whose tokens were taken, instead of round 6 that took them",
      (5, {1: 0, 2: 1}))
value(TL, "tl_reversed", True, "writes {owner: reader} instead of {reader: owner}",
      (6, {0: 1, 1: 2}))
value(TL, "tl_only_first", True, "misses prompt 2, which took prompt 1's token", (6, {1: 0}))
value(TL, "tl_only_last", True, "misses prompt 1, which took prompt 0's token", (6, {2: 1}))
value(TL, "tl_prefill_round", True,
      "round 7 is the prefill the notebook says is processed at once", (7, {3: 0}))
value(TL, "tl_grow_round", True,
      "round 8, where the batch grows; nothing is in flight then", (8, {1: 0, 2: 1, 3: 2}))
value(TL, "tl_with_finished", True,
      "adds prompt 0, which is not in round 6's batch", (6, {0: 0, 1: 0, 2: 1}))
value(TL, "tl_numpy", False, "the right pair with numpy integers from an array of rounds",
      (np.int64(6), {np.int64(1): np.int64(0), np.int64(2): np.int64(1)}))
value(TL, "tl_key_order", False, "the right dict written in the other order", (6, {2: 1, 1: 0}))
value(TL, "tl_ordered_dict", False, "an OrderedDict built with zip",
      (6, collections.OrderedDict(zip([1, 2], [0, 1]))))

# ---------------------------------------------------------------- Lab 6, fix (key)


@add(FK, "fk_shipped", True, "the shipped key: the place in this round's batch")
def fk_shipped(req, b):
    return b


@add(FK, "fk_index_mod", True,
     "prompt index mod 3: a joiner collides with a live prompt when a later one finishes first")
def fk_index_mod(req, b):
    return req.index % 3


@add(FK, "fk_id_mod", True, "request id mod 3: collides with a live request like the index does")
def fk_id_mod(req, b):
    return req.id % 3


_ring = itertools.count()
_ring_keys = {}


@add(FK, "fk_ring_counter", True,
     "SGLang's first way: a ring counter at first sight, which reuses a live request's key")
def fk_ring_counter(req, b):
    if req.id not in _ring_keys:
        _ring_keys[req.id] = next(_ring) % 3
    return _ring_keys[req.id]


_first_b = {}


@add(FK, "fk_first_place", True,
     "remembers the place at the request's first round; a joiner prefilled alone gets place 0")
def fk_first_place(req, b):
    return _first_b.setdefault(req.id, b)


@add(FK, "fk_min_index", True, "min(index, 2): every prompt from 2 on shares key 2")
def fk_min_index(req, b):
    return min(req.index, 2)


@add(FK, "fk_reversed_place", True, "2 - b is still a place in the batch, only counted backwards")
def fk_reversed_place(req, b):
    return 2 - b


@add(FK, "fk_row_if_pending", True,
     "uses the row only when the input is pending; a non-pending round writes under its place")
def fk_row_if_pending(req, b):
    return req.row if req.num_inflight > 1 else b


@add(FK, "fk_prompt_hash", True, "a checksum of the prompt text mod 3: different prompts can collide")
def fk_prompt_hash(req, b):
    return sum(req.prompt.encode()) % 3


@add(FK, "fk_block_mod", True,
     "first KV block mod 3: block numbers are not rows, two live requests can share a residue")
def fk_block_mod(req, b):
    return req.blocks[0] % 3


@add(FK, "fk_stream_mod", True, "the sampling stream mod 3 is a hash, not a free slot")
def fk_stream_mod(req, b):
    return req.sampling_stream % 3


@add(FK, "fk_index_plus_place", True, "mixes in the place, which moves when the batch shrinks")
def fk_index_plus_place(req, b):
    return (req.index + b) % 3


@add(FK, "fk_first_three", True,
     "fixes the notebook's first three prompts by index, joiners still keyed by place")
def fk_first_three(req, b):
    return req.index if req.index < 3 else b


_never_freed = {}


@add(FK, "fk_alloc_never_free", True,
     "allocates keys at first sight but never frees one, so the fourth request shares key 2")
def fk_alloc_never_free(req, b):
    if req.id not in _never_freed:
        _never_freed[req.id] = min(len(_never_freed), 2)
    return _never_freed[req.id]


@add(FK, "fk_prefill_by_place", True,
     "keys the prefill by its place and later rounds by row: the state moves keys mid-life")
def fk_prefill_by_place(req, b):
    return req.row if req.output_ids else b


@add(FK, "fk_row_plus_one", True, "row + 1 gives 3 for the last row, past the device's 3 rows")
def fk_row_plus_one(req, b):
    return req.row + 1


@add(FK, "fk_rotated_row", False, "(row + 1) % 3 is a permutation of rows: still one key per request")
def fk_rotated_row(req, b):
    return (req.row + 1) % 3


@add(FK, "fk_row_table", False, "a lookup table on the row, another fixed bijection")
def fk_row_table(req, b):
    return [2, 0, 1][req.row]


@add(FK, "fk_row_asserted", False, "the row with harmless range checks")
def fk_row_asserted(req, b):
    assert 0 <= req.row < 3, req.row
    assert 0 <= b < 3, b
    return int(req.row)


_own = {}


@add(FK, "fk_own_allocator", False,
     "its own allocator: lowest key no live request holds, freed once the engine released it")
def fk_own_allocator(req, b):
    for ident, (other, _) in list(_own.items()):
        if other.row == -1:
            del _own[ident]
    if id(req) not in _own:
        taken = {k for _, k in _own.values()}
        _own[id(req)] = (req, min(k for k in range(3) if k not in taken))
    return _own[id(req)][1]


@add(FK, "fk_row_fallback", False, "the row, falling back to the place only if no row is set")
def fk_row_fallback(req, b):
    return req.row if req.row >= 0 else b


@add(BS, "bs_same_batch_only", True,
     "waits only when the held step ran the same batch; after a request leaves, the others' "
     "held tokens are skipped")
def bs_same_batch_only(engine, plan, held):
    if engine.constraint is None or not held:
        return 0
    same = [r.id for r in held[-1].plan.requests] == [r.id for r in plan.requests]
    return len(held) if same else 0
