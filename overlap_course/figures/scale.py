"""The to-scale view: a window of rounds on two lanes, every span at its real time.

It answers the course's question -- *while the device works on round N, what is the host
doing, and is the device ever left waiting?* -- with ``host`` above ``device``, one bar per
span, device idle gaps hatched, stretches where a process was *preempted* (the machine was
busy: wall time far above CPU time) hatched differently, and an arrow from each round's
``sample`` end (its completion event) to the host's processing of that round.

A window of rounds ``a..b`` runs from the moment round a-1's tokens reached the requests
to the moment round b's did (:func:`rounds.round_window`), in every run, so that in a
comparison equal widths mean equal time and the run with more tokens per second draws the
shorter window (``docs/measurements/figures.md`` has why no other anchor is fair).
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from overlap_course.measure.contention import busy_stretches, contention, cpu_share, late_ms
from overlap_course.measure.machine import busy_warning
from overlap_course.traces.recorded import recorded_label, recorded_runs, recording
from toy_engine.runinfo import RunStats
from toy_engine.timeline import PROCESS_STAGES, Span, Timeline, owner_name
from toy_engine.validate import check_int, shown

from .layout import BAR_WIDTH, LANE_Y, apply_layout, cpu_text, heading, style_lanes
from .palette import BUSY_COLOR, IDLE_COLOR, PATTERNS, in_stage_order, stage_color
from .rounds import (check_timeline, common_first_round, decode_rounds, default_first_round, round_window,
                     window_spans)

__all__ = ["timeline_figure", "compare_figure"]

WINDOW_NOTE = "window: the round before delivered (its postprocess ends) → the last round delivered"


def _links(spans: list[Span]) -> list[tuple[Span, Span]]:
    """(device sample, host postprocess/flush) pairs of the same round: the event hand-off."""
    samples, processed = {}, {}
    for s in spans:
        if s.lane == "device" and s.stage == "sample":
            if s.round not in samples or s.end_ms > samples[s.round].end_ms:
                samples[s.round] = s  # the last sample of the round fires the event
        elif s.lane == "host" and s.stage in PROCESS_STAGES:
            processed.setdefault(s.round, s)
    return [(samples[r], processed[r]) for r in sorted(samples) if r in processed]


def _window(timeline: Timeline, first_round: int | None, num_rounds: int) -> dict:
    """Everything a to-scale figure needs for one window, in ms relative to its start.

    The time range is :func:`rounds.round_window`: from the delivery of the round before
    the first to the delivery of the last.  Spans of the window's rounds are drawn clipped
    to it (under ZOS the first round's forward began before the round before it was
    delivered).  Idle gaps and machine-busy stretches are the timeline's, clipped to the range.
    """
    num_rounds = check_int("num_rounds", num_rounds, 1)
    first = default_first_round(timeline) if first_round is None else check_int("first_round", first_round, 0)
    last = first + num_rounds - 1
    owned = window_spans(timeline, first, num_rounds)
    if owned:
        t0, t1 = round_window(timeline, first, last)
    else:
        t0 = t1 = 0.0
    inside = [s for s in owned if s.end_ms >= t0 and s.start_ms <= t1]
    gaps = timeline.device_gaps(t0, t1) if owned else []
    idle = sum(b - a for a, b in gaps)
    wanted = range(first, last + 1)
    context = sorted((s for s in timeline.spans
                      if s.round not in wanted and s.end_ms > t0 and s.start_ms < t1),
                     key=lambda s: (s.start_ms, s.end_ms))
    busy = [b for lane in ("device", "host") for b in busy_stretches(timeline, t0, t1, lane=lane)] if owned else []
    return dict(first=first, last=last, spans=inside, context=context, t0=t0, t1=t1,
                gaps=gaps, idle_ms=idle, idle_fraction=idle / (t1 - t0) if t1 > t0 else 0.0,
                busy=busy, busy_ms=sum(b - a for a, b, _ in busy), links=_links(inside))


def _hover(span: Span, t0: float, clipped: bool = False) -> str:
    text = (f"<b>{html.escape(span.stage)}</b> ({span.lane}) · round {span.round}<br>"
            f"start {span.start_ms - t0:.3f} ms · end {span.end_ms - t0:.3f} ms<br>"
            f"duration {span.duration_ms:.3f} ms · {cpu_text(span)}")
    if span.owner is not None:
        text += f"<br>owner {owner_name(span.owner)}"
    if span.label:
        text += f"<br>{html.escape(span.label)}"
    if clipped:
        text += "<br><i>drawn clipped to the window</i>"
    return text


def _clip(spans: list[Span], t0: float, t1: float) -> tuple[list[float], list[float]]:
    starts = [max(s.start_ms, t0) for s in spans]
    return [a - t0 for a in starts], [max(0.0, min(s.end_ms, t1) - a) for s, a in zip(spans, starts)]


def _stage_trace(stage: str, spans: list[Span], win: dict, show_legend: bool) -> go.Bar:
    """The window's spans of one stage (one legend entry per stage)."""
    t0, t1 = win["t0"], win["t1"]
    base, length = _clip(spans, t0, t1)
    return go.Bar(
        name=stage, legendgroup=stage, showlegend=show_legend, orientation="h",
        y=[LANE_Y[s.lane] for s in spans], base=base, x=length, width=BAR_WIDTH,
        text=[f"r{s.round}" for s in spans], textposition="inside", insidetextanchor="middle",
        hovertext=[_hover(s, t0, s.start_ms < t0 or s.end_ms > t1) for s in spans],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=stage_color(stage), line=dict(color="rgba(0,0,0,0.45)", width=0.6),
                    pattern=dict(shape=PATTERNS["flush"] if stage == "flush" else "",
                                 fgcolor="rgba(255,255,255,0.8)", size=6)),
        meta=dict(kind="span", stage=stage))


