"""The executed lab as a static book: ``moelab book build [OUT]``.

The book is a Sphinx site (``myst-nb`` renders the executed notebooks, ``sphinx-book-theme`` gives the table
of contents and the toggles) that works from any static file server with no network:

* notebooks are reused from ``moelab notebooks run`` (``runs/``) when that copy was executed without an
  error after the source notebook was last changed; the others are executed here with papermill;
* plotly figures are stored by the kernel as ``application/vnd.plotly.v1+json``, which Sphinx cannot show:
  each becomes an HTML ``<div>`` drawn by the ``plotly.min.js`` of the installed plotly package, served
  from the site itself (so the figures stay interactive: zoom, hover, legend);
* MathJax is the npm package ``mathjax@3.2.2`` (Apache-2.0), vendored in ``moelab/book/static/vendor``;
* solution cells (nbgrader ``solution: true`` or ``jupyter.source_hidden``) are collapsed behind a toggle;
* ipywidgets panels need a running kernel: in the book each is replaced by a note that says how to open
  the notebook live (every page also starts with that command and, given a repository, a Binder link); a
  widget that is a tqdm progress bar is dropped, as is every stderr stream (library logs and warnings);
* computed Markdown outputs (``display(Markdown(...))``) are rendered as MyST, so their ``$...$`` math is typeset
  like a markdown cell's; a backticked public name links to its API entry through a Sphinx role;
* the index lists one title per chapter (a notebook's later level-1 headings become level 2) in one style, and a
  notebook's ``Previous: ... · Next: ...`` line follows the index's order;
* notebook 06 captures from a live vLLM engine: where none is installed, the book runs it on the capture recorded
  with vLLM once (``data/traces/tiny-moe-06-vllm.npz``, :func:`notebook_params`) and labels the page with the
  engine and date of that recording (:func:`capture_note`).

The site is written into a temporary folder beside ``OUT`` and swapped in only when the whole build
succeeded, so a failing notebook never leaves a half-written book over a good one. ``OUT`` follows moelab's
output policy: it must be new, empty, or a book this command built, with no file in it
that the build did not write; anything else stops the command before any notebook runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab._io import read_json
from moelab._outputs import check_output_dir, replace_dir
from moelab.datasets import repo_root
from moelab.notebooks import check_parameters, in_reading_order, notebooks_dir, resolve, run_notebook

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
VENDOR = Path(__file__).parent / "static" / "vendor"
#: pages besides the notebooks, in reading order: (file in the repository, page name)
EXTRA_PAGES = (("COURSE.md", "course"), ("notebooks/NOTATION.md", "notation"), ("docs/guide.md", "guide"))


class BookError(ValueError):
    """A book could not be built (a notebook failed, an output folder is unusable); the message says which."""


@dataclass(frozen=True)
class BookBuild:
    """What :func:`build_book` did: the site folder, per notebook whether it was reused or executed and
    how long that took, and the seconds the Sphinx build itself took."""

    out: Path
    pages: tuple[str, ...]
    reused: tuple[str, ...]
    executed: dict[str, float] = field(default_factory=dict)
    sphinx_seconds: float = 0.0
    seconds: float = 0.0


#: the writer's name in the output marker (``.moelab-output.json``)
WRITER = "book build"


def check_output_folder(out: str | os.PathLike) -> Path:
    """``out`` as an absolute path that can become the site: new, empty or a book this command built (nothing
    in it that the build did not write), not a link, not inside moelab's sources, its parent writable."""
    try:
        path = check_output_dir(out, writer=WRITER, name="OUT", replace=True)
    except ValueError as exc:
        raise BookError(str(exc)) from None
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BookError(f"OUT {path} cannot be written: {parent} is not writable")
    return path


def reusable(executed: Path, source: Path) -> bool:
    """Whether ``executed`` is a papermill run of ``source`` that finished without an error and is newer
    than the source's last change."""
    if not executed.is_file() or executed.stat().st_mtime < source.stat().st_mtime:
        return False
    try:
        meta = read_json(executed).get("metadata", {}).get("papermill", {})  # size and nesting checked first
    except (OSError, ValueError, AttributeError):
        return False
    return bool(meta) and not meta.get("exception")


