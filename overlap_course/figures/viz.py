"""Pictures of engine timelines, for the course notebooks.

The question every figure answers is the course's: *while the device works on round N,
what is the host doing, and is the device ever left waiting?*  Two views answer it from
the same recorded spans:

* the **to-scale view** (:func:`timeline_figure`, :func:`compare_figure`): a window of
  rounds on two lanes, ``host`` above ``device``, one bar per span at its real time,
  device idle gaps hatched, stretches where the device was *preempted* (the machine was
  busy: wall time far above CPU time) hatched differently, and an arrow from each round's
  ``sample`` end (its completion event) to the host's processing of that round;
* the **order view** (:func:`order_figure`): the same spans with time replaced by order.
  On the CPU stand-in a decode forward takes ~3 ms and a launch ~0.02 ms, so to scale the
  host's control work is a sliver; in the order view every stage is a labelled block of
  readable width, placed in the order it really started, and the loop's passes are the
  columns.  It is computed from the spans, never drawn by hand.

A window of rounds ``a..b`` runs from the moment round a-1's tokens reached the requests
to the moment round b's did (:meth:`Timeline.round_window`), in every run, so that in a
comparison equal widths mean equal time and the run with more tokens per second draws the
shorter window.  (Windows anchored elsewhere charged ZOS a forward of the round before, or
its one-round deferral, and made the faster run look slower: the measurements are in
docs/measurements/engine.md.)

Colours are the Okabe-Ito set (readable with the common colour-vision deficiencies),
and the three things that must never be told apart by colour alone carry patterns:
device idle ``x``, machine busy ``\\``, flush ``/``.

The figures only read a :class:`~toy_engine.timeline.Timeline`, so they work the same for
a run recorded a second ago, a trace loaded from JSON (:func:`load_trace`), or a hand-made
timeline.  :class:`TimelineExplorer` wraps a live engine in widgets.

plotly (and ipywidgets for the explorer) are course extras, so ``toy_engine`` itself
never imports this module.
"""

from __future__ import annotations

import html
import re
import warnings
import zlib
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from overlap_course.traces.recorded import TRACES_DIR, recorded_label, recorded_runs, trace_name
from overlap_course.figures.config import configure_renderers, plotly_config
from overlap_course.measure.contention import busy_stretches, contention, cpu_shares, preempted
from overlap_course.measure.machine import busy_warning
from toy_engine.timeline import PROCESS_STAGES, Span, Timeline
from toy_engine.validate import check_int, shown

__all__ = ["STAGE_COLORS", "timeline_figure", "compare_figure", "order_figure", "issued_order",
           "save_html", "load_trace", "available_traces", "default_first_round", "TimelineExplorer"]

#: Fixed stage colours (Okabe-Ito, plus lighter tints of it).  Host control work is
#: green, launches yellow, waiting pale grey, result processing orange / vermillion,
#: deliberate overhead reddish purple; device work blue.
STAGE_COLORS = {
    # host
    "schedule": "#a6dcc9",
    "overhead": "#cc79a7",
    "prepare": "#009e73",
    "launch_forward": "#f0e442",
    "launch_sample": "#f6efa0",
    "wait": "#e3e3e3",
    "postprocess": "#e69f00",
    "flush": "#d55e00",
    # device
    "upload": "#56b4e9",
    "correct": "#a4d3f0",
    "draft": "#7a9cc6",
    "forward": "#0072b2",
    "sample": "#00406a",
}
IDLE_COLOR = "rgba(255, 255, 255, 0.0)"
BUSY_COLOR = "rgba(0, 0, 0, 0.18)"
#: Patterns, so that idle, machine-busy and flush never depend on colour alone.
PATTERNS = {"idle": "x", "busy": "\\", "flush": "/"}
#: Unknown stages get one of these, chosen by a stable hash of the name.
_FALLBACK_COLORS = ("#999999", "#882255", "#44aa99", "#ddcc77", "#117733", "#aa4499")
_STAGE_ORDER = list(STAGE_COLORS)
_LANE_Y = {"device": 0, "host": 1}  # numeric rows, so arrows can use data coordinates
_BAR_WIDTH = 0.6


def _use_data_only_renderer() -> None:
    """In a notebook, send figures as plotly JSON only.

    Plotly's notebook default also embeds plotly.js (~5 MB) into every notebook that
    shows a figure.  JupyterLab renders the JSON through the jupyterlab-plotly
    extension that ships with plotly, so the course's notebooks stay small.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    if get_ipython() is not None and "IPKernelApp" in get_ipython().config:
        pio.renderers.default = "plotly_mimetype"


_use_data_only_renderer()
configure_renderers()  # no cloud-share button in any figure (figure_config.py)


def stage_color(stage: str) -> str:
    """The stage's fixed colour; an unknown stage gets a stable fallback colour."""
    return STAGE_COLORS.get(stage) or _FALLBACK_COLORS[zlib.crc32(stage.encode()) % len(_FALLBACK_COLORS)]


# ---------------------------------------------------------------------------- windows

def _check_timeline(value, name: str = "timeline") -> Timeline:
    if not isinstance(value, Timeline):
        raise TypeError(f"{name} must be a Timeline (engine.timeline, or viz.load_trace(name)), got "
                        f"{type(value).__name__}")
    return value


def decode_rounds(timeline: Timeline) -> list[int]:
    """Rounds that ran a forward and are not prefill rounds (``meta["prefill_rounds"]``)."""
    prefill = set(timeline.meta.get("prefill_rounds", ()))
    return sorted({s.round for s in timeline.spans if s.stage == "forward"} - prefill)


def default_first_round(timeline: Timeline) -> int:
    """First decode round whose previous round is a decode round too.

    That is the first *steady-state* round: prefill and the first decode round still
    look like start-up (cold caches, no deferred step to overlap with).
    """
    decode = decode_rounds(timeline)
    decode_set = set(decode)
    steady = [r for r in decode if r - 1 in decode_set]
    if steady:
        return steady[0]
    rounds = timeline.rounds()
    return 0 if not rounds or 0 in rounds else rounds[0]


