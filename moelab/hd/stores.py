"""HD's three databases behind one interface: ``lookup(context, k) -> candidate continuations``.

* **W** (:class:`ContextStore`) — per request: n-grams of the prompt and of the tokens accepted so far,
  keyed by the last 1-2 tokens, LRU per key (most recent continuation first).
* **S** — model-dependent: the top-100k n-grams of the TARGET model's own greedy outputs on ShareGPT
  prompts disjoint from Spec-Bench (built by :mod:`moelab.make.hd_stores`, ``moelab build-hd-stores``);
  the one for SmolLM2-135M-Instruct ships in ``data/hd/``.
* **L** — statistics-dependent: REST's exact suffix index over ShareGPT (:class:`moelab.hd.suffix.SuffixStore`),
  built once per tokenizer into the cache dir.

S and L files record the tokenizer's identity; loading one with another tokenizer is a
:class:`StoreFileError` naming the file and the field. This module builds nothing (see
:mod:`moelab.make.hd_stores`), so it imports neither models nor decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from moelab._validate import check_int
from moelab.datasets import repo_root
from moelab.hd.identity import store_meta, tokenizer_identity
from moelab.hd.ngram import NGramTable, StoreFileError
from moelab.hd.suffix import L_MAX_TOKENS, SuffixStore, load_sharegpt_suffix_store

STORE_KINDS = {"S": "model", "L": "statistics"}


class Store(Protocol):
    """Anything HD can draft from."""

    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]: ...


def match_length(store: Store, context: Sequence[int]) -> int:
    """How many of ``context``'s last tokens ``store``'s answer matched (its ``match_length`` method), or 0
    for a store that does not say (one confidence class for all its answers)."""
    f = getattr(store, "match_length", None)
    return int(f(context)) if f is not None else 0


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
        # key -> its continuations, most recent first (a short plain list: cheaper than an ordered dict)
        self._table: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.extend(prompt)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens; every n-gram that becomes complete is (re)inserted as most recent."""
        toks = self.tokens
        start = len(toks)
        toks.extend(map(int, new_tokens))
        L = self.length
        table, per_key, key_lengths = self._table, self.per_key, self.key_lengths
        longest = key_lengths[0]
        for end in range(max(start, L), len(toks)):  # `end` = last token of a continuation
            kend = end - L + 1  # keys end just before the continuation
            if kend < longest:  # the first tokens of a request: only the keys that fit
                cont = tuple(toks[kend:end + 1])
                for m in key_lengths:
                    if kend >= m:
                        self._insert(tuple(toks[kend - m:kend]), cont)
                continue
            # one tuple of the longest key and the continuation, which every key and the continuation are
            # slices of (one list slice per n-gram, not one per key); the insertion inline (the per-step path)
            win = tuple(toks[kend - longest:end + 1])
            cont = win[longest:]
            for m in key_lengths:
                key = win[longest - m:longest]
                bucket = table.get(key)
                if bucket is None:
                    table[key] = [cont]
                elif bucket[0] != cont:  # (already the most recent: nothing to do)
                    if cont in bucket:
                        bucket.remove(cont)
                    elif len(bucket) >= per_key:
                        bucket.pop()  # evict the least recently seen
                    bucket.insert(0, cont)

    def _insert(self, key: tuple[int, ...], cont: tuple[int, ...]) -> None:
        """Make ``cont`` the most recent continuation of ``key`` (evicting the least recent beyond ``per_key``)."""
        bucket = self._table.get(key)
        if bucket is None:
            self._table[key] = [cont]
        elif bucket[0] != cont:  # (already the most recent: nothing to do)
            if cont in bucket:
                bucket.remove(cont)
            elif len(bucket) >= self.per_key:
                bucket.pop()  # evict the least recently seen
            bucket.insert(0, cont)

    def match_length(self, context: Sequence[int]) -> int:
        """The longest key length whose key (``context``'s last tokens) has continuations; 0 if none. A
        drafter's confidence signal: a continuation after a longer key is accepted far more often."""
        n = len(context)
        table = self._table
        for m in self.key_lengths:
            if n >= m and table.get(tuple(context[n - m:])):
                return m
        return 0

    def lookup_matched(self, context: Sequence[int], k: int = 7) -> tuple[list[tuple[int, ...]], int]:
        """``(lookup(context, k), match_length(context))`` in one pass over the keys.

        A drafter asks for both on every step; both probe the same keys (the longest key with continuations
        is the match length, and its continuations come first), so one pass halves the probes.

        Parameters
        ----------
        context : sequence of int
            The tokens so far (only the last ``max(key_lengths)`` are read).
        k : int
            Continuations wanted at most.

        Returns
        -------
        candidates : list of tuple of int
            What :meth:`lookup` returns.
        match_length : int
            What :meth:`match_length` returns (0 when there is no candidate).
        """
        out: list[tuple[int, ...]] | None = None
        matched = 0
        n = len(context)
        table = self._table
        for m in self.key_lengths:
            if n < m:
                continue
            bucket = table.get(tuple(context[n - m:]))
            if not bucket:
                continue
            if out is None:  # the longest key with continuations: the match length (as in lookup)
                matched = m
                out = bucket[:max(k, 1)]
                if len(out) >= k:
                    return out, matched
                continue
            for c in bucket:
                if c not in out:
                    out.append(c)
                    if len(out) >= k:
                        return out, matched
        return ([], 0) if out is None else (out, matched)

    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]:
        """Up to ``k`` continuations of ``context``'s last tokens (longest key first, most recent first)."""
        return self.lookup_matched(context, k)[0]  # one walk over the keys (the drafter calls lookup_matched)


