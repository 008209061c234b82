"""HD's own experiment: Spec-Bench-style evaluation of the drafters at an equal budget on a real target model
(HF transformers, tree verification; :func:`run_hf`), and its tables.

Conventions (Spec-Bench): *mean accepted tokens* (MAT, column ``mean_accepted``) = tokens produced per target forward,
the bonus token included (a = m + 1 per step, 1.00 for AR; "accepted" alone means accepted draft tokens, m),
pooled over the steps of a category; *speedup* = mean per-question tokens/s of a method over that of AR.

How each number is obtained:

* AR runs for real on every question (its greedy output is the reference, its tokens/s the baseline).
* Methods in ``measure`` run for real too (tree verification on the model, wall-clock timed, output
  checked token-for-token against AR: column ``identical``) -> measured CPU speedup.
* Every method is *replayed* against AR's greedy output (:func:`moelab.hd.decode.replay_greedy`): exact
  acceptance, and the drafter's own per-step latency (``draft_us_p50``; the work per step is that of a real
  run). Unmeasured methods have no target timing (their ``tokens_per_s`` is NaN). For measured methods
  ``draft_us_p50_inline`` is the drafting time inside the real CPU run, where every step follows a forward
  that evicts the CPU caches (on a GPU server the forward runs elsewhere and the replay figure applies).
* Every row names its ``engine`` (``"hf"``: HF transformers on this machine, tree verification) and the
  ``budget`` (draft tokens verified per forward, at most). There is no projection to other hardware or
  model sizes: acceptance measured on a 135M model says nothing reliable about a 7B one.

Tokens/s exclude the prefill (identical for every method; on a CPU it would dominate short outputs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import atomic_write_text
from moelab._validate import check_int, check_real
from moelab.costmodel.verify import VerifyCost, cached_verify_cost, fit_verify_cost
from moelab.datasets import SPEC_BENCH_CATEGORIES
from moelab.hd.decode import GenerationResult, generate, replay_greedy
from moelab.hd.drafters import Drafter, NoDrafter
from moelab.hd.methods import get_method, make_hf_drafter
from moelab.hd.policy import BUDGETS, check_budget
from moelab.hd.stores import Store
from moelab.models.lm import chat_prompt_ids, verify_cost_curve

#: the budget of the per-category tables and of the measured (wall-clock) runs
BUDGET = 8
#: the methods of the equal-budget experiment, every one at every budget (AR runs once, as the reference)
HF_METHODS = ("pld", "hd_fixed", "hd", "rest")


def _row(method: str, q: pd.Series, res: GenerationResult, drafter: Drafter, measured: bool,
         identical: bool | None, budget: int | None) -> dict[str, Any]:
    steps = res.steps
    draft = np.array([s.draft_us for s in steps])
    tree = np.array([s.tree_size for s in steps])
    row: dict[str, Any] = {
        "engine": "hf", "method": method, "budget": budget, "question_id": int(q["question_id"]),
        "category": q["category"],
        "new_tokens": len(res.tokens), "forwards": len(steps), "mean_accepted": res.mean_accepted,
        "measured": measured, "identical": identical,
        "decode_s": res.decode_s if measured else float("nan"),
        "tokens_per_s": res.tokens_per_s if measured else float("nan"),
        "draft_us_p50": float(np.median(draft)) if draft.size else float("nan"),
        "tree_size_mean": float(tree.mean()) if tree.size else float("nan"),
        "tree_size_max": int(tree.max()) if tree.size else 0,
    }
    for letter, c in drafter.counters.items():
        row[f"{letter}_queries"] = c.queries
        row[f"{letter}_lookup_hits"] = c.lookup_hits
        row[f"{letter}_accepted_tokens"] = c.accepted_tokens
    return row


def _steps(method: str, q: pd.Series, res: GenerationResult, mode: str) -> pd.DataFrame:
    return pd.DataFrame({
        "method": method, "question_id": int(q["question_id"]), "category": q["category"], "mode": mode,
        "step": np.arange(len(res.steps)), "tree_size": [s.tree_size for s in res.steps],
        "accepted": [len(s.accepted) for s in res.steps], "draft_us": [s.draft_us for s in res.steps],
        "sources": ["".join(s.sources) for s in res.steps]})


@dataclass
class SpecBenchRun:
    """Per-question rows and per-step draft latencies of one evaluation."""

    questions: pd.DataFrame
    steps: pd.DataFrame
    config: dict[str, Any]

    def summary(self) -> pd.DataFrame:
        """Per (method, category) and per method overall: MAT (tokens per forward, bonus included), measured CPU speedup,
        drafting latency p50, per-store lookup-hit rate and accepted share."""
        return summarize(self.questions, self.steps)

    def to_csv(self, folder: str | Path) -> dict[str, Path]:
        """Write ``hd_questions.csv``, ``hd_summary.csv`` (and per-step ``hd_steps.csv``) atomically."""
        folder = Path(folder)
        out = {}
        for name, df in (("hd_questions", self.questions), ("hd_summary", self.summary()), ("hd_steps", self.steps)):
            out[name] = atomic_write_text(folder / f"{name}.csv", df.to_csv(index=False))
        return out


def run_specbench(model: Any, tokenizer: Any, questions: pd.DataFrame, *,
                  factories: Mapping[str, tuple[Callable[[], Drafter], int]], max_new_tokens: int = 32,
                  measure: Sequence[str] = (), temperature: float = 0.0, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> SpecBenchRun:
    """Evaluate ``methods`` on ``questions`` (rows of :func:`moelab.hd.specbench.spec_bench_split`).

    Parameters
    ----------
    model, tokenizer
        The target (e.g. from :func:`moelab.models.load_lm`).
    questions : DataFrame
        Needs ``question_id, category, prompt``.
    factories : mapping
        ``{label: (make_drafter, budget)}``: every method to run, by its row label, with a factory of fresh
        drafters (e.g. :func:`moelab.hd.methods.make_hf_drafter` at a budget); AR is always run.
    max_new_tokens : int
        Tokens generated per question (greedy; stops early at EOS).
    measure : sequence of str
        Methods that also run for real with wall-clock timing (others are replayed exactly).
    temperature : float
        0: greedy (replay + the ``measure`` runs). > 0: every method runs for real with lossless
        speculative sampling (no replay exists for sampling); ``identical`` is then None.
    seed : int
        Seeds sampling (each question and method gets its own stream derived from it).
    progress : callable, optional
        Called with a short status line per question.
    """
    check_int("max_new_tokens", max_new_tokens, low=1)
    check_real("temperature", temperature, low=0.0)
    check_int("seed", seed, low=0)
    if questions is None or len(questions) == 0:
        raise ValueError("questions must hold at least one row")
    factories = dict(factories)
    methods = list(factories)
    unknown = sorted(set(measure) - set(factories))
    if unknown:
        raise ValueError(f"measure must name methods of factories ({methods}); got unknown {unknown}")
    measure = set(measure)
    eos = tokenizer.eos_token_id

    def new_drafter(m: str) -> Drafter:
        return factories[m][0]()

    def budget_of(m: str) -> int:
        return int(factories[m][1])

    rows, step_rows = [], []
    for i, (_, q) in enumerate(questions.iterrows()):
        ids = chat_prompt_ids(tokenizer, q["prompt"])
        sampled = temperature > 0
        kw = {"max_new_tokens": max_new_tokens, "eos_token_id": eos, "temperature": temperature}
        ar = generate(model, ids, None, seed=np.random.default_rng([seed, i, 0]), **kw)
        rows.append(_row("AR", q, ar, NoDrafter(), True, None if sampled else True, 0))
        for j, m in enumerate(methods, start=1):
            if m == "AR":
                continue
            drafter = new_drafter(m)
            res, identical, real = None, None, sampled or m in measure
            if not sampled:  # the replay gives exact greedy acceptance and the drafter's own per-step latency
                res = replay_greedy(drafter, ids, ar.tokens)
                step_rows.append(_steps(m, q, res, "replay"))
            if real:  # the real run: wall clock, inline drafting latency, identity with AR
                drafter = new_drafter(m)
                res = generate(model, ids, drafter, seed=np.random.default_rng([seed, i, j]), **kw)
                identical = None if sampled else res.tokens == ar.tokens
                step_rows.append(_steps(m, q, res, "run"))
            rows.append(_row(m, q, res, drafter, real, identical, budget_of(m)))
        if progress is not None:
            progress(f"[{i + 1}/{len(questions)}] {q['category']} q{q['question_id']}: AR {ar.tokens_per_s:.1f} tok/s")
    steps = pd.concat(step_rows, ignore_index=True) if step_rows else pd.DataFrame(
        columns=["method", "question_id", "category", "mode", "step", "tree_size", "accepted", "draft_us", "sources"])
    config = {"methods": methods, "measure": sorted(measure), "max_new_tokens": max_new_tokens,
              "budgets": {m: budget_of(m) for m in methods}, "n_questions": len(questions),
              "temperature": temperature, "seed": seed,
              "question_ids": [int(x) for x in questions["question_id"]],
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return SpecBenchRun(pd.DataFrame(rows), steps, config)


def summarize(questions: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (method, category) rows plus an ``overall`` row per method (see :meth:`SpecBenchRun.summary`)."""
    ar = questions[questions["method"] == "AR"].set_index("question_id")
    out = []
    for (method, category), g in list(questions.groupby(["method", "category"], sort=False)) + \
            [((m, "overall"), g) for m, g in questions.groupby("method", sort=False)]:
        row: dict[str, Any] = {"engine": "hf", "method": method, "budget": g["budget"].iloc[0] if "budget" in g else None,
                               "category": category, "questions": len(g),
                               "mean_accepted": g["new_tokens"].sum() / max(1, g["forwards"].sum())}
        if g["measured"].all():
            base = ar.loc[g["question_id"], "tokens_per_s"].to_numpy()
            row["cpu_speedup"] = float(g["tokens_per_s"].mean() / base.mean())
            row["identical"] = None if g["identical"].isna().any() else bool(g["identical"].all())
        else:
            row["cpu_speedup"], row["identical"] = float("nan"), None
        if steps is not None and len(steps):
            s = steps[(steps["method"] == method) & ((steps["category"] == category) | (category == "overall"))]
            for mode, col in (("replay", "draft_us_p50"), ("run", "draft_us_p50_inline")):
                sm = s[s["mode"] == mode]["draft_us"]
                row[col] = float(sm.median()) if len(sm) else float("nan")
        accepted = sum(g[c].sum() for c in g.columns if c.endswith("_accepted_tokens") and g[c].notna().any())
        for letter in "WSLP":
            if f"{letter}_queries" in g and g[f"{letter}_queries"].notna().any():
                qn = g[f"{letter}_queries"].sum()
                row[f"{letter}_hit_rate"] = float(g[f"{letter}_lookup_hits"].sum() / qn) if qn else float("nan")
                row[f"{letter}_accept_share"] = float(g[f"{letter}_accepted_tokens"].sum() / accepted) if accepted \
                    else float("nan")
        out.append(row)
    df = pd.DataFrame(out)
    order = {c: i for i, c in enumerate([*SPEC_BENCH_CATEGORIES, "overall"])}
    return df.assign(_o=df["category"].map(order)).sort_values(["method", "_o"]).drop(columns="_o") \
        .reset_index(drop=True)


