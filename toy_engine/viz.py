"""Pictures of engine timelines, for the course notebooks.

The question every figure answers is the course's: *while the device works on round N,
what is the host doing, and is the device ever left waiting?*  So a figure shows a
small window of rounds on two lanes, ``host`` above ``device``, with

* one bar per span, coloured by stage (one legend entry per stage, fixed colours, so
  "forward" is the same blue in every figure of the course) and labelled with the
  round whose work it is (``r5``);
* the device's idle gaps shaded: that is the overhead zero-overhead scheduling hides;
* an arrow from each round's device ``sample`` end (the completion event) to the start
  of the host's ``postprocess``/``flush`` of that round.  In serial mode the arrow is
  short and the device idles after it; in ZOS mode round N's results are processed
  while round N+1's forward runs, and the arrows slant forward over the next round.

The figures only read a :class:`~toy_engine.timeline.Timeline`, so they work the same
for a run recorded a second ago, a trace loaded from JSON (:func:`load_trace`), or a
hand-made timeline.  :class:`TimelineExplorer` wraps a live engine in widgets.

plotly (and ipywidgets for the explorer) are course extras, so ``toy_engine`` itself
never imports this module.
"""

from __future__ import annotations

import html
import warnings
import zlib
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from .timeline import Span, Timeline

__all__ = ["STAGE_COLORS", "timeline_figure", "compare_figure", "save_html", "load_trace",
           "available_traces", "TimelineExplorer"]

#: Fixed stage colours.  Host control work is green, launches olive, waiting pale
#: grey, result processing orange/brown, deliberate overhead red; device work blue.
STAGE_COLORS = {
    # host
    "schedule": "#98df8a",
    "overhead": "#d62728",
    "prepare": "#2ca02c",
    "launch_forward": "#bcbd22",
    "launch_sample": "#dbdb8d",
    "wait": "#e3e3e3",
    "postprocess": "#ff7f0e",
    "flush": "#8c564b",
    # device
    "upload": "#aec7e8",
    "correct": "#c5b0d5",
    "draft": "#6baed6",
    "forward": "#1f77b4",
    "sample": "#9467bd",
}
IDLE_COLOR = "rgba(150, 150, 150, 0.35)"
#: Unknown stages get one of these, chosen by a stable hash of the name.
_FALLBACK_COLORS = ("#e377c2", "#7f7f7f", "#17becf", "#f7b6d2", "#c49c94", "#9edae5")
_STAGE_ORDER = list(STAGE_COLORS)
_PROCESS_STAGES = ("postprocess", "flush")
_LANE_Y = {"device": 0, "host": 1}  # numeric rows, so arrows can use data coordinates
_BAR_WIDTH = 0.6
TRACES_DIR = Path(__file__).parent / "traces"



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


def stage_color(stage: str) -> str:
    """The stage's fixed colour; an unknown stage gets a stable fallback colour."""
    return STAGE_COLORS.get(stage) or _FALLBACK_COLORS[zlib.crc32(stage.encode()) % len(_FALLBACK_COLORS)]


# ---------------------------------------------------------------------------- windows

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
        elif s.lane == "host" and s.stage in _PROCESS_STAGES:
            processed.setdefault(s.round, s)
    return [(samples[r], processed[r]) for r in sorted(samples) if r in processed]


def _window(timeline: Timeline, first_round: int | None, num_rounds: int) -> dict:
    """Everything a figure needs for one window, in ms relative to the window start.

    The window's *time range* runs from its first span's start to its last span's end
    (host and device).  Idle gaps are the timeline's device gaps clipped to that range:
    in serial mode this includes the idle time before the window's first upload, which
    is exactly the per-round host overhead the course is about.
    """
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    first = default_first_round(timeline) if first_round is None else int(first_round)
    spans = window_spans(timeline, first, num_rounds)
    t0 = min((s.start_ms for s in spans), default=0.0)
    t1 = max((s.end_ms for s in spans), default=0.0)
    gaps = timeline.device_gaps(t0, t1) if spans else []
    idle = sum(b - a for a, b in gaps)
    wanted = range(first, first + num_rounds)
    context = sorted((s for s in timeline.spans
                      if s.round not in wanted and s.end_ms > t0 and s.start_ms < t1),
                     key=lambda s: (s.start_ms, s.end_ms))
    return dict(first=first, last=first + num_rounds - 1, spans=spans, context=context, t0=t0, t1=t1,
                gaps=gaps, idle_ms=idle, idle_fraction=idle / (t1 - t0) if t1 > t0 else 0.0,
                links=_links(spans))


