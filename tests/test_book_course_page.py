"""The course page (COURSE.md, rendered as the book's course page) keeps the lab's one meaning per symbol."""

from __future__ import annotations

import re
from pathlib import Path

COURSE = Path(__file__).resolve().parents[1] / "COURSE.md"
NOTATION = Path(__file__).resolve().parents[1] / "notebooks" / "NOTATION.md"


def test_course_page_writes_balanceroute_prompt_tokens_as_the_notation_does():
    """The notation page renames the BalanceRoute paper's prompt tokens s_i to P_i (P_Q for a set): s_j is ELDR's
    similarity. The instructor's notes once scored BR-0 as F_g = s - G (s - m_g)_+ (issue 40, student read)."""
    assert "prompt tokens are $P_i$" in NOTATION.read_text()  # the resolution this test holds the course page to
    scores = re.findall(r"F_g[^$]*", COURSE.read_text())
    assert any("P_Q" in score for score in scores), scores  # BR-0's score is written out on the page
    with_s = [score for score in scores if re.search(r"(?<![A-Za-z\\_])s(?![A-Za-z_])", score)]
    assert not with_s, with_s


def test_a_check_states_a_small_tolerance_as_a_percentage():
    """The book shows each check's output ('Correct: `D` is right (within ...)'): a tolerance below 1% read
    'rtol=0.005', numpy's parameter name, which no page defines (issue 40, second student read)."""
    from moelab.course.check import check_number

    assert "(within 0.5%)" in check_number("D", 3.0, 3.0, rtol=0.005).message
    assert "(within 0.1%)" in check_number("I", 3.0, 3.0, rtol=0.001).message
    assert "(within 2%)" in check_number("x", 3.0, 3.0).message
    wrong = check_number("D", 4.0, 3.0, rtol=0.005).message
    assert "rtol" not in wrong and "within 0.5%" in wrong and "3" not in wrong  # the expected 3.0 is never stated
