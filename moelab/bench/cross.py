"""Cross-paper benchmark: ELDR picks the instance, BalanceRoute picks the rank (``moelab.cross``).

Operating point (documented): SYNTHETIC Qwen3-30B-A3B-shaped workload (``moelab.eldr.workload``),
K=4 decode instances x G=4 DP-attention ranks of 16 slots, prompt/output lengths resampled from the Azure
LLM trace 2023 (conversation; outputs <= 512, the longer 2.9% left out and counted), attention set to 50% of
a one-rank step at the reference batch (a projection knob, :meth:`DecodeStepModel.with_attention_share`),
Poisson arrivals at 1.3x the rate that fills the slots (``rate_for_load``: the ranks run full and a
queue forms, the regime BalanceRoute targets). Gains are p50 TPOT against JSQ x JSQ on the same arrivals.
"""

from __future__ import annotations

from moelab import cross
from moelab.bench.core import Figure


def run(quick: bool = False) -> list[Figure]:
    """Measure the cross-paper figures at the documented operating point (``quick``: smaller)."""
    n_req = 800 if quick else 2000
    cs = cross.prepare(n_instances=4, ranks=4, slots=16, n_trace=384 if quick else 768, output_len=512,
                       attention_share=0.5, n_pairs=2000 if quick else 5000)
    rate = cross.rate_for_load(cs, 1.3)
    df = cross.pair_grid(cs, rate=rate, n_requests=n_req)
    g = cross.gains(df)
    base = (f"synthetic Qwen3-30B-A3B-shaped workload, K=4 x G=4 ranks x 16 slots, attention 50% of a rank step "
            f"(projection), {rate:.0f} req/s (1.3x slot capacity), {n_req} requests; {cs.lengths_note}; vs jsq x jsq")
    return [
        Figure("cross", "cross_best_pair_tpot_gain_pct", g["best_pair_gain_pct"], "%", "",
               f"best pair {g['best_pair']}; {base}"),
        Figure("cross", "cross_eldr_only_gain_pct", g["eldr_only_gain_pct"], "%", "", f"eldr x jsq; {base}"),
        Figure("cross", "cross_br_only_gain_pct", g["br_only_gain_pct"], "%", "", f"{g['br_only_pair']}; {base}"),
        Figure("cross", "cross_both_gain_pct", g["both_gain_pct"], "%", "",
               f"{g['both_pair']} (additive would be {g['additive_gain_pct']:.2f}%); {base}"),
    ]
