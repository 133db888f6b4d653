"""Plotly figures drawn as static images by kaleido in Chromium (Debian's, or BROWSER_PATH):
the notebooks' stored PNGs, the website's and the handout's.  A browser that is missing, dies
as it starts or never answers is one sentence naming where it looked and what BROWSER_PATH
must be."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor, wait

from overlap_course.safe_json import quoted

# Quantized to a 256-colour palette: PNGs a few times smaller, colours kept (the measurements,
# and why not median-cut or 64 colours: docs/measurements/figures.md).
STATIC_COLORS = 256
CHROMIUM = "/usr/bin/chromium"  # Debian's package; kaleido never downloads a Chrome of its own here
#: How long a browser may take to start and answer Chrome's protocol (Chromium: ~2.5 s).  A
#: program that never answers (a Firefox, an old Chromium) would hang kaleido's start forever.
BROWSER_START_S = 60.0
#: kaleido's browser driver logs from threads of its own, which can outlive a drawing (a
#: BROWSER_PATH that writes junk: a JSONError traceback after the command's last line), so
#: they are silenced from the first drawing on: every failure is the course's one line.
DRIVER_LOGGERS = ("choreographer", "kaleido", "browser_proc")


def _browser() -> str | None:
    """$BROWSER_PATH, else Debian's Chromium; None lets kaleido search (Chrome, Edge, ... on PATH)."""
    return os.environ.get("BROWSER_PATH") or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)


def shrink_png(png: bytes) -> bytes:
    """kaleido's RGBA PNG as a 256-colour palette PNG (see STATIC_COLORS for the measurement)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    palette = image.quantize(colors=STATIC_COLORS, method=Image.Quantize.MAXCOVERAGE, kmeans=2,
                             dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _browser_failed(stopped: bool) -> Exception:
    """Chromium closed as it started (choreographer says so in a tuple of sentences), or was
    ``stopped`` by :func:`_stop_browser`; a BROWSER_PATH naming another program (``/bin/true``,
    a Firefox) is bad input, so a ValueError."""
    chosen = os.environ.get("BROWSER_PATH")
    where = f"BROWSER_PATH={quoted(chosen, 200)}" if chosen else _browser() or "the browser on PATH"
    what = (f"did not answer within {BROWSER_START_S:g} s of starting, so it was stopped"
            if stopped else "closed as soon as it started")
    return (ValueError if chosen else RuntimeError)(
        f"{where} {what}: BROWSER_PATH must name a Chrome or Chromium binary, e.g. {CHROMIUM} "
        f"(bash scripts/install_browser.sh installs it)")


def _stop_browser(k, stopped: list) -> None:
    """:data:`BROWSER_START_S` passed and the browser has not answered, or Ctrl-C: end it and
    what it started (choreographer starts it in a session of its own), which makes kaleido's
    start (or drawing) fail instead of waiting forever."""
    proc = getattr(k, "subprocess", None)
    if proc is None:
        return
    stopped.append(True)
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # Windows: no process groups
            proc.kill()
    except ProcessLookupError:
        pass


async def _render_images(figures: list[dict], fmt: str, size: tuple[int, int], browser: list,
                         stopped: list) -> list[bytes]:
    """The images, drawn in one browser (appended to ``browser``, so that a Ctrl-C in the
    calling thread can end it: :func:`render_images`)."""
    import kaleido
    from choreographer.errors import BrowserClosedError, BrowserFailedError
    from kaleido.errors import ChromeNotFoundError, KaleidoError

    images = []
    try:  # one browser for all figures: starting Chromium costs ~2.5 s, one figure ~0.4 s
        k = kaleido.Kaleido(n=1, path=_browser(), mathjax=False, timeout=120)
        browser.append(k)
        stuck = asyncio.get_running_loop().call_later(BROWSER_START_S, _stop_browser, k, stopped)
        async with k:
            stuck.cancel()
            for fig in figures:
                layout = fig.get("layout", {})
                opts = {"format": fmt, "width": layout.get("width") or size[0],
                        "height": layout.get("height") or size[1]}
                images.append(await k.calc_fig(fig, opts=opts))
    except KaleidoError as err:  # a figure check_figures let through that plotly.js refused
        raise ValueError(f"plotly.js could not draw figure {len(images) + 1} of {len(figures)} "
                         f"({str(err)[:200]}); clear that output, or run the notebook again to "
                         f"store the figure its cell draws") from None
    except ChromeNotFoundError:
        raise RuntimeError(f"no Chrome/Chromium to draw the notebooks' static figures (looked at $BROWSER_PATH, "
                           f"{CHROMIUM} and PATH): run `bash scripts/install_browser.sh` (Debian's chromium), or "
                           "set BROWSER_PATH to a Chrome/Chromium binary") from None
    except (BrowserFailedError, BrowserClosedError):
        raise _browser_failed(bool(stopped)) from None
    return images


def render_images(figures: list[dict], fmt: str = "png") -> list[bytes]:
    """kaleido's images (``fmt``: png, svg, ...) of Plotly figure dicts, from a thread of its own:
    callers may already run an event loop (a Jupyter kernel, Playwright's sync API), where
    asyncio.run refuses.  A Ctrl-C ends the browser at once, so the thread's wait for it ends
    too (a browser that never answers: :data:`BROWSER_START_S`); the interpreter joins the thread
    as it exits."""
    from overlap_course.figures.config import STATIC_HEIGHT_PX, STATIC_WIDTH_PX  # plotly and the engine: only here

    size = (STATIC_WIDTH_PX, STATIC_HEIGHT_PX)
    for name in DRIVER_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    pool, browser, stopped = ThreadPoolExecutor(max_workers=1), [], []
    drawn = pool.submit(asyncio.run, _render_images(figures, fmt, size, browser, stopped))
    try:
        return drawn.result()
    except KeyboardInterrupt:
        while not (stopped or drawn.done()):  # until the thread has started the browser
            if browser:
                _stop_browser(browser[0], stopped)
            wait([drawn], timeout=0.05)
        raise
    finally:
        pool.shutdown(wait=False)
