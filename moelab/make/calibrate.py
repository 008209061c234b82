"""``moelab calibrate``: measure this machine's decode-step costs and fit moelab's cost models.

Writes the same tables as ``data/calibration/h200/`` (same columns), so every cost model in
:mod:`moelab.costmodel` fits on them unchanged:

* ``moe_step.csv`` — one MoE layer's expert FFNs (SwiGLU) at decode vs batch ``B`` and distinct
  experts ``D`` (``B*k`` expert slots spread evenly over ``D`` experts), per model shape;
  ``bmm_active`` (batched matmul over exactly the active experts) and, where the kernel exists,
  ``grouped_mm`` (``torch._grouped_mm`` over all experts, ``D`` groups non-empty).
* ``attn_step.csv`` — decode attention core (``scaled_dot_product_attention``, GQA) vs ``B`` x ``ctx``.
* ``dense_verify.csv`` — one Llama-style dense layer forward over ``q`` new tokens on a cached context.
* ``decode_layer.csv`` — one whole MoE decode layer (norms, QKV/O projections, GQA attention over ``ctx``
  cached tokens, router + top-k, expert FFNs over ``D`` distinct experts, residuals) at a registry
  shape, vs ``B`` x ``ctx`` x ``D``: what :meth:`moelab.costmodel.DecodeStepModel.from_calibration` fits
  its per-layer overhead on, so the folder drives every simulator.
* ``env.json`` — device, software, measured copy bandwidth; ``fit.json`` — the fitted models and
  their errors on the measured points.

On a CUDA GPU each point is the median of ``reps`` CUDA-graph replays after warm-up, weights rotated
over several layer copies so they are not served from L2. ``--smoke`` runs tiny shapes on the CPU
(wall-clock medians) so CI exercises the whole path; its numbers describe the CPU, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import atomic_write_json, atomic_write_text
from moelab._outputs import check_output_dir, claim_output_dir, record_outputs
from moelab._validate import check_choice, check_int
from moelab.costmodel import (
    MODEL_SHAPES,
    AttentionModel,
    DenseVerifyModel,
    ModelShape,
    MoEShape,
    MoEStepModel,
)

#: the writer's name in the output folder's marker (``.moelab-output.json``), and the files it writes there
WRITER = "calibrate"
OUTPUT_FILES = ("moe_step.csv", "attn_step.csv", "dense_verify.csv", "decode_layer.csv", "env.json", "fit.json")


@dataclass(frozen=True)
class AttnShape:
    """Decode attention shape: query heads, KV heads, head dim."""

    q_heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class DenseShape:
    """A Llama-style dense layer: hidden, FFN, heads, KV heads, layers in the whole model."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    layers: int


# the shapes the bundled H200 tables measure, looked up in the one registry (MODEL_SHAPES)
MOE_TABLE_MODELS = ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "olmoe-1b-7b", "qwen3-30b-a3b")
ATTN_TABLE_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")


def _attn_shape(name: str) -> AttnShape:
    s = MODEL_SHAPES[name]
    return AttnShape(s.q_heads, s.kv_heads, s.head_dim)
def _dense_shape(name: str) -> DenseShape:
    s = MODEL_SHAPES[name]
    return DenseShape(s.hidden, s.dense_ffn, s.q_heads, s.kv_heads, s.num_layers)


DENSE_TABLE_MODELS = ("llama2-7b", "tinyllama-1.1b", "llama-160m")


@dataclass(frozen=True)
class Plan:
    """What to measure: shapes and grids, precision, repetitions."""

    moe_shapes: dict[str, MoEShape]
    batches: tuple[int, ...]
    distinct: tuple[int, ...]
    attn_shapes: dict[str, AttnShape]
    attn_batches: tuple[int, ...]
    contexts: tuple[int, ...]
    dense_shapes: dict[str, DenseShape]
    verify_q: tuple[int, ...]
    verify_ctx: int
    layer_shape: str
    layer_batches: tuple[int, ...]
    layer_contexts: tuple[int, ...]
    layer_distinct: tuple[int, ...]
    dtype: str
    reps: int
    warmup: int
    layer_copies: int


#: repetitions per measured point: the median settles within a few dozen; 1000 over the full plan's
#: points is already hours of GPU time, so more is refused rather than run for days
MAX_REPS = 1000


