"""HD's three databases behind one interface: ``lookup(context, k) -> candidate continuations``.

* **W** (:class:`ContextStore`) — per request: n-grams of the prompt and of the tokens accepted so far,
  keyed by the last 1-2 tokens, LRU per key (most recent continuation first).
* **S** (:func:`build_model_store`) — model-dependent: the most frequent n-grams of the TARGET model's own
  greedy outputs on prompts disjoint from the evaluation (default: the Spec-Bench "store" split, see
  :mod:`moelab.hd.specbench`). A small one for SmolLM2-135M-Instruct ships in ``data/hd/``.
* **L** (:func:`build_statistics_store`) — statistics-dependent: an n-gram index over a text corpus
  (default: the offline multi-domain corpus ``moelab.models.iter_domain_texts(split="train")``), built
  once into the cache dir.

S and L files record the tokenizer's identity; loading one with another tokenizer is an error.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from moelab._validate import check_int
from moelab.hd.ngram import NGramTable

STORE_KINDS = {"S": "model", "L": "statistics"}


class Store(Protocol):
    """Anything HD can draft from."""

    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]: ...


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """Name, vocabulary size and a sha256 of the (token, id) vocabulary — what store files record."""
    cached = getattr(tokenizer, "_moelab_identity", None)
    if cached is not None:
        return cached
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    name = getattr(tokenizer, "moelab_name", None) or str(getattr(tokenizer, "name_or_path", ""))
    ident = {"name": name, "vocab_size": len(vocab), "sha256": digest}
    try:
        tokenizer._moelab_identity = ident
    except AttributeError:  # some tokenizers refuse new attributes; then it is recomputed next time
        pass
    return ident


class ContextStore:
    """W: a per-request n-gram store over the prompt and the accepted tokens, LRU per key.

    Parameters
    ----------
    key_lengths : sequence of int
        Key lengths (longest is queried first).
    length : int
        Continuation length stored per n-gram.
    per_key : int
        Continuations remembered per key; the least recently seen is evicted first.
    """

    def __init__(self, key_lengths: Sequence[int] = (1, 2), length: int = 4, per_key: int = 8) -> None:
        self.key_lengths = sorted({check_int("key_lengths entry", m, low=1, high=3) for m in key_lengths}, reverse=True)
        self.length = check_int("length", length, low=1, high=64)
        self.per_key = check_int("per_key", per_key, low=1)
        self.reset()

    def reset(self, prompt: Sequence[int] = ()) -> None:
        """Forget everything and index ``prompt``."""
        self.tokens: list[int] = []
        self._table: dict[tuple[int, ...], OrderedDict[tuple[int, ...], None]] = {}
        self.extend(prompt)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens; every n-gram that becomes complete is (re)inserted as most recent."""
        toks = self.tokens
        start = len(toks)
        toks.extend(int(t) for t in new_tokens)
        L = self.length
        for end in range(max(start, L), len(toks)):  # `end` = last token of a continuation
            cont = tuple(toks[end - L + 1:end + 1])
            kend = end - L + 1  # keys end just before the continuation
            for m in self.key_lengths:
                if kend < m:
                    continue
                key = tuple(toks[kend - m:kend])
                bucket = self._table.get(key)
                if bucket is None:
                    bucket = self._table[key] = OrderedDict()
                bucket[cont] = None
                bucket.move_to_end(cont, last=False)  # most recent first
                if len(bucket) > self.per_key:
                    bucket.popitem(last=True)

    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]:
        """Up to ``k`` continuations of ``context``'s last tokens (longest key first, most recent first)."""
        out: list[tuple[int, ...]] = []
        n = len(context)
        for m in self.key_lengths:
            if n < m:
                continue
            bucket = self._table.get(tuple(context[n - m:]))
            if not bucket:
                continue
            for c in bucket:
                if c not in out:
                    out.append(c)
                    if len(out) >= k:
                        return out
        return out