def _context_trace(spans: list[Span], win: dict, show_legend: bool) -> go.Bar:
    """Other rounds' work in the same time range, faded and clipped to the window, so the
    lanes are not misleadingly empty where e.g. round N-1 is still on the device."""
    t0 = win["t0"]
    base, length = _clip(spans, t0, win["t1"])
    return go.Bar(
        name="other rounds", legendgroup="other rounds", showlegend=show_legend,
        orientation="h", y=[LANE_Y[s.lane] for s in spans], base=base, x=length, width=BAR_WIDTH * 0.7,
        opacity=0.3, text=[f"r{s.round}" for s in spans], textposition="inside",
        insidetextanchor="middle", hovertext=[_hover(s, t0) + "<br><i>outside the window</i>" for s in spans],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=[stage_color(s.stage) for s in spans], line=dict(width=0)),
        meta=dict(kind="context"))


def _idle_trace(gaps: list[tuple[float, float]], t0: float, show_legend: bool) -> go.Bar:
    return go.Bar(
        name="device idle", legendgroup="device idle", showlegend=show_legend,
        orientation="h", y=[LANE_Y["device"]] * len(gaps), base=[a - t0 for a, _ in gaps],
        x=[b - a for a, b in gaps], width=BAR_WIDTH,
        hovertext=[f"<b>device idle</b> {b - a:.3f} ms<br>from {a - t0:.3f} to {b - t0:.3f} ms<br>"
                   f"nothing was queued: the device waited for the host" for a, b in gaps],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=IDLE_COLOR, line=dict(color="rgba(90,90,90,0.8)", width=0.8),
                    pattern=dict(shape=PATTERNS["idle"], fgcolor="rgba(60,60,60,0.7)", size=6)),
        meta=dict(kind="idle"))


