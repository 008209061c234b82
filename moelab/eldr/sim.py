"""PD-disaggregated decode-cluster simulator with expert sets per step.

Requests arrive at the decode tier after prefill, carrying a signature and their prompt length (the
KV cache they bring). A router places each one on one of ``K`` decode workers at its arrival time.
Each worker runs continuous batching: at every step boundary it admits queued requests up to
``batch_cap`` running ones, then runs one decode step for the whole batch. The step's latency comes
from a :class:`~moelab.costmodel.DecodeStepModel`: distinct experts summed over MoE layers (from the
requests' own expert traces), batch size and KV tokens.

Event-driven: the next event is either the next arrival or the earliest step end among workers.
Per step the distinct experts are counted with bitsets: every captured decode token's expert set is
pre-packed into ``[L, ceil(E/64)]`` uint64 words, so a batch's union is one ``bitwise_or.reduce``
and one ``bitwise_count`` — vectorised over requests, layers and experts. Traces are finite; a
request replays its trace's decode tokens cyclically from a random start offset (like
``ExpertTrace.distinct_experts``), so simulated outputs may be longer than captured ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from moelab._validate import check_array, check_int, check_real, rng_from
from moelab.costmodel.decode_layer import DecodeStepModel
from moelab.routing.base import ClusterView, RequestBatch, Router
from moelab.sim.metrics import LatencySummary, summarize_requests
from moelab.traces import ExpertTrace


def pack_expert_bits(trace: ExpertTrace) -> np.ndarray:
    """Every decode token's expert set as bits: uint64 ``[sum T, L, ceil(E/64)]``."""
    ids = trace.decode_ids.astype(np.int64)
    words = (trace.geometry.num_experts + 63) // 64
    out = np.zeros(ids.shape[:2] + (words,), dtype=np.uint64)
    bits = np.left_shift(np.uint64(1), (ids % 64).astype(np.uint64))
    word = ids // 64
    for w in range(words):
        out[:, :, w] = np.bitwise_or.reduce(np.where(word == w, bits, np.uint64(0)), axis=2)
    return out


