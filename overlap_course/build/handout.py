"""A one-page "three rounds" handout for workshops: serial vs ZOS, drawn from recorded traces.

    python -m overlap_course.build.handout            # -> build/handout/three_rounds.html and .pdf

The page shows rounds 0-2 of the shipped quiet-machine traces (``traces/cpu_serial.json``,
``traces/cpu_zos.json``) in the order view (:func:`overlap_course.figures.order_figure`), the ZOS
run's last round with its flush, a few lines on how to read them, and numbers computed
from the same traces.  Rounds 0-2 rather than a steady-state window because they hold
both rules a learner must see: the prefill round processed in its own pass, the decode
rounds deferred to the next one.

Under the two order views a strip shows a real GPU trace to scale: the A100 event-sync trace
shipped in ``traces/a100/`` (a PyTorch-profiler trace from HTA's MIT-licensed test data, with
its provenance line), where the GPU idles after a host sync as the serial loop's device idles
after its wait; its numbers come from :mod:`overlap_course.traces.kineto` on the same file.

The page is A4 *landscape*: an order view of three rounds wants width for its vertical
labels (``docs/measurements/figures.md`` has the sizes).

Figures are SVG drawn by kaleido with the Chromium that draws the notebooks' static images
(:func:`overlap_course.build.drawing.render_images`), embedded as ``data:`` URIs, so the page needs
no network and prints as vectors; the same Chromium prints the PDF (``--print-to-pdf``),
and the page's CSS ``@page`` rule sets the paper.
"""

from __future__ import annotations

from overlap_course.ctrl_c import interruptible

interruptible(__name__, "handout")  # first: Ctrl-C while the imports run is one line

import base64
import html
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overlap_course import figures
from overlap_course.build import drawing
from overlap_course.command_line import PATH_CHARS, Parser, fail, os_problem, out_folder, run
from overlap_course.figures.rounds import decode_rounds, round_window
from overlap_course.safe_json import quoted, refuse_unwritable, write_file
from overlap_course.traces import kineto
from overlap_course.traces.recorded import load_trace, recorded_label, recording
from toy_engine.timeline import Timeline

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "build" / "handout"
FIRST_ROUND, NUM_ROUNDS = 0, 3
# Figure sizes in CSS px (1/96 in), so the SVGs are drawn at the size they print:
# A4 landscape minus 8 mm margins is 1062 x 733 px; the left column holds the two main
# figures, the right one (88 mm) the flush figure and the notes.
MAIN_SIZE, FLUSH_SIZE, REAL_SIZE = (700, 240), (336, 228), (700, 70)
REAL_TRACE = "a100_event_sync"


def load_runs() -> dict[str, Timeline]:
    """The two recorded traces, by mode."""
    return {mode: load_trace(f"cpu_{mode}") for mode in ("serial", "zos")}


def numbers(timeline: Timeline) -> dict:
    """What the handout states about one trace, computed from its spans."""
    t0, t1 = round_window(timeline, FIRST_ROUND, FIRST_ROUND + NUM_ROUNDS - 1)
    decode = decode_rounds(timeline)
    forwards = [s.duration_ms for s in timeline.lane("device") if s.stage == "forward" and s.round in decode]
    launches = [s.duration_ms for s in timeline.lane("host") if s.stage == "launch_forward"]
    spans = timeline.spans
    return dict(
        decode_idle=timeline.device_idle_fraction(decode),
        decode_rounds=len(decode),
        window_ms=t1 - t0,
        window_idle_ms=sum(b - a for a, b in timeline.device_gaps(t0, t1)),
        run_ms=max(s.end_ms for s in spans) - min(s.start_ms for s in spans),
        forward_ms=statistics.median(forwards),
        launch_ms=statistics.median(launches),
    )


def real_numbers(name: str = REAL_TRACE) -> dict:
    """What the handout states about the real trace, from :mod:`overlap_course.traces.kineto` on its file."""
    s, after = kineto.summary(name), kineto.idle_after_syncs(name)
    gap = max(after["gaps"], key=lambda g: g["idle_us"])
    readme = (kineto.REAL_TRACES_DIR / "README.md").read_text()
    commit = re.search(r"at commit ([0-9a-f]{7,40})", readme)
    return dict(idle=s["device_idle_fraction"], idle_us=s["device_idle_us"], span_us=s["device_span_us"],
                gap_us=gap["idle_us"], gap_sync=gap["sync"], gap_mid_ms=(gap["start_us"] + gap["end_us"]) / 2000,
                device=kineto.to_timeline(name).meta.device,
                file=kineto.real_traces()[name].name, commit=commit.group(1)[:10] if commit else "?")


