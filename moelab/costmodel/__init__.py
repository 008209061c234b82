"""Step-latency models fitted from measured tables: data in, a predictor out, with its fit error.

The measured H200 tables (``data/calibration/h200/``) and any GPU's ``moelab calibrate`` output have
the same columns, so every model here is fitted, never typed in. Model geometry lives in one registry,
:data:`MODEL_SHAPES`; the one decode-step model is :class:`DecodeStepModel`.
"""

from moelab.costmodel.decode_layer import DecodeLayerModel
from moelab.costmodel.dp import DPCost
from moelab.costmodel.fit import FitReport, LinearFit, fit_linear
from moelab.costmodel.models import AttentionModel, DenseVerifyModel, MoEStepModel, expected_distinct_experts
from moelab.costmodel.shapes import MODEL_SHAPES, ModelShape, MoEShape, model_shape, moe_shape
from moelab.costmodel.step import DecodeStepModel, EPStepTable, StepTable
from moelab.costmodel.verify import OnlineVerifyCost, VerifyCost, fit_verify_cost

__all__ = [
    "FitReport", "LinearFit", "fit_linear",
    "MODEL_SHAPES", "ModelShape", "MoEShape", "model_shape", "moe_shape",
    "DecodeLayerModel", "DecodeStepModel", "EPStepTable", "StepTable",
    "AttentionModel", "DenseVerifyModel", "MoEStepModel", "expected_distinct_experts",
    "DPCost", "OnlineVerifyCost", "VerifyCost", "fit_verify_cost",
]

