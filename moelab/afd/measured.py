"""An AFD simulator that does not restate the theory: measured stage times and real request lengths.

What the paper-coefficient simulator (:mod:`moelab.afd.sim`) takes from the theory — linear stage times
from the six coefficients and geometric decode lengths — comes here from measurements:

- **stage times** from a :class:`moelab.afd.calibration.StageTables` (the H200 ``attn_step`` table by the
  KV bytes of each instance's *actual* requests, with its kernel floor; ``moe_step`` at the aggregated
  batch and the distinct experts it activates; the published DeepEP dispatch/combine table for the
  A<->F link by tokens and EP size, flagged where extrapolated);
- **request lengths** from a :class:`LengthDistribution`: (prompt, decode) pairs resampled jointly from
  the bundled Azure LLM inference traces (2023, ``code`` and ``conv``), optionally rescaled to other
  means; ``geometric`` keeps the theory's assumption for comparison.

Each slot serves requests back to back (continuous batching: a finished request's slot is refilled at
once); a request holds its slot for as many steps as it decodes, and its KV load is its prompt plus its
age. Per-instance loads therefore differ and fluctuate, and every microbatch waits for its slowest
instance (stragglers), as consequences of the draws. The pipeline (attention -> A->F -> FFN -> F->A,
``microbatches`` in flight) is the same event recursion as the paper-coefficient simulator.

The theory is then *fitted* to the same tables (:func:`moelab.afd.calibration.fit_coefficients`: the six
coefficients by least squares, fit errors reported) and given the realised mean lengths; its r* is compared
with the simulated optimum — a test of the theory that may fail. Fed the theory's own assumptions
(:class:`moelab.afd.calibration.LinearStages` and geometric lengths) the simulator reduces to the closed
form; that reduction is the one place agreement is expected.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from moelab._validate import check_array, check_choice, check_int, check_real
from moelab.afd.calibration import (
    FIT_R_VALUES,
    CoefficientFit,
    Coverage,
    LinearStages,
    StageTables,
    fit_coefficients,
)
from moelab.afd.coefficients import AFDCoefficients
from moelab.afd.sim import (
    MAX_B,
    MAX_CELLS,
    MAX_MICROBATCHES,
    MAX_R,
    MAX_REQUESTS,
    MAX_STEPS,
    _entropy,
    _pipeline,
    straggler_crossing,
)
from moelab.afd.theory import (
    DEFAULT_REQUESTS,
    attention_takeover_load,
    idle_ratios,
    optimal_ratio,
    ratio_terms,
    throughput_per_instance,
)
from moelab.traces.requests import load_azure_trace

#: The length laws: the theory's geometric one (:meth:`LengthDistribution.geometric`) and the bundled traces
#: (:meth:`LengthDistribution.from_trace`; a simulator also takes these two by name)
LENGTH_SOURCES = ("geometric", "azure-conv", "azure-code")



@dataclass(frozen=True)
class LengthDistribution:
    """Request lengths a simulated slot draws: joint (prompt, decode) pairs, or the theory's geometric law.

    This is how a workload's mean lengths reach the measured simulator (:func:`simulate_measured`,
    :func:`measured_optimum` take it as ``lengths``): build one with :meth:`geometric` (the closed form's own
    assumption, at the means ``mu_P`` and ``mu_D`` the closed form is given) or :meth:`from_trace` (a
    bundled trace's joint lengths, optionally rescaled to those means), and compare the simulator with
    ``optimal_ratio(B, mu_P, mu_D, ...)`` at the same workload.

    ``prompt`` and ``decode`` are the resampled pairs (decode = steps a request holds its slot, >= 1);
    for ``geometric`` the decode steps are Geometric(p) on {1, 2, ...} with ``p = 1/(1+mu_D)`` and the
    prompts gamma-distributed around ``mu_P`` (CV ``prompt_cv``), as in :mod:`moelab.afd.sim`.

    Examples
    --------
    >>> LengthDistribution.geometric(mu_P=1000, mu_D=300).mean_decode
    300.0
    """

    name: str
    prompt: np.ndarray
    decode: np.ndarray
    geometric_mu_D: float | None = None
    prompt_cv: float = 0.0
    source: str = ""

    @classmethod
    def geometric(cls, mu_P: float, mu_D: float, prompt_cv: float = 0.5) -> LengthDistribution:
        """The theory's law at mean prompt ``mu_P`` and mean decode ``mu_D`` (tokens).

        Parameters
        ----------
        mu_P : float
            Mean prompt tokens (>= 0); prompts are gamma-distributed around it.
        mu_D : float
            Mean decode tokens (0..1e7); a request holds its slot for Geometric(1/(1+mu_D)) steps on
            {1, 2, ...}, mean ``1 + mu_D``.
        prompt_cv : float
            Coefficient of variation of the prompts (0..10; 0: every prompt is ``mu_P``).

        Returns
        -------
        LengthDistribution
            Its :attr:`mean_prompt` and :attr:`mean_decode` are ``mu_P`` and ``mu_D`` exactly.
        """
        mu_P = check_real("mu_P", mu_P, low=0)
        mu_D = check_real("mu_D", mu_D, low=0, high=1e7)
        prompt_cv = check_real("prompt_cv", prompt_cv, low=0, high=10)
        return cls("geometric", np.array([mu_P]), np.array([1.0 + mu_D]), mu_D, prompt_cv,
                   "the theory's law: geometric decode, gamma prompts")

    @classmethod
    def from_trace(cls, kind: str = "azure-conv", mu_P: float | None = None, mu_D: float | None = None,
                   ) -> LengthDistribution:
        """Joint (prompt, output) lengths of a bundled trace; ``mu_P``/``mu_D`` rescale each to that mean
        (decode steps rounded to integers >= 1; the realised means are what :attr:`mean_prompt` and
        :attr:`mean_decode` report and what the theory is given).

        Parameters
        ----------
        kind : str
            ``"azure-conv"`` or ``"azure-code"`` (the Azure LLM inference traces of 2023).
        mu_P : float, optional
            Rescale the prompts to this mean (tokens, >= 0); default the trace's own.
        mu_D : float, optional
            Rescale the outputs to this mean (tokens, 0..1e7); default the trace's own.

        Returns
        -------
        LengthDistribution
        """
        check_choice("kind", kind, LENGTH_SOURCES[1:])
        tr = load_azure_trace(kind.split("-", 1)[1], 2023)
        prompt = tr.prompt_len.astype(np.float64)
        decode = tr.output_len.astype(np.float64)
        note = f"{tr.source}: {len(tr)} requests, joint (prompt, output) resampling"
        if mu_P is not None:
            prompt = prompt * (check_real("mu_P", mu_P, low=0) / prompt.mean())
            note += f", prompts rescaled to mean {mu_P:g}"
        if mu_D is not None:
            mu_D = check_real("mu_D", mu_D, low=0, high=1e7)
            decode = np.maximum(1.0, np.round(decode * ((1.0 + mu_D) / decode.mean())))
            note += f", decode rescaled to mean {mu_D:g} (+1 step)"
        return cls(kind, prompt, decode, None, 0.0, note)

    @property
    def mean_prompt(self) -> float:
        """Mean prompt tokens: the theory's ``mu_P`` for this distribution."""
        return float(self.prompt.mean())

    @property
    def mean_steps(self) -> float:
        """Mean steps a request holds its slot."""
        return float(self.decode.mean())

    @property
    def mean_decode(self) -> float:
        """The theory's ``mu_D`` for this distribution: mean slot-holding steps minus one (a geometric
        gap of mean ``1 + mu_D`` is the theory's decode of mean ``mu_D``)."""
        return self.mean_steps - 1.0

    @property
    def steady_load_per_slot(self) -> float:
        """Long-run KV tokens per slot under renewal (size-biased prompt + mean age) — what a slot really
        holds on average, to set beside the theory's ``mu_P + mu_D``."""
        parts = self.steady_load_parts()
        return parts["prompt"] + parts["decode"]

    def steady_load_parts(self) -> dict[str, float]:
        """The two parts of :attr:`steady_load_per_slot`, each against the mean the theory uses.

        A slot is found holding a request in proportion to how long the request holds it, so its long-run
        prompt is the prompt weighted by slot-holding steps (below ``mu_P`` when longer outputs come with
        shorter prompts) and its decoded part is the mean age of the request in the slot (``mu_D`` for the
        geometric law, less for a lighter-tailed decode length, more for a heavier-tailed one).

        Returns
        -------
        dict of str to float
            ``prompt`` and ``decode`` (KV tokens per slot; they sum to :attr:`steady_load_per_slot`),
            ``prompt_ratio`` (``prompt / mu_P``), ``decode_ratio`` (``decode / mu_D``),
            ``prompt_decode_corr`` (Pearson correlation of prompt and slot-holding steps over the pairs; 0
            for the geometric law, whose prompts are drawn independently) and ``decode_cv`` (coefficient of
            variation of the slot-holding steps; the geometric law's is ``sqrt(mu_D / (1 + mu_D))``, about 1).

        Examples
        --------
        >>> LengthDistribution.geometric(mu_P=1000, mu_D=300).steady_load_parts()["decode_ratio"]
        1.0
        """
        if self.geometric_mu_D is not None:
            mu_D = self.geometric_mu_D
            return {"prompt": self.mean_prompt, "decode": mu_D, "prompt_ratio": 1.0,
                    "decode_ratio": 1.0, "prompt_decode_corr": 0.0,
                    "decode_cv": float(np.sqrt(mu_D / (1.0 + mu_D)))}
        d = self.decode
        prompt = float((self.prompt * d).sum() / d.sum())
        decode = float(((d - 1) * d / 2).sum() / d.sum())
        varies = self.prompt.std() > 0 and d.std() > 0
        return {"prompt": prompt, "decode": decode,
                "prompt_ratio": prompt / self.mean_prompt if self.mean_prompt > 0 else float("nan"),
                "decode_ratio": decode / self.mean_decode if self.mean_decode > 0 else float("nan"),
                "prompt_decode_corr": float(np.corrcoef(self.prompt, d)[0, 1]) if varies else 0.0,
                "decode_cv": float(d.std() / d.mean())}

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, decode-steps) pairs (``n`` at most :data:`MAX_DRAWS`: two float arrays of ``n``)."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy Generator (np.random.default_rng(seed)); got {type(rng).__name__}")
        n = check_int("n", n, low=0, high=MAX_DRAWS)
        if self.geometric_mu_D is not None:
            mu_P, p = float(self.prompt[0]), 1.0 / (1.0 + self.geometric_mu_D)
            if self.prompt_cv == 0 or mu_P == 0:
                prompts = np.full(n, mu_P)
            else:
                shape = 1.0 / self.prompt_cv**2
                prompts = rng.gamma(shape, mu_P / shape, size=n)
            gaps = rng.geometric(p, size=n).astype(np.float64) if p < 1 else np.ones(n)
            return prompts, gaps
        idx = rng.integers(0, self.prompt.size, size=n)
        return self.prompt[idx], self.decode[idx]


