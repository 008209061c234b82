"""Step time of the BalanceRoute DP cluster, from the one decode-step model of the floor.

The cluster is the deployment the paper assumes: ``G`` ranks with DP attention and expert parallelism
(EP) over the same ``G`` GPUs. Every step ends in a barrier, so (:meth:`DecodeStepModel.ep_step_ms`)

``step_ms = MoE(total batch, union of experts) / G-way EP + LM head + max_g [rank work(B_g) + attention(L_g)]``

where ``L_g`` is rank ``g``'s KV load. Only the attention term depends on where requests were placed,
which is why the attention share of the step bounds what balancing can buy (the regime map).

:class:`DPCost` folds that model into arrays for the simulator's hot loop (one step costs a few
microseconds instead of a full model evaluation) through the floor's own fold
(:meth:`~moelab.costmodel.step.DecodeStepModel.ep_table`), never a second fit, and is checked against
:meth:`~moelab.costmodel.step.DecodeStepModel.ep_step_ms` in ``tests/test_balanceroute.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from moelab._validate import check_int, check_real
from moelab.costmodel.shapes import MODEL_SHAPES
from moelab.costmodel.step import DecodeStepModel

MAX_SLOTS = 4096
MAX_WORKERS = 1024
H200_HBM_GB = 141.0


@dataclass(frozen=True)
class DPCost:
    """Barrier step time of ``n_workers`` DP-attention + EP ranks of ``slots`` slots each.

    ``step_ms(active, loads) = moe_head_ms[sum(active)] + max_g (rank_fixed_ms[active_g] +
    attn_layers * max(attn_floor_ms, attn_base_ms + attn_ms_per_token * loads_g))``.

    Build with :meth:`h200` (the floor's fitted model at a registry shape) or :meth:`synthetic`
    (a stated toy cost for tests and teaching). ``model`` is the floor model it was folded from.
    """

    n_workers: int
    slots: int
    rank_fixed_ms: np.ndarray = field(repr=False)
    moe_head_ms: np.ndarray = field(repr=False)
    attn_layers: int = 1
    attn_floor_ms: float = 0.0
    attn_base_ms: float = 0.0
    attn_ms_per_token: float = 0.0
    model: DecodeStepModel | None = field(default=None, repr=False)
    label: str = "custom"

    def __post_init__(self) -> None:
        G = check_int("n_workers", self.n_workers, low=1, high=MAX_WORKERS)
        B = check_int("slots", self.slots, low=1, high=MAX_SLOTS)
        rf = np.asarray(self.rank_fixed_ms, np.float64)
        mh = np.asarray(self.moe_head_ms, np.float64)
        if rf.shape != (B + 1,) or mh.shape != (G * B + 1,):
            raise ValueError(f"rank_fixed_ms must have {B + 1} entries and moe_head_ms {G * B + 1}; "
                             f"got {rf.shape} and {mh.shape}")
        if not (np.all(np.isfinite(rf)) and np.all(np.isfinite(mh))) or rf.min() < 0 or mh.min() < 0:
            raise ValueError("step-cost tables must be finite and >= 0")
        object.__setattr__(self, "rank_fixed_ms", rf)
        object.__setattr__(self, "moe_head_ms", mh)
        check_int("attn_layers", self.attn_layers, low=1)
        for name in ("attn_floor_ms", "attn_base_ms", "attn_ms_per_token"):
            check_real(name, getattr(self, name), low=0)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model: DecodeStepModel, n_workers: int, slots: int) -> DPCost:
        """Fold a floor :class:`~moelab.costmodel.step.DecodeStepModel` (its ``ep_step_ms`` over ``G`` ranks).

        Parameters
        ----------
        model : DecodeStepModel
            The step model to fold (e.g. ``DecodeStepModel.h200(shape)`` or ``.from_calibration(folder, shape)``).
        n_workers : int
            DP-attention + EP ranks ``G`` (1..:data:`MAX_WORKERS`).
        slots : int
            Request slots per rank ``B`` (1..:data:`MAX_SLOTS`).

        Returns
        -------
        DPCost
        """
        if not isinstance(model, DecodeStepModel):
            raise ValueError(f"model must be a DecodeStepModel; got {type(model).__name__}")
        G = check_int("n_workers", n_workers, low=1, high=MAX_WORKERS)
        B = check_int("slots", slots, low=1, high=MAX_SLOTS)
        t = model.ep_table(G, B)
        tot = np.arange(G * B + 1, dtype=np.float64)
        # uniform top-k routing of the group's tokens (no expert locality at the rank level)
        moe_head = t.moe_fixed_ms + t.moe_ms_per_distinct * model.expected_sum_distinct(tot) + t.head_ms
        a = t.attn
        return cls(G, B, t.rank_fixed_ms, moe_head, int(a.attn_layers), float(a.attn_floor_ms), float(a.attn_base_ms),
                   float(a.attn_ms_per_token), model, model.name)

    @classmethod
    def h200(cls, n_workers: int, slots: int, shape: str = "qwen3-30b-a3b", *, attn_scale: float = 1.0) -> DPCost:
        """The H200-fitted step model at registry ``shape`` (:data:`moelab.costmodel.MODEL_SHAPES`), folded
        for ``n_workers`` ranks of ``slots`` slots.

        Parameters
        ----------
        n_workers : int
            DP-attention + EP ranks ``G`` (1..:data:`MAX_WORKERS`): the simulator's ``n_workers``.
        slots : int
            Request slots (running requests) per rank ``B`` (1..:data:`MAX_SLOTS`): the simulator's ``slots``.
        shape : str
            A registry model shape (default ``"qwen3-30b-a3b"``).
        attn_scale : float
            Multiplies the KV bytes attention reads per token (> 0, at most 1e4; 1 = the shape's own layout,
            more for a longer-context or heavier-attention variant).

        Returns
        -------
        DPCost
            Its ``step_ms(active, loads)`` is the barrier step time in ms; ``model`` the unfolded model.

        Examples
        --------
        >>> cost = DPCost.h200(4, 16)                      # 4 DP ranks of 16 slots, Qwen3-30B-A3B on H200
        >>> (cost.n_workers, cost.slots)
        (4, 16)
        """
        if shape not in MODEL_SHAPES:
            raise ValueError(f"shape must be one of {sorted(MODEL_SHAPES)}; got {shape!r}")
        model = DecodeStepModel.h200(shape)
        if attn_scale != 1.0:
            model = model.with_attn_scale(check_real("attn_scale", attn_scale, low=0, low_open=True, high=1e4))
        return cls.from_model(model, n_workers, slots)

    @classmethod
    def from_calibration(cls, calibration: str | os.PathLike, n_workers: int, slots: int,
                         shape: str = "qwen3-30b-a3b") -> DPCost:
        """The step model fitted on a bundled GPU's tables or any ``moelab calibrate`` folder
        (:meth:`DecodeStepModel.from_calibration`) at registry ``shape``, folded for ``G`` ranks.

        Parameters
        ----------
        calibration : str or path
            A bundled GPU's name or a ``moelab calibrate --out`` folder.
        n_workers : int
            DP-attention + EP ranks ``G`` (1..:data:`MAX_WORKERS`).
        slots : int
            Request slots per rank (1..:data:`MAX_SLOTS`).
        shape : str
            A registry model shape (default ``"qwen3-30b-a3b"``).

        Returns
        -------
        DPCost
        """
        if shape not in MODEL_SHAPES:
            raise ValueError(f"shape must be one of {sorted(MODEL_SHAPES)}; got {shape!r}")
        return cls.from_model(DecodeStepModel.from_calibration(calibration, shape), n_workers, slots)

    @classmethod
    def synthetic(cls, n_workers: int, slots: int, fixed_ms: float, ms_per_token: float) -> DPCost:
        """A stated toy cost, ``step_ms = fixed_ms + ms_per_token * max_g L_g`` (synthetic, for tests).

        Parameters
        ----------
        n_workers : int
            Ranks ``G`` (1..:data:`MAX_WORKERS`).
        slots : int
            Request slots per rank (1..:data:`MAX_SLOTS`).
        fixed_ms : float
            Time of every step whatever the load, ms (>= 0).
        ms_per_token : float
            Time per KV token of the most loaded rank, ms (>= 0).

        Returns
        -------
        DPCost
        """
        G = check_int("n_workers", n_workers, low=1, high=MAX_WORKERS)
        B = check_int("slots", slots, low=1, high=MAX_SLOTS)
        fixed_ms = check_real("fixed_ms", fixed_ms, low=0)
        return cls(G, B, np.zeros(B + 1), np.full(G * B + 1, fixed_ms), 1, 0.0, 0.0,
                   check_real("ms_per_token", ms_per_token, low=0), None, "synthetic")

    @property
    def name(self) -> str:
        return self.label

    # ------------------------------------------------------------------ pricing
    def attention_ms(self, kv_tokens: np.ndarray | float) -> np.ndarray:
        """Attention of all layers of one rank holding ``kv_tokens`` (vectorised)."""
        a = self.attn_base_ms + self.attn_ms_per_token * np.asarray(kv_tokens, np.float64)
        return self.attn_layers * np.maximum(self.attn_floor_ms, a)

    def step_ms(self, active: np.ndarray, loads: np.ndarray) -> float:
        """One barrier step: ``active[g]`` running requests and ``loads[g]`` KV tokens per rank."""
        attn = self.attn_layers * np.maximum(self.attn_floor_ms, self.attn_base_ms + self.attn_ms_per_token * loads)
        return float(self.moe_head_ms[int(active.sum())] + np.max(self.rank_fixed_ms[active] + attn))

    def exact_step_ms(self, active: np.ndarray, loads: np.ndarray) -> float:
        """The same step from the floor model directly (slow; for checks)."""
        if self.model is None:
            raise ValueError("a synthetic DPCost has no floor model to check against")
        B = np.asarray(active, np.float64)
        return float(self.model.ep_step_ms(B, float(self.model.expected_sum_distinct(B.sum())),
                                           np.asarray(loads, np.float64)))

    def uniform_step_ms(self, load_per_rank: float, active_per_rank: int | None = None) -> float:
        """A perfectly balanced step: every rank runs ``active_per_rank`` (default: all slots) requests
        holding ``load_per_rank`` KV tokens."""
        b = self.slots if active_per_rank is None else check_int("active_per_rank", active_per_rank, low=0,
                                                                 high=self.slots)
        act = np.full(self.n_workers, b, np.int64)
        return self.step_ms(act, np.full(self.n_workers, float(load_per_rank)))

    def attention_share(self, load_per_rank: float) -> float:
        """Share of a balanced full-slot step spent in attention at ``load_per_rank`` KV tokens per rank."""
        return float(self.attention_ms(load_per_rank)) / self.uniform_step_ms(load_per_rank)

    def kv_capacity_tokens(self, hbm_gb: float = H200_HBM_GB, utilization: float = 0.9) -> float:
        """KV tokens one rank can cache: ``utilization * HBM`` minus the rank's weights (attention and
        dense parts replicated, routed experts split ``G`` ways), over the per-token KV bytes of all
        layers. The denominator of vLLM's ``kv_cache_usage`` in the simulator."""
        if self.model is None:
            raise ValueError("a synthetic DPCost has no model shape; pass kv_capacity_tokens explicitly")
        s = self.model.shape
        hbm_gb = check_real("hbm_gb", hbm_gb, low=0, low_open=True)
        utilization = check_real("utilization", utilization, low=0, high=1, low_open=True)
        expert = 3 * s.hidden * s.expert_ffn * s.bytes_per_param
        routed = s.num_moe_layers * s.num_experts * expert
        shared = s.num_moe_layers * s.shared_experts * expert
        attn_proj = s.num_layers * (s.hidden * (s.q_heads + 2 * s.kv_heads) * s.head_dim + s.q_heads * s.head_dim * s.hidden)
        dense = s.num_dense_layers * 3 * s.hidden * s.dense_ffn * s.bytes_per_param
        weights = routed / self.n_workers + shared + attn_proj * s.bytes_per_param + dense + 2 * s.head_bytes
        free = utilization * hbm_gb * 1e9 - weights
        per_token = s.num_layers * s.kv_bytes_per_token * self.model.attn_scale
        if free <= 0:
            raise ValueError(f"{self.name}: the weights of one rank ({weights / 1e9:.1f} GB) do not fit in "
                             f"{utilization:g} x {hbm_gb:g} GB at G={self.n_workers}")
        return free / per_token

    @property
    def note(self) -> str:
        """Where the numbers come from."""
        if self.model is None:
            return f"synthetic: step = fixed + {self.attn_ms_per_token:g} ms/token x max load (G={self.n_workers})"
        s = self.model.shape
        return (f"{self.name} ({s.source}); DP attention + {self.n_workers}-way EP, {self.slots} slots per rank; "
                f"moelab.costmodel.DecodeStepModel.ep_step_ms fitted on the bundled H200 tables"
                + ("" if self.model.attn_scale == 1.0 else f"; attention KV bytes x{self.model.attn_scale:g}"))
