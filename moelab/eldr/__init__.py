"""ELDR: expert-locality-aware decode routing for PD-disaggregated MoE serving.

signature (prefill counts -> unit vector) -> partition (balanced spherical K-means, one centroid per
decode worker) -> routing (locality band tau) -> sim (decode cluster with a calibrated cost model).
``cache`` keeps per-KV-block expert histograms so prefix caching leaves signatures exact;
``workload`` generates the realistic-scale synthetic workload (clearly labelled synthetic).
"""

from moelab.eldr.signature import KINDS, SignatureBuilder, decode_recall, greedy_layer_mask, predictability

__all__ = ["KINDS", "SignatureBuilder", "decode_recall", "greedy_layer_mask", "predictability"]
