"""Zero-overhead scheduling: same tokens as serial, deferred results, flush, lifetimes."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import toy_engine as te

WORDS = ["Once upon a time", "One day", "There was a", "The little fox", "Once", "A", "She liked to"]


@pytest.fixture(scope="module")
def engines(engine_pool):
    def get(mode, max_batch_size=4, num_kv_blocks=64):
        return engine_pool(mode=mode, max_batch_size=max_batch_size, num_kv_blocks=num_kv_blocks)
    return get


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.sampled_from(WORDS), min_size=1, max_size=7),
       max_new=st.integers(1, 48),
       stop=st.sampled_from([None, ["."], ["fox", "the"], [" a"]]),
       batch=st.sampled_from([(1, 64), (3, 64), (4, 12)]),
       temperature=st.sampled_from([0.0, 0.8]))
def test_zos_equals_serial(engines, prompts, max_new, stop, batch, temperature):
    kw = dict(max_new_tokens=max_new, stop=stop, temperature=temperature, seed=3)
    serial = engines("serial", *batch).generate(prompts, **kw)
    zos = engines("zos", *batch).generate(prompts, **kw)
    assert [(c.token_ids, c.finish_reason) for c in zos] == [(c.token_ids, c.finish_reason) for c in serial]


def test_without_the_flush_the_last_tokens_never_arrive(engines):
    engine = engines("zos")
    expected = engine.generate(["Once upon a time", "One day"], max_new_tokens=20)
    assert all(len(c.token_ids) == 20 for c in expected)

    engine.flush = lambda previous: None  # the deferred step is dropped, never processed
    try:
        with pytest.raises(te.EngineStalled, match="dropped instead of processed or flushed") as info:
            engine.generate(["Once upon a time", "One day"], max_new_tokens=20)
    finally:
        del engine.flush
    assert info.value.reason == "unprocessed_inflight" and info.value.prompt_indexes == [0, 1]
    assert info.value.request_ids == [r.id for r in engine.requests]
    lost = engine.completions
    assert [len(c.token_ids) for c in lost] == [19, 19]  # the final round's token is missing
    assert [c.text for c in lost] == [c.text[:-1] for c in expected]
    # the engine recovered: the same engine still works
    assert engine.generate(["Once"], max_new_tokens=5)[0].finish_reason == "length"


def test_no_token_after_a_stop_even_with_the_extra_step(engines):
    engine = engines("zos")
    ref = engines("serial").generate(["Once upon a time"], max_new_tokens=60)[0].text
    stop = ref[20:23]
    out = engine.generate(["Once upon a time", "One day"], max_new_tokens=60, stop=[stop])
    assert out[0].finish_reason == "stop" and out[0].text == ref[: ref.index(stop)]
    # the finished request was already in the next round (the extra step): its output was dropped
    assert engine.stats.discarded_outputs >= 1
    serial = engines("serial")
    serial.generate(["Once upon a time", "One day"], max_new_tokens=60, stop=[stop])
    assert serial.stats.discarded_outputs == 0


def test_abort_mid_flight_keeps_everyone_else(engines):
    engine = engines("zos")
    expected = engine.generate(WORDS[:4], max_new_tokens=30)

    def abort_request_1(eng, round):
        if round == 6:
            eng.abort(eng.requests[1].id)

    out = engine.generate(WORDS[:4], max_new_tokens=30, on_round=abort_request_1)
    assert out[1].finish_reason == "abort" and 0 < len(out[1].token_ids) < 30
    assert out[1].token_ids == expected[1].token_ids[: len(out[1].token_ids)]
    for i in (0, 2, 3):
        assert out[i].token_ids == expected[i].token_ids
    assert not engine.scheduler.running and all(not r.num_inflight for r in engine.requests)


def test_an_exception_in_the_loop_drains_and_the_engine_stays_usable(engines):
    engine = engines("zos")
    expected = engine.generate(WORDS[:3], max_new_tokens=25)

    def explode(eng, round):
        if round == 8:
            raise KeyError("boom in the host loop")

    with pytest.raises(KeyError, match="boom"):
        engine.generate(WORDS[:3], max_new_tokens=25, on_round=explode)
    assert all(c.finish_reason == "abort" for c in engine.completions)
    assert engine.scheduler.blocks.can_allocate(engine.config.num_kv_blocks), "KV blocks leaked"
    again = engine.generate(WORDS[:3], max_new_tokens=25)
    assert [c.token_ids for c in again] == [c.token_ids for c in expected]


def test_previous_round_is_processed_after_this_forward_is_launched(engines):
    engine = engines("zos")
    engine.generate(WORDS[:4], max_new_tokens=20)
    tl = engine.timeline
    host = tl.lane("host")
    launches = {s.round: s for s in host if s.stage == "launch_forward"}
    prefill = set(tl.meta.prefill_rounds)
    checked = 0
    for post in (s for s in host if s.stage == "postprocess" and s.round not in prefill):
        nxt = launches.get(post.round + 1)
        if nxt is not None:
            assert post.start_ms >= nxt.end_ms, (post, nxt)
            checked += 1
    assert checked >= 15
    assert [s.stage for s in host if s.stage == "flush"] == ["flush"]


def test_single_buffered_inputs_are_a_race(engines, monkeypatch):
    import toy_engine.engine as engine_mod

    monkeypatch.setattr(engine_mod, "NUM_SLOTS", 1)  # every round shares slot 0
    with pytest.raises(te.RaceError, match=r"race on buffer '(meta|temps)0'.*round \d+") as info:
        engines("zos").generate(WORDS[:3], max_new_tokens=10)
    err = info.value
    assert (err.kind, err.buffer, err.access, err.launch, err.blocks) == ("buffer", "meta0", "w", "upload", [])


def test_freeing_a_finished_requests_cache_too_early_is_a_race(engines, monkeypatch):
    from toy_engine.scheduler import Scheduler

    def eager_release(self, req):  # ignores in-flight rounds: the lifetime bug
        if req.finished:
            self.free(req)

    engine = engines("zos")
    ref = engine.generate(["Once upon a time"], max_new_tokens=30)[0].text
    monkeypatch.setattr(Scheduler, "release_if_done", eager_release)
    # request 0 stops in a decode round while its next round is already launched
    with pytest.raises(te.RaceError, match=r"KV blocks .* of prompt \d+ freed while launch 'forward' of round") as info:
        engine.generate(["Once upon a time", "One day"], max_new_tokens=30, stop=[ref[5:8]])
    err = info.value
    assert (err.kind, err.launch, err.buffer, err.access) == ("free_in_use", "forward", None, None)
    assert err.blocks and set(err.blocks) <= set(range(engine.config.num_kv_blocks))
    assert err.prompt == 0 and err.owner is None and err.round >= 1
