"""Paper-coefficient mode: a discrete-event simulator of an rA-1F bundle with the theory's own stage times.

This is the reproduction of the paper's figures (linear stage times from six coefficients, geometric
decode lengths): it agrees with the closed form largely by construction. The independent check is
:mod:`moelab.afd.measured` (measured stage tables, real request lengths).

Token dynamics. Each attention instance holds ``microbatches`` groups of B slots. Every decode step
each slot emits one token; its request then ends with probability p = 1/(1+mu_D) and the slot is
refilled at once with a new request (prompt drawn around mu_P, decode age 0), so decode lengths are
geometric with mean mu_D and slots stay full. A slot's KV load is prompt + age, and an instance's load
is the sum over its slots, so loads differ between instances and fluctuate from step to step.
The loads of all steps are built at once from renewal times (bincount + cumsum), not slot by slot.

Timing. A microbatch step flows through four single-server stages in order: attention on all r
instances (each instance works through its microbatches FIFO at ``a_A*T_i + b_A`` times its speed
factor; the microbatch moves on when its slowest instance finishes - the straggler barrier), the
A->F transfer ``t_C(B)``, the FFN ``t_F(rB)`` and the F->A transfer ``t_C(B)``. Microbatch j's next
step may start only after its previous step has come back. With ``microbatches >= 3`` the stages
overlap, so the long-run cycle approaches the slowest stage - the theory's ``t_cyc = max(t_A, t_C, t_F)``
- and the simulation adds what theory averages away: stragglers and load fluctuations.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from moelab._validate import check_array, check_int, check_real
from moelab.afd.coefficients import AFDCoefficients
from moelab.afd.coefficients import check_coefficients as _coeffs
from moelab.afd.theory import (
    DEFAULT_REQUESTS,
    idle_ratios,
    optimal_ratio,
    termination_prob,
    throughput_per_instance,
)


@dataclass(frozen=True)
class AFDSimResult:
    """What one simulated run measured. Times are in the coefficients' unit."""

    r: int
    B: int
    steps: int
    microbatches: int
    throughput_per_instance: float  # tokens per time unit per instance (r attention + 1 FFN)
    attention_idle: float  # share of attention-instance time spent waiting
    ffn_idle: float  # share of FFN time spent waiting
    makespan: float
    tokens: int
    mean_attention_time: float  # mean per-instance attention stage time
    mean_straggler_time: float  # mean of the per-microbatch max over instances
    ffn_time: float
    comm_time: float
    mean_token_load: float  # KV tokens per instance per microbatch, averaged over the run
    unit: str

    def as_dict(self) -> dict:
        return asdict(self)


def _group_loads(B: int, K: int, p: float, prompt_draw, rng: np.random.Generator) -> np.ndarray:
    """KV-token load of one group of B slots at steps 0..K-1 (length-K array)."""
    age_drop = np.zeros(K)  # sum of renewal gaps at each step: what the ages lose when slots refill
    prompt_jump = np.zeros(K)  # prompt change of the refilled slots at each step
    prompt = prompt_draw(rng, B)
    first = float(prompt.sum())
    # renewal times of every slot: gaps ~ Geometric(p) on {1,2,...} (survive each step w.p. 1-p)
    expected = K * p
    n_cols = max(4, int(expected + 6 * math.sqrt(expected) + 8))
    start = np.zeros(B, dtype=np.int64)
    active = np.arange(B)
    while active.size:
        gaps = rng.geometric(p, size=(active.size, n_cols)) if p < 1 else np.ones((active.size, n_cols), np.int64)
        times = start[active, None] + np.cumsum(gaps, axis=1)
        new_prompts = prompt_draw(rng, active.size * n_cols).reshape(active.size, n_cols)
        prev_prompts = np.concatenate([prompt[active, None], new_prompts[:, :-1]], axis=1)
        inside = times < K
        age_drop += np.bincount(times[inside], weights=gaps[inside], minlength=K)
        prompt_jump += np.bincount(times[inside], weights=(new_prompts - prev_prompts)[inside], minlength=K)
        start[active] = times[:, -1]
        prompt[active] = new_prompts[:, -1]
        active = active[times[:, -1] < K]
    # sum of ages = B*k - (sum of current start times); both jumps accumulate over steps
    return first + B * np.arange(K, dtype=np.float64) - np.cumsum(age_drop) + np.cumsum(prompt_jump)


