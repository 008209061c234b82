"""The compiled event loop of :func:`moelab.sim.cluster.simulate` for independent decode instances
(``ranks=1``, ELDR's cluster).

Why compiled: one worker-step of the Python loop costs ~10-20 us of interpreter work (bookkeeping of a
few dozen requests in numpy blocks), which caps a 16-worker run near 60k worker-steps/s. Here the
same physics runs in numba between arrivals; the loop hands control back to Python at every arrival
(routers are Python objects called once per request, and they read the live ``active``/``kv``/
``waiting``/``waiting_tokens`` arrays this loop updates in place) and when the step log is full.

Bit-identical to the Python loop (``tests/test_sim_speed.py``): the same float64 operations in the same
order (``fixed[b] + per_d[b] * sum_d + L * max(attn, floor)``, ``t + ms * 1e-3``), the same tie-break
(the lowest worker index among equal step ends, as ``argmin``), the same FCFS order of queues and
batches (a request is appended at admission; finishing keeps the others' order).

State: per request, singly linked lists (``nxt``) thread each instance's FCFS queue and its running
batch in order; per instance, head/tail/length. A tournament tree over the instances' step ends gives
the next step end in O(log K) per event (a scan over K = 4096 instances per step would dominate).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: what :func:`run` returns: the next arrival needs routing, the step log is full, or every event is done
ARRIVAL, LOG_FULL, DONE = 0, 1, 2

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@njit(cache=True, inline="always")
def _popcount(x: np.uint64) -> int:
    # SWAR popcount: every constant is uint64 so numba never promotes to float64
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return int((x * _H01) >> np.uint64(56))


@njit(cache=True, inline="always")
def _append(nxt: np.ndarray, head: np.ndarray, tail: np.ndarray, w: int, i: int) -> None:
    """Append request ``i`` to list ``w`` (a queue or a running batch: singly linked through ``nxt``)."""
    nxt[i] = -1
    if tail[w] >= 0:
        nxt[tail[w]] = i
    else:
        head[w] = i
    tail[w] = i


@njit(cache=True, inline="always")
def _tree_update(tree: np.ndarray, step_end: np.ndarray, w: int) -> None:
    # tree[1] is the instance with the earliest step end; ties go to the lower index (the left child)
    v = (tree.size // 2 + w) >> 1
    while v >= 1:
        a, b = tree[2 * v], tree[2 * v + 1]
        tree[v] = a if step_end[a] <= step_end[b] else b
        v >>= 1


def new_tree(n_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """An all-idle tournament tree: ``(tree, step_end)`` with ``step_end`` padded to a power of two."""
    p = 1
    while p < n_workers:
        p *= 2
    step_end = np.full(p, np.inf)
    tree = np.zeros(2 * p, np.int64)
    tree[p:] = np.arange(p)
    for v in range(p - 1, 0, -1):
        tree[v] = tree[2 * v]  # all ends are inf: the left (lower) index wins
    return tree, step_end


@njit(cache=True)
def _start_step(w, t, cap, plen, olen, start_row, tlen, off, done, nxt, admit,
                q_head, q_tail, q_len, r_head, r_tail, r_len,
                active, waiting, wait_tok, kv_run, step_end, tree,
                replay, flat_bits, acc, fixed, per_d, uniform_d, n_layers, a_floor, a_base, a_slope,
                log_w, log_t, log_b, log_d, log_ms, ctr):
    room = cap - r_len[w]
    take = min(room, q_len[w]) if room > 0 else 0
    if take > 0:
        tok = 0
        for _ in range(take):  # FCFS: the queue's head joins the end of the batch
            i = q_head[w]
            q_head[w] = nxt[i]
            _append(nxt, r_head, r_tail, w, i)
            admit[i] = t
            tok += plen[i]
        if q_head[w] < 0:
            q_tail[w] = -1
        q_len[w] -= take
        r_len[w] += take
        waiting[w] -= take
        wait_tok[w] -= tok
        active[w] += take
        kv_run[w] += tok
    b = r_len[w]
    if b == 0:
        step_end[w] = np.inf
        _tree_update(tree, step_end, w)
        return
    if replay:
        acc[:] = 0
        i = r_head[w]
        while i >= 0:
            row = start_row[i] + (off[i] + done[i]) % tlen[i]
            for j in range(acc.size):
                acc[j] |= flat_bits[row, j]
            i = nxt[i]
        d = 0
        for j in range(acc.size):
            d += _popcount(acc[j])
        sum_d = float(d)
    else:
        sum_d = uniform_d[b]
    attn = a_base + a_slope * kv_run[w]
    ms = fixed[b] + per_d[b] * sum_d + n_layers * (attn if attn > a_floor else a_floor)
    step_end[w] = t + ms * 1e-3
    _tree_update(tree, step_end, w)
    k = ctr[1]
    log_w[k] = w
    log_t[k] = t
    log_b[k] = b
    log_d[k] = sum_d
    log_ms[k] = ms
    ctr[1] = k + 1


@njit(cache=True)
def run(dest, cap, arrival, plen, olen, start_row, tlen, off, done, nxt, admit, first, finish,
        q_head, q_tail, q_len, r_head, r_tail, r_len,
        active, waiting, wait_tok, kv, kv_run, step_end, tree,
        replay, flat_bits, acc, fixed, per_d, uniform_d, n_layers, a_floor, a_base, a_slope,
        log_w, log_t, log_b, log_d, log_ms, ctr):
    """Advance the cluster until the next arrival needs routing, the step log is full, or the end.

    ``ctr`` = [next arrival, steps logged]. ``dest >= 0``: the arrival ``ctr[0]`` was routed to ``dest``
    (queued there, its KV counted, an idle instance starts at once) before the loop resumes. The log
    needs room for one more step on entry.
    """
    n = arrival.size
    if dest >= 0:
        i = ctr[0]
        _append(nxt, q_head, q_tail, dest, i)
        q_len[dest] += 1
        waiting[dest] += 1
        wait_tok[dest] += plen[i]
        kv[dest] += plen[i]  # the KV cache arrives from the prefill tier with the request
        ctr[0] = i + 1
        if step_end[dest] == np.inf:  # an idle instance starts at once
            _start_step(dest, arrival[i], cap, plen, olen, start_row, tlen, off, done, nxt, admit,
                        q_head, q_tail, q_len, r_head, r_tail, r_len, active, waiting, wait_tok, kv_run, step_end,
                        tree, replay, flat_bits, acc, fixed, per_d, uniform_d, n_layers, a_floor, a_base, a_slope,
                        log_w, log_t, log_b, log_d, log_ms, ctr)
    while True:
        if ctr[1] >= log_w.size:
            return LOG_FULL
        w = tree[1]
        t = step_end[w]
        if ctr[0] < n and arrival[ctr[0]] <= t:
            return ARRIVAL
        if t == np.inf:
            return DONE
        # the step of w ends: every running request appended one token; finished ones leave
        b = r_len[w]
        kv[w] += b
        kv_run[w] += b
        freed = 0
        n_fin = 0
        prev = -1
        i = r_head[w]
        while i >= 0:
            nx = nxt[i]
            if done[i] == 0:  # admitted at this step's start: its first token
                first[i] = t
            done[i] += 1
            if done[i] >= olen[i]:
                finish[i] = t
                freed += plen[i] + done[i]
                n_fin += 1
                if prev >= 0:
                    nxt[prev] = nx
                else:
                    r_head[w] = nx
                if r_tail[w] == i:
                    r_tail[w] = prev
                nxt[i] = -1
            else:
                prev = i
            i = nx
        kv[w] -= freed
        kv_run[w] -= freed
        active[w] -= n_fin
        r_len[w] -= n_fin
        _start_step(w, t, cap, plen, olen, start_row, tlen, off, done, nxt, admit,
                    q_head, q_tail, q_len, r_head, r_tail, r_len, active, waiting, wait_tok, kv_run, step_end,
                    tree, replay, flat_bits, acc, fixed, per_d, uniform_d, n_layers, a_floor, a_base, a_slope,
                    log_w, log_t, log_b, log_d, log_ms, ctr)


@njit(cache=True)
def running(r_head, nxt, n_running):
    """Every running request and its instance, instance by instance in batch order."""
    wk = np.empty(n_running, np.int64)
    ids = np.empty(n_running, np.int64)
    k = 0
    for w in range(r_head.size):
        i = r_head[w]
        while i >= 0:
            wk[k] = w
            ids[k] = i
            k += 1
            i = nxt[i]
    return wk, ids
