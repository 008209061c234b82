"""Step-latency models fitted from measured tables: data in, a predictor out, with its fit error.

The measured H200 tables (``data/calibration/h200/``) and any GPU's ``moelab calibrate`` output have
the same columns, so every model here is fitted, never typed in. Model geometry lives in one registry,
:data:`MODEL_SHAPES`; the one decode-step model is :class:`DecodeStepModel`.
"""

from moelab.costmodel.decode_layer import DecodeLayerModel
from moelab.costmodel.fit import FitReport, LinearFit, fit_linear
from moelab.costmodel.models import AttentionModel, DenseVerifyModel, MoEStepModel, expected_distinct_experts
from moelab.costmodel.shapes import MODEL_SHAPES, ModelShape, MoEShape, model_shape, moe_shape
from moelab.costmodel.step import DecodeStepModel, EPStepTable, StepTable

__all__ = [
    "FitReport", "LinearFit", "fit_linear",
    "MODEL_SHAPES", "ModelShape", "MoEShape", "model_shape", "moe_shape",
    "DecodeLayerModel", "DecodeStepModel", "EPStepTable", "StepTable",
    "AttentionModel", "DenseVerifyModel", "MoEStepModel", "expected_distinct_experts",
]


def __getattr__(name: str):  # deprecated aliases of MODEL_SHAPES for afd/ and balanceroute/ until they switch (to be removed)
    import warnings

    legacy = {"MOE_SHAPES": lambda: {n: s.moe for n, s in MODEL_SHAPES.items() if s.is_moe},
              "LAYER_SHAPES": lambda: {n: s for n, s in MODEL_SHAPES.items() if s.is_moe},
              "MODEL_LAYERS": lambda: {n: s.num_layers for n, s in MODEL_SHAPES.items()}}
    if name in legacy:
        warnings.warn(f"moelab.costmodel.{name} is deprecated: use MODEL_SHAPES", DeprecationWarning, stacklevel=2)
        return legacy[name]()
    raise AttributeError(f"module 'moelab.costmodel' has no attribute {name!r}")
