"""The cost-aware drafter's acceptance state: per request, forgetting, exploring, from a prior; bad input.

Real drafters and stores (W, an S n-gram table, an L suffix index) over small token sequences; the "engine"
is greedy verification against a known output: predictable text (drafts accepted) or random tokens, which
reject drafts as a temperature-1 request does.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from moelab.costmodel.verify import VerifyCost, cached_verify_cost, load_curve_json, machine_id
from moelab.hd import HierarchyDrafter, NGramTable, SuffixStore, replay_greedy
from moelab.hd.drafters import COST_AWARE_CONTEXT_KEYS, CostAwareDrafter, explore_rate
from moelab.hd.engine import cost_aware_rows, make_row_drafters
from moelab.hd.methods import make_hf_drafter
from moelab.hd.policy import (
    FALLBACK_PRIOR,
    AcceptanceModel,
    EngineAcceptance,
    cold_start_prior,
    default_prior,
)
from moelab.hd.rows import RowDrafters

VOCAB = 200
BUDGET = 8
CHEAP = VerifyCost([1, 9], [10.0, 14.0])  # each extra verified token costs 5% of a forward: drafting pays
DEAR = VerifyCost([1, 2, 9], [10.0, 14.0, 17.0])  # a step up from one token to two (a CPU's mat-vec -> GEMM)


def _corpus(seed: int = 0) -> list[list[int]]:
    """Documents made of a few recurring phrases, so the stores learn what follows what."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in rng.integers(6, 12, size=12)]
    return [[t for i in rng.integers(0, len(phrases), size=30) for t in phrases[i]] for _ in range(20)]


CORPUS = _corpus()
S = NGramTable.build(CORPUS, key_lengths=(1, 2), length=4)
L = SuffixStore.build(CORPUS, vocab_size=VOCAB)


def _greedy_request(i: int) -> tuple[list[int], list[int]]:
    """A prompt and the target's output: a stretch of one document and its continuation (predictable)."""
    doc = CORPUS[i % len(CORPUS)]
    return doc[:20], doc[20:140]


def _hot_request(i: int) -> tuple[list[int], list[int]]:
    """A prompt from the corpus and an output of random tokens: every draft is rejected."""
    rng = np.random.default_rng([7, i])
    return CORPUS[i % len(CORPUS)][:20], rng.integers(0, VOCAB, size=120).tolist()


def _serve(rows: RowDrafters, requests: list[tuple[list[int], list[int]]]) -> tuple[int, int]:
    """Serve ``requests`` one after the other in batch row 0 (as a batching engine reuses rows), verifying
    each proposed chain greedily against the request's output; returns (drafted, accepted) tokens."""
    drafted0, accepted0 = rows.stats.drafted_tokens, rows.stats.accepted_tokens
    for prompt, ref in requests:
        tokens, pos = list(prompt), 0
        while pos < len(ref):
            chain = rows.propose(0, np.asarray(tokens), BUDGET)
            a = 0
            while a < len(chain) and pos + a < len(ref) and chain[a] == ref[pos + a]:
                a += 1
            n_new = min(a + 1, len(ref) - pos)  # the accepted tokens and the target's own next one
            tokens += ref[pos:pos + n_new]
            pos += n_new
        rows.propose(0, np.asarray(tokens), BUDGET)  # the engine reports the last step's outcome
    return rows.stats.drafted_tokens - drafted0, rows.stats.accepted_tokens - accepted0


GREEDY = [_greedy_request(i) for i in range(4)]
HOT = [_hot_request(i) for i in range(8)]


def test_greedy_requests_draft_after_rejecting_ones_as_on_a_fresh_engine_vllm_rows():
    fresh = _serve(cost_aware_rows(S, L, CHEAP, budget=BUDGET), GREEDY)  # one fresh engine, the greedy requests
    # each greedy request alone on a fresh engine: what a request drafts from the cold start
    cold = [_serve(cost_aware_rows(S, L, CHEAP, budget=BUDGET), [g]) for g in GREEDY]
    engine = EngineAcceptance()
    rows = cost_aware_rows(S, L, CHEAP, budget=BUDGET, engine=engine)
    hot_drafted, hot_accepted = _serve(rows, HOT)
    assert hot_drafted > 100 and hot_accepted < 0.05 * hot_drafted  # the hot requests really were rejected
    # the engine's own estimate fell far below the floor; new requests still start from the floor
    raw = (engine.accepted[("S", False, 0)] + 2 * engine.floor) / (engine.tried[("S", False, 0)] + 2)
    assert raw < 0.5 * engine.floor and engine.alpha("S", False) == engine.floor
    after = _serve(rows, GREEDY)
    assert fresh[1] > 100  # the greedy requests are draftable at all
    # never below a cold start; the fresh engine's later requests also start from its earlier greedy
    # requests' (higher) estimates, which the hot ones cancel here: a few drafted tokens, no accepted ones
    assert after[0] >= sum(c[0] for c in cold) and after[1] >= sum(c[1] for c in cold)
    assert after[1] >= 0.97 * fresh[1] and after[0] >= 0.9 * fresh[0]
    assert engine.requests == len(HOT) + len(GREEDY)


