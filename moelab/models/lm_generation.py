"""Batch greedy generation and the verify-cost curve of an HF causal LM."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from moelab._validate import check_int
from moelab.models.lm_session import LMSession, chat_prompt_ids


def greedy_generate_batch(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 128,
                          batch_size: int = 8, progress: bool = False) -> list[list[int]]:
    """Greedy continuations (token ids, cut after EOS) of chat ``prompts``, in left-padded batches.

    Batching pads prompts, which can move logits by float rounding; use :class:`LMSession`-based decoding
    where bit-exact greedy output matters (this helper builds draft stores, where it does not).
    """
    import torch  # lazy: torch is heavy and optional

    check_int("max_new_tokens", max_new_tokens, low=1)
    check_int("batch_size", batch_size, low=1)
    ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    out: list[list[int]] = [[] for _ in ids]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:

        batches = tqdm(batches, desc="greedy outputs")
    for batch in batches:
        width = max(len(ids[i]) for i in batch)
        inp = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            inp[r, width - len(ids[i]):] = torch.as_tensor(ids[i])
            mask[r, width - len(ids[i]):] = 1
        with torch.inference_mode():
            gen = model.generate(input_ids=inp.to(device), attention_mask=mask.to(device), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=pad)
        for r, i in enumerate(batch):
            toks = gen[r, width:].tolist()
            if eos is not None and eos in toks:
                toks = toks[:toks.index(eos) + 1]
            out[i] = toks
    return out


def verify_cost_curve(model: Any, *, qs: Sequence[int] = (1, 2, 4, 8), context_len: int = 256,
                      repeat: int = 5, seed: int = 0) -> pd.DataFrame:
    """Latency of one forward over ``q`` new tokens on top of a cached context (the verification cost).

    The context (random token ids, ``context_len`` long) is prefilled once into a KV cache; each timed
    forward appends ``q`` tokens and the cache is cropped back afterwards, so every run sees the same
    context length. Medians over ``repeat`` runs after one warm-up.

    Returns
    -------
    DataFrame
        ``q, ms_median, ms_min, ms_max, relative`` (relative = ms_median / ms_median at the smallest q).
    """
    import torch  # lazy: torch is heavy and optional

    qs = [check_int("qs entry", q, low=1, high=512) for q in qs]
    if not qs:
        raise ValueError("qs must name at least one q >= 1")
    check_int("context_len", context_len, low=1, high=32768)
    check_int("repeat", repeat, low=1)
    rng = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    device = next(model.parameters()).device
    ctx = rng.integers(0, vocab, size=(1, context_len))
    rows = []
    session = LMSession(model)
    session.prefill(ctx[0].tolist())
    for q in qs:
        new = rng.integers(0, vocab, size=q)
        chain = np.arange(-1, q - 1)
        times = []
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            session.forward_tree(new, chain)
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            session.commit([])  # drop the q tokens again
            if i:  # the first run is a warm-up
                times.append(dt * 1e3)
        rows.append({"q": q, "ms_median": float(np.median(times)), "ms_min": float(np.min(times)),
                     "ms_max": float(np.max(times))})
    df = pd.DataFrame(rows)
    df["relative"] = df["ms_median"] / df.loc[df["q"].idxmin(), "ms_median"]
    return df


__all__ = ["greedy_generate_batch", "verify_cost_curve"]
