"""Spec-Bench in vLLM: AR, vLLM's own ``ngram`` and ``suffix`` speculators, and HD (cost-aware, fixed,
REST-alone) as a ``custom_class`` drafter — same engine, same LM, same budget, one question at a time
(Spec-Bench's batch size 1), float32, greedy or sampled.

Each method keeps one warm engine in its own process (:mod:`moelab.hd.vllm_pool`), and the methods run
back to back on each question, their order rotated (:func:`arrange_points`), so a shared machine's
changing load falls on every method alike. The runner is the ``hd-vllm`` sweep suite (:func:`moelab.sweep.suites.run_suite`,
also ``moelab sweep hd-vllm``): every (question, method) result is cached under a key of the point, the
drafting code (:data:`RUN_CODE`), vLLM's version and the data (Spec-Bench, the S store), so a rerun skips
what is done and the full benchmark is resumable. Speed = output tokens / wall time of the request (prefill included,
as Spec-Bench times it); mean accepted tokens = output tokens / target forwards, from vLLM's own
speculative-decoding counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._validate import check_int, check_real
from moelab.hd.policy import VerifyCost, check_budget
from moelab.hd.vllm_worker import MAX_MODEL_LEN, VLLM_METHODS, measure_vllm_cost, suffix_status

FULL_TOKENS = 128  # new tokens per question in the full benchmark (and in moelab bench hd's vLLM half)


def arrange_points(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normal form and run order of vLLM sweep points (the ``hd-vllm`` suite's ``arrange``).

    Only cost-aware HD reads ``cost``: the other methods' points drop it, so their results (and cache
    keys) do not depend on a curve they never read, and the duplicates this makes merge. Then question by
    question: every method of a question back to back with the others, their order rotated from one
    question to the next, so no method is always first after a question change and a shared machine's
    changing load falls on every method alike."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    seen: set[tuple] = set()
    for p in points:
        p = dict(p) if p.get("method") == "HD" else {**p, "cost": ""}
        key = tuple(sorted(p.items()))
        if key in seen:
            continue
        seen.add(key)
        # a question's group: every method of it, HD at whatever curve (so HD rotates with its peers too)
        groups.setdefault(tuple((k, v) for k, v in sorted(p.items()) if k not in ("method", "cost")), []).append(p)
    out: list[dict[str, Any]] = []
    for i, group in enumerate(groups.values()):
        r = i % len(group)
        out += group[r:] + group[:r]
    return out


def run_vllm_methods(questions: pd.DataFrame, *, methods: Sequence[str] = VLLM_METHODS,
                     budget: int = 8, max_new_tokens: int = FULL_TOKENS, temperature: float = 0.0,
                     cost: VerifyCost | None = None, l_max_tokens: int | None = None, run_tag: str = "",
                     out: str | Path | None = None, progress: bool = True,
                     compute: bool = True) -> tuple[pd.DataFrame, dict[str, str]]:
    """Run ``methods`` in vLLM on ``questions`` (Spec-Bench rows), interleaved question by question
    (:func:`arrange_points`, one warm engine per method), as the ``hd-vllm`` sweep suite with its cache in
    ``out`` (default :func:`default_runs_dir`): every (question, method) result is cached, so an
    interrupted run resumes, and ``moelab sweep hd-vllm --out`` the same folder shares the results. Returns the per-question
    table and ``{method: reason}`` for methods skipped (e.g. suffix without arctic-inference).
    ``run_tag`` keeps a repeated run of a method (e.g. AR measured again at the end) apart from the first.
    ``cost``: the verify-cost curve cost-aware HD reads (default: this machine's, measured once and cached).
    Speeds are only comparable when nothing else runs the engines' cores (the runner is serial for that).
    ``compute=False`` runs nothing and returns the results cached so far. Prompts come from Spec-Bench by
    question id (the workers tokenize them with the target's own chat template)."""
    from moelab.sweep.suites import run_suite

    budget = check_budget(budget)
    check_int("max_new_tokens", max_new_tokens, low=1, high=MAX_MODEL_LEN // 2)
    check_real("temperature", temperature, low=0.0)
    bad = sorted(set(methods) - set(VLLM_METHODS))
    if bad:
        raise ValueError(f"methods must be among {list(VLLM_METHODS)}; got unknown {bad}")
    skipped: dict[str, str] = {}
    if "suffix" in methods:
        ok, why = suffix_status()
        if not ok:
            skipped["suffix"] = why
    run = [m for m in methods if m not in skipped]
    if not run:
        return pd.DataFrame(), skipped
    grid = {"question_id": [int(q) for q in questions["question_id"]], "method": run, "budget": [budget],
            "max_new_tokens": [int(max_new_tokens)], "temperature": [float(temperature)], "seed": [0],
            "l_max_tokens": [int(l_max_tokens or 0)],
            "cost": [json.dumps(cost.as_dict(), sort_keys=True) if cost is not None else ""], "tag": [str(run_tag)]}
    res = run_suite("hd-vllm", grid, out=Path(out) if out else default_runs_dir(), backend="serial", progress=progress,
                    compute=compute)
    df = res.frame
    if len(df):
        ar = df[df["method"] == "AR"].set_index("question_id")["output_ids"]
        df["identical"] = [None if temperature > 0 or qid not in ar.index else list(o) == list(ar.loc[qid])
                           for qid, o in zip(df["question_id"], df["output_ids"])]
    return df, skipped


def default_runs_dir() -> Path:
    """Where :func:`run_vllm_methods` and :func:`full_benchmark` keep results (``$MOELAB_CACHE/hd/vllm-runs``);
    ``moelab sweep hd-vllm --out`` this folder runs and resumes the same cached points."""
    from moelab.datasets import cache_dir

    return cache_dir() / "hd" / "vllm-runs"


def summarize_vllm(df: pd.DataFrame) -> pd.DataFrame:
    """Per (method, category) and overall: speedup over AR (mean per-question tokens/s ratio, Spec-Bench),
    mean accepted tokens, identical outputs."""
    from moelab.datasets import SPEC_BENCH_CATEGORIES

    ar = df[df["method"] == "AR"].set_index("question_id")["tokens_per_s"]
    out = []
    for (m, cat), g in list(df.groupby(["method", "category"], sort=False)) + \
            [((m, "overall"), g) for m, g in df.groupby("method", sort=False)]:
        base = ar.reindex(g["question_id"]).to_numpy()
        fw = g["forwards"].sum()
        out.append({"engine": "vllm", "method": m, "category": cat, "budget": int(g["budget"].iloc[0]),
                    "questions": len(g), "tokens_per_s": float(g["tokens_per_s"].mean()),
                    "speedup": float(g["tokens_per_s"].mean() / np.nanmean(base)),
                    "mean_accepted": float(g["new_tokens"].sum() / fw) if fw > 0 else float("nan"),
                    "identical": None if g["identical"].isna().any() else bool(g["identical"].all()),
                    "draft_us_p50": float(g["draft_us_p50"].median()) if "draft_us_p50" in g else float("nan")})
    res = pd.DataFrame(out)
    order = {c: i for i, c in enumerate([*SPEC_BENCH_CATEGORIES, "overall"])}
    return res.assign(_o=res["category"].map(order)).sort_values(["method", "_o"]).drop(columns="_o") \
        .reset_index(drop=True)


FULL_TABLE = "specbench_vllm_full.csv"  # in data/hd/: the committed full-benchmark table (when it has been run)


def full_table_path() -> Path:
    from moelab.datasets import repo_root

    return repo_root() / "data" / "hd" / FULL_TABLE


FULL_METHODS = ("AR", "ngram", "suffix", "HD")


def full_benchmark(*, methods: Sequence[str] = FULL_METHODS, budget: int = 8, max_new_tokens: int = FULL_TOKENS,
                   temperatures: Sequence[float] = (0.0,), per_category: int | None = None,
                   out: str | Path | None = None, cache: str | Path | None = None,
                   progress: bool = True, compute: bool = True) -> pd.DataFrame:
    """The whole Spec-Bench evaluation in vLLM (every category, all 480 questions, ``max_new_tokens``
    tokens, each temperature), the methods interleaved question by question (:func:`run_vllm_methods`):
    resumable (every (question, method) result cached; a rerun skips what is done), then one table with
    one row per method, category and temperature, stamped with date, commit, machine and the measuring
    code's version (``run_code``), written to
    ``out`` (default ``data/hd/specbench_vllm_full.csv``). Hours on a 2-core CPU: give it a quiet machine
    (``moelab sweep hd-vllm --out`` :func:`default_runs_dir` runs the same points).

    ``compute=False`` runs nothing: the table of the questions every method has finished so far (column
    ``complete`` False while some are missing), written only where ``out`` says — the committed table is
    only ever a complete run."""
    import subprocess as sp

    from moelab.datasets import repo_root
    from moelab.hd.policy import machine_id
    from moelab.hd.specbench import spec_bench_split
    from moelab.sweep.suites import get_suite

    questions = spec_bench_split("eval", per_category=per_category)
    # categories in turn (1st question of each, then the 2nd, ...): a run stopped part-way has covered every
    # category alike, so compute=False tables mean something before the end
    rank = questions.groupby("category", sort=False).cumcount()
    questions = questions.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank")
    tables = []
    for t in temperatures:
        df, skipped = run_vllm_methods(questions, methods=methods, budget=budget, max_new_tokens=max_new_tokens,
                                       temperature=float(t), out=cache, progress=progress, compute=compute)
        ran = [m for m in methods if m not in skipped]
        for m, why in skipped.items():
            tables.append(pd.DataFrame([{"engine": "vllm", "method": m, "category": "overall", "budget": budget,
                                         "temperature": float(t), "skipped": why}]))
        if len(df):  # the questions every method has finished (all of them unless compute=False)
            per_q = df.groupby("question_id")["method"].nunique()
            df = df[df["question_id"].isin(per_q.index[per_q == len(ran)])]
        complete = len(df) == len(questions) * len(ran)
        if not len(df):
            tables.append(pd.DataFrame([{"engine": "vllm", "method": m, "category": "overall", "budget": budget,
                                         "temperature": float(t), "questions": 0, "complete": False} for m in ran]))
            continue
        summ = summarize_vllm(df)
        summ["complete"] = complete
        summ["temperature"] = float(t)
        tables.append(summ)
    res = pd.concat(tables, ignore_index=True)
    try:
        commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                        check=False).stdout.strip()
    except OSError:
        commit = ""
    res["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    res["commit"] = commit
    # the measuring code's version every cached result is keyed on (RUN_CODE, vLLM's version): a table
    # written at a later commit is still that code's measurement
    res["run_code"] = get_suite("hd-vllm").code_version()
    res["machine"] = machine_id()
    res["questions_per_category"] = per_category or "all"
    res["max_new_tokens"] = max_new_tokens
    from moelab._io import atomic_write_text

    if out is not None or ("complete" in res and bool(res["complete"].fillna(True).all())):
        atomic_write_text(Path(out) if out else full_table_path(), res.to_csv(index=False))
    return res


__all__ = ["FULL_METHODS", "FULL_TABLE", "FULL_TOKENS", "VLLM_METHODS", "arrange_points", "default_runs_dir", "full_benchmark",
           "full_table_path", "measure_vllm_cost", "run_vllm_methods", "summarize_vllm"]
