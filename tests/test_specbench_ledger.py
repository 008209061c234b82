"""The full Spec-Bench run's points ledger: a run that outlives one machine resumes from the questions every
method finished, rows of other measuring code do not count, and a damaged ledger is refused by name.

The engines are replaced by a stand-in that returns rows of the shape :func:`run_vllm_methods` returns: what is
tested here is the bookkeeping (which questions run, what is written), not a speed."""

from __future__ import annotations

import pandas as pd
import pytest

from moelab._io import FileFormatError
from moelab.bench.specbench import vllm_runs


class MachineLost(RuntimeError):
    """The stand-in's way of ending a run part-way."""


def _fake_runs(calls: list[list[int]], *, fail_after: int | None = None, threads_seen: list | None = None):
    """A stand-in for run_vllm_methods: every method finishes every question it is given (AR 10 tokens/s,
    the others 15), unless ``fail_after`` calls have happened (then it stops the run, like a lost machine).
    The engines' thread count it was asked for goes to ``threads_seen`` and into the rows."""

    def run(questions, *, methods, budget, max_new_tokens, temperature, out, progress, compute, threads):
        if threads_seen is not None:
            threads_seen.append(threads)
        if not compute:  # nothing cached by the stand-in
            return pd.DataFrame(), {}
        if fail_after is not None and len(calls) >= fail_after:
            raise MachineLost
        qids = [int(q) for q in questions["question_id"]]
        calls.append(qids)
        cats = dict(zip(questions["question_id"], questions["category"]))
        rows = [{"question_id": q, "category": cats[q], "method": m, "budget": budget, "max_new_tokens": max_new_tokens,
                 "temperature": temperature, "tokens_per_s": 10.0 if m == "AR" else 15.0, "new_tokens": 64,
                 "forwards": 64.0 if m == "AR" else 40.0, "accepted_tokens": 0.0 if m == "AR" else 24.0,
                 "drafts": 0.0 if m == "AR" else 40.0, "draft_us_p50": float("nan") if m == "AR" else 200.0,
                 "identical": True, "output_ids": [q, 1, 2], "cost_curve": "", "engine_threads": threads}
                for q in qids for m in methods]
        return pd.DataFrame(rows), {}

    return run


def test_a_run_resumes_from_the_ledger(tmp_path, monkeypatch):
    ledger, table = tmp_path / "points.csv", tmp_path / "full.csv"
    monkeypatch.setattr(vllm_runs, "LEDGER_CHUNK", 4)
    kw = {"methods": ("AR", "HD-cost"), "per_category": 2, "ledger": ledger, "progress": False}
    first: list[list[int]] = []
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs(first, fail_after=1))
    with pytest.raises(MachineLost):
        vllm_runs.full_benchmark(**kw)
    book = vllm_runs.read_ledger(ledger)
    assert sorted(set(book["question_id"])) == sorted(first[0]) and len(book) == 2 * 4  # the finished chunk only
    assert not table.exists()
    # the next machine runs only what is missing, in chunks, and writes the table once every question is done
    second: list[list[int]] = []
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs(second))
    res = vllm_runs.full_benchmark(**kw, out=table)
    ran = [q for c in second for q in c]
    assert not set(ran) & set(first[0]) and len(ran) == 12 - 4 and all(len(c) <= 4 for c in second)
    o = res[res["category"] == "overall"].set_index("method")
    assert bool(o["complete"].all()) and int(o.loc["AR", "questions"]) == 12
    assert o.loc["HD-cost", "speedup"] == pytest.approx(1.5) and o.loc["HD-cost", "mean_accepted"] == pytest.approx(1.6)
    assert table.is_file() and len(vllm_runs.read_ledger(ledger)) == 2 * 12
    # nothing left to run
    third: list[list[int]] = []
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs(third))
    vllm_runs.full_benchmark(**kw, out=table)
    assert third == []


def test_a_resumed_run_keeps_the_thread_count_it_began_with(tmp_path, monkeypatch):
    """A fresh run gives its engines the cores free at its start; a run resumed from the ledger gives them the
    count its rows were measured with, whatever is free then, so one table never mixes two settings."""
    ledger = tmp_path / "points.csv"
    monkeypatch.setattr(vllm_runs, "LEDGER_CHUNK", 4)
    kw = {"methods": ("AR", "HD-cost"), "per_category": 2, "ledger": ledger, "progress": False, "out": tmp_path / "t.csv"}
    seen: list = []
    monkeypatch.setattr(vllm_runs, "free_cores", lambda: 1)  # another job held a core when the run began
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([], fail_after=1, threads_seen=seen))
    with pytest.raises(MachineLost):
        vllm_runs.full_benchmark(**kw)
    assert set(seen) == {1} and set(vllm_runs.read_ledger(ledger)["engine_threads"]) == {1}
    monkeypatch.setattr(vllm_runs, "free_cores", lambda: 2)  # the machine is quiet when the run resumes
    seen.clear()
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([], threads_seen=seen))
    vllm_runs.full_benchmark(**kw)
    assert seen and set(seen) == {1} and set(vllm_runs.read_ledger(ledger)["engine_threads"]) == {1}
    # a fresh run (another measuring code's rows only) counts the free cores again
    vllm_runs.read_ledger(ledger).assign(run_code="0123456789abcdef").to_csv(ledger, index=False)
    seen.clear()
    vllm_runs.full_benchmark(**kw)
    assert set(seen) == {2}


