"""ELDR: signatures, balanced K-means, routers, signature cache, simulator, synthetic workload."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.costmodel import DecodeStepModel, ModelShape
from moelab.eldr.cache import SignatureCache
from moelab.eldr.partition import align_centroids, balanced_assign, spherical_kmeans
from moelab.eldr.routing import DomainOracleRouter, ELDRRouter
from moelab.eldr.signature import SignatureBuilder, decode_recall, greedy_layer_mask, predictability
from moelab.eldr.sim import pack_expert_bits, poisson_requests, simulate
from moelab.eldr.workload import SyntheticConfig, distinct_reduction, fit_domain_spread, generate
from moelab.routers import make_router
from moelab.routing import ClusterView, RequestBatch
from moelab.traces import ExpertTrace, Geometry, RequestTrace, expert_counts

SMALL = SyntheticConfig(num_layers=6, num_experts=32, top_k=4, model_name="small", n_domains=4,
                        prompt_len_mean=80, prefix_tokens=16, decode_tokens=8)


@pytest.fixture(scope="module")
def small_workload():
    return generate(240, SMALL, seed=3)


def small_cost(num_layers: int = 6, num_experts: int = 32, top_k: int = 4) -> DecodeStepModel:
    shape = ModelShape(num_layers, 512, 8, 2, 64, 1000, num_experts=num_experts, top_k=top_k, expert_ffn=256)
    return DecodeStepModel.h200(shape)


# ---------------------------------------------------------------- signatures

def test_signature_idf_and_unit_norm(small_workload):
    tr = small_workload.trace
    sb = SignatureBuilder("count_idf", "all").fit(tr)
    n = tr.n_requests
    df = (tr.prefill_counts > 0).sum(axis=0)
    assert np.allclose(sb.idf, np.log((n + 1) / (df + 1)))
    v = sb.transform(tr)
    # coordinates with idf == 0 (experts every request used) are dropped: zero everywhere, cosine unchanged
    assert v.shape == (n, sb.dim) == (n, int((sb.idf > 0).sum()))
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0)
    x = tr.prefill_counts[0] * sb.idf
    assert np.allclose(v[0], x.ravel()[sb.columns] / np.linalg.norm(x))
    assert np.allclose(v @ v.T, sb.transform(tr.prefill_counts * 1.0) @ v.T)


def test_signature_greedy_mask_and_report(small_workload):
    tr = small_workload.trace
    sb = SignatureBuilder(n_pairs=2000).fit(tr)
    assert sb.mask.dtype == bool and 1 <= sb.mask.sum() <= SMALL.num_layers
    rep = sb.report(tr, n_pairs=2000)
    assert -1 <= rep["rho"] <= 1 and 0 <= rep["recall"] <= 1 and -1 <= rep["rho_idf_decode"] <= 1
    # each rho scores against decode profiles weighted one way: the raw-count signature is scored on its own
    # weighting by rho, the idf one by rho_idf_decode (so each kind does better on the rho of its own weighting)
    raw = SignatureBuilder("count", "all", n_pairs=2000).fit(tr).report(tr, n_pairs=2000)
    idf = SignatureBuilder("count_idf", "all", n_pairs=2000).fit(tr).report(tr, n_pairs=2000)
    assert raw["rho"] - idf["rho"] > raw["rho_idf_decode"] - idf["rho_idf_decode"]
    # the kept prefix is the best greedy prefix: its correlation is the peak of the curve
    mask, curve, order = greedy_layer_mask(tr.prefill_counts * sb.idf, tr.decode_profiles(), n_pairs=2000)
    assert mask[order[int(np.argmax(curve))]] and mask.sum() == int(np.argmax(curve)) + 1


def test_greedy_summary_says_where_the_curve_is_measured_and_why_it_stops(small_workload):
    tr = small_workload.trace
    sb = SignatureBuilder(n_pairs=2000).fit(tr)
    summary = sb.greedy_summary()
    assert summary["calibration_requests"] == tr.n_requests and summary["layers_tried"] == len(sb.curve)
    assert summary["layers_kept"] == int(sb.mask.sum()) and summary["best_rho"] == max(sb.curve)
    # the rule: it stops only after `patience` additions in a row without a new best, else it tries every layer
    sb.patience = 1
    sb.fit(tr)
    s1 = sb.greedy_summary()
    after_best = s1["layers_tried"] - s1["layers_kept"]
    assert (s1["stopped_early"] and after_best == 1) or (not s1["stopped_early"] and s1["layers_tried"] == SMALL.num_layers)
    with pytest.raises(ValueError, match="greedy"):
        SignatureBuilder("count", n_pairs=2000).fit(tr).greedy_summary()
    from moelab.viz import eldr as viz  # lazy: plotly only for the caption check

    fig = viz.fig_greedy_curve(sb.curve, calibration_requests=tr.n_requests, patience=sb.patience)
    assert f"the {tr.n_requests} calibration requests" in fig.layout.title.text
    assert "stops after 1 additions without a new best" in fig.layout.xaxis.title.text


def test_signature_gate_prob_and_count(small_workload):
    tr = small_workload.trace
    for kind in ("count", "gate_prob"):
        sb = SignatureBuilder(kind).fit(tr)
        assert sb.mask.all() and np.allclose(np.linalg.norm(sb.transform(tr), axis=1), 1)


def test_signature_bad_input(small_workload):
    tr = small_workload.trace
    with pytest.raises(ValueError, match="kind"):
        SignatureBuilder("tfidf")
    with pytest.raises(ValueError, match="not fitted"):
        SignatureBuilder().transform(tr.prefill_counts)
    sb = SignatureBuilder("count").fit(tr)
    with pytest.raises(ValueError, match="signal must have shape"):
        sb.transform(np.ones((2, SMALL.num_layers, SMALL.num_experts + 1)))
    with pytest.raises(ValueError, match="layer_mask"):
        SignatureBuilder("count", np.zeros(SMALL.num_layers, bool)).fit(tr)


def test_predictability_perfect_and_recall():
    rng = np.random.default_rng(0)
    x = rng.poisson(3.0, size=(50, 3, 10)).astype(float)
    assert predictability(x, x, n_pairs=500)["rho"] == pytest.approx(1.0)
    assert decode_recall(x, x) == pytest.approx(1.0)
    assert decode_recall(-x, (x > 4).astype(float)) < 0.5  # inverted prefill predicts the wrong experts


# ---------------------------------------------------------------- balanced K-means

@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 60), k=st.integers(1, 9), d=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_balanced_kmeans_never_exceeds_capacity(n, k, d, seed):
    k = min(k, n)
    X = np.random.default_rng(seed).standard_normal((n, d))
    res = spherical_kmeans(X, k, balanced=True, seed=seed, max_iter=10)
    assert res.sizes.max() <= math.ceil(n / k)
    assert res.sizes.sum() == n
    assert np.allclose(np.linalg.norm(res.centroids, axis=1), 1.0)


def test_balanced_assign_is_optimal_small():
    import itertools

    rng = np.random.default_rng(1)
    sim = rng.random((5, 2))
    labels = balanced_assign(sim, cap=3)
    best = max((lab for lab in itertools.product(range(2), repeat=5) if max(np.bincount(lab, minlength=2)) <= 3),
               key=lambda lab: sim[np.arange(5), lab].sum())
    assert sim[np.arange(5), labels].sum() == pytest.approx(sim[np.arange(5), best].sum())


def test_vanilla_kmeans_can_be_unbalanced_and_align():
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.normal([5, 0, 0], 0.1, (40, 3)), rng.normal([0, 5, 0], 0.1, (4, 3))])
    van = spherical_kmeans(X, 2, balanced=False, seed=0)
    bal = spherical_kmeans(X, 2, balanced=True, seed=0)
    assert sorted(van.sizes) == [4, 40] and bal.sizes.max() == 22
    C = bal.centroids
    assert np.allclose(align_centroids(C, C[::-1]), C)
    with pytest.raises(ValueError, match="K"):
        spherical_kmeans(X, 0)


# ---------------------------------------------------------------- routers

def _view(load, free=None):
    load = np.asarray(load)
    return ClusterView(load, np.zeros_like(load), np.full(load.size, 100) if free is None else free)


def test_eldr_band_tau_zero_and_large():
    C = np.eye(4)
    sig = np.array([[0.9, 0.5, 0.0, 0.0]])
    r = ELDRRouter(C, tau=0.0)
    assert r.route(RequestBatch([10], sig), _view([9, 0, 0, 0]))[0] == 0  # pure locality ignores load
    r = ELDRRouter(C, tau=0.5)
    assert r.route(RequestBatch([10], sig), _view([9, 0, 0, 0]))[0] == 1  # band {0,1}: least loaded
    r = ELDRRouter(C, tau=2.0)  # everything in the band: JSQ
    assert r.route(RequestBatch([10], sig), _view([9, 3, 1, 2]))[0] == 2
    # full workers are skipped; a batch updates the load as it goes
    r = ELDRRouter(C, tau=0.0)
    out = r.route(RequestBatch([1, 1, 1], np.repeat(sig, 3, 0)), _view([0, 0, 0, 0], free=np.array([2, 5, 5, 5])))
    assert list(out) == [0, 0, 1]


def test_eldr_bad_input_and_registry():
    with pytest.raises(ValueError, match="tau"):
        ELDRRouter(np.eye(2), tau=-0.1)
    r = make_router("eldr", centroids=np.eye(3), tau=0.1)
    assert isinstance(r, ELDRRouter)
    with pytest.raises(ValueError, match="signature must have dimension 3"):
        r.route(RequestBatch([1], np.ones((1, 4))), _view([0, 0, 0]))
    with pytest.raises(ValueError, match="signature is required"):
        r.route(RequestBatch([1]), _view([0, 0, 0]))
    with pytest.raises(ValueError, match="n_workers"):
        r.reset(4)
    with pytest.raises(ValueError, match="router must be one of"):
        make_router("eldr_plus")
    with pytest.raises(ValueError, match="n_workers"):
        ELDRRouter(np.eye(2)).reset(0)


def test_eldr_router_help_explains_its_guards_itself():
    """help(ELDRRouter) (what the API reference renders) says what spill and min_band do, with their defaults,
    rather than pointing at the module docstring the reference does not show."""
    import inspect

    doc = inspect.getdoc(ELDRRouter)
    assert "module docstring" not in doc
    assert "(1 + spill) * m + 1" in doc and "sigma" in doc and "default 1.0" in doc
    assert "min_band" in doc and "default 1: off" in doc


def test_prepare_documents_and_checks_its_parameters(small_workload):
    import inspect

    from moelab.eldr import experiments as ex

    doc = inspect.getdoc(ex.prepare)
    for p in inspect.signature(ex.prepare).parameters:
        assert f"{p} : " in doc, p
    with pytest.raises(ValueError, match="n_pairs must be"):
        ex.prepare(small_workload.trace, small_cost(), 4, n_pairs=3)
    with pytest.raises(ValueError, match="calib_frac"):
        ex.prepare(small_workload.trace, small_cost(), 4, calib_frac=1.0)


def test_domain_oracle_groups():
    r = make_router("domain_oracle", n_domains=2)
    assert isinstance(r, DomainOracleRouter)
    out = [int(r.route(RequestBatch([1], domain=[1]), _view([0, 0, 0, 0]))[0]) for _ in range(3)]
    assert set(out) <= {2, 3}
    with pytest.raises(ValueError, match="domain"):
        r.route(RequestBatch([1], domain=[5]), _view([0, 0, 0, 0]))


def test_domain_oracle_worker_groups_and_their_description():
    # more workers than domains: contiguous groups, one domain per worker
    g = DomainOracleRouter.worker_groups(2, 4)
    assert g.tolist() == [[True, True, False, False], [False, False, True, True]]
    assert "own fixed group of 2 workers" in DomainOracleRouter.describe_groups(2, 4)
    # more domains than workers: domain d -> worker d mod K alone, two domains per worker, no choice
    g = DomainOracleRouter.worker_groups(8, 4)
    assert (g.sum(axis=1) == 1).all() and (g.sum(axis=0) == 2).all()
    assert [int(np.flatnonzero(row)[0]) for row in g] == [d % 4 for d in range(8)]
    text = DomainOracleRouter.describe_groups(8, 2)
    assert "8 domains on K = 2 workers" in text and "serves 4 domains" in text and "no worker to choose" in text
    assert "serves 1 to 2 domains" in DomainOracleRouter.describe_groups(3, 2)
    # the router routes by exactly this map
    r = make_router("domain_oracle", n_domains=8)
    r.reset(4)
    assert (r._groups == DomainOracleRouter.worker_groups(8, 4)).all()
    assert int(r.route(RequestBatch([1], domain=[6]), _view([0, 0, 0, 0]))[0]) == 2


# ---------------------------------------------------------------- signature cache

@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_cached_signature_equals_full_prefill(data):
    """Random prompts sharing random prefixes, random block sizes, evictions: the signature from
    the block table (cached blocks included) equals the full-prefill signature exactly."""
    L, E, k = 3, 8, 2
    block = data.draw(st.integers(1, 6), label="block_size")
    capacity = data.draw(st.integers(4, 40), label="capacity")
    cache = SignatureCache(block, L, E, capacity)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000), label="seed"))
    # routing is a deterministic function of the prefix (causal attention): ids of token i depend on tokens[:i+1]
    def route_ids(tokens: np.ndarray) -> np.ndarray:
        h = np.cumsum(tokens * 2654435761 % 9973) % 1_000_003
        return ((h[:, None, None] * (np.arange(L)[None, :, None] + 1) * (np.arange(k)[None, None, :] + 7)) % E).astype(np.int16)

    stems = [rng.integers(0, 50, size=rng.integers(0, 12)) for _ in range(3)]
    live: list[str] = []
    seen: list[np.ndarray] = []
    for i in range(data.draw(st.integers(1, 16), label="n_requests")):
        stem = stems[rng.integers(len(stems))]
        if seen and data.draw(st.booleans(), label="repeat a prompt"):  # re-admission after partial eviction
            tokens = seen[rng.integers(len(seen))]
        else:
            tokens = np.concatenate([stem, rng.integers(0, 50, size=rng.integers(1, 10))]).astype(np.int64)
        seen.append(tokens)
        ids = route_ids(tokens)
        need = -(-tokens.size // block)
        while live and cache.free_blocks < need:  # finish requests so blocks can be evicted
            cache.release(live.pop(0))
        if cache.free_blocks < need:
            continue
        # the cached part of the prompt is never read: poison exactly the rows a hit will serve
        hit = cache.lookup(tokens)
        poisoned = ids.copy()
        poisoned[:hit] = (poisoned[:hit] + 1) % E
        adm = cache.admit(f"r{i}", tokens, poisoned)
        assert adm.cached_tokens == hit
        assert np.array_equal(cache.counts(f"r{i}"), expert_counts(ids, E))
        assert adm.cached_tokens + adm.computed_tokens == tokens.size
        live.append(f"r{i}")
        if data.draw(st.booleans(), label="release"):
            cache.release(live.pop(0))
        # the key index and the block index always describe each other
        assert all(cache._key_of[b] == key for key, b in cache._block_of.items())
        assert len(cache._key_of) == len(cache._block_of)
    for rid in live:
        assert cache.counts(rid).sum() == cache.hist[list(cache.tables[rid])].astype(np.int64).sum()


def test_cache_reuses_prefix_without_reading_it():
    L, E = 2, 4
    cache = SignatureCache(2, L, E, 8)
    tokens = np.arange(5)
    ids = np.zeros((5, L, 1), np.int16)
    ids[:, :, 0] = np.array([0, 1, 2, 3, 0])[:, None]
    a = cache.admit("a", tokens, ids)
    assert a.cached_tokens == 0 and len(a.blocks) == 3
    poisoned = ids.copy()
    poisoned[:4] = 3  # the first two full blocks are cached: these rows must not be read
    b = cache.admit("b", tokens, poisoned)
    assert b.cached_tokens == 4 and b.blocks[:2] == a.blocks[:2] and b.blocks[2] != a.blocks[2]
    assert np.array_equal(cache.counts("b"), expert_counts(ids, E))
    cache.release("a")
    cache.release("b")
    assert cache.cached_blocks == 2 and cache.free_blocks == 8
    with pytest.raises(ValueError, match="not admitted"):
        cache.counts("a")
    full = SignatureCache(1, L, E, 2)
    full.admit("x", np.arange(2), ids[:2])
    with pytest.raises(RuntimeError, match="full"):
        full.admit("y", np.arange(10, 12), ids[:2])
    assert full.free_blocks == 0 and "y" not in full.tables


# ---------------------------------------------------------------- simulator

def _tiny_trace() -> ExpertTrace:
    g = Geometry(2, 8, 2, "tiny")
    dec = [np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]]]), np.array([[[4, 5], [6, 7]], [[0, 5], [2, 7]]])]
    counts = np.array([[[2, 2, 0, 0, 0, 0, 0, 0], [0, 0, 2, 2, 0, 0, 0, 0]],
                       [[0, 0, 0, 0, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0, 2, 2]]])
    return ExpertTrace.from_requests(request_ids=["a", "b"], domains=["x", "y"], prompt_tokens=[np.arange(2), np.arange(2)],
                                     prefill_counts=counts, decode_ids=dec, geometry=g)


def test_simulator_matches_hand_computation():
    tr = _tiny_trace()
    cost = small_cost(2, 8, 2)
    bits = pack_expert_bits(tr)
    assert np.bitwise_count(bits).sum(axis=2).max() == 2
    reqs = RequestTrace(np.array([0.0, 0.0]), np.array([2, 2]), np.array([3, 3]), domain=np.array([0, 1]),
                        trace_row=np.array([0, 1]), trace_offset=np.array([0, 0]))
    res = simulate(reqs, make_router("round_robin"), cost, n_workers=1, trace=tr)
    st = res.steps
    assert list(st["batch"]) == [1, 2, 2, 1]  # the second request joins at the first step boundary
    # distinct experts of each step agree with ExpertTrace.distinct_experts
    assert st["sum_distinct"].iloc[1] == tr.distinct_experts(np.array([0, 1]), np.array([1, 0])).sum()
    assert st["sum_distinct"].iloc[2] == tr.distinct_experts(np.array([0, 1]), np.array([2, 1])).sum()
    ms = cost.step_ms(1, st["sum_distinct"].iloc[0], 2)
    assert st["step_ms"].iloc[0] == pytest.approx(float(ms))
    assert np.allclose(st["step_ms"], cost.step_ms(st["batch"], st["sum_distinct"], [2, 5, 7, 4]))
    assert res.first_token_s[0] == pytest.approx(st["step_ms"].iloc[0] / 1e3)
    assert res.finish_s[0] == pytest.approx(st["step_ms"].iloc[:3].sum() / 1e3)
    assert np.isfinite(res.finish_s).all()


def test_simulator_bad_input(small_workload):
    tr = small_workload.trace
    reqs = poisson_requests(tr, sim_rate=10, n_requests=20, output_len=8)
    with pytest.raises(ValueError, match="geometry"):
        simulate(reqs, make_router("jsq"), small_cost(6, 64, 4), n_workers=2, trace=tr)
    with pytest.raises(ValueError, match="n_workers"):
        simulate(reqs, make_router("jsq"), small_cost(), n_workers=0, trace=tr)
    with pytest.raises(ValueError, match="signatures"):
        simulate(reqs, make_router("jsq"), small_cost(), n_workers=2, trace=tr, signatures=np.ones((3, 4)))
    with pytest.raises(ValueError, match="sim_rate"):
        poisson_requests(tr, sim_rate=0, n_requests=5)


def test_eldr_reduces_distinct_experts(small_workload):
    from moelab.eldr.experiments import gains, prepare, rate_sweep

    setup = prepare(small_workload.trace, small_cost(), 4, n_pairs=2000)
    df = rate_sweep(setup, rates=(2400.0,), routers=("jsq", "round_robin", "eldr", "domain_oracle"), n_requests=400,
                    output_len=64)
    g = gains(df)
    assert len(g) == 1
    row = df.set_index("router")
    assert row.loc["eldr", "distinct_per_layer_step"] < row.loc["jsq", "distinct_per_layer_step"]
    assert row.loc["domain_oracle", "distinct_per_layer_step"] < row.loc["jsq", "distinct_per_layer_step"]
    assert (df["n_requests"] == 400).all()


# ---------------------------------------------------------------- workload

def test_synthetic_workload_shape_and_labels(small_workload):
    tr = small_workload.trace
    assert tr.provenance["backend"] == "synthetic" and "synthetic" in tr.geometry.model_name
    assert np.array_equal(tr.prefill_counts.sum(axis=2), np.repeat(tr.prompt_lens[:, None] * SMALL.top_k, 6, axis=1))
    dec = tr.decode_ids
    assert all(len(np.unique(row)) == SMALL.top_k for row in dec[:50].reshape(-1, SMALL.top_k))
    assert (small_workload.prefix_counts <= tr.prefill_counts).all()
    red = distinct_reduction(tr, batch=8, n_batches=40)
    assert red["distinct_same_domain"] < red["distinct_mixed"]
    from dataclasses import replace

    sub = generate(40, replace(SMALL, subtopics=3, subtopic_sigma=0.5, mix_max=0.3), seed=1).trace
    assert sub.n_requests == 40 and sub.prefill_counts.shape == (40, 6, 32)
    with pytest.raises(ValueError, match="mix_max"):
        generate(4, replace(SMALL, mix_max=0.9))


def test_domain_spread_from_real_counts(public_data):
    sp = fit_domain_spread("olmoe")
    assert sp.depth[0] == 0 and sp.depth[-1] == 1
    assert (sp.sigma_domain > 0.3).all() and sp.sigma_domain[-1] > sp.sigma_domain[0]
    sg, sd = sp.at(48)
    assert sg.shape == sd.shape == (48,)
    with pytest.raises(ValueError, match="n_requests"):
        generate(0, SMALL)


def test_online_refit_realigns_to_workers():
    from moelab.eldr.partition import OnlineRefitter

    rng = np.random.default_rng(4)
    C = np.eye(3)
    refit = OnlineRefitter(window_s=1.0, every_s=0.5, min_points=30, seed=0)
    r = ELDRRouter(C, tau=0.0, refit=refit).reset(3)
    # the traffic drifts: cluster j now sits near (e_j + 0.3 e_{j+1}); refits must keep worker j on cluster j
    t = 0.0
    for _ in range(90):
        j = int(rng.integers(3))
        v = np.eye(3)[j] + 0.3 * np.eye(3)[(j + 1) % 3] + rng.normal(0, 0.02, 3)
        t += 0.02
        view = _view([0, 0, 0])
        view.time_s = t
        assert r.route(RequestBatch([1], v / np.linalg.norm(v)), view)[0] == j
    assert refit.n_refits >= 1
    assert np.all(np.argmax(r.centroids, axis=1) == np.arange(3))
    assert not np.allclose(r.centroids, np.eye(3))


def test_cost_model_from_hf_config():
    cfg = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 2, "num_hidden_layers": 4,
           "vocab_size": 5000, "model_type": "qwen3_moe"}
    m = DecodeStepModel.from_hf_config(cfg)
    m.check_geometry(4, 16, 2)
    assert m.shape.moe.expert_bytes == 3 * 256 * 128 * 2
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        DecodeStepModel.from_hf_config({k: v for k, v in cfg.items() if k != "num_experts_per_tok"})


def test_calibrate_picks_from_grid(public_data):
    from dataclasses import replace

    from moelab.eldr.calibration import calibrate_workload

    res = calibrate_workload(replace(SMALL, n_domains=2), n_requests=64, knobs=("request_sigma",),
                             grids={"request_sigma": (0.5, 2.0)}, batch=8, n_pairs=400)
    cfg, rows = res.config, res.points.to_dict("records")
    grid = [r for r in rows if r["step"].startswith("sweep")]
    assert {r["request_sigma"] for r in grid} >= {0.5, 2.0} and cfg.request_sigma in {r["request_sigma"] for r in rows}
    assert all({"rho_raw", "rho_count_idf", "reduction_pct"} <= set(r) for r in rows)


def test_user_trace_runs_unchanged(small_workload, tmp_path):
    """(c) any saved ExpertTrace + its model's HF config goes through the same pipeline unchanged."""
    import json

    from moelab.eldr.experiments import gains, prepare, rate_sweep

    path = small_workload.trace.save(tmp_path / "user_trace")
    cfg = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
           "moe_intermediate_size": 256, "num_experts": 32, "num_experts_per_tok": 4, "num_hidden_layers": 6}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    trace = ExpertTrace.load(path)
    cost = DecodeStepModel.from_hf_config(str(tmp_path / "config.json"))
    setup = prepare(trace, cost, 4, n_pairs=500)
    df = rate_sweep(setup, rates=(1200.0,), routers=("jsq", "eldr"), n_requests=100, output_len=32)
    assert len(gains(df)) == 1 and df["n_requests"].eq(100).all()
    cfg["num_experts"] = 64
    with pytest.raises(ValueError, match="geometry"):
        prepare(trace, DecodeStepModel.from_hf_config(cfg), 4)


