"""The vLLM capture driver: expert activations through vLLM: the same :class:`~moelab.traces.ExpertTrace` as the HF
backend, for batched requests under continuous batching.

How (vLLM internals, each listed in :mod:`moelab.models.vllm_contract` and checked before an engine starts):

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

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from moelab._validate import check_choice, check_int
from moelab.capture.vllm_hooks import NoMoELayersError, _drain, _is_engine, _set_enabled, install_hooks
from moelab.models.tiny_moe import TINY_MOE_PATH
from moelab.models.vllm_engine import make_engine, require_vllm
from moelab.traces import ExpertTrace, Geometry, default_provenance, expert_counts

_METHODS = {"hooks": "moelab hooks (MoERunner capture_fn, GateLinear, runner batch layout)",
            "routed_experts": "vLLM enable_return_routed_experts (CompletionOutput.routed_experts)"}
_ENGINE_LOCK = threading.RLock()  # one engine call at a time (the signature service runs in a thread)


def resolve_model_path(model: Any) -> str:
    """``"tiny-moe"`` -> the bundled model folder; anything else unchanged."""
    if str(model) in ("tiny-moe", "moelab-tiny-moe"):
        return str(TINY_MOE_PATH)
    return str(model)


def _eos_ids(engine: Any) -> set[int]:
    eos = engine.llm_engine.model_config.hf_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()


def _model_name(engine: Any) -> str:
    try:
        return str(engine.llm_engine.model_config.model)
    except AttributeError:
        return "unknown"


def capture_vllm(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], max_new_tokens: int, *,
                 request_ids: Sequence[str] | None = None, domains: Sequence[str] | None = None,
                 tokenizer: Any = None, add_special_tokens: bool = False, stop_at_eos: bool = False,
                 with_probs: bool = True, keep_prefill_ids: bool = True, model_name: str | None = None,
                 method: str = "auto", progress: bool = True, **engine_kwargs: Any) -> ExpertTrace:
    """Capture prefill expert counts and greedy-decode top-k ids of ``prompts`` through vLLM.

    Same semantics as the HF backend (:func:`moelab.capture.hf.capture_hf`), so the two traces are
    comparable token for token.

    Parameters
    ----------
    model : str, path or vllm.LLM
        A model folder / hub id / ``"tiny-moe"`` (an in-process engine is made with
        :func:`moelab.models.vllm_engine.make_engine` and ``engine_kwargs``) or an engine to reuse
        (hooks are installed once and stay; prefix caching must be off).
    prompts : list of str or of token-id lists
        Strings are tokenized with the model's tokenizer without special tokens (as the HF backend
        does); token ids are used as they are.
    max_new_tokens : int
        Greedy tokens generated per request whose routing is recorded (``T``).
    request_ids, domains : list of str, optional
        Default ``"r0", "r1", ...`` and ``"unknown"``.
    tokenizer : optional
        A Hugging Face tokenizer for string prompts (default: the engine's).
    add_special_tokens : bool
        Add BOS etc. when tokenizing strings (default False, as the HF backend).
    stop_at_eos : bool
        Stop a request after it generates end-of-sequence (that token's own decode step is still
        recorded, as in the HF backend). Default: exactly ``T`` tokens.
    with_probs, keep_prefill_ids : bool
        Record router probabilities summed over prompt tokens; keep per-token prefill ids.
    model_name : str, optional
        Name recorded in the geometry and provenance.
    method : {"auto", "hooks", "routed_experts"}
        ``"routed_experts"`` reads vLLM's own per-token routing (engines made with
        ``make_engine(..., return_routed_experts=True)``; needs a GPU: Model Runner V2 + Triton; no
        router probabilities, and CUDA graphs may stay on). ``"hooks"`` uses moelab's hooks (CPU and
        GPU, eager mode). ``"auto"``: routed_experts when the engine returns them, else hooks.
    progress : bool
        vLLM's progress bar.

    Returns
    -------
    ExpertTrace with ``prefill_counts``, ``decode_ids``, ``decode_tokens`` (+ ``prefill_ids``,
    ``prefill_probs`` with hooks).
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    n = len(prompts)
    if n == 0:
        raise ValueError("prompts must be a non-empty list")
    request_ids = [f"r{i}" for i in range(n)] if request_ids is None else [str(r) for r in request_ids]
    domains = ["unknown"] * n if domains is None else [str(d) for d in domains]
    if len(request_ids) != n or len(domains) != n:
        raise ValueError(f"request_ids and domains must have one entry per prompt ({n})")
    require_vllm(("engine", "capture"))  # names each hook target the installed vLLM lacks, before an engine starts
    engine = model if _is_engine(model) else make_engine(resolve_model_path(model), **engine_kwargs)
    token_lists = _tokenize(engine, prompts, tokenizer, add_special_tokens)
    # always generate past EOS (the EOS token's own decode step must be fed and recorded), then cut
    check_choice("method", method, ("auto", "hooks", "routed_experts"))
    native = _returns_routed_experts(engine)
    if method == "routed_experts" and not native:
        raise ValueError("method='routed_experts' needs an engine made with return_routed_experts=True (GPU only: "
                         "vLLM's routed-experts capture needs Model Runner V2 + Triton); use method='hooks'")
    if native and method != "hooks":
        method = "routed_experts"
        with_probs = False  # vLLM returns expert ids only
        info, prefill_ids, decode_ids, probs, gen = _capture_native(engine, token_lists, max_new_tokens, progress, request_ids)
    else:
        method = "hooks"
        info, prefill_ids, decode_ids, probs, gen = _capture(engine, token_lists, max_new_tokens, ignore_eos=True,
                                                             with_probs=with_probs, progress=progress, labels=request_ids)
    if stop_at_eos:
        eos = _eos_ids(engine)
        for i, g in enumerate(gen):
            hit = [t for t, tok in enumerate(g[:max_new_tokens]) if tok in eos]
            if hit:
                decode_ids[i] = decode_ids[i][: hit[0] + 1]
    L, k, E = info["num_layers"], info["top_k"], info["num_experts"]
    counts = np.zeros((n, L, E), np.int32)
    for i in range(n):
        counts[i] = expert_counts(prefill_ids[i], E)
    name = model_name or _model_name(engine)
    return ExpertTrace.from_requests(
        request_ids=request_ids, domains=domains, prompt_tokens=[np.asarray(t) for t in token_lists],
        prefill_counts=counts, decode_ids=decode_ids,
        geometry=Geometry(L, E, k, name, tuple(f"layers.{lid}.mlp" for lid in info["layer_ids"])),
        provenance=default_provenance("vllm", name, method=_METHODS[method],
                                      max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos, greedy=True,
                                      decode_semantics="decode_ids[t] = routing of the forward whose input is decode_tokens[t]"),
        prefill_ids=prefill_ids if keep_prefill_ids else None, prefill_probs=probs.astype(np.float32) if with_probs else None,
        decode_tokens=[np.asarray(g[: len(decode_ids[i])]) for i, g in enumerate(gen)],
    )


