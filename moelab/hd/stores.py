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


def target_greedy_outputs(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 80,
                          batch_size: int | None = None, progress: bool = False) -> list[list[int]]:
    """The target's greedy continuations of chat ``prompts`` (token ids, cut after EOS).

    ``batch_size=None`` decodes one prompt at a time with exact greedy decoding (what a CPU does best: no
    padding of long prompts); an int uses left-padded batches through ``transformers.generate`` (GPUs).
    """
    from moelab.hd.decode import generate
    from moelab.models.lm import chat_prompt_ids, greedy_generate_batch

    if not prompts:
        raise ValueError("prompts must not be empty")
    check_int("max_new_tokens", max_new_tokens, low=1)
    if batch_size is not None:
        return greedy_generate_batch(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens,
                                     batch_size=batch_size, progress=progress)
    it: Iterable[str] = prompts
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(prompts, desc="target greedy outputs")
    return [generate(model, chat_prompt_ids(tokenizer, p), None, max_new_tokens=max_new_tokens,
                     eos_token_id=tokenizer.eos_token_id).tokens for p in it]


def model_store_from_outputs(outputs: Sequence[Sequence[int]], tokenizer: Any, *, key_lengths: Sequence[int] = (1, 2),
                             length: int = 4, per_key: int = 7, max_ngrams: int = 100_000, min_count: int = 1,
                             source: str = "", extra_meta: dict[str, Any] | None = None) -> NGramTable:
    """S from the target's outputs: keep the ``max_ngrams`` most frequent (key + continuation) n-grams."""
    if not outputs:
        raise ValueError("outputs must not be empty")
    meta = _store_meta("model", tokenizer, source or f"{len(outputs)} target outputs",
                       {"output_tokens": int(sum(len(o) for o in outputs)), **(extra_meta or {})})
    return NGramTable.build(outputs, key_lengths=key_lengths, length=length, per_key=per_key, min_count=min_count,
                            max_ngrams=max_ngrams, meta=meta)


def build_model_store(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 80,
                      batch_size: int | None = None, source: str = "", progress: bool = False,
                      **table_kw: Any) -> NGramTable:
    """S: the most frequent n-grams of the target model's own greedy outputs on ``prompts``.

    ``prompts`` must be disjoint from the evaluation (e.g. ``spec_bench_split("store").prompt``);
    ``table_kw`` go to :func:`model_store_from_outputs` (key_lengths, length, per_key, max_ngrams, min_count).
    """
    outputs = target_greedy_outputs(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                    progress=progress)
    return model_store_from_outputs(outputs, tokenizer, source=source or f"{len(prompts)} prompts", extra_meta={
        "model": getattr(model.config, "_name_or_path", ""), "max_new_tokens": max_new_tokens}, **table_kw)


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


def default_store_path(kind: str) -> Path:
    """The shipped S (``"model"``) or L (``"statistics"``) store for the default target, SmolLM2-135M-Instruct."""
    from moelab.datasets import repo_root

    letter = {"model": "S", "statistics": "L"}.get(kind)
    if letter is None:
        raise ValueError(f"kind must be one of ['model', 'statistics']; got {kind!r}")
    return repo_root() / "data" / "hd" / f"smollm2-135m-instruct.{letter}.npz"


def default_model_store_path() -> Path:
    """The shipped S store for the default target (SmolLM2-135M-Instruct)."""
    return default_store_path("model")


def default_statistics_store_path(tokenizer: Any) -> Path:
    """Where an L store over the offline corpus for ``tokenizer`` is cached."""
    from moelab.datasets import cache_dir

    return cache_dir() / "hd" / f"L-offline-corpus-{tokenizer_identity(tokenizer)['sha256'][:12]}.npz"


def load_store(path: str | Path, tokenizer: Any, kind: str | None = None) -> NGramTable:
    """Load an S or L file, checking it was built for ``tokenizer`` (``kind`` in {"model", "statistics"})."""
    return NGramTable.load(path, expect_tokenizer=tokenizer_identity(tokenizer), expect_kind=kind)


