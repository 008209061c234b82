"""A self-speculative early-exit draft: the first layers of a causal LM, its final norm and its LM head.

The draft shares every weight with the target (no copy, no training): :func:`early_exit_draft` returns a
shallow view of a Hugging Face decoder-only model (Llama-style: ``model.model.layers``, ``model.model.norm``,
``model.lm_head``; e.g. SmolLM2-135M) whose decoder stack is cut after ``layers`` layers. With
``layers`` equal to the model's depth the view computes exactly the target's logits.

:func:`greedy_chains` runs a draft (or the target) greedily from every position of a known continuation:
row ``p`` holds the ``gamma_max`` tokens the model would propose after ``prompt + reference[:p]``. Under
greedy verification that is all a speculative round needs (see :mod:`moelab.dsd.acceptance`).
:func:`forward_ms` times forwards of ``q`` new tokens over a cached context (t_d, t_v, t_ar on this machine).

torch and transformers are imported inside the functions: ``import moelab.models.early_exit`` stays light.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from moelab._validate import check_int

MAX_GAMMA = 64
MAX_POSITIONS = 4096


def _depth(model: Any) -> int:
    try:
        return len(model.model.layers)
    except AttributeError:
        raise ValueError("model must be a decoder-only causal LM with model.model.layers (Llama-style)") from None


def early_exit_draft(model: Any, layers: int) -> Any:
    """A view of ``model`` that runs only its first ``layers`` decoder layers, then its norm and LM head.

    Parameters
    ----------
    model : transformers causal LM
        Llama-style (``model.model.layers``, ``model.model.norm``, ``model.lm_head``).
    layers : int
        Decoder layers kept, 1..depth of ``model``.

    Returns
    -------
    The draft: a callable module sharing all weights with ``model`` (``draft.moelab_exit_layers`` = layers).
    """
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch

    depth = _depth(model)
    layers = check_int("layers", layers, low=1, high=depth)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner._modules["layers"] = torch.nn.ModuleList(list(model.model.layers)[:layers])
    cfg = copy.copy(model.config)
    cfg.num_hidden_layers = layers
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:layers]
    inner.config = cfg
    outer = copy.copy(model)
    outer._modules = dict(model._modules)
    outer._modules["model"] = inner
    outer.config = cfg
    outer.moelab_exit_layers = layers
    return outer


def _ids(name: str, ids: Sequence[int], *, allow_empty: bool = False) -> list[int]:
    out = [int(t) for t in ids]
    if not out and not allow_empty:
        raise ValueError(f"{name} must hold at least one token id")
    if any(t < 0 for t in out):
        raise ValueError(f"{name} must hold token ids >= 0")
    return out


def greedy_chains(model: Any, prompt_ids: Sequence[int], reference: Sequence[int], gamma_max: int) -> np.ndarray:
    """Greedy proposals of ``model`` from every position of ``reference``.

    Row ``p`` (``0 <= p < len(reference)``) holds the ``gamma_max`` tokens ``model`` generates greedily
    after the context ``prompt_ids + reference[:p]``. One KV cache is kept along the reference; each
    row's look-ahead is cropped from it afterwards, so the work is ``len(reference) * gamma_max`` one-token
    forwards.
    """
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch
    from transformers import DynamicCache

    prompt = _ids("prompt_ids", prompt_ids)
    ref = _ids("reference", reference)
    gamma_max = check_int("gamma_max", gamma_max, low=1, high=MAX_GAMMA)
    if len(ref) > MAX_POSITIONS:
        raise ValueError(f"reference must hold at most MAX_POSITIONS={MAX_POSITIONS} tokens; got {len(ref)}")
    device = next(model.parameters()).device
    out = np.zeros((len(ref), gamma_max), dtype=np.int64)
    cache = DynamicCache()
    with torch.inference_mode():
        if len(prompt) > 1:
            model(input_ids=torch.tensor([prompt[:-1]], device=device), past_key_values=cache, use_cache=True)
        pending = prompt[-1]  # the last context token: its KV is not cached yet
        for p in range(len(ref)):
            tok = pending
            for j in range(gamma_max):
                logits = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=cache,
                               use_cache=True).logits
                tok = int(logits[0, -1].argmax())
                out[p, j] = tok
            if gamma_max > 1:  # keep the pending token's KV, drop the look-ahead
                cache.crop(-(gamma_max - 1))
            pending = ref[p]
    return out


def greedy_reference(model: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                     eos_token_id: int | None = None) -> list[int]:
    """The target's greedy continuation of ``prompt_ids`` (stops after ``max_new_tokens`` or at EOS)."""
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch

    prompt = _ids("prompt_ids", prompt_ids)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1, high=MAX_POSITIONS)
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    return [int(t) for t in out[0, len(prompt):].tolist()]


def forward_ms(model: Any, q: int, *, context_len: int = 256, repeats: int = 5, vocab_limit: int = 1000) -> float:
    """Median wall-clock ms of one forward of ``q`` new tokens after ``context_len`` cached tokens.

    The cache is rebuilt outside the timed region for every repeat. CPU timings on a shared machine are
    noisy: report them as such.
    """
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch
    from transformers import DynamicCache

    q = check_int("q", q, low=1, high=512)
    context_len = check_int("context_len", context_len, low=1, high=8192)
    repeats = check_int("repeats", repeats, low=1, high=100)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab_limit, (1, context_len), generator=gen).to(device)
    new = torch.randint(0, vocab_limit, (1, q), generator=gen).to(device)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            cache = DynamicCache()
            model(input_ids=ctx, past_key_values=cache, use_cache=True)
            t0 = time.perf_counter()
            model(input_ids=new, past_key_values=cache, use_cache=True)
            times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times[1:]))


__all__ = ["MAX_GAMMA", "MAX_POSITIONS", "early_exit_draft", "forward_ms", "greedy_chains", "greedy_reference"]
