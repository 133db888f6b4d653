"""Figures drawn from timelines (toy_engine.viz): fast, no browser."""

import re

import pytest

pytest.importorskip("plotly")

import toy_engine as te  # noqa: E402
from toy_engine import viz  # noqa: E402
from toy_engine.timeline import Timeline  # noqa: E402


def zos_timeline() -> Timeline:
    """A hand-made ZOS run: prefill r0, decode r1-r3 (deferred postprocess), flush of r3.

    Device gaps: 9.5-12.2 (host prepares r1 after processing the prefill) and
    24.0-24.5 (upload r3 waits for the host).  Round 4 only schedules (nothing left).
    """
    tl = Timeline(origin_ns=0, meta=dict(mode="zos", device="hand", prefill_rounds=[0]))
    own = "StepState(round={})".format
    H = [  # host: stage, round, start, end, owner
        ("schedule", 0, 0, 1, ""), ("prepare", 0, 1, 2, ""), ("launch_forward", 0, 2, 2.5, ""),
        ("launch_sample", 0, 2.5, 3, ""), ("wait", 0, 3, 10, own(0)), ("postprocess", 0, 10, 11, own(0)),
        ("schedule", 1, 11, 11.5, ""), ("prepare", 1, 11.5, 12.5, ""), ("launch_forward", 1, 12.5, 13, ""),
        ("launch_sample", 1, 13, 13.5, ""),
        ("schedule", 2, 13.5, 14, ""), ("prepare", 2, 14, 15, ""), ("launch_forward", 2, 15, 15.5, ""),
        ("wait", 1, 15.5, 18, own(1)), ("postprocess", 1, 18.2, 19.2, own(1)), ("launch_sample", 2, 19.2, 19.6, ""),
        ("schedule", 3, 19.6, 20, ""), ("prepare", 3, 20, 21, ""), ("launch_forward", 3, 21, 21.5, ""),
        ("wait", 2, 21.5, 24, own(2)), ("postprocess", 2, 24.1, 25, own(2)), ("launch_sample", 3, 25, 25.5, ""),
        ("schedule", 4, 25.5, 26, ""), ("wait", 3, 26, 30, own(3)), ("flush", 3, 30.2, 31, own(3)),
    ]
    D = [
        ("upload", 0, 2, 3, ""), ("forward", 0, 3, 8, ""), ("sample", 0, 8, 9.5, own(0)),
        ("upload", 1, 12.2, 12.6, ""), ("forward", 1, 12.6, 17, ""), ("sample", 1, 17, 18, own(1)),
        ("upload", 2, 18, 18.4, ""), ("forward", 2, 18.4, 23, ""), ("sample", 2, 23, 24, own(2)),
        ("upload", 3, 24.5, 25, ""), ("correct", 3, 25, 25.2, ""), ("forward", 3, 25.2, 29, ""),
        ("sample", 3, 29, 30, own(3)),
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
    assert viz.decode_rounds(tl) == [1, 2, 3]
    assert viz.default_first_round(tl) == 2
    tl.meta.pop("prefill_rounds")  # without meta: every forward round counts as decode
    assert viz.default_first_round(tl) == 1
    assert viz.default_first_round(Timeline(origin_ns=0)) == 0


def test_stage_traces_colours_and_span_bars():
    tl = zos_timeline()
    fig = viz.timeline_figure(tl)  # rounds 2, 3, 4
    window = [s for s in tl.spans if s.round in (2, 3, 4)]
    spans = kind(fig, "span")
    names = [t.name for t in spans]
    assert len(names) == len(set(names)), "one trace per stage"
    assert set(names) == {s.stage for s in window}
    for t in spans:
        assert t.marker.color == viz.STAGE_COLORS[t.name]
        assert t.orientation == "h"
    drawn = bars(fig)
    assert len(drawn) == len(window) == 20
    t0 = 13.5  # window start: schedule r2
    expected = sorted((s.stage, viz._LANE_Y[s.lane], s.start_ms - t0, s.duration_ms) for s in window)
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


def test_idle_gaps_in_ms_are_the_timelines_gaps_clipped_to_the_window():
    tl = zos_timeline()
    (idle,) = kind(viz.timeline_figure(tl), "idle")
    assert list(idle.base) == pytest.approx([24.0 - 13.5]) and list(idle.x) == pytest.approx([0.5])
    assert set(idle.y) == {viz._LANE_Y["device"]} and "0.500 ms" in idle.hovertext[0]
    (idle,) = kind(viz.timeline_figure(tl, first_round=0, num_rounds=5), "idle")
    assert list(idle.base) == pytest.approx([9.5, 24.0]) and list(idle.x) == pytest.approx([2.7, 0.5])
    # Round 1 alone: window 11.0 .. 19.2, so the 9.5-12.2 gap is clipped to 11.0-12.2.
    fig = viz.timeline_figure(tl, first_round=1, num_rounds=1)
    (idle,) = kind(fig, "idle")
    assert list(idle.base) == pytest.approx([0.0]) and list(idle.x) == pytest.approx([1.2])
    assert "device idle 1.20 ms of 8.20 ms" in fig.layout.title.text


def test_event_arrows_and_flush_marker():
    tl = zos_timeline()
    fig = viz.timeline_figure(tl)
    got = sorted((a.ax, a.x) for a in arrows(fig))  # sample end -> postprocess/flush start
    assert [v for pair in got for v in pair] == pytest.approx([24 - 13.5, 24.1 - 13.5, 30 - 13.5, 30.2 - 13.5])
    assert all(a.ay < a.y for a in arrows(fig))  # from the device row up to the host row
    flush = [a for a in fig.layout.annotations if "flush" in (a.text or "")]
    assert len(flush) == 1 and flush[0].text == "flush r3"
    assert len(arrows(viz.timeline_figure(tl, first_round=0, num_rounds=5))) == 4
    one = viz.timeline_figure(tl, first_round=1, num_rounds=1)
    assert len(arrows(one)) == 1 and not [a for a in one.layout.annotations if a.text]


def test_context_spans_are_separate_and_optional():
    tl = zos_timeline()
    fig = viz.timeline_figure(tl)
    (ctx,) = kind(fig, "context")
    # r1's forward, sample, wait and postprocess overlap rounds 2-4's time range (13.5 .. 31);
    # the forward started at 12.6, before the window, and is clipped to start at 0.
    assert set(ctx.text) == {"r1"} and len(ctx.x) == 4
    assert list(ctx.base) == pytest.approx([0, 2.0, 3.5, 4.7]) and list(ctx.x) == pytest.approx([3.5, 2.5, 1, 1])
    assert not kind(viz.timeline_figure(tl, context=False), "context")


def test_unknown_stage_gets_fallback_colour():
    tl = zos_timeline()
    tl.add("device", "mystery_kernel", 2, 24.0, 24.2)
    fig = viz.timeline_figure(tl)
    (t,) = [t for t in kind(fig, "span") if t.name == "mystery_kernel"]
    assert t.marker.color == viz.stage_color("mystery_kernel") and t.marker.color in viz._FALLBACK_COLORS
    assert len(bars(fig)) == 21


def test_json_round_trip_draws_the_same_figure():
    tl = zos_timeline()
    again = Timeline.from_json(tl.to_json())
    assert viz.timeline_figure(tl).to_plotly_json() == viz.timeline_figure(again).to_plotly_json()


@pytest.mark.parametrize("name", ["cpu_serial", "cpu_zos"])
def test_shipped_traces_draw(name):
    assert name in viz.available_traces()
    tl = viz.load_trace(name)
    assert tl.meta["mode"] == name.split("_")[1] and "recorded" in tl.meta and "tokens_per_s" in tl.meta["stats"]
    assert (viz.TRACES_DIR / f"{name}.json").stat().st_size < 200_000
    fig = viz.timeline_figure(tl)
    first = viz.default_first_round(tl)
    assert len(bars(fig)) == sum(first <= s.round < first + 3 for s in tl.spans)
    assert len(arrows(fig)) >= 2
    again = viz.timeline_figure(Timeline.from_json(tl.to_json()))
    assert again.to_plotly_json() == fig.to_plotly_json()
    with pytest.raises(ValueError, match="available"):
        viz.load_trace("no_such_trace")


def test_compare_figure():
    serial, zos = viz.load_trace("cpu_serial"), viz.load_trace("cpu_zos")
    fig = viz.compare_figure({"serial": serial, "zos": (zos, {"tokens_per_s": 1234.5})})
    assert fig.layout.xaxis.matches == "x2"  # one time axis for both rows (the bottom one)
    ys = {t.yaxis for t in fig.data}
    assert ys == {"y", "y2"}
    titles = [a.text for a in fig.layout.annotations if a.text and "idle" in a.text]
    assert len(titles) == 2 and "serial" in titles[0] and "zos" in titles[1]
    assert all(re.search(r"device idle [\d.]+ ms .*\(\d+\.\d%\).*run decode idle \d+\.\d%", t) for t in titles)
    assert "1234 tok/s" in titles[1] or "1235 tok/s" in titles[1]
    assert f"{serial.meta['stats']['tokens_per_s']:.0f} tok/s" in titles[0]  # from the recorded meta
    # Each row's window starts at 0; arrows refer to their own subplot's axes.
    for ax in ("y", "y2"):
        row = [t for t in fig.data if t.yaxis == ax and (t.meta or {}).get("kind") == "span"]
        assert min(min(t.base) for t in row) == 0
    assert {a.xref for a in arrows(fig)} == {"x", "x2"}
    # Legend lists each stage once.
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert len(shown) == len(set(shown))
    bare = viz.compare_figure({"a": zos_timeline()})
    assert "tok/s" not in bare.layout.annotations[0].text


def test_save_html_is_standalone(tmp_path):
    path = viz.save_html(viz.timeline_figure(zos_timeline()), tmp_path / "sub" / "fig.html")
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


def test_explorer_headless():
    pytest.importorskip("ipywidgets")
    tok = te.CharTokenizer()
    model = te.TinyGPT(te.GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32))
    ex = viz.TimelineExplorer(mode="serial", num_requests=2, max_new_tokens=6, device="cpu",
                              model=model, tokenizer=tok)
    engines, widget = [], ex.figure
    try:
        assert len(ex.figure.data) == 0
        ex.mode.value, ex.batch_size.value, ex.num_requests.value = "zos", 2, 3
        stats = ex.run()
        engines.append(ex.engine)
        assert stats["tokens"] == 3 * 6 and ex.timeline.meta["mode"] == "zos"
        assert kind(ex.figure, "span") and "tokens/s" in ex.readout.value and "idle" in ex.readout.value
        first = viz.default_first_round(ex.timeline)
        assert ex.round_slider.value == first and ex.round_slider.max == ex.timeline.rounds()[-1]
        before = ex.figure.to_plotly_json()["data"]

        ex.run_button.click()  # same config: the engine is reused
        assert ex.engine is engines[0] and _alive(engines[0])

        ex.round_slider.value = 0  # moves the window, no run
        assert ex.figure.to_plotly_json()["data"] != before
        assert "round 0" in ex.figure.layout.title.text or "rounds 0" in ex.figure.layout.title.text

        for change in (lambda: setattr(ex.drafts, "value", 2), lambda: setattr(ex.mode, "value", "serial")):
            change()
            ex.run_button.click()
            engines.append(ex.engine)
            assert engines[-1] is not engines[-2] and not _alive(engines[-2])
            assert "Error" not in ex.readout.value
        assert ex.timeline.meta["mode"] == "serial" and ex.timeline.meta["num_draft_tokens"] == 2
        assert ex.figure is widget  # redrawn in place, never replaced
    finally:
        ex.close()
    assert ex.engine is None and not any(_alive(e) for e in engines)
