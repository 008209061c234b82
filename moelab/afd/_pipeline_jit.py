"""The compiled job loop of :func:`moelab.afd.sim._pipeline` (the rA-1F bundle's four-stage pipeline).

Why compiled: the jobs are a sequential recurrence (a job's attention waits for its microbatch's previous
return), so the loop over jobs cannot be vectorised away; in numpy each job costs about a dozen whole-array
calls, ~14 us of call overhead, and a run of 10,000 requests per slot group is ~60k jobs. Notebook 03's
interactive panel re-runs it on every slider move (its coarse grid, then every integer around the best).

Bit-identical to the numpy loop it replaces (``tests/test_afd_sim.py``): the same float64 additions and
maxima in the same order (a maximum is exact, so the straggler barrier's order of comparison does not matter).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def pipeline_completions(attn: np.ndarray, col_of: np.ndarray, row_of: np.ndarray, starts: np.ndarray,
                         r: np.ndarray, t1: np.ndarray, t2: np.ndarray, t3: np.ndarray, m: int) -> np.ndarray:
    """The last job's F->A return (``g3``) of each row: ``attn`` (jobs, r_max) attention times, row ``q`` using
    instances ``col_of[starts[q]:starts[q] + r[q]]``; ``t1``, ``t2``, ``t3`` the A->F, FFN and F->A times per row;
    ``m`` microbatches. :func:`moelab.afd.sim._pipeline` adds ``t1 + t2`` to get the makespans."""
    n = r.size
    flat = col_of.size
    t12 = t1 + t2
    t12_flat = np.empty(flat)
    for p in range(flat):
        t12_flat[p] = t12[row_of[p]]
    free = np.zeros(flat)  # when each instance of each row is next free
    back = np.empty((m, flat))  # each microbatch's last return, as g3 per flat position
    for mb in range(m):
        for p in range(flat):
            back[mb, p] = -t12_flat[p]
    g1 = np.zeros(n)
    g2 = -t1
    g3 = -t12
    for j in range(attn.shape[0]):
        mb = j % m
        for q in range(n):
            s = starts[q]
            barrier = 0.0
            for p in range(s, s + r[q]):
                release = back[mb, p] + t12_flat[p]
                f = free[p] if free[p] >= release else release
                f = f + attn[j, col_of[p]]
                free[p] = f
                if p == s or f > barrier:
                    barrier = f
            # the three single-server stages: g_k' = t_k + max(barrier, g_1..g_k)
            s1 = barrier if barrier >= g1[q] else g1[q]
            s2 = s1 if s1 >= g2[q] else g2[q]
            s3 = s2 if s2 >= g3[q] else g3[q]
            g1[q] = s1 + t1[q]
            g2[q] = s2 + t2[q]
            g3[q] = s3 + t3[q]
        for p in range(flat):
            back[mb, p] = g3[row_of[p]]
    return g3
