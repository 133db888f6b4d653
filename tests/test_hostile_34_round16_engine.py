"""Issue 34, round sixteen (engine): the run's stats in linear time (Ctrl-C is held while they
are computed), a process_outputs plug-in that never commits refused by name, and a committed
token a plug-in changes in place refused by name."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine.refusals import OtherTokens
from toy_engine.sequence import Request
from toy_engine.timeline import Stage, Timeline, run_stats, union_ms

PROMPTS = ["Once upon", "There was"]
HOST = ("schedule", "prepare", "launch_forward", "launch_sample", "wait", "postprocess")
DEVICE = ("upload", "forward", "sample")


class StillGoing(Exception):
    """Raised by ``capped``: the run went on far past where it should have stopped."""


def capped(rounds: int):
    def on_round(engine, round):
        if round >= rounds:
            raise StillGoing(round)
    return on_round


class CountedSpans(list):
    """A timeline's spans that count the passes over them."""

    passes = 0

    def __iter__(self):
        CountedSpans.passes += 1
        return super().__iter__()


def synthetic(rounds: int) -> Timeline:
    """A serial-looking timeline: each round's host stages, then its device kernels."""
    tl, t = Timeline(origin_ns=0), 0.0
    for r in range(rounds):
        for stage in HOST:
            tl.add("host", stage, r, t, t + 0.1, owner=r if stage == "wait" else None)
            t += 0.1
        for stage in DEVICE:
            tl.add("device", stage, r, t - 0.35, t - 0.15)
    return tl


def stats_of(tl: Timeline, rounds: int):
    counts = dict(tokens=rounds, request_decode_rounds=rounds - 1, proposed=0, accepted=0,
                  discarded=0)
    return run_stats(tl, counts, {0}, 1.0, [0.1])


def test_run_stats_pass_over_the_spans_a_few_times_not_once_a_round():
    """Each round's mean host/device work scanned every span (rounds^2, in generate's
    ``finally`` with Ctrl-C held): 2,048 rounds kept an Interrupt waiting 10 s."""
    tl = synthetic(300)
    tl.spans = CountedSpans(tl.spans)
    CountedSpans.passes = 0
    stats_of(tl, 300)
    assert CountedSpans.passes <= 20, f"{CountedSpans.passes} passes over the spans for 300 rounds"


def test_8192_rounds_stats_take_well_under_seconds():
    tl = synthetic(8192)
    start = time.perf_counter()
    stats = stats_of(tl, 8192)
    took = time.perf_counter() - start
    assert stats.rounds == 8192
    assert took < 4.0, f"run_stats took {took:.1f} s for 8,192 rounds (Ctrl-C is held meanwhile)"


def test_stats_values_are_each_rounds_work_averaged():
    """The values, as the definition computes them, exactly (byte-identical to before)."""
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=1)) as eng:
        eng.generate(["Once upon"] * 3, 12)
        tl, stats = eng.timeline, eng.stats
    rounds = tl.rounds()
    for lane, got in (("host", stats.mean_host_ms_per_round),
                      ("device", stats.mean_device_ms_per_round)):
        work = (union_ms(s for s in tl.spans if s.lane == lane and s.round == r
                         and s.stage != Stage.WAIT) for r in rounds)
        assert got == sum(work) / len(rounds)


def forgets_to_commit(engine, step):  # waits, reads, releases: hands out no token
    engine.device.wait(step.sample_done)
    engine.read_outputs(step)
    for req in step.plan.requests:
        req.num_inflight -= 1
        engine.scheduler.release_if_done(req)


@pytest.mark.parametrize("mode", ["serial", "zos"])
def test_a_process_outputs_plugin_that_never_commits_is_refused_by_name(mode):
    """Stalled as no_progress after MAX_ROUNDS_WITHOUT_PROGRESS rounds until round 22, which
    refuses at once a plug-in that lowers num_inflight (claiming the round) and hands out no
    token (OtherTokens: under ZOS the device had fed the dropped token to the next round)."""
    with te.Engine(te.EngineConfig(mode=mode, max_batch_size=2)) as eng:
        want = [c.text for c in eng.generate(PROMPTS, 8)]
        with pytest.raises(OtherTokens) as err:
            eng.generate(PROMPTS, 8, process_outputs=forgets_to_commit, on_round=capped(400))
        assert [c.finish_reason for c in eng.completions] == ["abort", "abort"]
        assert [c.text for c in eng.generate(PROMPTS, 8)] == want
    assert err.value.round == 0 and err.value.prompt == 0 and err.value.given == []
    assert str(err.value).startswith("process_outputs=forgets_to_commit committed round 0 "
                                     "itself for prompt 0 (it lowered req.num_inflight) but "
                                     "handed it no token and did not end it")


