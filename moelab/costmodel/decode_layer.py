"""Whole decode layer and whole decode step of a MoE transformer, composed from the component models.

The component tables (``moe_step``, ``attn_step``) time only the expert FFNs and the attention core.
A real decode layer also runs the QKV and O projections, the router, two RMSNorms, top-k and the
residual adds. :class:`DecodeLayerModel` accounts for them in two parts:

* a **roofline part derived from bytes**: the projection and router weights are read once per step,
  at the HBM bandwidth the attention table measured (its fitted ms/GB), never typed in;
* a **fitted part**: a fixed per-layer overhead (the small kernels' launch/latency floor) and a
  per-token term (projection FLOPs), fitted with non-negative least squares on a seeded *training*
  split of ``decode_layer.csv``; the fit error is reported on the *held-out* points only.

:class:`DecodeStepModel` sums ``num_layers`` layers plus the LM head (bytes / bandwidth) into the
latency of one decode step of one worker — the cost model the ELDR decode-cluster simulator uses.
Because the MoE model is linear in the distinct-expert count ``D``, the sum over layers only needs
``sum_l D_l`` (exact, not an approximation of the fitted model).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from moelab._validate import check_array, check_int, check_real, rng_from
from moelab.costmodel.fit import FitReport
from moelab.costmodel.models import MOE_SHAPES, AttentionModel, MoEShape, MoEStepModel


@dataclass(frozen=True)
class LayerShape:
    """Shape of one MoE transformer layer (bf16 by default).

    ``hidden``; attention ``q_heads``/``kv_heads`` of ``head_dim``; ``moe`` the expert shape;
    ``vocab`` the LM-head size (used by :class:`DecodeStepModel`)."""

    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    moe: MoEShape
    vocab: int = 0
    bytes_per_param: int = 2

    @property
    def proj_params(self) -> int:
        """QKV + O projection and router weights of one layer."""
        h, d = self.hidden, self.head_dim
        return h * (self.q_heads + 2 * self.kv_heads) * d + self.q_heads * d * h + h * self.moe.num_experts

    @property
    def proj_bytes(self) -> int:
        return self.proj_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """K+V bytes one cached token occupies in one layer."""
        return 2 * self.kv_heads * self.head_dim * self.bytes_per_param


LAYER_SHAPES: dict[str, LayerShape] = {
    # Qwen3-30B-A3B: 48 layers, hidden 2048, 32 q / 4 kv heads of 128, 128 experts of FFN 768, top-8.
    "qwen3-30b-a3b": LayerShape(2048, 32, 4, 128, MOE_SHAPES["qwen3-30b-a3b"], vocab=151936),
    # OLMoE-1B-7B: 16 layers, hidden 2048, 16 heads of 128 (MHA), 64 experts of FFN 1024, top-8.
    "olmoe-1b-7b": LayerShape(2048, 16, 16, 128, MOE_SHAPES["olmoe-1b-7b"], vocab=50304),
    # Mixtral-8x7B: 32 layers, hidden 4096, 32 q / 8 kv heads of 128, 8 experts of FFN 14336, top-2.
    "mixtral-8x7b": LayerShape(4096, 32, 8, 128, MOE_SHAPES["mixtral-8x7b"], vocab=32000),
}
MODEL_LAYERS: dict[str, int] = {"qwen3-30b-a3b": 48, "olmoe-1b-7b": 16, "mixtral-8x7b": 32}


def _layer_shape(shape: LayerShape | str) -> LayerShape:
    if isinstance(shape, LayerShape):
        return shape
    if shape not in LAYER_SHAPES:
        raise ValueError(f"shape must be one of {sorted(LAYER_SHAPES)} or a LayerShape; got {shape!r}")
    return LAYER_SHAPES[shape]


_OTHER_FEATURES = ("fixed_ms", "ms_per_token_TFLOP")


@functools.lru_cache(maxsize=8)
def _h200_layer(test_frac: float, seed: int) -> DecodeLayerModel:
    # the fit is deterministic and immutable, so simulators may share one instance
    from moelab.datasets import load_calibration

    return DecodeLayerModel.from_tables(load_calibration("h200", "moe_step"), load_calibration("h200", "attn_step"),
                                        load_calibration("h200", "decode_layer"), test_frac=test_frac, seed=seed)


@dataclass(frozen=True)
class DecodeLayerModel:
    """One whole decode layer (ms) = MoE(B, D) + attention(KV bytes) + projections/router/norms.

    Attributes
    ----------
    moe, attn : the fitted component models
    ms_per_gb : HBM time per GB, taken from the attention fit (bandwidth-bound regime)
    other_coef : ``[fixed_ms, ms_per_token_TFLOP]`` fitted on the training split
    train_report, test_report : fit error on the training points and on the held-out points
    """

    moe: MoEStepModel
    attn: AttentionModel
    ms_per_gb: float
    other_coef: np.ndarray
    train_report: FitReport
    test_report: FitReport

    @classmethod
    def from_tables(
        cls,
        moe_table: pd.DataFrame,
        attn_table: pd.DataFrame,
        layer_table: pd.DataFrame,
        *,
        test_frac: float = 0.5,
        seed: int = 0,
        method: str = "bmm_active",
    ) -> DecodeLayerModel:
        """Fit the components on their tables and the remaining overhead on a seeded training split
        of ``layer_table`` (columns ``shape, B, ctx, D, ms_per_layer``); ``test_frac`` is held out."""
        test_frac = check_real("test_frac", test_frac, low=0, high=1, low_open=True, high_open=True)
        moe = MoEStepModel.from_table(moe_table, method)
        attn = AttentionModel.from_table(attn_table)
        ms_per_gb = float(attn.fit.as_dict()["ms_per_GB"])
        n = len(layer_table)
        rng = rng_from(seed)
        test = np.zeros(n, dtype=bool)
        test[rng.permutation(n)[: max(1, int(round(test_frac * n)))]] = True
        if test.all():
            raise ValueError("test_frac leaves no training points")
        base = cls(moe, attn, ms_per_gb, np.zeros(2), FitReport(np.ones(1), np.ones(1)), FitReport(np.ones(1), np.ones(1)))
        parts = [base._known_and_features(r.shape, r.B, r.ctx, r.D) for r in layer_table.itertuples()]
        known = np.array([p[0] for p in parts])
        X = np.array([p[1] for p in parts])
        y = layer_table["ms_per_layer"].to_numpy(np.float64)
        w = 1.0 / y  # relative error is what matters
        coef, _ = nnls(X[~test] * w[~test, None], (y[~test] - known[~test]) * w[~test])
        pred = known + X @ coef
        return cls(moe, attn, ms_per_gb, coef, FitReport(y[~test], pred[~test]), FitReport(y[test], pred[test]))

    @classmethod
    def h200(cls, *, test_frac: float = 0.5, seed: int = 0) -> DecodeLayerModel:
        """Fitted on the bundled H200 tables (overhead on a training half of ``decode_layer.csv``)."""
        return _h200_layer(float(test_frac), int(seed))

    def _known_and_features(self, shape: LayerShape | str, B: float, ctx: float, D: float) -> tuple[float, np.ndarray]:
        s = _layer_shape(shape)
        known = float(self.moe.predict_ms(s.moe, B, D) + self.attn.predict_ms(B * ctx * s.kv_bytes_per_token)
                      + s.proj_bytes / 1e9 * self.ms_per_gb)
        return known, np.array([1.0, B * 2.0 * s.proj_params / 1e12])

    def other_ms(self, shape: LayerShape | str, B: np.ndarray | float) -> np.ndarray:
        """Projections + router + norms + residuals of one layer: bytes/bandwidth + fitted terms."""
        s = _layer_shape(shape)
        B = check_array("B", B, low=0).astype(np.float64)
        return s.proj_bytes / 1e9 * self.ms_per_gb + self.other_coef[0] + self.other_coef[1] * B * 2.0 * s.proj_params / 1e12

    def predict_ms(self, shape: LayerShape | str, B: np.ndarray | float, ctx: np.ndarray | float, D: np.ndarray | float) -> np.ndarray:
        """Predicted ms of one decode layer for ``B`` requests of ``ctx`` cached tokens each, ``D``
        distinct experts (vectorised)."""
        s = _layer_shape(shape)
        B = check_array("B", B, low=0).astype(np.float64)
        ctx = check_array("ctx", ctx, low=0).astype(np.float64)
        attn = self.attn.predict_ms(B * ctx * s.kv_bytes_per_token)
        return self.moe.predict_ms(s.moe, B, D) + attn + self.other_ms(s, B)

    def as_dict(self) -> dict[str, float]:
        return {"ms_per_GB": self.ms_per_gb, **dict(zip(_OTHER_FEATURES, map(float, self.other_coef)))}


@dataclass(frozen=True)
class DecodeStepModel:
    """Latency (ms) of one decode step of one worker: ``num_layers`` decode layers + the LM head.

    ``step_ms(B, sum_D, kv_tokens)``: ``B`` requests in the batch, ``sum_D`` the distinct experts
    summed over MoE layers, ``kv_tokens`` the KV-cache tokens the batch holds (all vectorised).
    ``num_experts``/``top_k`` must match the trace a simulator feeds it (checked by
    :meth:`check_geometry`)."""

    layer: DecodeLayerModel
    shape: LayerShape
    num_layers: int
    name: str = "custom"

    @classmethod
    def h200(cls, model: str = "qwen3-30b-a3b", *, shape: LayerShape | None = None, num_layers: int | None = None,
             seed: int = 0) -> DecodeStepModel:
        """A step model at a named geometry (``LAYER_SHAPES``) or at a custom ``shape``/``num_layers``."""
        if shape is None:
            shape = _layer_shape(model)
            num_layers = MODEL_LAYERS[model] if num_layers is None else num_layers
        if num_layers is None:
            raise ValueError("num_layers must be given with a custom shape")
        num_layers = check_int("num_layers", num_layers, low=1)
        return cls(DecodeLayerModel.h200(seed=seed), shape, num_layers, model)

    @classmethod
    def from_hf_config(cls, config: dict | str, *, seed: int = 0) -> DecodeStepModel:
        """A step model at the geometry of a Hugging Face MoE config (a dict or a ``config.json`` path;
        Qwen2/3-MoE / OLMoE / Mixtral key names), e.g. the tiny MoE's own geometry."""
        if not isinstance(config, dict):
            from moelab._io import read_json

            config = read_json(config)
        c = config

        def get(*names: str, default: int | None = None) -> int:
            for nm in names:
                if c.get(nm) is not None:
                    return int(c[nm])
            if default is None:
                raise ValueError(f"config lacks {names[0]!r} (also tried {list(names[1:])})")
            return default

        hidden = get("hidden_size")
        q = get("num_attention_heads")
        shape = LayerShape(hidden, q, get("num_key_value_heads", default=q), get("head_dim", default=hidden // q),
                           MoEShape(hidden, get("moe_intermediate_size", "intermediate_size"),
                                    get("num_experts", "num_local_experts"), get("num_experts_per_tok")),
                           vocab=get("vocab_size", default=0))
        n_layers = get("num_hidden_layers")
        # Qwen-MoE configs may keep some layers dense (mlp_only_layers, decoder_sparse_step): a trace
        # records only the MoE layers, so the step model counts those
        dense = set(c.get("mlp_only_layers") or [])
        step = int(c.get("decoder_sparse_step") or 1)
        n_moe = sum(1 for i in range(n_layers) if i not in dense and (i + 1) % step == 0)
        return cls(DecodeLayerModel.h200(seed=seed), shape, n_moe, str(c.get("model_type", "hf-config")))

    def check_geometry(self, num_layers: int, num_experts: int, top_k: int) -> None:
        """Raise ``ValueError`` when a trace's geometry is not the one this model was built for."""
        want = (self.num_layers, self.shape.moe.num_experts, self.shape.moe.top_k)
        if (num_layers, num_experts, top_k) != want:
            raise ValueError(f"trace geometry (layers, experts, top_k)={(num_layers, num_experts, top_k)} does not match "
                             f"the cost model geometry {want} ({self.name}); build the cost model at the trace's geometry")

    def head_ms(self) -> float:
        """LM head: its weights read once per step (bytes / measured bandwidth)."""
        return self.shape.vocab * self.shape.hidden * self.shape.bytes_per_param / 1e9 * self.layer.ms_per_gb

    def step_ms(self, B: np.ndarray | float, sum_D: np.ndarray | float, kv_tokens: np.ndarray | float) -> np.ndarray:
        """Decode-step latency in ms (vectorised over steps)."""
        B = np.asarray(B, dtype=np.float64)
        sum_D = np.asarray(sum_D, dtype=np.float64)
        kv = np.asarray(kv_tokens, dtype=np.float64)
        s, L = self.shape, self.num_layers
        moe0 = self.layer.moe.predict_ms(s.moe, B, np.zeros_like(B))
        per_d = self.layer.moe.predict_ms(s.moe, B, np.ones_like(B)) - moe0  # the MoE fit is linear in D
        attn = self.layer.attn.predict_ms(kv * s.kv_bytes_per_token)
        return L * (moe0 + attn + self.layer.other_ms(s, B)) + per_d * sum_D + self.head_ms()

    def coefficients(self, B: float) -> tuple[float, float]:
        """``(fixed_ms, ms_per_distinct_expert)`` at batch ``B`` with an empty KV cache, for reporting."""
        f = float(self.step_ms(B, 0.0, 0.0))
        return f, float(self.step_ms(B, 1.0, 0.0)) - f


__all__ = ["LAYER_SHAPES", "MODEL_LAYERS", "DecodeLayerModel", "DecodeStepModel", "LayerShape"]
