"""Hostile input, round three, library entry points (issue 37, item 5): degenerate fits refused by name
(all-zero signatures and centroids), token ids checked against the vocabulary at HD's boundary with the
target (the HF engine's verify step and the vLLM proposer), caps with their reason on every size argument
that allocates up front, and the inputs that still ended in an unnamed numpy / KeyError / IndexError message.

Kept fast (a few seconds): tiny traces, no model (HD's verify step is reached through a stand-in session),
the caps are hit before anything is allocated."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moelab.traces import ExpertTrace, Geometry, RequestTrace

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _trace(n: int = 6, L: int = 2, E: int = 8, k: int = 2, T: int = 4, seed: int = 0) -> ExpertTrace:
    rng = np.random.default_rng(seed)
    dec = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(T)]) for _ in range(n)]
    return ExpertTrace.from_requests(request_ids=[str(i) for i in range(n)], domains=["a", "b"] * (n // 2),
                                     prompt_tokens=[np.arange(5 + i) for i in range(n)],
                                     prefill_counts=np.array([[rng.multinomial((5 + i) * k, np.full(E, 1 / E)) for _ in range(L)] for i in range(n)]),
                                     decode_ids=dec,
                                     geometry=Geometry(L, E, k, "toy"))


TRACE = _trace()


# ------------------------------------------------------------------------------- degenerate fits

def test_all_zero_signatures_are_not_a_fit():
    from moelab.eldr import ELDRRouter, spherical_kmeans

    zeros = np.zeros((10, 4))
    with pytest.raises(ValueError, match=r"X must hold at least K=1 non-zero signatures .*got 0 non-zero of 10"):
        spherical_kmeans(zeros, 1)
    two = zeros.copy()
    two[0, 0] = two[1, 1] = 1.0
    with pytest.raises(ValueError, match=r"at least K=3 non-zero .*got 2 non-zero"):
        spherical_kmeans(two, 3, balanced=False)
    with pytest.raises(ValueError, match="init must have no all-zero row"):
        spherical_kmeans(two, 2, init=np.zeros((2, 4)))
    # the router's fit names its own parameter
    with pytest.raises(ValueError, match=r"signatures must hold at least K=2 non-zero"):
        ELDRRouter().fit(zeros, 2)
    with pytest.raises(ValueError, match=r"centroids must have no all-zero row .* the first at index 1"):
        ELDRRouter(np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="X must hold at least one signature"):
        spherical_kmeans(np.zeros((0, 4)), 1)


@FAST
@given(X=st.lists(st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.0]), min_size=3, max_size=3), min_size=1, max_size=12),
       K=st.integers(1, 4), balanced=st.booleans())
def test_kmeans_fits_unit_centroids_or_refuses_by_name(X, K, balanced):
    """Signatures with zero rows among them (a request whose experts every request used): a fit has only
    unit centroids (a zero row neither seeds nor keeps a centroid), or it is refused naming X or K."""
    from moelab.eldr import spherical_kmeans

    X = np.asarray(X)
    try:
        res = spherical_kmeans(X, K, balanced=balanced, max_iter=10)
    except ValueError as exc:
        assert str(exc).startswith(("X must", "K must")), exc
        assert int((np.linalg.norm(X, axis=1) > 0).sum()) < K or K > len(X)
        return
    assert np.allclose(np.linalg.norm(res.centroids, axis=1), 1.0)


# ------------------------------------------------------------------------------- HD's vocabulary boundary

class _ReachedTheTarget(AssertionError):
    pass


class _StandInSession:
    """LMSession's shape without a model: prefill of one token does nothing, and reaching the verify
    forward means the ids went through unchecked."""

    def __init__(self, model):
        pass

    def prefill(self, ids):
        return None

    def forward_tree(self, tokens, parents):
        raise _ReachedTheTarget(f"the target was handed {tokens}")


def _drafter_proposing(*candidates):
    from moelab.hd import Draft, Drafter

    class Fixed(Drafter):
        name = "fixed"
        letters = "W"

        def draft(self):
            return Draft([tuple(c) for c in candidates], ["W"] * len(candidates))

    return Fixed()


@pytest.mark.parametrize("candidates, message", [
    ([(3, 99)], r"drafter Fixed 'fixed' proposed token id 99, outside the target's vocabulary \[0, vocab_size=24\)"),
    ([(3,), (24,)], r"proposed token id 24, outside .*vocab_size=24"),
    ([(-1,)], r"proposed token id -1"),
    ([(2.0,)], r"proposed a non-integer token id 2.0 \(type float\)"),
])
def test_draft_ids_past_the_vocabulary_are_named_before_verification(monkeypatch, candidates, message):
    import moelab.hd.decode as decode

    monkeypatch.setattr(decode, "LMSession", _StandInSession)
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=24))  # a bare torch IndexError before
    with pytest.raises(ValueError, match=message):
        decode.generate(model, [5], _drafter_proposing(*candidates), max_new_tokens=4)
    with pytest.raises(_ReachedTheTarget):  # in range: verification is reached
        decode.generate(model, [5], _drafter_proposing((3, 23)), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"prompt_ids must be .*vocab_size=24\); got 30 at index 1"):
        decode.generate(model, [5, 30], None, max_new_tokens=1)


def test_vocab_size_comes_from_the_embedding_rows():
    from moelab.hd.decode import model_vocab_size

    emb = SimpleNamespace(num_embeddings=32)
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=24), get_input_embeddings=lambda: emb)
    assert model_vocab_size(model) == 32  # the rows are where the lookup fails
    assert model_vocab_size(SimpleNamespace(config=SimpleNamespace(vocab_size=24))) == 24
    assert model_vocab_size(SimpleNamespace()) is None


def test_the_vllm_proposer_checks_its_chain_against_the_target_vocabulary():
    from moelab.hd.vllm_adapter import HDProposer, target_vocab_size

    cfg = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: 50, hf_config=None))
    assert target_vocab_size(cfg) == 50
    assert target_vocab_size(SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(vocab_size=7)))) == 7
    prop = object.__new__(HDProposer)  # vLLM builds it; its state is what propose reads
    prop.k, prop.max_model_len, prop.config, prop.vocab_size = 4, 64, {"method": "hd"}, 50
    prop.rows = SimpleNamespace(propose=lambda row, tokens, room: [7, 50])
    with pytest.raises(ValueError, match=r"vLLM proposer method 'hd' proposed token id 50, .*vocab_size=50"):
        prop.propose([[1]], np.array([3]), np.zeros((1, 8), np.int64))
    prop.rows = SimpleNamespace(propose=lambda row, tokens, room: [7, 49])
    assert prop.propose([[1]], np.array([3]), np.zeros((1, 8), np.int64)) == [[7, 49]]


def test_replay_and_tree_refuse_float_ids_instead_of_truncating():
    from moelab.hd import PLDDrafter, build_tree, replay_greedy

    with pytest.raises(ValueError, match="root and candidates must hold integer token ids"):
        build_tree(1, [(2.7, 3)], ["W"])  # int(2.7) used to verify token 2
    with pytest.raises(ValueError, match=r"sources must be a list of store letters, one per candidate \(2\)"):
        build_tree(1, [(2,), (3,)], ["W"])  # zip() dropped the second candidate
    with pytest.raises(ValueError, match=r"token ids in \[0, 2\^63\)"):
        build_tree(2**70, [], [])
    with pytest.raises(ValueError, match="proposed a non-integer token id"):
        replay_greedy(_drafter_proposing((2.0,)), [1], [2, 3])
    with pytest.raises(ValueError, match="reference must hold integer token ids"):
        replay_greedy(PLDDrafter(), [1], math.nan)


# ------------------------------------------------------------------------------- caps with their reason

def test_signature_cache_capacity_is_capped_before_allocating():
    from moelab.eldr import SignatureCache
    from moelab.eldr.cache import MAX_CACHE_BLOCKS, MAX_CACHE_CELLS

    with pytest.raises(ValueError, match=r"capacity_blocks x num_layers x num_experts must be <= MAX_CACHE_CELLS=.*"
                                         r"allocated up front\); got 4194304 x 48 x 128"):
        SignatureCache(16, 48, 128, MAX_CACHE_BLOCKS)  # 11 TiB was asked for before
    with pytest.raises(ValueError, match=r"capacity_blocks must be an integer in \[1, MAX_CACHE_BLOCKS=.*free list"):
        SignatureCache(16, 1, 1, 1 << 40)
    with pytest.raises(ValueError, match="num_experts must be an integer in .*MAX_EXPERTS"):
        SignatureCache(16, 1, 1 << 20, 4)
    assert SignatureCache(16, 48, 128, 4096).hist.size <= MAX_CACHE_CELLS  # the notebooks' size
    with pytest.raises(ValueError, match="request_id must be a string; got list"):
        SignatureCache(4, 2, 8, 16).admit(["r"], np.arange(4), np.zeros((4, 2, 2), int))


def test_request_counts_are_capped_with_the_reason():
    from moelab.eldr import poisson_requests
    from moelab.traces.requests import MAX_TRACE_REQUESTS

    with pytest.raises(ValueError, match=r"n_requests must be an integer in \[1, MAX_TRACE_REQUESTS=\d+\] \(each "
                                         r"request's columns are allocated up front"):
        poisson_requests(TRACE, sim_rate=10.0, n_requests=10**10)  # 75 GiB before
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, MAX_TRACE_REQUESTS"):
        RequestTrace(np.zeros(2), np.ones(2), np.ones(2)).resample(10**12)
    with pytest.raises(ValueError, match=r"n_requests x signature dim must be <= MAX_SIGNATURE_CELLS"):
        poisson_requests(TRACE, sim_rate=10.0, n_requests=MAX_TRACE_REQUESTS,
                         signatures=np.ones((TRACE.n_requests, 4096)))
    assert len(poisson_requests(TRACE, sim_rate=10.0, n_requests=5, output_len=[3])) == 5


def test_synthetic_workload_size_is_capped_before_allocating(monkeypatch):
    import moelab.eldr.workload as wl
    from moelab.eldr import SyntheticConfig, generate

    def no_spread(*a, **k):
        raise AssertionError("the workload started before the cap was checked")

    monkeypatch.setattr(wl, "fit_domain_spread", no_spread)
    with pytest.raises(ValueError, match=r"n_requests=1000000 needs ~\d+\.\d GiB .*MAX_SYNTHETIC_BYTES=.*allocated up "
                                         r"front\); n_requests must be <= \d+ here"):
        generate(1_000_000)  # 4.6 GiB and a MemoryError before
    for bad, message in [(dict(num_experts=1 << 20), "num_experts must be an integer in .*MAX_EXPERTS"),
                         (dict(subtopics=10**6), r"n_domains x subtopics x num_layers x num_experts must be <= "
                                                 "MAX_LOGIT_CELLS"),
                         (dict(decode_tokens=10**6), "decode_tokens x num_layers x num_experts must be <= MAX_LOGIT_CELLS"),
                         (dict(prompt_len_mean=2**40), "prompt_len_mean must be an integer in .*MAX_SEQUENCE_TOKENS")]:
        with pytest.raises(ValueError, match=message):
            generate(4, SyntheticConfig(**bad))
    with pytest.raises(ValueError, match=r"config must be a SyntheticConfig or None; got float"):
        generate(4, 1.5)
    with pytest.raises(ValueError, match=r"spread must be a DomainSpread"):
        generate(4, spread="olmoe")


def test_pair_counts_and_tables_are_capped():
    from moelab.afd.theory import ratio_table
    from moelab.eldr import predictability

    pre = TRACE.prefill_counts.astype(float)
    with pytest.raises(ValueError, match=r"n_pairs must be an integer in \[10, MAX_PAIRS=1000000\] \(the greedy layer"):
        predictability(pre, TRACE.decode_profiles(), n_pairs=10**12)
    with pytest.raises(ValueError, match="B_values x mu_P_values x mu_D_values must be <= MAX_TABLE_ROWS"):
        ratio_table(B_values=list(range(1, 101)), mu_P_values=list(range(1, 101)), mu_D_values=list(range(1, 101)))
    from moelab.balanceroute import LearnedPredictor, make_predictor

    reqs = RequestTrace(np.arange(40.0), np.arange(1, 41), np.arange(1, 41))
    with pytest.raises(ValueError, match=r"prompt_bins x max_age \+ 1 must be <= MAX_LEARNED_GRID"):
        LearnedPredictor(prompt_bins=4096, max_age=1 << 20).fit(reqs, 8)
    with pytest.raises(ValueError, match=r"horizon must be an integer in \[0, MAX_HORIZON=1024\]"):
        make_predictor("survival", reqs, 10**6)


# ------------------------------------------------------------------------------- unnamed messages, named

def _hists_of_nothing():
    from moelab.eldr import SignatureCache

    return SignatureCache(4, 2, 8, 16).admit_blocks("r", np.arange(6), [[1, 2], [3]])


def _rtt_sample():
    from moelab.dsd import RTTDistribution

    return RTTDistribution.constant(20.0).sample(1.5, 3)


def _eldr(name):
    import moelab.eldr

    return getattr(moelab.eldr, name)


def _dsd(name):
    import moelab.dsd

    return getattr(moelab.dsd, name)


def _sim(name):
    import moelab.sim

    return getattr(moelab.sim, name)


_DF = pd.DataFrame({"router": ["a", "b"], "rate": [1, 1], "tpot_ms_p50": [1.0, 2.0]})

# (what was called, the call, the named message); each ended in a bare IndexError / KeyError / AttributeError /
# OverflowError or in numpy's or pandas' words before
UNNAMED_BEFORE = [
    ("decode_recall(scalar prefill)", lambda: _eldr("decode_recall")(1.5, np.ones((2, 3))),
     "prefill and decode must have one shape"),  # IndexError: tuple index out of range
    ("greedy_layer_mask(decode of another shape)",
     lambda: _eldr("greedy_layer_mask")(TRACE.prefill_counts.astype(float), np.ones((6, 2, 3)), n_pairs=100),
     "prefill and decode must both have shape"),  # cannot reshape array
    ("align_centroids(strings)", lambda: _eldr("align_centroids")([["a"]], [["b"]]), "old must be"),
    ("ExpertTrace.prompt(n_requests)", lambda: TRACE.prompt(6), r"i must be an integer in \[0, n_requests - 1=5\]"),
    ("ExpertTrace.prompt(-1)", lambda: TRACE.prompt(-1), "i must be an integer"),  # an empty array, silently
    ("ExpertTrace.decode(1.5)", lambda: TRACE.decode(1.5), "i must be an integer"),
    ("ExpertTrace.decode_profiles(2**70)", lambda: TRACE.decode_profiles(2**70), "max_steps must be an integer"),
    ("ExpertTrace.distinct_experts(nan)", lambda: TRACE.distinct_experts(np.array([0]), math.nan),
     "steps must be an array of integers"),  # TypeError: 'numpy.bool' object does not support item assignment
    ("ExpertTrace.distinct_experts(scalar)", lambda: TRACE.distinct_experts(0), "requests must be a 1-d array"),
    ("expert_counts(0-d float)", lambda: __import__("moelab.traces", fromlist=["x"]).expert_counts(1.5, 4),
     "topk_ids must be an array of expert ids"),
    ("concat_traces(a trace)", lambda: __import__("moelab.traces", fromlist=["x"]).concat_traces(TRACE),
     "traces must be a non-empty list of ExpertTrace"),
    ("replay_requests(trace=None)", lambda: _eldr("poisson_requests")(None, sim_rate=1.0, n_requests=2),
     "trace must be an ExpertTrace; got NoneType"),  # AttributeError: decode_lens
    ("replay_requests(output_len='x')", lambda: _eldr("poisson_requests")(TRACE, sim_rate=1.0, n_requests=2, output_len="x"),
     "output_len must be an array of token counts"),  # UFuncTypeError
    ("RequestTrace(ragged prompt_len)", lambda: RequestTrace([0.0, 1.0], [[1, 2], [3]], [1, 1]),
     "prompt_len must be a 1-d array of token counts"),
    ("RequestTrace.from_frame(a dict)", lambda: RequestTrace.from_frame({"arrival_s": [0]}), "df must be a pandas DataFrame"),
    ("SignatureCache.admit_blocks(ragged)", _hists_of_nothing, "block_hists must be an array of integer counts"),
    ("SignatureBuilder(layer_mask=[0, 1])",
     lambda: _eldr("SignatureBuilder")("count", [0, 1], n_pairs=100).fit(TRACE), "layer_mask must be 'greedy', 'all' or"),
    ("SignatureBuilder.report(trace=1.5)",
     lambda: _eldr("SignatureBuilder")("count", "all", n_pairs=100).fit(TRACE).report(1.5), "trace must be an ExpertTrace"),
    ("workload_stats(trace=1.5)", lambda: _eldr("workload_stats")(1.5), "trace must be an ExpertTrace"),
    ("fit_domain_spread(['olmoe'])", lambda: _eldr("fit_domain_spread")(["olmoe"]), "model must be one of"),
    ("cache_signatures(workload=None)", lambda: _eldr("cache_signatures")(None, np.arange(2), np.zeros(2)),
     "workload must be a ConversationWorkload"),
    ("OnlineRefitter.observe(time_s='x')", lambda: _eldr("OnlineRefitter")().observe("x", np.ones((1, 2))),
     "time_s must be a real number"),
    ("OnlineRefitter.maybe_refit(centroids=None)", lambda: _eldr("OnlineRefitter")().maybe_refit(1.0, None),
     "centroids must be"),
    ("eldr.simulate(ragged signatures)", lambda: _eldr("simulate")(_eldr("poisson_requests")(
        TRACE, sim_rate=1.0, n_requests=2), __import__("moelab.routers", fromlist=["x"]).make_router("jsq"), _cost(),
        n_workers=1, trace=TRACE, signatures=[[1.0], [1.0, 2.0]]), "signatures must be"),
    ("imbalance(scalar)", lambda: _sim("imbalance")(3.0), "loads must have a last axis of workers"),
    ("summarize_requests(scalar first_token_s)", lambda: _sim("summarize_requests")(np.zeros(2), 1.0, np.ones(2), [2, 2]),
     "first_token_s must be a 1-d array with one entry per request"),
    ("gain_vs_best(metric absent)", lambda: _sim("gain_vs_best")({"a": {"x": 1.0}, "b": {"x": 2.0}}, "a", ["b"]),
     "metric must be a key of every compared result; got 'tpot_ms_p50'"),  # KeyError
    ("gain_vs_best(method=[...])", lambda: _sim("gain_vs_best")({"a": {}}, ["a"], ["b"]), "method must be a name"),
    ("gains_table(name_col absent)", lambda: _sim("gains_table")(_DF, "a", ["b"], name_col="who"),
     "name_col must be one of"),  # KeyError
    ("gains_table(by absent)", lambda: _sim("gains_table")(_DF, "a", ["b"], by="load"), "by must be one of"),
    ("percentiles(qs=150)", lambda: _sim("percentiles")([1.0, 2.0], (150,)), "qs must be <= 100"),
    ("cpu_costs({})", lambda: _dsd("cpu_costs")({}), "extra must hold timings_ms"),  # KeyError: 'timings_ms'
    ("iid_rounds(rng=0)", lambda: _dsd("iid_rounds")(0.5, 2, 10, 0), "rng must be a numpy Generator"),
    ("RTTDistribution.sample(rng=1.5)", _rtt_sample, "rng must be a numpy Generator"),
    ("best_mode(t_ar of another shape)", lambda: _dsd("best_mode")(alpha=[0.5, 0.6], rtt=10.0, gamma=4,
                                                                  t_ar=[30.0, 30.0, 30.0], t_a=1.0, t_d=1.0, t_v=30.0),
     "t_ar, t_a, t_d and t_v must be scalars or broadcast"),
    ("expected_tokens(ragged alpha)", lambda: _dsd("expected_tokens")([[0.5], [0.5, 0.6]], 4),
     "alpha must be a real number or an array"),
    ("optimal_gamma(alpha=[])", lambda: _dsd("optimal_gamma")([], 0.1), "alpha must be a real number"),
    ("breakeven_table(decimals=1.5)", lambda: _dsd("breakeven_table")(decimals=1.5), "decimals must be an integer"),
    ("simulate_rounds(alpha=[0.5])", lambda: _dsd("simulate_rounds")("dsd_sync", alpha=[0.5], gamma=2, t_d=1.0,
                                                                    t_v=3.0, t_a=1.0, rtt=1.0, rounds=10),
     "alpha must be one real number"),
    ("h200_verify_batch_ms(ctx='x')", lambda: _dsd("h200_verify_batch_ms")(ctx="x"), "ctx must be an integer"),
    ("capacity_batched(verify_batch_ms=1.0)", lambda: _dsd("capacity_batched")(
        {}, verify_batch_ms=1.0, draft_batch_ms=None, t_a=1.0, rtt=None), "verify_batch_ms must be a callable"),
    ("ratio_table(B_values=256)", lambda: __import__("moelab.afd", fromlist=["x"]).ratio_table(B_values=256),
     "B_values must be a non-empty 1-d sequence"),
    ("SuffixStore.build(vocab_size=nan)", lambda: __import__("moelab.hd", fromlist=["x"]).SuffixStore.build(
        [[1, 2, 3]], vocab_size=math.nan), "vocab_size must be an integer"),
    ("NGramTable.build(float ids)", lambda: __import__("moelab.hd", fromlist=["x"]).NGramTable.build(
        [[1.5, 2.0, 3.0]], length=1), r"sequences\[0\] must hold integer token ids"),  # truncated silently before
    ("get_method(['hd'])", lambda: __import__("moelab.hd", fromlist=["x"]).get_method(["hd"]), "method must be one of"),
    ("make_predictor(train=1.5)", lambda: __import__("moelab.balanceroute", fromlist=["x"]).make_predictor(
        "survival", 1.5, 8), "train must be a RequestTrace"),
    ("SurvivalPredictor.predict(age=-1)", lambda: __import__("moelab.balanceroute", fromlist=["x"]).SurvivalPredictor()
     .fit(RequestTrace(np.zeros(3), np.ones(3), np.arange(1, 4)), 4).predict(np.ones(1), np.array([-1.0])),
     "age must be finite and >= 0; got -1.0"),
]


_COST = []


def _cost():
    if not _COST:
        from moelab.costmodel import DecodeStepModel, ModelShape

        _COST.append(DecodeStepModel.h200(ModelShape(2, 128, 4, 2, 32, 500, num_experts=8, top_k=2, expert_ffn=64)))
    return _COST[0]


@pytest.mark.parametrize("what, call, message", UNNAMED_BEFORE, ids=[c[0] for c in UNNAMED_BEFORE])
def test_each_input_is_refused_by_name(what, call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------------------- spaces of hostile inputs

_HOSTILE = st.one_of(st.integers(-3, 12), st.sampled_from([2**63, 2**70, -(2**70)]),
                     st.sampled_from([1.5, 2.0, math.nan, math.inf, -math.inf, "x", None, [], [1, [2]]]),
                     st.lists(st.integers(-2, 9), max_size=3))


@FAST
@given(i=_HOSTILE)
def test_trace_rows_are_read_or_refused_by_name(i):
    for view in (TRACE.prompt, TRACE.decode):
        try:
            out = view(i)
        except ValueError as exc:
            assert str(exc).startswith("i must be an integer in [0, n_requests - 1=5]"), exc
            continue
        # ints, and floats with no fractional part (check_int's rule), inside [0, n_requests)
        assert isinstance(i, (int, float)) and float(i).is_integer() and 0 <= i < TRACE.n_requests and out.shape[0] > 0


@FAST
@given(output_len=_HOSTILE, n=st.integers(1, 4))
def test_replayed_output_lengths_are_taken_or_refused_by_name(output_len, n):
    from moelab.traces import replay_requests

    try:
        reqs = replay_requests(TRACE, rate=5.0, n_requests=n, output_len=output_len, seed=0)
    except ValueError as exc:
        assert str(exc).startswith("output_len must be"), exc
        return
    assert len(reqs) == n and reqs.output_len.min() >= 1


@FAST
@given(value=_HOSTILE)
def test_integer_arrays_refuse_zero_d_floats_by_name(value):
    from moelab._validate import check_int_array

    try:
        out = check_int_array("x", value, low=0, high=10)
    except ValueError as exc:
        assert str(exc).startswith("x must"), exc
        return
    assert out.dtype == np.int64 and (out.size == 0 or (out.min() >= 0 and out.max() < 10))


@FAST
@given(lengths=st.lists(st.integers(0, 4), min_size=4, max_size=4), scalar=st.sampled_from([None, 0, 1, 2, 3]))
def test_latency_summary_takes_matching_arrays_or_refuses_by_name(lengths, scalar):
    from moelab.sim import summarize_requests

    arrays = [np.arange(n, dtype=float) for n in lengths]
    if scalar is not None:
        arrays[scalar] = 1.0
    try:
        s = summarize_requests(*arrays)
    except ValueError as exc:
        assert str(exc).split(" ")[0] in ("arrival_s", "first_token_s", "finish_s", "output_len"), exc
        return
    assert s.n_requests == lengths[0]


# ---- the cost model's size arguments and reporting inputs (named, capped before allocating) ---------------


@pytest.mark.parametrize("call, says", [
    (lambda m: m.table(2**70), "max_batch must be an integer in [1, 1048576]"),
    (lambda m: m.ep_table(2**20, 2**20), "ranks x slots must be <= MAX_TABLE_BATCH"),
    (lambda m: m.with_attention_share(0.5, 32, "x"), "ctx must be a real number"),
    (lambda m: m.attention_share(-1, 5), "B must be in (0, inf)"),
])
def test_step_model_sizes_and_inputs_are_named(call, says):
    from moelab.costmodel import DecodeStepModel

    with pytest.raises(ValueError, match=re.escape(says)):
        call(DecodeStepModel.h200())


def test_step_model_seed_is_checked():
    from moelab.costmodel import DecodeStepModel

    with pytest.raises(ValueError, match="seed must be an integer"):
        DecodeStepModel.h200(seed=float("nan"))


# ---- routing contract, decode-tier helpers and AFD's measured lengths: named, never numpy's words -----------


def test_cluster_view_refuses_counts_that_are_not_whole_numbers():
    from moelab.routing import ClusterView

    with pytest.raises(ValueError, match="active must be an array of whole numbers"):
        ClusterView(np.array([np.nan, 1.0]), np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="kv_tokens must be an array of whole numbers"):
        ClusterView(np.zeros(2), np.array([0.5, 1.0]), np.ones(2))
    assert ClusterView(np.array([1.0, 2.0]), np.zeros(2), np.ones(2)).active.dtype == np.int64  # whole floats pass


@pytest.mark.parametrize("call, says", [
    (lambda: __import__("moelab.routing", fromlist=["make_router"]).make_router(["jsq"]), "router must be one of"),
    (lambda: __import__("moelab.routing.baselines", fromlist=["x"]).VLLMDataParallel().reset(2**70),
     "n_workers must be an integer in [1, 65536]"),
    (lambda: __import__("moelab.routing", fromlist=["x"]).RouterCalibration(n_workers=2, signatures="x"),
     "signatures must be a finite [n >= 1, d] array of numbers"),
    (lambda: __import__("moelab.sim.cluster", fromlist=["x"]).pack_expert_bits(1.5), "trace must be an ExpertTrace"),
    (lambda: __import__("moelab.sim.cluster", fromlist=["x"]).supplied_fields(1.5), "requests must be a RequestTrace"),
    (lambda: __import__("moelab.afd.sim", fromlist=["x"]).idle_crossing(pd.DataFrame({"r": [1]}), prefix="x"),
     "df must be a DataFrame with the columns"),
])
def test_routing_and_decode_tier_inputs_are_named(call, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        call()


def test_measured_length_draws_are_capped_and_need_a_generator():
    from moelab.afd.measured import MAX_DRAWS, LengthDistribution

    lengths = LengthDistribution.geometric(100.0, 500.0)
    with pytest.raises(ValueError, match="n must be an integer"):
        lengths.draw(np.random.default_rng(0), MAX_DRAWS + 1)
    with pytest.raises(ValueError, match="rng must be a numpy Generator"):
        lengths.draw(1.5, 10)


def test_acceptance_model_priors_must_be_a_dict():
    from moelab.hd.policy import AcceptanceModel

    with pytest.raises(ValueError, match="priors must be a dict"):
        AcceptanceModel(priors=1.5)