def test_rows_of_other_measuring_code_do_not_count(tmp_path, monkeypatch):
    ledger = tmp_path / "points.csv"
    calls: list[list[int]] = []
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs(calls))
    kw = {"methods": ("AR", "HD-cost"), "per_category": 1, "ledger": ledger, "progress": False, "out": tmp_path / "t.csv"}
    vllm_runs.full_benchmark(**kw)
    book = vllm_runs.read_ledger(ledger)
    book.assign(run_code="0123456789abcdef").to_csv(ledger, index=False)  # measured by another drafter version
    calls.clear()
    vllm_runs.full_benchmark(**kw)
    assert sorted(q for c in calls for q in c) == sorted(set(book["question_id"]))  # all measured again
    assert set(vllm_runs.read_ledger(ledger)["run_code"]) == {vllm_runs.HD_VLLM_SUITE.code_version()}


def test_another_codes_rows_stay_until_this_codes_run_is_complete(tmp_path, monkeypatch):
    """The committed ledger holds the run the committed table summarises: a new drafter version's partial run
    (a lost machine) adds its rows beside them, and only its complete run replaces them."""
    ledger = tmp_path / "points.csv"
    monkeypatch.setattr(vllm_runs, "LEDGER_CHUNK", 4)
    kw = {"methods": ("AR", "HD-cost"), "per_category": 2, "ledger": ledger, "progress": False, "out": tmp_path / "t.csv"}
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([]))
    vllm_runs.full_benchmark(**kw)
    old = vllm_runs.read_ledger(ledger).assign(run_code="0123456789abcdef")
    old.to_csv(ledger, index=False)
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([], fail_after=1))
    with pytest.raises(MachineLost):
        vllm_runs.full_benchmark(**kw)
    book = vllm_runs.read_ledger(ledger)
    mine = book[book["run_code"] == vllm_runs.HD_VLLM_SUITE.code_version()]
    assert len(book[book["run_code"] == "0123456789abcdef"]) == len(old) == 2 * 12 and len(mine) == 2 * 4
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([]))
    vllm_runs.full_benchmark(**kw)
    assert set(vllm_runs.read_ledger(ledger)["run_code"]) == {vllm_runs.HD_VLLM_SUITE.code_version()}


def test_a_partial_ledger_gives_an_incomplete_table_and_no_file(tmp_path, monkeypatch):
    calls: list[list[int]] = []
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs(calls, fail_after=0))
    monkeypatch.setattr(vllm_runs, "full_table_path", lambda: tmp_path / "full.csv")
    res = vllm_runs.full_benchmark(methods=("AR", "HD-cost"), per_category=1, ledger=tmp_path / "none.csv",
                                   compute=False, progress=False)
    assert not bool(res["complete"].any()) and not (tmp_path / "full.csv").exists()


@pytest.mark.parametrize("edit, column", [
    (lambda d: d.assign(tokens_per_s="fast"), "tokens_per_s"),
    (lambda d: d.assign(identical="maybe"), "identical"),
    (lambda d: d.assign(method="HD"), "method"),
    (lambda d: d.drop(columns="run_code"), "run_code"),
])
def test_a_damaged_ledger_is_refused_by_name(tmp_path, monkeypatch, edit, column):
    ledger = tmp_path / "points.csv"
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([]))
    vllm_runs.full_benchmark(methods=("AR", "HD-cost"), per_category=1, ledger=ledger, progress=False,
                             out=tmp_path / "t.csv")
    edit(vllm_runs.read_ledger(ledger)).to_csv(ledger, index=False)
    with pytest.raises(FileFormatError, match=column):
        vllm_runs.read_ledger(ledger)
    assert vllm_runs.read_ledger(tmp_path / "absent.csv").empty


def test_the_full_table_carries_paired_intervals(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_runs, "run_vllm_methods", _fake_runs([]))
    res = vllm_runs.full_benchmark(methods=("AR", "HD-cost", "HD-fixed"), per_category=1, ledger=tmp_path / "p.csv",
                                   out=tmp_path / "full.csv", progress=False)
    o = res[res["category"] == "overall"].set_index("method")
    # the stand-in: AR 10 tokens/s, every other method 15 on every question
    assert o.loc["HD-cost", "speedup_ci_low"] == pytest.approx(1.5) and o.loc["HD-cost", "hd_verdict"] == ""
    assert o.loc["AR", "hd_ratio"] == pytest.approx(1.5) and o.loc["AR", "hd_verdict"] == "ahead"
    assert o.loc["HD-fixed", "hd_verdict"] == "not distinguishable"
    assert "hd_ci_low" in pd.read_csv(tmp_path / "full.csv").columns


def test_run_code_covers_the_drafting_modules_it_imports():
    # a cached vLLM point is keyed by the source of RUN_CODE: a moelab.hd module that a keyed module imports and
    # that can change a draft must be keyed too (the compiled store lookups were missing at first)
    import re
    from pathlib import Path

    from moelab.bench.specbench.vllm_runs import RUN_CODE

    not_drafting = {"moelab.hd.identity": "a store file's origin metadata",
                    "moelab.hd.decode": "check_draft_ids refuses a malformed draft, never changes one"}
    root = Path(__file__).resolve().parents[1]
    missing = set()
    for mod in RUN_CODE:
        src = (root / Path(*mod.split("."))).with_suffix(".py").read_text()
        imported = set(re.findall(r"(?:from|import) (moelab\.hd\.\w+)", src))
        imported |= {f"moelab.hd.{m}" for m in re.findall(r"from moelab\.hd import (\w+)", src)
                     if (root / "moelab" / "hd" / f"{m}.py").is_file()}
        missing |= {m for m in imported if m not in RUN_CODE and m not in not_drafting}
    assert not missing, f"RUN_CODE leaves out {sorted(missing)}"