def _capture(engine: Any, token_lists: list[list[int]], max_new_tokens: int, *, ignore_eos: bool, with_probs: bool,
             progress: bool, labels: Sequence[str]) -> tuple[dict[str, Any], list[np.ndarray], list[np.ndarray], np.ndarray, list[list[int]]]:
    """Run the requests with the hooks on; per request: prefill ids ``[P, L, k]``, decode ids
    ``[T', L, k]`` (``T' <= max_new_tokens``; fewer only if generation stopped early), summed router
    probabilities ``[L, E]`` and generated token ids."""
    vllm = require_vllm()
    info = install_hooks(engine)
    L, k, E = info["num_layers"], info["top_k"], info["num_experts"]
    no_gate = sorted(set(info["layer_ids"]) - set(info["gates"]))
    if with_probs and no_gate:  # the probabilities of those layers would silently stay zero
        raise RuntimeError(f"vLLM capture: no GateLinear router found for MoE layers {no_gate[:8]} of this model, so "
                           "router probabilities cannot be recorded; capture with with_probs=False")
    n = len(token_lists)
    max_len = engine.llm_engine.model_config.max_model_len
    too_long = [i for i, t in enumerate(token_lists) if len(t) + max_new_tokens + 1 > max_len]
    if too_long:
        raise ValueError(f"prompts {too_long[:5]} plus max_new_tokens+1={max_new_tokens + 1} exceed the engine's "
                         f"max_model_len={max_len}")
    params = vllm.SamplingParams(max_tokens=max_new_tokens + 1, temperature=0.0, ignore_eos=ignore_eos)
    with _ENGINE_LOCK:
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
    # decode rows we expect: generated tokens that were fed back, at most T per request
    dlen = np.minimum(np.array([max(len(g) - 1, 0) for g in gen], dtype=np.int64), max_new_tokens)
    prefill_ids = [np.full((plen[i], L, k), -1, np.int32) for i in range(n)]
    decode_ids = [np.full((dlen[i], L, k), -1, np.int32) for i in range(n)]
    probs = np.zeros((n, L, E), np.float64)
    for rec in drained["records"]:
        owners = np.full(rec["qsl"][-1], -1, np.int64)
        for j, rid in enumerate(rec["req_ids"]):
            # the engine-internal id is "<external id>-<8 random chars>"
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
    missing = [labels[i] for i in range(n) if (prefill_ids[i] < 0).any() or (decode_ids[i] < 0).any()]
    if missing:
        raise RuntimeError(f"vLLM capture lost tokens of requests {missing[:5]}: was prefix caching enabled on this "
                           "engine (cached prefixes are not recomputed)? make one with moelab.models.vllm_engine.make_engine")
    return info, prefill_ids, decode_ids, probs, gen