def _hover(span: Span, t0: float) -> str:
    text = (f"<b>{html.escape(span.stage)}</b> ({span.lane}) · round {span.round}<br>"
            f"start {span.start_ms - t0:.3f} ms · end {span.end_ms - t0:.3f} ms<br>"
            f"duration {span.duration_ms:.3f} ms")
    if span.owner:
        text += f"<br>owner {html.escape(span.owner)}"
    return text


def _traces(win: dict, legend_seen: set | None = None, context: bool = True) -> list[go.Bar]:
    """One horizontal-bar trace per stage (legend = stages), other rounds, device idle.

    Traces are tagged in ``meta["kind"]``: "span" (this window's spans, one trace per
    stage), "context" (other rounds, faded) and "idle" (device gaps).
    """
    legend_seen = set() if legend_seen is None else legend_seen
    t0 = win["t0"]
    by_stage: dict[str, list[Span]] = {}
    for s in win["spans"]:
        by_stage.setdefault(s.stage, []).append(s)
    order = sorted(by_stage, key=lambda st: (_STAGE_ORDER.index(st) if st in STAGE_COLORS else len(_STAGE_ORDER), st))
    traces = []
    for stage in order:
        spans = by_stage[stage]
        color = stage_color(stage)
        traces.append(go.Bar(
            name=stage, legendgroup=stage, showlegend=stage not in legend_seen, orientation="h",
            y=[_LANE_Y[s.lane] for s in spans], base=[s.start_ms - t0 for s in spans],
            x=[s.duration_ms for s in spans], width=_BAR_WIDTH,
            text=[f"r{s.round}" for s in spans], textposition="inside", insidetextanchor="middle",
            hovertext=[_hover(s, t0) for s in spans], hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=color, line=dict(color="rgba(0,0,0,0.35)", width=0.5),
                        pattern=dict(shape="/" if stage == "flush" else "")),
            meta=dict(kind="span", stage=stage)))
        legend_seen.add(stage)
    if context and win["context"]:
        context = win["context"]
        # Other rounds' work in the same time range, faded and clipped to the window, so
        # the lanes are not misleadingly empty where e.g. round N-1 is still on the device.
        starts = [max(s.start_ms, t0) for s in context]
        traces.append(go.Bar(
            name="other rounds", legendgroup="other rounds", showlegend="other rounds" not in legend_seen,
            orientation="h", y=[_LANE_Y[s.lane] for s in context], base=[a - t0 for a in starts],
            x=[min(s.end_ms, win["t1"]) - a for s, a in zip(context, starts)], width=_BAR_WIDTH * 0.7,
            opacity=0.3, text=[f"r{s.round}" for s in context], textposition="inside",
            insidetextanchor="middle", hovertext=[_hover(s, t0) + "<br><i>outside the window</i>" for s in context],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=[stage_color(s.stage) for s in context], line=dict(width=0)),
            meta=dict(kind="context")))
        legend_seen.add("other rounds")
    gaps = win["gaps"]
    traces.append(go.Bar(
        name="device idle", legendgroup="device idle", showlegend="device idle" not in legend_seen,
        orientation="h", y=[_LANE_Y["device"]] * len(gaps), base=[a - t0 for a, _ in gaps],
        x=[b - a for a, b in gaps], width=_BAR_WIDTH,
        hovertext=[f"<b>device idle</b> {b - a:.3f} ms<br>from {a - t0:.3f} to {b - t0:.3f} ms" for a, b in gaps],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=IDLE_COLOR, line=dict(color="rgba(90,90,90,0.6)", width=0.5),
                    pattern=dict(shape="x", fgcolor="rgba(90,90,90,0.5)", size=6)),
        meta=dict(kind="idle")))
    legend_seen.add("device idle")
    return traces


