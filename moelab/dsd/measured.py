"""Token-level Monte Carlo of speculative decoding fed with measured inputs, and a batching server.

Inputs are measurements, not the closed forms' assumptions:

- **rounds**: per-round accepted lengths recorded on a real target (:mod:`moelab.dsd.acceptance`), replayed
  in their recorded order (whole prompts resampled with replacement, so their dependence is kept);
  :func:`iid_rounds` gives the closed form's i.i.d. law for comparison and for the reduction check;
- **times**: ``t_a``/``t_d`` per draft token and a verify-cost curve ``verify_ms(q)`` (q = tokens one
  forward verifies) from measured forwards (this CPU) or from ``dense_verify.csv`` (an H200, 7B shape);
- **RTT**: a :class:`moelab.dsd.rtt.RTTDistribution` (measured loopback shape, WAN shapes), one draw per round.

Modes per round (``n`` = draft tokens sent, ``a`` accepted, ``a + 1`` emitted):

- ``ar``: ``t_ar`` per token; ``colocated``: ``n*t_d + verify(n+1)``; ``dsd_sync``: ``n*t_a + RTT + verify(n+1)``;
- ``dsd_pipelined`` (``pipeline="event"``): while block k is in flight the edge keeps drafting the next block
  on the assumption that block k is accepted whole *and* the target's bonus token equals the draft's next
  token. When the verdict shows otherwise (recorded ``valid_next`` is False) those drafts are thrown away and
  the next block is drafted only after the verdict. Block k+1 leaves when the verdict of k is back and the
  block is drafted: ``s_{k+1} = max(v_k, start_{k+1} + n*t_a)``, ``v_k = s_k + RTT_k + verify(n+1)``.
  ``pipeline="paper"`` is the closed form's own timeline, ``max(n*t_a, RTT) + verify``, never invalidated.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from moelab._validate import (
    MAX_SEQUENCE_TOKENS,
    check_choice,
    check_counts,
    check_finite_array,
    check_instance,
    check_int,
    check_real,
    rng_from,
)
from moelab.costmodel import AttentionModel, DenseVerifyModel
from moelab.costmodel.verify import VerifyCost, cached_verify_cost
from moelab.dsd.rtt import RTTDistribution
from moelab.dsd.server import capacity_search
from moelab.dsd.theory import MODES

MAX_ROUNDS = 5_000_000
MAX_CLIENTS = 4096
PIPELINES = ("event", "paper")

VerifyLatencyFn = Callable[[np.ndarray], np.ndarray]


def iid_rounds(alpha: float, gamma: int, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The closed form's law as a round sequence: accepted ~ truncated geometric(alpha, gamma), i.i.d.

    Parameters
    ----------
    alpha : float
        Per-token acceptance probability in [0, 1).
    gamma : int
        Draft length, tokens per round (1..64).
    n : int
        Rounds (1..:data:`MAX_ROUNDS`).
    rng : numpy.random.Generator
        The random stream.

    Returns
    -------
    dict
        ``accepted``, ``nodes`` (= gamma), ``valid_next`` and ``sequence`` arrays, as
        :meth:`AcceptanceTrace.rounds` gives for a recording.
    """
    alpha = check_real("alpha", alpha, low=0, high=1, high_open=True)
    gamma = check_int("gamma", gamma, low=1, high=64)
    n = check_int("n", n, low=1, high=MAX_ROUNDS)
    check_instance("rng", rng, np.random.Generator, "a numpy Generator (np.random.default_rng(seed))")
    trials = rng.random((n, gamma + 1)) < alpha
    run = np.cumprod(trials, axis=1).sum(axis=1)  # leading accepts of gamma + 1 tries
    return {"accepted": np.minimum(run, gamma), "nodes": np.full(n, gamma, np.int64), "valid_next": run > gamma,
            "sequence": np.zeros(n, np.int64)}


