"""``moelab course release OUT``: the lessons as an nbgrader course an instructor can release and grade.

Writes ``OUT/source/<lab>/<lab>.ipynb`` for every lesson notebook (one lab each) plus an
``OUT/nbgrader_config.py``; from ``OUT`` the instructor's own tools take over, offline:

* ``nbgrader generate_assignment <lab>`` writes ``release/<lab>/``: the student copy, every solution replaced
  by nbgrader's ``YOUR CODE HERE`` stub, every locked check cell kept;
* students fill the stubs and hand in; ``nbgrader autograde <lab>`` runs each submission and scores the check
  cells (``points`` from their metadata): a checker's message is what the student reads when a check fails.

``--params K=V`` rewrites the released copies' ``parameters`` cell (e.g. smaller sizes for a lab session),
checked against the notebook's own parameters like ``moelab notebooks run`` does.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moelab._outputs import check_output_dir, record_outputs
from moelab.course.lessons import is_lesson, load_notebook, nbgrader_problems, notebook_names
from moelab.notebooks import check_parameters, parse_params, resolve
from moelab.parameters import assignments

#: the writer's name in the course folder's output marker (``.moelab-output.json``)
WRITER = "course release"

CONFIG = '''\
# nbgrader configuration written by `moelab course release`
c = get_config()  # noqa: F821 (nbgrader's config loader provides it)
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = "."
# the labs import moelab; grading runs each submission top to bottom in a fresh kernel
c.ExecutePreprocessor.timeout = {timeout_s}
'''


def lesson_names() -> list[str]:
    """The notebooks that are lessons (they have exercises), in reading order."""
    return [name for name in notebook_names() if is_lesson(load_notebook(name))]


def with_parameters(nb: dict[str, Any], name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``nb`` whose ``parameters`` cell assigns ``params`` (appended after its defaults), each
    checked against notebook ``name``'s parameter model first (a ``PRESET`` among them included), so a
    released lab never holds a value its notebook would refuse."""
    params = check_parameters(name, params)
    nb = copy.deepcopy(nb)
    if params:
        cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        source = source.rstrip("\n") + "\n" + assignments(params, header="# set by `moelab course release --params`")
        cell["source"] = source
    return nb


def release_course(out: str | os.PathLike, *, names: Sequence[str] | None = None,
                   params: dict[str, Any] | None = None, course_id: str = "moelab",
                   timeout_s: int = 1200) -> list[Path]:
    """Write an nbgrader course folder at ``out`` (which must not exist) from the lesson notebooks.

    Parameters
    ----------
    out : path of the new course folder.
    names : lesson names or unique prefixes (default: every lesson).
    params : values for the labs' ``parameters`` cells (each must be a parameter of every lab released).
    course_id : nbgrader's course id.
    timeout_s : nbgrader's per-cell execution limit when it grades.

    Returns
    -------
    list of Path
        The source notebooks written, one per lab.
    """
    root = check_output_dir(out, writer=WRITER, name="OUT")  # not a link, not inside moelab's sources
    if root.exists():
        raise ValueError(f"OUT must be a new folder: {root} exists (course release never writes over a course)")
    if not isinstance(course_id, str) or not course_id.isidentifier():
        raise ValueError(f"course_id must be an identifier (letters, digits, _); got {course_id!r}")
    lessons = lesson_names()
    chosen = resolve(list(names)) if names else lessons
    not_lessons = [n for n in chosen if n not in lessons]
    if not_lessons:
        raise ValueError(f"labs must be lesson notebooks {lessons}; {not_lessons} have no exercises")
    labs = {}
    for name in chosen:
        nb = load_notebook(name)
        problems = nbgrader_problems(nb)
        if problems:
            raise ValueError(f"notebook {name} cannot be released: {problems[:3]}")
        labs[name] = with_parameters(nb, name, dict(params or {}))
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.building-", dir=root.parent))
    try:
        written = []
        for name, nb in labs.items():
            lab = staging / "source" / name
            lab.mkdir(parents=True)
            (lab / f"{name}.ipynb").write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            written.append(root / "source" / name / f"{name}.ipynb")
        (staging / "nbgrader_config.py").write_text(CONFIG.format(course_id=course_id, timeout_s=int(timeout_s)))
        record_outputs(staging, WRITER)
        staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written


def main(argv: list[str] | None = None) -> int:
    """``moelab course release OUT [--labs ...] [--params K=V ...]``."""
    parser = argparse.ArgumentParser(prog="moelab course", description="hand out the lessons as nbgrader labs")
    sub = parser.add_subparsers(dest="action", required=True)
    rel = sub.add_parser("release", help="write an nbgrader course folder (source/<lab>/) from the lessons")
    rel.add_argument("out", help="the new course folder (must not exist)")
    rel.add_argument("--labs", nargs="*", help="lesson names or unique prefixes (default: every lesson)")
    rel.add_argument("--params", "-p", nargs="*", action="extend", metavar="K=V",
                     help="values for the labs' parameters cells (checked against each lab's parameter model)")
    rel.add_argument("--course-id", default="moelab", help="nbgrader course id (default: moelab)")
    sub.add_parser("list", help="list the lessons that can be released")
    args = parser.parse_args(argv)
    if args.action == "list":
        print("\n".join(lesson_names()))
        return 0
    written = release_course(args.out, names=args.labs, params=parse_params(args.params or []),
                             course_id=args.course_id)
    print(f"course: {Path(args.out).resolve()} ({len(written)} labs: {', '.join(p.parent.name for p in written)})")
    print(f"next: cd {args.out} && nbgrader generate_assignment LAB   (student copies in release/LAB/)")
    return 0
