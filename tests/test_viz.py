"""Figures drawn from timelines (overlap_course.figures): fast, no browser."""

import dataclasses
import re

import pytest

pytest.importorskip("plotly")

import toy_engine as te  # noqa: E402
from overlap_course import figures  # noqa: E402
from overlap_course.figures import layout, palette  # noqa: E402
from overlap_course.figures.rounds import common_first_round, decode_rounds, round_window  # noqa: E402
from overlap_course.traces.recorded import TRACES_DIR, recording  # noqa: E402
from toy_engine.timeline import Span, Timeline, TimelineMeta  # noqa: E402


def zos_timeline() -> Timeline:
    """A hand-made ZOS run: prefill r0, decode r1-r3 (deferred postprocess), flush of r3.

    Device gaps: 9.5-12.2 (host prepares r1 after processing the prefill) and
    24.0-24.5 (upload r3 waits for the host).  Round 4 only schedules (nothing left).
    """
    tl = Timeline(origin_ns=0, meta=TimelineMeta(mode="zos", device="hand", prefill_rounds=[0]))
    H = [  # host: stage, round, start, end, owner
        ("schedule", 0, 0, 1, None), ("prepare", 0, 1, 2, None), ("launch_forward", 0, 2, 2.5, None),
        ("launch_sample", 0, 2.5, 3, None), ("wait", 0, 3, 10, 0), ("postprocess", 0, 10, 11, 0),
        ("schedule", 1, 11, 11.5, None), ("prepare", 1, 11.5, 12.5, None), ("launch_forward", 1, 12.5, 13, None),
        ("launch_sample", 1, 13, 13.5, None),
        ("schedule", 2, 13.5, 14, None), ("prepare", 2, 14, 15, None), ("launch_forward", 2, 15, 15.5, None),
        ("wait", 1, 15.5, 18, 1), ("postprocess", 1, 18.2, 19.2, 1), ("launch_sample", 2, 19.2, 19.6, None),
        ("schedule", 3, 19.6, 20, None), ("prepare", 3, 20, 21, None), ("launch_forward", 3, 21, 21.5, None),
        ("wait", 2, 21.5, 24, 2), ("postprocess", 2, 24.1, 25, 2), ("launch_sample", 3, 25, 25.5, None),
        ("schedule", 4, 25.5, 26, None), ("wait", 3, 26, 30, 3), ("flush", 3, 30.2, 31, 3),
    ]
    D = [
        ("upload", 0, 2, 3, None), ("forward", 0, 3, 8, None), ("sample", 0, 8, 9.5, 0),
        ("upload", 1, 12.2, 12.6, None), ("forward", 1, 12.6, 17, None), ("sample", 1, 17, 18, 1),
        ("upload", 2, 18, 18.4, None), ("forward", 2, 18.4, 23, None), ("sample", 2, 23, 24, 2),
        ("upload", 3, 24.5, 25, None), ("correct", 3, 25, 25.2, None), ("forward", 3, 25.2, 29, None),
        ("sample", 3, 29, 30, 3),
    ]
    for lane, rows in (("host", H), ("device", D)):
        for stage, rnd, a, b, owner in rows:
            tl.add(lane, stage, rnd, a, b, owner)
    return tl


def kind(fig, k):
    return [t for t in fig.data if (t.meta or {}).get("kind") == k]


def bars(fig):
    """(stage, lane y, base, length, text, hover) of every drawn window span."""
    return [(t.name, y, b, x, txt, h) for t in kind(fig, "span")
            for y, b, x, txt, h in zip(t.y, t.base, t.x, t.text, t.hovertext)]


def arrows(fig):
    return [a for a in fig.layout.annotations if a.showarrow and not a.text]


def test_default_window_is_first_steady_decode_round():
    tl = zos_timeline()
    assert decode_rounds(tl) == [1, 2, 3]
    assert figures.default_first_round(tl) == 2
    tl.meta.prefill_rounds = []  # none known: every forward round counts as decode
    assert figures.default_first_round(tl) == 1
    assert figures.default_first_round(Timeline(origin_ns=0)) == 0