def test_rate_for_batch_hits_the_batch(small_workload):
    from moelab.eldr.experiments import prepare, rate_for_batch, run_one

    setup = prepare(small_workload.trace, small_cost(), 4, n_pairs=500)
    rate = rate_for_batch(setup, 16, 64)
    m = run_one(setup, "jsq", rate=rate, n_requests=600, output_len=64)
    assert 8 <= m["mean_batch"] <= 24


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12), tau=st.sampled_from([0.0, 0.05, 0.2, 1.0, 2.0]),
       full=st.integers(0, 11), guards=st.sampled_from([(1, None), (2, 0.25), (3, 0.0)]))
def test_eldr_decision_is_least_loaded_in_open_band(seed, k, tau, full, guards):
    """Both the one-request fast path and the batch path pick a least-loaded worker of the band
    computed among workers with a free slot — widened to ``min_band`` workers and spilled to the
    globally least-loaded one as the module docstring says (reference implementation in float64)."""
    from hypothesis import assume

    min_band, spill = guards
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((k, 5))
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    v = rng.standard_normal(5)
    v /= np.linalg.norm(v)
    load = rng.integers(0, 3, k)
    free = np.full(k, 4)
    free[rng.permutation(k)[: min(full, k - 1)]] = 0
    s = np.where(free > 0, C @ v, -np.inf)
    fin = np.sort(s[np.isfinite(s)])
    assume(np.all(np.abs(fin - (fin[-1] - tau)) > 1e-4) and np.all(np.diff(fin) > 1e-4))  # no float32 edge
    open_ = np.flatnonzero(free > 0)
    band = np.flatnonzero(s >= s.max() - tau)
    want = min(min_band, open_.size)
    if tau > 0 and band.size < want:
        band = np.argsort(-s)[:want]
    if tau > 0 and spill is not None and load[band].min() > (1 + spill) * load[open_].min() + 1:
        band = open_
    for batch_path in (False, True):
        r = ELDRRouter(C, tau=tau, seed=seed, min_band=min_band, spill=spill).reset(k)
        b = RequestBatch([3, 3], np.stack([v, v])) if batch_path else RequestBatch([3], v[None])
        w = int(r.route(b, _view(load, free))[0])
        assert free[w] > 0 and w in band
        assert load[w] == load[band].min()


