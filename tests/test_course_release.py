"""``moelab course release`` writes an nbgrader course; the REAL nbgrader strips the solutions and grades.

One lab (the map, 00, whose exercises run in seconds) goes through nbgrader's own commands, offline:
``generate_assignment`` (student copy: solutions stubbed, checks kept), then ``autograde`` on a correct and a
wrong submission: full marks for the first, none for the second, whose graded copy shows the checkers'
explanations.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.course.lessons import SOLUTION_BEGIN, SOLUTION_END, exercise_cells, load_notebook, solution_cells
from moelab.course.release import lesson_names, release_course

LAB = "00_overview"


def _nbgrader() -> str:
    exe = shutil.which("nbgrader", path=str(Path(sys.executable).parent))
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("nbgrader is not installed (pip install 'moelab[course]'); CI must run this test")
        pytest.skip("nbgrader is not installed (pip install 'moelab[course]')")
    return exe


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _submission(release: dict, source: dict, answers: str) -> dict:
    """The student copy with each stubbed cell answered: ``"solution"`` (the source's answer without its
    markers) or ``"wrong"`` (every answer ``None``)."""
    sub = json.loads(json.dumps(release))
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: _source(c) for c in solution_cells(source)}
    for cell in sub["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            if answers == "solution":
                text = solutions[gid].replace(SOLUTION_BEGIN + "\n", "").replace(SOLUTION_END + "\n", "")
                cell["source"] = text.replace(SOLUTION_END, "")
            else:
                cell["source"] = "answer = None\n"
    return sub


@pytest.mark.slow
def test_release_generate_and_autograde(tmp_path):
    nbgrader = _nbgrader()
    course = tmp_path / "course"
    written = release_course(course, names=["00"], params={"INTERACTIVE": False})
    assert written == [course / "source" / LAB / f"{LAB}.ipynb"]
    source = json.loads(written[0].read_text())
    assert "INTERACTIVE = False" in "".join(c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                                            for c in source["cells"])
    _run([nbgrader, "generate_assignment", LAB, "--force"], course)
    release = json.loads((course / "release" / LAB / f"{LAB}.ipynb").read_text())
    text = json.dumps(release)
    assert SOLUTION_BEGIN not in text and "YOUR CODE HERE" in text
    assert len(exercise_cells(release)) == len(exercise_cells(load_notebook(LAB))) >= 2  # checks kept
    points = sum(c["metadata"]["nbgrader"]["points"] for c in exercise_cells(release))

    for student, answers in (("alice", "solution"), ("bob", "wrong")):
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        (folder / f"{LAB}.ipynb").write_text(json.dumps(_submission(release, source, answers)))
    _run([nbgrader, "autograde", LAB, "--force"], course)

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        alice = gb.find_submission(LAB, "alice").score
        bob = gb.find_submission(LAB, "bob").score
    assert alice == pytest.approx(points) and bob == 0
    graded = (course / "autograded" / "bob" / LAB / f"{LAB}.ipynb").read_text()
    assert "expected" in graded.lower()  # the checker's explanation reaches the student


def test_release_refuses_bad_requests(tmp_path):
    assert LAB in lesson_names()
    existing = tmp_path / "there"
    existing.mkdir()
    with pytest.raises(ValueError, match="must be a new folder"):
        release_course(existing)
    with pytest.raises(ValueError, match="has no parameter"):
        release_course(tmp_path / "a", names=["00"], params={"NO_SUCH": 1})
    with pytest.raises(ValueError, match="notebook must be one of"):
        release_course(tmp_path / "b", names=["99_no_such_lab"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    done = subprocess.run([sys.executable, "-m", "moelab.cli", "course", "release", str(existing)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: OUT must be a new folder"), done.stderr
