"""The serial engine: correctness, bad input, queueing, timelines."""

import pytest

import toy_engine as te

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "Once", "The bird said"]


def test_batched_equals_one_request_at_a_time(make_engine):
    engine = make_engine(max_batch_size=8)
    batched = engine.generate(PROMPTS, max_new_tokens=40)
    single = [engine.generate([p], max_new_tokens=40)[0] for p in PROMPTS]
    assert [c.token_ids for c in batched] == [c.token_ids for c in single]
    assert all(c.finish_reason in ("length", "eos") for c in batched)


def test_generates_corpus_like_text(make_engine):
    out = make_engine().generate(["Once"], max_new_tokens=40)[0]
    assert out.text.startswith(" upon a time"), out.text
    assert len(out.token_ids) == 40 and out.finish_reason == "length"


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=[]), "at least one prompt"),
    (dict(prompts=[""]), "prompt 0 is empty"),
    (dict(prompts=["ok", "x" * 300]), "prompt 1 is too long"),
    (dict(prompts=["ok", "caf\u00e9 #1"]), "prompt 1: unknown characters"),
    (dict(prompts=["ok"], max_new_tokens=0), "max_new_tokens must be"),
    (dict(prompts=["ok"], temperature=-0.5), r"temperature must be a finite number in \[0.0, 100.0\]"),
    (dict(prompts=["ok"], stop=[""]), "stop strings must be non-empty"),
    (dict(prompts=["Once"], max_new_tokens=500), "context is 256"),
])
def test_bad_input_is_a_clear_value_error_and_the_engine_stays_usable(make_engine, kwargs, match):
    engine = make_engine()
    prompts = kwargs.pop("prompts")
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, **kwargs)
    assert engine.generate(["Once"], max_new_tokens=3)[0].finish_reason == "length"


@pytest.mark.parametrize("config, match", [
    (dict(mode="fast"), "unknown mode 'fast'"),
    (dict(device="tpu"), "unknown device 'tpu'"),
    (dict(max_batch_size=0), r"max_batch_size must be in \[1, 4096\], got 0"),
    (dict(num_draft_tokens=-1), r"num_draft_tokens must be in \[0, 16\], got -1"),
    (dict(num_draft_tokens=10**9), r"num_draft_tokens must be in \[0, 16\], got 1000000000"),
    (dict(num_kv_blocks=10**12), r"num_kv_blocks x block_size = 1000000000000 x 16 .* KV cache of 122070312.5 GiB "
                                 r".* above the 4 GiB limit: use at most 32768 blocks of 16"),
])
def test_bad_config_is_a_clear_value_error(shipped, config, match):
    with pytest.raises(ValueError, match=match):
        te.Engine(te.EngineConfig(**config), model=shipped[0])


def test_a_request_that_can_never_fit_the_cache_is_rejected(make_engine):
    engine = make_engine(num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="can never fit the KV cache: it needs 5 blocks"):
        engine.generate(["Once upon a time"], max_new_tokens=60)


def test_queued_requests_all_finish(make_engine):
    # 2 slots in the batch and a cache that holds only two requests at a time
    engine = make_engine(max_batch_size=2, num_kv_blocks=8, block_size=16)
    prompts = [f"Once upon a time{'!' * i}" for i in range(7)]
    outs = engine.generate(prompts, max_new_tokens=30)
    assert [o.prompt for o in outs] == prompts
    assert all(o.finish_reason in ("length", "eos") for o in outs)
    alone = make_engine().generate(prompts, max_new_tokens=30)
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]


def test_stop_strings_and_eos_end_a_completion_exactly(make_engine):
    engine = make_engine()
    full = engine.generate(["Once"], max_new_tokens=60)[0].text
    stop = full[10:13]
    out = engine.generate(["Once"], max_new_tokens=60, stop=[stop])[0]
    assert out.finish_reason == "stop"
    assert out.text == full[: full.index(stop)]
    assert len(out.token_ids) == len(out.text)
    # a story's last line ends with EOS, which never appears in the text
    ending = "Once upon a time, there was a fox named Leo.\nAnd they all lived happily ever"
    story = engine.generate([ending], max_new_tokens=20)[0]
    assert story.finish_reason == "eos", story.text
    assert story.text == " after." and len(story.token_ids) == len(story.text)


def test_sampling_is_reproducible_per_seed_with_one_stream_per_request(make_engine):
    engine = make_engine()
    a = engine.generate(PROMPTS, max_new_tokens=30, temperature=0.9, seed=7)
    again = engine.generate(PROMPTS, max_new_tokens=30, temperature=0.9, seed=7)
    c = engine.generate(PROMPTS, max_new_tokens=30, temperature=0.9, seed=8)
    assert [x.token_ids for x in a] == [x.token_ids for x in again]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    # a request's stream comes from (seed, its index in the call), not from its neighbours
    assert engine.generate(PROMPTS[:1], max_new_tokens=30, temperature=0.9, seed=7)[0].token_ids == a[0].token_ids
    # so copies of one prompt are independent samples
    copies = engine.generate(["Once"] * 4, max_new_tokens=30, temperature=1.0, seed=7)
    assert len({tuple(x.token_ids) for x in copies}) == 4


def test_timeline_spans_are_well_formed(make_engine):
    engine = make_engine(max_batch_size=3)
    engine.generate(PROMPTS, max_new_tokens=20)
    spans = engine.timeline.spans
    assert {s.lane for s in spans} == {"host", "device"}
    assert {"forward", "sample", "upload"} <= {s.stage for s in spans if s.lane == "device"}
    assert {"schedule", "prepare", "wait", "postprocess"} <= {s.stage for s in spans if s.lane == "host"}
    assert all(s.end_ms >= s.start_ms and isinstance(s.round, int) and s.round >= 0 for s in spans)
    device = engine.timeline.lane("device")
    assert all(a.end_ms <= b.start_ms for a, b in zip(device, device[1:])), "device spans overlap"
    # every round has its forward and sample on the device
    rounds = engine.timeline.rounds()
    for r in rounds:
        assert {"forward", "sample"} <= {s.stage for s in device if s.round == r}
    st = engine.stats
    assert st.rounds == len(rounds) and st.tokens == 100 and engine.timeline.meta.stats is st
    assert 0 <= st.device_idle_fraction < 1 and st.device_busy_ms > 0
    again = te.Timeline.from_json(engine.timeline.to_json())
    assert again.spans == spans


def test_engine_context_manager_stops_the_device(shipped):
    with te.Engine(te.EngineConfig(), model=shipped[0]) as engine:
        engine.generate(["Once"], max_new_tokens=2)
        proc = engine.device._proc
    assert not proc.is_alive()


@pytest.mark.parametrize("plugin", ["on_round", "loop", "correction", "process_outputs"])
def test_plug_ins_are_checked_before_anything_runs(engine_pool, plugin):
    engine = engine_pool()
    engine.generate(["One day"], max_new_tokens=2)
    before = engine.requests
    with pytest.raises(TypeError, match=f"{plugin} must be a function or None, got int 5"):
        engine.generate(["Once"], max_new_tokens=3, **{plugin: 5})
    assert engine.requests is before  # rejected before a run started


def test_requests_know_their_prompt_index(engine_pool):
    engine = engine_pool()
    engine.generate(["Once", "One day"], max_new_tokens=2)
    first = engine.generate(["A", "B", "C"], max_new_tokens=2)
    assert [r.index for r in engine.requests] == [0, 1, 2]
    assert [r.id for r in engine.requests] == [c.request_id for c in first]
