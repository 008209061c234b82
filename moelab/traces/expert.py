"""ExpertTrace: which experts every request activated, in prefill and in decode.

One object, whatever produced it (HF hooks, vLLM, a synthetic generator). Ragged per-request data
(prompt tokens, prefill top-k ids, decode top-k ids) is stored flat with ``offsets`` arrays, so
every view is a numpy slice. Files: ``<name>.npz`` (arrays) + ``<name>.json`` (geometry,
provenance, ids, labels); both written atomically, never pickled.
"""

from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_save_npz, atomic_write_json, load_npz, read_json

FORMAT = "moelab.ExpertTrace"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Geometry:
    """The MoE shape a trace was taken on: layers ``L``, experts per layer ``E``, top-``k``."""

    num_layers: int
    num_experts: int
    top_k: int
    model_name: str = "unknown"
    layer_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_experts", "top_k"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={self.num_experts}]; got {self.top_k}")
        if self.layer_names and len(self.layer_names) != self.num_layers:
            raise ValueError(f"layer_names must have num_layers={self.num_layers} entries; got {len(self.layer_names)}")

    def to_dict(self) -> dict[str, Any]:
        return {"num_layers": self.num_layers, "num_experts": self.num_experts, "top_k": self.top_k,
                "model_name": self.model_name, "layer_names": list(self.layer_names)}


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