def full_plan(reps: int = 50) -> Plan:
    """The H200 tables' grid: five MoE shapes, bf16, ``reps`` CUDA-graph replays per point."""
    return Plan({n: MODEL_SHAPES[n].moe for n in MOE_TABLE_MODELS}, (1, 8, 32, 64, 128, 256),
                (2, 4, 6, 8, 16, 32, 60, 64, 96, 128), {n: _attn_shape(n) for n in ATTN_TABLE_MODELS},
                (1, 8, 32, 128, 256), (512, 2048, 8192), {n: _dense_shape(n) for n in DENSE_TABLE_MODELS}, (1, 2, 4, 8, 16, 24, 28, 32, 48, 64, 128),
                1024, "qwen3-30b-a3b", (16, 32, 64, 128, 256), (512, 1024, 2048, 4096), (16, 32, 64, 96, 128),
                "bfloat16", reps, 10, 4)


def smoke_plan() -> Plan:
    """Tiny shapes for the CPU code path (CI): seconds, float32."""
    return Plan({"smoke-moe-a": MoEShape(256, 128, 16, 2, 4), "smoke-moe-b": MoEShape(128, 256, 8, 2, 4)},
                (1, 4, 16), (2, 4, 8, 16), {"smoke-attn": AttnShape(4, 2, 32)}, (1, 8), (64, 256, 8192, 32768),
                {"smoke-dense": DenseShape(256, 512, 4, 2, 2)}, (1, 2, 4, 8), 128,
                "tiny-moe", (4, 16), (64, 512), (4, 16, 32), "float32", 5, 2, 2)