#: the most length pairs one draw makes: 2 x 8 bytes each, 256 MiB at the cap
MAX_DRAWS = 1 << 24


def _renewal_loads(B: int, K: int, lengths: LengthDistribution, rng: np.random.Generator) -> np.ndarray:
    """KV-token load of one group of B slots at steps 0..K-1 under renewal with ``lengths``.

    Sum of loads = sum(prompt of the current request) + sum(age) and age = k - start, so the load is
    built from the jumps at renewal times (bincount + cumsum), not slot by slot."""
    prompt0, gap0 = lengths.draw(rng, B)
    age_drop = np.zeros(K)
    prompt_jump = np.zeros(K)
    first = float(prompt0.sum())
    start = gap0.astype(np.int64)  # renewal time of each slot's current request end
    prompt = prompt0.copy()
    drop = gap0.copy()  # what the slot's age loses at its next renewal (its request's length)
    n_cols = max(4, int(2 * K / max(lengths.mean_steps, 1.0)) + 4)
    active = np.flatnonzero(start < K)
    while active.size:
        new_p, new_g = lengths.draw(rng, active.size * n_cols)
        new_p = new_p.reshape(active.size, n_cols)
        new_g = new_g.reshape(active.size, n_cols).astype(np.int64)
        # renewal j happens at times[:, j]; the request starting there lasts new_g[:, j]
        times = start[active, None] + np.concatenate([np.zeros((active.size, 1), np.int64),
                                                      np.cumsum(new_g[:, :-1], axis=1)], axis=1)
        drops = np.concatenate([drop[active, None], new_g[:, :-1].astype(np.float64)], axis=1)
        prev_p = np.concatenate([prompt[active, None], new_p[:, :-1]], axis=1)
        inside = times < K
        age_drop += np.bincount(times[inside], weights=drops[inside], minlength=K)
        prompt_jump += np.bincount(times[inside], weights=(new_p - prev_p)[inside], minlength=K)
        start[active] = times[:, -1] + new_g[:, -1]
        drop[active] = new_g[:, -1]
        prompt[active] = new_p[:, -1]
        active = active[start[active] < K]
    return first + B * np.arange(K, dtype=np.float64) - np.cumsum(age_drop) + np.cumsum(prompt_jump)


