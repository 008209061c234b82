"""What a reader of the book sees in rendered pages: math in computed Markdown outputs, links that resolve to a
page and an anchor, one page order, no library logs, the panel note only where a panel was. Built with Sphinx
from small synthetic executed notebooks (no notebook is executed)."""

from __future__ import annotations

import html.parser
import importlib.util
import json
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.book import (
    CONF,
    PANEL_COPY_NOTE,
    PANEL_NOTE,
    _index,
    book_links,
    book_nav,
    chapter_title,
    is_progress_bar,
    prepare_notebook,
    reference,
)

WIDGET = "application/vnd.jupyter.widget-view+json"


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(outputs: list[dict]) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": "x = 1", "execution_count": 1, "outputs": outputs}


def _display(data: dict) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": data}


def _notebook(title: str, cells: list[dict]) -> dict:
    return {"metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5, "cells": [_md(f"# {title}\n\nintro"), *cells]}


def _cells() -> list[dict]:
    progress = {WIDGET: {"model_id": "a", "version_major": 2, "version_minor": 0},
                "text/plain": ["Loading weights:   0%|          | 0/272 [00:00<?, ?it/s]"]}
    panel = {WIDGET: {"model_id": "b", "version_major": 2, "version_minor": 0},
             "text/plain": ["VBox(children=(HBox(children=(IntSlider(value=7, description='candidates'…"]}
    return [
        _md("Uses `moelab.afd.simulate_measured` and `moelab.afd`; see [the notation](NOTATION.md#glossary) "
            "and the [README](../README.md).\n\n# 3. Does the paper's claim hold here?\n\ntext"),
        _code([_display({"text/markdown": r"With $\alpha$ = 0.8: $\bar n_{\mathrm{tok}}$ = 3.1 and"
                                          "\n\n$$t = \\frac{a}{b}$$\n\nsee [01](01_eldr.ipynb) and its [p95](NOTATION.md#glossary)",
                         "text/plain": "<Markdown>"})]),
        _code([{"output_type": "stream", "name": "stderr", "text": "INFO 12-06 engine.py:1] starting\n"},
               {"output_type": "stream", "name": "stdout", "text": "printed by the notebook\n"},
               _display(progress)]),
        _code([_display(panel)]),
        _md("---\nPrevious: [00 — map](00_overview.ipynb) · Next: [07 — cross](07_cross_paper.ipynb) ·\n"
            "[overview](00_overview.ipynb)"),
    ]


def test_outputs_drop_logs_and_progress_bars_and_note_only_panels():
    nb = _notebook("01 · ELDR — routing", _cells())
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"b": {}}}}
    page = prepare_notebook(nb, "01_eldr", None, included=["00_overview", "01_eldr", "02_hierarchy_drafting"])
    assert "widgets" not in page["metadata"]  # no widget manager in the book: the state only weighs the page
    # computed prose links the notation page like a markdown cell (tenth read: they pointed at "#NOTATION.md")
    shown = [o["data"]["text/markdown"] for c in page["cells"] for o in c.get("outputs", [])
             if "p95" in str(o.get("data", {}).get("text/markdown", ""))]
    assert shown and "(notation.md#glossary)" in shown[0]
    outputs = [o for c in page["cells"] for o in c.get("outputs", [])]
    assert not any(o.get("name") == "stderr" for o in outputs)
    assert any(o.get("text") == "printed by the notebook\n" for o in outputs)
    notes = [o for o in outputs if o.get("data", {}).get("text/markdown") == PANEL_NOTE]
    assert len(notes) == 1  # the panel; the progress bar is gone, not noted
    assert is_progress_bar(["Loading weights:   0%|          | 0/272 [00:00<?, ?it/s]"])
    assert not is_progress_bar("VBox(children=(IntSlider(value=7,")
    text = "\n".join(c["source"] for c in page["cells"] if c["cell_type"] == "markdown")
    assert "\n## 3. Does the paper's claim hold here?" in text  # one title per page
    assert "Previous: [00 — The map of the lab](00_overview.ipynb) · Next: [02 — Hierarchy Drafting]" in text
    assert "· ·" not in text


#: a panel as moelab.viz's notebook hook displays it: the live widget, and a static PNG copy of its figure as HTML
COPY = '<img alt="static copy of an interactive figure" src="data:image/png;base64,iVBORw0KGgo="/>'
# moelab.viz.common.static_fallback_html's note when no PNG was drawn
NO_COPY = ("<p><i>Interactive panel with 1 figure(s): open this notebook in JupyterLab or <code>moelab app</code> to "
           "use it (static copies: set MOELAB_PNG=1).</i></p>")


def _panel_with_copy() -> dict:
    return _display({WIDGET: {"model_id": "c", "version_major": 2, "version_minor": 0},
                     "text/html": COPY, "text/plain": ["VBox(children=(FloatSlider(value=0.1, description='tau'…"]})


