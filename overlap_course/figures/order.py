"""The order view: the same spans as the to-scale view, with time replaced by order.

On the CPU stand-in a decode forward takes ~3 ms and a launch ~0.02 ms, so to scale the
host's control work is a sliver; in the order view every stage is a labelled block of
readable width, placed in the order it really started, and the loop's passes are the
columns.  It is computed from the spans, never drawn by hand.  Exercise 03(b)'s answer
(:func:`issued_order`) can be drawn under the engine's, its first difference outlined.
"""

from __future__ import annotations

import html
import operator
import re

import plotly.graph_objects as go

from overlap_course.measure.contention import preempted
from toy_engine.timeline import PROCESS_STAGES, Timeline, owner_name
from toy_engine.validate import check_int

from .config import STATIC_WIDTH_PX
from .layout import apply_layout, cpu_text, heading
from .palette import PATTERNS, in_stage_order, stage_color
from .rounds import check_timeline, default_first_round

__all__ = ["order_figure", "issued_order"]

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
ORDER_Y = {"device": 0, "host": 1, "written": 2.15}


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
            passes.append(dict(host=[], launches=None))
        passes[-1]["host"].append(s)
    if not any(s.stage == "schedule" for s in host):
        passes = [dict(host=[s for s in host if s.round == r], launches=None)
                  for r in sorted({s.round for s in host})]
    for p in passes:
        launched = [s.round for s in p["host"] if s.stage in ("prepare", "launch_forward", "launch_sample")]
        if launched:
            p["launches"] = launched[0]
        elif not any(s.stage == "schedule" for s in host):
            p["launches"] = p["host"][0].round
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
    prefill = set(timeline.meta.prefill_rounds)
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
_PLOT_PX = STATIC_WIDTH_PX - 90  # the static image's width less the order view's margins: the narrowest drawn


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
    return [(_ISSUED[s.stage], s.round) for s in check_timeline(timeline).lane("host")
            if s.stage in _ISSUED and (keep is None or s.round in keep)]


def _plans_nothing(block: dict, column: dict) -> bool:
    """A schedule in a pass that launches nothing found no round to plan: its span keeps the last
    round's number (the engine's choice), which must not read as that round planned twice."""
    return block["span"].stage == "schedule" and column["launches"] is None


def _order_hover(block: dict, column: dict) -> str:
    s = block["span"]
    label, does = _ORDER_LABELS.get(s.stage, (s.stage, "works for round {r}"))
    if _plans_nothing(block, column):
        does = "finds nothing left to launch (the span keeps the number of round {r}, the last one launched)"
    where = (f"in the loop pass that launches round {column['launches']}" if column["launches"] is not None
             else "in the last loop pass (nothing left to launch)")
    owner = s.round if s.owner is None and s.stage in ("sample", "launch_sample") else s.owner
    text = (f"<b>{html.escape(s.stage)}</b> ({s.lane}) · round {s.round}<br>{does.format(r=s.round)}<br>"
            f"result owner: {owner_name(owner) or '—'}<br>{where}<br>"
            f"duration {s.duration_ms:.3f} ms · {cpu_text(s)}")
    if s.label:
        text += f"<br>{html.escape(s.label)}"
    if not block["in_window"]:
        text += "<br><i>another round's work in the same pass</i>"
    return text


def _stage_blocks(stage: str, blocks: list[dict], columns: list[dict]) -> go.Bar:
    """One stage's blocks: labelled, faded outside the window, the flush hatched and outlined."""
    label = _ORDER_LABELS.get(stage, (stage, ""))[0]
    flush = stage == "flush"
    return go.Bar(
        name=stage, legendgroup=stage, orientation="h",
        y=[ORDER_Y[b["span"].lane] for b in blocks], base=[b["x0"] + 0.04 for b in blocks],
        x=[b["x1"] - b["x0"] - 0.08 for b in blocks], width=0.78,
        text=[f"{label}: none" if _plans_nothing(b, columns[b["column"]]) else f"{label} r{b['span'].round}"
              for b in blocks], textposition="inside",
        insidetextanchor="middle", textangle=-90, textfont=dict(size=11),
        hovertext=[_order_hover(b, columns[b["column"]]) for b in blocks],
        hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=stage_color(stage),
                    opacity=[1.0 if b["in_window"] else 0.3 for b in blocks],
                    line=dict(color=["#5a2000" if flush else "rgba(0,0,0,0.5)" for b in blocks],
                              width=[2.5 if flush else 0.8 for b in blocks]),
                    pattern=dict(shape=[PATTERNS["flush"] if flush else PATTERNS["busy"] if preempted(b["span"]) else ""
                                        for b in blocks],
                                 fgcolor="rgba(255,255,255,0.85)" if flush else "rgba(0,0,0,0.6)", size=7)),
        meta=dict(kind="order", stage=stage,
                  spans=[[b["span"].lane, b["span"].stage, b["span"].round] for b in blocks]))


def _columns(columns: list[dict]) -> tuple[list[dict], list[dict]]:
    """(annotations, shapes): each pass's head and its dotted box, prefill passes tinted."""
    notes, shapes = [], []
    for c in columns:
        notes.append(dict(x=(c["x0"] + c["x1"]) / 2, y=1.62, xref="x", yref="y", text=f"<b>{c['head']}</b>",
                          showarrow=False, font=dict(size=_HEAD_FONT,
                                                     color="#8a3b00" if c["launches"] is None else "#222")))
        shapes.append(dict(type="rect", x0=c["x0"] - 0.3, x1=c["x1"] + 0.3, y0=-0.5, y1=1.5, xref="x", yref="y",
                           line=dict(color="rgba(0,0,0,0.25)", width=1, dash="dot"),
                           fillcolor="rgba(86,180,233,0.08)" if c["prefill"] else "rgba(0,0,0,0)", layer="below"))
    return notes, shapes


