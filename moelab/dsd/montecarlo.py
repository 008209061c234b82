"""Monte-Carlo simulation of one client's speculative rounds, to check every closed form.

Each round the drafter proposes ``gamma`` tokens; the target accepts each with probability ``alpha``
until the first rejection (the accepted length follows the truncated geometric law) and adds one
token of its own, so a round emits ``accepted + 1`` tokens. A round's time depends on the mode:
``ar`` one step ``t_ar`` per token; ``colocated`` ``gamma*t_d + t_v``; ``dsd_sync``
``gamma*t_a + RTT + t_v``; ``dsd_pipelined`` ``max(gamma*t_a, RTT) + t_v`` (the next block is drafted
while the round trip is in flight). RTT jitters per round, uniform in ``rtt*(1 +- rtt_jitter)``.
Latency per token is the renewal-reward ratio sum(time)/sum(tokens), with a delta-method CI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from moelab._validate import check_choice, check_finite_array, check_int, check_real, rng_from
from moelab.dsd.theory import MODES, latency_per_token

MAX_ROUNDS = 5_000_000  # rounds of one run (bounded work; larger values are refused)
MAX_GAMMA = 64


@dataclass(frozen=True)
class MCResult:
    """One Monte-Carlo run: latency per token with its standard error, and what the rounds did."""

    mode: str
    rounds: int
    latency_per_token: float
    std_err: float
    tokens_per_round: float
    tokens_per_round_se: float
    closed_form: float  # :func:`latency_per_token` at the same parameters
    rtt: float = float("nan")  # the mean RTT asked for (DSD modes; NaN otherwise)
    rtt_per_round: float = float("nan")  # the mean of the round trips drawn
    rtt_per_round_se: float = float("nan")  # its standard error (0 without jitter)

    @property
    def rtt_z(self) -> float:
        """How far the round trips drawn lie from the asked mean RTT, in standard errors (positive: longer);
        NaN where none were drawn at random (AR, co-located, no jitter)."""
        if not self.rtt_per_round_se > 0:
            return float("nan")
        return (self.rtt_per_round - self.rtt) / self.rtt_per_round_se

    @property
    def z(self) -> float:
        """(measured - closed form) / standard error; ``abs(z) < 3`` means agreement at 99.7%."""
        return (self.latency_per_token - self.closed_form) / self.std_err if self.std_err > 0 else 0.0

    def ci(self, level_z: float = 1.96) -> tuple[float, float]:
        """Confidence interval of the latency per token (ms), ``+- level_z`` standard errors."""
        return self.latency_per_token - level_z * self.std_err, self.latency_per_token + level_z * self.std_err


def accepted_lengths(alpha: float, gamma: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Accepted draft tokens of ``n`` rounds: per-token Bernoulli(alpha) trials up to the first
    rejection, capped at ``gamma`` (the truncated geometric law)."""
    if gamma > MAX_GAMMA or n > MAX_ROUNDS:
        raise ValueError(f"gamma must be at most MAX_GAMMA={MAX_GAMMA} and n at most MAX_ROUNDS={MAX_ROUNDS}")
    accept = rng.random((n, gamma)) < alpha
    return np.cumprod(accept, axis=1).sum(axis=1)


