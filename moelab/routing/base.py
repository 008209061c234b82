"""The router interface: ``route(batch, view) -> worker per request`` (``-1`` = keep waiting)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from moelab._validate import check_int, rng_from

UNASSIGNED = -1


@dataclass
class ClusterView:
    """What a router may see of ``G`` workers when it decides.

    ``active``: in-flight (running) requests; ``kv_tokens``: KV-cache tokens held; ``free_slots``:
    batch slots still free (a large number where the worker queues without limit); ``waiting``:
    requests queued at the worker but not yet running; ``time_s``: the simulated clock. Routers that
    assign several requests in one call update a private copy of these as they go.
    """

    active: np.ndarray
    kv_tokens: np.ndarray
    free_slots: np.ndarray
    waiting: np.ndarray | None = None
    time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.active = np.asarray(self.active, dtype=np.int64)
        g = self.active.shape[0]
        self.kv_tokens = np.asarray(self.kv_tokens, dtype=np.int64)
        self.free_slots = np.asarray(self.free_slots, dtype=np.int64)
        self.waiting = np.zeros(g, np.int64) if self.waiting is None else np.asarray(self.waiting, dtype=np.int64)
        for name in ("kv_tokens", "free_slots", "waiting"):
            if getattr(self, name).shape != (g,):
                raise ValueError(f"{name} must have one entry per worker ({g}); got shape {getattr(self, name).shape}")

    @property
    def n_workers(self) -> int:
        return int(self.active.shape[0])

    @classmethod
    def idle(cls, n_workers: int, slots: int = 1 << 30) -> ClusterView:
        """An empty cluster of ``n_workers`` with ``slots`` free slots each."""
        n_workers = check_int("n_workers", n_workers, low=1)
        return cls(np.zeros(n_workers), np.zeros(n_workers), np.full(n_workers, slots))

    def copy(self) -> ClusterView:
        return ClusterView(self.active.copy(), self.kv_tokens.copy(), self.free_slots.copy(), self.waiting.copy(),
                           self.time_s, dict(self.extra))

    def admit(self, worker: int, prompt_len: int) -> None:
        """Book one request of ``prompt_len`` tokens onto ``worker`` (used by routers on their copy)."""
        self.active[worker] += 1
        self.kv_tokens[worker] += prompt_len
        self.free_slots[worker] -= 1


@dataclass
class RequestBatch:
    """Requests to place, in arrival order. ``prompt_len`` is required; the rest is what a router
    may use if present: ``signature`` [n, d] (ELDR), ``domain`` (int codes, oracle),
    ``output_len`` (true lengths, for oracle predictors), ``request_id``, ``prompt_key``."""

    prompt_len: np.ndarray
    signature: np.ndarray | None = None
    domain: np.ndarray | None = None
    output_len: np.ndarray | None = None
    request_id: np.ndarray | None = None
    prompt_key: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prompt_len = np.atleast_1d(np.asarray(self.prompt_len, dtype=np.int64))
        n = self.prompt_len.shape[0]
        if self.request_id is None:
            self.request_id = np.arange(n)
        for name in ("domain", "output_len", "request_id", "prompt_key"):
            value = getattr(self, name)
            if value is not None:
                value = np.atleast_1d(np.asarray(value))
                if value.shape != (n,):
                    raise ValueError(f"{name} must have one entry per request ({n}); got shape {value.shape}")
                setattr(self, name, value)
        if self.signature is not None:
            sig = np.asarray(self.signature, dtype=np.float64)
            sig = sig[None, :] if sig.ndim == 1 else sig
            if sig.ndim != 2 or sig.shape[0] != n:
                raise ValueError(f"signature must have shape (n_requests={n}, dim); got {sig.shape}")
            self.signature = sig

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])


class Router:
    """Base class of every router. Subclasses implement :meth:`_choose` for one request (with
    ``view`` kept up to date by the base class), or override :meth:`route` for batch policies."""

    name: ClassVar[str] = "router"

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.n_workers = 0
        self.rng = rng_from(seed)

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget all state and prepare for ``n_workers`` workers."""
        self.n_workers = check_int("n_workers", n_workers, low=1)
        self.rng = rng_from(self.seed if seed is None else seed)
        return self

    def route(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """Assign each request of ``batch`` to a worker (``-1``: no worker has a free slot)."""
        if view.n_workers != self.n_workers:
            if self.n_workers == 0:
                self.reset(view.n_workers)
            else:
                raise ValueError(f"view has {view.n_workers} workers but the router was reset for {self.n_workers}")
        work = view.copy()
        out = np.full(len(batch), UNASSIGNED, dtype=np.int64)
        for i in range(len(batch)):
            open_ = work.free_slots > 0
            if not open_.any():
                break
            w = int(self._choose(batch, i, work, open_))
            out[i] = w
            work.admit(w, int(batch.prompt_len[i]))
        return out

    def _choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        raise NotImplementedError

    def _argmin_tiebreak(self, score: np.ndarray, open_: np.ndarray) -> int:
        """Index of the smallest ``score`` among open workers, ties broken by a seeded random draw."""
        masked = np.where(open_, score, np.inf)
        best = np.flatnonzero(masked == masked.min())
        return int(best[0] if best.size == 1 else best[self.rng.integers(best.size)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seed={self.seed})"


_REGISTRY: dict[str, type[Router] | str] = {
    # Routers that live in a paper's folder, found lazily so routing never imports them at load time.
    "eldr": "moelab.eldr.routing:ELDRRouter",
    "domain_oracle": "moelab.eldr.routing:DomainOracleRouter",
    "br0": "moelab.balanceroute.routers:BR0",
    "brh": "moelab.balanceroute.routers:BRH",
}


def register_router(cls: type[Router]) -> type[Router]:
    """Class decorator: make ``cls`` available to :func:`make_router` under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def available_routers() -> list[str]:
    """Names :func:`make_router` accepts."""
    return sorted(_REGISTRY)


def make_router(name: str, **kwargs: Any) -> Router:
    """Build a router by name (e.g. ``"jsq"``, ``"eldr"``, ``"br0"``) with keyword parameters."""
    if name not in _REGISTRY:
        raise ValueError(f"router must be one of {available_routers()}; got {name!r}")
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = entry
    return entry(**kwargs)