@dataclass(frozen=True)
class MeasuredSweep:
    """One independent simulation over several r, with the fitted theory beside it.

    Every time is in :attr:`unit` (``"ms"`` for the measured :class:`~moelab.afd.calibration.StageTables`;
    a :class:`~moelab.afd.calibration.LinearStages` run is in its coefficients' unit, ``"cycles"`` for the
    paper's fit), and every throughput is in **tokens per** :attr:`unit` **per instance**: the tokens the
    bundle emits divided by its ``r + 1`` instances (r attention, one FFN) and by the time taken. With
    ``unit == "ms"``, multiply by 1000 for tokens per second per instance.

    Attributes
    ----------
    frame : pandas.DataFrame
        One row per simulated r, in the order asked, with the columns

        - ``r``: attention instances per FFN instance;
        - ``sim_throughput``: simulated tokens per :attr:`unit` per instance, ``tokens / ((r + 1) *
          makespan)``;
        - ``theory_throughput``: the closed form's (:func:`moelab.afd.throughput_per_instance`) with
          :attr:`coeffs` at the realised means :attr:`mu_P`, :attr:`mu_D` and horizon :attr:`requests`
          (same unit);
        - ``stage_bound_throughput``: ``r*B / ((r + 1) * t)`` with ``t`` the slowest of the simulated
          stages' *mean* times (attention, both links, FFN): what the bundle would emit if no straggler
          or pipeline bubble cost anything (same unit);
        - ``sim_attention_idle``, ``sim_ffn_idle``: the share of the makespan an attention instance (on
          average) and the FFN instance spent waiting, in [0, 1];
        - ``theory_attention_idle``, ``theory_ffn_idle``: the closed form's ``1 - t_A/t_cyc`` and
          ``1 - t_F/t_cyc`` (:func:`moelab.afd.idle_ratios`);
        - ``sim_attention_time``: mean attention stage time of one instance for one microbatch step
          (:attr:`unit`);
        - ``sim_straggler_time``: mean over microbatch steps of the *slowest* of the r instances'
          attention times, what the barrier waits for (:attr:`unit`);
        - ``sim_token_load``: the KV tokens one of the r instances really holds per microbatch, averaged over
          the run (the simulated counterpart of the closed form's ``Tbar``; it differs from ``Tbar`` when the
          lengths are not geometric, because the lengths' shape decides how fast the load builds up over the
          horizon);
        - ``ffn_time``: the FFN stage time at ``r*B`` tokens (:attr:`unit`);
        - ``ffn_extrapolated``: whether ``r*B`` lies above the measured FFN table, so ``ffn_time`` (and every
          throughput of the row) extends the table's last segment: a projection, not a measurement;
        - ``link_af_time``, ``link_fa_time``: the attention->FFN and FFN->attention transfers of one
          microbatch (:attr:`unit`; 0 without a link table);
        - ``makespan``: simulated time until the last microbatch step returns (:attr:`unit`);
        - ``tokens``: tokens emitted, ``steps * microbatches * r * B``;
        - ``sim_vs_theory_pct``: ``100 * (sim_throughput / theory_throughput - 1)``.
    B : int
        Request slots per attention instance and microbatch.
    lengths : str
        Name of the :class:`LengthDistribution` drawn from (``"geometric"``, ``"azure-conv"``, ...).
    mu_P, mu_D : float
        The realised mean prompt and decode lengths (tokens) of that distribution: what the theory
        columns and :attr:`r_star` are given.
    steps : int
        Decode steps each microbatch runs, NOTATION's ``n_steps = requests * mean_steps / B`` (the paper's
        ``K``); each step is one forward
        of the whole bundle for that microbatch, so the run makes ``steps * microbatches`` forwards.
    microbatches : int
        Microbatches in flight per attention instance.
    coverage : dict
        How many stage evaluations fell outside the measured tables (``attention_evals``,
        ``attention_extrapolated``, ``ffn_evals``, ``ffn_extrapolated``, ``link_evals``,
        ``link_ep_extrapolated``, ``link_volume_extrapolated``) and ``notes``
        (:class:`~moelab.afd.calibration.Coverage`): attention and FFN evaluations beyond their tables are
        extrapolated (the last segment extended linearly; the FFN table stops at ``B <= 256`` tokens, which
        ``r * B`` passes quickly on long prompts or large r), while a link at an EP size ``r + 1`` outside
        the DeepEP table (8..256) holds the table's end bandwidth (a saturating curve that a linear
        extension would overshoot). Nonzero ``*_extrapolated`` counts mean the row's times rest partly on
        that.
    fit : CoefficientFit or None
        The least-squares fit of the six coefficients to the stage tables on :data:`FIT_R_VALUES`, with
        its errors; None when the stages are the theory's own (:class:`LinearStages`) or ``coeffs`` was
        given.
    coeffs : AFDCoefficients
        The coefficients the theory columns and :attr:`r_star` use.
    unit : str
        The time unit of every time and throughput above (``"ms"`` for the measured tables).
    steady_load_per_slot : float
        Long-run KV tokens one slot holds under renewal with these lengths (size-biased prompt plus mean
        age), to set beside the theory's ``mu_P + mu_D``.
    requests : float
        Requests per slot group, the theory's horizon N.
    notes : list of str
        Where the lengths and stage times came from.
    ffn_table_max_batch : float
        The largest aggregated batch (tokens) the stage tables of this sweep measure on the FFN side
        (``inf`` for :class:`LinearStages`): a row whose ``r*B`` lies above it is ``ffn_extrapolated``.
    steady_load_parts : dict of str to float
        :meth:`LengthDistribution.steady_load_parts` of these lengths: why :attr:`steady_load_per_slot`
        differs from ``mu_P + mu_D`` (the slot-weighted prompt against ``mu_P``, the mean age against ``mu_D``).
    """

    frame: pd.DataFrame
    B: int
    lengths: str
    mu_P: float
    mu_D: float
    steps: int
    microbatches: int
    coverage: dict
    fit: CoefficientFit | None
    coeffs: AFDCoefficients
    unit: str
    steady_load_per_slot: float
    requests: float = DEFAULT_REQUESTS
    notes: list[str] = field(default_factory=list)
    ffn_table_max_batch: float = float("inf")
    steady_load_parts: dict = field(default_factory=dict)

    @property
    def r_star(self) -> float:
        """The closed form's r* with the fitted coefficients and the realised mean lengths."""
        return optimal_ratio(self.B, self.mu_P, self.mu_D, self.requests, self.coeffs)

    @property
    def r_star_int(self) -> int:
        """The integer r the fitted closed form rates best among the swept r (r counts machines)."""
        f = self.frame
        return int(f["r"].to_numpy()[int(f["theory_throughput"].to_numpy().argmax())])

    @property
    def r_sim(self) -> int:
        """The simulated optimum: the swept r with the highest ``sim_throughput`` (the first swept on ties;
        see :attr:`optimum_at_edge`)."""
        f = self.frame
        return int(f["r"].to_numpy()[int(f["sim_throughput"].to_numpy().argmax())])

    @property
    def optimum_at_edge(self) -> bool:
        """True when the simulated optimum is the largest r swept (the true optimum may lie beyond)."""
        return self.r_sim == int(self.frame["r"].max()) and self.r_sim > 1

    @property
    def gap_pct(self) -> float:
        """Signed ``100 * (r_sim - r*) / r*``."""
        return 100.0 * (self.r_sim - self.r_star) / self.r_star

    def throughput_gap_pct(self, r: int) -> float:
        """``100 * (simulated / theory - 1)`` throughput at ``r`` (must be one of the swept r)."""
        row = self.frame[self.frame["r"] == r]
        if row.empty:
            raise ValueError(f"r must be one of the swept r values {self.frame['r'].tolist()}; got {r!r}")
        return float(row["sim_vs_theory_pct"].iloc[0])


