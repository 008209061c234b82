"""The PD-disaggregated decode tier: the whole life of a decode request in one place.

1. **Arrival.** A request arrives at the decode tier after prefill, bringing its KV cache
   (``prompt_len`` tokens) and whatever its trace has (signature, domain, prompt key, prefix hashes).
2. **Instance routing.** The ``router`` places it on one of ``K`` decode instances at its arrival
   time (:class:`~moelab.routing.ClusterView` over instances: running, queued, KV tokens held).
   The request queues at that instance.
3. **Admission.** At every step boundary an instance admits queued requests. With ``ranks=1`` (an
   independent decode worker, ELDR's cluster) it takes them FCFS up to ``slots`` running. With
   ``ranks=G > 1`` the instance is a DP-attention + EP group of ``G`` barrier-synchronised ranks of
   ``slots`` each: the ``rank_router`` (one copy per instance) sees the queue as a batch and the
   ranks as a view (running, KV load, free slots, the running requests, steps waited) and picks a
   rank per request (``-1`` keeps it queued) — BalanceRoute's setting, one level down, admitted by the
   same rule as :func:`moelab.sim.dp.simulate_dp` (:func:`moelab.sim.dp.route_to_ranks`).
4. **Decode step.** Every running request decodes one token. The step's latency comes from the one
   :class:`~moelab.costmodel.DecodeStepModel`: distinct experts of the instance's whole batch summed
   over MoE layers (the requests' own expert traces; all ranks' tokens go through the same EP experts),
   the batch and its KV bytes; with ranks, the slowest rank's attention sets the barrier
   (:meth:`~moelab.costmodel.DecodeStepModel.ep_step_ms`).
5. **Finish.** A request that produced ``output_len`` tokens leaves and frees its KV cache.

Event-driven: the next event is the next arrival or the earliest step end. Distinct experts per step
are counted with bitsets (each captured decode token's expert set pre-packed into ``[L, ceil(E/64)]``
uint64 words; a batch's union is one ``bitwise_or.reduce`` and one ``bitwise_count``). A request
replays its trace row's decode tokens cyclically from its ``trace_offset``. Requests without trace
rows are priced at uniform routing (:meth:`DecodeStepModel.expected_sum_distinct`, no locality).

Bounds on work (refused with a ``ValueError`` naming the parameter and the cap, never truncated): at most
:data:`MAX_DECODE_TOKENS` decode tokens in a run (the sum of ``output_len`` over the requests: every decode
token is one step of its request, and a run of batch-1 steps costs ~10 us of Python per token, so the cap
keeps the worst case at a couple of minutes), :data:`MAX_INSTANCES` instances, :data:`MAX_SLOTS` slots per
rank and at most :data:`MAX_GROUP_SLOTS` = ``slots x ranks`` per instance (the step tables are built for
every batch ``0..slots x ranks``: the separate maxima multiplied would need 2 GiB per table).
"""

from __future__ import annotations

import copy
from collections import deque

import numpy as np
import pandas as pd

from moelab._validate import check_instance, check_int
from moelab.costmodel.step import DecodeStepModel
from moelab.routing.base import ActiveRequests, ClusterView, RequestBatch, Router, check_supplies
from moelab.sim.dp import route_to_ranks
from moelab.sim.result import SimResult
from moelab.traces.expert import ExpertTrace
from moelab.traces.requests import RequestTrace

#: most decode tokens (sum of ``output_len``) in one run: the worst case (batch-1 steps) runs in minutes
MAX_DECODE_TOKENS = 10_000_000
MAX_INSTANCES = 4096
MAX_SLOTS = 1 << 16
#: most ``slots x ranks`` of one instance: the step tables hold one entry per batch 0..slots x ranks
#: (4M float64 entries = 32 MiB per table)
MAX_GROUP_SLOTS = 1 << 22
_UNLIMITED = 1 << 30
#: most coming steps of one instance whose distinct experts are counted in one pass (the counts of steps
#: past the next admission are thrown away, so a longer look-ahead wastes work on a busy instance)
_LOOKAHEAD = 16

#: cluster-level fields every run supplies to the instance router (request columns are added per trace)
INSTANCE_FIELDS = frozenset({"prompt_len", "output_len", "active", "waiting", "kv_tokens", "free_slots", "time_s",
                             "active_requests", "waiting_tokens"})