def test_hostile_inputs_refused():
    from moelab.eldr.cache import SignatureCache
    from moelab.eldr.partition import MAX_BALANCED_N, spherical_kmeans

    cache = SignatureCache(4, 2, 8, 16)
    with pytest.raises(ValueError, match="integer token ids"):
        cache.lookup(np.array([1.7, 2.2, 3.0, 4.0]))
    with pytest.raises(ValueError, match=">= 0"):
        cache.lookup(np.array([1, -2, 3, 4]))
    with pytest.raises(ValueError, match="MAX_BALANCED_N"):
        spherical_kmeans(np.ones((MAX_BALANCED_N + 1, 2)), 2)


def test_adjusted_rand_index_known_values():
    from moelab.eldr.experiments import adjusted_rand_index

    a = np.array([0, 0, 1, 1, 2, 2])
    assert adjusted_rand_index(a, a) == 1.0
    assert adjusted_rand_index(a, np.array([5, 5, 7, 7, 9, 9])) == 1.0  # label names do not matter
    # by hand: contingency [[2, 0], [1, 1]]: sum C(n_ij, 2) = 1, rows 1 + 1 = 2, columns 3 + 0 = 3, pairs 6,
    # expected 2 * 3 / 6 = 1, so ARI = (1 - 1) / (2.5 - 1) = 0; and [[2, 0], [0, 1], [0, 1]] vs [[2, 0], [0, 2]]
    assert math.isclose(adjusted_rand_index([0, 0, 1, 1], [0, 0, 0, 1]), 0.0, abs_tol=1e-12)
    assert math.isclose(adjusted_rand_index([0, 0, 1, 2], [0, 0, 1, 1]), (1 - 1 * 2 / 6) / (0.5 * (1 + 2) - 1 * 2 / 6))
    with pytest.raises(ValueError, match="same length"):
        adjusted_rand_index([0, 1], [0, 1, 2])