def _check_lengths(lengths) -> LengthDistribution:
    if isinstance(lengths, str):
        if lengths not in LENGTH_SOURCES[1:]:
            raise ValueError(f"lengths must be a LengthDistribution or one of {list(LENGTH_SOURCES[1:])}; got "
                             f"{lengths!r} (the geometric law needs its means: LengthDistribution.geometric(mu_P, mu_D))")
        return LengthDistribution.from_trace(lengths)
    if not isinstance(lengths, LengthDistribution):
        raise ValueError(f"lengths must be a LengthDistribution or one of {list(LENGTH_SOURCES[1:])}; "
                         f"got {type(lengths).__name__}")
    return lengths


def _lengths_carry_the_means(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse ``mu_P=`` / ``mu_D=`` by the function's name, saying what to pass: the means come with ``lengths``
    (Python's own error would only say the keyword is unexpected)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = [k for k in ("mu_P", "mu_D") if k in kwargs]
        if given:
            means = ", ".join(f"{k}={kwargs[k]!r}" for k in given)
            raise TypeError(f"{fn.__name__}() takes no {' or '.join(given)}: a workload's mean lengths come with "
                            f"lengths=, e.g. {fn.__name__}(..., lengths=LengthDistribution.geometric({means})) for "
                            f"the theory's geometric law, or lengths=LengthDistribution.from_trace('azure-conv', "
                            f"{means}) for a trace's lengths rescaled to those means (moelab.afd.LengthDistribution)")
        return fn(*args, **kwargs)

    return wrapper


@_lengths_carry_the_means
def simulate_measured(r_values, B: int = 256, lengths: LengthDistribution | str = "azure-conv", *,
                      stages: StageTables | LinearStages | None = None, requests: float = DEFAULT_REQUESTS,
                      microbatches: int = 3, speed_cv: float = 0.0, seed: int | None = 0,
                      coeffs: AFDCoefficients | None = None) -> MeasuredSweep:
    """Simulate rA-1F bundles for every r of ``r_values`` with measured stage times and real lengths.

    Parameters
    ----------
    r_values : sequence of int
        Attention instances per FFN instance (each in 1..:data:`MAX_R`).
    B : int
        Request slots per attention instance and microbatch (1..:data:`MAX_B`).
    lengths : LengthDistribution or str
        Request lengths, and with them the workload's mean lengths: a :class:`LengthDistribution`
        (``LengthDistribution.geometric(mu_P, mu_D)``, ``LengthDistribution.from_trace(kind, mu_P, mu_D)``) or
        a bundled trace by name (``"azure-conv"``, ``"azure-code"``, its own means). There is no ``mu_P`` /
        ``mu_D`` argument: they are the distribution's.
    stages : StageTables or LinearStages, optional
        Stage times; default the H200 tables with the DeepEP link for Qwen3-30B-A3B.
    requests : float
        Requests per slot group (the theory's horizon N, in [B, :data:`MAX_REQUESTS`]); the run lasts
        ``n_steps = N * mean_steps / B`` steps (NOTATION's symbol; the paper's ``K``).
    microbatches : int
        Microbatches in flight per instance (1..:data:`MAX_MICROBATCHES`).
    speed_cv : float
        Spread of fixed per-instance speed factors (lognormal, mean 1), in [0, 2].
    seed : int, optional
        Seed; equal seeds give equal results (common random numbers across r).
    coeffs : AFDCoefficients, optional
        Coefficients for the theory columns; default: fitted to ``stages`` by least squares on the fixed
        design :data:`FIT_R_VALUES` (r = 1..32 at this ``B``), whatever ``r_values`` holds, so any subset
        of r values reports the same :attr:`MeasuredSweep.r_star` (or the coefficients of ``LinearStages``).

    Returns
    -------
    MeasuredSweep
        One row per r (simulated and theory throughput, idle fractions, stage times), the fitted
        coefficients and their fit errors, the simulated optimum ``r_sim`` among ``r_values`` and the
        closed form's ``r_star``.

    Notes
    -----
    The simulator draws real (prompt, decode) length pairs from ``lengths``; the theory columns are given
    the realised means of those draws (``mu_P``, ``mu_D`` of the result), not means set elsewhere.
    """
    r_arr = check_array("r_values", r_values, ndim=1, low=1, high=MAX_R)
    if r_arr.size == 0 or np.any(r_arr != np.round(r_arr)):
        raise ValueError(f"r_values must hold integers in [1, {MAX_R}]; got {r_values!r}")
    r_arr = r_arr.astype(np.int64)
    B = check_int("B", B, low=1, high=MAX_B)
    lengths = _check_lengths(lengths)
    # the theory's horizon needs at least one fill of the B slots (N >= B)
    N = check_real("requests", requests, low=B, high=MAX_REQUESTS)
    m = check_int("microbatches", microbatches, low=1, high=MAX_MICROBATCHES)
    speed_cv = check_real("speed_cv", speed_cv, low=0, high=2)
    stages = StageTables.h200() if stages is None else stages
    if not isinstance(stages, (StageTables, LinearStages)):
        raise ValueError(f"stages must be a StageTables or LinearStages; got {type(stages).__name__}")
    K = max(1, round(N * lengths.mean_steps / B))
    if K > MAX_STEPS:
        raise ValueError(f"requests must keep the run at most MAX_STEPS={MAX_STEPS} steps; {N:g} requests of "
                         f"{lengths.mean_steps:.0f} steps over B={B} slots need {K}")
    r_max = int(r_arr.max())
    if K * m * r_max > MAX_CELLS:
        raise ValueError(f"r_values, requests and microbatches need {K * m * r_max} load cells; the cap is "
                         f"MAX_CELLS={MAX_CELLS} (fewer requests or a smaller r)")
    entropy = _entropy(seed)
    stages.reset_coverage()
    rngs = [np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(mb, i)))
            for mb in range(m) for i in range(r_max)]
    loads = np.stack([_renewal_loads(B, K, lengths, g) for g in rngs])  # (m * r_max, K)
    speed = np.ones(r_max)
    if speed_cv > 0:
        sigma = math.sqrt(math.log1p(speed_cv**2))
        speed = np.array([np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(1_000_000, i)))
                          .lognormal(-sigma**2 / 2, sigma) for i in range(r_max)])
    t_att = np.asarray(stages.attention_ms(loads), dtype=np.float64).reshape(m, r_max, K) * speed[None, :, None]
    attn = np.ascontiguousarray(t_att.transpose(2, 0, 1).reshape(K * m, r_max))
    t_F = np.asarray(stages.ffn_ms(r_arr * B), dtype=np.float64)
    ffn_beyond = np.asarray(stages.ffn_extrapolated(r_arr * B), dtype=bool)
    t_af, t_fa = stages.link_ms(np.full(r_arr.shape, float(B)), r_arr)
    makespans = _pipeline(attn, r_arr, np.asarray(t_af, np.float64), t_F, m, np.asarray(t_fa, np.float64))
    coverage = stages.reset_coverage()

    mu_P, mu_D = lengths.mean_prompt, lengths.mean_decode
    fit = None
    if coeffs is None:
        if isinstance(stages, LinearStages):
            coeffs = stages.coeffs
        else:
            # a fixed design, not r_arr: the answer must not depend on which r the caller asked about
            fit = fit_coefficients(stages, B=B, r_values=np.asarray(FIT_R_VALUES))
            stages.reset_coverage()
            coeffs = fit.coeffs
    rf = r_arr.astype(np.float64)
    theory = throughput_per_instance(rf, B, mu_P, mu_D, N, coeffs)
    idle = idle_ratios(rf, B, mu_P, mu_D, N, coeffs)
    jobs = K * m
    busy = np.cumsum(attn.sum(axis=0))
    straggler = np.maximum.accumulate(attn, axis=1).mean(axis=0)
    # mean KV load of the first r instances (common random numbers: instance i's loads do not depend on r)
    instance_load = np.cumsum(loads.reshape(m, r_max, K).mean(axis=(0, 2)))
    rows = []
    for q, r in enumerate(r_arr.tolist()):
        makespan = float(makespans[q])
        mean_attn = float(busy[r - 1]) / (jobs * r)
        bottleneck = max(mean_attn, float(t_af[q]), float(t_F[q]), float(t_fa[q]))
        rows.append({
            "r": r, "sim_throughput": jobs * r * B / ((r + 1) * makespan),
            "theory_throughput": float(theory[q]),
            "stage_bound_throughput": r * B / ((r + 1) * bottleneck),
            "sim_attention_idle": 1.0 - float(busy[r - 1]) / (r * makespan),
            "sim_ffn_idle": 1.0 - jobs * float(t_F[q]) / makespan,
            "theory_attention_idle": float(idle["attention"][q]), "theory_ffn_idle": float(idle["ffn"][q]),
            "sim_attention_time": mean_attn, "sim_straggler_time": float(straggler[r - 1]),
            "sim_token_load": float(instance_load[r - 1]) / r,
            "ffn_time": float(t_F[q]), "ffn_extrapolated": bool(ffn_beyond[q]), "link_af_time": float(t_af[q]), "link_fa_time": float(t_fa[q]),
            "makespan": makespan, "tokens": jobs * r * B,
        })
    frame = pd.DataFrame(rows)
    frame["sim_vs_theory_pct"] = 100 * (frame["sim_throughput"] / frame["theory_throughput"] - 1)
    return MeasuredSweep(frame, B, lengths.name, mu_P, mu_D, K, m, coverage.as_dict(), fit, coeffs, stages.unit,
                         lengths.steady_load_per_slot, N, [lengths.source, stages.source],
                         float(stages.ffn_table_max_batch), lengths.steady_load_parts())