# ---------------------------------------------------------------------- timing
class Timer:
    """Median milliseconds of a callable: CUDA graphs + events on a GPU, wall clock on the CPU."""

    def __init__(self, device: str, reps: int, warmup: int, graphs: bool = True) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        self.graphs = graphs and device.startswith("cuda")

    def median_ms(self, fn: Callable[[], Any]) -> float:
        """Median milliseconds of ``fn()`` over the timer's repetitions (after warm-up)."""
        import torch  # lazy: torch loads only when measuring

        for _ in range(self.warmup):
            fn()
        if not self.device.startswith("cuda"):
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return float(np.median(times))
        torch.cuda.synchronize()
        run = fn
        if self.graphs:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        times = []
        for _ in range(self.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return float(np.median(times))


def _dtype(name: str) -> Any:
    import torch  # lazy: torch loads only when measuring

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def copy_bandwidth_gbps(device: str, timer: Timer, nbytes: int) -> float:
    """Device-memory copy bandwidth (read + write counted once each), GB/s."""
    import torch  # lazy: torch loads only when measuring

    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    ms = timer.median_ms(lambda: b.copy_(a))
    return 2 * nbytes / (ms / 1e3) / 1e9


# ---------------------------------------------------------------------- MoE layer
def _slots(B: int, k: int, D: int) -> int:
    """Tokens per active expert when ``B*k`` slots are spread evenly over ``D`` experts (padded)."""
    return math.ceil(B * k / D)


def moe_weights(shape: MoEShape, copies: int, device: str, dtype: str, seed: int = 0) -> list[tuple[Any, Any]]:
    """``copies`` layer copies of all ``E`` experts' SwiGLU weights (``w13 [E, H, 2F]``, ``w2 [E, F, H]``),
    non-zero random, made on the device once per shape (slices give the first ``D`` experts)."""
    import torch  # lazy: torch loads only when measuring

    dt = _dtype(dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    E, H, Fd = shape.num_experts, shape.hidden, shape.ffn
    return [((torch.randn(E, H, 2 * Fd, generator=g, device=device) * 0.02).to(dt),
             (torch.randn(E, Fd, H, generator=g, device=device) * 0.02).to(dt)) for _ in range(copies)]


def moe_step_ms(shape: MoEShape, B: int, D: int, method: str, timer: Timer, device: str, dtype: str,
                weights: list[tuple[Any, Any]]) -> float:
    """Median ms of one MoE layer's expert FFNs for ``B`` tokens over ``D`` distinct experts
    (``weights`` from :func:`moe_weights`; several copies rotated so they come from memory, not cache)."""
    import torch  # lazy: torch loads only when measuring
    import torch.nn.functional as F  # lazy: torch loads only when measuring

    dt = _dtype(dtype)
    Fd = shape.ffn
    n = _slots(B, shape.top_k, D)
    g = torch.Generator(device=device).manual_seed(1)
    copies = len(weights)
    if method == "bmm_active":  # exactly the D active experts' weights are read
        w13 = [a[:D] for a, _ in weights]
        w2 = [b[:D] for _, b in weights]
        x = torch.randn(D, n, shape.hidden, generator=g, device=device).to(dt)

        def fn() -> None:
            for c in range(copies):
                h = torch.bmm(x, w13[c])
                torch.bmm(F.silu(h[..., :Fd]) * h[..., Fd:], w2[c])
    else:  # grouped GEMM over all E experts, only D groups non-empty
        counts = torch.zeros(shape.num_experts, dtype=torch.int32)
        counts[:D] = n
        offs = torch.cumsum(counts, 0).to(device=device, dtype=torch.int32)
        x = torch.randn(D * n, shape.hidden, generator=g, device=device).to(dt)

        def fn() -> None:
            for w13, w2 in weights:
                h = torch._grouped_mm(x, w13, offs=offs)
                torch._grouped_mm(F.silu(h[:, :Fd]) * h[:, Fd:], w2, offs=offs)
    return timer.median_ms(fn) / copies


def grouped_mm_available(device: str, dtype: str) -> bool:
    """Whether ``torch._grouped_mm`` runs here (it needs recent GPUs; absent on most CPUs)."""
    import torch  # lazy: torch loads only when measuring

    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        x = torch.ones(4, 16, device=device, dtype=_dtype(dtype))
        w = torch.ones(2, 16, 16, device=device, dtype=_dtype(dtype))
        torch._grouped_mm(x, w, offs=torch.tensor([2, 4], device=device, dtype=torch.int32))
        return True
    except (RuntimeError, NotImplementedError, TypeError):
        return False


# ---------------------------------------------------------------------- attention, dense verify
def attn_step_ms(shape: AttnShape, B: int, ctx: int, timer: Timer, device: str, dtype: str, copies: int) -> tuple[float, int]:
    """Median ms of decode attention (one query token per request over ``ctx`` cached) and KV bytes."""
    import torch  # lazy: torch loads only when measuring
    import torch.nn.functional as F  # lazy: torch loads only when measuring

    dt = _dtype(dtype)
    q = torch.randn(B, shape.q_heads, 1, shape.head_dim, device=device, dtype=dt)
    kv = [(torch.randn(B, shape.kv_heads, ctx, shape.head_dim, device=device, dtype=dt),
           torch.randn(B, shape.kv_heads, ctx, shape.head_dim, device=device, dtype=dt)) for _ in range(copies)]

    def fn() -> None:
        for k, v in kv:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    kv_bytes = 2 * B * shape.kv_heads * ctx * shape.head_dim * torch.finfo(dt).bits // 8
    return timer.median_ms(fn) / copies, kv_bytes


def dense_verify_ms(shape: DenseShape, q: int, ctx: int, timer: Timer, device: str, dtype: str, copies: int) -> float:
    """Median ms of one Llama-style layer over ``q`` new tokens attending to ``ctx`` cached + themselves."""
    import torch  # lazy: torch loads only when measuring
    import torch.nn.functional as F  # lazy: torch loads only when measuring

    dt = _dtype(dtype)
    H, Fd, nh, nkv = shape.hidden, shape.ffn, shape.heads, shape.kv_heads
    hd = H // nh
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*s: int) -> Any:
        return (torch.randn(*s, generator=g) * 0.02).to(device, dt)

    layers = [dict(qkv=w(H, (nh + 2 * nkv) * hd), o=w(nh * hd, H), up=w(H, 2 * Fd), down=w(Fd, H),
                   k=w(1, nkv, ctx, hd), v=w(1, nkv, ctx, hd)) for _ in range(copies)]
    x = torch.randn(1, q, H, generator=g).to(device, dt)
    # the q new tokens see the whole cache and each other causally
    mask = torch.ones(q, ctx + q, dtype=torch.bool, device=device).tril(diagonal=ctx)

    def fn() -> None:
        for p in layers:
            h = F.rms_norm(x, (H,))
            qkv = (h @ p["qkv"]).view(1, q, nh + 2 * nkv, hd).transpose(1, 2)
            qh, kh, vh = qkv[:, :nh], qkv[:, nh:nh + nkv], qkv[:, nh + nkv:]
            k = torch.cat([p["k"], kh], dim=2)
            v = torch.cat([p["v"], vh], dim=2)
            a = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, enable_gqa=True)
            h = x + a.transpose(1, 2).reshape(1, q, nh * hd) @ p["o"]
            u = F.rms_norm(h, (H,)) @ p["up"]
            _ = h + (F.silu(u[..., :Fd]) * u[..., Fd:]) @ p["down"]

    return timer.median_ms(fn) / copies


