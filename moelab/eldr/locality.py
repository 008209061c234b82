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
import pandas as pd
from sklearn.cluster import KMeans

from moelab._validate import check_instance, check_int, rng_from
from moelab.eldr.signature import SignatureBuilder
from moelab.eldr.workload import distinct_reduction, workload_stats
from moelab.traces.analysis import signature_ari
from moelab.traces.expert import ExpertTrace
from moelab.traces.files import bundled_trace_path, load_trace

#: the two bundled real traces, what their requests are and what their labels mean (both from the project's
#: ShareGPT-trained MoE, ``data/models/sharegpt-moe``: 8 MoE layers x 64 experts, top-8; data/traces/README.md)
REAL_TRACES: dict[str, dict[str, str]] = {
    "sharegpt-moe-sharegpt": {"name": "ShareGPT chats", "requests": "first user turns of held-out ShareGPT chats",
                              "labels": "writing system (ShareGPT has no topic or task field)"},
    "sharegpt-moe-specbench": {"name": "Spec-Bench questions", "requests": "Spec-Bench benchmark questions",
                               "labels": "task category"},
}


def _with_labels(trace: ExpertTrace, labels: np.ndarray) -> ExpertTrace:
    return dataclasses.replace(trace, domains=[f"c{int(c)}" for c in labels])