def _busy_hover(s: Span) -> str:
    if s.paced_ms is not None:
        return (f"<b>machine busy</b>: PACED {s.stage} r{s.round} ended {late_ms(s):.3f} ms after its time model's "
                f"{s.paced_ms:.3f} ms: its compute ({s.cpu_ms or 0.0:.3f} ms of CPU) did not fit, another process "
                f"held the core")
    return (f"<b>machine busy</b>: {s.stage} r{s.round} took {s.duration_ms:.3f} ms of wall time but got "
            f"{s.cpu_ms:.3f} ms of CPU ({cpu_share(s):.0%}): the {s.lane} process was ready but another process "
            f"held the core")


def _busy_trace(busy: list[tuple[float, float, Span]], t0: float, show_legend: bool) -> go.Bar:
    return go.Bar(
        name="machine busy (preempted)", legendgroup="busy", showlegend=show_legend, orientation="h",
        y=[LANE_Y[s.lane] for _, _, s in busy], base=[a - t0 for a, _, _ in busy], x=[b - a for a, b, _ in busy],
        width=BAR_WIDTH * 1.25,
        hovertext=[_busy_hover(s) for _, _, s in busy],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=BUSY_COLOR, line=dict(color="rgba(0,0,0,0.6)", width=0.8),
                    pattern=dict(shape=PATTERNS["busy"], fgcolor="rgba(0,0,0,0.75)", size=5, solidity=0.35)),
        meta=dict(kind="busy"))


def _traces(win: dict, legend_seen: set | None = None, context: bool = True) -> list[go.Bar]:
    """One horizontal-bar trace per stage (legend = stages), other rounds, device idle, busy.

    Traces are tagged in ``meta["kind"]``: "span" (this window's spans, one trace per
    stage), "context" (other rounds, faded), "idle" (device gaps) and "busy" (device
    or host spans that were preempted: wall time far above CPU time).  ``legend_seen``
    carries the legend entries across the rows of a comparison, so each shows once.
    """
    legend_seen = set() if legend_seen is None else legend_seen
    by_stage: dict[str, list[Span]] = {}
    for s in win["spans"]:
        by_stage.setdefault(s.stage, []).append(s)

    def first_time(group: str) -> bool:
        seen = group in legend_seen
        legend_seen.add(group)
        return not seen

    traces = [_stage_trace(stage, by_stage[stage], win, first_time(stage)) for stage in in_stage_order(by_stage)]
    if context and win["context"]:
        traces.append(_context_trace(win["context"], win, first_time("other rounds")))
    traces.append(_idle_trace(win["gaps"], win["t0"], first_time("device idle")))
    if win["busy"]:
        traces.append(_busy_trace(win["busy"], win["t0"], first_time("busy")))
    return traces


def _annotations(win: dict, xref: str = "x", yref: str = "y") -> list[dict]:
    """Event arrows (sample end -> postprocess/flush start) and a label on each flush."""
    t0, half = win["t0"], BAR_WIDTH / 2
    notes = []
    for sample, proc in win["links"]:
        notes.append(dict(
            x=proc.start_ms - t0, y=LANE_Y["host"] - half, ax=sample.end_ms - t0, ay=LANE_Y["device"] + half,
            xref=xref, yref=yref, axref=xref, ayref=yref, text="", showarrow=True,
            arrowhead=2, arrowsize=1, arrowwidth=1.3, arrowcolor="rgba(40,40,40,0.85)",
            hovertext=(f"round {sample.round}: sample done at {sample.end_ms - t0:.3f} ms, "
                       f"{proc.stage} starts at {proc.start_ms - t0:.3f} ms "
                       f"(+{proc.start_ms - sample.end_ms:.3f} ms)"),
            name=f"event r{sample.round}"))
    for s in win["spans"]:
        if s.lane == "host" and s.stage == "flush":
            notes.append(dict(
                x=(max(s.start_ms, t0) + min(s.end_ms, win["t1"])) / 2 - t0, y=LANE_Y["host"] + half,
                xref=xref, yref=yref, text=f"flush r{s.round}", showarrow=True, arrowhead=0, ax=0, ay=-18,
                font=dict(size=11, color="#8a3b00"), name=f"flush r{s.round}"))
    return notes


