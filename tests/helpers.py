"""Helpers shared by tests: run a notebook under papermill, check that every figure it saved was shown,
and read the results it recorded."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from moelab.notebooks import run_notebook
from moelab.viz.common import FIGURE_META_KEY

# Figures a notebook saves but does not show yet, per notebook its owner has not rewritten as a lesson
# (issue 26 Deliver 4). A recorded baseline: it may only shrink. A figure not listed here that is saved
# and not shown fails the notebook's test.
KNOWN_UNSHOWN: dict[str, frozenset[str]] = {}
# save_figure stamps layout.meta with the file name; a displayed copy carries it in its plotly JSON (in an
# HTML renderer's output or a widget's saved state the quotes may be escaped)
_SHOWN = re.compile(r'\\?"' + FIGURE_META_KEY + r'\\?"\s*:\s*\\?"([^"\\]+)')


def shown_figures(executed: dict[str, Any]) -> set[str]:
    """Names of the saved figures an executed notebook (JSON) displays: those whose ``layout.meta``
    stamp appears in a cell output or in the saved widget state."""
    outputs = [o for c in executed.get("cells", []) for o in c.get("outputs", [])]
    text = json.dumps(outputs) + json.dumps(executed.get("metadata", {}).get("widgets", {}))
    return set(_SHOWN.findall(text))


def unshown_figures(name: str, figures: Path, executed: Path) -> list[str]:
    """Figures saved into ``figures`` (``<stem>.html``) by notebook ``name`` that its executed copy
    ``executed`` never displays, minus the notebook's recorded :data:`KNOWN_UNSHOWN` baseline."""
    saved = {p.stem for p in figures.glob("*.html")}
    shown = shown_figures(json.loads(executed.read_text()))
    return sorted(saved - shown - KNOWN_UNSHOWN.get(name, frozenset()))


def execute_notebook(name: str, params: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Run ``notebooks/<name>.ipynb`` with ``params``; check every figure it saved is shown; return the
    JSON of results it wrote (plus ``_figures``: the files in its figures folder)."""
    figures = tmp_path / "figures"
    os.environ["MOELAB_FIGURES"] = str(figures)
    run = run_notebook(name, params, tmp_path)
    assert run.ok, f"{name} failed: {run.error}"
    results = sorted(figures.glob("*.json"))
    assert results, f"{name} wrote no results JSON into {figures}"
    unshown = unshown_figures(name, figures, run.output)
    assert not unshown, (f"{name} saved figures it never displays: {unshown} (make each the cell's last "
                         "expression or display() it)")
    merged: dict[str, Any] = {}
    for path in results:
        merged[path.stem] = json.loads(path.read_text())
    merged["_figures"] = sorted(p.name for p in figures.iterdir())
    return merged


def greedy_chains(rows: Any, row: int, prompt: list[int], ref: list[int], dtype: Any,
                  next_budget: Any) -> list[tuple[int, ...]]:
    """Serve one request in batch row ``row`` of an HD :class:`~moelab.hd.rows.RowDrafters` as vLLM does: propose
    a chain (budget ``next_budget()``) on the tokens so far, keep its longest prefix that matches the known greedy
    output ``ref`` plus the target's own next token; every proposed chain, in order."""
    import numpy as np  # lazy: only the HD tests serve rows

    tokens, pos, out = list(prompt), 0, []
    while pos < len(ref):
        chain = rows.propose(row, np.asarray(tokens, dtype=dtype), next_budget())
        out.append(tuple(chain))
        a = 0
        while a < len(chain) and pos + a < len(ref) and chain[a] == ref[pos + a]:
            a += 1
        n_new = min(a + 1, len(ref) - pos)
        tokens += ref[pos:pos + n_new]
        pos += n_new
    return out