def test_default_sweep_gains_and_paper_table(small_workload):
    from moelab.eldr import experiments as ex

    setup = ex.prepare(small_workload.trace, small_cost(), 4, n_pairs=500)
    df = ex.default_sweep(setup, rates=[20, 60], ks=[4, 8], n_requests=60, output_len=16)
    assert set(df["n_workers"]) == {4, 8} and len(df) == 2 * 2 * (len(ex.BASELINES) + 1)
    g = ex.sweep_gains(df)
    assert len(g) == 4 and {"p50_gain_pct", "p99_gain_pct"} <= set(g.columns)
    row = df[(df["n_workers"] == 8) & (df["rate"] == 60)]
    best = row[row["router"] != "eldr"]["tpot_ms_p99"].min()
    eldr = row[row["router"] == "eldr"]["tpot_ms_p99"].iloc[0]
    got = g[(g["n_workers"] == 8) & (g["rate"] == 60)]["p99_gain_pct"].iloc[0]
    assert math.isclose(got, 100 * (1 - eldr / best))
    # two-sided table: the paper's rates we ran, our gain, the real-trace gain and the ratios
    cmp = ex.compare_with_paper(df[df["n_workers"] == 4], real=df[df["n_workers"] == 8])
    assert list(cmp["rate"]) == [20.0, 60.0]
    assert np.allclose(cmp["ratio_synthetic"], cmp["tpot_gain_pct"] / cmp["paper_gain_pct"])
    assert np.allclose(cmp["ratio_real"], cmp["real_tpot_gain_pct"] / cmp["paper_gain_pct"])
    assert ex.paper_peak_rate() in set(ex.paper_gains()["rate"])
    # the gain budget: the expert share of the best baseline's step, the direct gain and the paper's batch estimate
    four = df[df["n_workers"] == 4]
    b = ex.gain_budget(four, setup)
    assert list(b["rate"]) == [20.0, 60.0]
    g4 = ex.gains(four)
    for r, g_row in zip(b.to_dict("records"), g4.to_dict("records")):
        base = four[(four["rate"] == r["rate"]) & (four["router"] == g_row["best_baseline"])].iloc[0]
        share = 100 * setup.cost.coefficients(base["mean_batch"])[1] * SMALL.num_layers * g_row["baseline_distinct"] \
            / g_row["baseline_tpot_ms_p50"]
        assert 0 < r["expert_share_pct"] < 100 and math.isclose(r["expert_share_pct"], share)
        assert math.isclose(r["direct_gain_pct"], r["distinct_reduction_pct"] * share / 100)
        paper = ex.paper_gains().set_index("rate").loc[r["rate"], "paper_baseline_tpot_ms_p50"]
        assert math.isclose(r["paper_batch_estimate"], base["mean_batch"] * paper / g_row["baseline_tpot_ms_p50"])


