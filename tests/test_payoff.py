"""When does overlap pay? (overlap_course/figures/payoff.py, site/overlap_pays.md).

The maths against hand-computed cases and against the toy's own counts; every published point
with its reference, date and workload, drawn where its source puts it; the learner's points
where the bench puts them (a bench result built from the shipped quiet-machine runs' stats and
the bench's own ratios, so no engine runs here); the widget's sliders; the site's page and its
stored image, which must show the current figure.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from overlap_course import figures
from overlap_course.figures import payoff
from overlap_course.measure import bench
from overlap_course.traces.recorded import recorded_runs

REPO = Path(__file__).resolve().parent.parent


def _site_build():
    spec = importlib.util.spec_from_file_location("site_build", REPO / "site" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def _recorded_bench(busy: str = "") -> dict:
    """What run_bench returns, from the shipped runs' stats: modes, then the bench's ratios."""
    modes = {mode: dataclasses.asdict(timeline.meta.stats) for drafts, suffix in ((0, ""), (4, "+spec"))
             for mode, timeline in ((f"{m}{suffix}", t) for m, t in recorded_runs(0.0, drafts=drafts).items())}
    return {"workload": dict(host_overhead_ms=0.0), "device": "cpu-process", "modes": modes,
            **bench._ratios(modes), "busy_warning": busy}


def _trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


@pytest.mark.parametrize("host, device, want", [
    (1.0, 4.0, 1.25), (4.0, 1.0, 1.25), (2.0, 2.0, 2.0), (3.0, 5.0, 1.6), (0.0, 5.0, 1.0), (2.5, 7.5, 4 / 3)])
def test_ideal_ratio_by_hand(host, device, want):
    assert payoff.ideal_ratio(host, device) == pytest.approx(want)


def test_the_curve_is_one_over_the_larger_share():
    x, y = payoff._curve()
    for share, ideal in zip(x, y):
        assert ideal == pytest.approx(1 / max(share / 100, 1 - share / 100))
    assert max(y) == pytest.approx(2.0) and y[x.index(50.0)] == pytest.approx(2.0)
    assert y[x.index(24.0)] == pytest.approx(1 / 0.76) == y[x.index(76.0)]


@pytest.mark.parametrize("speedup", [1.05, 1.1, 1.5, 2.0])
def test_implied_host_share_inverts_the_ideal(speedup):
    share = payoff.implied_host_share(speedup)
    assert 0 <= share <= 0.5
    assert payoff.ideal_ratio(share, 1 - share) == pytest.approx(speedup)


@pytest.mark.parametrize("drafts, acceptance, want", [(0, 0.7, 1.0), (4, 0.5, 3.0), (4, 1.0, 5.0), (2, 0.25, 1.5)])
def test_tokens_per_round_by_hand(drafts, acceptance, want):
    assert payoff.tokens_per_round(drafts, acceptance) == pytest.approx(want)


def test_tokens_per_round_is_the_toy_s_own_count():
    """The acceptance rate notebook 04 prints (accepted / proposed drafts) gives the toy's
    mean_accepted_per_round: 1 + a*k tokens per request and decode round."""
    spec = recorded_runs(0.0, drafts=4)["serial"]
    s, k = spec.meta.stats, spec.meta.num_draft_tokens
    acceptance = s.draft_tokens_accepted / s.draft_tokens_proposed
    assert 0 < acceptance < 1
    assert payoff.tokens_per_round(k, acceptance) == pytest.approx(1 + s.mean_accepted_per_round)


REFERENCE = re.compile(r"\b[\w.-]+/[\w.-]+\b.*(PR|issue) #\d+|\b[\w.-]+/[\w.-]+\b.*\.md\b")


@pytest.mark.parametrize("point", payoff.PUBLISHED, ids=lambda p: p.engine.split(",")[0])
def test_every_published_point_has_a_reference_a_date_and_a_workload(point):
    assert REFERENCE.search(point.reference), f"{point.engine}: {point.reference!r} names no repository and PR or file"
    assert point.url.startswith("https://") and re.fullmatch(r"20\d\d-\d\d-\d\d", point.date), (point.url, point.date)
    for field in ("measured", "workload", "drawn_at", "not_the_toy"):
        assert len(getattr(point, field).split()) >= 5, f"{point.engine}: {field} says too little"
    low, high = point.speedup
    if point.counter:  # no gain: drawn at x1, the device-bound end
        assert (low, high) == (1.0, 1.0) and point.host_share == (0.0, 0.0)
    else:
        assert 1 < low <= high <= 2 and 0 < point.host_share[0] <= point.host_share[1] <= 0.5
    assert point.url in payoff._LABELS, f"{point.engine}: no label place or colour in _LABELS"


def _by(number: str) -> payoff.Published:
    """The published point whose URL ends in ``number`` (its PR, issue or blog path)."""
    return next(p for p in payoff.PUBLISHED if p.url.rstrip("/").endswith(number))


def test_published_points_sit_where_their_sources_put_them():
    hf, sglang, vllm = _by("continuous_async"), _by("sglang-v0-4"), _by("23569")
    # Hugging Face: 300.6 s -> 234.5 s, GPU idle 24.0% of the synchronous run; their ceiling 300 -> 228 s.
    assert hf.speedup == (pytest.approx(1.2819, abs=1e-4),) * 2 and hf.host_share == (0.24, 0.24)
    assert payoff.ideal_ratio(0.24, 0.76) == pytest.approx(300 / 228, abs=2e-3)
    assert payoff.ideal_ratio(0.24, 0.76) > hf.speedup[0]  # measured short of the ceiling: under the curve
    assert sglang.speedup == (1.1, 1.1) and vllm.speedup == (1.05, 1.10) and vllm.expected and not sglang.expected
    # The numbers each PR or issue printed (issue 36): before -> after, or the share measured.
    assert _by("12128").speedup[0] == pytest.approx(159.71 / 140.52)  # about 13%
    assert _by("15591").speedup[0] == pytest.approx(1.1455, abs=1e-4)  # +14.5%
    assert _by("20547").speedup[0] == pytest.approx(1.2758, abs=1e-4)  # +27.6% on B200
    assert _by("32618").speedup[0] == pytest.approx(1.308)  # +30.8%, PP 4
    llama = _by("7456")
    assert llama.ceiling and llama.host_share == (0.10, 0.15)
    assert llama.drawn_at.startswith("measured")
    ceilings = [payoff.ideal_ratio(c, 1 - c) for c in llama.host_share]
    assert ceilings == pytest.approx(list(llama.speedup))
    assert llama.speedup[1] == pytest.approx(1.18, abs=0.005)  # the "at best x1.18"
    h800 = _by("23005")
    assert h800.counter and h800.speedup == (1.0, 1.0) and "H800" in h800.workload
    for p in payoff.PUBLISHED:
        if p.drawn_at.startswith("implied"):  # on the curve by construction
            for share, speedup in zip(p.host_share, p.speedup):
                assert payoff.ideal_ratio(share, 1 - share) == pytest.approx(speedup)
    fig = payoff.payoff_figure()
    for p in payoff.PUBLISHED:
        trace = next(t for t in fig.data if t.name.startswith(p.engine))
        assert list(trace.x) == pytest.approx([100 * s for s in p.host_share]) and list(trace.y) == list(p.speedup)
    names = " ".join(t.name for t in fig.data)
    assert "at most x1.11–1.18" in names and "x1 (no gain)" in names


def test_the_learner_points_land_where_the_bench_says():
    result = _recorded_bench()
    points = payoff.bench_points(result)
    assert [p.label.split(": ")[1].split(" (")[0] for p in points] == ["zos / serial", "zos+spec / serial+spec"]
    fig = payoff.payoff_figure(points)
    for p, key in zip(points, ("zos / serial", "zos+spec / serial+spec")):
        slow = result["modes"][key.split(" / ")[1]]
        host, device = slow["mean_host_ms_per_round"], slow["mean_device_ms_per_round"]
        assert p.host_share == pytest.approx(host / (host + device))
        assert p.ideal == pytest.approx(result[key]["ideal_ratio"])
        assert p.speedup == result[key]["throughput_ratio"]
        trace = next(t for t in fig.data if t.name.startswith(p.label))
        assert list(trace.x) == pytest.approx([100 * p.host_share] * 2)
        assert list(trace.y) == pytest.approx([p.ideal, p.speedup])
        assert "busy" not in trace.name


def test_a_busy_bench_says_so_on_its_points():
    points = payoff.bench_points(_recorded_bench(busy="WARNING: machine busy."))
    assert points and all(p.busy for p in points)
    assert all(t.name.endswith("busy machine") for t in payoff.payoff_figure(points).data if t.name.startswith("your"))


def test_two_runs_make_a_point_from_their_stats_as_dict_or_attributes():
    runs = recorded_runs(0.0)
    serial, zos = runs["serial"].meta.stats, runs["zos"].meta.stats
    point = payoff.measured(serial, zos, "section 3")
    assert point == payoff.measured(dataclasses.asdict(serial), dataclasses.asdict(zos), "section 3")
    assert point.speedup == pytest.approx(zos.tokens_per_s / serial.tokens_per_s)
    assert point.ideal == pytest.approx(bench.ideal_ratio(serial.mean_host_ms_per_round,
                                                          serial.mean_device_ms_per_round))


def test_the_widget_moves_its_point_and_says_what_a_round_yields():
    result = _recorded_bench()
    first = payoff.bench_points(result)[0]
    mine = payoff.measured(result["modes"]["serial"], result["modes"]["zos"], "mine")
    explorer = figures.PayoffExplorer(result, mine)
    assert len(explorer.points) == 3
    assert (explorer.host.value, explorer.device.value) == (pytest.approx(first.host_ms, abs=0.05),
                                                           pytest.approx(first.device_ms, abs=0.05))
    assert explorer.acceptance.disabled
    explorer.host.value, explorer.device.value = 3.0, 1.0
    sliders = _trace(explorer.figure, payoff.SLIDERS)
    assert list(sliders.x) == pytest.approx([75.0]) and list(sliders.y) == pytest.approx([4 / 3])
    assert "ideal x1.33" in explorer.readout.value and "the host lane bounds" in explorer.readout.value
    explorer.drafts.value, explorer.acceptance.value = 4, 0.5
    assert not explorer.acceptance.disabled
    text = explorer.readout.value
    assert "= 3.00" in text and "750 tok/s serial, 1000 tok/s overlapped" in text and "ideal x1.33" in text
    explorer.widget.close()


def test_the_site_page_includes_the_figure_and_the_published_numbers(tmp_path):
    build = _site_build()
    build.draw_pages(tmp_path)
    page = (REPO / "site" / "overlap_pays.md").read_text()
    figure = tmp_path / "_generated" / "overlap_pays_figure.html"
    numbers = tmp_path / "_generated" / "overlap_pays_published.md"
    assert f":file: {figure.relative_to(tmp_path)}" in page and f"{{include}} {numbers.relative_to(tmp_path)}" in page
    html = figure.read_text()
    assert "Plotly.newPlot" in html and "data:image/png;base64," in html and "When does overlap pay?" in html
    assert '"showSendToCloud": false' in html
    text = numbers.read_text()
    for p in payoff.PUBLISHED:
        assert f"]({p.url}), {p.date}" in text and p.workload in text
    assert re.search(r"^overlap_pays$", (REPO / "site" / "index.md").read_text(), re.M), "site/index.md's toctree"


def test_the_stored_image_is_the_current_figure():
    build = _site_build()
    fig = build.drawn_figures()["overlap_pays"]
    build.stored_image("overlap_pays", fig)  # raises when missing or stale
    fig["data"][1]["y"] = [1.5, 1.5]  # a published number changed, the image not redrawn
    with pytest.raises(ValueError, match=r"older version.*python site/build.py --draw"):
        build.stored_image("overlap_pays", fig)