def _plotly_html(spec: dict[str, Any], div_id: str) -> str:
    import plotly.io as pio  # lazy: plotly is only needed while a book is built

    return pio.to_html(spec, include_plotlyjs=False, full_html=False, div_id=div_id, include_mathjax=False,
                       config={"responsive": True})


def live_note(name: str, binder_repo: str | None) -> str:
    """The Markdown that opens every notebook page: how to run this notebook live."""
    lines = [f"**Run this notebook live.** In a clone of the repository: `moelab lab`, then open "
             f"`notebooks/{name}.ipynb` (sliders and panels need the live kernel)."]
    if binder_repo:
        url = f"https://mybinder.org/v2/gh/{binder_repo}/HEAD?labpath=notebooks%2F{name}.ipynb"
        lines.append(f"Or on Binder: [launch {name}]({url}).")
    return "```{note}\n" + " ".join(lines) + "\n```"


_NOTEBOOK_LINK = re.compile(r"\[([^\]]+)\]\((\d\d_[A-Za-z0-9_]+)\.ipynb(#[^)]*)?\)")


def unlink_missing(markdown: str, included: Collection[str], *, to_pages: bool = False) -> str:
    """``markdown`` with links to lab notebooks outside ``included`` reduced to their text (a partial book
    has no page for them). Sphinx turns a markdown cell's links to included notebooks into links to their
    pages, but not those in a cell's computed Markdown output: ``to_pages`` points those at the ``.html``."""
    def fix(m: re.Match) -> str:
        if m.group(2) not in included:
            return m.group(1)
        return f"[{m.group(1)}]({m.group(2)}.html{m.group(3) or ''})" if to_pages else m.group(0)

    return _NOTEBOOK_LINK.sub(fix, markdown)


_LINK_TARGET = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def book_links(markdown: str, source: str) -> str:
    """``markdown`` of the repository file ``source`` (e.g. ``"COURSE.md"``, ``"notebooks/00_overview.ipynb"``)
    with its relative links to lab notebooks and to the extra pages pointed at their book pages: in the book
    every page sits in one folder, so ``notebooks/01_eldr.ipynb`` (from ``COURSE.md``) becomes
    ``01_eldr.ipynb`` and ``NOTATION.md`` (from a notebook) or ``../COURSE.md`` become ``notation.md`` and
    ``course.md``. A link to another Markdown file of the repository (``README.md``), which has no page in the
    book, becomes its text. Other links are left as they are."""
    base = posixpath.dirname(source)
    pages = {rel: f"{page}.md" for rel, page in EXTRA_PAGES}

    def fix(m: re.Match) -> str:
        target = m.group(3)
        if m.group(1) or ":" in target or target.startswith("/"):
            return m.group(0)
        rel = posixpath.normpath(posixpath.join(base, target))
        if rel in pages:
            page = pages[rel]
        elif re.fullmatch(r"notebooks/\d\d_[A-Za-z0-9_]+\.ipynb", rel):
            page = rel.split("/", 1)[1]
        elif rel.endswith(".md"):
            return m.group(2)
        else:
            return m.group(0)
        return f"[{m.group(2)}]({page}{m.group(4) or ''})"

    return _LINK_TARGET.sub(fix, markdown)


_FENCE = re.compile(r"^\s*(```|~~~)")


def demote_extra_titles(markdown: str, seen_title: bool) -> tuple[str, bool]:
    """``markdown`` with every level-1 heading after the page's first (``# 3. Does the paper's claim hold here?``)
    made a level-2 one, so the page has one title (the book's index lists titles only); code fences are left as
    they are. Returns the text and whether the page's title has now been seen."""
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("# "):
            if seen_title:
                line = "#" + line
            seen_title = True
        lines.append(line)
    return "\n".join(lines), seen_title