def jittered_rtt(rtt: float, jitter: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Per-round RTTs, uniform in ``rtt*(1 +- jitter)`` (mean ``rtt``)."""
    if jitter == 0 or rtt == 0:
        return np.full(n, rtt)
    return rtt * (1.0 + jitter * rng.uniform(-1.0, 1.0, size=n))


def _one_value(name: str, value: object) -> None:
    """One client runs one setting: an array or a list is a ``ValueError`` naming ``name`` (numpy's
    'only length-1 arrays' words before); scalars go on to :func:`latency_per_token`'s checks."""
    if value is None or isinstance(value, (str, bytes)) or np.isscalar(value) \
            or (isinstance(value, np.ndarray) and value.ndim == 0):
        return
    raise ValueError(f"{name} must be one real number (one client's setting; sweep by calling again); "
                     f"got {type(value).__name__} {value!r:.60}")


def simulate_rounds(mode: str, *, alpha: float = 0.0, gamma: int = 1, t_ar: float | None = None,
                    t_d: float | None = None, t_v: float | None = None, t_a: float | None = None,
                    rtt: float | None = None, rtt_jitter: float = 0.0, rounds: int = 20_000,
                    seed: int | None = 0) -> MCResult:
    """Simulate ``rounds`` speculative rounds of one client (``ar``: ``rounds`` single-token steps).

    Parameters
    ----------
    mode : str
        One of :data:`moelab.dsd.MODES`.
    alpha : float
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (1..:data:`MAX_GAMMA`).
    t_ar : float, optional
        Cloud autoregressive step per token, ms (``ar``; ``t_v``'s default).
    t_d : float, optional
        Draft time per token on the cloud server, ms (``colocated``).
    t_v : float, optional
        One verification pass of the target, ms (default ``t_ar``).
    t_a : float, optional
        Draft time per token on the edge device, ms (DSD modes).
    rtt : float, optional
        Mean edge-cloud round-trip time, ms (DSD modes).
    rtt_jitter : float
        Relative uniform RTT jitter in [0, 1]: each round's RTT is ``U(rtt(1-j), rtt(1+j))``.
    rounds : int
        Rounds simulated (2..:data:`MAX_ROUNDS`).
    seed : int, optional
        Seed; equal seeds give equal results.

    Returns
    -------
    MCResult
        Measured ms per token with its standard error, tokens per round, the round trips drawn (DSD modes;
        :attr:`MCResult.rtt_z`) and the closed form (:func:`moelab.dsd.latency_per_token`) at the same
        parameters.
    """
    check_choice("mode", mode, MODES)
    rounds = check_int("rounds", rounds, low=2, high=MAX_ROUNDS)
    jitter = check_real("rtt_jitter", rtt_jitter, low=0, high=1)
    for name, value in (("alpha", alpha), ("t_ar", t_ar), ("t_d", t_d), ("t_v", t_v), ("t_a", t_a), ("rtt", rtt)):
        _one_value(name, value)
    closed = float(latency_per_token(mode, alpha=alpha, gamma=gamma, t_ar=t_ar, t_d=t_d, t_v=t_v, t_a=t_a,
                                     rtt=rtt, rtt_jitter=jitter))
    rng = rng_from(seed)
    rtts = None
    if mode == "ar":
        tokens = np.ones(rounds)
        times = np.full(rounds, float(t_ar))
    else:
        t_v = t_ar if t_v is None else t_v
        tokens = accepted_lengths(float(alpha), int(gamma), rounds, rng) + 1.0
        if mode == "colocated":
            times = np.full(rounds, gamma * t_d + t_v)
        else:
            rtts = jittered_rtt(float(rtt), jitter, rounds, rng)
            draft = gamma * t_a
            times = (draft + rtts if mode == "dsd_sync" else np.maximum(draft, rtts)) + t_v
    ratio = times.sum() / tokens.sum()
    # delta method for a ratio of means: Var(T - R*X) / (n * mean(X)^2)
    resid = times - ratio * tokens
    se = float(np.sqrt(resid.var(ddof=1) / rounds) / tokens.mean())
    tok_se = float(tokens.std(ddof=1) / np.sqrt(rounds))
    drawn = {} if rtts is None else {"rtt": float(rtt), "rtt_per_round": float(rtts.mean()),
                                      "rtt_per_round_se": float(rtts.std(ddof=1) / np.sqrt(rounds))}
    return MCResult(mode, rounds, float(ratio), se, float(tokens.mean()), tok_se, closed, **drawn)


@dataclass(frozen=True)
class FamilyAgreement:
    """Do many Monte-Carlo points agree with their closed forms *together* (:func:`family_agreement`)?"""

    points: int  # independent points tested (those with a standard error > 0)
    max_abs_z: float  # the largest |z| among them
    p_max: float  # chance that k agreeing, independent points show a max |z| at least this large
    z_threshold: float  # the max |z| that k agreeing points exceed with probability ``level`` (Sidak)
    level: float  # the test's false-alarm rate

    @property
    def agrees(self) -> bool:
        """The largest ``|z|`` stays within :attr:`z_threshold` (equivalently ``p_max >= level``)."""
        return self.max_abs_z <= self.z_threshold


def family_agreement(z: object, *, level: float = 0.05) -> FamilyAgreement:
    """Test many independent Monte-Carlo points against their closed forms at once.

    One point's ``|z| < 1.96`` is a 95% test; the largest of ``k`` points' ``|z|`` exceeds 1.96 far more
    often than 5% of the time even when every closed form is right. This test asks how likely the largest
    ``|z|`` is for ``k`` agreeing, *independent* points (each simulated with its own seed: points that share
    random draws are not independent and must not be counted as such).

    Parameters
    ----------
    z : array of float
        ``(simulated - closed form) / standard error`` of each point; points with no randomness (``z`` of a
        run with a zero standard error) are passed as NaN and left out.
    level : float
        False-alarm rate of the test, in (0, 0.5).

    Returns
    -------
    FamilyAgreement
        The points tested, the largest ``|z|`` with its family p-value (Sidak: ``1 - (1 - p_one)^k``, ``p_one``
        the two-sided normal tail of that ``|z|``), the threshold it is compared with, and ``agrees``.
    """
    level = check_real("level", level, low=0, high=0.5, low_open=True, high_open=True)
    try:
        arr = np.asarray(z, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"z must be an array of real numbers (NaN for a point without randomness); got {z!r:.60}") from None
    arr = check_finite_array("z", arr[~np.isnan(arr)])
    k = int(arr.size)
    if k == 0:
        raise ValueError("z must hold at least one point with a standard error > 0 (NaN marks the others)")
    m = float(np.abs(arr).max())
    p_one = float(2 * norm.sf(m))
    p_max = float(-np.expm1(k * np.log1p(-p_one))) if p_one < 1 else 1.0
    threshold = float(norm.isf(-np.expm1(np.log1p(-level) / k) / 2))
    return FamilyAgreement(k, m, p_max, threshold, level)


__all__ = ["FamilyAgreement", "MCResult", "accepted_lengths", "family_agreement", "jittered_rtt", "simulate_rounds"]
