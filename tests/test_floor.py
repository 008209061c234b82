"""The decode-cluster floor: one geometry registry, one step model, one router contract, one request
container, one result, and the decode-tier simulator with ranks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moelab._validate import MAX_SEQUENCE_TOKENS
from moelab.costmodel import (
    MODEL_SHAPES,
    DecodeStepModel,
    ModelShape,
    MoEStepModel,
    expected_distinct_experts,
    model_shape,
)
from moelab.routers import ROUTERS, check_supplies, make_router, router_class, router_names
from moelab.routing import ClusterView, RequestBatch, Router
from moelab.sim import SimResult, gain_vs_best
from moelab.sim.cluster import MAX_DECODE_TOKENS, simulate
from moelab.traces import ExpertTrace, Geometry, RequestTrace, replay_requests


# ---------------------------------------------------------------- registry
def test_registry_has_the_papers_models_and_is_read_only():
    for name in ("qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b", "deepseek-v2-lite", "gpt-oss-120b", "gemma-4-26b-a4b",
                 "deepseek-v3", "llama-3.1-70b", "tiny-moe"):
        assert MODEL_SHAPES[name].source
    with pytest.raises(TypeError):
        MODEL_SHAPES["x"] = MODEL_SHAPES["qwen3-30b-a3b"]  # type: ignore[index]
    with pytest.raises(ValueError, match="qwen3-30b-a3b"):
        model_shape("no-such-model")
    q = MODEL_SHAPES["qwen3-30b-a3b"]
    assert q.kv_bytes_per_token == 2 * 4 * 128 * 2 and q.num_moe_layers == 48
    v3 = MODEL_SHAPES["deepseek-v3"]
    assert v3.is_mla and v3.kv_bytes_per_token == (512 + 64) * 2 and v3.num_moe_layers == 58
    assert not MODEL_SHAPES["llama-3.1-70b"].is_moe
    tiny = MODEL_SHAPES["tiny-moe"]
    assert (tiny.num_layers, tiny.num_experts, tiny.top_k) == (6, 32, 2)


def test_table_fit_takes_custom_shapes_as_argument():
    from moelab.costmodel import MoEShape

    rows = [{"model": "custom", "method": "m", "B": b, "D": d, "ms_per_layer": 0.01 + 0.001 * d + 1e-5 * b}
            for b in (1, 8, 32) for d in (2, 4, 8)]
    table = pd.DataFrame(rows)
    with pytest.raises(ValueError, match="custom"):
        MoEStepModel.from_table(table, "m")
    fit = MoEStepModel.from_table(table, "m", shapes={"custom": MoEShape(64, 64, 8, 2)})
    assert fit.report.median_abs_err_pct < 5
    assert "custom" not in MODEL_SHAPES


# ---------------------------------------------------------------- one step model
def test_step_model_compositions_agree():
    m = DecodeStepModel.h200("qwen3-30b-a3b")
    B, D, kv = 32.0, 48 * 60.0, 32 * 1500.0
    t = m.table(64)
    assert t.step_ms(32, D, kv) == pytest.approx(float(m.step_ms(B, D, kv)))
    # one rank: the EP group and the barrier are the plain step
    assert float(m.ep_step_ms(np.array([B]), D, np.array([kv]))) == pytest.approx(float(m.step_ms(B, D, kv)))
    assert m.ep_table(1, 64).step_ms([32], D, [kv]) == pytest.approx(float(m.step_ms(B, D, kv)))
    # the DP barrier is the slowest rank of the same model
    loads = np.array([1e4, 3e4, 2e4])
    assert float(m.barrier_step_ms(np.full(3, B), np.full(3, D), loads)) == pytest.approx(float(m.step_ms(B, D, 3e4)))
    ep = m.ep_table(3, 64)
    assert ep.step_ms([10, 20, 5], D, [1e4, 3e4, 2e4]) == pytest.approx(
        float(m.ep_step_ms(np.array([10, 20, 5]), D, np.array([1e4, 3e4, 2e4]))))
    share = m.with_attention_share(0.4, 32, 1500)
    assert share.attention_share(32, 1500) == pytest.approx(0.4, abs=1e-6)
    for name in MODEL_SHAPES:  # every registry shape prices a step
        s = DecodeStepModel.h200(name)
        assert float(s.step_ms(8, s.expected_sum_distinct(8), 8 * 1000)) > 0


def test_cost_models_refuse_bad_input():
    m = DecodeStepModel.h200()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            m.step_ms(bad, 0, 0)
        with pytest.raises(ValueError):
            m.step_ms(1, 0, bad)
    with pytest.raises(ValueError, match="top_k"):
        expected_distinct_experts(10, 8, 9)
    with pytest.raises(ValueError, match="n_tokens"):
        expected_distinct_experts(-1, 8, 2)
    assert float(expected_distinct_experts(3, 8, 8)) == 8.0
    with pytest.raises(ValueError, match="top_k"):
        ModelShape(2, 64, 2, 2, 32, 100, num_experts=4, top_k=5, expert_ffn=16)


# ---------------------------------------------------------------- router contract
def test_every_registered_router_declares_known_fields():
    from moelab.routing import FIELDS

    for name in ROUTERS:
        cls = router_class(name)
        assert set(cls.requires) <= set(FIELDS), name
    lab = {n for n in ROUTERS if router_class(n).__module__.startswith("moelab.")}  # not a test's own router
    assert set(router_names("eldr_paper")) & lab == {"round_robin", "random", "jsq", "p2c"}
    assert set(router_names("eldr_paper")) & lab < set(router_names("baseline")) & lab


def test_driver_refuses_router_missing_a_field():
    with pytest.raises(ValueError, match="signature"):
        check_supplies(make_router("eldr", centroids=np.eye(2)), {"prompt_len", "free_slots", "active", "waiting"},
                       "a test driver")
    router = make_router("domain_oracle", n_domains=2)
    view = ClusterView.idle(2)
    with pytest.raises(ValueError, match="domain is required"):
        router.route(RequestBatch(np.array([5])), view)


def test_worker_guard_lives_once():
    class Fixed(Router):
        name = "fixed"

        def choose(self, batch, i, view, open_):
            return 0

    r = Fixed()
    assert r.route(RequestBatch(np.array([1, 2])), ClusterView.idle(3)).tolist() == [0, 0]
    with pytest.raises(ValueError, match="reset for 3"):
        r.route(RequestBatch(np.array([1])), ClusterView.idle(4))


def test_nan_signature_refused_before_routing():
    with pytest.raises(ValueError, match="finite"):
        RequestBatch(np.array([3]), signature=np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="finite"):
        RequestTrace(np.zeros(1), np.ones(1), np.ones(1), signature=np.array([[np.inf, 0.0]]))


# ---------------------------------------------------------------- one request container
def test_request_trace_columns_and_bad_input():
    tr = RequestTrace(np.array([0.0, 1.0]), np.array([3, 4]), np.array([2, 2]), domain=np.array([0, 1]))
    assert tr.columns == ("arrival_s", "prompt_len", "output_len", "domain")
    with pytest.raises(ValueError, match=r"\['signature'\]"):
        tr.require(("signature",), "a simulator")
    assert tr.head(1).domain.tolist() == [0]
    with pytest.raises(ValueError, match="sorted"):
        RequestTrace(np.array([1.0, 0.0]), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="finite"):
        RequestTrace(np.array([0.0, np.nan]), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="integers"):
        RequestTrace(np.zeros(2), np.ones(2), np.ones(2), trace_row=np.array([0.5, 1.0]), trace_offset=np.zeros(2))
    with pytest.raises(ValueError, match="together"):
        RequestTrace(np.zeros(1), np.ones(1), np.ones(1), trace_row=np.zeros(1))


# ---------------------------------------------------------------- decode tier with ranks
def _trace(n: int = 12, L: int = 2, E: int = 8, k: int = 2, T: int = 6, seed: int = 0) -> ExpertTrace:
    rng = np.random.default_rng(seed)
    dec = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(T)]) for _ in range(n)]
    counts = np.array([[rng.multinomial((5 + i) * k, np.full(E, 1 / E)) for _ in range(L)] for i in range(n)])
    return ExpertTrace.from_requests(request_ids=[str(i) for i in range(n)], domains=["a", "b"] * (n // 2),
                                     prompt_tokens=[np.arange(5 + i) for i in range(n)], prefill_counts=counts,
                                     decode_ids=dec, geometry=Geometry(L, E, k, "tiny"))


def _cost(L: int = 2, E: int = 8, k: int = 2) -> DecodeStepModel:
    return DecodeStepModel.h200(ModelShape(L, 128, 4, 2, 32, 500, num_experts=E, top_k=k, expert_ffn=64))


@pytest.mark.parametrize("rank_router", ["jsq", "least_kv", "br0", "brh"])
def test_ranked_cluster_finishes_every_request_within_slots(rank_router):
    tr = _trace()
    reqs = replay_requests(tr, rate=500.0, n_requests=60, output_len=np.arange(60) % 7 + 1, seed=1)
    res = simulate(reqs, make_router("jsq"), _cost(), n_workers=2, slots=3, trace=tr, ranks=3,
                   rank_router=make_router(rank_router))
    assert isinstance(res, SimResult)
    r = res.requests
    assert np.isfinite(r["finish_s"]).all() and (r["admit_s"] >= r["arrival_s"] - 1e-12).all()
    assert (res.steps["batch"] <= 9).all()
    assert set(r["rank"]) <= {0, 1, 2}
    m = res.metrics()
    assert m["n_requests"] == 60 and np.isfinite(m["tpot_ms_p50"]) and "avg_imbalance" in m


@pytest.mark.parametrize("rank_router", ["jsq", "least_kv", "br0", "brh"])
def test_one_instance_of_ranks_is_the_dp_simulator(rank_router):
    """Two loops, one physics: the decode tier (event-driven over instances) with ONE instance of G ranks and
    BalanceRoute's DP simulator (one lockstep group) price the same barrier step and admit by the same rule,
    so on the same arrivals (idle gaps and bursts) they produce the same steps, ranks and times."""
    from moelab.costmodel.dp import DPCost
    from moelab.sim.dp import simulate_dp

    rng = np.random.default_rng(3)
    n = 240
    arrival = np.sort(np.concatenate([rng.uniform(0, 0.5, n // 2), rng.uniform(3.0, 3.2, n - n // 2)]))
    reqs = RequestTrace(arrival, rng.integers(20, 3000, n), rng.integers(1, 150, n), source="burst-gap-burst")
    G, B = 4, 12
    model = DecodeStepModel.h200("qwen3-30b-a3b")
    tier = simulate(reqs, make_router("round_robin"), model, n_workers=1, slots=B, ranks=G,
                    rank_router=make_router(rank_router))
    dp = simulate_dp(reqs, make_router(rank_router), DPCost.from_model(model, G, B), n_workers=G, slots=B, warmup_lifetimes=0)
    assert len(tier.steps) == len(dp.steps)
    np.testing.assert_array_equal(tier.requests["rank"].to_numpy(), dp.requests["worker"].to_numpy())
    for col in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(tier.requests[col].to_numpy(), dp.requests[col].to_numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(tier.steps["step_ms"].to_numpy(), dp.steps["step_ms"].to_numpy(), rtol=1e-12)


def test_one_rank_is_fcfs_continuous_batching():
    tr = _trace()
    reqs = replay_requests(tr, rate=1000.0, n_requests=30, output_len=4, seed=2)
    res = simulate(reqs, make_router("round_robin"), _cost(), n_workers=1, slots=4, trace=tr)
    admit = res.requests["admit_s"].to_numpy()
    assert np.all(np.diff(admit) >= 0)  # one instance admits in arrival order
    assert res.steps["batch"].max() == 4


def test_simulator_refusals():
    tr = _trace()
    reqs = replay_requests(tr, rate=10.0, n_requests=5, output_len=3)
    with pytest.raises(ValueError, match="signature"):
        simulate(reqs, make_router("eldr", centroids=np.eye(2, 16)), _cost(), n_workers=2, trace=tr)
    with pytest.raises(ValueError, match="rank_router"):
        simulate(reqs, make_router("jsq"), _cost(), n_workers=2, trace=tr, ranks=2)
    with pytest.raises(ValueError, match="trace"):
        simulate(reqs, make_router("jsq"), _cost(), n_workers=2)
    n_big = MAX_DECODE_TOKENS // MAX_SEQUENCE_TOKENS + 1  # each request within the per-request maximum
    big = RequestTrace(np.zeros(n_big), np.ones(n_big), np.full(n_big, MAX_SEQUENCE_TOKENS))
    with pytest.raises(ValueError, match="MAX_DECODE_TOKENS"):
        simulate(big, make_router("jsq"), _cost(), n_workers=1)


def test_requests_without_expert_rows_priced_at_uniform_routing():
    reqs = RequestTrace(np.array([0.0]), np.array([10]), np.array([3]))
    cost = _cost()
    res = simulate(reqs, make_router("jsq"), cost, n_workers=1)
    assert res.steps["sum_distinct"].iloc[0] == pytest.approx(float(cost.expected_sum_distinct(1)))


def test_gain_vs_best():
    res = {"a": {"t": 10.0}, "b": {"t": 8.0}, "m": {"t": 6.0}}
    gain, best = gain_vs_best(res, "m", ["a", "b"], metric="t")
    assert best == "b" and gain == pytest.approx(25.0)
    gain, best = gain_vs_best(res, "m", ["a", "b"], metric="t", higher_is_better=True)
    assert best == "a" and gain == pytest.approx(-40.0)
    with pytest.raises(ValueError, match="baselines"):
        gain_vs_best(res, "m", ["zz"], metric="t")


def test_every_router_whose_needs_are_met_runs_in_the_decode_cluster():
    """Any router in the ELDR decode cluster: every registered router the trace's columns satisfy."""
    from moelab.sim.cluster import supplied_fields

    tr = _trace()
    reqs = replay_requests(tr, rate=300.0, n_requests=40, output_len=4, seed=3)
    reqs = reqs.with_columns(signature=np.random.default_rng(0).random((40, 16)))
    kwargs = {"eldr": {"centroids": np.random.default_rng(1).random((3, 16))}, "domain_oracle": {"n_domains": 2}}
    names = router_names(supplied=supplied_fields(reqs))
    assert {"eldr", "domain_oracle", "br0", "brh", "jsq"} <= set(names)
    for name in names:
        kw = kwargs.get(name, {"kv_capacity_tokens": 10_000} if name.startswith("vllm_dp@") and name != "vllm_dp@legacy"
                        else {})
        res = simulate(reqs, make_router(name, **kw), _cost(), n_workers=3, trace=tr)
        assert np.isfinite(res.finish_s).all(), name
