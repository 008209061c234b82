"""``moelab bench hd``: Hierarchy Drafting on SmolLM2-135M-Instruct over a Spec-Bench slice.

Slice: the first ``per_category`` questions of each category in the *eval* split
(:func:`moelab.hd.specbench.spec_bench_split`; S was built from the disjoint *store* split), greedy,
``max_new_tokens`` tokens. ``quick``: 1 question per category, 32 tokens. Full run: 5 per category,
64 tokens; any size via ``MOELAB_HD_PER_CATEGORY`` (``all`` = the 60 eval questions per category) and
``MOELAB_HD_TOKENS``. CSVs land in ``$MOELAB_FIGURES`` (or ``figures/``) as ``hd_*.csv``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from moelab.bench.core import Figure

SUITE = "hd"


def _slice(quick: bool) -> tuple[int | None, int]:
    per = os.environ.get("MOELAB_HD_PER_CATEGORY")
    tokens = os.environ.get("MOELAB_HD_TOKENS")
    per_category: int | None = 1 if quick else 5
    if per:
        per_category = None if per == "all" else int(per)
    return per_category, int(tokens) if tokens else (32 if quick else 64)


def run(quick: bool = False) -> list[Figure]:
    from moelab.datasets import SPEC_BENCH_CATEGORIES
    from moelab.hd import spec_bench_split
    from moelab.hd.evaluate import DEFAULT_METHODS, run_specbench
    from moelab.hd.stores import load_default_model_store, load_default_statistics_store
    from moelab.models.lm import load_lm, set_cpu_threads, verify_cost_curve
    from moelab.viz.common import figures_dir

    prev = set_cpu_threads(1)  # one thread: several times steadier on a shared 2-core CPU
    try:
        t0 = time.perf_counter()
        model, tok = load_lm()
        load = model.moelab_load
        S, L = load_default_model_store(tok), load_default_statistics_store(tok)
        curve = verify_cost_curve(model, qs=(1, 2, 4, 8), context_len=256, repeat=3 if quick else 7)
        per_category, tokens = _slice(quick)
        questions = spec_bench_split("eval", per_category=per_category)
        run_ = run_specbench(model, tok, questions, methods=DEFAULT_METHODS, model_store=S, statistics_store=L,
                             max_new_tokens=tokens, measure=("HD(WSL)", "PLD"))
        run_.to_csv(figures_dir())
        summary = run_.summary().set_index(["method", "category"])
        wall = time.perf_counter() - t0
    finally:
        set_cpu_threads(prev)

    slice_note = f"Spec-Bench eval split, {per_category or 'all'} q/category, {tokens} tokens, greedy, 1 CPU thread"
    hd = run_.steps[run_.steps["method"] == "HD(WSL)"]
    figs = [Figure(SUITE, "hd_draft_us_p50", float(np.median(hd[hd["mode"] == "replay"]["draft_us"])), "us", "<= 30",
                   "HD(WSL) drafter alone per step: W/S/L lookups + W update, over the benchmark's sequences"),
            Figure(SUITE, "hd_draft_us_p50_inline", float(np.median(hd[hd["mode"] == "run"]["draft_us"])), "us", "",
                   "same, timed inside the real CPU run (each step follows a cache-evicting forward)"),
            Figure(SUITE, "lm_load_s", load.seconds, "s", "", f"load_lm source={load.source}"),
            Figure(SUITE, "lm_rss_delta_mb", (load.rss_delta_bytes or 0) / 2**20, "MiB", "", "RSS growth while loading")]
    for _, r in curve.iterrows():
        figs.append(Figure(SUITE, f"lm_verify_ms_q{int(r['q'])}", float(r["ms_median"]), "ms", "",
                           "SmolLM2-135M forward of q tokens over a 256-token cached context, 1 thread"))
    singles = ("W-only", "S-only", "L-only")
    for cat in SPEC_BENCH_CATEGORIES:
        pld = float(summary.loc[("PLD", cat), "mean_accepted"])
        best_single = max(float(summary.loc[(m, cat), "mean_accepted"]) for m in singles)
        hd_mat = float(summary.loc[("HD(WSL)", cat), "mean_accepted"])
        figs.append(Figure(SUITE, f"hd_mat_{cat}", hd_mat, "tokens/forward", f">= {pld:.3f}",
                           f"HD(WSL) vs PLD; best single store {best_single:.3f}; {slice_note}"))
        figs.append(Figure(SUITE, f"pld_mat_{cat}", pld, "tokens/forward", "", slice_note))
    margin = min(float(summary.loc[("HD(WSL)", c), "mean_accepted"])
                 - max(float(summary.loc[(m, c), "mean_accepted"]) for m in singles) for c in SPEC_BENCH_CATEGORIES)
    figs.append(Figure(SUITE, "hd_mat_margin_over_best_single_store", margin, "tokens/forward", ">= 0",
                       "min over categories of HD(WSL) minus the best of W-only/S-only/L-only"))
    overall = summary.loc[("HD(WSL)", "overall")]
    figs.append(Figure(SUITE, "hd_cpu_speedup", float(overall["cpu_speedup"]), "x", "",
                       f"measured wall clock vs AR on this CPU (output identical: {bool(overall['identical'])}); "
                       "trees of ~20-30 tokens cost several AR steps on a CPU"))
    figs.append(Figure(SUITE, "hd_projected_h200_7b_speedup", float(overall["projected_h200_7b_speedup"]), "x", "",
                       "same per-step tree sizes, verify cost from data/calibration/h200/dense_verify.csv (llama2-7b)"))
    figs.append(Figure(SUITE, "hd_bench_wall_s", wall, "s", "", f"{len(questions)} questions incl. model load"))
    return figs
