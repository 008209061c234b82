"""Exercises of notebook 04 (edge-cloud speculative decoding, DSD), easy to hard.

Every expected answer is computed by :mod:`moelab.dsd` from the context the notebook passes (its
parameters in lower case: ``alpha``, ``gamma``, ``t_a``, ``t_ar``, ``t_d``, ``rtt``), never typed in;
``t_v = t_ar`` as in the notebook. Importing this module registers the exercises in
:data:`moelab.course.check.EXERCISES` under ``"04.<id>"``.
"""

from __future__ import annotations

import numpy as np

from moelab.course.check import Feedback, check_callable, check_choice, check_number, exercise
from moelab.dsd import best_mode, capacity_gain, expected_tokens, latency_per_token, rtt_breakeven

NOTEBOOK = "04"
# the notebook's default parameters (its `parameters` cell); the tests call every checker with these
DEFAULTS: dict[str, float] = {"alpha": 0.8, "gamma": 5, "t_a": 10.0, "t_ar": 50.0, "t_d": 10.0, "rtt": 60.0}
# the modes a server that cannot host the draft model chooses from (exercise 04.fastest_mode)
REMOTE_MODES = ("ar", "dsd_sync", "dsd_pipelined")


def _sync_latency(alpha: float, gamma: int, t_a: float, rtt: float, t_v: float) -> float:
    return float(latency_per_token("dsd_sync", alpha=alpha, gamma=gamma, t_a=t_a, rtt=rtt, t_v=t_v))


# 04.expected_tokens (easy) ---------------------------------------------------------------------------
def check_expected_tokens(answer: object, *, alpha: float, gamma: int, **_: object) -> Feedback:
    """``answer`` should be n_tok(alpha, gamma), the expected tokens one speculation round yields."""
    return check_number("n_tok", answer, float(expected_tokens(alpha, gamma)), rtol=0.01,
                        hint=f"n_tok = (1 - alpha^(gamma+1)) / (1 - alpha) with alpha = {alpha:g}, gamma = {gamma}; "
                             "it counts the target's bonus token, so it lies between 1 and gamma + 1.")


exercise(NOTEBOOK, "expected_tokens", "easy",
         "How many tokens does one speculation round yield on average at ALPHA and GAMMA? Assign it to `answer`.",
         check_expected_tokens,
         solution=lambda *, alpha, gamma, **_: float(expected_tokens(alpha, gamma)),
         wrong=lambda *, alpha, gamma, **_: float(gamma * alpha),  # forgets the bonus token and the truncation
         context=DEFAULTS)


# 04.breakeven_rtt (medium) ---------------------------------------------------------------------------
def check_breakeven_rtt(answer: object, *, alpha: float, gamma: int, t_ar: float, t_a: float,
                        **_: object) -> Feedback:
    """``answer`` should be the largest RTT (ms) at which synchronous DSD beats cloud AR."""
    expected = float(rtt_breakeven(alpha, gamma, t_ar, t_a))
    return check_number("RTT_breakeven", answer, expected, rtol=0.01, atol=0.5,
                        hint="set the sync DSD latency (gamma t_a + RTT + t_v)/n_tok equal to t_ar with t_v = t_ar and "
                             "solve for RTT: one t_ar of the n_tok t_ar is the verification pass itself.")


exercise(NOTEBOOK, "breakeven_rtt", "medium",
         "Below which RTT (ms) does synchronous DSD beat cloud AR at the notebook's parameters?",
         check_breakeven_rtt,
         solution=lambda *, alpha, gamma, t_ar, t_a, **_: float(rtt_breakeven(alpha, gamma, t_ar, t_a)),
         wrong=lambda *, alpha, gamma, t_ar, t_a, **_: float(expected_tokens(alpha, gamma) * t_ar - gamma * t_a),
         context=DEFAULTS)


# 04.fastest_mode (medium) ----------------------------------------------------------------------------
def fastest_remote_mode(*, alpha: float, gamma: int, t_a: float, t_ar: float, rtt: float, **_: object) -> str:
    """The fastest of cloud AR, sync DSD and pipelined DSD at this point (ties to the simpler mode)."""
    index = best_mode(alpha=alpha, rtt=rtt, gamma=gamma, t_ar=t_ar, t_a=t_a, modes=REMOTE_MODES)
    return REMOTE_MODES[int(np.asarray(index))]