def _slot_loads(n_groups: int, B: int, K: int, p: float, prompt_draw, rngs) -> np.ndarray:
    """Loads of ``n_groups`` groups of B slots -> (n_groups, K). ``rngs`` is one Generator per group
    (or one shared Generator)."""
    if isinstance(rngs, np.random.Generator):
        rngs = [rngs] * n_groups
    return np.stack([_group_loads(B, K, p, prompt_draw, rngs[g]) for g in range(n_groups)])


def _prompt_sampler(mu_P: float, prompt_cv: float, prompt_lengths: np.ndarray | None):
    """``draw(rng, n)`` -> n prompt lengths."""
    if prompt_lengths is not None:
        # a measured length distribution (e.g. a request trace), rescaled to mean mu_P
        scaled = prompt_lengths * (mu_P / prompt_lengths.mean())
        return lambda rng, n: rng.choice(scaled, size=n)
    if prompt_cv == 0 or mu_P == 0:
        return lambda rng, n: np.full(n, float(mu_P))
    shape = 1.0 / prompt_cv**2
    return lambda rng, n: rng.gamma(shape, mu_P / shape, size=n)


# bounded work (documented caps, shared with moelab.afd.measured; larger values are refused, never clamped)
MAX_R = 256  # attention instances per bundle
MAX_B = 8192  # slots per attention instance and microbatch
MAX_REQUESTS = 1_000_000  # requests per slot group
MAX_STEPS = 2_000_000  # decode steps of one run
MAX_CELLS = 60_000_000  # steps x microbatches x instances held in memory
MAX_MICROBATCHES = 16


def _entropy(seed: int | np.random.Generator | None) -> int:
    """One integer that seeds every random stream of a run."""
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**63))
    if seed is None:
        return int(np.random.SeedSequence().entropy % 2**63)
    return check_int("seed", seed, low=0)


def _pipeline(attn: np.ndarray, r_values: np.ndarray, t_C, t_F: np.ndarray, m: int, t_back=None) -> np.ndarray:
    """Makespans of the four-stage pipeline for several bundle sizes at once.

    ``attn`` is (jobs, r_max) attention times in job order; row ``q`` of the batch uses the first
    ``r_values[q]`` instances, FFN time ``t_F[q]``, A->F transfer ``t_C`` and F->A transfer ``t_back``
    (scalars or one value per row; ``t_back`` defaults to ``t_C``).

    The jobs are a sequential recurrence (a job's attention waits for its microbatch's previous return),
    so the loop over jobs stays, compiled (:mod:`moelab.afd._pipeline_jit`; the interactive panel of notebook 03
    runs this on every slider move). Per job:

    * the instance clocks of all rows live in one flat array (row q's first r_q instances side by side),
      and each row's straggler barrier is the maximum over its segment;
    * the three single-server stages after attention are one max-plus scan: with
      ``g1 = c1, g2 = c2 - t1, g3 = c3 - t1 - t2`` (``c`` the stages' last completions, ``t`` their
      times), a job with barrier ``b`` gives ``g_k' = t_k + max(b, g_1..g_k)``.
    """
    r = np.asarray(r_values, dtype=np.int64)
    n = len(r)
    t1 = np.ascontiguousarray(np.broadcast_to(np.asarray(t_C, dtype=np.float64), (n,)))
    t2 = np.ascontiguousarray(np.broadcast_to(np.asarray(t_F, dtype=np.float64), (n,)))
    t3 = np.ascontiguousarray(np.broadcast_to(np.asarray(t_C if t_back is None else t_back, dtype=np.float64), (n,)))
    starts = np.concatenate([[0], np.cumsum(r)[:-1]]).astype(np.int64)
    col_of = np.concatenate([np.arange(k) for k in r]).astype(np.int64)  # flat position -> instance
    row_of = np.repeat(np.arange(n), r).astype(np.int64)  # flat position -> row
    # lazy: numba loads (or, on a fresh cache, compiles) the job loop on the first simulation only
    from moelab.afd._pipeline_jit import pipeline_completions

    g3 = pipeline_completions(np.ascontiguousarray(attn, dtype=np.float64), col_of, row_of, starts, r, t1, t2, t3,
                              int(m))
    return g3 + (t1 + t2)


