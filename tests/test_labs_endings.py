"""Notebook 07's fix checks over every way a request ends (issue 33): the false passes the blind
round found fail with messages naming the ending and the prompt, and a run that never ends, or a
fix that never returns, is a verdict within the check's time limit, never a hang."""

from overlap_course import checks
from overlap_course.checks import sandbox

import labs_corpus


def wants_more_stop_and_abort_finished(req):
    """Counts a stop and an abort as finished, not EOS: an EOS-finished request is planned again."""
    return req.finish_reason not in ("stop", "abort") and \
        len(req.output_ids) + req.num_inflight < req.max_new_tokens


def test_a_policy_blind_to_eos_is_stopped_naming_the_prompt_and_its_ending():
    verdict = checks.check_wants_more(wants_more_stop_and_abort_finished)
    assert verdict.category == "finished_scheduled", repr(verdict)  # the round cap, not the limit
    assert "ended on EOS after" in verdict.message
    assert "prompt 3 (' all lived happily eve')" in verdict.message
    assert "the check stopped the run at round" in verdict.message


def test_a_limit_tested_with_gt_fails_without_drafts_naming_the_limit_at_a_rounds_end():
    verdict = checks.check_commit(labs_corpus.commit_limit_strictly_past)
    assert verdict.category == "stalled", repr(verdict)
    assert "ZOS without drafts" in verdict.message
    assert "the last of a round's run" in verdict.message
    assert "prompt 1 ('One day, the little') should have ended on its limit, 12 tokens" \
        in verdict.message


def test_a_limit_tested_after_the_whole_run_lets_a_stop_past_it_win():
    verdict = checks.check_commit(labs_corpus.commit_limit_trimmed_after_run)
    assert verdict.category == "stop_past_limit", repr(verdict)
    assert "which ends on its limit, 12 tokens, inside a round's accepted run" in verdict.message
    assert "yours ends as 'stop' with 11 tokens" in verdict.message


def wants_more_hangs_on_prompt_2(req):
    while req.index == 2:
        req.output_ids[:0]
    return not req.finished and len(req.output_ids) + req.num_inflight < req.max_new_tokens


def commit_hangs_on_prompt_0(req, tokens, eos_id, decode):
    while req.index == 0:
        tokens[:0]
    labs_corpus.commit(req, tokens, eos_id, decode)


def test_a_fix_that_never_returns_is_stopped_at_the_time_limit_naming_the_prompt(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 1.0)
    verdict = checks.check_wants_more(wants_more_hangs_on_prompt_2)
    assert verdict.category == "time_limit", repr(verdict)
    assert "your wants_more was still running after 1 s" in verdict.message
    assert "called for prompt 2 ('There was a fox') before round" in verdict.message
    assert "it should have ended on its limit, 12 tokens" in verdict.message
    verdict = checks.check_commit(commit_hangs_on_prompt_0)
    assert verdict.category == "time_limit", repr(verdict)
    assert "called for prompt 0 ('Once upon a time') before round 1, with 0 tokens committed; " \
           "it should have ended on a stop string after 7 tokens" in verdict.message, repr(verdict)