def test_projection_cost_keeps_trace_geometry(small_workload):
    from moelab.costmodel import MODEL_SHAPES
    from moelab.eldr.experiments import projection_cost

    c = projection_cost(small_workload.trace)
    g = small_workload.trace.geometry
    c.check_geometry(g.num_layers, g.num_experts, g.top_k)
    assert c.shape.moe.expert_bytes == MODEL_SHAPES["qwen3-30b-a3b"].moe.expert_bytes  # Qwen3-sized experts
    assert "projection" in c.shape.source


def test_projection_cost_prices_on_a_users_own_calibration_folder(small_workload, tmp_path):
    import shutil

    from moelab.costmodel.tables import calibration_folder
    from moelab.eldr.experiments import projection_cost

    for name in ("moe_step", "attn_step", "decode_layer"):
        shutil.copy(calibration_folder("h200") / f"{name}.csv", tmp_path / f"{name}.csv")
    h200 = projection_cost(small_workload.trace)
    same = projection_cost(small_workload.trace, calibration=tmp_path)  # the H200 tables under another name
    assert float(same.step_ms(8, 8 * 512, 40)) == pytest.approx(float(h200.step_ms(8, 8 * 512, 40)))
    import pandas as pd

    attn = pd.read_csv(tmp_path / "attn_step.csv")
    attn.assign(ms_attn_core=attn["ms_attn_core"] * 3).to_csv(tmp_path / "attn_step.csv", index=False)
    slower = projection_cost(small_workload.trace, calibration=str(tmp_path))  # a GPU with 3x slower attention
    assert float(slower.step_ms(8, 8 * 4096, 40)) > float(h200.step_ms(8, 8 * 4096, 40))
    with pytest.raises(ValueError, match="calibration must be a bundled GPU"):
        projection_cost(small_workload.trace, calibration="no-such-gpu")


