"""HD's vLLM results as tables: the per-(method, category) summary of per-question rows and the committed
full-benchmark table (``data/hd/specbench_vllm_full.csv``, measured by :mod:`moelab.bench.specbench`).

Reading only: nothing here runs an engine, so a notebook can show the committed results without the
measuring machinery.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moelab.datasets import SPEC_BENCH_CATEGORIES, repo_root

FULL_TABLE = "specbench_vllm_full.csv"  # in data/hd/: the committed full-benchmark table (when it has been run)


def full_table_path() -> Path:
    """Where the committed full Spec-Bench table in vLLM lives (``data/hd/specbench_vllm_full.csv``)."""
    return repo_root() / "data" / "hd" / FULL_TABLE


def summarize_vllm(df: pd.DataFrame) -> pd.DataFrame:
    """Per (method, category) and overall: speedup over AR (mean per-question tokens/s ratio, Spec-Bench),
    mean accepted tokens, identical outputs, from per-question rows of a vLLM run."""
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


__all__ = ["FULL_TABLE", "full_table_path", "summarize_vllm"]
