"""The instructor's grading round trip, driven through nbgrader's own commands (offline, no server).

``moelab course release`` writes the course folder; from there everything is nbgrader's:
``generate_assignment`` (the student copy), students hand in (``submitted/<student>/<lab>/<lab>.ipynb``,
which ``nbgrader collect`` or ``nbgrader zip_collect`` also fill), ``autograde``, ``generate_feedback`` (one
HTML page per student) and ``export`` (``grades.csv``). :func:`round_trip` runs that whole chain on
submissions built here (:func:`answered`), for the test suite and for ``moelab bench notebooks``
(``nbgrader_autograde_seconds``).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moelab.course.check import EXERCISES
from moelab.course.lessons import SOLUTION_BEGIN, SOLUTION_END, code_cells, exercise_cells, solution_cells

_KEY = re.compile(r'EXERCISES\["([^"]+)"\]')


class GradingError(RuntimeError):
    """An nbgrader command failed; the message has its last output lines."""


def nbgrader_executable() -> str | None:
    """The ``nbgrader`` of this Python's environment, or None when the ``course`` extra is not installed."""
    return shutil.which("nbgrader", path=str(Path(sys.executable).parent)) or shutil.which("nbgrader")


def nbgrader_env(nbgrader: str) -> dict[str, str]:
    """The environment to run the ``nbgrader`` executable ``nbgrader`` in: this one, with the executable's own
    folder first on ``PATH`` (nbgrader runs ``alembic`` from ``PATH`` to open its gradebook, so a virtual
    environment's nbgrader called by its path, the environment not activated, would fail without it) and
    ``PYTHONWARNINGS`` as set here."""
    path = os.pathsep.join(p for p in (str(Path(nbgrader).parent), os.environ.get("PATH", "")) if p)
    return {**os.environ, "PATH": path, "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "")}


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def exercise_keys(nb: dict) -> dict[str, str]:
    """``{solution cell grade_id: exercise key}``: each solution cell with the key its check cell names."""
    cells = code_cells(nb)
    keys = {}
    for i, cell in enumerate(cells):
        if cell in exercise_cells(nb) and i > 0:
            gid = cells[i - 1].get("metadata", {}).get("nbgrader", {}).get("grade_id")
            found = _KEY.findall(_source(cell))
            if gid and found:
                keys[gid] = found[0]
    return keys


def solution_text(cell: dict) -> str:
    """A solution cell's source without nbgrader's markers (what a student who got it right would write)."""
    text = _source(cell).replace(SOLUTION_BEGIN + "\n", "").replace(SOLUTION_END + "\n", "")
    return text.replace(SOLUTION_END, "").replace(SOLUTION_BEGIN, "")


def wrong_text(key: str) -> str:
    """Code assigning the registered typical wrong answer of exercise ``key`` to ``answer`` (for a function
    exercise, a function that returns a wrong number)."""
    ex = EXERCISES[key]
    value = ex.wrong(**(ex.context or {}))
    if callable(value):
        return "def _wrong(*args, **kwargs):\n    return -1.0\n\n\nanswer = _wrong\n"
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    return f"answer = {value!r}\n"


def answered(release: dict, source: dict, right: set[str] | None = None) -> dict:
    """The student copy ``release`` with every stubbed answer filled: the exercises whose key is in ``right``
    (default: all) with the source's solution, the others with the registered typical wrong answer."""
    sub = json.loads(json.dumps(release))
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: solution_text(c) for c in solution_cells(source)}
    keys = exercise_keys(source)
    for cell in sub["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            key = keys[gid]
            cell["source"] = solutions[gid] if right is None or key in right else wrong_text(key)
    return sub


@dataclass
class RoundTrip:
    """What :func:`round_trip` found: per student the total and per check cell the score and its maximum,
    the feedback pages' text, the exported grades, the seconds autograde took and nbgrader's warnings."""

    scores: dict[str, float]
    cells: dict[str, dict[str, tuple[float, float]]]
    feedback: dict[str, str]
    grades_csv: list[dict[str, str]]
    autograde_seconds: float
    warnings: list[str] = field(default_factory=list)


def _run(args: list[str], cwd: Path, timeout_s: float) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=nbgrader_env(args[0]))
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise GradingError(f"{' '.join(args[1:])} failed (exit {done.returncode}):\n{out[-3000:]}")
    return out


def round_trip(course: str | os.PathLike, lab: str, submissions: dict[str, dict], *,
               nbgrader: str | None = None, timeout_s: float = 900) -> RoundTrip:
    """Hand ``submissions`` (student id -> notebook JSON) in for ``lab`` of the released course folder
    ``course`` and run nbgrader's ``autograde``, ``generate_feedback`` and ``export`` there.

    ``nbgrader generate_assignment LAB`` must have run (the gradebook knows the assignment's cells).

    Raises
    ------
    GradingError
        When nbgrader is missing or one of its commands fails.
    """
    exe = nbgrader or nbgrader_executable()
    if exe is None:
        raise GradingError("nbgrader is not installed (pip install 'moelab[course]')")
    root = Path(course)
    for student, nb in submissions.items():
        folder = root / "submitted" / student / lab
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{lab}.ipynb").write_text(json.dumps(nb))
    start = time.perf_counter()
    log = _run([exe, "autograde", lab, "--force"], root, timeout_s)
    seconds = time.perf_counter() - start
    log += _run([exe, "generate_feedback", lab, "--force"], root, timeout_s)
    log += _run([exe, "export", "--to", "grades.csv"], root, timeout_s)
    warnings = [line for line in log.splitlines() if "partial credit" in line or "[WARNING]" in line]

    from nbgrader.api import Gradebook  # lazy: nbgrader is the optional `course` extra

    scores, cells = {}, {}
    with Gradebook(f"sqlite:///{(root / 'gradebook.db').resolve()}") as gb:
        for student in submissions:
            sub = gb.find_submission(lab, student)
            scores[student] = float(sub.score)
            cells[student] = {g.name: (float(g.score), float(g.max_score))
                              for nb in sub.notebooks for g in nb.grades if g.cell.cell_type == "code"}
    feedback = {}
    for student in submissions:
        page = root / "feedback" / student / lab / f"{lab}.html"
        feedback[student] = page.read_text(errors="replace") if page.is_file() else ""
    with open(root / "grades.csv", newline="") as handle:
        grades = list(csv.DictReader(handle))
    return RoundTrip(scores=scores, cells=cells, feedback=feedback, grades_csv=grades,
                     autograde_seconds=seconds, warnings=warnings)


__all__ = ["GradingError", "RoundTrip", "answered", "exercise_keys", "nbgrader_env", "nbgrader_executable", "round_trip",
           "solution_text", "wrong_text"]
