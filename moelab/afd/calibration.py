"""Stage times of an AFD bundle read from measured tables, and the theory's six coefficients fitted to them.

:class:`StageTables` answers "how long does this stage take" from the tables themselves, never from the
theory's linear forms (units: ms per *model* step, i.e. per-layer table times x the model's layers, since
AFD ping-pongs every layer):

- attention of one instance: ``attn_step.csv`` interpolated piecewise-linearly in the KV bytes of the
  requests that instance holds (the median of the rows with equal bytes). Below the smallest measured
  point the kernel floor holds (the table is flat there); above the largest the last segment is
  extended and the evaluation is **flagged as extrapolated**;
- the FFN instance: ``moe_step.csv`` at the aggregated batch ``n`` and the distinct experts ``D`` it
  activates (uniform top-k routing, :func:`moelab.costmodel.expected_distinct_experts`), interpolated
  linearly in ``D`` within each measured batch row and then in ``n``; batches above the largest measured
  one extend the last segment (**flagged**);
- the A<->F link: the DeepEP low-latency dispatch/combine table
  (``data/public/published-tables/deepep_v1_lowlatency_h800.csv``, H800 + 400 Gb/s CX7 IB, 128 tokens x
  hidden 7168 x top-8 per call). Its achieved per-rank bandwidth is interpolated in log2(EP size) with
  EP size = r + 1 ranks (r attention instances + the FFN instance); a call moving ``tokens x hidden x 2``
  bytes (bf16 hidden states, one copy per token) takes bytes / bandwidth. EP sizes outside 8..256, and
  volumes more than 2x away from the table's own per-call volume (where the fixed latency part the
  table cannot separate matters), are **flagged as extrapolated**. The table is another machine (H800),
  not this lab's H200: a published measurement, labelled as such.

:class:`LinearStages` gives the same interface from :class:`AFDCoefficients` (the theory's own linear
stage times), so a simulator can be fed either. :func:`fit_coefficients` fits the six coefficients by
least squares to a :class:`StageTables` and reports the fit error of each stage.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from moelab._validate import check_array, check_choice, check_finite_array, check_int
from moelab.afd.coefficients import AFDCoefficients, check_coefficients
from moelab.costmodel import MODEL_SHAPES, expected_distinct_experts
from moelab.costmodel.fit import fit_linear
from moelab.costmodel.tables import calibration_folder, read_calibration_table
from moelab.datasets import public_path

LINK_TABLE = "deepep-lowlatency"  # moelab.datasets name of the bundled DeepEP table
#: The one design the theory's six coefficients are fitted on (bundle sizes r = 1..32 at the asked ``B``), by
#: :func:`coefficients_from_tables`, :func:`fit_coefficients` and the measured simulator alike: never the r
#: values a caller asks to simulate, so the fitted closed form, and its r*, do not depend on which r were
#: asked for, and the coefficients a user fits agree with the simulator's.
FIT_R_VALUES = tuple(range(1, 33))
# the DeepEP table's per-call volume: 128 tokens x hidden 7168 x top-8 copies, FP8 dispatch / BF16 combine
_DEEPEP_REF_BYTES = {"dispatch": 128 * 7168 * 8 * 1, "combine": 128 * 7168 * 8 * 2}


@dataclass(frozen=True)
class StageGeometry:
    """What the stage tables need to know about a model: layers, KV bytes per token and layer, hidden
    size, experts and top-k."""

    name: str
    layers: int
    kv_bytes_per_token: int
    hidden: int
    num_experts: int
    top_k: int


def geometry(shape: str) -> StageGeometry:
    """The geometry of a MoE shape from the one registry, :data:`moelab.costmodel.MODEL_SHAPES` (every
    layer runs attention and the FFN ping-pong, so all ``num_layers`` count)."""
    s = MODEL_SHAPES.get(shape)
    if s is None or not s.is_moe:
        known = sorted(n for n, m in MODEL_SHAPES.items() if m.is_moe)
        raise ValueError(f"shape must be one of the MoE shapes {known}; got {shape!r}")
    return StageGeometry(shape, int(s.num_layers), int(s.kv_bytes_per_token), int(s.hidden), int(s.num_experts),
                    int(s.top_k))


@dataclass
class Coverage:
    """Counts of stage evaluations outside the measured tables, and how each was priced there.

    Attention (KV bytes above the ``attn_step`` table) and the FFN (a batch above the ``moe_step`` table's
    largest, ``B <= 256`` tokens in the bundled H200 tables) are *extrapolated*: the table's last segment
    is extended linearly, since both grow about linearly with their load there. Below a table they take its
    first value (the kernel floor; decode is weight-bound). The link's bandwidth at an EP size ``r + 1``
    outside the DeepEP table (8..256) *holds the table's end value*: bandwidth per EP size is a saturating
    curve, which a linear extension in log2(EP) would push past the hardware's (or below zero). A link
    volume more than 2x away from DeepEP's per-call volume scales the time with the bytes at the
    table's bandwidth (the fixed latency at that volume is unknown).

    Attributes
    ----------
    attention_evals, attention_extrapolated : int
        Attention stage evaluations, and those above the ``attn_step`` table.
    ffn_evals, ffn_extrapolated : int
        FFN stage evaluations, and those at a batch above the ``moe_step`` table.
    link_evals : int
        Link evaluations (each counts dispatch and combine once).
    link_ep_extrapolated : int
        Link evaluations at an EP size outside the DeepEP table (end value held, as above).
    link_volume_extrapolated : int
        Link evaluations whose dispatch or combine volume is more than 2x away from DeepEP's per-call volume
        (counted once per evaluation, like ``link_ep_extrapolated``, so it never exceeds ``link_evals``).
    notes : list of str
        One line per kind of excursion, saying what was done.
    """

    attention_evals: int = 0
    attention_extrapolated: int = 0
    ffn_evals: int = 0
    ffn_extrapolated: int = 0
    link_evals: int = 0
    link_ep_extrapolated: int = 0
    link_volume_extrapolated: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The counts and the distinct ``notes`` (sorted) as one dict."""
        return {k: getattr(self, k) for k in ("attention_evals", "attention_extrapolated", "ffn_evals",
                                              "ffn_extrapolated", "link_evals", "link_ep_extrapolated",
                                              "link_volume_extrapolated")} | {"notes": sorted(set(self.notes))}

    @property
    def any_extrapolated(self) -> bool:
        """Whether any stage evaluation fell outside its table (extrapolated or end value held)."""
        return bool(self.attention_extrapolated or self.ffn_extrapolated or self.link_ep_extrapolated
                    or self.link_volume_extrapolated)