def compare_published(summary: pd.DataFrame, published: pd.DataFrame, *, device: str = "A100-80GB",
                      model: str = "vicuna-7b-v1.3", methods: Sequence[str] = ("PLD", "REST", "Lookahead"),
                      ours: Sequence[str] = ("HD(WSL)", "PLD"), speedup_col: str = "cpu_speedup",
                      engine: str = "HF, this CPU") -> pd.DataFrame:
    """Per-category speedups over AR: ours (measured with ``engine``, column ``speedup_col`` of ``summary``)
    next to published rows. Different model, hardware and engine: compare shapes, not values.

    ``published`` is :func:`moelab.datasets.load_published_specbench`'s table."""
    pub = published[(published["device"] == device) & (published["model"] == model)].set_index("method")
    missing = sorted(set(methods) - set(pub.index))
    if missing:
        raise ValueError(f"methods {missing} are not in the published table for {device}/{model}; "
                         f"it has {sorted(pub.index)}")
    rows = []
    for cat in [*SPEC_BENCH_CATEGORIES, "overall"]:
        row: dict[str, Any] = {"category": cat}
        for m in ours:
            hit = summary[(summary["method"] == m) & (summary["category"] == cat)]
            row[f"{m} ({engine}, ours)"] = float(hit[speedup_col].iloc[0]) if len(hit) else float("nan")
        col = f"{cat}_speedup"
        for m in methods:
            row[f"{m} {device} (published)"] = float(pub.loc[m, col])
        rows.append(row)
    return pd.DataFrame(rows)


