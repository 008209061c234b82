"""Exercises of notebook 06 (from your deployment): read ELDR's reduction, compute a random batch's experts.

Every expected answer is computed by the library from the context the notebook passes: the distinct experts
per layer per step that each router produced in this run (``DISTINCT``), the captured model's geometry and
the decode batch of one server. The default context (used by the tests) is the tiny MoE's geometry with a
seeded random ``DISTINCT``, so no result is typed here.
"""

from __future__ import annotations

import numpy as np

from moelab.costmodel import expected_distinct_experts
from moelab.course.check import Feedback, check_number, exercise
from moelab.routers import router_names
from moelab.sim import gain_vs_best

NOTEBOOK = "06"


def random_distinct(seed: int) -> dict[str, float]:
    """A seeded stand-in for ``compare_routers(...)["distinct"]``: distinct experts per router."""
    names = (*router_names("eldr_paper"), "eldr")
    rng = np.random.default_rng([6, seed])
    return {name: float(v) for name, v in zip(names, rng.uniform(3.0, 7.0, size=len(names)))}


#: a tiny-MoE-sized geometry (E experts, top-k) with a seeded stand-in; the tests call every exercise with it
DEFAULTS = {"DISTINCT": random_distinct(0), "E": 32, "TOP_K": 2, "BATCH": 9}


def eldr_reduction(distinct: dict[str, float]) -> float:
    """ELDR's reduction (%) of distinct experts per step against the best of the other routers."""
    if not isinstance(distinct, dict) or "eldr" not in distinct or len(distinct) < 2:
        raise ValueError(f"distinct must map 'eldr' and at least one other router to a number; got {distinct!r}")
    res = {name: {"distinct": float(v)} for name, v in distinct.items()}
    return gain_vs_best(res, "eldr", [n for n in distinct if n != "eldr"], metric="distinct")[0]


def check_eldr_reduction(answer: object, *, DISTINCT: dict, **_: object) -> Feedback:
    """ELDR's reduction (%) of distinct experts per layer per step against the best load balancer."""
    return check_number("eldr_reduction_pct", answer, eldr_reduction(DISTINCT), atol=0.05,
                        hint="take the router with the FEWEST distinct experts other than ELDR (the best "
                             "baseline), then 100 (1 - eldr / best); positive means ELDR loads fewer experts.")


def check_distinct_random(answer: object, *, E: int, TOP_K: int, BATCH: int, **_: object) -> Feedback:
    """Distinct experts per layer that one decode step of BATCH requests loads under random routing."""
    return check_number("D", answer, float(expected_distinct_experts(BATCH, E, TOP_K)), rtol=0.005,
                        hint=f"D = E (1 - (1 - k/E)^B) with E = {E}, k = {TOP_K}, B = {BATCH}: each expert is "
                             "missed by one token with probability 1 - k/E, and by all B tokens with its B-th power.")


exercise(NOTEBOOK, "eldr_reduction", "easy",
         "Read ELDR's reduction (%) of distinct experts per step against the best load balancer.",
         check_eldr_reduction, solution=lambda **ctx: eldr_reduction(ctx["DISTINCT"]),
         # the sign slip: "fewer" written as a negative change
         wrong=lambda **ctx: -eldr_reduction(ctx["DISTINCT"]) - 1.0, context=DEFAULTS)
exercise(NOTEBOOK, "distinct_random", "medium",
         "How many distinct experts per layer does one decode step of BATCH randomly routed requests load?",
         check_distinct_random,
         solution=lambda **ctx: float(expected_distinct_experts(ctx["BATCH"], ctx["E"], ctx["TOP_K"])),
         wrong=lambda **ctx: float(ctx["TOP_K"] * ctx["BATCH"]), context=DEFAULTS)

__all__ = ["DEFAULTS", "check_distinct_random", "check_eldr_reduction", "eldr_reduction", "random_distinct"]
