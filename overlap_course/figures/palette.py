"""The colours and patterns every figure uses, so a stage looks the same in every view.

Colours are the Okabe-Ito set (readable with the common colour-vision deficiencies), and
the three things that must never be told apart by colour alone carry patterns: device
idle ``x``, machine busy ``\\``, flush ``/``.
"""

from __future__ import annotations

import zlib

#: Fixed stage colours (Okabe-Ito, plus lighter tints of it).  Host control work is
#: green, launches yellow, waiting pale grey, result processing orange / vermillion,
#: deliberate overhead reddish purple; device work blue.  The order is the legend's.
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
#: Unknown stages (a real trace's kernels, a learner's own) get one of these, by a stable hash.
FALLBACK_COLORS = ("#999999", "#882255", "#44aa99", "#ddcc77", "#117733", "#aa4499")
_STAGE_ORDER = list(STAGE_COLORS)


def stage_color(stage: str) -> str:
    """The stage's fixed colour; an unknown stage gets a stable fallback colour."""
    return STAGE_COLORS.get(stage) or FALLBACK_COLORS[zlib.crc32(stage.encode()) % len(FALLBACK_COLORS)]


def in_stage_order(stages) -> list[str]:
    """``stages`` in the palette's order (the loop's), unknown ones after them by name."""
    return sorted(stages, key=lambda st: (_STAGE_ORDER.index(st) if st in STAGE_COLORS else len(_STAGE_ORDER), st))
