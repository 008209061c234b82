"""Real-browser harness for the notebook tests: JupyterLab (or Voila) on 127.0.0.1 with a token, driven by
Playwright's Python package through Debian's ``chromium`` (Playwright's own browser download cannot run
here). Used by ``tests/test_browser.py``.

Everything a run writes (JupyterLab settings, workspaces, the parameterised notebook copies, figures) goes
to a temporary folder, so a developer's own JupyterLab state is never touched and every run starts fresh.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from moelab.bench.app import stop_process, wait_until

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

# JupyterLab user settings for the test: no news/update toast, every cell rendered (no windowing, so
# outputs below the fold exist in the DOM), no autosave dialogs, no kernel-choice dialog.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}
# ... and the announcements plugin (the "official Jupyter news?" toast) disabled outright.
PAGE_CONFIG = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}


def browser_tools() -> str:
    """Path of the ``chromium`` executable, with Playwright importable. Missing pieces skip the test on
    a developer machine and FAIL it under CI (``CI=true``), where ``.ci/run`` installs both."""
    missing = []
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        missing.append("Debian's chromium (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install 'moelab[browser]')")
    if missing:
        why = "browser tests need " + " and ".join(missing)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why + " (CI=true: the browser tests must run)")
        pytest.skip(why)
    return chromium  # type: ignore[return-value]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    """Wait until ``url`` answers (any HTTP status), failing early if the server process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections, failing early if the server process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"port {port} did not open within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


@dataclass
class Server:
    base: str
    token: str
    proc: subprocess.Popen
    log: Path


def isolated_env(tmp: Path) -> dict[str, str]:
    """Environment for a Jupyter server whose settings, workspaces and figures live under ``tmp``."""
    config = tmp / "jupyter-config"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(PAGE_CONFIG))
    settings = tmp / "lab-settings"
    for rel, value in LAB_SETTINGS.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(os.environ)
    env.update({
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "lab-workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "jupyter-runtime"),
        "MOELAB_FIGURES": str(tmp / "figures"),
        "MOELAB_PNG": os.environ.get("MOELAB_PNG", "0"),
        "PYTHONUNBUFFERED": "1",
    })
    return env


@contextmanager
def jupyterlab(root: Path, tmp: Path) -> Iterator[Server]:
    """JupyterLab serving ``root`` on 127.0.0.1:<free port> with a random token."""
    port, token = free_port(), secrets.token_hex(16)
    log = tmp / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False", "--allow-root",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=isolated_env(tmp), cwd=root)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc, log)
        yield Server(f"http://127.0.0.1:{port}", token, proc, log)
    finally:
        stop_process(proc)




@contextmanager
def chromium_browser(chromium: str) -> Iterator[Any]:
    """A headless Chromium (one per process: Playwright's sync API allows one driver at a time)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_context(browser: Any, width: int = 1400, height: int = 1000) -> Any:
    return browser.new_context(viewport={"width": width, "height": height})


# --------------------------------------------------------------------------------------------------
# Page inspection (JavaScript run in the page)

# Every output area holding a widget view that contains a slider: the interactive panels.
JS_MARK_PANELS = """() => {
    const outs = Array.from(document.querySelectorAll('.jp-Notebook:not(.lm-mod-hidden) .jp-OutputArea-output, body.voila .jp-OutputArea-output, #rendered_cells .jp-OutputArea-output'));
    let n = 0;
    for (const o of outs) {
        if (o.querySelector('.widget-slider') || o.querySelector('.widget-dropdown') || o.querySelector('.widget-checkbox')) {
            o.setAttribute('data-moelab-panel', String(n++));
        }
    }
    return n;
}"""


# Every plotly figure on the page: its layout and each trace's axes, for the lab's axis-title checker below.
JS_FIGURES = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    layout: JSON.parse(JSON.stringify(el.layout || {})),
    data: (el.data || []).map(t => ({type: t.type || 'scatter', xaxis: t.xaxis, yaxis: t.yaxis, visible: t.visible,
        showscale: t.showscale, coloraxis: t.coloraxis, colorbar: JSON.parse(JSON.stringify(t.colorbar || {})),
        marker: {showscale: (t.marker || {}).showscale,
                 colorbar: JSON.parse(JSON.stringify((t.marker || {}).colorbar || {}))}})),
}))"""


