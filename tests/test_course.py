"""The exercise checkers: every registered exercise accepts its solution and rejects a typical wrong
answer with a message; bad input (a string, None, NaN, a list of the wrong shape) is feedback, never an
exception."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moelab.course import (
    EXERCISES,
    Feedback,
    check_array,
    check_callable,
    check_choice,
    check_number,
    exercise,
    require,
)
from moelab.course.overview import PAPER_TERMS

BAD_ANSWERS = ["abc", None, float("nan"), float("inf"), [1.0, 2.0, 3.0], [[1.0], [2.0, 3.0]], {"a": 1}, True,
               np.zeros((2, 2)), lambda *a: "not a number", lambda *a: 1 / 0]


def test_registry_covers_the_notebooks_and_levels():
    assert {"03", "00"} <= {e.notebook for e in EXERCISES.values()}
    per_notebook = {nb: [e for e in EXERCISES.values() if e.notebook == nb] for nb in ("00", "03")}
    assert len(per_notebook["03"]) >= 4 and len(per_notebook["00"]) >= 2
    for entries in per_notebook.values():
        assert {e.level for e in entries} >= {"easy", "hard"}
    assert all(key == e.key and e.prompt for key, e in EXERCISES.items())


def test_each_exercise_heading_shows_the_registered_level():
    # thirteenth read: 05's "BR-0's pick" said "(easy)" in the notebook and "medium" in the registry
    import json
    import re

    from moelab.notebooks import notebooks_dir

    shown = {}
    for path in sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb")):
        level = None
        for cell in json.loads(path.read_text())["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                found = re.findall(r"\((easy|medium|hard)\b", text)
                level = found[-1] if found else level
            for key in re.findall(r'EXERCISES\["([0-9]{2}\.[a-z0-9_]+)"\]\.check', text):
                shown[key] = level
    assert set(shown) == set(EXERCISES)
    wrong = {key: (shown[key], EXERCISES[key].level) for key in EXERCISES if shown[key] != EXERCISES[key].level}
    assert not wrong, f"notebook heading vs registry level: {wrong}"


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_checker_passes_the_solution(key):
    ex = EXERCISES[key]
    feedback = ex.check(ex.solution(**ex.context), **ex.context)
    assert isinstance(feedback, Feedback) and feedback.ok, feedback.message
    assert require(feedback) is None  # a check cell evaluates to nothing nbgrader reads as partial credit


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_checker_fails_the_wrong_answer_with_a_message(key):
    ex = EXERCISES[key]
    feedback = ex.check(ex.wrong(**ex.context), **ex.context)
    assert isinstance(feedback, Feedback) and not feedback.ok and not bool(feedback)
    assert len(feedback.message) > 20 and "Hint:" in feedback.message
    with pytest.raises(AssertionError, match="Hint"):
        require(feedback)


@pytest.mark.parametrize("key", sorted(EXERCISES))
@pytest.mark.parametrize("bad", BAD_ANSWERS, ids=lambda b: type(b).__name__)
def test_checker_turns_bad_input_into_feedback(key, bad):
    ex = EXERCISES[key]
    feedback = ex.check(bad, **ex.context)
    assert isinstance(feedback, Feedback) and not feedback.ok
    assert any(word in feedback.message for word in ("expected", "must be", "raised", "return"))


@pytest.mark.parametrize("paper", ["AFD", "BalanceRoute", "DSD", "HD"])
def test_paper_for_term_tells_a_wrong_paper_which_term_it_moves(paper):
    """00.paper_for_term: a wrong paper (any case, stray spaces) is told the term its own method moves, and the
    right paper is never named in the hint."""
    ex = EXERCISES["00.paper_for_term"]
    for spelled in (paper, f"  {paper.lower()} "):
        feedback = ex.check(spelled, **ex.context)
        assert not feedback.ok
        assert f"{paper}'s method moves {PAPER_TERMS[paper]}, not D." in feedback.message, feedback.message
        assert "ELDR" not in feedback.message.split("Hint:", 1)[1]


def test_paper_for_term_without_a_named_paper_points_at_the_table():
    ex = EXERCISES["00.paper_for_term"]
    for answer in ("Mixtral", "", "eldr?"):
        feedback = ex.check(answer, **ex.context)
        assert not feedback.ok and "read the table of what each method does" in feedback.message, feedback.message
        assert "method moves" not in feedback.message and "ELDR" not in feedback.message.split("Hint:", 1)[1]
    assert ex.check(" eLdR ", **ex.context).ok


def test_check_number_names_a_known_slip():
    slips = [(6.0, "that is twice it"), (3.0, "a slip equal to the answer never hides the answer")]
    wrong = check_number("x", 6.05, 3.0, hint="halve it", slips=slips)
    assert not wrong and "that is twice it" in wrong.message and "Hint: halve it" in wrong.message
    assert check_number("x", 3.0, 3.0, slips=slips)  # the right answer wins over a slip at the same value
    other = check_number("x", 9.0, 3.0, slips=slips)
    assert not other and "too high" in other.message and "twice" not in other.message


def test_check_number_states_its_tolerance_in_words():
    # the check passes within atol + rtol * |expected|: read as "2% plus 0.05", never "2% + ±0.05"
    assert "(within 2% plus 0.05)" in check_number("x", 3.0, 3.0, rtol=0.02, atol=0.05).message
    assert "(within 2%)" in check_number("x", 3.0, 3.0).message
    assert "(within ±0.05)" in check_number("x", 3.0, 3.0, rtol=0.0, atol=0.05).message
    assert "(exactly)" in check_number("x", 3.0, 3.0, rtol=0.0).message
    assert "(within 2.5%)" in check_number("x", 3.0, 3.0, rtol=0.025).message  # not rounded to 2% or 3%


def test_check_number_messages():
    assert check_number("x", 3.01, 3.0)
    assert check_number("x", np.float32(3.0), 3.0) and check_number("x", np.array([3.0]), 3.0)
    wrong = check_number("x", 4.0, 3.17, hint="look at y")
    assert "4" in wrong.message and "3.17" not in wrong.message  # the expected value is never given away
    assert "too high" in wrong.message and "look at y" in wrong.message and "`x`" in wrong.message
    for bad, shown in (("abc", "str 'abc'"), (None, "None"), (math.nan, "nan"), ([1, 2], "list")):
        fb = check_number("x", bad, 3.0)
        assert not fb and "expected a number for `x`" in fb.message and shown in fb.message
    assert not check_number("x", True, 1.0)  # a bool is not a number here
    with pytest.raises(ValueError, match="rtol"):
        check_number("x", 1.0, 1.0, rtol=-1)


def test_check_array_shape_first_then_first_wrong_element():
    assert check_array("a", [1, 2, 3], np.array([1.0, 2.0, 3.0]))
    shape = check_array("a", [1, 2], [1, 2, 3])
    assert not shape and "(3,)" in shape.message and "(2,)" in shape.message
    elem = check_array("a", [1, 5, 3, 9], [1, 2, 3, 4])
    assert not elem and "2 of 4" in elem.message and "`a`[1]" in elem.message
    for bad in ("abc", None, [1, [2]], [1, math.nan, 3]):
        fb = check_array("a", bad, [1, 2, 3])
        assert not fb and fb.message


def test_check_choice_and_callable():
    assert check_choice("c", " Up ", "up", ["up", "down"])
    assert not check_choice("c", "sideways", "up", ["up", "down"])
    assert "one of" in check_choice("c", 3, "up", ["up", "down"]).message
    with pytest.raises(ValueError, match="expected"):
        check_choice("c", "up", "left", ["up", "down"])
    cases = [((1, 2), 3.0), ((2, 2), 4.0)]
    assert check_callable("add", lambda a, b: a + b, cases)
    assert "add(2, 2)" in check_callable("add", lambda a, b: 3.0, cases).message
    assert "raised" in check_callable("add", lambda a: a, cases).message
    assert "expected a function" in check_callable("add", 3, cases).message


def test_feedback_renders_for_jupyter():
    assert Feedback(True, "fine")._repr_markdown_() == "**Correct:** fine"
    assert str(Feedback(False, "no")) == "Not yet: no"
    with pytest.raises(TypeError, match="Feedback"):
        require(True)


def test_exercise_rejects_a_bad_level():
    with pytest.raises(ValueError, match="level"):
        exercise("99", "x", "tricky", "?", check_number, solution=lambda: 1, wrong=lambda: 2)


# ---- the course page (COURSE.md): it cannot go stale silently --------------------------------------------------

def _course_page() -> str:
    from moelab.datasets import repo_root

    return (repo_root() / "COURSE.md").read_text()


def test_course_page_names_every_notebook_and_only_real_ones():
    import re

    from moelab.course.lessons import notebook_names

    text, names = _course_page(), notebook_names()
    linked = set(re.findall(r"\]\(notebooks/(\d\d_[A-Za-z0-9_]+)\.ipynb", text))
    assert linked, "COURSE.md links no notebook"
    assert linked <= set(names), f"COURSE.md links notebooks that do not exist: {sorted(linked - set(names))}"
    assert set(names) <= linked, f"COURSE.md never links: {sorted(set(names) - linked)}"
    for name in names:  # each notebook has its learning objectives
        assert re.search(rf"\*\*\[{name[:2]} [^\]]*\]\(notebooks/{name}\.ipynb\)\.\*\* After it you can", text), \
            f"COURSE.md: no learning objectives for {name}"


def test_course_page_cites_only_registered_exercises_and_releasable_labs():
    import re

    from moelab.course.release import lesson_names
    from moelab.notebooks import resolve

    text = _course_page()
    cited = re.findall(r"`(\d\d\.[a-z][a-z0-9_]*)`", text)
    assert len(cited) >= 20, f"COURSE.md cites too few exercises: {cited}"
    unknown = sorted(set(cited) - set(EXERCISES))
    assert not unknown, f"COURSE.md cites exercises that moelab.course does not register: {unknown}"
    releases = re.findall(r"`moelab course release (\S+) --labs ([0-9 ]+)`", text)
    assert len(releases) >= 2, "COURSE.md: each lab needs its `moelab course release ... --labs ...` command"
    lessons = set(lesson_names())
    for out, labs in releases:
        chosen = resolve(labs.split())
        assert set(chosen) <= lessons, f"COURSE.md: lab {out} releases non-lessons {sorted(set(chosen) - lessons)}"
        # every exercise the lab's table cites belongs to one of the notebooks it releases
        section = text.split(f"`moelab course release {out} --labs {labs}`", 1)[1].split("\n### ", 1)[0]
        for key in set(re.findall(r"`(\d\d\.[a-z][a-z0-9_]*)`", section)):
            assert any(n.startswith(key[:2]) for n in chosen), f"COURSE.md: lab {out} cites {key}, not released"


def test_book_links_point_repository_links_at_book_pages():
    from moelab.book import book_links, unlink_missing

    course = ("[00](notebooks/00_overview.ipynb) [n](notebooks/NOTATION.md#glossary) [r](README.md) "
              "[v](https://docs.vllm.ai/en/latest/) [x](notebooks/99_missing.ipynb)")
    # README.md has no page in the book: its link becomes plain text
    assert book_links(course, "COURSE.md") == ("[00](00_overview.ipynb) [n](notation.md#glossary) r "
                                               "[v](https://docs.vllm.ai/en/latest/) [x](99_missing.ipynb)")
    assert unlink_missing(book_links(course, "COURSE.md"), ["00_overview"]).endswith(" x")
    in_notebook = "[n](NOTATION.md#clashes) [c](../COURSE.md) [01](01_eldr.ipynb)"
    assert book_links(in_notebook, "notebooks/00_overview.ipynb") == \
        "[n](notation.md#clashes) [c](course.md) [01](01_eldr.ipynb)"


def test_br0_pick_note_example_holds():
    # thirteenth read: COURSE.md said BR-0 picks "the longest prompt that still fits"; a slight overshoot can win
    from moelab.course.balanceroute import br0_best_request, br0_margins, br0_score
    from moelab.datasets import repo_root

    loads, rank = [300.0, 0.0, 100.0, 200.0], 1  # G = 4, rank 1's margin 300: the note's example
    assert br0_margins(loads)[rank] == 300.0
    assert (br0_score(310, 300.0, 4), br0_score(100, 300.0, 4)) == (270.0, 100.0)
    assert br0_best_request(loads, [100, 310], rank) == 1  # the overshooting prompt, not the one that fits
    note = (repo_root() / "COURSE.md").read_text()
    assert "a 310-token prompt scores 270, a 100-token one\n  100" in note