def _annotations(win: dict, xref: str = "x", yref: str = "y") -> list[dict]:
    """Event arrows (sample end -> postprocess/flush start) and a label on each flush."""
    t0, half = win["t0"], _BAR_WIDTH / 2
    notes = []
    for sample, proc in win["links"]:
        notes.append(dict(
            x=proc.start_ms - t0, y=_LANE_Y["host"] - half, ax=sample.end_ms - t0, ay=_LANE_Y["device"] + half,
            xref=xref, yref=yref, axref=xref, ayref=yref, text="", showarrow=True,
            arrowhead=2, arrowsize=1, arrowwidth=1.3, arrowcolor="rgba(60,60,60,0.8)",
            hovertext=(f"round {sample.round}: sample done at {sample.end_ms - t0:.3f} ms, "
                       f"{proc.stage} starts at {proc.start_ms - t0:.3f} ms "
                       f"(+{proc.start_ms - sample.end_ms:.3f} ms)"),
            name=f"event r{sample.round}"))
    for s in win["spans"]:
        if s.lane == "host" and s.stage == "flush":
            notes.append(dict(
                x=(s.start_ms + s.end_ms) / 2 - t0, y=_LANE_Y["host"] + half, xref=xref, yref=yref,
                text=f"flush r{s.round}", showarrow=True, arrowhead=0, ax=0, ay=-18,
                font=dict(size=11, color=STAGE_COLORS["flush"]), name=f"flush r{s.round}"))
    return notes


def _window_title(win: dict) -> str:
    rounds = f"round {win['first']}" if win["first"] == win["last"] else f"rounds {win['first']}–{win['last']}"
    return (f"{rounds} · device idle {win['idle_ms']:.2f} ms of {win['t1'] - win['t0']:.2f} ms "
            f"({win['idle_fraction']:.1%})")


def _style_lanes(fig: go.Figure, **axis) -> None:
    fig.update_yaxes(tickvals=[_LANE_Y["device"], _LANE_Y["host"]], ticktext=["device", "host"],
                     range=[-0.6, 1.75], fixedrange=True, zeroline=False, showgrid=False, **axis)


def _layout(fig: go.Figure, title: str, height: int) -> None:
    fig.update_layout(
        title=dict(text=title, x=0.01), barmode="overlay", height=height, template="plotly_white",
        uniformtext=dict(minsize=8, mode="hide"),  # "r5" only where the bar is wide enough
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, traceorder="normal"),
        hovermode="closest", margin=dict(l=60, r=20, t=80, b=40))


def timeline_figure(timeline: Timeline, first_round: int | None = None, num_rounds: int = 3,
                    title: str | None = None, context: bool = True) -> go.Figure:
    """Host and device lanes for the spans of rounds ``first_round .. +num_rounds-1``.

    ``first_round`` defaults to the first steady-state decode round (see
    :func:`default_first_round`).  Time is in ms from the window's first span.
    ``context`` also draws, faded, other rounds' spans that ran inside the window's
    time range (with ZOS, round N-1's wait and postprocess run during round N).
    """
    win = _window(timeline, first_round, num_rounds)
    fig = go.Figure(_traces(win, context=context))
    for note in _annotations(win):
        fig.add_annotation(**note)
    _style_lanes(fig)
    fig.update_xaxes(title="time in window (ms)", rangemode="tozero")
    mode = timeline.meta.get("mode")
    head = title or " · ".join(x for x in (mode and f"{mode}", timeline.meta.get("device")) if x) or "timeline"
    _layout(fig, f"{head}<br><sup>{_window_title(win)}</sup>", height=400)
    return fig


def _run_idle(timeline: Timeline, stats: dict | None) -> float:
    if stats and "decode_device_idle_fraction" in stats:
        return stats["decode_device_idle_fraction"]
    decode = decode_rounds(timeline)
    return timeline.device_idle_fraction(decode) if decode else timeline.device_idle_fraction()