def _check_rounds(rounds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not isinstance(rounds, Mapping) or not {"accepted", "nodes", "valid_next"} <= set(rounds):
        raise ValueError("rounds must be a dict with accepted, nodes, valid_next (see AcceptanceTrace.rounds)")
    # counts are integers (a fraction is refused, not truncated) and flags are booleans, each named
    acc = check_counts("rounds['accepted']", rounds["accepted"])
    nodes = check_counts("rounds['nodes']", rounds["nodes"])
    valid = np.asarray(rounds["valid_next"])
    if valid.dtype != bool and not (valid.dtype.kind in "iu" and np.isin(valid, (0, 1)).all()):
        raise ValueError(f"rounds['valid_next'] must hold booleans; got dtype {valid.dtype}")
    valid = valid.astype(bool)
    seq = check_counts("rounds['sequence']", rounds["sequence"]) if "sequence" in rounds else np.zeros(acc.size, np.int64)
    if acc.ndim != 1 or acc.size == 0 or nodes.shape != acc.shape or valid.shape != acc.shape or seq.shape != acc.shape:
        raise ValueError("rounds must hold equal-length, non-empty 1-d arrays")
    if acc.min() < 0 or np.any(acc > nodes):
        raise ValueError("rounds: accepted must be in [0, nodes] (a round accepts at most the tokens it drafted)")
    return {"accepted": acc, "nodes": nodes, "valid_next": valid, "sequence": seq}


def resample_rounds(rounds: dict[str, np.ndarray], n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` rounds made of whole recorded sequences drawn with replacement (their order within kept)."""
    r = _check_rounds(rounds)
    n = check_int("n", n, low=1, high=MAX_ROUNDS)
    seqs = np.unique(r["sequence"])
    if seqs.size == 1:
        idx = np.arange(n) % r["accepted"].size
    else:
        parts, total = [], 0
        members = {s: np.flatnonzero(r["sequence"] == s) for s in seqs.tolist()}
        while total < n:
            pick = members[int(rng.choice(seqs))]
            parts.append(pick)
            total += pick.size
        idx = np.concatenate(parts)[:n]
    return {k: v[idx] for k, v in r.items()}


def _verify(verify_ms: VerifyLatencyFn | float, q: np.ndarray) -> np.ndarray:
    if callable(verify_ms):
        try:
            out = np.asarray(verify_ms(q), dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("verify_ms must return finite times > 0, one per verified block (numbers)") from None
    else:
        out = np.full(q.shape, check_real("verify_ms", verify_ms, low=0, low_open=True))
    if out.shape != q.shape or not np.all(np.isfinite(out)) or np.any(out <= 0):
        raise ValueError("verify_ms must return finite times > 0, one per verified block")
    return out


@dataclass(frozen=True)
class MeasuredMC:
    """One Monte-Carlo run with measured inputs."""

    mode: str
    rounds: int
    latency_per_token: float  # ms per emitted token: total time / total tokens
    std_err: float  # delta-method standard error over rounds
    tokens_per_round: float
    wasted_draft_share: float  # pipelined: drafted tokens thrown away / drafted tokens
    invalidated_share: float  # pipelined: rounds whose pre-drafted block was thrown away


def simulate(mode: str, rounds: dict[str, np.ndarray], *, t_ar: float | None = None, t_d: float = 0.0,
             t_a: float = 0.0, verify_ms: VerifyLatencyFn | float | None = None, rtt: RTTDistribution | None = None,
             n_rounds: int = 20_000, pipeline: str = "event", seed: int | None = 0) -> MeasuredMC:
    """Simulate ``n_rounds`` rounds of one client in ``mode`` (see the module doc) and measure latency per token.

    Parameters
    ----------
    mode : str
        One of :data:`moelab.dsd.MODES`.
    rounds : dict
        Recorded rounds (:meth:`AcceptanceTrace.rounds`) or :func:`iid_rounds`; resampled to ``n_rounds``.
    t_ar : float, optional
        Cloud autoregressive step per token, ms (``ar`` only; > 0).
    t_d : float
        Draft time per token on the cloud server, ms (>= 0; ``colocated``).
    t_a : float
        Draft time per token on the edge device, ms (>= 0; DSD modes).
    verify_ms : callable or float
        Verify cost of one forward of ``q`` tokens (``q = n + 1``), ms; a float means a constant
        (the closed forms' ``t_v``).
    rtt : RTTDistribution
        Per-round RTT law, ms (DSD modes).
    n_rounds : int
        Rounds simulated (2..:data:`MAX_ROUNDS`).
    pipeline : str
        ``"event"`` (invalidated drafts are paid for) or ``"paper"`` (the closed form's timeline).
    seed : int, optional
        Equal seeds give equal results; the RTT draws use their own stream, so two RTT laws see the same
        rounds (common random numbers).

    Returns
    -------
    MeasuredMC
        ms per emitted token with its standard error, tokens per round, and for pipelined runs the share
        of drafts wasted and of rounds invalidated.
    """
    check_choice("mode", mode, MODES)
    check_choice("pipeline", pipeline, PIPELINES)
    n_rounds = check_int("n_rounds", n_rounds, low=2, high=MAX_ROUNDS)
    t_d = check_real("t_d", t_d, low=0, high=1e6)
    t_a = check_real("t_a", t_a, low=0, high=1e6)
    seed_rng = rng_from(seed)
    base = int(seed_rng.integers(2**62))
    rng_rounds = np.random.default_rng([base, 0])
    rng_rtt = np.random.default_rng([base, 1])
    if mode == "ar":
        t_ar = check_real("t_ar", t_ar, low=0, low_open=True, high=1e6)
        return MeasuredMC(mode, n_rounds, t_ar, 0.0, 1.0, 0.0, 0.0)
    if verify_ms is None:
        raise ValueError("verify_ms is required for speculative modes (ms per verify forward, or a curve)")
    r = resample_rounds(rounds, n_rounds, rng_rounds)
    n = r["nodes"].astype(np.float64)
    tokens = r["accepted"] + 1.0
    tv = _verify(verify_ms, r["nodes"] + 1)
    wasted = invalid = 0.0
    if mode == "colocated":
        times = n * t_d + tv
    else:
        if not isinstance(rtt, RTTDistribution):
            raise ValueError("rtt must be an RTTDistribution for DSD modes (e.g. RTTDistribution.constant(50))")
        rtts = rtt.sample(rng_rtt, n_rounds)
        draft = n * t_a
        if mode == "dsd_sync":
            times = draft + rtts + tv
        elif pipeline == "paper":
            times = np.maximum(draft, rtts) + tv
        else:
            times, wasted, invalid = _pipelined_event(draft, rtts, tv, r["valid_next"], t_a, n)
    total = times.sum()
    ratio = total / tokens.sum()
    resid = times - ratio * tokens
    se = float(np.sqrt(resid.var(ddof=1) / n_rounds) / tokens.mean())
    return MeasuredMC(mode, n_rounds, float(ratio), se, float(tokens.mean()), wasted, invalid)


def _pipelined_event(draft: np.ndarray, rtts: np.ndarray, tv: np.ndarray, valid: np.ndarray, t_a: float,
                     n: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Per-round durations of the event timeline (see the module doc), the wasted-draft share and the share
    of rounds whose pre-drafted block was invalidated. Block 0 is drafted from t=0 and sent at ``draft[0]``;
    the durations add up to the verdict time of the last block."""
    K = draft.size
    send = np.empty(K + 1)
    send[0] = draft[0]
    wasted = 0.0
    last_verdict = 0.0
    for k in range(K):
        v = send[k] + rtts[k] + tv[k]
        last_verdict = v
        if k + 1 < K:
            if valid[k]:  # drafted during the wait, from right after block k left, and still good
                begin = send[k]
            else:  # the wait's drafts are thrown away; redraft from the verdict
                if t_a > 0:
                    wasted += min(n[k + 1], (v - send[k]) / t_a)
                begin = v
            send[k + 1] = max(v, begin + draft[k + 1])
    send[K] = last_verdict
    dur = np.diff(send)
    dur[0] += send[0]
    drafted = n.sum() + wasted
    return dur, float(wasted / drafted) if drafted else 0.0, float(np.mean(~valid[:-1])) if K > 1 else 0.0


def breakeven_rtt_sync(rounds: dict[str, np.ndarray], *, t_ar: float, t_a: float,
                       verify_ms: VerifyLatencyFn | float) -> float:
    """Mean RTT (ms) at which synchronous DSD with these measured inputs stops beating cloud AR.

    A sync round costs ``n*t_a + RTT + verify(n+1)``, so the RTT law enters the latency per token only
    through its mean: on the recorded rounds (each used once, in order) the break-even is exact,
    ``(t_ar * sum(tokens) - sum(n*t_a + verify(n+1))) / rounds``. Negative means DSD never beats AR here.

    Parameters
    ----------
    rounds : dict
        Recorded rounds (:meth:`AcceptanceTrace.rounds`) or :func:`iid_rounds`.
    t_ar : float
        Cloud autoregressive step per token, ms (> 0).
    t_a : float
        Draft time per token on the edge device, ms (>= 0).
    verify_ms : callable or float
        Verify cost of one forward of ``q`` tokens, ms.

    Returns
    -------
    float
        The break-even mean RTT, ms.
    """
    t_ar = check_real("t_ar", t_ar, low=0, low_open=True, high=1e6)
    t_a = check_real("t_a", t_a, low=0, high=1e6)
    r = _check_rounds(rounds)
    n = r["nodes"].astype(np.float64)
    fixed = n * t_a + _verify(verify_ms, r["nodes"] + 1)
    return float((t_ar * (r["accepted"] + 1.0).sum() - fixed.sum()) / n.size)


#: measured and closed-form break-even RTTs agree when they differ by at most this share of the closed form's
#: magnitude (of at least 1 ms, so two break-evens near zero are not held to a fraction of nothing)
BREAKEVEN_AGREE = 0.10
#: a recorded round whose verification costs more target steps than this is what separates the measured
#: break-even from the closed form's (which takes t_v = t_ar, one target step per round)
VERIFY_STEPS_MAX = 1.1


def breakeven_agreement(name: str, measured_ms: float, closed_form_ms: float, rounds: dict[str, np.ndarray],
                        verify_ms: VerifyLatencyFn, *, tolerance: float = BREAKEVEN_AGREE,
                        verify_steps_max: float = VERIFY_STEPS_MAX) -> tuple[bool, str]:
    """Whether a measured break-even RTT (:func:`breakeven_rtt_sync`) agrees with the closed form's
    (:func:`moelab.dsd.theory.rtt_breakeven`), and the sentence that says why.

    Both negative agree (neither lets sync DSD beat cloud AR at any round trip). Otherwise they agree when
    ``|measured - closed| <= tolerance * max(1 ms, |closed|)``. A disagreement is explained by what the
    measured break-even charges and the closed form does not: each recorded round verifies its own draft
    nodes plus one token (a token tree for HD), priced on ``verify_ms``; when that costs more than
    ``verify_steps_max`` target steps on average the sentence says so, otherwise it points at the recorded
    tokens per round differing from ``n_tok`` at the fitted acceptance.

    Parameters
    ----------
    name : str
        The drafter, as the sentence names it.
    measured_ms, closed_form_ms : float
        The two break-even round trips, ms (finite; negative means sync DSD never pays).
    rounds : dict
        The recorded rounds the measured break-even used (:meth:`AcceptanceTrace.rounds`).
    verify_ms : callable
        The verify cost of one forward over ``q`` tokens, ms, the one the measured break-even used.
    tolerance : float
        The relative gap that still agrees (0 to 1).
    verify_steps_max : float
        The mean verification cost, in target steps, above which it explains a disagreement (>= 1).

    Returns
    -------
    (bool, str)
        Whether they agree, and the evidence sentence (numbers to one decimal, gaps in whole percent).
    """
    name = check_instance("name", name, str, "a string (the drafter as the sentence names it)")
    m = check_real("measured_ms", measured_ms, low=-1e9, high=1e9)
    c = check_real("closed_form_ms", closed_form_ms, low=-1e9, high=1e9)
    tolerance = check_real("tolerance", tolerance, low=0, high=1)
    verify_steps_max = check_real("verify_steps_max", verify_steps_max, low=1, high=1e3)
    r = _check_rounds(rounds)
    if m < 0 and c < 0:
        return True, (f"{name}: both negative, so both say sync DSD never beats cloud AR "
                      f"(measured {m:.1f}, closed form {c:.1f} ms)")
    text = f"{name}: measured {m:.1f} vs closed form {c:.1f} ms"
    gap = abs(m - c) / max(1.0, abs(c))
    if gap <= tolerance:
        return True, text + f" ({gap:.0%} apart, within the {tolerance:.0%} pass mark)"
    q = r["nodes"] + 1
    steps = float(np.mean(_verify(verify_ms, q)) / _verify(verify_ms, np.ones(1, np.int64))[0])
    why = (f"the closed form takes t_v = t_ar, but a recorded round verifies {np.mean(q):.1f} tokens on average "
           f"(its draft nodes plus one), which costs {steps:.2f} target steps on the recording CPU"
           if steps > verify_steps_max else
           "the recorded rounds' tokens per round differ from n_tok at the fitted alpha")
    return False, text + f" (they disagree, {gap:.0%} apart, beyond the {tolerance:.0%} pass mark: {why})"


# ---------------------------------------------------------------------------------------------------------
# a server that batches verification across clients

@dataclass(frozen=True)
class BatchedResult:
    """One run of :func:`serve_batched`: per-client token rate (tokens per ms), batch size, utilisation."""

    mode: str
    clients: int
    per_client_rate: float  # tokens per ms per client over the measured window
    mean_batch: float  # clients per server forward
    server_utilisation: float
    rounds: int


def _check_cost_fns(verify_batch_ms: Any, draft_batch_ms: Any) -> None:
    """The batched cost functions are callables (a number used to fail mid-run: 'float' object is not callable)."""
    if not callable(verify_batch_ms):
        raise ValueError("verify_batch_ms must be a callable (batch, q) -> ms, e.g. h200_verify_batch_ms(); got "
                         f"{type(verify_batch_ms).__name__} {verify_batch_ms!r:.60}")
    if draft_batch_ms is not None and not callable(draft_batch_ms):
        raise ValueError("draft_batch_ms must be a callable batch -> ms or None; got "
                         f"{type(draft_batch_ms).__name__} {draft_batch_ms!r:.60}")


def serve_batched(mode: str, clients: int, rounds: dict[str, np.ndarray], *, verify_batch_ms: Callable[[int, int], float],
                  draft_batch_ms: Callable[[int], float] | None = None, t_a: float = 0.0,
                  rtt: RTTDistribution | None = None, max_batch: int = 16, rounds_per_client: int = 100,
                  seed: int | None = 0) -> BatchedResult:
    """``clients`` closed-loop clients on one server that verifies (and, co-located, drafts) in batches.

    Whenever the server is free it takes every queued block (up to ``max_batch``) into one forward:
    ``dsd`` costs ``verify_batch_ms(b, q)`` for ``b`` clients and ``q`` verified tokens in total;
    ``colocated`` first runs ``n_max`` batched draft steps (``draft_batch_ms(b)`` each) and then the verify.
    DSD clients draft on their edge (``n * t_a``) and pay half an RTT each way. Per-round acceptance comes
    from ``rounds`` (recorded or i.i.d.), resampled per client.

    Parameters
    ----------
    mode : str
        ``"colocated"`` or ``"dsd"``.
    clients : int
        Concurrent closed-loop clients (1..:data:`MAX_CLIENTS`).
    rounds : dict
        Recorded rounds (:meth:`AcceptanceTrace.rounds`) or :func:`iid_rounds`.
    verify_batch_ms : callable
        ``(b, q) -> ms``: one forward verifying ``b`` clients' blocks, ``q`` tokens in total (e.g.
        :func:`h200_verify_batch_ms`).
    draft_batch_ms : callable, optional
        ``b -> ms``: one batched draft step on the server (``colocated``).
    t_a : float
        Draft time per token on the edge device, ms (>= 0; ``dsd``).
    rtt : RTTDistribution, optional
        Round-trip law, ms (``dsd``).
    max_batch : int
        Most clients in one forward.
    rounds_per_client : int
        Run length in unloaded rounds of one client (10..100000); the first 10% is warm-up.
    seed : int, optional
        Seed; equal seeds give equal results.

    Returns
    -------
    BatchedResult
    """
    check_choice("mode", mode, ("colocated", "dsd"))
    clients = check_int("clients", clients, low=1, high=MAX_CLIENTS)
    max_batch = check_int("max_batch", max_batch, low=1, high=MAX_CLIENTS)
    rpc = check_int("rounds_per_client", rounds_per_client, low=10, high=100_000)
    t_a = check_real("t_a", t_a, low=0, high=1e6)
    _check_cost_fns(verify_batch_ms, draft_batch_ms)
    if mode == "colocated" and draft_batch_ms is None:
        raise ValueError("draft_batch_ms is required for colocated (the server drafts for its clients)")
    if mode == "dsd" and not isinstance(rtt, RTTDistribution):
        raise ValueError("rtt must be an RTTDistribution for dsd")
    rng = rng_from(seed)
    base = int(rng.integers(2**62))
    per = [resample_rounds(rounds, rpc * 2 + 8, np.random.default_rng([base, c])) for c in range(clients)]
    rtts = (rtt.sample(np.random.default_rng([base, 10**6]), clients * (rpc * 2 + 8) * 2).reshape(clients, -1)
            if mode == "dsd" else None)
    nxt = np.zeros(clients, np.int64)
    # unloaded round time bounds the horizon: run until every client has done ~rpc rounds
    q1 = int(per[0]["nodes"][0]) + 1
    one = verify_batch_ms(1, q1) + (q1 - 1) * (draft_batch_ms(1) if draft_batch_ms else 0.0)
    unloaded = one + (q1 - 1) * t_a + (rtt.mean if mode == "dsd" else 0.0)
    horizon = rpc * max(unloaded, clients * one / max_batch)
    warmup = 0.1 * horizon
    events: list[tuple[float, int]] = []
    for c in range(clients):
        first = (per[c]["nodes"][0] * t_a + rtts[c, 0] / 2) if mode == "dsd" else 0.0
        heapq.heappush(events, (first * (0.5 + rng.random()), c))
    tokens = np.zeros(clients)
    free, busy, forwards, batched, n_rounds = 0.0, 0.0, 0, 0, 0
    queue: list[tuple[float, int]] = []
    while events or queue:
        # the server starts its next forward when it is free and a block has arrived; every block that has
        # arrived by then joins the batch (earliest first, up to max_batch)
        first = min(queue[0][0] if queue else np.inf, events[0][0] if events else np.inf)
        start = max(free, first)
        if start >= horizon:
            break
        while events and events[0][0] <= start:
            queue.append(heapq.heappop(events))
        queue.sort()
        batch = [c for _, c in queue[:max_batch]]
        queue = queue[max_batch:] if len(queue) > max_batch else []
        ks = [int(nxt[c]) for c in batch]
        nodes = np.array([per[c]["nodes"][k] for c, k in zip(batch, ks)])
        cost = verify_batch_ms(len(batch), int((nodes + 1).sum()))
        if mode == "colocated":
            cost += int(nodes.max()) * draft_batch_ms(len(batch))
        done = start + cost
        busy += max(0.0, min(done, horizon) - max(start, warmup))
        forwards += 1
        batched += len(batch)
        free = done
        for c, k in zip(batch, ks):
            acc = int(per[c]["accepted"][k])
            if mode == "dsd":
                back = done + rtts[c, 2 * k] / 2
                j = (k + 1) % per[c]["nodes"].size
                arrive = back + per[c]["nodes"][j] * t_a + rtts[c, 2 * k + 1] / 2
            else:
                back = arrive = done
            if warmup <= back < horizon:
                tokens[c] += acc + 1
                n_rounds += 1
            nxt[c] = (k + 1) % per[c]["nodes"].size
            heapq.heappush(events, (arrive, c))
    window = horizon - warmup
    return BatchedResult(mode, clients, float(tokens.mean() / window), batched / max(forwards, 1), busy / window,
                         n_rounds)


@dataclass(frozen=True)
class BatchedCapacity:
    """Clients each mode sustains at one per-client rate target with batched verification (:func:`capacity_batched`).

    A mode's capacity is a whole number of clients: the most clients whose per-client rate still meets the
    target (one more and every client falls below it). The ratio is taken between the two *crossings*, where
    each mode's measured rate falls to the target (linearly interpolated between the whole counts around it),
    so it does not jump by a whole client's share; it is therefore not exactly ``dsd_clients / colocated_clients``.
    """

    colocated_clients: int
    dsd_clients: int
    ratio: float  # dsd_crossing / colocated_crossing
    target_rate: float
    rates: dict[str, dict[int, float]]
    colocated_crossing: float  # clients at which the co-located rate crosses the target (between whole counts)
    dsd_crossing: float


def capacity_batched(rounds: dict[str, np.ndarray], *, verify_batch_ms: Callable[[int, int], float],
                     draft_batch_ms: Callable[[int], float], t_a: float, rtt: RTTDistribution,
                     target_fraction: float = 0.25, max_batch: int = 16, rounds_per_client: int = 60,
                     max_clients: int = 1024, seed: int | None = 0) -> BatchedCapacity:
    """Clients each mode sustains at one per-client rate target (``target_fraction`` of the slower mode's
    unloaded rate), measured with :func:`serve_batched`; ``ratio`` = DSD / co-located.

    Parameters
    ----------
    rounds, verify_batch_ms, draft_batch_ms, t_a, rtt, max_batch, rounds_per_client, seed
        As in :func:`serve_batched` (times in ms).
    target_fraction : float
        The per-client rate target as a share of the slower mode's unloaded rate, in (0, 1].
    max_clients : int
        Most clients tried (2..:data:`MAX_CLIENTS`).

    Returns
    -------
    BatchedCapacity
        Whole clients of each mode (the most meeting the target), where each rate crosses the target, the
        ratio of the crossings, the target (tokens per ms per client) and every rate measured.
    """
    frac = check_real("target_fraction", target_fraction, low=0, high=1, low_open=True)
    max_clients = check_int("max_clients", max_clients, low=2, high=MAX_CLIENTS)
    _check_cost_fns(verify_batch_ms, draft_batch_ms)
    cache: dict[str, dict[int, float]] = {"colocated": {}, "dsd": {}}

    def rate(mode: str) -> Callable[[int], float]:
        def f(c: int) -> float:
            if c not in cache[mode]:
                cache[mode][c] = serve_batched(mode, c, rounds, verify_batch_ms=verify_batch_ms,
                                               draft_batch_ms=draft_batch_ms, t_a=t_a, rtt=rtt, max_batch=max_batch,
                                               rounds_per_client=rounds_per_client, seed=seed).per_client_rate
            return cache[mode][c]
        return f

    target = frac * min(rate("colocated")(1), rate("dsd")(1))
    col, col_x = capacity_search(rate("colocated"), target, max_clients, target_name="the rate target_fraction asks for",
                                 max_name="max_clients")
    dsd, dsd_x = capacity_search(rate("dsd"), target, max_clients, target_name="the rate target_fraction asks for",
                                 max_name="max_clients")
    return BatchedCapacity(int(col), int(dsd), dsd_x / col_x, target, {k: dict(sorted(v.items())) for k, v in cache.items()},
                           col_x, dsd_x)


#: KV heads and head dim of the dense shapes the measured verify table holds
_KV_DIMS = {"llama2-7b": (32, 128), "tinyllama-1.1b": (4, 64), "llama-160m": (12, 64)}


def h200_verify_curve(shape: str = "llama2-7b") -> dict[str, Any]:
    """One forward's cost on the H200 over ``q`` tokens, from ``dense_verify.csv``, as measured and fitted.

    Each table point is the median of CUDA-graph replays with no spread kept, and a few fall as ``q`` grows,
    which no forward does; the fit is their :func:`monotone_fit`, as for the CPU curve (:func:`cpu_costs`).

    Parameters
    ----------
    shape : str
        A dense model shape of the measured table (``llama2-7b``, ``tinyllama-1.1b``, ``llama-160m``).

    Returns
    -------
    dict
        ``qs``, ``table_ms`` (the table's medians) and ``fitted_ms`` (the monotone fit), one per ``q``;
        ``falls`` (the ``(q, next q)`` pairs where the medians fall), ``pooled_blocks`` (:func:`pooled_blocks`)
        and ``verify`` (ms through the fit, piecewise-linear in ``q``; ``q`` outside the table is refused).
    """
    dv = DenseVerifyModel.h200()
    check_choice("shape", shape, sorted(dv.shapes))
    rows = dv.table[dv.table["shape"] == shape].sort_values("q")
    qs = rows["q"].to_numpy(np.int64)
    ms = rows["ms_model_est"].to_numpy(np.float64)
    fitted = monotone_fit(ms)

    def verify(q: ArrayLike) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        if q.size and (q.min() < qs[0] or q.max() > qs[-1]):
            raise ValueError(f"q must be in [{qs[0]}, {qs[-1]}] (the measured dense_verify range for {shape}); "
                             f"got {q.min()}..{q.max()}")
        return np.interp(q, qs, fitted)

    return {"qs": qs.tolist(), "table_ms": ms.tolist(), "fitted_ms": fitted.tolist(),
            "falls": [(int(qs[i]), int(qs[i + 1])) for i in range(qs.size - 1) if ms[i + 1] < ms[i]],
            "pooled_blocks": pooled_blocks(qs, ms, fitted), "verify": verify}


def h200_verify_batch_ms(shape: str = "llama2-7b", ctx: int = 1024) -> Callable[[int, int], float]:
    """Batched verify cost on the H200 from measured tables: ``dense_verify.csv`` at ``q`` tokens (one
    forward's weight reads and FLOPs; its monotone fit, :func:`h200_verify_curve`) plus the K/V reads of the extra sequences, ``attn_step``-measured
    ms per byte (the table's GQA kernel; ``ctx`` cached tokens per sequence). ``q`` above the table's
    largest (128) is refused, never clamped.

    Parameters
    ----------
    shape : str
        A dense model shape of the measured table (``llama2-7b``, ``tinyllama-1.1b``, ``llama-160m``).
    ctx : int
        Cached tokens per sequence (>= 0).

    Returns
    -------
    callable
        ``(b, q) -> ms``: one forward verifying ``b`` sequences, ``q`` tokens in total.
    """
    dv = DenseVerifyModel.h200()
    attn = AttentionModel.h200()
    check_choice("shape", shape, sorted(_KV_DIMS))  # before pandas compares it with the column
    ctx = check_int("ctx", ctx, low=0, high=MAX_SEQUENCE_TOKENS, high_name="MAX_SEQUENCE_TOKENS")
    rows = dv.table[dv.table["shape"] == shape]
    if rows.empty:
        raise ValueError(f"shape must be one of {dv.shapes}; got {shape!r}")
    layers = int(rows["layers_in_model"].iloc[0])
    dims = _KV_DIMS[shape]
    kv_seq = 2 * dims[0] * dims[1] * 2 * ctx  # K+V bytes of one sequence per layer (bf16)
    per_byte = float(attn.fit.as_dict()["ms_per_GB"]) / 1e9

    curve = h200_verify_curve(shape)
    qs, ms = np.asarray(curve["qs"], np.float64), np.asarray(curve["fitted_ms"], np.float64)
    kv_ms = layers * kv_seq * per_byte

    def cost(b: int, q: int) -> float:
        if not 1 <= q <= qs[-1]:
            raise ValueError(f"q must be in [1, {qs[-1]:.0f}] (the measured dense_verify range for {shape}); got {q}")
        return float(np.interp(q, qs, ms)) + (b - 1) * kv_ms

    return cost


#: the engine name under which notebook 02 caches its transformers verify-cost curve (``moelab.hd.experiments.hf_cost``)
HF_VERIFY_ENGINE = "hf-transformers"


class _NotCached(LookupError):
    """Raised instead of measuring: :func:`cached_cpu_verify_cost` only reads."""


def _refuse_to_measure() -> VerifyCost:
    raise _NotCached


def cached_cpu_verify_cost(model: str) -> VerifyCost | None:
    """This machine's verify-cost curve of ``model`` as notebook 02 measured and cached it, or ``None`` where it was
    never measured here. Nothing is measured (no model is loaded): a recording's CPU timings can be set beside
    what the same model costs on the machine at hand.

    Parameters
    ----------
    model : str
        The model's registered name (e.g. ``"smollm2-135m-instruct"``, a recording's ``target``).

    Returns
    -------
    VerifyCost or None
        ms per forward of ``q`` tokens on this machine (one torch thread, 256 cached tokens, minimum of repeats;
        its ``source`` says when it was measured).
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a model's registered name (a non-empty str); got {model!r:.60}")
    try:
        return cached_verify_cost(HF_VERIFY_ENGINE, model, _refuse_to_measure)
    except _NotCached:
        return None


def monotone_fit(ms: ArrayLike) -> np.ndarray:
    """The non-decreasing sequence closest to ``ms`` in least squares (isotonic regression,
    :class:`sklearn.isotonic.IsotonicRegression`): where a later point is below an earlier one, the run of points
    involved is replaced by its mean.

    A forward over more tokens never costs less, so a timed curve that falls (noise: each timing of a shared
    machine catches a different share of its cores) is pooled where it falls and kept where it rises.

    Parameters
    ----------
    ms : array of float
        Timings in order of increasing ``q`` (finite).

    Returns
    -------
    numpy.ndarray
        The fitted values, one per timing, non-decreasing.
    """
    from sklearn.isotonic import IsotonicRegression  # lazy: scikit-learn loads only where a curve is fitted

    values = check_finite_array("ms", ms, ndim=1)
    if values.size < 2:
        return values.astype(np.float64)
    return IsotonicRegression(increasing=True).fit_transform(np.arange(values.size, dtype=np.float64), values)


def pooled_blocks(qs: ArrayLike, recorded: ArrayLike, fitted: ArrayLike) -> list[dict[str, Any]]:
    """The runs of ``q`` whose recorded timings :func:`monotone_fit` replaced by one mean, one entry per run.

    Parameters
    ----------
    qs : array of int
        The timed ``q``, increasing.
    recorded, fitted : array of float
        The recorded timings and their monotone fit, one per ``q``.

    Returns
    -------
    list of dict
        Per pooled run, in order of ``q``: ``qs`` (the run's q) and ``ms`` (the one value the fit gives them,
        their mean). A run is a maximal stretch of equal fitted values holding at least one changed timing.
    """
    q = [int(x) for x in np.asarray(qs)]
    rec, fit = np.asarray(recorded, dtype=np.float64), np.asarray(fitted, dtype=np.float64)
    if not (len(q) == rec.size == fit.size):
        raise ValueError(f"qs, recorded and fitted must have one value per q; got {len(q)}, {rec.size}, {fit.size}")
    blocks: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(q) + 1):
        if i == len(q) or not np.isclose(fit[i], fit[start], rtol=1e-12, atol=0):
            run = slice(start, i)
            if not np.allclose(fit[run], rec[run], rtol=1e-12, atol=0):
                blocks.append({"qs": q[run], "ms": float(fit[start])})
            start = i
    return blocks


def cpu_costs(extra: dict) -> dict[str, Any]:
    """Measured CPU costs from a recording's ``timings_ms`` (:attr:`AcceptanceTrace.meta` of a recording).

    The recorded verify timings are medians of a few forwards on a shared machine and can fall as ``q``
    grows, which no forward does; ``verify`` is therefore their :func:`monotone_fit` (non-decreasing, equal to
    the medians wherever they already rise), and ``verify_recorded`` the medians as recorded.

    Parameters
    ----------
    extra : dict
        Holds ``timings_ms`` with ``target_q`` (verify ms per q tokens) and ``draft_q`` (draft ms per q), and
        optionally the recording's ``note`` and ``torch_threads`` (how the timings were taken).

    Returns
    -------
    dict
        ``t_ar`` (one-token verify ms, from the fit), ``t_a`` (early-exit ms per draft token), ``verify`` (a
        :data:`VerifyLatencyFn` through the fit, piecewise-linear in the measured q; q beyond the measured range
        is refused), ``verify_recorded`` (the same through the recorded medians), ``qs``, ``recorded_ms`` and
        ``fitted_ms`` (the points), ``pooled_qs`` (the q whose median the fit changed), ``pooled_blocks`` (those q
        in runs that share one fitted value, :func:`pooled_blocks`), ``q_max``, ``note`` and
        ``torch_threads`` (``None`` where the recording does not say).
    """
    # a recording's metadata is data from a file: a missing or malformed key is named (a bare KeyError before)
    tim = extra.get("timings_ms") if isinstance(extra, Mapping) else None
    if not isinstance(tim, Mapping) or not isinstance(tim.get("target_q"), Mapping) or not tim["target_q"] \
            or not isinstance(tim.get("draft_q"), Mapping):
        raise ValueError("extra must hold timings_ms = {'target_q': {q: ms, ...}, 'draft_q': {q: ms, ...}} (a "
                         f"recording's metadata); got {extra!r:.80}")
    try:
        qs = np.array(sorted(int(k) for k in tim["target_q"]))
        ms = check_finite_array("timings_ms['target_q']", [tim["target_q"][str(q)] if str(q) in tim["target_q"]
                                                            else tim["target_q"][q] for q in qs], low=0)
        d = tim["draft_q"]
        t_a = check_real("timings_ms['draft_q'][1]", d["1"] if "1" in d else d.get(1), low=0)
    except (TypeError, ValueError, OverflowError, KeyError) as exc:
        raise ValueError(f"extra['timings_ms'] must map integer q (1 included) to finite ms >= 0: {exc}") from None
    if qs[0] != 1 or np.any(np.diff(qs) == 0):
        raise ValueError(f"extra['timings_ms']['target_q'] must start at q=1 with distinct q; got {qs.tolist()}")
    fitted = monotone_fit(ms)

    def through(points: np.ndarray) -> VerifyLatencyFn:
        def verify(q: np.ndarray) -> np.ndarray:
            q = np.asarray(q, dtype=np.float64)
            if q.size and (q.min() < qs[0] or q.max() > qs[-1]):
                raise ValueError(f"q must be in [{qs[0]}, {qs[-1]}] (the measured CPU verify curve); got {q.min()}..{q.max()}")
            return np.interp(q, qs, points)
        return verify

    verify = through(fitted)
    threads = extra.get("torch_threads")
    return {"t_ar": float(verify(1)), "t_a": t_a, "verify": verify, "verify_recorded": through(ms),
            "qs": qs.tolist(), "recorded_ms": ms.tolist(), "fitted_ms": fitted.tolist(),
            "pooled_qs": qs[~np.isclose(fitted, ms, rtol=1e-12, atol=0)].tolist(),
            "pooled_blocks": pooled_blocks(qs, ms, fitted), "q_max": int(qs[-1]),
            "note": extra.get("note") if isinstance(extra.get("note"), str) else None,
            "torch_threads": int(threads) if isinstance(threads, (int, np.integer)) else None}


__all__ = ["HF_VERIFY_ENGINE", "MAX_CLIENTS", "MAX_ROUNDS", "PIPELINES", "BatchedCapacity", "BatchedResult", "MeasuredMC",
           "VerifyLatencyFn", "breakeven_rtt_sync", "capacity_batched", "cpu_costs", "h200_verify_batch_ms", "h200_verify_curve",
           "cached_cpu_verify_cost", "iid_rounds", "monotone_fit", "pooled_blocks", "resample_rounds", "serve_batched", "simulate"]
