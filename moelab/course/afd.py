"""Exercises of notebook 03 (AFD sizing): r_peak at twice the slots, the binding term, the load and r*.

Every expected answer is computed by :mod:`moelab.afd` from the context the notebook passes (its
parameters), so a student who changes a parameter is still checked against the right number.
"""

from __future__ import annotations

import numpy as np

from moelab.afd import AFDCoefficients, mean_token_load, optimal_ratio, ratio_terms
from moelab.course.check import (
    Feedback,
    check_callable,
    check_choice,
    check_number,
    exercise,
)

NOTEBOOK = "03"
#: the notebook's default workload (its parameters cell); the tests call every exercise with it
DEFAULTS = {"B": 256, "MU_P": 100.0, "MU_D": 500.0, "N": 10_000}
BINDING_OPTIONS = ("attention", "communication", "ffn_peak")


def _load_cases(B: int, MU_P: float, MU_D: float, N: float) -> list[tuple[tuple, float]]:
    """The notebook's workload plus short horizons, where the filling-up transient is a large share."""
    args = [(B, MU_P, MU_D, N), (B, MU_P, MU_D, 2 * B), (64, 50.0, 1000.0, 128), (128, 0.0, 200.0, 256)]
    return [(a, mean_token_load(*a)) for a in args]


def _r_star_cases(B: int, MU_P: float, MU_D: float, N: float) -> list[tuple[tuple, float]]:
    """The notebook's workload plus one set by the FFN peak (short decodes) and one by attention."""
    args = [(B, MU_P, MU_D, N), (256, 100.0, 100.0, 10_000), (128, 500.0, 500.0, 10_000), (512, 2000.0, 1000.0, 10_000)]
    return [(a, optimal_ratio(*a)) for a in args]


def _r_peak_doubled(B: int, MU_P: float, MU_D: float) -> float:
    """r_peak with twice the slots, 2B (the paper's coefficients). It depends on B alone, so the horizon is
    left infinite (a finite N must hold at least 2B requests)."""
    return ratio_terms(2 * B, MU_P, MU_D, None).r_peak


def check_r_peak(answer: object, *, B: int, MU_P: float, MU_D: float, N: float) -> Feedback:
    """r_peak = sqrt(b_F / (a_F B')) with twice the notebook's slots, B' = 2B (paper coefficients)."""
    before = ratio_terms(B, MU_P, MU_D, N).r_peak
    return check_number(
        "r_peak", answer, _r_peak_doubled(B, MU_P, MU_D), rtol=0.005,
        hint=f"r_peak = sqrt(b_F / (a_F B')), with a_F and b_F from the coefficients table of section 2 and "
             f"B' = 2B = {2 * B}.",
        slips=[(before, f"that is r_peak at B = {B}, this notebook's slots: double B first"),
               (before / 2, "r_peak does not halve when B doubles: B sits under a square root")])


def check_binding(answer: object, *, B: int, MU_P: float, MU_D: float, N: float) -> Feedback:
    """Which candidate sets r* when the mean decode length drops to a fifth (MU_D / 5)."""
    terms = ratio_terms(B, MU_P, MU_D / 5, N)
    return check_choice("binding", answer, terms.binding, BINDING_OPTIONS,
                        hint=f"compute r_A, r_C and r_peak at mu_D = {MU_D / 5:g}: r* is the largest of the three, "
                             "and the binding term is the one that equals r*.")


def check_token_load(answer: object, *, B: int, MU_P: float, MU_D: float, N: float) -> Feedback:
    """A function Tbar(B, mu_P, mu_D, N) for the horizon-average KV load of one attention instance."""
    return check_callable("token_load", answer, _load_cases(B, MU_P, MU_D, N), rtol=0.005,
                          hint="p = 1/(1+mu_D), n_steps = N/(B p), and the transient share is "
                               "(1-(1-p)^n_steps)/(p n_steps); B(mu_P+mu_D) alone is the infinite-horizon load.")


