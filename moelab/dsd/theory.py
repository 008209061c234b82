"""Closed forms for edge-cloud (distributed) speculative decoding (Lyu et al., arXiv 2606.25091).

Notation (every function's parameters use these names):

- ``alpha``: i.i.d. per-token acceptance probability of a draft token, in [0, 1);
- ``gamma``: draft length, tokens drafted per speculative round (>= 1);
- ``t_ar``: one autoregressive decode step of the target in the cloud, per token (ms);
- ``t_v``: one verification pass of the target over a drafted block (ms; about one decode step ``t_ar``,
  since verification is memory-bound, and ``t_ar`` where not given);
- ``t_d``: draft time per token when the draft model runs on the cloud server beside the target (ms);
- ``t_a``: draft time per token when the draft model runs on the edge device (ms);
- ``rtt``: the edge-cloud round-trip time (ms), ``rtt_jitter`` its relative uniform jitter.

All times share one unit: ms throughout the lab (any unit works if every time uses it; the results are
then in that unit). Functions broadcast over numpy arrays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from moelab._validate import _as_array, check_choice, check_finite_array, check_int, check_real

#: Decoding modes compared: plain autoregressive (``ar``), draft and target on one machine (``colocated``), and distributed speculative decoding over a network, synchronous (``dsd_sync``) or pipelined (``dsd_pipelined``).
MODES = ("ar", "colocated", "dsd_sync", "dsd_pipelined")


def _arr(name: str, value, *, low: float = 0.0, high: float | None = None, high_open: bool = False):
    """Validate a scalar or array parameter; returns a float for scalars."""
    if value is None:
        raise ValueError(f"{name} is required here (a real number >= {low:g})")
    if isinstance(value, (str, bytes)) or np.isscalar(value):
        return check_real(name, value, low=low, high=high, high_open=high_open)
    arr = _as_array(name, value, what="a real number or an array of them")  # strings and ragged lists, named
    if arr.ndim == 0:
        return check_real(name, arr.item(), low=low, high=high, high_open=high_open)
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr) | (arr < low)
    if high is not None:
        bad |= (arr >= high) if high_open else (arr > high)
    if bad.any():
        hi = "inf)" if high is None else f"{high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in [{low:g}, {hi} everywhere; got {arr[bad].ravel()[0]!r}")
    return arr


def _alpha(alpha):
    return _arr("alpha", alpha, low=0.0, high=1.0, high_open=True)


def _gamma(gamma) -> int:
    return check_int("gamma", gamma, low=1)


def expected_tokens(alpha: ArrayLike, gamma: int) -> float | np.ndarray:
    """Expected tokens per speculative round, ``(1 - alpha^(gamma+1)) / (1 - alpha)`` (Leviathan et al.).

    Parameters
    ----------
    alpha : float or array
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length (>= 1).

    Returns
    -------
    float or array
        Between 1 (alpha = 0) and gamma + 1; tends to ``1/(1-alpha)`` as gamma grows.
    """
    a = _alpha(alpha)
    g = _gamma(gamma)
    return (1.0 - np.power(a, g + 1)) / (1.0 - a)


def _expected_max(c, rtt, jitter):
    """``E[max(c, R)]`` for ``R ~ Uniform(rtt*(1-j), rtt*(1+j))`` (the jitter law of the simulators)."""
    if np.all(np.asarray(jitter) == 0):
        return np.maximum(c, rtt)
    lo, hi = rtt * (1 - jitter), rtt * (1 + jitter)
    c, lo, hi = np.broadcast_arrays(np.asarray(c, float), np.asarray(lo, float), np.asarray(hi, float))
    width = np.where(hi > lo, hi - lo, 1.0)
    inside = (c * (c - lo) + (hi**2 - c**2) / 2) / width
    out = np.where(c <= lo, (lo + hi) / 2, np.where(c >= hi, c, inside))
    return out if out.ndim else float(out)


def latency_per_token(mode: str, *, alpha: ArrayLike | None = None, gamma: int | None = None,
                      t_ar: ArrayLike | None = None, t_d: ArrayLike | None = None, t_v: ArrayLike | None = None,
                      t_a: ArrayLike | None = None, rtt: ArrayLike | None = None,
                      rtt_jitter: float = 0.0) -> float | np.ndarray:
    """Mean latency per output token of one request under ``mode``, with ``E`` = :func:`expected_tokens`.

    - ``ar``: cloud autoregressive decoding, ``t_ar``.
    - ``colocated``: draft and target on the server, ``(gamma*t_d + t_v) / E``.
    - ``dsd_sync``: draft on the edge, one round trip per round, ``(gamma*t_a + rtt + t_v) / E``.
    - ``dsd_pipelined``: the edge keeps drafting the next block during the round trip, which hides
      the round trip while ``rtt <= gamma*t_a`` (:func:`pipelined_window`): ``(max(gamma*t_a, rtt) + t_v) / E``.

    Parameters
    ----------
    mode : str
        One of :data:`MODES`.
    alpha : float or array, optional
        Per-token acceptance probability in [0, 1) (every mode but ``ar``).
    gamma : int, optional
        Draft length, tokens per round (>= 1; every mode but ``ar``).
    t_ar : float or array, optional
        Cloud autoregressive step per token, ms (>= 0; ``ar``, and ``t_v``'s default).
    t_d : float or array, optional
        Draft time per token on the cloud server, ms (>= 0; ``colocated``).
    t_v : float or array, optional
        One verification pass of the target, ms (>= 0; default ``t_ar``).
    t_a : float or array, optional
        Draft time per token on the edge device, ms (>= 0; ``dsd_sync``, ``dsd_pipelined``).
    rtt : float or array, optional
        Mean edge-cloud round-trip time, ms (>= 0; ``dsd_sync``, ``dsd_pipelined``).
    rtt_jitter : float
        Relative half-width ``j`` in [0, 1] of a uniform RTT jitter, ``U(rtt(1-j), rtt(1+j))``. Only the
        pipelined form depends on it (through ``E[max(gamma*t_a, RTT)]``); the others are linear in RTT.

    Returns
    -------
    float or array
        ms per output token (broadcast over the array arguments).
    """
    check_choice("mode", mode, MODES)
    jitter = check_real("rtt_jitter", rtt_jitter, low=0, high=1)
    if mode == "ar":
        return _arr("t_ar", t_ar)
    if t_v is None and t_ar is not None:
        t_v = t_ar
    t_v = _arr("t_v", t_v)
    E = expected_tokens(alpha, _gamma(gamma))
    if mode == "colocated":
        if t_d is None:
            raise ValueError("t_d is required for mode 'colocated': the draft time per token on the cloud server, "
                             "ms (>= 0)")
        return (gamma * _arr("t_d", t_d) + t_v) / E
    draft = gamma * _arr("t_a", t_a)
    rtt = _arr("rtt", rtt)
    if mode == "dsd_sync":
        return (draft + rtt + t_v) / E
    return (_expected_max(draft, rtt, jitter) + t_v) / E


def rtt_breakeven(alpha: ArrayLike, gamma: int, t_ar: ArrayLike, t_a: ArrayLike) -> float | np.ndarray:
    """Largest RTT at which synchronous DSD beats cloud AR (with ``t_v = t_ar``):
    ``(E - 1)*t_ar - gamma*t_a``, ``E`` = :func:`expected_tokens`.

    Parameters
    ----------
    alpha : float or array
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (>= 1).
    t_ar : float or array
        Cloud autoregressive step per token, ms (>= 0); also the verification pass.
    t_a : float or array
        Draft time per token on the edge device, ms (>= 0).

    Returns
    -------
    float or array
        The break-even RTT in ms: below it ``dsd_sync`` is faster per token than ``ar``. A negative value
        means DSD never beats AR at these settings.
    """
    E = expected_tokens(alpha, gamma)
    return (E - 1.0) * _arr("t_ar", t_ar) - gamma * _arr("t_a", t_a)


def breakeven_table(alphas: ArrayLike = (0.5, 0.7, 0.85, 0.9), t_ars: ArrayLike = (100, 50, 30, 20), gamma: int = 5,
                    t_a: float = 10.0, *, decimals: int | None = 0) -> pd.DataFrame:
    """:func:`rtt_breakeven` on a grid: rows ``t_ar``, columns ``alpha``.

    Parameters
    ----------
    alphas : sequence of float
        Per-token acceptance probabilities in [0, 1] (the columns).
    t_ars : sequence of float
        Cloud autoregressive steps per token, ms (>= 0; the rows).
    gamma : int
        Draft length, tokens per round (>= 1).
    t_a : float
        Draft time per token on the edge device, ms (>= 0).
    decimals : int, optional
        Round to this many decimals (0..15); None keeps full precision.

    Returns
    -------
    DataFrame
        Break-even RTT in ms; NaN (blank) where negative, i.e. where DSD never beats cloud AR.
    """
    alphas = check_finite_array("alphas", alphas, ndim=1, low=0, high=1)
    t_ars = check_finite_array("t_ars", t_ars, ndim=1, low=0).tolist()
    if decimals is not None:
        decimals = check_int("decimals", decimals, low=0, high=15)
    rows = {}
    for t_ar in t_ars:
        value = np.asarray(rtt_breakeven(alphas, gamma, t_ar, t_a), dtype=np.float64)
        value = np.where(value < 0, np.nan, value)
        rows[t_ar] = np.round(value, decimals) if decimals is not None else value
    table = pd.DataFrame.from_dict(rows, orient="index", columns=[f"{a:g}" for a in alphas])
    table.index.name = "t_ar"
    table.columns.name = "alpha"
    return table


def round_table(*, alpha: float, gamma: int, rtt: float, t_ar: float, t_d: float, t_v: float,
                t_a: float) -> pd.DataFrame:
    """Every mode of :data:`MODES` at one operating point: the time of one round, the tokens it emits and the
    latency per output token (their ratio: what :func:`latency_per_token` gives without jitter).

    A round is one target forward for ``ar`` (one token) and one draft-then-verify round otherwise
    (``E`` = :func:`expected_tokens` tokens): ``colocated`` ``gamma*t_d + t_v``, ``dsd_sync``
    ``gamma*t_a + rtt + t_v``, ``dsd_pipelined`` ``max(gamma*t_a, rtt) + t_v`` (no jitter).

    Parameters
    ----------
    alpha : float
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (>= 1).
    rtt : float
        Edge-cloud round-trip time, ms (>= 0).
    t_ar, t_d, t_v, t_a : float
        Cloud autoregressive step per token, cloud draft time per token, one verification pass and edge
        draft time per token, ms (>= 0).

    Returns
    -------
    DataFrame
        Index ``mode`` (:data:`MODES`); columns ``time per round (ms)``, ``tokens per round`` and
        ``ms per output token``.
    """
    gamma = _gamma(gamma)
    alpha, rtt = float(_alpha(alpha)), float(_arr("rtt", rtt))
    t_ar, t_d, t_v, t_a = (float(_arr(name, v)) for name, v in (("t_ar", t_ar), ("t_d", t_d), ("t_v", t_v), ("t_a", t_a)))
    n_tok = float(expected_tokens(alpha, gamma))
    round_ms = {"ar": t_ar, "colocated": gamma * t_d + t_v, "dsd_sync": gamma * t_a + rtt + t_v,
                "dsd_pipelined": max(gamma * t_a, rtt) + t_v}
    tokens = {m: 1.0 if m == "ar" else n_tok for m in MODES}
    return pd.DataFrame({"time per round (ms)": round_ms, "tokens per round": tokens,
                         "ms per output token": {m: round_ms[m] / tokens[m] for m in MODES}}).rename_axis("mode")


def pipelined_window(gamma: int, t_a: ArrayLike) -> float | np.ndarray:
    """The end of the pipelined protocol's window: the largest RTT that pipelined DSD hides, ``gamma*t_a``.

    While a drafted block is in flight the edge drafts the next one, which takes ``gamma*t_a``; a round
    trip shorter than that is hidden behind the drafting, so inside the window (``rtt <= gamma*t_a``)
    pipelined DSD costs ``gamma*t_a + t_v`` per round whatever the RTT, and matches co-located SD when
    ``t_a = t_d``. Past it every extra ms of RTT is paid.

    Parameters
    ----------
    gamma : int
        Draft length, tokens per round (>= 1).
    t_a : float or array
        Draft time per token on the edge device, ms (>= 0).

    Returns
    -------
    float or array
        The window's end in ms (it starts at RTT 0).
    """
    return _gamma(gamma) * _arr("t_a", t_a)


def pipelined_breakeven(alpha: ArrayLike, gamma: int, t_ar: ArrayLike, t_a: ArrayLike) -> float | np.ndarray:
    """Largest RTT at which pipelined DSD beats cloud AR (with ``t_v = t_ar``): ``(E - 1)*t_ar``,
    ``E`` = :func:`expected_tokens`, where pipelined DSD beats AR at all; NaN where it never does.

    Pipelined DSD costs ``(max(gamma*t_a, rtt) + t_v) / E`` per token (:func:`latency_per_token`): inside
    its window (``rtt <= gamma*t_a``, :func:`pipelined_window`) the round trip is hidden, past it every ms
    is paid. It beats AR's ``t_ar`` exactly when ``max(gamma*t_a, rtt) < (E - 1)*t_ar``, so:

    - where ``gamma*t_a < (E - 1)*t_ar`` (:func:`rtt_breakeven` > 0), below RTT ``(E - 1)*t_ar``, which is
      ``pipelined_window(gamma, t_a) + rtt_breakeven(alpha, gamma, t_ar, t_a)``: the synchronous
      protocol's break-even moved out by the window;
    - elsewhere never, even at RTT 0 (drafting a block costs more than the tokens it saves): NaN.

    Without jitter (the jittered pipelined form pays ``E[max(gamma*t_a, RTT)]``, a little more).

    Parameters
    ----------
    alpha : float or array
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (>= 1).
    t_ar : float or array
        Cloud autoregressive step per token, ms (>= 0); also the verification pass.
    t_a : float or array
        Draft time per token on the edge device, ms (>= 0).

    Returns
    -------
    float or array
        The break-even RTT in ms: ``dsd_pipelined`` is faster per token than ``ar`` at every RTT below it
        (and slower above); NaN where it is never faster. ``rtt < pipelined_breakeven(...)`` is False there.

    Examples
    --------
    >>> round(pipelined_breakeven(0.8, 4, 30.0, 5.0), 2)
    70.85
    >>> bool(np.isnan(pipelined_breakeven(0.1, 4, 30.0, 5.0)))
    True
    """
    E = expected_tokens(alpha, gamma)
    t_ar = _arr("t_ar", t_ar)
    t_a = _arr("t_a", t_a)
    end = (E - 1.0) * t_ar
    out = np.where(end > _gamma(gamma) * t_a, end, np.nan)
    return float(out) if out.ndim == 0 else out


def capacity_gain(gamma: int, t_d: ArrayLike, t_v: ArrayLike) -> float | np.ndarray:
    """Clients a saturated server sustains under DSD relative to co-located SD at equal per-client
    rate: ``1 + gamma*t_d/t_v`` (co-located spends ``gamma*t_d + t_v`` per round, DSD only ``t_v``).

    Parameters
    ----------
    gamma : int
        Draft length, tokens per round (>= 1).
    t_d : float or array
        Draft time per token on the cloud server, ms (>= 0).
    t_v : float or array
        One verification pass of the target, ms (> 0).

    Returns
    -------
    float or array
        The ratio of clients (>= 1; dimensionless).
    """
    g = _gamma(gamma)
    t_d = _arr("t_d", t_d)
    t_v = _arr("t_v", t_v)
    if np.any(np.asarray(t_v) == 0):
        raise ValueError("t_v must be > 0 (a verification pass takes time)")
    return 1.0 + g * t_d / t_v


def leviathan_speedup(alpha: ArrayLike, gamma: int, c: ArrayLike) -> float | np.ndarray:
    """Co-located speed-up over AR, ``E / (gamma*c + 1)`` (Leviathan et al.), ``E`` = :func:`expected_tokens`.

    Parameters
    ----------
    alpha : float or array
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (>= 1).
    c : float or array
        Cost ratio ``t_d / t_v`` of one draft token to one verification pass (>= 0, dimensionless).

    Returns
    -------
    float or array
        AR time per token over co-located SD time per token (> 1: SD is faster).
    """
    return expected_tokens(alpha, gamma) / (gamma * _arr("c", c) + 1.0)


def optimal_gamma(alpha: float, c: float, gamma_max: int = 32) -> int:
    """The draft length in ``1..gamma_max`` that maximises :func:`leviathan_speedup`.

    Parameters
    ----------
    alpha : float
        Per-token acceptance probability in [0, 1).
    c : float
        Cost ratio ``t_d / t_v`` (>= 0).
    gamma_max : int
        Longest draft considered (1..1024).

    Returns
    -------
    int
        The best ``gamma`` (the smallest one on ties).
    """
    gamma_max = check_int("gamma_max", gamma_max, low=1, high=1024)
    # one optimum for one (alpha, c): an array of them has no single answer (numpy's argmax words before)
    alpha = check_real("alpha", alpha, low=0, high=1, high_open=True)
    c = check_real("c", c, low=0)
    speedups = [leviathan_speedup(alpha, g, c) for g in range(1, gamma_max + 1)]
    return int(np.argmax(speedups)) + 1


def best_mode(*, alpha: ArrayLike, rtt: ArrayLike, gamma: int, t_ar: ArrayLike, t_a: ArrayLike,
              t_d: ArrayLike | None = None, t_v: ArrayLike | None = None, modes: tuple[str, ...] = MODES,
              rtt_jitter: float = 0.0) -> np.ndarray:
    """Index into ``modes`` of the lowest-latency mode (:func:`latency_per_token`) at each (alpha, rtt).

    Ties go to the earlier mode, i.e. to the simpler deployment in :data:`MODES` order.

    Parameters
    ----------
    alpha : float or array
        Per-token acceptance probability in [0, 1); broadcast with ``rtt``.
    rtt : float or array
        Mean edge-cloud round-trip time, ms (>= 0).
    gamma : int
        Draft length, tokens per round (>= 1).
    t_ar : float or array
        Cloud autoregressive step per token, ms (>= 0); also ``t_v``'s default.
    t_a : float or array
        Draft time per token on the edge device, ms (>= 0).
    t_d : float or array, optional
        Draft time per token on the cloud server, ms (>= 0); required when ``modes`` holds ``colocated``.
    t_v : float or array, optional
        One verification pass of the target, ms (>= 0; default ``t_ar``).
    modes : tuple of str
        The candidate modes, from :data:`MODES` (e.g. without ``colocated`` when the server cannot host
        the draft model).
    rtt_jitter : float
        Relative uniform RTT jitter in [0, 1] (see :func:`latency_per_token`).

    Returns
    -------
    ndarray of int
        Per (alpha, rtt) point, the index into ``modes`` of the fastest one (``modes[i]`` names it).
    """
    if isinstance(modes, str):  # "ar" would be read letter by letter
        raise ValueError(f"modes must be a tuple of mode names from {list(MODES)}; got the string {modes!r}")
    modes = list(modes)
    for m in modes:
        check_choice("modes", m, MODES)
    if not modes:
        raise ValueError(f"modes must list at least one of {list(MODES)}")
    if "colocated" in modes and t_d is None:
        others = tuple(m for m in modes if m != "colocated")
        raise ValueError(f"t_d is required when modes include 'colocated' (the default modes, MODES, do): t_d is "
                         f"the draft time per token on the cloud server, ms. Pass t_d=..., or modes={others!r} "
                         f"(without 'colocated') when the cloud cannot host the draft model")
    alpha, rtt = _alpha(alpha), _arr("rtt", rtt)
    try:
        alpha, rtt = np.broadcast_arrays(np.asarray(alpha, float), np.asarray(rtt, float))
    except ValueError:
        raise ValueError(f"alpha and rtt must broadcast together; got shapes {np.shape(alpha)} and "
                         f"{np.shape(rtt)}") from None
    lat = []
    for m in modes:
        v = latency_per_token(m, alpha=alpha, gamma=gamma, t_ar=t_ar, t_d=t_d, t_v=t_v, t_a=t_a, rtt=rtt,
                              rtt_jitter=rtt_jitter)
        try:
            lat.append(np.broadcast_to(v, alpha.shape))
        except ValueError:  # an array t_ar / t_a / t_d / t_v of another shape: numpy's words before
            raise ValueError(f"t_ar, t_a, t_d and t_v must be scalars or broadcast to the shape of alpha and rtt "
                             f"{alpha.shape}; mode {m!r} gave shape {np.shape(v)}") from None
    stacked = np.stack(lat)
    # tolerance so exact ties (e.g. pipelined == co-located inside the window) are not decided by rounding
    best = stacked.min(axis=0)
    return np.argmax(stacked <= best * (1 + 1e-12), axis=0)


__all__ = [
    "MODES", "best_mode", "breakeven_table", "capacity_gain", "expected_tokens", "latency_per_token",
    "leviathan_speedup", "optimal_gamma", "pipelined_breakeven", "pipelined_window", "round_table", "rtt_breakeven",
]