def untitled_figure_axes(page: Any) -> list[str]:
    """One line per plotly figure on ``page`` with an axis a reader cannot name, as the lab's own checker
    (:func:`moelab.viz.untitled_axes`) judges the figure the browser drew (its layout and traces' axes)."""
    import plotly.graph_objects as go

    from moelab.viz import untitled_axes

    out = []
    for spec in page.evaluate(JS_FIGURES):
        fig = go.Figure(spec, skip_invalid=True)
        if missing := untitled_axes(fig):
            title = fig.layout.title.text or "(untitled figure)"
            out.append(f"{title[:90]}: no title on {', '.join(missing)}")
    return out


def error_texts(page: Any, *, loading: bool = True) -> list[str]:
    """Text of every error/stderr output and of every widget that failed (or, with ``loading``, is
    still loading: only meaningful once the page has settled)."""
    found = page.evaluate("""(loading) => {
        const out = [];
        for (const el of document.querySelectorAll(
                "[data-mime-type='application/vnd.jupyter.stderr'], .jp-OutputArea-output .jp-RenderedText[data-mime-type='application/vnd.jupyter.error']"))
            out.push('stderr/error output: ' + el.innerText.slice(0, 1500));
        const body = document.body.innerText;
        const needles = ['Error displaying widget', 'Model not found'].concat(loading ? ['Loading widget...'] : []);
        for (const needle of needles)
            if (body.includes(needle)) out.push('page shows: ' + needle);
        return out;
    }""", loading)
    return list(found)


def drag_slider(page: Any, panel: Any, index: int = 0) -> str:
    """Drag the ``index``-th slider handle of ``panel`` by a third of its track (to the right, or to the
    left when it sits in the right half). Returns a label for messages."""
    slider = panel.locator(".widget-slider").nth(index)
    slider.scroll_into_view_if_needed()
    label = slider.locator(".widget-label").first.inner_text() if slider.locator(".widget-label").count() else f"slider {index}"
    track = slider.locator(".noUi-target, .ui-slider, .slider-container").first
    handle = slider.locator(".noUi-handle, .ui-slider-handle").first
    tb, hb = track.bounding_box(), handle.bounding_box()
    assert tb and hb, f"slider {label!r} has no visible track/handle"
    before = readout(slider)
    x, y = hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2
    dx = tb["width"] / 3 * (1 if x < tb["x"] + tb["width"] / 2 else -1)
    page.mouse.move(x, y)
    page.mouse.down()
    for k in range(1, 11):
        page.mouse.move(x + dx * k / 10, y)
    page.mouse.up()
    if not wait_for(lambda: readout(slider) != before, 5):  # the drag did not take: use the keyboard
        handle.focus()
        for _ in range(3):
            handle.press("ArrowRight" if dx > 0 else "ArrowLeft")
    return label


def readout(slider: Any) -> str:
    return slider.locator(".widget-readout").first.inner_text()


def slider_value(panel: Any, index: int = 0) -> str:
    return panel.locator(".widget-slider").nth(index).locator(".widget-readout").first.inner_text()


def wait_for(predicate: Any, timeout_s: float, step_s: float = 0.5) -> bool:
    """:func:`moelab.bench.app.wait_until`, polling every half second by default (page state)."""
    return wait_until(predicate, timeout_s, step_s)


def run_all_cells(page: Any) -> None:
    """Run every cell through the command palette (Ctrl+Shift+C, "Run All Cells", Enter), once the
    kernel is idle; retried once if no cell started within 30 s."""
    wait_for(lambda: "Idle" in page.locator(".jp-StatusBar-Widget, #jp-main-statusbar").all_inner_texts().__str__(), 90)
    for _ in range(2):
        page.keyboard.press("Escape")
        page.keyboard.press("Control+Shift+C")
        box = page.locator(".lm-CommandPalette-input").first
        box.wait_for(state="visible", timeout=15_000)
        box.fill("Run All Cells")
        page.locator(".lm-CommandPalette-item:visible", has_text="Run All Cells").first.wait_for(timeout=15_000)
        box.press("Enter")
        if wait_for(lambda: any(p != "[ ]:" for p in code_prompts(page)), 30):
            return
    raise AssertionError(f"Run All Cells started no cell: {code_prompts(page)}")


def code_prompts(page: Any) -> list[str]:
    """The input prompts (``[ ]:``, ``[*]:``, ``[3]:``) of the visible notebook's code cells; read as
    ``textContent``, so a cell whose input is collapsed (an exercise's hidden solution) still reports its own."""
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        '.jp-Notebook:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')).map(e => e.textContent.trim())""")
