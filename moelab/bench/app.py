"""Lecture mode in a real browser: how soon ``moelab app`` shows its first figure, how fast a slider redraws.

:func:`measure_lecture` starts ``moelab app NAME`` (Voila, lesson part, precomputed results) on 127.0.0.1
with a token and opens it in headless Chromium (Debian's ``chromium``, driven by Playwright):

* ``app_first_figure_seconds``: from the page request until the first plotly figure is drawn, the median over
  :data:`FIRST_FIGURE_VISITS` visitors one after the other, each with a browser context of its own (nothing
  cached) and a pre-heated kernel of its own: one page load is one draw of a noisy quantity on a shared machine;
* ``app_slider_response_seconds_p50``: the median, over :data:`SLIDER_MOVES` moves of the panels' sliders
  (one keyboard step each, alternating direction), from the key press until a figure of that panel shows
  different data.

``run`` (the benchmark figures) measures ``MOELAB_BENCH_APP_NOTEBOOK`` (default ``03_afd_ratio``: a lesson
with a live panel) from the precomputed runs in ``runs/``; when there is none it precomputes the lesson into
a temporary folder first (not timed; the figure's note says so). ``tests/test_browser.py`` runs the same
measurement in its browser (``test_app_serves_dashboard``), where the first move after the page loaded is timed
like every other (no untimed warm-up move).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moelab._validate import check_int
from moelab.bench.core import Figure

SUITE = "notebooks"
GOAL_S = 2.0
SLIDER_MOVES = 6
#: visitors whose first figure ``run`` times (the last one also moves the sliders)
FIRST_FIGURE_VISITS = 3
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# per plotly figure inside ``root``: a fingerprint of its data (a redraw changes it)
JS_FINGERPRINTS = """(root) => Array.from(root.querySelectorAll('.js-plotly-plot')).map(el =>
    JSON.stringify((el.data || []).map(t => [t.name, t.x, t.y, t.z, t.text])))"""
# output areas holding a widget view with a slider: the live panels (marked for locators)
JS_MARK_PANELS = """() => {
    let n = 0;
    for (const o of document.querySelectorAll('.jp-OutputArea-output')) {
        if (o.querySelector('.widget-slider')) o.setAttribute('data-moelab-panel', String(n++));
    }
    return n;
}"""


@dataclass(frozen=True)
class LectureTiming:
    """One measured lecture: seconds to the first figure (the median over its visits, each visit's in
    ``first_figures_s``), each slider move's redraw time, the live panels, how long the app took to be ready
    (its pre-heated kernels quiet) before the first visit, and its log (whole, or its head and tail when longer
    than 6,000 characters)."""

    notebook: str
    first_figure_s: float
    slider_s: tuple[float, ...]
    panels: int
    ready_s: float = 0.0
    log: str = field(default="", repr=False)
    first_figures_s: tuple[float, ...] = ()

    @property
    def slider_p50_s(self) -> float:
        return statistics.median(self.slider_s) if self.slider_s else float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Any, timeout_s: float, step_s: float = 0.05) -> bool:
    """Poll ``predicate`` every ``step_s`` until it is true (True) or ``timeout_s`` passed (its last value)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


