"""The expert-locality statistics a model card reports for ELDR, measured on a captured trace.

:func:`locality_report` splits a trace in halves (seeded), fits ELDR's count_idf signature and K-means
clusters on one half and reports on the other: how well prefill predicts decode routing (rho, decode-expert
recall), how many fewer distinct experts a batch of one signature cluster (or one label) touches than a
mixed batch, and how well clusters match the labels (ARI). ``moelab.make.sharegpt_moe`` writes them
beside the bundled traces (``data/traces/*.stats.json``) and into the model card.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from sklearn.cluster import KMeans

from moelab._validate import check_int, rng_from
from moelab.eldr.signature import SignatureBuilder
from moelab.eldr.workload import distinct_reduction, workload_stats
from moelab.traces.analysis import signature_ari
from moelab.traces.expert import ExpertTrace


def _with_labels(trace: ExpertTrace, labels: np.ndarray) -> ExpertTrace:
    return dataclasses.replace(trace, domains=[f"c{int(c)}" for c in labels])


def locality_report(
    trace: ExpertTrace,
    *,
    n_clusters: int = 8,
    batch: int = 32,
    n_pairs: int = 30000,
    seed: int = 0,
) -> dict[str, Any]:
    """Locality statistics of a captured trace, split in halves (seeded): the count_idf signature (idf and
    greedy layer mask) and the K-means clusters are fitted on the calibration half, everything is
    reported on the other (held-out) half.

    Returns
    -------
    dict
        ``rho_count_idf`` / ``recall_count_idf`` (:meth:`SignatureBuilder.report` on the held-out half),
        ``rho_raw`` / ``recall_raw`` (raw counts, all layers: :func:`moelab.eldr.workload.workload_stats`),
        ``distinct_reduction_pct_cluster`` (decode-step distinct experts of ``batch`` requests of one
        signature cluster vs of the mix, :func:`moelab.eldr.workload.distinct_reduction`),
        ``distinct_reduction_pct_label`` (same, batches of one label; None if no label has ``batch`` requests),
        ``ari_labels`` (K-means with as many clusters as labels vs the labels,
        :func:`moelab.traces.analysis.signature_ari`), label counts, sizes.
    """
    n = trace.n_requests
    check_int("n_clusters", n_clusters, low=2, high=n // 2)
    perm = rng_from(seed).permutation(n)
    cal, held = trace.subset(np.sort(perm[: n // 2])), trace.subset(np.sort(perm[n // 2:]))
    sb = SignatureBuilder("count_idf", n_pairs=n_pairs, seed=seed).fit(cal)
    rep = sb.report(held, n_pairs=n_pairs)
    raw = workload_stats(held, batch=batch, n_pairs=n_pairs, seed=seed)
    km = KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit(sb.transform(cal))
    held_clusters = km.predict(sb.transform(held))
    red_c = distinct_reduction(_with_labels(held, held_clusters), batch=batch, seed=seed)
    codes, names = trace.domain_codes()
    counts = {name: int(np.sum(codes == i)) for i, name in enumerate(names)}
    try:
        red_l = distinct_reduction(held, batch=batch, seed=seed)["reduction_pct"]
    except ValueError:
        red_l = None
    ari = signature_ari(trace, seed=seed) if len(names) >= 2 else None
    toks = trace.decode_tokens
    distinct_toks = None if toks is None else float(np.mean(
        [np.unique(toks[a:b]).size for a, b in zip(trace.decode_offsets[:-1], trace.decode_offsets[1:])]))
    return {
        "n_requests": n, "n_calibration": cal.n_requests, "n_heldout": held.n_requests,
        "decode_tokens": int(trace.decode_lens.sum()), "geometry": trace.geometry.to_dict(),
        "rho_count_idf": rep["rho"], "recall_count_idf": rep["recall"], "layers_kept": rep["layers_kept"],
        "rho_raw": raw["rho"], "recall_raw": raw["recall"],
        "distinct_mixed": red_c["distinct_mixed"], "distinct_same_cluster": red_c["distinct_same_domain"],
        "distinct_reduction_pct_cluster": red_c["reduction_pct"], "distinct_reduction_pct_label": red_l,
        "n_clusters": n_clusters, "batch": batch, "ari_labels": ari, "decode_distinct_tokens_per_request": distinct_toks, "label_counts": counts, "seed": seed, "n_pairs": n_pairs,
    }


__all__ = ["locality_report"]
