"""Fitted component models: MoE expert FFNs vs distinct experts, attention vs KV bytes, dense verify vs q."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moelab._validate import check_array
from moelab.costmodel.fit import FitReport, LinearFit, fit_linear


@dataclass(frozen=True)
class MoEShape:
    """One MoE layer's expert shape: hidden ``H``, expert FFN ``F``, experts ``E``, ``top_k``; bf16."""

    hidden: int
    ffn: int
    num_experts: int
    top_k: int
    bytes_per_param: int = 2

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one SwiGLU expert (w1, w3: H x F; w2: F x H)."""
        return 3 * self.hidden * self.ffn * self.bytes_per_param


MOE_SHAPES: dict[str, MoEShape] = {
    "mixtral-8x7b": MoEShape(4096, 14336, 8, 2),
    "qwen1.5-moe-a2.7b": MoEShape(2048, 1408, 60, 4),
    "deepseek-v2-lite": MoEShape(2048, 1408, 64, 6),
    "olmoe-1b-7b": MoEShape(2048, 1024, 64, 8),
    "qwen3-30b-a3b": MoEShape(2048, 768, 128, 8),
}


def _moe_features(shape: MoEShape, B: np.ndarray, D: np.ndarray) -> np.ndarray:
    B, D = np.broadcast_arrays(np.asarray(B, dtype=np.float64), np.asarray(D, dtype=np.float64))
    # fixed launch cost | weight bytes of the distinct experts | per-expert kernel overhead | token FLOPs
    flops = 2.0 * B * shape.top_k * 3 * shape.hidden * shape.ffn
    return np.stack([np.ones_like(B * D), D * shape.expert_bytes / 1e9, D, flops / 1e12], axis=-1)


_MOE_FEATURES = ("launch_ms", "ms_per_GB_weights", "ms_per_expert", "ms_per_TFLOP")


@dataclass(frozen=True)
class MoEStepModel:
    """One MoE layer's decode time (ms) from batch ``B`` and distinct experts ``D``, for any shape:
    ``t = c0 + c1 * D*expert_GB + c2 * D + c3 * TFLOPs(B)``, fitted on a measured ``moe_step`` table."""

    fit: LinearFit
    report: FitReport
    method: str

    @classmethod
    def from_table(cls, table: pd.DataFrame, method: str = "bmm_active") -> MoEStepModel:
        """Fit on the rows of ``table`` measured with ``method`` (shapes must be in :data:`MOE_SHAPES`)."""
        rows = table[table["method"] == method]
        if rows.empty:
            raise ValueError(f"method must be one of {sorted(table['method'].unique())}; got {method!r}")
        unknown = sorted(set(rows["model"]) - set(MOE_SHAPES))
        if unknown:
            raise ValueError(f"table has MoE shapes {unknown} not in MOE_SHAPES; add them first")
        X = np.concatenate([_moe_features(MOE_SHAPES[m], g["B"].to_numpy(), g["D"].to_numpy()) for m, g in rows.groupby("model", sort=False)])
        y = np.concatenate([g["ms_per_layer"].to_numpy() for _, g in rows.groupby("model", sort=False)])
        fit, report = fit_linear(X, y, _MOE_FEATURES)
        return cls(fit, report, method)

    @classmethod
    def h200(cls, method: str = "bmm_active") -> MoEStepModel:
        """Fitted on the bundled H200 measurements."""
        from moelab.datasets import load_calibration

        return cls.from_table(load_calibration("h200", "moe_step"), method)

    def predict_ms(self, shape: MoEShape | str, B: np.ndarray | int, D: np.ndarray | int) -> np.ndarray:
        """Predicted ms for one MoE layer (vectorised over ``B`` and ``D``)."""
        if isinstance(shape, str):
            if shape not in MOE_SHAPES:
                raise ValueError(f"shape must be one of {sorted(MOE_SHAPES)} or a MoEShape; got {shape!r}")
            shape = MOE_SHAPES[shape]
        D = check_array("D", D, low=0)
        if D.size and D.max() > shape.num_experts:
            raise ValueError(f"D must be in [0, num_experts={shape.num_experts}]; got max {D.max()}")
        B = check_array("B", B, low=0)
        return self.fit.predict(_moe_features(shape, B, D))


@dataclass(frozen=True)
class AttentionModel:
    """Decode attention core time (ms) per layer from KV bytes read: ``max(floor, a + b*GB)``."""

    floor_ms: float
    fit: LinearFit
    report: FitReport

    @classmethod
    def from_table(cls, table: pd.DataFrame) -> AttentionModel:
        kv_gb = table["kv_bytes"].to_numpy(np.float64) / 1e9
        y = table["ms_attn_core"].to_numpy(np.float64)
        floor = float(np.median(y[kv_gb <= np.quantile(kv_gb, 0.2)]))
        linear = y > 1.5 * floor  # bandwidth-bound points; below them the kernel floor dominates
        fit, _ = fit_linear(np.stack([np.ones(linear.sum()), kv_gb[linear]], axis=1), y[linear], ("base_ms", "ms_per_GB"))
        model = cls(floor, fit, FitReport(y, y))
        return cls(floor, fit, FitReport(y, model.predict_ms(kv_gb * 1e9)))

    @classmethod
    def h200(cls) -> AttentionModel:
        from moelab.datasets import load_calibration

        return cls.from_table(load_calibration("h200", "attn_step"))

    def predict_ms(self, kv_bytes: np.ndarray | float) -> np.ndarray:
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
        from moelab.datasets import load_calibration

        return cls(load_calibration("h200", "dense_verify"))

    @property
    def shapes(self) -> list[str]:
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
    n = np.asarray(n_tokens, dtype=np.float64)
    return num_experts * -np.expm1(n * np.log1p(-top_k / num_experts))


def check_shape_name(name: str) -> str:
    """Validate a MoE shape name."""
    if name not in MOE_SHAPES:
        raise ValueError(f"shape must be one of {sorted(MOE_SHAPES)}; got {name!r}")
    return name


__all__ = ["MOE_SHAPES", "AttentionModel", "DenseVerifyModel", "MoEShape", "MoEStepModel", "check_shape_name",
           "expected_distinct_experts"]