def _event_arrows(blocks: list[dict]) -> list[dict]:
    """From each round's sample (its completion event) to the host block that consumes it."""
    samples = {b["span"].round: b for b in blocks if b["span"].lane == "device" and b["span"].stage == "sample"}
    notes = []
    for b in blocks:
        s = b["span"]
        if s.lane == "host" and s.stage in PROCESS_STAGES and s.round in samples and b["in_window"]:
            src = samples[s.round]
            notes.append(dict(
                x=b["x0"] + 0.1, y=ORDER_Y["host"] - 0.39, ax=src["x1"] - 0.1, ay=ORDER_Y["device"] + 0.39,
                xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True, arrowhead=2, arrowsize=1.1,
                arrowwidth=1.6, arrowcolor="rgba(30,30,30,0.9)", name=f"event r{s.round}",
                hovertext=f"round {s.round}'s sample event: the device finished it, so the host's {s.stage} may read "
                          f"its output slot (StepState(round={s.round}))"))
    return notes


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
    first place it differs is outlined and named.  Anything but a list or tuple (``42``, a
    string, a set) is not drawn: the subtitle says why (a cell after a junk answer still runs).
    """
    num_rounds = check_int("num_rounds", num_rounds, 1)
    check_timeline(timeline)
    first = default_first_round(timeline) if first_round is None else check_int("first_round", first_round, 0)
    lay = _order_layout(timeline, first, num_rounds)
    by_stage: dict[str, list[dict]] = {}
    for b in lay["blocks"]:
        by_stage.setdefault(b["span"].stage, []).append(b)
    traces = [_stage_blocks(stage, by_stage[stage], lay["columns"]) for stage in in_stage_order(by_stage)]
    notes, shapes = _columns(lay["columns"])
    notes += _event_arrows(lay["blocks"])
    height, yrange = 560, [-0.6, 1.85]
    why = None if written is None or isinstance(written, (list, tuple)) else (
        f"your order is not drawn: it is of type {html.escape(type(written).__name__)}, not a "
        f"list of (stage, round) pairs")
    written = None if why else written
    if written is not None:
        traces += _written_traces(written, timeline, lay)
        height, yrange = 680, [-0.6, 2.75]
    fig = go.Figure(traces)
    for note in notes:
        fig.add_annotation(**note)
    for shape in shapes:
        fig.add_shape(**shape)
    ticks = [ORDER_Y["device"], ORDER_Y["host"]] + ([ORDER_Y["written"]] if written is not None else [])
    fig.update_yaxes(tickvals=ticks, ticktext=["device", "host", "you wrote"][:len(ticks)], range=yrange,
                     fixedrange=True, zeroline=False, showgrid=False)
    fig.update_xaxes(title="order, not time: a block spans those that started while it ran; widths are not "
                           "durations (hover: times)",
                     showticklabels=False, showgrid=False, zeroline=False,
                     range=_order_range(lay["columns"], lay["width"]))
    rounds, faded = _order_title(lay)
    apply_layout(fig, f"{heading(timeline, title)} · order view, {rounds}<br><sup>columns: loop passes; blocks in "
                      f"the order they started; arrows: sample event → the host's processing of that round"
                      + "".join(f"<br>{x}" for x in (faded, why) if x) + "</sup>", height=height)
    fig.update_layout(showlegend=False, bargap=0, uniformtext=dict(minsize=7, mode="show"),
                      margin=dict(l=70, r=20, t=90, b=50), meta=dict(view="order"))
    return fig


def _as_checked(pair: tuple) -> tuple:
    """A (stage, round) pair as check_three_rounds reads it, so that the figure agrees with the
    check (blind round 44: "Forward" passed there and was drawn as the first difference here):
    the stage by the checks' ``name`` (case, surrounding spaces and quotes ignored), the round
    as an integer (a numpy one too)."""
    from overlap_course.checks.answers import name  # the checks are imported only for a row
    stage, rnd = pair
    if name(stage) is None or isinstance(rnd, bool):
        return pair
    try:
        return name(stage), operator.index(rnd)
    except TypeError:
        return pair


def _written_traces(written, timeline: Timeline, lay: dict) -> list[go.Bar]:
    """The learner's order, item i under the engine's i-th issued step; the first difference outlined."""
    # A learner's list may hold anything: keep (stage, round) pairs, show the rest as written.
    shown = [tuple(x) if isinstance(x, (tuple, list)) and len(x) == 2 else (repr(x), "?")
             for x in written]
    written = [_as_checked(x) for x in shown]
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
        hovers.append(f"you wrote <b>{html.escape(str(shown[i]))}</b><br>the engine did "
                      f"<b>{html.escape(str(did)) if did else 'nothing more'}</b>" +
                      ("" if same else "<br><b>first difference</b>" if i == first_diff else "<br>differs"))
        colors.append(stage_color(host_stage))
        lines.append((3.5, "#000000") if i == first_diff else (0.8, "rgba(0,0,0,0.5)"))
    return [go.Bar(
        name="you wrote", orientation="h", y=[ORDER_Y["written"]] * len(written), base=xs, x=ws, width=0.6,
        text=texts, textposition="inside", insidetextanchor="middle", textangle=-90, textfont=dict(size=11),
        hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>",
        marker=dict(color=colors, line=dict(width=[w for w, _ in lines], color=[c for _, c in lines]),
                    pattern=dict(shape=["x" if i == first_diff else PATTERNS["flush"] if item[0] == "flush" else ""
                                        for i, item in enumerate(written)],
                                 fgcolor="rgba(0,0,0,0.6)", size=6)),
        meta=dict(kind="written", first_difference=first_diff, engine=[list(e) for e in engine]))]
