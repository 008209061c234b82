"""Does a Lookahead (Jacobi) window pay for W on this machine? The decision, from the measured verify cost.

The paper fills W also with n-grams that a Lookahead/Jacobi window produces: ``n`` extra guessed positions
verified in the same forward as the draft, whose outputs become n-grams for later steps. Those positions
cost verification time now and can only pay back later, through extra accepted tokens. With ``c(q)`` the
measured time of one target forward over ``q`` tokens (:class:`moelab.costmodel.verify.VerifyCost`), a best draft
of ``K`` tokens with ``E`` expected tokens per step (accepted + bonus), and ``g`` the extra accepted tokens
per step that each window token brings, the window pays iff

    (E + g * n) / c(K + 1 + n)  >  E / c(K + 1)

i.e. iff ``g`` exceeds the break-even ``g* = E * (c(K + 1 + n) - c(K + 1)) / (n * c(K + 1))``.

What ``g`` is: no Jacobi window runs in this project's engines, so ``g`` is not measured here. The default
(:func:`lookahead_gain_bound`) is an upper bound from Lookahead's published Spec-Bench result (Vicuna-7B,
mean accepted tokens 1.64, ``data/public/published-tables``): all of its gain over one token per forward
(0.64) credited to its window alone, spread over the smallest window it would use (7 positions x 4 levels =
28 tokens): ``g <= 0.64 / 28 = 0.023`` extra tokens per window token per step. A real ``g`` is lower (part of
that gain comes from the verification branch and from the prompt's n-grams).

On this CPU (HF transformers, SmolLM2-135M, 1 thread; the cached curve is ``c(q) ~ 162 + 39.4 (q - 1)`` ms),
the break-even is ``g* ~ 0.175`` at the cost-aware draft (K = 3, E = 1.25): 7.7 times the bound, so the
window never pays and the HF engine keeps W to the prompt and the accepted tokens
(:func:`hf_lookahead_enabled` says no; :func:`moelab.hd.decode.generate` does not run a Jacobi window).
vLLM's CPU curve is nearly flat (``c(9) / c(1) ~ 1.04``), where the bound would allow a window, but vLLM's
``custom_class`` drafter proposes one chain and cannot add guessed positions to the verified batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moelab._validate import check_instance, check_int, check_real
from moelab.costmodel.verify import VerifyCost
from moelab.hd.policy import MAX_BUDGET

PUBLISHED_LOOKAHEAD_MAT = 1.64  # Spec-Bench leaderboard, Vicuna-7B v1.3 (A100 and RTX3090 rows agree)
MIN_LOOKAHEAD_WINDOW_TOKENS = 28  # 7 window positions x (5 - 1) levels


def lookahead_gain_bound(mat: float = PUBLISHED_LOOKAHEAD_MAT, window_tokens: int = MIN_LOOKAHEAD_WINDOW_TOKENS) -> float:
    """Upper bound on the extra accepted tokens per step per window token: a Lookahead run's whole gain over
    autoregressive decoding (``mat - 1``) credited to its ``window_tokens`` window positions."""
    check_real("mat", mat, low=1.0)
    check_int("window_tokens", window_tokens, low=1)
    return (float(mat) - 1.0) / window_tokens


@dataclass(frozen=True)
class JacobiDecision:
    """Whether appending ``window`` Jacobi tokens to a ``draft_tokens``-token draft pays (see module docstring)."""

    window: int
    draft_tokens: int
    expected_tokens: float
    gain_per_token: float
    break_even_gain: float  # g*: the gain per window token at which the window breaks even
    tokens_per_ms_without: float
    tokens_per_ms_with: float

    @property
    def pays(self) -> bool:
        return self.tokens_per_ms_with > self.tokens_per_ms_without

    def as_dict(self) -> dict[str, Any]:
        return {"window": self.window, "draft_tokens": self.draft_tokens, "expected_tokens": self.expected_tokens,
                "gain_per_token": self.gain_per_token, "break_even_gain": self.break_even_gain,
                "tokens_per_ms_without": self.tokens_per_ms_without, "tokens_per_ms_with": self.tokens_per_ms_with,
                "pays": self.pays}


def jacobi_window_decision(cost: VerifyCost, *, window: int, draft_tokens: int, expected_tokens: float,
                           gain_per_token: float | None = None) -> JacobiDecision:
    """Would a Jacobi window of ``window`` tokens appended to the verified draft pay?

    Parameters
    ----------
    cost : VerifyCost
        The target's measured verify-cost curve on this machine.
    window : int
        Jacobi-window tokens added to the forward (1..64).
    draft_tokens : int
        Draft tokens of the best draft without the window (``K``, 0..64).
    expected_tokens : float
        Tokens per step of that draft (accepted + bonus; a measured mean accepted tokens, >= 1).
    gain_per_token : float, optional
        Extra accepted tokens per step per window token (``g``); default :func:`lookahead_gain_bound`.
    """
    check_instance("cost", cost, VerifyCost, "a VerifyCost (e.g. moelab.costmodel.fit_verify_cost(qs, ms))")
    window = check_int("window", window, low=1, high=MAX_BUDGET)
    draft_tokens = check_int("draft_tokens", draft_tokens, low=0, high=MAX_BUDGET)
    e = check_real("expected_tokens", expected_tokens, low=1.0)
    g = lookahead_gain_bound() if gain_per_token is None else check_real("gain_per_token", gain_per_token, low=0.0)
    c0 = float(cost(draft_tokens + 1))
    c1 = float(cost(draft_tokens + 1 + window))
    return JacobiDecision(window, draft_tokens, float(e), float(g), e * (c1 - c0) / (window * c0), e / c0,
                          (e + g * window) / c1)


def best_jacobi_window(cost: VerifyCost, *, draft_tokens: int, expected_tokens: float,
                       gain_per_token: float | None = None, windows=(4, 8, 16, 28)) -> list[JacobiDecision]:
    """:func:`jacobi_window_decision` for each window size (the report behind :func:`hf_lookahead_enabled`)."""
    return [jacobi_window_decision(cost, window=w, draft_tokens=draft_tokens, expected_tokens=expected_tokens,
                                   gain_per_token=gain_per_token) for w in windows]


def hf_lookahead_enabled(cost: VerifyCost, *, draft_tokens: int, expected_tokens: float,
                         gain_per_token: float | None = None) -> bool:
    """True iff some window size pays: the condition under which W would collect Lookahead n-grams. The HF
    engine has no Jacobi pool; where this is True it says so instead of running one (see the module docstring)."""
    return any(d.pays for d in best_jacobi_window(cost, draft_tokens=draft_tokens, expected_tokens=expected_tokens,
                                                  gain_per_token=gain_per_token))


__all__ = ["MIN_LOOKAHEAD_WINDOW_TOKENS", "PUBLISHED_LOOKAHEAD_MAT", "JacobiDecision", "best_jacobi_window",
           "hf_lookahead_enabled", "jacobi_window_decision", "lookahead_gain_bound"]