@dataclass(frozen=True)
class DecodeRequests:
    """Requests arriving at the decode tier: ``arrival_s`` (sorted), ``prompt_len``, ``output_len``,
    ``trace_idx`` (which trace request's experts they replay), ``offset`` (start token in it),
    ``domain`` (integer codes, for the oracle)."""

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    trace_idx: np.ndarray
    offset: np.ndarray
    domain: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def poisson_requests(
    trace: ExpertTrace,
    *,
    rate: float,
    n_requests: int,
    output_len: int | np.ndarray = 512,
    seed: int = 0,
) -> DecodeRequests:
    """Poisson arrivals at ``rate`` req/s; each request replays a uniformly drawn request of ``trace``
    (prompt length and domain included) from a random decode offset; fixed or given output lengths.
    Trace requests without captured decode tokens have no experts to replay and are not drawn."""
    rate = check_real("rate", rate, low=0, low_open=True)
    n = check_int("n_requests", n_requests, low=1)
    rng = rng_from(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    arrival -= arrival[0]
    eligible = np.flatnonzero(trace.decode_lens > 0)
    if eligible.size == 0:
        raise ValueError("trace has no request with decode tokens to replay")
    idx = eligible[rng.integers(0, eligible.size, size=n)]
    lens = trace.decode_lens[idx]
    out = np.broadcast_to(np.asarray(output_len, dtype=np.int64), (n,)).copy()
    if out.min() < 1:
        raise ValueError(f"output_len must be >= 1; got minimum {out.min()}")
    codes, _ = trace.domain_codes()
    return DecodeRequests(arrival, trace.prompt_lens[idx].astype(np.int64), out, idx, rng.integers(0, lens), codes[idx])


@dataclass(frozen=True)
class SimResult:
    """Per-request times, per-step log and the summary of one simulated run.

    Times are seconds from the first arrival at the decode tier. ``first_token_s`` is the end of a
    request's first decode step, so the summary's TTFT is *TTFT-at-decode* (queueing at the decode
    worker + one step; the prefill tier is not simulated). ``steps`` has one row per worker step:
    ``worker, t_s, batch, sum_distinct`` (distinct experts summed over MoE layers), ``step_ms``."""

    summary: LatencySummary
    worker: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    steps: pd.DataFrame
    num_layers: int
    extra: dict = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat dict: latency summary + mean distinct experts per layer per step (token-weighted and
        per step), mean batch, per-worker request-count imbalance."""
        st = self.steps
        per_layer = st["sum_distinct"].to_numpy() / self.num_layers
        b = st["batch"].to_numpy()
        counts = np.bincount(self.worker, minlength=int(self.worker.max()) + 1 if self.worker.size else 1)
        return {**self.summary.as_dict(),
                "distinct_per_layer_step": float(per_layer.mean()) if len(st) else float("nan"),
                "distinct_per_layer_tokenweighted": float((per_layer * b).sum() / max(b.sum(), 1)),
                "mean_batch": float(b.mean()) if len(st) else float("nan"),
                "step_ms_mean": float(st["step_ms"].mean()) if len(st) else float("nan"),
                "n_steps": int(len(st)),
                "worker_load_cv": float(counts.std() / max(counts.mean(), 1e-12)), **self.extra}


def simulate(
    trace: ExpertTrace,
    requests: DecodeRequests,
    router: Router,
    cost: DecodeStepModel,
    *,
    n_workers: int,
    signatures: np.ndarray | None = None,
    batch_cap: int = 256,
    bits: np.ndarray | None = None,
) -> SimResult:
    """Simulate the decode cluster.

    Parameters
    ----------
    trace : expert traces the requests replay (geometry must match ``cost``)
    requests : arrivals (see :func:`poisson_requests`)
    router : any :class:`Router`; it is reset for ``n_workers``
    cost : step latency model at the trace's geometry
    n_workers : decode workers K (>= 1)
    signatures : [trace.n_requests, d] per trace request, passed to the router (ELDR needs them)
    batch_cap : most running requests per worker
    bits : precomputed :func:`pack_expert_bits` of ``trace`` (saves time across runs)
    """
    K = check_int("n_workers", n_workers, low=1)
    cap = check_int("batch_cap", batch_cap, low=1)
    g = trace.geometry
    cost.check_geometry(g.num_layers, g.num_experts, g.top_k)
    if signatures is not None:
        signatures = check_array("signatures", signatures, ndim=2, dtype=np.float64)
        if signatures.shape[0] != trace.n_requests:
            raise ValueError(f"signatures must have one row per trace request ({trace.n_requests}); got {signatures.shape[0]}")
    if bits is None:
        bits = pack_expert_bits(trace)
    elif bits.shape[:2] != trace.decode_ids.shape[:2]:
        raise ValueError(f"bits must be pack_expert_bits(trace) with shape {trace.decode_ids.shape[:2]} + (words,)")
    router.reset(K)

    # cost model folded into per-batch-size tables: step_ms = fixed[B] + per_d[B]*sum_D + attention(kv)
    Bs = np.arange(cap + 1, dtype=np.float64)
    attn0 = float(cost.layer.attn.predict_ms(0.0))
    fixed = (cost.step_ms(Bs, 0.0, 0.0) - cost.num_layers * attn0).tolist()  # attention is added per step below
    per_d = (cost.step_ms(Bs, 1.0, 0.0) - cost.step_ms(Bs, 0.0, 0.0)).tolist()
    a_floor, a_base, a_slope = cost.layer.attn.per_token_coefficients(cost.shape.kv_bytes_per_token)
    L = cost.num_layers

    n = len(requests)
    arrival = requests.arrival_s
    start_row = trace.decode_offsets[requests.trace_idx].astype(np.int64)
    tlen = trace.decode_lens[requests.trace_idx].astype(np.int64)
    off = requests.offset.astype(np.int64)
    plen = requests.prompt_len.astype(np.int64)
    olen = requests.output_len.astype(np.int64)
    sig = signatures[requests.trace_idx] if signatures is not None else None
    dom = requests.domain
    if n and (plen.min() < 0 or olen.min() < 1):
        raise ValueError("requests need prompt_len >= 0 and output_len >= 1")

    worker = np.full(n, -1, dtype=np.int64)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    # per worker, one int64 block [6, batch]: request, first trace row, trace length, phase
    # (offset + tokens done), tokens done, output length — admission concatenates, finishing compacts
    state: list[np.ndarray] = [np.zeros((6, 0), np.int64) for _ in range(K)]
    fresh = [0] * K  # requests admitted at the last step start (their first token ends that step)
    queues: list[deque] = [deque() for _ in range(K)]
    active = np.zeros(K, np.int64)
    waiting = np.zeros(K, np.int64)
    kv = np.zeros(K, np.int64)  # KV tokens a worker holds (queued requests included): what routers see
    kv_run = [0] * K  # KV tokens of the running batch: what attention reads (Python ints: cheap scalar updates)
    free = np.full(K, 1 << 30, np.int64)  # workers queue without limit; the cap applies at admission
    step_end = np.full(K, np.inf)
    log_w: list[int] = []
    log_t: list[float] = []
    log_b: list[int] = []
    log_d: list[int] = []
    log_ms: list[float] = []
    flat_bits = bits.reshape(bits.shape[0], -1)  # [sum T, L * words]: one contiguous row per token
    or_reduce = np.bitwise_or.reduce
    req_block = np.stack([np.arange(n), start_row, tlen, off, np.zeros(n, np.int64), olen])

    def start_step(w: int, t: float) -> None:
        st = state[w]
        q = queues[w]
        room = cap - st.shape[1]
        fresh[w] = 0
        if q and room > 0:
            take = [q.popleft() for _ in range(min(room, len(q)))]
            st = np.concatenate([st, req_block[:, take]], axis=1)
            state[w] = st
            waiting[w] -= len(take)
            active[w] += len(take)
            fresh[w] = len(take)
            kv_run[w] += int(plen[take].sum())
        b = st.shape[1]
        if b == 0:
            step_end[w] = np.inf
            return
        rows = st[1] + st[3] % st[2]
        sum_d = int(np.bitwise_count(or_reduce(flat_bits[rows], axis=0)).sum())
        attn = a_base + a_slope * kv_run[w]
        ms = fixed[b] + per_d[b] * sum_d + L * (attn if attn > a_floor else a_floor)
        step_end[w] = t + ms * 1e-3
        log_w.append(w)
        log_t.append(t)
        log_b.append(b)
        log_d.append(sum_d)
        log_ms.append(ms)

    def end_step(w: int, t: float) -> None:
        st = state[w]
        st[3:5] += 1
        kv[w] += st.shape[1]  # every running request appended one token to its KV cache
        kv_run[w] += st.shape[1]
        if fresh[w]:
            first[st[0, -fresh[w]:]] = t
        done = st[4] >= st[5]
        if done.any():
            ids = st[0, done]
            finish[ids] = t
            freed = int(plen[ids].sum() + st[4, done].sum())
            kv[w] -= freed
            kv_run[w] -= freed
            state[w] = st[:, ~done]
            active[w] -= ids.size
        start_step(w, t)

    ai = 0
    view = ClusterView(active, kv, free, waiting)
    while True:
        w = int(step_end.argmin())
        t_end = step_end[w]
        if ai < n and arrival[ai] <= t_end:
            t = float(arrival[ai])
            view.time_s = t
            batch = RequestBatch(plen[ai:ai + 1], None if sig is None else sig[ai:ai + 1], dom[ai:ai + 1])
            dest = int(router.route(batch, view)[0])
            if not 0 <= dest < K:
                raise ValueError(f"router {router!r} returned worker {dest}; expected one in [0, {K})")
            worker[ai] = dest
            queues[dest].append(ai)
            waiting[dest] += 1
            kv[dest] += plen[ai]  # the KV cache arrives from the prefill tier with the request
            if step_end[dest] == np.inf:  # an idle worker starts at once
                start_step(dest, t)
            ai += 1
            continue
        if t_end == np.inf:
            break
        end_step(w, float(t_end))

    steps = pd.DataFrame({"worker": np.asarray(log_w, np.int64), "t_s": np.asarray(log_t), "batch": np.asarray(log_b, np.int64),
                          "sum_distinct": np.asarray(log_d, np.int64), "step_ms": np.asarray(log_ms)})
    summary = summarize_requests(arrival, first, finish, olen)
    return SimResult(summary, worker, first, finish, steps, L)


__all__ = ["DecodeRequests", "SimResult", "pack_expert_bits", "poisson_requests", "simulate"]
