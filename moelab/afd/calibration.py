"""AFD coefficients from measured GPU tables (units: milliseconds per model step).

- Attention side ``a_A, b_A``: the :class:`moelab.costmodel.AttentionModel` fit of ``attn_step.csv``
  (decode attention core vs KV bytes, linear above its ~16 us kernel floor). ``a_A`` = ms per GB times
  the KV bytes one cached token adds per layer; ``b_A`` = the fit's intercept. The QKV/O projections
  are not in that table and are left out.
- FFN side ``a_F, b_F``: the :class:`moelab.costmodel.MoEStepModel` fit of ``moe_step.csv`` evaluated
  at the batch sizes an FFN instance sees (``n = r*B``) with the expected number of distinct experts
  under uniform top-k routing, ``D(n) = E*(1-(1-k/E)^n)``, then a straight line ``a_F*n + b_F``
  least-squares fitted over ``n_range``. Once ``n*k >> E`` every expert is active, so ``b_F`` is the
  weight read of all experts and ``a_F`` the per-token FLOPs.
- Communication ``a_C, b_C``: NOT measured (the tables have no interconnect). The stand-in is a
  link model: each token's hidden state (``hidden * 2`` bytes, bf16) crosses a link of ``link_GBps``
  with a fixed ``link_latency_us`` per transfer. The defaults (50 GB/s, 10 us: a 400 Gb/s RDMA NIC)
  are assumptions, labelled as such in ``source``.

Every coefficient is multiplied by ``layers`` (AFD ping-pongs every layer), so time is per model
step; r* does not depend on ``layers`` (all six scale together), throughput does.
"""

from __future__ import annotations

import numpy as np

from moelab._validate import check_int, check_real
from moelab.afd.theory import AFDCoefficients

# decoder layers and GQA KV geometry of the MoE shapes the H200 tables cover
MODEL_LAYOUT: dict[str, dict[str, int]] = {
    "qwen3-30b-a3b": {"layers": 48, "kv_heads": 4, "head_dim": 128},
    "mixtral-8x7b": {"layers": 32, "kv_heads": 8, "head_dim": 128},
}


def coefficients_from_tables(gpu: str = "h200", shape: str = "qwen3-30b-a3b", *, n_range: tuple[int, int] = (256, 8192),
                             link_GBps: float = 50.0, link_latency_us: float = 10.0, layers: int | None = None,
                             method: str = "bmm_active") -> AFDCoefficients:
    """Fit ``AFDCoefficients`` (ms per model step) from the measured tables of ``gpu``.

    Parameters
    ----------
    gpu : str
        Calibration folder under ``data/calibration`` (``"h200"``).
    shape : str
        MoE model shape; one of :data:`MODEL_LAYOUT` (the attention table's shapes).
    n_range : (int, int)
        Aggregated FFN batch range (tokens) the FFN line is fitted over.
    link_GBps, link_latency_us : float
        The assumed A<->F link (bandwidth > 0, latency >= 0) standing in for the communication term.
    layers : int, optional
        Decoder layers (default: the shape's); coefficients are per model step.
    method : str
        MoE kernel rows of ``moe_step.csv`` to fit (``bmm_active`` or ``grouped_mm``).
    """
    from moelab.costmodel import MOE_SHAPES, AttentionModel, MoEStepModel, expected_distinct_experts
    from moelab.datasets import load_calibration

    if shape not in MODEL_LAYOUT:
        raise ValueError(f"shape must be one of {sorted(MODEL_LAYOUT)}; got {shape!r}")
    lo = check_int("n_range[0]", n_range[0], low=1)
    hi = check_int("n_range[1]", n_range[1], low=lo + 1)
    link_GBps = check_real("link_GBps", link_GBps, low=0, low_open=True)
    link_latency_us = check_real("link_latency_us", link_latency_us, low=0)
    layout = MODEL_LAYOUT[shape]
    L = layout["layers"] if layers is None else check_int("layers", layers, low=1)
    moe_shape = MOE_SHAPES[shape]

    attn_table = load_calibration(gpu, "attn_step")
    rows = attn_table[attn_table["shape"] == shape]
    if rows.empty:
        raise ValueError(f"attn_step table of {gpu!r} has no rows for shape {shape!r}")
    attn = AttentionModel.from_table(rows)
    bytes_per_token = float(AttentionModel.kv_bytes(1, layout["kv_heads"], layout["head_dim"]))
    a_A = attn.fit.as_dict()["ms_per_GB"] * bytes_per_token / 1e9
    b_A = attn.fit.as_dict()["base_ms"]

    moe = MoEStepModel.from_table(load_calibration(gpu, "moe_step"), method)
    n = np.unique(np.geomspace(lo, hi, 32).round())
    t = moe.predict_ms(moe_shape, n, expected_distinct_experts(n, moe_shape.num_experts, moe_shape.top_k))
    a_F, b_F = np.polyfit(n, t, 1)
    if a_F <= 0:
        raise ValueError(f"the fitted FFN time does not grow with batch over n_range={n_range}; widen it")

    act_bytes = moe_shape.hidden * 2  # one bf16 hidden state per token and direction
    a_C = act_bytes / (link_GBps * 1e9) * 1e3
    b_C = link_latency_us / 1e3
    note = (f"{gpu} tables, {shape} x{L} layers: attention fit (median err {attn.report.median_abs_err_pct:.1f}%), "
            f"MoE fit (median err {moe.report.median_abs_err_pct:.1f}%); communication ASSUMED "
            f"({link_GBps:g} GB/s, {link_latency_us:g} us), not measured")
    return AFDCoefficients(a_A * L, b_A * L, float(a_F) * L, max(float(b_F), 0.0) * L, a_C * L, b_C * L,
                           unit="ms", source=note)


__all__ = ["MODEL_LAYOUT", "coefficients_from_tables"]