def test_stage_traces_colours_and_span_bars():
    tl = zos_timeline()
    fig = figures.timeline_figure(tl)  # rounds 2, 3, 4: from r1's delivery (19.2) to the flush of r3 (31.0)
    assert round_window(tl, 2, 4) == (19.2, 31.0)
    # r2's schedule/prepare/launch_forward/upload ran before r1 was delivered: outside the window.
    window = [s for s in tl.spans if s.round in (2, 3, 4) and s.end_ms >= 19.2]
    spans = kind(fig, "span")
    names = [t.name for t in spans]
    assert len(names) == len(set(names)), "one trace per stage"
    assert set(names) == {s.stage for s in window}
    for t in spans:
        assert t.marker.color == figures.STAGE_COLORS[t.name]
        assert t.orientation == "h"
        assert t.marker.pattern.shape == ("/" if t.name == "flush" else "")
    drawn = bars(fig)
    assert len(drawn) == len(window) == 16
    t0 = 19.2  # window start: round 1's tokens reach the requests; round 2's forward is drawn clipped
    expected = sorted((s.stage, layout.LANE_Y[s.lane], max(s.start_ms, t0) - t0, s.end_ms - max(s.start_ms, t0))
                      for s in window)
    got = sorted((st, y, b, x) for st, y, b, x, _, _ in drawn)
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    for (_, _, gb, gx), (_, _, eb, ex) in zip(got, expected):
        assert gb == pytest.approx(eb) and gx == pytest.approx(ex)
    # The deferred postprocess of r2 (ran during r3) and the flush of r3 are in the window.
    assert ("postprocess", 1) in {(st, y) for st, y, *_ in drawn}
    assert ("flush", 1) in {(st, y) for st, y, *_ in drawn}
    # Every span is labelled with its round, in the text and in the hover.
    for st, _, _, _, text, hover in drawn:
        r = int(text[1:])
        assert text == f"r{r}" and f"round {r}" in hover and st in hover and "duration" in hover
    owners = [h for st, *_, h in drawn if st in ("postprocess", "flush", "sample", "wait")]
    assert all("StepState(round=" in h for h in owners)
    assert fig.layout.barmode == "overlay"
    assert fig.layout.xaxis.title.text == "time in window (ms)"
    assert tuple(fig.layout.xaxis.range) == pytest.approx((0, 11.8))
    assert "rounds 2–4: 11.80 ms" in fig.layout.title.text


def test_idle_gaps_in_ms_are_the_timelines_gaps_clipped_to_the_window():
    tl = zos_timeline()
    (idle,) = kind(figures.timeline_figure(tl), "idle")
    assert list(idle.base) == pytest.approx([24.0 - 19.2]) and list(idle.x) == pytest.approx([0.5])
    assert set(idle.y) == {layout.LANE_Y["device"]} and "0.500 ms" in idle.hovertext[0]
    assert idle.marker.pattern.shape == "x"
    (idle,) = kind(figures.timeline_figure(tl, first_round=0, num_rounds=5), "idle")  # window 2.0 .. 31.0
    assert list(idle.base) == pytest.approx([7.5, 22.0]) and list(idle.x) == pytest.approx([2.7, 0.5])
    # Round 1 alone: window 11.0 (round 0 delivered) .. 19.2 (round 1 delivered): the device
    # idled 11.0 .. 12.2 while the host prepared round 1, a cost of delivering round 1.
    fig = figures.timeline_figure(tl, first_round=1, num_rounds=1)
    (idle,) = kind(fig, "idle")
    assert list(idle.base) == pytest.approx([0.0]) and list(idle.x) == pytest.approx([1.2])
    assert "round 1: 8.20 ms · device idle 1.20 ms" in fig.layout.title.text
    fig = figures.timeline_figure(tl, first_round=0, num_rounds=2)  # 2.0 .. 19.2, with the gap
    assert "rounds 0–1: 17.20 ms · device idle 2.70 ms (15.7%)" in fig.layout.title.text


def test_event_arrows_and_flush_marker():
    tl = zos_timeline()
    fig = figures.timeline_figure(tl)
    got = sorted((a.ax, a.x) for a in arrows(fig))  # sample end -> postprocess/flush start
    assert [v for pair in got for v in pair] == pytest.approx([24 - 19.2, 24.1 - 19.2, 30 - 19.2, 30.2 - 19.2])
    assert all(a.ay < a.y for a in arrows(fig))  # from the device row up to the host row
    flush = [a for a in fig.layout.annotations if "flush" in (a.text or "")]
    assert len(flush) == 1 and flush[0].text == "flush r3"
    assert len(arrows(figures.timeline_figure(tl, first_round=0, num_rounds=5))) == 4
    one = figures.timeline_figure(tl, first_round=1, num_rounds=1)
    assert len(arrows(one)) == 1 and not [a for a in one.layout.annotations if a.text]


def test_context_spans_are_separate_and_optional():
    tl = zos_timeline()
    # Round 2 alone (19.2 .. 25): round 3's schedule, prepare, launch_forward (19.6 .. 21.5)
    # and upload (24.5 .. 25) run inside and are drawn faded; its forward (25.2) comes after.
    (ctx,) = kind(figures.timeline_figure(tl, first_round=2, num_rounds=1), "context")
    assert sorted(ctx.text) == ["r3", "r3", "r3", "r3"]
    assert list(ctx.base) == pytest.approx([0.4, 0.8, 1.8, 5.3])
    assert not kind(figures.timeline_figure(tl, first_round=2, num_rounds=1, context=False), "context")


def test_unknown_stage_gets_fallback_colour():
    tl = zos_timeline()
    tl.add("device", "mystery_kernel", 2, 24.0, 24.2)
    fig = figures.timeline_figure(tl)
    (t,) = [t for t in kind(fig, "span") if t.name == "mystery_kernel"]
    assert t.marker.color == palette.stage_color("mystery_kernel") and t.marker.color in palette.FALLBACK_COLORS
    assert len(bars(fig)) == 17


def test_json_round_trip_draws_the_same_figure():
    tl = zos_timeline()
    again = Timeline.from_json(tl.to_json())
    assert figures.timeline_figure(tl).to_plotly_json() == figures.timeline_figure(again).to_plotly_json()


