"""Issue 34, round twenty-two (commits): a round's commit checked where a plug-in returns.

Round 21's ``Run.follow_flights`` took any drop of one in ``num_inflight`` after a
process_outputs plug-in as "it committed the round itself", and nothing compared the tokens a
round hands out with what its sample kept: a round claimed without its token (a), accepted
drafts dropped (b), another token given to engine.commit_outputs (c) gave silently wrong texts;
a count lowered twice (d), lowered by a per_request commit (f), or a step a plug-in committed
processed again (i) stalled or raced with a false cause."""

from __future__ import annotations

import pytest

import toy_engine as te
from overlap_course.labs.plugins import per_request
from toy_engine.buffers import unpack_outputs
from toy_engine.refusals import InflightChanged, OtherTokens, StepProcessedTwice
from toy_engine.sequence import Request

PROMPTS = ["Once upon", "The king said", "She ", "A"]


def texts(eng, n=12, **kw):
    return [c.text for c in eng.generate(PROMPTS, n, **kw)]


def by_hand(keep=None, skip_round=None):
    """A process_outputs plug-in that commits the round itself (wait, read, num_inflight -= 1,
    req.commit), as the engine does; ``keep(kept)``: what it commits instead; ``skip_round``:
    a round it claims (lowers num_inflight) without committing anything."""
    def po(eng, step):
        eng.device.wait(step.sample_done)
        reqs, out = step.plan.requests, eng.read_outputs(step)
        k = 0 if step.plan.is_prefill else eng.config.num_draft_tokens
        for req, kept in zip(reqs, unpack_outputs(out, len(reqs), k)):
            req.num_inflight -= 1
            if not req.finished and step.plan.round != skip_round:
                req.commit(keep(kept) if keep else kept, eng.tokenizer.eos_id,
                           eng.tokenizer.decode)
        for req in reqs:
            eng.scheduler.release_if_done(req)
    po.__name__ = po.__qualname__ = "by_hand"
    return po