@pytest.mark.slow
def test_regime_map_grid_and_prefix_ablation(small_workload):
    from moelab.eldr import experiments as ex

    rm = ex.regime_map((0.5, 1.5), rates=[60], ks=[4], taus=[0.0, 0.1], n_trace=64, n_requests=40, output_len=8,
                       n_pairs=300)
    assert len(rm) == 2 * 2 and set(rm["tau"]) == {0.0, 0.1}
    assert rm.groupby("domain_scale")["rho"].nunique().eq(1).all()  # one measured rho per generated workload
    assert np.isfinite(rm[["p50_gain_pct", "p99_gain_pct", "oracle_gap_pct"]].to_numpy()).all()
    assert (rm["eldr_mean_batch"] >= 1).all()  # a step holds at least one request: what the map's star is set against
    with pytest.raises(ValueError, match="scale"):
        ex.regime_map((-1.0,), rates=[60], ks=[4], n_trace=64, n_requests=10, output_len=4, n_pairs=300)
    # the prefix-cache ablation on its shared-prefix conversation workload: tests/test_eldr_prefix.py


def test_decode_drift_within_a_request():
    """drift_walk moves a request's decode routing while it generates: its first and last decode tokens
    share fewer experts than without it (same seed, everything else equal)."""
    from dataclasses import replace

    def overlap(walk: float) -> float:
        cfg = replace(SMALL, decode_tokens=16, drift_walk=walk, mix_max=0.0, subtopics=1)
        t = generate(60, cfg, seed=1).trace
        ids = t.decode_ids.reshape(60, 16, cfg.num_layers, cfg.top_k)
        a = np.stack([expert_counts(ids[i, :4], cfg.num_experts).ravel() for i in range(60)]).astype(float)
        b = np.stack([expert_counts(ids[i, -4:], cfg.num_experts).ravel() for i in range(60)]).astype(float)
        return float(np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))

    assert overlap(1.5) < overlap(0.0) - 0.05
    with pytest.raises(ValueError, match="drift_walk"):
        SyntheticConfig(drift_walk=-0.1).validate()


