"""The endings corpus (tests/endings_corpus.py): each wrong answer fails with its category, and
its message names the ending and the prompt (0 false passes)."""

import pytest

from overlap_course import checks

from endings_corpus import WRONG

CHECK = {"02a": checks.check_serial_loop, "03a": checks.check_zos_loop,
         "04a": checks.check_correction,
         "05": checks.check_process_outputs}


@pytest.mark.parametrize("entry", WRONG, ids=[f"{e.exercise}-{e.name}" for e in WRONG])
def test_wrong_ending_handling_fails_and_names_it(entry):
    verdict = CHECK[entry.exercise](entry.answer)
    assert not verdict.passed, f"FALSE PASS: {verdict!r}"
    assert verdict.category == entry.category, repr(verdict)
    missing = [w for w in entry.words if w not in verdict.message]
    assert not missing, f"the message lacks {missing}: {verdict!r}"


def test_the_corpus_covers_every_exercise_that_frees_or_steps():
    assert {e.exercise for e in WRONG} >= {"02a", "03a", "05"} and len(WRONG) >= 20
