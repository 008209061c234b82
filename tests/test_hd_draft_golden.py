"""HD's drafts, counters and acceptance state are those recorded before the drafting-latency work of issue 41
(part 4): the same requests through the same drafters must give, step for step, the same proposals (candidates,
store letters, confidence classes), the same store counters, the same acceptance models (a request's and the
engine's decayed counts), exploration counts, online verify-cost table and policy-choice state.

The record is a sha256 of the run's full trace, taken from the code as it was before that work (commit
25efd30): a faster path that changes any draft, any count or any float of the learned state changes the digest.
The trace itself is built here, so when a digest fails, ``_trace`` of the old and the new code can be diffed
step by step (check the old code out into a scratch directory and run this module's ``_trace`` there).

Four drivers cover the engines' paths: the HF engine's tree (``replay_greedy``, cost-aware at several budgets
and cost curves, and the paper's fixed tree), vLLM's rows (cost-aware chains through ``RowDrafters.propose``,
offline, and online with a deterministic clock so the online cost curve and the policy choice take part), and
the fixed hierarchy's chain rows.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from moelab.costmodel.verify import VerifyCost
from moelab.hd import HierarchyDrafter, NGramTable, SuffixStore, replay_greedy
from moelab.hd import drafters as drafters_module
from moelab.hd.drafters import COST_AWARE_CONTEXT_KEYS, CostAwareDrafter
from moelab.hd.engine import cost_aware_rows
from moelab.hd.policy import AcceptanceModel, EngineAcceptance
from moelab.hd.rows import RowDrafters
from tests.helpers import greedy_chains

VOCAB = 3000
COSTS = {"cheap": VerifyCost([1, 2, 3, 5, 9], [10.0, 10.4, 10.9, 11.5, 13.0]),
         "dear": VerifyCost([1, 2, 3, 5, 9], [10.0, 15.0, 16.0, 18.0, 22.0]),
         "flat": VerifyCost([1, 9], [10.0, 10.0])}


def _corpus(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in rng.integers(3, 20, size=80)]
    return [[t for i in rng.zipf(1.4, size=40) % len(phrases) for t in phrases[i]] for _ in range(120)]


CORPUS = _corpus()


@pytest.fixture(scope="module")
def stores() -> tuple[NGramTable, SuffixStore]:
    return (NGramTable.build(CORPUS[:60], key_lengths=(1, 2), length=4),
            SuffixStore.build(CORPUS, vocab_size=VOCAB))


def _requests(seed: int, n: int = 12) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy output) pairs: random tokens then a stretch of a document, and the document's
    continuation as the output (every fifth output random: its drafts are rejected)."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n):
        doc = CORPUS[int(rng.integers(len(CORPUS)))]
        prompt = rng.integers(0, VOCAB, int(rng.integers(1, 120))).tolist() + doc[:10]
        ref = doc[10:110] if q % 5 else rng.integers(0, VOCAB, 50).tolist()
        out.append((prompt, ref))
    return out


def _model_state(m: AcceptanceModel | EngineAcceptance) -> tuple:
    return (sorted(m.accepted.items()), sorted(m.tried.items()))


def _counters(d) -> tuple:
    return tuple((k, c.queries, c.lookup_hits, c.candidates, c.accept_steps, c.accepted_tokens)
                 for k, c in sorted(d.counters.items()))


def _recording(d):
    """``d`` with every draft it returns appended to ``d.trace``."""
    d.trace = []
    orig = d.draft

    def draft(*a):
        r = orig(*a)
        d.trace.append((list(r.candidates), list(r.sources), None if r.classes is None else list(r.classes)))
        return r

    d.draft = draft
    return d


#: the cold-start prior of the recorded run (then default_prior(), read from the full table committed at the
#: time): pinned, so that a new committed table (data, not drafting code) leaves the digest alone
RECORDED_PRIOR = 0.508435009039142


def _hf_trace(S, L) -> list:
    trace = []
    engine = EngineAcceptance(0.4)
    for cost_name, cost in COSTS.items():
        for budget in (4, 8, 16):
            for i, (prompt, ref) in enumerate(_requests(1)):
                length = min(4, budget)
                inner = HierarchyDrafter(S, L, order="WSL", max_candidates=min(7, budget // length + 1), length=length,
                                         context_key_lengths=COST_AWARE_CONTEXT_KEYS)
                acc = engine.new_request() if i % 2 else AcceptanceModel(RECORDED_PRIOR)
                d = _recording(CostAwareDrafter(inner, cost, budget=budget, seed=i, acceptance=acc))
                res = replay_greedy(d, prompt, ref)
                trace.append((cost_name, budget, i, d.trace, [(s.accepted, s.sources, s.bonus) for s in res.steps],
                              _counters(d), _model_state(d.acceptance), d.explored))
    trace.append(_model_state(engine))
    for order in ("WSL", "LSW", "W"):
        for i, (prompt, ref) in enumerate(_requests(2, 6)):
            d = _recording(HierarchyDrafter(S if "S" in order else None, L, order=order, max_candidates=2, length=4))
            res = replay_greedy(d, prompt, ref)
            trace.append((order, i, d.trace, [(s.accepted, s.sources) for s in res.steps], _counters(d)))
    return trace


class _Clock:
    """A deterministic stand-in for the ``time`` module: every reading advances by a fixed pattern."""

    def __init__(self) -> None:
        self.t, self.i = 100.0, 0

    def perf_counter(self) -> float:
        self.i += 1
        self.t += (7 + (self.i * 13) % 29) * 1e-4
        return self.t


def _serve(rows: RowDrafters, seed: int) -> list:
    """Requests in 4 reused batch rows (vLLM's path), greedy verification against the known output."""
    rng = np.random.default_rng(seed)
    out = []
    for q, (prompt, ref) in enumerate(_requests(seed, 16)):
        out += greedy_chains(rows, q % 4, prompt, ref, np.int32 if q % 2 else np.int64,
                             lambda: int(rng.integers(0, 9)))
    return out


def _rows_trace(S, L, online: bool) -> list:
    trace = []
    for cost_name, cost in COSTS.items():
        engine = EngineAcceptance(0.45)
        rows = cost_aware_rows(S, L, cost, budget=8, engine=engine, seed=3, online=online)
        made = []
        factory = rows.factory

        def new(factory=factory, made=made):
            d = factory()
            made.append(d)
            return d

        rows.factory = new
        chains = _serve(rows, 7)
        trace.append((cost_name, chains, _model_state(engine), rows.stats.proposals, rows.stats.drafted_tokens,
                      rows.stats.accepted_tokens, rows.stats.resets,
                      [(_counters(d), _model_state(d.acceptance), d.explored, list(d.arms)) for d in made]))
        if online:
            trace.append((list(rows.cost_model.table), rows.cost_model.observations, rows.cost_model.rebuilds,
                          rows.policy_choice.as_dict(), list(rows.policy_choice.tokens),
                          list(rows.policy_choice.seconds)))
    fixed = RowDrafters(lambda: HierarchyDrafter(S, L, order="WSL", length=4), lambda d, m: d.draft_chain(m))
    trace.append(("fixed", _serve(fixed, 8)))
    return trace


def _digest(trace: list) -> str:
    return hashlib.sha256(repr(trace).encode()).hexdigest()


# recorded from the code before the work (commit 25efd30)
GOLDEN = {
    "hf": "0641e52fa37c285545747469405a6764e01aad66ee8cfbffe3b867092a5edb5a",
    "rows": "1a03ab078571c6981ea27be542dd26f01fff4aa83014659fdbd183cd367ebf49",
    "rows_online": "783ad19cb56681396688892f662c5df2e71c42a7c72bfbdd581b5c199e77ccb4",
}


def _trace(name: str, S, L, monkeypatch=None) -> list:
    if name == "hf":
        return _hf_trace(S, L)
    if name == "rows":
        return _rows_trace(S, L, False)
    if monkeypatch is not None:
        monkeypatch.setattr(drafters_module, "time", _Clock())
    return _rows_trace(S, L, True)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_drafts_and_state_are_the_recorded_ones(name, stores, monkeypatch):
    trace = _trace(name, *stores, monkeypatch)
    flat = repr(trace)
    assert flat.count("(") > 1000  # it drafted (not a comparison of two empty runs)
    assert _digest(trace) == GOLDEN[name], f"{name}: drafts or learned state differ from the recorded run"