def default_r_values(B: int, lengths: LengthDistribution, stages: StageTables | LinearStages | None = None,
                     requests: float = DEFAULT_REQUESTS, *, r_min_hi: int = 32, r_cap: int = 96) -> list[int]:
    """Integers 1..r_hi, with r_hi at least ``r_min_hi`` and 2.5x the r* fitted on :data:`FIT_R_VALUES`
    (capped at ``r_cap``), so the simulated optimum is inside the sweep.

    Returns
    -------
    list of int
    """
    stages = StageTables.h200() if stages is None else stages
    if isinstance(stages, LinearStages):
        c = stages.coeffs
    else:
        c = fit_coefficients(stages, B=B, r_values=np.asarray(FIT_R_VALUES)).coeffs
        stages.reset_coverage()
    r_star = optimal_ratio(B, lengths.mean_prompt, lengths.mean_decode, requests, c)
    r_hi = int(min(r_cap, max(r_min_hi, math.ceil(2.5 * r_star))))
    return list(range(1, r_hi + 1))


@_lengths_carry_the_means
def measured_optimum(B: int = 256, lengths: LengthDistribution | str = "azure-conv", *,
                     stages: StageTables | LinearStages | None = None, requests: float = DEFAULT_REQUESTS,
                     r_values=None, seed: int | None = 0, microbatches: int = 3, speed_cv: float = 0.0,
                     coeffs: AFDCoefficients | None = None) -> MeasuredSweep:
    """:func:`simulate_measured` over every integer r up to past the fitted r* (see
    :func:`default_r_values`); compare ``.r_sim`` with ``.r_star``.

    Parameters
    ----------
    B : int
        Request slots per attention instance and microbatch.
    lengths : LengthDistribution or str
        The workload's request lengths and so its mean lengths (``LengthDistribution.geometric(mu_P, mu_D)``,
        ``LengthDistribution.from_trace(kind, mu_P, mu_D)``, or ``"azure-conv"`` / ``"azure-code"``).
    stages : StageTables or LinearStages, optional
        Stage times (default the H200 tables).
    requests : float
        Requests per slot group (the theory's horizon N).
    r_values : sequence of int, optional
        The r to simulate (default :func:`default_r_values`: 1 up to well past the fitted r*).
    seed : int, optional
        Seed (common random numbers across r).
    microbatches, speed_cv, coeffs
        As in :func:`simulate_measured`.

    Returns
    -------
    MeasuredSweep
        ``.r_sim`` (the simulated optimum) beside ``.r_star`` (the closed form fitted on
        :data:`FIT_R_VALUES`, at the realised means of ``lengths``).
    """
    lengths = _check_lengths(lengths)
    stages = StageTables.h200() if stages is None else stages
    if r_values is None:
        r_values = default_r_values(B, lengths, stages, requests)
    return simulate_measured(r_values, B, lengths, stages=stages, requests=requests, seed=seed,
                             microbatches=microbatches, speed_cv=speed_cv, coeffs=coeffs)


