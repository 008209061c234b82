"""Exercises of notebook 07 (cross-paper: ELDR picks the instance, BalanceRoute picks the rank).

Every expected answer is computed by the library from the context the notebook passes: the pair grid's
p50 TPOT and distinct experts per layer per step per pair (``TPOT``, ``DISTINCT``, from this run), the model's
expert geometry, the cluster shape and the exercise's rank loads (``EX_LOADS``). The default context (used by the tests) is the notebook's shape with a
seeded random pair grid, so no result is typed here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moelab.costmodel import expected_distinct_experts
from moelab.course.check import Feedback, check_callable, check_number, exercise
from moelab.cross import INSTANCE_ROUTERS, RANK_ROUTERS, gains
from moelab.sim.metrics import imbalance

NOTEBOOK = "07"
PAIRS = tuple(f"{i} x {r}" for i in INSTANCE_ROUTERS for r in RANK_ROUTERS)


def random_tpot(seed: int) -> dict[str, float]:
    """A seeded random p50 TPOT (ms) per pair: a stand-in grid for the tests and the checkers' extra cases."""
    rng = np.random.default_rng([7, seed])
    return {pair: float(v) for pair, v in zip(PAIRS, rng.uniform(20.0, 40.0, size=len(PAIRS)))}


def tpot_grid(tpot: dict[str, float]) -> pd.DataFrame:
    """``{pair: p50 TPOT}`` as the frame :func:`moelab.cross.gains` reads."""
    rows = []
    for pair, value in tpot.items():
        instance, rank = pair.split(" x ")
        rows.append({"instance_router": instance, "rank_router": rank, "tpot_ms_p50": float(value)})
    return pd.DataFrame(rows)


def random_distinct(seed: int) -> dict[str, float]:
    """Seeded random distinct experts per layer per step, per pair: the stand-in beside :func:`random_tpot`."""
    rng = np.random.default_rng([17, seed])
    return {pair: float(v) for pair, v in zip(PAIRS, rng.uniform(20.0, 60.0, size=len(PAIRS)))}


#: the notebook's default shape (its parameters cell) with a seeded stand-in grid; the tests use it
DEFAULTS = {"TPOT": random_tpot(0), "DISTINCT": random_distinct(0), "E": 128, "TOP_K": 8, "G": 4, "SLOTS": 16,
            "LOADS": [2500.0, 1500.0, 2600.0, 1400.0]}


def _valid_pairs(name: str, values: object) -> dict[str, float]:
    if not isinstance(values, dict) or not set(PAIRS) <= set(values):
        raise ValueError(f"{name} must be a dict with the pairs {PAIRS}; got {values!r}")
    return {p: float(values[p]) for p in PAIRS}


def _expert_cut(distinct: dict) -> float:
    return 100.0 * (1.0 - distinct["eldr x jsq"] / distinct["jsq x jsq"])


def check_expert_cut(answer: object, *, DISTINCT: dict, TPOT: dict, **_: object) -> Feedback:
    """How much (%) ELDR x JSQ cuts the distinct experts per layer per step against JSQ x JSQ."""
    distinct = _valid_pairs("DISTINCT", DISTINCT)
    ratio = 100.0 * distinct["eldr x jsq"] / distinct["jsq x jsq"]
    tpot_gain = gains(tpot_grid(_valid_pairs("TPOT", TPOT)))["eldr_only_gain_pct"]
    return check_number(
        "expert_cut_pct", answer, _expert_cut(distinct), atol=0.1,
        hint="rows `eldr x jsq` and `jsq x jsq` of the headline table, column `distinct_per_layer_step`: "
             "100 (1 - D[eldr x jsq] / D[jsq x jsq]).",
        slips=[(ratio, "that is ELDR's distinct experts as a share of JSQ's; the cut is what is saved"),
               (tpot_gain, "that is ELDR's p50 TPOT gain, the result; the question asks for the lever it pulls, "
                           "the distinct experts")])


def check_distinct_experts(answer: object, *, E: int, TOP_K: int, G: int, SLOTS: int, **_: object) -> Feedback:
    """Distinct experts one MoE layer loads when the instance's G * SLOTS tokens are routed at random."""
    expected = float(expected_distinct_experts(G * SLOTS, E, TOP_K))
    return check_number("D", answer, expected, rtol=0.005,
                        hint=f"B = G * SLOTS = {G * SLOTS} tokens share one instance's experts; use "
                             "D = E (1 - (1 - k/E)^B): tokens overlap, so D is far below k B and never above E.")


