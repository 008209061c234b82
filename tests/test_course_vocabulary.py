"""The lab's vocabulary (issue 40): every term of moelab.course.vocabulary.TERMS (the jargon issue 40 found
undefined, and the glossary's abbreviations) has an entry in NOTATION.md's glossary; NOTATION defines IDF once,
as the notebooks compute it; and the first use of a term in a notebook links to NOTATION.md."""

from __future__ import annotations

import re

import pytest

from moelab.course.lessons import notebook_names
from moelab.course.vocabulary import (
    TERMS,
    first_use,
    glossary_entries,
    notation_text,
    undefined_terms,
    unlinked_first_uses,
)

# first uses not yet linked, per notebook: may only shrink (lower it when you link a term, never raise it)
UNLINKED_BASELINE: dict[str, int] = {}


def test_every_term_is_defined_in_the_glossary():
    assert undefined_terms() == [], "define these in notebooks/NOTATION.md's glossary (a bold bullet each)"
    entries = {e.lower() for e in glossary_entries()}
    assert len(entries) == len(glossary_entries()), "a glossary entry is defined twice"


def test_one_idf_definition_and_it_is_the_one_the_notebooks_compute():
    text = notation_text()
    assert r"\log\frac{N+1}{\mathrm{df}_e+1}" in text
    assert not re.search(r"\\log\s*\(?\s*N\s*/\s*n", text), "NOTATION still defines the unsmoothed IDF"
    assert len(re.findall(r"\*\*IDF\*\*", text)) == 1


@pytest.mark.parametrize("name", notebook_names())
def test_first_use_of_every_term_links_to_the_glossary(name):
    unlinked = unlinked_first_uses([name])[name]
    allowed = UNLINKED_BASELINE.get(name, 0)
    assert len(unlinked) <= allowed, f"{name}: link these first uses to NOTATION.md#glossary: {unlinked}"


def test_first_use_finder():
    nb = {"cells": [{"cell_type": "markdown", "source": "math $\\mathrm{TPOT}$ and `TPOT` first"},
                    {"cell_type": "markdown", "source": "then [TPOT](NOTATION.md#glossary) linked, TPOT again"}]}
    assert first_use(nb, TERMS["TPOT"])[0] == 1 and first_use(nb, TERMS["TPOT"])[2] is True
    plain = {"cells": [{"cell_type": "markdown", "source": "the rest of it, then REST the drafter"}]}
    assert "REST the" in first_use(plain, TERMS["REST"])[1] and first_use(plain, TERMS["REST"])[2] is False


def test_a_term_broken_across_lines_is_still_found():
    # the source wraps lines: "speculative-sampling\nrule" is the term, unlinked
    nb = {"cells": [{"cell_type": "markdown", "source": "a lossless speculative-sampling\nrule replaces greedy"}]}
    use = first_use(nb, TERMS["Speculative-sampling rule"])
    assert use is not None and use[0] == 0 and use[2] is False
