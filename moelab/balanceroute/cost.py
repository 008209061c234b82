"""Step time of a barrier-synchronised DP decode step as a function of the most loaded worker's KV load.

Every decode step ends in a barrier, so it lasts as long as the slowest worker. Workers run the
same batch size (their slots), so everything except attention costs about the same on each; what
differs is the attention read of each worker's KV cache. The model is therefore

``step_ms = fixed_ms + n_layers * attn_ms(kv_bytes(max_g L_g))``

* ``attn_ms`` is :class:`moelab.costmodel.AttentionModel` fitted on the measured H200 table
  ``data/calibration/h200/attn_step.csv`` (``max(floor, a + b*GB)`` per layer);
* ``fixed_ms`` is, per layer, the MoE expert FFN time at the full batch (``MoEStepModel`` fitted on
  ``moe_step.csv``, with the expected number of distinct experts under uniform top-k routing) plus
  the rest of the layer (norms, projections, router) measured as the median residual of the
  composite ``decode_layer.csv`` points after subtracting the MoE and attention models; times
  ``n_layers``. Sampling, embedding and LM head are not modelled.

Default shape: Qwen3-30B-A3B (48 layers, GQA with 4 KV heads of dim 128, bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moelab._validate import check_int, check_real


@dataclass(frozen=True)
class StepCost:
    """``step_ms(max_load) = fixed_ms + n_layers * max(floor_ms, base_ms + ms_per_gb * GB(max_load))``.

    ``kv_bytes_per_token`` is the per-layer K+V bytes one cached token costs.
    """

    fixed_ms: float
    n_layers: int
    floor_ms: float
    base_ms: float
    ms_per_gb: float
    kv_bytes_per_token: float
    note: str = ""

    def __post_init__(self) -> None:
        check_real("fixed_ms", self.fixed_ms, low=0)
        check_int("n_layers", self.n_layers, low=1)
        for name in ("floor_ms", "base_ms", "ms_per_gb"):
            check_real(name, getattr(self, name), low=0)
        check_real("kv_bytes_per_token", self.kv_bytes_per_token, low=0, low_open=True)

    def attn_ms(self, max_load: np.ndarray | float) -> np.ndarray | float:
        """Attention time (all layers) of a worker holding ``max_load`` KV tokens."""
        gb = np.asarray(max_load, dtype=np.float64) * (self.kv_bytes_per_token / 1e9)
        return self.n_layers * np.maximum(self.floor_ms, self.base_ms + self.ms_per_gb * gb)

    def step_ms(self, max_load: np.ndarray | float) -> np.ndarray | float:
        """Step time (ms) when the most loaded worker holds ``max_load`` KV tokens (vectorised)."""
        return self.fixed_ms + self.attn_ms(max_load)

    def step_ms_scalar(self, max_load: float) -> float:
        """Scalar fast path used inside the simulation loop."""
        attn = self.base_ms + self.ms_per_gb * (max_load * self.kv_bytes_per_token / 1e9)
        return self.fixed_ms + self.n_layers * (attn if attn > self.floor_ms else self.floor_ms)

    @classmethod
    def h200(cls, slots: int = 72, *, shape: str = "qwen3-30b-a3b", fixed_ms: float | None = None) -> StepCost:
        """Fitted on the measured H200 tables for a worker of model ``shape`` running ``slots``
        requests per step (layer count and KV layout come from :data:`moelab.costmodel.LAYER_SHAPES`).

        ``fixed_ms`` overrides the measured fixed term (e.g. to study attention-heavy settings).
        """
        from moelab.costmodel import AttentionModel, MoEStepModel, expected_distinct_experts
        from moelab.costmodel.decode_layer import LAYER_SHAPES, MODEL_LAYERS, DecodeLayerModel

        slots = check_int("slots", slots, low=1)
        if shape not in LAYER_SHAPES:
            raise ValueError(f"shape must be one of {sorted(LAYER_SHAPES)}; got {shape!r}")
        layout, n_layers = LAYER_SHAPES[shape], MODEL_LAYERS[shape]
        attn = AttentionModel.h200()
        coef = attn.fit.as_dict()
        base, per_gb = coef["base_ms"], coef["ms_per_GB"]
        kv_per_token = float(layout.kv_bytes_per_token)
        note = "attention: attn_step.csv fit"
        if fixed_ms is None:
            ms = layout.moe
            distinct = float(expected_distinct_experts(slots, ms.num_experts, ms.top_k))
            moe_ms = float(MoEStepModel.h200().predict_ms(ms, slots, min(distinct, ms.num_experts)))
            # projections, router, norms: the part of a whole decode layer the component tables lack
            other = float(DecodeLayerModel.h200().other_ms(layout, slots))
            fixed_ms = n_layers * (moe_ms + other)
            note += (f"; fixed: {n_layers} layers x (MoE {moe_ms:.4f} ms at B={slots} [moe_step.csv] + "
                     f"other {other:.4f} ms [decode_layer model])")
        else:
            fixed_ms = check_real("fixed_ms", fixed_ms, low=0)
            note += f"; fixed {fixed_ms:g} ms (user)"
        return cls(float(fixed_ms), n_layers, float(attn.floor_ms), base, per_gb, kv_per_token, note)
