"""Helpers shared by tests: run a notebook under papermill and read the results it recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from moelab.notebooks import run_notebook


def execute_notebook(name: str, params: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Run ``notebooks/<name>.ipynb`` with ``params``; return the JSON of results it wrote."""
    figures = tmp_path / "figures"
    os.environ["MOELAB_FIGURES"] = str(figures)
    run = run_notebook(name, params, tmp_path)
    assert run.ok, f"{name} failed: {run.error}"
    results = sorted(figures.glob("*.json"))
    assert results, f"{name} wrote no results JSON into {figures}"
    merged: dict[str, Any] = {}
    for path in results:
        merged[path.stem] = json.loads(path.read_text())
    merged["_figures"] = sorted(p.name for p in figures.iterdir())
    return merged
