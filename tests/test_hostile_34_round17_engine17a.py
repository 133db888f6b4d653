"""Issue 34, round seventeen (engine17a): what a plug-in commits is stored as plain ints
(a Tensor or array token, even 0-d, refused by name: one read from the output slot changed
as later rounds reused it), a non-list output_ids never iterated as the run ends (Ctrl-C is
held there), a list subclass refused by its type, a token committed then taken back no
progress, and a process_outputs plug-in's change to a request outside its step refused."""

from __future__ import annotations

import numpy as np
import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine import buffers
from toy_engine import run as te_run
from toy_engine.refusals import HandedBeside

from test_hostile_34_round16_engine import capped

PROMPTS = ["Hello", "Once upon"]


def committing(token):
    """A process_outputs plug-in that commits ``token(out, i)`` for each request itself."""
    def po(engine, step):
        engine.device.wait(step.sample_done)
        out = engine.device.host(buffers.out_buffer(step.slot), "r")
        for i, req in enumerate(step.plan.requests):
            req.num_inflight -= 1
            if req.finished:
                continue
            tok = out[i]
            if tok == engine.tokenizer.eos_id:
                req.finish_reason = "eos"
            else:
                req.output_ids.append(token(out, i))
                req.text += engine.tokenizer.decode([int(tok)])
                if len(req.output_ids) >= req.max_new_tokens:
                    req.finish_reason = "length"
            engine.scheduler.release_if_done(req)
    return po


@pytest.fixture(scope="module", params=["serial", "zos"])
def engine_and_reference(request):
    with te.Engine(te.EngineConfig(mode=request.param)) as eng:
        yield eng, [c.token_ids for c in eng.generate(PROMPTS, 8)]


@pytest.mark.parametrize("token", [lambda out, i: out[i], lambda out, i: out[i].clone()],
                         ids=["view_of_the_slot", "tensor_copy"])
def test_a_tensor_token_is_refused_by_name(engine_and_reference, token):
    """A 0-d Tensor passed as a token id (operator.index takes it); the slot's view then
    changed as later rounds reused the slot, and token_ids came back wrong as Tensors."""
    eng, want = engine_and_reference
    with pytest.raises(TypeError) as err:
        eng.generate(PROMPTS, 8, process_outputs=committing(token))
    message = str(err.value)
    assert message.startswith("process_outputs=po, committing prompt 0's tokens itself, stored "
                              "Tensor tensor(57) at req.output_ids[0]: "), message
    assert "append int(tok), not the Tensor, even 0-d (a Tensor read from the output slot is a " \
           "view of it, which later rounds overwrite)" in message, message
    assert [c.token_ids for c in eng.generate(PROMPTS, 8)] == want


def test_numpy_integers_are_stored_as_plain_ints(engine_and_reference):
    """What passes is stored as plain ints: token_ids hold ints, as the device is sent."""
    eng, want = engine_and_reference
    got = eng.generate(PROMPTS, 8, process_outputs=committing(lambda out, i: np.int64(out[i])))
    assert [c.token_ids for c in got] == want
    assert {type(t) for c in got for t in c.token_ids} == {int}


def test_a_0d_numpy_array_token_is_refused_at_commit(engine_and_reference):
    """np.array(tok) passed, then prepare_inputs failed with 'len() of unsized object'."""
    eng, want = engine_and_reference

    def commit(req, tokens, eos_id, decode):
        for tok in tokens:
            req.output_ids.append(np.array(tok))
            req.text += decode([tok])
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"

    with pytest.raises(TypeError) as err:
        eng.generate(PROMPTS, 8, on_round=plugins.per_request(commit=commit))
    message = str(err.value)
    assert message.startswith("prompt 0's commit, replaced on the request by a plug-in "
                              "(per_request(commit=commit)), stored ndarray array(57) at "
                              "req.output_ids[0]: "), message
    assert "append int(tok), not the ndarray, even 0-d" in message, message
    assert [c.token_ids for c in eng.generate(PROMPTS, 8)] == want


class Endless:
    """Not a list: iterating it never ends (``limit`` steps, then it says so)."""

    def __init__(self, limit=None):
        self.steps, self.limit = 0, limit

    def __iter__(self):
        if self.limit is None:
            raise ValueError("boom from __iter__")
        return self

    def __next__(self):
        self.steps += 1
        if self.steps > self.limit:
            raise RuntimeError("iterated 10,000 steps: it would never end")
        return 1


