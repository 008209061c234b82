"""``moelab course release`` writes an nbgrader course; the REAL nbgrader strips the solutions and grades.

One lab (the map, 00, whose exercises run in seconds) goes through nbgrader's own commands, offline:
``generate_assignment`` (student copy: solutions stubbed, checks kept), then ``autograde``,
``generate_feedback`` and ``export`` on a correct and a partly wrong submission (:mod:`moelab.course.grading`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.course import EXERCISES
from moelab.course.grading import answered, exercise_keys, round_trip
from moelab.course.lessons import SOLUTION_BEGIN, exercise_cells, load_notebook
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


@pytest.mark.slow
def test_release_generate_autograde_feedback_export(tmp_path):
    """The instructor's whole flow (COURSE.md): release, generate_assignment, hand in, autograde,
    generate_feedback, export. A submission filled from the solutions gets full marks; one with the first
    exercise right and the others filled with the registered typical wrong answers gets that exercise's points
    and zero on every other check cell; its feedback page names each failed quantity without its expected
    value; nbgrader logs no partial-credit warning (check cells evaluate to None)."""
    nbgrader = _nbgrader()
    course = tmp_path / "course"
    written = release_course(course, names=["00"], params={"INTERACTIVE": False})
    assert written == [course / "source" / LAB / f"{LAB}.ipynb"]
    source = json.loads(written[0].read_text())
    assert "INTERACTIVE = False" in "".join(c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                                            for c in source["cells"])
    log = _run([nbgrader, "generate_assignment", LAB, "--force"], course)
    release = json.loads((course / "release" / LAB / f"{LAB}.ipynb").read_text())
    text = json.dumps(release)
    assert SOLUTION_BEGIN not in text and "YOUR CODE HERE" in text
    checks = exercise_cells(release)
    assert len(checks) == len(exercise_cells(load_notebook(LAB))) >= 2  # checks kept
    points = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"] for c in checks}
    keys = exercise_keys(source)
    first = next(iter(keys.values()))

    result = round_trip(course, LAB, {"alice": answered(release, source),
                                      "bob": answered(release, source, right={first})}, nbgrader=nbgrader)
    assert result.scores["alice"] == pytest.approx(sum(points.values()))
    bob = {gid: got for gid, (got, _) in result.cells["bob"].items() if gid in points}
    first_check = list(points)[0]
    assert bob[first_check] == points[first_check]
    assert all(bob[gid] == 0 for gid in points if gid != first_check), bob
    assert result.scores["bob"] == pytest.approx(points[first_check])
    assert not [w for w in result.warnings + log.splitlines() if "partial credit" in w], result.warnings

    page = result.feedback["bob"]
    assert page and "Not yet:" in page
    for key in list(keys.values())[1:]:  # each failed check names its quantity, by the name the checker uses
        ex = EXERCISES[key]
        message = ex.check(ex.wrong(**ex.context), **ex.context).message
        name = (re.findall(r"`([^`]+)`", message) or [message.split("(")[0]])[0]
        assert name in page, (key, name)
    assert "Correct:" in result.feedback["alice"] and "Not yet:" not in result.feedback["alice"]
    grades = {row["student_id"]: float(row["score"]) for row in result.grades_csv if row["assignment"] == LAB}
    assert grades == pytest.approx({"alice": sum(points.values()), "bob": points[first_check]})


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