CONFIGS = [dict(mode="serial"), dict(mode="zos"), dict(mode="serial", num_draft_tokens=3),
           dict(mode="zos", num_draft_tokens=3)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("kw", [{}, dict(stop=["e", "th"]), dict(n=5)], ids=["", "stop", "n5"])
def test_a_plugin_that_commits_itself_rightly_is_not_refused(config, kw):
    with te.Engine(te.EngineConfig(**config)) as eng:
        want = texts(eng, **kw)
        assert texts(eng, process_outputs=by_hand(), **kw) == want


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_a_round_claimed_without_its_token_is_refused_by_name(mode):
    """(a) It lowered num_inflight for round 3 and handed out nothing: ZOS had fed the dropped
    token to round 4, and the run ended "length" with other texts."""
    with te.Engine(te.EngineConfig(mode=mode)) as eng:
        want = texts(eng)
        with pytest.raises(OtherTokens) as err:
            texts(eng, process_outputs=by_hand(skip_round=3))
        assert texts(eng) == want
    assert (err.value.round, err.value.prompt, err.value.given) == (3, 0, [])
    assert str(err.value).startswith("process_outputs=by_hand committed round 3 itself for "
                                     "prompt 0 (it lowered req.num_inflight) but handed it no "
                                     "token and did not end it, where the round kept [")


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_accepted_drafts_dropped_by_a_plugin_are_refused_in_every_mode(mode):
    """(b) kept[:1] of a speculative round: garbage texts under ZOS (the device went on from
    the accepted drafts); serial recomputed them: refused in both, so the modes agree."""
    with te.Engine(te.EngineConfig(mode=mode, num_draft_tokens=3)) as eng:
        want = texts(eng, 16)
        with pytest.raises(OtherTokens) as err:
            texts(eng, 16, process_outputs=by_hand(keep=lambda kept: kept[:1]))
        assert texts(eng, 16) == want
    assert len(err.value.sampled) > 1 and err.value.given == err.value.sampled[:1]
    assert f"handed it the tokens {err.value.given} and did not end it, where the round kept " \
           f"{err.value.sampled}" in str(err.value)


def swapping(round_, prompt=0):
    """A plug-in giving engine.commit_outputs another valid token for ``prompt`` in a round."""
    def swapped(eng, step):
        eng.device.wait(step.sample_done)
        out = eng.read_outputs(step)
        if step.plan.round == round_:
            out[prompt] = (out[prompt] + 1) % eng.tokenizer.vocab_size
        for req in eng.commit_outputs(step, out):
            eng.scheduler.release_if_done(req)
    return swapped


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_commit_outputs_refuses_other_tokens_than_the_slot_holds(mode):
    """(c) Serial went on from the token given, ZOS from the device's: two texts, no error."""
    with te.Engine(te.EngineConfig(mode=mode)) as eng:
        want = texts(eng)
        with pytest.raises(OtherTokens) as err:
            texts(eng, process_outputs=swapping(3))
        assert texts(eng) == want
    (sampled,), given = err.value.sampled, err.value.given
    assert (err.value.round, err.value.prompt, given) == (3, 0, [sampled + 1])
    assert str(err.value).startswith(
        f"process_outputs=swapped gave engine.commit_outputs() round 3's outputs with "
        f"{given} kept for prompt 0, where the round sampled [{sampled}] (the step's output "
        f"slot holds them)")


def lowers_too(eng, step):
    eng.device.wait(step.sample_done)
    for req in eng.commit_outputs(step, eng.read_outputs(step)):
        eng.scheduler.release_if_done(req)
    for req in step.plan.requests:
        req.num_inflight -= 1


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_num_inflight_lowered_beside_commit_outputs_is_refused_by_name(mode):
    """(d) The count went to -1 and the run stalled: "was a deferred step dropped?"."""
    with te.Engine(te.EngineConfig(mode=mode)) as eng:
        want = texts(eng)
        with pytest.raises(InflightChanged) as err:
            texts(eng, process_outputs=lowers_too)
        assert texts(eng) == want
    assert err.value.prompt == 0
    assert str(err.value).startswith(
        "prompt 0's req.num_inflight is -1, but the run counts 0 of its rounds in flight "
        "(planned, not yet committed): it was changed by process_outputs=lowers_too, beside "
        "engine.commit_outputs(step, out), which takes one off itself")


def commit_lowers(req, tokens, eos_id, decode):
    Request.commit(req, tokens, eos_id, decode)
    if req.finished:
        req.num_inflight -= 1


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_num_inflight_lowered_by_a_per_request_commit_is_refused_by_name(mode):
    """(f) Serial stalled ("was a deferred step dropped?"), ZOS raced: the engine's
    release_if_done freed a cache round 4 still used."""
    with te.Engine(te.EngineConfig(mode=mode)) as eng:
        want = texts(eng)
        with pytest.raises(InflightChanged) as err:
            texts(eng, stop=["e"], on_round=per_request(commit=commit_lowers))
        assert texts(eng) == want
    assert f"it was changed by prompt {err.value.prompt}'s commit, replaced on the request by " \
           f"a plug-in (per_request(commit=commit_lowers))" in str(err.value)


def processes_round_3_twice(engine):
    """The engine's own loops, but round 3's step is processed twice."""
    zos, previous = engine.config.mode == "zos", None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
            if previous.plan.round == 3:
                engine.process_outputs(previous)
            previous = None
        step = engine.launch_sample(inputs)
        if zos and not plan.is_prefill:
            previous = step
        else:
            engine.process_outputs(step)
            if plan.round == 3:
                engine.process_outputs(step)


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_a_step_a_plugin_committed_itself_processed_again_is_refused(mode):
    """(i) The second call was taken and lowered num_inflight again: a stall or a race."""
    with te.Engine(te.EngineConfig(mode=mode)) as eng:
        want = texts(eng)
        with pytest.raises(StepProcessedTwice) as err:
            texts(eng, loop=processes_round_3_twice, process_outputs=by_hand())
        assert texts(eng) == want
    assert err.value.round == 3 and err.value.prompt_indexes == [0, 1, 2, 3]


def lowers_unfinished_only(eng, step):
    """Commits itself, but lowers num_inflight only for the requests still unfinished."""
    eng.device.wait(step.sample_done)
    reqs, out = step.plan.requests, eng.read_outputs(step)
    for req, kept in zip(reqs, unpack_outputs(out, len(reqs), 0)):
        if not req.finished:
            req.num_inflight -= 1
            req.commit(kept, eng.tokenizer.eos_id, eng.tokenizer.decode)
    for req in reqs:
        eng.scheduler.release_if_done(req)


def test_a_plugin_lowering_only_some_of_its_steps_counts_is_refused_by_name():
    with te.Engine(te.EngineConfig(mode="zos")) as eng:
        want = texts(eng, stop=["e"])
        with pytest.raises(InflightChanged) as err:
            texts(eng, stop=["e"], process_outputs=lowers_unfinished_only)
        assert texts(eng, stop=["e"]) == want
    assert "process_outputs=lowers_unfinished_only committed round " in str(err.value)
    assert "itself, lowering the other requests' of its step by one, but left this one's at 1" \
           in str(err.value)


# ---------------------------------------------- round 23: the tokens handed out, the count kept

def _forgets_the_count(eng, step):
    """Commits each round itself (wait, read, req.commit, release) but never lowers
    req.num_inflight: it was told a step was dropped, though it processed every one."""
    eng.device.wait(step.sample_done)
    reqs, out = step.plan.requests, eng.read_outputs(step)
    k = 0 if step.plan.is_prefill else eng.config.num_draft_tokens
    for req, kept in zip(reqs, unpack_outputs(out, len(reqs), k)):
        if not req.finished:
            req.commit(kept, eng.tokenizer.eos_id, eng.tokenizer.decode)
    for req in reqs:
        eng.scheduler.release_if_done(req)


@pytest.mark.parametrize("mode, drafts", [("serial", 0), ("zos", 0), ("zos", 3)])
def test_a_plugin_committing_itself_without_lowering_the_count_is_told_so(mode, drafts):
    with te.Engine(te.EngineConfig(mode=mode, device="cpu", num_draft_tokens=drafts)) as eng:
        want = [c.text for c in eng.generate(PROMPTS, 12)]
        with pytest.raises(ValueError, match=r"process_outputs=_forgets_the_count handed out "
                                             r"round 0's tokens itself .* without taking the "
                                             r"round off its num_inflight") as err:
            eng.generate(PROMPTS, 12, process_outputs=_forgets_the_count)
        assert "dropped" not in str(err.value)
        assert [c.text for c in eng.generate(PROMPTS, 12)] == want
