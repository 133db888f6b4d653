"""The one-page "three rounds" handout (overlap_course/build/handout.py) tells the truth about its traces.

The built page must show rounds 0-2 of both recorded runs (and the ZOS run's flush) and the
real A100 trace beside them, say where the traces were recorded, state numbers equal to those recomputed here from the raw
JSON files (spans and the engine's own recorded stats, not the handout's code), and load
nothing from the network.  tests/browser/test_handout_browser.py prints and looks at it.
Building needs Chromium (the ``built_handout`` fixture in tests/conftest.py).
"""

from __future__ import annotations

import base64
import json
import re
import statistics
from html import unescape
from pathlib import Path

import pytest

from overlap_course.build import handout
from overlap_course.traces.recorded import TRACES_DIR

MODES = ("serial", "zos")


def _raw(mode: str) -> dict:
    return json.loads((TRACES_DIR / f"cpu_{mode}.json").read_text())


@pytest.fixture(scope="module")
def built(built_handout):
    page, pdf = built_handout
    return page.read_text(encoding="utf-8"), pdf


def _svgs(page: str) -> list[str]:
    return [base64.b64decode(data).decode("utf-8")
            for data in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)]


def _block_x(svg: str) -> dict[str, float]:
    """Where each labelled block of an order view is drawn (x of its label, px)."""
    return {label: float(x) for x, label in
            re.findall(r'class="bartext[^"]*"[^>]*transform="translate\(([-\d.]+),[^"]*">([^<]+)</text>', svg)}


def _cell(page: str, cell_id: str) -> str:
    match = re.search(rf'id="{re.escape(cell_id)}">([^<]*)<', page)
    assert match, f"the handout has no element {cell_id!r}"
    return unescape(match.group(1))


def _expected(mode: str) -> dict:
    """The handout's numbers, recomputed from the raw trace file."""
    trace = _raw(mode)
    spans = trace["spans"]
    device = sorted((s["start_ms"], s["end_ms"]) for s in spans if s["lane"] == "device")
    shown = [s for s in spans if 0 <= s["round"] <= 2]
    t0 = min(s["start_ms"] for s in shown if s["lane"] == "device")
    t1 = max(s["end_ms"] for s in shown if s["lane"] == "host" and s["stage"] in ("postprocess", "flush"))
    busy, reached = 0.0, t0  # union of device work inside [t0, t1]
    for a, b in device:
        a, b = max(a, reached), min(b, t1)
        if b > a:
            busy, reached = busy + b - a, b
    prefill = set(trace["meta"]["prefill_rounds"])
    return dict(
        decode_idle=trace["meta"]["stats"]["decode_device_idle_fraction"],  # the engine's own number
        window_ms=t1 - t0,
        window_idle_ms=(t1 - t0) - busy,
        run_ms=max(s["end_ms"] for s in spans) - min(s["start_ms"] for s in spans),
        forward_ms=statistics.median(s["end_ms"] - s["start_ms"] for s in spans
                                     if s["stage"] == "forward" and s["round"] not in prefill),
        launch_ms=statistics.median(s["end_ms"] - s["start_ms"] for s in spans if s["stage"] == "launch_forward"),
    )


def test_numbers_are_the_traces():
    """handout.numbers() agrees with the raw files (no browser needed)."""
    for mode in MODES:
        got, want = handout.numbers(handout.load_runs()[mode]), _expected(mode)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (mode, key, got[key], value)
    assert _expected("serial")["decode_idle"] > _expected("zos")["decode_idle"]  # the claim the page makes


def test_page_states_the_traces_numbers(built):
    page, _ = built
    for mode in MODES:
        want = _expected(mode)
        assert _cell(page, f"{mode}-decode_idle") == f"{want['decode_idle']:.1%}"
        assert _cell(page, f"{mode}-window_ms") == f"{want['window_ms']:.1f} ms"
        assert _cell(page, f"{mode}-window_idle_ms") == f"{want['window_idle_ms']:.1f} ms"
        assert _cell(page, f"{mode}-run_ms") == f"{want['run_ms']:.1f} ms"
    serial = _expected("serial")
    assert _cell(page, "forward-ms") == f"{serial['forward_ms']:.1f}"
    assert _cell(page, "launch-ms") == f"{serial['launch_ms']:.2f}"
    assert f"{_raw('serial')['meta']['stats']['tokens']} tokens" in page