def test_steady_state_window_restricts_latency_to_requests_arriving_inside_it(small_workload):
    """``MeasurementWindow(requests="window")`` takes TPOT/TTFT/queueing over the requests arriving in the
    window's span only; the default window (and ``window=None`` in run_one/rate_sweep) stays every request."""
    from moelab.eldr.experiments import prepare, rate_sweep, run_one
    from moelab.sim import MeasurementWindow
    from moelab.sim.metrics import summarize_requests

    setup = prepare(small_workload.trace, small_cost(), 4, n_pairs=2000)
    reqs = poisson_requests(setup.pool, sim_rate=600.0, n_requests=400, output_len=32, seed=0)
    res = simulate(reqs, make_router("jsq"), setup.cost, n_workers=4, trace=setup.pool)
    plain = res.metrics()
    assert res.metrics(window=MeasurementWindow()) == plain and "latency_requests" not in plain
    # steps-only window: the latencies still cover every request (today's behaviour)
    steps_only = res.metrics(window=MeasurementWindow(warmup_lifetimes=8))
    assert steps_only["tpot_ms_p50"] == plain["tpot_ms_p50"] and steps_only["warmup_steps"] > 0
    w = MeasurementWindow(warmup_lifetimes=8, requests="window")
    steady = res.metrics(window=w)
    first, last = w.span(res.steps, float(res.requests["output_len"].mean()))
    assert (steady["latency_from_s"], steady["latency_to_s"]) == (first, last)
    ws, _ = w.select(res.steps, float(res.requests["output_len"].mean()))
    assert first == ws["t_s"].min() and last == ws["t_s"].max() and first > 0
    r = res.requests
    inside = r[(r["arrival_s"] >= first) & (r["arrival_s"] <= last)]
    assert 0 < steady["latency_requests"] == len(inside) < len(r)
    ref = summarize_requests(inside["arrival_s"].to_numpy(), inside["first_token_s"].to_numpy(),
                             inside["finish_s"].to_numpy(), inside["output_len"].to_numpy())
    assert steady["tpot_ms_p50"] == ref.tpot_ms_p50 and steady["ttft_ms_p99"] == ref.ttft_ms_p99
    assert steady["queue_s_mean"] == float((inside["admit_s"] - inside["arrival_s"]).mean())
    # run totals and the step figures are the steps-only window's
    for k in ("n_requests", "makespan_s", "throughput_run_tok_s", "mean_batch", "window_steps"):
        assert steady[k] == steps_only[k], k
    # the whole-run window with requests="window" keeps (almost) every request: the span is the busy steps
    assert res.metrics(window=MeasurementWindow(requests="window"))["latency_requests"] >= len(r) - 1
    with pytest.raises(ValueError, match="requests must be one of"):
        MeasurementWindow(requests="steady")
    # run_one / rate_sweep: window=None is today's row, a window passes through
    kw = dict(rate=2400.0, n_requests=300, output_len=32)
    assert run_one(setup, "jsq", **kw, window=None) == run_one(setup, "jsq", **kw)
    df = rate_sweep(setup, rates=(2400.0,), routers=("jsq",), n_requests=300, output_len=32, window=w)
    assert (df["latency_requests"] < 300).all()
    with pytest.raises(ValueError, match="window must be"):
        run_one(setup, "jsq", **kw, window=2.0)