def test_a_panel_with_a_static_copy_shows_its_caption_in_the_html_myst_nb_prefers():
    # myst-nb renders text/html before text/markdown: a note put in text/markdown beside the copy is never seen,
    # and the reader finds a figure again with no slider and no word of why (06's tau panel, 07's Explore panel)
    page = prepare_notebook(_notebook("06 — deployment", [_code([_panel_with_copy()])]), "06_from_your_deployment",
                            None)
    (out,) = [o for c in page["cells"] for o in c.get("outputs", [])]
    html = out["data"]["text/html"]
    assert PANEL_COPY_NOTE in html and html.index(PANEL_COPY_NOTE) < html.index(COPY)  # the caption, then the copy
    assert "sliders need a live kernel" in PANEL_COPY_NOTE and "static copy" in PANEL_COPY_NOTE
    # a run without PNG export has no copy, only the panel's note saying so: no caption claims a copy (eleventh read)
    no_copy = _display({WIDGET: {"model_id": "d", "version_major": 2, "version_minor": 0},
                        "text/html": NO_COPY, "text/plain": ["VBox()"]})
    page = prepare_notebook(_notebook("06 — deployment", [_code([no_copy])]), "06_from_your_deployment", None)
    (out,) = [o for c in page["cells"] for o in c.get("outputs", [])]
    assert PANEL_COPY_NOTE not in out["data"]["text/html"] and "MOELAB_PNG=1" in out["data"]["text/html"]
    assert WIDGET not in out["data"]


def test_page_order_titles_and_readme():
    md = "Previous: [04](04_dsd_rtt.ipynb) · Next: [07 — cross](07_cross_paper.ipynb) ·\n[map](00_overview.ipynb)"
    order = ["04_dsd_rtt", "05_balanceroute", "06_from_your_deployment", "07_cross_paper"]
    out = book_nav(md, "05_balanceroute", order)
    assert out.startswith("Previous: [04 — Speculation at a distance](04_dsd_rtt.ipynb) · "
                          "Next: [06 — From your deployment](06_from_your_deployment.ipynb) ·\n[map]")
    assert "07_cross_paper" not in out
    out = book_nav("Previous: [07](07_cross_paper.ipynb) · Back to [the map](00_overview.ipynb)",
                   "06_from_your_deployment", order)
    assert out.startswith("Previous: [05 — BalanceRoute](05_balanceroute.ipynb) · Next: [07 — Cross-paper]")
    assert chapter_title("01 · ELDR — expert-locality-aware decode routing") == \
        "01 — ELDR: expert-locality-aware decode routing"
    assert chapter_title("00 — The map of the lab") == "00 — The map of the lab"
    assert "01 — ELDR: x <01_eldr>" in _index(["01_eldr"], {"01_eldr": "01 · ELDR — x"})
    assert book_links("the [README](README.md) and [notebook 01](notebooks/01_eldr.ipynb)", "COURSE.md") == \
        "the README and [notebook 01](01_eldr.ipynb)"


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def broken_links(site: Path) -> list[str]:
    """Every internal ``href`` of the site's pages that does not reach an existing file and anchor."""
    parsed: dict[Path, _Links] = {}
    bad = []
    for page in sorted(site.rglob("*.html")):
        if "_static" in page.parts:
            continue
        links = parsed.setdefault(page, _parse(page))
        for href in links.hrefs:
            if ":" in href.split("#")[0].split("/")[0] or href.startswith("//"):
                continue  # external (https:, mailto:)
            path, _, anchor = href.partition("#")
            target = page if not path else (page.parent / posixpath.normpath(path)).resolve()
            if not path and not anchor:
                continue
            if not target.is_file():
                bad.append(f"{page.relative_to(site)}: {href} (no file)")
            elif anchor and target.suffix == ".html":
                ids = parsed.setdefault(target, _parse(target)).ids
                if anchor not in ids:
                    bad.append(f"{page.relative_to(site)}: {href} (no anchor)")
    return bad