def gap_map(B_values=(128, 256, 512), mu_P_values=(100, 1000), mu_D_values=(100, 500),
            distributions=LENGTH_SOURCES, *, requests: float = 2000, stages: StageTables | None = None,
            seed: int = 0) -> pd.DataFrame:
    """``(simulated optimum - r*) / r*`` over B, mu_P, mu_D and the length distribution (one row each).

    The trace distributions keep their shape and are rescaled to each (mu_P, mu_D); the theory is given
    the realised means. At most 200 cells (bounded work).

    Returns
    -------
    pandas.DataFrame
        One row per cell: ``B``, ``mu_P``, ``mu_D``, ``lengths``; the fitted closed form's ``r_star``, its best
        swept integer ``r_star_int`` and ``binding`` term; the simulated optimum ``r_sim``, ``gap_rel`` and
        ``gap_pct`` (signed, relative to r*), ``optimum_at_edge``; ``load_ratio`` (what a slot holds in the
        long run over ``mu_P + mu_D``); ``token_load`` (the closed form's horizon-average KV tokens per
        attention instance, Tbar) beside ``takeover_load`` (the Tbar above which attention sets r*,
        :func:`moelab.afd.attention_takeover_load`), which decide the regime; ``extrapolated`` (any attention
        or FFN evaluation outside the tables) and ``ffn_measured_share`` (the share of swept r whose FFN batch
        ``r*B`` the table measures; the rest is a projection of its last segment); ``horizon_load_ratio`` (the
        KV load the simulated instances really held over the run, averaged over every instance of the sweep, over
        ``token_load``: unlike ``load_ratio``, a long-run value, it says what the lengths did within this horizon);
        ``straggler_crossing`` (the r at which the FFN step reaches the slowest instance's attention step,
        :func:`moelab.afd.straggler_crossing`: the simulated turn from attention- to FFN-bound, beside r*)."""
    cells = len(B_values) * len(mu_P_values) * len(mu_D_values) * len(distributions)
    if cells > 200:
        raise ValueError(f"B_values x mu_P_values x mu_D_values x distributions must be at most 200 cells; got {cells}")
    for d in distributions:
        check_choice("distributions", d, LENGTH_SOURCES)
    stages = StageTables.h200() if stages is None else stages
    rows = []
    for B in B_values:
        for mu_P in mu_P_values:
            for mu_D in mu_D_values:
                for dist in distributions:
                    lengths = (LengthDistribution.geometric(mu_P, mu_D) if dist == "geometric"
                               else LengthDistribution.from_trace(dist, mu_P, mu_D))
                    res = measured_optimum(int(B), lengths, stages=stages, requests=requests, seed=seed)
                    terms = ratio_terms(int(B), res.mu_P, res.mu_D, requests, res.coeffs)
                    rows.append({"B": int(B), "mu_P": float(mu_P), "mu_D": float(mu_D), "lengths": dist,
                                 "r_star": res.r_star, "r_star_int": res.r_star_int, "binding": terms.binding,
                                 "r_sim": res.r_sim,
                                 "gap_rel": (res.r_sim - res.r_star) / res.r_star, "gap_pct": res.gap_pct,
                                 "optimum_at_edge": res.optimum_at_edge,
                                 "load_ratio": res.steady_load_per_slot / (res.mu_P + res.mu_D),
                                 "token_load": terms.token_load,
                                 "horizon_load_ratio": float(res.frame.loc[res.frame["r"].idxmax(), "sim_token_load"])
                                 / terms.token_load,
                                 "straggler_crossing": straggler_crossing(res.frame),
                                 "takeover_load": attention_takeover_load(int(B), res.coeffs),
                                 "extrapolated": bool(res.coverage["attention_extrapolated"]
                                                      or res.coverage["ffn_extrapolated"]),
                                 "ffn_measured_share": float(1.0 - res.frame["ffn_extrapolated"].mean())})
    return pd.DataFrame(rows)


