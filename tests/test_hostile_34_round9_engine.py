"""Issue 34's ninth hostile round, the engine and the labs' plug-ins: a loop that takes requests
out of the scheduler, ``close()`` from an argument's own code, EngineConfig subclasses, an
unpicklable correction, stop strings without end, a commit that commits nothing, the paced time
model shared by every engine, ``per_request(completion=...)``, an ``aborts`` plug-in reused.
Each failed when written."""

from __future__ import annotations

import collections.abc
import threading

import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine import kernels
from toy_engine import run as te_run
from toy_engine.config import MAX_SLOTS
from toy_engine.process_device import ProcessDevice
from toy_engine.refusals import CommitStoppedEarly
from toy_engine.sequence import Request

PROMPTS = ["Once upon a time", "One day", "There was a fox"]


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(device="cpu", max_batch_size=2)) as built:
        yield built


@pytest.fixture(scope="module")
def expected(engine):
    return [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=6)]


class Runaway(Exception):
    """Raised by ``capped``: the run went on far past where it should have stopped."""


def capped(on_round, rounds: int):
    def bounded(engine, round):
        if round > rounds:
            raise Runaway(f"round {round}")
        on_round(engine, round)
    return bounded


def test_a_loop_that_drops_requests_has_them_end_abort_and_the_next_run_is_right(engine,
                                                                                 expected):
    def drops_them(eng):  # admits, then forgets the requests: rows and blocks stay taken
        eng.schedule()
        eng.scheduler.running.clear()
    out = engine.generate(PROMPTS[:2], max_new_tokens=6, loop=drops_them)
    assert [r.finish_reason for r in engine.requests] == ["abort"] * 2
    assert [c.finish_reason for c in out] == ["abort"] * 2
    assert [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=6)] == expected
    assert len(engine.scheduler.free_rows) == 2
    assert len(engine.scheduler.blocks.free_ids) == engine.config.num_kv_blocks


def test_close_from_an_argument_is_refused_and_starts_no_device():
    eng = te.Engine(te.EngineConfig(device="cpu"))

    class Tokens:  # an int-like whose own code closes the engine while generate reads it
        def __index__(self):
            eng.close()
            return 5
    try:
        with pytest.raises(RuntimeError, match="this engine is closed"):
            eng.generate(["Once"], max_new_tokens=Tokens())
        assert eng.device.failure() is not None  # still the closed device: no new process
    finally:
        eng.device.close()


class Lying(te.EngineConfig):
    """Its block_size reads 0 from the second read on (after a check that reads it once)."""

    def __getattribute__(self, name):
        state = object.__getattribute__(self, "__dict__")
        if name == "block_size" and state.get("_frozen"):
            state["_reads"] = state.get("_reads", 0) + 1
            if state["_reads"] > 1:
                return 0
        return object.__getattribute__(self, name)


class Unchecked(te.EngineConfig):
    def __post_init__(self):  # skips the checks
        object.__setattr__(self, "_frozen", True)


def test_a_config_subclass_runs_on_its_checked_values(expected):
    with te.Engine(Lying(device="cpu", max_batch_size=2)) as eng:
        assert type(eng.config) is te.EngineConfig and eng.config.block_size == 16
        assert [c.token_ids for c in eng.generate(PROMPTS, max_new_tokens=6)] == expected


def test_a_config_replaced_by_a_lying_subclass_runs_on_the_built_one(engine, expected):
    built = engine.config
    engine.config = Lying(device="cpu", max_batch_size=2)
    try:
        assert [c.token_ids for c in engine.generate(PROMPTS, max_new_tokens=6)] == expected
        assert engine.config is built
    finally:
        engine.config = built


def test_a_config_subclass_that_skips_the_checks_is_refused_by_field():
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        te.Engine(Unchecked(device="cpu", block_size=0))


def test_an_unpicklable_correction_is_refused_by_name_before_the_run():
    lock = threading.Lock()

    def my_correction(meta, accepted, block_size):
        with lock:
            kernels.correct_seqlens_qk(meta, accepted, block_size)
    with te.Engine(te.EngineConfig(mode="zos", device="cpu", num_draft_tokens=2)) as eng:
        good = [c.token_ids for c in eng.generate(PROMPTS, max_new_tokens=8)]
        with pytest.raises(TypeError, match=r"correction=my_correction cannot be sent "
                                            r"to the CPU stand-in's device process.*_thread.lock"):
            eng.generate(PROMPTS, max_new_tokens=8, correction=my_correction)
        assert [r.id for r in eng.requests] == [0, 1, 2]  # refused before a run: the first's
        fine = [c.token_ids for c in eng.generate(PROMPTS, max_new_tokens=8,
                                                  correction=kernels.correct_seqlens_qk)]
        assert fine == good


