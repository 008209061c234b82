"""A frequency-ranked n-gram table: key (the last 1..m tokens) -> the most frequent continuations.

This is the data structure behind the model store S and the statistics store L. It is built with
vectorised numpy (sliding windows, ``np.unique`` over rows, one lexsort) and answers a lookup with one
dict probe per key length, so querying costs a few microseconds whatever the corpus size. Files are a
pickle-free ``.npz`` plus metadata that records the tokenizer's identity; loading a table built with a
different tokenizer (or a file that is not a table) raises ``ValueError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_save_npz, load_npz
from moelab._validate import check_int

FORMAT = "moelab.hd.ngram/1"
_SHIFT = 21  # packed key = t0 << 21 | t1: vocabularies up to 2M tokens


def _pack(key: Sequence[int]) -> int:
    out = 0
    for t in key:
        out = (out << _SHIFT) | int(t)
    return out


def _pack_rows(keys: np.ndarray) -> np.ndarray:
    out = np.zeros(keys.shape[0], dtype=np.int64)
    for j in range(keys.shape[1]):
        out = (out << _SHIFT) | keys[:, j].astype(np.int64)
    return out


class NGramTable:
    """Key -> top continuations, for several key lengths (longest key is tried first).

    Parameters
    ----------
    length : int
        Continuation length (tokens after the key).
    tables : dict
        ``m -> (keys [K, m], conts [K, G, length] padded with -1, counts [K, G])`` per key length ``m``.
    meta : dict
        Free-form metadata (kind, tokenizer identity, build parameters, source description).
    """

    def __init__(self, length: int, tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
                 meta: dict[str, Any] | None = None) -> None:
        self.length = check_int("length", length, low=1)
        self.tables = dict(sorted(tables.items(), reverse=True))
        self.meta = dict(meta or {})
        self._index = {m: dict(zip(_pack_rows(k).tolist(), range(k.shape[0]))) for m, (k, _, _) in self.tables.items()}
        self._memo: dict[tuple[int, int], list[tuple[int, ...]]] = {}

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, sequences: Iterable[Sequence[int] | np.ndarray], *, key_lengths: Sequence[int] = (1, 2),
              length: int = 4, per_key: int = 7, min_count: int = 1, max_ngrams: int | None = None,
              meta: dict[str, Any] | None = None) -> NGramTable:
        """Count every (key + continuation) window of every sequence (windows never cross sequences).

        Parameters
        ----------
        sequences : iterable of token-id sequences
        key_lengths : sequence of int
            Key lengths to index (e.g. ``(1, 2)``: look up with the last 2 tokens, then the last one).
        length : int
            Continuation length stored per n-gram.
        per_key : int
            Continuations kept per key, most frequent first.
        min_count : int
            Drop n-grams seen fewer times.
        max_ngrams : int, optional
            Keep only the most frequent ``max_ngrams`` n-grams per key length (the paper's 100k 5-grams).
        """
        key_lengths = sorted({check_int("key_lengths entry", m, low=1, high=3) for m in key_lengths})
        if not key_lengths:
            raise ValueError("key_lengths must name at least one key length in [1, 3]")
        check_int("length", length, low=1, high=64)
        check_int("per_key", per_key, low=1)
        check_int("min_count", min_count, low=1)
        if max_ngrams is not None:
            check_int("max_ngrams", max_ngrams, low=1)
        seqs = [np.asarray(s, dtype=np.int64).ravel() for s in sequences]
        if any(s.size and (s.min() < 0 or s.max() >= 1 << _SHIFT) for s in seqs):
            raise ValueError(f"sequences must hold token ids in [0, {1 << _SHIFT})")
        tables = {}
        for m in key_lengths:
            w = m + length
            parts = [np.lib.stride_tricks.sliding_window_view(s, w) for s in seqs if s.size >= w]
            if not parts:
                tables[m] = (np.zeros((0, m), np.int32), np.zeros((0, per_key, length), np.int32),
                             np.zeros((0, per_key), np.int32))
                continue
            rows, counts = np.unique(np.concatenate(parts).astype(np.int32), axis=0, return_counts=True)
            keep = counts >= min_count
            rows, counts = rows[keep], counts[keep]
            if max_ngrams is not None and rows.shape[0] > max_ngrams:
                top = np.argsort(-counts, kind="stable")[:max_ngrams]
                rows, counts = rows[top], counts[top]
            # sort by key, then count descending: each key's continuations become a ranked run
            order = np.lexsort((-counts, *[rows[:, j] for j in range(m - 1, -1, -1)]))
            rows, counts = rows[order], counts[order]
            new_key = np.ones(rows.shape[0], dtype=bool)
            new_key[1:] = np.any(rows[1:, :m] != rows[:-1, :m], axis=1)
            gid = np.cumsum(new_key) - 1
            starts = np.flatnonzero(new_key)
            rank = np.arange(rows.shape[0]) - starts[gid]
            sel = rank < per_key
            k = int(new_key.sum())
            conts = np.full((k, per_key, length), -1, dtype=np.int32)
            cnt = np.zeros((k, per_key), dtype=np.int32)
            conts[gid[sel], rank[sel]] = rows[sel, m:]
            cnt[gid[sel], rank[sel]] = counts[sel]
            tables[m] = (rows[starts, :m].astype(np.int32), conts, cnt)
        info = {"key_lengths": key_lengths, "per_key": per_key, "min_count": min_count, "max_ngrams": max_ngrams,
                "tokens": int(sum(s.size for s in seqs)), "sequences": len(seqs)}
        return cls(length, tables, {**info, **(meta or {})})

    # ------------------------------------------------------------------ query
    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]:
        """Up to ``k`` distinct continuations of ``context``: longest matching key first, most frequent first."""
        out: list[tuple[int, ...]] = []
        n = len(context)
        for m, index in self._index.items():
            if n < m:
                continue
            row = index.get(_pack(context[n - m:]))
            if row is None:
                continue
            cands = self._memo.get((m, row))
            if cands is None:
                cands = [tuple(t for t in c if t >= 0) for c in self.tables[m][1][row].tolist() if c[0] >= 0]
                self._memo[(m, row)] = cands
            for c in cands:
                if c not in out:
                    out.append(c)
                    if len(out) >= k:
                        return out
        return out

    @property
    def n_keys(self) -> int:
        return int(sum(t[0].shape[0] for t in self.tables.values()))

    @property
    def n_ngrams(self) -> int:
        return int(sum(int((t[2] > 0).sum()) for t in self.tables.values()))

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the table atomically as a pickle-free ``.npz`` (metadata as a JSON string inside)."""
        arrays: dict[str, np.ndarray] = {"format": np.array(FORMAT), "meta": np.array(json.dumps(self.meta)),
                                         "length": np.array(self.length)}
        for m, (keys, conts, counts) in self.tables.items():
            arrays[f"keys{m}"], arrays[f"conts{m}"], arrays[f"counts{m}"] = keys, conts, counts
        return atomic_save_npz(path, **arrays)

    @classmethod
    def load(cls, path: str | Path, *, expect_tokenizer: dict[str, Any] | None = None,
             expect_kind: str | None = None) -> NGramTable:
        """Read a table written by :meth:`save`; checks the format, kind and tokenizer identity."""
        z = load_npz(path)
        if "format" not in z or str(z["format"]) != FORMAT:
            raise ValueError(f"{path} is not a moelab HD n-gram store (format {FORMAT!r} expected)")
        meta = json.loads(str(z["meta"]))
        if expect_kind is not None and meta.get("kind") != expect_kind:
            raise ValueError(f"{path} holds a {meta.get('kind')!r} store, not a {expect_kind!r} store")
        if expect_tokenizer is not None:
            have = meta.get("tokenizer") or {}
            if have.get("sha256") != expect_tokenizer.get("sha256"):
                raise ValueError(
                    f"{path} was built for tokenizer {have.get('name')!r} (vocab {have.get('vocab_size')}, "
                    f"sha256 {str(have.get('sha256'))[:12]}), not for {expect_tokenizer.get('name')!r} "
                    f"(sha256 {str(expect_tokenizer.get('sha256'))[:12]}); rebuild it for this tokenizer")
        tables = {}
        for key in z:
            if key.startswith("keys"):
                m = int(key[4:])
                tables[m] = (z[f"keys{m}"], z[f"conts{m}"], z[f"counts{m}"])
        return cls(int(z["length"]), tables, meta)


__all__ = ["FORMAT", "NGramTable"]