def simulate(r: int, B: int, mu_P: float, mu_D: float, *, steps: int | None = None, requests: float | None = None,
             coeffs: AFDCoefficients | None = None, microbatches: int = 3, prompt_cv: float = 0.5,
             speed_cv: float = 0.0, prompt_lengths: np.ndarray | None = None, seed: int | None = 0) -> AFDSimResult:
    """Simulate an rA-1F bundle and measure throughput per instance and idle ratios.

    Parameters
    ----------
    r : int
        Attention instances (>= 1).
    B : int
        Request slots per attention instance and microbatch (>= 1).
    mu_P, mu_D : float
        Mean prompt length (>= 0) and mean geometric decode length (>= 0), tokens.
    steps, requests : optional
        Horizon: ``steps`` decode steps, or ``requests`` per slot group (``K = N/(B p)`` steps, the
        theory's horizon). Give at most one; default ``requests=10_000``.
    coeffs : AFDCoefficients, optional
        Stage latencies (paper's Ascend fit by default).
    microbatches : int
        Microbatches in flight per instance (>= 1); 3 lets attention, transfers and FFN overlap.
    prompt_cv : float
        Coefficient of variation of the gamma-distributed prompt lengths (0 = all equal to mu_P).
    speed_cv : float
        Spread of fixed per-instance speed factors (lognormal, mean 1): slow instances, not only
        heavy ones. 0 = identical hardware.
    prompt_lengths : array, optional
        Resample prompt lengths from this measured distribution (rescaled to mean ``mu_P``).
    seed : int, optional
        Seed; equal seeds give equal results.
    """
    return _simulate_many([check_int("r", r, low=1, high=MAX_R)], B, mu_P, mu_D, steps=steps, requests=requests, coeffs=coeffs,
                          microbatches=microbatches, prompt_cv=prompt_cv, speed_cv=speed_cv,
                          prompt_lengths=prompt_lengths, seed=seed)[0]


