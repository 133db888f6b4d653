"""The course notebooks in a real browser: JupyterLab + headless Chromium (Playwright).

nbval proves the kernel side of the notebooks (every cell runs, outputs match).  This
test proves the browser side, which nbval cannot see: that the jupyterlab-plotly
extension draws the Plotly timelines (host and device lanes), and that the
``TimelineExplorer`` widgets are live (pressing *Run* and moving a slider redraw the
figure through the kernel).

How it works: a module-scoped JupyterLab server is started from this venv on a free
loopback port, over a temporary copy of ``notebooks/`` (autosave off, so nothing in the
repo is ever written).  For each notebook, Debian's Chromium (``/usr/bin/chromium``,
driven by Playwright; no Playwright browser download) opens it, clears the stored
outputs, runs all cells through ``window.jupyterapp`` (``--LabApp.expose_app_in_browser``)
and waits until the kernel is idle and every cell has an execution count.  Then: no
error output; at least one Plotly timeline drawn with host and device lanes; in notebook 03a
an order view (the same spans as labelled blocks in real order) drawn too; and, in the
capstone, the explorer redraws when the mode is changed and *Run* pressed, again when the
"first round" slider is moved with the keyboard, and again when its *view* is switched to
the order view and back to scale -- after Run All, as a learner finds it (no later cell
closes it, issue 23).  A screenshot of each notebook goes to ``artifacts/browser/``.

Needs ``bash scripts/install_browser.sh``.  Without Chromium or Playwright the test is
skipped, unless ``REQUIRE_BROWSER_TEST=1`` (CI) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from browser_support import CHROMIUM, CHROMIUM_ARGS, REQUIRE, descendants, free_port, stop_server, sync_api

REPO = Path(__file__).resolve().parents[2]
# Where the notebooks are copied from (override only to debug the test itself).
NOTEBOOK_DIR = Path(os.environ.get("BROWSER_TEST_NOTEBOOK_DIR", REPO / "notebooks"))
ARTIFACTS = REPO / "artifacts" / "browser"
RUN_TIMEOUT_S = 240  # all cells of one notebook, cold kernel included
WIDGET_TIMEOUT_S = 90  # one explorer redraw through the kernel

# A timeline_figure has one bar trace per stage (meta.kind == "span") on lane y=1 (host)
# or y=0 (device), plus "other rounds" and "device idle".  A real run has at least
# schedule/prepare/launch/wait/postprocess on the host and upload/forward/sample on the
# device; these bounds leave room for windows that miss a stage or two.
MIN_HOST_STAGES = 3
MIN_DEVICE_STAGES = 2
MIN_TRACES = MIN_HOST_STAGES + MIN_DEVICE_STAGES + 1


# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def playwright_api():
    """Playwright's sync API, once Chromium and the client are known to be there."""
    return sync_api()


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def _api(base: str, token: str, path: str, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _log_tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


@pytest.fixture(scope="module")
def lab(playwright_api, tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 over a temporary copy of notebooks/."""
    tmp = tmp_path_factory.mktemp("jupyterlab")
    root = tmp / "root"
    if NOTEBOOK_DIR.is_dir():
        shutil.copytree(NOTEBOOK_DIR, root / "notebooks",
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    else:
        (root / "notebooks").mkdir(parents=True)
    config, settings = tmp / "config", tmp / "settings"
    # No build check / build prompt; no extension manager asking PyPI.
    _write_json(config / "labconfig" / "page_config.json", {"buildCheck": False, "buildAvailable": False})
    # User settings: never write the notebooks, no news/update notifications.
    _write_json(settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings",
                {"autosave": False})
    _write_json(settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
                {"fetchNews": "false", "checkForUpdates": False})
    env = dict(os.environ,
               JUPYTER_CONFIG_DIR=str(config), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTER_PLATFORM_DIRS="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--ServerApp.terminals_enabled=False",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{_log_tail(log)}", pytrace=False)
            try:
                _api(base, token, f"/api/status?token={token}", timeout=2)
                break
            except (urllib.error.URLError, OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer in 90 s:\n{_log_tail(log)}", pytrace=False)
                time.sleep(0.5)
        yield dict(base=base, token=token, root=root, log=log)
    finally:
        _stop_server(proc, base, token)


def _stop_server(proc: subprocess.Popen, base: str, token: str) -> None:
    """Shut the kernels down through the API, stop the server, then reap any leftover."""
    if proc.poll() is None:
        try:
            for kernel in _api(base, token, "/api/kernels"):
                _api(base, token, f"/api/kernels/{kernel['id']}", method="DELETE", timeout=30)
        except (urllib.error.URLError, OSError, ValueError):
            pass
    stop_server(proc, descendants(proc.pid))


@pytest.fixture(scope="module")
def browser_context(playwright_api, tmp_path_factory):
    """Headless Debian Chromium with a fresh profile."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    with playwright_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1300})
        context.set_default_timeout(60_000)
        try:
            yield context
        finally:
            context.close()


# ---------------------------------------------------------------------------- page helpers

# Helpers installed in the page: the notebook panel of a path, its cells' state, plots.
_JS_HELPERS = r"""
() => {
  const app = window.jupyterapp;
  const H = {};
  H.panel = (path) => {
    for (const w of app.shell.widgets('main')) {
      if (w.context && w.context.path === path && w.content && w.content.widgets) return w;
    }
    return null;
  };
  H.kernelStatus = (path) => {
    const w = H.panel(path);
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return k ? k.status : null;
  };
  H.cells = (path) => {
    const w = H.panel(path);
    if (!w) return null;
    return w.content.widgets.map((c, i) => {
      const m = c.model;
      const prompt = c.node.querySelector('.jp-InputArea-prompt');
      const out = {index: i, type: m.type, empty: !m.sharedModel.getSource().trim(),
                   count: m.type === 'code' ? m.executionCount : null,
                   prompt: prompt ? prompt.textContent.trim() : '',
                   tags: (m.getMetadata && m.getMetadata('tags')) || [], errors: [], tracebacks: []};
      if (m.type === 'code') {
        for (const o of m.outputs.toJSON()) {
          if (o.output_type === 'error') out.errors.push(`${o.ename}: ${o.evalue}`);
        }
        for (const n of c.node.querySelectorAll(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')) {
          if (n.textContent.includes('Traceback')) out.tracebacks.push(n.textContent.slice(0, 500));
        }
      }
      return out;
    });
  };
  H.plotInfo = (gd) => {
    const data = gd.data || [];
    const lanes = {host: 0, device: 0};
    const orderLanes = {host: 0, device: 0};
    for (const t of data) {
      const kind = t.meta && t.meta.kind;
      if (kind !== 'span' && kind !== 'order') continue;
      const ys = Array.from(t.y || []);
      const into = kind === 'span' ? lanes : orderLanes;
      if (ys.includes(1)) into.host += 1;
      if (ys.includes(0)) into.device += 1;
    }
    const title = gd.layout && gd.layout.title;
    const meta = (gd.layout && gd.layout.meta) || {};
    return {traces: data.length, lanes, orderLanes, view: meta.view || null,
            xTitle: gd.layout && gd.layout.xaxis && gd.layout.xaxis.title ? gd.layout.xaxis.title.text : null,
            svgTraces: gd.querySelectorAll('g.trace').length,
            barPaths: gd.querySelectorAll('g.trace.bars g.point path').length,
            ticks: Array.from(gd.querySelectorAll('.ytick text')).map(t => t.textContent),
            width: gd.getBoundingClientRect().width, height: gd.getBoundingClientRect().height,
            title: title ? (typeof title === 'string' ? title : title.text) : null};
  };
  H.plots = (path) => {
    const w = H.panel(path);
    return w ? Array.from(w.node.querySelectorAll('.js-plotly-plot')).map(H.plotInfo) : [];
  };
  // The TimelineExplorer: the widget box holding the "Run" button.
  H.explorer = (path) => {
    const w = H.panel(path);
    if (!w) return null;
    const run = Array.from(w.node.querySelectorAll('button.jupyter-button'))
      .find(b => b.textContent.trim() === 'Run');
    if (!run) return null;
    let box = run.closest('.widget-hbox');
    box = box && box.parentElement && box.parentElement.closest('.widget-vbox');
    const gd = box && box.querySelector('.js-plotly-plot');
    if (!gd) return null;
    box.dataset.browserTest = 'explorer';  // for Playwright's locators
    return {box, run, gd};
  };
  H.explorerState = (path) => {
    const e = H.explorer(path);
    if (!e) return null;
    const data = (e.gd.data || []).map(t => ({name: t.name, base: Array.from(t.base || []),
                                              x: Array.from(t.x || []), y: Array.from(t.y || [])}));
    const readout = e.box.querySelector('.widget-html');
    return {key: JSON.stringify([e.gd.layout.title, data]), info: H.plotInfo(e.gd),
            runDisabled: e.run.disabled, readout: readout ? readout.textContent : ''};
  };
  window.__browserTest = H;
  return true;
}
"""


def _open_notebook(page, lab, rel: str):
    page.goto(f"{lab['base']}/lab/tree/{rel}?reset&token={lab['token']}", wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined", timeout=90_000)
    page.evaluate("() => window.jupyterapp.started")
    page.evaluate(_JS_HELPERS)
    page.wait_for_function("(p) => { const w = window.__browserTest.panel(p);"
                           " return w && w.context.isReady && w.content.widgets.length > 0; }",
                           arg=rel, timeout=90_000)
    page.wait_for_function("(p) => window.__browserTest.kernelStatus(p) === 'idle'", arg=rel, timeout=90_000)


def _command(page, rel: str, command: str, active_cell: int | None = None) -> None:
    """Start a JupyterLab command on the notebook, made current (and its active cell set).

    Not awaited (a run command's promise settles only when its cells have run): the
    callers poll the cells instead, with their own time limits.
    """
    page.evaluate("""([p, command, active]) => {
        const w = window.__browserTest.panel(p);
        window.jupyterapp.shell.activateById(w.id);
        if (active !== null) w.content.activeCellIndex = active;
        window.jupyterapp.commands.execute(command)
            .catch(e => console.error(`browser test: ${command} failed: ${e}`));
        return true;
    }""", [rel, command, active_cell])


def _code(cells: list[dict], lo: int, hi: int) -> list[dict]:
    return [c for c in cells[lo:hi] if c["type"] == "code" and not c["empty"]]


def _clear_outputs(page, rel: str) -> None:
    """Clear stored outputs and execution counts, so only this run's results are seen."""
    _command(page, rel, "notebook:clear-all-cell-outputs")
    page.wait_for_function("""(p) => window.__browserTest.cells(p)
        .every(c => c.type !== 'code' || (c.count === null && !c.errors.length))""", arg=rel, timeout=30_000)


def _run_cells(page, rel: str, lo: int, hi: int, deadline: float) -> list[dict]:
    """Run cells lo..hi-1 (all, all above hi, or all from lo); wait until each ran or one failed.

    The command is repeated while no cell has started: on a cold kernel one Run All is
    sometimes lost.  Done means the kernel is idle on three polls in a row (not just
    between two cells), no prompt shows ``[*]``, and every non-empty code cell has an
    execution count (or one raised, which stops the run).
    """
    n = len(page.evaluate("(p) => window.__browserTest.cells(p)", rel))
    if lo == 0 and hi >= n:
        command, active = "notebook:run-all-cells", None
    elif lo == 0:
        command, active = "notebook:run-all-above", hi
    else:
        command, active = "notebook:run-all-below", lo
    started = False
    for attempt in range(6):
        if attempt:
            print(f"{rel}: {command} started no cell in 20 s; trying again ({attempt + 1})")
        _command(page, rel, command, active)
        t_end = min(deadline, time.monotonic() + 20)
        while time.monotonic() < t_end:
            cells = page.evaluate("(p) => window.__browserTest.cells(p)", rel)
            if any(c["count"] is not None or c["prompt"].startswith("[*]") for c in _code(cells, lo, hi)):
                started = True
                break
            page.wait_for_timeout(250)
        if started or time.monotonic() >= deadline:
            break
    if not started:
        pytest.fail(f"{rel}: {command} never started a cell", pytrace=False)
    stable, status = 0, None
    while time.monotonic() < deadline:
        status = page.evaluate("(p) => window.__browserTest.kernelStatus(p)", rel)
        cells = page.evaluate("(p) => window.__browserTest.cells(p)", rel)
        code = _code(cells, lo, hi)
        pending = any(c["prompt"].startswith("[*]") for c in code)
        done = all(c["count"] is not None for c in code)
        failed = any(c["errors"] and "raises-exception" not in c["tags"] for c in code)
        if status == "idle" and not pending and (done or failed):
            stable += 1
            if stable >= 3:
                return cells
        else:
            stable = 0
        page.wait_for_timeout(400)
    todo = [c["index"] for c in _code(cells, lo, hi) if c["count"] is None]
    pytest.fail(f"{rel}: cells {lo}..{hi - 1} not finished in time (kernel {status}; cells not run: {todo})",
                pytrace=False)


def _assert_no_errors(rel: str, cells: list[dict]) -> None:
    bad = [f"cell {c['index']}: {'; '.join(c['errors'] + c['tracebacks'])[:800]}"
           for c in cells if (c["errors"] or c["tracebacks"]) and "raises-exception" not in c["tags"]]
    assert not bad, f"{rel}: error outputs in the browser:\n" + "\n".join(bad)


def _is_timeline(info: dict) -> bool:
    return (info["traces"] >= MIN_TRACES and info["lanes"]["host"] >= MIN_HOST_STAGES
            and info["lanes"]["device"] >= MIN_DEVICE_STAGES
            and {"host", "device"} <= set(info["ticks"]) and info["barPaths"] > 0)


def _is_order_view(info: dict) -> bool:
    """An order view: host and device blocks (meta.kind == "order"), drawn, with lane ticks."""
    return (info["view"] == "order" and info["orderLanes"]["host"] >= MIN_HOST_STAGES
            and info["orderLanes"]["device"] >= MIN_DEVICE_STAGES and info["barPaths"] > 0
            and {"host", "device"} <= set(info["ticks"]) and (info["xTitle"] or "").startswith("order"))


def _assert_order_view_rendered(rel: str, plots: list[dict]) -> None:
    views = [p for p in plots if _is_order_view(p)]
    assert views, f"{rel}: no rendered order view (host and device blocks, lane ticks, drawn bars); plots: {plots}"
    for p in views:
        assert p["width"] > 200 and p["height"] > 150 and p["svgTraces"] >= p["traces"], f"{rel}: {p}"


def _assert_timeline_rendered(rel: str, plots: list[dict]) -> None:
    assert plots, f"{rel}: no Plotly figure (.js-plotly-plot) was rendered"
    timelines = [p for p in plots if _is_timeline(p)]
    assert timelines, (f"{rel}: no rendered timeline with >= {MIN_HOST_STAGES} host and >= {MIN_DEVICE_STAGES} "
                       f"device stage traces, lane ticks and drawn bars; plots: {plots}")
    for p in timelines:  # drawn, not just data: a real size and one SVG group per trace
        assert p["width"] > 200 and p["height"] > 150, f"{rel}: timeline drawn too small: {p}"
        assert p["svgTraces"] >= p["traces"], f"{rel}: traces in the data but not in the SVG: {p}"


def _wait_plots(page, rel: str, timeout_s: float = 60, order_view: bool = False) -> list[dict]:
    """The notebook's plots, once one is a drawn timeline (and, with ``order_view``, one an
    order view): plotly.js loads and draws asynchronously."""
    deadline = time.monotonic() + timeout_s
    while True:
        plots = page.evaluate("(p) => window.__browserTest.plots(p)", rel)
        ready = any(_is_timeline(p) for p in plots) and (not order_view or any(_is_order_view(p) for p in plots))
        if ready or time.monotonic() > deadline:
            return plots
        page.wait_for_timeout(300)


def _screenshot(page, rel: str, selector_js: str | None = None) -> Path:
    if selector_js:
        page.evaluate(f"(p) => {{ const el = {selector_js}; if (el) el.scrollIntoView({{block: 'center'}}); }}", rel)
        page.wait_for_timeout(300)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{Path(rel).stem}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _wait_explorer_change(page, rel: str, before: str, what: str, drawn=None) -> dict:
    """Wait until the explorer's figure shows a new, complete timeline (or ``drawn`` view)."""
    drawn = drawn or _is_timeline
    deadline = time.monotonic() + WIDGET_TIMEOUT_S
    state = None
    while time.monotonic() < deadline:
        state = page.evaluate("(p) => window.__browserTest.explorerState(p)", rel)
        if state and state["key"] != before and not state["runDisabled"] and drawn(state["info"]):
            return state
        page.wait_for_timeout(300)
    pytest.fail(f"{rel}: {what} did not redraw the explorer's timeline in {WIDGET_TIMEOUT_S} s; "
                f"last state: {state and {k: state[k] for k in ('info', 'runDisabled', 'readout')}}", pytrace=False)


def _exercise_explorer(page, rel: str) -> None:
    """Change the mode and press Run; then move the window slider with the keyboard."""
    try:
        page.wait_for_function("(p) => window.__browserTest.explorer(p) !== null", arg=rel, timeout=60_000)
    except Exception as exc:  # noqa: BLE001 - Playwright's TimeoutError
        failure = f"{rel}: no TimelineExplorer rendered (a widget box with a Run button and a Plotly figure): {exc}"
    else:
        failure = None
    if failure:
        pytest.fail(failure, pytrace=False)
    state = page.evaluate("(p) => window.__browserTest.explorerState(p)", rel)
    explorer = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) [data-browser-test=explorer]").first
    # The mode ToggleButtons (serial / zos): press the one that is not selected.
    mode = explorer.locator(".widget-toggle-buttons", has_text="serial").first
    toggles = mode.locator("button")
    assert toggles.count() >= 2, f"{rel}: the explorer's mode toggle buttons are missing"
    other = mode.locator("button:not(.mod-active)").first
    new_mode = other.text_content().strip()
    other.click()
    explorer.locator("button.jupyter-button", has_text=re.compile(r"^\s*Run\s*$")).first.click()
    state = _wait_explorer_change(page, rel, state["key"], f"mode={new_mode} + Run")
    assert "Error" not in state["readout"], f"{rel}: the explorer reported: {state['readout']}"
    assert new_mode in (state["info"]["title"] or ""), f"{rel}: title does not show mode {new_mode}: {state['info']}"
    # The "first round" slider: focus its handle, one step right with the keyboard.
    slider = explorer.locator(".widget-slider", has_text="first round").first
    handle = slider.locator(".noUi-handle").first
    now, top = (float(handle.get_attribute(a) or 0) for a in ("aria-valuenow", "aria-valuemax"))
    handle.focus()
    handle.press("ArrowRight" if now < top else "ArrowLeft")
    state = _wait_explorer_change(page, rel, state["key"], "moving the first-round slider")
    # The view ToggleButtons: the order view of the same run, then back to scale.
    view = explorer.locator(".widget-toggle-buttons", has_text="order").first
    view.locator("button", has_text=re.compile(r"^\s*order\s*$")).first.click()
    state = _wait_explorer_change(page, rel, state["key"], "switching the view to order", _is_order_view)
    view.locator("button", has_text=re.compile(r"^\s*to scale\s*$")).first.click()
    state = _wait_explorer_change(page, rel, state["key"], "switching the view back to scale")
    assert state["info"]["view"] == "scale", f"{rel}: {state['info']}"


# ---------------------------------------------------------------------------- the test

NOTEBOOKS = [
    pytest.param("notebooks/03a_zos_order.ipynb", False, id="03a_zos_order"),
    pytest.param("notebooks/03b_zos_measured.ipynb", False, id="03b_zos_measured"),
    pytest.param("notebooks/05_ownership.ipynb", True, id="05_ownership"),
]


@pytest.mark.timeout(RUN_TIMEOUT_S + 2 * WIDGET_TIMEOUT_S + 120)
@pytest.mark.parametrize("rel, has_explorer", NOTEBOOKS)
def test_notebook_renders_in_jupyterlab(lab, browser_context, rel, has_explorer):
    path = lab["root"] / rel
    if not path.is_file():
        msg = f"{rel} does not exist"
        if REQUIRE:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    page = browser_context.new_page()
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: msg.type == "error" and console_errors.append(msg.text[:300]))
    shot = None
    try:
        _open_notebook(page, lab, rel)
        _clear_outputs(page, rel)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        # Run All, then use the explorer: no later cell may have closed it (issue 23).
        cells = _run_cells(page, rel, 0, len(json.loads(path.read_text())["cells"]), deadline)
        _assert_no_errors(rel, cells)
        has_order_view = rel.endswith("03a_zos_order.ipynb")  # its section 5 draws one
        plots = _wait_plots(page, rel, order_view=has_order_view)
        _assert_timeline_rendered(rel, plots)
        if has_order_view:
            _assert_order_view_rendered(rel, plots)
        if has_explorer:
            _exercise_explorer(page, rel)
            _assert_no_errors(rel, page.evaluate("(p) => window.__browserTest.cells(p)", rel))
            shot = _screenshot(page, rel, "window.__browserTest.explorer(p).gd")
        else:
            shot = _screenshot(page, rel, "window.__browserTest.panel(p).node.querySelector('.js-plotly-plot')")
    except BaseException:
        if shot is None:
            try:
                _screenshot(page, rel)
            except Exception:  # noqa: BLE001 - keep the real failure
                pass
        if console_errors:
            print(f"browser console errors ({len(console_errors)}):", *console_errors[:20], sep="\n  ")
        print(f"jupyter lab log tail:\n{_log_tail(lab['log'], 3000)}")
        raise
    finally:
        try:  # stop this notebook's kernel (and any engine it holds) before the next notebook
            page.evaluate("""(p) => { const w = window.__browserTest && window.__browserTest.panel(p);
                return w && w.sessionContext.session ? w.sessionContext.shutdown() : null; }""", rel)
        except Exception:  # noqa: BLE001 - the server fixture shuts every kernel down anyway
            pass
        page.close()
