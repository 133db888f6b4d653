"""A check's answer: passed or not, the message the learner reads, and the mistake's category.

The message names the mistake in the lesson's terms; the category names it for machines:
the learner's progress record and the room's progress view (``overlap_course/progress.py``)
and the tests, which pin a category per wrong answer instead of searching the wording.
Every category is listed in :data:`CATEGORIES`; a verdict with any other is a bug in a check.
"""

from __future__ import annotations

from dataclasses import dataclass

PASSED = "passed"

CATEGORIES = frozenset({
    PASSED,
    # any check: the stub is still in place, the answer has the wrong form or is junk, the check
    # was given the wrong run or object, a round below 0, or a wrong answer with no more specific diagnosis
    "unanswered", "not_implemented", "shape", "junk", "setup", "no_such_round", "wrong",
    # any exercise checker: what the learner's code did to the check itself
    "raised", "time_limit", "edits_engine", "spins", "stalled", "race", "device_error", "wrong_tokens",
    "nested", "edits_requests", "edits_run", "signals", "refusal_caught",
    # a learner's loop (exercises 02 and 03), read from the host's order of stages
    "sample_before_forward", "prepared_twice", "launched_twice", "processed_twice", "plan_dropped",
    "out_of_order", "scheduled_ahead",
    "never_launched",
    "scheduled_before_processing", "not_serial", "prefill_deferred", "not_deferred", "process_before_forward",
    "deferred_past_prefill", "sample_before_process", "waits_before_forward", "waits_later_event",
    "loop_returned", "dropped_at_prefill", "no_flush", "never_processed", "none_plan", "correction",
    "skipped_extra_step", "foreign_step", "other_engine", "inputs_replaced", "other_thread",
    "flushed_with_a_plan", "scheduled_too_early", "engine_loop",
    # 00: stream, launch, event
    "includes_later_kernel", "misses_earlier_kernel", "no_such_kernel", "launch_count", "no_read",
    "wait_without_event", "read_before_launch", "no_race", "still_races",
    # 01: packed batch, paged KV cache
    "position_as_slot", "block_number", "missing_offset", "offset_on_block_number", "swapped_div_mod",
    "wrong_block", "prefill_lengths", "query_not_one", "key_misses_new_token", "key_only_new_token",
    "key_one_too_many",
    # 02: the serial engine, and exercise 02(b)
    "sign_flipped", "seconds", "wrong_round", "start_to_start", "inside_round", "up_to_forward", "host_lane",
    "from_sample_start", "too_few_digits", "wait_is_not_work", "device_stage", "not_a_stage",
    "launch_only_queues", "hidden_by_device", "negative", "partly_hidden", "more_than_overhead",
    "not_a_number", "percentage", "busy_fraction", "idle_over_busy", "idle_ms", "wall_denominator",
    "wrong_value", "not_from_timeline", "built_in",
    "wall_time", "new_gap", "no_gap", "microseconds",
    # 03: the ZOS order, the future-token map, the ideal; exercise 03's three rounds
    "serial_order", "not_launched_yet", "earlier_round", "nothing_lost", "all_lost", "tokens_kept",
    "more_than_one_step", "total_not_per_request", "counts_startup",
    "plain_changes", "constraint_unaffected", "against_measurement", "serial_ids",
    "host_knows_token", "placeholder_for_known", "pending_unset", "pending_inverted", "divides_by_smaller",
    "upside_down", "device_over_host", "host_over_device", "serial_round_time", "from_idle_fraction",
    "zos_times", "measured_speedup", "one_decimal", "cut_two_decimals",
    "gain", "includes_prefill", "sample_before_postprocess",
    "rounds_from_zero",  # 03(b): the decode rounds numbered from 0
    "flush_before_sample", "flush_mid_run", "forward_before_sample", "order", "length",
    "host_names",
    # 04: stale lengths, and exercise 04's correction and its fields
    "stale", "off_by_one", "plus_one", "subtracted", "slots_shifted", "positions_not_slots", "shifted_by_one",
    "accepted_by_batch", "pending_ignored", "first_token_only", "block_size_hardcoded", "seqlens_q",
    "seqlens_k", "positions", "slot_mapping", "host_read", "host_tensor", "python_loop",
    "engine_fix", "hidden_ops", "engine_error", "engine_mismatch",
    "input_field", "unknown_field", "missing_field", "unchanged_field", "changed_input", "no_shift",
    "cached", "uneven_queries", "stopped", "scripted",
    # 05: ownership and lifetime, and exercise 05's process_outputs
    "misses_current_round", "misses_in_flight", "already_processed", "missed_abort_round",
    "missed_extra_step", "serial_discards_nothing", "nothing_discarded", "too_many", "wrong_slot",
    "wrong_buffer", "writing_round", "waits_other_event", "read_before_wait", "edits_race_checker",
    "unchecked_read",
    "double_free", "free_in_use",
    "committed_twice", "plan_changed", "never_committed", "inflight_changed", "freed_unfinished",
    "short_commit", "bad_outputs",
    "left_unfinished", "ended_unfinished",
    "kept_blocks", "calls_itself", "calls_stage", "tokens_beside", "pool_junk", "stale_blocks",
    # 06: real traces
    "idle_time_not_share", "share_over_one", "whole_trace", "pytorch_call", "launch_call", "not_blocking", "other_sync",
    "not_in_trace",
    # 07: bugs that shipped (the labs' fixes: scheduling, aborts, commits)
    "extra_step", "serializes", "finished_scheduled", "still_running", "overwrote_finish", "aborted_scheduled",
    "too_few", "eos_kept", "text_mismatch", "wrong_reason", "past_limit", "past_eos", "kept_stop", "missed_stop",
    "stopped_early", "stop_past_limit", "wrong_request", "keeps_state", "not_marked",
    "stop_tie", "stripped_space", "extra_tokens", "past_stop",
    # 07b: bugs of 2026 (a sampler a step behind, the future map keyed by batch place)
    "at_the_space", "waits_without_need", "wrong_reader", "wrong_owner",
    "leaked_tokens", "drafts_lost",
})