def _window_title(win: dict) -> str:
    rounds = f"round {win['first']}" if win["first"] == win["last"] else f"rounds {win['first']}–{win['last']}"
    text = (f"{rounds}: {win['t1'] - win['t0']:.2f} ms · device idle {win['idle_ms']:.2f} ms "
            f"({win['idle_fraction']:.1%})")
    if win["busy_ms"]:
        text += f" · machine busy {win['busy_ms']:.2f} ms"
    return text


def timeline_figure(timeline: Timeline, first_round: int | None = None, num_rounds: int = 3,
                    title: str | None = None, context: bool = True) -> go.Figure:
    """Host and device lanes for rounds ``first_round .. +num_rounds-1``, to scale.

    ``first_round`` defaults to the first steady-state decode round (see
    :func:`~overlap_course.figures.rounds.default_first_round`).  Time is in ms from the
    window's start, the delivery of the round before the first (:func:`rounds.round_window`).
    ``context`` also draws, faded, other rounds' spans that ran inside the window (with ZOS,
    round N-1's wait and postprocess run during round N).
    """
    win = _window(check_timeline(timeline), first_round, num_rounds)
    fig = go.Figure(_traces(win, context=context))
    for note in _annotations(win):
        fig.add_annotation(**note)
    style_lanes(fig)
    fig.update_xaxes(title="time in window (ms)", range=[0, max(win["t1"] - win["t0"], 1e-3)],
                     showticklabels=True)
    apply_layout(fig, f"{heading(timeline, title)}<br><sup>{_window_title(win)}<br>{WINDOW_NOTE}</sup>",
                 height=420)
    fig.update_layout(margin=dict(t=100))
    return fig


def _run_idle(timeline: Timeline, stats: RunStats | None) -> float:
    if stats is not None:
        return stats.decode_device_idle_fraction
    decode = decode_rounds(timeline)
    return timeline.device_idle_fraction(decode) if decode else timeline.device_idle_fraction()


def _checked_runs(runs) -> list[tuple[str, Timeline, RunStats | None]]:
    """(label, timeline, stats) per run: stats given, else the timeline's own (``meta.stats``)."""
    if not isinstance(runs, dict):
        raise TypeError(f"runs must be a dict of label -> Timeline (or (Timeline, stats)), e.g. {{'serial': "
                        f"serial.timeline, 'zos': zos.timeline}}; got {type(runs).__name__}")
    if not runs:
        raise ValueError("compare_figure needs at least one run")
    rows = []
    for label, run in runs.items():
        timeline, stats = run if isinstance(run, tuple) and len(run) == 2 else (run, None)
        check_timeline(timeline, f"runs[{shown(label)}]")
        if stats is not None and not isinstance(stats, RunStats):
            raise TypeError(f"the stats of runs[{shown(label)}] must be a RunStats (engine.stats) or None, got "
                            f"{type(stats).__name__}")
        rows.append((str(label), timeline, stats if stats is not None else timeline.meta.stats))
    return rows


def _recorded_fallback(rows: list[tuple[str, Timeline, RunStats | None]]) -> tuple[str | None, list]:
    """(the busy warning, RECORDED quiet-machine rows) when a live run was busy; else (None, [])."""
    live = {label: tl for label, tl, _ in rows if recording(tl) is None}
    devices = {tl.meta.device for tl in live.values()}
    if not live or all(contention(tl)["busy"] is None for tl in live.values()):
        return None, []
    warning = busy_warning(live, cuda=devices.isdisjoint({"cpu-process", None}))
    if not warning:
        return None, []
    overhead = max(tl.meta.host_overhead_ms for tl in live.values())
    drafts = max(tl.meta.num_draft_tokens for tl in live.values())
    recorded = []
    for mode, tl in recorded_runs(overhead, drafts=drafts).items():
        w = tl.meta.workload
        recorded.append((f"RECORDED {mode} (quiet machine: {recorded_label(tl)}; {w.requests} x "
                         f"{w.max_new_tokens} tokens)", tl, tl.meta.stats))
    return warning, recorded


