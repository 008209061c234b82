"""``moelab app`` (lecture mode) and ``moelab slides``: bad input is an ``error: ...`` line and exit code 2, never
a traceback; the research part starts at its tagged heading in every notebook; a precomputed run is replayed
(only the cells the live panels need run) and an unusable one is named on the page; the slides are offline and
cut to fit a screen. In a real browser (slow): the slides open from 127.0.0.1 with no request elsewhere.
``moelab app`` serving a real precomputed lesson in Chromium (what the page shows, the first figure and every
slider redraw, timed) is ``tests/test_browser.py::test_app_serves_dashboard``, which shares that module's
browser."""

from __future__ import annotations

import importlib.util
import json
import re

import nbformat
import pytest

from moelab import app, lecture, slides
from moelab.cli import main
from moelab.notebooks import available_notebooks


@pytest.mark.parametrize("argv, needle", [
    (["app", "no_such_notebook"], "notebook must be one of"),
    (["app", "04", "--host", "0.0.0.0"], "--allow-remote"),
    (["app", "04", "--host", "example.org"], "loopback"),
    (["app", "04", "--port", "70000"], "--port"),
    (["app", "04", "--params", "not_a_parameter=1"], "has no parameter"),
])
def test_bad_input_is_an_error_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err


def test_served_copy_has_the_parameters(tmp_path):
    path = app.prepare_notebook("04_dsd_rtt", {"MC_ROUNDS": 500}, tmp_path)
    nb = nbformat.read(path, as_version=4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    at = next(i for i, t in enumerate(tags) if "parameters" in t)
    assert "injected-parameters" in tags[at + 1] and "MC_ROUNDS = 500" in nb.cells[at + 1].source
    assert app.prepare_notebook("04_dsd_rtt", {}, tmp_path).parent.name == "notebooks"  # no params: the original


def test_voila_command_hides_code_and_binds_as_told():
    cmd = app.voila_command(app.Path("x.ipynb"), host="127.0.0.1", port=8866, token="t", open_browser=False)
    assert "--strip_sources=True" in cmd and "--Voila.ip=127.0.0.1" in cmd and "--token=t" in cmd
    assert "--no-browser" in cmd and "--port=8866" in cmd
    # only the front-end extensions a lesson page needs, and the template without CDN stylesheets
    assert [a.split("=", 1)[1] for a in cmd if a.startswith("--VoilaConfiguration.extension_allowlist=")] == \
        list(app.PAGE_EXTENSIONS)
    assert f"--template={app.VOILA_TEMPLATE}" in cmd
    assert (app.VOILA_DATA / "voila" / "templates" / app.VOILA_TEMPLATE / "index.html.j2").is_file()
    template = (app.VOILA_DATA / "voila" / "templates" / app.VOILA_TEMPLATE / "index.html.j2").read_text()
    assert "block data_priority" in template and "static/plotly.min.js" in template  # figures drawn by the page
    assert not any("preheat" in a or "fill_delay" in a for a in cmd)  # no pool asked: none
    pooled = app.voila_command(app.Path("x.ipynb"), host="127.0.0.1", port=1, token="t", open_browser=False, pool=2,
                               refill_delay_s=12.5)
    assert "--pool_size=2" in pooled and "--VoilaKernelManager.fill_delay=12.5" in pooled


def test_plotly_js_is_served_next_to_the_template(tmp_path):
    """``moelab app`` puts the installed plotly.js where Voila serves the lecture template's static files (a copy:
    Voila refuses symlinks out of a static folder), in a Jupyter data folder of its own."""
    data = app.plotly_data_dir(tmp_path)
    served = data / "voila" / "templates" / app.VOILA_TEMPLATE / "static" / "plotly.min.js"
    assert served.is_file() and not served.is_symlink()
    source = app.Path(importlib.util.find_spec("plotly").submodule_search_locations[0]) / "package_data"
    assert served.read_bytes() == (source / "plotly.min.js").read_bytes()
    assert app.plotly_data_dir(tmp_path) == data  # a second call (same folder) is fine


def _figure_notebook(path, *trace_types: str):
    cells = [{"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1, "outputs": [
        {"output_type": "display_data", "metadata": {},
         "data": {"application/vnd.plotly.v1+json": {"data": [{"type": t} for t in trace_types] + [{"x": [1]}]}}}]}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_page_gets_the_small_plotly_bundle_only_when_it_draws_every_recorded_trace(tmp_path):
    """The vendored partial bundle (a third of the full plotly.js) is served when every recorded trace is one of
    its types (a trace without a type is a scatter) and its plotly.js version is the installed one's; a trace
    type it lacks (a table, a 3-D scatter) gets the full bundle."""
    installed = app.Path(importlib.util.find_spec("plotly").submodule_search_locations[0]) / "package_data" / "plotly.min.js"
    assert app._plotly_js_version(app.CARTESIAN_BUNDLE) == app._plotly_js_version(installed)  # vendored to match
    cartesian = _figure_notebook(tmp_path / "a.ipynb", "heatmap", "bar")
    assert app.recorded_trace_types(cartesian) == {"heatmap", "bar", "scatter"}
    for nb, want in ((cartesian, app.CARTESIAN_BUNDLE), (_figure_notebook(tmp_path / "b.ipynb", "bar", "table"), installed),
                     (_figure_notebook(tmp_path / "c.ipynb", "scatter3d"), installed)):
        data = app.plotly_data_dir(tmp_path / nb.stem, nb)
        served = data / "voila" / "templates" / app.VOILA_TEMPLATE / "static" / "plotly.min.js"
        assert served.read_bytes() == want.read_bytes(), nb.name


# --- the lesson/research boundary -------------------------------------------------------------------------

RESEARCH_HEADING = re.compile(r"^#{1,2} .*claim hold here\?", re.MULTILINE)


@pytest.mark.parametrize("name", available_notebooks())
def test_research_part_starts_at_its_tagged_heading(name):
    """At most one cell is tagged ``research``; it is the first "Does the paper's claim hold here?" heading,
    and a notebook with that heading has the tag; the lesson part keeps the headline cell."""
    nb = lecture.load(name)
    tagged = [i for i, c in enumerate(nb["cells"]) if lecture.RESEARCH_TAG in lecture._tags(c)]
    heading = [i for i, c in enumerate(nb["cells"])
               if c["cell_type"] == "markdown" and RESEARCH_HEADING.search(lecture._source(c))]
    assert len(tagged) <= 1
    assert tagged == heading[:1], f"{name}: research tag on {tagged}, research heading at {heading[:1]}"
    lesson = lecture.lesson_cells(nb)
    assert len(lesson) == lecture.research_start(nb) and lesson
    if any("headline" in lecture._tags(c) for c in nb["cells"]):
        assert any("headline" in lecture._tags(c) for c in lesson), f"{name}: the headline is past the lesson"


def test_cell_names_reads_and_binds():
    names = lecture.cell_names("import numpy as np\nx = f(a)\ny = x + b\nfor i in range(n):\n    z = i\n"
                               "c += 1\nd = [k for k in e]\ndef g(p):\n    q = p + h\n    return q\n")
    assert names.reads == {"f", "a", "b", "n", "c", "e", "h"}
    assert {"np", "x", "y", "i", "z", "c", "d", "g"} <= names.binds
    assert lecture.cell_names("x = x + 1").reads == {"x"}  # a rebinding still reads the earlier x
    assert lecture.cell_names("def (").reads == frozenset()


def test_live_cells_follow_the_names_a_panel_reads():
    sources = ["A = 1\nB = 2", "import m\nheavy = m.sim(A)", "table = m.load(B)", "panel = m.panel(table, A)"]
    assert lecture.live_cells(sources, {0, 3}) == {0, 1, 2, 3}  # m is imported by the heavy cell: it runs too
    sources[1] = "import m"
    sources.insert(2, "heavy = m.sim(A)")
    assert lecture.live_cells(sources, {0, 4}) == {0, 1, 3, 4}  # the heavy cell is not needed: replayed


# --- precomputed runs (a fake run: no kernel) ---------------------------------------------------------------

NB = "04_dsd_rtt"
WIDGET = {"application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2, "version_minor": 0},
          "text/plain": "panel"}
PLOTLY = {"application/vnd.plotly.v1+json": {"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}],
                                             "layout": {"title": {"text": "t"}}}}


def fake_run(runs, *, params=None, change=None, error_at=None, subdir=""):
    """A papermill-like executed copy of 04's lesson: every code cell prints its position, the panel cell
    shows a widget, the first figure cell a plotly figure."""
    nb = lecture.load(NB)
    cells = lecture.lesson_cells(nb)
    k = -1
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        k += 1
        src = lecture._source(cell)
        cell["execution_count"] = k + 1
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": f"cell {k}\n"}]
        if "dsd_panel(" in src:
            cell["outputs"].append({"output_type": "execute_result", "data": WIDGET, "metadata": {}, "execution_count": k + 1})
        elif "save_figure(" in src:
            cell["outputs"].append({"output_type": "display_data", "data": PLOTLY, "metadata": {}})
        if k == error_at:
            cell["outputs"].append({"output_type": "error", "ename": "E", "evalue": "boom", "traceback": []})
        if k == change:
            cell["source"] = src + "\n# edited"
    nb["cells"] = cells
    nb["metadata"]["papermill"] = {"parameters": params or {}, "end_time": "2026-01-01T00:00:00"}
    folder = runs / subdir if subdir else runs
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NB}.ipynb").write_text(json.dumps(nb))
    return nb