def per_request_rewriting(index, value):
    """A per_request commit that commits, then overwrites output_ids[index] once."""
    def commit(req, tokens, eos_id, decode):
        Request.commit(req, tokens, eos_id, decode)
        if len(req.output_ids) >= 3 and not vars(req).get("rewritten"):
            req.rewritten = True
            req.output_ids[index] = value
    return dict(on_round=plugins.per_request(commit=commit))


def per_request_replacing_last(index, value):
    """A per_request commit that overwrites the newest token (index -1) instead of appending."""
    def commit(req, tokens, eos_id, decode):
        if len(req.output_ids) >= 2 and not vars(req).get("rewritten"):
            req.rewritten = True
            req.output_ids[index] = value
            return
        Request.commit(req, tokens, eos_id, decode)
    return dict(on_round=plugins.per_request(commit=commit))


def process_outputs_rewriting(index, value):
    """A process_outputs plug-in that overwrites output_ids[index] once, then commits."""
    def po(engine, step):
        engine.device.wait(step.sample_done)
        for req in step.plan.requests:
            if len(req.output_ids) >= 2 and not vars(req).get("rewritten"):
                req.rewritten = True
                req.output_ids[index] = value
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)
    return dict(process_outputs=po)


REWRITES = [  # plug-in, index changed, value, the plug-in's name in the message
    (per_request_replacing_last, -1, "x", r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (per_request_replacing_last, -1, 1000, r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (per_request_replacing_last, -1, -1, r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (per_request_rewriting, 0, "x", r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (per_request_rewriting, 0, -1, r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (per_request_rewriting, 0, 3.0, r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (per_request_rewriting, 0, 2, r"prompt 0's commit, .*per_request\(commit=commit\)"),
    (process_outputs_rewriting, -1, 1000, r"process_outputs=po, committing prompt 0's tokens"),
    (process_outputs_rewriting, 0, -1, r"process_outputs=po, committing prompt 0's tokens"),
    (process_outputs_rewriting, 0, "x", r"process_outputs=po, committing prompt 0's tokens"),
]
CONFIGS = [dict(mode="serial"), dict(mode="zos"), dict(mode="zos", num_draft_tokens=2)]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def engine_and_reference(request):
    with te.Engine(te.EngineConfig(max_batch_size=2, **request.param)) as eng:
        yield eng, [c.token_ids for c in eng.generate(PROMPTS, 8)]


@pytest.mark.parametrize("make,index,value,plugin", REWRITES)
def test_a_committed_token_changed_in_place_is_refused_by_name(engine_and_reference, make,
                                                               index, value, plugin):
    """Only the new entries were checked: a change to one committed before was sent to the
    device (a bare ValueError, a DeviceError, or -1 read as FROM_DEVICE: serial and ZOS
    differed) or returned silently in Completion.token_ids."""
    eng, want = engine_and_reference
    with pytest.raises((TypeError, ValueError)) as err:
        eng.generate(PROMPTS, 8, **make(index, value))
    message = str(err.value)
    assert re.match(plugin, message), message
    assert re.search(rf"changed req\.output_ids\[\d\] from \d+ to \w+ {re.escape(repr(value))}: "
                     r"a committed token stays as it is", message), message
    assert isinstance(err.value, ValueError if value == 2 else TypeError)
    assert all(c.finish_reason == "abort" for c in eng.completions)
    assert [c.token_ids for c in eng.generate(PROMPTS, 8)] == want


def test_removing_the_newest_and_equal_values_are_no_change():
    """A stop string removes tokens committed in earlier rounds (the engine's own commit);
    a plug-in that stores the same ids as other objects (numpy integers) changes nothing."""
    def commit(req, tokens, eos_id, decode):
        Request.commit(req, tokens, eos_id, decode)

    def po(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            req.output_ids = [np.int64(t) for t in req.output_ids]
            engine.scheduler.release_if_done(req)

    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=2)) as eng:
        want = eng.generate(PROMPTS, 12, stop=[" a time", "shy b"])
        for kw in (dict(on_round=plugins.per_request(commit=commit)), dict(process_outputs=po)):
            got = eng.generate(PROMPTS, 12, stop=[" a time", "shy b"], **kw)
            assert [(c.text, c.finish_reason) for c in got] == [(c.text, c.finish_reason)
                                                                for c in want]
            assert [list(map(int, c.token_ids)) for c in got] == [c.token_ids for c in want]
    assert {c.finish_reason for c in want} == {"stop"}
