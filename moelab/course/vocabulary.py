"""The lab's vocabulary: every term a notebook uses without explaining it is defined once, in
``notebooks/NOTATION.md``, and linked there where a notebook first uses it.

* :data:`TERMS`: the terms issue 40 found undefined (suffix decoding, ``gate_prob`` / ``count_idf``, BF-IO, AFD's
  cycles, the SHA-256 block chain, the speculative-sampling rule, BR-0's plentiful/scarce slots) with the
  pattern that finds a use of each in a notebook's markdown;
* :func:`glossary_entries`: every bold entry of NOTATION's glossary (each is a term the lab defines);
* :func:`undefined_terms`: terms of :data:`TERMS` with no bold definition in NOTATION.md (goal: none);
* :func:`unlinked_first_uses`: per notebook, the terms whose first use in its markdown is not a link to
  NOTATION.md (the reader meets the word and has nowhere to click).

The test suite (``tests/test_course_vocabulary.py``) holds these to their goals; ``moelab bench notebooks``
reports ``glossary_terms_undefined``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from moelab.course.lessons import load_notebook, notebook_names
from moelab.notebooks import notebooks_dir

#: term (as NOTATION.md defines it, in bold) -> regex finding a use of it in a notebook's markdown
TERMS: dict[str, str] = {
    "Suffix decoding": r"suffix decoding",
    "count_idf / count / gate_prob": r"\bcount[_-]idf\b|\bgate_prob\b|\bgate probabilit",
    "BF-IO": r"\bBF-IO\b",
    "Cycles": r"\bcycles\b",
    "SHA-256 block chain": r"SHA-256",
    "Speculative-sampling rule": r"speculative-sampling rule|speculative sampling",
    "Plentiful / scarce slots": r"\bplentiful\b|\bscarce\b",
    "IDF": r"\bIDF\b|inverse document frequency",
    "TPOT": r"\bTPOT\b",
    "TTFT": r"\bTTFT\b",
    "JSQ": r"\bJSQ\b",
    "KV cache": r"\bKV cache\b",
    "MLA / GQA": r"\bMLA\b|\bGQA\b",
    "ARI": r"\bARI\b",
    "Spec-Bench": r"\bSpec-Bench\b",
    "PLD": r"(?-i:\bPLD\b)",
    "REST": r"(?-i:\bREST\b)",  # the capitalised name only: "the rest of" is not REST
    "Straggler": r"\bstragglers?\b",
    "Microbatch": r"\bmicrobatch(?:es)?\b",
    "WAN": r"\bWAN\b",
    "Early-exit draft": r"\bearly-exit draft\b",
    "Oracle": r"\boracle\b",
    "Hungarian matching": r"\bHungarian\b",
    "Coefficient of variation": r"\bcoefficients? of variation\b",
    "DeepEP": r"\bDeepEP\b",
    "bf16": r"\bbf16\b",
    "ShareGPT": r"\bShareGPT\b",
    "H200, H800": r"\bH800\b",
    "InfiniBand": r"\bInfiniBand\b",
    "Student-t interval": r"\bStudent[- ]t\b",
    "Least-squares slope": r"\bleast[- ]squares slopes?\b",
}

_BOLD_ENTRY = re.compile(r"^- \*\*([^*]+)\*\*", re.MULTILINE)
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]*)\)")
_HEADING = re.compile(r"^#{1,6} .*$", re.MULTILINE)
_HIDDEN = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$|`[^`\n]*`", re.DOTALL)


def notation_text() -> str:
    """NOTATION.md as committed."""
    return (notebooks_dir() / "NOTATION.md").read_text()


def glossary_entries(text: str | None = None) -> list[str]:
    """The bold names of NOTATION's glossary bullets (``- **Name** ...``), in order."""
    text = notation_text() if text is None else text
    glossary = text.split("## Glossary", 1)[1] if "## Glossary" in text else ""
    return _BOLD_ENTRY.findall(glossary)


def undefined_terms(text: str | None = None, terms: Mapping[str, str] = TERMS) -> list[str]:
    """Terms with no bold glossary entry of that name (case-insensitive) in NOTATION.md."""
    defined = {name.strip().lower() for name in glossary_entries(text)}
    return [term for term in terms if term.lower() not in defined]


def _markdown(nb: dict[str, Any]) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else str(c["source"])
            for c in nb.get("cells", []) if c.get("cell_type") == "markdown"]


def first_use(nb: dict[str, Any], pattern: str) -> tuple[int, str, bool] | None:
    """``(markdown cell index, the words around it, linked)`` of the first use of ``pattern`` in the notebook's
    markdown (its first cell, the title and prerequisites, included), or None when it is never used. ``linked``:
    the use is inside the text of a link to NOTATION.md."""
    # a space in a pattern matches any whitespace: a term the source breaks across lines is still the term
    rx = re.compile(pattern.replace(" ", r"\s+"), re.IGNORECASE)
    for i, text in enumerate(_markdown(nb)):
        # a use inside math, inline code or a heading cannot carry a link: look past it (same length, so offsets
        # hold); the first use in running text is the one to link
        m = rx.search(_HEADING.sub(lambda h: " " * len(h.group(0)), _HIDDEN.sub(lambda h: " " * len(h.group(0)), text)))
        if m is None:
            continue
        for link in _LINK.finditer(text):
            if link.start(1) <= m.start() < link.end(1) and "NOTATION.md" in link.group(2):
                return i, text[max(0, m.start() - 30):m.end() + 30], True
        return i, " ".join(text[max(0, m.start() - 30):m.end() + 30].split()), False
    return None


def unlinked_first_uses(names: list[str] | None = None, terms: Mapping[str, str] = TERMS) -> dict[str, list[str]]:
    """Per notebook, the terms whose first use in its markdown is not linked to NOTATION.md."""
    out: dict[str, list[str]] = {}
    for name in names or notebook_names():
        nb = load_notebook(name)
        missing = []
        for term, pattern in terms.items():
            use = first_use(nb, pattern)
            if use is not None and not use[2]:
                missing.append(f"{term} (cell {use[0]}: ...{use[1]}...)")
        out[name] = missing
    return out


__all__ = ["TERMS", "first_use", "glossary_entries", "notation_text", "undefined_terms", "unlinked_first_uses"]
