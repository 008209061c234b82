"""HF backend of :func:`moelab.capture.capture`: forward hooks on the router modules of a transformers MoE.

A router is the ``gate`` (or ``router``) child of any module that also has an ``experts`` child — the
sparse-MoE block of Qwen3-MoE, Qwen2-MoE, Mixtral and OLMoE (verified with tiny random configs of each in
``tests/test_capture_hf.py``). The hook reads the router's output: ``(logits, scores, indices)`` in
transformers >= 5, or plain logits from an ``nn.Linear`` gate (older versions), where the top-k is taken
from the softmax as the model does.

Requests run in batches of ``batch_size`` (default 1): one prefill forward over the (left-padded)
prompts, then greedy decode with the KV cache. Pad positions are routed too and dropped; with
``batch_size > 1`` a near-tie between two experts can occasionally resolve differently than at batch 1
(matmul blocking changes the last bits), so the default stays exact at 1. ``decode_ids[t]`` is the routing of the forward that takes
generated token ``decode_tokens[t]`` as input — the decode step that loads those experts — so a request
with ``T`` new tokens has ``T`` decode rows. Every forward also asks the model for
``output_router_logits=True`` and checks (``self_check``) that the hook ids equal that output's top-k on
every token, so a mis-hooked module or a wrong layer order cannot go unnoticed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from moelab._validate import check_int
from moelab.models.tiny_moe import TINY_MOE_PATH, load_tiny_moe
from moelab.traces.expert import ExpertTrace, Geometry, default_provenance, expert_counts


def resolve_model(model: Any, *, device: str | None = None) -> tuple[Any, Any, str]:
    """(model, tokenizer or None, name) from a path / hub id / ``"tiny-moe"`` / loaded model / pair."""
    if isinstance(model, (str, Path)):
        name = str(model)
        if name in ("tiny-moe", "moelab-tiny-moe") or Path(name).resolve() == Path(TINY_MOE_PATH).resolve():
            m, tok = load_tiny_moe()
            return m, tok, "moelab-tiny-moe"
        # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(name).exists() and ("/" not in name or name.startswith((".", "/"))):
            raise ValueError(f"model {name!r} is neither a local folder nor a hub id (owner/name) nor 'tiny-moe'")
        try:
            m = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(name)
        except OSError as exc:
            raise ValueError(f"could not load model {name!r}: {exc}") from exc
        return m, tok, name
    if isinstance(model, (tuple, list)) and len(model) == 2:
        m, tok = model
        return m, tok, str(getattr(m.config, "_name_or_path", "") or type(m).__name__)
    if hasattr(model, "config") and hasattr(model, "named_modules"):
        return model, None, str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    raise ValueError(f"model must be a path / hub id / 'tiny-moe', a transformers model, or a (model, tokenizer) pair; "
                     f"got {type(model).__name__}")


def find_routers(model: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of every MoE router, in layer order."""
    routers = []
    for name, mod in model.named_modules():
        children = dict(mod.named_children())
        if "experts" in children:
            for attr in ("gate", "router"):
                if attr in children:
                    routers.append((f"{name}.{attr}" if name else attr, children[attr]))
                    break
    if not routers:
        raise ValueError(f"{type(model).__name__} has no MoE router modules (a module with 'experts' and 'gate' children); "
                         "is it a mixture-of-experts model?")
    return routers