_NAV = re.compile(r"(Previous|Next): \[[^\]]*\]\(\d\d_[A-Za-z0-9_]+\.ipynb\)(\s*·)? ?")
_NAV_LINE = re.compile(r"^(Previous|Next): ", re.MULTILINE)


def _nav_link(page: str) -> str:
    """``[NN — short title](page.ipynb)``: the notebook's title up to its first colon or parenthesis."""
    try:
        nb = read_json(notebooks_dir() / f"{page}.ipynb")
        label = re.split(r"[:(]", chapter_title(_title(nb, page)), maxsplit=1)[0].strip()
    except (OSError, ValueError, KeyError, TypeError):
        label = ""
    if not re.match(r"\d\d — \S", label):
        label = f"{page[:2]} — {page[3:].replace('_', ' ')}"
    return f"[{label}]({page}.ipynb)"


def book_nav(markdown: str, name: str, order: Sequence[str]) -> str:
    """``markdown`` with a notebook's own ``Previous: [..](..) · Next: [..](..)`` line pointing at the pages
    before and after ``name`` in the book's order ``order`` (the index's), so that the prose and the book's
    previous/next buttons agree; a line without such links is left as it is."""
    first = _NAV_LINE.search(markdown)
    if name not in order or first is None or not _NAV.match(markdown, first.start()):
        return markdown
    i = list(order).index(name)
    links = ([f"Previous: {_nav_link(order[i - 1])}"] if i > 0 else []) + (
        [f"Next: {_nav_link(order[i + 1])}"] if i + 1 < len(order) else [])
    end = markdown.find("\n", first.start())
    end = len(markdown) if end < 0 else end
    line = _NAV.sub("", markdown[first.start():end])
    nav = " ".join(f"{link} ·" for link in links)
    return markdown[:first.start()] + " ".join(part for part in (nav, line) if part) + markdown[end:]


def prepare_notebook(nb: dict[str, Any], name: str, binder_repo: str | None,
                     included: Collection[str] | None = None, *, api_links: bool = False) -> dict[str, Any]:
    """A copy of an executed notebook ready for Sphinx: plotly outputs as HTML, widget panels as a note,
    solution cells collapsed, links to the notation and course pages pointed at the book's (:func:`book_links`),
    links to notebooks outside ``included`` (default: all) reduced to text, the live-run note first;
    ``api_links``: a backticked public name (`` `moelab.afd.simulate_measured` ``) links to its API reference
    entry (:func:`moelab.book.reference.link_symbols`)."""
    nb = copy.deepcopy(nb)
    # the live panels' widget state (megabytes of plotly per panel) serves no page: the book has no widget
    # manager, and each panel is shown as its static copy or a note
    nb.get("metadata", {}).pop("widgets", None)
    figure, titled = 0, False
    nb["cells"] = _with_blanks(nb["cells"])
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = book_links("".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"],
                                f"notebooks/{name}.ipynb")
            source, titled = demote_extra_titles(source, titled)
            if included is not None:
                source = book_nav(unlink_missing(source, included), name,
                                  in_reading_order([n for n in included if n[:2].isdigit()]))
            cell["source"] = source
            if api_links:
                from moelab.book.reference import link_symbols  # lazy: imports every public package

                cell["source"] = link_symbols(cell["source"])
        meta = cell.setdefault("metadata", {})
        tags = meta.setdefault("tags", [])
        grader = meta.get("nbgrader", {})
        solution = grader.get("solution") or meta.get("jupyter", {}).get("source_hidden")
        check = grader.get("grade") is True and grader.get("locked") is True  # collapsed like the solution
        if cell["cell_type"] == "code" and (solution or check) and "hide-input" not in tags:
            tags.append("hide-input")
        if cell["cell_type"] == "code" and (grader.get("solution") or check):
            # two identical "Show code cell source" toggles under a blank left the student to guess which one
            # gives the answer away: each says what it opens (myst-nb's cell-level prompts)
            what = "the solution" if grader.get("solution") else "the check"
            meta.setdefault("mystnb", {}).update({"code_prompt_show": f"Show {what}", "code_prompt_hide": f"Hide {what}"})
        for out in cell.get("outputs", []):
            data = out.get("data")
            if not data:
                continue
            if "text/markdown" in data:  # computed prose links the notation page and notebooks too
                md = data["text/markdown"]  # rendered as MyST (CONF): links resolve like a markdown cell's
                md = book_links("".join(md) if isinstance(md, list) else md, f"notebooks/{name}.ipynb")
                data["text/markdown"] = md if included is None else unlink_missing(md, included)
            if PLOTLY_MIME in data:
                figure += 1
                data["text/html"] = _plotly_html(data.pop(PLOTLY_MIME), f"{name}-figure-{figure}")
            if WIDGET_MIME in data:
                data.pop(WIDGET_MIME)
                plain = data.pop("text/plain", None)
                if is_progress_bar(plain):  # a tqdm bar drawn as a widget: nothing to show in the book
                    out["drop"] = True
                elif "text/html" in data:  # the panel's static copy (moelab.viz's PNG of its figures), or its note
                    # that none was drawn (a run without PNG export), which stands as it is
                    html = "".join(data["text/html"]) if isinstance(data["text/html"], list) else data["text/html"]
                    # myst-nb shows text/html before text/markdown: the caption goes inside the HTML, above the
                    # copy, or the reader sees a figure again with no slider and no word of why
                    data["text/html"] = (PANEL_COPY_NOTE_HTML + html) if "<img" in html else html
                else:  # a panel without a static copy: the note alone
                    data["text/markdown"] = PANEL_NOTE
        if "outputs" in cell:  # library logs and warnings (stderr) and progress bars stay out of the book
            cell["outputs"] = [o for o in cell["outputs"] if not o.pop("drop", False)
                               and not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": live_note(name, binder_repo)})
    note = capture_note(nb)
    if note:
        nb["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": note})
    return nb


