"""The router contract: ``route(batch, view) -> worker per request`` (``-1`` = keep waiting).

* A router declares what it reads: :attr:`Router.requires`, a set of names from :data:`FIELDS`
  (request fields live on :class:`RequestBatch`, cluster fields on :class:`ClusterView`).
* A driver (a simulator, the proxy, an analysis) says what it supplies and calls
  :func:`check_supplies` once before it starts: a router that needs a field the driver cannot fill is
  refused with a ``ValueError`` naming the field. :meth:`Router.route` checks again per call that
  the required fields are present (a cheap ``is None`` test).
* The worker-count guard lives once, in :meth:`Router.route`; subclasses implement :meth:`Router._route`
  (a whole batch) or :meth:`Router._choose` (one request at a time, the view kept up to date).
* :data:`ROUTERS` is the one registry of names; :func:`make_router` builds one, :func:`router_names`
  lists them (optionally by tag, e.g. ``"baseline"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from moelab._validate import check_int, rng_from

UNASSIGNED = -1

#: Every field a router may require, where it lives and what it means.
FIELDS: dict[str, str] = {
    # per request (RequestBatch)
    "prompt_len": "RequestBatch.prompt_len: prompt tokens (the KV cache the request brings)",
    "signature": "RequestBatch.signature: [n, d] expert-routing signature (ELDR)",
    "domain": "RequestBatch.domain: integer domain/task label (oracles)",
    "prompt_key": "RequestBatch.prompt_key: hash identifying a repeated prompt",
    "prefix_hashes": "RequestBatch.prefix_hashes: per request, the hashes of its prompt's KV blocks",
    "output_len": "RequestBatch.output_len: true output length (oracles and oracle predictors only)",
    # per worker (ClusterView)
    "active": "ClusterView.active: running requests per worker",
    "waiting": "ClusterView.waiting: requests queued at each worker, not yet running",
    "waiting_tokens": "ClusterView.waiting_tokens: prompt tokens of the requests queued at each worker",
    "kv_tokens": "ClusterView.kv_tokens: KV-cache tokens each worker holds (its load)",
    "free_slots": "ClusterView.free_slots: batch slots still free per worker",
    "time_s": "ClusterView.time_s: the simulated clock",
    "active_requests": "ClusterView.active_requests: per running request its worker, workload, age, prompt",
    "waited_steps": "ClusterView.waited_steps: per request of the batch, routing steps it has waited",
}
_BATCH_FIELDS = frozenset({"prompt_len", "signature", "domain", "prompt_key", "prefix_hashes", "output_len"})
# fields a RequestBatch / ClusterView always has (never None)
_ALWAYS = frozenset({"prompt_len", "active", "waiting", "kv_tokens", "free_slots", "time_s"})


def _check_names(names: Collection[str], what: str) -> frozenset[str]:
    unknown = sorted(set(names) - set(FIELDS))
    if unknown:
        raise ValueError(f"{what} has unknown field(s) {unknown}; fields: {sorted(FIELDS)}")
    return frozenset(names)


@dataclass(frozen=True)
class ActiveRequests:
    """The running requests of a cluster, one entry each: ``worker``, ``workload`` (KV tokens of its
    coming step), ``age`` (tokens generated), ``prompt_len``, and when known ``prompt_key`` and the
    true ``output_len`` (oracle predictors only)."""

    worker: np.ndarray
    workload: np.ndarray
    age: np.ndarray
    prompt_len: np.ndarray
    prompt_key: np.ndarray | None = None
    output_len: np.ndarray | None = None

    def __len__(self) -> int:
        return int(np.asarray(self.worker).shape[0])


@dataclass
class ClusterView:
    """What a router may see of ``G`` workers when it decides.

    ``active``: running requests; ``kv_tokens``: KV-cache tokens held; ``free_slots``: batch slots
    still free (a large number where the worker queues without limit); ``waiting``: requests queued
    at the worker but not yet running; ``time_s``: the simulated clock; ``step``: the driver's step
    counter; ``active_requests`` (:class:`ActiveRequests`), ``waited_steps`` (per request of the
    batch) and ``waiting_tokens`` (prompt tokens queued per worker) where the driver supplies them.
    Routers that assign several requests in one call update a private copy (:meth:`copy`,
    :meth:`admit`) as they go.
    """

    active: np.ndarray
    kv_tokens: np.ndarray
    free_slots: np.ndarray
    waiting: np.ndarray | None = None
    time_s: float = 0.0
    step: int = 0
    active_requests: ActiveRequests | None = None
    waited_steps: np.ndarray | None = None
    waiting_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.active = np.asarray(self.active, dtype=np.int64)
        g = self.active.shape[0]
        self.kv_tokens = np.asarray(self.kv_tokens, dtype=np.int64)
        self.free_slots = np.asarray(self.free_slots, dtype=np.int64)
        self.waiting = np.zeros(g, np.int64) if self.waiting is None else np.asarray(self.waiting, dtype=np.int64)
        for name in ("kv_tokens", "free_slots", "waiting"):
            if getattr(self, name).shape != (g,):
                raise ValueError(f"{name} must have one entry per worker ({g}); got shape {getattr(self, name).shape}")
        if self.waiting_tokens is not None:
            self.waiting_tokens = np.asarray(self.waiting_tokens, dtype=np.int64)
            if self.waiting_tokens.shape != (g,):
                raise ValueError(f"waiting_tokens must have one entry per worker ({g}); got {self.waiting_tokens.shape}")

    @property
    def n_workers(self) -> int:
        """Number of workers ``G`` the view describes."""
        return int(self.active.shape[0])

    @classmethod
    def idle(cls, n_workers: int, slots: int = 1 << 30) -> ClusterView:
        """An empty cluster of ``n_workers`` with ``slots`` free slots each."""
        n_workers = check_int("n_workers", n_workers, low=1)
        return cls(np.zeros(n_workers), np.zeros(n_workers), np.full(n_workers, slots))

    def copy(self) -> ClusterView:
        """An independent copy a router may book requests onto."""
        return ClusterView(self.active.copy(), self.kv_tokens.copy(), self.free_slots.copy(), self.waiting.copy(),
                           self.time_s, self.step, self.active_requests, self.waited_steps,
                           None if self.waiting_tokens is None else self.waiting_tokens.copy())

    def admit(self, worker: int, prompt_len: int) -> None:
        """Book one request of ``prompt_len`` tokens onto ``worker`` (used by routers on their copy)."""
        self.active[worker] += 1
        self.kv_tokens[worker] += prompt_len
        self.free_slots[worker] -= 1


@dataclass
class RequestBatch:
    """Requests to place, in arrival order. ``prompt_len`` is required; the rest is what a router
    may use if the driver supplies it: ``signature`` [n, d] (ELDR), ``domain`` (int codes, oracle),
    ``output_len`` (true lengths, for oracle predictors), ``request_id``, ``prompt_key``,
    ``prefix_hashes`` (a tuple of block hashes per request). Signatures must be finite; they are kept as
    float32 when given as float32, else converted to float64."""

    prompt_len: np.ndarray
    signature: np.ndarray | None = None
    domain: np.ndarray | None = None
    output_len: np.ndarray | None = None
    request_id: np.ndarray | None = None
    prompt_key: np.ndarray | None = None
    prefix_hashes: tuple | None = None

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
            sig = np.asarray(self.signature)
            if sig.dtype != np.float32:  # float32 signatures stay float32 (a router's hot path reads them as is)
                sig = sig.astype(np.float64)
            sig = sig[None, :] if sig.ndim == 1 else sig
            if sig.ndim != 2 or sig.shape[0] != n:
                raise ValueError(f"signature must have shape (n_requests={n}, dim); got {sig.shape}")
            if not np.isfinite(sig).all():
                raise ValueError("signature must contain only finite values (NaN/inf refused before routing)")
            self.signature = sig
        if self.prefix_hashes is not None and len(self.prefix_hashes) != n:
            raise ValueError(f"prefix_hashes must have one entry per request ({n}); got {len(self.prefix_hashes)}")

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])


class Router:
    """Base class of every router.

    Class attributes: ``name`` (the registry name), ``requires`` (fields of :data:`FIELDS` it reads),
    ``tags`` (e.g. ``"baseline"``, ``"eldr_paper"``). Subclasses implement :meth:`_choose` for one
    request (``view`` kept up to date by the base class) or :meth:`_route` for batch policies.
    """

    name: ClassVar[str] = "router"
    requires: ClassVar[frozenset[str]] = frozenset({"prompt_len", "free_slots"})
    tags: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.n_workers = 0
        self.rng = rng_from(seed)

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget all state and prepare for ``n_workers`` workers."""
        self.n_workers = check_int("n_workers", n_workers, low=1)
        self.rng = rng_from(self.seed if seed is None else seed)
        return self

    def _bind(self, view: ClusterView) -> None:
        """The worker-count guard: adopt the view's size on first use, refuse a different one later."""
        if view.n_workers != self.n_workers:
            if self.n_workers == 0:
                self.reset(view.n_workers)
            else:
                raise ValueError(f"view has {view.n_workers} workers but the router was reset for {self.n_workers}")

    def _check_present(self, batch: RequestBatch, view: ClusterView) -> None:
        # the optional fields this router requires, worked out once per ``requires`` set (hot path)
        cache = self.__dict__.get("_present")
        if cache is None or cache[0] is not self.requires:
            cache = (self.requires, tuple((f in _BATCH_FIELDS, f) for f in sorted(self.requires) if f not in _ALWAYS))
            self.__dict__["_present"] = cache
        for in_batch, f in cache[1]:
            if getattr(batch if in_batch else view, f, None) is None:
                where = "RequestBatch" if f in _BATCH_FIELDS else "ClusterView"
                raise ValueError(f"{f} is required by the {self.name} router ({where}.{f} is None)")

    def route(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """Assign each request of ``batch`` to a worker (``-1``: no worker has a free slot)."""
        self._bind(view)
        self._check_present(batch, view)
        return self._route(batch, view)

    def _route(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
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


def check_supplies(router: Router | type[Router], supplied: Collection[str], driver: str) -> None:
    """Refuse ``router`` (``ValueError`` naming the fields) when it requires a field that ``driver``
    does not supply."""
    supplied = _check_names(supplied, driver)
    missing = sorted(set(router.requires) - supplied)
    if missing:
        raise ValueError(f"router {router.name!r} requires {missing}, which {driver} does not supply "
                         f"(it supplies {sorted(supplied)})")


#: The one registry of router names: name -> class, or ``"module:Class"`` for routers that live in a
#: paper's folder (imported on first use, so the floor never imports a paper at load time).
ROUTERS: dict[str, type[Router] | str] = {
    "eldr": "moelab.eldr.routing:ELDRRouter",
    "domain_oracle": "moelab.eldr.routing:DomainOracleRouter",
    "br0": "moelab.balanceroute.routers:BR0",
    "brh": "moelab.balanceroute.routers:BRH",
}


def register_router(cls: type[Router]) -> type[Router]:
    """Class decorator: add ``cls`` to :data:`ROUTERS` under ``cls.name`` (validates ``requires``)."""
    _check_names(cls.requires, f"{cls.__name__}.requires")
    ROUTERS[cls.name] = cls
    return cls


def router_class(name: str) -> type[Router]:
    """The class registered under ``name`` (``ValueError`` listing the registry)."""
    if name not in ROUTERS:
        raise ValueError(f"router must be one of {sorted(ROUTERS)}; got {name!r}")
    entry = ROUTERS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        ROUTERS[name] = entry
    return entry


def router_names(tag: str | None = None, *, supplied: Collection[str] | None = None) -> tuple[str, ...]:
    """Registered names, sorted; only those tagged ``tag`` and/or whose requirements ``supplied`` covers."""
    out = []
    for name in sorted(ROUTERS):
        cls = router_class(name) if (tag is not None or supplied is not None) else None
        if tag is not None and tag not in cls.tags:
            continue
        if supplied is not None and not set(cls.requires) <= set(supplied):
            continue
        out.append(name)
    return tuple(out)


def available_routers() -> list[str]:
    """Names :func:`make_router` accepts (the keys of :data:`ROUTERS`)."""
    return sorted(ROUTERS)


def make_router(name: str, **kwargs: Any) -> Router:
    """Build a router by name (e.g. ``"jsq"``, ``"eldr"``, ``"br0"``) with keyword parameters."""
    return router_class(name)(**kwargs)


def requirements(names: Collection[str] | None = None) -> Mapping[str, frozenset[str]]:
    """What each router (all by default) requires."""
    return {n: router_class(n).requires for n in (sorted(ROUTERS) if names is None else names)}
