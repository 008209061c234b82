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
* assistant reply ``t`` (read back in later prompts): the mean decode logits of turn ``t`` (``generate``'s
  drift and within-request walk, averaged over the reply); the reply's decode ids are Gumbel top-k of the
  same decode logits, exactly as in ``generate``.

A token's picks are drawn from a generator seeded by its conversation (the system prompt's once per
domain), in token order, so **a token's routing is a deterministic function of the prefix that ends at
it** (the system-prompt tokens fix the domain; the first user turn fixes the conversation): the same
prefix always gives the same KV-block histograms, in every turn that repeats it, as causal attention
would. Approximation (stated): each token's ``k`` picks per layer are ``k`` independent draws from the
top-k inclusion probabilities (``workload._inclusion``) rather than ``k`` distinct experts — the same
``Multinomial(P*k, pi)`` law ``generate`` uses for prefill counts, now per token. Memory stays bounded:
the trace holds prompt tokens and ``[N, L, E]`` counts; per-token ids are regenerated per conversation
on demand (a small LRU of conversations), never stored for the whole workload.

**Signatures through the cache** (:func:`cache_signatures`). The requests (turns arriving in the order
of :func:`conversation_arrivals`) are admitted into a :class:`~moelab.eldr.cache.SignatureCache` (block
size and capacity in blocks are parameters) with per-block histograms
(:meth:`~moelab.eldr.cache.SignatureCache.admit_blocks`; the cached blocks' rows are zeroed before
admission, so a cache that read them instead of its own blocks would be caught). In a PD-disaggregated
cluster the prefix cache lives on the prefill tier and a request holds its blocks only while its prefill
runs: a request is released once ``in_flight`` later requests have been admitted (a documented in-flight
window standing for the prefill tier's concurrency; earlier if the next admission needs the blocks),
after which its full blocks stay cached, evictable LRU. Replies are decoded on the decode tier, so they
reach the prefill cache only as part of the next turn's prompt. Each request's counts three ways:
``full`` (its full prefill, no cache), ``coindexed`` (``cache.counts``: the sum over its whole block
table, cached blocks included) and ``suffix`` (only the blocks it computed itself).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from moelab._validate import check_array, check_int, check_real, rng_from
from moelab.eldr.cache import SignatureCache
from moelab.eldr.workload import (
    OLMOE_DOMAINS,
    DomainSpread,
    SyntheticConfig,
    _decode_topk,
    _domain_logits,
    _inclusion,
    _request_logits,
    _topic_logits,
    fit_domain_spread,
)
from moelab.traces import ExpertTrace, default_provenance, expert_counts

#: most prompt tokens a generated workload may hold over all its requests (turns repeat their history)
MAX_PROMPT_TOKENS = 50_000_000
_VOCAB = 32000
_MEMO = 64  # conversations whose per-token routing ids are kept (LRU)


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


@dataclass(frozen=True)
class _Conversation:
    tokens: np.ndarray  # int32 [P_last]: the last turn's prompt (every earlier prompt is a prefix of it)
    ids: np.ndarray  # int16 [P_last, L, k]: per-token routing ids of those tokens
    prompt_lens: np.ndarray  # [turns]
    decode_ids: np.ndarray  # int16 [turns, T, L, k]


@dataclass(frozen=True, eq=False)
class ConversationWorkload:
    """A generated shared-prefix conversation workload (see the module docstring).

    ``trace``: one row per request (turn), ``prefill_counts`` = full prefill; ``conversation`` and
    ``turn`` (0-based) of each row. Per-token routing ids are regenerated on demand
    (:meth:`prompt_ids`, :meth:`block_hists`)."""

    trace: ExpertTrace
    conversation: np.ndarray
    turn: np.ndarray
    config: SyntheticConfig
    conversations: ConversationConfig
    spread: DomainSpread
    seed: int
    _state: dict = field(repr=False, default_factory=dict)
    _memo: OrderedDict = field(repr=False, default_factory=OrderedDict)

    @property
    def n_conversations(self) -> int:
        """Conversations in the workload."""
        return int(self.conversation.max()) + 1

    def _conv(self, c: int) -> _Conversation:
        if c in self._memo:
            self._memo.move_to_end(c)
            return self._memo[c]
        conv = _make_conversation(self.config, self.conversations, self._state, c)
        self._memo[c] = conv
        if len(self._memo) > _MEMO:
            self._memo.popitem(last=False)
        return conv

    def rows_of(self, request_ids: list[str]) -> np.ndarray:
        """Trace rows of the given request ids (e.g. a subset's)."""
        index = self._state.setdefault("index", {r: i for i, r in enumerate(self.trace.request_ids)})
        missing = [r for r in request_ids if r not in index]
        if missing:
            raise ValueError(f"request_ids must belong to this workload; {missing[0]!r} does not")
        return np.array([index[r] for r in request_ids], dtype=np.int64)

    def prompt_ids(self, row: int) -> np.ndarray:
        """Per-token routing ids [P, L, k] of request ``row``'s prompt (a deterministic function of its prefix)."""
        row = check_int("row", row, low=0, high=self.trace.n_requests - 1)
        return self._conv(int(self.conversation[row])).ids[: int(self.trace.prompt_lens[row])]

    def block_hists(self, row: int, block_size: int) -> np.ndarray:
        """Expert histograms of request ``row``'s KV blocks, int32 [ceil(P / block_size), L, E]."""
        bs = check_int("block_size", block_size, low=1)
        ids = self.prompt_ids(row)
        P, L, k = ids.shape
        E = self.config.num_experts
        nb = -(-P // bs)
        flat = ((np.arange(P)[:, None, None] // bs) * L + np.arange(L)[None, :, None]) * E + ids
        return np.bincount(flat.ravel(), minlength=nb * L * E).reshape(nb, L, E).astype(np.int32)


def _make_conversation(cfg: SyntheticConfig, cc: ConversationConfig, st: dict, c: int) -> _Conversation:
    """Conversation ``c``, entirely from its own seed and the shared domain state (so it can be regenerated)."""
    rng = np.random.default_rng(int(st["conv_seed"][c]))
    L, k = cfg.num_layers, cfg.top_k
    d, tp = int(st["domain"][c]), int(st["topic"][c])
    n_turns = int(min(rng.geometric(1.0 / cc.turns_mean), cc.max_turns))
    user_len = 1 + rng.poisson(cc.user_tokens_mean - 1, size=n_turns)
    reply_len = 1 + rng.poisson(cc.reply_tokens_mean - 1, size=n_turns - 1)
    b = _request_logits(cfg, st["dom_logits"], st["topic_logits"][d, tp][None], rng)
    user = b + cfg.sharpness * cc.turn_sigma * rng.standard_normal((n_turns, L, cfg.num_experts))
    dec_ids, dec_mean = _decode_topk(cfg, user, rng)
    tokens, ids = [st["sys_tokens"][d]], [st["sys_ids"][d]]
    prompt_lens = np.empty(n_turns, np.int64)
    P = st["sys_tokens"].shape[1]
    for t in range(n_turns):
        if t:  # the previous reply, read back as part of this prompt
            tokens.append(rng.integers(0, _VOCAB, size=reply_len[t - 1], dtype=np.int32))
            ids.append(_draw_ids(_inclusion(dec_mean[t - 1], k), int(reply_len[t - 1]), k, rng))
            P += int(reply_len[t - 1])
        tokens.append(rng.integers(0, _VOCAB, size=user_len[t], dtype=np.int32))
        ids.append(_draw_ids(_inclusion(user[t], k), int(user_len[t]), k, rng))
        P += int(user_len[t])
        prompt_lens[t] = P
    return _Conversation(np.concatenate(tokens), np.concatenate(ids), prompt_lens, dec_ids)


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
    cfg = (config or SyntheticConfig()).validate()
    cc = (conversations or ConversationConfig()).validate()
    spread = spread or fit_domain_spread("olmoe")
    rng = rng_from(seed)
    E, k, S = cfg.num_experts, cfg.top_k, cfg.prefix_tokens
    dom_logits = _domain_logits(cfg, spread, rng)
    domain = rng.permutation(np.arange(n) % cfg.n_domains)
    topic_logits = _topic_logits(cfg, dom_logits, rng)
    topic = rng.integers(0, cfg.subtopics, size=n)
    sys_tokens = rng.integers(0, _VOCAB, size=(cfg.n_domains, S), dtype=np.int32)
    sys_ids = np.stack([_draw_ids(_inclusion(dom_logits[d], k), S, k, rng) for d in range(cfg.n_domains)])
    st = {"dom_logits": dom_logits, "topic_logits": topic_logits, "domain": domain, "topic": topic,
          "sys_tokens": sys_tokens, "sys_ids": sys_ids, "conv_seed": rng.integers(0, 1 << 62, size=n)}
    names = [OLMOE_DOMAINS[d] if d < len(OLMOE_DOMAINS) else f"domain{d}" for d in range(cfg.n_domains)]
    rids, doms, toks, counts, dec, conv_of, turn_of, total = [], [], [], [], [], [], [], 0
    memo: OrderedDict = OrderedDict()
    for c in range(n):
        conv = _make_conversation(cfg, cc, st, c)
        total += int(conv.prompt_lens.sum())
        if total > MAX_PROMPT_TOKENS:
            raise ValueError(f"n_conversations={n} asks for more than MAX_PROMPT_TOKENS={MAX_PROMPT_TOKENS} prompt "
                             f"tokens over all turns (use fewer or shorter conversations)")
        for t, P in enumerate(conv.prompt_lens.tolist()):
            rids.append(f"c{c}-t{t}")
            doms.append(names[domain[c]])
            toks.append(conv.tokens[:P])
            counts.append(expert_counts(conv.ids[:P], E).astype(np.int32))
            dec.append(conv.decode_ids[t])
            conv_of.append(c)
            turn_of.append(t)
        if c >= n - _MEMO:
            memo[c] = conv
    plen = np.array([t.size for t in toks], dtype=np.int64)
    prov = default_provenance("synthetic", cfg.model_name, generator="moelab.eldr.prefix.generate_conversations",
                              seed=seed, config={f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                              conversations={f: getattr(cc, f) for f in cc.__dataclass_fields__},
                              spread_source=spread.source)
    trace = ExpertTrace(
        rids, doms, np.concatenate(toks), np.concatenate([[0], np.cumsum(plen)]).astype(np.int64), np.stack(counts),
        np.concatenate(dec), np.arange(len(rids) + 1, dtype=np.int64) * cfg.decode_tokens, cfg.geometry, prov,
    )
    return ConversationWorkload(trace, np.array(conv_of, np.int64), np.array(turn_of, np.int64), cfg, cc, spread,
                                seed, st, memo)


def conversation_arrivals(workload: ConversationWorkload, rows: np.ndarray, *, rate: float, turn_gap_s: float = 20.0,
                          seed: int = 0) -> np.ndarray:
    """Arrival time (s) of each of ``rows``: conversations start as a Poisson process whose request rate
    is ``rate`` on average (``rate`` x conversations / requests in ``rows``), and turn ``t + 1`` arrives
    ``Exp(turn_gap_s)`` after turn ``t`` (the reply's decode plus the user's reading and typing: an
    assumption, not coupled to the simulated decode time). The earliest arrival is at 0."""
    rate = check_real("rate", rate, low=0, low_open=True)
    gap = check_real("turn_gap_s", turn_gap_s, low=0)
    rows = check_array("rows", rows, ndim=1).astype(np.int64)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= workload.trace.n_requests:
        raise ValueError(f"rows must be a non-empty selection of the workload's {workload.trace.n_requests} requests")
    rng = rng_from(seed)
    convs, conv_idx = np.unique(workload.conversation[rows], return_inverse=True)
    start = np.cumsum(rng.exponential(rows.size / (rate * convs.size), size=convs.size))
    turns = workload.turn[rows]
    gaps = rng.exponential(gap, size=(convs.size, int(workload.turn.max()) + 1)) if gap > 0 else \
        np.zeros((convs.size, int(workload.turn.max()) + 1))
    offset = np.concatenate([np.zeros((convs.size, 1)), np.cumsum(gaps, axis=1)[:, :-1]], axis=1)
    arrival = start[conv_idx] + offset[conv_idx, turns]
    return arrival - arrival.min()


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


__all__ = ["MAX_PROMPT_TOKENS", "CachedSignatures", "ConversationConfig", "ConversationWorkload", "cache_signatures",
           "conversation_arrivals", "generate_conversations"]
