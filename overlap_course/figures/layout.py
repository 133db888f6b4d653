"""What the to-scale view, the order view and the explorer share: lanes, titles, hover text."""

from __future__ import annotations

import plotly.graph_objects as go

from overlap_course.measure.contention import cpu_share, late_ms, preempted
from toy_engine.timeline import Span, Timeline

LANE_Y = {"device": 0, "host": 1}  # numeric rows, so arrows can use data coordinates
BAR_WIDTH = 0.6


def heading(timeline: Timeline, title: str | None) -> str:
    """``title``, else the run's mode and device ("zos · cpu-process", "zos · cpu-process · PACED")."""
    paced = "PACED" if timeline.meta.pacing else None
    return title or " · ".join(x for x in (timeline.meta.mode, timeline.meta.device, paced) if x) or "timeline"


def cpu_text(span: Span) -> str:
    """The span's CPU share for its hover, and whether that means the machine was busy; for a paced span,
    its time model's duration beside the CPU time its real compute got, and whether it ended late."""
    if span.paced_ms is not None:
        text = (f"PACED: the time model gives {span.paced_ms:.3f} ms; the real compute got "
                f"{span.cpu_ms or 0.0:.3f} ms of CPU")
        if preempted(span):
            text += f" — <b>{late_ms(span):.3f} ms late: its compute did not fit, the machine was busy</b>"
        return text
    share = cpu_share(span)
    if share is None:
        return "CPU share not measured"
    text = f"CPU {span.cpu_ms:.3f} ms = {share:.0%} of wall"
    if preempted(span):
        text += " — <b>preempted: the machine was busy</b>"
    elif span.lane == "host" and span.stage == "wait":
        text += " (blocked on the event: low CPU is expected)"
    return text


def style_lanes(fig: go.Figure) -> None:
    """Two rows, host above device."""
    fig.update_yaxes(tickvals=[LANE_Y["device"], LANE_Y["host"]], ticktext=["device", "host"],
                     range=[-0.6, 1.75], fixedrange=True, zeroline=False, showgrid=False)


def apply_layout(fig: go.Figure, title: str, height: int) -> None:
    """The course's look: title top left, legend below, bars overlaid, hover on the nearest."""
    fig.update_layout(
        title=dict(text=title, x=0.01), barmode="overlay", height=height, template="plotly_white",
        uniformtext=dict(minsize=8, mode="hide"),  # "r5" only where the bar is wide enough
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, traceorder="normal"),
        hovermode="closest", margin=dict(l=60, r=20, t=80, b=40), meta=dict(view="scale"))
