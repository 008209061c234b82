"""Step-latency models fitted from measured tables: data in, a predictor out, with its fit error.

The measured H200 tables (``data/calibration/h200/``) and any GPU's ``moelab calibrate`` output have
the same columns, so every model here is fitted, never typed in.
"""

from moelab.costmodel.decode_layer import (
    LAYER_SHAPES,
    MODEL_LAYERS,
    DecodeLayerModel,
    DecodeStepModel,
    LayerShape,
)
from moelab.costmodel.fit import FitReport, LinearFit, fit_linear
from moelab.costmodel.models import (
    MOE_SHAPES,
    AttentionModel,
    DenseVerifyModel,
    MoEShape,
    MoEStepModel,
    expected_distinct_experts,
)

__all__ = [
    "FitReport", "LinearFit", "fit_linear",
    "LAYER_SHAPES", "MODEL_LAYERS", "DecodeLayerModel", "DecodeStepModel", "LayerShape",
    "MOE_SHAPES", "AttentionModel", "DenseVerifyModel", "MoEShape", "MoEStepModel", "expected_distinct_experts",
]