class ManyStops(collections.abc.Sequence):
    """Says it has 1 stop string, and gives 5,000 before its IndexError; counts its reads."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 1

    def __getitem__(self, i):
        self.reads += 1
        if i >= 5000:
            raise IndexError(i)
        return "zz"


def test_stop_strings_are_capped_and_read_no_further(engine):
    stop = ManyStops()
    with pytest.raises(ValueError, match="at most 1,000 stop strings per call"):
        engine.generate(["Once"], max_new_tokens=4, stop=stop)
    assert stop.reads <= 1001


def test_a_commit_that_commits_nothing_is_refused_by_name(engine):
    """Stalled as no_progress after MAX_ROUNDS_WITHOUT_PROGRESS rounds until round 27, which
    refuses a commit that hands out fewer tokens than the round kept, not ending the request,
    in the round it does (CommitStoppedEarly)."""
    def commit(req, tokens, eos_id, decode):  # returns before appending anything
        return
    on_round = capped(plugins.per_request(commit=commit), 400)
    with pytest.raises(CommitStoppedEarly) as err:
        engine.generate(["Once upon a time"], max_new_tokens=8, on_round=on_round)
    assert err.value.round == 0 and err.value.prompt == 0 and err.value.appended == []
    assert str(err.value).startswith("prompt 0's commit, replaced on the request by a plug-in "
                                     "(per_request(commit=commit)), was handed round 0's kept")


LEGIT_RUNS = [  # config, loop, generate's keywords
    (dict(mode="serial"), None, dict(stop=["e", "th"])),
    (dict(mode="zos", num_draft_tokens=3), None, dict(stop=[" the"])),
    (dict(mode="zos", constraint="title_case"), None, {}),
    (dict(mode="zos"), plugins.keep_in_flight(6), dict(stop=["o"])),  # in a ring of 8 slots
]


@pytest.mark.parametrize("config,loop,kwargs", LEGIT_RUNS)
def test_a_right_commit_never_stalls_and_no_run_nears_the_bound(config, loop, kwargs):
    prompts = PROMPTS * 3
    stretch = dict(seen=None, since=0, longest=0)

    def commit(req, tokens, eos_id, decode):
        Request.commit(req, tokens, eos_id, decode)

    def measured(eng, round):
        seen = [(len(r.output_ids), r.finished) for r in eng.requests]
        if seen != stretch["seen"]:
            stretch.update(seen=seen, since=round)
        stretch["longest"] = max(stretch["longest"], round - stretch["since"])
        per_request(eng, round)
    per_request = plugins.per_request(commit=commit)
    with plugins.ring(MAX_SLOTS), te.Engine(te.EngineConfig(device="cpu", max_batch_size=4,
                                                            **config)) as eng:
        want = [c.token_ids for c in eng.generate(prompts, max_new_tokens=120, loop=loop, **kwargs)]
        got = eng.generate(prompts, max_new_tokens=120, loop=loop, on_round=measured, **kwargs)
    assert [c.token_ids for c in got] == want
    assert stretch["longest"] <= te_run.MAX_ROUNDS_WITHOUT_PROGRESS // 100


def test_each_paced_device_and_run_has_its_own_time_model():
    model = {kernel: list(values) for kernel, values in ProcessDevice.PACED_MS.items()}
    with te.Engine(te.EngineConfig(device="paced")) as eng:
        eng.generate(["Once"], max_new_tokens=2)
        meta = eng.timeline.meta.pacing
        assert meta == model and meta is not ProcessDevice.PACED_MS
        assert eng.device.pacing is not ProcessDevice.PACED_MS and eng.device.pacing is not meta
        meta["forward"][0] = 1e7  # a learner's function handed this timeline
        assert ProcessDevice.PACED_MS == model and eng.device.pacing == model
        eng.generate(["Once"], max_new_tokens=2)
        assert eng.timeline.meta.pacing == model


@pytest.mark.parametrize("forward,error,said", [
    ([float("nan"), 0.1], ValueError, r"PACED_MS\['forward'\]\[0\] must be a finite number"),
    ([1e7, 0.1], ValueError, r"PACED_MS\['forward'\]\[0\] must be a finite number in "
                             r"\[0.0, 1000.0\]"),
    ([9.5, -1.0], ValueError, r"PACED_MS\['forward'\]\[1\] must be a finite number"),
    ([9.5], TypeError, r"PACED_MS\['forward'\] must be \[ms, ms per packed token\]"),
])
def test_a_time_model_out_of_bounds_is_refused_before_a_device_starts(monkeypatch, forward, error,
                                                                      said):
    monkeypatch.setattr(ProcessDevice, "PACED_MS", dict(ProcessDevice.PACED_MS, forward=forward))
    with pytest.raises(error, match=said):
        te.Engine(te.EngineConfig(device="paced"))


def test_per_request_refuses_completion_which_no_round_calls():
    with pytest.raises(TypeError, match="per_request: completion is not called during the run"):
        plugins.per_request(completion=lambda req: 42)


def test_an_aborts_plugin_reused_aborts_in_every_run():
    with te.Engine(te.EngineConfig(mode="zos", device="cpu", max_batch_size=4)) as eng:
        on_round = plugins.aborts(lambda engine, request_id: engine.abort(request_id), [(3, 1)])
        runs = [eng.generate(PROMPTS[:2], max_new_tokens=12, on_round=on_round) for _ in range(2)]
    assert [[c.finish_reason for c in out] for out in runs] == [["length", "abort"]] * 2
    assert runs[0][1].token_ids == runs[1][1].token_ids
