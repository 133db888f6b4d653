"""When does overlap pay?  The ideal speed-up of overlapping a round's host and device work, the
learner's own measured points and published ones: :func:`payoff_figure` (the site's static
figure) and :class:`PayoffExplorer` (the same with sliders, notebook 03b).

A serial round costs host + device ms, an overlapped one max(host, device)
(:func:`overlap_course.measure.bench.ideal_ratio`), so the ideal depends only on the host's share of a
serial round, s = host / (host + device): 1 / max(s, 1 - s), x2 at an even split.  Engines
publish speed-ups, rarely per-round times, so each published number is drawn at the host share
its source gives or implies; :data:`PUBLISHED` (:mod:`.payoff_points`) says which, what was
measured on what workload, and why a toy's ratio is not the same quantity.

Speculation as the toy models it (notebook 04): a decode round feeds each request its newest
token and k drafts; the host prepares all 1 + k slots and the forward verifies all of them,
whatever is accepted; the request keeps 1 + accepted tokens.  With the acceptance rate
a = accepted / proposed drafts, a round yields 1 + a*k tokens per request (the toy's
``mean_accepted_per_round`` is a*k) for the same host and device ms.  Acceptance changes tokens
per second, not the overlap's ratio; the drafts change the ratio through a round's device ms.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import plotly.graph_objects as go

from overlap_course.measure.bench import ideal_ratio

from .config import plotly_config
from .payoff_points import PUBLISHED, Published, implied_host_share

__all__ = ["Published", "PUBLISHED", "Measured", "ideal_ratio", "implied_host_share", "tokens_per_round",
           "measured", "bench_points", "payoff_figure", "published_text", "PayoffExplorer"]

HOST, DEVICE = "mean_host_ms_per_round", "mean_device_ms_per_round"
SLIDERS = "your sliders"


def _stat(stats, name: str) -> float:
    """One number of a run's stats, a dict (the bench's medians) or a ``RunStats``
    (``engine.stats``): the one place this module reads stats."""
    return stats[name] if isinstance(stats, dict) else getattr(stats, name)


def tokens_per_round(drafts: int, acceptance: float) -> float:
    """Tokens a decode round yields per request: the newest one plus the accepted drafts."""
    return 1 + acceptance * drafts


@dataclass(frozen=True)
class Measured:
    """A learner's serial run and its overlapped twin: where they sit on the figure."""
    label: str
    host_ms: float      # per round, of the serial run
    device_ms: float
    speedup: float      # overlapped tokens/s over serial tokens/s
    busy: bool = False  # the contention meter distrusted a run

    @property
    def host_share(self) -> float:
        return self.host_ms / (self.host_ms + self.device_ms)

    @property
    def ideal(self) -> float:
        return ideal_ratio(self.host_ms, self.device_ms)


def measured(serial_stats, overlapped_stats, label: str = "your runs") -> Measured:
    """The point of a serial run's stats and an overlapped run's (e.g. ``engine.stats``)."""
    _produced(serial_stats, "serial_stats", "serial")
    _produced(overlapped_stats, "overlapped_stats", "overlapped")
    return Measured(label, _stat(serial_stats, HOST), _stat(serial_stats, DEVICE),
                    _stat(overlapped_stats, "tokens_per_s") / _stat(serial_stats, "tokens_per_s"))


def _produced(stats, name: str, run: str) -> None:
    """Refuse the stats of a run that produced no tokens or ran no round (interrupted at once,
    every request aborted; None: no run finished): its speed-up and host share would divide
    by zero."""
    again = f"run the {run} run's cell again to the end, then this one"
    if stats is None:
        raise ValueError(f"measured: {name} is None: the {run} run made no stats (it raised, or "
                         f"never ran); {again}")
    tps, host, device = (_stat(stats, key) for key in ("tokens_per_s", HOST, DEVICE))
    if not (tps > 0 and host + device > 0):
        raise ValueError(f"measured: {name} has tokens_per_s {tps!r} and {host!r} + {device!r} "
                         f"host + device ms per round: the {run} run produced no tokens "
                         f"(interrupted, or its requests aborted before a round ran); {again}")