def rank_correlation(x: pd.Series, y: pd.Series) -> float:
    """Spearman's rank correlation of two per-category series over the categories both hold (ties share a rank).

    Parameters
    ----------
    x, y : pandas.Series
        Values indexed by category (e.g. HD's tokens per forward and its speed-up per Spec-Bench category).

    Returns
    -------
    float
        In [-1, 1]: 1 when both order the categories alike, -1 when in reverse; NaN with fewer than three shared
        categories or when either series is constant there.

    Examples
    --------
    >>> rank_correlation(pd.Series({"a": 1.0, "b": 2.0, "c": 3.0}), pd.Series({"a": 10.0, "b": 30.0, "c": 20.0}))
    0.5
    """
    both = pd.concat([x.rename("x"), y.rename("y")], axis=1, join="inner").dropna()
    rx, ry = both["x"].rank(), both["y"].rank()
    if len(both) < 3 or rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def category_shape(compare: pd.DataFrame) -> dict[str, Any]:
    """How the per-category shape of each of our columns of :func:`compare_published`'s table compares with each
    published column: which categories lead and trail, and how alike the two orderings are.

    Parameters
    ----------
    compare : pandas.DataFrame
        :func:`compare_published`'s table (a ``category`` column, one row per Spec-Bench category plus
        ``overall``; columns ending in ``"(published)"`` are the published side, the others ours).

    Returns
    -------
    dict
        ``columns``: per column, ``lead`` and ``trail`` (its fastest and slowest category) and ``order`` (the
        categories from fastest to slowest); ``pairs``: per (ours, published) pair, ``rho`` (Spearman's rank
        correlation over the categories both have), ``same_lead`` and ``same_trail``, and ``agree`` /
        ``disagree`` (the categories that sit in the same half of both orderings, and those that do not).

    Raises
    ------
    ValueError
        If ``compare`` has no ``category`` column, or no column on one of the two sides.
    """
    if "category" not in compare:
        raise ValueError(f"compare needs a 'category' column; it has {list(compare.columns)}")
    per_cat = compare[compare["category"] != "overall"].set_index("category")
    published = [c for c in per_cat.columns if str(c).endswith("(published)")]
    ours = [c for c in per_cat.columns if c not in published]
    if not published or not ours:
        raise ValueError(f"compare needs both our columns and published ones; got ours {ours}, published {published}")
    columns: dict[str, dict[str, Any]] = {}
    for col in per_cat.columns:
        v = per_cat[col].dropna().sort_values(ascending=False)
        columns[str(col)] = {"lead": str(v.index[0]) if len(v) else "", "trail": str(v.index[-1]) if len(v) else "",
                             "order": [str(c) for c in v.index]}
    pairs: dict[str, dict[str, Any]] = {}
    for a in ours:
        for b in published:
            both = per_cat[[a, b]].dropna()
            rho = rank_correlation(both[a], both[b])
            half = len(both) / 2  # a category "leads" when it sits in the faster half of that column's ordering
            top_a, top_b = ({c for c, r in both[col].rank(ascending=False).items() if r <= half} for col in (a, b))
            agree = [c for c in both.index if (c in top_a) == (c in top_b)]
            pairs[f"{a} | {b}"] = {"ours": str(a), "published": str(b), "rho": rho,
                                   "same_lead": columns[str(a)]["lead"] == columns[str(b)]["lead"],
                                   "same_trail": columns[str(a)]["trail"] == columns[str(b)]["trail"],
                                   "agree": [str(c) for c in agree],
                                   "disagree": [str(c) for c in both.index if c not in agree]}
    return {"columns": columns, "pairs": pairs}