def test_one_shared_never_forgetting_estimate_locks_drafting_off():
    """What the per-request state prevents: the same traffic through ONE model that never forgets and never
    explores (the former design) leaves the greedy requests drafting far less than on a fresh engine."""
    shared = AcceptanceModel(half_life=float("inf"))

    def rows() -> RowDrafters:
        return RowDrafters(lambda: CostAwareDrafter(HierarchyDrafter(S, L, order="WSL", length=4,
                                                                     context_key_lengths=COST_AWARE_CONTEXT_KEYS), CHEAP,
                                                    budget=BUDGET, chain=True, acceptance=shared, explore=0.0),
                           lambda d, m: d.draft(m))

    fresh = _serve(cost_aware_rows(S, L, CHEAP, budget=BUDGET), GREEDY)
    r = rows()
    _serve(r, HOT)
    after = _serve(r, GREEDY)
    assert after[1] < 0.5 * fresh[1]


@pytest.mark.parametrize("cost", [CHEAP, DEAR])
def test_greedy_requests_draft_after_rejecting_ones_as_on_a_fresh_engine_hf(cost):
    """HF engine: one drafter per request (make_hf_drafter), an engine prior shared across them."""
    def serve(engine: EngineAcceptance | None, requests, first_seed: int = 0) -> tuple[int, int]:
        drafted = accepted = 0
        for i, (prompt, ref) in enumerate(requests):
            d = make_hf_drafter("HD-cost", S, L, budget=BUDGET, cost=cost, engine=engine, seed=first_seed + i)
            res = replay_greedy(d, prompt, ref)
            drafted += sum(s.tree_size - 1 for s in res.steps)  # tree nodes besides the root
            accepted += sum(len(s.accepted) for s in res.steps)
        return drafted, accepted

    fresh = serve(EngineAcceptance(), GREEDY)
    engine = EngineAcceptance()
    serve(engine, HOT, first_seed=100)
    after = serve(engine, GREEDY)
    assert fresh[1] > 50
    assert after[0] >= 0.95 * fresh[0] and after[1] >= 0.95 * fresh[1]


def test_cold_start_drafts_from_the_measured_prior():
    prior, source = cold_start_prior()
    assert 0.0 < prior < 1.0 and "specbench_vllm_full.csv" in source  # from the committed table, not a guess
    assert default_prior() == prior
    for cost in (CHEAP, DEAR):
        d = make_hf_drafter("HD-cost", S, L, budget=BUDGET, cost=cost)
        d.start(GREEDY[0][0])
        assert d.draft().candidates, "a fresh drafter must draft on its first step"
        rows = cost_aware_rows(S, L, cost, budget=BUDGET)
        assert rows.propose(0, np.asarray(GREEDY[0][0]), BUDGET)


def test_cold_start_prior_solves_the_tables_mat(tmp_path):
    table = tmp_path / "full.csv"
    table.write_text("method,category,budget,mean_accepted\nHD,overall,4,1.9375\nAR,overall,4,1.0\n")
    prior, _ = cold_start_prior(table)
    assert prior == pytest.approx(0.5, abs=1e-9)  # 0.5 + 0.25 + 0.125 + 0.0625 = 0.9375
    assert cold_start_prior(tmp_path / "missing.csv")[0] == FALLBACK_PRIOR
    (tmp_path / "no-hd.csv").write_text("method,category,budget,mean_accepted\nAR,overall,4,1.0\n")
    assert cold_start_prior(tmp_path / "no-hd.csv")[0] == FALLBACK_PRIOR


def _rejected_then_predictable(explore: float, seed: int = 0) -> CostAwareDrafter:
    """S alone (one estimate, so no untested store keeps drafting alive): the request first produced 120
    random tokens (every draft rejected), then predictable text."""
    prompt, ref = GREEDY[1]
    _, noise = HOT[0]
    d = CostAwareDrafter(HierarchyDrafter(S, None, order="S", max_candidates=1, length=4), CHEAP, budget=BUDGET,
                         explore=explore, seed=seed)
    res = replay_greedy(d, prompt, noise + ref)
    d.steps = res.steps  # type: ignore[attr-defined]
    return d


def test_exploration_retests_a_low_estimate_and_recovers():
    stuck = _rejected_then_predictable(explore=0.0)
    assert stuck.acceptance.alpha("S", False) < CHEAP.draft_threshold(BUDGET)
    late = stuck.steps[-40:]
    assert sum(s.tree_size - 1 for s in late) == 0  # without exploration the request never drafts again
    d = _rejected_then_predictable(explore=0.125)
    assert d.explored > 0
    late = d.steps[-40:]
    assert sum(len(s.accepted) for s in late) > 20  # re-tested, found good, drafting again
    again = _rejected_then_predictable(explore=0.125)
    assert [s.accepted for s in again.steps] == [s.accepted for s in d.steps]  # deterministic given the seed