def default_store_path(kind: str) -> Path:
    """The shipped S (``"model"``) store for the default target, SmolLM2-135M-Instruct."""
    letter = {"model": "S", "statistics": "L"}.get(kind)
    if letter is None:
        raise ValueError(f"kind must be one of ['model', 'statistics']; got {kind!r}")
    return repo_root() / "data" / "hd" / f"smollm2-135m-instruct.{letter}.npz"


def default_model_store_path() -> Path:
    """The shipped S store for the default target (SmolLM2-135M-Instruct)."""
    return default_store_path("model")


def load_store(path: str | Path, tokenizer: Any, kind: str | None = None) -> NGramTable:
    """Load an S (n-gram table) file, checking it was built for ``tokenizer`` (``kind`` in {"model", "statistics"})."""
    return NGramTable.load(path, expect_tokenizer=tokenizer_identity(tokenizer), expect_kind=kind)


def load_default_model_store(tokenizer: Any) -> NGramTable:
    """The shipped S store (``data/hd/``, the model's own n-gram table, built for SmolLM2-135M-Instruct).

    It is read as shipped: there is no ``rebuild`` or ``max_tokens`` here (building S runs the model;
    ``moelab build-hd-stores --stores S [--model NAME]`` does it).

    Parameters
    ----------
    tokenizer : tokenizer
        The target's tokenizer; it must be the one the store was built for (checked by its identity).

    Returns
    -------
    NGramTable
        The S store.

    Raises
    ------
    FileNotFoundError
        When the shipped file is missing (the message says how to rebuild it).
    StoreFileError
        When the file does not belong to ``tokenizer`` (or is damaged), saying how to build one for it.
    """
    path = default_model_store_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; rebuild it with `moelab build-hd-stores --stores S`")
    try:
        return load_store(path, tokenizer, "model")
    except StoreFileError as exc:
        raise StoreFileError(exc.path, exc.field, f"{exc.problem}. The shipped S store belongs to "
                             "SmolLM2-135M-Instruct; for another target build one with "
                             "`moelab build-hd-stores --stores S --model <name>`") from None


def load_default_statistics_store(tokenizer: Any, *, rebuild: bool = False, max_tokens: int | None = None) -> SuffixStore:
    """L for ``tokenizer``: REST's suffix index over ShareGPT (cached; built once, about a minute on 2 cores).

    Parameters
    ----------
    tokenizer : tokenizer
        The target's tokenizer: ShareGPT's conversations are tokenized with it, and the cached file is
        keyed by its identity (a store of another tokenizer is never read).
    rebuild : bool
        Build the index again even if its cached file exists (and overwrite that file); default False reads
        the cache when it is there and builds it only the first time.
    max_tokens : int, optional
        How many ShareGPT tokens to index, from the start of the corpus (default ``None``, as is 0:
        :data:`moelab.hd.suffix.L_MAX_TOKENS`, 8 million). Fewer build faster and smaller but find fewer
        continuations; each value is its own cached file.

    Returns
    -------
    SuffixStore
        The L store.
    """
    return load_sharegpt_suffix_store(tokenizer, max_tokens=max_tokens or L_MAX_TOKENS, rebuild=rebuild)


__all__ = ["STORE_KINDS", "ContextStore", "Store", "StoreFileError", "default_model_store_path", "default_store_path",
           "load_default_model_store", "load_default_statistics_store", "load_store", "match_length", "store_meta",
           "tokenizer_identity"]