#: the check workloads: the paper's five (B, mu_P, mu_D) with Azure-conv-shaped lengths, both raw traces (None:
#: the trace's own means), and three long-context workloads where attention, not the FFN peak, sets r* on an H200
CHECK_WORKLOADS: tuple[tuple[int, float | None, float | None, str], ...] = (
    (256, 100, 500, "azure-conv"), (128, 100, 500, "azure-conv"), (512, 100, 500, "azure-conv"),
    (256, 100, 100, "azure-conv"), (256, 500, 500, "azure-conv"),
    (256, None, None, "azure-conv"), (256, None, None, "azure-code"),
    (256, 4000, 1000, "azure-conv"), (128, 4000, 1000, "azure-conv"), (512, 2000, 500, "azure-conv"),
)


def check_workload(B: int, mu_P: float | None, mu_D: float | None, dist: str) -> LengthDistribution:
    """The length distribution of one check workload (``None`` means the trace's own mean)."""
    if dist == "geometric":
        return LengthDistribution.geometric(mu_P, mu_D)
    return LengthDistribution.from_trace(dist, mu_P, mu_D)


__all__ = ["CHECK_WORKLOADS", "FIT_R_VALUES", "LENGTH_SOURCES", "MAX_B", "MAX_CELLS", "MAX_MICROBATCHES", "MAX_R",
           "MAX_REQUESTS", "MAX_STEPS", "Coverage", "LengthDistribution", "MeasuredSweep", "check_workload",
           "default_r_values", "gap_map", "measured_optimum", "simulate_measured"]
