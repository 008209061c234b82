"""Expert-locality statistics of an :class:`~moelab.traces.ExpertTrace`.

Three numbers say whether a model's routing carries "domain locality" that ELDR can exploit:

* :func:`domain_expert_mi` — per-layer mutual information (nats) between a request's domain and the
  expert a token is routed to.
* :func:`topk_activation_share` — the *activation share*: how much of a request's decode expert
  activations fall in the top-``k`` experts of its own prefill (per layer), against the same ``k`` experts
  chosen globally (most popular prefill experts of the whole trace). (Not ELDR's decode-expert *recall*,
  :func:`moelab.eldr.signature.decode_recall`, which scores a signature's predicted expert set.)
* :func:`signature_ari` — adjusted Rand index between K-means clusters of prefill signatures and the
  domain labels.

:func:`locality_stats` bundles them; the tiny-MoE model card is written from it and a test recomputes it
from the bundled traces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from moelab._validate import check_choice, check_int, rng_from
from moelab.traces.expert import ExpertTrace


def _activation_counts(trace: ExpertTrace, source: str) -> np.ndarray:
    check_choice("source", source, ("prefill", "decode"))
    return trace.prefill_counts if source == "prefill" else trace.decode_profiles()


def domain_expert_mi(trace: ExpertTrace, source: str = "prefill") -> np.ndarray:
    """Per-layer mutual information ``I(domain; expert)`` in nats, ``[L]``.

    The joint distribution weights every request equally (each request's activation counts are
    normalised to sum 1 per layer, so long prompts do not dominate): ``p(d, e) = mean over requests r of
    domain d of C_r[l, e] / sum_e C_r[l, e]``, times the share of requests in ``d``. The upper bound is
    ``log(#domains)``.

    Parameters
    ----------
    trace : ExpertTrace
    source : {"prefill", "decode"}
        Prefill counts or decode expert-count profiles.
    """
    counts = _activation_counts(trace, source).astype(np.float64)  # [N, L, E]
    codes, names = trace.domain_codes()
    if len(names) < 2:
        raise ValueError(f"mutual information needs at least 2 domains; the trace has {names}")
    tot = counts.sum(axis=2, keepdims=True)
    keep = tot[:, 0, 0] > 0
    share = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)[keep]
    codes = codes[keep]
    n = len(codes)
    joint = np.zeros((len(names), counts.shape[1], counts.shape[2]))  # [D, L, E]
    np.add.at(joint, codes, share / n)
    p_d = joint.sum(axis=2, keepdims=True)  # [D, L, 1]
    p_e = joint.sum(axis=0, keepdims=True)  # [1, L, E]
    ratio = np.divide(joint, p_d * p_e, out=np.ones_like(joint), where=joint > 0)
    return np.sum(joint * np.log(ratio), axis=(0, 2))


def topk_activation_share(trace: ExpertTrace, k: int = 4, *, max_steps: int | None = None) -> dict[str, Any]:
    """Activation share: the share of decode expert activations that fall in the top-``k`` prefill
    experts, vs a global top-``k``.

    For request ``r`` and layer ``l``, the predicted set is the ``k`` experts with the highest prefill
    counts (ties broken by lower expert id). The activation share is the share of the request's decode activations
    (token x top-k slots) that hit the set; the baseline predicts, for every request, the ``k`` experts
    most used in prefill over the whole trace. Both are averaged over requests (each layer weighted
    equally).

    Returns
    -------
    dict
        ``activation_share``, ``baseline``, ``gain`` (floats) and ``activation_share_per_layer``,
        ``baseline_per_layer`` ``[L]``.
    """
    g = trace.geometry
    check_int("k", k, low=1, high=g.num_experts, high_name="num_experts")
    dec = trace.decode_profiles(max_steps).astype(np.float64)  # [N, L, E]
    keep = dec[:, 0, :].sum(axis=1) > 0
    if not np.any(keep):
        raise ValueError("the trace has no decode tokens; the activation share needs decode activations")
    pre = trace.prefill_counts[keep].astype(np.float64)
    dec = dec[keep]
    # stable sort on -count: the lower expert id wins ties, deterministically
    own = np.argsort(-pre, axis=2, kind="stable")[:, :, :k]  # [N, L, k]
    glob = np.argsort(-pre.sum(axis=0), axis=1, kind="stable")[:, :k]  # [L, k]
    tot = dec.sum(axis=2)  # [N, L]
    hit_own = np.take_along_axis(dec, own, axis=2).sum(axis=2) / tot
    hit_glob = dec[:, np.arange(g.num_layers)[:, None], glob].sum(axis=2) / tot
    rl, bl = hit_own.mean(axis=0), hit_glob.mean(axis=0)
    return {"k": int(k), "activation_share": float(rl.mean()), "baseline": float(bl.mean()),
            "gain": float(rl.mean() - bl.mean()), "activation_share_per_layer": rl, "baseline_per_layer": bl}


def prefill_signatures(trace: ExpertTrace) -> np.ndarray:
    """Unit-norm prefill signatures ``[N, L*E]``: per-layer count shares, concatenated, L2-normalised."""
    c = trace.prefill_counts.astype(np.float64)
    tot = c.sum(axis=2, keepdims=True)
    x = np.divide(c, tot, out=np.zeros_like(c), where=tot > 0).reshape(len(c), -1)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def signature_clusters(trace: ExpertTrace, n_clusters: int | None = None, *, seed: int = 0, n_init: int = 10) -> np.ndarray:
    """K-means (Euclidean, on unit-norm prefill signatures) cluster label per request.

    ``n_clusters`` defaults to the number of domains; K-means uses k-means++ seeding, ``n_init`` restarts
    and a fixed ``seed``.
    """
    _, names = trace.domain_codes()
    n_init = check_int("n_init", n_init, low=1, high=1000)
    if n_clusters is None:
        k = len(names)
        if k < 2:
            raise ValueError(f"clustering needs at least 2 clusters/domains; the trace has {names}")
    else:
        k = check_int("n_clusters", n_clusters, low=2, high=len(trace), high_name="number of requests")
    if k > len(trace):
        raise ValueError(f"n_clusters (the number of domains, {k}) must be <= the number of requests ({len(trace)})")
    seed_int = int(rng_from(seed).integers(0, 2**31 - 1))
    return KMeans(n_clusters=k, n_init=n_init, random_state=seed_int).fit_predict(prefill_signatures(trace))


def signature_ari(trace: ExpertTrace, n_clusters: int | None = None, *, seed: int = 0, n_init: int = 10) -> float:
    """Adjusted Rand index of :func:`signature_clusters` vs the domain labels."""
    codes, _ = trace.domain_codes()
    return float(adjusted_rand_score(codes, signature_clusters(trace, n_clusters, seed=seed, n_init=n_init)))


def locality_stats(trace: ExpertTrace, k: int = 4, *, seed: int = 0) -> dict[str, Any]:
    """All locality statistics of a trace as plain JSON-able numbers.

    Returns
    -------
    dict
        ``mi_prefill`` / ``mi_decode`` (per-layer lists, nats), ``mi_max``, ``activation_share`` / ``baseline`` /
        ``gain`` at ``k`` (+ per-layer lists), ``ari`` and ``kmeans_confusion`` (domains x clusters), ``n_requests``, ``domains``, ``log_n_domains``.
    """
    mi_p = domain_expert_mi(trace, "prefill")
    mi_d = domain_expert_mi(trace, "decode")
    share = topk_activation_share(trace, k)
    codes, names = trace.domain_codes()
    clusters = signature_clusters(trace, seed=seed)
    confusion = np.zeros((len(names), len(names)), dtype=np.int64)
    np.add.at(confusion, (codes, clusters), 1)
    # clusters ordered by the domain they mostly hold, so the matrix reads along its diagonal
    confusion = confusion[:, np.argsort(np.argmax(confusion, axis=0) + confusion.max(axis=0) / (len(trace) + 1.0), kind="stable")]
    return {
        "n_requests": len(trace), "domains": names, "log_n_domains": float(np.log(len(names))),
        "mi_prefill": [float(v) for v in mi_p], "mi_decode": [float(v) for v in mi_d], "mi_max": float(mi_p.max()),
        "k": share["k"], "activation_share": share["activation_share"], "baseline": share["baseline"],
        "gain": share["gain"], "activation_share_per_layer": [float(v) for v in share["activation_share_per_layer"]],
        "baseline_per_layer": [float(v) for v in share["baseline_per_layer"]],
        "ari": signature_ari(trace, seed=seed), "kmeans_confusion": confusion.tolist(),
    }