@pytest.mark.parametrize("name", ["cpu_serial", "cpu_zos"])
def test_shipped_traces_draw(name):
    assert name in figures.available_traces()
    tl = figures.load_trace(name)
    assert tl.meta.mode == name.split("_")[1] and recording(tl) is not None and tl.meta.stats.tokens_per_s > 0
    assert (TRACES_DIR / f"{name}.json").stat().st_size < 200_000
    fig = figures.timeline_figure(tl)
    first = figures.default_first_round(tl)
    t0, t1 = round_window(tl, first, first + 2)
    assert len(bars(fig)) == sum(first <= s.round < first + 3 and s.end_ms >= t0 and s.start_ms <= t1
                                 for s in tl.spans)
    assert len(arrows(fig)) >= 2
    again = figures.timeline_figure(Timeline.from_json(tl.to_json()))
    assert again.to_plotly_json() == fig.to_plotly_json()
    with pytest.raises(ValueError, match="available"):
        figures.load_trace("no_such_trace")


def test_compare_figure():
    serial, zos = figures.load_trace("cpu_serial"), figures.load_trace("cpu_zos")
    faster = dataclasses.replace(zos.meta.stats, tokens_per_s=1234.5)
    fig = figures.compare_figure({"serial": serial, "zos": (zos, faster)})
    assert fig.layout.xaxis.matches == "x2"  # one time axis for both rows (the bottom one)
    ys = {t.yaxis for t in fig.data}
    assert ys == {"y", "y2"}
    titles = [a.text for a in fig.layout.annotations if a.text and "idle" in a.text]
    assert len(titles) == 2 and "serial" in titles[0] and "zos" in titles[1]
    assert all(re.search(r"device idle [\d.]+ ms .*\(\d+\.\d%\).*run decode idle \d+\.\d%", t) for t in titles)
    assert "1234 tok/s" in titles[1] or "1235 tok/s" in titles[1]
    assert f"{serial.meta.stats.tokens_per_s:.0f} tok/s" in titles[0]  # from the recorded meta
    # Each row's window starts at 0; arrows refer to their own subplot's axes.
    for ax in ("y", "y2"):
        row = [t for t in fig.data if t.yaxis == ax and (t.meta or {}).get("kind") == "span"]
        assert min(min(t.base) for t in row) >= 0
    assert {a.xref for a in arrows(fig)} == {"x", "x2"}
    # Legend lists each stage once.
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert len(shown) == len(set(shown))
    bare = figures.compare_figure({"a": zos_timeline()})
    assert "tok/s" not in bare.layout.annotations[0].text


def test_save_html_is_standalone(tmp_path):
    path = figures.save_html(figures.timeline_figure(zos_timeline()), tmp_path / "sub" / "fig.html")
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    assert path.stat().st_size > 1_000_000  # plotly.js is inlined
    assert "<html" in text[:200].lower() and "</html>" in text[-200:].lower()
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", text, flags=re.I)
    assert tags, "expected inline script tags"
    for tag in tags:
        assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", tag, flags=re.I), tag


# ---------------------------------------------------------------------------- explorer

def _alive(engine) -> bool:
    proc = getattr(engine.device, "_proc", None)
    return proc is not None and proc.is_alive()


@pytest.fixture
def run_engines(monkeypatch):
    """Every engine that starts a run while the test runs (toy_engine's run observers)."""
    seen = []
    monkeypatch.setattr(te.engine, "RUN_OBSERVERS",
                        [*te.engine.RUN_OBSERVERS, lambda engine, when: when == "start" and seen.append(engine)])
    return seen


def _small_explorer(**kw):
    tok = te.CharTokenizer()
    model = te.TinyGPT(te.GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32))
    return figures.TimelineExplorer(num_requests=2, max_new_tokens=6, device="cpu", model=model, tokenizer=tok, **kw)


def test_explorer_headless(run_engines):
    """The widgets drive runs and both views in one FigureWidget; no run leaves its engine's
    device process behind (notebook 05 keeps the explorer open beside its own engines)."""
    pytest.importorskip("ipywidgets")
    ex = _small_explorer(mode="serial")
    widget = ex.figure
    try:
        assert len(ex.figure.data) == 0
        ex.mode.value, ex.batch_size.value, ex.num_requests.value = "zos", 2, 3
        stats = ex.run()
        assert len(run_engines) == 1 and not _alive(run_engines[0])
        assert stats.tokens == 3 * 6 and ex.timeline.meta.mode == "zos"
        assert kind(ex.figure, "span") and "tokens/s" in ex.readout.value and "idle" in ex.readout.value
        first = figures.default_first_round(ex.timeline)
        assert ex.round_slider.value == first and ex.round_slider.max == ex.timeline.rounds()[-1]
        before = ex.figure.to_plotly_json()["data"]
        assert ex.figure.layout.meta["view"] == "scale"

        ex.view.value = "order"  # the same spans, as the order view, in the same widget
        assert ex.figure.layout.meta["view"] == "order" and kind(ex.figure, "order") and not kind(ex.figure, "span")
        assert ex.figure.layout.xaxis.title.text.startswith("order")
        assert len(ex.figure.layout.shapes) >= 3  # one box per loop pass
        ex.view.value = "to scale"
        assert not ex.figure.layout.shapes and ex.figure.layout.xaxis.showticklabels
        no_uid = lambda data: [{k: v for k, v in t.items() if k != "uid"} for t in data]  # noqa: E731
        assert no_uid(ex.figure.to_plotly_json()["data"]) == no_uid(before)
        assert ex.figure.layout.meta["view"] == "scale"
        assert len(run_engines) == 1  # moving the window or switching the view runs nothing

        ex.round_slider.value = 0  # moves the window, no run
        assert ex.figure.to_plotly_json()["data"] != before
        assert "round 0" in ex.figure.layout.title.text or "rounds 0" in ex.figure.layout.title.text

        for change in (lambda: None, lambda: setattr(ex.drafts, "value", 2), lambda: setattr(ex.mode, "value", "serial")):
            change()
            ex.run_button.click()
            assert "Error" not in ex.readout.value
            assert not any(_alive(e) for e in run_engines), "a run left its engine's device process running"
        assert len(set(map(id, run_engines))) == 4  # each run its own engine
        assert ex.timeline.meta.mode == "serial" and ex.timeline.meta.num_draft_tokens == 2
        assert ex.figure is widget  # redrawn in place, never replaced
    finally:
        ex.close()
    assert ex.widget.comm is None and ex.figure.comm is None


