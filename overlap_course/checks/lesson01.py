"""Lesson 01 (notebook 01_tiny_gpt): the packed batch and the paged KV cache -- where a
position's key and value live (its slot), and the query and key lengths of a decode round.
"""

from __future__ import annotations

from . import context
from .answers import int_list, one_number, show
from .harness import notebook_check
from .verdict import Verdict, fails, passes, unanswered

__all__ = ["check_slot", "check_decode_lengths"]


def _in_table(a: dict) -> str | None:
    if a["pos"] // a["block_size"] < len(a["table"]):
        return None
    return f"position {a['pos']} is past the {len(a['table'])} blocks of table {show(a['table'])}"


@notebook_check
@context.given(table=context.wholes(0, context.BIG, "the request's block table ([5, 2, 9])"),
               pos=context.whole(0, context.BIG, "the position asked about (9)"),
               block_size=context.whole(1, context.BIG, "the KV cache's block size (4)"),
               agree=_in_table)
def check_slot(answer, table, pos: int, block_size: int, name: str = "slot") -> Verdict:
    """Your turn (01): the KV-cache slot of position ``pos`` of a request with block table ``table``
    (``name``: the answer's variable, for the unanswered message; a second request is a second question)."""
    answer = one_number(answer, f"set `{name}` to a number", "a slot is one whole number", whole=True)
    if isinstance(answer, Verdict):
        return answer
    table = [int(b) for b in table]
    index, offset = divmod(pos, block_size)
    want = table[index] * block_size + offset
    if answer == want:
        return passes(f"position {pos} is in the request's block index {index} (= {pos} // {block_size}), "
                      f"which is block {table[index]}, at offset {offset}: slot {table[index]} x "
                      f"{block_size} + {offset} = {want}")
    # the value a mistake gives -> (category, why): a later key of the literal wins a tie (9 at
    # pos 9 in block 9 is its number), then setdefault: an earlier one wins
    mistakes = {
        pos: ("position_as_slot",
              "that is the position itself, as if the request owned blocks 0, 1, 2, ... in order: go through the "
              "blocks it really owns, its block table"),
        table[index]: ("block_number",
                       "that is the block's number, not the slot: multiply it by the block size and add the offset"),
        table[index] * block_size: ("missing_offset", f"that is the block's first slot: add the offset {pos} % "
                                                      f"{block_size}"),
    }
    if pos == table[index]:  # blind round 51: 9 at pos 9 in block 9 is also the position
        mistakes[pos] = ("block_number",
                         "that is the position itself (as if the request owned blocks 0, 1, "
                         "2, ... in order: look its block up in the block table) and, here, "
                         "also that block's number: multiply it by the block size and add the "
                         "offset")
    if offset:  # at offset 0 the block number plus the offset is the number: nothing was added
        mistakes[table[index] + offset] = ("offset_on_block_number",
                                           "you added the offset to the block number: multiply the "
                                           "block number by the block size first")
    if offset < len(table):
        mistakes.setdefault(table[offset] * block_size + index,
                            ("swapped_div_mod",
                             "you swapped // and %: the block index is pos // block_size, the offset pos % block_size"))
    for wrong_index in sorted(range(len(table)), key=lambda i: abs(i - index)):  # any other
        if wrong_index != index:  # block of the table (blind round 51: table[0] for index 2)
            mistakes.setdefault(table[wrong_index] * block_size + offset,
                                ("wrong_block", f"right offset, wrong block: position {pos} is in block index {pos} "
                                                f"// {block_size} = {index} of the table"))
    if answer in mistakes:
        category, why = mistakes[answer]
        return fails(category, f"slot {answer}: {why}")
    return fails("wrong", f"slot {answer} is not it: slot = table[pos // block_size] * block_size + "
                          f"pos % block_size, with table {table}, pos {pos}, block_size {block_size}")


@notebook_check
@context.given(answers=2, prompt_lengths=context.wholes(1, context.BIG, "the prompts' lengths "
                                                                      "([9, 7, 3])"))
def check_decode_lengths(seqlens_q, seqlens_k, prompt_lengths) -> Verdict:
    """Predict (01): seqlens_q and seqlens_k of the first decode round after a prefill of
    prompts with ``prompt_lengths`` tokens."""
    if seqlens_q is None or seqlens_k is None:
        return unanswered("set both `seqlens_q` and `seqlens_k` to lists, one number per request")
    q, k = int_list(seqlens_q), int_list(seqlens_k)
    if q is None or k is None:
        return fails("shape", "write each as a list of whole numbers, one per request, e.g. [1, 2, 3]")
    n = len(prompt_lengths)
    prompts = [int(p) for p in prompt_lengths]
    if len(q) != n or len(k) != n:
        return fails("shape", f"one number per request: there are {n} requests (you gave {len(q)} and {len(k)})")
    want_q, want_k = [1] * n, [p + 1 for p in prompts]
    if q != want_q:
        if q == prompts:
            return fails("prefill_lengths", "seqlens_q: those are the prefill's query lengths. In a decode round "
                                            "each request feeds only its newest token")
        return fails("query_not_one", f"seqlens_q is {q}: in a decode round every request feeds exactly one "
                                      f"token, its newest")
    if k != want_k:
        if k == prompts:
            return fails("key_misses_new_token", "seqlens_k: the key length counts this round's token too (the "
                                                 "past from the cache plus the new token)")
        if k == want_q:
            return fails("key_only_new_token", "seqlens_k: the new token attends to the request's whole past, "
                                               "read from the KV cache, not only to itself")
        if k == [p + 2 for p in prompts]:
            return fails("key_one_too_many", "seqlens_k: one too many. The prefill fed the prompt and produced "
                                             "one token, and this round feeds that token: count them again")
        return fails("wrong", f"seqlens_k is {k}: each request's key length is its own cached past plus this "
                              f"round's token")
    return passes(f"seqlens_q {want_q}, seqlens_k {want_k}: one new token per request, attending to its "
                  f"prompt in the cache plus itself")
