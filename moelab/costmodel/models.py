"""Fitted component models: MoE expert FFNs vs distinct experts, attention vs KV bytes, dense verify vs q."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moelab._validate import check_array, check_int
from moelab.costmodel.fit import FitReport, LinearFit, fit_linear
from moelab.costmodel.shapes import ModelShape, MoEShape, moe_shape
from moelab.costmodel.tables import calibration_moe_shapes, read_calibration_table


def _moe_features(shape: MoEShape, B: np.ndarray, D: np.ndarray, ep: int = 1) -> np.ndarray:
    B, D = np.broadcast_arrays(np.asarray(B, dtype=np.float64), np.asarray(D, dtype=np.float64))
    # fixed launch cost | weight bytes of the distinct experts | per-expert kernel overhead | token FLOPs;
    # with expert parallelism over ``ep`` ranks every rank reads and computes 1/ep of the work (ideal
    # balance, no all-to-all cost: an assumption stated where it is used)
    flops = 2.0 * B * shape.top_k * 3 * shape.hidden * shape.ffn
    return np.stack([np.ones_like(B * D), D * shape.expert_bytes / 1e9 / ep, D / ep, flops / 1e12 / ep], axis=-1)


_MOE_FEATURES = ("launch_ms", "ms_per_GB_weights", "ms_per_expert", "ms_per_TFLOP")


@dataclass(frozen=True)
class MoEStepModel:
    """One MoE layer's decode time (ms) from batch ``B`` and distinct experts ``D``, for any shape:
    ``t = c0 + c1 * D*expert_GB + c2 * D + c3 * TFLOPs(B)``, fitted on a measured ``moe_step`` table."""

    fit: LinearFit
    report: FitReport
    method: str

    @classmethod
    def from_table(cls, table: pd.DataFrame, method: str = "bmm_active", *,
                   shapes: Mapping[str, MoEShape] | None = None) -> MoEStepModel:
        """Fit on the rows of ``table`` measured with ``method``. The ``model`` column names the expert
        shape: looked up in ``shapes`` (e.g. a calibration plan's own shapes) first, then in
        :data:`moelab.costmodel.MODEL_SHAPES`."""
        rows = table[table["method"] == method]
        if rows.empty:
            raise ValueError(f"method {method!r} has no rows in the moe_step table: its 'method' column holds "
                             f"{sorted(map(str, table['method'].unique()))} (moelab calibrate writes 'bmm_active', the "
                             "method the step models read by default)")
        X, y = [], []
        for m, g in rows.groupby("model", sort=False):
            try:
                shape = moe_shape(str(m), shapes)
            except ValueError as exc:
                raise ValueError(f"table has MoE shape {m!r} that is neither in shapes= nor in MODEL_SHAPES "
                                 f"({exc})") from None
            X.append(_moe_features(shape, g["B"].to_numpy(), g["D"].to_numpy()))
            y.append(g["ms_per_layer"].to_numpy())
        fit, report = fit_linear(np.concatenate(X), np.concatenate(y), _MOE_FEATURES)
        return cls(fit, report, method)

    @classmethod
    def h200(cls, method: str = "bmm_active") -> MoEStepModel:
        """Fitted on the bundled H200 measurements."""
        return cls.from_calibration("h200", method)

    @classmethod
    def from_calibration(cls, calibration: str | os.PathLike, method: str = "bmm_active") -> MoEStepModel:
        """Fitted on ``moe_step.csv`` of a bundled GPU or a ``moelab calibrate`` folder."""
        return cls.from_table(read_calibration_table(calibration, "moe_step"), method,
                              shapes=calibration_moe_shapes(calibration))

    def predict_ms(self, shape: MoEShape | ModelShape | str, B: np.ndarray | int, D: np.ndarray | int, *,
                   ep: int = 1) -> np.ndarray:
        """Predicted ms for one MoE layer (vectorised over ``B`` and ``D``); ``ep``: expert-parallel
        ranks sharing the layer's experts (each does 1/ep of the weight reads and FLOPs)."""
        shape = moe_shape(shape)
        ep = check_int("ep", ep, low=1)
        D = check_array("D", D, low=0)
        if D.size and D.max() > shape.num_experts:
            raise ValueError(f"D must be in [0, num_experts={shape.num_experts}]; got max {D.max()}")
        B = check_array("B", B, low=0)
        return self.fit.predict(_moe_features(shape, B, D, ep))


@dataclass(frozen=True)
class AttentionModel:
    """Decode attention core time (ms) per layer from KV bytes read: ``max(floor, a + b*GB)``."""

    floor_ms: float
    fit: LinearFit
    report: FitReport

    @classmethod
    def from_table(cls, table: pd.DataFrame) -> AttentionModel:
        """Fit on an ``attn_step`` table (columns ``kv_bytes, ms_attn_core``)."""
        kv_gb = table["kv_bytes"].to_numpy(np.float64) / 1e9
        y = table["ms_attn_core"].to_numpy(np.float64)
        floor = float(np.median(y[kv_gb <= np.quantile(kv_gb, 0.2)]))
        linear = y > 1.5 * floor  # bandwidth-bound points; below them the kernel floor dominates
        if not linear.any():
            raise ValueError(f"table has no bandwidth-bound attention point: every ms_attn_core is within 1.5x the "
                             f"kernel floor ({floor:.4g} ms, the median of the smallest 20% of kv_bytes), so the "
                             f"per-GB slope cannot be fitted; measure larger KV sizes (kv_bytes up to "
                             f"{kv_gb.max() * 1e9:.3g} here)")
        fit, _ = fit_linear(np.stack([np.ones(linear.sum()), kv_gb[linear]], axis=1), y[linear], ("base_ms", "ms_per_GB"))
        model = cls(floor, fit, FitReport(y, y))
        return cls(floor, fit, FitReport(y, model.predict_ms(kv_gb * 1e9)))

    @classmethod
    def h200(cls) -> AttentionModel:
        """Fitted on the bundled H200 attention table."""
        return cls.from_calibration("h200")

    @classmethod
    def from_calibration(cls, calibration: str | os.PathLike) -> AttentionModel:
        """Fitted on ``attn_step.csv`` of a bundled GPU or a ``moelab calibrate`` folder."""
        return cls.from_table(read_calibration_table(calibration, "attn_step"))

    def predict_ms(self, kv_bytes: np.ndarray | float) -> np.ndarray:
        """Attention core ms of one layer reading ``kv_bytes`` (vectorised; >= 0, finite)."""
        kv = check_array("kv_bytes", kv_bytes, low=0) / 1e9
        return np.maximum(self.floor_ms, self.fit.predict(np.stack([np.ones_like(kv), kv], axis=-1)))

    def per_token_coefficients(self, kv_bytes_per_token: float) -> tuple[float, float, float]:
        """``(floor_ms, base_ms, ms_per_token)`` so that a layer holding ``n`` cached tokens costs
        ``max(floor_ms, base_ms + ms_per_token * n)`` — the scalar form simulators use in hot loops."""
        c = self.fit.as_dict()
        return float(self.floor_ms), c["base_ms"], c["ms_per_GB"] * kv_bytes_per_token / 1e9

    @staticmethod
    def kv_bytes(tokens: np.ndarray | int, kv_heads: int = 4, head_dim: int = 128, bytes_per_elem: int = 2) -> np.ndarray:
        """K+V bytes one layer reads for ``tokens`` cached tokens (default: Qwen3-30B-A3B GQA, bf16)."""
        return 2 * np.asarray(tokens, dtype=np.float64) * kv_heads * head_dim * bytes_per_elem


@dataclass(frozen=True)
class DenseVerifyModel:
    """Whole-model forward time (ms) of a dense LM verifying ``q`` tokens, by piecewise-linear
    interpolation of a measured ``dense_verify`` table (one curve per shape)."""

    table: pd.DataFrame

    @classmethod
    def h200(cls) -> DenseVerifyModel:
        """The bundled H200 ``dense_verify`` table."""
        return cls.from_calibration("h200")

    @classmethod
    def from_calibration(cls, calibration: str | os.PathLike) -> DenseVerifyModel:
        """``dense_verify.csv`` of a bundled GPU or a ``moelab calibrate`` folder."""
        return cls(read_calibration_table(calibration, "dense_verify"))

    @property
    def shapes(self) -> list[str]:
        """Dense shapes the table measures."""
        return sorted(self.table["shape"].unique())

    def predict_ms(self, shape: str, q: np.ndarray | int) -> np.ndarray:
        """Model forward ms for ``q`` new tokens (q >= 1) over the table's cached context."""
        if shape not in self.shapes:
            raise ValueError(f"shape must be one of {self.shapes}; got {shape!r}")
        q = check_array("q", q, low=1)
        rows = self.table[self.table["shape"] == shape].sort_values("q")
        if q.size and q.max() > rows["q"].max():
            raise ValueError(f"q must be in [1, {rows['q'].max()}] (the measured range); got max {q.max()}")
        return np.interp(q, rows["q"].to_numpy(), rows["ms_model_est"].to_numpy())

    def relative_cost(self, shape: str, q: np.ndarray | int) -> np.ndarray:
        """Verify cost of ``q`` tokens relative to one decode step (1.0 at q=1)."""
        return self.predict_ms(shape, q) / self.predict_ms(shape, 1)


def expected_distinct_experts(n_tokens: np.ndarray | float, num_experts: int, top_k: int) -> np.ndarray:
    """Expected distinct experts hit by ``n_tokens`` tokens each routed uniformly to top-k of E experts:
    ``E * (1 - (1 - k/E)^n)`` (the no-locality baseline every router starts from)."""
    num_experts = check_int("num_experts", num_experts, low=1)
    top_k = check_int("top_k", top_k, low=1, high=num_experts)
    n = check_array("n_tokens", n_tokens, low=0).astype(np.float64)
    if top_k == num_experts:
        return np.where(n > 0, float(num_experts), 0.0)
    return num_experts * -np.expm1(n * np.log1p(-top_k / num_experts))


__all__ = ["AttentionModel", "DenseVerifyModel", "MoEStepModel", "expected_distinct_experts"]