#: what the book shows in place of an ipywidgets panel (an output whose widget is not a progress bar)
PANEL_NOTE = "*An interactive panel: its sliders need a live kernel (see the note at the top of this page).*"
#: the caption above a panel's static copy (an image of its figures at the notebook's parameters): inside the copy's
#: HTML, which myst-nb prefers to Markdown
PANEL_COPY_NOTE = ("A static copy of an interactive panel, drawn at the settings its sliders start from (where the "
                   "page also draws a figure at the same settings, it shows that figure again): its sliders need a "
                   "live kernel (see the note at the top of this page).")
PANEL_COPY_NOTE_HTML = f'<p class="moelab-panel-note"><em>{PANEL_COPY_NOTE}</em></p>'
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+(?:\.\d+)?[kMG]?/\d*(?:\.\d+)?[kMG]?|\bit/s\]|s/it\]")


def is_progress_bar(plain: str | list[str] | None) -> bool:
    """Whether a widget output's ``text/plain`` is a tqdm progress bar (``Loading weights:  0%|   | 0/272 [...]``)
    rather than a panel (``VBox(children=(IntSlider(...``)."""
    text = "".join(plain) if isinstance(plain, list) else (plain or "")
    return bool(_PROGRESS.search(text)) and not re.match(r"\s*[A-Z]\w*\(children=", text)


#: what nbgrader's generate_assignment writes in place of a solution (the student's blank)
STUDENT_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"


def _with_blanks(cells: list[dict]) -> list[dict]:
    """``cells`` with, before every solution cell, the student's blank: the cell as nbgrader hands it out
    (the solution between its markers replaced by nbgrader's stub), shown as code and never executed."""
    out = []
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell.get("source"), list) else str(cell.get("source", ""))
        if (cell.get("cell_type") == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("solution")
                and "### BEGIN SOLUTION" in source and "### END SOLUTION" in source):
            head, rest = source.split("### BEGIN SOLUTION", 1)
            tail = rest.split("### END SOLUTION", 1)[1].lstrip("\n")
            blank = head + STUDENT_STUB + ("\n" + tail if tail else "")
            out.append({"cell_type": "markdown", "metadata": {"tags": ["exercise-blank"]},
                        "source": "*Your answer (the cell as the lab hands it out):*\n\n```python\n"
                                  + blank.rstrip("\n") + "\n```"})
        out.append(cell)
    return out


