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
