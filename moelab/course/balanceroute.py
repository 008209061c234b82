"""Exercises of notebook 05 (BalanceRoute: data-parallel load balancing at the decode barrier), easy to hard.

Every expected answer is computed by :mod:`moelab.balanceroute.score` (the routers' own F-score) from the
context the notebook passes: its toy example in lower case (``loads``: the KV load of each DP rank,
``prompts``: the prompt tokens of the waiting requests, ``new_prompt``: one request's prompt tokens,
``rank``: the rank being filled), never typed in. BR-0's score is the library's ``f_score`` with horizon
0, ``a = 1`` and ``b = G`` (the number of ranks). Importing this module registers the exercises in
:data:`moelab.course.check.EXERCISES` under ``"05.<id>"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moelab.balanceroute.score import discounts, f_score
from moelab.course.check import Feedback, _describe, check_array, check_callable, check_number, exercise

NOTEBOOK = "05"
# the notebook's default toy example (its `parameters` cell); the tests call every checker with these
DEFAULTS: dict[str, object] = {"loads": (600.0, 900.0, 400.0, 700.0), "prompts": (100.0, 250.0, 400.0),
                               "new_prompt": 350.0, "rank": 0}


def br0_margins(loads: Sequence[float]) -> np.ndarray:
    """Each rank's margin to the envelope, ``m_g = M - L_g`` with ``M = max_g L_g``.

    Parameters
    ----------
    loads : sequence of float
        KV load ``L_g`` of each DP rank (tokens), >= 0.

    Returns
    -------
    numpy.ndarray
        ``m_g`` per rank.
    """
    arr = np.asarray(loads, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 1 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"loads must be a non-empty 1-D sequence of finite numbers >= 0; got {loads!r}")
    return arr.max() - arr


def br0_score(prompt_tokens: float, margin: float, n_ranks: int) -> float:
    """BR-0's score ``F_g(Q) = P_Q - G (P_Q - m_g)_+`` of a set with ``P_Q = prompt_tokens`` for a rank with
    margin ``margin``, computed by the routers' own :func:`moelab.balanceroute.score.f_score`
    (horizon 0, ``a = 1``, ``b = G = n_ranks``)."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1; got {n_ranks}")
    return float(f_score(float(prompt_tokens), np.array([float(margin)]), discounts(0, 1.0), 1.0, float(n_ranks)))


def br0_scores(loads: Sequence[float], prompt_tokens: float) -> np.ndarray:
    """BR-0's score of one set of ``prompt_tokens`` prompt tokens for every rank (``G = len(loads)``)."""
    margins = br0_margins(loads)
    return np.array([br0_score(prompt_tokens, m, margins.size) for m in margins])


def br0_best_request(loads: Sequence[float], prompts: Sequence[float], rank: int) -> int:
    """Index (into ``prompts``) of the single waiting request BR-0's first stage gives ``rank``: the one
    with the highest ``F_rank`` (ties to the first)."""
    margins = br0_margins(loads)
    if not 0 <= int(rank) < margins.size:
        raise ValueError(f"rank must be in [0, {margins.size - 1}]; got {rank}")
    scores = [br0_score(p, margins[int(rank)], margins.size) for p in prompts]
    return int(np.argmax(scores))


def brh_score(prompt_tokens: float, margins: Sequence[float], delta: float, eta: float, beta: float) -> float:
    """BR-H's horizon score ``sum_h delta^h [eta P_Q - beta (P_Q - m_{g,h})_+]`` for one rank, with
    ``margins = (m_{g,0}, ..., m_{g,H})``, discount ``delta`` (the paper's gamma / ``g``), reward weight
    ``eta`` (the paper's ``a``) and penalty weight ``beta`` (the paper's ``b``); computed by the routers'
    :func:`~moelab.balanceroute.score.f_score`."""
    m = np.asarray(margins, dtype=np.float64)
    return float(f_score(float(prompt_tokens), m, discounts(m.size - 1, float(delta)), float(eta), float(beta)))