def decode_layer_ms(shape: ModelShape, B: int, ctx: int, D: int, timer: Timer, device: str, dtype: str,
                    copies: int) -> float:
    """Median ms of one whole MoE decode layer at ``shape``: RMSNorm, QKV projection, GQA attention of
    ``B`` one-token queries over ``ctx`` cached tokens each, O projection, RMSNorm, router + top-k, the
    expert FFNs over ``D`` distinct experts (``B*k`` slots spread evenly, as in :func:`moe_step_ms`),
    residual adds; ``copies`` layer copies rotated."""
    import torch  # lazy: torch loads only when measuring
    import torch.nn.functional as F  # lazy: torch loads only when measuring

    dt = _dtype(dtype)
    H, nh, nkv, hd = shape.hidden, shape.q_heads, shape.kv_heads, shape.head_dim
    E, k, Fd = shape.num_experts, shape.top_k, shape.expert_ffn
    n = _slots(B, k, D)
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*s: int) -> Any:
        return (torch.randn(*s, generator=g) * 0.02).to(device, dt)

    layers = [dict(qkv=w(H, (nh + 2 * nkv) * hd), o=w(nh * hd, H), router=w(H, E), w13=w(D, H, 2 * Fd),
                   w2=w(D, Fd, H), k=w(B, nkv, ctx, hd), v=w(B, nkv, ctx, hd)) for _ in range(copies)]
    x = torch.randn(B, H, generator=g).to(device, dt)
    xe = torch.randn(D, n, H, generator=g).to(device, dt)  # the routed tokens, grouped by expert

    def fn() -> None:
        for p in layers:
            h = F.rms_norm(x, (H,))
            qkv = (h @ p["qkv"]).view(B, nh + 2 * nkv, 1, hd)
            a = F.scaled_dot_product_attention(qkv[:, :nh], p["k"], p["v"], enable_gqa=True)
            h = x + a.reshape(B, nh * hd) @ p["o"]
            u = F.rms_norm(h, (H,))
            torch.topk(u @ p["router"], k, dim=-1)
            e = torch.bmm(xe, p["w13"])
            _ = h + torch.bmm(F.silu(e[..., :Fd]) * e[..., Fd:], p["w2"]).sum(dim=(0, 1))

    return timer.median_ms(fn) / copies


# ---------------------------------------------------------------------- driver
def _distinct_grid(shape: MoEShape, B: int, grid: tuple[int, ...]) -> list[int]:
    """D values possible for batch B: at least top-k, at most min(E, B*k)."""
    hi = min(shape.num_experts, B * shape.top_k)
    values = sorted({d for d in grid if shape.top_k <= d <= hi} | {hi})
    return values