def test_explorer_busy_note_is_one_line_about_what_it_shows():
    """A run the contention meter judged busy (here: other programs used 1.5 CPUs meanwhile) gets
    the busy warning, one line at 1280x720 opening to its reasons, naming nothing the explorer
    does not show (no RECORDED run, no code).  (The warning never fired before issue 23: it read
    contention keys that engine.stats no longer has.)"""
    pytest.importorskip("ipywidgets")
    from overlap_course.measure import machine

    ex = _small_explorer()
    try:
        ex.run()
        ex.timeline.meta.annotations["machine_load"] = dict(cpus=2, wall_s=1.0, others_cpus=1.5)
        ex._update_readout()
        note = re.search(r"<details\b.*?</details>", ex.readout.value, re.S)
        assert note, f"no busy note in {ex.readout.value!r}"
        summary = re.search(r"<summary\b[^>]*>(.*?)</summary>", note.group(0), re.S).group(1)
        assert "white-space:nowrap" in note.group(0) and len(re.sub(r"<[^>]+>", "", summary)) <= 90, summary
        assert machine.BUSY_WARNING_PREFIX in summary and "1.50" in note.group(0)
        for foreign in ("RECORDED", "load_trace", "<code>"):
            assert foreign not in ex.readout.value, f"the note names {foreign!r}, which the explorer does not show"
    finally:
        ex.close()


def test_explorer_stored_without_its_state_reads_as_text():
    """A stored notebook has no widget state: its viewers fall back to text/plain, which names
    the explorer instead of showing ``VBox(children=...``."""
    pytest.importorskip("ipywidgets")
    ex = _small_explorer()
    try:
        bundle = ex._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert bundle["text/plain"].startswith("Timeline explorer") and "VBox" not in bundle["text/plain"]
    finally:
        ex.close()


# ---------------------------------------------------------------------------- aligned windows

def _decode_triples(tl):
    decode = set(decode_rounds(tl))
    return [r for r in sorted(decode) if {r, r + 1, r + 2} <= decode]


@pytest.mark.parametrize("overhead", [0.0, 2.0])
def test_aligned_window_of_the_faster_recorded_run_is_not_the_longer(overhead):
    """Issue 12: the ZOS window of rounds 2-4 used to begin with most of round 1's forward, so
    the faster run drew the longer window.  Now, for the same rounds, it is never longer --
    unless its device itself worked longer on those very rounds (the stand-in's device time
    per round drifts by up to ~30 % between runs on one machine, far more than the ~0.6 ms a
    round that ZOS saves at 0 ms host overhead), and then by no more than that extra device
    time.  The old misalignment added a forward of the round *before* the window, which
    this bound does not excuse; and such exceptions must stay rare."""
    from overlap_course.traces.recorded import recorded_runs, trace_name

    if overhead and not (TRACES_DIR / f"{trace_name('zos', overhead)}.json").is_file():
        pytest.skip(f"no trace recorded at {overhead:g} ms host overhead is shipped yet "
                    f"(scripts/record_traces.py refuses to record one on a busy machine)")
    runs = recorded_runs(overhead)
    assert set(runs) == {"serial", "zos"} and runs["zos"].meta.host_overhead_ms == overhead
    fast, slow = sorted(runs.values(), key=lambda tl: -tl.meta.stats.tokens_per_s)
    assert fast.meta.mode == "zos", "the recorded quiet-machine ZOS run must be the faster one"
    common = sorted(set(_decode_triples(fast)) & set(_decode_triples(slow)))
    assert len(common) >= 10
    longer = []
    for first in common:
        f0, f1 = round_window(fast, first, first + 2)
        s0, s1 = round_window(slow, first, first + 2)
        rounds = range(first, first + 3)
        slower_device = max(0.0, fast.device_busy_ms(rounds) - slow.device_busy_ms(rounds))
        assert f1 - f0 <= s1 - s0 + slower_device + 1e-6, (first, f1 - f0, s1 - s0, slower_device)
        if f1 - f0 > s1 - s0:
            longer.append(first)
    # Delivery to delivery, the faster run draws the longer window rarely (1 and 2 of 21 on the
    # shipped traces); a window ending at processing but starting at device work charged ZOS its
    # one-round deferral and did so in 3 and 12 of 21.
    assert len(longer) <= len(common) // 5, f"the faster run drew the longer window from rounds {longer}"
    whole = sorted(set(decode_rounds(fast)) & set(decode_rounds(slow)))
    f0, f1 = round_window(fast, whole[0], whole[-1])
    s0, s1 = round_window(slow, whole[0], whole[-1])
    assert f1 - f0 <= s1 - s0, ("all common decode rounds", f1 - f0, s1 - s0)
    # The figure draws exactly those windows, on one axis whose range fits the longer.
    fig = figures.compare_figure({"serial": runs["serial"], "zos": runs["zos"]}, fallback=False)
    first = common_first_round([runs["serial"], runs["zos"]])
    lengths = {m: round_window(tl, first, first + 2) for m, tl in runs.items()}
    titles = [a.text for a in fig.layout.annotations[:2]]
    for mode, title in zip(("serial", "zos"), titles):
        a, b = lengths[mode]
        assert f"rounds {first}–{first + 2}: {b - a:.2f} ms" in title
    assert fig.layout.xaxis2.range[1] == pytest.approx(max(b - a for a, b in lengths.values()))
    for ax in ("y", "y2"):  # every row's bars lie inside its window
        row = [t for t in fig.data if t.yaxis == ax and (t.meta or {}).get("kind") == "span"]
        assert min(min(t.base) for t in row) >= 0
        end = max(b + x for t in row for b, x in zip(t.base, t.x))
        assert end == pytest.approx(max(b - a for a, b in [lengths["serial" if ax == "y" else "zos"]]))