def window_spans(timeline: Timeline, first_round: int, num_rounds: int) -> list[Span]:
    """Spans *owned* by rounds ``first_round .. first_round+num_rounds-1``.

    Selection is by round, not time: a round's deferred postprocess (or flush) belongs
    to the window even though it ran during a later round.
    """
    wanted = range(first_round, first_round + num_rounds)
    return sorted((s for s in timeline.spans if s.round in wanted), key=lambda s: (s.start_ms, s.end_ms))


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

    The time range is :meth:`Timeline.round_window`: from the delivery of the round before
    the first to the delivery of the last.  Spans of the window's rounds are drawn clipped
    to it (under ZOS the first round's forward began before the round before it was
    delivered).  Idle gaps and machine-busy stretches are the timeline's, clipped to the range.
    """
    num_rounds = check_int("num_rounds", num_rounds, 1)
    first = default_first_round(timeline) if first_round is None else check_int("first_round", first_round, 0)
    last = first + num_rounds - 1
    owned = window_spans(timeline, first, num_rounds)
    if owned:
        t0, t1 = timeline.round_window(first, last)
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


def _cpu_text(span: Span) -> str:
    share = span.cpu_share
    if share is None:
        return "CPU share not measured"
    text = f"CPU {span.cpu_ms:.3f} ms = {share:.0%} of wall"
    if preempted(span):
        text += " — <b>preempted: the machine was busy</b>"
    elif span.lane == "host" and span.stage == "wait":
        text += " (blocked on the event: low CPU is expected)"
    return text


def _hover(span: Span, t0: float, clipped: bool = False) -> str:
    text = (f"<b>{html.escape(span.stage)}</b> ({span.lane}) · round {span.round}<br>"
            f"start {span.start_ms - t0:.3f} ms · end {span.end_ms - t0:.3f} ms<br>"
            f"duration {span.duration_ms:.3f} ms · {_cpu_text(span)}")
    if span.owner:
        text += f"<br>owner {html.escape(span.owner)}"
    if clipped:
        text += "<br><i>drawn clipped to the window</i>"
    return text


def _clip(spans: list[Span], t0: float, t1: float) -> tuple[list[float], list[float]]:
    starts = [max(s.start_ms, t0) for s in spans]
    return [a - t0 for a in starts], [max(0.0, min(s.end_ms, t1) - a) for s, a in zip(spans, starts)]


def _traces(win: dict, legend_seen: set | None = None, context: bool = True) -> list[go.Bar]:
    """One horizontal-bar trace per stage (legend = stages), other rounds, device idle, busy.

    Traces are tagged in ``meta["kind"]``: "span" (this window's spans, one trace per
    stage), "context" (other rounds, faded), "idle" (device gaps) and "busy" (device
    or host spans that were preempted: wall time far above CPU time).
    """
    legend_seen = set() if legend_seen is None else legend_seen
    t0, t1 = win["t0"], win["t1"]
    by_stage: dict[str, list[Span]] = {}
    for s in win["spans"]:
        by_stage.setdefault(s.stage, []).append(s)
    order = sorted(by_stage, key=lambda st: (_STAGE_ORDER.index(st) if st in STAGE_COLORS else len(_STAGE_ORDER), st))
    traces = []
    for stage in order:
        spans = by_stage[stage]
        base, length = _clip(spans, t0, t1)
        traces.append(go.Bar(
            name=stage, legendgroup=stage, showlegend=stage not in legend_seen, orientation="h",
            y=[_LANE_Y[s.lane] for s in spans], base=base, x=length, width=_BAR_WIDTH,
            text=[f"r{s.round}" for s in spans], textposition="inside", insidetextanchor="middle",
            hovertext=[_hover(s, t0, s.start_ms < t0 or s.end_ms > t1) for s in spans],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=stage_color(stage), line=dict(color="rgba(0,0,0,0.45)", width=0.6),
                        pattern=dict(shape=PATTERNS["flush"] if stage == "flush" else "",
                                     fgcolor="rgba(255,255,255,0.8)", size=6)),
            meta=dict(kind="span", stage=stage)))
        legend_seen.add(stage)
    if context and win["context"]:
        spans = win["context"]
        # Other rounds' work in the same time range, faded and clipped to the window, so
        # the lanes are not misleadingly empty where e.g. round N-1 is still on the device.
        base, length = _clip(spans, t0, t1)
        traces.append(go.Bar(
            name="other rounds", legendgroup="other rounds", showlegend="other rounds" not in legend_seen,
            orientation="h", y=[_LANE_Y[s.lane] for s in spans], base=base, x=length, width=_BAR_WIDTH * 0.7,
            opacity=0.3, text=[f"r{s.round}" for s in spans], textposition="inside",
            insidetextanchor="middle", hovertext=[_hover(s, t0) + "<br><i>outside the window</i>" for s in spans],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=[stage_color(s.stage) for s in spans], line=dict(width=0)),
            meta=dict(kind="context")))
        legend_seen.add("other rounds")
    gaps = win["gaps"]
    traces.append(go.Bar(
        name="device idle", legendgroup="device idle", showlegend="device idle" not in legend_seen,
        orientation="h", y=[_LANE_Y["device"]] * len(gaps), base=[a - t0 for a, _ in gaps],
        x=[b - a for a, b in gaps], width=_BAR_WIDTH,
        hovertext=[f"<b>device idle</b> {b - a:.3f} ms<br>from {a - t0:.3f} to {b - t0:.3f} ms<br>"
                   f"nothing was queued: the device waited for the host" for a, b in gaps],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=IDLE_COLOR, line=dict(color="rgba(90,90,90,0.8)", width=0.8),
                    pattern=dict(shape=PATTERNS["idle"], fgcolor="rgba(60,60,60,0.7)", size=6)),
        meta=dict(kind="idle")))
    legend_seen.add("device idle")
    busy = win["busy"]
    if busy:
        traces.append(go.Bar(
            name="machine busy (preempted)", legendgroup="busy",
            showlegend="busy" not in legend_seen, orientation="h",
            y=[_LANE_Y[s.lane] for _, _, s in busy], base=[a - t0 for a, _, _ in busy], x=[b - a for a, b, _ in busy],
            width=_BAR_WIDTH * 1.25,
            hovertext=[f"<b>machine busy</b>: {s.stage} r{s.round} took {s.duration_ms:.3f} ms of wall time "
                       f"but got {s.cpu_ms:.3f} ms of CPU ({s.cpu_share:.0%}): the {s.lane} process was ready "
                       f"but another process held the core" for _, _, s in busy],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=BUSY_COLOR, line=dict(color="rgba(0,0,0,0.6)", width=0.8),
                        pattern=dict(shape=PATTERNS["busy"], fgcolor="rgba(0,0,0,0.75)", size=5, solidity=0.35)),
            meta=dict(kind="busy")))
        legend_seen.add("busy")
    return traces


def _annotations(win: dict, xref: str = "x", yref: str = "y") -> list[dict]:
    """Event arrows (sample end -> postprocess/flush start) and a label on each flush."""
    t0, half = win["t0"], _BAR_WIDTH / 2
    notes = []
    for sample, proc in win["links"]:
        notes.append(dict(
            x=proc.start_ms - t0, y=_LANE_Y["host"] - half, ax=sample.end_ms - t0, ay=_LANE_Y["device"] + half,
            xref=xref, yref=yref, axref=xref, ayref=yref, text="", showarrow=True,
            arrowhead=2, arrowsize=1, arrowwidth=1.3, arrowcolor="rgba(40,40,40,0.85)",
            hovertext=(f"round {sample.round}: sample done at {sample.end_ms - t0:.3f} ms, "
                       f"{proc.stage} starts at {proc.start_ms - t0:.3f} ms "
                       f"(+{proc.start_ms - sample.end_ms:.3f} ms)"),
            name=f"event r{sample.round}"))
    for s in win["spans"]:
        if s.lane == "host" and s.stage == "flush":
            notes.append(dict(
                x=(max(s.start_ms, t0) + min(s.end_ms, win["t1"])) / 2 - t0, y=_LANE_Y["host"] + half,
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


_WINDOW_NOTE = "window: the round before delivered (its postprocess ends) → the last round delivered"


def _style_lanes(fig: go.Figure, **axis) -> None:
    fig.update_yaxes(tickvals=[_LANE_Y["device"], _LANE_Y["host"]], ticktext=["device", "host"],
                     range=[-0.6, 1.75], fixedrange=True, zeroline=False, showgrid=False, **axis)


def _layout(fig: go.Figure, title: str, height: int) -> None:
    fig.update_layout(
        title=dict(text=title, x=0.01), barmode="overlay", height=height, template="plotly_white",
        uniformtext=dict(minsize=8, mode="hide"),  # "r5" only where the bar is wide enough
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, traceorder="normal"),
        hovermode="closest", margin=dict(l=60, r=20, t=80, b=40), meta=dict(view="scale"))


def timeline_figure(timeline: Timeline, first_round: int | None = None, num_rounds: int = 3,
                    title: str | None = None, context: bool = True) -> go.Figure:
    """Host and device lanes for rounds ``first_round .. +num_rounds-1``, to scale.

    ``first_round`` defaults to the first steady-state decode round (see
    :func:`default_first_round`).  Time is in ms from the window's start, the first
    device work of ``first_round`` (:meth:`Timeline.round_window`).  ``context`` also
    draws, faded, other rounds' spans that ran inside the window (with ZOS, round N-1's
    wait and postprocess run during round N).
    """
    win = _window(_check_timeline(timeline), first_round, num_rounds)
    fig = go.Figure(_traces(win, context=context))
    for note in _annotations(win):
        fig.add_annotation(**note)
    _style_lanes(fig)
    fig.update_xaxes(title="time in window (ms)", range=[0, max(win["t1"] - win["t0"], 1e-3)],
                     showticklabels=True)
    mode = timeline.meta.get("mode")
    head = title or " · ".join(x for x in (mode and f"{mode}", timeline.meta.get("device")) if x) or "timeline"
    _layout(fig, f"{head}<br><sup>{_window_title(win)}<br>{_WINDOW_NOTE}</sup>", height=420)
    fig.update_layout(margin=dict(t=100))
    return fig


def _run_idle(timeline: Timeline, stats: dict | None) -> float:
    if stats and "decode_device_idle_fraction" in stats:
        return stats["decode_device_idle_fraction"]
    decode = decode_rounds(timeline)
    return timeline.device_idle_fraction(decode) if decode else timeline.device_idle_fraction()


def _common_first_round(timelines: list[Timeline]) -> int:
    """The first round that is steady state in every run (so all rows show the same rounds)."""
    return max(default_first_round(tl) for tl in timelines)


def compare_figure(runs: dict, num_rounds: int = 3, first_round: int | None = None,
                   context: bool = True, fallback: bool = True) -> go.Figure:
    """One row per run (label -> Timeline, or label -> (Timeline, stats)), same rounds, same scale.

    Every row shows the same rounds, each from the delivery of the round before them to the
    delivery of their last (:meth:`Timeline.round_window`), on one shared time axis: equal widths are equal time, so the faster run
    has the shorter window.  Titles give the window's length and device idle, the run's
    decode-phase idle fraction, its device CPU share and, when stats are known (given,
    or ``meta["stats"]`` of a recorded trace), tokens/s.

    With ``fallback`` (the default), when a live run was busy or fewer than 2 CPUs are
    usable (:func:`overlap_course.measure.machine.busy_warning`), the warning is printed and put in
    the title, and the recorded quiet-machine runs are added as extra rows labelled
    RECORDED with their machine, date and commit.
    """
    if not isinstance(runs, dict):
        raise TypeError(f"runs must be a dict of label -> Timeline (or (Timeline, stats)), e.g. {{'serial': "
                        f"serial.timeline, 'zos': zos.timeline}}; got {type(runs).__name__}")
    if not runs:
        raise ValueError("compare_figure needs at least one run")
    rows = []
    for label, run in runs.items():
        timeline, stats = run if isinstance(run, tuple) and len(run) == 2 else (run, None)
        _check_timeline(timeline, f"runs[{shown(label)}]")
        if stats is not None and not isinstance(stats, dict):
            raise TypeError(f"the stats of runs[{shown(label)}] must be a dict (engine.stats) or None, got "
                            f"{type(stats).__name__}")
        stats = stats if stats is not None else timeline.meta.get("stats")
        rows.append((str(label), timeline, stats))
    warning = None
    if fallback:
        live = {label: tl for label, tl, _ in rows if "recorded" not in tl.meta}
        devices = {tl.meta.get("device") for tl in live.values()}
        if live and any(cpu_shares(tl)["device_cpu_share"] is not None for tl in live.values()):
            warning = busy_warning(live, cuda=devices.isdisjoint({"cpu-process", None}))
        if warning:
            overhead = max(tl.meta.get("host_overhead_ms", 0.0) for tl in live.values())
            drafts = max(tl.meta.get("num_draft_tokens", 0) or 0 for tl in live.values())
            for mode, tl in recorded_runs(overhead, drafts=drafts).items():
                w = tl.meta.get("recorded", {}).get("workload", {})
                rows.append((f"RECORDED {mode} (quiet machine: {recorded_label(tl)}; {w.get('requests', '?')} x "
                             f"{w.get('max_new_tokens', '?')} tokens)", tl, tl.meta.get("stats")))
            print(warning)
    first = _common_first_round([tl for _, tl, _ in rows]) if first_round is None else first_round
    wins, titles = [], []
    for label, timeline, stats in rows:
        win = _window(timeline, first, num_rounds)
        parts = [f"<b>{html.escape(label)}</b>", _window_title(win),
                 f"run decode idle {_run_idle(timeline, stats):.1%}"]
        share = cpu_shares(timeline)["device_cpu_share"]
        if share is not None:
            parts.append(f"device CPU share {share:.0%}" + (" (BUSY)" if contention(timeline)["busy"] else ""))
        if stats and "tokens_per_s" in stats:
            parts.append(f"{stats['tokens_per_s']:.0f} tok/s")
        wins.append(win)
        # the run's name on one line, its numbers on the next: on one line a RECORDED row's
        # title ran past the figure's right edge in the 900-px static image
        titles.append(f"{parts[0]}<br>{' · '.join(parts[1:])}")
    n = len(wins)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.22 / n)
    seen: set = set()
    for i, win in enumerate(wins, start=1):
        for trace in _traces(win, seen, context=context):
            fig.add_trace(trace, row=i, col=1)
        suffix = "" if i == 1 else str(i)
        for note in _annotations(win, xref=f"x{suffix}", yref=f"y{suffix}"):
            fig.add_annotation(**note)
    _style_lanes(fig)
    widest = max(w["t1"] - w["t0"] for w in wins)
    fig.update_xaxes(range=[0, max(widest, 1e-3)])
    fig.update_xaxes(title="time in window (ms)", row=n, col=1)
    for ann in fig.layout.annotations[:n]:  # subplot titles: left-aligned, smaller
        ann.update(x=0, xanchor="left", align="left", font=dict(size=12))
    title = f"same rounds, same time scale ({num_rounds} rounds from round {first})<br><sup>{_WINDOW_NOTE}</sup>"
    if warning:
        title = ("<b>machine busy: live timings are not trustworthy; RECORDED quiet-machine rows below</b><br>"
                 + title)
    _layout(fig, title, height=170 + 230 * n)
    fig.update_layout(margin=dict(t=120 if warning else 100), meta=dict(view="scale", busy_warning=warning))
    return fig


# ---------------------------------------------------------------------------- order view

#: How each stage reads in the order view (block label, and what it does to its round).
_ORDER_LABELS = {
    "schedule": ("schedule", "plans round {r}"),
    "overhead": ("overhead", "extra host work of round {r} (teaching knob)"),
    "prepare": ("prepare", "writes round {r}'s metadata and launches its upload"),
    "launch_forward": ("launch fwd", "launches round {r}'s forward"),
    "launch_sample": ("launch sample", "launches round {r}'s sample; creates StepState(round={r})"),
    "wait": ("wait", "waits for round {r}'s sample event"),
    "postprocess": ("postprocess", "consumes round {r}'s results and commits them to the requests"),
    "flush": ("FLUSH", "consumes round {r}'s results: no next round is left to hide it under"),
    "upload": ("upload", "copies round {r}'s metadata to the device"),
    "correct": ("correct", "fixes round {r}'s stale lengths on the device"),
    "draft": ("draft", "proposes round {r}'s draft tokens"),
    "forward": ("forward", "runs round {r}'s forward"),
    "sample": ("sample", "samples round {r}'s tokens into its output slot"),
}
#: What the learner writes in exercise 03(b), and the host stage it names.
_ISSUED = {"launch_forward": "forward", "launch_sample": "sample", "postprocess": "postprocess", "flush": "flush"}
_ORDER_GAP = 0.8  # empty slots between two columns
_ORDER_Y = {"device": 0, "host": 1, "written": 2.15}


def _passes(timeline: Timeline) -> list[dict]:
    """The host loop's passes, in order: each pass starts at a ``schedule`` span.

    A pass's ``launches`` is the round it prepares/launches (None for a pass that only
    processes, e.g. the final flush); its device spans are those of that round.  A
    timeline without schedule spans falls back to one pass per round.
    """
    host = timeline.lane("host")
    passes: list[dict] = []
    for s in host:
        if s.stage == "schedule" or not passes:
            passes.append(dict(host=[], launches=None, rounds=set()))
        passes[-1]["host"].append(s)
    if not any(s.stage == "schedule" for s in host):
        passes = [dict(host=[s for s in host if s.round == r], launches=None, rounds=set())
                  for r in sorted({s.round for s in host})]
    for p in passes:
        launched = [s.round for s in p["host"] if s.stage in ("prepare", "launch_forward", "launch_sample")]
        if launched:
            p["launches"] = launched[0]
        elif not any(s.stage == "schedule" for s in host):
            p["launches"] = p["host"][0].round
        p["rounds"] = {s.round for s in p["host"]}
    by_round = {p["launches"]: p for p in passes if p["launches"] is not None}
    for p in passes:
        p["device"] = []
    for s in timeline.lane("device"):
        if s.round in by_round:
            by_round[s.round]["device"].append(s)
    return passes


def _order_layout(timeline: Timeline, first: int, num_rounds: int) -> dict:
    """Blocks of the order view: every span of the shown passes at its order position.

    Within a column (a pass) the spans are ranked by start time over both lanes: a
    block starts at its rank and ends at the number of spans that started before it
    ended (at least one slot).  So a device forward covers exactly the host blocks that
    started while it ran, and reading left to right is the real order.
    """
    wanted = set(range(first, first + num_rounds))
    passes = [p for p in _passes(timeline)
              if p["launches"] in wanted or any(s.round in wanted for s in p["host"])]
    if not passes:
        raise ValueError(f"no host or device spans for rounds {first}..{first + num_rounds - 1}; "
                         f"this timeline has rounds {timeline.rounds()[:1]}..{timeline.rounds()[-1:]}")
    prefill = set(timeline.meta.get("prefill_rounds", ()))
    blocks, columns, offset = [], [], 0.0
    for p in passes:
        spans = sorted(p["host"] + p["device"], key=lambda s: (s.start_ms, s.lane != "host", s.end_ms))
        starts = [s.start_ms for s in spans]
        for k, s in enumerate(spans):
            ended = sum(1 for t in starts if t < s.end_ms)
            x0, x1 = offset + k, offset + max(k + 1, ended)
            blocks.append(dict(span=s, x0=x0, x1=x1, in_window=s.round in wanted, column=len(columns)))
        r = p["launches"]
        if r is None:
            head = "end: nothing<br>left to launch"
        else:
            head = f"round {r}" + (" · prefill" if r in prefill else "")
        columns.append(dict(x0=offset, x1=offset + len(spans), head=head, launches=r,
                            prefill=r in prefill))
        offset += len(spans) + _ORDER_GAP
    return dict(first=first, last=first + num_rounds - 1, blocks=blocks, columns=columns, width=offset - _ORDER_GAP)


_HEAD_FONT = 12
_HEAD_EM = 0.62      # a bold character's width in em, generous (the column heads are short)
_PLOT_PX = 900 - 90  # the static image's width less the order view's margins: the narrowest drawn


def _order_range(columns: list[dict], width: float) -> list[float]:
    """The x range: every block, plus room for the first and last column heads to end inside
    the figure (a head wider than its column would otherwise run over the edge)."""
    lo, hi = -0.6, width + 0.6
    for _ in range(3):  # the room a head needs in slots depends on the range: settle it
        per_px = (hi - lo) / _PLOT_PX
        halves = [max(len(line) for line in re.sub(r"</?b>", "", c["head"]).split("<br>")) * _HEAD_EM * _HEAD_FONT / 2
                  * per_px for c in columns]
        centre = [(c["x0"] + c["x1"]) / 2 for c in columns]
        lo = min(-0.6, min(c - h for c, h in zip(centre, halves)) - 0.2)
        hi = max(width + 0.6, max(c + h for c, h in zip(centre, halves)) + 0.2)
    return [lo, hi]


def _order_title(lay: dict) -> tuple[str, str]:
    """(the rounds asked for, plus any pass drawn beside them; what the faded blocks are)."""
    first, last = lay["first"], lay["last"]
    rounds = f"rounds {first}–{last}" if last > first else f"round {first}"
    notes = []
    for i, c in enumerate(lay["columns"]):
        if c["launches"] is None or first <= c["launches"] <= last:
            continue
        done = sorted({b["span"].round for b in lay["blocks"]
                       if b["column"] == i and b["in_window"] and b["span"].lane == "host"})
        rounds += f" + round {c['launches']}'s pass"
        if done:
            notes.append(f"round {c['launches']}'s pass is drawn because it processes round "
                         f"{', '.join(str(r) for r in done)}")
    if any(not b["in_window"] for b in lay["blocks"]):
        notes.append("faded: other rounds' work in the same passes")
    return rounds, "; ".join(notes)


def issued_order(timeline: Timeline, rounds=None) -> list[tuple[str, int]]:
    """What the host issued, as exercise 03(b) writes it: ``("forward", 1), ("sample", 1), ...``.

    ``forward``/``sample`` are the launches, ``postprocess``/``flush`` the processing,
    in the recorded order; ``rounds`` (default: all) keeps only those rounds.
    """
    keep = None if rounds is None else set(rounds)
    return [(_ISSUED[s.stage], s.round) for s in _check_timeline(timeline).lane("host")
            if s.stage in _ISSUED and (keep is None or s.round in keep)]


def _order_hover(block: dict, column: dict) -> str:
    s = block["span"]
    label, does = _ORDER_LABELS.get(s.stage, (s.stage, "works for round {r}"))
    where = (f"in the loop pass that launches round {column['launches']}" if column["launches"] is not None
             else "in the last loop pass (nothing left to launch)")
    owner = s.owner or ("StepState(round={})".format(s.round) if s.stage in ("sample", "launch_sample") else "—")
    text = (f"<b>{html.escape(s.stage)}</b> ({s.lane}) · round {s.round}<br>{does.format(r=s.round)}<br>"
            f"result owner: {html.escape(owner)}<br>{where}<br>"
            f"duration {s.duration_ms:.3f} ms · {_cpu_text(s)}")
    if not block["in_window"]:
        text += "<br><i>another round's work in the same pass</i>"
    return text


def order_figure(timeline: Timeline, first_round: int | None = None, num_rounds: int = 3,
                 title: str | None = None, written=None) -> go.Figure:
    """The order view: rounds ``first_round..+num_rounds-1`` as readable blocks in real order.

    Columns are the host loop's passes (the pass that launches round N is headed
    "round N"; prefill rounds and the final flush pass are marked); host blocks above,
    device blocks below, each labelled with its stage and the round it works for, in
    the order they started.  Arrows run from each round's sample (its completion event)
    to the host block that consumes it; the flush is vermillion, hatched and capitalised.
    Hover says which round a block consumes and who owns the result.  Blocks of other
    rounds that share the passes are faded.

    ``written``: a learner's list of ``(stage, round)`` as in exercise 03(b); it is drawn
    in a row above the host, item *i* under the engine's *i*-th issued step, and the
    first place it differs is outlined and named.
    """
    num_rounds = check_int("num_rounds", num_rounds, 1)
    _check_timeline(timeline)
    first = default_first_round(timeline) if first_round is None else check_int("first_round", first_round, 0)
    lay = _order_layout(timeline, first, num_rounds)
    columns = lay["columns"]
    traces = []
    by_stage: dict[str, list[dict]] = {}
    for b in lay["blocks"]:
        by_stage.setdefault(b["span"].stage, []).append(b)
    order = sorted(by_stage, key=lambda st: (_STAGE_ORDER.index(st) if st in STAGE_COLORS else len(_STAGE_ORDER), st))
    for stage in order:
        blocks = by_stage[stage]
        label = _ORDER_LABELS.get(stage, (stage, ""))[0]
        traces.append(go.Bar(
            name=stage, legendgroup=stage, orientation="h",
            y=[_ORDER_Y[b["span"].lane] for b in blocks], base=[b["x0"] + 0.04 for b in blocks],
            x=[b["x1"] - b["x0"] - 0.08 for b in blocks], width=0.78,
            text=[f"{label} r{b['span'].round}" for b in blocks], textposition="inside",
            insidetextanchor="middle", textangle=-90, textfont=dict(size=11),
            hovertext=[_order_hover(b, columns[b["column"]]) for b in blocks],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=stage_color(stage),
                        opacity=[1.0 if b["in_window"] else 0.3 for b in blocks],
                        line=dict(color=["#5a2000" if stage == "flush" else "rgba(0,0,0,0.5)" for b in blocks],
                                  width=[2.5 if stage == "flush" else 0.8 for b in blocks]),
                        pattern=dict(shape=[PATTERNS["flush"] if stage == "flush"
                                            else PATTERNS["busy"] if preempted(b["span"]) else ""
                                            for b in blocks],
                                     fgcolor="rgba(255,255,255,0.85)" if stage == "flush" else "rgba(0,0,0,0.6)",
                                     size=7)),
            meta=dict(kind="order", stage=stage,
                      spans=[[b["span"].lane, b["span"].stage, b["span"].round] for b in blocks])))
    notes, shapes = [], []
    for c in columns:
        notes.append(dict(x=(c["x0"] + c["x1"]) / 2, y=1.62, xref="x", yref="y", text=f"<b>{c['head']}</b>",
                          showarrow=False, font=dict(size=_HEAD_FONT,
                                                     color="#8a3b00" if c["launches"] is None else "#222")))
        shapes.append(dict(type="rect", x0=c["x0"] - 0.3, x1=c["x1"] + 0.3, y0=-0.5, y1=1.5, xref="x", yref="y",
                           line=dict(color="rgba(0,0,0,0.25)", width=1, dash="dot"),
                           fillcolor="rgba(86,180,233,0.08)" if c["prefill"] else "rgba(0,0,0,0)", layer="below"))
    samples = {b["span"].round: b for b in lay["blocks"]
               if b["span"].lane == "device" and b["span"].stage == "sample"}
    for b in lay["blocks"]:
        s = b["span"]
        if s.lane == "host" and s.stage in PROCESS_STAGES and s.round in samples and b["in_window"]:
            src = samples[s.round]
            notes.append(dict(
                x=b["x0"] + 0.1, y=_ORDER_Y["host"] - 0.39, ax=src["x1"] - 0.1, ay=_ORDER_Y["device"] + 0.39,
                xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True, arrowhead=2, arrowsize=1.1,
                arrowwidth=1.6, arrowcolor="rgba(30,30,30,0.9)", name=f"event r{s.round}",
                hovertext=f"round {s.round}'s sample event: the device finished it, so the host's {s.stage} may read "
                          f"its output slot (StepState(round={s.round}))"))
    height = 560
    yrange = [-0.6, 1.85]
    if written is not None:
        traces += _written_traces(written, timeline, lay)
        yrange = [-0.6, 2.75]
        height = 680
    fig = go.Figure(traces)
    for note in notes:
        fig.add_annotation(**note)
    for shape in shapes:
        fig.add_shape(**shape)
    ticks = [_ORDER_Y["device"], _ORDER_Y["host"]] + ([_ORDER_Y["written"]] if written is not None else [])
    fig.update_yaxes(tickvals=ticks, ticktext=["device", "host", "you wrote"][:len(ticks)], range=yrange,
                     fixedrange=True, zeroline=False, showgrid=False)
    fig.update_xaxes(title="order, not time: a block spans those that started while it ran; widths are not "
                           "durations (hover: times)",
                     showticklabels=False, showgrid=False, zeroline=False,
                     range=_order_range(columns, lay["width"]))
    mode = timeline.meta.get("mode")
    head = title or " · ".join(x for x in (mode and f"{mode}", timeline.meta.get("device")) if x) or "timeline"
    rounds, faded = _order_title(lay)
    _layout(fig, f"{head} · order view, {rounds}<br><sup>columns: loop passes; blocks in the order they started; "
                 f"arrows: sample event → the host's processing of that round"
                 + (f"<br>{faded}" if faded else "") + "</sup>", height=height)
    fig.update_layout(showlegend=False, bargap=0, uniformtext=dict(minsize=7, mode="show"),
                      margin=dict(l=70, r=20, t=90, b=50), meta=dict(view="order"))
    return fig


def _written_traces(written, timeline: Timeline, lay: dict) -> list[go.Bar]:
    """The learner's order, item i under the engine's i-th issued step; the first difference outlined."""
    # A learner's list may hold anything: keep (stage, round) pairs, show the rest as written.
    written = [tuple(x) if isinstance(x, (tuple, list)) and len(x) == 2 else (repr(x), "?") for x in written]
    rounds = range(lay["first"], lay["last"] + 1)
    engine = issued_order(timeline, rounds)
    slots = {}  # i -> where the engine's i-th issued step is drawn
    for b in lay["blocks"]:
        s = b["span"]
        if s.lane == "host" and s.stage in _ISSUED and s.round in rounds:
            slots[len(slots)] = (b["x0"], b["x1"])
    end = lay["width"]
    first_diff = next((i for i, (w, e) in enumerate(zip(written, engine)) if w != e),
                      None if len(written) == len(engine) else min(len(written), len(engine)))
    xs, ws, texts, hovers, colors, lines = [], [], [], [], [], []
    for i, item in enumerate(written):
        x0, x1 = slots.get(i, (end + 0.2 + (i - len(slots)), end + 1.0 + (i - len(slots))))
        stage = item[0] if isinstance(item[0], str) else repr(item[0])
        host_stage = {v: k for k, v in _ISSUED.items()}.get(stage, stage)
        did = engine[i] if i < len(engine) else None
        same = did == item
        xs.append(x0 + 0.04)
        ws.append(max(x1 - x0 - 0.08, 0.6))
        texts.append(f"{stage} r{item[1]}")
        hovers.append(f"you wrote <b>{html.escape(str(item))}</b><br>the engine did "
                      f"<b>{html.escape(str(did)) if did else 'nothing more'}</b>" +
                      ("" if same else "<br><b>first difference</b>" if i == first_diff else "<br>differs"))
        colors.append(stage_color(host_stage))
        lines.append((3.5, "#000000") if i == first_diff else (0.8, "rgba(0,0,0,0.5)"))
    return [go.Bar(
        name="you wrote", orientation="h", y=[_ORDER_Y["written"]] * len(written), base=xs, x=ws, width=0.6,
        text=texts, textposition="inside", insidetextanchor="middle", textangle=-90, textfont=dict(size=11),
        hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=colors, line=dict(width=[w for w, _ in lines], color=[c for _, c in lines]),
                    pattern=dict(shape=["x" if i == first_diff else PATTERNS["flush"] if item[0] == "flush" else ""
                                        for i, item in enumerate(written)],
                                 fgcolor="rgba(0,0,0,0.6)", size=6)),
        meta=dict(kind="written", first_difference=first_diff, engine=[list(e) for e in engine]))]


# ---------------------------------------------------------------------------- files

def save_html(fig: go.Figure, path) -> Path:
    """Write a standalone HTML page with plotly.js inlined (works offline, no CDN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True, include_mathjax=False, config=plotly_config())
    return path