def test_lecture_replays_a_precomputed_run(tmp_path):
    fake_run(tmp_path / "runs")
    served = lecture.lecture_notebook(NB, {}, tmp_path / "runs", tmp_path / "replay.json")
    assert served.precomputed is not None and served.precomputed.path == tmp_path / "runs" / f"{NB}.ipynb"
    code = [lecture._source(c) for c in served.notebook["cells"] if c["cell_type"] == "code"]
    live = [s for s in code if "_moelab_replay(" not in s and "OutputReplay" not in s]
    assert any("dsd_panel(" in s for s in live) and any("parameters" in s for s in live)
    assert not any("best_mode(" in s for s in live), "a heavy cell the panel does not need runs live"
    assert served.replayed and set(served.live) | set(served.replayed) == set(range(len(served.live) + len(served.replayed)))
    replay = json.loads((tmp_path / "replay.json").read_text())
    assert all(str(k) in replay for k in served.replayed)
    first = lecture._source(served.notebook["cells"][0])
    assert "computed by an earlier run" in first and "2026-01-01" in first
    text = " ".join(lecture._source(c) for c in served.notebook["cells"])
    assert not RESEARCH_HEADING.search(text)  # the research part is not served


@pytest.mark.parametrize("kind, needle", [
    (dict(change=3), "has changed since it ran"),
    (dict(error_at=2), "failed in that run"),
    (dict(params={"RTT": 1.0}), "other parameters"),
])
def test_an_unusable_run_is_said_and_the_lesson_computed(tmp_path, kind, needle):
    params = {"RTT": 60.0} if "params" in kind else {}
    fake_run(tmp_path / "runs", **kind)
    served = lecture.lecture_notebook(NB, params, tmp_path / "runs", tmp_path / "replay.json")
    assert served.precomputed is None and needle in served.why_not
    note = lecture._source(served.notebook["cells"][0])
    assert "no precomputed results" in note and f"moelab app {NB} --precompute" in note
    assert not served.replayed and not (tmp_path / "replay.json").exists()