def test_round_window_runs_from_delivery_to_delivery():
    tl = Timeline(origin_ns=0)
    tl.add("host", "schedule", 2, 0.0, 0.5)      # under round 1's forward (ZOS): not the start
    tl.add("device", "upload", 2, 3.0, 3.2)
    tl.add("device", "sample", 2, 6.0, 7.0)
    tl.add("host", "postprocess", 2, 7.5, 8.0)
    tl.add("host", "schedule", 3, 8.0, 8.2)
    tl.add("device", "forward", 3, 8.5, 11.0)
    tl.add("host", "flush", 3, 11.5, 12.0)
    assert round_window(tl, 2, 2) == (3.0, 8.0)   # round 1 never processed here: round 2's first device work
    assert round_window(tl, 2, 3) == (3.0, 12.0)
    assert round_window(tl, 3, 3) == (8.0, 12.0)  # from round 2's postprocess (its tokens reach the requests)
    only_host = Timeline(origin_ns=0)
    only_host.add("host", "prepare", 0, 1.0, 2.0)
    assert round_window(only_host, 0, 0) == (1.0, 2.0)


def test_round_window_rejects_bad_ranges():
    tl = zos_timeline()
    with pytest.raises(ValueError, match="last_round"):
        round_window(tl, 3, 2)
    with pytest.raises(ValueError, match="rounds 7..9 have no spans"):
        round_window(tl, 7, 9)


# ---------------------------------------------------------------------------- contention

def busy_timeline(share: float, mode: str = "zos") -> Timeline:
    """zos_timeline with CPU times: every device span got ``share`` of its wall time."""
    tl = zos_timeline()
    tl.meta.mode, tl.meta.device = mode, "cpu-process"
    tl.spans = [Span(s.lane, s.stage, s.round, s.start_ms, s.end_ms, s.owner,
                     s.duration_ms * (share if s.lane == "device" else 1.0)) for s in tl.spans]
    return tl


def test_preempted_device_work_is_shaded_machine_busy_not_idle():
    tl = busy_timeline(0.4)
    fig = figures.timeline_figure(tl)
    (busy,) = kind(fig, "busy")
    (idle,) = kind(fig, "idle")
    # every device span of the window of at least 0.2 ms was preempted: 5 of the 6 (the
    # 0.2 ms correct is too short to judge); the idle gap stays an idle gap
    assert len(busy.x) == 5 and "machine busy" in busy.name and "(40%)" in busy.hovertext[1]
    assert list(idle.x) == pytest.approx([0.5])
    assert busy.marker.pattern.shape == "\\" and idle.marker.pattern.shape == "x"
    assert "machine busy" in fig.layout.title.text
    quiet = figures.timeline_figure(busy_timeline(0.97))
    assert not kind(quiet, "busy") and "machine busy" not in quiet.layout.title.text
    assert "CPU " in bars(quiet)[0][5] and "% of wall" in bars(quiet)[0][5]


def test_palette_colour_blind_safe_and_patterns_distinct():
    colours = list(figures.STAGE_COLORS.values())
    assert len(set(colours)) == len(colours)
    assert len(set(palette.PATTERNS.values())) == 3 and set(palette.PATTERNS) == {"idle", "busy", "flush"}
    # Okabe-Ito core colours are used for the stages the lessons point at.
    for stage, colour in (("forward", "#0072b2"), ("postprocess", "#e69f00"), ("flush", "#d55e00"),
                          ("prepare", "#009e73"), ("upload", "#56b4e9")):
        assert figures.STAGE_COLORS[stage] == colour