def available_traces() -> list[str]:
    """Names of the recorded traces shipped with the package (for :func:`load_trace`)."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.json"))


def load_trace(name: str) -> Timeline:
    """A shipped, recorded timeline by name, e.g. ``load_trace("cpu_zos")`` or
    ``load_trace("cpu_serial_overhead2ms")``.

    Recorded on a quiet machine with ``scripts/record_traces.py``; ``meta["recorded"]``
    says how, where, when and at which commit (and its contention meter), ``meta["stats"]``
    carries the run's stats.
    """
    path = TRACES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no recorded trace {name!r}; available: {', '.join(available_traces()) or 'none'}")
    return Timeline.from_json(path)


# ---------------------------------------------------------------------------- explorer

class TimelineExplorer:
    """Widgets that run the engine live and draw its timeline.

    Change the mode, drafts, batch size, requests or host overhead, press *Run*, and
    slide the window along the run; *view* switches between the to-scale timeline and
    the order view of the same spans.  One engine (one device process) is kept while its
    configuration is unchanged; it is closed when the configuration changes and by
    :meth:`close`, so re-running many times leaks nothing.  Everything works headless:
    ``explorer.run()`` is what the button does.
    """

    def __init__(self, mode: str = "zos", num_requests: int = 8, max_new_tokens: int = 48,
                 num_rounds: int = 3, device: str = "auto", model=None, tokenizer=None) -> None:
        import ipywidgets as w

        self.max_new_tokens = max_new_tokens
        self.device_kind = device
        self._model, self._tokenizer = model, tokenizer
        self.engine = None
        self._engine_key = None
        self._quiet = False
        self.timeline: Timeline | None = None
        self.stats: dict = {}
        style = dict(description_width="initial")
        self.mode = w.ToggleButtons(options=["serial", "zos"], value=mode, description="mode", style=style)
        self.drafts = w.IntSlider(value=0, min=0, max=6, description="draft tokens", style=style)
        self.batch_size = w.IntSlider(value=8, min=1, max=16, description="batch size", style=style)
        self.num_requests = w.IntSlider(value=num_requests, min=1, max=32, description="requests", style=style)
        self.host_overhead = w.FloatSlider(value=0.0, min=0.0, max=5.0, step=0.25, description="host overhead ms",
                                           style=style)
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.num_rounds = w.IntSlider(value=num_rounds, min=1, max=8, description="rounds shown", style=style)
        self.round_slider = w.IntSlider(value=0, min=0, max=0, description="first round", style=style,
                                        continuous_update=False)
        self.view = w.ToggleButtons(options=["to scale", "order"], value="to scale", description="view",
                                    style=style)
        self.readout = w.HTML("<i>press Run</i>")
        self.figure = go.FigureWidget()
        self.figure._config = plotly_config()
        _style_lanes(self.figure)
        _layout(self.figure, "press Run", height=360)
        self.run_button.on_click(self._on_click)
        self.round_slider.observe(self._on_window, names="value")
        self.num_rounds.observe(self._on_window, names="value")
        self.view.observe(self._on_window, names="value")
        self.widget = w.VBox([
            w.HBox([self.mode, self.run_button]),
            w.HBox([self.drafts, self.batch_size]),
            w.HBox([self.num_requests, self.host_overhead]),
            self.readout,
            w.HBox([self.round_slider, self.num_rounds]),
            self.view,
            self.figure,
        ])

    # -- engine -------------------------------------------------------------

    def _config(self):
        from toy_engine.engine import EngineConfig

        return EngineConfig(mode=self.mode.value, device=self.device_kind, max_batch_size=self.batch_size.value,
                            num_draft_tokens=self.drafts.value, host_overhead_ms=float(self.host_overhead.value))

    def _load_model(self):
        if self._model is None:
            from toy_engine.data import CharTokenizer
            from toy_engine.model import GPTConfig, TinyGPT, load_model

            try:
                self._model, alphabet = load_model()
                self._tokenizer = CharTokenizer(alphabet)
            except FileNotFoundError:
                warnings.warn("no shipped checkpoint: the explorer runs an untrained model (timings are the same)")
                self._tokenizer = self._tokenizer or CharTokenizer()
                self._model = TinyGPT(GPTConfig(vocab_size=self._tokenizer.vocab_size))
        return self._model, self._tokenizer

    def _get_engine(self):
        """The engine for the current controls: reused if unchanged, else replaced."""
        from toy_engine.engine import Engine

        config = self._config()
        key = (config.mode, config.device, config.max_batch_size, config.num_draft_tokens, config.host_overhead_ms)
        if self.engine is None or key != self._engine_key:
            self._close_engine()
            model, tokenizer = self._load_model()
            self.engine, self._engine_key = Engine(config, model=model, tokenizer=tokenizer), key
        return self.engine

    def _close_engine(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine, self._engine_key = None, None

    def prompts(self) -> list[str]:
        """The fixed, mixed-length workload (the benchmark's), ``num_requests`` long."""
        from overlap_course.measure.bench import default_workload

        return default_workload(self.num_requests.value)

    def run(self) -> dict:
        """Run the engine once with the current controls, redraw; returns the stats."""
        engine = self._get_engine()
        engine.generate(self.prompts(), max_new_tokens=self.max_new_tokens)
        self.timeline, self.stats = engine.timeline, dict(engine.stats)
        rounds = self.timeline.rounds()
        self._quiet = True  # set the slider without one redraw per trait change
        try:
            self.round_slider.max = rounds[-1] if rounds else 0
            self.round_slider.value = min(default_first_round(self.timeline), self.round_slider.max)
        finally:
            self._quiet = False
        self._update_readout()
        self.redraw()
        return self.stats

    # -- drawing ------------------------------------------------------------

    def redraw(self) -> None:
        """Redraw the current window into the same FigureWidget (no new widgets)."""
        if self.timeline is None:
            return
        draw = order_figure if self.view.value == "order" else timeline_figure
        new = draw(self.timeline, self.round_slider.value, self.num_rounds.value)
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(list(new.data))
            self.figure.layout = new.layout
            # Lists are sent to the browser only when set: say explicitly that the other
            # view's column boxes and labels are gone.
            self.figure.layout.shapes = new.layout.shapes or ()
            self.figure.layout.annotations = new.layout.annotations or ()
        _sync_widget_state(self.figure)

    def _update_readout(self) -> None:
        s, m = self.stats, self.timeline.meta
        share = s.get("device_cpu_share")
        rows = [("mode", m.get("mode")), ("device", m.get("device")),
                ("device idle (run)", f"{s.get('device_idle_fraction', 0):.1%}"),
                ("device idle (decode)", f"{s.get('decode_device_idle_fraction', 0):.1%}"),
                ("tokens/s", f"{s.get('tokens_per_s', 0):.0f}"),
                ("rounds", s.get("rounds")), ("wall ms", f"{s.get('wall_ms', 0):.1f}")]
        if m.get("num_draft_tokens"):
            rows.append(("accepted drafts / round", f"{s.get('mean_accepted_per_round', 0):.2f}"))
        if share is not None:
            rows.append(("device CPU share", f"{share:.0%}"))
        cells = "".join(f"<td style='padding:0 12px'><b>{k}</b><br>{html.escape(str(v))}</td>" for k, v in rows)
        warning = busy_warning({m.get("mode", "run"): s}, cuda=m.get("device") != "cpu-process")
        note = (f"<div style='color:#8a3b00;max-width:70em'><b>{html.escape(warning)}</b> "
                f"(<code>viz.load_trace('{trace_name(m.get('mode', 'zos'), m.get('host_overhead_ms', 0.0))}')</code> "
                f"is the recorded one)</div>" if warning else "")
        self.readout.value = f"<table><tr>{cells}</tr></table>{note}"

    def _on_click(self, _button) -> None:
        self.run_button.disabled = True
        try:
            self.run()
        except Exception as exc:  # noqa: BLE001 - shown to the student, not swallowed silently
            self.readout.value = f"<span style='color:#d62728'><b>{type(exc).__name__}</b>: {html.escape(str(exc))}</span>"
        finally:
            self.run_button.disabled = False

    def _on_window(self, _change) -> None:
        if not self._quiet:
            self.redraw()

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Stop the engine's device process and close the widgets."""
        self._close_engine()
        self.widget.close()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        _sync_widget_state(self.figure)
        display(self.widget)


def _sync_widget_state(figure: go.FigureWidget) -> None:
    """Copy the figure into its synced widget state, which plotly refreshes only on display.

    A FigureWidget sends later changes as messages to the front ends connected *then*; its
    synced state keeps what it held when it was last displayed on its own -- inside a box it
    never is.  A front end that connects later (Voila renders the page after the cells ran; a
    reloaded JupyterLab tab) draws that state: the explorer's first run came up blank there.
    plotly has no public call for this; ``_repr_mimebundle_`` is the one that does it."""
    figure._repr_mimebundle_()
