"""ELDR prefix caching for real: admit_blocks, the shared-prefix conversation workload, signatures
through the KV-block signature cache (full / co-indexed / suffix-only) and the ablation that uses them."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.costmodel import DecodeStepModel, ModelShape
from moelab.eldr import experiments as ex
from moelab.eldr.cache import SignatureCache
from moelab.eldr.prefix import (
    ConversationConfig,
    cache_signatures,
    conversation_arrivals,
    generate_conversations,
)
from moelab.eldr.workload import SyntheticConfig
from moelab.traces import expert_counts

SMALL = SyntheticConfig(num_layers=4, num_experts=16, top_k=2, model_name="small", n_domains=3, prompt_len_mean=80,
                        prefix_tokens=20, decode_tokens=4)
CONV = ConversationConfig(turns_mean=3.0, max_turns=5, user_tokens_mean=10, reply_tokens_mean=14)
BS = 4


@pytest.fixture(scope="module")
def work():
    return generate_conversations(40, SMALL, CONV, seed=2)


def small_cost() -> DecodeStepModel:
    return DecodeStepModel.h200(ModelShape(4, 512, 8, 2, 64, 1000, num_experts=16, top_k=2, expert_ffn=256))


# ---------------------------------------------------------------- admit_blocks

def test_admit_blocks_equals_admit():
    """Same prompts (shared random prefixes), same releases and evictions: admit_blocks with per-block
    histograms gives the same block tables, counts, hits and evictions as admit with per-token ids."""
    rng = np.random.default_rng(0)
    L, E, k, bs = 3, 8, 2, 3
    a, b = SignatureCache(bs, L, E, 24), SignatureCache(bs, L, E, 24)
    prefixes = [rng.integers(0, 50, size=n) for n in (7, 12, 3)]
    live = []
    for i in range(60):
        tokens = np.concatenate([prefixes[i % 3], rng.integers(0, 50, size=rng.integers(1, 12))])
        h = np.cumsum(tokens * 31 % 97)  # routing: a function of the prefix
        ids = (h[:, None, None] * (np.arange(L)[None, :, None] + 3) * (np.arange(k)[None, None, :] + 5) % E)
        nb = -(-tokens.size // bs)
        hists = np.stack([expert_counts(ids[j * bs:(j + 1) * bs], E) for j in range(nb)])
        while live and a.free_blocks < nb:
            r = live.pop(0)
            a.release(r)
            b.release(r)
        hit = b.lookup(tokens) // bs
        poisoned = hists.copy()
        poisoned[:hit] = 7  # cached blocks: never read
        ra, rb = a.admit(f"r{i}", tokens, ids), b.admit_blocks(f"r{i}", tokens, poisoned)
        assert ra == rb
        assert np.array_equal(a.counts(f"r{i}"), b.counts(f"r{i}"))
        assert np.array_equal(b.counts(f"r{i}"), expert_counts(ids, E))
        live.append(f"r{i}")
        if len(live) > 4:
            r = live.pop(0)
            a.release(r)
            b.release(r)
    assert (a.hits, a.evictions, a.cached_blocks, a.free_blocks) == (b.hits, b.evictions, b.cached_blocks, b.free_blocks)
    assert b.hits > 0 and b.evictions > 0


def test_admit_blocks_bad_input():
    c = SignatureCache(4, 2, 8, 8)
    tokens = np.arange(6)
    good = np.zeros((2, 2, 8), np.int64)
    with pytest.raises(ValueError, match="block_hists"):
        c.admit_blocks("a", tokens, np.zeros((1, 2, 8), np.int64))  # 6 tokens are 2 blocks of 4
    with pytest.raises(ValueError, match="block_hists"):
        c.admit_blocks("a", tokens, good.astype(float))
    with pytest.raises(ValueError, match="block_hists"):
        c.admit_blocks("a", tokens, good - 1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        c.admit_blocks("a", np.array([1.5, 2.0]), good[:1])
    assert c.free_blocks == 8 and not c.tables  # nothing half-admitted
    c.admit_blocks("a", tokens, good)
    with pytest.raises(ValueError, match="already admitted"):
        c.admit_blocks("a", tokens, good)


# ---------------------------------------------------------------- workload

def test_conversations_share_real_prefixes(work):
    tr = work.trace
    assert tr.provenance["backend"] == "synthetic" and work.turn.max() >= 1
    assert np.array_equal(tr.prefill_counts.sum(axis=2), np.repeat(tr.prompt_lens[:, None] * SMALL.top_k, 4, axis=1))
    sys_of = {}
    for r in range(tr.n_requests):
        ids = work.prompt_ids(r)
        assert ids.shape == (tr.prompt_lens[r], SMALL.num_layers, SMALL.top_k)
        assert np.array_equal(expert_counts(ids, SMALL.num_experts), tr.prefill_counts[r])
        assert np.array_equal(work.block_hists(r, BS).sum(axis=0), tr.prefill_counts[r])
        # the system prompt (tokens and routing) is the domain's, in every conversation
        sys = (tr.prompt(r)[:SMALL.prefix_tokens].tobytes(), ids[:SMALL.prefix_tokens].tobytes())
        assert sys_of.setdefault(tr.domains[r], sys) == sys
        if work.turn[r]:  # turn t's prompt extends turn t-1's, tokens and routing alike
            p = tr.prompt_lens[r - 1]
            assert work.conversation[r - 1] == work.conversation[r] and p < tr.prompt_lens[r]
            assert np.array_equal(tr.prompt(r)[:p], tr.prompt(r - 1))
            assert np.array_equal(ids[:p], work.prompt_ids(r - 1))
    assert len(sys_of) == SMALL.n_domains and len(set(sys_of.values())) == SMALL.n_domains
    again = generate_conversations(40, SMALL, CONV, seed=2).trace
    assert np.array_equal(again.prefill_counts, tr.prefill_counts) and np.array_equal(again.decode_ids, tr.decode_ids)


def test_multi_turn_prefixes_hit_the_cache(work):
    """Without evictions every hit is derivable: turn t > 0 reuses the full blocks of turn t-1's prompt;
    a first turn reuses its system prompt's full blocks once any earlier request of its domain came."""
    tr = work.trace
    rows = np.arange(tr.n_requests)
    arrival = conversation_arrivals(work, rows, sim_rate=20, sessions=6, seed=1)
    later = work.turn > 0
    assert (arrival[later] > arrival[np.flatnonzero(later) - 1]).all()  # a conversation's turns keep their order
    assert np.isclose(arrival.min(), 0) and np.unique(arrival).size == rows.size
    cs = cache_signatures(work, rows, arrival, block_size=BS, capacity_blocks=4000, in_flight=3)
    expect = np.zeros(rows.size, np.int64)
    seen: set[str] = set()
    for i in np.argsort(arrival, kind="stable"):
        if work.turn[i]:
            expect[i] = tr.prompt_lens[i - 1] // BS * BS
        elif tr.domains[i] in seen:
            expect[i] = SMALL.prefix_tokens // BS * BS
        seen.add(tr.domains[i])
    assert cs.evictions == 0
    assert np.array_equal(cs.cached_tokens, expect)
    assert cs.hit_rate == pytest.approx(expect.sum() / tr.prompt_lens.sum()) and cs.hit_rate > 0.3
    assert cs.block_hits == expect.sum() // BS


