"""Shared-prefix conversation workloads, and request signatures built through the KV-block signature cache.

**Workload** (SYNTHETIC, :func:`generate_conversations`; the generative model of
:mod:`moelab.eldr.workload`, reusing its domain / sub-topic / request logits and its decode top-k).
Each domain has a system prompt of ``config.prefix_tokens`` fixed token ids. A conversation (domain and
sub-topic drawn as in :func:`~moelab.eldr.workload.generate`) has a geometric number of turns (mean
``turns_mean``, truncated at ``max_turns``); turn ``t``'s prompt is the system prompt, every earlier user
turn and assistant reply, and the new user turn, so real prefixes are shared across the requests of a
domain (the system prompt) and across the turns of a conversation (the whole history). One request per
turn; its decode tokens are the reply.

Routing (per prompt token ``j``, ``k`` expert picks per layer):

* system prompt tokens: the domain's logits ``a_d`` (fixed per domain, like ``generate``'s shared prefix);
* user turn ``t``: the conversation's request logits ``b_c`` (sub-topic + second-domain mix + request noise,
  ``generate``'s ``b_r``) plus per-turn noise ``s * turn_sigma * z_ct``;
* assistant reply ``t`` (read back in later prompts): its decode routing. The reply's decode ids are
  Gumbel top-k of turn ``t``'s decode logits (``generate``'s drift and within-request walk, exactly as in
  ``generate``); reply token ``j`` routes, when read back, like captured decode token ``j mod T`` — a
  causal model routes a token the same way whether it is decoded or prefilled, and the simulator
  replays the ``T`` captured decode tokens cyclically the same way.

Every prompt token's routing is drawn once, in token order, and every later prompt that repeats it
repeats its ids, so **a token's routing is a deterministic function of the prefix that ends at it**
(the system-prompt tokens fix the domain; the first user turn fixes the conversation): the same prefix
always gives the same KV-block histograms, as causal attention would. Approximation (stated): a system
prompt or user token's ``k`` picks per layer are ``k`` independent draws from the top-k inclusion
probabilities (``workload._inclusion``) rather than ``k`` distinct experts — the same
``Multinomial(P*k, pi)`` law ``generate`` uses for prefill counts, now per token. Memory stays bounded:
per-token ids are kept once per conversation (its last prompt; each domain's system prompt once),
``uint8`` when the model has at most 256 experts (about the memory per-block histograms would take),
and the workload's total is checked against :data:`MAX_ID_BYTES`.

**Signatures through the cache** (:func:`cache_signatures`). The requests (turns arriving in the order
of :func:`conversation_arrivals`) are admitted into a :class:`~moelab.eldr.cache.SignatureCache` (block
size and capacity in blocks are parameters) with per-block histograms
(:meth:`~moelab.eldr.cache.SignatureCache.admit_blocks`; the cached blocks' rows are zeroed before
admission, so a cache that read them instead of its own blocks would be caught). In a PD-disaggregated
cluster the prefix cache lives on the prefill tier and a request holds its blocks only while its prefill
runs: a request is released once ``in_flight`` later requests have been admitted (a documented in-flight
window standing for the prefill tier's concurrency; earlier if the next admission needs the blocks),
after which its full blocks stay cached, evictable LRU. Replies are decoded on the decode tier, so they
reach the prefill cache only as part of the next turn's prompt. One cache stands for the prefill tier
(one prefill instance, or a prefix-aware prefill router that keeps a conversation on the instance that
holds its history) — a simplification, stated. Each request's counts three ways:
``full`` (its full prefill, no cache), ``coindexed`` (``cache.counts``: the sum over its whole block
table, cached blocks included) and ``suffix`` (only the blocks it computed itself).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from moelab._validate import check_array, check_instance, check_int, check_real, rng_from
from moelab.eldr.cache import SignatureCache
from moelab.eldr.workload import (
    OLMOE_DOMAINS,
    DomainSpread,
    SyntheticConfig,
    _config,
    _decode_topk,
    _domain_logits,
    _inclusion,
    _request_logits,
    _spread,
    _topic_logits,
)
from moelab.traces import ExpertTrace, default_provenance, expert_counts

#: most prompt tokens a generated workload may hold over all its requests (turns repeat their history)
MAX_PROMPT_TOKENS = 50_000_000
#: most bytes of per-token routing ids a generated workload may keep
MAX_ID_BYTES = 1 << 30
_VOCAB = 32000


@dataclass(frozen=True)
class ConversationConfig:
    """Conversation structure: geometric number of turns (mean ``turns_mean`` before truncation at
    ``max_turns``), user-turn and reply lengths ``1 + Poisson(mean - 1)`` tokens, per-turn routing noise
    ``turn_sigma`` (Gumbel units, times ``sharpness``). The system prompt is ``SyntheticConfig.prefix_tokens``."""

    turns_mean: float = 3.0
    max_turns: int = 8
    user_tokens_mean: int = 64
    reply_tokens_mean: int = 128
    turn_sigma: float = 0.5

    def validate(self) -> ConversationConfig:
        """Raise ``ValueError`` naming the first parameter out of range."""
        check_int("max_turns", self.max_turns, low=1, high=64)
        check_real("turns_mean", self.turns_mean, low=1, high=self.max_turns, high_name="max_turns")
        check_int("user_tokens_mean", self.user_tokens_mean, low=1, high=1 << 16)
        check_int("reply_tokens_mean", self.reply_tokens_mean, low=1, high=1 << 16)
        check_real("turn_sigma", self.turn_sigma, low=0)
        return self


def _draw_ids(pi: np.ndarray, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` tokens x ``k`` independent picks per layer from ``pi`` [L, E] (rows sum to 1): int16 [n, L, k]."""
    L, E = pi.shape
    cdf = np.cumsum(pi, axis=-1)
    cdf[:, -1] = 1.0
    flat = (cdf + np.arange(L)[:, None]).ravel()  # layer l's CDF shifted to [l, l + 1]: one sorted array
    u = rng.random((n, L, k)) + np.arange(L)[None, :, None]
    pos = np.searchsorted(flat, u.ravel(), side="right").reshape(n, L, k)
    return (pos - np.arange(L)[None, :, None] * E).astype(np.int16)