def measure(plan: Plan, device: str, progress: Callable[[str], None] | None = None) -> dict[str, pd.DataFrame]:
    """Run every measurement of ``plan`` on ``device``; returns the three tables."""
    import torch  # lazy: torch loads only when measuring

    say = progress or (lambda s: None)
    timer = Timer(device, plan.reps, plan.warmup)
    bw = copy_bandwidth_gbps(device, timer, 256 << 20 if device.startswith("cuda") else 32 << 20)
    methods = ["bmm_active"] + (["grouped_mm"] if grouped_mm_available(device, plan.dtype) else [])
    bytes_per = torch.finfo(_dtype(plan.dtype)).bits // 8
    moe_rows = []
    for name, shape in plan.moe_shapes.items():
        shape_b = MoEShape(shape.hidden, shape.ffn, shape.num_experts, shape.top_k, bytes_per)
        weights = moe_weights(shape_b, plan.layer_copies, device, plan.dtype)
        for B in plan.batches:
            for D in _distinct_grid(shape_b, B, plan.distinct):
                for method in methods:
                    ms = moe_step_ms(shape_b, B, D, method, timer, device, plan.dtype, weights)
                    wbytes = D * shape_b.expert_bytes
                    moe_rows.append(dict(model=name, method=method, B=B, D=D, layers_timed=plan.layer_copies,
                                         ms_per_layer=round(ms, 5), weight_bytes_per_layer=wbytes,
                                         floor_ms_per_layer=round(wbytes / (bw * 1e9) * 1e3, 5)))
        del weights
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        say(f"moe {name}: {sum(r['model'] == name for r in moe_rows)} points")
    attn_rows = []
    for name, shape in plan.attn_shapes.items():
        for B in plan.attn_batches:
            for ctx in plan.contexts:
                ms, kvb = attn_step_ms(shape, B, ctx, timer, device, plan.dtype, plan.layer_copies)
                attn_rows.append(dict(shape=name, B=B, ctx=ctx, ms_attn_core=round(ms, 5), kv_bytes=kvb))
        say(f"attention {name}: done")
    dense_rows = []
    for name, shape in plan.dense_shapes.items():
        for q in plan.verify_q:
            ms = dense_verify_ms(shape, q, plan.verify_ctx, timer, device, plan.dtype, plan.layer_copies)
            dense_rows.append(dict(shape=name, layers_in_model=shape.layers, q=q, ctx=plan.verify_ctx,
                                   ms_per_layer=round(ms, 5), ms_model_est=round(ms * shape.layers, 4)))
        say(f"dense verify {name}: done")
    layer_rows = []
    lshape = MODEL_SHAPES[plan.layer_shape]
    for B in plan.layer_batches:
        for ctx in plan.layer_contexts:
            for D in _distinct_grid(lshape.moe, B, plan.layer_distinct):
                ms = decode_layer_ms(lshape, B, ctx, D, timer, device, plan.dtype, plan.layer_copies)
                layer_rows.append(dict(shape=plan.layer_shape, B=B, ctx=ctx, D=D, ms_per_layer=round(ms, 5)))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    say(f"decode layer {plan.layer_shape}: {len(layer_rows)} points")
    return {"moe_step": pd.DataFrame(moe_rows), "attn_step": pd.DataFrame(attn_rows),
            "dense_verify": pd.DataFrame(dense_rows), "decode_layer": pd.DataFrame(layer_rows), "_copy_GBps": bw}


def fit_models(tables: dict[str, pd.DataFrame], shapes: dict[str, MoEShape]) -> dict[str, Any]:
    """Fit moelab's cost models on measured tables; the report gives each fit's error on its points.

    The MoE table's shapes are passed to :meth:`MoEStepModel.from_table` as ``shapes`` (the registry
    is never modified)."""
    report: dict[str, Any] = {"moe_step": {}, "attn_step": {}, "dense_verify": {}}
    moe = tables["moe_step"]
    for method in sorted(moe["method"].unique()):
        model = MoEStepModel.from_table(moe, method, shapes=shapes)
        report["moe_step"][method] = {"coef": model.fit.as_dict(), "median_abs_err_pct": model.report.median_abs_err_pct,
                                      "max_abs_err_pct": model.report.max_abs_err_pct,
                                      "points": len(model.report.measured)}
    try:
        attn = AttentionModel.from_table(tables["attn_step"])
        report["attn_step"] = {"floor_ms": attn.floor_ms, "coef": attn.fit.as_dict(),
                               "median_abs_err_pct": attn.report.median_abs_err_pct, "points": len(attn.report.measured)}
    except (ValueError, RuntimeError) as exc:  # e.g. no bandwidth-bound point among tiny smoke shapes
        report["attn_step"] = {"error": str(exc)}
    dense = DenseVerifyModel(tables["dense_verify"])
    report["dense_verify"] = {s: {f"q={int(q)}": float(dense.relative_cost(s, int(q)))
                                  for q in tables["dense_verify"].query("shape == @s")["q"]} for s in dense.shapes}
    return report