def check_r_star_function(answer: object, *, B: int, MU_P: float, MU_D: float, N: float) -> Feedback:
    """A function r_star(B, mu_P, mu_D, N) = max(r_A, r_C, r_peak) with the paper's coefficients."""
    return check_callable("r_star", answer, _r_star_cases(B, MU_P, MU_D, N), rtol=0.005,
                          hint="r* is the MAX of three candidates; with short decodes r_peak = sqrt(b_F/(a_F B)) "
                               "wins, and r_C uses t_C(B) = a_C B + b_C. Coefficients: AFDCoefficients.paper().")


def _solution_token_load(B: int, mu_P: float, mu_D: float, N: float) -> float:
    p = 1.0 / (1.0 + mu_D)
    n_steps = N / (B * p)
    transient = (1.0 - (1.0 - p) ** n_steps) / (p * n_steps)
    return B * (mu_P + mu_D * (1.0 - transient))


def _solution_r_star(B: int, mu_P: float, mu_D: float, N: float) -> float:
    c = AFDCoefficients.paper()
    t_A = c.a_A * _solution_token_load(B, mu_P, mu_D, N) + c.b_A
    t_C = c.a_C * B + c.b_C
    r_A = (t_A - c.b_F) / (c.a_F * B)
    r_C = (t_C - c.b_F) / (c.a_F * B)
    r_peak = float(np.sqrt(c.b_F / (c.a_F * B)))
    return max(r_A, r_C, r_peak)


def _wrong_r_star(B: int, mu_P: float, mu_D: float, N: float) -> float:
    """The typical slip: attention balance only, forgetting the FFN's own peak."""
    c = AFDCoefficients.paper()
    return (c.a_A * _solution_token_load(B, mu_P, mu_D, N) + c.b_A - c.b_F) / (c.a_F * B)


exercise(NOTEBOOK, "r_peak", "easy",
         "With twice this notebook's slots per attention instance (2B), what is r_peak? Compute it from the "
         "coefficients table.",
         check_r_peak, solution=lambda **ctx: _r_peak_doubled(ctx["B"], ctx["MU_P"], ctx["MU_D"]),
         # the typical slip: r_peak halved, as if it were inversely proportional to B
         wrong=lambda **ctx: ratio_terms(ctx["B"], ctx["MU_P"], ctx["MU_D"], ctx["N"]).r_peak / 2,
         context=DEFAULTS)
exercise(NOTEBOOK, "binding", "medium",
         "Divide the mean decode length by five. Which candidate sets r* now: 'attention', 'communication' "
         "or 'ffn_peak'?",
         check_binding, solution=lambda **ctx: ratio_terms(ctx["B"], ctx["MU_P"], ctx["MU_D"] / 5, ctx["N"]).binding,
         wrong=lambda **ctx: next(o for o in BINDING_OPTIONS
                                  if o != ratio_terms(ctx["B"], ctx["MU_P"], ctx["MU_D"] / 5, ctx["N"]).binding),
         context=DEFAULTS)
exercise(NOTEBOOK, "token_load", "hard",
         "Implement token_load(B, mu_P, mu_D, N), the horizon-average KV tokens of one attention instance.",
         check_token_load, solution=lambda **ctx: _solution_token_load,
         wrong=lambda **ctx: (lambda B, mu_P, mu_D, N: B * (mu_P + mu_D)), context=DEFAULTS)
exercise(NOTEBOOK, "r_star_function", "hard",
         "Implement r_star(B, mu_P, mu_D, N) from the four formulas of the mechanism section.",
         check_r_star_function, solution=lambda **ctx: _solution_r_star, wrong=lambda **ctx: _wrong_r_star,
         context=DEFAULTS)

__all__ = ["BINDING_OPTIONS", "DEFAULTS", "check_binding", "check_r_peak", "check_r_star_function",
           "check_token_load"]
