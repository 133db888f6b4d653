"""Issue 34, round twenty-seven, lab 4: the engine now refuses a commit that hands out fewer
tokens than its round kept without ending the request (``CommitStoppedEarly``), and one that
hands out others (``CommitOtherTokens``).  Lab 4's check told both as "your commit raised ...",
naming the checker's own plug-in (``per_request(commit=noted)``).  The first is said now of
the learner's commit, with the round's kept tokens and what it appended (the second is the
checker's own slip first: a doubled run is told so)."""

from __future__ import annotations

import pytest

from overlap_course import checks
from overlap_course.labs import shipped

import labs_corpus


def first_only(req, tokens, eos_id, decode):
    """Right without drafts; with them it drops every accepted draft."""
    shipped.commit(req, tokens[:1], eos_id, decode)


def skip_once(req, tokens, eos_id, decode):
    if len(req.output_ids) == 3 and not getattr(req, "skipped", False):
        req.skipped = True
        return
    shipped.commit(req, tokens, eos_id, decode)


def doubled(req, tokens, eos_id, decode):
    shipped.commit(req, [t for t in tokens for _ in (0, 1)], eos_id, decode)


@pytest.mark.parametrize("commit, category, said", [
    (first_only, "stopped_early", "your commit appended ["),
    (skip_once, "stopped_early", "your commit appended [], 0 of the"),
])
def test_a_refused_commit_is_told_of_the_learners_commit(commit, category, said):
    verdict = checks.check_commit(commit)
    assert not verdict.passed and verdict.category == category, str(verdict)
    assert said in str(verdict) and "kept [" in str(verdict), str(verdict)
    assert "raised" not in str(verdict) and "noted" not in str(verdict), str(verdict)


def test_a_doubled_run_is_still_the_checkers_own_slip():
    verdict = checks.check_commit(doubled)
    assert not verdict.passed and "the run's last token a second time" in str(verdict), verdict


def test_the_reference_commit_still_passes():
    verdict = checks.check_commit(labs_corpus.commit)
    assert verdict.passed, str(verdict)
