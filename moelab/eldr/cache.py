"""Signature cache co-indexed with a prefix-caching KV cache.

Every KV block carries the expert histogram ``[L, E]`` of the prompt tokens it holds (small
unsigned ints). A request's block table lists its blocks; its signature counts are the SUM over all
of them — cached blocks included — so with prefix caching (prefill computes only the uncached
suffix) the signature still equals what a full prefill gives.

Like vLLM's prefix caching: only FULL blocks are shareable, keyed by a SHA-256 chain over the
prompt's token blocks (a block's key covers every token before it); a request's partial last block
is private. Blocks whose reference count drops to zero stay cached and are evicted least-recently
used first when a new block is needed.

Requests are admitted from per-token routing ids (:meth:`SignatureCache.admit`) or, when only block
histograms are kept (bounded memory), from per-block histograms (:meth:`SignatureCache.admit_blocks`);
both share, evict and validate the same way.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from moelab._validate import _as_array, check_array, check_int, check_product
from moelab.traces import expert_counts
from moelab.traces.expert import MAX_EXPERTS, MAX_LAYERS

#: most KV blocks one cache holds: the free list keeps one Python int per block (4M blocks: ~150 MB), and
#: 4M blocks of 16 tokens are 64M tokens, far beyond one prefill tier's KV cache
MAX_CACHE_BLOCKS = 1 << 22
#: most histogram cells (blocks x layers x experts) one cache allocates up front: 512 MiB of uint16 counts
#: (e.g. 43k blocks of Qwen3-30B-A3B's 48 x 128 experts; the notebooks use 4096)
MAX_CACHE_CELLS = 1 << 28


@dataclass(frozen=True)
class Admission:
    """Outcome of admitting one request: its block table, and how many prompt tokens were served
    from cache vs computed (only the computed tokens' routing ids were read)."""

    blocks: tuple[int, ...]
    cached_tokens: int
    computed_tokens: int


def _token_ids(prompt_tokens: np.ndarray) -> np.ndarray:
    """Token ids as int64; float, boolean or negative ids are refused (never truncated)."""
    arr = check_array("prompt_tokens", prompt_tokens, ndim=1)
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"prompt_tokens must be integer token ids; got dtype {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"prompt_tokens must be >= 0; got minimum {arr.min()}")
    return arr.astype(np.int64)


class SignatureCache:
    """Per-KV-block expert histograms with block tables, prefix reuse and LRU eviction.

    Parameters
    ----------
    block_size : int
        Tokens per KV block (>= 1).
    num_layers, num_experts : int
        Geometry of the histograms.
    capacity_blocks : int
        KV blocks available, in ``[1, MAX_CACHE_BLOCKS]``. The histogram cells, ``capacity_blocks`` times
        ``num_layers`` times ``num_experts`` of them, are allocated up front: at most :data:`MAX_CACHE_CELLS`.
    """

    def __init__(self, block_size: int, num_layers: int, num_experts: int, capacity_blocks: int) -> None:
        self.block_size = check_int("block_size", block_size, low=1)
        self.num_layers = check_int("num_layers", num_layers, low=1, high=MAX_LAYERS, high_name="MAX_LAYERS")
        self.num_experts = check_int("num_experts", num_experts, low=1, high=MAX_EXPERTS, high_name="MAX_EXPERTS")
        self.capacity = check_int("capacity_blocks", capacity_blocks, low=1, high=MAX_CACHE_BLOCKS,
                                  high_name="MAX_CACHE_BLOCKS", why="the free list holds one entry per block")
        # checked before the allocation below: a huge capacity used to end in a MemoryError (11 TiB asked)
        check_product(("capacity_blocks", "num_layers", "num_experts"),
                      (self.capacity, self.num_layers, self.num_experts), cap=MAX_CACHE_CELLS,
                      cap_name="MAX_CACHE_CELLS", why="the histograms of every block are allocated up front")
        dtype = np.uint16 if self.block_size < np.iinfo(np.uint16).max else np.uint32  # an expert counts <= block_size
        self.hist = np.zeros((self.capacity, self.num_layers, self.num_experts), dtype=dtype)
        self.refcount = np.zeros(self.capacity, dtype=np.int64)
        self._free = list(range(self.capacity - 1, -1, -1))
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.tables: dict[str, tuple[int, ...]] = {}
        self.hits = 0
        self.evictions = 0

    # ------------------------------------------------------------------ internals
    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        if not self._evictable:
            raise RuntimeError(f"KV cache full: all {self.capacity} blocks are referenced by running requests")
        b, _ = self._evictable.popitem(last=False)
        del self._block_of[self._key_of.pop(b)]
        self.evictions += 1
        return b

    def _ref(self, b: int) -> None:
        self.refcount[b] += 1
        self._evictable.pop(b, None)

    def _keys(self, tokens: np.ndarray) -> list[bytes]:
        bs, keys, h = self.block_size, [], hashlib.sha256()
        for i in range(tokens.size // bs):
            h.update(tokens[i * bs:(i + 1) * bs].tobytes())
            keys.append(h.copy().digest())
        return keys

    # ------------------------------------------------------------------ API
    def lookup(self, prompt_tokens: np.ndarray) -> int:
        """Prompt tokens a prefix-cache hit would serve right now (no side effects)."""
        tokens = _token_ids(prompt_tokens)
        hit = 0
        for key in self._keys(tokens):
            if key not in self._block_of:
                break
            hit += 1
        return hit * self.block_size

    def admit(self, request_id: str, prompt_tokens: np.ndarray, prefill_ids: np.ndarray) -> Admission:
        """Admit a request: reuse cached full blocks of its prefix, compute the rest.

        ``prefill_ids`` [P, L, k] are the routing ids a full prefill would produce; only the rows of
        the uncached suffix are read (that is all a prefix-cached prefill computes)."""
        self._check_new(request_id)
        tokens = _token_ids(prompt_tokens)
        ids = _as_array("prefill_ids", prefill_ids, what="an array of expert ids [P, L, k]")
        if ids.ndim != 3 or ids.shape[:2] != (tokens.size, self.num_layers):
            raise ValueError(f"prefill_ids must have shape (P={tokens.size}, L={self.num_layers}, k); got {ids.shape}")
        bs = self.block_size

        def block(i: int) -> np.ndarray:
            seg = ids[i * bs:(i + 1) * bs]
            if seg.size and (seg.min() < 0 or seg.max() >= self.num_experts):
                raise ValueError(f"prefill_ids must be expert ids in [0, {self.num_experts - 1}]")
            return expert_counts(seg, self.num_experts)

        return self._admit(request_id, tokens, block)

    def admit_blocks(self, request_id: str, prompt_tokens: np.ndarray, block_hists: np.ndarray) -> Admission:
        """:meth:`admit` from per-block expert histograms instead of per-token routing ids.

        ``block_hists`` [ceil(P / block_size), L, E]: row ``i`` counts the expert picks of prompt tokens
        ``[i * block_size, (i + 1) * block_size)`` (the last block may be partial). Same sharing,
        eviction and validation as :meth:`admit`: only the rows of the uncached suffix are read, and
        they must be integer counts that fit the cache's histograms."""
        self._check_new(request_id)
        tokens = _token_ids(prompt_tokens)
        h = _as_array("block_hists", block_hists, what="an array of integer counts [blocks, L, E]")
        n_blocks = -(-tokens.size // self.block_size)
        want = (n_blocks, self.num_layers, self.num_experts)
        if h.shape != want:
            raise ValueError(f"block_hists must have shape (ceil(P/block_size)={n_blocks}, L={self.num_layers}, "
                             f"E={self.num_experts}); got {h.shape}")
        if h.size and h.dtype.kind not in "iu":
            raise ValueError(f"block_hists must be integer counts; got dtype {h.dtype}")
        top = int(np.iinfo(self.hist.dtype).max)

        def block(i: int) -> np.ndarray:
            b = h[i]
            if b.min() < 0 or b.max() > top:
                raise ValueError(f"block_hists must be counts in [0, {top}]; block {i} has {b.min()} .. {b.max()}")
            return b

        return self._admit(request_id, tokens, block)

    @staticmethod
    def _check_id(request_id: object) -> str:
        # a request id is a dict key: an unhashable one used to end in a bare TypeError
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a string; got {type(request_id).__name__} {request_id!r:.60}")
        return request_id

    def _check_new(self, request_id: str) -> None:
        self._check_id(request_id)
        if request_id in self.tables:
            raise ValueError(f"request_id {request_id!r} is already admitted")

    def _admit(self, request_id: str, tokens: np.ndarray, block: Callable[[int], np.ndarray]) -> Admission:
        """Reuse the cached full-block prefix; compute (``block(i)``: the histogram of block i) the rest."""
        bs = self.block_size
        n_full = tokens.size // bs
        keys = self._keys(tokens)
        table: list[int] = []
        hit = 0
        while hit < n_full and keys[hit] in self._block_of:  # prefix reuse stops at the first miss
            b = self._block_of[keys[hit]]
            self._ref(b)
            table.append(b)
            hit += 1
        self.hits += hit
        try:
            for i in range(hit, -(-tokens.size // bs)):
                counts = block(i)
                b = self._alloc()
                self.hist[b] = counts
                self._ref(b)
                table.append(b)
                # Full blocks become shareable; the partial last block stays private. A full block whose
                # key is still cached elsewhere (its prefix was evicted first) stays private too: one key,
                # one block, so evicting either block never unregisters the other.
                if i < n_full and keys[i] not in self._block_of:
                    self._key_of[b] = keys[i]
                    self._block_of[keys[i]] = b
        except BaseException:
            self._release_blocks(table)
            raise
        self.tables[request_id] = tuple(table)
        return Admission(tuple(table), hit * bs, tokens.size - hit * bs)

    def _release_blocks(self, blocks: list[int] | tuple[int, ...]) -> None:
        # Tail first, as vLLM does: a prefix's later blocks are evicted before its earlier ones, so a
        # cached block chain never loses its head while keeping its tail.
        for b in reversed(blocks):
            self.refcount[b] -= 1
            if self.refcount[b] == 0:
                if b in self._key_of:
                    self._evictable[b] = None  # stays cached until evicted
                else:
                    self._free.append(b)

    def release(self, request_id: str) -> None:
        """The request finished: drop its references (shareable blocks stay cached, evictable)."""
        if self._check_id(request_id) not in self.tables:
            raise ValueError(f"request_id {request_id!r} is not admitted")
        self._release_blocks(self.tables.pop(request_id))

    def counts(self, request_id: str) -> np.ndarray:
        """The request's prefill expert counts ``[L, E]``: the sum over its block table."""
        if self._check_id(request_id) not in self.tables:
            raise ValueError(f"request_id {request_id!r} is not admitted")
        return self.hist[list(self.tables[request_id])].sum(axis=0, dtype=np.int64)

    @property
    def cached_blocks(self) -> int:
        """KV blocks holding a cached prompt prefix."""
        return len(self._block_of)

    @property
    def free_blocks(self) -> int:
        """KV blocks not in use."""
        return len(self._free) + len(self._evictable)


__all__ = ["MAX_CACHE_BLOCKS", "MAX_CACHE_CELLS", "Admission", "SignatureCache"]
