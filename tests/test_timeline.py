"""Fast tests for toy_engine.timeline (pure Python, no torch)."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toy_engine.runinfo import RunStats, Workload
from toy_engine.timeline import run_stats
from toy_engine.timeline import (DEVICE_STAGES, HOST_STAGES, PROCESS_STAGES, Span, Stage, Timeline, TimelineMeta,
                                 owner_name)


def handmade() -> Timeline:
    """Device [0,2],[3,5],[5,6],[8,9] (rounds 0,1,1,2) plus some host spans."""
    tl = Timeline(origin_ns=1_000, meta=TimelineMeta(mode="zos", num_draft_tokens=0))
    tl.add("device", "forward", 0, 0, 2)
    tl.add("device", "forward", 1, 3, 5)
    tl.add("device", "sample", 1, 5, 6)
    tl.add("device", "forward", 2, 8, 9, owner=2)
    # host: round 0 schedule+prepare overlap -> union 1.5; wait is excluded.
    tl.add("host", "schedule", 0, -1, 0)
    tl.add("host", "prepare", 0, -0.5, 0.5)
    tl.add("host", "wait", 0, 0.5, 2)
    tl.add("host", "postprocess", 0, 2, 3.5)   # round 0 total: 1.5 + 1.5 = 3.0
    tl.add("host", "prepare", 1, 6, 7)         # round 1: 1.0
    tl.add("host", "postprocess", 2, 9, 10)    # round 2: 1.0
    return tl


# -- stages ----------------------------------------------------------------


def test_a_known_stage_name_becomes_its_stage_and_any_other_name_stays_as_given():
    tl = Timeline()
    ours = tl.add("device", "forward", 0, 1, 2)
    theirs = tl.add("device", "kernel", 0, 2, 3)  # a profiler trace's stage (overlap_course.traces.kineto)
    assert ours.stage is Stage.FORWARD and ours.stage == "forward" and f"{ours.stage}" == "forward"
    assert type(theirs.stage) is str and theirs.stage == "kernel"
    assert json.loads(tl.to_json())["spans"][0]["stage"] == "forward"  # stored as the plain name
    back = Timeline.from_json(tl.to_json())
    assert back.spans == tl.spans and back.spans[0].stage is Stage.FORWARD and type(back.spans[1].stage) is str
    assert {"postprocess", "flush"} == set(PROCESS_STAGES) and "wait" in HOST_STAGES and "sample" in DEVICE_STAGES
    assert set(HOST_STAGES) | set(DEVICE_STAGES) | {Stage.SETUP} == set(Stage)


# -- Span validation --------------------------------------------------------

def test_span_bad_lane():
    with pytest.raises(ValueError, match="'gpu'"):
        Span("gpu", "forward", 0, 0.0, 1.0)


def test_span_end_before_start():
    with pytest.raises(ValueError) as exc:
        Span("device", "forward", 3, 5.0, 4.0)
    msg = str(exc.value)
    assert "'forward'" in msg and "round 3" in msg and "5.0" in msg and "4.0" in msg


def test_span_negative_round_and_empty_stage():
    with pytest.raises(ValueError, match="round"):
        Span("host", "prepare", -1, 0.0, 1.0)
    with pytest.raises(ValueError, match="stage"):
        Span("host", "", 0, 0.0, 1.0)


def test_owner_is_a_round_number_and_text_goes_in_label():
    span = Span("host", "wait", 3, 0.0, 1.0, owner=3)
    assert owner_name(span.owner) == "StepState(round=3)" and owner_name(None) == ""
    assert Span("host", "cudaLaunchKernel", 0, 0.0, 1.0, label="stream 7: gemm").label == "stream 7: gemm"
    for bad in ("StepState(round=3)", -1, True, 2.0):
        with pytest.raises(ValueError, match="owner must be the number of the round .* goes in label"):
            Span("host", "wait", 3, 0.0, 1.0, owner=bad)
    with pytest.raises(ValueError, match="label must be a string"):
        Span("host", "wait", 3, 0.0, 1.0, label=None)


def test_a_trace_with_owner_strings_is_refused_with_a_sentence():
    tl = handmade()
    text = tl.to_json().replace('"owner": 2', '"owner": "StepState(round=2)"')
    with pytest.raises(ValueError, match=r"timeline JSON text\['spans'\]\[3\]\['owner'\] must be an integer or "
                                         r"null \(the round that owns the results; text goes in label\), got str"):
        Timeline.from_json(text)


def test_span_duration_and_float_normalisation():
    s = Span("host", "prepare", 0, 1, 3)
    assert s.duration_ms == 2.0 and isinstance(s.start_ms, float)
    assert Span("device", "forward", 0, 1.0, 1.0).duration_ms == 0.0


# -- queries on the hand-made timeline ---------------------------------------

def test_gaps_busy_idle():
    tl = handmade()
    assert tl.device_gaps() == [(2.0, 3.0), (6.0, 8.0)]
    assert tl.device_busy_ms() == 2 + 2 + 1 + 1
    assert tl.device_idle_fraction() == pytest.approx(3 / 9)
    assert tl.device_busy_ms(rounds=[1]) == 3.0
    # a gap is charged to the round whose work ends it: (2, 3) to round 1, (6, 8) to round 2
    assert tl.device_idle_fraction(rounds=[1]) == pytest.approx(1 / (1 + 3))
    assert tl.device_idle_fraction(rounds=[0, 2]) == pytest.approx(2 / (2 + 3))


def test_gaps_window_clipped():
    tl = handmade()
    assert tl.device_gaps(start_ms=2.5, end_ms=7) == [(2.5, 3.0), (6.0, 7.0)]
    assert tl.device_gaps(start_ms=3.5) == [(6.0, 8.0)]
    assert tl.device_gaps(end_ms=2.0) == []


def test_overlapping_device_spans_merged():
    tl = Timeline(origin_ns=0)
    tl.add("device", "forward", 0, 0, 4)
    tl.add("device", "draft", 0, 1, 3)     # inside
    tl.add("device", "sample", 0, 3.5, 6)  # overlaps the end
    tl.add("device", "forward", 1, 7, 8)
    assert tl.device_busy_ms() == 7.0
    assert tl.device_gaps() == [(6.0, 7.0)]
    assert tl.device_idle_fraction() == pytest.approx(1 / 8)


def test_lane_rounds_len_repr():
    tl = handmade()
    starts = [s.start_ms for s in tl.lane("host")]
    assert starts == sorted(starts)
    assert tl.rounds() == [0, 1, 2]
    assert len(tl) == 10
    assert "spans=10" in repr(tl)


def test_run_stats_of_the_handmade_timeline():
    counts = dict(tokens=12, request_decode_rounds=4, proposed=8, accepted=6, discarded=1)
    s = run_stats(handmade(), counts, {0}, wall_s=0.012, launch_latencies_ms=[0.1, 0.3, 0.2])
    assert (s.rounds, s.prefill_rounds, s.decode_rounds, s.tokens, s.discarded_outputs) == (3, 1, 2, 12, 1)
    assert s.wall_ms == pytest.approx(12.0) and s.tokens_per_s == pytest.approx(1000.0)  # the loop's time
    assert s.device_busy_ms == 6.0
    assert s.device_idle_fraction == pytest.approx(3 / 9)
    assert s.decode_device_idle_fraction == pytest.approx(3 / (3 + 4))  # rounds 1, 2: their gaps and work
    assert s.mean_host_ms_per_round == pytest.approx((3.0 + 1.0 + 1.0) / 3)  # wait is not host work
    assert s.mean_device_ms_per_round == pytest.approx((2.0 + 3.0 + 1.0) / 3)
    assert (s.mean_accepted_per_round, s.tokens_per_forward, s.launch_latency_ms) == (1.5, 4.0, 0.2)


def test_empty_timeline():
    tl = Timeline()
    assert tl.device_gaps() == [] and tl.device_busy_ms() == 0.0
    assert tl.device_idle_fraction() == 0.0
    s = run_stats(tl, dict(tokens=0, request_decode_rounds=0, proposed=0, accepted=0, discarded=0), set(), 0.0, [])
    assert (s.rounds, s.mean_host_ms_per_round, s.tokens_per_s, s.launch_latency_ms) == (0, 0.0, 0.0, None)


# -- JSON --------------------------------------------------------------------

def _assert_same(a: Timeline, b: Timeline):
    assert a.spans == b.spans and a.meta == b.meta and a.origin_ns == b.origin_ns


def test_json_round_trip_string_and_file(tmp_path):
    tl = handmade()
    tl.meta.workload = Workload(requests=2, max_new_tokens=8, temperature=0.5)
    tl.meta.prefill_rounds = [0]
    tl.meta.stats = RunStats(rounds=3, wall_ms=10.0, device_busy_ms=6.0, device_idle_fraction=1 / 3,
                             mean_host_ms_per_round=1.5, mean_device_ms_per_round=2.0, tokens=6, tokens_per_s=600.0,
                             prefill_rounds=1, decode_rounds=2, decode_device_idle_fraction=0.25,
                             draft_tokens_proposed=0, draft_tokens_accepted=0, mean_accepted_per_round=0.0,
                             tokens_per_forward=2.0, discarded_outputs=1)
    tl.meta.annotations["course"] = {"any": ["json", 1, None]}
    tl.add("host", "overhead", 3, 0.1 + 0.2, 1 / 3)  # awkward floats
    text = tl.to_json()
    assert json.loads(text)["version"] == 1
    _assert_same(tl, Timeline.from_json(text))
    path = tmp_path / "run.json"
    assert tl.to_json(path) == text
    _assert_same(tl, Timeline.from_json(path))
    _assert_same(tl, Timeline.from_json(str(path)))


@pytest.mark.parametrize("bad, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be an object"),
    ('{"origin_ns": 0, "meta": {}, "spans": []}', "version"),
    ('{"version": 2, "origin_ns": 0, "meta": {}, "spans": []}', "unsupported"),
    ('{"version": 1, "meta": {}, "spans": []}', "origin_ns"),
    ('{"version": 1, "origin_ns": 0, "meta": {}, "spans": [{"lane": "host"}]}', "missing"),
    ('{"version": 1, "origin_ns": 0, "meta": {}, "spans": [{"lane": "cpu", "stage": "x",'
     ' "round": 0, "start_ms": 0, "end_ms": 1}]}', r"\['spans'\]\[0\] is invalid: Span lane must be"),
    ('{"version": 1, "origin_ns": 0, "meta": {}, "spans": [{"lane": "host", "stage": "x",'
     ' "round": 0, "start_ms": "a", "end_ms": 1}]}', "start_ms"),
])
def test_from_json_malformed(bad, match):
    with pytest.raises(ValueError, match=match):
        Timeline.from_json(bad)


def test_from_json_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        Timeline.from_json(tmp_path / "nope.json")


# -- recording ---------------------------------------------------------------

def test_host_span_records_even_on_error():
    tl = Timeline()
    with tl.host_span("prepare", 0, owner=0):
        pass
    with pytest.raises(RuntimeError):
        with tl.host_span("postprocess", 0):
            raise RuntimeError("boom")
    assert [s.stage for s in tl.spans] == ["prepare", "postprocess"]
    assert all(s.lane == "host" and s.duration_ms >= 0 for s in tl.spans)
    assert tl.spans[0].owner == 0 and owner_name(tl.spans[0].owner) == "StepState(round=0)"


def test_add_device_ns_uses_shared_clock():
    tl = Timeline(origin_ns=5_000_000)
    s = tl.add_device_ns("forward", 1, 6_000_000, 8_500_000)
    assert (s.lane, s.start_ms, s.end_ms) == ("device", 1.0, 3.5)
    t0 = time.perf_counter_ns()
    tl2 = Timeline()
    assert tl2.origin_ns >= t0 and tl2.now_ms() >= 0.0


# -- property ----------------------------------------------------------------

_pieces = st.lists(
    st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 100, allow_nan=False)),
    min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(_pieces)
def test_busy_plus_gaps_is_window_disjoint(pieces):
    tl = Timeline(origin_ns=0)
    t = 0.0
    for gap, dur in pieces:
        start = t + gap
        t = start + dur
        tl.add("device", "forward", 0, start, t)
    spans = tl.lane("device")
    window = spans[-1].end_ms - spans[0].start_ms
    total = tl.device_busy_ms() + sum(b - a for a, b in tl.device_gaps())
    assert abs(total - window) <= 1e-9
    assert all(b > a for a, b in tl.device_gaps())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 20)), min_size=1, max_size=30))
def test_busy_plus_gaps_is_window_overlapping(pieces):
    tl = Timeline(origin_ns=0)
    for start, dur in pieces:
        tl.add("device", "forward", 0, start, start + dur)
    window = max(s.end_ms for s in tl.spans) - min(s.start_ms for s in tl.spans)
    total = tl.device_busy_ms() + sum(b - a for a, b in tl.device_gaps())
    assert abs(total - window) <= 1e-9
    assert tl.device_busy_ms() <= sum(s.duration_ms for s in tl.spans) + 1e-9


def contended() -> Timeline:
    """Device: forward r1 quiet (3.8 of 4 ms CPU), forward r2 preempted (2 of 5 ms); host work."""
    tl = Timeline(origin_ns=0)
    tl.add("device", "forward", 1, 0, 4, cpu_ms=3.8)
    tl.add("device", "sample", 1, 4, 4.1, cpu_ms=0.01)  # short: not judged
    tl.add("device", "forward", 2, 6, 11, cpu_ms=2.0)
    tl.add("host", "prepare", 2, 4.5, 5.5, cpu_ms=0.9)
    tl.add("host", "wait", 1, 1, 4.2, cpu_ms=0.05)  # blocked by design: not counted
    tl.add("host", "postprocess", 1, 4.2, 4.5)  # no CPU time recorded: not counted
    return tl


def test_span_cpu_time_validation():
    assert Span("device", "forward", 1, 0.0, 4.0, cpu_ms=1).cpu_ms == 1.0
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="cpu_ms"):
            Span("device", "forward", 1, 0.0, 1.0, cpu_ms=bad)


def test_cpu_time_survives_json_and_old_traces_load():
    tl = contended()
    again = Timeline.from_json(tl.to_json())
    assert [s.cpu_ms for s in again.spans] == [s.cpu_ms for s in tl.spans]
    old = json.loads(tl.to_json())
    for raw in old["spans"]:
        raw.pop("cpu_ms")
    assert all(s.cpu_ms is None for s in Timeline.from_json(json.dumps(old)).spans)


def test_host_span_records_thread_cpu_time():
    tl = Timeline()
    with tl.host_span("overhead", 0):
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:  # busy: CPU time accrues
            pass
    with tl.host_span("wait", 0):
        time.sleep(0.02)  # blocked: almost none
    spin, sleep = tl.spans
    assert 0 < spin.cpu_ms <= spin.duration_ms * 1.05 + 0.1
    assert sleep.cpu_ms < 0.5 * sleep.duration_ms
    tl.add_device_ns("forward", 0, 0, 2_000_000, cpu_ns=1_500_000)
    assert tl.spans[-1].cpu_ms == 1.5