@pytest.mark.parametrize("make", [lambda: Endless(10_000), lambda: Endless()],
                         ids=["never_ends", "iter_raises"])
def test_a_non_list_output_ids_is_never_iterated(engine_and_reference, make):
    """The run's end built the Completions with list(output_ids), where Ctrl-C is held: an
    endless one hung generate for good, an __iter__ that raised replaced the clear error."""
    eng, want = engine_and_reference
    stored = []

    def po(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
        if step.plan.round == 3:
            stored.append(make())
            step.plan.requests[0].output_ids = stored[0]

    with pytest.raises(TypeError, match="req.output_ids = Endless <.* was stored by process_outputs=po"):
        eng.generate(PROMPTS, 8, process_outputs=po)
    assert stored[0].steps == 0
    assert eng.completions[0].token_ids == [] and eng.completions[0].finish_reason == "abort"
    assert [c.token_ids for c in eng.generate(PROMPTS, 8)] == want


class TokenList(list):
    pass


@pytest.mark.parametrize("container", [TokenList, tuple], ids=["list_subclass", "tuple"])
def test_a_list_subclass_is_refused_by_its_type(container):
    """The message said 'output_ids holds token ids, ints from 0 to 61' of [57]: it names the
    type now, and that a plain list is needed."""
    def commit(req, tokens, eos_id, decode):
        for tok in tokens:
            req.output_ids = container(list(req.output_ids) + [tok])
            req.text += decode([tok])
            if len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = "length"
                return

    with te.Engine(te.EngineConfig(mode="serial")) as eng:
        with pytest.raises(TypeError) as err:
            eng.generate(["Hello"], 4, on_round=plugins.per_request(commit=commit))
        assert eng.generate(["Hello"], 4)[0].finish_reason == "length"
    message, kind = str(err.value), container.__name__
    assert f"req.output_ids = {kind} " in message, message
    assert f"must stay a plain list, not a {kind}" in message, message
    assert "ints from 0 to" not in message, message


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_a_token_committed_then_taken_back_is_refused(monkeypatch, mode):
    """commit_outputs marked progress each call, so a plug-in that took the token back ran
    forever (past round 3,000; a right run of this takes 9 rounds).  Round 24: refused where the
    plug-in returns, by name (HandedBeside), not a stall."""
    monkeypatch.setattr(te_run, "MAX_ROUNDS_WITHOUT_PROGRESS", 40)

    def po(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if len(req.output_ids) > 2 and not req.finished:
                req.output_ids.pop()
                req.text = req.text[:-1]
            engine.scheduler.release_if_done(req)

    with te.Engine(te.EngineConfig(mode=mode)) as eng:
        with pytest.raises(HandedBeside) as err:
            eng.generate(PROMPTS, 8, process_outputs=po, on_round=capped(400))
        assert eng.generate(["Hello"], 4)[0].finish_reason == "length"
    assert err.value.holds == [] and len(err.value.handed) == 1


def outside(change):
    """A process_outputs plug-in that, once prompt 0 finished, ``change``s its tokens while
    processing prompt 1's step (max_batch_size=1 runs them one after the other)."""
    def po(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
        first = engine.requests[0]
        if first not in step.plan.requests and first.finished and not hasattr(po, "done"):
            po.done = change(first.output_ids)
    return po


@pytest.mark.parametrize("change, error, says", [
    (lambda ids: ids.__setitem__(0, "x"), TypeError, r"changed req\.output_ids\[0\] from 57 "
                                                     r"to str 'x': a committed token stays"),
    (lambda ids: ids.__setitem__(0, 1), ValueError, r"changed req\.output_ids\[0\] from 57 to "
                                                    r"int 1: a committed token stays"),
    (lambda ids: ids.append(1), ValueError, r"changed prompt 0's req\.output_ids from 4 to 5 "
                                            r"tokens: a step's tokens go to its own requests"),
], ids=["to_a_str", "to_another_id", "appended"])
def test_a_request_outside_the_step_is_checked(change, error, says):
    """Only the step's requests were checked: prompt 0's token_ids came back ['x', 1, ...]."""
    with te.Engine(te.EngineConfig(mode="serial", max_batch_size=1)) as eng:
        want = [c.token_ids for c in eng.generate(PROMPTS, 4)]
        with pytest.raises(error, match=r"^process_outputs=po, given round \d+'s step \(prompt 0 "
                                        r"is not in it\), " + says):
            eng.generate(PROMPTS, 4, process_outputs=outside(change))
        assert [c.token_ids for c in eng.generate(PROMPTS, 4)] == want
