"""Whole decode layer and whole decode step of a MoE transformer, composed from the component models.

The component tables (``moe_step``, ``attn_step``) time only the expert FFNs and the attention core.
A real decode layer also runs the QKV and O projections, the router, two RMSNorms, top-k and the
residual adds. :class:`DecodeLayerModel` accounts for them in two parts:

* a **roofline part derived from bytes**: the projection and router weights are read once per step,
  at the HBM bandwidth the attention table measured (its fitted ms/GB), never typed in;
* a **fitted part**: a fixed per-layer overhead (the small kernels' launch/latency floor) and a
  per-token term (projection FLOPs), fitted with non-negative least squares on a seeded *training*
  split of ``decode_layer.csv``; the fit error is reported on the *held-out* points only.

:class:`moelab.costmodel.DecodeStepModel` (``step.py``) sums the layers plus the LM head into the
latency of one decode step — the one step model every simulator uses.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from moelab._validate import check_array, check_int, check_real, rng_from
from moelab.costmodel.fit import FitReport
from moelab.costmodel.models import AttentionModel, MoEStepModel
from moelab.costmodel.shapes import ModelShape, MoEShape, model_shape
from moelab.costmodel.tables import calibration_moe_shapes, read_calibration_table


def _layer_shape(shape: ModelShape | str) -> ModelShape:
    s = model_shape(shape)
    if not s.is_moe:
        raise ValueError(f"shape {shape!r} is dense; a decode-layer model needs a MoE shape")
    return s


_OTHER_FEATURES = ("fixed_ms", "ms_per_token_TFLOP")


@functools.lru_cache(maxsize=8)
def _h200_layer(test_frac: float, seed: int) -> DecodeLayerModel:
    # the fit is deterministic and immutable, so simulators may share one instance
    return DecodeLayerModel.from_calibration("h200", test_frac=test_frac, seed=seed)


@dataclass(frozen=True)
class DecodeLayerModel:
    """One whole decode layer (ms) = MoE(B, D) + attention(KV bytes) + projections/router/norms.

    Attributes
    ----------
    moe : MoEStepModel
        The fitted MoE-layer model.
    attn : AttentionModel
        The fitted attention model.
    ms_per_gb : float
        HBM time per GB, taken from the attention fit (bandwidth-bound regime).
    other_coef : ndarray
        ``[fixed_ms, ms_per_token_TFLOP]`` of the projections, router and norms, fitted on the training split.
    train_report, test_report : FitReport
        Fit error on the training points and on the held-out points.
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
        moe_shapes: Mapping[str, MoEShape] | None = None,
    ) -> DecodeLayerModel:
        """Fit the components on their tables and the remaining overhead on a seeded training split
        of ``layer_table`` (columns ``shape, B, ctx, D, ms_per_layer``); ``test_frac`` is held out.
        ``moe_shapes`` names ``moe_table``'s expert shapes that are not in the registry."""
        test_frac = check_real("test_frac", test_frac, low=0, high=1, low_open=True, high_open=True)
        moe = MoEStepModel.from_table(moe_table, method, shapes=moe_shapes)
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
    def from_calibration(cls, calibration: str | os.PathLike, *, test_frac: float = 0.5, seed: int = 0) -> DecodeLayerModel:
        """Fitted on ``moe_step``, ``attn_step`` and ``decode_layer`` tables of a bundled GPU or a
        ``moelab calibrate --out DIR`` folder (a folder lacking a table is refused, naming the file and
        the command that writes it; the tables' columns: :func:`moelab.costmodel.tables.read_calibration_table`)."""
        tables = [read_calibration_table(calibration, t) for t in ("moe_step", "attn_step", "decode_layer")]
        return cls.from_tables(*tables, test_frac=test_frac, seed=seed,
                               moe_shapes=calibration_moe_shapes(calibration))

    @classmethod
    def h200(cls, *, test_frac: float = 0.5, seed: int = 0) -> DecodeLayerModel:
        """Fitted on the bundled H200 tables (overhead on a training half of ``decode_layer.csv``)."""
        test_frac = check_real("test_frac", test_frac, low=0, high=1, low_open=True, high_open=True)
        return _h200_layer(float(test_frac), check_int("seed", seed, low=0, high=2**32 - 1))

    def _known_and_features(self, shape: ModelShape | str, B: float, ctx: float, D: float) -> tuple[float, np.ndarray]:
        s = _layer_shape(shape)
        known = float(self.moe.predict_ms(s.moe, B, D) + self.attn.predict_ms(B * ctx * s.kv_bytes_per_token)
                      + s.proj_bytes / 1e9 * self.ms_per_gb)
        return known, np.array([1.0, B * 2.0 * s.proj_params / 1e12])

    def other_ms(self, shape: ModelShape | str, B: np.ndarray | float) -> np.ndarray:
        """Projections + router + norms + residuals of one layer: bytes/bandwidth + fitted terms."""
        s = model_shape(shape)
        B = check_array("B", B, low=0).astype(np.float64)
        return s.proj_bytes / 1e9 * self.ms_per_gb + self.other_coef[0] + self.other_coef[1] * B * 2.0 * s.proj_params / 1e12

    def dense_ffn_ms(self, params: int, B: np.ndarray | float, bytes_per_param: int = 2) -> np.ndarray:
        """A dense FFN of ``params`` weights (a dense layer's MLP, a MoE layer's shared experts): its
        weights read once per step (bytes / measured bandwidth) + its FLOPs at the fitted per-TFLOP cost."""
        B = check_array("B", B, low=0).astype(np.float64)
        return params * bytes_per_param / 1e9 * self.ms_per_gb + self.other_coef[1] * B * 2.0 * params / 1e12

    def predict_ms(self, shape: ModelShape | str, B: np.ndarray | float, ctx: np.ndarray | float, D: np.ndarray | float) -> np.ndarray:
        """Predicted ms of one decode layer for ``B`` requests of ``ctx`` cached tokens each, ``D``
        distinct experts (vectorised)."""
        s = _layer_shape(shape)
        B = check_array("B", B, low=0).astype(np.float64)
        ctx = check_array("ctx", ctx, low=0).astype(np.float64)
        attn = self.attn.predict_ms(B * ctx * s.kv_bytes_per_token)
        return self.moe.predict_ms(s.moe, B, D) + attn + self.other_ms(s, B)

    def as_dict(self) -> dict[str, float]:
        """Bandwidth and fitted overhead coefficients by name."""
        return {"ms_per_GB": self.ms_per_gb, **dict(zip(_OTHER_FEATURES, map(float, self.other_coef)))}


__all__ = ["DecodeLayerModel"]