def test_lesson_only_run_is_preferred(tmp_path):
    fake_run(tmp_path / "runs", change=1)  # a stale full run ...
    fake_run(tmp_path / "runs", subdir="lecture")  # ... and a good lesson-only run
    pre, why = lecture.find_precomputed(NB, tmp_path / "runs")
    assert pre is not None and pre.path.parent.name == "lecture" and not why


def test_output_replay_shows_the_recorded_outputs(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"0": [{"output_type": "stream", "name": "stdout", "text": ["a ", "b\n"]}]}))
    lecture.OutputReplay.load(path)(0)
    assert capsys.readouterr().out == "a b\n"


@pytest.mark.parametrize("argv, needle", [
    (["app", "04", "--whole", "--precompute"], "--precompute"),
    (["app", "04", "--pool", "99"], "--pool"),
    (["app", "04", "--refill-delay", "-1"], "--refill-delay"),
    (["app", "04", "--refill-delay", "nan"], "--refill-delay"),
    (["slides", "no_such_notebook"], "notebook must be one of"),
])
def test_more_bad_input_is_an_error_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err


def test_slides_into_a_file_is_an_error(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["slides", "04", str(tmp_path / "f"), "--from", str(tmp_path)]) == 2
    assert "is a file" in capsys.readouterr().err