def _real_figure(name: str = REAL_TRACE) -> dict:
    """The real trace to scale, host above device, its longest gap labelled."""
    timeline = kineto.to_timeline(name)
    rnd = timeline.rounds()[0]
    fig = figures.timeline_figure(timeline, first_round=rnd, num_rounds=1, context=False)
    num = real_numbers(name)
    fig.layout.annotations = ()
    mid = num["gap_mid_ms"] - min(sp.start_ms for sp in timeline.lane("device"))
    fig.add_annotation(x=mid, y=0, text=f"{num['gap_us']:.0f} µs idle after {num['gap_sync']}", showarrow=False,
                       font=dict(size=11, color="#222"), bgcolor="rgba(255,255,255,0.85)")
    width, height = REAL_SIZE
    fig.update_layout(title=None, width=width, height=height, showlegend=False, margin=dict(l=48, r=6, t=2, b=18))
    fig.update_xaxes(title=None, ticksuffix=" ms", tickfont=dict(size=9))
    return fig.to_dict()


def _figures(runs: dict[str, Timeline]) -> list[dict]:
    """Serial rounds 0-2, ZOS rounds 0-2, ZOS last round (its flush), sized for the page."""
    zos = runs["zos"]
    last = zos.rounds()[-1]
    figs = [figures.order_figure(runs["serial"], FIRST_ROUND, NUM_ROUNDS),
            figures.order_figure(zos, FIRST_ROUND, NUM_ROUNDS),
            figures.order_figure(zos, last, 1)]
    for fig, (width, height) in zip(figs, (MAIN_SIZE, MAIN_SIZE, FLUSH_SIZE)):
        # The page's captions replace the titles; "hover for times" means nothing on paper.
        fig.update_layout(title=None, width=width, height=height, margin=dict(l=48, r=6, t=6, b=6))
        fig.update_xaxes(title=None)
    # The flush figure's two column heads would overlap: its caption says what "end" is.
    figs[2].for_each_annotation(lambda a: a.update(text="<b>end</b>"), selector=lambda a: "nothing left" in (a.text or ""))
    return [fig.to_dict() for fig in figs] + [_real_figure()]


def _img(svg: bytes, alt: str) -> str:
    data = base64.b64encode(svg).decode("ascii")
    return f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(alt)}">'


CSS = """
@page { size: A4 landscape; margin: 8mm; }
* { box-sizing: border-box; }
body { margin: 0; font: 8.2pt/1.28 "Liberation Sans", Arial, sans-serif; color: #222; }
.page { width: 281mm; height: 193mm; overflow: hidden; display: grid; gap: 1mm 5mm;
        grid-template-columns: 186mm 90mm; grid-template-rows: auto 1fr; }
header { grid-column: 1 / 3; border-bottom: 1px solid #999; padding-bottom: 1mm; }
h1 { font-size: 14pt; margin: 0; }
.source { font-size: 7.6pt; color: #444; }
#real-provenance { font-size: 7pt; line-height: 1.15; }
figure { margin: 0 0 1mm 0; }
figcaption { font-weight: bold; font-size: 8.6pt; }
figcaption span { font-weight: normal; }
img { display: block; }
h2 { font-size: 9.4pt; margin: 1.2mm 0 0.4mm 0; }
p, ol { margin: 0 0 0.8mm 0; }
ol { padding-left: 4.5mm; }
table { border-collapse: collapse; width: 100%; font-size: 8.2pt; }
td, th { border-bottom: 1px solid #ccc; padding: 0.4mm 1mm; text-align: right; }
td:first-child, th:first-child { text-align: left; }
"""


