"""A notebook's lesson part as reveal.js slides that work offline: ``moelab slides NAME [OUT]``.

The slides are ``nbconvert --to slides`` of the lesson part (:mod:`moelab.lecture`) with the outputs of a
precomputed run (``runs/lecture/NAME.ipynb`` or ``runs/NAME.ipynb``; computed first, with a note, when none
is usable), through a template (``templates/moelab_reveal``) that loads only files next to the HTML:
reveal.js 5.2.1 vendored from npm (``static/vendor/reveal.js``, MIT), the book's MathJax 3 and the installed
plotly's ``plotly.min.js``. No jQuery, require.js, mermaid or CDN URL is left.

**Fitting a projected screen.** The lessons' markdown cells run to 200-470 words, several screens of
projected text, so each is *split*, not shrunk: at headings and paragraph boundaries (never inside a fenced
block, display math or a table), slides are packed up to :data:`SLIDE_WORDS` words, a figure counting as
:data:`FIGURE_WORDS`. A level-1/2 heading starts a new horizontal slide, anything else that does not fit
continues the section on a vertical sub-slide, so a lecturer walks down a section and right to the next one.
Splitting keeps the text at a readable size; a slide that still overflows (one long paragraph, a tall
table) scrolls inside itself rather than being clipped or scaled down.

Code is hidden (``exclude_input``); solution and exercise-check cells and code cells without output are
skipped; an interactive panel (it needs a kernel) becomes a one-line note pointing at ``moelab app``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab import lecture
from moelab._io import atomic_write_text
from moelab._outputs import check_output_dir, record_outputs
from moelab.book import is_progress_bar
from moelab.notebooks import resolve

HERE = Path(__file__).parent
REVEAL = HERE / "static" / "vendor" / "reveal.js"
TEMPLATES = HERE / "templates"
TEMPLATE = "moelab_reveal"
MATHJAX = HERE.parent / "book" / "static" / "vendor" / "mathjax"
VENDOR_DIR = "vendor"  # OUT/vendor/{reveal.js, mathjax, plotly.min.js}
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: words on one slide (a projected 1280x800 stage at 36 px: about ten lines of prose under a heading)
SLIDE_WORDS = 110
#: what a figure (plotly, image) counts as, in words: a figure gets a slide of its own
FIGURE_WORDS = SLIDE_WORDS
#: what a table counts as
TABLE_WORDS = 60
_HEADING = re.compile(r"^(#{1,6})\s")


class SlidesError(ValueError):
    """Slides could not be built (an unusable output folder, a lesson that failed); the message says why."""


@dataclass(frozen=True)
class SlidesBuild:
    """What :func:`build_slides` wrote: the HTML file, its slide count, and the run its outputs came from."""

    html: Path
    slides: int
    source: Path
    computed: bool


def split_markdown(text: str, max_words: int = SLIDE_WORDS) -> list[str]:
    """``text`` cut into chunks of at most ``max_words`` words at headings and blank lines, never inside a
    fenced code block, display math (``$$``) or a table; a block longer than ``max_words`` stays whole."""
    blocks: list[list[str]] = [[]]
    fence = math = False
    for line in text.splitlines():
        stripped = line.strip()
        inside = fence or math
        if stripped.startswith(("```", "~~~")):
            fence = not fence
        elif stripped.count("$$") % 2 == 1 and not fence:
            math = not math
        if not inside and not stripped and blocks[-1]:
            blocks.append([])
            continue
        if not inside and _HEADING.match(line) and blocks[-1]:
            blocks.append([])
        blocks[-1].append(line)
    chunks: list[list[str]] = []
    words = 0
    for block in (b for b in blocks if b):
        n = len(" ".join(block).split())
        if not chunks or _HEADING.match(block[0]) or words + n > max_words:
            chunks.append([])
            words = 0
        if chunks[-1]:
            chunks[-1].append("")
        chunks[-1].extend(block)
        words += n
    return ["\n".join(c) for c in chunks]


def _heading_level(text: str) -> int:
    m = _HEADING.match(text.lstrip("\n"))
    return len(m.group(1)) if m else 0


def _weight(outputs: list[dict[str, Any]]) -> int:
    w = 0
    for out in outputs:
        data = out.get("data", {})
        if PLOTLY_MIME in data or any(k.startswith("image/") for k in data):
            w += FIGURE_WORDS
        elif "text/html" in data and "<table" in lecture._source({"source": data["text/html"]}):
            w += TABLE_WORDS
        elif "text/markdown" in data:
            w += len(lecture._source({"source": data["text/markdown"]}).split())
        elif out.get("output_type") == "stream":
            w += len(lecture._source({"source": out.get("text", "")}).split())
        elif data:
            w += 20
    return w


def _plotly_html(spec: dict[str, Any], div_id: str) -> str:
    import plotly.io as pio  # lazy: plotly is only needed while slides are built

    return pio.to_html(spec, include_plotlyjs=False, full_html=False, div_id=div_id, include_mathjax=False,
                       config={"responsive": True})


def _skipped(cell: dict[str, Any]) -> bool:
    meta = cell.get("metadata", {})
    grader = meta.get("nbgrader") or {}
    return (cell.get("cell_type") == "code"
            and (not cell.get("outputs") or bool(grader.get("solution")) or bool(grader.get("grade"))
                 or "hide-input" in meta.get("tags", []) or meta.get("jupyter", {}).get("source_hidden", False)))


def slide_notebook(name: str, outputs: dict[int, list[dict[str, Any]]], *, app_command: str) -> dict[str, Any]:
    """``name``'s lesson part with the recorded ``outputs`` (by lesson code-cell position), cut into slides
    (``metadata.slideshow.slide_type`` on every cell, see the module docstring)."""
    nb = lecture.load(name)
    cells: list[dict[str, Any]] = []
    k, figure, weight = -1, 0, SLIDE_WORDS + 1

    def place(cell: dict[str, Any], w: int, level: int) -> None:
        nonlocal weight
        if level in (1, 2) or not cells:
            kind, weight = "slide", 0
        elif level or weight + w > SLIDE_WORDS:
            kind, weight = "subslide", 0
        else:
            kind = "-"
        weight += w
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
        cells.append(cell)

    for cell in lecture.lesson_cells(nb):
        if cell["cell_type"] == "markdown":
            for chunk in split_markdown(lecture._source(cell)):
                place({"cell_type": "markdown", "metadata": {}, "source": chunk}, len(chunk.split()),
                      _heading_level(chunk))
            continue
        if cell["cell_type"] != "code":
            continue
        k += 1
        cell = copy.deepcopy(cell)
        cell["outputs"] = copy.deepcopy(outputs.get(k, []))
        if _skipped(cell):
            cell.setdefault("metadata", {})["slideshow"] = {"slide_type": "skip"}
            cells.append(cell)
            continue
        for out in cell["outputs"]:
            data = out.get("data", {})
            if PLOTLY_MIME in data:
                figure += 1
                data["text/html"] = _plotly_html(data.pop(PLOTLY_MIME), f"{name}-slide-figure-{figure}")
            if lecture.WIDGET_MIME in data:
                data.pop(lecture.WIDGET_MIME)
                if is_progress_bar(data.pop("text/plain", None)):  # a tqdm bar, not a panel: nothing to show
                    out["drop"] = True
                elif "text/html" in data:  # a panel with a static copy: the HTML is what reveal.js shows, so
                    # the caption goes inside it, above the copy (else a figure repeats with no word of why)
                    html = data["text/html"]
                    data["text/html"] = (f'<p class="moelab-panel-note"><em>A static copy of an interactive panel, '
                                         f'drawn at the settings its sliders start from: run it live with <code>{app_command}'
                                         '</code>.</em></p>' + ("".join(html) if isinstance(html, list) else html))
                else:
                    data["text/markdown"] = f"*An interactive panel: run it live with `{app_command}`.*"
        cell["outputs"] = [o for o in cell["outputs"] if not o.pop("drop", False)]
        place(cell, _weight(cell["outputs"]), 0)
    for i, cell in enumerate(cells):
        cell["id"] = f"slide-cell-{i}"
    out = {k: v for k, v in nb.items() if k != "cells"}
    out["cells"] = cells
    return out


#: the writer's name in the output folder's marker (``.moelab-output.json``)
WRITER = "slides"


def check_output_folder(out: str | os.PathLike, name: str | None = None) -> Path:
    """``out`` as an absolute folder path that can be written (it may not exist yet): new, empty, or one
    this command wrote, where the slides of ``name`` and the vendored scripts it would replace are its own and
    unchanged (moelab's output policy: it never overwrites what it did not write); not a link, not inside moelab's sources."""
    try:
        path = check_output_dir(out, writer=WRITER, name="OUT", overwrites=[f"{name}.slides.html"] if name else [],
                                owned_subdirs=[VENDOR_DIR])
    except ValueError as exc:
        raise SlidesError(str(exc)) from None
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SlidesError(f"OUT {path} cannot be written: {parent} is not a writable folder")
    return path


def vendor_into(out: Path) -> Path:
    """Copy reveal.js, MathJax and plotly.js into ``out/vendor`` (once per folder); return that folder."""
    import plotly  # lazy: plotly is only needed while slides are built

    vendor = out / VENDOR_DIR
    shutil.copytree(REVEAL, vendor / "reveal.js", dirs_exist_ok=True)
    shutil.copytree(MATHJAX, vendor / "mathjax", dirs_exist_ok=True)
    shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", vendor / "plotly.min.js")
    return vendor


def build_slides(name: str, out: str | os.PathLike = "slides", *, runs: str | os.PathLike = "runs",
                 timeout_s: int = 1800) -> SlidesBuild:
    """Write ``OUT/<name>.slides.html`` (and ``OUT/vendor/``) from the lesson part of notebook ``name``.

    Parameters
    ----------
    name : str
        Notebook name or unique prefix.
    out : path
        Output folder (created; the HTML and the vendored scripts go there).
    runs : path
        Folder of precomputed runs (see :mod:`moelab.lecture`); when none is usable the lesson part is
        computed into ``RUNS/lecture/`` first (and a note says so on stderr).
    timeout_s : int
        Per-cell limit when the lesson has to be computed.

    Returns
    -------
    SlidesBuild
    """
    # lazy: nbconvert (and its Jinja templates) loads only when slides are built
    import nbformat
    from nbconvert import SlidesExporter

    try:
        (name,) = resolve([name])
    except ValueError as exc:
        raise SlidesError(str(exc)) from None
    folder = check_output_folder(out, name)
    pre, why = lecture.find_precomputed(name, runs)
    computed = pre is None
    if pre is None:
        print(f"note: no precomputed results for {name} ({why}); computing its lesson part now into "
              f"{Path(runs) / lecture.LECTURE_SUBDIR}", file=sys.stderr, flush=True)
        lecture.precompute(name, {}, runs, timeout_s=timeout_s)
        pre, why = lecture.find_precomputed(name, runs)
        if pre is None:
            raise SlidesError(f"the lesson of {name} was computed but cannot be read back: {why}")
    nb = slide_notebook(name, pre.outputs, app_command=f"moelab app {name}")
    exporter = SlidesExporter(template_name=TEMPLATE, extra_template_basedirs=[str(TEMPLATES)],
                              exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
                              reveal_url_prefix=f"{VENDOR_DIR}/reveal.js", reveal_theme="white",
                              reveal_transition="none", reveal_width="1280", reveal_height="800")
    node = nbformat.reads(json.dumps(nb), as_version=4)  # joins list sources, as nbconvert expects
    body, _ = exporter.from_notebook_node(node, resources={"moelab_vendor": VENDOR_DIR})
    folder.mkdir(parents=True, exist_ok=True)
    vendor_into(folder)
    html = folder / f"{name}.slides.html"
    atomic_write_text(html, body)
    record_outputs(folder, WRITER, [html, *(p for p in (folder / VENDOR_DIR).rglob("*") if p.is_file())])
    slides = sum(1 for c in nb["cells"] if c["metadata"].get("slideshow", {}).get("slide_type") in ("slide", "subslide"))
    return SlidesBuild(html, slides, pre.path, computed)


def main(argv: list[str] | None = None) -> int:
    """``moelab slides NOTEBOOK [OUT] [--from RUNS]``."""
    p = argparse.ArgumentParser(prog="moelab slides", description="the lesson part of a notebook as offline "
                                "reveal.js slides (nbconvert), from precomputed results")
    p.add_argument("notebook", help="notebook name or unique prefix, e.g. 03")
    p.add_argument("out", nargs="?", default="slides", help="output folder (default: slides)")
    p.add_argument("--from", dest="runs", default="runs",
                   help="folder of precomputed runs (RUNS/lecture/NAME.ipynb or RUNS/NAME.ipynb; default: runs)")
    args = p.parse_args(argv)
    try:
        done = build_slides(args.notebook, args.out, runs=args.runs)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"slides: {done.html} ({done.slides} slides; outputs from {done.source})")
    print(f"present it offline: python -m http.server --bind 127.0.0.1 --directory {done.html.parent} 8000, "
          f"then open http://127.0.0.1:8000/{done.html.name}")
    return 0


__all__ = ["FIGURE_WORDS", "SLIDE_WORDS", "SlidesBuild", "SlidesError", "build_slides", "check_output_folder",
           "main", "slide_notebook", "split_markdown", "vendor_into"]


if __name__ == "__main__":
    sys.exit(main())