def expert_counts(topk_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Per-layer expert counts ``[L, E]`` (int64) of tokens' top-k ids ``[T, L, k]``: how many of the
    tokens picked expert e in layer l. The one histogram behind prefill counts, KV-block histograms and
    live captures."""
    ids = np.asarray(topk_ids, dtype=np.int64)
    if ids.ndim != 3:
        raise ValueError(f"topk_ids must have shape (tokens, L, k); got {ids.shape}")
    L = ids.shape[1]
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"topk_ids must be expert ids in [0, {num_experts - 1}]")
    flat = (np.arange(L)[None, :, None] * num_experts + ids).ravel()
    return np.bincount(flat, minlength=L * num_experts).reshape(L, num_experts)


def default_provenance(backend: str, model: str, **extra: Any) -> dict[str, Any]:
    """Provenance record: model, backend, UTC date, software versions (+ anything in ``extra``)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("moelab", "numpy", "torch", "transformers", "vllm"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return {"backend": backend, "model": model, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "versions": versions, **extra}


@dataclass(frozen=True, eq=False)
class ExpertTrace:
    """Expert activations of ``N`` requests on a model of shape ``geometry``.

    Attributes
    ----------
    request_ids, domains : list of str, length N
    prompt_tokens : int32 [sum P], with ``prompt_offsets`` [N+1]
    prefill_counts : int32 [N, L, E] — prompt tokens whose top-k picked expert e in layer l
        (each row sums to ``P_i * k``)
    decode_ids : int16 [sum T, L, k], with ``decode_offsets`` [N+1] — top-k ids of every generated token
    prefill_ids : optional int16 [sum P, L, k] — top-k ids of every prompt token (aligned with
        ``prompt_tokens``; needed for per-KV-block histograms)
    prefill_probs : optional float32 [N, L, E] — router probabilities summed over prompt tokens
    decode_tokens : optional int32 [sum T] — the generated token ids
    geometry, provenance
    """

    request_ids: list[str]
    domains: list[str]
    prompt_tokens: np.ndarray
    prompt_offsets: np.ndarray
    prefill_counts: np.ndarray
    decode_ids: np.ndarray
    decode_offsets: np.ndarray
    geometry: Geometry
    provenance: dict[str, Any] = field(default_factory=dict)
    prefill_ids: np.ndarray | None = None
    prefill_probs: np.ndarray | None = None
    decode_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        g = self.geometry
        n = len(self.request_ids)
        if len(self.domains) != n:
            raise ValueError(f"domains must have one entry per request ({n}); got {len(self.domains)}")
        if len(set(self.request_ids)) != n:
            raise ValueError("request_ids must be unique")
        po, do = np.asarray(self.prompt_offsets), np.asarray(self.decode_offsets)
        for name, off, total in (("prompt_offsets", po, len(self.prompt_tokens)), ("decode_offsets", do, len(self.decode_ids))):
            if off.shape != (n + 1,) or off[0] != 0 or off[-1] != total or np.any(np.diff(off) < 0):
                raise ValueError(f"{name} must be non-decreasing, length N+1={n + 1}, from 0 to {total}")
        if self.prefill_counts.shape != (n, g.num_layers, g.num_experts):
            raise ValueError(f"prefill_counts must have shape (N, L, E)={(n, g.num_layers, g.num_experts)}; "
                             f"got {self.prefill_counts.shape}")
        if self.decode_ids.ndim != 3 or self.decode_ids.shape[1:] != (g.num_layers, g.top_k):
            raise ValueError(f"decode_ids must have shape (sum T, L, k)=(*, {g.num_layers}, {g.top_k}); got {self.decode_ids.shape}")
        if self.decode_ids.size and (self.decode_ids.min() < 0 or self.decode_ids.max() >= g.num_experts):
            raise ValueError(f"decode_ids must be expert ids in [0, {g.num_experts - 1}]")
        if self.prefill_ids is not None and self.prefill_ids.shape != (len(self.prompt_tokens), g.num_layers, g.top_k):
            raise ValueError(f"prefill_ids must have shape (sum P, L, k)=({len(self.prompt_tokens)}, {g.num_layers}, {g.top_k}); "
                             f"got {self.prefill_ids.shape}")
        if self.prefill_probs is not None and self.prefill_probs.shape != self.prefill_counts.shape:
            raise ValueError(f"prefill_probs must have the shape of prefill_counts {self.prefill_counts.shape}")
        if self.decode_tokens is not None and self.decode_tokens.shape != (len(self.decode_ids),):
            raise ValueError(f"decode_tokens must have shape (sum T,)=({len(self.decode_ids)},)")

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_requests(
        cls,
        *,
        request_ids: list[str],
        domains: list[str],
        prompt_tokens: list[np.ndarray],
        prefill_counts: np.ndarray,
        decode_ids: list[np.ndarray],
        geometry: Geometry,
        provenance: dict[str, Any] | None = None,
        prefill_ids: list[np.ndarray] | None = None,
        prefill_probs: np.ndarray | None = None,
        decode_tokens: list[np.ndarray] | None = None,
    ) -> ExpertTrace:
        """Build a trace from per-request (ragged) arrays."""
        L, k = geometry.num_layers, geometry.top_k
        id_dtype = np.int16 if geometry.num_experts <= np.iinfo(np.int16).max else np.int32

        def flat(parts: list[np.ndarray], shape_tail: tuple[int, ...], dtype: Any) -> np.ndarray:
            arrays = [np.asarray(p, dtype=dtype).reshape((-1, *shape_tail)) for p in parts]
            return np.concatenate(arrays) if arrays else np.zeros((0, *shape_tail), dtype)

        return cls(
            list(map(str, request_ids)), list(map(str, domains)),
            flat(prompt_tokens, (), np.int32), _offsets(np.array([len(p) for p in prompt_tokens], dtype=np.int64)),
            np.asarray(prefill_counts, dtype=np.int32),
            flat(decode_ids, (L, k), id_dtype), _offsets(np.array([np.asarray(d).reshape(-1, L, k).shape[0] for d in decode_ids], dtype=np.int64)),
            geometry, dict(provenance or {}),
            None if prefill_ids is None else flat(prefill_ids, (L, k), id_dtype),
            None if prefill_probs is None else np.asarray(prefill_probs, dtype=np.float32),
            None if decode_tokens is None else flat(decode_tokens, (), np.int32),
        )

    # ---------------------------------------------------------------- sizes and views
    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def n_requests(self) -> int:
        return len(self.request_ids)

    @property
    def prompt_lens(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)

    @property
    def decode_lens(self) -> np.ndarray:
        return np.diff(self.decode_offsets)

    def prompt(self, i: int) -> np.ndarray:
        """Prompt token ids of request ``i``."""
        return self.prompt_tokens[self.prompt_offsets[i]:self.prompt_offsets[i + 1]]

    def decode(self, i: int) -> np.ndarray:
        """Decode top-k ids of request ``i``: ``[T_i, L, k]``."""
        return self.decode_ids[self.decode_offsets[i]:self.decode_offsets[i + 1]]

    def prefill_topk(self, i: int) -> np.ndarray:
        """Prefill top-k ids of request ``i``: ``[P_i, L, k]`` (needs ``prefill_ids``)."""
        if self.prefill_ids is None:
            raise ValueError("this trace has no per-token prefill_ids (captured without them)")
        return self.prefill_ids[self.prompt_offsets[i]:self.prompt_offsets[i + 1]]

    def decode_profiles(self, max_steps: int | None = None) -> np.ndarray:
        """Decode expert-count profiles ``[N, L, E]``: how often each expert served a generated token
        (first ``max_steps`` tokens of each request if given)."""
        g = self.geometry
        n = self.n_requests
        lens = self.decode_lens if max_steps is None else np.minimum(self.decode_lens, max_steps)
        owner = np.repeat(np.arange(n), lens)
        pos = np.concatenate([np.arange(s, s + m) for s, m in zip(self.decode_offsets[:-1], lens)]) if n else np.zeros(0, np.int64)
        ids = self.decode_ids[pos.astype(np.int64)]  # [M, L, k]
        layer = np.broadcast_to(np.arange(g.num_layers)[None, :, None], ids.shape)
        flat = (owner[:, None, None] * g.num_layers + layer) * g.num_experts + ids
        counts = np.bincount(flat.ravel(), minlength=n * g.num_layers * g.num_experts)
        return counts.reshape(n, g.num_layers, g.num_experts).astype(np.int32)

    def distinct_experts(self, requests: np.ndarray, steps: np.ndarray | int = 0) -> np.ndarray:
        """Distinct experts per layer ``[L]`` activated by one decode step of a batch.

        ``requests`` are request indices; ``steps`` the decode step each is at (scalar or per request).
        A step past a request's last captured token wraps around (traces are finite; simulators run
        longer outputs)."""
        req = np.asarray(requests, dtype=np.int64)
        if req.size == 0:
            return np.zeros(self.geometry.num_layers, dtype=np.int64)
        step = np.broadcast_to(np.asarray(steps, dtype=np.int64), req.shape)
        lens = self.decode_lens[req]
        if np.any(lens == 0):
            raise ValueError("some requests have no decode tokens in this trace")
        rows = self.decode_offsets[req] + np.mod(step, lens)
        ids = self.decode_ids[rows]  # [b, L, k]
        g = self.geometry
        onehot = np.zeros((g.num_layers, g.num_experts), dtype=bool)
        onehot[np.broadcast_to(np.arange(g.num_layers)[None, :, None], ids.shape), ids] = True
        return onehot.sum(axis=1)

    def subset(self, idx: np.ndarray | list[int]) -> ExpertTrace:
        """A new trace holding requests ``idx`` (in that order)."""
        idx = np.asarray(idx, dtype=np.int64)

        def gather(flat: np.ndarray | None, off: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
            lens = np.diff(off)[idx]
            if flat is None:
                return None, _offsets(lens)
            rows = np.concatenate([np.arange(off[i], off[i + 1]) for i in idx]) if idx.size else np.zeros(0, np.int64)
            return flat[rows.astype(np.int64)], _offsets(lens)

        pt, po = gather(self.prompt_tokens, self.prompt_offsets)
        di, do = gather(self.decode_ids, self.decode_offsets)
        pi, _ = gather(self.prefill_ids, self.prompt_offsets)
        dt, _ = gather(self.decode_tokens, self.decode_offsets)
        return ExpertTrace(
            [self.request_ids[i] for i in idx], [self.domains[i] for i in idx], pt, po, self.prefill_counts[idx], di, do,
            self.geometry, dict(self.provenance), pi, None if self.prefill_probs is None else self.prefill_probs[idx], dt,
        )

    def domain_codes(self) -> tuple[np.ndarray, list[str]]:
        """Integer domain label per request and the sorted label names."""
        names = sorted(set(self.domains))
        lookup = {d: i for i, d in enumerate(names)}
        return np.array([lookup[d] for d in self.domains], dtype=np.int64), names

    # ---------------------------------------------------------------- files
    def save(self, path: str | Path) -> Path:
        """Write ``path`` (``.npz``) and its JSON sidecar atomically; returns the ``.npz`` path."""
        path = Path(path).with_suffix(".npz")
        arrays = {"prompt_tokens": self.prompt_tokens, "prompt_offsets": self.prompt_offsets,
                  "prefill_counts": self.prefill_counts, "decode_ids": self.decode_ids, "decode_offsets": self.decode_offsets}
        for name in ("prefill_ids", "prefill_probs", "decode_tokens"):
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name)
        atomic_save_npz(path, **arrays)
        atomic_write_json(path.with_suffix(".json"), {
            "format": FORMAT, "format_version": FORMAT_VERSION, "geometry": self.geometry.to_dict(),
            "provenance": self.provenance, "request_ids": self.request_ids, "domains": self.domains,
            "arrays": sorted(arrays),
        })
        return path

    @classmethod
    def load(cls, path: str | Path) -> ExpertTrace:
        """Load a trace written by :meth:`save`; anything else gives a clear ``ValueError``."""
        path = Path(path).with_suffix(".npz")
        meta_path = path.with_suffix(".json")
        if not meta_path.is_file():
            raise ValueError(f"{path} is not a moelab ExpertTrace: its sidecar {meta_path.name} is missing")
        meta = read_json(meta_path)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path} is not a moelab ExpertTrace sidecar (format tag {FORMAT!r} missing)")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{meta_path} has format_version {meta.get('format_version')!r}; this moelab reads {FORMAT_VERSION}")
        arrays = load_npz(path)
        missing = [a for a in meta.get("arrays", []) if a not in arrays]
        if missing:
            raise ValueError(f"{path} lacks arrays {missing} named in its sidecar (corrupt or mismatched pair)")
        geo = meta["geometry"]
        return cls(
            list(meta["request_ids"]), list(meta["domains"]), arrays["prompt_tokens"], arrays["prompt_offsets"],
            arrays["prefill_counts"], arrays["decode_ids"], arrays["decode_offsets"],
            Geometry(int(geo["num_layers"]), int(geo["num_experts"]), int(geo["top_k"]), str(geo.get("model_name", "unknown")),
                     tuple(geo.get("layer_names", ()))),
            dict(meta.get("provenance", {})), arrays.get("prefill_ids"), arrays.get("prefill_probs"), arrays.get("decode_tokens"),
        )