def test_coindexed_equals_full_and_suffix_differs(work):
    tr = work.trace
    rows = np.arange(tr.n_requests)
    arrival = conversation_arrivals(work, rows, sim_rate=20, sessions=6, seed=1)
    big = cache_signatures(work, rows, arrival, block_size=BS, capacity_blocks=4000)
    small = cache_signatures(work, rows, arrival, block_size=BS, capacity_blocks=60, in_flight=2)
    assert small.evictions > 0 and 0 < small.hit_rate < big.hit_rate
    for cs in (big, small):
        assert np.array_equal(cs.full, tr.prefill_counts)
        assert np.array_equal(cs.coindexed, cs.full) and cs.coindexed_exact  # the cache invariant, measured
        hit = cs.cached_tokens > 0
        assert (cs.suffix[hit] != cs.full[hit]).any(axis=(1, 2)).all()
        assert np.array_equal(cs.suffix[~hit], cs.full[~hit])
        assert np.array_equal(cs.suffix.sum(axis=2), ((tr.prompt_lens - cs.cached_tokens) * SMALL.top_k)[:, None]
                              .repeat(SMALL.num_layers, axis=1))


def test_prefix_cache_ablation_measures(work):
    setup = ex.prefix_setup(work, small_cost(), 2, n_pairs=300)
    assert setup.calib.n_requests + setup.pool.n_requests == work.trace.n_requests
    assert not set(work.conversation[work.rows_of(setup.calib.request_ids)]) & set(
        work.conversation[work.rows_of(setup.pool.request_ids)])  # split by conversation
    pc = ex.prefix_cache_ablation(setup, work, rate=320, capacity_blocks=[4000, 40], block_size=BS, in_flight=2,
                                  sessions=4, output_len=8)
    modes = pc["prefix_cache"].tolist()
    assert modes[:5] == ["full prefill", "co-indexed", "suffix only", "co-indexed", "suffix only"]
    assert modes[5].startswith("best baseline")
    full, co_big, suf_big, co_small, suf_small = (pc.iloc[i] for i in range(5))
    for co in (co_big, co_small):
        assert bool(co["counts_equal_full"]) and co["signature_err"] == full["signature_err"]
        assert co["tpot_ms_p50"] == full["tpot_ms_p50"] and co["tpot_ms_p99"] == full["tpot_ms_p99"]
    assert abs(full["signature_err"]) < 1e-9
    assert suf_big["signature_err"] > 0.01 and not bool(suf_big["counts_equal_full"])
    assert co_big["hit_rate"] > co_small["hit_rate"] > 0 and co_small["evictions"] > 0 == co_big["evictions"]
    # fewer hits leave more of the prompt to compute: the suffix-only signature is closer to the full one
    assert suf_small["signature_err"] < suf_big["signature_err"]
    # where each request was routed: co-indexed routes exactly as full prefill; equal routes are the same run
    n = setup.pool.n_requests
    assert len(full["workers"]) == n and co_big["workers"] == full["workers"] and co_big["rerouted"] == 0
    assert suf_big["rerouted"] == sum(a != b for a, b in zip(suf_big["workers"], full["workers"]))
    for a, b in ((suf_big, suf_small), (suf_big, full)):
        if a["workers"] == b["workers"]:
            assert a["tpot_ms_p50"] == b["tpot_ms_p50"] and a["tpot_ms_p99"] == b["tpot_ms_p99"]
    # the cache sizes: the big one holds every prompt (never evicts), the small one cannot
    assert co_big["prompt_blocks"] == int((-(-setup.pool.prompt_lens // BS)).sum()) <= 4000
    assert co_small["prompt_blocks"] > 40 and sum(suf_small["cached_tokens"]) < sum(suf_big["cached_tokens"])


def test_bad_parameters(work):
    rows = np.arange(work.trace.n_requests)
    arrival = conversation_arrivals(work, rows, sim_rate=20)
    for kw, name in ((dict(turns_mean=0.5), "turns_mean"), (dict(max_turns=0), "max_turns"),
                     (dict(turns_mean=6.0, max_turns=5), "turns_mean"), (dict(user_tokens_mean=0), "user_tokens_mean"),
                     (dict(reply_tokens_mean=0), "reply_tokens_mean"), (dict(turn_sigma=-1.0), "turn_sigma")):
        with pytest.raises(ValueError, match=name):
            ConversationConfig(**kw).validate()
    with pytest.raises(ValueError, match="n_conversations"):
        generate_conversations(0, SMALL, CONV)
    with pytest.raises(ValueError, match="capacity_blocks"):
        cache_signatures(work, rows, arrival, block_size=BS, capacity_blocks=3)
    with pytest.raises(ValueError, match="block_size"):
        cache_signatures(work, rows, arrival, block_size=0)
    with pytest.raises(ValueError, match="in_flight"):
        cache_signatures(work, rows, arrival, block_size=BS, in_flight=0)
    with pytest.raises(ValueError, match="arrival_s"):
        cache_signatures(work, rows, arrival[:-1], block_size=BS)
    with pytest.raises(ValueError, match="rows"):
        cache_signatures(work, rows + 10_000, arrival, block_size=BS)
    with pytest.raises(ValueError, match="rate"):
        conversation_arrivals(work, rows, sim_rate=0)
    with pytest.raises(ValueError, match="sessions"):
        conversation_arrivals(work, rows, sim_rate=1, sessions=0)
    with pytest.raises(ValueError, match="request_ids"):
        work.rows_of(["nope"])
    setup = ex.prefix_setup(work, small_cost(), 2, n_pairs=300)
    with pytest.raises(ValueError, match="capacity_blocks"):
        ex.prefix_cache_ablation(setup, work, capacity_blocks=[], block_size=BS)
    with pytest.raises(ValueError, match="n_workers"):
        ex.prefix_setup(work, small_cost(), 500)
