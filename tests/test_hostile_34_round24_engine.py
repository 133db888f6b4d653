"""Issue 34, round twenty-four (engine): what a plug-in or a loop does to a request, refused by
name where it would give silently wrong text, a hang, a bare TypeError or a false message.

d: ``req.finish_reason`` set back to None by on_round (serial and ZOS returned wrong text and
"abort", ZOS with drafts never returned: each re-end counted as progress); e: tokens handed out
beside engine.commit_outputs (doubled or made-up text); c: a learner's loop holding 2 decode
steps with drafts (wrong text); a: a waiting request's max_new_tokens set to 4.0, "5" or None
(a bare TypeError in the scheduler); b: lowered to -3 while waiting (admitted with no KV block,
then "freed since"); f: lowered with np.int64(4) or 4.0 ("may only be lowered")."""

from __future__ import annotations

import collections
import signal

import numpy as np
import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine.buffers import unpack_outputs
from toy_engine.record import Commit
from toy_engine.refusals import DraftsTooDeep, EndTakenBack, FixedChanged, HandedBeside
from toy_engine.run import EngineStalled

PROMPTS = ["Once upon", "The king said", "She ", "A"]
CONFIGS = [dict(mode="serial"), dict(mode="zos"), dict(mode="zos", num_draft_tokens=3)]
IDS = ["serial", "zos", "zos-drafts"]


def ends(eng, n=16, **kw):
    return [(c.text, c.finish_reason) for c in eng.generate(PROMPTS, n, **kw)]


@pytest.fixture(params=CONFIGS, ids=IDS)
def eng(request):
    with te.Engine(te.EngineConfig(device="cpu", **request.param)) as e:
        yield e


# d: a request ends exactly once.

def _reopen(eng, round):
    for r in eng.requests:
        if r.finish_reason is not None:
            r.finish_reason = None


def test_finish_reason_set_back_to_none_is_refused_naming_the_prompt_and_plugin(eng):
    stop = ["e"] if eng.config.mode == "serial" else [" t", "e"]  # some end before the last
    want = ends(eng, stop=stop)
    with pytest.raises(EndTakenBack, match=r"prompt \d's req.finish_reason was set back from "
                                           r"'stop' to None by on_round=_reopen: a request "
                                           r"ends exactly once") as info:
        eng.generate(PROMPTS, 16, stop=stop, on_round=_reopen)
    assert info.value.was == "stop"
    assert ends(eng, stop=stop) == want


def test_finish_reason_set_back_by_the_loop_is_refused_and_a_reason_kept():
    req = te.sequence.Request(0, 3, "A", [1], 4)
    req.finish_reason = "stop"
    req.finish_reason = "stop"  # the same again: nothing taken back
    with pytest.raises(EndTakenBack, match="prompt 3's .* by the loop or a plug-in"):
        req.finish_reason = None
    assert req.finish_reason == "stop"


def test_a_request_ended_again_each_round_around_the_guard_stalls_not_hangs():
    """vars() gets around the guard: each round's re-end of a request with no new token is no
    progress, so the run stalls in MAX_ROUNDS_WITHOUT_PROGRESS rounds (it ran forever)."""
    def reopen(eng, round):
        for r in eng.requests:
            if r.finish_reason is not None:
                vars(r)["finish_reason"] = None

    def hang(*_):
        raise TimeoutError("generate still running after 300 s: it would never end")

    was = signal.signal(signal.SIGALRM, hang)
    signal.alarm(300)  # takes seconds; a generous bound, where it ran forever
    try:
        with te.Engine(te.EngineConfig(device="cpu", mode="zos", num_draft_tokens=3)) as e:
            with pytest.raises(EngineStalled, match="1000 rounds in a row") as info:
                e.generate(PROMPTS, 16, stop=[" t", "e"], on_round=reopen)
            assert info.value.reason == "no_progress"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, was)


# e: after engine.commit_outputs the round's tokens are the engine's.

def _committing(then):
    def po(eng, step):
        eng.device.wait(step.sample_done)
        out = eng.read_outputs(step)
        reqs = eng.commit_outputs(step, out)
        k = 0 if step.plan.is_prefill else eng.config.num_draft_tokens
        then(eng, reqs, unpack_outputs(out, len(reqs), k))
        for r in reqs:
            eng.scheduler.release_if_done(r)
    po.__name__ = po.__qualname__ = then.__name__
    return po


def twice(eng, reqs, kept):
    for req, toks in zip(reqs, kept):
        if not req.finished:
            req.commit(toks, eng.tokenizer.eos_id, eng.tokenizer.decode)


def extra(eng, reqs, kept):
    for req in reqs:
        if not req.finished:
            req.output_ids.append(5)


def nothing(eng, reqs, kept):
    pass


