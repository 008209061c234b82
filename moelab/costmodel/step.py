"""The one decode-step model every simulator uses.

One decode step of one worker (ms) =

* MoE layers: routed experts by batch ``B`` and the distinct experts summed over MoE layers
  ``sum_D`` (:class:`~moelab.costmodel.MoEStepModel`, linear in ``D``), plus shared experts;
* attention of every layer by the KV bytes the batch reads (:class:`~moelab.costmodel.AttentionModel`);
* the rest of every layer — projections, router, norms (:meth:`DecodeLayerModel.other_ms`) — and the
  dense FFN of dense layers;
* the LM head (its weights read once per step, bytes / measured bandwidth).

Clusters compose it, never re-fit it:

* :meth:`DecodeStepModel.step_ms` — one independent worker (ELDR's decode instances);
* :meth:`DecodeStepModel.barrier_step_ms` — barrier-synchronised DP ranks: the step lasts as long as
  the slowest rank, each rank priced by :meth:`step_ms` (BalanceRoute's DP cluster);
* :meth:`DecodeStepModel.ep_step_ms` — DP attention + expert parallelism over ``G`` ranks: the MoE
  part from the group's total batch and its union of distinct experts, split over the ranks (ideal
  balance, all-to-all not modelled), plus the slowest rank's attention and per-rank layer work.

:meth:`DecodeStepModel.table` folds the model into per-batch-size arrays for simulators' hot loops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from moelab._validate import check_array, check_int, check_real
from moelab.costmodel.decode_layer import DecodeLayerModel
from moelab.costmodel.models import expected_distinct_experts
from moelab.costmodel.shapes import ModelShape, model_shape

#: the largest batch a step table folds: far above any decode batch (vLLM's max_num_seqs is in the hundreds)
MAX_TABLE_BATCH = 1 << 20


def _nonneg(name: str, x: np.ndarray | float) -> np.ndarray:
    return check_array(name, x, low=0).astype(np.float64)


def _check_finite_costs(what: str, **parts: np.ndarray | float) -> None:
    """``ValueError`` naming the first part of ``what`` that is not finite (a cost model fitted on a table
    with an inf or NaN, or an absurd ``attn_scale``): simulators would report inf/NaN metrics as results."""
    for name, x in parts.items():
        arr = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"cost: {what}'s {name} is not finite ({arr[~np.isfinite(arr)].ravel()[0]!r}); the "
                             "cost model's coefficients or inputs must be finite")


@dataclass(frozen=True)
class StepTable:
    """:class:`DecodeStepModel` folded for a hot loop at batch sizes ``0..max_batch``:
    ``step_ms(b, sum_d, kv) = fixed_ms[b] + ms_per_distinct[b] * sum_d + attn_layers *
    max(attn_floor_ms, attn_base_ms + attn_ms_per_token * kv)``."""

    fixed_ms: np.ndarray
    ms_per_distinct: np.ndarray
    attn_layers: int
    attn_floor_ms: float
    attn_base_ms: float
    attn_ms_per_token: float

    @property
    def max_batch(self) -> int:
        """Largest batch the table covers."""
        return int(self.fixed_ms.shape[0] - 1)

    def attention_ms(self, kv_tokens: float) -> float:
        """Attention of all layers for ``kv_tokens`` cached tokens (scalar)."""
        a = self.attn_base_ms + self.attn_ms_per_token * kv_tokens
        return self.attn_layers * (a if a > self.attn_floor_ms else self.attn_floor_ms)

    def step_ms(self, b: int, sum_d: float, kv_tokens: float) -> float:
        """One step (scalar fast path of :meth:`DecodeStepModel.step_ms`)."""
        return float(self.fixed_ms[b] + self.ms_per_distinct[b] * sum_d) + self.attention_ms(kv_tokens)


@dataclass(frozen=True)
class EPStepTable:
    """:meth:`DecodeStepModel.ep_step_ms` folded for a hot loop: ``G`` ranks of at most ``slots`` requests.

    ``step_ms(b_ranks, sum_d, kv_ranks) = moe_fixed_ms[B] + moe_ms_per_distinct[B] * sum_d + head_ms +
    max_r(rank_fixed_ms[b_r] + attention(kv_r))`` with ``B = sum_r b_r``."""

    ranks: int
    moe_fixed_ms: np.ndarray
    moe_ms_per_distinct: np.ndarray
    rank_fixed_ms: np.ndarray
    head_ms: float
    attn: StepTable

    def step_ms(self, b_ranks: list[int] | np.ndarray, sum_d: float, kv_ranks: list[int] | np.ndarray) -> float:
        """One step (ms) for per-rank batches ``b_ranks``, the group's ``sum_d`` and per-rank KV tokens."""
        b_tot = int(sum(b_ranks))
        rank = max(float(self.rank_fixed_ms[b]) + self.attn.attention_ms(kv) for b, kv in zip(b_ranks, kv_ranks))
        return float(self.moe_fixed_ms[b_tot] + self.moe_ms_per_distinct[b_tot] * sum_d) + self.head_ms + rank