def test_no_exploration_where_the_cost_curve_alone_forbids_drafting():
    """Every extra verified token costs a full forward: no acceptance <= 1 pays, nothing is re-tested."""
    steep = VerifyCost([1, 2, 3], [10.0, 20.0, 30.0])
    prompt, ref = GREEDY[1]
    d = CostAwareDrafter(HierarchyDrafter(S, L, order="WSL", max_candidates=3, length=4), steep, budget=BUDGET,
                         explore=1.0)
    res = replay_greedy(d, prompt, ref)
    assert d.explored == 0 and all(s.tree_size == 1 for s in res.steps)


def test_estimates_forget_with_the_half_life():
    m = AcceptanceModel(prior=0.5, half_life=8.0)
    for _ in range(200):
        m.record("S", False, False)
    low = m.alpha("S", False)
    for _ in range(8):
        m.record("S", False, True)
    # after one half-life of acceptances the old rejections weigh half: alpha ~ (8*(1-.5)/(1-.5**(1/8)) ...)
    keep = 0.5 ** (1 / 8)
    tried = sum(keep ** i for i in range(208))
    acc = sum(keep ** i for i in range(8))
    assert m.alpha("S", False) == pytest.approx((acc + 2 * 0.5) / (tried + 2))
    assert low < 0.1 < 0.45 < m.alpha("S", False)


def test_explore_rate_keeps_exploration_cheap():
    assert explore_rate(CHEAP) == 0.125
    rate = explore_rate(DEAR)  # one extra token costs 40% of a forward here
    assert rate * (DEAR.relative(2) - 1) == pytest.approx(0.02)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_acceptance_prior_out_of_range_is_refused(value):
    with pytest.raises(ValueError, match="prior"):
        AcceptanceModel(prior=value)
    with pytest.raises(ValueError, match="floor"):
        EngineAcceptance(floor=value)
    with pytest.raises(ValueError, match="explore"):
        CostAwareDrafter(HierarchyDrafter(S, L), CHEAP, explore=value)
    with pytest.raises(ValueError, match="acceptance_prior"):  # the vLLM adapter's config, refused before loading
        make_row_drafters({"method": "hd", "acceptance_prior": value}, tokenizer_path="/nonexistent", budget=BUDGET)


def test_a_verify_cost_curve_that_is_not_increasing_is_refused():
    with pytest.raises(ValueError, match="ms must not decrease"):
        VerifyCost([1, 2, 9], [10.0, 9.0, 12.0])
    VerifyCost([1, 2, 9], [10.0, 10.0, 12.0])  # flat stretches are fine (verifying more can be free)


def _write_curve(path, **fields):
    path.write_text(json.dumps({"qs": [1, 9], "ms": [10.0, 14.0], "source": "test", **fields}))
    return path


def test_a_cost_file_from_another_machine_or_model_is_refused(tmp_path):
    here = machine_id()
    ok = _write_curve(tmp_path / "ok.json", machine=here, engine="vllm", model="smollm2")
    assert load_curve_json(ok, engine="vllm", model="smollm2").ms == [10.0, 14.0]
    with pytest.raises(ValueError, match="machine 'other-box'"):
        load_curve_json(_write_curve(tmp_path / "a.json", machine="other-box", engine="vllm", model="smollm2"))
    with pytest.raises(ValueError, match="model 'tinyllama'"):
        load_curve_json(_write_curve(tmp_path / "b.json", machine=here, engine="vllm", model="tinyllama"),
                        model="smollm2")
    with pytest.raises(ValueError, match="machine None"):  # a file that does not say where it was measured
        load_curve_json(_write_curve(tmp_path / "c.json"))


def test_cached_cost_records_its_origin_and_refuses_a_foreign_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path))
    calls = []

    def measure() -> VerifyCost:
        calls.append(1)
        return VerifyCost([1, 9], [10.0, 14.0], "measured")

    vc = cached_verify_cost("vllm", "smollm2", measure)
    (path,) = (tmp_path / "hd" / "verify-cost").glob("*.json")
    d = json.loads(path.read_text())
    assert (d["machine"], d["engine"], d["model"]) == (machine_id(), "vllm", "smollm2") and vc.ms == [10.0, 14.0]
    assert cached_verify_cost("vllm", "smollm2", measure).ms == [10.0, 14.0] and len(calls) == 1  # read back
    path.write_text(json.dumps({**d, "machine": "other-box"}))  # a cache copied from elsewhere
    with pytest.raises(ValueError, match="machine 'other-box'"):
        cached_verify_cost("vllm", "smollm2", measure)
    assert len(calls) == 1
    # an entry from before files named their origin: its name (engine, model, this machine) vouches for it
    path.write_text(json.dumps({"qs": [1, 9], "ms": [10.0, 15.0]}))
    assert cached_verify_cost("vllm", "smollm2", measure).ms == [10.0, 15.0] and len(calls) == 1
    assert json.loads(path.read_text())["machine"] == machine_id()  # and it now says so
    path.write_text(json.dumps({**d, "ms": [10.0, 9.0]}))  # a damaged entry (decreasing): measured again
    assert cached_verify_cost("vllm", "smollm2", measure).ms == [10.0, 14.0] and len(calls) == 2