def model_geometry(model: Any, routers: list[tuple[str, Any]], name: str) -> Geometry:
    """Geometry from the model config (experts, top-k) and the routers found (layers)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    e = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None)
    k = getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "moe_top_k", None)
    if not e or not k:
        raise ValueError(f"cannot read num_experts / num_experts_per_tok from {type(cfg).__name__}")
    return Geometry(len(routers), int(e), int(k), name, tuple(n for n, _ in routers))


class _RouterTap:
    """Collects (top-k ids, probabilities) of every router call of one forward."""

    def __init__(self, routers: list[tuple[str, Any]], top_k: int) -> None:
        self.top_k = top_k
        self.ids: list[Any] = [None] * len(routers)
        self.probs: list[Any] = [None] * len(routers)
        self.handles = [mod.register_forward_hook(self._hook(i)) for i, (_, mod) in enumerate(routers)]

    def _hook(self, layer: int):
        # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
        import torch

        def fn(module: Any, inputs: Any, output: Any) -> None:
            if isinstance(output, (tuple, list)):
                logits = output[0]
                idx = output[2] if len(output) >= 3 and not torch.is_floating_point(output[2]) else None
            else:
                logits, idx = output, None
            probs = torch.softmax(logits.detach().float().reshape(-1, logits.shape[-1]), dim=-1)
            if idx is None:
                idx = torch.topk(probs, self.top_k, dim=-1).indices
            self.ids[layer] = idx.detach().reshape(-1, self.top_k).to("cpu")
            self.probs[layer] = probs.to("cpu")

        return fn

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """``ids [tokens, L, k]`` and ``probs [tokens, L, E]`` of the last forward."""
        if any(x is None for x in self.ids):
            raise RuntimeError("a router hook did not fire during the forward pass")
        ids = np.stack([x.numpy() for x in self.ids], axis=1)
        probs = np.stack([x.numpy() for x in self.probs], axis=1)
        self.ids = [None] * len(self.ids)
        self.probs = [None] * len(self.probs)
        return ids, probs

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _check_against_router_logits(out: Any, ids: np.ndarray, where: str) -> None:
    """Hook ids must equal the top-k (as sets) of the model's own ``router_logits`` output."""
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch

    rl = getattr(out, "router_logits", None)
    if rl is None:
        raise RuntimeError("the model returned no router_logits with output_router_logits=True; cannot self-check")
    k = ids.shape[-1]
    ref = np.stack([torch.topk(torch.softmax(r.detach().float().reshape(-1, r.shape[-1]), -1), k, dim=-1).indices.cpu().numpy()
                    for r in rl], axis=1)
    if ref.shape != ids.shape or not np.array_equal(np.sort(ref, -1), np.sort(ids, -1)):
        bad = int(np.sum(np.any(np.sort(ref, -1) != np.sort(ids, -1), axis=-1))) if ref.shape == ids.shape else -1
        raise RuntimeError(f"self-check failed at {where}: hook ids differ from output_router_logits top-k "
                           f"(shapes {ids.shape} vs {ref.shape}, {bad} token-layers differ)")