@dataclass(frozen=True, eq=False)
class ConversationWorkload:
    """A generated shared-prefix conversation workload (see the module docstring).

    ``trace``: one row per request (turn), ``prefill_counts`` = full prefill; ``conversation`` and
    ``turn`` (0-based) of each row; per-token routing ids through :meth:`prompt_ids` and
    :meth:`block_hists`."""

    trace: ExpertTrace
    conversation: np.ndarray
    turn: np.ndarray
    config: SyntheticConfig
    conversations: ConversationConfig
    spread: DomainSpread
    seed: int
    _sys_ids: np.ndarray = field(repr=False, default=None)  # [D, S, L, k]
    _conv_ids: list = field(repr=False, default_factory=list)  # per conversation [P_last - S, L, k]
    _domain: np.ndarray = field(repr=False, default=None)  # per conversation
    _index: dict = field(repr=False, default_factory=dict)

    @property
    def n_conversations(self) -> int:
        """Conversations in the workload."""
        return len(self._conv_ids)

    def rows_of(self, request_ids: list[str]) -> np.ndarray:
        """Trace rows of the given request ids (e.g. a subset's)."""
        if not self._index:
            self._index.update({r: i for i, r in enumerate(self.trace.request_ids)})
        missing = [r for r in request_ids if r not in self._index]
        if missing:
            raise ValueError(f"request_ids must belong to this workload; {missing[0]!r} does not")
        return np.array([self._index[r] for r in request_ids], dtype=np.int64)

    def prompt_ids(self, row: int) -> np.ndarray:
        """Per-token routing ids [P, L, k] of request ``row``'s prompt (a deterministic function of its prefix)."""
        row = check_int("row", row, low=0, high=self.trace.n_requests - 1)
        c = int(self.conversation[row])
        sys = self._sys_ids[self._domain[c]]
        return np.concatenate([sys, self._conv_ids[c][: int(self.trace.prompt_lens[row]) - sys.shape[0]]])

    def block_hists(self, row: int, block_size: int) -> np.ndarray:
        """Expert histograms of request ``row``'s KV blocks, int32 [ceil(P / block_size), L, E]
        (``block_size`` at most :data:`MAX_PROMPT_TOKENS`: a larger block is the same one block)."""
        bs = check_int("block_size", block_size, low=1, high=MAX_PROMPT_TOKENS, high_name="MAX_PROMPT_TOKENS")
        ids = self.prompt_ids(row)
        P, L, k = ids.shape
        E = self.config.num_experts
        nb = -(-P // bs)
        flat = ((np.arange(P)[:, None, None] // bs) * L + np.arange(L)[None, :, None]) * E + ids
        return np.bincount(flat.ravel(), minlength=nb * L * E).reshape(nb, L, E).astype(np.int32)


def generate_conversations(
    n_conversations: int,
    config: SyntheticConfig | None = None,
    conversations: ConversationConfig | None = None,
    *,
    spread: DomainSpread | None = None,
    seed: int = 0,
) -> ConversationWorkload:
    """Generate ``n_conversations`` shared-prefix conversations (domains round-robin, shuffled), one
    trace row per turn (see the module docstring). ``config.prompt_len_mean`` is not used: prompt
    lengths come from the conversation structure."""
    n = check_int("n_conversations", n_conversations, low=1, high=1_000_000)
    cfg = _config(config)
    cc = (ConversationConfig() if conversations is None else check_instance(
        "conversations", conversations, ConversationConfig, "a ConversationConfig or None")).validate()
    spread = _spread(spread)
    rng = rng_from(seed)
    L, E, k, S, T = cfg.num_layers, cfg.num_experts, cfg.top_k, cfg.prefix_tokens, cfg.decode_tokens
    id_dtype = np.uint8 if E <= 256 else np.int16
    dom_logits = _domain_logits(cfg, spread, rng)
    domain = rng.permutation(np.arange(n) % cfg.n_domains)
    topic_logits = _topic_logits(cfg, dom_logits, rng)
    topic = rng.integers(0, cfg.subtopics, size=n)
    sys_tokens = rng.integers(0, _VOCAB, size=(cfg.n_domains, S), dtype=np.int32)
    sys_ids = np.stack([_draw_ids(_inclusion(dom_logits[d], k), S, k, rng) for d in range(cfg.n_domains)])
    sys_ids = sys_ids.astype(id_dtype)
    sys_counts = np.stack([expert_counts(sys_ids[d], E) for d in range(cfg.n_domains)])
    n_turns = np.minimum(rng.geometric(1.0 / cc.turns_mean, size=n), cc.max_turns)
    first = np.concatenate([[0], np.cumsum(n_turns)])  # turn rows of conversation c: first[c] .. first[c+1]
    user_len = 1 + rng.poisson(cc.user_tokens_mean - 1, size=first[-1])
    reply_len = 1 + rng.poisson(cc.reply_tokens_mean - 1, size=first[-1])  # the last turn's reply is never read back
    conv_of = np.repeat(np.arange(n), n_turns)
    turn_of = np.arange(first[-1]) - first[conv_of]
    history = np.cumsum(user_len + reply_len) - _first_cumsum(user_len + reply_len, first, conv_of)
    prompt_len = S + history - reply_len  # system prompt + earlier turns and replies + this user turn
    total_tokens = int(prompt_len.sum())
    id_bytes = int((prompt_len[first[1:] - 1] - S).sum()) * L * k * np.dtype(id_dtype).itemsize
    if total_tokens > MAX_PROMPT_TOKENS or id_bytes > MAX_ID_BYTES:
        raise ValueError(f"n_conversations={n} asks for {total_tokens} prompt tokens over all turns and {id_bytes} bytes "
                         f"of routing ids (bounds MAX_PROMPT_TOKENS={MAX_PROMPT_TOKENS}, MAX_ID_BYTES={MAX_ID_BYTES}); "
                         f"use fewer or shorter conversations")
    N = int(first[-1])
    counts = np.empty((N, L, E), np.int32)
    dec = np.empty((N * T, L, k), np.int16)
    tokens = np.empty(total_tokens, np.int32)
    offsets = np.concatenate([[0], np.cumsum(prompt_len)]).astype(np.int64)
    conv_ids: list[np.ndarray] = []
    chunk = max(1, int(2_000_000 // (T * L * E * cc.turns_mean)))  # bounds the Gumbel buffer like generate's
    for s in range(0, n, chunk):
        cs = np.arange(s, min(n, s + chunk))
        b = _request_logits(cfg, dom_logits, topic_logits[domain[cs], topic[cs]], rng)
        rows = np.arange(first[cs[0]], first[cs[-1] + 1])
        user = b[conv_of[rows] - s] + cfg.sharpness * cc.turn_sigma * rng.standard_normal((rows.size, L, E))
        tok, _ = _decode_topk(cfg, user, rng)  # [turns, T, L, k]: each turn's reply
        dec[rows[0] * T:(rows[-1] + 1) * T] = tok.reshape(-1, L, k)
        pi = _inclusion(user, k)
        for c in cs.tolist():
            d = int(domain[c])
            parts, words = [], []
            for j in range(first[c], first[c + 1]):
                r = j - rows[0]
                parts.append(_draw_ids(pi[r], int(user_len[j]), k, rng).astype(id_dtype))
                words.append(rng.integers(0, _VOCAB, size=user_len[j], dtype=np.int32))
                if j < first[c + 1] - 1:  # the reply, read back in the next turn's prompt
                    parts.append(tok[r][np.arange(reply_len[j]) % T].astype(id_dtype))
                    words.append(rng.integers(0, _VOCAB, size=reply_len[j], dtype=np.int32))
            ids = np.concatenate(parts)
            text = np.concatenate([sys_tokens[d], *words])
            conv_ids.append(ids)
            for j in range(first[c], first[c + 1]):
                P = int(prompt_len[j])
                tokens[offsets[j]:offsets[j + 1]] = text[:P]
                counts[j] = sys_counts[d] + expert_counts(ids[:P - S], E)
    names = [OLMOE_DOMAINS[d] if d < len(OLMOE_DOMAINS) else f"domain{d}" for d in range(cfg.n_domains)]
    prov = default_provenance("synthetic", cfg.model_name, generator="moelab.eldr.prefix.generate_conversations",
                              seed=seed, config={f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                              conversations={f: getattr(cc, f) for f in cc.__dataclass_fields__},
                              spread_source=spread.source)
    trace = ExpertTrace(
        [f"c{c}-t{t}" for c, t in zip(conv_of.tolist(), turn_of.tolist())], [names[domain[c]] for c in conv_of],
        tokens, offsets, counts, dec, np.arange(N + 1, dtype=np.int64) * T, cfg.geometry, prov,
    )
    return ConversationWorkload(trace, conv_of.astype(np.int64), turn_of.astype(np.int64), cfg, cc, spread, seed,
                                sys_ids, conv_ids, domain)


def _first_cumsum(x: np.ndarray, first: np.ndarray, group: np.ndarray) -> np.ndarray:
    """For each element, the cumulative sum of ``x`` up to (excluding) its group's first element."""
    before = np.concatenate([[0], np.cumsum(x)])[first[:-1]]
    return before[group]


def conversation_arrivals(workload: ConversationWorkload, rows: np.ndarray, *, sim_rate: float, sessions: int = 64,
                          seed: int = 0) -> np.ndarray:
    """Arrival time (s) of each of ``rows``: a Poisson stream at ``sim_rate`` req/s served by ``sessions``
    concurrent conversations.

    Each arrival is the next turn of a uniformly chosen open session; a session whose conversation has no
    turn left opens the next conversation (in a seeded random order), so the turns of one conversation
    keep their order and about ``sessions`` other requests arrive between two of its turns
    (``sessions / sim_rate`` seconds) — the quantity that decides whether its history is still cached. An
    assumption, stated: the gap is not coupled to the simulated decode time of the reply.

    Parameters
    ----------
    workload : ConversationWorkload
        The conversations (:func:`generate_conversations`).
    rows : array of int
        The workload requests that arrive (e.g. a split's served half).
    sim_rate : float
        Arrival rate in req/s into the whole simulated cluster (> 0); not ELDR's paper unit: for a ``rate``
        in req/s at 16 decode workers pass ``rate * paper_rate_scale(K)``
        (:func:`moelab.eldr.experiments.prefix_cache_ablation` does).
    sessions : int
        Concurrent conversations (>= 1).
    seed : int
        Seed of the gaps and the session choices.

    Returns
    -------
    ndarray of float
        One arrival time (s) per entry of ``rows``; the first arrival is at 0.
    """
    check_instance("workload", workload, ConversationWorkload, "a ConversationWorkload (generate_conversations())")
    rate = check_real("sim_rate", sim_rate, low=0, low_open=True)
    sessions = check_int("sessions", sessions, low=1)
    rows = check_array("rows", rows, ndim=1).astype(np.int64)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= workload.trace.n_requests:
        raise ValueError(f"rows must be a non-empty selection of the workload's {workload.trace.n_requests} requests")
    rng = rng_from(seed)
    n = rows.size
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    times -= times[0]
    convs = workload.conversation[rows]
    by_turn = np.lexsort((workload.turn[rows], convs))  # rows grouped by conversation, turns in order
    starts = np.flatnonzero(np.r_[True, convs[by_turn][1:] != convs[by_turn][:-1]])
    ends = np.r_[starts[1:], n]
    queue = deque(rng.permutation(starts.size).tolist())
    cursor = {}  # open session -> next position in by_turn
    open_: list[int] = []
    arrival = np.empty(n)
    for slot in range(n):
        while len(open_) < sessions and queue:
            c = queue.popleft()
            open_.append(c)
            cursor[c] = int(starts[c])
        j = int(rng.integers(len(open_)))
        c = open_[j]
        arrival[by_turn[cursor[c]]] = times[slot]
        cursor[c] += 1
        if cursor[c] == ends[c]:
            open_[j] = open_[-1]
            open_.pop()
    return arrival


@dataclass(frozen=True, eq=False)
class CachedSignatures:
    """One pass of requests through a :class:`~moelab.eldr.cache.SignatureCache` (see the module docstring).

    ``full``, ``coindexed``, ``suffix``: int32 [n, L, E] counts of each request (in the order of the
    ``rows`` given); ``cached_tokens`` / ``prompt_tokens`` per request; cache totals."""

    full: np.ndarray
    coindexed: np.ndarray
    suffix: np.ndarray
    cached_tokens: np.ndarray
    prompt_tokens: np.ndarray
    evictions: int
    block_hits: int
    block_size: int
    capacity_blocks: int
    in_flight: int

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / all prompt tokens (vLLM's prefix-cache hit rate)."""
        return float(self.cached_tokens.sum() / self.prompt_tokens.sum())

    @property
    def coindexed_exact(self) -> bool:
        """Whether every co-indexed count equals the full-prefill count (the cache invariant, measured)."""
        return bool(np.array_equal(self.coindexed, self.full))


def cache_signatures(workload: ConversationWorkload, rows: np.ndarray, arrival_s: np.ndarray, *, block_size: int = 16,
                     capacity_blocks: int = 4096, in_flight: int = 8) -> CachedSignatures:
    """Admit ``rows`` of the workload into a fresh signature cache in order of ``arrival_s`` and build
    each request's counts three ways (full prefill / co-indexed / suffix only; module docstring)."""
    bs = check_int("block_size", block_size, low=1, high=4096)
    cap = check_int("capacity_blocks", capacity_blocks, low=1, high=1 << 20)
    window = check_int("in_flight", in_flight, low=1)
    check_instance("workload", workload, ConversationWorkload, "a ConversationWorkload (generate_conversations())")
    tr = workload.trace
    rows = check_array("rows", rows, ndim=1).astype(np.int64)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= tr.n_requests:
        raise ValueError(f"rows must be a non-empty selection of the workload's {tr.n_requests} requests")
    arrival = check_array("arrival_s", arrival_s, ndim=1, dtype=np.float64)
    if arrival.shape != rows.shape:
        raise ValueError(f"arrival_s must have one entry per row ({rows.size}); got {arrival.size}")
    plen = tr.prompt_lens[rows].astype(np.int64)
    need = int(-(-plen.max() // bs))
    if cap < need:
        raise ValueError(f"capacity_blocks must be >= {need} (the longest prompt's blocks at block_size={bs}); got {cap}")
    g = tr.geometry
    cache = SignatureCache(bs, g.num_layers, g.num_experts, cap)
    n = rows.size
    co = np.empty((n, g.num_layers, g.num_experts), np.int32)
    suf = np.empty_like(co)
    cached = np.zeros(n, np.int64)
    live: deque[str] = deque()
    for i in np.argsort(arrival, kind="stable").tolist():
        r = int(rows[i])
        rid = tr.request_ids[r]
        tokens = tr.prompt(r)
        hists = workload.block_hists(r, bs)
        while live and cache.free_blocks < hists.shape[0]:  # the prefill waits for running prefills to finish
            cache.release(live.popleft())
        hit = cache.lookup(tokens) // bs
        given = hists.copy()
        given[:hit] = 0  # served from cache: a correct cache never reads these rows
        adm = cache.admit_blocks(rid, tokens, given)
        co[i] = cache.counts(rid)
        cached[i] = adm.cached_tokens
        suf[i] = hists[adm.cached_tokens // bs:].sum(axis=0)
        live.append(rid)
        if len(live) > window:
            cache.release(live.popleft())
    return CachedSignatures(tr.prefill_counts[rows], co, suf, cached, plen, cache.evictions, cache.hits, bs, cap, window)


__all__ = ["MAX_ID_BYTES", "MAX_PROMPT_TOKENS", "CachedSignatures", "ConversationConfig", "ConversationWorkload", "cache_signatures",
           "conversation_arrivals", "generate_conversations"]
