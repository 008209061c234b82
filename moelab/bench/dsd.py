"""DSD benchmarks: closed-form checks, and the propositions re-measured with recorded acceptance and measured costs.

The ``dsd_measured_*``, ``dsd_tokens_per_round_err_pct``, ``dsd_capacity_ratio_batched`` and
``dsd_breakeven_rtt_ms_measured`` figures read the bundled recording ``data/dsd/acceptance_smollm2.json``
(SmolLM2-135M-Instruct target on Spec-Bench prompts; early-exit, PLD and HD drafters; forward timings and a
loopback RTT sample measured on the recording machine). :func:`record_suite` re-records it; it is the one
place that wires the Hierarchy Drafting drafters (``moelab.hd``) into the DSD recorder, so the two paper
folders never import each other.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import moelab.dsd as dsd
from moelab.bench.core import Figure
from moelab.costmodel import DenseVerifyModel
from moelab.dsd import MODES, breakeven_table, cpu_costs, simulate_rounds
from moelab.dsd.acceptance import AcceptanceTrace, chains_proposer, drafter_proposer, record_acceptance
from moelab.dsd.measured import h200_verify_batch_ms
from moelab.dsd.rtt import WAN_SCENARIOS, RTTDistribution
from moelab.hd.drafters import HierarchyDrafter, PLDDrafter
from moelab.hd.specbench import chat_prompt_ids
from moelab.hd.stores import load_default_model_store, load_default_statistics_store
from moelab.models.early_exit import early_exit_draft, greedy_chains, greedy_reference

# the paper's table (gamma=5, t_a=10 ms): RTT_max in ms; None = blank (DSD never beats cloud AR)
PAPER_TABLE = {
    100: {0.5: 47, 0.7: 144, 0.85: 265, 0.9: 319},
    50: {0.5: None, 0.7: 47, 0.85: 108, 0.9: 134},
    30: {0.5: None, 0.7: 8, 0.85: 45, 0.9: 61},
    20: {0.5: None, 0.7: None, 0.85: 13, 0.9: 24},
}
GAMMA = 5  # the paper's draft length, used for the early-exit draft


def record_suite(model: Any, tokenizer: Any, questions, *, exit_layers: int = 24, gamma_max: int = 7,
                 max_new_tokens: int = 48, drafters=("early_exit", "pld", "hd"), progress=None,
                 precomputed: dict | None = None) -> dict:
    """Record acceptance of the early-exit draft and the model-free drafters on ``questions``.

    Returns ``{name: AcceptanceTrace}``. ``early_exit`` uses :func:`moelab.models.early_exit.greedy_chains`
    (``exit_layers`` of the target, ``gamma_max`` tokens ahead); ``pld`` and ``hd`` are ``moelab.hd``'s PLD
    and HD(WSL) drafters with ``moelab.hd``'s default S (shipped) and L (ShareGPT suffix index) stores (their
    native draft sizes: 10 tokens, 7 x 4 tree).
    ``precomputed`` maps a question id to ``(reference, chains)`` already computed with
    :func:`moelab.models.early_exit.greedy_reference` / :func:`~moelab.models.early_exit.greedy_chains` at
    these settings (skips the model forwards for that question).
    """

    name = getattr(tokenizer, "moelab_name", type(model).__name__)
    draft = early_exit_draft(model, exit_layers) if "early_exit" in drafters else None
    stores = None
    if "hd" in drafters:
        stores = (load_default_model_store(tokenizer), load_default_statistics_store(tokenizer))
    seqs: dict[str, list] = {d: [] for d in drafters}
    for _, q in questions.iterrows():
        ids = chat_prompt_ids(tokenizer, q["prompt"])
        qid, cat = int(q["question_id"]), str(q["category"])
        pre = (precomputed or {}).get(qid)
        ref = list(pre[0]) if pre is not None else greedy_reference(model, ids, max_new_tokens, tokenizer.eos_token_id)
        if draft is not None:
            chains = np.asarray(pre[1]) if pre is not None else greedy_chains(draft, ids, ref, gamma_max)
            seqs["early_exit"].append(record_acceptance(chains_proposer(chains), ids, ref, gamma_max=gamma_max,
                                                        question_id=qid, category=cat))
        if "pld" in drafters:
            seqs["pld"].append(record_acceptance(drafter_proposer(PLDDrafter()), ids, ref, gamma_max=10,
                                                 question_id=qid, category=cat))
        if "hd" in drafters:
            hd = HierarchyDrafter(*stores, order="WSL")
            seqs["hd"].append(record_acceptance(drafter_proposer(hd), ids, ref, gamma_max=4, question_id=qid,
                                                category=cat))
        if progress is not None:
            progress(f"q{qid} {cat}: {len(ref)} tokens")
    meta = {"exit_layers": exit_layers, "prompts": [int(x) for x in questions["question_id"]],
            "max_new_tokens": max_new_tokens, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    labels = {"early_exit": f"early exit after {exit_layers} layers", "pld": "PLD", "hd": "HD(WSL)"}
    return {d: AcceptanceTrace(labels[d], name, {"early_exit": gamma_max, "pld": 10, "hd": 4}[d], seqs[d], meta)
            for d in drafters}


def _closed_form_figures(quick: bool) -> list[Figure]:
    table = breakeven_table(alphas=(0.5, 0.7, 0.85, 0.9), t_ars=tuple(PAPER_TABLE), gamma=5, t_a=10.0)
    worst = 0.0
    for t_ar, row in PAPER_TABLE.items():
        for alpha, paper in row.items():
            got = table.loc[t_ar, f"{alpha:g}"]
            if paper is None:
                worst = max(worst, 0.0 if math.isnan(got) else math.inf)
            else:
                worst = max(worst, math.inf if math.isnan(got) else abs(got - paper))
    figs = [Figure("dsd", "dsd_breakeven_table_max_err_ms", worst, "ms", "<= 0",
                   "rounded break-even RTT vs the paper's 16 cells (blanks included)")]
    rounds = 5_000 if quick else 20_000
    zs = []
    for i, (alpha, rtt, jitter) in enumerate([(0.6, 20.0, 0.0), (0.8, 45.0, 0.5), (0.9, 150.0, 0.3)]):
        for mode in MODES:
            res = simulate_rounds(mode, alpha=alpha, gamma=5, t_ar=50, t_d=8, t_a=10, rtt=rtt, rtt_jitter=jitter,
                                  rounds=rounds, seed=i)
            zs.append(abs(res.z))
    figs.append(Figure("dsd", "dsd_closed_form_mc_max_abs_z", float(np.max(zs)), "sigma", "<= 3.5",
                       "closed-form world (i.i.d. alpha, uniform jitter): Monte Carlo vs closed form, "
                       f"{len(zs)} points — a consistency check, agreement by construction"))
    return figs


def run(quick: bool = False) -> list[Figure]:
    figs = _closed_form_figures(quick)
    traces, extra = dsd.load_shipped()
    ee, hd, pld = traces["early_exit"], traces["hd"], traces["pld"]
    n_prompts = len(ee.sequences)
    a_ee, a_hd = ee.alpha(GAMMA), hd.alpha()
    tpr_ee, tpr_hd = ee.tokens_per_round(GAMMA), hd.tokens_per_round()
    e_ee, e_hd = float(dsd.expected_tokens(a_ee, GAMMA)), float(dsd.expected_tokens(a_hd, hd.gamma_max))
    figs += [
        Figure("dsd", "dsd_measured_alpha_early_exit", a_ee, "", "",
               f"SmolLM2-135M target, its first {ee.provenance.get('exit_layers')} layers + LM head as draft, "
               f"gamma={GAMMA}, {n_prompts} Spec-Bench prompts (truncated-geometric MLE over the recorded rounds)"),
        Figure("dsd", "dsd_measured_alpha_hd", a_hd, "", "",
               f"HD(WSL) edge drafter (7 candidates x 4 tokens), same target and prompts; PLD: {pld.alpha():.3f}"),
        Figure("dsd", "dsd_tokens_per_round_err_pct", 100 * (e_ee / tpr_ee - 1), "%", "",
               f"n_tok(alpha_measured, {GAMMA}) = {e_ee:.3f} vs measured {tpr_ee:.3f} tokens/round (early exit); "
               f"HD: {e_hd:.3f} vs {tpr_hd:.3f} ({100 * (e_hd / tpr_hd - 1):+.1f}%); the MLE alpha is fitted to these "
               "same rounds, so this checks the law's shape, not an independent prediction"),
        Figure("dsd", "dsd_tokens_per_round_err_pct_first_token_alpha",
               100 * (float(dsd.expected_tokens(ee.first_token_rate(), GAMMA)) / tpr_ee - 1), "%", "",
               f"n_tok(alpha, {GAMMA}) with alpha = the measured first-token acceptance {ee.first_token_rate():.3f} (how "
               f"alpha is usually quoted) vs measured tokens/round; PLD: "
               f"{100 * (float(dsd.expected_tokens(pld.first_token_rate(), pld.gamma_max)) / pld.tokens_per_round() - 1):+.1f}%"),
    ]

    # break-even RTT on this CPU (the recording machine): SmolLM2 target, measured forward costs
    cpu = cpu_costs(extra)
    n_mc = 5_000 if quick else 20_000
    be = dsd.breakeven_rtt_sync(ee.rounds(GAMMA), t_ar=cpu["t_ar"], t_a=cpu["t_a"], verify_ms=cpu["verify"])
    be_cf = float(dsd.rtt_breakeven(a_ee, GAMMA, cpu["t_ar"], cpu["t_a"]))
    hd_draft_ms = float(np.median(np.concatenate([s.propose_us for s in hd.sequences]))) / 1e3
    be_hd = dsd.breakeven_rtt_sync(hd.rounds(), t_ar=cpu["t_ar"], t_a=hd_draft_ms / hd.gamma_max,
                                   verify_ms=lambda q: cpu["verify"](np.minimum(q, cpu["q_max"])))
    be_hd_cf = float(dsd.rtt_breakeven(a_hd, hd.gamma_max, cpu["t_ar"], hd_draft_ms / hd.gamma_max))
    figs += [
        Figure("dsd", "dsd_breakeven_rtt_ms_measured", be, "ms", "",
               f"sync DSD vs cloud AR, early-exit draft, measured on the recording CPU (t_ar={cpu['t_ar']:.1f}, "
               f"t_a={cpu['t_a']:.1f} ms/token, verify(q) measured); negative = DSD never beats AR"),
        Figure("dsd", "dsd_breakeven_rtt_ms_closed_form", be_cf, "ms", "",
               "(n_tok(alpha_measured)-1)*t_ar - gamma*t_a at the same measured t_ar, t_a (t_v = t_ar)"),
        Figure("dsd", "dsd_breakeven_rtt_ms_measured_hd", be_hd, "ms", "",
               f"same with the HD edge drafter (draft {hd_draft_ms:.2f} ms per round, tree verify >{cpu['q_max']} "
               "tokens costed at the largest measured q)"),
        Figure("dsd", "dsd_breakeven_rtt_ms_closed_form_hd", be_hd_cf, "ms", "", "closed form for the HD drafter"),
    ]

    # pipelining with invalidated drafts vs the closed form, at an RTT inside the drafting window
    rtt = RTTDistribution.lognormal(max(GAMMA * cpu["t_a"] * 0.5, 1.0), max(GAMMA * cpu["t_a"] * 1.2, 2.0),
                                    "inside the window")
    pipe = dsd.simulate_measured("dsd_pipelined", ee.rounds(GAMMA), t_a=cpu["t_a"], verify_ms=cpu["verify"], rtt=rtt,
                                 n_rounds=n_mc, seed=0)
    cf = float(dsd.latency_per_token("dsd_pipelined", alpha=a_ee, gamma=GAMMA, t_a=cpu["t_a"], t_v=cpu["t_ar"],
                                     rtt=rtt.mean))
    figs.append(Figure("dsd", "dsd_pipelined_vs_closed_form_pct", 100 * (pipe.latency_per_token / cf - 1), "%", "",
                       f"measured pipelined DSD (invalidated drafts redrafted: {pipe.invalidated_share:.0%} of rounds, "
                       f"{pipe.wasted_draft_share:.0%} of drafted tokens wasted) vs (max(gamma t_a, RTT)+t_v)/n_tok"))

    # capacity: H200 7B target with a 160M draft, batched verify from dense_verify.csv + attn_step
    dv = DenseVerifyModel.h200()
    verify_b = h200_verify_batch_ms("llama2-7b")
    draft_1 = h200_verify_batch_ms("llama-160m")
    t_d, t_v = float(dv.predict_ms("llama-160m", 1)), float(dv.predict_ms("llama2-7b", GAMMA + 1))
    max_batch = 128 // (GAMMA + 1)  # the verify table covers q <= 128 tokens per forward
    wan = WAN_SCENARIOS["cross-continent"].scaled(50.0)
    cap = dsd.capacity_batched(ee.rounds(GAMMA), verify_batch_ms=verify_b, draft_batch_ms=lambda b: draft_1(b, b),
                               t_a=t_d, rtt=wan, max_batch=max_batch, target_fraction=0.5, max_clients=4096,
                               rounds_per_client=30 if quick else 60, seed=0)
    theory = float(dsd.capacity_gain(GAMMA, t_d, t_v))
    figs += [
        Figure("dsd", "dsd_capacity_ratio_batched", cap.ratio, "x", "",
               f"H200 7B target (dense_verify), 160M draft t_d={t_d:.2f} ms, batches <= {max_batch} clients, "
               f"early-exit acceptance, RTT 50 ms mean (cross-continent shape; the loopback sample's tail is CPU "
               f"stalls, not a network's): DSD {cap.dsd_clients} vs co-located "
               f"{cap.colocated_clients} clients"),
        Figure("dsd", "dsd_capacity_ratio_theory", theory, "x", "",
               f"1 + gamma*t_d/t_v with t_v = verify({GAMMA + 1} tokens) = {t_v:.2f} ms"),
    ]
    return figs