def _check_per_rank(name: str, answer: object, expected: np.ndarray, hint: str) -> Feedback:
    """:func:`check_array` with a one-line "expected ..." message for an answer of the wrong shape or kind."""
    try:
        shape = np.shape(answer) if not isinstance(answer, (str, bytes, dict)) and answer is not None else None
    except Exception:  # a ragged list, an object whose __array__ or __len__ raises
        shape = None
    if shape != expected.shape:
        return Feedback(False, f"expected `{name}` as {expected.size} numbers, one per rank (shape {expected.shape}), "
                               f"got {_describe(answer)}. Hint: {hint}")
    return check_array(name, answer, expected, rtol=1e-6, atol=1e-6, hint=hint)


# 05.margins (easy) -----------------------------------------------------------------------------------
def loads_after(loads: Sequence[float], new_prompt: float, rank: int) -> np.ndarray:
    """The toy loads once a request of ``new_prompt`` tokens has joined rank ``rank`` (its KV grows by that much)."""
    out = np.asarray(loads, dtype=np.float64).copy()
    if not 0 <= int(rank) < out.size:
        raise ValueError(f"rank must be in [0, {out.size - 1}]; got {rank}")
    out[int(rank)] += float(new_prompt)
    return out


def check_margins(answer: object, *, loads: Sequence[float], new_prompt: float, rank: int, **_: object) -> Feedback:
    """``answer`` should be the margin ``m_g`` of every toy rank after the new request joined rank ``rank``."""
    return _check_per_rank("margins", answer, br0_margins(loads_after(loads, new_prompt, rank)),
                           hint=f"first add {float(new_prompt):g} tokens to rank {int(rank)}'s load; the envelope M is "
                                "then the LARGEST of the new loads (it may be that rank's), and m_g = M - L_g, so the "
                                "most loaded rank has margin 0.")


exercise(NOTEBOOK, "margins", "easy",
         "Compute the margin m_g of each toy rank, in rank order, after a request of TOY_NEW_PROMPT tokens has "
         "joined rank TOY_RANK.",
         check_margins,
         solution=lambda *, loads, new_prompt, rank, **_: br0_margins(loads_after(loads, new_prompt, rank)),
         # the margins before the request joined (read off the worked example's table)
         wrong=lambda *, loads, **_: br0_margins(loads),
         context=DEFAULTS)


# 05.br0_scores (medium) ------------------------------------------------------------------------------
def check_br0_scores(answer: object, *, loads: Sequence[float], new_prompt: float, **_: object) -> Feedback:
    """``answer`` should be BR-0's score of the one-request set ``{new_prompt}`` for every toy rank."""
    n = len(loads)
    return _check_per_rank("F", answer, br0_scores(loads, new_prompt),
                           hint=f"F_g = P_Q - G (P_Q - m_g)_+ with P_Q = {float(new_prompt):g} and G = {n} (the number of "
                            "ranks): the penalty applies only to the part of P_Q above the margin, and it is G "
                            "times that part, not once.")


exercise(NOTEBOOK, "br0_scores", "medium",
         "Score the one-request set {TOY_NEW_PROMPT} for every rank of the toy example with BR-0's F_g(Q).",
         check_br0_scores,
         solution=lambda *, loads, new_prompt, **_: br0_scores(loads, new_prompt),
         # penalty slope 1 instead of G: F = min(P_Q, m_g), which never goes negative
         wrong=lambda *, loads, new_prompt, **_: np.minimum(float(new_prompt), br0_margins(loads)),
         context=DEFAULTS)