def _row_title(label: str, win: dict, timeline: Timeline, stats: RunStats | None) -> str:
    parts = [_window_title(win), f"run decode idle {_run_idle(timeline, stats):.1%}"]
    meter = contention(timeline)
    if meter["device_late_fraction"] is not None:
        parts.append(f"PACED device, {meter['device_late_fraction']:.1%} late" + (" (BUSY)" if meter["busy"] else ""))
    elif meter["device_cpu_share"] is not None:
        parts.append(f"device CPU share {meter['device_cpu_share']:.0%}" + (" (BUSY)" if meter["busy"] else ""))
    if stats is not None:
        parts.append(f"{stats.tokens_per_s:.0f} tok/s")
    # the run's name on one line, its numbers on the next: on one line a RECORDED row's
    # title ran past the figure's right edge in the 900-px static image
    return f"<b>{html.escape(label)}</b><br>{' · '.join(parts)}"


def compare_figure(runs: dict, num_rounds: int = 3, first_round: int | None = None,
                   context: bool = True, fallback: bool = True) -> go.Figure:
    """One row per run (label -> Timeline, or label -> (Timeline, stats)), same rounds, same scale.

    Every row shows the same rounds, each from the delivery of the round before them to the
    delivery of their last (:func:`rounds.round_window`), on one shared time axis: equal
    widths are equal time, so the faster run has the shorter window.  Titles give the
    window's length and device idle, the run's decode-phase idle fraction, its device CPU
    share and, when stats are known (given, or the timeline's ``meta.stats``), tokens/s.

    With ``fallback`` (the default), when a live run was busy or fewer than 2 CPUs are
    usable (:func:`overlap_course.measure.machine.busy_warning`), the warning is printed and put in
    the title, and the recorded quiet-machine runs are added as extra rows labelled
    RECORDED with their machine, date and commit.
    """
    rows = _checked_runs(runs)
    warning = None
    if fallback:
        warning, recorded = _recorded_fallback(rows)
        rows += recorded
        if warning:
            print(warning)
    first = common_first_round([tl for _, tl, _ in rows]) if first_round is None else first_round
    wins = [_window(timeline, first, num_rounds) for _, timeline, _ in rows]
    titles = [_row_title(label, win, tl, stats) for (label, tl, stats), win in zip(rows, wins)]
    n = len(wins)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.22 / n)
    seen: set = set()
    for i, win in enumerate(wins, start=1):
        for trace in _traces(win, seen, context=context):
            fig.add_trace(trace, row=i, col=1)
        suffix = "" if i == 1 else str(i)
        for note in _annotations(win, xref=f"x{suffix}", yref=f"y{suffix}"):
            fig.add_annotation(**note)
    style_lanes(fig)
    fig.update_xaxes(range=[0, max(max(w["t1"] - w["t0"] for w in wins), 1e-3)])
    fig.update_xaxes(title="time in window (ms)", row=n, col=1)
    for ann in fig.layout.annotations[:n]:  # subplot titles: left-aligned, smaller
        ann.update(x=0, xanchor="left", align="left", font=dict(size=12))
    title = f"same rounds, same time scale ({num_rounds} rounds from round {first})<br><sup>{WINDOW_NOTE}</sup>"
    if warning:
        title = ("<b>machine busy: live timings are not trustworthy; RECORDED quiet-machine rows below</b><br>"
                 + title)
    apply_layout(fig, title, height=170 + 230 * n)
    fig.update_layout(margin=dict(t=120 if warning else 100), meta=dict(view="scale", busy_warning=warning))
    return fig