def _store_meta(kind: str, tokenizer: Any, source: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "tokenizer": tokenizer_identity(tokenizer), "source": source,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def build_model_store(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 128,
                      batch_size: int = 8, key_lengths: Sequence[int] = (1, 2), length: int = 4, per_key: int = 7,
                      max_ngrams: int = 100_000, min_count: int = 1, source: str = "",
                      progress: bool = False) -> NGramTable:
    """S: the most frequent n-grams of the target model's own greedy outputs on ``prompts``.

    ``prompts`` must be disjoint from the evaluation (e.g. ``spec_bench_split("store").prompt``). The
    outputs are generated greedily in batches (left padding) with the chat template.
    """
    from moelab.models.lm import greedy_generate_batch

    if not prompts:
        raise ValueError("prompts must not be empty")
    check_int("max_new_tokens", max_new_tokens, low=1)
    outputs = greedy_generate_batch(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens,
                                    batch_size=batch_size, progress=progress)
    meta = _store_meta("model", tokenizer, source or f"{len(prompts)} prompts",
                       {"model": getattr(model.config, "_name_or_path", ""), "max_new_tokens": max_new_tokens,
                        "output_tokens": int(sum(len(o) for o in outputs))})
    return NGramTable.build(outputs, key_lengths=key_lengths, length=length, per_key=per_key, min_count=min_count,
                            max_ngrams=max_ngrams, meta=meta)


def build_statistics_store(texts: Iterable[str], tokenizer: Any, *, key_lengths: Sequence[int] = (1, 2),
                           length: int = 4, per_key: int = 7, min_count: int = 2, source: str = "",
                           batch: int = 256) -> NGramTable:
    """L: an n-gram index over a text corpus (any iterable of documents), tokenized with ``tokenizer``."""
    seqs: list[list[int]] = []
    buf: list[str] = []
    n_docs = 0

    def flush() -> None:
        if buf:
            seqs.extend(tokenizer(buf, add_special_tokens=False)["input_ids"])
            buf.clear()

    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"texts must yield strings; got {type(text).__name__}")
        if text.strip():
            buf.append(text)
            n_docs += 1
        if len(buf) >= batch:
            flush()
    flush()
    if not n_docs:
        raise ValueError("texts must contain at least one non-empty document")
    meta = _store_meta("statistics", tokenizer, source or f"{n_docs} documents", {"documents": n_docs})
    return NGramTable.build(seqs, key_lengths=key_lengths, length=length, per_key=per_key, min_count=min_count,
                            meta=meta)


def default_model_store_path() -> Path:
    """The shipped S store for the default target (SmolLM2-135M-Instruct)."""
    from moelab.datasets import repo_root

    return repo_root() / "data" / "hd" / "smollm2-135m-instruct.S.npz"


def default_statistics_store_path(tokenizer: Any) -> Path:
    """Where the default L store (offline corpus) for ``tokenizer`` is cached."""
    from moelab.datasets import cache_dir

    return cache_dir() / "hd" / f"L-offline-corpus-{tokenizer_identity(tokenizer)['sha256'][:12]}.npz"


def load_store(path: str | Path, tokenizer: Any, kind: str | None = None) -> NGramTable:
    """Load an S or L file, checking it was built for ``tokenizer`` (``kind`` in {"model", "statistics"})."""
    return NGramTable.load(path, expect_tokenizer=tokenizer_identity(tokenizer), expect_kind=kind)


def load_default_statistics_store(tokenizer: Any, *, rebuild: bool = False, max_bytes: int | None = None,
                                  domains: Sequence[str] | None = None) -> NGramTable:
    """L over the offline multi-domain corpus (train split), built once and cached per tokenizer."""
    from moelab.models.corpus import iter_domain_texts

    path = default_statistics_store_path(tokenizer)
    if max_bytes is not None or domains is not None:  # a non-default corpus gets its own file
        tag = hashlib.sha256(json.dumps([max_bytes, domains]).encode()).hexdigest()[:8]
        path = path.with_name(path.stem + f"-{tag}.npz")
    if path.is_file() and not rebuild:
        return load_store(path, tokenizer, "statistics")
    kw: dict[str, Any] = {"split": "train"}
    if max_bytes is not None:
        kw["max_bytes"] = max_bytes
    texts = (t for _, t in iter_domain_texts(domains, **kw))
    table = build_statistics_store(texts, tokenizer, source=f"offline corpus train split {kw}")
    table.save(path)
    return table


def rebuild_default_model_store(*, per_category: int | None = None, max_new_tokens: int = 128, batch_size: int = 8,
                                path: str | Path | None = None, model_name: str | None = None,
                                progress: bool = True) -> Path:
    """Rebuild the shipped S store: the target's greedy outputs on the Spec-Bench *store* split.

    ``python -c "from moelab.hd.stores import rebuild_default_model_store as r; r()"`` regenerates
    ``data/hd/smollm2-135m-instruct.S.npz`` (all 120 store-split questions, 128 tokens each).
    """
    from moelab.hd.specbench import spec_bench_split
    from moelab.models.lm import DEFAULT_LM, load_lm

    model, tok = load_lm(model_name or DEFAULT_LM)
    df = spec_bench_split("store", per_category=per_category)
    table = build_model_store(model, tok, df["prompt"].tolist(), max_new_tokens=max_new_tokens,
                              batch_size=batch_size, progress=progress,
                              source=f"Spec-Bench store split ({len(df)} questions: sorted position % 4 == 3 "
                                     "per category), first turn, chat template, greedy")
    table.meta["question_ids"] = [int(q) for q in df["question_id"]]
    return table.save(path or default_model_store_path())


__all__ = ["STORE_KINDS", "ContextStore", "Store", "build_model_store", "build_statistics_store",
           "default_model_store_path", "default_statistics_store_path", "load_default_statistics_store",
           "load_store", "rebuild_default_model_store", "tokenizer_identity"]