def bench_points(result: dict) -> list[Measured]:
    """A point per comparison of a :func:`~overlap_course.measure.bench.run_bench` result
    (``zos / serial``, ``zos+spec / serial+spec``): the slower mode's medians and the bench's
    measured ratio; busy when the bench warned."""
    overhead, points = result["workload"]["host_overhead_ms"], []
    for key, ratio in result.items():
        if " / " in key:
            serial = result["modes"][key.split(" / ")[1]]
            points.append(Measured(f"your bench: {key} ({result['device']}, host overhead {overhead:g} ms)",
                                   _stat(serial, HOST), _stat(serial, DEVICE), ratio["throughput_ratio"],
                                   busy=bool(result.get("busy_warning"))))
    return points


def _curve(points: int = 200) -> tuple[list[float], list[float]]:
    """The ideal over host shares 0..100% (x in percent)."""
    shares = [i / points for i in range(1, points)]
    return [100 * s for s in shares], [ideal_ratio(s, 1 - s) for s in shares]


def payoff_figure(points=(), sliders: tuple[float, float] | None = None) -> go.Figure:
    """The ideal speed-up against the host's share of a serial round, with :data:`PUBLISHED`,
    the :class:`Measured` ``points`` (measured and ideal, joined) and, given ``(host_ms,
    device_ms)``, the sliders' round."""
    x, y = _curve()
    hover = "host %{x:.0f}%: x%{y:.2f}<extra></extra>"
    fig = go.Figure(go.Scatter(x=x, y=y, mode="lines", name="ideal: (h + d) / max(h, d)",
                               line=dict(color="#1f77b4", width=3), hovertemplate=hover))
    for x0, x1, colour, text in ((0, 50, "rgba(31,119,180,0.07)", "device-bound: host work hides under the forward"),
                                 (50, 100, "rgba(255,127,14,0.07)", "host-bound: device work hides under the host's")):
        fig.add_vrect(x0=x0, x1=x1, fillcolor=colour, line_width=0, layer="below")
        fig.add_annotation(x=(x0 + x1) / 2, y=2.08, text=text, showarrow=False, font=dict(size=11, color="#555"))
    # Widest first, so that a point drawn on top of a range stays visible (SGLang's x1.1 is vLLM's upper end).
    for p in sorted(PUBLISHED, key=lambda p: p.speedup[0] - p.speedup[1]):
        (label_x, label_y), colour = _LABELS[p.url]
        implied = p.drawn_at.startswith("implied")
        share = [100 * s for s in p.host_share]
        text = _speedup_text(p)
        fig.add_trace(go.Scatter(
            x=share, y=list(p.speedup), mode="lines+markers", name=f"{p.engine} ({p.date[:4]}): {text}",
            line=dict(color=colour, width=6), hovertemplate=f"{html.escape(p.engine)}<br>%{{y:.2f}}x<extra></extra>",
            marker=dict(size=16 if p.speedup[0] == p.speedup[1] else 10, color="white" if implied else colour,
                        line=dict(color=colour, width=2.5), symbol="circle" if implied else "square")))
        fig.add_annotation(x=share[0], y=p.speedup[0], ax=label_x, ay=label_y, axref="x", ayref="y",
                           text=f"{_short(p)} {text}",
                           font=dict(size=11, color=colour), arrowcolor=colour, bgcolor="rgba(255,255,255,0.8)")
    for p in points:
        name = f"{p.label}: x{p.speedup:.2f} (ideal x{p.ideal:.2f}){', busy machine' if p.busy else ''}"
        fig.add_trace(go.Scatter(x=[100 * p.host_share] * 2, y=[p.ideal, p.speedup], mode="lines+markers", name=name,
                                 line=dict(color="#ff7f0e", dash="dot"),
                                 marker=dict(size=[11, 17], symbol=["circle-open", "star"], color="#ff7f0e"),
                                 hovertemplate=hover))
    if sliders:
        fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name=SLIDERS, marker=dict(
            size=15, symbol="diamond", color="#17becf", line=dict(color="#333", width=1))))
        _place_sliders(fig, *sliders)
    top = max([2.15] + [p.speedup + 0.1 for p in points])
    fig.update_layout(
        template="plotly_white", height=640 + 20 * (len(points) + bool(sliders)),
        margin=dict(t=95, b=40, l=60, r=20),
        title=dict(text="When does overlap pay? The ideal speed-up against the host's share of a serial round<br>"
                        "<sup>ideal = (h + d) / max(h, d) = 1 / max(s, 1 − s), s = h / (h + d), h and d the host and "
                        "device ms of a serial round.<br>With k drafts at acceptance a a round yields 1 + a·k tokens "
                        "per request for the same h and d: the ratio does not change</sup>", x=0.01),
        xaxis=dict(title="host share of a serial round, s (%)", range=[-2, 100], ticksuffix="%"),
        yaxis=dict(title="speed-up (x, serial time / overlapped)", range=[0.95, top]),
        legend=dict(orientation="h", yanchor="top", y=-0.14, x=0, font=dict(size=11)))
    return fig


