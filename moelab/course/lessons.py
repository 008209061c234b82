"""The structure of a lesson notebook: its exercises, solution cells and their nbgrader metadata.

A **lesson** is a notebook with at least one exercise; an **exercise** is a solution cell (the student's
answer, between nbgrader's solution markers, collapsed) followed by a locked, graded check cell that calls
a checker of :data:`moelab.course.check.EXERCISES`. ``moelab course release`` and the ``notebooks``
benchmark suite read notebooks through these functions (as JSON: nothing is executed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moelab._io import FileFormatError, read_json
from moelab.notebooks import notebooks_dir

SOLUTION_BEGIN = "### BEGIN SOLUTION"
SOLUTION_END = "### END SOLUTION"
NBGRADER_SCHEMA = 3


def load_notebook(name_or_path: str | Path) -> dict[str, Any]:
    """A committed notebook as JSON, by name (``"04_dsd_rtt"``) or path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = notebooks_dir() / f"{name_or_path}.ipynb"
    if not path.is_file():
        raise ValueError(f"notebook must name a file in {notebooks_dir()}; got {name_or_path!r}")
    nb = read_json(path)  # size and nesting bounded: a path may name any file
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise FileFormatError(path, "cells", "is missing (not a Jupyter notebook)")
    return nb


def notebook_names() -> list[str]:
    """Names of the committed notebooks, sorted."""
    return sorted(p.stem for p in notebooks_dir().glob("[0-9][0-9]_*.ipynb"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def code_cells(nb: dict) -> list[dict]:
    """The notebook's code cells, in order."""
    return [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]


def _nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def exercise_cells(nb: dict) -> list[dict]:
    """The locked, graded nbgrader check cells: one per exercise."""
    return [c for c in code_cells(nb) if _nbgrader(c).get("grade") is True and _nbgrader(c).get("locked") is True]


def solution_cells(nb: dict) -> list[dict]:
    """Cells carrying nbgrader solution metadata or solution markers."""
    return [c for c in code_cells(nb) if _nbgrader(c).get("solution") is True or SOLUTION_BEGIN in _source(c)]


def is_lesson(nb: dict) -> bool:
    """A lesson notebook has at least one exercise."""
    return bool(exercise_cells(nb))


def nbgrader_problems(nb: dict) -> list[str]:
    """What is wrong with the notebook's nbgrader cells (empty when all are valid).

    Solution cells need ``{solution: true, grade: false, locked: false, grade_id, schema_version: 3}``,
    both solution markers, ``jupyter.source_hidden: true`` and the ``hide-input`` tag; check cells need
    ``{grade: true, locked: true, points > 0, solution: false, grade_id, schema_version: 3}``; every
    ``grade_id`` is unique."""
    problems, ids = [], []
    for cell in solution_cells(nb):
        meta, src = _nbgrader(cell), _source(cell)
        gid = meta.get("grade_id", "?")
        want = {"solution": True, "grade": False, "locked": False, "schema_version": NBGRADER_SCHEMA}
        wrong = {k: meta.get(k) for k, v in want.items() if meta.get(k) != v}
        if wrong or not meta.get("grade_id"):
            problems.append(f"solution cell {gid}: nbgrader metadata {wrong or 'without grade_id'}")
        if SOLUTION_BEGIN not in src or SOLUTION_END not in src:
            problems.append(f"solution cell {gid}: missing {SOLUTION_BEGIN!r} / {SOLUTION_END!r}")
        if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden") is not True:
            problems.append(f"solution cell {gid}: source not hidden (jupyter.source_hidden)")
        if "hide-input" not in cell.get("metadata", {}).get("tags", []):
            problems.append(f"solution cell {gid}: no 'hide-input' tag")
        ids.append(meta.get("grade_id"))
    for cell in exercise_cells(nb):
        meta = _nbgrader(cell)
        gid = meta.get("grade_id", "?")
        if meta.get("solution") is not False or meta.get("schema_version") != NBGRADER_SCHEMA or not meta.get("grade_id"):
            problems.append(f"check cell {gid}: nbgrader metadata {meta}")
        if not isinstance(meta.get("points"), (int, float)) or meta.get("points", 0) <= 0:
            problems.append(f"check cell {gid}: points must be > 0, got {meta.get('points')!r}")
        if SOLUTION_BEGIN in _source(cell):
            problems.append(f"check cell {gid}: holds solution markers")
        ids.append(meta.get("grade_id"))
    dupes = sorted({i for i in ids if ids.count(i) > 1 and i})
    if dupes:
        problems.append(f"grade_id used twice: {dupes}")
    return problems
