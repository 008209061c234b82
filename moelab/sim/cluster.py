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
uint64 words; a batch's union is an OR over its requests' rows and a popcount). A request
replays its trace row's decode tokens cyclically from its ``trace_offset``. Requests without trace
rows are priced at uniform routing (:meth:`DecodeStepModel.expected_sum_distinct`, no locality).

Two loops, one physics: independent instances (``ranks=1``) run in a compiled event loop
(:mod:`moelab.sim._cluster_jit`, numba) that returns to Python only to route each arrival; DP groups
(``ranks > 1``, whose rank routers are Python objects called at every admission) run in the Python loop
below. The Python loop runs ``ranks=1`` too, as the reference the compiled one must equal bit for bit
(``tests/test_sim_speed.py``).

Bounds on work (refused with a ``ValueError`` naming the parameter and the cap, never truncated): at most
:data:`MAX_REQUESTS` requests (each is one Python routing call, tens of us with view and batch, so the
per-request worst case, one-token requests, ends in about a minute), at most :data:`MAX_DECODE_TOKENS`
decode tokens (the sum of ``output_len``) on independent instances and :data:`MAX_GROUP_DECODE_TOKENS` on
DP groups (every decode token is at worst one step of its own: a batch-1 step costs on the order of a
microsecond in the compiled loop and ~10 us in the Python loop, so either worst case ends in minutes; the
compiled loop's step log keeps 40 bytes per step, 2.7 GB at the cap and about twice that while it grows),
:data:`MAX_INSTANCES` instances, :data:`MAX_SLOTS` slots per rank and at most :data:`MAX_GROUP_SLOTS` =
``slots x ranks`` per instance (the step tables are built for every batch ``0..slots x ranks``: the
separate maxima multiplied would need 2 GiB per table).
"""

from __future__ import annotations

import copy
from collections import deque

import numpy as np
import pandas as pd

from moelab._validate import check_instance, check_int
from moelab.costmodel.step import DecodeStepModel, StepTable
from moelab.routing.base import ActiveRequests, ClusterView, RequestBatch, Router, call_router, check_supplies
from moelab.sim.dp import route_to_ranks
from moelab.sim.result import SimResult
from moelab.traces.expert import ExpertTrace
from moelab.traces.requests import RequestTrace

#: most decode tokens (sum of ``output_len``) in one run of independent instances: the worst case (every
#: token a batch-1 step of the compiled loop) runs in minutes, and 100k requests x 512 tokens fit
MAX_DECODE_TOKENS = 1 << 26
#: most decode tokens in one run of DP groups (``ranks > 1``): the Python loop's batch-1 worst case
MAX_GROUP_DECODE_TOKENS = 10_000_000
#: most requests in one run: every arrival is one Python routing call
MAX_REQUESTS = 1 << 20
MAX_INSTANCES = 4096
MAX_SLOTS = 1 << 16
#: most ``slots x ranks`` of one instance: the step tables hold one entry per batch 0..slots x ranks
#: (4M float64 entries = 32 MiB per table)
MAX_GROUP_SLOTS = 1 << 22
_UNLIMITED = 1 << 30
#: first size of the compiled loop's step log (it doubles when full, never past the run's decode tokens)
_LOG_START = 1 << 16

#: cluster-level fields every run supplies to the instance router (request columns are added per trace)
INSTANCE_FIELDS = frozenset({"prompt_len", "output_len", "active", "waiting", "kv_tokens", "free_slots", "time_s",
                             "active_requests", "waiting_tokens"})
#: what the rank router sees inside a DP group
RANK_FIELDS = frozenset({"prompt_len", "output_len", "active", "waiting", "kv_tokens", "free_slots", "time_s",
                         "active_requests", "waited_steps", "waiting_tokens"})
_REQUEST_FIELDS = ("signature", "domain", "prompt_key", "prefix_hashes")


def pack_expert_bits(trace: ExpertTrace) -> np.ndarray:
    """Every decode token's expert set as bits: uint64 ``[sum T, L, ceil(E/64)]``."""
    check_instance("trace", trace, ExpertTrace, "an ExpertTrace")
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
    check_instance("requests", requests, RequestTrace, "a RequestTrace")
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

    The positional order, ``(requests, router, cost)``, is every decode-tier simulator's
    (:func:`moelab.eldr.simulate` too); everything else is a keyword.

    Parameters
    ----------
    requests : RequestTrace
        The arrivals (``trace_row``/``trace_offset`` to replay expert traces, e.g. from
        :func:`~moelab.traces.replay_requests`).
    router : Router
        The instance router; reset for ``n_workers``; refused, naming the field, if it requires a field
        the requests lack (:func:`moelab.routing.check_supplies`).
    cost : DecodeStepModel
        The step model at the trace's geometry.
    n_workers : int
        Decode instances K (1..:data:`MAX_INSTANCES`).
    slots : int
        Most running requests per rank (the per-worker batch cap).
    trace : ExpertTrace, optional
        The expert trace ``trace_row`` indexes (required when the requests have trace rows).
    bits : ndarray, optional
        :func:`pack_expert_bits` of ``trace`` (saves time across runs).
    ranks : int
        DP-attention ranks per instance G (1 = an independent decode worker).
    rank_router : Router, optional
        Router over the ranks of one instance (required when ``ranks > 1``).
    pool_view : int
        Most queued requests the rank router sees per step.

    Returns
    -------
    SimResult
        Per request and per step records; ``metrics()`` gives the run-level figures.
    """
    return _simulate(requests, router, cost, n_workers=n_workers, slots=slots, trace=trace, bits=bits, ranks=ranks,
                     rank_router=rank_router, pool_view=pool_view, python_loop=False)


def _simulate(
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
    python_loop: bool,
) -> SimResult:
    """:func:`simulate`; ``python_loop`` runs independent instances through the Python event loop (the
    reference the compiled loop is tested against) instead of :mod:`moelab.sim._cluster_jit`."""
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
    if n > MAX_REQUESTS:
        raise ValueError(f"requests must hold at most MAX_REQUESTS={MAX_REQUESTS} requests (one routing call each, so "
                         f"a run ends in minutes); got {n}")
    total = int(requests.output_len.sum())
    cap_name, tok_cap = ("MAX_DECODE_TOKENS", MAX_DECODE_TOKENS) if G == 1 else \
        ("MAX_GROUP_DECODE_TOKENS (ranks > 1)", MAX_GROUP_DECODE_TOKENS)
    if total > tok_cap:
        raise ValueError(f"requests ask for {total} decode tokens (sum of output_len over {n} requests); the simulator "
                         f"is bounded at {cap_name}={tok_cap} so a run ends in minutes (use fewer or shorter requests)")
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
    if G == 1 and not python_loop:
        return _run_compiled(requests, router, K, cap, L, table, np.asarray(uniform_d), start_row, tlen, off,
                             None if flat_bits is None else np.ascontiguousarray(flat_bits), want_active)

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

    def start_step(w: int, t: float) -> None:
        q = queues[w]
        fresh[w] = 0
        dec = float("nan")
        if G == 1:
            room = cap - state[w].shape[1]
            take = [q.popleft() for _ in range(min(room, len(q)))] if q and room > 0 else []
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
        b = st.shape[1]
        n_steps_w[w] += 1
        if b == 0:
            step_end[w] = np.inf
            if queues[w]:
                raise RuntimeError(f"rank router {rank_routers[w]!r} left {len(queues[w])} requests queued on an "
                                   f"empty instance")
            return
        if replay:
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
        start_step(w, t)

    def active_view() -> ActiveRequests:
        blocks = [s for s in state if s.shape[1]]
        if not blocks:
            z = np.zeros(0, np.int64)
            return ActiveRequests(z, z, z, z, None, z)
        st = np.concatenate(blocks, axis=1)
        wk = np.concatenate([np.full(s.shape[1], i, np.int64) for i, s in enumerate(state) if s.shape[1]])
        ids = st[0]
        return ActiveRequests(wk, plen[ids] + st[4], st[4].copy(), plen[ids], None if key is None else key[ids], olen[ids])

    ai = 0
    # read-only windows on the live arrays: a router that writes to the view fails (RouterError) instead of
    # silently corrupting the cluster's state
    view = ClusterView(*map(_read_only, (active, kv, free, waiting)), waiting_tokens=_read_only(wait_tok))
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
            # every request is placed on arrival (instances queue without limit): -1 is a bad answer too
            dest = int(call_router(router, batch, view, allow_waiting=False)[0])
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


def _read_only(a: np.ndarray) -> np.ndarray:
    """A non-writeable view of ``a`` (it follows ``a``'s updates)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _run_compiled(requests: RequestTrace, router: Router, K: int, cap: int, L: int, table: StepTable,
                  uniform_d: np.ndarray, start_row: np.ndarray, tlen: np.ndarray, off: np.ndarray,
                  flat_bits: np.ndarray | None, want_active: bool) -> SimResult:
    """Independent instances (``ranks=1``): the compiled loop runs between arrivals; Python routes each
    arrival (the router contract: one call per request, reading the live per-instance arrays)."""
    # lazy: numba's import (~0.3 s) is paid by simulation runs only, not by every `import moelab.sim`
    from moelab.sim import _cluster_jit as jit

    n = len(requests)
    arrival = np.ascontiguousarray(requests.arrival_s, dtype=np.float64)
    plen = np.ascontiguousarray(requests.prompt_len, dtype=np.int64)
    olen = np.ascontiguousarray(requests.output_len, dtype=np.int64)
    sig, dom, key, pfx = requests.signature, requests.domain, requests.prompt_key, requests.prefix_hashes
    replay = flat_bits is not None
    if not replay:
        flat_bits = np.zeros((1, 1), np.uint64)
    acc = np.zeros(flat_bits.shape[1], np.uint64)
    done = np.zeros(n, np.int64)
    nxt = np.full(n, -1, np.int64)
    worker = np.full(n, -1, np.int64)
    admit, first, finish = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    q_head, q_tail, q_len = np.full(K, -1, np.int64), np.full(K, -1, np.int64), np.zeros(K, np.int64)
    r_head, r_tail, r_len = np.full(K, -1, np.int64), np.full(K, -1, np.int64), np.zeros(K, np.int64)
    active, waiting, wait_tok, kv, kv_run = (np.zeros(K, np.int64) for _ in range(5))
    free = np.full(K, _UNLIMITED, np.int64)  # instances queue without limit; the cap applies at admission
    tree, step_end = jit.new_tree(K)
    fixed = np.ascontiguousarray(table.fixed_ms, dtype=np.float64)
    per_d = np.ascontiguousarray(table.ms_per_distinct, dtype=np.float64)
    a_floor, a_base, a_slope = float(table.attn_floor_ms), float(table.attn_base_ms), float(table.attn_ms_per_token)
    # the step log grows by doubling: a run has at most one logged step per decode token, and one slot
    # more than that keeps the loop's "log full" check from ever firing once every token is logged
    most = int(olen.sum()) + 1
    size = min(most, _LOG_START)
    logs = [np.empty(size, np.int64), np.empty(size), np.empty(size, np.int64), np.empty(size), np.empty(size)]
    ctr = np.zeros(2, np.int64)  # next arrival, steps logged

    # read-only windows on the live arrays: a router that writes to the view fails (RouterError) instead of
    # silently corrupting the cluster's state
    view = ClusterView(*map(_read_only, (active, kv, free, waiting)), waiting_tokens=_read_only(wait_tok))
    dest = -1
    while True:
        status = jit.run(dest, cap, arrival, plen, olen, start_row, tlen, off, done, nxt, admit, first, finish,
                         q_head, q_tail, q_len, r_head, r_tail, r_len, active, waiting, wait_tok, kv, kv_run,
                         step_end, tree, replay, flat_bits, acc, fixed, per_d, uniform_d, L, a_floor, a_base, a_slope,
                         *logs, ctr)
        dest = -1
        if status == jit.DONE:
            break
        if status == jit.LOG_FULL or ctr[1] == logs[0].size:  # room for the step an arrival may start
            grow = min(logs[0].size, most - logs[0].size)
            if grow < 1:  # an invariant, checked so a broken one fails instead of looping forever
                raise RuntimeError(f"the step log outgrew the run's {most - 1} decode tokens")
            logs = [np.concatenate([a, np.empty(grow, a.dtype)]) for a in logs]
        if status != jit.ARRIVAL:
            continue
        ai = int(ctr[0])
        view.time_s = float(arrival[ai])
        if want_active:
            wk, ids = jit.running(r_head, nxt, int(r_len.sum()))
            view.active_requests = ActiveRequests(wk, plen[ids] + done[ids], done[ids], plen[ids],
                                                  None if key is None else key[ids], olen[ids])
        sl = slice(ai, ai + 1)
        batch = RequestBatch(plen[sl], None if sig is None else sig[sl], None if dom is None else dom[sl], olen[sl],
                             None, None if key is None else key[sl], None if pfx is None else pfx[sl])
        dest = int(call_router(router, batch, view, allow_waiting=False)[0])
        worker[ai] = dest

    if np.isnan(finish).any():
        raise RuntimeError(f"{int(np.isnan(finish).sum())} requests never finished (a router kept them queued)")
    m = int(ctr[1])
    log_w, log_t, log_b, log_d, log_ms = (a[:m] for a in logs)
    steps = pd.DataFrame({"worker": log_w, "t_s": log_t, "batch": log_b,
                          "sum_distinct": log_d.astype(np.int64) if replay else log_d, "step_ms": log_ms}, copy=False)
    req = pd.DataFrame({"arrival_s": arrival, "prompt_len": plen, "output_len": olen, "worker": worker,
                        "rank": np.zeros(n, np.int64), "admit_s": admit, "first_token_s": first, "finish_s": finish})
    return SimResult(req, steps, router.name, K, cap, L, {})


__all__ = ["INSTANCE_FIELDS", "MAX_DECODE_TOKENS", "MAX_GROUP_DECODE_TOKENS", "MAX_GROUP_SLOTS", "MAX_INSTANCES",
           "MAX_REQUESTS", "MAX_SLOTS", "RANK_FIELDS", "pack_expert_bits", "simulate", "supplied_fields"]