def check_imbalance(answer: object, *, LOADS: list, **_: object) -> Feedback:
    """The barrier's idle work I = G max_g L_g - sum_g L_g for the exercise's rank loads (``EX_LOADS``)."""
    expected = float(imbalance(np.asarray(LOADS, dtype=float)))
    return check_number("I", answer, expected, rtol=0.001,
                        hint="every rank waits for the most loaded one: I sums each rank's margin M - L_g "
                             "with M = max_g L_g (not max - min).")


def _interaction_cases(TPOT: dict) -> list[tuple[tuple, float]]:
    grids = [_valid_pairs("TPOT", TPOT)] + [random_tpot(s) for s in (1, 2, 3, 4)]
    out = []
    for grid in grids:
        g = gains(tpot_grid(grid))
        out.append(((grid,), g["both_gain_pct"] - g["additive_gain_pct"]))
    return out


def check_interaction(answer: object, *, TPOT: dict, **_: object) -> Feedback:
    """A function interaction(tpot) = both - (eldr_only + br_only), in percentage points."""
    return check_callable("interaction", answer, _interaction_cases(TPOT), rtol=0.001,
                          hint="gain of a pair = 100 (1 - tpot[pair] / tpot['jsq x jsq']); br_only is the BETTER "
                               "of 'jsq x br0' and 'jsq x brh', both the better of 'eldr x br0' and 'eldr x brh'.")


def _gain(tpot: dict, pair: str) -> float:
    return 100.0 * (1.0 - tpot[pair] / tpot["jsq x jsq"])


def _solution_interaction(tpot: dict) -> float:
    eldr_only = _gain(tpot, "eldr x jsq")
    br_only = max(_gain(tpot, "jsq x br0"), _gain(tpot, "jsq x brh"))
    both = max(_gain(tpot, "eldr x br0"), _gain(tpot, "eldr x brh"))
    return both - (eldr_only + br_only)


def _wrong_interaction(tpot: dict) -> float:
    """The typical slip: BR-0 only, forgetting that each side takes the better BalanceRoute variant."""
    return _gain(tpot, "eldr x br0") - (_gain(tpot, "eldr x jsq") + _gain(tpot, "jsq x br0"))


exercise(NOTEBOOK, "expert_cut", "easy",
         "By how much (%) does ELDR x JSQ cut the distinct experts per layer per step against JSQ x JSQ? Compute it "
         "from the headline table.",
         check_expert_cut, solution=lambda **ctx: _expert_cut(ctx["DISTINCT"]),
         # the typical slip: the ratio, not the cut
         wrong=lambda **ctx: 100.0 * ctx["DISTINCT"]["eldr x jsq"] / ctx["DISTINCT"]["jsq x jsq"], context=DEFAULTS)
exercise(NOTEBOOK, "distinct_experts", "medium",
         "How many distinct experts does one MoE layer load per step when an instance's G * SLOTS tokens are "
         "routed at random?",
         check_distinct_experts,
         solution=lambda **ctx: float(expected_distinct_experts(ctx["G"] * ctx["SLOTS"], ctx["E"], ctx["TOP_K"])),
         wrong=lambda **ctx: float(ctx["TOP_K"] * ctx["G"] * ctx["SLOTS"]), context=DEFAULTS)
exercise(NOTEBOOK, "imbalance", "medium",
         "Compute the barrier's idle work I for the rank loads EX_LOADS.",
         check_imbalance, solution=lambda **ctx: float(imbalance(np.asarray(ctx["LOADS"], dtype=float))),
         wrong=lambda **ctx: float(max(ctx["LOADS"]) - min(ctx["LOADS"])), context=DEFAULTS)
exercise(NOTEBOOK, "interaction", "hard",
         "Implement interaction(tpot): the best ELDR x BR pair's gain minus the sum of the two gains alone.",
         check_interaction, solution=lambda **ctx: _solution_interaction, wrong=lambda **ctx: _wrong_interaction,
         context=DEFAULTS)

__all__ = ["DEFAULTS", "PAIRS", "check_distinct_experts", "check_expert_cut", "check_imbalance", "check_interaction",
           "random_distinct", "random_tpot", "tpot_grid"]