# Where each published point's label sits (host share in %, speed-up) and its colour, by its source:
# the left group stacked above the curve, the rest below it on the right.
_LABELS = {
    "https://github.com/vllm-project/vllm/pull/23569": ((27, 1.98), "#d62728"),
    "https://lmsys.org/blog/2024-12-04-sglang-v0-4/": ((27, 1.895), "#2ca02c"),
    "https://github.com/sgl-project/sglang/pull/12128": ((27, 1.81), "#17a2b8"),
    "https://github.com/sgl-project/sglang/pull/15591": ((27, 1.725), "#006d5b"),
    "https://github.com/sgl-project/sglang/pull/20547": ((30, 1.64), "#8c564b"),
    "https://github.com/vllm-project/vllm/pull/32618": ((44, 1.39), "#e377c2"),
    "https://huggingface.co/blog/continuous_async": ((41, 1.29), "#9467bd"),
    "https://github.com/ggml-org/llama.cpp/issues/7456": ((42, 1.06), "#7f7f7f"),
    "https://github.com/sgl-project/sglang/issues/23005": ((72, 1.12), "#bcbd22"),
}


def _short(p: Published) -> str:
    """The label on the figure: the engine's name up to its first comma."""
    return p.engine.split(",")[0]


def _place_sliders(fig, host_ms: float, device_ms: float) -> None:
    share = host_ms / (host_ms + device_ms)
    fig.update_traces(x=[100 * share], y=[ideal_ratio(host_ms, device_ms)], selector=dict(name=SLIDERS))


def _speedup_text(p: Published) -> str:
    """x1.1, x1.28, x1.05–1.1 expected, at most x1.11–1.18, x1 (no gain): the speed-up to the
    precision its source gives, and what kind of number it is."""
    text = "x" + "–".join(dict.fromkeys(f"{s:.2f}".rstrip("0").rstrip(".") for s in p.speedup))
    if p.ceiling:
        return f"at most {text}"
    return text + (" expected" if p.expected else " (no gain)" if p.counter else "")


def _fields(p: Published) -> list[tuple[str, str]]:
    share = "–".join(dict.fromkeys(f"{s:.0%}" for s in p.host_share))
    return [("speed-up", _speedup_text(p)), ("what was measured", p.measured), ("workload", p.workload),
            ("drawn at host share", f"{share} ({p.drawn_at})"), ("not the toy's ratio because", p.not_the_toy)]