#: notebook 06's recorded capture (``python -m moelab.make.deployment_trace``): the page's trace where no live engine is
DEPLOYMENT_NOTEBOOK = "06_from_your_deployment"
RECORDED_CAPTURE = Path("data") / "traces" / "tiny-moe-06-vllm.npz"
_RECORDED = re.compile(r"^trace recorded with (.+)$", re.MULTILINE)


def recorded_capture() -> Path | None:
    """The bundled capture notebook 06 is shown from when no live engine is installed (:data:`RECORDED_CAPTURE`
    under the repository), or None when it is not there."""
    path = repo_root() / RECORDED_CAPTURE
    return path if path.is_file() and path.with_suffix(".json").is_file() else None


def notebook_params(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters the book executes ``name`` with: ``params``, and for notebook 06 where vLLM is not usable
    (:func:`moelab.models.vllm_engine.vllm_status`) and neither ``TRACE`` nor ``BACKEND`` is given, ``TRACE`` = the
    recorded capture (:func:`recorded_capture`; when it is missing the notebook falls back to the Hugging Face
    capture, and :func:`capture_note` labels either page)."""
    out = dict(params or {})
    if name != DEPLOYMENT_NOTEBOOK or "TRACE" in out or "BACKEND" in out:
        return out
    from moelab.models.vllm_engine import vllm_status  # lazy: reads vLLM's files only when 06 is in the book

    recorded = recorded_capture()
    if recorded is not None and not vllm_status()[0]:
        out["TRACE"] = str(recorded)
    return out


def _stream_text(nb: dict[str, Any]) -> str:
    """Everything the notebook's cells printed, in order."""
    parts = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            text = out.get("text", "")
            parts.append("".join(text) if isinstance(text, list) else str(text))
    return "\n".join(parts)


def capture_note(nb: dict[str, Any]) -> str:
    """A labelled note for a page whose expert trace did not come from a live engine here, or ``""``: notebook 06
    run on a recorded capture (it prints ``capture backend: file`` and ``trace recorded with vLLM X on DATE``) says
    so with the engine and date, and 06 run with the Hugging Face fallback (``capture backend: hf``) says that."""
    text = _stream_text(nb)
    if re.search(r"^capture backend: file\b", text, re.MULTILINE):
        m = _RECORDED.search(text)
        how = re.sub(r"[`*_\[\]<>]", "", m.group(1).strip())[:120] if m else "an engine elsewhere"
        what = ("this notebook's own requests through the same model, recorded once with a live engine "
                f"(`{RECORDED_CAPTURE.as_posix()}`, " if f"(reading {RECORDED_CAPTURE.name})" in text else "(")
        return ("```{important}\nThis page was **executed from a capture recorded with " + how + ", no live engine "
                "here**: no engine was started and the expert trace was read from a file: " + what + "the "
                "notebook's `TRACE`). Any vLLM-versus-HF agreement shown is the check made when the trace was "
                "recorded. With vLLM installed the same page captures from the live engine.\n```")
    if re.search(r"^capture backend: hf\b", text, re.MULTILINE):
        return ("```{important}\nThis page was executed **without a live vLLM engine**: the expert trace "
                "below was captured with the Hugging Face backend (the same model and requests, one "
                "request at a time), so the engine start and the vLLM-versus-HF agreement check are "
                "labelled *skipped*. With vLLM installed the same page captures from the live engine.\n```")
    return ""


CONF = '''\
project = "moelab: a lab for MoE LLM serving"
author = "the moelab authors"
extensions = ["myst_nb", "sphinx_togglebutton"]
html_theme = "sphinx_book_theme"
html_title = "moelab"
html_context = {"default_mode": "light"}  # an unset mode makes the theme log a console error
html_static_path = ["_static"]
html_css_files = ["moelab.css"]
html_js_files = ["vendor/plotly.min.js"]
mathjax_path = "vendor/mathjax/tex-chtml-full.js"
nb_execution_mode = "off"
nb_ipywidgets_js = {}
nb_render_markdown_format = "myst"  # a Markdown output's $...$ math and links render like a markdown cell's
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image"]
myst_heading_anchors = 3  # links such as notation.md#glossary reach the heading
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
exclude_patterns = ["_build"]
html_theme_options = {"show_toc_level": 2, "use_download_button": True}
'''


#: the book's own style sheet (``_static/moelab.css``): a printed line wraps inside the content column (a result
#: sentence of 06 ran 2,400 px past a 688-px column, hidden until the reader scrolled sideways), and a display
#: equation too wide for the column scrolls with a visible bar instead of being cut
BOOK_CSS = """\
div.cell_output div.output.stream pre, div.cell_output div.output.text_plain pre {
    white-space: pre-wrap;
    overflow-wrap: anywhere;
}
mjx-container[display="true"] {
    overflow-x: auto;
    overflow-y: hidden;
    max-width: 100%;
}
"""


def chapter_title(title: str) -> str:
    """A notebook title as the index lists it: ``NN — subject`` whatever separators the notebook used
    (``01 · ELDR — expert-locality-aware decode routing`` becomes ``01 — ELDR: expert-locality-aware decode
    routing``); other titles are returned as they are."""
    m = re.match(r"(\d\d)\s*([·—–:-])\s*(.+)$", title)
    if not m:
        return title
    rest = m.group(3).replace(" — ", ": ", 1) if m.group(2) != "—" else m.group(3)
    return f"{m.group(1)} — {rest}"


def _index(pages: Sequence[str], titles: dict[str, str]) -> str:
    lines = ["# moelab: a lab for Mixture-of-Experts LLM serving", "",
             "Five serving papers reproduced end to end, one executed notebook each. "
             "Start with the overview; the notation page defines every symbol the lessons use.", "",
             "```{toctree}", ":maxdepth: 1", ":titlesonly:", ""]  # chapters only, never a page's sections
    lines += [f"{chapter_title(titles.get(p, p))} <{p}>" for p in pages]
    return "\n".join(lines + ["```", ""])


def _title(nb: dict[str, Any], fallback: str) -> str:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def build_book(out: str | os.PathLike = "book", *, names: Sequence[str] | None = None,
               executed_dir: str | os.PathLike | None = None, params: dict[str, Any] | None = None,
               binder_repo: str | None = None, timeout_s: int = 1200) -> BookBuild:
    """Build the executed lab into a static site at ``out``.

    Parameters
    ----------
    out : path
        The site folder (replaced whole, only after a successful build; it must be new, empty, or a book this
        command built with nothing added since).
    names : notebook names or unique prefixes; all of them when None.
    executed_dir : folder of ``moelab notebooks run`` outputs to reuse (None: execute every notebook); a
        folder that does not exist is a ``BookError``.
    params : papermill parameters for the notebooks executed here (e.g. a preset).
    binder_repo : ``OWNER/NAME`` of the repository on GitHub, for a Binder link on every page.
    timeout_s : per-cell execution limit of the notebooks executed here.

    Returns
    -------
    BookBuild
    """
    t0 = time.perf_counter()
    site = check_output_folder(out)
    try:
        chosen = resolve(list(names) if names else None)
        for name in chosen:  # every notebook's parameters before the first one runs
            check_parameters(name, notebook_params(name, params))
    except ValueError as exc:
        raise BookError(str(exc)) from exc
    runs = Path(executed_dir).expanduser().resolve() if executed_dir else None
    if runs is not None and not runs.is_dir():
        raise BookError(f"--from {runs} is not a folder of executed notebooks; run 'moelab notebooks run' into it "
                        "first, or leave --from out to execute every notebook here")
    site.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{site.name}.building-", dir=site.parent))
    try:
        src = staging / "src"
        (src / "_static" / "vendor").mkdir(parents=True)
        executed, reused, titles = {}, [], {}
        for name in chosen:
            source = notebooks_dir() / f"{name}.ipynb"
            if runs is not None and reusable(runs / f"{name}.ipynb", source):
                path = runs / f"{name}.ipynb"
                reused.append(name)
            else:
                run = run_notebook(name, notebook_params(name, params), staging / "executed", timeout_s=timeout_s)
                if not run.ok:
                    raise BookError(f"notebook {name} failed: {run.error}; the book was not written")
                path, executed[name] = run.output, run.seconds
            nb = prepare_notebook(read_json(path), name, binder_repo, included=chosen, api_links=not names)
            titles[name] = _title(nb, name)
            (src / f"{name}.ipynb").write_text(json.dumps(nb))
        pages = in_reading_order(chosen)  # the chapters (and their Previous/Next lines) in the course's order
        for rel, page in EXTRA_PAGES:
            if (repo_root() / rel).is_file():
                text = book_links((repo_root() / rel).read_text(), rel)
                (src / f"{page}.md").write_text(unlink_missing(text, chosen))
                titles[page] = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), page)
                pages.append(page)
        conf = CONF
        if not names:  # the whole book: the API reference too (moelab.book.reference; a partial book skips it)
            # lazy: the reference imports every public package
            from moelab.book.reference import SPHINX_CONF, write_reference

            pages += write_reference(src)
            titles["api/index"] = "API reference"
            conf += SPHINX_CONF
        (src / "index.md").write_text(_index(pages, titles))
        (src / "conf.py").write_text(conf)
        shutil.copytree(VENDOR, src / "_static" / "vendor", dirs_exist_ok=True)
        (src / "_static" / "moelab.css").write_text(BOOK_CSS)
        import plotly  # lazy: plotly is only needed while a book is built

        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
                        src / "_static" / "vendor" / "plotly.min.js")
        t_sphinx = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(staging / "html")],
                              capture_output=True, text=True, timeout=max(60, timeout_s))
        if done.returncode != 0:
            raise BookError(f"sphinx failed: {(done.stderr or done.stdout).strip()[-800:]}")
        sphinx_seconds = time.perf_counter() - t_sphinx
        try:
            replace_dir(staging / "html", site, WRITER)
        except ValueError as exc:  # a file appeared in OUT during the build: it stays, and so does the old book
            raise BookError(str(exc)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BookBuild(site, tuple(pages), tuple(reused), executed, sphinx_seconds, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    """``moelab book build [OUT] [--names ...] [--from DIR] [--binder OWNER/NAME]``."""
    parser = argparse.ArgumentParser(prog="moelab book", description="build the executed lab as a static HTML site")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="execute (or reuse) the notebooks and build the site")
    build.add_argument("out", nargs="?", default="book", help="site folder (default: book)")
    build.add_argument("--names", nargs="*", help="notebook names or unique prefixes (default: all)")
    build.add_argument("--from", dest="executed_dir", default=None,
                       help="reuse notebooks executed by 'moelab notebooks run' from this folder (default: runs, "
                            "when it exists; a folder named here must exist)")
    build.add_argument("--binder", dest="binder_repo", help="OWNER/NAME on GitHub: add a Binder link to every page")
    args = parser.parse_args(argv)
    executed_dir = args.executed_dir if args.executed_dir is not None else ("runs" if Path("runs").is_dir() else None)
    done = build_book(args.out, names=args.names, executed_dir=executed_dir, binder_repo=args.binder_repo)
    print(f"book: {done.out}/index.html ({len(done.pages)} pages; reused {len(done.reused)} executed notebooks, "
          f"executed {len(done.executed)}; sphinx {done.sphinx_seconds:.1f} s, total {done.seconds:.1f} s)")
    print(f"serve it offline: python -m http.server --bind 127.0.0.1 --directory {done.out} 8000")
    return 0