def test_busy_comparison_prints_warning_and_adds_the_recorded_rows(capsys, monkeypatch):
    from overlap_course.measure import machine
    from toy_engine import device as engine_device

    monkeypatch.setattr(engine_device, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: None)
    runs = {"serial": busy_timeline(0.5, "serial"), "zos": busy_timeline(0.5)}
    fig = figures.compare_figure(runs)
    out = capsys.readouterr().out
    assert out.startswith(machine.BUSY_WARNING_PREFIX) and "50%" in out and "RECORDED" in out
    titles = [a.text for a in fig.layout.annotations if a.text and "rounds" in a.text]
    assert len(titles) == 4 and "(BUSY)" in titles[0]
    recorded = [t for t in titles if "RECORDED" in t]
    assert len(recorded) == 2 and all("commit" in t and "UTC" in t and "CPUs" in t for t in recorded)
    assert all(re.search(r"\d+ x \d+ tokens", t) for t in recorded), recorded  # which workload they ran
    assert fig.layout.meta["busy_warning"] == out.strip()
    assert "machine busy" in fig.layout.title.text
    # A quiet live run: no warning, no recorded rows.
    quiet = figures.compare_figure({"serial": busy_timeline(0.97, "serial"), "zos": busy_timeline(0.97)})
    assert not capsys.readouterr().out and len([a for a in quiet.layout.annotations if "RECORDED" in (a.text or "")]) == 0
    # One usable CPU: the warning comes whatever the shares say.
    monkeypatch.setattr(engine_device, "affinity_cpus", lambda: 1)
    figures.compare_figure({"serial": busy_timeline(0.97, "serial"), "zos": busy_timeline(0.97)})
    assert "Only 1 usable CPU" in capsys.readouterr().out


# ---------------------------------------------------------------------------- order view

def order_blocks(fig):
    """(lane, stage, round, x0, x1, opacity, hover) of every block of the order view."""
    out = []
    for t in kind(fig, "order"):
        for (lane, stage, rnd), b, x, op, h in zip(t.meta["spans"], t.base, t.x, t.marker.opacity, t.hovertext):
            out.append((lane, stage, rnd, b, b + x, op, h))
    return out


@pytest.mark.parametrize("name", ["cpu_zos", "cpu_serial"])
def test_order_view_of_the_last_three_recorded_rounds(name):
    """Every stage of three rounds present, in the recorded order, with the flush."""
    tl = figures.load_trace(name)
    last = max(decode_rounds(tl))
    rounds = range(last - 2, last + 1)
    fig = figures.order_figure(tl, first_round=rounds[0], num_rounds=3)
    assert fig.layout.meta["view"] == "order"
    blocks = order_blocks(fig)
    drawn = [b for b in blocks if b[5] == 1.0]
    recorded = [s for s in tl.spans if s.round in rounds]
    assert sorted(b[:3] for b in drawn) == sorted((s.lane, s.stage, s.round) for s in recorded)
    # Each lane reads left to right in the recorded order (blocks of other rounds included).
    for lane in ("host", "device"):
        lane_blocks = sorted((b for b in blocks if b[0] == lane), key=lambda b: b[3])
        spans = [s for s in tl.lane(lane) if any(b[:3] == (lane, s.stage, s.round) for b in lane_blocks)]
        assert [b[1:3] for b in lane_blocks] == [(s.stage, s.round) for s in spans]
        for a, b in zip(lane_blocks, lane_blocks[1:]):
            assert a[4] <= b[3] + 1e-9, (a, b)  # no overlap within a lane
    # Across lanes too, within a column (a loop pass): a block that started earlier is never
    # drawn to the right.  (Round N's sample may start after pass N+1 began; it stays in
    # column N, the pass that launched it, and its arrow slants into pass N+1.)
    spans = {(s.lane, s.stage, s.round): s for s in tl.spans if s.round in rounds}
    columns = [(c.x0, c.x1) for c in fig.layout.shapes]
    assert len(columns) == (4 if name == "cpu_zos" else 3)
    col = {b[:3]: next(i for i, (x0, x1) in enumerate(columns) if x0 <= b[3] <= x1) for b in drawn}
    for a in drawn:
        for b in drawn:
            if col[a[:3]] == col[b[:3]] and spans[a[:3]].start_ms < spans[b[:3]].start_ms:
                assert a[3] < b[3], (a[:3], b[:3])
    # Each block is a readable slot wide, whatever its duration.
    assert min(b[4] - b[3] for b in blocks) > 0.8
    # The last round is flushed (ZOS) or postprocessed at once (serial).
    flush = [t for t in kind(fig, "order") if t.name == "flush"]
    if name == "cpu_zos":
        assert [tuple(x) for x in flush[0].meta["spans"]] == [("host", "flush", last)]
        assert flush[0].marker.pattern.shape[0] == "/" and flush[0].text[0].startswith("FLUSH")
        assert any("end: nothing<br>left to launch" in (a.text or "") for a in fig.layout.annotations)
    else:
        assert not flush
    # One event arrow per round, from its sample to its processing.
    assert len(arrows(fig)) == 3
    for _, stage, rnd, *_, hover in drawn:
        if stage in ("wait", "postprocess", "flush"):
            assert f"StepState(round={rnd})" in hover and "round" in hover and "CPU" in hover


