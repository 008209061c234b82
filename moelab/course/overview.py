"""Exercises of notebook 00 (the map): the distinct-experts formula and which paper moves which term."""

from __future__ import annotations

from moelab.costmodel import expected_distinct_experts
from moelab.course.check import Feedback, check_callable, check_choice, check_number, exercise

NOTEBOOK = "00"
#: the notebook's default MoE layer for the exercises (Qwen3-30B-A3B's 128 experts, top-8) and a batch of 32
DEFAULTS = {"E": 128, "TOP_K": 8, "BATCH": 32}
#: the papers of the lab, by the name the map uses, and the decode-step term each one moves
PAPER_TERMS = {
    "ELDR": "MoE weight reads (distinct experts per step)",
    "BalanceRoute": "the slowest rank (DP barrier)",
    "AFD": "stage balance between attention and FFN",
    "DSD": "the round trip vs the drafting window",
    "HD": "target forwards per token",
}


def _expected_distinct(E: int, TOP_K: int, BATCH: int) -> float:
    return float(expected_distinct_experts(BATCH, E, TOP_K))


def check_distinct_experts(answer: object, *, E: int, TOP_K: int, BATCH: int) -> Feedback:
    """D for a random batch of BATCH tokens, each routed to TOP_K of E experts."""
    return check_number("D", answer, _expected_distinct(E, TOP_K, BATCH), rtol=0.01,
                        hint=f"D = E(1 - (1 - k/E)^B) with E = {E}, k = {TOP_K}, B = {BATCH}; "
                             "k·B counts an expert once per token that uses it, D counts it once.")


def check_paper_for_term(answer: object, **_: object) -> Feedback:
    """Which paper's method lowers the number of distinct experts a decode step reads.

    A wrong paper is told which term its method moves instead (the right paper is never named)."""
    named = {paper.lower(): paper for paper in PAPER_TERMS}
    chosen = named.get(str.lower(str.strip(answer))) if isinstance(answer, str) else None
    rule = ("D counts each expert once, however many of the batch's tokens use it, so D falls when the tokens of "
            "one batch use the same experts: which method chooses a batch's requests by the experts they use?")
    if chosen is not None and chosen != "ELDR":
        hint = f"{chosen}'s method moves {PAPER_TERMS[chosen]}, not D. {rule}"
    else:
        hint = f"read the table of what each method does. {rule}"
    return check_choice("paper", answer, "ELDR", tuple(PAPER_TERMS), hint=hint)


def check_distinct_function(answer: object, *, E: int, TOP_K: int, BATCH: int) -> Feedback:
    """A function distinct(E, k, B) returning the expected distinct experts of a random batch."""
    args = [(E, TOP_K, BATCH), (E, TOP_K, 1), (64, 2, 16), (256, 8, 256)]
    cases = [(a, float(expected_distinct_experts(a[2], a[0], a[1]))) for a in args]
    return check_callable("distinct", answer, cases, rtol=0.005,
                          hint="each expert is missed by one token with probability (1 - k/E); by all B tokens "
                               "with (1 - k/E)^B; D is E times the chance of NOT being missed.")


exercise(NOTEBOOK, "distinct_experts", "easy",
         "How many distinct experts (on average) does a random batch of BATCH tokens touch? Read it off the curve.",
         check_distinct_experts, solution=lambda **ctx: _expected_distinct(ctx["E"], ctx["TOP_K"], ctx["BATCH"]),
         wrong=lambda **ctx: float(min(ctx["E"], ctx["TOP_K"] * ctx["BATCH"])), context=DEFAULTS)
exercise(NOTEBOOK, "paper_for_term", "medium",
         "Which paper's method lowers the number of distinct experts a decode step must read?",
         check_paper_for_term, solution=lambda **ctx: "ELDR", wrong=lambda **ctx: "AFD", context=DEFAULTS)
exercise(NOTEBOOK, "distinct_function", "hard",
         "Implement distinct(E, k, B) = the expected distinct experts of B tokens routed to k of E experts.",
         check_distinct_function,
         solution=lambda **ctx: (lambda E, k, B: E * (1 - (1 - k / E) ** B)),
         wrong=lambda **ctx: (lambda E, k, B: min(E, k * B)), context=DEFAULTS)

__all__ = ["DEFAULTS", "PAPER_TERMS", "check_distinct_experts", "check_distinct_function", "check_paper_for_term"]