@dataclass
class Verdict:
    passed: bool
    message: str
    category: str  # PASSED, or the mistake's name in CATEGORIES

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES or self.passed != (self.category == PASSED):
            raise ValueError(f"a {'passing' if self.passed else 'failing'} verdict cannot have category "
                             f"{self.category!r}: add it to overlap_course.checks.verdict.CATEGORIES")

    def __repr__(self) -> str:
        return ("PASSED: " if self.passed else "NOT YET: ") + self.message

    def __bool__(self) -> bool:
        return self.passed


def passes(message: str) -> Verdict:
    return Verdict(True, message, PASSED)


def fails(category: str, message: str) -> Verdict:
    return Verdict(False, message, category)


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 token", "3 tokens", "2 times"."""
    return f"{n} {noun}{'s' * (n != 1)}"


def joined(words: list[str]) -> str:
    """Words as a sentence lists them: "a", "a and b", "a, b and c"."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def article(noun: str) -> str:
    """``noun`` with its article: "an int", "a list"."""
    return ("an " if noun[:1].lower() in ("a", "e", "i", "o", "u") else "a ") + noun


def no_such_round(rnd: int) -> Verdict:
    """A round number below 0: every question that asks for a round says the same."""
    return fails("no_such_round", f"there is no round {rnd}: a run's rounds are numbered from 0, its first prefill")


def negative_count(count: int) -> Verdict:
    """A count below 0 (outputs discarded, tokens kept): every question that asks for a count
    says the same."""
    return fails("negative", f"a count cannot be negative (yours is {count})")


def unanswered(what: str) -> Verdict:
    """A notebook question whose stub is still in place."""
    return fails("unanswered", f"not answered yet: {what}, then run this cell again")


def not_implemented(what: str, still: str = "it still raises NotImplementedError") -> Verdict:
    """An exercise whose function still raises NotImplementedError, or whose answer is still
    the shipped placeholder (``still`` says which: `order` is still None)."""
    return fails("not_implemented", f"not implemented yet: fill in {what} ({still})")