def category_wins(summary: pd.DataFrame, method: str, rival: str, col: str = "mean_accepted") -> dict[str, Any]:
    """In which Spec-Bench categories ``method`` is ahead of ``rival`` on ``col`` of a :func:`summarize` table.

    Returns
    -------
    dict
        ``ahead``, ``tied`` and ``behind`` (category lists), ``categories`` (how many both have), ``margin``
        (per category ``method`` minus ``rival``), ``worst`` (the category of the smallest margin) and ``every``
        (``method`` ahead in every category).

    Raises
    ------
    ValueError
        If either method has no per-category row with a value of ``col``.
    """
    per = summary[summary["category"] != "overall"].pivot(index="category", columns="method", values=col)
    missing = [m for m in (method, rival) if m not in per or per[m].isna().all()]
    if missing:
        raise ValueError(f"{missing} have no per-category {col!r} in the summary; methods: {sorted(per.columns)}")
    both = per[[method, rival]].dropna()
    margin = (both[method] - both[rival]).reindex([c for c in SPEC_BENCH_CATEGORIES if c in both.index])
    out = {"ahead": [str(c) for c, d in margin.items() if d > 0], "tied": [str(c) for c, d in margin.items() if d == 0],
           "behind": [str(c) for c, d in margin.items() if d < 0], "categories": int(len(margin)),
           "margin": {str(c): float(d) for c, d in margin.items()},
           "worst": str(margin.idxmin()) if len(margin) else ""}
    out["every"] = bool(len(margin)) and len(out["ahead"]) == len(margin)
    return out