def _simulate_many(r_values, B, mu_P, mu_D, *, steps=None, requests=None, coeffs=None, microbatches=3,
                   prompt_cv=0.5, speed_cv=0.0, prompt_lengths=None, seed=0) -> list[AFDSimResult]:
    """:func:`simulate` for several r at once. Under common random numbers instance i's requests do
    not depend on r, so one set of loads and one pass of the pipeline serve every r: each result is
    exactly what a separate :func:`simulate` call returns."""
    c = _coeffs(coeffs)
    r_arr = np.array([check_int("r", r, low=1, high=MAX_R) for r in r_values], dtype=np.int64)
    B = check_int("B", B, low=1, high=MAX_B)
    mu_P = check_real("mu_P", mu_P, low=0)
    mu_D = check_real("mu_D", mu_D, low=0)
    m = check_int("microbatches", microbatches, low=1, high=MAX_MICROBATCHES)
    prompt_cv = check_real("prompt_cv", prompt_cv, low=0)
    speed_cv = check_real("speed_cv", speed_cv, low=0)
    if prompt_lengths is not None:
        prompt_lengths = check_array("prompt_lengths", prompt_lengths, ndim=1, low=0, dtype=np.float64)
        if prompt_lengths.size == 0 or prompt_lengths.mean() <= 0:
            raise ValueError("prompt_lengths must be a non-empty array with a positive mean")
    p = termination_prob(mu_D)
    if steps is not None and requests is not None:
        raise ValueError("give steps or requests, not both")
    if steps is not None:
        K = check_int("steps", steps, low=1, high=MAX_STEPS)
    else:
        N = DEFAULT_REQUESTS if requests is None else check_real("requests", requests, low=0, low_open=True,
                                                                  high=MAX_REQUESTS)
        K = max(1, round(N / (B * p)))
        if K > MAX_STEPS:
            raise ValueError(f"requests must keep the run at most MAX_STEPS={MAX_STEPS} steps; {N:g} requests need {K}")
    if K * m * int(r_arr.max()) > MAX_CELLS:
        raise ValueError(f"r, steps/requests and microbatches need {K * m * int(r_arr.max())} load cells; the cap is "
                         f"MAX_CELLS={MAX_CELLS}")
    entropy = _entropy(seed)
    r_max = int(r_arr.max())
    # common random numbers: the slot group of (microbatch mb, instance i) draws from its own stream
    # keyed by (mb, i), so instance i sees the same requests at every r and curves over r are smooth
    rngs = [np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(mb, i)))
            for mb in range(m) for i in range(r_max)]
    loads = _slot_loads(m * r_max, B, K, p, _prompt_sampler(mu_P, prompt_cv, prompt_lengths), rngs)
    speed = np.ones(r_max)
    if speed_cv > 0:
        sigma = math.sqrt(math.log1p(speed_cv**2))
        speed = np.array([np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(1_000_000, i)))
                          .lognormal(-sigma**2 / 2, sigma) for i in range(r_max)])
    # job order: step k, microbatch mb -> row k*m + mb; columns are instances
    attn = np.ascontiguousarray(((c.a_A * loads + c.b_A).reshape(m, r_max, K) * speed[None, :, None])
                                .transpose(2, 0, 1).reshape(K * m, r_max))
    t_C = c.a_C * B + c.b_C
    t_F = c.a_F * r_arr * B + c.b_F
    makespans = _pipeline(attn, r_arr, t_C, t_F, m)
    jobs = K * m
    busy = np.cumsum(attn.sum(axis=0))  # total attention work of the first r instances
    straggler = np.maximum.accumulate(attn, axis=1).mean(axis=0)  # mean barrier time with r instances
    group_load = loads.reshape(m, r_max, K).mean(axis=(0, 2))
    out = []
    for q, r in enumerate(r_arr.tolist()):
        makespan = float(makespans[q])
        tokens = jobs * r * B
        out.append(AFDSimResult(
            r=r, B=B, steps=K, microbatches=m,
            throughput_per_instance=tokens / ((r + 1) * makespan),
            attention_idle=1.0 - float(busy[r - 1]) / (r * makespan),
            ffn_idle=1.0 - jobs * float(t_F[q]) / makespan,
            makespan=makespan, tokens=tokens,
            mean_attention_time=float(busy[r - 1]) / (jobs * r), mean_straggler_time=float(straggler[r - 1]),
            ffn_time=float(t_F[q]), comm_time=t_C, mean_token_load=float(group_load[:r].mean()), unit=c.unit,
        ))
    return out


R_SWEEP = (1, 2, 4, 8, 16, 24, 32)