@pytest.mark.parametrize("then", [twice, extra], ids=["twice", "extra"])
def test_tokens_handed_out_beside_commit_outputs_are_refused(eng, then):
    want = ends(eng)
    with pytest.raises(HandedBeside, match=rf"process_outputs={then.__name__} committed round "
                                           rf"0 through engine.commit_outputs\(step, out\), "
                                           rf"which handed prompt 0 the tokens \[\d+\], then "):
        eng.generate(PROMPTS, 16, process_outputs=_committing(then))
    assert ends(eng) == want
    assert ends(eng, process_outputs=_committing(nothing)) == want  # the right one passes


# c: a loop holding 2 decode steps on an engine that drafts.

def _deep(depth):
    def loop(engine):
        held = collections.deque()
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                if held:
                    engine.flush(held.popleft())
                continue
            inputs = engine.prepare_inputs(plan)
            if held:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if len(held) == depth:
                engine.process_outputs(held.popleft())
            step = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(step)
            else:
                held.append(step)
    return loop


def test_a_loop_holding_two_drafting_steps_is_refused_by_the_engine():
    with plugins.ring(4):
        e = te.Engine(te.EngineConfig(device="cpu", mode="zos", num_draft_tokens=3))
    try:
        want = [c.text for c in e.generate(PROMPTS, 20, loop=te.loops.serial_loop)]
        assert [c.text for c in e.generate(PROMPTS, 20, loop=_deep(1))] == want
        with plugins.ring(4), pytest.raises(DraftsTooDeep, match=(
                r"round \d+'s decode plan, whose prompt \d has 2 earlier rounds still in "
                r"flight, on an engine that drafts 3 tokens a round \(num_draft_tokens=3\): "
                r"the seqlen correction covers one round in flight")):
            e.generate(PROMPTS, 20, loop=_deep(2))
        assert [c.text for c in e.generate(PROMPTS, 20)] == want
    finally:
        e.close()


def test_a_deeper_loop_without_drafts_still_runs():
    with plugins.ring(4):
        e = te.Engine(te.EngineConfig(device="cpu", mode="zos"))
    try:
        want = [c.text for c in e.generate(PROMPTS, 20, loop=te.loops.serial_loop)]
        with plugins.ring(4):
            assert [c.text for c in e.generate(PROMPTS, 20, loop=_deep(2))] == want
    finally:
        e.close()


# a, b, f: max_new_tokens changed by on_round, waiting or admitted.

def _set_limit(value, round=0, prompt=None):
    def on_round(eng, rnd):
        if rnd == round:
            for r in eng.requests:
                if prompt in (None, r.index):
                    r.max_new_tokens = value
    return on_round


@pytest.mark.parametrize("value", [4.0, "5", None, np.int64(4), True],
                         ids=["float", "str", "None", "np.int64", "bool"])
@pytest.mark.parametrize("round", [0, 5], ids=["waiting", "admitted"])
def test_a_non_int_max_new_tokens_is_refused_naming_its_type_and_the_plugin(eng, value, round):
    want = ends(eng, 12)
    with pytest.raises(FixedChanged, match=(
            rf"prompt 0's req.max_new_tokens was changed from 12 to .* by on_round=on_round, "
            rf"a value of type {type(value).__name__}: max_new_tokens is a plain int")):
        eng.generate(PROMPTS, 12, on_round=_set_limit(value, round))
    assert ends(eng, 12) == want


def test_a_waiting_request_changed_by_the_loop_is_refused_before_the_scheduler_reads_it():
    def loop(engine):
        engine.requests[0].max_new_tokens = "5"
        te.loops.serial_loop(engine)

    with te.Engine(te.EngineConfig(device="cpu")) as e:
        with pytest.raises(FixedChanged, match=r"to .5. by loop=loop, a value of type str"):
            e.generate(PROMPTS, 12, loop=loop)


@pytest.mark.parametrize("value", [-3, 0])
def test_a_waiting_request_lowered_to_no_tokens_ends_length_never_admitted(eng, value):
    """As an admitted one lowered to the tokens it has ends "length" (round 22)."""
    want = ends(eng, 12)
    got = ends(eng, 12, on_round=_set_limit(value, prompt=1))
    assert got[1] == ("", "length")
    assert got[:1] + got[2:] == want[:1] + want[2:]
    admitted = [i for c in eng.record.of(Commit) for i in c.prompts]
    assert 1 not in admitted and 0 in admitted
    assert ends(eng, 12, on_round=_set_limit(value)) == [("", "length")] * 4


def test_a_lowered_int_is_still_taken(eng):
    """Ended "length"; with drafts the round in flight may still commit (round 23)."""
    got = ends(eng, 12, on_round=_set_limit(4, round=3))
    most = 12 if eng.config.num_draft_tokens else 4
    assert all(reason == "length" and len(text) <= most for text, reason in got), got
