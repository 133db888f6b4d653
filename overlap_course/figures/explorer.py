"""The explorer: widgets that run the engine live and draw its timeline, in either view.

Notebook 05 and the Voila app (``apps/explorer.ipynb``) show it; plotly and ipywidgets
are course extras, imported only here and in the views.
"""

from __future__ import annotations

import html
import warnings

import plotly.graph_objects as go

from overlap_course.measure.contention import contention
from overlap_course.measure.machine import BUSY_WARNING_PREFIX, busy_warning
from toy_engine.config import EngineConfig
from toy_engine.engine import Engine
from toy_engine.runinfo import RunStats
from toy_engine.timeline import Timeline

from .config import plotly_config
from .layout import apply_layout, style_lanes
from .order import order_figure
from .rounds import default_first_round
from .scale import timeline_figure

__all__ = ["TimelineExplorer"]

#: What the explorer shows where its widget cannot be drawn.
TEXT_FALLBACK = "Timeline explorer: a live widget; run the notebook, or open the app (./run.sh explorer), to use it"


class TimelineExplorer:
    """Widgets that run the engine live and draw its timeline.

    Change the mode, drafts, batch size, requests or host overhead, press *Run*, and
    slide the window along the run; *view* switches between the to-scale timeline and
    the order view of the same spans.  Each run starts an engine and closes it when done
    (starting one costs ~0.2 s once the first has started the forkserver), so between runs
    the explorer holds no device process: a notebook may start engines of its own beside it
    (notebook 05's benchmark) and an app page left open costs only its kernel.  Everything
    works headless: ``explorer.run()`` is what the button does.
    """

    def __init__(self, mode: str = "zos", num_requests: int = 8, max_new_tokens: int = 48,
                 num_rounds: int = 3, device: str = "auto", model=None, tokenizer=None) -> None:
        import ipywidgets as w

        self.max_new_tokens = max_new_tokens
        self.device_kind = device
        self._model, self._tokenizer = model, tokenizer
        self._quiet = False
        self.timeline: Timeline | None = None
        self.stats: RunStats | None = None
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
        style_lanes(self.figure)
        apply_layout(self.figure, "press Run", height=360)
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

    def _config(self) -> EngineConfig:
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

    def prompts(self) -> list[str]:
        """The fixed, mixed-length workload (the benchmark's), ``num_requests`` long."""
        from overlap_course.measure.bench import default_workload

        return default_workload(self.num_requests.value)

    def run(self) -> RunStats:
        """Run an engine once with the current controls (closed when done), redraw; returns the stats."""
        model, tokenizer = self._load_model()
        with Engine(self._config(), model=model, tokenizer=tokenizer) as engine:
            engine.generate(self.prompts(), max_new_tokens=self.max_new_tokens)
        self.timeline, self.stats = engine.timeline, engine.stats
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
        meter = contention(self.timeline)
        rows = [("mode", m.mode), ("device", f"{m.device} (PACED)" if m.pacing else m.device),
                ("device idle (run)", f"{s.device_idle_fraction:.1%}"),
                ("device idle (decode)", f"{s.decode_device_idle_fraction:.1%}"),
                ("tokens/s", f"{s.tokens_per_s:.0f}"), ("rounds", s.rounds), ("wall ms", f"{s.wall_ms:.1f}")]
        if m.num_draft_tokens:
            rows.append(("accepted drafts / round", f"{s.mean_accepted_per_round:.2f}"))
        if meter["device_late_fraction"] is not None:
            rows.append(("paced device late", f"{meter['device_late_fraction']:.1%}"))
        elif meter["device_cpu_share"] is not None:
            rows.append(("device CPU share", f"{meter['device_cpu_share']:.0%}"))
        cells = "".join(f"<td style='padding:0 12px'><b>{k}</b><br>{html.escape(str(v))}</td>" for k, v in rows)
        warning = busy_warning({m.mode: self.timeline}, cuda=m.device != "cpu-process", recorded=False)
        self.readout.value = f"<table><tr>{cells}</tr></table>{_busy_note(warning) if warning else ''}"

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
        """Close every widget of the explorer (no engine outlives a run)."""
        todo = [self.widget]
        while todo:
            widget = todo.pop()
            todo += getattr(widget, "children", ())
            widget.close()

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return widget_mimebundle(self.widget, self.figure, TEXT_FALLBACK, **kwargs)


def _busy_note(warning: str) -> str:
    """The busy warning as one line that opens to the whole text: projected at 1280x720 the
    full warning took six lines and pushed the figure off the screen."""
    details = html.escape(warning.removeprefix(f"{BUSY_WARNING_PREFIX}. "))
    return ("<details class='busy-note' style='color:#8a3b00'><summary style='cursor:pointer;white-space:nowrap'>"
            f"<b>{BUSY_WARNING_PREFIX}</b>: these timings may not show what overlap buys (why?)</summary>"
            f"<div style='max-width:70em'>{details}</div></details>")


def widget_mimebundle(widget, figure: go.FigureWidget, text: str, **kwargs) -> dict:
    """A course widget's display: the widget with its figure's state synced; for a viewer without
    the state (a stored notebook) ``text``, not the ``VBox(children=...`` of its repr (the notebook
    build stores an image of the figure beside)."""
    _sync_widget_state(figure)
    return {**widget._repr_mimebundle_(**kwargs), "text/plain": text}


def _sync_widget_state(figure: go.FigureWidget) -> None:
    """Copy the figure into its synced widget state, which plotly refreshes only on display.

    A FigureWidget sends later changes as messages to the front ends connected *then*; its
    synced state keeps what it held when it was last displayed on its own -- inside a box it
    never is.  A front end that connects later (Voila renders the page after the cells ran; a
    reloaded JupyterLab tab) draws that state: the explorer's first run came up blank there.
    plotly has no public call for this; ``_repr_mimebundle_`` is the one that does it."""
    figure._repr_mimebundle_()
