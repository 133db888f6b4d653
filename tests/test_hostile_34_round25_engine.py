"""Issue 34, round twenty-five (engine): a plug-in's change to a request refused where it is
made, naming the plug-in, the field and what was done.

e: a per_request commit handing out a round's tokens twice, or one made up (silently wrong
text); b: output_ids or text replaced by another type (a bare AttributeError or TypeError);
f: a waiting request changed by a process_outputs plug-in (blamed on the loop); a: a waiting
request's limit raised by on_round (refused rounds later, "since the last round", "its KV
blocks were reserved"); c: a token removed beside engine.commit_outputs (told "changed" and
"appended"); d: an end taken back by per_request's wants_more ("by the loop or a plug-in")."""

from __future__ import annotations

import numpy as np
import pytest

import toy_engine as te
from overlap_course.labs import plugins, shipped
from toy_engine.refusals import (CommitOtherTokens, EndTakenBack, FixedChanged, HandedBeside,
                                 StateReplaced)
from toy_engine.sequence import Request

PROMPTS = ["Once upon", "The king said", "She ", "A"]
WAITING = PROMPTS * 3  # 12 prompts, 8 rows: prompts 8 to 11 wait
CONFIGS = [dict(mode="serial"), dict(mode="zos"), dict(mode="zos", num_draft_tokens=3)]
IDS = ["serial", "zos", "zos-drafts"]


def ends(eng, n=12, prompts=PROMPTS, **kw):
    return [(c.text, c.finish_reason) for c in eng.generate(prompts, n, **kw)]


@pytest.fixture(params=CONFIGS, ids=IDS)
def eng(request):
    with te.Engine(te.EngineConfig(device="cpu", **request.param)) as e:
        yield e


# e: a per_request commit hands out what the round kept, once, in order.

def twice(req, tokens, eos_id, decode):
    Request.commit(req, tokens, eos_id, decode)
    if not req.finished:
        Request.commit(req, tokens, eos_id, decode)


def extra(req, tokens, eos_id, decode):
    Request.commit(req, tokens, eos_id, decode)
    if not req.finished:
        req.output_ids.append(5)
        req.text += "x"


@pytest.mark.parametrize("commit, appended", [(twice, [1, 1]), (extra, [1, 5])],
                         ids=["twice", "extra"])
def test_a_commit_handing_out_other_tokens_is_refused(eng, commit, appended):
    want = ends(eng)
    with pytest.raises(CommitOtherTokens, match=(
            rf"prompt 0's commit, replaced on the request by a plug-in \(per_request\(commit="
            rf"{commit.__name__}\)\), was handed round 0's kept tokens \[1\] and appended "
            rf"\[1, \d+\]: a commit appends each kept token once, in order")) as info:
        ends(eng, on_round=plugins.per_request(commit=commit))
    assert info.value.appended == appended and info.value.kept == [1]
    assert ends(eng) == want


def test_the_shipped_lab_commit_still_runs_to_be_judged(eng):
    """Lab 4's shipped commit keeps tokens past a stop or the limit, or cuts a stop: what it
    leaves is the kept run, or a prefix of it as the request ends; the course judges it."""
    for stop in ([], ["e"], [" t", "e"], ["in"]):
        got = ends(eng, 16, stop=stop, on_round=plugins.per_request(commit=shipped.commit))
        assert all(reason in ("length", "stop", "eos") for _, reason in got), got


# b: output_ids and text keep their types.

CHANGES = {"output_ids=tuple": ("output_ids", tuple), "output_ids=ndarray": ("output_ids",
                                                                          np.array),
           "output_ids=None": ("output_ids", lambda _: None), "text=None": ("text",
                                                                            lambda _: None),
           "text=bytes": ("text", str.encode)}


def _po_then_commit(change):
    def po(eng, step):
        eng.device.wait(step.sample_done)
        out = eng.read_outputs(step)
        if step.plan.round == 3:
            change(step.plan.requests[0])
        for r in eng.commit_outputs(step, out):
            eng.scheduler.release_if_done(r)
    return po


def _on_round(change):
    def on_round(eng, rnd):
        if rnd == 3:
            change(eng.requests[0])
    return on_round


@pytest.mark.parametrize("where, says", [
    ("process_outputs", "by process_outputs=po, before engine.commit_outputs"),
    ("on_round", "by on_round=on_round:")])
