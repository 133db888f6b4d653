"""Issue 34, round seventeen (engine17b): a plug-in's finish_reason outside the engine's
reasons refused as it is set; figures.payoff.measured refuses a run without tokens by name; a
run that ran no round reports no round and no launch latency of earlier runs; a request a
plug-in plans past max_new_tokens refused by name before its metadata is built."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import toy_engine as te
from overlap_course.figures import payoff
from overlap_course.labs.plugins import per_request
from toy_engine.refusals import EndTakenBack
from toy_engine.runinfo import RunStats

PROMPTS = ["Hello there", "ab"]


@pytest.fixture(scope="module")
def zos():
    with te.Engine(te.EngineConfig(mode="zos")) as eng:
        yield eng


def ends_with(value):
    """A per_request commit that ends each request at 3 tokens with ``value``."""
    def commit(req, tokens, eos_id, decode):
        for tok in tokens:
            req.output_ids.append(tok)
            req.text += decode([tok])
            if len(req.output_ids) >= 3:
                req.finish_reason = value
                return
    return commit


@pytest.mark.parametrize("value", ["stopped", True, 1, "", np.array([1, 2])],
                         ids=["typo", "true", "one", "empty", "ndarray"])
def test_a_finish_reason_outside_the_engines_is_refused_by_name(zos, value):
    with pytest.raises((TypeError, ValueError), match=r"req\.finish_reason = .*prompt 0.*"
                       r"'length', 'stop', 'eos', 'abort'"):
        zos.generate(PROMPTS, 8, on_round=per_request(commit=ends_with(value)))
    assert [c.finish_reason for c in zos.completions] == ["abort", "abort"]  # ended, aborted
    assert zos.generate(["Hello"], 4)[0].finish_reason == "length"


def test_every_engine_reason_and_a_str_subclass_of_one_are_kept(zos):
    got = zos.generate(PROMPTS, 8, on_round=per_request(commit=ends_with(np.str_("stop"))))
    assert [(c.finish_reason, type(c.finish_reason)) for c in got] == [("stop", str)] * 2
    req = zos.requests[0]
    for reason in ("length", "stop", "eos", "abort"):
        req.finish_reason = reason
        assert req.finish_reason == reason
    with pytest.raises(EndTakenBack):  # round 24: a request ends once, never set back to None
        req.finish_reason = None
    assert req.finish_reason == "abort"


def stats(tokens: int, host: float, device: float) -> RunStats:
    return RunStats(rounds=int(bool(host)), wall_ms=1.0, device_busy_ms=device,
                    device_idle_fraction=0.0, mean_host_ms_per_round=host,
                    mean_device_ms_per_round=device, tokens=tokens, tokens_per_s=tokens * 1e3,
                    prefill_rounds=0, decode_rounds=0, decode_device_idle_fraction=0.0,
                    draft_tokens_proposed=0, draft_tokens_accepted=0,
                    mean_accepted_per_round=0.0, tokens_per_forward=0.0, discarded_outputs=0)


@pytest.mark.parametrize("which", ["serial", "overlapped"])
@pytest.mark.parametrize("empty", [stats(0, 0.0, 0.0), None], ids=["no_tokens", "none"])
def test_payoff_measured_names_a_run_without_tokens(which, empty):
    good = stats(16, 1.0, 2.0)
    args = (empty, good) if which == "serial" else (good, empty)
    with pytest.raises(ValueError, match=rf"{which}_stats .*the {which} run .*run the {which} "
                                         r"run's cell again"):
        payoff.measured(*args, "your runs")
    dicts = [None if a is None else dataclasses.asdict(a) for a in args]
    with pytest.raises(ValueError, match=rf"{which}_stats"):
        payoff.measured(*dicts)
    assert payoff.measured(good, good).speedup == 1.0


def abort_all(engine, round):
    for req in engine.requests:
        engine.abort(req.id)


def interrupt(engine, round):
    raise KeyboardInterrupt


@pytest.mark.parametrize("plugin", [abort_all, interrupt], ids=["abort_all", "interrupt"])
def test_a_run_that_ran_no_round_reports_none_and_no_earlier_launches(zos, plugin):
    zos.generate(["Hello"], 8)  # an earlier run: its launches
    assert zos.stats.rounds > 0 and zos.stats.launch_latency_ms is not None
    try:
        zos.generate(PROMPTS, 8, on_round=plugin)
    except KeyboardInterrupt:
        pass
    assert not [s for s in zos.timeline.spans if s.stage == "forward"]
    assert (zos.stats.rounds, zos.stats.tokens, zos.stats.launch_latency_ms) == (0, 0, None)
    assert zos.generate(["Hello"], 4)[0].finish_reason == "length"
    assert zos.stats.rounds == 4 and zos.stats.launch_latency_ms is not None


def forgets_the_limit(req):
    return not req.finished


def commits_40(req, tokens, eos_id, decode):
    for tok in tokens:
        if tok == eos_id:
            req.finish_reason = "eos"
            return
        req.output_ids.append(tok)
        req.text += decode([tok])
        if len(req.output_ids) >= 40:
            req.finish_reason = "length"
            return


@pytest.mark.parametrize("mode,k", [("serial", 0), ("zos", 0), ("zos", 2)])
def test_a_request_planned_past_max_new_tokens_is_refused_by_name(mode, k):
    with te.Engine(te.EngineConfig(mode=mode, num_draft_tokens=k)) as eng:
        plugin = per_request(wants_more=forgets_the_limit, commit=commits_40)
        with pytest.raises(ValueError, match=r"plans prompt \d for more tokens, but it has 8 of "
                           r"its max_new_tokens 8.*KV blocks hold \d+.*its wants_more.*"
                           r"per_request\(commit=commits_40\)"):
            eng.generate(PROMPTS, 8, on_round=plugin)
        done = eng.completions
        assert [c.finish_reason for c in done] == ["abort", "abort"]
        assert all(len(c.token_ids) <= 8 for c in done)  # no token past the limit handed out
        assert eng.generate(["Hello"], 4)[0].finish_reason == "length"
        # The engine's own commit ends it at the limit: a wants_more that forgets it is harmless.
        got = eng.generate(PROMPTS, 8, on_round=per_request(wants_more=forgets_the_limit))
        assert [(c.finish_reason, len(c.token_ids)) for c in got] == [("length", 8)] * 2