@dataclass(frozen=True)
class DecodeStepModel:
    """Latency (ms) of one decode step at a :class:`ModelShape`, from the fitted layer model.

    ``attn_scale`` multiplies the KV bytes attention reads (1 = the shape's own layout): the knob of
    attention-share and context-scale studies (:meth:`with_attention_share`). ``num_layers`` is the
    number of MoE layers — the layers an expert trace records and ``sum_D`` sums over.
    """

    layer: DecodeLayerModel
    shape: ModelShape
    name: str = "custom"
    attn_scale: float = 1.0

    def __post_init__(self) -> None:
        check_real("attn_scale", self.attn_scale, low=0)

    # ------------------------------------------------------------------ construction
    @classmethod
    def h200(cls, model: str | ModelShape = "qwen3-30b-a3b", *, seed: int = 0) -> DecodeStepModel:
        """The step model at a registry shape (:data:`MODEL_SHAPES`) or a given :class:`ModelShape`,
        fitted on the bundled H200 tables."""
        shape = model_shape(model)
        seed = check_int("seed", seed, low=0, high=2**32 - 1)
        return cls(DecodeLayerModel.h200(seed=seed), shape, model if isinstance(model, str) else "custom")

    @classmethod
    def from_calibration(cls, calibration: str | os.PathLike, model: str | ModelShape = "qwen3-30b-a3b", *,
                         seed: int = 0) -> DecodeStepModel:
        """The step model at ``model``'s geometry fitted on a bundled GPU's tables or a ``moelab calibrate``
        folder (see :meth:`DecodeLayerModel.from_calibration`)."""
        shape = model_shape(model)
        return cls(DecodeLayerModel.from_calibration(calibration, seed=seed), shape,
                   model if isinstance(model, str) else "custom")

    @classmethod
    def from_hf_config(cls, config: dict | str, *, seed: int = 0) -> DecodeStepModel:
        """The step model at the geometry of a Hugging Face config (dict or ``config.json`` path)."""
        shape = ModelShape.from_hf_config(config)
        return cls(DecodeLayerModel.h200(seed=seed), shape, shape.source or "hf-config")

    def with_attn_scale(self, attn_scale: float) -> DecodeStepModel:
        """The same model with attention reading ``attn_scale`` times the shape's KV bytes."""
        return replace(self, attn_scale=check_real("attn_scale", attn_scale, low=0))

    # ------------------------------------------------------------------ geometry
    @property
    def num_layers(self) -> int:
        """MoE layers (what ``sum_D`` sums over and an expert trace records)."""
        return self.shape.num_moe_layers

    def check_geometry(self, num_layers: int, num_experts: int, top_k: int) -> None:
        """Raise ``ValueError`` when a trace's geometry is not the one this model was built for."""
        want = (self.num_layers, self.shape.num_experts, self.shape.top_k)
        if (num_layers, num_experts, top_k) != want:
            raise ValueError(f"trace geometry (layers, experts, top_k)={(num_layers, num_experts, top_k)} does not match "
                             f"the cost model geometry {want} ({self.name}); build the cost model at the trace's geometry")

    # ------------------------------------------------------------------ parts
    def head_ms(self) -> float:
        """LM head: its weights read once per step (bytes / measured bandwidth)."""
        return self.shape.head_bytes / 1e9 * self.layer.ms_per_gb

    def attention_ms(self, kv_tokens: np.ndarray | float) -> np.ndarray:
        """Attention of all layers when the batch holds ``kv_tokens`` cached tokens."""
        kv = _nonneg("kv_tokens", kv_tokens)
        return self.shape.num_layers * self.layer.attn.predict_ms(kv * self.shape.kv_bytes_per_token * self.attn_scale)

    def _moe_parts(self, B: np.ndarray, ep: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(MoE time of all MoE layers at D=0, ms per distinct expert) at batch ``B``."""
        if not self.shape.is_moe:
            return np.zeros_like(B), np.zeros_like(B)
        moe = self.layer.moe
        m0 = moe.predict_ms(self.shape.moe, B, np.zeros_like(B), ep=ep)
        per_d = moe.predict_ms(self.shape.moe, B, np.ones_like(B), ep=ep) - m0  # the MoE fit is linear in D
        return self.num_layers * m0, per_d

    def _rank_ms(self, B: np.ndarray, kv: np.ndarray) -> np.ndarray:
        """Per-worker work that does not depend on the experts: attention, projections/norms of every
        layer, the shared experts of MoE layers and the FFN of dense layers."""
        s, lay = self.shape, self.layer
        out = self.attention_ms(kv) + s.num_layers * lay.other_ms(s, B)
        if s.shared_experts:
            out = out + s.num_moe_layers * lay.dense_ffn_ms(s.shared_experts * 3 * s.hidden * s.expert_ffn, B,
                                                            s.bytes_per_param)
        if s.num_dense_layers:
            out = out + s.num_dense_layers * lay.dense_ffn_ms(3 * s.hidden * s.dense_ffn, B, s.bytes_per_param)
        return out

    # ------------------------------------------------------------------ steps
    def step_ms(self, B: np.ndarray | float, sum_D: np.ndarray | float, kv_tokens: np.ndarray | float) -> np.ndarray:
        """One worker's decode step (ms; vectorised): ``B`` requests, ``sum_D`` distinct experts summed
        over MoE layers, ``kv_tokens`` cached tokens of the batch."""
        B = _nonneg("B", B)
        sum_D = _nonneg("sum_D", sum_D)
        m0, per_d = self._moe_parts(B)
        return m0 + per_d * sum_D + self._rank_ms(B, _nonneg("kv_tokens", kv_tokens)) + self.head_ms()

    def barrier_step_ms(self, B: np.ndarray, sum_D: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
        """Barrier-synchronised DP ranks (last axis): the step lasts as long as the slowest rank,
        each priced by :meth:`step_ms`."""
        return np.max(self.step_ms(B, sum_D, kv_tokens), axis=-1)

    def ep_step_ms(self, B: np.ndarray, sum_D: np.ndarray | float, kv_tokens: np.ndarray) -> np.ndarray:
        """DP attention + expert parallelism over the ranks of the last axis: MoE from the group's total
        batch ``B.sum(-1)`` and its union of distinct experts ``sum_D`` (one value per step), each rank
        doing 1/G of it; plus the slowest rank's attention and per-rank layer work; plus the LM head."""
        B = _nonneg("B", B)
        kv = _nonneg("kv_tokens", kv_tokens)
        G = B.shape[-1] if B.ndim else 1
        m0, per_d = self._moe_parts(B.sum(axis=-1) if B.ndim else B, ep=G)
        return m0 + per_d * _nonneg("sum_D", sum_D) + np.max(self._rank_ms(B, kv), axis=-1) + self.head_ms()

    def expected_sum_distinct(self, n_tokens: np.ndarray | float) -> np.ndarray:
        """``sum_D`` under uniform top-k routing of ``n_tokens`` tokens (no locality)."""
        if not self.shape.is_moe:
            return np.zeros_like(_nonneg("n_tokens", n_tokens))
        return self.num_layers * expected_distinct_experts(n_tokens, self.shape.num_experts, self.shape.top_k)

    def table(self, max_batch: int) -> StepTable:
        """The model folded at batch sizes ``0..max_batch`` for a simulator's hot loop (at most
        :data:`MAX_TABLE_BATCH`: one row per batch size is allocated)."""
        max_batch = check_int("max_batch", max_batch, low=1, high=MAX_TABLE_BATCH)
        Bs = np.arange(max_batch + 1, dtype=np.float64)
        zero = np.zeros_like(Bs)
        attn0 = float(self.attention_ms(0.0))
        fixed = self.step_ms(Bs, zero, zero) - attn0
        per_d = self.step_ms(Bs, np.ones_like(Bs), zero) - self.step_ms(Bs, zero, zero)
        floor, base, per_tok = self.layer.attn.per_token_coefficients(self.shape.kv_bytes_per_token * self.attn_scale)
        _check_finite_costs("the step table", fixed_ms=fixed, ms_per_distinct=per_d, attn_floor_ms=floor,
                            attn_base_ms=base, attn_ms_per_token=per_tok)
        return StepTable(fixed, per_d, self.shape.num_layers, floor, base, per_tok)

    def ep_table(self, ranks: int, slots: int) -> EPStepTable:
        """:meth:`ep_step_ms` folded for ``ranks`` ranks of at most ``slots`` requests each."""
        ranks = check_int("ranks", ranks, low=1, high=MAX_TABLE_BATCH)
        slots = check_int("slots", slots, low=1, high=MAX_TABLE_BATCH)
        if ranks * slots > MAX_TABLE_BATCH:  # one row per total batch size is allocated
            raise ValueError(f"ranks x slots must be <= MAX_TABLE_BATCH={MAX_TABLE_BATCH} (one table row per batch "
                             f"size); got {ranks} x {slots} = {ranks * slots}")
        Bt = np.arange(ranks * slots + 1, dtype=np.float64)
        m0, per_d = self._moe_parts(Bt, ep=ranks)
        b = np.arange(slots + 1, dtype=np.float64)
        rank_fixed = self._rank_ms(b, np.zeros_like(b)) - float(self.attention_ms(0.0))
        _check_finite_costs("the EP step table", moe_fixed_ms=m0, moe_ms_per_distinct=per_d, rank_fixed_ms=rank_fixed,
                            head_ms=self.head_ms())
        return EPStepTable(ranks, m0, per_d, rank_fixed, self.head_ms(), self.table(slots))

    # ------------------------------------------------------------------ reporting
    def coefficients(self, B: float) -> tuple[float, float]:
        """``(fixed_ms, ms_per_distinct_expert)`` at batch ``B`` with an empty KV cache."""
        f = float(self.step_ms(B, 0.0, 0.0))
        return f, float(self.step_ms(B, 1.0, 0.0)) - f

    def attention_share(self, B: float, ctx: float, sum_D: float | None = None) -> float:
        """Share of the step spent in attention for ``B`` requests of ``ctx`` cached tokens each
        (``sum_D`` defaults to uniform routing of ``B`` tokens)."""
        B = check_real("B", B, low=0, low_open=True)
        ctx = check_real("ctx", ctx, low=0)
        sd = float(self.expected_sum_distinct(B)) if sum_D is None else check_real("sum_D", sum_D, low=0)
        return float(self.attention_ms(B * ctx) / self.step_ms(B, sd, B * ctx))

    def with_attention_share(self, share: float, B: float, ctx: float, sum_D: float | None = None) -> DecodeStepModel:
        """The model whose attention takes ``share`` of the step at (``B``, ``ctx``), by scaling the KV
        bytes attention reads (a longer context / heavier KV layout; the rest of the step unchanged)."""
        share = check_real("share", share, low=0, high=1, low_open=True, high_open=True)
        self.attention_share(B, ctx, sum_D)  # B, ctx and sum_D checked (named) before the search
        lo, hi = 0.0, 1.0
        while replace(self, attn_scale=hi).attention_share(B, ctx, sum_D) < share:
            hi *= 2
            if hi > 1e9:
                raise ValueError(f"share={share} is out of reach at B={B}, ctx={ctx}")
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if replace(self, attn_scale=mid).attention_share(B, ctx, sum_D) < share:
                lo = mid
            else:
                hi = mid
        return replace(self, attn_scale=0.5 * (lo + hi))


__all__ = ["DecodeStepModel", "EPStepTable", "StepTable"]