def _returns_routed_experts(engine: Any) -> bool:
    try:
        return bool(engine.llm_engine.vllm_config.aux_output_config.enable_return_routed_experts)
    except AttributeError:
        return False


def _capture_native(engine: Any, token_lists: list[list[int]], max_new_tokens: int, progress: bool,
                    labels: Sequence[str]) -> tuple[dict[str, Any], list[np.ndarray], list[np.ndarray], np.ndarray, list[list[int]]]:
    """Per-token routing from vLLM's ``routed_experts`` output (``[fed tokens, L, k]`` per request:
    row ``p`` is the token at position ``p``). Written to the vLLM 0.32 output format; GPU only, so
    not exercised by moelab's CPU tests."""
    vllm = require_vllm()
    cfg = engine.llm_engine.model_config.hf_config
    cfg = getattr(cfg, "text_config", None) or cfg
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None)
    if not E:
        raise NoMoELayersError("the model config names no experts (num_experts / num_local_experts): not an MoE")
    params = vllm.SamplingParams(max_tokens=max_new_tokens + 1, temperature=0.0, ignore_eos=True)
    with _ENGINE_LOCK:
        outputs = engine.generate([{"prompt_token_ids": t} for t in token_lists], params, use_tqdm=progress)
    prefill_ids, decode_ids, gen = [], [], []
    for i, (o, toks) in enumerate(zip(outputs, token_lists)):
        routed = getattr(o.outputs[0], "routed_experts", None)
        P, g = len(toks), list(o.outputs[0].token_ids)
        T = min(max(len(g) - 1, 0), max_new_tokens)
        if routed is None or routed.ndim != 3 or routed.shape[0] < P + T:
            raise RuntimeError(f"vLLM returned no usable routed_experts for request {labels[i]} "
                               f"(shape {None if routed is None else routed.shape}, need >= {P + T} rows); use method='hooks'")
        prefill_ids.append(np.asarray(routed[:P], np.int32))
        decode_ids.append(np.asarray(routed[P:P + T], np.int32))
        gen.append(g)
    L, k = prefill_ids[0].shape[1:]
    info = {"num_layers": int(L), "top_k": int(k), "num_experts": int(E), "layer_ids": list(range(int(L)))}
    return info, prefill_ids, decode_ids, np.zeros((len(token_lists), int(L), int(E))), gen


def prefill_counts(engine: Any, prompts: Sequence[str] | Sequence[Sequence[int]], *, tokenizer: Any = None,
                   add_special_tokens: bool = True) -> np.ndarray:
    """Prefill expert counts ``[N, L, E]`` of ``prompts`` (one prefill pass each; no decode recorded).

    This is how ELDR signatures are obtained for live routing: a prefill pass on an engine with
    moelab's hooks (see :class:`PrefillCountServer`, ``python -m moelab.capture.vllm_backend serve-counts``)."""
    token_lists = _tokenize(engine, prompts, tokenizer, add_special_tokens)
    info, prefill_ids, _, _, _ = _capture(engine, token_lists, 0, ignore_eos=True, with_probs=False, progress=False,
                                          labels=[str(i) for i in range(len(token_lists))])
    return np.stack([expert_counts(p, info["num_experts"]) for p in prefill_ids]).astype(np.int32)


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


__all__ = ["capture_vllm", "prefill_counts", "resolve_model_path"]