def published_text(fmt: str = "markdown") -> str:
    """:data:`PUBLISHED` in words, with links: ``markdown`` (the site) or ``html`` (the widget)."""
    parts = []
    for p in PUBLISHED:
        if fmt == "markdown":
            items = "".join(f"- **{name}:** {text}\n" for name, text in _fields(p))
            parts.append(f"### {p.engine}\n\n{items}- **reference:** [{p.reference}]({p.url}), {p.date}\n")
        else:
            items = "".join(f"<li><b>{name}:</b> {html.escape(text)}</li>" for name, text in _fields(p))
            parts.append(f"<h4>{html.escape(p.engine)}</h4><ul>{items}<li><b>reference:</b> <a href='{p.url}' "
                         f"target='_blank'>{html.escape(p.reference)}</a>, {p.date}</li></ul>")
    return "\n".join(parts)


TEXT_FALLBACK = "When does overlap pay? A live widget: run the notebook to move its sliders"


class PayoffExplorer:
    """Sliders for a serial round's host and device ms, and speculation's drafts and acceptance,
    on :func:`payoff_figure`: the ideal, what a round yields, and where the learner's runs landed.

    ``runs``: :func:`~overlap_course.measure.bench.run_bench` results and :class:`Measured`
    points (:func:`measured`); the sliders start at the first one's serial times.  Works headless:
    set a slider's ``value`` and read ``readout.value`` or ``figure``.
    """

    def __init__(self, *runs, drafts: int = 0, acceptance: float = 0.5) -> None:
        import ipywidgets as w

        self.points = [p for run in runs for p in (bench_points(run) if isinstance(run, dict) else [run])]
        host, device = (self.points[0].host_ms, self.points[0].device_ms) if self.points else (1.0, 4.0)
        style = dict(description_width="initial")
        self.host = w.FloatSlider(value=host, min=0.05, max=max(20.0, 2 * host), step=0.05,
                                  description="host ms / round", style=style)
        self.device = w.FloatSlider(value=device, min=0.05, max=max(40.0, 2 * device), step=0.05,
                                    description="device ms / round", style=style)
        self.drafts = w.IntSlider(value=drafts, min=0, max=8, description="draft tokens k", style=style)
        self.acceptance = w.FloatSlider(value=acceptance, min=0.0, max=1.0, step=0.01, readout_format=".0%",
                                        description="acceptance a", style=style)
        self.readout = w.HTML()
        self.figure = go.FigureWidget(payoff_figure(self.points, (host, device)))
        self.figure._config = plotly_config()
        for slider in (self.host, self.device, self.drafts, self.acceptance):
            slider.observe(self._update, names="value")
        published = w.HTML(f"<details><summary><b>The published numbers: what each measured, and why the toy's "
                           f"ratio is not the same</b></summary>{published_text('html')}</details>")
        self.widget = w.VBox([w.HBox([self.host, self.device]), w.HBox([self.drafts, self.acceptance]),
                              self.readout, self.figure, published])
        self._update()

    def _update(self, _change=None) -> None:
        h, d, k, a = self.host.value, self.device.value, self.drafts.value, self.acceptance.value
        self.acceptance.disabled = k == 0
        serial, overlapped = h + d, max(h, d)
        tokens = tokens_per_round(k, a)
        bound, hidden = ("device", "host") if d >= h else ("host", "device")
        with self.figure.batch_update():
            _place_sliders(self.figure, h, d)
        spec = f"1 + {a:.0%} × {k} = {tokens:.2f}" if k else "1 (no drafts)"
        self.readout.value = (
            f"serial round h + d = {serial:.2f} ms; overlapped max(h, d) = {overlapped:.2f} ms; "
            f"<b>ideal x{ideal_ratio(h, d):.2f}</b>: the {bound} lane bounds the round, the {hidden} work hides "
            f"under it.<br>Tokens per request and round: {spec}; per request {1e3 * tokens / serial:.0f} tok/s "
            f"serial, {1e3 * tokens / overlapped:.0f} tok/s overlapped (acceptance scales both alike).")

    def _repr_mimebundle_(self, **kwargs) -> dict:
        from .explorer import widget_mimebundle

        return widget_mimebundle(self.widget, self.figure, TEXT_FALLBACK, **kwargs)