#: what the rank router sees inside a DP group
RANK_FIELDS = frozenset({"prompt_len", "output_len", "active", "waiting", "kv_tokens", "free_slots", "time_s",
                         "active_requests", "waited_steps", "waiting_tokens"})
_REQUEST_FIELDS = ("signature", "domain", "prompt_key", "prefix_hashes")


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


def supplied_fields(requests: RequestTrace) -> frozenset[str]:
    """What the decode tier can tell an instance router about ``requests``."""
    return INSTANCE_FIELDS | {f for f in _REQUEST_FIELDS if getattr(requests, f) is not None}


def simulate(
    requests: RequestTrace,
    router: Router,
    cost: DecodeStepModel,
    *,
    n_workers: int,
    slots: int = 256,
    trace: ExpertTrace | None = None,
    bits: np.ndarray | None = None,
    ranks: int = 1,
    rank_router: Router | None = None,
    pool_view: int = 512,
) -> SimResult:
    """Simulate the decode tier (see the module docstring).

    Parameters
    ----------
    requests : the arrivals (:class:`~moelab.traces.RequestTrace`; ``trace_row``/``trace_offset`` to
        replay expert traces, e.g. from :func:`~moelab.traces.replay_requests`)
    router : instance router; reset for ``n_workers``; refused if it needs a field the trace lacks
    cost : the step model at the trace's geometry
    n_workers : decode instances K (1..MAX_INSTANCES)
    slots : most running requests per rank (the per-worker batch cap)
    trace : the expert trace ``trace_row`` indexes (required when requests have trace rows)
    bits : :func:`pack_expert_bits` of ``trace`` (saves time across runs)
    ranks : DP-attention ranks per instance G (1 = an independent decode worker)
    rank_router : router over the ranks of one instance (required when ``ranks > 1``)
    pool_view : most queued requests the rank router sees per step
    """
    K = check_int("n_workers", n_workers, low=1, high=MAX_INSTANCES)
    cap = check_int("slots", slots, low=1, high=MAX_SLOTS)
    G = check_int("ranks", ranks, low=1, high=MAX_INSTANCES)
    if G * cap > MAX_GROUP_SLOTS:
        raise ValueError(f"slots x ranks must be <= MAX_GROUP_SLOTS={MAX_GROUP_SLOTS} (the step tables hold one entry "
                         f"per batch up to slots x ranks); got slots={cap} x ranks={G} = {G * cap}")
    pool_view = check_int("pool_view", pool_view, low=1)
    check_instance("requests", requests, RequestTrace, "a RequestTrace")
    check_instance("router", router, Router, "a Router")
    check_instance("cost", cost, DecodeStepModel, "a DecodeStepModel (cost model)")
    if rank_router is not None:
        check_instance("rank_router", rank_router, Router, "a Router")
    n = len(requests)
    if n == 0:
        raise ValueError("requests must hold at least one request")
    total = int(requests.output_len.sum())
    if total > MAX_DECODE_TOKENS:
        raise ValueError(f"requests ask for {total} decode tokens (sum of output_len over {n} requests); the simulator "
                         f"is bounded at MAX_DECODE_TOKENS={MAX_DECODE_TOKENS} so a run ends in minutes (use fewer or "
                         "shorter requests)")
    check_supplies(router, supplied_fields(requests), "the decode-cluster simulator (this trace)")
    if G > 1:
        if rank_router is None:
            raise ValueError("rank_router is required when ranks > 1 (e.g. make_router('jsq'))")
        check_supplies(rank_router, RANK_FIELDS | {f for f in _REQUEST_FIELDS if getattr(requests, f) is not None},
                       "the DP group of the decode-cluster simulator")
    replay = requests.trace_row is not None
    if replay:
        if trace is None:
            raise ValueError("requests have trace_row: pass the expert trace they index (trace=)")
        g = trace.geometry
        cost.check_geometry(g.num_layers, g.num_experts, g.top_k)
        if requests.trace_row.max() >= trace.n_requests:
            raise ValueError(f"trace_row must index the trace's {trace.n_requests} requests; got max {requests.trace_row.max()}")
        if np.any(trace.decode_lens[requests.trace_row] < 1):
            raise ValueError("every replayed trace row needs at least one captured decode token")
        if bits is None:
            bits = pack_expert_bits(trace)
        else:  # every dimension: a wrong word count would be read as is and price the steps wrong
            want = tuple(trace.decode_ids.shape[:2]) + ((g.num_experts + 63) // 64,)
            if not isinstance(bits, np.ndarray) or bits.dtype != np.uint64 or bits.shape != want:
                got = f"{bits.dtype} {bits.shape}" if isinstance(bits, np.ndarray) else type(bits).__name__
                raise ValueError(f"bits must be pack_expert_bits(trace): uint64 of shape {want} ([decode tokens, "
                                 f"num_layers, ceil(num_experts/64)]); got {got}")
    router.reset(K)
    rank_routers = [copy.deepcopy(rank_router).reset(G) for _ in range(K)] if G > 1 else []

    L = cost.num_layers
    table = cost.table(cap)
    ep = cost.ep_table(G, cap) if G > 1 else None
    fixed = table.fixed_ms.tolist()
    per_d = table.ms_per_distinct.tolist()
    a_floor, a_base, a_slope = table.attn_floor_ms, table.attn_base_ms, table.attn_ms_per_token
    uniform_d = cost.expected_sum_distinct(np.arange(G * cap + 1)).tolist()

    arrival = requests.arrival_s
    plen = requests.prompt_len
    olen = requests.output_len
    if replay:
        start_row = trace.decode_offsets[requests.trace_row].astype(np.int64)
        tlen = trace.decode_lens[requests.trace_row].astype(np.int64)
        off = requests.trace_offset.astype(np.int64)
        flat_bits = bits.reshape(bits.shape[0], -1)  # [sum T, L * words]: one contiguous row per token
    else:
        start_row = np.zeros(n, np.int64)
        tlen = np.ones(n, np.int64)
        off = np.zeros(n, np.int64)
        flat_bits = None
    sig, dom, key, pfx = requests.signature, requests.domain, requests.prompt_key, requests.prefix_hashes
    want_active = "active_requests" in router.requires

    worker = np.full(n, -1, dtype=np.int64)
    rank_of = np.full(n, -1, dtype=np.int64)
    admit = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    # per instance, one int64 block [7, batch]: request, first trace row, trace length, phase
    # (offset + tokens done), tokens done, output length, rank — admission concatenates, finishing compacts
    state: list[np.ndarray] = [np.zeros((7, 0), np.int64) for _ in range(K)]
    fresh: list[np.ndarray | int] = [0] * K  # requests admitted at the last step start
    queues: list[deque] = [deque() for _ in range(K)]
    # G == 1: steps ended since the block was brought up to date, steps from then to the batch's first
    # finish, and the distinct-expert counts of the coming steps (from step ``ahead_from`` of the lag on)
    lag = [0] * K
    to_finish = [_UNLIMITED] * K
    ahead: list[list[int]] = [[] for _ in range(K)]
    ahead_from = [0] * K
    enq_step = np.zeros(n, np.int64)
    n_steps_w = [0] * K
    active = np.zeros(K, np.int64)
    waiting = np.zeros(K, np.int64)
    wait_tok = np.zeros(K, np.int64)  # prompt tokens queued per instance
    kv = np.zeros(K, np.int64)  # KV tokens an instance holds (queued requests included): what routers see
    kv_run = [0] * K  # KV tokens of the running batch: what attention reads
    free = np.full(K, _UNLIMITED, np.int64)  # instances queue without limit; the cap applies at admission
    step_end = np.full(K, np.inf)
    log: dict[str, list] = {k: [] for k in ("worker", "t_s", "batch", "sum_distinct", "step_ms")}
    if G > 1:
        for k in ("max_load", "sum_load", "decision_ms"):
            log[k] = []
    or_reduce = np.bitwise_or.reduce
    req_block = np.stack([np.arange(n), start_row, tlen, off, np.zeros(n, np.int64), olen, np.zeros(n, np.int64)])

    def admit_ranks(w: int, t: float, st: np.ndarray) -> tuple[np.ndarray, float]:
        """The rank router of instance ``w`` places queued requests on its ranks."""
        q = queues[w]
        if not q:
            return np.zeros(0, np.int64), float("nan")
        running = np.bincount(st[6], minlength=G) if st.shape[1] else np.zeros(G, np.int64)
        free_r = cap - running
        if free_r.max() <= 0:
            return np.zeros(0, np.int64), float("nan")
        ids = st[0]
        work = plen[ids] + st[4]
        loads = np.bincount(st[6], weights=work, minlength=G).astype(np.int64) if st.shape[1] else np.zeros(G, np.int64)
        front = np.fromiter((q[i] for i in range(min(pool_view, len(q)))), np.int64)
        act = ActiveRequests(st[6].copy(), work, st[4].copy(), plen[ids], None if key is None else key[ids], olen[ids])
        view = ClusterView(running, loads, free_r, None, t, step=n_steps_w[w], active_requests=act,
                           waited_steps=n_steps_w[w] - enq_step[front], waiting_tokens=np.zeros(G, np.int64))
        batch = RequestBatch(plen[front], None if sig is None else sig[front], None if dom is None else dom[front],
                             olen[front], front, None if key is None else key[front],
                             None if pfx is None else tuple(pfx[i] for i in front.tolist()))
        where, chosen, dec = route_to_ranks(rank_routers[w], batch, view, free_r)
        take = front[chosen]
        rank_of[take] = where[chosen]
        if take.size:
            keep = set(take.tolist())
            queues[w] = deque(r for r in q if r not in keep)
        return take, dec

    def catch_up(w: int) -> np.ndarray:
        """Apply the steps instance ``w`` ended since its block was last brought up to date."""
        st = state[w]
        if lag[w]:
            st[3:5] += lag[w]
            to_finish[w] -= lag[w]
            ahead_from[w] -= lag[w]  # the counts ahead stay valid: they follow the same phases
            lag[w] = 0
        return st

    def distinct_ahead(w: int, st: np.ndarray) -> None:
        """Distinct experts of the next steps of ``w`` while its batch stays as it is (until its first
        finish), counted for up to :data:`_LOOKAHEAD` steps in one vectorised pass: a step's count depends
        only on the batch and each request's trace phase, both known in advance between events."""
        n_ahead = min(to_finish[w] - lag[w], _LOOKAHEAD)
        phase = st[3][None, :] + (lag[w] + np.arange(n_ahead))[:, None]
        rows = st[1][None, :] + phase % st[2][None, :]
        counts = np.bitwise_count(or_reduce(flat_bits[rows], axis=1)).reshape(n_ahead, -1).sum(axis=1)
        ahead[w] = counts.tolist()
        ahead_from[w] = lag[w]

    def start_step(w: int, t: float) -> None:
        q = queues[w]
        fresh[w] = 0
        dec = float("nan")
        if G == 1:
            room = cap - state[w].shape[1]
            take = [q.popleft() for _ in range(min(room, len(q)))] if q and room > 0 else []
            if take:
                st = catch_up(w)
                ahead[w] = []
            st = state[w]
        else:
            st = state[w]
            take, dec = admit_ranks(w, t, st)
        if len(take):
            block = req_block[:, take]
            if G > 1:
                block = block.copy()
                block[6] = rank_of[take]
            st = np.concatenate([st, block], axis=1)
            state[w] = st
            waiting[w] -= len(take)
            wait_tok[w] -= int(plen[take].sum())
            active[w] += len(take)
            fresh[w] = np.asarray(take, np.int64)
            admit[take] = t
            kv_run[w] += int(plen[take].sum())
            to_finish[w] = int((st[5] - st[4]).min())
        b = st.shape[1]
        n_steps_w[w] += 1
        if b == 0:
            step_end[w] = np.inf
            if queues[w]:
                raise RuntimeError(f"rank router {rank_routers[w]!r} left {len(queues[w])} requests queued on an "
                                   f"empty instance")
            return
        if replay and G == 1:
            i = lag[w] - ahead_from[w]
            if not 0 <= i < len(ahead[w]):
                distinct_ahead(w, st)
                i = 0
            sum_d = ahead[w][i]
        elif replay:
            rows = st[1] + st[3] % st[2]
            sum_d = int(np.bitwise_count(or_reduce(flat_bits[rows], axis=0)).sum())
        else:
            sum_d = uniform_d[b]
        if G == 1:
            attn = a_base + a_slope * kv_run[w]
            ms = fixed[b] + per_d[b] * sum_d + L * (attn if attn > a_floor else a_floor)
        else:
            b_r = np.bincount(st[6], minlength=G)
            kv_r = np.bincount(st[6], weights=plen[st[0]] + st[4], minlength=G)
            ms = ep.step_ms(b_r.tolist(), sum_d, kv_r.tolist())
            log["max_load"].append(int(kv_r.max()))
            log["sum_load"].append(int(kv_r.sum()))
            log["decision_ms"].append(dec)
        step_end[w] = t + ms * 1e-3
        log["worker"].append(w)
        log["t_s"].append(t)
        log["batch"].append(b)
        log["sum_distinct"].append(sum_d)
        log["step_ms"].append(ms)

    def end_step(w: int, t: float) -> None:
        st = state[w]
        b = st.shape[1]
        kv[w] += b  # every running request appended one token to its KV cache
        kv_run[w] += b
        f = fresh[w]
        if not isinstance(f, int):
            first[f] = t
        if G == 1:  # the block's phases and counts advance lazily: only a finish or an admission reads them
            lag[w] += 1
            if lag[w] < to_finish[w]:
                start_step(w, t)
                return
            st = catch_up(w)
            ahead[w] = []
        else:
            st[3:5] += 1
        done = st[4] >= st[5]
        if done.any():
            ids = st[0, done]
            finish[ids] = t
            freed = int(plen[ids].sum() + st[4, done].sum())
            kv[w] -= freed
            kv_run[w] -= freed
            state[w] = st = st[:, ~done]
            active[w] -= ids.size
        to_finish[w] = int((st[5] - st[4]).min()) if st.shape[1] else _UNLIMITED
        start_step(w, t)

    def active_view() -> ActiveRequests:
        for w in range(K):
            catch_up(w)
        blocks = [s for s in state if s.shape[1]]
        if not blocks:
            z = np.zeros(0, np.int64)
            return ActiveRequests(z, z, z, z, None, z)
        st = np.concatenate(blocks, axis=1)
        wk = np.concatenate([np.full(s.shape[1], i, np.int64) for i, s in enumerate(state) if s.shape[1]])
        ids = st[0]
        return ActiveRequests(wk, plen[ids] + st[4], st[4].copy(), plen[ids], None if key is None else key[ids], olen[ids])

    ai = 0
    view = ClusterView(active, kv, free, waiting, waiting_tokens=wait_tok)
    while True:
        w = int(step_end.argmin())
        t_end = step_end[w]
        if ai < n and arrival[ai] <= t_end:
            t = float(arrival[ai])
            view.time_s = t
            if want_active:
                view.active_requests = active_view()
            sl = slice(ai, ai + 1)
            batch = RequestBatch(plen[sl], None if sig is None else sig[sl], None if dom is None else dom[sl], olen[sl],
                                 None, None if key is None else key[sl], None if pfx is None else pfx[sl])
            dest = int(router.route(batch, view)[0])
            if not 0 <= dest < K:
                raise ValueError(f"router {router!r} returned worker {dest}; expected one in [0, {K})")
            worker[ai] = dest
            queues[dest].append(ai)
            enq_step[ai] = n_steps_w[dest]
            waiting[dest] += 1
            wait_tok[dest] += plen[ai]
            kv[dest] += plen[ai]  # the KV cache arrives from the prefill tier with the request
            if step_end[dest] == np.inf:  # an idle instance starts at once
                start_step(dest, t)
            ai += 1
            continue
        if t_end == np.inf:
            break
        end_step(w, float(t_end))

    if np.isnan(finish).any():
        raise RuntimeError(f"{int(np.isnan(finish).sum())} requests never finished (a router kept them queued)")
    steps = pd.DataFrame({k: np.asarray(v) for k, v in log.items()})
    if G > 1:
        steps["ranks"] = G
    req = pd.DataFrame({"arrival_s": arrival, "prompt_len": plen, "output_len": olen, "worker": worker,
                        "rank": np.maximum(rank_of, 0), "admit_s": admit, "first_token_s": first, "finish_s": finish})
    name = router.name if G == 1 else f"{router.name} x {rank_router.name}"
    return SimResult(req, steps, name, K, cap, L, {"ranks": G} if G > 1 else {})


__all__ = ["INSTANCE_FIELDS", "MAX_DECODE_TOKENS", "MAX_GROUP_SLOTS", "MAX_INSTANCES", "MAX_SLOTS", "RANK_FIELDS", "pack_expert_bits",
           "simulate", "supplied_fields"]
