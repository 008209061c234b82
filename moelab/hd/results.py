"""HD's vLLM results as tables: the per-(method, category) summary of per-question rows, paired ratios between
methods with bootstrap intervals over questions (:func:`paired_ratio`, :func:`verdict`), and the committed
full-benchmark table (``data/hd/specbench_vllm_full.csv``, measured by :mod:`moelab.bench.specbench`).

Reading only: nothing here runs an engine, so a notebook can show the committed results without the
measuring machinery.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moelab._stats import interval_verdict
from moelab.datasets import SPEC_BENCH_CATEGORIES, repo_root

FULL_TABLE = "specbench_vllm_full.csv"  # in data/hd/: the committed full-benchmark table (when it has been run)


def full_table_path() -> Path:
    """Where the committed full Spec-Bench table in vLLM lives (``data/hd/specbench_vllm_full.csv``)."""
    return repo_root() / "data" / "hd" / FULL_TABLE


def summarize_vllm(df: pd.DataFrame) -> pd.DataFrame:
    """Per (method, category) and overall: speedup over AR (mean per-question tokens/s ratio, Spec-Bench),
    MAT (tokens per forward, bonus included), identical outputs, from per-question rows of a vLLM run."""
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


#: bootstrap resamples of the paired intervals (vectorised: one (B, n) index draw)
BOOTSTRAP_RESAMPLES = 4000
#: the seed of every interval (an interval is a property of the data, not of the run that printed it)
BOOTSTRAP_SEED = 0


def paired_ratio(df: pd.DataFrame, a: str, b: str, *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """Method ``a``'s speed over method ``b``'s on the questions both ran, with a percentile bootstrap interval.

    The ratio is that of the mean per-question tokens/s (so it equals ``speedup(a) / speedup(b)`` of
    :func:`summarize_vllm` on the same questions). The interval resamples *questions* with replacement, each
    keeping both methods' speeds: the two were measured back to back on the question (rotated order,
    :func:`moelab.bench.specbench.vllm_runs.arrange_points`), so load that drifts over minutes falls on both and
    cancels in the pair, and the interval reflects how the questions differ, not how the machine did.

    Parameters
    ----------
    df : DataFrame
        Per-question rows (``question_id``, ``method``, ``tokens_per_s``), e.g. of
        :func:`moelab.bench.specbench.run_vllm_methods` or the points ledger.
    a, b : str
        Method labels (``"HD-cost"``, ``"HD-fixed"``, ...).
    level : float
        Coverage of the interval, in (0, 1).
    resamples : int
        Bootstrap resamples (>= 100).
    seed : int
        Seeds the resampling (the same data and seed give the same interval).

    Returns
    -------
    dict
        ``ratio``, ``ci_low``, ``ci_high``, ``questions`` (NaN bounds, and 0 questions, when none are shared).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    if int(resamples) < 100:
        raise ValueError(f"resamples must be at least 100; got {resamples!r}")
    speed = df[df["method"].isin([a, b])].pivot_table(index="question_id", columns="method", values="tokens_per_s",
                                                      aggfunc="mean")
    if a not in speed or b not in speed:
        return {"ratio": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "questions": 0}
    speed = speed[[a, b]].dropna()
    x, y = speed[a].to_numpy(float), speed[b].to_numpy(float)
    n = x.size
    if n == 0:
        return {"ratio": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "questions": 0}
    idx = np.random.default_rng(seed).integers(0, n, size=(int(resamples), n))
    boot = x[idx].mean(axis=1) / y[idx].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return {"ratio": float(x.mean() / y.mean()), "ci_low": float(lo), "ci_high": float(hi), "questions": int(n)}


def verdict(ci_low: float, ci_high: float) -> str:
    """What an interval of a ratio ``a / b`` allows one to say: ``"ahead"`` (``a`` faster: the whole interval is
    above 1), ``"behind"`` (below 1) or ``"not distinguishable"`` (it holds 1, or is undefined)."""
    return interval_verdict(ci_low, ci_high, null=1.0)


#: the paired comparisons of HD's benchmark and full table: (first method, second method)
PAIRS = (("HD-cost", "HD-fixed"), ("HD-cost", "suffix"), ("HD-cost", "ngram"))


