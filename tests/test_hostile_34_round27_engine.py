"""Issue 34, round twenty-seven (engine): a per_request commit that hands out fewer tokens than
the round kept, or takes one back, without ending the request.

CommitOtherTokens.check accepted any prefix of a round's kept tokens and never asked whether the
request ended where the commit stopped early, and check_committed lets a commit remove the
newest tokens (meant for cutting a stop string) whether or not a stop string ended it.  So
a: a commit appending only the first kept token (dropping accepted drafts) gave other text under
ZOS with drafts than serial; b: a commit that once appended nothing; c: one that once removed the
newest committed token with no stop string, both not ending the request, gave serial and ZOS
different text, silently (under ZOS the device had already fed the token to the next round).
Now each is refused, in every mode (CommitStoppedEarly), naming the prompt, the round, the tokens
handed and kept, and the fix; right commits (the lab's shipped one, a stop string's cut, EOS or
the limit mid-round, numpy ints) still pass.  A commit that stops at a kept EOS or at the
request's limit without ending it is left as it was: lab 4 judges it (past_eos, stalled), as
tests/labs_corpus.py's "EOS never marked" and "never finishes a request" check."""

from __future__ import annotations

import numpy as np
import pytest

import toy_engine as te
from overlap_course.labs import plugins, shipped
from toy_engine import refusals
from toy_engine.sequence import Request

PROMPTS = ["hello world", "the cat sat", "abc"]
CONFIGS = [dict(mode="serial"), dict(mode="zos"), dict(mode="zos", num_draft_tokens=2)]
IDS = ["serial", "zos", "zos-drafts"]


@pytest.fixture(params=CONFIGS, ids=IDS)
def eng(request):
    with te.Engine(te.EngineConfig(device="cpu", **request.param)) as e:
        yield e


def ends(eng, commit=None, prompts=PROMPTS, n=12, **kw):
    on_round = plugins.per_request(commit=commit) if commit else None
    return [(c.text, c.finish_reason, c.token_ids)
            for c in eng.generate(prompts, n, on_round=on_round, **kw)]


def refused(eng, commit):
    """The refusal of ``commit``'s run (before the fix: it ran, silently)."""
    with pytest.raises(ValueError) as err:
        ends(eng, commit)
    assert type(err.value) is refusals.CommitStoppedEarly, err.value
    return err.value


# a: the first kept token only, accepted drafts dropped, the request not ended.

def first_only(req, toks, eos, decode):
    if toks[0] == eos:
        req.finish_reason = "eos"
        return
    req.output_ids.append(toks[0])
    req.text += decode([toks[0]])
    if len(req.output_ids) >= req.max_new_tokens:
        req.finish_reason = "length"


def test_first_kept_token_only_refused_with_drafts():
    with te.Engine(te.EngineConfig(device="cpu", mode="zos", num_draft_tokens=2)) as e:
        got = refused(e, first_only)
    assert len(got.appended) < len(got.kept) and got.ended is None and not got.removed
    msg = str(got)
    assert f"prompt {got.prompt}'s commit" in msg and f"round {got.round}'s kept" in msg
    assert "per_request(commit=first_only)" in msg and "did not end it" in msg
    assert "append each kept token once" in msg and "req.finish_reason" in msg


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_first_kept_token_only_right_without_drafts(mode):
    """One token a round: the first is every token kept, and the serial text comes back."""
    with te.Engine(te.EngineConfig(device="cpu", mode=mode)) as e:
        assert ends(e, first_only) == ends(e)


# b: once, nothing appended and the request not ended (a skipped round).

def skip_once():
    skipped = set()

    def skip(req, toks, eos, decode):
        if len(req.output_ids) == 3 and req.index not in skipped:
            skipped.add(req.index)
            return
        Request.commit(req, toks, eos, decode)
    return skip


def test_skipped_round_refused(eng):
    got = refused(eng, skip_once())
    assert got.appended == [] and got.kept and got.ended is None
    assert f"appended [], 0 of its {len(got.kept)}, and did not end it" in str(got)


# c: once, the newest committed token removed, no stop string, the request not ended.

def take_back(reason=None):
    done = set()

    def cut(req, toks, eos, decode):
        if len(req.output_ids) == 4 and req.index not in done:
            done.add(req.index)
            del req.output_ids[-1]
            req.text = req.text[:-1]
            if reason:
                req.finish_reason = reason
            return
        Request.commit(req, toks, eos, decode)
    return cut


def test_token_taken_back_refused(eng):
    got = refused(eng, take_back())
    assert got.removed == 1 and got.ended is None
    msg = str(got)
    assert "removed 1 of the tokens committed before, and did not end it" in msg
    assert "only to cut a stop string off" in msg


def test_token_taken_back_ending_at_the_limit_refused(eng):
    """Taking back is right only where a stop string ends the request."""
    got = refused(eng, take_back("length"))
    assert got.ended == "length" and "not at a stop string" in str(got)


# Right commits still pass.

STORY = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]


def test_shipped_commit_passes(eng):
    """Lab 4's shipped commit appends the whole run, then cuts a stop string (tokens of earlier
    rounds too) and ends the request: never refused (its late stop is lab 4's to judge)."""
    got = ends(eng, shipped.commit, STORY, 30, stop=[" was", "."])
    if not eng.config.num_draft_tokens:  # with drafts it misses stops: the lab's bug
        assert got == ends(eng, None, STORY, 30, stop=[" was", "."])
        assert "stop" in [reason for _, reason, _ in got]


def noting(calls):
    def commit(req, toks, eos, decode):
        before = len(req.output_ids)
        Request.commit(req, toks, eos, decode)
        calls.append((len(req.output_ids) - before, len(toks), req.finish_reason))
    return commit


def test_stop_string_cut_passes(eng):
    """A stop string's cut takes back tokens committed in earlier rounds, ending "stop"."""
    calls = []
    assert ends(eng, noting(calls), STORY, 30, stop=[" was"]) == ends(eng, None, STORY, 30,
                                                                     stop=[" was"])
    assert any(n < 0 and reason == "stop" for n, _, reason in calls)


def test_eos_and_limit_mid_round_pass():
    """With drafts, EOS and the limit end a request inside a round's kept run."""
    calls = []
    with te.Engine(te.EngineConfig(device="cpu", mode="zos", num_draft_tokens=3)) as e:
        for n in (77, 80, 90):
            assert ends(e, noting(calls), STORY, n) == ends(e, None, STORY, n)
    assert any(n < kept and reason == "eos" for n, kept, reason in calls)
    assert any(n < kept and reason == "length" for n, kept, reason in calls)


def numpy_ints(req, toks, eos, decode):
    Request.commit(req, [np.int64(t) for t in toks], eos, decode)


def test_numpy_ints_pass(eng):
    got = ends(eng, numpy_ints)
    assert got == ends(eng)
    assert all(type(t) is int for _, _, ids in got for t in ids)
