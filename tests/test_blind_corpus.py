"""The blind corpus (tests/blind_corpus.py): learner answers written by someone who had only
the notebooks -- never the checkers' code -- so that it does not share their blind spots.

Every wrong answer must fail (0 false passes) and every right one pass (0 wrong failures).
The author's own judgement of each answer stands, except where the lead read it against the
course's rules and the engine's behaviour and found it right; those are listed in
``RULED_RIGHT`` with the reason, so the reclassification is visible and reviewable.
"""

import pytest

from overlap_course.checks import sandbox

from blind_corpus import BLIND
from test_mistakes import check, serial_run  # noqa: F401  (the same checker calls and serial run)

# name -> why the answer is right although its author marked it wrong
RULED_RIGHT = {
    "idle_unmerged_spans": "device spans of one in-order stream never overlap, so unmerged sums equal merged "
                           "ones (the guide's corpus lists 'summed span durations' as right)",
    "corr_rebind_dict_entries": "the engine runs the forward on the dict it passed, so new tensors under the same "
                                "keys are used; the exercise's text now says so (it claimed tensors must change "
                                "in place, which nothing needs)",
    "po_clear_requests": "the run keeps its own tuple of requests (issue 21): clearing engine.requests once "
                         "everything finished loses nothing",
    "zos_process_instead_of_flush": "flush is process_outputs under the timeline's name for the last step: which "
                                    "of the two processes it is not something the run does differently",
    "zos_inline_no_flush_stage": "processing written out inline has no stage name to get wrong: the last step "
                                 "is processed after schedule() found nothing, which is what a flush is",
}
# name -> why the answer is wrong although its author marked it right (issue 33: exercise 04's rule,
# "no operation whose result's size depends on the values (... `repeat_interleave` without
# `output_size` ...)": the length of repeat_interleave's result is the sum of the repeats, which the
# host must read from the device before it can allocate it, a wait on a GPU)
_NO_OUTPUT_SIZE = "torch.repeat_interleave(..., seqlens_q) without output_size: a host wait on a " \
                  "GPU"
RULED_WRONG = {name: _NO_OUTPUT_SIZE for name in (
    "corr_repeat_interleave", "corr_pending_from_input_ids", "corr_index_select_gather",
    "corr_positions_from_seqlens_k", "corr_einsum_onehot")}
# round 50: made on the host, mixed with the device's tensors: an error on a GPU (host_tensor)
RULED_WRONG["corr_scatter_owner"] = "torch.zeros(T) without device=, scattered with the " \
                                    "metadata's indices: tensors on two devices on a GPU"
ENTRIES = [(a, (a.wrong and a.name not in RULED_RIGHT) or a.name in RULED_WRONG) for a in BLIND]
# The checks' own limit is 30 s; blind hangs stop sooner here: 10 s, and 1.5 s for the six answers
# written to loop forever (nothing they do depends on the limit's length: each must end as time_limit).
# The answers whose only mistake is handing the work to the engine's own code: the rounds to its
# loop (engine_loop), exercise 04's values to its correction (engine_fix, since 2026-12-07; it
# had been ruled right).  Any other wrong answer that hands over after a mistake of its own must
# be judged for that mistake: the engine's code is named last, so it never hides a mistake the
# checker would miss otherwise.
# (serial_clears_requests clears engine.requests after the engine's loop: harmless, as
# po_clear_requests shows for exercise 05, so handing over is its only mistake.)
HANDS_OVER_ONLY = {"serial_calls_engine_loop", "zos_calls_engine_loop", "serial_clears_requests",
                   "corr_calls_engine_kernel"}

LIMIT_S, FOREVER_LIMIT_S = 10.0, 1.5
FOREVER = {"serial_catch_baseexception_forever", "serial_endless_iterator", "serial_forever", "zos_forever_after_done",
           "po_hang_on_finished", "corr_forever"}


@pytest.mark.parametrize("entry,wrong", ENTRIES, ids=[f"{a.exercise}-{a.name}" for a, _ in ENTRIES])
def test_blind_answer(entry, wrong, serial_run, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", FOREVER_LIMIT_S if entry.name in FOREVER else LIMIT_S)
    verdict = check(entry, serial_run)
    assert entry.name not in FOREVER or verdict.category == "time_limit", repr(verdict)
    if wrong:
        assert not verdict.passed, f"FALSE PASS ({entry.why}): {verdict!r}"
        assert verdict.category != "passed" and "Traceback" not in verdict.message
        handed_over = verdict.category in ("engine_loop", "engine_fix")
        assert handed_over == (entry.name in HANDS_OVER_ONLY), repr(verdict)
    else:
        assert verdict.passed, f"WRONG FAILURE ({entry.why}): {verdict!r}"


def test_the_blind_corpus_is_large_enough():
    wrong = sum(w for _, w in ENTRIES)
    assert wrong >= 40 and len(ENTRIES) - wrong >= 30
    assert set(RULED_RIGHT) | set(RULED_WRONG) | HANDS_OVER_ONLY <= {a.name for a in BLIND}