def sweep(r_values=R_SWEEP, B: int = 256, mu_P: float = 100, mu_D: float = 500, *, requests: float | None = None,
          coeffs: AFDCoefficients | None = None, seed: int | None = 0, **sim_kwargs) -> pd.DataFrame:
    """Theory vs simulation for each r: throughput per instance and idle ratios (one row per r).

    Every r runs with the same seed: common random numbers (see :func:`simulate`), so the curve over
    r is smooth and its argmax is not decided by seed noise."""
    r_arr = check_array("r_values", r_values, ndim=1, low=1, high=MAX_R).astype(np.int64)
    if r_arr.size == 0:
        raise ValueError("r_values must hold at least one r >= 1")
    N = DEFAULT_REQUESTS if requests is None else requests
    theory = throughput_per_instance(r_arr.astype(np.float64), B, mu_P, mu_D, N, coeffs)
    idle = idle_ratios(r_arr.astype(np.float64), B, mu_P, mu_D, N, coeffs)
    results = _simulate_many(r_arr.tolist(), B, mu_P, mu_D, requests=N, coeffs=coeffs, seed=_entropy(seed), **sim_kwargs)
    rows = []
    for i, (r, res) in enumerate(zip(r_arr.tolist(), results)):
        rows.append({
            "r": r, "theory_throughput": float(theory[i]), "sim_throughput": res.throughput_per_instance,
            "theory_attention_idle": float(idle["attention"][i]), "theory_ffn_idle": float(idle["ffn"][i]),
            "sim_attention_idle": res.attention_idle, "sim_ffn_idle": res.ffn_idle,
            "sim_straggler_time": res.mean_straggler_time, "sim_attention_time": res.mean_attention_time,
            "ffn_time": res.ffn_time,
        })
    df = pd.DataFrame(rows)
    df["sim_vs_theory_pct"] = 100 * (df["sim_throughput"] / df["theory_throughput"] - 1)
    return df


def idle_crossing(df: pd.DataFrame, prefix: str = "sim") -> float | None:
    """The r where the attention and FFN idle curves cross (linear interpolation between rows);
    None when they do not cross inside the swept range."""
    needed = ["r", f"{prefix}_attention_idle", f"{prefix}_ffn_idle"]
    missing = [c for c in needed if not isinstance(df, pd.DataFrame) or c not in df.columns]
    if missing:
        raise ValueError(f"df must be a DataFrame with the columns {needed} (prefix={prefix!r} names the sweep's "
                         f"columns, e.g. 'sim' or 'theory'); missing {missing}")
    r = df["r"].to_numpy(np.float64)
    diff = (df[f"{prefix}_attention_idle"] - df[f"{prefix}_ffn_idle"]).to_numpy()
    for i in range(len(r) - 1):
        if diff[i] == 0:
            return float(r[i])
        if diff[i] * diff[i + 1] < 0:
            return float(r[i] + (r[i + 1] - r[i]) * diff[i] / (diff[i] - diff[i + 1]))
    return float(r[-1]) if diff[-1] == 0 else None


def straggler_crossing(df: pd.DataFrame) -> float | None:
    """The r at which the FFN step catches up with the *slowest* attention instance (linear interpolation
    between rows): where the simulated bundle really turns from attention-bound to FFN-bound.

    The closed form balances the FFN against the *mean* attention step at the theory's load ``Tbar``
    (``r_A``); the simulator's microbatch waits for its slowest instance, so its turn lies where
    ``ffn_time`` reaches ``sim_straggler_time`` instead. Below this r stragglers cost throughput, above it the
    FFN is the bottleneck and hides them; the simulated optimum is an integer next to it (when it is above
    the FFN peak).

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep with the columns ``r``, ``ffn_time`` and ``sim_straggler_time`` (:func:`sweep`,
        ``simulated_optimum(...).fine`` or :attr:`moelab.afd.MeasuredSweep.frame`), sorted by ``r``.

    Returns
    -------
    float or None
        The crossing r; None when the FFN step stays below (or above) the slowest instance over the whole sweep.
    """
    needed = ["r", "ffn_time", "sim_straggler_time"]
    missing = [c for c in needed if not isinstance(df, pd.DataFrame) or c not in df.columns]
    if missing:
        raise ValueError(f"df must be a DataFrame with the columns {needed} (a sweep's frame); missing {missing}")
    f = df.sort_values("r")
    r = f["r"].to_numpy(np.float64)
    diff = (f["ffn_time"] - f["sim_straggler_time"]).to_numpy(np.float64)
    for i in range(len(r) - 1):
        if diff[i] == 0:
            return float(r[i])
        if diff[i] < 0 < diff[i + 1]:
            return float(r[i] + (r[i + 1] - r[i]) * -diff[i] / (diff[i + 1] - diff[i]))
    return float(r[-1]) if len(r) and diff[-1] == 0 else None


