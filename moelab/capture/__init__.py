"""Expert-activation capture: run a real MoE on prompts and record which experts every token used.

``capture(model, prompts, max_new_tokens, backend="hf"|"vllm", ...) -> ExpertTrace`` is the one entry
point. The HF backend (:mod:`moelab.capture.hf`) hooks the router modules of a transformers model; the
vLLM backend lives in :mod:`moelab.capture.vllm_backend` and is imported only when asked for. torch,
transformers and vllm are imported lazily, so ``import moelab.capture`` needs none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from moelab._validate import check_choice, check_int
from moelab.capture.hf import capture_hf
from moelab.traces.expert import ExpertTrace

#: Capture backends: ``hf`` (Hugging Face transformers, one request at a time) or ``vllm`` (a live vLLM engine).
BACKENDS = ("hf", "vllm")


def _check_prompts(prompts: Any) -> list:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError("prompts must be a non-empty list of strings or of token-id sequences; "
                         f"got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts must be a non-empty list; got an empty one")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompts[{i}] is an empty string")
        elif len(p) == 0:
            raise ValueError(f"prompts[{i}] is an empty token sequence")
    return prompts


def capture(
    model: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    max_new_tokens: int,
    backend: str = "hf",
    domains: Sequence[str] | None = None,
    request_ids: Sequence[str] | None = None,
    **kwargs: Any,
) -> ExpertTrace:
    """Run ``prompts`` through an MoE model (prefill + greedy decode) and record its expert activations.

    Parameters
    ----------
    model : str, path, or (model, tokenizer)
        A local folder / hub id / ``"tiny-moe"`` (the project's bundled model), or a loaded Hugging
        Face pair. The vLLM backend takes what :func:`moelab.capture.vllm_backend.capture_vllm` takes.
    prompts : list of str or list of token-id sequences
        One entry per request; token ids are used as they are (no special tokens added).
    max_new_tokens : int
        Greedy tokens generated per request (>= 1).
    backend : {"hf", "vllm"}
        Who runs the model: ``transformers`` with router hooks, or a vLLM engine
        (:func:`moelab.capture.vllm_backend.capture_vllm`).
    domains : list of str, optional
        A label per request (default ``"unknown"``).
    request_ids : list of str, optional
        Unique ids (default ``"r00000"``...).
    **kwargs
        Backend options (HF: ``progress``, ``self_check``, ``keep_prefill_ids``, ``device``,
        ``stop_at_eos``, ``model_name``).

    Returns
    -------
    ExpertTrace
        With ``prefill_counts``, per-token ``prefill_ids``, ``prefill_probs`` (summed router
        probabilities), ``decode_ids``, ``decode_tokens``, geometry and provenance.
    """
    check_choice("backend", backend, BACKENDS)
    prompts = _check_prompts(prompts)
    check_int("max_new_tokens", max_new_tokens, low=1)
    n = len(prompts)
    if domains is None:
        domains = ["unknown"] * n
    if len(domains) != n:
        raise ValueError(f"domains must have one label per prompt ({n}); got {len(domains)}")
    if request_ids is None:
        request_ids = [f"r{i:05d}" for i in range(n)]
    if len(request_ids) != n or len(set(map(str, request_ids))) != n:
        raise ValueError(f"request_ids must be {n} unique ids")
    if backend == "hf":
        return capture_hf(model, prompts, int(max_new_tokens), domains=list(domains), request_ids=list(request_ids), **kwargs)
    try:
        mod = importlib.import_module("moelab.capture.vllm_backend")
    except ModuleNotFoundError as exc:
        if exc.name in ("moelab.capture.vllm_backend",):
            raise RuntimeError("backend='vllm' needs moelab.capture.vllm_backend, which is not part of this installation") from exc
        raise RuntimeError(f"backend='vllm' could not be imported: {exc} (is vllm installed?)") from exc
    if not hasattr(mod, "capture_vllm"):
        raise RuntimeError("moelab.capture.vllm_backend has no capture_vllm(model, prompts, max_new_tokens, **kw)")
    return mod.capture_vllm(model, prompts, int(max_new_tokens), domains=list(domains), request_ids=list(request_ids), **kwargs)


__all__ = ["BACKENDS", "capture"]
