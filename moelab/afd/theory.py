"""Closed-form sizing of an rA-1F Attention/FFN-disaggregated bundle (Lyu et al., arXiv 2601.21351).

r attention instances run B request slots each per microbatch (an instance holds one such group per
microbatch in flight); one FFN instance serves a microbatch's aggregated r*B tokens.
Stage latencies are linear: ``t_A(T) = a_A*T + b_A`` (T = KV tokens one instance attends over in a step: its B slots of one microbatch),
``t_F(rB) = a_F*r*B + b_F`` and ``t_C(B) = a_C*B + b_C``; with pipelined microbatches the cycle time
is the slowest stage, ``t_cyc = max(t_A, t_C, t_F)`` (the paper's tau; ``notebooks/NOTATION.md`` names it
t_cyc), and every cycle emits r*B tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moelab._validate import check_array, check_finite_array, check_int, check_real
from moelab.afd.coefficients import AFDCoefficients
from moelab.afd.coefficients import check_coefficients as _coeffs

# Requests each attention instance serves when the caller does not say (the paper's finite horizon).
DEFAULT_REQUESTS = 10_000
#: the longest mean prompt or decode length (tokens) the closed form takes: far beyond any context window, and
#: below the point where its products (B x mu x N) overflow a float
MAX_MEAN_TOKENS = 1e9


def _workload(B: int, mu_P: float, mu_D: float, N: float | None) -> tuple[int, float, float, float | None]:
    B = check_int("B", B, low=1)
    mu_P = check_real("mu_P", mu_P, low=0, high=MAX_MEAN_TOKENS)
    mu_D = check_real("mu_D", mu_D, low=0, high=MAX_MEAN_TOKENS)
    if N is not None:
        # a horizon shorter than one fill of the B slots has no steady part: the load formula needs N >= B
        N = check_real("N", N, low=B)
    return B, mu_P, mu_D, N


def termination_prob(mu_D: float) -> float:
    """Per-step termination probability p of a geometric decode length with mean ``mu_D=(1-p)/p``."""
    mu_D = check_real("mu_D", mu_D, low=0, high=MAX_MEAN_TOKENS)
    return 1.0 / (1.0 + mu_D)


def horizon_steps(B: int, mu_D: float, N: float) -> float:
    """Decode steps ``K = N/(B p)`` in which B slots serve N requests on average."""
    if N is None:
        raise ValueError("N must be a real number >= B (requests per attention instance and microbatch); got None")
    B, _, mu_D, N = _workload(B, 0.0, mu_D, N)
    return N / (B * termination_prob(mu_D))


def expected_decode_load(k: np.ndarray | int, B: int, mu_D: float) -> np.ndarray:
    """``E[D_k] = B*mu_D*(1-(1-p)^k)``: decode tokens held by B slots after k steps from empty."""
    k = check_array("k", k, low=0).astype(np.float64)
    B, _, mu_D, _ = _workload(B, 0.0, mu_D, None)
    p = termination_prob(mu_D)
    return B * mu_D * -np.expm1(k * np.log1p(-p)) if p < 1 else np.full_like(k, B * mu_D)


def mean_token_load(B: int, mu_P: float, mu_D: float, N: float | None = None) -> float:
    """Horizon-average KV tokens of one attention instance's B slots (one microbatch), ``Tbar``.

    ``Tbar = B*[mu_P + mu_D*(1 - (1-(1-p)^K)/(p K))]`` over ``K = N/(B p)`` steps; ``B*(mu_P+mu_D)``
    when ``N is None`` (infinite horizon).
    """
    B, mu_P, mu_D, N = _workload(B, mu_P, mu_D, N)
    p = termination_prob(mu_D)
    if N is None or p >= 1.0:  # p rounds to 1 for vanishing mu_D: no decode load builds up
        return B * (mu_P + mu_D)
    K = N / (B * p)
    transient = -np.expm1(K * np.log1p(-p)) / (p * K)  # (1-(1-p)^K)/(pK): share of the horizon still filling up
    return float(B * (mu_P + mu_D * (1.0 - transient)))


@dataclass(frozen=True)
class RatioTerms:
    """The three candidates of ``r* = max(r_A, r_C, r_peak)`` and the attention and communication stage
    times behind them (what :func:`ratio_terms` returns; :attr:`binding` names the candidate that sets r*,
    :attr:`r_star` its value; the repr shows both). The FFN time ``t_F(rB) = a_F r B + b_F`` depends on r,
    so it is no single number here: compute it from ``coeffs`` at the r of interest.

    Times are in the coefficients' unit (``coeffs.unit``: ms for a fit to measured tables, cycles for
    the paper's fit); the ratios are dimensionless (attention instances per FFN instance) and may be
    negative, meaning that stage never binds.

    Attributes
    ----------
    r_A : float
        The attention term ``(t_A - b_F) / (a_F B)``: the r at which the FFN time ``t_F(rB)`` reaches the
        attention time; below it attention is the bottleneck. Grows with the mean lengths and N (through
        ``token_load``).
    r_C : float
        The communication term ``(t_C - b_F) / (a_F B)``: the r at which ``t_F`` reaches the A<->F
        transfer time.
    r_peak : float
        The FFN-peak term ``sqrt(b_F / (a_F B))``: once the FFN is the bottleneck, per-instance throughput
        ``rB / ((r+1)(a_F r B + b_F))`` peaks here. It depends on B and the FFN coefficients only, not on
        the lengths or N.
    t_A : float
        Mean attention stage time at the horizon-average load, ``a_A * token_load + b_A``.
    t_C : float
        One A<->F transfer of B tokens, ``a_C * B + b_C``.
    token_load : float
        Horizon-average KV tokens per attention instance, ``Tbar`` (:func:`mean_token_load`).
    """

    r_A: float
    r_C: float
    r_peak: float
    t_A: float
    t_C: float
    token_load: float

    @property
    def r_star(self) -> float:
        """``max(r_A, r_C, r_peak)``, what :func:`optimal_ratio` returns."""
        return max(self.r_A, self.r_C, self.r_peak)

    @property
    def binding(self) -> str:
        """Which candidate sets r*: ``"attention"``, ``"communication"`` or ``"ffn_peak"``."""
        return ("attention", "communication", "ffn_peak")[int(np.argmax([self.r_A, self.r_C, self.r_peak]))]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("r_A", "r_C", "r_peak", "t_A", "t_C", "token_load"))
        return f"RatioTerms(binding={self.binding!r}, r_star={self.r_star!r}, {fields})"


def ratio_terms(B: int, mu_P: float, mu_D: float, N: float | None = None,
                coeffs: AFDCoefficients | None = None) -> RatioTerms:
    """The three candidates of r*: ``r_A = (a_A*Tbar + b_A - b_F)/(a_F B)``, ``r_C = (t_C - b_F)/(a_F B)``
    and ``r_peak = sqrt(b_F/(a_F B))`` (see :func:`optimal_ratio`), to see which one binds.

    Parameters
    ----------
    B : int
        Request slots per attention instance and microbatch (>= 1).
    mu_P, mu_D : float
        Mean prompt length and mean (geometric) decode length in tokens (0..:data:`MAX_MEAN_TOKENS`).
    N : float, optional
        Requests served per attention instance and microbatch, by its ``B`` slots (the finite horizon, >= B); ``None`` means N -> inf.
    coeffs : AFDCoefficients, optional
        Stage-latency coefficients; the paper's Ascend fit by default.

    Returns
    -------
    RatioTerms
        ``r_A``, ``r_C``, ``r_peak``, the stage times behind them, ``r_star`` (their maximum) and
        ``binding`` (``"attention"``, ``"communication"`` or ``"ffn_peak"``).

    Examples
    --------
    >>> t = ratio_terms(256, 100, 500)
    >>> t.binding in ("attention", "communication", "ffn_peak")
    True
    """
    c = _coeffs(coeffs)
    B, mu_P, mu_D, N = _workload(B, mu_P, mu_D, N)
    load = mean_token_load(B, mu_P, mu_D, N)
    t_A = c.a_A * load + c.b_A
    t_C = c.a_C * B + c.b_C
    scale = c.a_F * B
    return RatioTerms((t_A - c.b_F) / scale, (t_C - c.b_F) / scale, float(np.sqrt(c.b_F / scale)), t_A, t_C, load)


def optimal_ratio(B: int, mu_P: float, mu_D: float, N: float | None = None,
                  coeffs: AFDCoefficients | None = None) -> float:
    """The throughput-optimal number of attention instances per FFN instance, ``r*``.

    Parameters
    ----------
    B : int
        Request slots per attention instance and microbatch (>= 1).
    mu_P, mu_D : float
        Mean prompt length and mean (geometric) decode length in tokens (>= 0).
    N : float, optional
        Requests served per attention instance and microbatch, by its ``B`` slots (the finite horizon, >= B); ``None`` means N -> inf.
    coeffs : AFDCoefficients, optional
        Stage-latency coefficients; the paper's Ascend fit by default.

    Returns
    -------
    float
        ``r* = max(r_A, r_C, r_peak)``: below r_A attention is the bottleneck, and adding attention
        instances past r_peak lowers per-instance throughput once the FFN is the bottleneck.

    Notes
    -----
    Which term binds depends on the coefficients. With the coefficients fitted to the H200 tables
    (:func:`coefficients_from_tables`), r* is often the FFN-peak term ``r_peak = sqrt(b_F/(a_F B))``,
    which depends on B alone: r* then does not move with ``mu_P``, ``mu_D`` or ``N`` (the attention
    term ``r_A`` takes over only for long contexts, thousands of tokens per request). :func:`ratio_terms`
    shows all three terms and which one binds (``.binding``).
    """
    return ratio_terms(B, mu_P, mu_D, N, coeffs).r_star


def attention_takeover_load(B: int, coeffs: AFDCoefficients | None = None) -> float:
    """The horizon-average KV load per attention instance above which attention balance sets r*.

    ``r_A = (a_A Tbar + b_A - b_F) / (a_F B)`` grows with the load ``Tbar`` while ``r_C`` and ``r_peak`` do
    not depend on it, so attention binds exactly when ``Tbar`` exceeds
    ``(b_F - b_A + a_F B max(r_C, r_peak)) / a_A``: the load whose attention step outlasts the FFN's fixed
    cost by what the FFN-side optimum already asks of it. Compare it with :func:`mean_token_load` (or
    ``ratio_terms(...).token_load``) to read the regime of a workload without computing r*.

    Parameters
    ----------
    B : int
        Request slots per attention instance and microbatch (>= 1).
    coeffs : AFDCoefficients, optional
        Stage-latency coefficients; the paper's Ascend fit by default.

    Returns
    -------
    float
        KV tokens per attention instance (``inf`` when ``a_A`` is 0: attention never binds); at most 0 when
        attention binds at any load.

    Examples
    --------
    >>> t = ratio_terms(256, 100, 500)
    >>> (t.token_load > attention_takeover_load(256)) == (t.binding == "attention")
    True
    """
    c = _coeffs(coeffs)
    B = check_int("B", B, low=1)
    scale = c.a_F * B
    other = max((c.a_C * B + c.b_C - c.b_F) / scale, float(np.sqrt(c.b_F / scale)))
    if c.a_A == 0:
        return float("inf")
    return float((c.b_F - c.b_A + scale * other) / c.a_A)


def ratio_summary(B: int, mu_P: float, mu_D: float, N: float | None = None,
                  coeffs: AFDCoefficients | None = None) -> dict:
    """One workload's r* with everything that decides it, as one table row: to set two r* side by side and
    see why they differ (another workload, another horizon, or other coefficients and so another binding term).

    Parameters
    ----------
    B, mu_P, mu_D, N, coeffs
        The workload and coefficients, as in :func:`optimal_ratio`.

    Returns
    -------
    dict
        ``B``, ``mu_P``, ``mu_D``, ``N`` (None: infinite horizon), ``unit`` (the coefficients' time unit),
        ``token_load`` (Tbar) and ``takeover_load`` (:func:`attention_takeover_load`: attention sets r* when
        Tbar exceeds it), ``t_A`` (attention step at Tbar) and ``b_F`` (the FFN's fixed cost) in ``unit``,
        the candidates ``r_A``, ``r_C``, ``r_peak``, ``r_star`` and the ``binding`` term.
    """
    c = _coeffs(coeffs)
    t = ratio_terms(B, mu_P, mu_D, N, c)
    return {"B": int(B), "mu_P": float(mu_P), "mu_D": float(mu_D), "N": None if N is None else float(N), "unit": c.unit,
            "token_load": t.token_load, "takeover_load": attention_takeover_load(B, c), "t_A": t.t_A, "b_F": c.b_F,
            "r_A": t.r_A, "r_C": t.r_C, "r_peak": t.r_peak, "r_star": t.r_star, "binding": t.binding}


def _ratios(r: np.ndarray | float) -> np.ndarray:
    try:  # named: a string or a ragged list says "r must be ...", not numpy's words
        arr = check_finite_array("r", r)
    except ValueError as exc:
        raise ValueError(f"r must be > 0 (attention instances per FFN instance); got {r!r} ({exc})") from None
    if arr.size and arr.min() <= 0:
        raise ValueError(f"r must be > 0 (attention instances per FFN instance); got {r!r}")
    return arr


def stage_times(r: np.ndarray | float, B: int, mu_P: float, mu_D: float, N: float | None = None,
                coeffs: AFDCoefficients | None = None) -> dict[str, np.ndarray]:
    """Mean stage times and the cycle time for each r.

    Parameters
    ----------
    r : float or array
        Attention instances per FFN instance (> 0).
    B, mu_P, mu_D, N, coeffs
        The workload and coefficients, as in :func:`optimal_ratio`.

    Returns
    -------
    dict of str to ndarray
        ``t_A`` (attention), ``t_C`` (one A<->F transfer), ``t_F`` (the FFN at ``r*B`` tokens) and the
        cycle time ``t_cyc = max(t_A, t_C, t_F)`` (NOTATION.md's t_cyc, the paper's tau), each an array
        shaped like ``r``, in the coefficients' unit.
    """
    c = _coeffs(coeffs)
    r = _ratios(r)
    terms = ratio_terms(B, mu_P, mu_D, N, c)
    t_F = c.a_F * r * B + c.b_F
    t_A = np.full_like(r, terms.t_A)
    t_C = np.full_like(r, terms.t_C)
    return {"t_A": t_A, "t_C": t_C, "t_F": t_F, "t_cyc": np.maximum(np.maximum(t_A, t_C), t_F)}


def throughput_per_instance(r: np.ndarray | float, B: int, mu_P: float, mu_D: float, N: float | None = None,
                            coeffs: AFDCoefficients | None = None) -> np.ndarray | float:
    """Tokens per time unit per instance of an rA-1F bundle, ``r*B / ((r+1) * t_cyc(r))``.

    ``t_cyc(r) = max(t_A, t_C, t_F(rB))`` is the cycle time (:func:`stage_times`); every cycle emits
    ``r*B`` tokens shared by ``r + 1`` instances. Attention-bound it is ``(B/t_A) * r/(r+1)``; FFN-bound
    ``rB/((r+1)(a_F r B + b_F))``.

    Parameters
    ----------
    r : float or array
        Attention instances per FFN instance (> 0).
    B, mu_P, mu_D, N, coeffs
        The workload and coefficients, as in :func:`optimal_ratio`.

    Returns
    -------
    float or ndarray
        Tokens per ``coeffs.unit`` per instance: a float for scalar ``r``, else an array shaped like ``r``.
    """
    st = stage_times(r, B, mu_P, mu_D, N, coeffs)
    r_arr = _ratios(r)
    out = r_arr * int(B) / ((r_arr + 1.0) * st["t_cyc"])
    return float(out) if np.ndim(r) == 0 else out


def idle_ratios(r: np.ndarray | float, B: int, mu_P: float, mu_D: float, N: float | None = None,
                coeffs: AFDCoefficients | None = None) -> dict[str, np.ndarray]:
    """Theoretical idle shares per cycle: attention ``1 - t_A/t_cyc`` and FFN ``1 - t_F/t_cyc``.

    Parameters
    ----------
    r : float or array
        Attention instances per FFN instance (> 0).
    B, mu_P, mu_D, N, coeffs
        The workload and coefficients, as in :func:`optimal_ratio`.

    Returns
    -------
    dict of str to ndarray
        ``attention`` and ``ffn``: the share of each cycle ``t_cyc`` (:func:`stage_times`) that stage
        waits, in [0, 1], shaped like ``r``.
    """
    st = stage_times(r, B, mu_P, mu_D, N, coeffs)
    return {"attention": 1.0 - st["t_A"] / st["t_cyc"], "ffn": 1.0 - st["t_F"] / st["t_cyc"]}


#: most rows :func:`ratio_table` builds (each is a closed-form evaluation and a dict)
MAX_TABLE_ROWS = 100_000


def _axis(name: str, values: object) -> list:
    """A table axis as a list (a scalar or a string used to fail as 'object is not iterable')."""
    if isinstance(values, (list, tuple, range)):
        out = list(values)
    elif isinstance(values, np.ndarray) and values.ndim == 1:
        out = values.tolist()
    else:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of numbers; got {type(values).__name__} {values!r:.60}")
    if not out:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of numbers; got an empty one")
    return out


def ratio_table(B_values=(64, 128, 256, 512), mu_P_values=(100, 500, 2000), mu_D_values=(100, 500, 1000),
                N: float | None = DEFAULT_REQUESTS, coeffs: AFDCoefficients | None = None):
    """r* and its binding term for every combination of B, mu_P and mu_D (one row each; each axis a
    non-empty 1-d sequence, at most :data:`MAX_TABLE_ROWS` combinations; every value checked by
    :func:`ratio_terms`)."""
    axes = {name: _axis(name, v) for name, v in (("B_values", B_values), ("mu_P_values", mu_P_values),
                                                  ("mu_D_values", mu_D_values))}
    n_rows = len(axes["B_values"]) * len(axes["mu_P_values"]) * len(axes["mu_D_values"])
    if n_rows > MAX_TABLE_ROWS:
        raise ValueError(f"B_values x mu_P_values x mu_D_values must be <= MAX_TABLE_ROWS={MAX_TABLE_ROWS} combinations "
                         f"(one closed form each, a table to read); got {n_rows}")
    B_values, mu_P_values, mu_D_values = axes.values()
    rows = []
    for B in B_values:
        for mu_P in mu_P_values:
            for mu_D in mu_D_values:
                t = ratio_terms(B, mu_P, mu_D, N, coeffs)
                rows.append({"B": int(B), "mu_P": float(mu_P), "mu_D": float(mu_D), "r_star": t.r_star,
                             "r_A": t.r_A, "r_peak": t.r_peak, "binding": t.binding})
    return pd.DataFrame(rows)


__all__ = [
    "DEFAULT_REQUESTS", "MAX_MEAN_TOKENS", "MAX_TABLE_ROWS", "ratio_table", "AFDCoefficients", "RatioTerms",
    "attention_takeover_load", "expected_decode_load", "ratio_summary", "horizon_steps", "idle_ratios",
    "mean_token_load", "optimal_ratio", "ratio_terms", "stage_times", "termination_prob", "throughput_per_instance",
]