def _isolated_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var, sub in (("JUPYTER_CONFIG_DIR", "jupyter-config"), ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"), ("MOELAB_FIGURES", "figures")):
        env[var] = str(tmp / sub)
    env.update(PYTHONUNBUFFERED="1", MOELAB_PNG="0")
    return env


def chromium_path() -> str:
    """Debian's chromium; a ``ValueError`` naming what is missing when it or Playwright is not installed."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = [] if path else ["chromium (apt-get install -y chromium)"]
    try:
        # lazy: only the browser measurement needs Playwright
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install 'moelab[browser]')")
    if missing:
        raise ValueError("the lecture-mode measurement needs " + " and ".join(missing))
    return path  # type: ignore[return-value]


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate ``proc`` (a server or a browser driver), kill it if it does not exit within 20 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _press(slider: Any, forward: bool) -> None:
    """Step ``slider`` once with the keyboard."""
    handle = slider.locator(".noUi-handle").first
    handle.focus()
    handle.press("ArrowRight" if forward else "ArrowLeft")


def measure_lecture(name: str = "03_afd_ratio", runs: str | os.PathLike = "runs", *, moves: int = SLIDER_MOVES,
                    pool: int = 1, timeout_s: float = 300.0, screenshot: str | os.PathLike | None = None,
                    params: dict[str, Any] | None = None, browser: Any = None,
                    check: Callable[[Any], None] | None = None, visits: int = 1) -> LectureTiming:
    """Serve ``name``'s lesson with ``moelab app`` and time it in headless Chromium (see the module docstring).

    Parameters
    ----------
    visits : int
        Visitors timed one after the other (1 to 9), each in a fresh browser context with a pre-heated kernel
        of its own (the pool holds at least this many); the next one arrives once the kernels are quiet. Only
        the last one moves the sliders, runs ``check`` and takes the screenshot.
    params : dict, optional
        Notebook parameters passed to ``moelab app --params`` (a precomputed run with them must be in ``runs``
        for the lesson to be replayed).
    browser : playwright Browser, optional
        A Chromium already launched (a test module's); by default one is launched and closed here.
    check : callable, optional
        Called with the page once the first figure is drawn and the page has loaded, before the timed
        slider moves (a test's checks of what the page shows).

    Raises
    ------
    AssertionError
        When the page shows no figure, a panel has no slider that moves, or a move redraws nothing within
        ``timeout_s`` (the message holds the end of the server's log).
    """
    visits = check_int("visits", visits, low=1, high=9)
    pool = max(pool, visits)
    chromium = chromium_path()
    # lazy: Playwright (and its driver) loads only when a browser measurement runs
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="moelab-app-bench-") as tmp_:
        tmp = Path(tmp_)
        port, token = _free_port(), secrets.token_hex(16)
        log = tmp / "app.log"
        cmd = [sys.executable, "-m", "moelab.cli", "app", name, f"--port={port}", f"--token={token}",
               f"--pool={pool}", "--from", str(Path(runs).expanduser().resolve()),
               *(["--params", *(f"{k}={v!r}" for k, v in params.items())] if params else [])]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=_isolated_env(tmp))

        console: list[str] = []  # the page's console errors and uncaught errors, for a failure's message

        def tail() -> str:
            n, cpu = _kernel_cpu_s(proc.pid) if Path("/proc/self/stat").exists() else (0, float("nan"))
            said = "\n".join(console[-20:]) or "(nothing)"
            return (f"kernels under the app: {n}, their CPU so far {cpu:.1f} s\nthe page's console errors and "
                    f"uncaught errors: {said}\nthe app's log:\n" + log.read_text(errors="replace")[-3000:])

        try:
            assert wait_until(lambda: _port_open(port) or proc.poll() is not None, 120, 0.2) and proc.poll() is None, \
                f"moelab app did not start:\n{tail()}"
            ready_s = wait_ready(proc, pool, timeout_s)
            url = f"http://127.0.0.1:{port}/?token={token}"

            def visit_all(b: Any) -> tuple[list[float], list[float], int]:
                firsts: list[float] = []
                for v in range(visits):
                    last = v == visits - 1
                    if v:  # the previous visitor's kernel has been shut down and nothing else runs
                        wait_kernels_quiet(proc, timeout_s)
                    first_, slider_, panels_ = _visit(b, url, name, moves if last else 0, timeout_s,
                                                      screenshot if last else None, check if last else None,
                                                      tail, console)
                    firsts.append(first_)
                return firsts, slider_, panels_

            if browser is not None:
                firsts, slider_s, panels = visit_all(browser)
            else:
                with sync_playwright() as p:
                    own = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
                    try:
                        firsts, slider_s, panels = visit_all(own)
                    finally:
                        own.close()
        finally:
            stop_process(proc)
        text = log.read_text(errors="replace")
        # the head says what the app ran live and what it replayed; a kernel's noisy shutdown can fill the tail
        excerpt = text if len(text) <= 6000 else f"{text[:3000]}\n[...]\n{text[-3000:]}"
        return LectureTiming(name, statistics.median(firsts), tuple(slider_s), panels, ready_s, excerpt, tuple(firsts))


def _visit(browser: Any, url: str, name: str, moves: int, timeout_s: float,
           screenshot: str | os.PathLike | None, check: Callable[[Any], None] | None,
           tail: Callable[[], str], console: list[str]) -> tuple[float, list[float], int]:
    """One visitor: (seconds to the first figure, each timed slider move, live panels); the page's console
    errors and uncaught errors are appended to ``console``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.on("console", lambda m: console.append(f"console error: {m.text[:300]}") if m.type == "error" else None)
        # uncaught errors and rejected promises (a widget front end giving up on a model reports one)
        page.on("pageerror", lambda e: console.append(f"page error: {str(e)[:300]}"))
        t0 = time.monotonic()
        page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
        assert wait_until(lambda: page.locator(".js-plotly-plot").count() > 0, timeout_s), \
            f"{name}: no figure within {timeout_s:.0f} s\n{tail()}"
        first = time.monotonic() - t0
        slider_s: list[float] = []
        panels = 0
        if moves or check:
            wait_until(lambda: page.locator(".widget-slider").count() > 0, timeout_s, 0.2)
            page.wait_for_load_state("load", timeout=timeout_s * 1000)
            page.wait_for_load_state("networkidle", timeout=timeout_s * 1000)
            panels = page.evaluate(JS_MARK_PANELS)
        if check:
            check(page)
        if moves:
            slider_s = _slider_times(page, name, panels, moves, timeout_s, tail)
        if screenshot:
            page.screenshot(path=str(screenshot))
        return first, slider_s, panels
    finally:
        context.close()


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kernel_cpu_s(pid: int) -> tuple[int, float]:
    """(number of kernels below ``pid``, their CPU seconds so far)."""
    n, ticks = 0, 0
    for c in _descendants(pid):
        try:
            if b"ipykernel" not in Path(f"/proc/{c}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n, ticks = n + 1, ticks + int(fields[11]) + int(fields[12])
    return n, ticks / os.sysconf("SC_CLK_TCK")


def wait_ready(proc: subprocess.Popen, pool: int, timeout_s: float = 300.0, quiet_s: float = 2.0) -> float:
    """Wait until ``moelab app`` has its ``pool`` pre-heated kernels and they have gone quiet (no CPU used
    for ``quiet_s``): the moment a lecturer would open the room. Returns the seconds waited (Linux only;
    elsewhere it returns at once)."""
    return 0.0 if pool <= 0 else wait_kernels_quiet(proc, timeout_s, quiet_s, kernels=pool)


def wait_kernels_quiet(proc: subprocess.Popen, timeout_s: float = 300.0, quiet_s: float = 1.0, *,
                       kernels: int = 0) -> float:
    """Wait until at least ``kernels`` kernels run under ``moelab app`` and all of them have used no CPU for
    ``quiet_s`` (heated, or a visitor's kernel shut down); returns the seconds waited (Linux only; elsewhere it
    returns at once)."""
    if not Path("/proc/self/stat").exists():
        return 0.0
    t0, last, since = time.monotonic(), (-1, -1.0), time.monotonic()
    while time.monotonic() - t0 < timeout_s and proc.poll() is None:
        now = _kernel_cpu_s(proc.pid)
        if now != last:
            last, since = now, time.monotonic()
        elif now[0] >= kernels and time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.25)
    return time.monotonic() - t0


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _settled(panel: Any, quiet_s: float = 0.5, timeout_s: float = 30.0) -> Any:
    """The panel's figure fingerprints once they have not changed for ``quiet_s`` (an earlier redraw done)."""
    last, since, t0 = panel.evaluate(JS_FINGERPRINTS), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
        now = panel.evaluate(JS_FINGERPRINTS)
        if now != last:
            last, since = now, time.monotonic()
    return last


def panel_text(panel: Any) -> str:
    """The panel's text outside its figures (labels, readouts, status lines), shortened for messages."""
    text = panel.evaluate("""(root) => { const c = root.cloneNode(true);
        c.querySelectorAll('.js-plotly-plot').forEach(e => e.remove()); return c.innerText; }""")
    text = " ".join(text.split())
    return text if len(text) <= 600 else text[:300] + " ... " + text[-300:]


#: how long a key press may take to show the slider's new value; generous, since a busy 2-core machine delays
#: the page's redraws (the wait ends as soon as the value shows)
READOUT_WAIT_S = 20.0


def _step_direction(slider: Any, prefer_forward: bool) -> bool | None:
    """The way ``slider`` can step from where its handle sits (noUiSlider's ``aria-value*``): ``prefer_forward``
    unless the handle is at that end; None when it can move neither way (a single-value slider)."""
    handle = slider.locator(".noUi-handle").first
    try:
        now, low, high = (float(handle.get_attribute(a) or "nan")
                          for a in ("aria-valuenow", "aria-valuemin", "aria-valuemax"))
    except ValueError:
        now = low = high = float("nan")
    if not all(math.isfinite(x) for x in (now, low, high)):
        return prefer_forward  # no position to read: try the preferred way
    if now < high and (prefer_forward or now <= low):
        return True
    return False if now > low else None


def _slider_times(page: Any, name: str, panels: int, moves: int, timeout_s: float, tail: Any) -> list[float]:
    """Move the panels' sliders ``moves`` times in all (round robin over panels, each panel's first slider
    that moves) and time each redraw."""
    assert panels >= 1, f"{name}: the lesson shows no live panel with a slider\n{tail()}"
    times: list[float] = []
    for m in range(moves):
        panel = page.locator(f"[data-moelab-panel='{m % panels}']")
        panel.scroll_into_view_if_needed()
        assert wait_until(lambda panel=panel: bool(panel.evaluate(JS_FINGERPRINTS)), timeout_s, 0.2), \
            f"{name}: panel {m % panels} shows no plotly figure"
        before = _settled(panel)
        text_before = panel_text(panel)
        sliders = panel.locator(".widget-slider").count()
        moved = False
        for k in range(sliders):
            slider = panel.locator(".widget-slider").nth(k)
            readout = slider.locator(".widget-readout").first.inner_text()
            # the direction comes from the handle's position, not from a press that did nothing: on a loaded
            # machine the new value may show seconds later, and pressing back before it does undoes the move
            forward = _step_direction(slider, prefer_forward=(m // panels) % 2 == 0)
            if forward is None:
                continue
            t0 = time.monotonic()
            _press(slider, forward)
            if wait_until(lambda slider=slider, readout=readout:
                          slider.locator(".widget-readout").first.inner_text() != readout, READOUT_WAIT_S, 0.02):
                moved = True
                break
        assert moved, f"{name}: no slider of panel {m % panels} moves"
        if not wait_until(lambda panel=panel, before=before: panel.evaluate(JS_FINGERPRINTS) != before, timeout_s):
            # which side stalled: the panel's text outside its figures (a status line the kernel rewrites on
            # each move, the readouts) tells a change the kernel never answered from a figure not redrawn
            label = slider.locator(".widget-label").first.inner_text()
            raise AssertionError(
                f"{name}: move {m + 1} of {moves}: slider {label!r} of panel {m % panels} moved {readout} -> "
                f"{slider.locator('.widget-readout').first.inner_text()} but no figure redrew within "
                f"{timeout_s:.0f} s (earlier moves' redraws: {', '.join(f'{t:.2f}' for t in times) or 'none'} s)\n"
                f"panel text before the move: {text_before!r}\nnow: {panel_text(panel)!r}\n{tail()}")
        times.append(time.monotonic() - t0)
    return times


def run(quick: bool = False) -> list[Figure]:
    """``app_first_figure_seconds`` and ``app_slider_response_seconds_p50`` (see the module docstring)."""
    # lazy: the lecture machinery (and, when precomputing, papermill) loads only when the suite runs
    from moelab import lecture

    name = os.environ.get("MOELAB_BENCH_APP_NOTEBOOK", "03_afd_ratio")
    runs, note = Path("runs"), "results precomputed in runs/"
    with tempfile.TemporaryDirectory(prefix="moelab-app-runs-") as tmp:
        if lecture.find_precomputed(name, runs)[0] is None:
            runs, note = Path(tmp), "lesson precomputed first into a temporary folder (not timed)"
            lecture.precompute(name, {}, runs)
        timing = measure_lecture(name, runs, moves=3 if quick else SLIDER_MOVES, visits=FIRST_FIGURE_VISITS)
    shown = ", ".join(f"{s:.2f}" for s in timing.slider_s)
    firsts = ", ".join(f"{s:.2f}" for s in timing.first_figures_s)
    return [
        Figure(SUITE, "app_first_figure_seconds", timing.first_figure_s, "s", f"<= {GOAL_S:g}",
               f"moelab app {name} in headless Chromium: page request to first plotly figure, median of "
               f"{len(timing.first_figures_s)} visitors ({firsts} s); {note}"),
        Figure(SUITE, "app_slider_response_seconds_p50", timing.slider_p50_s, "s", f"<= {GOAL_S:g}",
               f"{len(timing.slider_s)} slider moves over {timing.panels} live panel(s), key press to redraw: "
               f"{shown} s"),
    ]


def _main(argv: list[str] | None = None) -> int:
    """``python -m moelab.bench.app NAME RUNS [--moves N] [--visits N] [--timeout S] [--screenshot PNG]``: one
    :class:`LectureTiming` as a JSON line."""
    p = argparse.ArgumentParser(prog="python -m moelab.bench.app")
    p.add_argument("name")
    p.add_argument("runs")
    p.add_argument("--moves", type=int, default=SLIDER_MOVES)
    p.add_argument("--visits", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--screenshot")
    args = p.parse_args(argv)
    timing = measure_lecture(args.name, args.runs, moves=args.moves, timeout_s=args.timeout, screenshot=args.screenshot,
                             visits=args.visits)
    print(json.dumps(asdict(timing)))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
