"""Exact compact storage of captured expert traces (numpy only; no torch).

A router's top-k choice at one token and layer is a k-subset of E experts. Its order carries nothing
the traces' consumers use (counts, signatures, distinct experts), so the *set* is stored as its rank in
the combinatorial number system: ``sum_i C(c_i, i+1)`` over the sorted ids ``c_0 < ... < c_{k-1}``, a
number below ``C(E, k)``: ``C(64, 8) = 4.43e9`` needs 33 bits, where the eight int16 ids take 16 bytes.
On disk the ranks are split into byte planes (``decode_sets`` uint8 ``[bytes, sum T, L]``, least
significant plane first; 5 planes for 64 choose 8), so deflate sees the skewed high bytes together.
Decoding is exact (the sorted ids come back), so a :class:`~moelab.traces.ExpertTrace` rebuilt by
:func:`load_compact_trace` has the same counts, profiles and distinct-expert numbers as the captured one.

Files: ``<name>.npz`` (``decode_sets`` byte planes, ``prefill_counts`` [N, L, E] uint16 when it fits,
prompt and generated token ids, offsets) + ``<name>.json`` (format tag ``moelab.CompactExpertTrace``,
geometry, provenance, ids, labels), written atomically and read back as untrusted input (size-checked,
dtypes and ranges checked, never unpickled). Per-token prefill ids are not stored (the counts are).
"""

from __future__ import annotations

import math
from math import comb
from pathlib import Path

import numpy as np

from moelab._io import FileFormatError, atomic_save_npz, atomic_write_json, load_npz, read_json_record
from moelab.traces.expert import MAX_EXPERTS, MAX_LAYERS, ExpertTrace, Geometry, check_loaded_trace

FORMAT = "moelab.CompactExpertTrace"
FORMAT_VERSION = 1
ARRAYS = ("prompt_tokens", "prompt_offsets", "prefill_counts", "decode_sets", "decode_offsets", "decode_tokens")
_KINDS = {name: "iu" for name in ARRAYS}
MAX_SET_BITS = 63


def check_compact_geometry(num_experts: int, top_k: int) -> None:
    """Refuse a geometry whose ranks or rank table do not fit 63 bits, before any table is built.

    The table holds ``C(c, i)`` for ``c < E``, ``i <= k``; its largest entry is ``C(E - 1, min(k, (E - 1) // 2))``.
    A log-gamma estimate rules out the huge cases first, so a sidecar claiming 65,536 experts and top-1000
    costs microseconds, not a hang.
    """
    half = min(top_k, (num_experts - 1) // 2)
    for n, r in ((num_experts, top_k), (num_experts - 1, half)):
        log2 = (math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)) / math.log(2)
        if log2 > MAX_SET_BITS + 1 or comb(n, r) > 1 << MAX_SET_BITS:
            raise ValueError(f"num_experts={num_experts} with top_k={top_k} needs ranks of about 2**{log2:.0f}; the "
                             f"compact format holds {MAX_SET_BITS}-bit ranks (use ExpertTrace.save for this geometry)")


def _binom_table(num_experts: int, top_k: int) -> np.ndarray:
    """``T[c, i] = C(c, i)`` for ``c < E``, ``i <= k`` (uint64)."""
    return np.array([[comb(c, i) for i in range(top_k + 1)] for c in range(num_experts)], dtype=np.uint64)


def _set_dtype(num_experts: int, top_k: int) -> np.dtype:
    check_compact_geometry(num_experts, top_k)
    n = comb(num_experts, top_k)
    return np.dtype(np.uint32 if n <= 1 << 32 else np.uint64)