# --- slides --------------------------------------------------------------------------------------------------

def test_split_markdown_fits_a_slide_and_keeps_blocks_whole():
    para = " ".join(["word"] * 40)
    text = "## Title\n\n" + "\n\n".join([para] * 5) + "\n\n```\ncode\n\nstill code\n```\n\n$$\na\n\nb\n$$"
    chunks = slides.split_markdown(text, max_words=100)
    assert len(chunks) >= 3 and all(len(c.split()) <= 100 for c in chunks)
    assert chunks[0].startswith("## Title")
    assert any("```\ncode\n\nstill code\n```" in c for c in chunks)  # a fence is never cut
    assert any("$$\na\n\nb\n$$" in c for c in chunks)


CDN = re.compile(r"""<(?:script|link)[^>]+(?:src|href)=["'](?:https?:)?//""", re.IGNORECASE)


def build_fake_slides(tmp_path):
    fake_run(tmp_path / "runs", subdir="lecture")
    return slides.build_slides(NB, tmp_path / "slides", runs=tmp_path / "runs")


def test_slides_are_offline_and_fit(tmp_path):
    done = build_fake_slides(tmp_path)
    html = done.html.read_text()
    assert not CDN.search(html), CDN.search(html).group(0)
    assert not any(host in html for host in ("unpkg.com", "cdnjs", "jsdelivr", "mathjax.org", "cdn.plot.ly"))
    for ref in ("vendor/reveal.js/dist/reveal.js", "vendor/reveal.js/dist/reveal.css", "vendor/mathjax/tex-chtml-full.js",
                "vendor/plotly.min.js"):
        assert ref in html and (done.html.parent / ref).is_file(), ref
    assert "Reveal.initialize" in html and "require(" not in html
    assert done.slides >= 5 and "claim-hold-here" not in html  # no research heading (its anchor)
    nb = slides.slide_notebook(NB, lecture.find_precomputed(NB, tmp_path / "runs")[0].outputs, app_command="x")
    kinds = [c["metadata"]["slideshow"]["slide_type"] for c in nb["cells"]]
    # each slide (a run of cells up to the next slide/subslide) holds at most SLIDE_WORDS words of markdown
    words, slide_words = 0, []
    for cell, kind in zip(nb["cells"], kinds):
        if kind in ("slide", "subslide"):
            slide_words.append(words)
            words = 0
        if cell["cell_type"] == "markdown":
            words += len(lecture._source(cell).split())
    slide_words.append(words)
    longest = max(len(b.split()) for c in lecture.lesson_cells(lecture.load(NB)) if c["cell_type"] == "markdown"
                  for b in re.split(r"\n\s*\n", lecture._source(c)))
    assert max(slide_words) <= max(slides.SLIDE_WORDS, longest)
    assert "skip" in kinds  # solutions and checks are not shown


# --- in a real browser ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chromium_path():
    from tests import browser as b

    return b.browser_tools()


@pytest.mark.slow
@pytest.mark.browser
def test_slides_open_offline_in_chromium(tmp_path, chromium_path):
    """The slides from 127.0.0.1: reveal.js starts, every request stays on this machine, no console error."""
    import functools
    import http.server
    import threading

    from playwright.sync_api import sync_playwright

    from tests import browser as b

    done = build_fake_slides(tmp_path)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(done.html.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    errors, hosts = [], set()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path, args=b.CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "404" not in m.text else None)
            page.on("response", lambda r: errors.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: hosts.add(r.url.split("/")[2] if "://" in r.url else r.url[:5]))
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/{done.html.name}", timeout=120_000)  # a loaded 2-core machine
            assert b.wait_for(lambda: page.evaluate("() => !!(window.Reveal && Reveal.isReady())"), 30, 0.2)
            total = page.evaluate("() => Reveal.getTotalSlides()")
            page.keyboard.press("ArrowRight")
            assert b.wait_for(lambda: page.evaluate("() => Reveal.getIndices().h") == 1, 10, 0.2)
            assert b.wait_for(lambda: page.evaluate("() => !!(window.MathJax && MathJax.startup && MathJax.startup.document)"), 30, 0.2)
            browser.close()
    finally:
        server.shutdown()
    assert total >= done.slides // 2 and not errors, errors
    assert hosts <= {f"127.0.0.1:{server.server_address[1]}", "data:"}, hosts