def capture_hf(
    model: Any,
    prompts: list,
    max_new_tokens: int,
    *,
    domains: list[str],
    request_ids: list[str],
    progress: bool = True,
    self_check: bool = True,
    keep_prefill_ids: bool = True,
    stop_at_eos: bool = False,
    batch_size: int = 1,
    device: str | None = None,
    model_name: str | None = None,
) -> ExpertTrace:
    """HF-hook capture; see :func:`moelab.capture.capture` (arguments validated there)."""
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch
    from tqdm.auto import tqdm


    check_int("batch_size", batch_size, low=1)
    m, tok, name = resolve_model(model, device=device)
    name = model_name or name
    if device is not None:
        m.to(device)
    dev = next(m.parameters()).device
    m.eval()
    routers = find_routers(m)
    geo = model_geometry(m, routers, name)
    L, E, k = geo.num_layers, geo.num_experts, geo.top_k
    eos = getattr(m.config, "eos_token_id", None)
    eos_set = set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()

    token_lists = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tok is None:
                raise ValueError("string prompts need a tokenizer: pass (model, tokenizer) or a model path")
            ids = tok(p, add_special_tokens=False)["input_ids"]
        else:
            ids = [int(t) for t in p]
        vocab = int(m.config.get_text_config().vocab_size if hasattr(m.config, "get_text_config") else m.config.vocab_size)
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompts[{i}] must tokenize to ids in [0, {vocab - 1}]")
        token_lists.append(ids)

    # The decoder stack + LM head are called directly: the CausalLM wrapper would compute the
    # load-balancing loss from router_logits, which breaks with padding masks under a KV cache.
    base, head = m.get_decoder(), m.get_output_embeddings()
    tap = _RouterTap(routers, k)
    n = len(token_lists)
    counts = np.zeros((n, L, E), dtype=np.int32)
    probs_sum = np.zeros((n, L, E), dtype=np.float32)
    pre_ids: list[Any] = [None] * n
    dec_ids: list[Any] = [None] * n
    dec_toks: list[Any] = [None] * n
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    pad = int(pad if pad is not None else 0)
    # batches of similar prompt length waste little on left padding
    order = np.argsort([len(t) for t in token_lists], kind="stable") if batch_size > 1 else np.arange(n)
    batches = [order[s:s + batch_size] for s in range(0, n, batch_size)]
    bar = tqdm(total=n, desc="capture (hf)", unit="req", disable=not progress)
    try:
        with torch.inference_mode():
            for chunk in batches:
                B = len(chunk)
                lens = np.array([len(token_lists[i]) for i in chunk])
                S = int(lens.max())
                x = torch.full((B, S), pad, dtype=torch.long)
                mask = torch.zeros((B, S), dtype=torch.long)
                for b, i in enumerate(chunk):
                    x[b, S - lens[b]:] = torch.tensor(token_lists[i])
                    mask[b, S - lens[b]:] = 1
                pos = (mask.cumsum(1) - 1).clamp(min=0)
                out = base(input_ids=x.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=True,
                           output_router_logits=self_check)
                p_ids, p_probs = tap.take()
                if self_check:
                    _check_against_router_logits(out, p_ids, f"prefill of requests {chunk.tolist()}")
                p_ids, p_probs = p_ids.reshape(B, S, L, k), p_probs.reshape(B, S, L, E)
                for b, i in enumerate(chunk):
                    real = slice(S - lens[b], S)  # pad positions are routed too, and dropped here
                    pre_ids[i] = p_ids[b, real].astype(np.int16)
                    counts[i] = expert_counts(pre_ids[i], E)
                    probs_sum[i] = p_probs[b, real].sum(axis=0)
                past = out.past_key_values
                nxt = head(out.last_hidden_state[:, -1]).argmax(-1)
                pos = pos[:, -1:]
                steps_ids = np.zeros((B, max_new_tokens, L, k), dtype=np.int16)
                steps_tok = np.zeros((B, max_new_tokens), dtype=np.int32)
                stop = np.full(B, max_new_tokens)
                for t in range(max_new_tokens):
                    steps_tok[:, t] = nxt.cpu().numpy()
                    mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], dim=1)
                    pos = pos + 1
                    out = base(input_ids=nxt[:, None], attention_mask=mask.to(dev), position_ids=pos.to(dev),
                               past_key_values=past, use_cache=True, output_router_logits=self_check)
                    d_ids, _ = tap.take()
                    if self_check:
                        _check_against_router_logits(out, d_ids, f"decode step {t} of requests {chunk.tolist()}")
                    steps_ids[:, t] = d_ids.reshape(B, L, k)
                    past = out.past_key_values
                    if stop_at_eos:
                        hit = np.isin(steps_tok[:, t], list(eos_set)) & (stop == max_new_tokens)
                        stop[hit] = t + 1
                        if np.all(stop <= t + 1):
                            break
                    nxt = head(out.last_hidden_state[:, -1]).argmax(-1)
                for b, i in enumerate(chunk):
                    dec_ids[i] = steps_ids[b, :stop[b]]
                    dec_toks[i] = steps_tok[b, :stop[b]]
                bar.update(B)
    finally:
        tap.close()
        bar.close()

    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import transformers

    prov = default_provenance("hf", name, transformers_model=type(m).__name__, dtype=str(next(m.parameters()).dtype),
                              device=str(dev), greedy=True, batch_size=int(batch_size), self_checked=bool(self_check),
                              decode_semantics="decode_ids[t] = routing of the forward whose input is decode_tokens[t]",
                              transformers_version=transformers.__version__)
    return ExpertTrace.from_requests(
        request_ids=request_ids, domains=domains, prompt_tokens=[np.asarray(t) for t in token_lists],
        prefill_counts=counts, decode_ids=dec_ids, geometry=geo, provenance=prov,
        prefill_ids=pre_ids if keep_prefill_ids else None, prefill_probs=probs_sum, decode_tokens=dec_toks,
    )
