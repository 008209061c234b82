"""Interval statistics shared by the papers' comparisons (one meaning of "ahead / behind / not distinguishable").

:func:`interval_verdict` reads an interval against the value of "no difference" (0 for a gain in %, 1 for a
ratio); :func:`log_ratio_interval` is the paired, per-seed interval of a ratio of two methods' values (a mean of
log ratios with a Student-t half-width, so the point estimate is the ratio of the geometric means and always lies
inside its interval).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from moelab._validate import check_real

#: the verdicts of :func:`interval_verdict`
VERDICTS = ("ahead", "behind", "not distinguishable")


def interval_verdict(low: float, high: float, *, null: float = 0.0) -> str:
    """What an interval allows one to say about a difference whose "no difference" value is ``null``.

    Parameters
    ----------
    low, high : float
        The interval's ends, oriented so that larger means the first method is better (a gain in %, a speed ratio).
    null : float
        The value of no difference (0 for a gain in %, 1 for a ratio).

    Returns
    -------
    str
        ``"ahead"`` when the whole interval is above ``null``, ``"behind"`` when it is below, else (it holds
        ``null``, or an end is not finite) ``"not distinguishable"``.
    """
    if not (np.isfinite(low) and np.isfinite(high)):
        return "not distinguishable"
    if low > null:
        return "ahead"
    if high < null:
        return "behind"
    return "not distinguishable"


def _positive_values(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one value per seed (a flat sequence); got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must hold finite values > 0 (a ratio of them is taken); got {arr[i]!r} at "
                         f"position {i}")
    return arr


def t_half_width(values: Sequence[float] | np.ndarray, level: float = 0.95) -> float:
    """Half-width of the Student-t interval of the mean of ``values`` (independent replicates, at least 2) at
    confidence ``level`` in (0, 1): ``t_{(1+level)/2, n-1} * s / sqrt(n)``."""
    level = check_real("level", level, low=0, high=1, low_open=True, high_open=True)
    v = np.asarray(values, np.float64)
    if v.ndim != 1 or v.size < 2:
        raise ValueError(f"values must be one value per replicate, at least 2; got shape {v.shape}")
    return float(stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))


def log_ratio_interval(reference: Sequence[float], method: Sequence[float], *, level: float = 0.95,
                       n_comparisons: int = 1, reference_name: str = "reference",
                       method_name: str = "method") -> dict[str, float]:
    """The paired ratio ``method / reference`` over seeds: geometric mean with a Student-t interval on the logs.

    Parameters
    ----------
    reference, method : sequence of float
        One positive value per seed, same seeds in the same order.
    level : float
        Confidence level, in (0, 1), of the whole family of ``n_comparisons`` intervals (Bonferroni: each interval
        is at level ``1 - (1 - level) / n_comparisons``).
    n_comparisons : int
        How many such intervals are read together (1: this one alone).
    reference_name, method_name : str
        The caller's parameter names, for the error messages.

    Returns
    -------
    dict
        ``ratio`` (``exp(mean log(method / reference))``, equal to the ratio of the two geometric means),
        ``ratio_lo`` / ``ratio_hi`` (the interval), ``reference_geomean`` / ``method_geomean`` and ``n``.
    """
    level = check_real("level", level, low=0, high=1, low_open=True, high_open=True)
    if int(n_comparisons) != n_comparisons or n_comparisons < 1:
        raise ValueError(f"n_comparisons must be an integer >= 1; got {n_comparisons!r}")
    ref = _positive_values(reference_name, reference)
    met = _positive_values(method_name, method)
    if ref.shape != met.shape or ref.size < 2:
        raise ValueError(f"{reference_name} and {method_name} need one value per seed, at least 2 seeds; got "
                         f"{ref.shape} and {met.shape}")
    d = np.log(met) - np.log(ref)
    alpha = (1 - level) / int(n_comparisons)
    half = t_half_width(d, 1 - alpha)
    mean = float(d.mean())
    return {"ratio": float(np.exp(mean)), "ratio_lo": float(np.exp(mean - half)), "ratio_hi": float(np.exp(mean + half)),
            "reference_geomean": float(np.exp(np.log(ref).mean())), "method_geomean": float(np.exp(np.log(met).mean())),
            "n": int(d.size)}
