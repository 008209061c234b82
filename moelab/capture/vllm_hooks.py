"""vLLM capture hooks: what runs inside vLLM's worker to record expert routing.

Every ``MoERunner`` module's router gets a capture callback (``router.set_capture_fn``) receiving the
``[num_tokens, top_k]`` expert ids of one forward step; a forward hook on every ``GateLinear`` gives the
router logits (router probabilities summed over prompt tokens); a forward pre-hook on the model reads the
runner's batch layout of that step (request ids in batch order, token spans, positions), so every row is
attributed to (request, position). The hooks are module-level functions installed with
``LLM.collective_rpc`` so they can be shipped to worker processes. See :mod:`moelab.capture.vllm_driver`
for the capture that uses them.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import numpy as np

_ATTR = "_moelab_expert_recorder"
_LAYER_RE = re.compile(r"layers\.(\d+)\.")


class NoMoELayersError(ValueError):
    """The model has no MoE layer vLLM's capture hooks can attach to."""


class _Recorder:
    """Lives in the worker: collects, per forward step, the batch layout and every layer's top-k ids."""

    def __init__(self, runner: Any, layer_ids: list[int], top_k: int, num_experts: int) -> None:
        self.runner = runner
        self.slot = {lid: i for i, lid in enumerate(layer_ids)}
        self.top_k, self.num_experts = top_k, num_experts
        self.enabled = False
        self.records: list[dict[str, Any]] = []
        self.cur: dict[str, Any] | None = None
        self.handles: list[Any] = []
        self.errors: list[str] = []

    # model forward pre-hook: the batch layout of this step
    def pre_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not self.enabled:
            return
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        batch = self.runner.input_batch
        n_req = int(batch.num_reqs)
        qsl = np.asarray(self.runner.query_start_loc.np[: n_req + 1], dtype=np.int64).copy()
        n_tok = int(qsl[-1])
        L = len(self.slot)
        self.cur = {
            "req_ids": [str(r) for r in batch.req_ids[:n_req]],
            "qsl": qsl,
            "positions": positions[:n_tok].detach().to("cpu").numpy().astype(np.int64).copy(),
            "input_ids": None if input_ids is None else input_ids[:n_tok].detach().to("cpu").numpy().astype(np.int64).copy(),
            "ids": np.full((n_tok, L, self.top_k), -1, dtype=np.int32),
            "probs": np.zeros((n_tok, L, self.num_experts), dtype=np.float32),
            "seen": np.zeros(L, dtype=bool),
        }

    def post_forward(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.enabled and self.cur is not None:
            if not self.cur["seen"].all():
                self.errors.append(f"a forward step captured only {int(self.cur['seen'].sum())} of {len(self.slot)} MoE layers")
            self.records.append(self.cur)
            self.cur = None

    def capture(self, layer_id: int, topk_ids: Any) -> None:
        cur = self.cur
        if cur is None:
            return
        n = cur["ids"].shape[0]
        s = self.slot[layer_id]
        cur["ids"][:, s, :] = topk_ids[:n].detach().to("cpu").numpy()
        cur["seen"][s] = True

    def gate(self, layer_id: int, module: Any, inputs: Any, output: Any) -> None:
        cur = self.cur
        if cur is None:
            return
        # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
        import torch

        logits = output[0] if isinstance(output, tuple) else output
        n = cur["probs"].shape[0]
        cur["probs"][:, self.slot[layer_id], :] = torch.softmax(logits[:n].float(), dim=-1).detach().to("cpu").numpy()


def _moe_modules(model: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """MoE runners and router gates by decoder-layer index."""
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners, gates = {}, {}
    for name, mod in model.named_modules():
        m = _LAYER_RE.search(name + ".")
        if isinstance(mod, MoERunner) and isinstance(getattr(mod, "router", None), BaseRouter):
            runners[int(mod.layer_id) if mod.layer_id is not None else int(m.group(1))] = mod
        elif isinstance(mod, GateLinear) and m:
            gates[int(m.group(1))] = mod
    return runners, gates


def _install(worker: Any) -> dict[str, Any]:
    """Worker side: attach the recorder (idempotent); returns the MoE geometry vLLM sees."""
    runner = worker.model_runner
    model = runner.get_model()
    rec = getattr(worker, _ATTR, None)
    runners, gates = _moe_modules(model)
    if not runners:
        return {"num_layers": 0}
    layer_ids = sorted(runners)
    first = runners[layer_ids[0]]
    top_k = int(first.router.top_k)
    num_experts = int(first.router.global_num_experts)
    if rec is None:
        rec = _Recorder(runner, layer_ids, top_k, num_experts)
        for lid, mod in runners.items():
            mod.router.set_capture_fn(partial(rec.capture, lid))
        for lid, mod in gates.items():
            if lid in rec.slot:
                rec.handles.append(mod.register_forward_hook(partial(rec.gate, lid)))
        rec.handles.append(model.register_forward_pre_hook(rec.pre_forward, with_kwargs=True))
        rec.handles.append(model.register_forward_hook(rec.post_forward, with_kwargs=True))
        setattr(worker, _ATTR, rec)
    return {"num_layers": len(layer_ids), "layer_ids": layer_ids, "top_k": top_k, "num_experts": num_experts,
            "gates": sorted(set(gates) & set(rec.slot))}


def _set_enabled(worker: Any, enabled: bool) -> None:
    rec = getattr(worker, _ATTR)
    rec.enabled = enabled
    rec.cur = None
    if enabled:
        rec.records, rec.errors = [], []


def _drain(worker: Any) -> dict[str, Any]:
    rec = getattr(worker, _ATTR)
    out = {"records": rec.records, "errors": rec.errors}
    rec.records, rec.errors = [], []
    return out


def _remove(worker: Any) -> None:
    rec = getattr(worker, _ATTR, None)
    if rec is None:
        return
    for h in rec.handles:
        h.remove()
    for mod in _moe_modules(worker.model_runner.get_model())[0].values():
        mod.router.set_capture_fn(None)
    delattr(worker, _ATTR)


# ---------------------------------------------------------------------- parent side
def _is_engine(obj: Any) -> bool:
    return hasattr(obj, "generate") and hasattr(obj, "collective_rpc")


def install_hooks(engine: Any) -> dict[str, Any]:
    """Install moelab's capture hooks in ``engine`` (a ``vllm.LLM``); returns the MoE geometry.

    Raises :class:`NoMoELayersError` if the model has no MoE layer."""
    info = engine.collective_rpc(_install)[0]
    if not info["num_layers"]:
        raise NoMoELayersError("the model has no MoE layers (no vLLM MoERunner with a router): nothing to capture")
    return info


def remove_hooks(engine: Any) -> None:
    """Detach moelab's hooks from ``engine``."""
    engine.collective_rpc(_remove)


__all__ = ["NoMoELayersError", "install_hooks", "remove_hooks"]
