"""Event-driven simulation of one cloud server serving C speculative-decoding clients.

The server is one FIFO worker that runs one round's work at a time (batching is not modelled,
as in the paper's capacity argument). Each client runs rounds back to back (a closed loop):

- ``colocated``: the client's round is one server job of ``gamma*t_d + t_v`` (draft, then verify);
  its tokens stream out and the next round is queued at once.
- ``dsd``: the client drafts ``gamma*t_a`` on its own edge device, sends the block (half an RTT),
  the server verifies it (``t_v``), the verdict returns (the other half), and the next round starts.
  While a client drafts or waits on the network the server verifies other clients' blocks: this
  cross-client overlap is where DSD's capacity comes from.

A round emits ``accepted + 1`` tokens (truncated geometric law). The per-client rate is tokens per
unit time averaged over clients after a warm-up. :func:`max_clients` searches the largest C whose
per-client rate still meets a target, and :func:`capacity_ratio` compares the two modes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from moelab._validate import check_choice, check_int, check_real, rng_from
from moelab.dsd.montecarlo import accepted_lengths, jittered_rtt
from moelab.dsd.theory import capacity_gain, expected_tokens

SERVER_MODES = ("colocated", "dsd")
MAX_CLIENTS = 4096  # clients of one server run / capacity search (bounded work)
MAX_ROUNDS_PER_CLIENT = 100_000


@dataclass(frozen=True)
class ServerResult:
    """One multi-client run."""

    mode: str
    clients: int
    per_client_rate: float  # tokens per time unit per client (mean over clients)
    server_utilisation: float  # busy share of the server over the measured window
    rounds: int


@dataclass(frozen=True)
class _Setup:
    alpha: float
    gamma: int
    t_d: float
    t_v: float
    t_a: float
    rtt: float
    rtt_jitter: float


def _setup(alpha, gamma, t_d, t_v, t_a, rtt, rtt_jitter) -> _Setup:
    alpha = check_real("alpha", alpha, low=0, high=1, high_open=True)
    return _Setup(alpha, check_int("gamma", gamma, low=1), check_real("t_d", t_d, low=0),
                  check_real("t_v", t_v, low=0, low_open=True), check_real("t_a", t_a, low=0),
                  check_real("rtt", rtt, low=0), check_real("rtt_jitter", rtt_jitter, low=0, high=1))


def _run(mode: str, clients: int, s: _Setup, horizon: float, warmup: float, rng: np.random.Generator) -> ServerResult:
    work = s.gamma * s.t_d + s.t_v if mode == "colocated" else s.t_v
    edge = 0.0 if mode == "colocated" else s.gamma * s.t_a
    n_draw = 4096
    acc = accepted_lengths(s.alpha, s.gamma, n_draw, rng)
    rtts = jittered_rtt(s.rtt, s.rtt_jitter, n_draw, rng)
    used = 0
    events: list[tuple[float, int, int]] = []  # (time, client, kind): 0 = job reaches server
    # stagger the first rounds so clients do not arrive in lock-step
    for c in range(clients):
        heapq.heappush(events, (edge * rng.random() + (rtts[c % n_draw] / 2 if mode == "dsd" else 0.0), c, 0))
    tokens = np.zeros(clients)
    server_free = 0.0
    busy = 0.0
    rounds = 0
    while events:
        t, c, _ = heapq.heappop(events)
        if t >= horizon:
            break
        start = max(t, server_free)
        server_free = start + work
        busy += max(0.0, min(server_free, horizon) - max(start, warmup))
        if used + 2 > n_draw:  # refill the pre-drawn randomness
            acc = accepted_lengths(s.alpha, s.gamma, n_draw, rng)
            rtts = jittered_rtt(s.rtt, s.rtt_jitter, n_draw, rng)
            used = 0
        done = server_free
        if mode == "dsd":
            back = done + rtts[used] / 2  # verdict reaches the edge
            nxt = back + edge + rtts[used + 1] / 2  # next block drafted and sent
        else:
            back = nxt = done
        if warmup <= back < horizon:
            tokens[c] += acc[used] + 1
            rounds += 1
        used += 2
        heapq.heappush(events, (nxt, c, 0))
    window = horizon - warmup
    return ServerResult(mode, clients, float(tokens.mean() / window), busy / window, rounds)


def serve(mode: str, clients: int, *, alpha: float, gamma: int, t_d: float, t_v: float, t_a: float = 0.0,
          rtt: float = 0.0, rtt_jitter: float = 0.0, rounds_per_client: int = 200, seed: int | None = 0) -> ServerResult:
    """Simulate ``clients`` closed-loop clients on one server and measure the per-client token rate.

    Parameters
    ----------
    mode : str
        ``"colocated"`` (the server drafts and verifies) or ``"dsd"`` (synchronous DSD: the edge drafts).
    clients : int
        Concurrent clients (1..:data:`MAX_CLIENTS`).
    alpha : float
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (>= 1).
    t_d : float
        Draft time per token on the server, ms (>= 0; ``colocated``).
    t_v : float
        One verification pass of the target, ms (> 0).
    t_a : float
        Draft time per token on the edge device, ms (>= 0; ``dsd``).
    rtt : float
        Mean edge-cloud round-trip time, ms (>= 0; ``dsd``).
    rtt_jitter : float
        Relative uniform RTT jitter in [0, 1].
    rounds_per_client : int
        Length of the run, in unloaded rounds of one client (>= 10); the first 10% is warm-up.
    seed : int, optional
        Seed; equal seeds give equal results.

    Returns
    -------
    ServerResult
        ``per_client_rate`` (tokens per ms per client), ``server_utilisation`` (busy share) and the rounds
        measured.
    """
    check_choice("mode", mode, SERVER_MODES)
    clients = check_int("clients", clients, low=1, high=MAX_CLIENTS)
    rpc = check_int("rounds_per_client", rounds_per_client, low=10, high=MAX_ROUNDS_PER_CLIENT)
    s = _setup(alpha, gamma, t_d, t_v, t_a, rtt, rtt_jitter)
    unloaded = s.gamma * s.t_d + s.t_v if mode == "colocated" else s.gamma * s.t_a + s.rtt + s.t_v
    # saturated, every client waits for the other clients' work too
    work = s.gamma * s.t_d + s.t_v if mode == "colocated" else s.t_v
    horizon = rpc * max(unloaded, clients * work)
    return _run(mode, clients, s, horizon, 0.1 * horizon, rng_from(seed))


@dataclass(frozen=True)
class Capacity:
    """Largest client count meeting a per-client rate target: whole (the capacity: one more client and every
    client falls below the target) and where the rate crosses the target (between two whole counts)."""

    mode: str
    target_rate: float
    max_clients: int
    clients_interp: float  # where the per-client rate crosses the target, linearly interpolated
    rates: dict[int, float]  # measured per-client rate of every client count tried


def max_clients(mode: str, target_rate: float, *, alpha: float, gamma: int, t_d: float, t_v: float,
                t_a: float = 0.0, rtt: float = 0.0, rtt_jitter: float = 0.0, rounds_per_client: int = 200,
                max_c: int = 4096, seed: int | None = 0) -> Capacity:
    """Search the largest C with per-client rate >= ``target_rate`` (doubling, then bisection; every
    C is simulated with the same seed so the measured rate is a smooth function of C).

    Parameters
    ----------
    mode : str
        ``"colocated"`` or ``"dsd"`` (see :func:`serve`).
    target_rate : float
        Per-client rate to meet, tokens per ms (> 0, at most one unloaded client's rate).
    alpha, gamma, t_d, t_v, t_a, rtt, rtt_jitter, rounds_per_client, seed
        As in :func:`serve` (times in ms).
    max_c : int
        Most clients tried (1..:data:`MAX_CLIENTS`).

    Returns
    -------
    Capacity
        ``max_clients`` (an integer), ``clients_interp`` (where the rate crosses the target) and the rate of
        every client count tried.
    """
    target_rate = check_real("target_rate", target_rate, low=0, low_open=True)
    max_c = check_int("max_c", max_c, low=1, high=MAX_CLIENTS)
    rates: dict[int, float] = {}

    def rate(c: int) -> float:
        if c not in rates:
            rates[c] = serve(mode, c, alpha=alpha, gamma=gamma, t_d=t_d, t_v=t_v, t_a=t_a, rtt=rtt,
                             rtt_jitter=rtt_jitter, rounds_per_client=rounds_per_client, seed=seed).per_client_rate
        return rates[c]

    lo, interp = capacity_search(rate, target_rate, max_c)
    return Capacity(mode, target_rate, lo, interp, dict(sorted(rates.items())))


def capacity_search(rate: Callable[[int], float], target: float, max_c: int, *, target_name: str = "target_rate",
                    max_name: str = "max_c") -> tuple[int, float]:
    """The largest client count ``C <= max_c`` with ``rate(C) >= target`` (doubling, then bisection) and
    where the rate crosses ``target`` between ``C`` and ``C + 1``, linearly interpolated. ``rate`` must be
    non-increasing in ``C``; the names are the caller's parameters, for the error messages."""
    if rate(1) < target:
        raise ValueError(f"{target_name} must be at most one unloaded client's rate ({rate(1):.4g}); got {target:g}")
    lo, hi = 1, 2
    while hi <= max_c and rate(hi) >= target:
        lo, hi = hi, hi * 2
    if hi > max_c:
        raise ValueError(f"{max_name} must be larger: {max_c} clients still meet {target_name}={target:g}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rate(mid) >= target else (lo, mid)
    r_lo, r_hi = rate(lo), rate(lo + 1)
    frac = (r_lo - target) / (r_lo - r_hi) if r_lo > r_hi else 0.0
    return lo, lo + float(np.clip(frac, 0, 1))


@dataclass(frozen=True)
class CapacityComparison:
    """Clients each mode sustains at one per-client rate (:func:`capacity_ratio`), measured and predicted."""

    colocated: Capacity
    dsd: Capacity
    measured_ratio: float  # DSD crossing / co-located crossing (``clients_interp``), not a ratio of whole counts
    predicted_ratio: float  # 1 + gamma*t_d/t_v


def capacity_ratio(*, alpha: float, gamma: int, t_d: float, t_v: float, t_a: float, rtt: float,
                   rtt_jitter: float = 0.0, target_fraction: float = 0.1, rounds_per_client: int = 200,
                   seed: int | None = 0) -> CapacityComparison:
    """Measure how many more clients DSD sustains than co-located SD at the same per-client rate.

    The target rate is ``target_fraction`` (in (0, 1]) of the slower mode's unloaded per-client rate,
    so both modes can meet it and the server is saturated at the limit.

    Parameters
    ----------
    alpha, gamma, t_d, t_v, t_a, rtt, rtt_jitter, rounds_per_client, seed
        As in :func:`serve` (times in ms).
    target_fraction : float
        The per-client rate target as a share of the slower mode's unloaded rate, in (0, 1].

    Returns
    -------
    CapacityComparison
        Both modes' :class:`Capacity`, the measured ratio of clients (DSD / co-located) and the closed
        form's :func:`moelab.dsd.capacity_gain`.
    """
    frac = check_real("target_fraction", target_fraction, low=0, high=1, low_open=True)
    s = _setup(alpha, gamma, t_d, t_v, t_a, rtt, rtt_jitter)
    E = float(expected_tokens(s.alpha, s.gamma))
    slowest_round = max(s.gamma * s.t_d + s.t_v, s.gamma * s.t_a + s.rtt + s.t_v)
    target = frac * E / slowest_round
    kw = {"alpha": alpha, "gamma": gamma, "t_d": t_d, "t_v": t_v, "t_a": t_a, "rtt": rtt, "rtt_jitter": rtt_jitter,
          "rounds_per_client": rounds_per_client, "seed": seed}
    col = max_clients("colocated", target, **kw)
    dsd = max_clients("dsd", target, **kw)
    return CapacityComparison(col, dsd, dsd.clients_interp / col.clients_interp, float(capacity_gain(gamma, t_d, t_v)))


__all__ = ["SERVER_MODES", "Capacity", "CapacityComparison", "ServerResult", "capacity_ratio", "max_clients", "serve"]