def hf_cost(model: Any) -> VerifyCost:
    """The HF verify-cost curve of ``model`` on this machine: the minima over repeats of
    :func:`moelab.models.lm.verify_cost_curve`, fitted with ``q = 1`` apart
    (:func:`moelab.costmodel.verify.fit_verify_cost`: one new token runs matrix-vector products, two or
    more run matrix products, a step up in cost on a CPU); cached per machine and model."""

    def measure() -> VerifyCost:
        c = verify_cost_curve(model, qs=(1, 2, 3, 5, 9, 17, 29), context_len=256, repeat=5)
        return fit_verify_cost(c["q"].tolist(), c["ms_min"].tolist(), "HF transformers, 1 thread, context 256, min of "
                               f"5, measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}", first_point_apart=True)

    # "hf-transformers": curves cached under "hf" were one line through every point (no q = 1 apart)
    return cached_verify_cost("hf-transformers", model.moelab_load.name, measure)


def run_hf(model: Any, tok: Any, questions: pd.DataFrame, S: Store, L: Store, tokens: int,
           budgets: Sequence[int] | None = None, measure_budget: int = BUDGET, temperature: float = 0.0,
           seed: int = 0) -> tuple[SpecBenchRun, VerifyCost]:
    """The equal-budget experiment in HF transformers: every method of :data:`HF_METHODS` at every budget
    (default :data:`moelab.hd.policy.BUDGETS`), replayed exactly against AR's greedy output; cost-aware HD
    and PLD also run for real at ``measure_budget`` (speed, identity). Row labels ``"<label>@<budget>"``
    (e.g. ``"HD-cost@8"``). Returns the run and the verify-cost curve cost-aware HD read (:func:`hf_cost`)."""
    budgets = tuple(budgets or BUDGETS)
    for b in budgets:
        check_budget(b)
    cost = hf_cost(model)
    factories: dict[str, tuple[Callable[[], Drafter], int]] = {}
    for b in budgets:
        for name in HF_METHODS:
            factories[f"{get_method(name).label}@{b}"] = (
                lambda name=name, b=b: make_hf_drafter(name, S, L, budget=b, cost=cost), b)
    measure = [f"{get_method(m).label}@{measure_budget}" for m in ("hd", "pld")]
    measure = [m for m in measure if m in factories]
    return run_specbench(model, tok, questions, factories=factories, max_new_tokens=tokens, measure=measure,
                         temperature=temperature, seed=seed), cost


__all__ = ["BUDGET", "HF_METHODS", "SpecBenchRun", "category_shape", "category_wins", "compare_published", "hf_cost", "rank_correlation", "run_hf", "run_specbench",
           "summarize"]
