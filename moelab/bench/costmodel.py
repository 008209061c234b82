"""Cost-model fit errors against the measured H200 tables."""

from __future__ import annotations

from moelab.bench.core import Figure
from moelab.costmodel import AttentionModel, DecodeLayerModel, MoEStepModel


def run(quick: bool = False) -> list[Figure]:
    """Fit errors of the cost models on the bundled H200 tables."""
    moe = MoEStepModel.h200()
    attn = AttentionModel.h200()
    layer = DecodeLayerModel.h200()
    return [
        Figure("costmodel", "costmodel_moe_median_abs_err_pct", moe.report.median_abs_err_pct, "%", "<= 10",
               f"{len(moe.report.measured)} measured MoE-layer points, 5 shapes, {moe.method}"),
        Figure("costmodel", "costmodel_attn_median_abs_err_pct", attn.report.median_abs_err_pct, "%", "<= 10",
               f"{len(attn.report.measured)} measured attention points"),
        Figure("costmodel", "costmodel_layer_median_abs_err_pct", layer.test_report.median_abs_err_pct, "%", "<= 10",
               f"{len(layer.test_report.measured)} held-out decode_layer.csv points (whole Qwen3-30B-A3B layer; "
               f"overhead fitted on the other {len(layer.train_report.measured)})"),
    ]
