"""ELDR: expert-locality-aware decode routing for PD-disaggregated MoE serving.

signature (prefill counts -> unit vector) -> partition (balanced spherical K-means, one centroid per
decode worker) -> routing (locality band tau) -> sim (decode cluster with a calibrated cost model).
``cache`` keeps per-KV-block expert histograms so prefix caching leaves signatures exact;
``workload`` generates the realistic-scale synthetic workload (clearly labelled synthetic);
``prefix`` the shared-prefix multi-turn conversation workload and signatures built through the cache;
``experiments`` runs the paper's sweeps and ablations.

Every ELDR arrival rate (``rate``) is in the paper's unit, req/s at :data:`PAPER_DECODE_WORKERS` = 16 decode
workers: ``K`` workers are offered ``rate * K / 16`` req/s (:func:`paper_rate_scale`), the same load per worker
at every ``K``. The only function that takes the simulated cluster's own req/s, :func:`poisson_requests`,
names it ``sim_rate``.
"""

from moelab.eldr.cache import Admission, SignatureCache
from moelab.eldr.partition import KMeansResult, OnlineRefitter, align_centroids, spherical_kmeans
from moelab.eldr.prefix import (
    CachedSignatures,
    ConversationConfig,
    ConversationWorkload,
    cache_signatures,
    generate_conversations,
)
from moelab.eldr.routing import DomainOracleRouter, ELDRRouter
from moelab.eldr.signature import KINDS, SignatureBuilder, decode_recall, greedy_layer_mask, predictability
from moelab.eldr.sim import (
    PAPER_DECODE_WORKERS,
    pack_expert_bits,
    paper_rate_scale,
    poisson_requests,
    simulate,
)
from moelab.eldr.workload import (
    DomainSpread,
    SyntheticConfig,
    SyntheticWorkload,
    fit_domain_spread,
    generate,
    workload_stats,
)

__all__ = [
    "KINDS", "PAPER_DECODE_WORKERS", "Admission", "ConversationConfig", "ConversationWorkload", "DomainOracleRouter", "ELDRRouter",
    "CachedSignatures", "DomainSpread", "KMeansResult", "OnlineRefitter", "cache_signatures", "generate_conversations",
    "SignatureBuilder", "SignatureCache", "SyntheticConfig", "SyntheticWorkload", "align_centroids",
    "decode_recall", "fit_domain_spread", "generate", "greedy_layer_mask", "pack_expert_bits",
    "paper_rate_scale", "poisson_requests", "predictability", "simulate", "spherical_kmeans", "workload_stats",
]