def load_default_model_store(tokenizer: Any) -> NGramTable:
    """The shipped S store; a clear error if ``tokenizer`` is not the one it was built for."""
    path = default_model_store_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; rebuild it with moelab.hd.rebuild_default_model_store()")
    try:
        return load_store(path, tokenizer, "model")
    except ValueError as exc:
        raise ValueError(f"{exc}. The shipped S store belongs to SmolLM2-135M-Instruct; for another target build one "
                         "with moelab.hd.build_model_store(model, tokenizer, spec_bench_split('store').prompt)") from None


def load_default_statistics_store(tokenizer: Any, *, rebuild: bool = False, max_bytes: int | None = None,
                                  domains: Sequence[str] | None = None) -> NGramTable:
    """L over the offline multi-domain corpus (train split).

    Uses the shipped file when it was built for ``tokenizer`` (and no custom corpus is asked for);
    otherwise builds the index once into the cache dir (minutes on 2 cores) and reuses it.
    """
    from moelab.models.corpus import iter_domain_texts

    custom = max_bytes is not None or domains is not None
    shipped = default_store_path("statistics")
    if not custom and not rebuild and shipped.is_file():
        try:
            return load_store(shipped, tokenizer, "statistics")
        except ValueError:
            pass  # another tokenizer: fall through to the per-tokenizer cache
    path = default_statistics_store_path(tokenizer)
    if custom:  # a non-default corpus gets its own file
        tag = hashlib.sha256(json.dumps([max_bytes, domains]).encode()).hexdigest()[:8]
        path = path.with_name(path.stem + f"-{tag}.npz")
    if path.is_file() and not rebuild:
        return load_store(path, tokenizer, "statistics")
    kw: dict[str, Any] = {"split": "train"}
    if max_bytes is not None:
        kw["max_bytes"] = max_bytes
    texts = (t for _, t in iter_domain_texts(domains, **kw))
    table = build_statistics_store(texts, tokenizer, source=f"offline corpus (moelab.models.corpus) {kw}, "
                                                            f"domains {domains or 'all available'}")
    table.save(path)
    return table


def rebuild_default_model_store(*, per_category: int | None = None, max_new_tokens: int = 80,
                                path: str | Path | None = None, model_name: str | None = None,
                                progress: bool = True) -> Path:
    """Rebuild the shipped S store: the target's greedy outputs on the Spec-Bench *store* split.

    ``python -c "from moelab.hd import rebuild_default_model_store as r; r()"`` regenerates
    ``data/hd/smollm2-135m-instruct.S.npz`` from all 120 store-split questions (about 30-60 min on 2 busy
    CPU cores; ``per_category`` takes fewer).
    """
    from moelab.hd.specbench import spec_bench_split
    from moelab.models.lm import DEFAULT_LM, load_lm

    model, tok = load_lm(model_name or DEFAULT_LM)
    df = spec_bench_split("store", per_category=per_category)
    table = build_model_store(model, tok, df["prompt"].tolist(), max_new_tokens=max_new_tokens, progress=progress,
                              source=STORE_SPLIT_SOURCE.format(n=len(df)))
    table.meta["question_ids"] = [int(q) for q in df["question_id"]]
    return table.save(path or default_model_store_path())


STORE_SPLIT_SOURCE = ("Spec-Bench store split ({n} questions: per category, sorted position % 4 == 3; never in the "
                      "eval split), first turn, chat template, exact greedy")


__all__ = ["STORE_KINDS", "ContextStore", "Store", "build_model_store", "build_statistics_store",
           "default_model_store_path", "default_statistics_store_path", "default_store_path",
           "load_default_model_store", "load_default_statistics_store",
           "load_store", "model_store_from_outputs", "rebuild_default_model_store", "target_greedy_outputs",
           "tokenizer_identity"]