def test_regime_map_labels_read_on_the_darkest_cells():
    """Issue 40 (student read): the map's text labels sit over heatmap cells whose colour runs to dark blue and red;
    each label has a light box under it, so it reads on any cell (dark text on a dark cell did not)."""
    import pandas as pd  # lazy: only this test builds a regime table

    from moelab.viz.eldr import fig_regime_map  # lazy: plotly only for this test

    regime = pd.DataFrame([{"n_workers": 4, "tau": 0.1, "rate": rate, "rho": rho, "p50_gain_pct": gain}
                           for rate, rho, gain in ((20.0, 0.5, -2.0), (60.0, 0.5, 4.0), (20.0, 0.8, 3.0),
                                                   (60.0, 0.8, 16.0))])
    fig = fig_regime_map(regime, n_workers=4, tau=0.1, paper_rho=(0.7, 0.92), real_point=(60.0, 0.6))
    labels = {a.text: a for a in fig.layout.annotations}
    assert {"paper's rho range", "real trace"} <= set(labels)
    for text in ("paper's rho range", "real trace"):
        box = labels[text].bgcolor
        assert box is not None, text
        rgb = [float(v) for v in box[box.index("(") + 1:box.index(")")].split(",")[:3]]
        assert min(rgb) >= 200, (text, box)  # a light box under dark text
    assert not any(getattr(t, "text", None) for t in fig.data if t.type == "scatter")  # no unboxed text on the star


def test_regime_map_titles_and_colours_each_metric_for_what_it_is():
    """A sixth student read: choosing ``oracle_gap_pct`` titled the map 'ELDR oracle gap pct over the best baseline'
    (the gap is to the domain-label oracle, not a baseline) on the gains' RdBu scale, where blue then meant ELDR
    slower. Each metric has its own title, and blue is ELDR doing better on every one."""
    import pandas as pd  # lazy: only this test builds a regime table

    from moelab.viz.eldr import REGIME_METRICS, fig_regime_map  # lazy: plotly only for this test

    regime = pd.DataFrame([{"n_workers": 4, "tau": 0.1, "rate": rate, "rho": rho, "p50_gain_pct": 5.0 * rho,
                            "p99_gain_pct": -rho, "oracle_gap_pct": 3.0 - rate / 10}
                           for rate in (20.0, 60.0) for rho in (0.5, 0.8)])

    def is_blue(rgb: str) -> bool:
        r, _, b = (int(v) for v in rgb[rgb.index("(") + 1:rgb.index(")")].split(","))
        return b > r

    titles = set()
    for metric in ("p50_gain_pct", "p99_gain_pct", "oracle_gap_pct"):
        fig = fig_regime_map(regime, n_workers=4, tau=0.1, metric=metric)
        title, heat = fig.layout.title.text, fig.data[0]
        assert title.startswith(REGIME_METRICS[metric]["title"]) and "pct" not in title and "τ=0.1" in title
        titles.add(title)
        low, high = heat.colorscale[0][1], heat.colorscale[-1][1]
        gain = metric != "oracle_gap_pct"  # a gain is better above zero, the gap to the oracle below it
        assert is_blue(high if gain else low) and not is_blue(low if gain else high), metric
        assert heat.zmid == 0
    assert len(titles) == 3
    gap_title = fig_regime_map(regime, n_workers=4, tau=0.1, metric="oracle_gap_pct").layout.title.text
    assert "oracle" in gap_title and "best baseline" not in gap_title and "ELDR slower" in gap_title
    with pytest.raises(ValueError, match="metric must be one of"):
        fig_regime_map(regime, n_workers=4, tau=0.1, metric="tpot_ms_p50")


def test_ablation_axis_writes_tau_as_the_prose_does():
    import pandas as pd  # lazy: only this test builds an ablation table

    from moelab.viz.eldr import fig_ablation  # lazy: plotly only for this test

    df = pd.DataFrame({"tau": [0.0, 0.1], "tpot_ms_p50": [14.0, 13.9], "distinct_per_layer_step": [72.0, 71.8]})
    assert {ax.title.text for ax in (fig_ablation(df, "tau", "t").layout.xaxis, fig_ablation(df, "tau", "t").layout.xaxis2)} == {"band width τ"}


def test_paper_comparison_line_label_reads_over_the_bars():
    """Issue 40 (student read): the 'paper's lowest gain' label runs across the bars of the later rates (dark text
    on the grey paper bar); it has a light box under it."""
    import pandas as pd  # lazy: only this test builds a comparison table

    from moelab.viz.eldr import fig_paper_comparison  # lazy: plotly only for this test

    cmp = pd.DataFrame({"rate": [20.0, 60.0, 100.0], "paper_gain_pct": [11.8, 15.2, 13.4],
                        "tpot_gain_pct": [0.5, 9.2, 9.2], "distinct_reduction_pct": [5.4, 12.6, 10.6]})
    (label,) = [a for a in fig_paper_comparison(cmp).layout.annotations if "paper's lowest TPOT gain" in a.text]
    assert "11.8%" in label.text
    box = label.bgcolor
    assert box is not None
    assert min(float(v) for v in box[box.index("(") + 1:box.index(")")].split(",")[:3]) >= 200, box