@pytest.mark.slow
def test_rendered_pages_have_math_in_outputs_and_no_broken_link(tmp_path):
    if importlib.util.find_spec("sphinx") is None:
        pytest.skip("needs the docs extra (sphinx)")
    src = tmp_path / "src"
    (src / "api").mkdir(parents=True)
    (src / "_static").mkdir()
    names = ["00_overview", "01_eldr"]
    for name in names:
        exercise = [{**_code([]), "source": "### BEGIN SOLUTION\nanswer = 1\n### END SOLUTION",
                     "metadata": {"nbgrader": {"solution": True, "grade": False}}},
                    {**_code([_display({"text/markdown": "**Correct**"})]), "source": "check(answer)",
                     "metadata": {"nbgrader": {"grade": True, "locked": True}}}]
        page = prepare_notebook(_notebook(f"{name[:2]} — page {name}", [*_cells(), _code([_panel_with_copy()]),
                                                                           *exercise]), name, None,
                                included=names, api_links=True)
        (src / f"{name}.ipynb").write_text(json.dumps(page))
    (src / "notation.md").write_text("# Notation\n\n## Glossary\n\nterms\n")
    (src / "api" / "moelab.afd.rst").write_text(reference.page("moelab.afd"))
    (src / "index.md").write_text(_index([*names, "notation", "api/moelab.afd"], {}))
    (src / "conf.py").write_text(CONF + reference.SPHINX_CONF)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    site = tmp_path / "html"
    assert broken_links(site) == []
    body = (site / "01_eldr.html").read_text()
    assert "$\\alpha$" not in body and "\\(\\alpha\\)" in body  # the output's inline math is marked as math
    assert "\\[t = \\frac{a}{b}\\]" in body or 'class="math' in body
    assert "api/moelab.afd.html#moelab.afd.simulate_measured" in body
    assert "INFO 12-06" not in body and "printed by the notebook" in body
    assert body.count("An interactive panel") == 1 and "Loading weights" not in body
    # the panel with a static copy: its caption rendered above the copy (not a bare repeated figure)
    assert body.count(PANEL_COPY_NOTE) == 1 and body.index(PANEL_COPY_NOTE) < body.index("static copy of an interactive figure")
    assert "README" in body and "README.md" not in body
    # an exercise: the blank shown, then two collapsed toggles that each say what they open
    assert "YOUR CODE HERE" in body and "Show code cell source" not in body
    assert body.count("Show the solution") == 1 and body.count("Show the check") == 1


def test_png_export_does_not_log_choreographer_tracebacks():
    import logging

    from moelab.viz.common import _quiet_export_logs

    _quiet_export_logs()  # what save_figure does before kaleido runs
    assert not logging.getLogger("choreographer.channels.pipe").isEnabledFor(logging.ERROR)


def test_slides_drop_progress_bars_and_note_only_panels():
    from moelab.slides import slide_notebook

    progress = _display({WIDGET: {"model_id": "a"}, "text/plain": "Loading weights:  50%|#   | 136/272 [00:01<00:01]"})
    panel = _display({WIDGET: {"model_id": "b"}, "text/plain": "VBox(children=(IntSlider(value=7),))"})
    nb = slide_notebook("02_hierarchy_drafting", {0: [progress, panel]}, app_command="moelab app")
    shown = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert len(shown) == 1 and "An interactive panel" in shown[0]["data"]["text/markdown"]


def test_slides_caption_a_panels_static_copy():
    """A panel's static copy (HTML, which reveal.js shows before Markdown) carries its caption inside, above the
    image, so a slide never repeats a figure with no word that it is the panel at this run's parameters."""
    from moelab.slides import slide_notebook

    img = '<img alt="static copy of an interactive figure" src="data:image/png;base64,AAAA"/>'
    panel = _display({WIDGET: {"model_id": "b"}, "text/plain": "VBox(children=(IntSlider(value=7),))",
                      "text/html": img})
    nb = slide_notebook("06_from_your_deployment", {0: [panel]}, app_command="moelab app 06_from_your_deployment")
    shown = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert len(shown) == 1
    html = shown[0]["data"]["text/html"]
    assert html.index("static copy of an interactive panel") < html.index("<img")
    assert "moelab app 06_from_your_deployment" in html and "text/markdown" not in shown[0]["data"]


def test_each_notebook_links_its_neighbours_in_the_reading_order():
    """A notebook's Previous/Next line, 00's reading-order table and the book's chapters follow one order
    (:data:`moelab.notebooks.READING_ORDER`), so a reader in JupyterLab and one in the book walk the same path."""
    from moelab.book import _nav_link
    from moelab.notebooks import READING_ORDER, available_notebooks, in_reading_order, notebooks_dir

    assert sorted(READING_ORDER) == available_notebooks()
    assert in_reading_order(["mine", "06_from_your_deployment", "00_overview"]) == \
        ["00_overview", "06_from_your_deployment", "mine"]
    for i, name in enumerate(READING_ORDER):
        text = "".join(json.loads((notebooks_dir() / f"{name}.ipynb").read_text())["cells"][-1]["source"])
        want = ([f"Previous: {_nav_link(READING_ORDER[i - 1])}"] if i else []) + (
            [f"Next: {_nav_link(READING_ORDER[i + 1])}"] if i + 1 < len(READING_ORDER) else [])
        assert " · ".join(want) in text, f"{name}'s last cell should link {want}"
        assert book_nav(text, name, READING_ORDER) == text  # the book leaves it as it is
