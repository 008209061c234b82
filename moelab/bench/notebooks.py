"""The ``notebooks`` benchmark suite: are the committed notebooks lessons? (issue 26)

Everything here reads the committed ``.ipynb`` files as JSON (static, no execution) except
``lesson_checkers_reject_wrong``, which calls every registered exercise checker, and
``notebook_classroom_seconds_<notebook>`` (issue 27), which executes every notebook headless at
``PRESET="classroom"`` (:mod:`moelab.presets`; minutes, so ``--quick`` leaves them out), then
``book_build_seconds`` (``moelab book build`` from those executed notebooks) and the lecture mode's browser
timings (:mod:`moelab.bench.app`). Issue 40 adds ``glossary_terms_undefined`` (static, goal 0), then from the
classroom executions ``prose_numbers_mismatched``, ``figure_text_entities``, ``figure_label_overlaps``,
``figure_hidden_series`` and ``output_raw_entities`` (goal 0 each; :mod:`moelab.course.agreement`, :mod:`moelab.viz.hygiene`) and
``nbgrader_autograde_seconds`` (the course round trip of :mod:`moelab.course.grading` on lab 00). Definitions:

* **exercise**: a locked nbgrader check cell (``metadata.nbgrader``: ``grade: true, locked: true``);
  each exercise has one, after its solution cell.
* **lesson notebook**: a notebook with at least one exercise.
* **first result cell**: the first code cell tagged :data:`HEADLINE_TAG` (the cell that shows the
  notebook's headline figure or live panel). Its position is ``(index + 1) / code cells``: the fraction
  of the notebook's code a reader runs before seeing the result; 1.0 when no cell is tagged.
* **typed number**: a number in a markdown cell that the allow-list (:func:`typed_numbers`) does not
  explain: results must be rendered from the run (``display(Markdown(...))``), not typed.
* **unshown figure**: a ``save_figure(X, ...)`` call whose ``X`` is never displayed afterwards: neither a
  later ``display(..., X, ...)`` / ``X.show()`` nor the last expression of its cell or of a later cell
  before one that rebinds ``X`` (a conditional expression ``panel if c else X`` does not count: it shows
  ``X`` on one branch only). A call inside a loop counts as shown only when the loop
  body itself displays ``X`` (otherwise only the last iteration's figure reaches the page).
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import pkgutil
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import moelab.course as course
from moelab.bench import app as app_bench
from moelab.bench.core import Figure
from moelab.book import BookError, build_book
from moelab.course.agreement import (
    CODE_SPAN,
    DISPLAY_MATH,
    HTML_ENTITY,
    HTML_TAG,
    INLINE_MATH,
    LINK_TARGET,
    executed_report,
)
from moelab.course.check import EXERCISES
from moelab.course.grading import answered, nbgrader_env, nbgrader_executable, round_trip
from moelab.course.lessons import (
    _source,
    code_cells,
    exercise_cells,
    is_lesson,
    load_notebook,
    notebook_names,
)
from moelab.course.release import release_course
from moelab.course.vocabulary import TERMS, undefined_terms, unlinked_first_uses
from moelab.notebooks import describe_requirements, missing_requirements, parse_cell_source, run_notebook

SUITE = "notebooks"
HEADLINE_TAG = "headline"
FIRST_RESULT_GOAL = 0.35
CLASSROOM_GOAL_S = 180.0  # issue 27: each notebook at the classroom preset in <= 3 min on a 2-core laptop

# words after which a number is a label (a section, proposition, part, step...), not a result
_LABEL_WORDS = r"(?:proposition|part|section|§|step|exercise|deliver|notebook|table|figure|eq\.?|chapter|level)"
# (plural labels and ranges too: "sections 3.1–3.4", "propositions 2 and 3")
_LABEL_BEFORE = re.compile(_LABEL_WORDS + r"s?\s*(?:[\d.]+\s*(?:–|-|,|and|to)\s*)*$", re.IGNORECASE)
_MATH_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# a maximal "word" that holds a digit: 135M, H200, 04_dsd_rtt, 2606.25091, 0.5, t_1
_NUMBER_WORD = re.compile(r"[A-Za-z0-9_.\-]*\d[A-Za-z0-9_.\-]*%?")
_LIST_MARKER = re.compile(r"^\s*\d+[.)]\s")


def _allowed_word(word: str) -> bool:
    """Whether a digit-holding word is a name or an identifier rather than a typed quantity."""
    core = word.strip(".-")
    if not core:
        return True
    if re.match(r"[A-Za-z_]", core):  # a name that starts with a letter: H200, SmolLM2-135M, M1, r_A, t_2
        return True
    if re.fullmatch(r"\d+(?:\.\d+)?[A-Z](?:-[A-Za-z0-9\-]+)?", core):  # a size or a role: 135M, 7B, 1F (rA-1F)
        return True
    if re.fullmatch(r"(?:19|20)\d\d", core):  # a year
        return True
    if re.fullmatch(r"\d{4}\.\d{4,5}(?:v\d+)?", core):  # an arXiv id
        return True
    if re.fullmatch(r"0\d(?:_\w+)?", core):  # a notebook number or name: 04, 04_dsd_rtt
        return True
    return False


def typed_numbers(markdown: str) -> list[str]:
    """The numbers in one markdown cell that the allow-list does not explain.

    Allowed: headings' numbers (section titles), a number right after a label word (Proposition 3,
    Part 2, step 1, §7), ordered-list markers (``1.``), names that start with a letter (H200,
    SmolLM2-135M, M1, r_A), sizes and roles (135M, 7B, the 1F of rA-1F), years, arXiv ids, notebook numbers (04, 04_dsd_rtt), identifiers and file names in code
    spans without spaces (``dense_verify.csv``), link targets and HTML attributes, and single-digit
    integers inside LaTeX math (the constants of a definition, as in ``1 - alpha^{gamma+1}``).
    Everything else (``1.5x``, ``60 ms``, ``0.8`` typed into a sentence or a formula) is reported.

    Parameters
    ----------
    markdown : str
        The cell's source.

    Returns
    -------
    list of str
        The offending words, in order.
    """
    found: list[str] = []

    def math(m: re.Match) -> str:
        # sub/superscripts (t_{12}), commands and symbols (\alpha, x2) are not quantities
        body = re.sub(r"[_^]\{[^{}]*\}|[_^]\w|\\[A-Za-z]+|[A-Za-z]+\d*", " ", m.group(0))
        found.extend(w for w in _MATH_NUMBER.findall(body) if not re.fullmatch(r"\d", w))
        return " "

    markdown = DISPLAY_MATH.sub(math, markdown)  # display math may span lines
    for line in markdown.splitlines():
        if line.lstrip().startswith("#"):  # a heading: section numbers
            continue
        line = _LIST_MARKER.sub("", line)  # "1. " of an ordered list
        line = LINK_TARGET.sub("]", line)
        line = HTML_TAG.sub(" ", line)
        line = HTML_ENTITY.sub(" ", line)
        line = CODE_SPAN.sub(lambda m: " " if " " not in m.group(1).strip() else f" {m.group(1)} ", line)
        line = INLINE_MATH.sub(math, line)
        for m in _NUMBER_WORD.finditer(line):
            word = m.group(0)
            if _allowed_word(word) or _LABEL_BEFORE.search(line[:m.start()]):
                continue
            found.append(word)
    return found


def first_result_cell_frac(nb: dict) -> float:
    """``(index + 1) / code cells`` of the first code cell tagged :data:`HEADLINE_TAG`; 1.0 when none is."""
    cells = code_cells(nb)
    for i, cell in enumerate(cells):
        if HEADLINE_TAG in cell.get("metadata", {}).get("tags", []):
            return (i + 1) / len(cells)
    return 1.0




def _shown_names(node: ast.AST) -> set[str]:
    """Names displayed by ``node``: ``display(..., X)`` arguments and ``X.show()`` receivers."""
    shown = set()
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        if isinstance(call.func, ast.Name) and call.func.id == "display":
            shown |= {a.id for a in call.args if isinstance(a, ast.Name)}
        if isinstance(call.func, ast.Attribute) and call.func.attr == "show" and isinstance(call.func.value, ast.Name):
            shown.add(call.func.value.id)
    return shown


def _last_expression_names(tree: ast.Module) -> set[str]:
    """The name the cell's last statement shows as its result (a bare ``X``; ``panel if c else X`` shows
    ``X`` only on one branch, so it does not count)."""
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or not isinstance(tree.body[-1].value, ast.Name):
        return set()
    return {tree.body[-1].value.id}


def _assigns(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(tree))


def unshown_figures(nb: dict) -> list[str]:
    """The figures a notebook saves with ``save_figure`` but never displays (see the module docstring).

    Returns
    -------
    list of str
        ``"<cell index>:<variable>"`` per unshown save (``"<cell index>:<expression>"`` when the saved
        figure is not a variable, which can never be shown afterwards).
    """
    trees = [(i, parse_cell_source(_source(c))) for i, c in enumerate(nb.get("cells", [])) if c.get("cell_type") == "code"]
    trees = [(i, t) for i, t in trees if t is not None]
    unshown = []
    for pos, (i, tree) in enumerate(trees):
        loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))]
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "save_figure"
                    and call.args):
                continue
            target = call.args[0]
            if not isinstance(target, ast.Name):
                unshown.append(f"{i}:{ast.unparse(target)}")
                continue
            name = target.id
            loop = next((lp for lp in loops if any(n is call for n in ast.walk(lp))), None)
            if loop is not None:
                shown = name in _shown_names(loop)
            else:
                shown = name in _shown_names(tree) or name in _last_expression_names(tree)
                for _, later in trees[pos + 1:]:
                    if shown or _assigns(later, name):  # a later cell that rebinds the name shows another figure
                        break
                    shown = name in _shown_names(later) or name in _last_expression_names(later)
            if not shown:
                unshown.append(f"{i}:{name}")
    return unshown


def markdown_typed_numbers(nb: dict) -> list[str]:
    """Typed numbers over all markdown cells of ``nb`` (:func:`typed_numbers`)."""
    return [w for c in nb.get("cells", []) if c.get("cell_type") == "markdown" for w in typed_numbers(_source(c))]


def import_course_modules() -> dict[str, Any]:
    """Import every module of :mod:`moelab.course` (each registers its exercises) and return the registry."""
    for info in pkgutil.iter_modules(course.__path__):
        importlib.import_module(f"moelab.course.{info.name}")
    return EXERCISES


def checker_verdicts() -> dict[str, bool]:
    """Per registered exercise: does its checker accept the solution and reject the typical wrong answer
    with a message? (Both, so a checker that rejects everything does not count.)"""
    verdicts = {}
    for key, ex in sorted(import_course_modules().items()):
        ctx = dict(ex.context or {})
        good = ex.check(ex.solution(**ctx), **ctx)
        bad = ex.check(ex.wrong(**ctx), **ctx)
        verdicts[key] = bool(good.ok) and not bad.ok and bool(str(bad.message).strip())
    return verdicts


def classroom_seconds(names: list[str] | None = None, out_dir: str | os.PathLike | None = None
                      ) -> dict[str, tuple[float, str]]:
    """Execute each notebook headless at ``PRESET="classroom"`` and time it.

    Figures are written as HTML only (``MOELAB_PNG=0`` unless set: a PNG export starts a browser per figure).

    Parameters
    ----------
    names : list of str, optional
        Notebooks to run (default: all).
    out_dir : path, optional
        Where the executed notebooks go (default: a temporary folder, removed afterwards).

    Returns
    -------
    dict
        ``{notebook: (seconds, note)}``; seconds is NaN for a notebook that failed (the note says why) or
        was skipped for a missing optional package.
    """
    names = list(names or notebook_names())
    out: dict[str, tuple[float, str]] = {}
    png_before = os.environ.get("MOELAB_PNG")
    os.environ.setdefault("MOELAB_PNG", "0")
    try:
        with tempfile.TemporaryDirectory(prefix="moelab-classroom-") as tmp:
            where = Path(out_dir) if out_dir is not None else Path(tmp)
            for name in names:
                missing = missing_requirements(name)
                if missing:
                    out[name] = (math.nan, f"skipped: needs {describe_requirements(missing)}")
                    continue
                run = run_notebook(name, {"PRESET": "classroom"}, where)
                out[name] = (run.seconds, "ok" if run.ok else f"FAILED: {run.error}")
    finally:
        if png_before is None:
            os.environ.pop("MOELAB_PNG", None)
    return out


def book_figure(executed_dir: Path, out: Path) -> Figure:
    """``book_build_seconds``: ``moelab book build`` from the notebooks the classroom timing just executed
    (each reused, never executed again; one that is missing, e.g. skipped for a missing package, is executed
    and the note says so)."""
    try:
        done = build_book(out, executed_dir=executed_dir)
    except BookError as exc:
        return Figure(SUITE, "book_build_seconds", math.nan, "s", "", f"FAILED: {exc}")
    executed = ", ".join(f"{n} {s:.0f} s" for n, s in done.executed.items()) or "none"
    return Figure(SUITE, "book_build_seconds", done.seconds, "s", "",
                  f"{len(done.pages)} pages from the classroom runs: reused {len(done.reused)} executed notebooks, "
                  f"executed {executed}; sphinx {done.sphinx_seconds:.1f} s")


def glossary_figure() -> Figure:
    """``glossary_terms_undefined`` (issue 40): terms of :data:`moelab.course.vocabulary.TERMS` with no glossary
    entry in NOTATION.md; the note adds the first uses not linked to it."""
    missing = undefined_terms()
    unlinked = unlinked_first_uses()
    return Figure(SUITE, "glossary_terms_undefined", float(len(missing)), "terms", "<= 0",
                  f"{len(TERMS)} terms checked{': undefined ' + ', '.join(missing) if missing else ''}; first uses "
                  f"not linked to NOTATION.md: {sum(map(len, unlinked.values()))}")


def executed_figures(runs: Path) -> list[Figure]:
    """``prose_numbers_mismatched``, ``figure_text_entities``, ``figure_label_overlaps``, ``figure_hidden_series`` and
    ``output_raw_entities`` (issue 40) over the notebooks executed into ``runs`` (their results JSON in
    ``runs/figures``): see
    :func:`moelab.course.agreement.executed_report`."""
    results = {p.stem: json.loads(p.read_text()) for p in sorted((runs / "figures").glob("*.json"))}
    totals: dict[str, dict[str, int]] = {}
    for path in sorted(runs.glob("[0-9][0-9]_*.ipynb")):
        report = executed_report(json.loads(path.read_text()), results)
        for kind, found in report.items():
            totals.setdefault(kind, {})[path.stem] = len(found)
    out = []
    for kind, unit in (("prose_numbers_mismatched", "numbers"), ("figure_text_entities", "texts"),
                       ("figure_label_overlaps", "pairs"), ("figure_hidden_series", "series"),
                       ("output_raw_entities", "entities")):
        per = totals.get(kind, {})
        out.append(Figure(SUITE, kind, float(sum(per.values())) if per else math.nan, unit, "<= 0",
                          (", ".join(f"{n} {c}" for n, c in per.items() if c) or "none")
                          + f" (over {len(per)} executed notebooks)" if per else "no executed notebooks"))
    return out


def autograde_figure(course: Path) -> Figure:
    """``nbgrader_autograde_seconds`` (issue 40): ``nbgrader autograde`` of lab 00 released by ``moelab course
    release`` for two submissions (one from the solutions, one with typical wrong answers), after
    ``generate_assignment``; the note says whether the scores were right."""
    exe = nbgrader_executable()
    if exe is None:
        return Figure(SUITE, "nbgrader_autograde_seconds", math.nan, "s", "", "skipped: nbgrader not installed")
    lab = "00_overview"
    try:
        source = json.loads(release_course(course, names=["00"], params={"INTERACTIVE": False})[0].read_text())
        subprocess.run([exe, "generate_assignment", lab, "--force"], cwd=course, check=True, capture_output=True,
                       timeout=600, env=nbgrader_env(exe))
        release = json.loads((course / "release" / lab / f"{lab}.ipynb").read_text())
        done = round_trip(course, lab, {"right": answered(release, source), "wrong": answered(release, source, set())},
                          nbgrader=exe)
    except Exception as exc:  # any failure of the chain is the figure's note
        return Figure(SUITE, "nbgrader_autograde_seconds", math.nan, "s", "", f"FAILED: {str(exc)[:200]}")
    return Figure(SUITE, "nbgrader_autograde_seconds", done.autograde_seconds, "s", "",
                  f"lab 00, two submissions: scores {done.scores} (wrong must be 0); "
                  f"{len(done.warnings)} nbgrader warnings")


def api_reference_figure() -> Figure:
    """``api_public_names_undocumented``: public names (every public package's ``__all__``) without a docstring
    or ``#:`` comment (:func:`moelab.book.reference.undocumented`; goal 0)."""
    from moelab.book.reference import undocumented  # lazy: imports every public package

    missing = undocumented()
    return Figure(SUITE, "api_public_names_undocumented", float(len(missing)), "names", "<= 0",
                  ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))