def test_page_says_where_the_traces_come_from(built):
    page, _ = built
    provenance = unescape(re.sub(r"<[^>]+>", "", page.split('id="provenance">')[1].split("</div>")[0]))
    for mode in MODES:
        rec = _raw(mode)["meta"]["annotations"]["recorded"]
        assert f"cpu_{mode}.json" in provenance
        assert rec["machine"]["node"] in provenance
        assert rec["date"][:16].replace("T", " ") in provenance
        assert f"commit {rec['commit'][:10]}" in provenance
    assert _raw("serial")["meta"]["annotations"]["recorded"]["command"] in provenance


def test_figures_show_three_rounds_of_each_mode_and_the_flush(built):
    page, _ = built
    serial, zos, _real, end = _svgs(page)  # in page order: the real trace sits under the two order views
    for svg in (serial, zos):
        assert "round 0 · prefill" in svg and "round 1" in svg and "round 2" in svg
        for r in range(3):
            assert f"forward r{r}" in svg and f"sample r{r}" in svg and f"postprocess r{r}" in svg
    # serial processes round 1 in round 1's pass; ZOS in round 2's, after launching round 2's forward
    x = _block_x(serial)
    assert x["launch sample r1"] < x["postprocess r1"] < x["launch fwd r2"]
    x = _block_x(zos)
    assert x["launch fwd r0"] < x["postprocess r0"] < x["launch fwd r1"]  # prefill: processed at once
    assert x["launch fwd r2"] < x["postprocess r1"] < x["launch sample r2"]
    last = max(s["round"] for s in _raw("zos")["spans"])
    assert f"FLUSH r{last}" in end
    assert "FLUSH" not in serial + zos


def test_nothing_comes_from_the_network(built):
    page, _ = built
    text = re.sub(r'src="data:image/svg\+xml;base64,[A-Za-z0-9+/=]+"', "", page)
    assert not re.search(r"(https?:)?//|@import|\bsrc=|<link\b|<script\b", text), "the page loads something"
    for svg in _svgs(page):
        # XML namespace names look like URLs but are never fetched
        rest = re.sub(r'xmlns(:\w+)?="[^"]*"', "", svg)
        assert not re.search(r"https?:|@import|url\((?![\'\"]?#)", rest), "a figure refers to something outside itself"


# ---------------------------------------------------------------------------- the real trace beside the toy's

def _real_expected() -> dict:
    """The real-trace panel's numbers, from overlap_course.traces.kineto on the shipped file (HTA's figures:
    tests/test_kineto.py checks kineto against HTA on it)."""
    from overlap_course.traces import kineto

    s, after = kineto.summary(handout.REAL_TRACE), kineto.idle_after_syncs(handout.REAL_TRACE)
    gap = max(after["gaps"], key=lambda g: g["idle_us"])
    return dict(idle=s["device_idle_fraction"], gap_us=gap["idle_us"], sync=gap["sync"])


def test_real_numbers_are_the_files():
    want, got = _real_expected(), handout.real_numbers()
    assert (got["idle"], got["gap_us"], got["gap_sync"]) == (want["idle"], want["gap_us"], want["sync"])
    assert got["device"].startswith("NVIDIA A100") and got["file"] == "a100_event_sync.json.gz"


def test_page_shows_the_real_trace_with_its_provenance(built):
    page, _ = built
    want = _real_expected()
    assert _cell(page, "real-idle") == f"{want['idle']:.1%}"
    assert _cell(page, "real-gap") == f"{want['gap_us']:.0f} µs"
    assert _cell(page, "real-sync") == want["sync"]
    provenance = unescape(re.sub(r"<[^>]+>", "", page.split('id="real-provenance">')[1].split("</div>")[0]))
    note = (handout.kineto.REAL_TRACES_DIR / "README.md").read_text()
    commit = re.search(r"at commit ([0-9a-f]{40})", note).group(1)
    for part in ("overlap_course/traces/a100/a100_event_sync.json.gz", "NVIDIA A100", "torch.profiler",
                 "facebookresearch/HolisticTraceAnalysis", commit[:10], "MIT"):
        assert part in provenance, part
    real = _svgs(page)[2]
    assert f"{want['gap_us']:.0f} µs idle after {want['sync']}" in real
    assert "host" in real and "device" in real