class StageTables:
    """Stage times (ms per model step) of an AFD bundle read from measured tables; see the module doc.

    Parameters
    ----------
    attn : DataFrame
        ``attn_step`` rows (columns ``shape, kv_bytes, ms_attn_core``).
    moe : DataFrame
        ``moe_step`` rows (columns ``model, method, B, D, ms_per_layer``).
    link : DataFrame
        The DeepEP table (``op, ep_size, latency_us, rdma_bandwidth_GBps``); None leaves the link out.
    shape : str
        MoE shape (rows of ``attn`` and ``moe`` with that name are used).
    method : str
        MoE kernel rows (``bmm_active`` or ``grouped_mm``).
    """

    unit = "ms"

    def __init__(self, attn: pd.DataFrame, moe: pd.DataFrame, link: pd.DataFrame | None, shape: str = "qwen3-30b-a3b",
                 method: str = "bmm_active", label: str = "measured") -> None:
        self.geometry = geometry(shape)
        self.shape = shape
        a = attn[attn["shape"] == shape]
        if a.empty:
            raise ValueError(f"shape must be one of the attention table's shapes {sorted(attn['shape'].unique())}; "
                             f"got {shape!r}")
        per_kv = a.groupby("kv_bytes")["ms_attn_core"].median()
        self.attn_kv = per_kv.index.to_numpy(np.float64)
        self.attn_ms = per_kv.to_numpy(np.float64)
        self.attn_rows = a.reset_index(drop=True)
        m = moe[(moe["model"] == shape)]
        methods = sorted(m["method"].unique())
        check_choice("method", method, methods)
        m = m[m["method"] == method]
        self.method = method
        self.moe_rows = m.reset_index(drop=True)
        self._moe_B = np.array(sorted(m["B"].unique()), dtype=np.float64)
        self._moe_row = {int(b): g.sort_values("D")[["D", "ms_per_layer"]].to_numpy(np.float64) for b, g in m.groupby("B")}
        # each batch row's expert range, aligned with _moe_B: which rows cover a D (_moe_covering)
        self._moe_D_lo = np.array([self._moe_row[int(b)][:, 0].min() for b in self._moe_B])
        self._moe_D_hi = np.array([self._moe_row[int(b)][:, 0].max() for b in self._moe_B])
        self.link = None
        if link is not None:
            self.link = {op: g.sort_values("ep_size")[["ep_size", "rdma_bandwidth_GBps"]].to_numpy(np.float64)
                         for op, g in link.groupby("op")}
            if set(self.link) != {"dispatch", "combine"}:
                raise ValueError(f"link table must have dispatch and combine rows; got {sorted(self.link)}")
        self.coverage = Coverage()
        self.source = (f"{label} tables, {shape} x{self.geometry.layers} layers: attn_step + moe_step ({method}) interpolated; link: "
                       + ("DeepEP low-latency table (H800, published)" if link is not None else "none"))

    @classmethod
    def h200(cls, shape: str = "qwen3-30b-a3b", method: str = "bmm_active", link: bool = True) -> StageTables:
        """The bundled H200 tables (and the published DeepEP link table unless ``link=False``); a fresh
        instance (with its own extrapolation counter) each call, the tables read once."""
        attn, moe = _bundled_h200_tables()
        return cls(attn, moe, link_table() if link else None, shape, method, "h200")

    @classmethod
    def from_calibration(cls, calibration: str | os.PathLike, shape: str = "qwen3-30b-a3b",
                         method: str = "bmm_active", link: bool = True) -> StageTables:
        """The ``attn_step`` and ``moe_step`` tables of a bundled GPU (e.g. ``"h200"``) or of any folder
        ``moelab calibrate --out DIR`` wrote (one without them is refused, naming the missing file), with
        the published DeepEP link table unless ``link=False``."""
        if isinstance(calibration, str) and calibration == "h200":
            return cls.h200(shape, method, link)
        folder = calibration_folder(calibration)
        attn, moe = (read_calibration_table(folder, t) for t in ("attn_step", "moe_step"))
        return cls(attn, moe, link_table() if link else None, shape, method, folder.name)

    def reset_coverage(self) -> Coverage:
        """Start counting extrapolations afresh; returns the finished counter."""
        done, self.coverage = self.coverage, Coverage()
        return done

    # ---- attention ---------------------------------------------------------------------------------
    def attention_ms(self, kv_tokens: np.ndarray | float) -> np.ndarray:
        """Attention time of one instance holding ``kv_tokens`` cached tokens (vectorised), ms per step."""
        tokens = check_finite_array("kv_tokens", kv_tokens, low=0)
        kv = tokens * self.geometry.kv_bytes_per_token
        x, y = self.attn_kv, self.attn_ms
        out = np.interp(kv, x, y)  # left of the table: the kernel floor (the table is flat there)
        beyond = kv > x[-1]
        if beyond.any():
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            out = np.where(beyond, y[-1] + slope * (kv - x[-1]), out)
            self.coverage.notes.append(f"attention KV bytes above the table ({x[-1]:.3g} B): last segment extended")
        self.coverage.attention_evals += int(kv.size)
        self.coverage.attention_extrapolated += int(beyond.sum())
        return out * self.geometry.layers

    @property
    def attention_floor_ms(self) -> float:
        return float(self.attn_ms[0] * self.geometry.layers)

    # ---- FFN ---------------------------------------------------------------------------------------
    def distinct_experts(self, n_tokens: np.ndarray | float) -> np.ndarray:
        return expected_distinct_experts(n_tokens, self.geometry.num_experts, self.geometry.top_k)

    def _moe_covering(self, D: np.ndarray) -> np.ndarray:
        """Which measured batch rows' expert ranges cover each ``D`` (any shape): a bool array of shape
        ``D.shape + (rows,)`` aligned with ``_moe_B``; a ``D`` covered by fewer than two rows is a ValueError."""
        D = np.asarray(D, dtype=np.float64)
        cover = (self._moe_D_lo <= D[..., None]) & (D[..., None] <= self._moe_D_hi)
        short = cover.sum(axis=-1) < 2
        if short.any():
            raise ValueError(f"moe_step has fewer than two batch rows covering D={float(D[short].flat[0]):.1f} "
                             f"for {self.shape}")
        return cover

    def _moe_beyond(self, n: np.ndarray, cover: np.ndarray) -> np.ndarray:
        """The table's one extrapolation rule: a batch ``n`` above the largest batch row covering its ``D``
        (``cover`` from :meth:`_moe_covering`, broadcast with ``n``) extends that row's last segment."""
        return np.asarray(n, dtype=np.float64) > np.max(np.where(cover, self._moe_B, -np.inf), axis=-1)

    def _moe_layer_ms(self, n: float, D: float) -> tuple[float, bool]:
        cover = self._moe_covering(np.float64(D))
        Bs = self._moe_B[cover]
        ys = np.array([np.interp(D, self._moe_row[int(b)][:, 0], self._moe_row[int(b)][:, 1]) for b in Bs])
        if self._moe_beyond(n, cover):
            slope = (ys[-1] - ys[-2]) / (Bs[-1] - Bs[-2])
            return float(ys[-1] + slope * (n - Bs[-1])), True
        if n < Bs[0]:  # below the smallest batch row that covers D: the time of that row (decode is weight-bound)
            return float(ys[0]), False
        return float(np.interp(n, Bs, ys)), False

    @property
    def ffn_table_max_batch(self) -> float:
        """The largest aggregated batch (tokens) the ``moe_step`` table measures; an FFN evaluation above it
        extends the table's last segment (a projection, counted in :attr:`coverage`)."""
        return float(self._moe_B[-1])

    def ffn_extrapolated(self, n_tokens: np.ndarray | float, D: np.ndarray | float | None = None) -> np.ndarray:
        """Whether :meth:`ffn_ms` extends the table past its measured batches at each ``n_tokens`` (bool array
        shaped like ``n_tokens``; ``D`` as in :meth:`ffn_ms`). Counts nothing.

        Parameters
        ----------
        n_tokens : float or array
            Aggregated batch (tokens, >= 1).
        D : float or array, optional
            Distinct experts activated (default: the expected number under uniform top-k routing).

        Returns
        -------
        ndarray of bool
            True where the batch lies above the largest measured batch row covering ``D``.
        """
        n = check_array("n_tokens", n_tokens, low=1)
        D = self.distinct_experts(n) if D is None else check_array("D", D, low=1, high=self.geometry.num_experts)
        n, D = np.broadcast_arrays(n, D)
        return self._moe_beyond(n, self._moe_covering(D))

    def ffn_ms(self, n_tokens: np.ndarray | float, D: np.ndarray | float | None = None) -> np.ndarray:
        """FFN time for ``n_tokens`` aggregated tokens and ``D`` distinct experts (default: the expected
        number under uniform top-k routing), ms per model step."""
        n = check_array("n_tokens", n_tokens, low=1)
        D = self.distinct_experts(n) if D is None else check_array("D", D, low=1, high=self.geometry.num_experts)
        n, D = np.broadcast_arrays(n, D)
        out = np.empty(n.shape)
        extra = 0
        for idx in np.ndindex(n.shape):
            out[idx], flagged = self._moe_layer_ms(float(n[idx]), float(D[idx]))
            extra += flagged
        if extra:
            self.coverage.notes.append(f"FFN batch (r·B tokens) above the MoE table's largest ({self._moe_B[-1]:.0f} "
                                       "tokens): last segment extended")
        self.coverage.ffn_evals += int(n.size)
        self.coverage.ffn_extrapolated += extra
        return out * self.geometry.layers

    # ---- link --------------------------------------------------------------------------------------
    def link_extrapolated(self, tokens: np.ndarray | float, r: np.ndarray | int) -> np.ndarray:
        """Whether :meth:`link_ms` leaves the DeepEP table at each (``tokens``, ``r``): an EP size ``r + 1``
        outside the table (end value held) or a transfer more than 2x away from its per-call volume (either
        direction). Bool array of the broadcast shape; False everywhere without a link table. Counts nothing.

        Parameters
        ----------
        tokens : float or array
            Tokens one instance sends (>= 0).
        r : int or array
            Attention instances per FFN instance (>= 1).

        Returns
        -------
        ndarray of bool
        """
        tokens, r = _broadcast_tokens_r(tokens, r)
        if self.link is None:
            return np.zeros(tokens.shape, dtype=bool)
        ep_off, volume_off = self._link_outside(tokens, r)
        return ep_off | np.logical_or.reduce(list(volume_off.values()))

    def _link_outside(self, tokens: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Where the DeepEP table does not measure a transfer (``tokens``, ``r`` broadcast, a link table
        present): the EP size ``r + 1`` outside it (the end value is held), and per op a volume more than 2x
        from that op's per-call volume. The one rule :meth:`link_ms` counts and :meth:`link_extrapolated` flags."""
        ep = r + 1.0
        nbytes = tokens * self.geometry.hidden * 2.0
        lo, hi = self.link["dispatch"][0, 0], self.link["dispatch"][-1, 0]
        volume_off = {op: (nbytes > 2 * ref) | (nbytes < ref / 2) for op, ref in _DEEPEP_REF_BYTES.items()}
        return (ep < lo) | (ep > hi), volume_off

    def link_ms(self, tokens: np.ndarray | float, r: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """``(A->F, F->A)`` transfer times of one instance's ``tokens`` hidden states in an rA-1F bundle
        (EP size r + 1), ms per model step; zeros when the stage tables carry no link."""
        tokens, r = _broadcast_tokens_r(tokens, r)
        if self.link is None:
            return np.zeros(tokens.shape), np.zeros(tokens.shape)
        ep = r + 1.0
        nbytes = tokens * self.geometry.hidden * 2.0
        off, volume_off = self._link_outside(tokens, r)
        out = []
        for op in ("dispatch", "combine"):
            t = self.link[op]
            bw = np.interp(np.log2(ep), np.log2(t[:, 0]), t[:, 1])  # GB/s; outside 8..256 the end values hold
            out.append(nbytes / (bw * 1e9) * 1e3 * self.geometry.layers)
        lo, hi = self.link["dispatch"][0, 0], self.link["dispatch"][-1, 0]
        self.coverage.link_evals += int(tokens.size)
        self.coverage.link_ep_extrapolated += int(off.sum())
        self.coverage.link_volume_extrapolated += int(np.sum(np.logical_or.reduce(list(volume_off.values()))))
        if off.any():
            self.coverage.notes.append(f"link EP size outside the DeepEP table ({lo:.0f}..{hi:.0f}): end value held")
        if self.coverage.link_volume_extrapolated:
            self.coverage.notes.append("link volume more than 2x from the DeepEP per-call volume: bandwidth scaled, "
                                       "fixed latency unknown")
        return out[0], out[1]


class LinearStages:
    """The theory's own linear stage times from six coefficients, behind the :class:`StageTables` interface
    (``attention_ms(T) = a_A T + b_A``, ``ffn_ms(n) = a_F n + b_F``, both links ``a_C B + b_C``)."""

    def __init__(self, coeffs: AFDCoefficients | None = None) -> None:
        self.coeffs = check_coefficients(coeffs)
        self.unit = self.coeffs.unit
        self.coverage = Coverage()
        self.source = f"linear stage times from {self.coeffs.source}"

    def reset_coverage(self) -> Coverage:
        done, self.coverage = self.coverage, Coverage()
        return done

    def attention_ms(self, kv_tokens):
        return self.coeffs.a_A * check_finite_array("kv_tokens", kv_tokens, low=0) + self.coeffs.b_A

    def ffn_ms(self, n_tokens, D=None):
        return self.coeffs.a_F * check_array("n_tokens", n_tokens, low=1) + self.coeffs.b_F

    #: linear stage times have no table to leave
    ffn_table_max_batch = float("inf")

    def ffn_extrapolated(self, n_tokens, D=None):
        return np.zeros(check_array("n_tokens", n_tokens, low=1).shape, dtype=bool)

    def link_extrapolated(self, tokens, r):
        return np.zeros(_broadcast_tokens_r(tokens, r)[0].shape, dtype=bool)

    def link_ms(self, tokens, r):
        tokens, r = _broadcast_tokens_r(tokens, r)
        t = self.coeffs.a_C * tokens + self.coeffs.b_C
        return t, t.copy()


@dataclass(frozen=True)
class CoefficientFit:
    """The six coefficients fitted by least squares to stage tables, and each stage's fit error.

    Attributes
    ----------
    coeffs : AFDCoefficients
        ``a_A, b_A, a_F, b_F, a_C, b_C`` in the tables' unit (ms per model step).
    errors : pandas.DataFrame
        One row per ``stage`` (``attention``, ``ffn``, ``link``): ``points`` fitted,
        ``points_beyond_table`` (those the stage tables price outside their measurements: the table's last
        segment extended, or the link table's end value held; a fit error there measures the line against
        that extension, not against a measurement), ``median_abs_err_pct`` and ``max_abs_err_pct`` (the
        relative error of the fitted line, %), and ``max_err_at_tokens``, where the largest error sits (attention:
        KV tokens per instance; FFN: the aggregated batch; link: tokens one instance sends; NaN without a link
        table).
    """

    coeffs: AFDCoefficients
    errors: pd.DataFrame

    def error_pct(self, stage: str, stat: str = "median") -> float:
        return float(self.errors.set_index("stage").loc[stage, f"{stat}_abs_err_pct"])


def _broadcast_tokens_r(tokens: np.ndarray | float, r: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """``tokens`` and ``r`` checked by name (finite, >= 0 / >= 1) and broadcast together."""
    t, rr = check_finite_array("tokens", tokens, low=0), check_finite_array("r", r, low=1)
    try:
        return np.broadcast_arrays(t, rr)
    except ValueError:
        raise ValueError(f"tokens {t.shape} and r {rr.shape} must broadcast together") from None


def _lsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Least-squares line ``y = a x + b`` (b >= 0, a >= 0) on the floor's one fit
    (:func:`moelab.costmodel.fit.fit_linear`, unweighted); returns a, b and the relative errors."""
    fit, report = fit_linear(np.stack([x, np.ones_like(x)], axis=1), y, ("slope", "intercept"), relative=False)
    return float(fit.coef[0]), float(fit.coef[1]), report.rel_err


def fit_coefficients(stages: StageTables, *, B: int, r_values=FIT_R_VALUES,
                     kv_tokens: np.ndarray | None = None) -> CoefficientFit:
    """Fit ``a_A, b_A, a_F, b_F, a_C, b_C`` (ms per model step) by least squares to measured stages.

    - attention: every ``attn_step`` row of the shape (x = cached tokens, y = table ms x layers);
      ``kv_tokens`` adds the operating points (instance loads) a simulation will evaluate;
    - FFN: the measured FFN time at the aggregated batches ``n = r*B`` of ``r_values`` (and the table's own
      batch rows inside that range), at the distinct experts each activates;
    - link: the slower direction at ``B/4 .. 4B`` tokens and every r of ``r_values``.

    Parameters
    ----------
    stages : StageTables
        The measured stage tables (e.g. :meth:`StageTables.h200`).
    B : int
        Request slots per attention instance and microbatch (>= 1).
    r_values : sequence of int
        The bundle sizes whose operating range the FFN and link fits cover; default :data:`FIT_R_VALUES`,
        the design the measured simulator fits on too (another design gives other coefficients and another r*).
    kv_tokens : ndarray, optional
        Extra attention operating points (KV tokens per instance).

    Returns
    -------
    CoefficientFit
        The coefficients (ms per model step) and each stage's fit error.
    """
    B = check_int("B", B, low=1)
    r_arr = check_array("r_values", r_values, ndim=1, low=1)
    if r_arr.size == 0:
        raise ValueError("r_values must hold at least one r >= 1")
    g = stages.geometry
    x_a = stages.attn_rows["kv_bytes"].to_numpy(np.float64) / g.kv_bytes_per_token
    y_a = stages.attn_rows["ms_attn_core"].to_numpy(np.float64) * g.layers
    if kv_tokens is not None:
        kv = check_array("kv_tokens", kv_tokens, ndim=1, low=0)
        x_a = np.concatenate([x_a, kv])
        y_a = np.concatenate([y_a, stages.attention_ms(kv)])
    beyond_a = x_a * g.kv_bytes_per_token > stages.attn_kv[-1]
    a_A, b_A, e_a = _lsq(x_a, y_a)
    # the operating range: the aggregated batches r*B the bundle sizes produce, plus the table's own batch
    # rows inside that range (smaller batches never reach the FFN instance of such a bundle)
    n = np.unique(np.concatenate([r_arr * B, stages._moe_B[(stages._moe_B >= r_arr.min() * B)
                                                          & (stages._moe_B <= r_arr.max() * B)]]))
    y_f = stages.ffn_ms(n)
    beyond_f = stages.ffn_extrapolated(n)
    a_F, b_F, e_f = _lsq(n, y_f)
    if a_F <= 0:
        raise ValueError("the FFN time fitted to the table does not grow with the batch; widen r_values")
    Bs = np.unique(np.round(B * np.geomspace(0.25, 4, 9)).clip(1))
    bb, rr = np.meshgrid(Bs, r_arr)
    t_af, t_fa = stages.link_ms(bb.ravel(), rr.ravel())
    y_c = np.maximum(t_af, t_fa)
    beyond_c = stages.link_extrapolated(bb.ravel(), rr.ravel())
    if np.all(y_c == 0):
        a_C, b_C, e_c, x_c = 0.0, 0.0, np.zeros(1), np.full(1, np.nan)
    else:
        x_c = bb.ravel().astype(np.float64)
        a_C, b_C, e_c = _lsq(x_c, y_c)
    errors = pd.DataFrame([
        {"stage": s, "points": int(e.size), "points_beyond_table": int(np.sum(beyond)),
         "median_abs_err_pct": float(100 * np.median(np.abs(e))), "max_abs_err_pct": float(100 * np.max(np.abs(e))),
         "max_err_at_tokens": float(x[int(np.argmax(np.abs(e)))])}
        for s, e, beyond, x in (("attention", e_a, beyond_a, x_a), ("ffn", e_f, beyond_f, n.astype(np.float64)),
                                ("link", e_c, beyond_c, x_c))])
    note = (f"least squares to {stages.source}; fit error (median/max %): "
            + ", ".join(f"{r.stage} {r.median_abs_err_pct:.1f}/{r.max_abs_err_pct:.1f}" for r in errors.itertuples()))
    return CoefficientFit(AFDCoefficients(a_A, b_A, a_F, b_F, a_C, b_C, unit="ms", source=note), errors)


def coefficients_from_tables(calibration: str | os.PathLike = "h200", shape: str = "qwen3-30b-a3b", *, B: int = 256,
                             r_values=FIT_R_VALUES, method: str = "bmm_active", link: bool = True) -> AFDCoefficients:
    """The six coefficients (ms per model step) fitted to measured tables for bundles of ``B`` slots; see
    :func:`fit_coefficients`.

    With the default design (:data:`FIT_R_VALUES`) these are exactly the coefficients the measured simulator
    (:func:`moelab.afd.simulate_measured`, :func:`moelab.afd.measured_optimum`) fits on the same tables, so
    ``optimal_ratio(B, mu_P, mu_D, coeffs=coefficients_from_tables(...))`` equals the simulator's ``r_star``
    at the same workload.

    Parameters
    ----------
    calibration : str or path
        A bundled GPU (``"h200"``) or any folder ``moelab calibrate --out DIR`` wrote; a folder without
        ``attn_step.csv`` / ``moe_step.csv`` is refused with a ``ValueError`` naming the missing file.
    shape : str
        The registry model whose stage geometry prices the tables (a MoE shape).
    B : int
        Request slots per attention instance and microbatch (>= 1).
    r_values : sequence of int
        The fit's design of bundle sizes (default :data:`FIT_R_VALUES`, the simulator's).
    method : str
        The ``moe_step`` table's method column.
    link : bool
        Include the A<->F link stage (the DeepEP table); False prices it at zero.

    Returns
    -------
    AFDCoefficients
        ``a_A, b_A, a_F, b_F, a_C, b_C`` in ms per model step, with the fit errors in ``source``.
    """
    return fit_coefficients(StageTables.from_calibration(calibration, shape, method, link), B=B,
                            r_values=r_values).coeffs


def link_table() -> pd.DataFrame:
    """The published DeepEP dispatch/combine table the link stage reads (a copy)."""
    return _deepep_table().copy()


@functools.lru_cache(maxsize=1)
def _deepep_table() -> pd.DataFrame:
    path = public_path("deepep-lowlatency")
    if path.stat().st_size > 1_000_000:
        raise ValueError(f"{path} is larger than 1 MB; not the DeepEP table")
    return pd.read_csv(path)


@functools.lru_cache(maxsize=1)
def _bundled_h200_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    # read once: every StageTables.h200() shares them (the constructor copies what it keeps)
    return read_calibration_table("h200", "attn_step"), read_calibration_table("h200", "moe_step")


__all__ = ["FIT_R_VALUES", "Coverage", "CoefficientFit", "LinearStages", "StageGeometry", "StageTables", "coefficients_from_tables",
           "fit_coefficients", "geometry", "link_table"]
