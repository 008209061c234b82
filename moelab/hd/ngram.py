"""A frequency-ranked n-gram table: key (the last 1..m tokens) -> the most frequent continuations.

This is the data structure behind the model store S and the statistics store L. It is built with
vectorised numpy (sliding windows, ``np.unique`` over rows, one lexsort) and answers a lookup from a memo
per context tail, or else with one compiled call (:mod:`moelab.hd._ngram_jit`: one hash probe per key
length), so querying costs a few microseconds whatever the corpus size. Files are a
pickle-free ``.npz`` plus metadata that records the tokenizer's identity; loading a table built with a
different tokenizer (or a file that is not a table) raises ``ValueError``.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from moelab._io import FileFormatError, atomic_save_npz, load_npz, loads_json
from moelab._validate import check_int, check_token_array, token_tuple

FORMAT = "moelab.hd.ngram/1"
_SHIFT = 21  # packed key = t0 << 21 | t1: vocabularies up to 2M tokens


_MAX_ID = 1 << _SHIFT
_ALL = 1 << 30  # "every continuation" as a lookup size


def _pack_rows(keys: np.ndarray) -> np.ndarray:
    out = np.zeros(keys.shape[0], dtype=np.int64)
    for j in range(keys.shape[1]):
        out = (out << _SHIFT) | keys[:, j].astype(np.int64)
    return out


def token_documents(name: str, documents: Any) -> list[np.ndarray]:
    """``documents`` (token-id sequences) as flat int64 arrays: integer dtypes only, so a float id is refused
    rather than truncated to another token (``np.asarray(d, dtype=np.int64)`` did that), and a scalar or a
    string is named rather than a bare ``TypeError``."""
    if isinstance(documents, (str, bytes, dict)) or not isinstance(documents, Iterable):
        raise ValueError(f"{name} must be a list of token-id sequences; got {type(documents).__name__} "
                         f"{documents!r:.60}")
    out = []
    for i, d in enumerate(documents):
        if isinstance(d, np.ndarray):
            d = d.ravel()
        elif not isinstance(d, (list, tuple, range)):
            raise ValueError(f"{name}[{i}] must be a sequence of token ids; got {type(d).__name__} {d!r:.40}")
        out.append(check_token_array(f"{name}[{i}]", d))
    return out


class _Compiled(NamedTuple):
    """An :class:`NGramTable`'s arrays for :func:`moelab.hd._ngram_jit.lookup` (see its parameters)."""

    lookup: Any
    meta: np.ndarray
    slots: np.ndarray
    conts: np.ndarray


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
        self._compiled: _Compiled | None = None  # the compiled lookup's arrays (see _compile)
        self._max_m = max(self.tables, default=1)
        # tail -> (its first continuations, ranked; whether they are all of them): see lookup
        self._answers: dict[tuple[int, ...], tuple[list[tuple[int, ...]], bool]] = {}
        # m -> (a flat memoryview of its continuation table, values per key row, values per continuation), or
        # None: a key row's continuations are read without numpy (its per-call dispatch costs several
        # microseconds per lookup, far more with cold caches, as in an engine between two forwards); native
        # integer tables only, others take numpy's path
        self._flat: dict[int, tuple[memoryview, int, int] | None] = {
            m: (memoryview(c.reshape(-1)), c.shape[1] * c.shape[2], c.shape[2])
            if isinstance(c, np.ndarray) and c.ndim == 3 and c.dtype.kind in "iu" and c.dtype.isnative
            and c.flags.c_contiguous and c.shape[2] else None
            for m, (_, c, _) in self.tables.items()}

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, sequences: Iterable[Sequence[int] | np.ndarray], *, key_lengths: Sequence[int] = (1, 2),
              length: int = 4, per_key: int = 7, min_count: int = 1, max_ngrams: int | None = None,
              per_document: bool = False, meta: dict[str, Any] | None = None) -> NGramTable:
        """Count every (key + continuation) window of every sequence (windows never cross sequences).

        Parameters
        ----------
        sequences : iterable of token-id sequences
            The documents to count (lists or 1-d integer arrays of token ids).
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
        per_document : bool
            Count an n-gram at most once per sequence (document frequency, as the paper's S store does),
            so one repetitive output cannot dominate the ranking.
        """
        key_lengths = sorted({check_int("key_lengths entry", m, low=1, high=3) for m in key_lengths})
        if not key_lengths:
            raise ValueError("key_lengths must name at least one key length in [1, 3]")
        check_int("length", length, low=1, high=64)
        check_int("per_key", per_key, low=1)
        check_int("min_count", min_count, low=1)
        if max_ngrams is not None:
            check_int("max_ngrams", max_ngrams, low=1)
        vocab = ((meta or {}).get("tokenizer") or {}).get("vocab_size")
        if vocab is not None and int(vocab) > _MAX_ID:
            raise ValueError(f"tokenizer vocab_size {vocab} is larger than the {_MAX_ID} token ids an n-gram table "
                             "packs (21 bits per token); use moelab.hd.suffix.SuffixStore for this tokenizer")
        seqs = token_documents("sequences", sequences)
        if any(s.size and (s.min() < 0 or s.max() >= _MAX_ID) for s in seqs):
            raise ValueError(f"sequences must hold token ids in [0, {_MAX_ID}) (21 bits per token)")
        tables = {}
        for m in key_lengths:
            w = m + length
            parts = [np.lib.stride_tricks.sliding_window_view(s, w) for s in seqs if s.size >= w]
            if per_document:
                parts = [np.unique(p.astype(np.int32), axis=0) for p in parts]
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
                "per_document": bool(per_document),
                "tokens": int(sum(s.size for s in seqs)), "sequences": len(seqs)}
        return cls(length, tables, {**info, **(meta or {})})

    # ------------------------------------------------------------------ query
    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]:
        """Up to ``k`` distinct continuations of ``context``: longest matching key first, most frequent first.

        The answer depends only on the last ``max(key lengths)`` tokens, and the answer for ``k`` is the
        first ``k`` of the full answer (every distinct continuation, in that order), so answers are memoised
        per tail (bounded: cleared when it reaches 65,536 entries): a repeated tail costs one dict probe. A
        tail is answered as far as asked (a chain asks for one continuation, and the first key often holds
        enough): its entry serves every later ``k`` up to its length, and is completed when a caller asks
        for more."""
        n = len(context)
        try:  # token_tuple's conversion, inline (the hot path); a float id is refused, not truncated
            tail = tuple(map(operator.index, context[max(0, n - self._max_m):]))
        except TypeError:
            tail = token_tuple("context", context[max(0, n - self._max_m):])  # raises, naming the context
        answers = self._answers
        hit = answers.get(tail)  # (the first continuations, whether that is all of them)
        if hit is not None and (hit[1] or 1 <= k <= len(hit[0])):
            return hit[0][:k]
        if k < 1 and hit is None:
            return self._lookup(tail, k)
        ask = k if k >= 1 else _ALL  # (k < 1 with a partial entry: its full answer, sliced as before)
        got = self._lookup(tail, ask)
        if hit is None and len(answers) >= 65_536:
            answers.clear()
        answers[tail] = (got, len(got) < ask)
        return got[:k]

    def _lookup(self, context: Sequence[int], k: int) -> list[tuple[int, ...]]:
        """:meth:`_lookup_py`'s answer for the tail ``context`` (at most ``max_key_length`` ids), compiled for
        ``k >= 1`` (:mod:`moelab.hd._ngram_jit`: a memo miss reads two int64 arrays per key length instead of a
        dozen dicts, lists and tuples, each a likely cache miss in an engine between two forwards)."""
        if k < 1:  # (a slice with k <= 0 keeps Python's semantics, negative k included)
            return self._lookup_py(context, k)
        c = self._compiled if self._compiled is not None else self._compile()
        got = c.lookup(np.array([t if 0 <= t < _MAX_ID else -1 for t in context], dtype=np.int64), c.meta, c.slots,
                       c.conts, self.length, k)
        # one row per continuation: its length, then its tokens
        return [tuple(r[1:r[0] + 1]) for r in got.tolist()]

    def _compile(self) -> _Compiled:
        """The compiled lookup's arrays (built on the first lookup: a table that is only saved never pays)."""
        # lazy: numba is loaded (compiled, on a fresh cache) at the first query, not when moelab.hd is imported
        from moelab.hd import _ngram_jit

        meta, slots, conts = [], [], []
        n_slots = n_cells = 0
        for m, (k, c, _) in self.tables.items():  # longest key first, as the Python lookup walks them
            packed = _pack_rows(k)
            b = max(4, int(2 * max(1, packed.size)).bit_length())  # at most half full: short probe runs
            slots.append(_ngram_jit.build_table(packed, b))
            conts.append(np.asarray(c).reshape(-1))
            meta += [m, b, n_slots, n_cells, c.shape[1]]
            n_slots += 1 << b
            n_cells += conts[-1].size
        flat = np.concatenate(conts).astype(np.int64) if conts else np.zeros(0, np.int64)
        if not flat.size or (flat.min() >= -1 and flat.max() < _MAX_ID):  # (ids and -1 padding: int32 holds them)
            flat = flat.astype(np.int32)
        self._compiled = _Compiled(_ngram_jit.lookup, np.array(meta, dtype=np.int64), np.concatenate(slots), flat)
        return self._compiled

    def _lookup_py(self, context: Sequence[int], k: int) -> list[tuple[int, ...]]:
        """The lookup in Python over the dict index (any ``k``; the reference of the compiled one)."""
        out: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] | None = None  # out's members, once a second key length merges into it
        n = len(context)
        memo = self._memo
        for m, index in self._index.items():
            if n < m:
                continue
            # the last m tokens packed (as _pack_rows packs the stored keys), or -1 for an id outside
            # [0, 2**21): such ids are refused at build time, so no stored key matches (packing it would
            # collide with another key)
            key = 0
            for t in context[n - m:]:
                if t < 0 or t >= _MAX_ID:
                    key = -1
                    break
                key = (key << _SHIFT) | t
            row = index.get(key)
            if row is None:
                continue
            cands = memo.get((m, row))
            if cands is None:
                cands = memo[(m, row)] = self._row_candidates(m, row)
            if not out:  # the longest key's continuations are distinct already
                out = cands[:k]
                if len(out) >= k:
                    return out
                continue
            if seen is None:
                seen = set(out)
            for c in cands:
                if c not in seen:
                    seen.add(c)
                    out.append(c)
                    if len(out) >= k:
                        return out
        return out

    def _row_candidates(self, m: int, row: int) -> list[tuple[int, ...]]:
        """The continuations of key row ``row`` of length ``m``: distinct, in rank order, -1 padding dropped
        (a foreign file may repeat rows or pad inside one)."""
        flat = self._flat.get(m)
        if flat is None:
            rows = self.tables[m][1][row].tolist()
        else:
            mv, width, length = flat
            values = mv[row * width:(row + 1) * width].tolist()
            rows = [values[i:i + length] for i in range(0, width, length)]
        cands = [tuple(c) if min(c) >= 0 else tuple([t for t in c if t >= 0]) for c in rows if c[0] >= 0]
        return list(dict.fromkeys(cands))

    @property
    def max_key_length(self) -> int:
        """The longest key: a lookup reads at most this many of the context's last tokens."""
        return self._max_m

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
             expect_kind: str | None = None, max_bytes: int = 256 << 20) -> NGramTable:
        """Read a table written by :meth:`save`.

        The file is size-checked before anything is inflated (``max_bytes``: all arrays together), then
        its format, metadata, array dtypes and shapes, kind and tokenizer identity are checked; any
        problem is a :class:`StoreFileError` naming the file and the field."""
        z = load_store_npz(path, required=("format", "meta", "length"), max_bytes=max_bytes)
        return cls._from_arrays(path, z, expect_tokenizer, expect_kind)

    @classmethod
    def _from_arrays(cls, path: str | Path, z: dict[str, np.ndarray], expect_tokenizer: dict[str, Any] | None,
                     expect_kind: str | None) -> NGramTable:
        if z["format"].shape != () or str(z["format"]) != FORMAT:
            raise StoreFileError(path, "format", f"is not a moelab HD n-gram store (format {FORMAT!r} expected)")
        meta = read_store_meta(path, z, expect_tokenizer, expect_kind)
        if z["length"].shape != () or z["length"].dtype.kind not in "iu" or not 1 <= int(z["length"]) <= 64:
            raise StoreFileError(path, "length", "must be one integer in [1, 64]")
        length = int(z["length"])
        vocab, vocab_name = _MAX_ID, "the table's id limit"
        declared = (meta.get("tokenizer") or {}).get("vocab_size") if isinstance(meta.get("tokenizer"), dict) else None
        if declared is not None:
            if isinstance(declared, bool) or not isinstance(declared, int) or not 1 <= declared <= _MAX_ID:
                raise StoreFileError(path, "meta.tokenizer.vocab_size", f"must be an integer in [1, {_MAX_ID}]; "
                                                                        f"got {declared!r}")
            vocab, vocab_name = declared, "meta.tokenizer.vocab_size"
        tables = {}
        for key in z:
            if not key.startswith("keys"):
                continue
            m = int(key[4:]) if key[4:].isdigit() else -1
            if m not in (1, 2, 3):
                raise StoreFileError(path, key, "key length must be 1, 2 or 3")
            for name in (f"conts{m}", f"counts{m}"):
                if name not in z:
                    raise StoreFileError(path, name, "is missing")
            keys, conts, counts = z[f"keys{m}"], z[f"conts{m}"], z[f"counts{m}"]
            for name, arr in ((f"keys{m}", keys), (f"conts{m}", conts), (f"counts{m}", counts)):
                if arr.dtype.kind not in "iu":
                    raise StoreFileError(path, name, f"must hold integers; has dtype {arr.dtype}")
            k = keys.shape[0] if keys.ndim == 2 else -1
            if keys.shape != (k, m) or conts.ndim != 3 or conts.shape[0] != k or conts.shape[2] != length \
                    or counts.shape != conts.shape[:2]:
                raise StoreFileError(path, f"conts{m}", f"shapes disagree: keys {keys.shape}, conts {conts.shape}, "
                                                        f"counts {counts.shape}, length {length}")
            if keys.size and (keys.min() < 0 or keys.max() >= vocab):
                raise StoreFileError(path, f"keys{m}", f"token ids must be in [0, {vocab_name}={vocab})")
            # -1 pads a key's unused continuation slots; anything else outside the vocabulary would be
            # drafted and crash the decoder's embedding lookup later
            if conts.size and (conts.min() < -1 or conts.max() >= vocab):
                raise StoreFileError(path, f"conts{m}", f"continuation ids must be -1 (padding) or in "
                                                        f"[0, {vocab_name}={vocab}); got {conts.min()} .. {conts.max()}")
            tables[m] = (keys, conts, counts)
        if not tables:
            raise StoreFileError(path, "keys1", "the store has no key table")
        return cls(length, tables, meta)