def _header(runs: dict[str, Timeline]) -> str:
    """The title and where the two traces come from."""
    serial = runs["serial"]
    rec, work = recording(serial), serial.meta.workload
    labels = {mode: recorded_label(tl) for mode, tl in runs.items()}
    where = (labels["serial"] if labels["serial"] == labels["zos"]
             else f"serial: {labels['serial']}; ZOS: {labels['zos']}")
    return f"""<header>
<h1>Three rounds of the toy engine: serial loop vs zero-overhead scheduling (ZOS)</h1>
<div class="source" id="provenance">Recorded traces <code>overlap_course/traces/cpu_serial.json</code>
and <code>cpu_zos.json</code>: {html.escape(where)};
{work.requests} requests × {work.max_new_tokens} new tokens, device = a CPU process
({html.escape(str(serial.meta.device))}), written by <code>{html.escape(rec.command)}</code>.
Every block is a recorded span, placed in the order it started. Rebuild: <code>./run.sh handout</code>.</div>
</header>
"""


def _figures_column(svgs: list[bytes], rounds: str) -> str:
    """The two order views and the real GPU trace beneath them."""
    real = real_numbers()
    return f"""<div>
<figure id="fig-serial"><figcaption>Serial, {rounds} <span>— each pass launches its round, waits for it and
processes it before the next round is planned: meanwhile the device has nothing queued.</span></figcaption>
{_img(svgs[0], f"order view of the serial run, {rounds}")}</figure>
<figure id="fig-zos"><figcaption>ZOS, {rounds} <span>— from round 2 on, a pass launches this round's forward,
processes the previous round while it runs, then launches this round's sample.</span></figcaption>
{_img(svgs[1], f"order view of the ZOS run, {rounds}")}</figure>
<figure id="fig-real"><figcaption>A real GPU, the same gap <span>— a PyTorch-profiler trace to scale: the GPU (lower
row) is idle <span id="real-idle">{real['idle']:.1%}</span> of {real['span_us']:.0f} µs; its longest gap,
<span id="real-gap">{real['gap_us']:.0f} µs</span>, follows <span id="real-sync">{html.escape(str(real['gap_sync']))}</span>
(the host reading a GPU value), as the serial loop's device idles after its wait.</span></figcaption>
{_img(svgs[3], f"the real trace {real['file']} to scale")}
<div class="source" id="real-provenance"><code>overlap_course/traces/a100/{html.escape(real['file'])}</code>: recorded on an
{html.escape(real['device'])} with torch.profiler by the authors of HTA (test data of
facebookresearch/HolisticTraceAnalysis, commit {html.escape(real['commit'])}, MIT license); idle as HTA counts it,
<code>./run.sh trace summary</code>; notebook 06.</div></figure>
</div>
"""


def _notes_column(runs: dict[str, Timeline], svgs: list[bytes], rounds: str) -> str:
    """The flush figure, how to read the page, the three rules and the numbers."""
    serial, zos = runs["serial"], runs["zos"]
    s, z = numbers(serial), numbers(zos)
    last = zos.rounds()[-1]

    def row(label: str, key: str, fmt) -> str:
        return (f"<tr><td>{label}</td><td id=\"serial-{key}\">{fmt(s[key])}</td>"
                f"<td id=\"zos-{key}\">{fmt(z[key])}</td></tr>")

    return f"""<div>
<figure id="fig-flush"><figcaption>ZOS, round {last} and the end <span>— the last pass has nothing left to launch:
it only waits for round {last} and flushes it.</span></figcaption>
{_img(svgs[2], f"order view of the ZOS run's last round {last} and its flush")}</figure>
<h2>How to read it</h2>
<p>A column is one pass of the host loop, headed by the round it launches: host blocks above, device
blocks below, each naming its stage and round (<b>r1</b> = round 1). Widths show <i>order</i>, not time
(serial trace: a decode forward took <span id="forward-ms">{s['forward_ms']:.1f}</span> ms, launching it
<span id="launch-ms">{s['launch_ms']:.2f}</span> ms). Faded blocks belong to other rounds.
An <b>arrow</b> leads from a round's <i>sample</i> on the device (its completion event) to the host step
that first reads that round's tokens: its postprocess, or the flush.</p>
<h2>The ZOS order, and its three rules</h2>
<ol>
<li><b>This round's forward, the previous round's postprocess, this round's sampling.</b> The forward
needs nothing the host has yet to commit; the sample may (a grammar mask built from the text so far),
so it is launched only after the previous round is committed.</li>
<li><b>Prefill is processed at once</b>, in its own pass (round 0); <b>decode is deferred</b> by one
pass: round 1's arrow lands in round 2's column.</li>
<li><b>Flush at the end:</b> after the last launch there is no next forward to hide behind, so one
more pass waits for round {last} and commits it. Without it, the requests in that round never
get their last token.</li>
</ol>
<h2>Measured on these two traces</h2>
<table id="numbers">
<tr><th></th><th>serial</th><th>ZOS</th></tr>
{row(f"device idle, {s['decode_rounds']} decode rounds", "decode_idle", lambda v: f"{v:.1%}")}
{row(f"{rounds}: first upload → last postprocess", "window_ms", lambda v: f"{v:.1f} ms")}
{row("&emsp;device idle inside them", "window_idle_ms", lambda v: f"{v:.1f} ms")}
{row("whole run, first to last span", "run_ms", lambda v: f"{v:.1f} ms")}
</table>
<p class="source">Both runs emit {serial.meta.stats.tokens} tokens; ZOS changes when
work runs, not which tokens come out. Your machine gives other times; the order is the same.</p>
</div>
"""


