"""Does every number a notebook's rendered prose states agree with what the notebook shows?

A notebook renders its sentences (``display(Markdown(...))``) from the same results it records with
``write_results`` and shows in its tables. :func:`prose_mismatches` reads an executed notebook (JSON, nothing is
run) and its results, pulls every number out of the rendered prose (math, inline code and link targets left
out; small integers, which count things, and years ignored) and looks each one up, within the rounding it is
printed with, among

* every number in the notebook's results (as recorded, times 100 for a fraction printed as a percentage, and
  its absolute value for a signed change written in words),
* every number the notebook's other outputs show (tables, printed lines) and its ``parameters`` cell sets.

A number found nowhere is a mismatch: typed into the prose, or computed from a different source than the
output shows. The notebook tests call :func:`prose_mismatches` on the executions they already make.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab.viz.hygiene import (
    notebook_figure_problems,
    output_missing_markers,
    output_raw_entities,
    output_stray_values,
)

# Markdown markup that states no prose number: one definition for the prose cross-check here and for the typed-number
# scan of the committed lessons (moelab.bench.notebooks.typed_numbers)
#: display math (``$$ ... $$``, across lines)
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)
#: inline math (``$ ... $`` on one line)
INLINE_MATH = re.compile(r"\$[^$\n]*\$")
#: either, display math first where both could start
MATH = re.compile(f"{DISPLAY_MATH.pattern}|{INLINE_MATH.pattern}", re.DOTALL)
#: a code span; group 1 is its content
CODE_SPAN = re.compile(r"`([^`\n]*)`")
#: a link's target (``](...)``); the link's text stays
LINK_TARGET = re.compile(r"\]\([^)]*\)")
#: an HTML tag
HTML_TAG = re.compile(r"<[^<>]*>")
#: an HTML entity
HTML_ENTITY = re.compile(r"&#?\w+;")


def strip_markup(markdown: str) -> str:
    """``markdown`` with what is not prose blanked out: math (:data:`MATH`), code spans, link targets (the link's
    text stays) and HTML tags, each replaced by a space (a target by ``]``).

    Parameters
    ----------
    markdown : str

    Returns
    -------
    str
    """
    return HTML_TAG.sub(" ", LINK_TARGET.sub("]", CODE_SPAN.sub(" ", MATH.sub(" ", markdown))))

# a number standing alone: not inside a word or an identifier (H200, Qwen3-30B, r32), optionally signed
_PROSE_NUMBER = re.compile(r"(?<![\w.\-−])([+\-−]?)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?=(?:x|%)?(?![\w]))")
_ANY_NUMBER = re.compile(r"[+\-−]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+\-]?\d+)?")
#: integers up to this are counts (workers, candidates, steps) that the prose may name freely
SMALL_INT = 10


@dataclass(frozen=True)
class ProseNumber:
    """One number of rendered prose: the cell it is in, the text as printed, its value and printed decimals."""

    cell: int
    text: str
    value: float
    decimals: int
    context: str


def _text(data: Any) -> str:
    return "".join(data) if isinstance(data, list) else str(data or "")


def prose_numbers(executed: dict) -> list[ProseNumber]:
    """Every number stated in the notebook's rendered prose (``text/markdown`` outputs of code cells)."""
    found = []
    for i, cell in enumerate(executed.get("cells", [])):
        if (cell.get("metadata", {}).get("nbgrader") or {}).get("grade") is True:
            continue  # a check's feedback states tolerances, not results
        for out in cell.get("outputs", []) or []:
            md = (out.get("data") or {}).get("text/markdown")
            if md is None:
                continue
            text = strip_markup(_text(md))
            for m in _PROSE_NUMBER.finditer(text):
                sign, body = m.group(1), m.group(2)
                value = float(body.replace(",", ""))
                decimals = len(body.split(".", 1)[1]) if "." in body else 0
                if decimals == 0 and (value <= SMALL_INT or 1990 <= value <= 2035):
                    continue
                value = -value if sign in ("-", "−") else value
                lo, hi = max(0, m.start() - 40), min(len(text), m.end() + 40)
                found.append(ProseNumber(i, sign + body, value, decimals, " ".join(text[lo:hi].split())))
    return found


def _numbers(value: Any, depth: int = 0) -> Iterable[float]:
    if depth > 12:
        return
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            yield float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, depth + 1)
            if isinstance(key, str):
                yield from _numbers_in_text(key)
    elif isinstance(value, (list, tuple)):
        for item in value[:100_000]:
            yield from _numbers(item, depth + 1)
    elif isinstance(value, str):
        yield from _numbers_in_text(value)