class StoreFileError(FileFormatError):
    """An HD store file that cannot be used: corrupt, foreign, over budget, or built for another tokenizer.
    A ``ValueError``; ``path`` and ``field`` name the file and the array or metadata key at fault."""


def load_store_npz(path: str | Path, **kw: Any) -> dict[str, np.ndarray]:
    """:func:`moelab._io.load_npz` (sizes checked before anything is inflated) with its errors as
    :class:`StoreFileError`."""
    try:
        return load_npz(path, **kw)
    except StoreFileError:
        raise
    except FileFormatError as exc:
        raise StoreFileError(exc.path, exc.field, exc.problem) from None


def read_store_meta(path: str | Path, z: dict[str, np.ndarray], expect_tokenizer: dict[str, Any] | None,
                    expect_kind: str | None) -> dict[str, Any]:
    """The JSON metadata of a store file, checked for kind and tokenizer (shared by every store format)."""
    if "meta" not in z or z["meta"].shape != () or z["meta"].dtype.kind not in "US":
        raise StoreFileError(path, "meta", "is not a JSON object")
    try:
        meta = loads_json(str(z["meta"]), path=path)
    except FileFormatError as exc:
        raise StoreFileError(path, "meta", exc.problem) from None
    if not isinstance(meta, dict):
        raise StoreFileError(path, "meta", "is not a JSON object")
    if expect_kind is not None and meta.get("kind") != expect_kind:
        raise StoreFileError(path, "meta.kind", f"holds a {meta.get('kind')!r} store, not a {expect_kind!r} store")
    if expect_tokenizer is not None:
        have = meta.get("tokenizer") or {}
        if not isinstance(have, dict) or have.get("sha256") != expect_tokenizer.get("sha256"):
            have = have if isinstance(have, dict) else {}
            raise StoreFileError(
                path, "meta.tokenizer",
                f"was built for tokenizer {have.get('name')!r} (vocab {have.get('vocab_size')}, sha256 "
                f"{str(have.get('sha256'))[:12]}), not for {expect_tokenizer.get('name')!r} (sha256 "
                f"{str(expect_tokenizer.get('sha256'))[:12]}); rebuild it for this tokenizer "
                "(`moelab build-hd-stores`)")
    return meta


__all__ = ["FORMAT", "NGramTable", "StoreFileError", "load_store_npz", "read_store_meta"]