@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_output_ids_or_text_of_another_type_is_refused_naming_it(eng, where, says, change):
    name, make = CHANGES[change]
    want = ends(eng)
    plugin = (_po_then_commit if where == "process_outputs" else _on_round)(
        lambda req: setattr(req, name, make(getattr(req, name))))
    with pytest.raises(StateReplaced) as info:
        ends(eng, **{where: plugin})
    kind = "NoneType" if change.endswith("None") else change.split("=")[1]
    message = str(info.value)
    assert message.startswith(f"prompt 0's req.{name} = {kind} "), message
    assert says in message and f"{name} must stay a plain " in message, message
    assert info.value.name == name and info.value.prompt == 0
    assert ends(eng) == want


# f, a: a waiting request's fields are fixed once generate takes them, refused as changed.

def test_a_waiting_request_changed_by_process_outputs_names_it_not_the_loop(eng):
    def po(engine, step):
        engine.device.wait(step.sample_done)
        for r in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(r)
        if step.plan.round == 2:
            first = engine.requests[0]
            if not first.finished and first.num_inflight == 0:
                first.max_new_tokens = len(first.output_ids)  # legal: it ends "length"
            engine.requests[8].max_new_tokens = "5"

    want = ends(eng, prompts=WAITING)
    with pytest.raises(FixedChanged, match=r"prompt 8's req.max_new_tokens was changed from 12 "
                                           r"to '5' by process_outputs=po, a value of type str"):
        ends(eng, prompts=WAITING, process_outputs=po)
    assert ends(eng, prompts=WAITING) == want


@pytest.mark.parametrize("value", [20, "5"])
def test_a_waiting_request_raised_by_on_round_is_refused_at_once_naming_it(eng, value):
    def on_round(engine, rnd):
        if rnd == 0:
            engine.requests[-1].max_new_tokens = value

    want = ends(eng, prompts=WAITING)
    with pytest.raises(FixedChanged, match=rf"prompt 11's req.max_new_tokens was changed from "
                                           rf"12 to {value!r} by on_round=on_round") as info:
        ends(eng, prompts=WAITING, on_round=on_round)
    assert eng.scheduler.round == 0  # at once, not rounds later
    message = str(info.value)
    assert "KV blocks were reserved" not in message and "since the last round" not in message
    if value == 20:
        assert "fixed once generate takes them, admitted or waiting" in message, message
    assert ends(eng, prompts=WAITING) == want


def test_a_waiting_request_changed_by_the_loop_names_the_loop():
    def loop(engine):
        engine.requests[0].max_new_tokens = 20
        te.loops.serial_loop(engine)

    with te.Engine(te.EngineConfig(device="cpu")) as e:
        with pytest.raises(FixedChanged, match=r"from 12 to 20 by loop=loop: .* fixed once "
                                               r"generate takes them"):
            e.generate(PROMPTS, 12, loop=loop)


# c: a token removed beside engine.commit_outputs is told so.

def _removing(change, after: bool):
    def po(eng, step):
        eng.device.wait(step.sample_done)
        out = eng.read_outputs(step)
        if step.plan.round == 3 and not after:
            change(step.plan.requests[0].output_ids)
        reqs = eng.commit_outputs(step, out)
        if step.plan.round == 3 and after:
            change(step.plan.requests[0].output_ids)
        for r in reqs:
            eng.scheduler.release_if_done(r)
    return po


@pytest.mark.parametrize("change", [list.pop, list.clear], ids=["pop", "clear"])
@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_token_removed_beside_commit_outputs_is_told_removed(eng, change, after):
    want = ends(eng)
    when = (r"committed round 3 through engine.commit_outputs\(step, out\), which handed "
            r"prompt 0 the tokens \[[\d, ]+\], then removed \d+ of the \d+ tokens of prompt 0's "
            r"req.output_ids: " if after else
            r"removed \d+ of the \d+ tokens of prompt 0's req.output_ids before it called "
            r"engine.commit_outputs\(step, out\) for round 3: ")
    with pytest.raises(HandedBeside, match="process_outputs=po " + when) as info:
        ends(eng, process_outputs=_removing(change, after))
    assert "itself" not in str(info.value) and "append" not in str(info.value).split(":")[0]
    assert info.value.before is not after
    assert ends(eng) == want


# d: wants_more named.

def test_an_end_taken_back_in_wants_more_names_it(eng):
    def wants_more(req):
        for r in eng.requests:
            if r is not req and r.finish_reason is not None:
                r.finish_reason = None
        return Request.wants_more(req)

    want = ends(eng, stop=["e"])
    with pytest.raises(EndTakenBack, match=r"set back from 'stop' to None by "
                                           r"per_request\(wants_more=wants_more\): "):
        ends(eng, stop=["e"], on_round=plugins.per_request(wants_more=wants_more))
    assert ends(eng, stop=["e"]) == want