def same_steps(df: pd.DataFrame, a: str, b: str) -> tuple[int, int]:
    """On how many of the questions both ran methods ``a`` and ``b`` took the same steps: as many target
    forwards and as many accepted draft tokens.

    Where they did, neither drafted better: their speed ratio on that question measures only the rest, the
    rejected draft tokens each had verified (a shorter chain makes a cheaper forward, which is what
    cost-aware drafting is for), each method's drafting time, and the machine's timing noise. On a machine
    whose forward costs the same for any chain length, only the last two are left, and a paired interval
    over such questions says how steady the machine was.

    Parameters
    ----------
    df : DataFrame
        Per-question rows (``question_id``, ``method``, ``forwards``, ``accepted_tokens``), as for
        :func:`paired_ratio`.
    a, b : str
        Method labels (``"HD-cost"``, ``"HD-fixed"``, ...).

    Returns
    -------
    same, shared : int
        Questions with the same steps, and questions both methods ran; ``(0, 0)`` when the rows carry no step
        counts (a table of speeds only).
    """
    cols = ["forwards", "accepted_tokens"]
    if not set(cols) <= set(df.columns):
        return 0, 0
    rows = df[df["method"].isin([a, b])].pivot_table(index="question_id", columns="method", values=cols, aggfunc="mean")
    if rows.empty or a not in rows["forwards"] or b not in rows["forwards"]:
        return 0, 0
    rows = rows.dropna()
    same = np.ones(len(rows), dtype=bool)
    for c in cols:
        same &= rows[(c, a)].to_numpy(float) == rows[(c, b)].to_numpy(float)
    return int(same.sum()), len(rows)


def paired_table(df: pd.DataFrame, pairs: tuple[tuple[str, str], ...] = PAIRS, **kw: float) -> pd.DataFrame:
    """:func:`paired_ratio` of every pair in ``pairs`` (pairs whose methods did not run are left out), overall and
    per category, with its :func:`verdict`; ``kw`` goes to :func:`paired_ratio`."""
    rows = []
    have = set(df["method"]) if len(df) else set()
    for a, b in pairs:
        if a not in have or b not in have:
            continue
        groups = [("overall", df)] + [(c, df[df["category"] == c]) for c in SPEC_BENCH_CATEGORIES
                                      if "category" in df and (df["category"] == c).any()]
        for cat, g in groups:
            r = paired_ratio(g, a, b, **kw)
            rows.append({"a": a, "b": b, "category": cat, **r, "verdict": verdict(r["ci_low"], r["ci_high"])})
    return pd.DataFrame(rows, columns=["a", "b", "category", "ratio", "ci_low", "ci_high", "questions", "verdict"])


def with_intervals(summary: pd.DataFrame, df: pd.DataFrame, *, against: str = "HD-cost", **kw: float) -> pd.DataFrame:
    """:func:`summarize_vllm`'s ``summary`` of the rows ``df`` with paired 95 % intervals added per (method,
    category): ``speedup_ci_low``/``speedup_ci_high`` (the method over AR) and ``hd_ratio``,
    ``hd_ci_low``/``hd_ci_high`` and ``hd_verdict`` (``against``, cost-aware HD, over the method; empty on its
    own row), all from :func:`paired_ratio` on the questions both ran; ``kw`` goes to :func:`paired_ratio`."""
    out = summary.copy()
    cols: dict[str, list] = {c: [] for c in ("speedup_ci_low", "speedup_ci_high", "hd_ratio", "hd_ci_low",
                                             "hd_ci_high", "hd_verdict")}
    for m, cat in zip(out["method"], out["category"]):
        g = df if cat == "overall" else df[df["category"] == cat]
        sp = paired_ratio(g, m, "AR", **kw) if m != "AR" else {"ci_low": 1.0, "ci_high": 1.0}
        hd = paired_ratio(g, against, m, **kw) if m != against else {"ratio": np.nan, "ci_low": np.nan,
                                                                       "ci_high": np.nan}
        cols["speedup_ci_low"].append(sp["ci_low"])
        cols["speedup_ci_high"].append(sp["ci_high"])
        cols["hd_ratio"].append(hd["ratio"])
        cols["hd_ci_low"].append(hd["ci_low"])
        cols["hd_ci_high"].append(hd["ci_high"])
        cols["hd_verdict"].append("" if m == against else verdict(hd["ci_low"], hd["ci_high"]))
    for c, v in cols.items():
        out[c] = v
    return out


__all__ = ["BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED", "FULL_TABLE", "PAIRS", "full_table_path", "paired_ratio",
           "paired_table", "same_steps", "summarize_vllm", "verdict", "with_intervals"]
