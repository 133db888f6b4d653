"""Issue 34, round twenty-six (engine): a commit's made-up EOS, a commit that consumes its
tokens, and a limit raised back after it was lowered.

a: a per_request commit appending an EOS the round never sampled passed CommitOtherTokens (every
EOS was dropped before comparing): silently wrong tokens; b: a right commit that empties the
list it is handed made stats.draft_tokens_accepted negative; c: a waiting request's
max_new_tokens lowered by on_round, then raised back to generate's once admitted, was refused
rounds later by PlannedPastLimit, blaming output_ids grown by the loop."""

from __future__ import annotations

import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine.refusals import CommitOtherTokens, FixedChanged
from toy_engine.sequence import Request

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]
CONFIGS = [dict(mode="serial"), dict(mode="zos"), dict(mode="zos", num_draft_tokens=3)]
IDS = ["serial", "zos", "zos-drafts"]


def ends(eng, prompts=PROMPTS, n=16, **kw):
    return [(c.text, c.finish_reason, c.token_ids) for c in eng.generate(prompts, n, **kw)]


@pytest.fixture(params=CONFIGS, ids=IDS)
def eng(request):
    with te.Engine(te.EngineConfig(device="cpu", **request.param)) as e:
        yield e


# a: an EOS the round did not sample is no token to hand out.

def plus_eos(req, tokens, eos_id, decode):
    Request.commit(req, tokens, eos_id, decode)
    req.output_ids.append(eos_id)


def only_eos(req, tokens, eos_id, decode):
    req.output_ids.append(eos_id)


@pytest.mark.parametrize("commit", [plus_eos, only_eos])
def test_a_commit_appending_an_eos_the_round_never_sampled_is_refused(eng, commit):
    want = ends(eng)
    eos = eng.tokenizer.eos_id
    with pytest.raises(CommitOtherTokens) as err:
        ends(eng, on_round=plugins.per_request(commit=commit))
    msg = str(err.value)
    assert commit.__name__ in msg and f"EOS {eos}" in msg and "did not sample" in msg, msg
    assert eos not in err.value.kept and eos in err.value.appended
    assert ends(eng) == want  # the engine stays usable


# b: the accepted drafts are counted from the round's tokens, not what a commit left of them.

def popping(req, tokens, eos_id, decode):
    """A right commit that uses up the list it is handed (as one popping each token does): the
    engine's own commit on a copy, then the list emptied."""
    Request.commit(req, list(tokens), eos_id, decode)
    tokens.clear()


def test_b_a_commit_consuming_its_tokens_keeps_the_acceptance_stats():
    with te.Engine(te.EngineConfig(device="cpu", mode="zos", num_draft_tokens=3)) as eng:
        want = ends(eng)
        plain = (eng.stats.draft_tokens_accepted, eng.stats.mean_accepted_per_round)
        assert ends(eng, on_round=plugins.per_request(commit=popping)) == want
        got = (eng.stats.draft_tokens_accepted, eng.stats.mean_accepted_per_round)
    assert plain[0] > 0 and got == plain


# c: a limit lowered is the one in force: raised above it, refused where it is raised.

WAITING = PROMPTS * 3  # 12 prompts: the last ones wait for a row
N = 24


def lowered_then(back: int, when: str, low: int = 2):
    """on_round lowering prompt 11's limit at round 0 (waiting), then setting it to ``back`` at
    the first round it is admitted, or at round 1 while it still waits."""
    seen = {}

    def on_round(eng, rnd):
        req = eng.requests[11]
        seen["last"] = rnd
        if rnd == 0:
            req.max_new_tokens = low
        elif "raised" not in seen and (req.row != -1) == (when == "admitted"):
            seen["raised"] = rnd
            req.max_new_tokens = back
    return on_round, seen


@pytest.mark.parametrize("when", ["admitted", "waiting"])
@pytest.mark.parametrize("back", [N, 3])
def test_c_a_limit_raised_back_after_lowering_is_refused_where_it_is_raised(back, when):
    for cfg in CONFIGS:
        with te.Engine(te.EngineConfig(device="cpu", block_size=1, **cfg)) as eng:
            want = ends(eng, WAITING, N)
            on_round, seen = lowered_then(back, when)
            with pytest.raises(FixedChanged) as err:
                ends(eng, WAITING, N, on_round=on_round)
            msg = str(err.value)
            assert seen["last"] == seen["raised"], (cfg, seen)  # refused as on_round returned
            assert "on_round" in msg and "prompt 11's req.max_new_tokens" in msg, msg
            assert f"from 2 (lowered from the {N} generate took) to {back}" in msg, msg
            assert "limit in force" in msg and "grew" not in msg and "by the loop" not in msg
            assert ends(eng, WAITING, N) == want


def test_c_a_limit_lowered_again_or_set_to_the_one_in_force_is_taken():
    with te.Engine(te.EngineConfig(device="cpu", block_size=1, mode="zos")) as eng:
        for back in (2, 1):
            on_round, seen = lowered_then(back, "admitted")
            got = ends(eng, WAITING, N, on_round=on_round)
            assert "raised" in seen and len(got[11][2]) == back and got[11][1] == "length"