@dataclass(frozen=True)
class OptimumCheck:
    """Simulated optimum vs the closed-form r*."""

    r_star: float
    r_star_int: int  # the integer r the closed form rates best (r is a count of instances)
    r_sim: int  # integer r with the highest simulated throughput
    r_sim_interp: float  # vertex of the parabola through r_sim and its neighbours (sub-integer estimate)
    coarse: pd.DataFrame  # the sweep over R_SWEEP
    fine: pd.DataFrame  # the integer sweep around the coarse optimum

    @property
    def gap_pct(self) -> float:
        """100*|r_sim - r*|/r* (integer simulated optimum; at least the distance of r* to an integer)."""
        return 100 * abs(self.r_sim - self.r_star) / self.r_star

    @property
    def interp_gap_pct(self) -> float:
        """100*|r_sim_interp - r*|/r*."""
        return 100 * abs(self.r_sim_interp - self.r_star) / self.r_star


def _vertex(r: np.ndarray, f: np.ndarray, i: int) -> float:
    """Sub-integer argmax: the vertex of the parabola through points i-1, i, i+1 (clipped to them)."""
    if i == 0 or i == len(r) - 1:
        return float(r[i])
    x, y = r[i - 1:i + 2].astype(float), f[i - 1:i + 2].astype(float)
    # the parabola through three points in closed form (Newton's divided differences): an interpolation,
    # not a fit, so no least squares is involved
    s01, s12 = (y[1] - y[0]) / (x[1] - x[0]), (y[2] - y[1]) / (x[2] - x[1])
    a = (s12 - s01) / (x[2] - x[0])
    b = s01 - a * (x[0] + x[1])
    return float(np.clip(-b / (2 * a), x[0], x[2])) if a < 0 else float(r[i])


def simulated_optimum(B: int = 256, mu_P: float = 100, mu_D: float = 500, *, requests: float | None = None,
                      coeffs: AFDCoefficients | None = None, r_values=R_SWEEP, seed: int | None = 0,
                      **sim_kwargs) -> OptimumCheck:
    """Locate the simulated optimum: the coarse sweep ``r_values``, then every integer between the
    best coarse point's neighbours (r is a count of instances, so the optimum is an integer)."""
    N = DEFAULT_REQUESTS if requests is None else requests
    r_star = optimal_ratio(B, mu_P, mu_D, N, coeffs)
    coarse = sweep(r_values, B, mu_P, mu_D, requests=N, coeffs=coeffs, seed=seed, **sim_kwargs)
    best = int(coarse["sim_throughput"].to_numpy().argmax())
    rs = coarse["r"].to_numpy()
    lo, hi = rs[max(best - 1, 0)], rs[min(best + 1, len(rs) - 1)]
    inner = [x for x in range(int(lo), int(hi) + 1) if x not in set(rs.tolist())]
    fine = sweep(inner, B, mu_P, mu_D, requests=N, coeffs=coeffs, seed=_entropy(seed) if seed is None else seed,
                 **sim_kwargs) if inner else coarse.iloc[:0]
    both = pd.concat([coarse, fine]).sort_values("r").reset_index(drop=True)
    i = int(both["sim_throughput"].to_numpy().argmax())
    r_all = both["r"].to_numpy()
    r_star_int = int(r_all[int(both["theory_throughput"].to_numpy().argmax())])
    return OptimumCheck(r_star, r_star_int, int(r_all[i]), _vertex(r_all, both["sim_throughput"].to_numpy(), i),
                        coarse, both)


__all__ = ["R_SWEEP", "AFDSimResult", "OptimumCheck", "idle_crossing", "simulate", "simulated_optimum", "straggler_crossing",
           "sweep"]