def compare_figure(runs: dict, num_rounds: int = 3, first_round: int | None = None,
                   context: bool = True) -> go.Figure:
    """One row per run (label -> Timeline, or label -> (Timeline, stats)), same time scale.

    Each run's window is shifted to start at 0 and the rows share the x axis, so equal
    lengths mean equal time.  Titles give the window's device idle fraction, the run's
    decode-phase idle fraction and, when stats are known (given, or stored in
    ``meta["stats"]`` of a recorded trace), tokens/s.
    """
    if not runs:
        raise ValueError("compare_figure needs at least one run")
    wins, titles = [], []
    for label, run in runs.items():
        timeline, stats = run if isinstance(run, tuple) else (run, None)
        stats = stats if stats is not None else timeline.meta.get("stats")
        win = _window(timeline, first_round, num_rounds)
        parts = [f"<b>{html.escape(str(label))}</b>", _window_title(win),
                 f"run decode idle {_run_idle(timeline, stats):.1%}"]
        if stats and "tokens_per_s" in stats:
            parts.append(f"{stats['tokens_per_s']:.0f} tok/s")
        wins.append(win)
        titles.append(" · ".join(parts))
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
    fig.update_xaxes(rangemode="tozero")
    fig.update_xaxes(title="time in window (ms)", row=n, col=1)
    for ann in fig.layout.annotations[:n]:  # subplot titles: left-aligned, smaller
        ann.update(x=0, xanchor="left", font=dict(size=12))
    _layout(fig, f"same window, same time scale ({num_rounds} rounds)", height=150 + 230 * n)
    return fig


# ---------------------------------------------------------------------------- files

def save_html(fig: go.Figure, path) -> Path:
    """Write a standalone HTML page with plotly.js inlined (works offline, no CDN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True, include_mathjax=False)
    return path


def available_traces() -> list[str]:
    """Names of the recorded traces shipped with the package (for :func:`load_trace`)."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.json"))


def load_trace(name: str) -> Timeline:
    """A shipped, recorded timeline by name, e.g. ``load_trace("cpu_zos")``.

    Recorded with ``scripts/record_traces.py``; ``meta`` says how (command, date,
    machine, torch version) and carries the run's ``stats``.
    """
    path = TRACES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no recorded trace {name!r}; available: {', '.join(available_traces()) or 'none'}")
    return Timeline.from_json(path)


# ---------------------------------------------------------------------------- explorer

class TimelineExplorer:
    """Widgets that run the engine live and draw its timeline.

    Change the mode, drafts, batch size, requests or host overhead, press *Run*, and
    slide the window along the run.  One engine (one device process) is kept while its
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
        self.readout = w.HTML("<i>press Run</i>")
        self.figure = go.FigureWidget()
        _style_lanes(self.figure)
        _layout(self.figure, "press Run", height=360)
        self.run_button.on_click(self._on_click)
        self.round_slider.observe(self._on_window, names="value")
        self.num_rounds.observe(self._on_window, names="value")
        self.widget = w.VBox([
            w.HBox([self.mode, self.run_button]),
            w.HBox([self.drafts, self.batch_size]),
            w.HBox([self.num_requests, self.host_overhead]),
            self.readout,
            w.HBox([self.round_slider, self.num_rounds]),
            self.figure,
        ])

    # -- engine -------------------------------------------------------------

    def _config(self):
        from .engine import EngineConfig

        return EngineConfig(mode=self.mode.value, device=self.device_kind, max_batch_size=self.batch_size.value,
                            num_draft_tokens=self.drafts.value, host_overhead_ms=float(self.host_overhead.value))

    def _load_model(self):
        if self._model is None:
            from .data import CharTokenizer
            from .model import GPTConfig, TinyGPT, load_model

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
        from .engine import Engine

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
        from .bench import default_workload

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
        new = timeline_figure(self.timeline, self.round_slider.value, self.num_rounds.value)
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(list(new.data))
            self.figure.layout.annotations = new.layout.annotations
            self.figure.layout.title = new.layout.title
            self.figure.layout.xaxis.autorange = True

    def _update_readout(self) -> None:
        s, m = self.stats, self.timeline.meta
        rows = [("mode", m.get("mode")), ("device", m.get("device")),
                ("device idle (run)", f"{s.get('device_idle_fraction', 0):.1%}"),
                ("device idle (decode)", f"{s.get('decode_device_idle_fraction', 0):.1%}"),
                ("tokens/s", f"{s.get('tokens_per_s', 0):.0f}"),
                ("rounds", s.get("rounds")), ("wall ms", f"{s.get('wall_ms', 0):.1f}")]
        if m.get("num_draft_tokens"):
            rows.append(("accepted drafts / round", f"{s.get('mean_accepted_per_round', 0):.2f}"))
        cells = "".join(f"<td style='padding:0 12px'><b>{k}</b><br>{html.escape(str(v))}</td>" for k, v in rows)
        self.readout.value = f"<table><tr>{cells}</tr></table>"

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

        display(self.widget)
