"""Every checker's runs produce the endings it declares (overlap_course/checks/endings.py): a
mistake in handling a finished request shows only in a run where requests end that way, so each
checker is run on a right answer and the endings of all its runs are collected and compared."""

import pytest

from overlap_course import checks
from overlap_course.checks import endings, lab_runs

import labs_corpus
import mistakes


def _ring_slots_uncached():
    """check_ring_slots keeps its ring runs per (depth, slots): start afresh, so they run here."""
    lab_runs.ring_run.cache_clear()
    return checks.check_ring_slots(labs_corpus.ring_slots)


# checker name -> a call of it on a right answer (lesson 07's checkers are added here too)
RIGHT = {
    "check_serial_loop": lambda: checks.check_serial_loop(mistakes.serial),
    "check_zos_loop": lambda: checks.check_zos_loop(mistakes.make_zos()),
    "check_correction": lambda: checks.check_correction(mistakes.correction),
    "check_process_outputs": lambda: checks.check_process_outputs(mistakes.process),
    "check_three_rounds": lambda: checks.check_three_rounds(mistakes.THREE_ROUNDS),
    "check_wants_more": lambda: checks.check_wants_more(labs_corpus.wants_more),
    "check_abort": lambda: checks.check_abort(labs_corpus.abort),
    "check_ring_slots": _ring_slots_uncached,
    "check_commit": lambda: checks.check_commit(labs_corpus.commit),
}


def test_every_declared_checker_is_run_here():
    assert set(endings.DECLARED) <= set(RIGHT), "add a right answer for each declared checker"


@pytest.mark.parametrize("name", sorted(endings.DECLARED))
def test_the_declared_endings_really_occur(name):
    with endings.observe() as seen:
        verdict = RIGHT[name]()
    assert verdict.passed, repr(verdict)
    missing = sorted(map(str, endings.DECLARED[name] - seen))
    assert not missing, f"{name}'s runs never ended a request this way: {missing}"


def test_the_limit_is_told_apart_inside_and_at_the_end_of_a_speculative_step():
    """The endings run with drafts: a limit met inside a round's accepted drafts, EOS, the stop
    string, EOS and a limit met by a round's last token, prompt by prompt."""
    engine = checks.pool.engine(num_draft_tokens=checks.pool.DRAFTS)
    engine.generate(checks.pool.ENDINGS_PROMPTS, **checks.pool.ENDINGS_RUN)
    assert [e.how for _, e in endings.run_endings(engine)] == [
        endings.LIMIT_IN_SPEC_STEP, endings.EOS, endings.STOP, endings.EOS,
        endings.LIMIT_AT_ROUND_END]


def test_an_ending_without_drafts_inside_a_step_is_refused():
    with pytest.raises(ValueError, match="cannot fall inside"):
        endings.Ending(endings.LIMIT_IN_SPEC_STEP, drafts=False)
