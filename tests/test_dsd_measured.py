"""DSD with measured inputs: invariants of the recorder, the RTT laws, the Monte Carlo and the batching server,
and the reduction to the closed forms when fed their own assumptions (the one place agreement is asserted)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import moelab.dsd as dsd
from moelab.costmodel.verify import VerifyCost, cached_verify_cost
from moelab.dsd.acceptance import AcceptanceTrace, SequenceRecord, record_acceptance
from moelab.dsd.measured import MAX_CLIENTS, MAX_ROUNDS, iid_rounds, serve_batched, simulate
from moelab.dsd.rtt import RTTDistribution

REF = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def _iid_trace(alpha: float, gamma_max: int, n: int, seed: int = 0) -> AcceptanceTrace:
    rng = np.random.default_rng(seed)
    run = np.cumprod(rng.random((n, gamma_max)) < alpha, axis=1).sum(axis=1)
    rec = SequenceRecord(0, "synthetic", run, np.full(n, gamma_max), np.zeros(n))
    return AcceptanceTrace("iid", "none", gamma_max, [rec])


def test_recorder_oracle_wrong_and_tree():
    oracle = record_acceptance(lambda ctx, p: [tuple(REF[p:p + 4])], [1, 2], REF, gamma_max=4)
    assert oracle.run.tolist() == [min(4, len(REF) - p) for p in range(len(REF))]
    wrong = record_acceptance(lambda ctx, p: [(0, 0, 0)], [1, 2], REF, gamma_max=4)
    assert wrong.run.tolist() == [0] * len(REF) and wrong.nodes.tolist() == [3] * len(REF)
    # two candidates sharing a prefix: the trie holds 3 nodes; the best candidate sets the run
    tree = record_acceptance(lambda ctx, p: [(REF[p], 0), (REF[p], REF[p + 1] if p + 1 < len(REF) else 0)],
                             [1], REF, gamma_max=4)
    assert tree.run[0] == 2 and tree.nodes[0] == 3
    with pytest.raises(ValueError, match="gamma_max"):
        record_acceptance(lambda ctx, p: [], [1], REF, gamma_max=0)
    with pytest.raises(ValueError, match="drafter"):
        record_acceptance(object(), [1], REF, gamma_max=2)


def test_recorder_sees_the_context_a_real_run_sees():
    seen = []
    record_acceptance(lambda ctx, p: seen.append(list(ctx)) or [], [1, 2], REF[:3], gamma_max=2)
    assert seen == [[1, 2], [1, 2, 5], [1, 2, 5, 6]]


def test_rounds_conserve_tokens_and_positions():
    trace = _iid_trace(0.6, 6, 3000)
    for g in (1, 3, 5):
        r = trace.rounds(g)
        emitted = (r["accepted"] + 1).sum()
        assert emitted <= 3000 and emitted > 3000 - (g + 1) - 1  # every position up to the cut-off is covered once
        assert np.all(r["accepted"] <= g) and np.all(r["nodes"] <= g)
        assert not np.any(r["valid_next"] & (r["accepted"] < g))  # a valid pre-draft needs the whole block
    assert not trace.rounds(6)["valid_next"].any()  # past gamma_max the recording does not know


def test_iid_recording_reduces_to_leviathan():
    # the closed form's own assumption (i.i.d. acceptance): tokens per round -> E(alpha, gamma), alpha recovered
    trace = _iid_trace(0.7, 8, 60_000, seed=1)
    for g in (2, 5):
        r = trace.rounds(g)["accepted"]
        se = r.std() / np.sqrt(r.size)
        assert abs(trace.tokens_per_round(g) - dsd.expected_tokens(0.7, g)) < 4 * se
        assert trace.alpha(g) == pytest.approx(0.7, abs=0.01)
    assert np.allclose(trace.conditional_acceptance(), 0.7, atol=0.02)


def test_trace_file_roundtrip_and_refusals(tmp_path):
    trace = _iid_trace(0.5, 4, 50)
    path = dsd.save_traces(tmp_path / "a.json", {"x": trace}, {"timings_ms": {"t": 1.0}})
    back, extra = dsd.load_traces(path)
    assert back["x"].rounds(3)["accepted"].tolist() == trace.rounds(3)["accepted"].tolist()
    assert extra["timings_ms"] == {"t": 1.0}
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        dsd.load_traces(tmp_path / "bad.json")
    d = trace.to_dict()
    d["sequences"][0]["run"][0] = 99
    with pytest.raises(ValueError, match="run"):
        AcceptanceTrace.from_dict(d)
    with pytest.raises(FileNotFoundError):
        dsd.load_traces(tmp_path / "none.json")


def test_rtt_laws():
    rng = np.random.default_rng(0)
    ln = RTTDistribution.lognormal(40, 100)
    s = ln.sample(rng, 200_000)
    assert np.percentile(s, 50) == pytest.approx(40, rel=0.02) and np.percentile(s, 95) == pytest.approx(100, rel=0.03)
    assert ln.percentile(95) == pytest.approx(100)
    assert ln.scaled(80).mean == pytest.approx(80) and ln.scaled(80).percentile(50) == pytest.approx(80 * 40 / ln.mean)
    emp = RTTDistribution.empirical([1.0, 2.0, 3.0])
    assert emp.mean == pytest.approx(2.0) and set(emp.sample(rng, 50)) <= {1.0, 2.0, 3.0}
    assert RTTDistribution.uniform(50, 0.2).percentile(100) == pytest.approx(60)
    # the share above a threshold and the mean leftover beyond it agree with the sampled law (all three kinds)
    for law in (ln, ln.scaled(120), RTTDistribution.uniform(50, 0.2), RTTDistribution.empirical([1.0, 2.0, 3.0]).scaled(20),
                RTTDistribution.constant(30)):
        s = law.sample(rng, 400_000)
        for k in (0.0, 15.0, 45.0, 100.0):
            assert law.share_above(k) == pytest.approx(np.mean(s > k), abs=3e-3), (law.name, k)
            assert law.mean_excess_over(k) == pytest.approx(np.mean(np.maximum(s - k, 0)), rel=0.02, abs=0.05), (law.name, k)
    assert ln.share_above(ln.percentile(95)) == pytest.approx(0.05)
    assert RTTDistribution.uniform(50, 0.2).mean_excess_over(0) == pytest.approx(50)
    for call, name in ((lambda: RTTDistribution.lognormal(50, 40), "p95_ms"),
                       (lambda: RTTDistribution.empirical([1.0]), "samples_ms"),
                       (lambda: RTTDistribution.uniform(10, 2), "jitter"),
                       (lambda: RTTDistribution.constant(-1), "rtt_ms")):
        with pytest.raises(ValueError, match=name):
            call()


def test_loopback_rtt_is_measured():
    rtt = dsd.measure_loopback_rtt(50)
    assert rtt.shape == (50,) and np.all(rtt > 0) and np.all(np.isfinite(rtt))
    with pytest.raises(ValueError, match="host"):
        dsd.measure_loopback_rtt(5, host="8.8.8.8")


@pytest.mark.parametrize(("mode", "pipeline"), [("colocated", "event"), ("dsd_sync", "event"),
                                                ("dsd_pipelined", "paper")])
def test_reduces_to_the_closed_form_on_its_own_assumptions(mode, pipeline):
    rounds = iid_rounds(0.8, 5, 40_000, np.random.default_rng(2))
    rtt = RTTDistribution.uniform(45.0, 0.5)
    res = simulate(mode, rounds, t_d=8, t_a=10, verify_ms=50, rtt=rtt, n_rounds=40_000, pipeline=pipeline, seed=3)
    closed = dsd.latency_per_token(mode, alpha=0.8, gamma=5, t_d=8, t_a=10, t_v=50, rtt=45, rtt_jitter=0.5)
    assert abs(res.latency_per_token - closed) < 3.29 * res.std_err  # 99.9% interval


def test_monotone_in_rtt_and_pipelining_bounds():
    trace = _iid_trace(0.6, 7, 5000, seed=4)
    rounds = trace.rounds(5)
    shape = RTTDistribution.lognormal(30, 90)
    kw = {"t_a": 5.0, "verify_ms": lambda q: 40 + 0.5 * q, "n_rounds": 3000, "seed": 9}
    for mode in ("dsd_sync", "dsd_pipelined"):
        lat = [simulate(mode, rounds, rtt=shape.scaled(m), **kw).latency_per_token for m in (0, 10, 40, 160)]
        assert np.all(np.diff(lat) > 0), (mode, lat)
    sync = simulate("dsd_sync", rounds, rtt=shape.scaled(40), **kw)
    pipe = simulate("dsd_pipelined", rounds, rtt=shape.scaled(40), **kw)
    assert pipe.latency_per_token <= sync.latency_per_token  # every pipelined round is at most a sync round
    assert 0 < pipe.wasted_draft_share < 1 and 0 < pipe.invalidated_share < 1
    # never a valid pre-draft: pipelining buys nothing, the round trip is paid in full
    none_valid = {**rounds, "valid_next": np.zeros_like(rounds["valid_next"])}
    assert simulate("dsd_pipelined", none_valid, rtt=shape.scaled(40), **kw).latency_per_token == pytest.approx(
        simulate("dsd_sync", none_valid, rtt=shape.scaled(40), **kw).latency_per_token)


def test_same_seed_same_result():
    rounds = iid_rounds(0.7, 4, 1000, np.random.default_rng(0))
    kw = {"t_a": 3.0, "verify_ms": 20.0, "rtt": RTTDistribution.lognormal(20, 50), "n_rounds": 500}
    assert simulate("dsd_pipelined", rounds, seed=5, **kw) == simulate("dsd_pipelined", rounds, seed=5, **kw)
    assert simulate("dsd_pipelined", rounds, seed=5, **kw) != simulate("dsd_pipelined", rounds, seed=6, **kw)


def test_breakeven_is_where_sync_ties_ar():
    rounds = _iid_trace(0.8, 7, 4000).rounds(5)  # one sequence: the simulation replays it in order
    n = rounds["accepted"].size
    be = dsd.breakeven_rtt_sync(rounds, t_ar=50, t_a=10, verify_ms=50)
    # the RTT law's shape does not matter for sync DSD, only its mean
    for law in (RTTDistribution.constant(be), RTTDistribution.uniform(be, 0.0)):
        at = simulate("dsd_sync", rounds, t_a=10, verify_ms=50, rtt=law, n_rounds=n, seed=1)
        assert at.latency_per_token == pytest.approx(50, rel=1e-9)
    # the i.i.d. closed form at the same alpha is close (the reduction), not equal (finite recording)
    assert be == pytest.approx(float(dsd.rtt_breakeven(0.8, 5, 50, 10)), rel=0.1)


def test_breakeven_agreement_says_why():
    rounds = {"accepted": np.array([1, 3]), "nodes": np.array([3, 5]), "valid_next": np.array([False, False])}
    flat = lambda q: np.full(np.shape(q), 40.0)  # noqa: E731 - one target step whatever q
    steep = lambda q: 40.0 * (1 + 0.5 * (np.asarray(q) - 1))  # noqa: E731 - q tokens cost 1 + (q - 1) / 2 steps
    ok, text = dsd.breakeven_agreement("x", 10.5, 10.0, rounds, flat)
    assert ok and text == "x: measured 10.5 vs closed form 10.0 ms (5% apart, within the 10% pass mark)"
    ok, text = dsd.breakeven_agreement("x", -3.0, -40.0, rounds, flat)
    assert ok and "both negative" in text
    # near zero the pass mark is 10% of 1 ms, not of the closed form's 0.2 ms
    assert dsd.breakeven_agreement("x", 0.29, 0.2, rounds, flat)[0]
    assert not dsd.breakeven_agreement("x", 0.31, 0.2, rounds, flat)[0]
    # a disagreement: the rounds verify 4 and 6 tokens, 5 on average, (2.5 + 3.5) / 2 = 3 target steps
    ok, text = dsd.breakeven_agreement("x", 5.0, 10.0, rounds, steep)
    assert not ok and "50% apart, beyond the 10% pass mark" in text
    assert "verifies 5.0 tokens on average" in text and "costs 3.00 target steps" in text
    ok, text = dsd.breakeven_agreement("x", 5.0, 10.0, rounds, flat)
    assert not ok and "tokens per round differ from n_tok" in text
    assert "20% pass mark" in dsd.breakeven_agreement("x", 5.0, 10.0, rounds, flat, tolerance=0.2)[1]
    with pytest.raises(ValueError, match="tolerance"):
        dsd.breakeven_agreement("x", 5.0, 10.0, rounds, flat, tolerance=1.5)
    with pytest.raises(ValueError, match="measured_ms"):
        dsd.breakeven_agreement("x", float("nan"), 10.0, rounds, flat)


def test_batched_server_invariants():
    rounds = iid_rounds(0.8, 4, 4000, np.random.default_rng(1))
    flat = lambda b, q: 40.0 + 0.05 * q  # noqa: E731 - a nearly flat verify curve
    kw = {"verify_batch_ms": flat, "draft_batch_ms": lambda b: 2.0, "t_a": 2.0,
          "rtt": RTTDistribution.constant(30), "rounds_per_client": 40, "seed": 0}
    one = serve_batched("dsd", 32, rounds, max_batch=1, **kw)
    many = serve_batched("dsd", 32, rounds, max_batch=16, **kw)
    assert 0 <= one.server_utilisation <= 1 + 1e-9 and 0 <= many.server_utilisation <= 1 + 1e-9
    assert one.mean_batch == 1 and 1 < many.mean_batch <= 16
    assert many.per_client_rate > 2 * one.per_client_rate  # batching a flat curve serves more tokens
    assert serve_batched("dsd", 8, rounds, max_batch=4, **kw) == serve_batched("dsd", 8, rounds, max_batch=4, **kw)


def test_unbatched_server_reduces_to_the_capacity_closed_form():
    # one client per server job and constant costs: the closed form's own server
    rounds = iid_rounds(0.8, 5, 4000, np.random.default_rng(3))
    cap = dsd.capacity_batched(rounds, verify_batch_ms=lambda b, q: 50.0 * b, draft_batch_ms=lambda b: 10.0 * b,
                               t_a=10.0, rtt=RTTDistribution.uniform(60, 0.3), max_batch=1, target_fraction=0.1,
                               rounds_per_client=80, seed=0)
    assert cap.ratio == pytest.approx(dsd.capacity_gain(5, 10, 50), rel=0.08)


@pytest.mark.parametrize(("call", "name"), [
    (lambda: simulate("edge", iid_rounds(0.5, 2, 10, np.random.default_rng(0))), "mode"),
    (lambda: simulate("dsd_sync", {"accepted": [1]}, verify_ms=1.0), "rounds"),
    (lambda: simulate("dsd_sync", iid_rounds(0.5, 2, 10, np.random.default_rng(0)), verify_ms=1.0), "rtt"),
    (lambda: simulate("colocated", iid_rounds(0.5, 2, 10, np.random.default_rng(0))), "verify_ms"),
    (lambda: simulate("colocated", iid_rounds(0.5, 2, 10, np.random.default_rng(0)), verify_ms=1.0,
                      n_rounds=MAX_ROUNDS + 1), "n_rounds"),
    (lambda: simulate("dsd_pipelined", iid_rounds(0.5, 2, 10, np.random.default_rng(0)), verify_ms=1.0,
                      rtt=RTTDistribution.constant(1), pipeline="magic"), "pipeline"),
    (lambda: simulate("colocated", iid_rounds(0.5, 2, 10, np.random.default_rng(0)), verify_ms=lambda q: -q), "verify_ms"),
    (lambda: iid_rounds(1.0, 2, 10, np.random.default_rng(0)), "alpha"),
    (lambda: serve_batched("dsd", MAX_CLIENTS + 1, iid_rounds(0.5, 2, 10, np.random.default_rng(0)),
                           verify_batch_ms=lambda b, q: 1.0, rtt=RTTDistribution.constant(1)), "clients"),
    (lambda: serve_batched("colocated", 2, iid_rounds(0.5, 2, 10, np.random.default_rng(0)),
                           verify_batch_ms=lambda b, q: 1.0), "draft_batch_ms"),
    (lambda: dsd.h200_verify_batch_ms("gpt-5"), "shape"),
    (lambda: dsd.h200_verify_batch_ms()(4, 500), "q"),
])
def test_bad_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_monotone_fit_pools_only_where_timings_fall():
    rising = [1.0, 2.0, 2.0, 5.0]
    assert dsd.monotone_fit(rising).tolist() == rising  # nothing to pool
    assert dsd.monotone_fit([1.0, 3.0, 2.0, 4.0]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert dsd.monotone_fit([1.0, 3.0, 2.0, 4.0, 0.5]).tolist() == pytest.approx([1.0, 2.375, 2.375, 2.375, 2.375])
    rng = np.random.default_rng(1)
    for _ in range(50):
        ms = rng.normal(10, 3, size=8)
        fit = dsd.monotone_fit(ms)
        assert np.all(np.diff(fit) >= -1e-12) and fit.mean() == pytest.approx(ms.mean())
        # least squares among non-decreasing curves: no random non-decreasing curve is closer
        for _ in range(20):
            other = np.sort(rng.normal(10, 3, size=8))
            assert np.sum((fit - ms) ** 2) <= np.sum((other - ms) ** 2) + 1e-9
    with pytest.raises(ValueError, match="ms"):
        dsd.monotone_fit([1.0, np.nan])
    assert dsd.monotone_fit([3.0]).tolist() == [3.0] and dsd.monotone_fit([]).size == 0


def test_pooled_blocks_give_one_value_per_pooled_run():
    """Review item: notebook 04 said 'replaces q = ... by their mean, X ms' with one X even when the fit pooled
    two separate runs; each run has its own mean."""
    qs = [1, 2, 3, 4, 5, 6, 7]
    rec = [10.0, 14.0, 12.0, 15.0, 20.0, 17.0, 30.0]
    fit = dsd.monotone_fit(rec)
    assert fit.tolist() == pytest.approx([10.0, 13.0, 13.0, 15.0, 18.5, 18.5, 30.0])
    assert dsd.pooled_blocks(qs, rec, fit) == [{"qs": [2, 3], "ms": pytest.approx(13.0)},
                                               {"qs": [5, 6], "ms": pytest.approx(18.5)}]
    # equal rising medians are not a pooled run
    assert dsd.pooled_blocks([1, 2, 3], [1.0, 2.0, 2.0], dsd.monotone_fit([1.0, 2.0, 2.0])) == []
    with pytest.raises(ValueError, match="one value per q"):
        dsd.pooled_blocks([1, 2], [1.0], [1.0])
    cpu = dsd.cpu_costs({"timings_ms": {"target_q": dict(zip(map(str, qs), rec)), "draft_q": {"1": 1.0}}})
    assert [b["qs"] for b in cpu["pooled_blocks"]] == [[2, 3], [5, 6]] and cpu["pooled_qs"] == [2, 3, 5, 6]


def test_cpu_costs_fit_the_recorded_verify_curve():
    _, rec = dsd.load_shipped()
    cpu = dsd.cpu_costs(rec)
    qs, recorded, fitted = np.array(cpu["qs"]), np.array(cpu["recorded_ms"]), np.array(cpu["fitted_ms"])
    assert np.all(np.diff(fitted) >= 0)  # verifying more tokens never costs less
    assert cpu["verify"](qs).tolist() == pytest.approx(fitted.tolist())
    assert cpu["verify_recorded"](qs).tolist() == pytest.approx(recorded.tolist())
    kept = ~np.isin(qs, cpu["pooled_qs"])
    assert np.allclose(fitted[kept], recorded[kept]) and not np.allclose(fitted[~kept], recorded[~kept])
    assert cpu["t_ar"] == recorded[0] and cpu["torch_threads"] == rec["torch_threads"] and cpu["note"] == rec["note"]


def test_batched_capacity_counts_whole_clients():
    rounds = iid_rounds(0.8, 5, 4000, np.random.default_rng(3))
    cap = dsd.capacity_batched(rounds, verify_batch_ms=lambda b, q: 50.0 * b, draft_batch_ms=lambda b: 10.0 * b,
                               t_a=10.0, rtt=RTTDistribution.uniform(60, 0.3), max_batch=1, target_fraction=0.1,
                               rounds_per_client=40, seed=0)
    for whole, crossing, mode in ((cap.colocated_clients, cap.colocated_crossing, "colocated"),
                                  (cap.dsd_clients, cap.dsd_crossing, "dsd")):
        assert isinstance(whole, int) and whole <= crossing <= whole + 1
        assert cap.rates[mode][whole] >= cap.target_rate > cap.rates[mode][whole + 1]  # the most meeting the target
    assert cap.ratio == pytest.approx(cap.dsd_crossing / cap.colocated_crossing)


def test_cached_cpu_verify_cost_reads_and_never_measures(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path))
    assert dsd.cached_cpu_verify_cost("smollm2-135m-instruct") is None  # nothing measured here: nothing loaded
    cached_verify_cost(dsd.measured.HF_VERIFY_ENGINE, "smollm2-135m-instruct", lambda: VerifyCost([1, 2], [50.0, 80.0]))
    assert dsd.cached_cpu_verify_cost("smollm2-135m-instruct")(1) == 50.0
    with pytest.raises(ValueError, match="model"):
        dsd.cached_cpu_verify_cost("")
