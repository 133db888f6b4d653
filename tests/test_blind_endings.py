"""The blind endings corpus (tests/blind_endings.py, issue 33): answers about finishing, freeing,
the extra step, aborts and limits, written by someone who saw only the notebooks and
``toy_engine/``.  Every wrong answer must fail (0 false passes), every right one pass (0 wrong
failures).  This file runs the entries for the exercise and notebook checkers; the entries for
notebook 07's checkers (LAB_CHECKS) run in tests/test_blind_endings_labs.py, so each runs once.
"""

import pytest

from overlap_course import checks
from overlap_course.checks import sandbox

from blind_endings import BLIND
# noqa: F401  (the notebook's serial run, for check_idle_fraction)
from test_mistakes import serial_run

LAB_CHECKS = {"check_wasted_round", "check_wants_more", "check_abort_in_flight", "check_abort",
              "check_ring_race", "check_ring_slots", "check_overshoot", "check_commit"}
EXERCISE_CHECKS = {"check_serial_loop", "check_idle_fraction", "check_zos_loop",
                   "check_three_rounds",
                   "check_correction", "check_metadata_answer", "check_process_outputs"}
# name -> why the answer is right although its author marked it wrong (the notebook's text)
RULED_RIGHT: dict[str, str] = {}
# name -> why the answer is wrong although its author marked it right.  Exercise 04's rules (cell 4,
# as issue 33 made them follow the host-wait rule): "no operation whose result's size depends on the
# values (indexing with a boolean mask, `nonzero`, `masked_select`, `unique`, `repeat_interleave`
# without `output_size`: the host must learn that size before it can allocate the result)"; the hint
# passes `output_size=len(meta["positions"])`.  The author followed the earlier hint, which did not.
_NO_OUTPUT_SIZE = "repeat_interleave(..., seqlens_q) without output_size: a host wait on a GPU"
RULED_WRONG = {"cc_len_of_seqlens": _NO_OUTPUT_SIZE, "cc_new_tensors_same_keys": _NO_OUTPUT_SIZE}
ENTRIES = [(a, (a.wrong and a.name not in RULED_RIGHT) or a.name in RULED_WRONG) for a in BLIND
           if a.check in EXERCISE_CHECKS]
# the checks' own limit is 30 s (test_checkers runs it); a blind hang stops sooner here
LIMIT_S = 10.0


def _call(entry, serial_run):
    check = getattr(checks, entry.check)
    return check(entry.answer,
                 serial_run) if entry.check == "check_idle_fraction" else check(entry.answer)


def test_every_entry_is_run_by_this_file_or_the_labs_one():
    assert {a.check for a in BLIND} <= EXERCISE_CHECKS | LAB_CHECKS
    assert not EXERCISE_CHECKS & LAB_CHECKS


@pytest.mark.parametrize("entry,wrong", ENTRIES, ids=[a.name for a, _ in ENTRIES])
def test_blind_endings_answer(entry, wrong, serial_run, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", LIMIT_S)
    verdict = _call(entry, serial_run)
    assert "Traceback" not in verdict.message
    if wrong:
        assert not verdict.passed, f"FALSE PASS ({entry.why}): {verdict!r}"
    else:
        assert verdict.passed, f"WRONG FAILURE ({entry.why}): {verdict!r}"


def test_the_blind_endings_corpus_is_large_enough():
    wrong = sum(a.wrong for a in BLIND)
    assert wrong >= 40 and len(BLIND) - wrong >= 20
    assert set(RULED_RIGHT) | set(RULED_WRONG) <= {a.name for a in BLIND}