def _halves(trace: ExpertTrace, seed: int) -> tuple[ExpertTrace, ExpertTrace]:
    """The seeded (calibration, held-out) halves every statistic of this module uses."""
    n = trace.n_requests
    perm = rng_from(seed).permutation(n)
    return trace.subset(np.sort(perm[: n // 2])), trace.subset(np.sort(perm[n // 2:]))


def heldout_label_counts(trace: ExpertTrace, *, seed: int = 0) -> dict[str, int]:
    """Requests per label in the held-out half :func:`locality_report` reports on (the same seeded halves):
    its same-label reduction draws one-label batches only from the labels with at least ``batch`` of them.

    Parameters
    ----------
    trace : ExpertTrace
        A labelled trace of at least 2 requests.
    seed : int
        Seed of the halves (the ``seed`` of the report).

    Returns
    -------
    dict
        label -> requests of that label in the held-out half (labels absent from it count 0).
    """
    check_instance("trace", trace, ExpertTrace, "an ExpertTrace")
    check_int("the trace's requests", trace.n_requests, low=2)
    _, names = trace.domain_codes()
    held_codes, held_names = _halves(trace, seed)[1].domain_codes()
    counts = {str(name): 0 for name in names}
    for i, name in enumerate(held_names):
        counts[str(name)] = int(np.sum(held_codes == i))
    return counts


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
    cal, held = _halves(trace, seed)
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


def heldout_rho(trace: ExpertTrace, *, n_pairs: int = 30000, seed: int = 0) -> float:
    """The held-out count_idf rho of :func:`locality_report` (same seeded halves, same pairs) alone.

    Parameters
    ----------
    trace : ExpertTrace
        At least 4 requests (two per half).
    n_pairs : int
        Request pairs of the rho.
    seed : int
        Seed of the halves and the pairs.

    Returns
    -------
    float
    """
    check_instance("trace", trace, ExpertTrace, "an ExpertTrace")
    n = trace.n_requests
    if n < 4:
        raise ValueError(f"trace must hold at least 4 requests (two per half); got {n}")
    cal, held = _halves(trace, seed)
    return float(SignatureBuilder("count_idf", n_pairs=n_pairs, seed=seed).fit(cal).report(held, n_pairs=n_pairs)["rho"])


def locality_contrast(names: tuple[str, ...] = tuple(REAL_TRACES), *, min_label: int = 40, n_pairs: int = 30000,
                      seed: int = 0) -> pd.DataFrame:
    """Why two real traces show different locality: each one's held-out count_idf rho (as
    :func:`locality_report` measures it, the number in its ``.stats.json``), inside one label, and on long prompts.

    Parameters
    ----------
    names : tuple of str
        Bundled trace stems (``data/traces/<name>.npz``); absent ones are left out.
    min_label : int
        Labels with at least this many requests get their own rho (fewer make too few pairs).
    n_pairs : int
        Request pairs of each rho (30,000 as the stats files).
    seed : int
        Seed of the halves and the pairs.

    Returns
    -------
    DataFrame
        One row per trace: ``trace``, ``requests`` (what they are), ``n_requests``, ``labels`` (what a label is),
        ``n_labels``, ``largest_label_share`` (fraction of the requests in the largest label),
        ``median_prompt_tokens``, ``rho`` (all requests), ``rho_within_label_lo`` / ``_hi`` (the range over the
        labels of at least ``min_label`` requests; each from one label's held-out half alone, so a rough value:
        ``labels_within`` labels, the smallest of ``smallest_label_within`` requests), ``long_prompt_tokens`` (the largest median prompt length of
        the traces compared) and ``rho_long_prompts`` (rho of this trace's prompts at least that long). A
        ``display`` name per trace is in :data:`REAL_TRACES`.
    """
    min_label = check_int("min_label", min_label, low=8)
    traces = {n: load_trace(bundled_trace_path(n)) for n in names if bundled_trace_path(n).is_file()}
    if not traces:
        return pd.DataFrame()
    long_len = max(float(np.median(t.prompt_lens)) for t in traces.values())
    rows = []
    for name, tr in traces.items():
        codes, labels = tr.domain_codes()
        sizes = np.bincount(codes, minlength=len(labels))
        within = [heldout_rho(tr.subset(np.flatnonzero(codes == i)), n_pairs=n_pairs, seed=seed)
                  for i in np.flatnonzero(sizes >= min_label)]
        long = np.flatnonzero(tr.prompt_lens >= long_len)
        info = REAL_TRACES.get(name, {"name": name, "requests": "requests", "labels": "label"})
        rows.append({"trace": name, "display": info["name"], "requests": info["requests"], "n_requests": tr.n_requests,
                     "labels": info["labels"], "n_labels": len(labels), "largest_label_share": float(sizes.max() / sizes.sum()),
                     "median_prompt_tokens": float(np.median(tr.prompt_lens)),
                     "rho": heldout_rho(tr, n_pairs=n_pairs, seed=seed),
                     "rho_within_label_lo": min(within) if within else float("nan"),
                     "rho_within_label_hi": max(within) if within else float("nan"),
                     "labels_within": len(within),
                     "smallest_label_within": int(sizes[sizes >= min_label].min()) if within else 0,
                     "long_prompt_tokens": long_len,
                     "rho_long_prompts": heldout_rho(tr.subset(long), n_pairs=n_pairs, seed=seed)
                     if long.size >= 2 * min_label else float("nan")})
    return pd.DataFrame(rows)


def recorded_selection(name: str, source_labels: pd.Series | None = None) -> dict[str, Any] | None:
    """What a bundled real trace kept of its source data set when it was recorded (its provenance's
    ``requests``: the source's question count, the prompt-length limit and how many were skipped over it).

    Parameters
    ----------
    name : str
        Bundled trace stem (``data/traces/<name>.npz``).
    source_labels : pandas.Series, optional
        The source data set's label of every question (for Spec-Bench:
        ``moelab.datasets.load_spec_bench()["category"]``); when given, the result also says which labels the
        limit left out entirely and which it thinned.

    Returns
    -------
    dict or None
        ``questions``, ``kept``, ``skipped_too_long``, ``max_len`` (tokens), ``kept_by_label`` and, with
        ``source_labels``, ``source_by_label``, ``labels_left_out`` and ``labels_thinned`` (label -> (kept, in the
        source)); None when the trace is absent or its provenance records no length limit.
    """
    path = bundled_trace_path(name)
    if not path.exists():
        return None
    trace = load_trace(path)
    req = trace.provenance.get("requests") if isinstance(trace.provenance, dict) else None
    if not isinstance(req, dict) or not {"questions", "skipped_too_long", "max_len"} <= set(req):
        return None
    kept = pd.Series(trace.domains).value_counts()
    out: dict[str, Any] = {"questions": int(req["questions"]), "kept": int(trace.n_requests),
                           "skipped_too_long": int(req["skipped_too_long"]), "max_len": int(req["max_len"]),
                           "kept_by_label": {str(k): int(v) for k, v in kept.items()}}
    if source_labels is not None:
        source = pd.Series(source_labels).astype(str).value_counts()
        out["source_by_label"] = {str(k): int(v) for k, v in source.items()}
        out["labels_left_out"] = [str(k) for k in source.index if int(kept.get(k, 0)) == 0]
        out["labels_thinned"] = {str(k): (int(kept[k]), int(v)) for k, v in source.items() if 0 < int(kept.get(k, 0)) < v}
    return out


__all__ = ["REAL_TRACES", "heldout_label_counts", "heldout_rho", "locality_contrast", "locality_report",
           "recorded_selection"]