def environment(device: str, copy_gbps: float, plan: Plan, smoke: bool) -> dict[str, Any]:
    """Software and hardware the tables were measured with."""
    import torch  # lazy: torch loads only when measuring

    env: dict[str, Any] = {"torch": torch.__version__, "device": device.split(":")[0], "python": platform.python_version(),
                           "dtype": plan.dtype, "reps": plan.reps, "layer_copies": plan.layer_copies, "smoke": smoke,
                           "copy_GBps": round(copy_gbps, 1), "machine": platform.machine(),
                           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        env.update(name=p.name, sms=p.multi_processor_count, mem_gb=round(p.total_memory / 2**30, 1))
    else:
        env.update(name=platform.processor() or "cpu", threads=torch.get_num_threads())
    for pkg in ("transformers", "vllm", "triton"):
        try:
            env[pkg] = version(pkg)
        except Exception:  # not installed: record that plainly
            env[pkg] = "absent"
    return env


def calibrate(out: str | Path, *, smoke: bool = False, device: str | None = None, reps: int | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure, write ``moe_step.csv``, ``attn_step.csv``, ``dense_verify.csv``, ``decode_layer.csv``,
    ``env.json`` and ``fit.json`` into ``out``; returns the fit report. The folder is complete:
    ``DecodeStepModel.from_calibration(out)`` and ``DPCost.from_calibration(out, ...)`` fit on it.

    Parameters
    ----------
    out : path
        Output folder ``DIR`` (new, empty, or one calibrate wrote); afterwards
        ``DecodeStepModel.from_calibration(DIR, model)`` prices steps with this machine's costs.
    smoke : bool
        Tiny shapes (CPU code path for CI); otherwise the H200 tables' shapes and grid.
    device : str, optional
        ``"cuda"``/``"cuda:N"`` or ``"cpu"``; default CUDA when available. Full runs need CUDA.
    reps : int, optional
        Repetitions per point (default 50 on a GPU, 5 for smoke).
    """
    import torch  # lazy: torch loads only when measuring

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_choice("device", device.split(":")[0], ("cuda", "cpu"))
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU here")
    if not smoke and not device.startswith("cuda"):
        raise ValueError("a full calibration needs a CUDA GPU (the tables are GPU decode costs); "
                         "use smoke=True (--smoke) to run the code path on the CPU")
    plan = smoke_plan() if smoke else full_plan()
    if reps is not None:
        plan = Plan(**{**asdict_shallow(plan), "reps": check_int("reps", reps, low=1, high=MAX_REPS, high_name="MAX_REPS")})
    # moelab's output policy: a new or empty folder, or one calibrate wrote, whose files are its own; checked
    # before measuring (minutes on a GPU), claimed so that an interrupted run is recognised next time
    out = claim_output_dir(check_output_dir(out, writer=WRITER, name="--out", overwrites=OUTPUT_FILES), WRITER)
    threads = torch.get_num_threads()
    if not device.startswith("cuda"):
        # one thread: OpenMP barriers of a multi-threaded op stall for whole scheduler slices when
        # the cores are shared, which turns sub-millisecond points into 100+ ms outliers
        torch.set_num_threads(1)
    try:
        tables = measure(plan, device, progress)
    finally:
        torch.set_num_threads(threads)
    copy_gbps = tables.pop("_copy_GBps")
    for name, df in tables.items():
        atomic_write_text(out / f"{name}.csv", df.to_csv(index=False))
    atomic_write_json(out / "env.json", environment(device, copy_gbps, plan, smoke))
    report = fit_models(tables, plan.moe_shapes)
    report["shapes"] = {"moe": {k: asdict(v) for k, v in plan.moe_shapes.items()},
                        "attention": {k: asdict(v) for k, v in plan.attn_shapes.items()},
                        "dense": {k: asdict(v) for k, v in plan.dense_shapes.items()},
                        "decode_layer": plan.layer_shape}
    atomic_write_json(out / "fit.json", report)
    record_outputs(out, WRITER, [p for p in OUTPUT_FILES if (out / p).is_file()])
    return report


def asdict_shallow(plan: Plan) -> dict[str, Any]:
    """Plan fields without converting the nested shape dataclasses."""
    return {f: getattr(plan, f) for f in plan.__dataclass_fields__}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``moelab calibrate``."""
    p = argparse.ArgumentParser(prog="moelab calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder DIR (new, empty or one calibrate wrote); then "
                   "DecodeStepModel.from_calibration(DIR, model) uses its costs")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: tests the code path in seconds")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per point (median)")
    args = p.parse_args(argv)
    try:
        report = calibrate(args.out, smoke=args.smoke, device=args.device, reps=args.reps,
                           progress=lambda s: print(s, flush=True))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for method, r in report["moe_step"].items():
        print(f"MoE step model ({method}): median |err| {r['median_abs_err_pct']:.1f}% over {r['points']} points")
    attn = report["attn_step"]
    print("attention model: " + (f"median |err| {attn['median_abs_err_pct']:.1f}%" if "error" not in attn else attn["error"]))
    print(f"wrote {args.out}/{{moe_step,attn_step,dense_verify,decode_layer}}.csv, env.json, fit.json; use it as "
          f"DecodeStepModel.from_calibration({args.out!r}, model)")
    print(json.dumps({s: v for s, v in report["dense_verify"].items()}, indent=None)[:400])
    return 0


if __name__ == "__main__":
    sys.exit(main())
