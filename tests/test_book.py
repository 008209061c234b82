"""``moelab book build``: a static site built from executed notebooks that works with no network.

The browser test serves the built site from ``python -m http.server`` on 127.0.0.1, opens every page in
headless Chromium (Debian's, through Playwright) with every request that leaves 127.0.0.1 refused, and
checks: no console error and no failed request, every plotly figure drawn, math typeset where the page has
math, solution cells collapsed, every internal link resolving to a file of the site.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from moelab.bench.app import stop_process
from moelab.book import BookError, build_book, check_output_folder, prepare_notebook, unlink_missing
from moelab.notebooks import run_notebook
from tests.browser import browser_tools, chromium_browser, free_port, new_context, wait_http

pytestmark = [pytest.mark.slow]

# the notebooks of the CI-sized book
BOOK_NOTEBOOKS = ("00_overview", "03_afd_ratio")


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> Path:
    from tests.test_notebook_03_afd_ratio import CI_PARAMS

    runs = tmp_path_factory.mktemp("runs")
    for name, params in zip(BOOK_NOTEBOOKS, ({}, CI_PARAMS), strict=True):  # CI-sized parameters
        run = run_notebook(name, params, runs)
        assert run.ok, f"{name} failed: {run.error}"
    return runs


@pytest.fixture(scope="module")
def site(executed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book") / "site"
    done = build_book(out, names=list(BOOK_NOTEBOOKS), executed_dir=executed, binder_repo="owner/moelab")
    assert set(done.reused) == set(BOOK_NOTEBOOKS) and not done.executed  # reused, never re-executed
    print(f"book_build_seconds {done.seconds:.1f} (sphinx {done.sphinx_seconds:.1f})")
    return out


# Runs in the page: what a reader would see broken.
JS_PAGE_REPORT = """() => {
    const plots = Array.from(document.querySelectorAll('.plotly-graph-div'));
    const sol = Array.from(document.querySelectorAll('.tag_hide-input'));
    const text = document.querySelector('main') ? document.querySelector('main').innerText : '';
    return {
        plots: plots.length,
        drawn: plots.filter(p => p.classList.contains('js-plotly-plot') && p.querySelector('.main-svg')).length,
        math_sources: document.querySelectorAll('.math, .MathJax_Preview').length,
        math_typeset: document.querySelectorAll('mjx-container').length,
        solutions: sol.length,
        solutions_open: sol.filter(s => { const d = s.querySelector('details'); return !d || d.open; }).length,
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
        live_note: text.includes('moelab lab'),
        // wider than its box: a printed line or a display equation the reader sees cut (thirteenth read)
        too_wide: Array.from(document.querySelectorAll('div.cell_output pre, mjx-container[display="true"]'))
            .filter(e => e.scrollWidth > e.clientWidth + 1)
            .map(e => `${e.tagName.toLowerCase()} ${e.scrollWidth} > ${e.clientWidth} px: ${e.textContent.slice(0, 60)}`),
    };
}"""


def test_book_pages_in_a_browser(site):
    chromium = browser_tools()
    pages = sorted(p.relative_to(site).as_posix() for p in site.glob("*.html") if p.name not in ("genindex.html", "search.html"))
    assert {"index.html", "00_overview.html", "03_afd_ratio.html"} <= set(pages)
    port = free_port()
    log = site.parent / "http.log"
    with log.open("w") as fh:
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                   "--directory", str(site)], stdout=fh, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/"
        wait_http(base, server, log)
        reports = {}
        with chromium_browser(chromium) as browser:
            context = new_context(browser, 1280, 800)  # the book's narrowest usual column: 688 px
            outside: list[str] = []
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                          else (outside.append(route.request.url), route.abort()))
            for rel in pages:
                page = context.new_page()
                errors: list[str] = []
                page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on("requestfailed", lambda r, errors=errors: errors.append(f"failed request {r.url}"))
                page.goto(base + rel, wait_until="networkidle")
                # MathJax loads deferred and typesets asynchronously: Sphinx's inline config defines
                # window.MathJax first, the library adds `startup` when it runs; then wait for its promise
                typeset = -1  # MathJax never started
                if page.locator(".math").count():
                    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                           timeout=30_000)
                    typeset = page.evaluate("""() => MathJax.startup.promise.then(
                        () => document.querySelectorAll('mjx-container').length)""")
                report = page.evaluate(JS_PAGE_REPORT)
                report["mathjax"] = typeset
                report["errors"] = errors
                reports[rel] = report
                page.close()
            context.close()
        assert outside == [], f"pages asked for resources outside the site: {outside[:5]}"
        for rel, r in reports.items():
            assert r["errors"] == [], f"{rel}: {r['errors'][:5]}"
            assert r["drawn"] == r["plots"], f"{rel}: {r['plots'] - r['drawn']} of {r['plots']} figures not drawn"
            if r["math_sources"]:
                assert r["math_typeset"] > 0, f"{rel}: math present but not typeset (MathJax: {r['mathjax']})"
            assert r["solutions_open"] == 0, f"{rel}: {r['solutions_open']} solution cells shown open"
            assert r["too_wide"] == [], f"{rel}: cut at a 1280-px window: {r['too_wide'][:5]}"
            for href in r["links"]:
                target = urllib.parse.urlsplit(href)
                if target.scheme or href.startswith(("#", "mailto:")):
                    continue
                path = (site / Path(rel).parent / urllib.parse.unquote(target.path)).resolve()
                assert path.exists(), f"{rel}: link {href!r} resolves to nothing"
        for name in BOOK_NOTEBOOKS:
            assert reports[f"{name}.html"]["live_note"], f"{name}: no note on how to open it live"
            assert reports[f"{name}.html"]["plots"] > 0, f"{name}: no figure in the page"
    finally:
        stop_process(server)


def test_prepare_notebook_turns_plotly_json_into_html_and_collapses_solutions():
    fig = {"data": [{"type": "scatter", "y": [1, 2]}], "layout": {}}
    nb = {"cells": [
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": True}}, "source": "answer = 1", "outputs": []},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "locked": True}}, "source": "check(answer)",
         "outputs": []},
        {"cell_type": "code", "metadata": {}, "source": "fig", "outputs": [
            {"output_type": "display_data", "metadata": {}, "data": {"application/vnd.plotly.v1+json": fig,
                                                                      "text/plain": "Figure"}},
            {"output_type": "display_data", "metadata": {},
             "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "VBox()"}}]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    out = prepare_notebook(nb, "99_demo", "owner/repo")
    assert "moelab lab" in out["cells"][0]["source"] and "mybinder.org/v2/gh/owner/repo" in out["cells"][0]["source"]
    assert "hide-input" in out["cells"][1]["metadata"]["tags"]
    # each collapsed toggle says what it opens: the solution, or the check (not two alike "Show code cell source")
    assert out["cells"][1]["metadata"]["mystnb"] == {"code_prompt_show": "Show the solution",
                                                     "code_prompt_hide": "Hide the solution"}
    assert "hide-input" in out["cells"][2]["metadata"]["tags"]
    assert out["cells"][2]["metadata"]["mystnb"]["code_prompt_show"] == "Show the check"
    assert "mystnb" not in out["cells"][3]["metadata"]
    figure, widget = out["cells"][3]["outputs"]
    assert "plotly-graph-div" in figure["data"]["text/html"] and "application/vnd.plotly.v1+json" not in figure["data"]
    assert "https://" not in figure["data"]["text/html"]  # no CDN script inside a figure
    assert set(widget["data"]) == {"text/markdown"}
    assert nb["cells"][0]["metadata"] == {"nbgrader": {"solution": True}}  # the input is not modified


def test_output_folder_errors(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(BookError, match="must be a folder"):
        check_output_folder(a_file)
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(BookError, match="not writable"):
                check_output_folder(locked / "site")
        finally:
            locked.chmod(0o700)


def test_failed_notebook_leaves_the_good_book(tmp_path, monkeypatch):
    import moelab.book as book
    from moelab._outputs import record_outputs
    from moelab.notebooks import NotebookRun

    good = tmp_path / "site"
    good.mkdir()
    (good / "index.html").write_text("the good book")
    record_outputs(good, book.WRITER)  # a book this command built earlier
    with pytest.raises(BookError, match="METHOD must be one of"):  # refused before any notebook runs
        build_book(good, names=["00"], executed_dir=None, params={"METHOD": "no_such_method"})
    monkeypatch.setattr(book, "run_notebook", lambda name, params, out, **kw: NotebookRun(
        name, 0.1, Path(out) / f"{name}.ipynb", False, "KeyError: 'boom'"))
    with pytest.raises(BookError, match="00_overview failed"):
        build_book(good, names=["00"], executed_dir=None)
    assert (good / "index.html").read_text() == "the good book"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".site")] == []  # no staging left behind


def test_cli_book_errors(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    done = subprocess.run([sys.executable, "-m", "moelab.cli", "book", "build", str(a_file)], capture_output=True,
                          text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: OUT must be a folder"), done.stderr
    done = subprocess.run([sys.executable, "-m", "moelab.cli", "book", "build", str(tmp_path / "b"), "--names", "zz"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "notebook must be one of" in done.stderr, done.stderr


def test_links_to_notebooks_outside_a_partial_book_become_text():
    md = "Next: [ELDR](01_eldr.ipynb), back to [the map](00_overview.ipynb#top), see [docs](https://x.org/a.ipynb)."
    assert unlink_missing(md, {"00_overview"}) == ("Next: ELDR, back to [the map](00_overview.ipynb#top), "
                                                    "see [docs](https://x.org/a.ipynb).")
    assert unlink_missing(md, {"00_overview"}, to_pages=True).startswith("Next: ELDR, back to [the map](00_overview.html#top)")


def test_book_shows_06_from_the_recorded_capture_when_vllm_is_hidden(tmp_path, monkeypatch):
    """Issue 40: where no live engine is installed, the book runs notebook 06 on the capture recorded with vLLM
    (data/traces/tiny-moe-06-vllm.npz) and labels the page with that recording's engine and date."""
    import importlib.util

    import moelab.models.vllm_engine as ve

    if importlib.util.find_spec("myst_nb") is None:
        if os.environ.get("CI"):
            pytest.fail("myst-nb (the docs extra) is required under CI")
        pytest.skip("needs the docs extra (sphinx, myst-nb)")
    monkeypatch.setattr(ve, "vllm_status", lambda features=("engine",): (False, "vLLM is not installed (hidden)"))
    done = build_book(tmp_path / "site", names=["06_from_your_deployment"], executed_dir=None, params={"PRESET": "ci"})
    assert set(done.executed) == {"06_from_your_deployment"}
    page = (tmp_path / "site" / "06_from_your_deployment.html").read_text()
    assert "capture backend: file (reading tiny-moe-06-vllm.npz)" in page  # the recorded capture, not a capture here
    assert "trace recorded with vLLM 0.32" in page or "trace recorded with vLLM 0.33" in page
    label = page.split("executed from a capture recorded with vLLM ", 1)
    assert len(label) == 2 and ", no live engine here" in label[1][:60], "the page is not labelled"
    assert "live-engine check: made when the trace was recorded" in page