def page_html(runs: dict[str, Timeline], svgs: list[bytes]) -> str:
    """The handout as one self-contained HTML page."""
    rounds = f"rounds {FIRST_ROUND}–{FIRST_ROUND + NUM_ROUNDS - 1}"
    return (f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Three rounds: serial vs ZOS</title>
<style>{CSS}</style></head>
<body><div class="page">
"""
            + _header(runs) + _figures_column(svgs, rounds) + _notes_column(runs, svgs, rounds) + """</div></body></html>
""")


#: How long headless Chromium may take to print the page; one that takes longer is stuck.
PRINT_TIMEOUT_S = 120


def print_pdf(page: Path, pdf: Path) -> None:
    """Print ``page`` to ``pdf`` with headless Chromium; the page's ``@page`` rule sets the paper."""
    browser = drawing._browser()
    if browser is None:
        raise RuntimeError(f"no Chromium to print the handout (looked at $BROWSER_PATH and {drawing.CHROMIUM}): "
                           "run `bash scripts/install_browser.sh`, or set BROWSER_PATH to a Chrome/Chromium binary")
    # the browser would wait forever on a pipe at the PDF's name: a regular file there, or none
    refuse_unwritable(pdf, quoted(str(pdf), PATH_CHARS))
    with tempfile.TemporaryDirectory() as profile:  # a throwaway profile: nothing kept, nothing shared
        try:
            result = subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--no-pdf-header-footer", f"--print-to-pdf={pdf}",
                 page.as_uri()],
                capture_output=True, text=True, timeout=PRINT_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # killed by run(); a stuck browser is one line
            raise RuntimeError(f"Chromium ({browser}) did not print {page.name} within "
                               f"{PRINT_TIMEOUT_S} s: check that BROWSER_PATH names a working "
                               f"Chrome or Chromium, or print the HTML from a browser") from None
    if result.returncode != 0 or not pdf.is_file():
        raise RuntimeError(f"Chromium could not print {page} (exit {result.returncode}):\n{result.stderr[-2000:]}")


def build(out_dir: Path = OUT_DIR) -> list[Path]:
    """Write ``three_rounds.html`` and ``three_rounds.pdf`` into ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    page, pdf = out_dir / "three_rounds.html", out_dir / "three_rounds.pdf"
    # a pipe or a folder at either: refused before anything is drawn or written, browser or none
    for path in (page, pdf):
        refuse_unwritable(path, quoted(str(path), PATH_CHARS))
    runs = load_runs()
    svgs = drawing.render_images(_figures(runs), "svg")
    write_file(page, page_html(runs, svgs), quoted(str(page), PATH_CHARS))
    print_pdf(page, pdf)
    return [page, pdf]


def main(argv=None) -> int:
    p = Parser(prog="handout", description="build the one-page 'three rounds' handout (HTML + PDF)")
    p.add_argument("--out", default=str(OUT_DIR), help="default: build/handout")
    a = p.parse_args(argv)
    start = time.perf_counter()
    try:
        written = build(out_folder(a.out).resolve())
    except ValueError as err:
        return fail("handout", err)
    except OSError as err:
        return fail("handout", os_problem(err))
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    for path in written:
        print(path)
    print(f"built in {time.perf_counter() - start:.1f} s; print {written[1].name} on A4, landscape")
    return 0


if __name__ == "__main__":
    run("handout", main)