# 05.br0_pick (medium) --------------------------------------------------------------------------------
def check_br0_pick(answer: object, *, loads: Sequence[float], prompts: Sequence[float], rank: int,
                   **_: object) -> Feedback:
    """``answer`` should be the index (into ``prompts``) of the request BR-0 gives ``rank``."""
    margins = br0_margins(loads)
    expected = br0_best_request(loads, prompts, rank)
    hint = (f"rank {int(rank)} has margin {margins[int(rank)]:g}; score every waiting request with "
            f"F = P_Q - G (P_Q - m)_+ and take the largest (the biggest request is not always best).")
    is_int = isinstance(answer, (int, np.integer)) and not isinstance(answer, (bool, np.bool_))
    if not is_int:
        return Feedback(False, f"expected an integer index into TOY_PROMPTS (0..{len(prompts) - 1}), got "
                               f"{_describe(answer)}. Hint: {hint}")
    if not 0 <= int(answer) < len(prompts):
        return Feedback(False, f"the index must be in 0..{len(prompts) - 1}, got {int(answer)}. Hint: {hint}")
    feedback = check_number("request index", int(answer), expected, rtol=0.0, atol=0.0, hint=hint)
    if feedback.ok:  # confirm without restating the scores: the executed book shows this line
        return Feedback(True, f"the request index is right: it scores best for rank {int(rank)} among the "
                              f"{len(prompts)} waiting requests.")
    return feedback


exercise(NOTEBOOK, "br0_pick", "medium",
         "BR-0's first stage gives rank TOY_RANK one waiting request. Which one (its index into TOY_PROMPTS)?",
         check_br0_pick,
         solution=lambda *, loads, prompts, rank, **_: br0_best_request(loads, prompts, rank),
         wrong=lambda *, prompts, **_: int(np.argmax(prompts)),  # the biggest request, past the envelope
         context=DEFAULTS)


# 05.brh_score (hard: implement the horizon form) ------------------------------------------------------
# (P_Q, margins over h = 0..H, delta, eta, beta) cases the student's function is run on: inside every margin,
# past the envelope now but not later (a request finishes), BR-0 as the special case H = 0, a long horizon
BRH_CASES: tuple[tuple[float, tuple[float, ...], float, float, float], ...] = (
    (100.0, (300.0, 300.0, 320.0), 0.86, 1.0, 43.0),
    (250.0, (200.0, 400.0, 600.0), 0.86, 1.0, 43.0),
    (250.0, (200.0,), 0.5, 1.0, 4.0),
    (500.0, tuple(float(100 + 50 * h) for h in range(9)), 0.7, 1.0, 8.0),
)


def check_brh_score(answer: object, **_: object) -> Feedback:
    """``answer`` should be a function ``f(ds, margins, delta, eta, beta)`` returning BR-H's score for one rank."""
    cases = [(args, brh_score(*args)) for args in BRH_CASES]
    return check_callable("brh_score", answer, cases, rtol=1e-6,
                          hint="weight step h by delta**h for h = 0..H (H + 1 = len(margins)); the reward is "
                               "eta * (sum of the weights) * ds and the penalty beta * sum_h delta**h * "
                               "max(ds - m_h, 0).")


def _wrong_brh_score(ds: float, margins: Sequence[float], delta: float, eta: float, beta: float) -> float:
    # forgets the discount: every future step weighs as much as the coming one
    return float(sum(eta * ds - beta * max(ds - m, 0.0) for m in margins))


exercise(NOTEBOOK, "brh_score", "hard",
         "Implement `brh_score(ds, margins, delta, eta, beta)`: BR-H's horizon score of a set with ds prompt tokens "
         "for one rank whose projected margins over h = 0..H are `margins`.",
         check_brh_score, solution=lambda **_: brh_score, wrong=lambda **_: _wrong_brh_score, context=DEFAULTS)

__all__ = ["BRH_CASES", "DEFAULTS", "br0_best_request", "br0_margins", "br0_score", "br0_scores", "brh_score",
           "check_br0_pick", "check_br0_scores", "check_brh_score", "check_margins", "loads_after"]