def _numbers_in_text(text: str) -> Iterable[float]:
    for m in _ANY_NUMBER.finditer(text):
        try:
            yield float(m.group(0).replace(",", "").replace("−", "-"))
        except ValueError:
            continue


def reference_numbers(executed: dict, results: Any) -> list[float]:
    """What the prose may state: the results' numbers and every number the notebook's other outputs and its
    ``parameters`` cell show."""
    refs = list(_numbers(results))
    for cell in executed.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            refs += list(_numbers_in_text(_text(cell.get("source"))))
        for out in cell.get("outputs", []) or []:
            data = out.get("data") or {}
            for mime in ("text/plain", "text/html"):
                if mime in data and "text/markdown" not in data:
                    refs += list(_numbers_in_text(html.unescape(HTML_TAG.sub(" ", _text(data[mime])))))
            if out.get("output_type") == "stream":
                refs += list(_numbers_in_text(_text(out.get("text"))))
    return refs


def agrees(number: ProseNumber, refs: Iterable[float]) -> bool:
    """Whether ``number`` is one of ``refs`` (or 100 times one, or its absolute value) within its printed rounding."""
    half = 0.5 * 10 ** (-number.decimals) * (1 + 1e-9) + 1e-12
    v = number.value
    for r in refs:
        for cand in (r, 100 * r):
            if abs(v - cand) <= half or abs(abs(v) - abs(cand)) <= half:
                return True
    return False


def prose_mismatches(executed: dict, results: Any) -> list[ProseNumber]:
    """The prose numbers of ``executed`` that agree with nothing the notebook records or shows."""
    refs = sorted(set(reference_numbers(executed, results)))
    return [n for n in prose_numbers(executed) if not agrees(n, refs)]


__all__ = ["CODE_SPAN", "DISPLAY_MATH", "HTML_ENTITY", "HTML_TAG", "INLINE_MATH", "LINK_TARGET", "MATH", "ProseNumber",
           "agrees", "prose_mismatches", "prose_numbers", "reference_numbers", "strip_markup"]


def executed_report(executed: dict, results: Any) -> dict[str, list[str]]:
    """What a reader of an executed notebook would trip over, per kind (each list empty when clean):
    ``prose_numbers_mismatched`` (:func:`prose_mismatches`) and the figure checks of
    :func:`moelab.viz.hygiene.notebook_figure_problems` (``figure_text_entities``, ``figure_label_overlaps``,
    ``figure_method_colors``, ``figure_log_axis_ticks``, ``figure_hidden_series``, ``figure_title_overflows``,
    ``figure_table_cells_cut``), and ``output_raw_entities``
    (:func:`moelab.viz.hygiene.output_raw_entities`: entities in HTML or printed outputs a reader would see raw), and
    ``output_stray_values`` (:func:`moelab.viz.hygiene.output_stray_values`: a path a call returned, shown), and
    ``output_missing_markers`` (:func:`moelab.viz.hygiene.output_missing_markers`: NaN, <NA> or None shown in a
    table)."""
    results = {k: v for k, v in results.items() if not str(k).startswith("_")} if isinstance(results, dict) else results
    report = {"prose_numbers_mismatched": [f"cell {n.cell}: {n.text} in {n.context!r}"
                                           for n in prose_mismatches(executed, results)]}
    report.update({f"figure_{kind}": found for kind, found in notebook_figure_problems(executed).items()})
    report["output_raw_entities"] = output_raw_entities(executed)
    report["output_stray_values"] = output_stray_values(executed)
    report["output_missing_markers"] = output_missing_markers(executed)
    return report


__all__ += ["executed_report"]


def assert_reads_cleanly(executed_path: str | os.PathLike, results: Any) -> dict[str, list[str]]:
    """Raise ``AssertionError`` listing every problem :func:`executed_report` finds in the executed notebook at
    ``executed_path`` (its results: ``results``); return the (empty) report. The notebook tests call it on the
    execution they already make, so nothing is executed twice."""
    report = executed_report(json.loads(Path(executed_path).read_text()), results)
    found = {kind: problems for kind, problems in report.items() if problems}
    if found:
        raise AssertionError(f"{Path(executed_path).name} does not read cleanly: "
                             + "; ".join(f"{kind} ({len(p)}): {p[:5]}" for kind, p in found.items()))
    return report


__all__ += ["assert_reads_cleanly"]