def test_order_view_columns_are_passes_and_mark_prefill():
    tl = zos_timeline()
    fig = figures.order_figure(tl, first_round=0, num_rounds=4)
    heads = [a.text for a in fig.layout.annotations if a.text and a.text.startswith("<b>")]
    # the hand-made run's last pass schedules nothing and flushes round 3
    assert heads == ["<b>round 0 · prefill</b>", "<b>round 1</b>", "<b>round 2</b>", "<b>round 3</b>",
                     "<b>end: nothing<br>left to launch</b>"]
    # That pass's schedule planned nothing: labelled so, not as a second schedule of a round.
    schedule = next(t for t in kind(fig, "order") if t.name == "schedule")
    assert list(schedule.text) == ["schedule r0", "schedule r1", "schedule r2", "schedule r3", "schedule: none"]
    assert "finds nothing left to launch" in schedule.hovertext[-1]
    blocks = order_blocks(fig)
    hosts = sorted((b for b in blocks if b[0] == "host"), key=lambda b: b[3])
    # The ZOS order: r2's forward is launched before r1 is processed, and r1's postprocess
    # is in the pass that launches r2.
    names = [(st, r) for _, st, r, *_ in hosts]
    assert names.index(("launch_forward", 2)) < names.index(("postprocess", 1)) < names.index(("launch_sample", 2))
    hover = next(b[6] for b in hosts if b[1:3] == ("postprocess", 1))
    assert "pass that launches round 2" in hover and "consumes round 1" in hover
    # A device block covers the host blocks of its pass that started while it ran: r2's
    # upload (18 .. 18.4) the postprocess of r1 (18.2), its forward (18.4 .. 23) the
    # launch_sample of r2 (19.2); r3's launches (19.6 ..) are in the next pass's column.
    cover = {}
    for stage in ("upload", "forward"):
        dev = next(b for b in blocks if b[1:3] == (stage, 2))
        cover[stage] = [b[1:3] for b in hosts if dev[3] <= b[3] < dev[4]]
    assert cover == {"upload": [("postprocess", 1)], "forward": [("launch_sample", 2)]}


def test_written_order_is_drawn_beside_the_engines():
    tl = zos_timeline()
    engine = figures.issued_order(tl, range(1, 4))
    assert engine == [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
                      ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]
    fig = figures.order_figure(tl, 1, 3, written=engine)
    (row,) = kind(fig, "written")
    assert row.meta["first_difference"] is None and list(row.text)[:2] == ["forward r1", "sample r1"]
    assert "you wrote" in list(fig.layout.yaxis.ticktext)
    # Each written item sits under the engine's step it is compared with.
    host = {b[1:3]: b for b in order_blocks(fig) if b[0] == "host"}
    stage_of = {"forward": "launch_forward", "sample": "launch_sample"}
    for (stage, rnd), x in zip(engine, row.base):
        assert host[(stage_of.get(stage, stage), rnd)][3] == pytest.approx(x - 0.04 + 0.04)
    wrong = [("forward", 1), ("sample", 1), ("forward", 2), ("sample", 2), ("postprocess", 1)]
    (row,) = kind(figures.order_figure(tl, 1, 3, written=wrong), "written")
    assert row.meta["first_difference"] == 3 and "first difference" in row.hovertext[3]
    assert list(row.marker.line.width)[3] > list(row.marker.line.width)[0]


def test_written_order_survives_malformed_lists():
    tl = zos_timeline()
    (row,) = kind(figures.order_figure(tl, 1, 3, written=["forward 1", ("sample", 1), (1, 2, 3)]), "written")
    assert row.meta["first_difference"] == 0 and len(row.text) == 3 and row.text[1] == "sample r1"
    assert not kind(figures.order_figure(tl, 1, 3, written=None), "written")


# ---- the order view says what it draws (issue 20: caption, title, end label) ---------------

def _order_figs():
    figs = [figures.order_figure(zos_timeline(), first_round=1, num_rounds=2),
            figures.order_figure(zos_timeline(), first_round=0, num_rounds=4)]
    for name in ("cpu_zos", "cpu_serial"):
        tl = figures.load_trace(name)
        last = max(decode_rounds(tl))
        figs.append(figures.order_figure(tl, first_round=last - 2, num_rounds=3))
        figs.append(figures.order_figure(tl, num_rounds=3))
    return figs


def test_order_view_caption_does_not_promise_equal_widths():
    for fig in _order_figs():
        widths = {round(b[4] - b[3], 3) for b in order_blocks(fig)}
        caption = fig.layout.xaxis.title.text
        assert len(widths) > 1  # a device block stretches over the host blocks that started while it ran
        assert not re.search(r"one slot|equal|same width", caption), caption
        assert "not" in caption and "duration" in caption, caption  # widths are not durations