def guide_figure() -> Figure:
    """``guide_blocks_run_seconds``: every code block of the user guide (``docs/guide.md``) run in order in one
    session (:func:`moelab.book.guide.run_blocks`), the total wall time; the slowest block in the note."""
    from moelab.book import guide  # lazy: the guide's blocks import every system

    if not guide.guide_path().is_file():
        return Figure(SUITE, "guide_blocks_run_seconds", math.nan, "s", "", "skipped: no docs/guide.md (not a checkout)")
    with tempfile.TemporaryDirectory(prefix="moelab-bench-guide-") as tmp:
        try:
            runs = guide.run_blocks(out_dir=tmp)
        except RuntimeError as exc:
            return Figure(SUITE, "guide_blocks_run_seconds", math.nan, "s", "", f"FAILED: {str(exc)[:200]}")
    slow = max(runs, key=lambda r: r.seconds)
    skipped = [r.block.line for r in runs if r.skipped]
    return Figure(SUITE, "guide_blocks_run_seconds", sum(r.seconds for r in runs), "s", "",
                  f"{len(runs)} blocks; slowest {slow.seconds:.1f} s ({slow.block.section}, line {slow.block.line})"
                  + (f"; skipped lines {skipped}" if skipped else ""))


def run(quick: bool = False) -> list[Figure]:
    """The suite's figures; ``quick`` leaves out the classroom timings (they execute every notebook)."""
    notebooks = {name: load_notebook(name) for name in notebook_names()}
    exercises = sum(len(exercise_cells(nb)) for nb in notebooks.values())
    lessons = sorted(n for n, nb in notebooks.items() if is_lesson(nb))
    figs = [Figure(SUITE, "lesson_exercises_total", float(exercises), "exercises", "",
                   f"locked nbgrader check cells across the notebooks; lessons: {', '.join(lessons) or 'none'}")]
    verdicts = checker_verdicts()
    rejecting = [k for k, ok in verdicts.items() if ok]
    figs.append(Figure(SUITE, "lesson_checkers_reject_wrong", len(rejecting) / len(verdicts) if verdicts else 0.0,
                       "fraction", ">= 1.0",
                       f"{len(rejecting)} of {len(verdicts)} registered checkers accept their solution and reject "
                       f"their typical wrong answer with a message"
                       + (f"; failing: {sorted(set(verdicts) - set(rejecting))}" if len(rejecting) < len(verdicts) else "")))
    for name, nb in notebooks.items():
        figs.append(Figure(SUITE, f"notebook_first_result_cell_frac_{name}", first_result_cell_frac(nb), "fraction",
                           f"<= {FIRST_RESULT_GOAL}",
                           f"(index + 1) / {len(code_cells(nb))} code cells of the first cell tagged "
                           f"'{HEADLINE_TAG}' (1.0: none tagged)"))
    typed = {n: markdown_typed_numbers(nb) for n, nb in notebooks.items()}
    figs.append(Figure(SUITE, "notebook_typed_numbers", float(sum(map(len, typed.values()))), "numbers", "<= 0",
                       "numbers in markdown outside the allow-list: "
                       + ", ".join(f"{n} {len(v)}" for n, v in typed.items() if v)))
    unshown = {n: unshown_figures(nb) for n, nb in notebooks.items()}
    figs.append(Figure(SUITE, "notebook_figures_unshown", float(sum(map(len, unshown.values()))), "figures", "<= 0",
                       "save_figure calls never displayed (static): "
                       + ", ".join(f"{n} {v}" for n, v in unshown.items() if v)))
    figs.append(glossary_figure())  # issue 40: static
    figs.append(api_reference_figure())  # issue 38: static
    if quick:
        return figs
    figs.append(guide_figure())  # issue 38: the user guide's blocks, run
    with tempfile.TemporaryDirectory(prefix="moelab-bench-book-") as tmp:
        timed = classroom_seconds(out_dir=Path(tmp) / "runs")
        figs.append(book_figure(Path(tmp) / "runs", Path(tmp) / "site"))
        figs += executed_figures(Path(tmp) / "runs")  # issue 40: what the executed classroom runs read like
        figs.append(autograde_figure(Path(tmp) / "course"))
    goal = f"<= {CLASSROOM_GOAL_S:g}"
    for name, (seconds, note) in timed.items():
        figs.append(Figure(SUITE, f"notebook_classroom_seconds_{name}", seconds, "s", goal,
                           f"executed headless at PRESET='classroom' (HTML figures): {note}"))
    ran = {n: s for n, (s, _) in timed.items() if math.isfinite(s)}
    failed = sorted(n for n, (_, note) in timed.items() if note.startswith("FAILED"))
    worst = max(ran, key=ran.get) if ran else "none"
    figs.append(Figure(SUITE, "notebook_classroom_seconds_max", max(ran.values()) if ran and not failed else math.nan,
                       "s", goal, f"slowest: {worst}" + (f"; failed: {failed}" if failed else "")
                       + (f"; not run: {sorted(set(timed) - set(ran) - set(failed))}" if len(ran) + len(failed) < len(timed) else "")))
    # the lecture mode in a real browser (moelab app): first figure and slider redraws
    figs += app_bench.run(quick)
    return figs


__all__ = ["CLASSROOM_GOAL_S", "HEADLINE_TAG", "SUITE", "api_reference_figure", "autograde_figure", "book_figure", "executed_figures",
           "glossary_figure", "checker_verdicts", "guide_figure", "classroom_seconds", "first_result_cell_frac", "import_course_modules",
           "markdown_typed_numbers", "run", "typed_numbers", "unshown_figures"]