def set_bytes(num_experts: int, top_k: int) -> int:
    """Bytes needed for a rank below ``C(num_experts, top_k)``."""
    return max(1, ((comb(num_experts, top_k) - 1).bit_length() + 7) // 8)


def to_planes(sets: np.ndarray, n_bytes: int) -> np.ndarray:
    """``[...]`` ranks -> uint8 ``[n_bytes, ...]`` byte planes (least significant first)."""
    v = np.asarray(sets).astype(np.uint64)
    return np.stack([((v >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.uint8) for b in range(n_bytes)])


def from_planes(planes: np.ndarray) -> np.ndarray:
    """Inverse of :func:`to_planes` (uint64)."""
    out = np.zeros(planes.shape[1:], dtype=np.uint64)
    for b in range(planes.shape[0]):
        out |= planes[b].astype(np.uint64) << np.uint64(8 * b)
    return out


def encode_topk_sets(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Rank of each top-k set: ``ids [..., k]`` (distinct expert ids in ``[0, num_experts)``) -> ``[...]``
    uint32 (or uint64 when ``C(E, k) > 2**32``)."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu" or ids.ndim < 1:
        raise ValueError(f"ids must be an integer array [..., k]; got {ids.dtype} with shape {ids.shape}")
    k = ids.shape[-1]
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"ids must be expert ids in [0, num_experts={num_experts}); got {ids.min()} .. {ids.max()}")
    s = np.sort(ids.astype(np.int64), axis=-1)
    if k > 1 and np.any(np.diff(s, axis=-1) == 0):
        raise ValueError("ids must hold k distinct experts per row (a top-k set); some row repeats an expert")
    dtype = _set_dtype(num_experts, k)
    table = _binom_table(num_experts, k)
    out = np.zeros(s.shape[:-1], dtype=np.uint64)
    for i in range(k):
        out += table[s[..., i], i + 1]
    return out.astype(dtype)


def decode_topk_sets(sets: np.ndarray, num_experts: int, top_k: int) -> np.ndarray:
    """Inverse of :func:`encode_topk_sets`: ``[...]`` ranks -> sorted ids ``[..., top_k]`` (int16)."""
    sets = np.asarray(sets)
    if sets.dtype.kind not in "iu":
        raise ValueError(f"sets must be an integer array; got {sets.dtype}")
    limit = comb(num_experts, top_k)
    if sets.size and (int(sets.min()) < 0 or int(sets.max()) >= limit):
        raise ValueError(f"sets must be ranks in [0, C({num_experts}, {top_k})={limit}); got {sets.min()} .. {sets.max()}")
    check_compact_geometry(num_experts, top_k)
    table = _binom_table(num_experts, top_k)
    rest = sets.astype(np.uint64).ravel().copy()
    out = np.zeros((rest.size, top_k), dtype=np.int16)
    for i in range(top_k, 0, -1):
        c = np.searchsorted(table[:, i], rest, side="right") - 1  # largest c with C(c, i) <= rest
        out[:, i - 1] = c
        rest -= table[c, i]
    return out.reshape(*sets.shape, top_k)


def save_compact_trace(trace: ExpertTrace, path: str | Path) -> Path:
    """Write ``trace`` (an :class:`~moelab.traces.ExpertTrace`) compactly to ``path`` (``.npz`` + ``.json``)."""
    g = trace.geometry
    path = Path(path).with_suffix(".npz")
    counts = trace.prefill_counts
    arrays = {
        "prompt_tokens": trace.prompt_tokens.astype(np.uint16 if trace.prompt_tokens.max(initial=0) < 1 << 16 else np.int32),
        "prompt_offsets": trace.prompt_offsets.astype(np.int64),
        "prefill_counts": counts.astype(np.uint16 if counts.max(initial=0) < 1 << 16 else np.int32),
        "decode_sets": to_planes(encode_topk_sets(trace.decode_ids, g.num_experts), set_bytes(g.num_experts, g.top_k)),
        "decode_offsets": trace.decode_offsets.astype(np.int64),
        "decode_tokens": (np.zeros(0, np.int32) if trace.decode_tokens is None else
                          trace.decode_tokens.astype(np.uint16 if trace.decode_tokens.max(initial=0) < 1 << 16 else np.int32)),
    }
    atomic_save_npz(path, **arrays)
    atomic_write_json(path.with_suffix(".json"), {
        "format": FORMAT, "format_version": FORMAT_VERSION, "geometry": g.to_dict(), "provenance": trace.provenance,
        "request_ids": trace.request_ids, "domains": trace.domains, "has_decode_tokens": trace.decode_tokens is not None,
        "encoding": "rank[t, l] = sum_i C(c_i, i + 1) over the sorted top-k ids c_0 < ... < c_{k-1} "
                    "(combinatorial number system); decode_sets[b, t, l] = byte b of rank[t, l]; "
                    "prefill per-token ids not stored",
    })
    return path


def load_compact_trace(path: str | Path, *, max_bytes: int = 256 << 20) -> ExpertTrace:
    """Read a file written by :func:`save_compact_trace` back as an :class:`~moelab.traces.ExpertTrace`
    (decode ids sorted within each top-k set; ``prefill_ids`` and ``prefill_probs`` None).

    Raises
    ------
    FileNotFoundError
        The ``.npz`` does not exist.
    moelab.traces.FileFormatError
        Anything malformed (naming the file and field).
    """
    path = Path(path).with_suffix(".npz")
    meta_path = path.with_suffix(".json")
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if not meta_path.is_file():
        raise FileFormatError(path, None, f"is not a compact trace: its sidecar {meta_path.name} is missing")
    meta = read_json_record(meta_path)
    if meta.get("format", None) != FORMAT:
        raise meta.error("format", f"is {meta.get('format', None)!r}; expected {FORMAT!r}")
    if meta.get_int("format_version") != FORMAT_VERSION:
        raise meta.error("format_version", f"must be {FORMAT_VERSION}")
    geo = meta.get_record("geometry")
    L = geo.get_int("num_layers", low=1, high=MAX_LAYERS)
    E = geo.get_int("num_experts", low=1, high=MAX_EXPERTS)
    k = geo.get_int("top_k", low=1, high=E)
    try:
        check_compact_geometry(E, k)
    except ValueError as exc:
        raise geo.error("top_k", str(exc)) from None
    names = geo.get_str_list("layer_names", [])
    geometry = Geometry(L, E, k, geo.get_str("model_name", "unknown"), tuple(names))
    request_ids = meta.get_str_list("request_ids", unique=True)
    domains = meta.get_str_list("domains", length=len(request_ids))
    arrays = load_npz(path, required=ARRAYS, allowed=ARRAYS, dtypes=_KINDS, max_bytes=max_bytes)
    planes = arrays["decode_sets"]
    nb = set_bytes(E, k)
    if planes.dtype != np.uint8 or planes.ndim != 3 or planes.shape[0] != nb or planes.shape[2] != L:
        raise FileFormatError(path, "decode_sets", f"must be uint8 byte planes of shape ({nb}, sum T, L={L}); "
                                                   f"got {planes.dtype} {planes.shape}")
    try:
        ids = decode_topk_sets(from_planes(planes), E, k)
    except ValueError as exc:
        raise FileFormatError(path, "decode_sets", str(exc)) from None
    toks = arrays["decode_tokens"] if meta.get_bool("has_decode_tokens", False) else None
    try:
        trace = ExpertTrace(request_ids, domains, arrays["prompt_tokens"].astype(np.int32), arrays["prompt_offsets"],
                           arrays["prefill_counts"].astype(np.int32), ids, arrays["decode_offsets"], geometry,
                           meta.get_dict("provenance", {}), None, None,
                           None if toks is None else toks.astype(np.int32))
    except ValueError as exc:
        raise FileFormatError(path, getattr(exc, "field", None), getattr(exc, "problem", str(exc))) from None
    check_loaded_trace(trace, path)
    return trace