def test_order_view_title_names_every_column_it_draws():
    fig = figures.order_figure(zos_timeline(), first_round=1, num_rounds=2)  # rounds 1-2; pass 3 processes round 2
    heads = [a.text for a in fig.layout.annotations if a.text and a.text.startswith("<b>")]
    assert heads == ["<b>round 1</b>", "<b>round 2</b>", "<b>round 3</b>"]
    title = fig.layout.title.text
    assert "rounds 1–2" in title and "round 3" in title and "faded" in title, title
    for fig in _order_figs():
        title = fig.layout.title.text.split("<br>")[0]
        span = re.search(r"rounds? (\d+)(?:–(\d+))?", title)
        named = set(range(int(span.group(1)), int(span.group(2) or span.group(1)) + 1))
        named |= {int(r) for r in re.findall(r"\+ round (\d+)'s pass", title)}
        for head in (a.text for a in fig.layout.annotations if a.text and a.text.startswith("<b>round")):
            assert int(re.search(r"round (\d+)", head).group(1)) in named, (head, title)


def _head_extents(fig):
    """Each column head's horizontal extent in data units, at the static image's width
    (900 px, the narrowest the course draws), from its longest line at ~0.62 em a character."""
    width = fig.layout.width or 900
    margin = fig.layout.margin
    x0, x1 = fig.layout.xaxis.range
    px_per_unit = (width - margin.l - margin.r) / (x1 - x0)
    out = []
    for a in fig.layout.annotations:
        if not (a.text and a.text.startswith("<b>")) or a.showarrow:
            continue
        lines = re.sub(r"</?b>", "", a.text).split("<br>")
        half = max(len(line) for line in lines) * 0.62 * (a.font.size or 12) / 2 / px_per_unit
        anchor = a.xanchor or "center"
        left = a.x - 2 * half if anchor == "right" else a.x if anchor == "left" else a.x - half
        out.append((left, left + 2 * half, a.text))
    return sorted(out), (x0, x1)


def test_order_view_column_heads_fit_inside_the_figure_and_do_not_overlap():
    for fig in _order_figs():
        heads, (x0, x1) = _head_extents(fig)
        for left, right, text in heads:
            assert x0 <= left and right <= x1, (text, left, right, x0, x1)
        for (_, r1, t1), (l2, _, t2) in zip(heads, heads[1:]):
            assert r1 <= l2, (t1, t2)


# ---- the recorded fallback compares like with like (issue 20) -----------------------------

def _live_bench_calls():
    """The live comparisons the notebooks run: (notebook, num_requests, max_new_tokens, modes)."""
    import json as _json
    calls = []
    for nb in ("03b_zos_measured", "04_stale_lengths", "05_ownership"):
        cells = _json.loads((TRACES_DIR.parent.parent / "notebooks" / f"{nb}.ipynb").read_text())["cells"]
        for cell in cells:
            src = "".join(cell["source"])
            for m in re.finditer(r"run_bench\((.*?)\)\n", src, re.S):
                args = m.group(1)
                req = re.search(r"num_requests=(\d+)", args)
                new = re.search(r"max_new_tokens=(\d+)", args)
                modes = re.search(r"modes=\(([^)]*)\)", args)
                calls.append((nb, int(req.group(1)), int(new.group(1)),
                              tuple(re.findall(r'"([^"]+)"', modes.group(1))) if modes else ("serial", "zos")))
    assert calls
    return calls


def test_recorded_traces_are_the_workload_the_notebooks_compare_them_with():
    from overlap_course.traces.recorded import RECORDED_WORKLOAD

    for name in figures.available_traces():
        w = figures.load_trace(name).meta.workload
        assert (w.requests, w.max_new_tokens) == (RECORDED_WORKLOAD["requests"],
                                                  RECORDED_WORKLOAD["max_new_tokens"]), name
        assert figures.load_trace(name).meta.max_batch_size == RECORDED_WORKLOAD["batch_size"], name
    for nb, requests, new_tokens, _ in _live_bench_calls():
        assert (requests, new_tokens) == (RECORDED_WORKLOAD["requests"], RECORDED_WORKLOAD["max_new_tokens"]), nb


def test_every_mode_a_notebook_benchmarks_has_a_recorded_fallback():
    from overlap_course.measure import bench
    from overlap_course.traces.recorded import recorded_runs

    for nb, *_, modes in _live_bench_calls():
        for fast, slow in (("zos", "serial"), ("zos+spec", "serial+spec")):
            if fast in modes and slow in modes:
                drafts = 4 if "spec" in fast else 0
                runs = recorded_runs(0.0, drafts=drafts)
                assert set(runs) == {"serial", "zos"}, (nb, fast)
                assert all(tl.meta.num_draft_tokens == drafts for tl in runs.values()), (nb, fast)
                text = bench.recorded_comparison_text(0.0, drafts=drafts)
                assert text.startswith("RECORDED") and ("+spec " in text) == bool(drafts), text


def test_a_recorded_fallback_for_another_workload_says_so():
    from overlap_course.measure import bench

    w = figures.load_trace("cpu_zos").meta.workload
    same = bench.recorded_comparison_text(0.0, workload=dict(num_requests=w.requests, max_new_tokens=w.max_new_tokens))
    other = bench.recorded_comparison_text(0.0, workload=dict(num_requests=w.requests + 1, max_new_tokens=96))
    assert "different workload" not in same
    assert "different workload" in other and f"{w.requests + 1} requests x 96" in other