def check_fastest_mode(answer: object, *, alpha: float, gamma: int, t_a: float, t_ar: float, rtt: float,
                       **_: object) -> Feedback:
    """``answer`` should name the fastest mode when the server cannot host the draft model."""
    expected = fastest_remote_mode(alpha=alpha, gamma=gamma, t_a=t_a, t_ar=t_ar, rtt=rtt)
    window = gamma * t_a
    return check_choice("fastest_mode", answer, expected, REMOTE_MODES,
                        hint=f"compare t_ar with (gamma t_a + RTT + t_v)/n_tok and (max(gamma t_a, RTT) + t_v)/n_tok; "
                             f"the drafting window gamma t_a is {window:g} ms here and RTT is {rtt:g} ms.")


exercise(NOTEBOOK, "fastest_mode", "medium",
         "The server cannot host the draft model. Which mode is fastest at the notebook's RTT: 'ar', "
         "'dsd_sync' or 'dsd_pipelined'?",
         check_fastest_mode,
         solution=lambda **ctx: fastest_remote_mode(**ctx),
         wrong=lambda **ctx: next(m for m in REMOTE_MODES if m != fastest_remote_mode(**ctx)),
         context=DEFAULTS)


# 04.sync_latency (hard: implement the formula) -------------------------------------------------------
# (alpha, gamma, t_a, rtt, t_v) cases the student's function is run on: both sides of the break-even,
# no acceptance, a zero round trip and a long draft
SYNC_CASES: tuple[tuple[float, int, float, float, float], ...] = (
    (0.8, 5, 10.0, 60.0, 50.0), (0.5, 3, 20.0, 150.0, 30.0), (0.0, 4, 5.0, 10.0, 40.0), (0.9, 8, 2.0, 0.0, 25.0))


def check_sync_latency(answer: object, **_: object) -> Feedback:
    """``answer`` should be a function ``f(alpha, gamma, t_a, rtt, t_v)`` returning sync DSD's ms per token."""
    cases = [(args, _sync_latency(*args)) for args in SYNC_CASES]
    return check_callable("sync_latency", answer, cases, rtol=1e-6,
                          hint="a round costs gamma t_a + RTT + t_v and yields n_tok(alpha, gamma) tokens on average; "
                               "divide the first by the second (n_tok = 1 when alpha = 0).")


def _wrong_sync_latency(alpha: float, gamma: int, t_a: float, rtt: float, t_v: float) -> float:
    return gamma * t_a + rtt + t_v  # the time of one round, not per token


exercise(NOTEBOOK, "sync_latency", "hard",
         "Implement `sync_latency(alpha, gamma, t_a, rtt, t_v)`: the mean latency per output token of synchronous DSD.",
         check_sync_latency, solution=lambda **_: _sync_latency, wrong=lambda **_: _wrong_sync_latency,
         context=DEFAULTS)


# 04.capacity (hard) ----------------------------------------------------------------------------------
def check_capacity(answer: object, *, gamma: int, t_d: float, t_ar: float, **_: object) -> Feedback:
    """``answer`` should be how many times more clients a saturated server sustains under DSD."""
    return check_number("C_cap", answer, float(capacity_gain(gamma, t_d, t_ar)), rtol=0.01,
                        hint="per client round the server spends gamma t_d + t_v co-located but only t_v under "
                             "DSD (t_v = t_ar here); the ratio of the two is the factor, not their difference.")


exercise(NOTEBOOK, "capacity", "hard",
         "A saturated server verifies for many clients. How many times more clients does it sustain when the "
         "clients draft (DSD) than when it drafts for them (co-located), at the same per-client rate?",
         check_capacity,
         solution=lambda *, gamma, t_d, t_ar, **_: float(capacity_gain(gamma, t_d, t_ar)),
         wrong=lambda *, gamma, t_d, t_ar, **_: float(gamma * t_d / t_ar),
         context=DEFAULTS)

__all__ = ["DEFAULTS", "REMOTE_MODES", "SYNC_CASES", "check_breakeven_rtt", "check_capacity",
           "check_expected_tokens", "check_fastest_mode", "check_sync_latency", "fastest_remote_mode"]
