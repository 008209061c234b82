"""Capture expert activations through vLLM: the same :class:`~moelab.traces.ExpertTrace` as the HF
backend, for batched requests under continuous batching.

How (vLLM internals, pinned to :data:`moelab.models.vllm_engine.SUPPORTED_VLLM`):

* every ``MoERunner`` module's router gets a capture callback (``router.set_capture_fn``) that
  receives the ``[num_tokens, top_k]`` expert ids of the flat token batch of one forward step;
* a forward hook on every ``GateLinear`` (the router projection) gives the router logits, from
  which router probabilities are summed over prompt tokens;
* a forward pre-hook on the model reads the model runner's batch layout for that step — the
  request ids in batch order (``input_batch.req_ids``), their token spans (``query_start_loc``) and
  each token's position — so every captured row is attributed to (request, position): positions
  below the prompt length are prefill tokens, the rest are generated tokens being fed back.

The hooks are installed with ``LLM.collective_rpc`` (the callable receives the worker, hence the
runner) and are module-level functions, so they can be shipped to worker processes. vLLM's own
``enable_return_routed_experts`` needs Model Runner V2 + Triton (fails on CPU); the hooks work on
both, but on GPU they need ``enforce_eager=True`` (no CUDA graphs), which :func:`make_engine`
sets by default.

Decode convention (shared with the HF backend): ``decode_ids[t]`` is the routing of generated
token ``t`` when it is fed back as input. To record ``T`` of them vLLM generates ``T + 1`` tokens
(the last one is sampled but never fed); ``decode_tokens`` holds the first ``T``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from moelab._validate import check_int
from moelab.traces import ExpertTrace, Geometry, default_provenance

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
        import torch

        logits = output[0] if isinstance(output, tuple) else output
        n = cur["probs"].shape[0]
        cur["probs"][:, self.slot[layer_id], :] = torch.softmax(logits[:n].float(), dim=-1).detach().to("cpu").numpy()


def _moe_modules(model: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """MoE runners and router gates by decoder-layer index."""
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
    from functools import partial

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


def _model_name(engine: Any) -> str:
    try:
        return str(engine.llm_engine.model_config.model)
    except AttributeError:
        return "unknown"


def capture_vllm(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], max_new_tokens: int, *,
                 request_ids: Sequence[str] | None = None, domains: Sequence[str] | None = None,
                 tokenizer: Any = None, add_special_tokens: bool = True, ignore_eos: bool = True,
                 with_probs: bool = True, progress: bool = True, **engine_kwargs: Any) -> ExpertTrace:
    """Capture prefill expert counts and greedy-decode top-k ids of ``prompts`` through vLLM.

    Parameters
    ----------
    model : str, path or vllm.LLM
        A model folder / hub id (an in-process engine is made with :func:`make_engine` and
        ``engine_kwargs``) or an engine to reuse (hooks are installed once and stay).
    prompts : list of str or of token-id lists
        Strings are tokenized with the model's Hugging Face tokenizer (as the HF backend does), so
        both backends see identical token ids.
    max_new_tokens : int
        Generated tokens per request whose routing is recorded (``T``).
    request_ids, domains : list of str, optional
        Default ``"r0", "r1", ...`` and ``"unknown"``.
    tokenizer : optional
        A Hugging Face tokenizer for string prompts (default: the model folder's).
    ignore_eos : bool
        Generate exactly ``T`` tokens (default) instead of stopping at end-of-sequence.
    with_probs : bool
        Also record router probabilities summed over prompt tokens (``prefill_probs``).
    progress : bool
        vLLM's progress bar.

    Returns
    -------
    ExpertTrace with ``prefill_ids``, ``decode_tokens`` and (if asked) ``prefill_probs``.
    """
    from moelab.models.vllm_engine import make_engine, require_vllm

    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    n = len(prompts)
    if n == 0:
        raise ValueError("prompts must be a non-empty list")
    request_ids = [f"r{i}" for i in range(n)] if request_ids is None else [str(r) for r in request_ids]
    domains = ["unknown"] * n if domains is None else [str(d) for d in domains]
    if len(request_ids) != n or len(domains) != n:
        raise ValueError(f"request_ids and domains must have one entry per prompt ({n})")
    vllm = require_vllm()
    engine = model if _is_engine(model) else make_engine(model, **engine_kwargs)
    token_lists = _tokenize(engine, prompts, tokenizer, add_special_tokens)
    max_len = engine.llm_engine.model_config.max_model_len
    too_long = [i for i, t in enumerate(token_lists) if len(t) + max_new_tokens + 1 > max_len]
    if too_long:
        raise ValueError(f"prompts {too_long[:5]} plus max_new_tokens+1={max_new_tokens + 1} exceed the engine's "
                         f"max_model_len={max_len}")
    info = install_hooks(engine)
    L, k, E = info["num_layers"], info["top_k"], info["num_experts"]
    params = vllm.SamplingParams(max_tokens=max_new_tokens + 1, temperature=0.0, ignore_eos=ignore_eos)
    engine.collective_rpc(_set_enabled, args=(True,))
    try:
        outputs = engine.generate([{"prompt_token_ids": t} for t in token_lists], params, use_tqdm=progress)
    finally:
        engine.collective_rpc(_set_enabled, args=(False,))
    drained = engine.collective_rpc(_drain)[0]
    if drained["errors"]:
        raise RuntimeError("vLLM capture hooks missed layers: " + "; ".join(drained["errors"][:3]))
    external = {str(o.request_id): i for i, o in enumerate(outputs)}
    gen = [list(o.outputs[0].token_ids) for o in outputs]
    plen = np.array([len(t) for t in token_lists], dtype=np.int64)
    # decode records we expect: generated tokens that were fed back, at most T per request
    dlen = np.minimum(np.array([max(len(g) - 1, 0) for g in gen], dtype=np.int64), max_new_tokens)

    prefill_ids = [np.full((plen[i], L, k), -1, np.int32) for i in range(n)]
    decode_ids = [np.full((dlen[i], L, k), -1, np.int32) for i in range(n)]
    probs = np.zeros((n, L, E), np.float64)
    for rec in drained["records"]:
        owners = np.full(rec["qsl"][-1], -1, np.int64)
        for j, rid in enumerate(rec["req_ids"]):
            owners[rec["qsl"][j]:rec["qsl"][j + 1]] = external.get(rid.rsplit("-", 1)[0], external.get(rid, -1))
        for i in np.unique(owners[owners >= 0]):
            rows = np.flatnonzero(owners == i)
            pos = rec["positions"][rows]
            pre = pos < plen[i]
            prefill_ids[i][pos[pre]] = rec["ids"][rows[pre]]
            if with_probs:
                probs[i] += rec["probs"][rows[pre]].sum(axis=0)
            dec = ~pre & (pos - plen[i] < dlen[i])
            decode_ids[i][pos[dec] - plen[i]] = rec["ids"][rows[dec]]
    missing = [request_ids[i] for i in range(n) if (prefill_ids[i] < 0).any() or (decode_ids[i] < 0).any()]
    if missing:
        raise RuntimeError(f"vLLM capture lost tokens of requests {missing[:5]}: was prefix caching enabled on this "
                           "engine (cached prefixes are not recomputed)? make one with moelab.models.vllm_engine.make_engine")
    counts = np.zeros((n, L, E), np.int32)
    for i in range(n):
        flat = (np.arange(L)[None, :, None] * E + prefill_ids[i]).ravel()
        counts[i] = np.bincount(flat, minlength=L * E).reshape(L, E)
    name = _model_name(engine)
    return ExpertTrace.from_requests(
        request_ids=request_ids, domains=domains, prompt_tokens=[np.asarray(t) for t in token_lists],
        prefill_counts=counts, decode_ids=decode_ids,
        geometry=Geometry(L, E, k, name, tuple(f"layers.{lid}.mlp" for lid in info["layer_ids"])),
        provenance=default_provenance("vllm", name, method="moelab hooks (MoERunner capture_fn, GateLinear, runner batch layout)",
                                      max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, greedy=True),
        prefill_ids=prefill_ids, prefill_probs=probs.astype(np.float32) if with_probs else None,
        decode_tokens=[np.asarray(g[: dlen[i]]) for i, g in enumerate(gen)],
    )


def _tokenize(engine: Any, prompts: Sequence[Any], tokenizer: Any, add_special_tokens: bool) -> list[list[int]]:
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompts[{i}] is an empty string")
            if tokenizer is None:
                tokenizer = engine.get_tokenizer()
            ids = list(tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"])
        else:
            ids = [int(t) for t in p]
        if not ids:
            raise ValueError(f"prompts[{i}] has no tokens")
        out.append(ids)
    return out
