"""The router contract: ``route(batch, view) -> worker per request`` (``-1`` = keep waiting).

* A router declares what it reads: :attr:`Router.requires`, a set of names from :data:`FIELDS`
  (request fields live on :class:`RequestBatch`, cluster fields on :class:`ClusterView`).
* A driver (a simulator, the proxy, an analysis) says what it supplies and calls
  :func:`check_supplies` once before it starts: a router that needs a field the driver cannot fill is
  refused with a ``ValueError`` naming the field. :meth:`Router.route` checks again per call that
  the required fields are present (a cheap ``is None`` test).
* The worker-count guard lives once, in :meth:`Router.route`; subclasses implement :meth:`Router._route`
  (a whole batch) or :meth:`Router._choose` (one request at a time, the view kept up to date).
* A router with fitted state declares what it needs from a :class:`RouterCalibration`
  (:attr:`Router.calibration_needs`, names from :data:`CALIBRATION_FIELDS`); :meth:`Router.prepare` fits
  it (ELDR's centroids, the domain oracle's domain count, a vLLM balancer's KV capacity) and refuses,
  naming the missing items, a calibration that lacks them. :meth:`Router.route` refuses a router that
  still needs preparing.
* A router that dispatches every request at once to an engine's own queue, even a full engine, says so
  with :attr:`Router.engine_queues`; a driver states whether it keeps engine queues
  (:func:`check_supplies`, :func:`router_names`), as it states the fields it supplies.
* :data:`ROUTERS` is the one registry of names, filled by :func:`register_router` as each router's
  module is imported: this floor registers its baselines; the paper folders register their own
  routers, and :mod:`moelab.routers` imports every one of them, so that module's registry is complete.
  :func:`make_router` builds (and, given a calibration, prepares) one; :func:`router_names` lists them
  (optionally by tag, e.g. ``"baseline"``, or by what a driver supplies).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from moelab._validate import MAX_SEQUENCE_TOKENS, check_int, check_int_array, check_real, rng_from

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


#: Everything a router may need from its calibration (:meth:`Router.prepare`), and what it means.
CALIBRATION_FIELDS: dict[str, str] = {
    "n_workers": "RouterCalibration.n_workers: the workers the router will place requests on",
    "signatures": "RouterCalibration.signatures: [n, d] expert-routing signatures of calibration requests (ELDR)",
    "centroids": "RouterCalibration.centroids: [n_workers, d] centroids the driver already fitted on the signatures",
    "domains": "RouterCalibration.domains: domain label of each calibration request (the domain oracle)",
    "kv_capacity_tokens": "RouterCalibration.kv_capacity_tokens: one engine's KV-cache size in tokens (vLLM >= 0.32)",
    "seed": "RouterCalibration.seed: seed of whatever prepare fits (e.g. K-means)",
}


def _check_names(names: Collection[str], what: str, known: Mapping[str, str] = FIELDS) -> frozenset[str]:
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"{what} has unknown field(s) {unknown}; fields: {sorted(known)}")
    return frozenset(names)


@dataclass(frozen=True)
class RouterCalibration:
    """What a driver knows before routing starts, for :meth:`Router.prepare` (fields: :data:`CALIBRATION_FIELDS`).

    Parameters
    ----------
    n_workers : int, optional
        The workers the router will place requests on (>= 1).
    signatures : ndarray, optional
        ``[n, d]`` finite expert-routing signatures of calibration requests (ELDR fits one centroid per
        worker on them).
    centroids : ndarray, optional
        ``[n_workers, d]`` centroids the driver already fitted on ``signatures`` (its cache: ELDR takes
        them instead of running K-means again).
    domains : array-like, optional
        The domain label of each calibration request (the domain oracle counts the distinct ones).
    kv_capacity_tokens : float, optional
        One engine's KV-cache size in tokens (> 0; vLLM >= 0.32 turns KV tokens into a usage fraction).
    seed : int
        Seed of whatever ``prepare`` fits (default 0).
    """

    n_workers: int | None = None
    signatures: np.ndarray | None = None
    centroids: np.ndarray | None = None
    domains: np.ndarray | None = None
    kv_capacity_tokens: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_workers is not None:
            object.__setattr__(self, "n_workers", check_int("n_workers", self.n_workers, low=1))
        if self.signatures is not None:
            sig = np.asarray(self.signatures, dtype=np.float64)
            if sig.ndim != 2 or sig.shape[0] < 1 or not np.isfinite(sig).all():
                raise ValueError(f"signatures must be a finite [n >= 1, d] array; got shape {sig.shape}")
            object.__setattr__(self, "signatures", sig)
        if self.centroids is not None:
            cen = np.asarray(self.centroids, dtype=np.float64)
            if self.signatures is None or cen.ndim != 2 or cen.shape[1] != self.signatures.shape[1]:
                raise ValueError(f"centroids must come with the signatures they were fitted on, one [n_workers, d] row "
                                 f"per worker of the signatures' dimension; got shape {cen.shape}")
            if self.n_workers is not None and cen.shape[0] != self.n_workers:
                raise ValueError(f"centroids must have one row per worker (n_workers={self.n_workers}); got {cen.shape[0]}")
            object.__setattr__(self, "centroids", cen)
        if self.domains is not None:
            object.__setattr__(self, "domains", np.atleast_1d(np.asarray(self.domains)))
        if self.kv_capacity_tokens is not None:
            object.__setattr__(self, "kv_capacity_tokens",
                               check_real("kv_capacity_tokens", self.kv_capacity_tokens, low=0, low_open=True))
        object.__setattr__(self, "seed", check_int("seed", self.seed, low=0))

    def provides(self) -> frozenset[str]:
        """Names of the fields this calibration holds (``seed`` always)."""
        return frozenset(f.name for f in fields(self) if getattr(self, f.name) is not None)


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
        plen = self.prompt_len
        if not (isinstance(plen, np.ndarray) and plen.dtype == np.int64):  # the simulators' hot path passes int64
            plen = check_int_array("prompt_len", np.atleast_1d(np.asarray(plen)) if np.ndim(plen) == 0 else plen,
                                   low=0, high=MAX_SEQUENCE_TOKENS + 1)
        self.prompt_len = plen = np.atleast_1d(plen)
        # a negative (or absurd) prompt length must not reach a router: it would be placed and priced as is
        if plen.size and (plen.min() < 0 or plen.max() > MAX_SEQUENCE_TOKENS):
            check_int_array("prompt_len", plen, low=0, high=MAX_SEQUENCE_TOKENS + 1)
        n = plen.shape[0]
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
    ``tags`` (e.g. ``"baseline"``, ``"eldr_paper"``), ``calibration_needs`` (items of
    :data:`CALIBRATION_FIELDS` :meth:`prepare` must get; an instance whose constructor was given that
    state needs fewer, and a prepared one none) and ``engine_queues`` (True: every request goes at once
    to an engine, even a full one, and waits in that engine's queue; the driver keeps those queues).
    A router whose ``requires`` depends on its parameters narrows it per instance; the class attribute
    is then the most it may read. Subclasses implement :meth:`_choose` for one request (``view`` kept up
    to date by the base class) or :meth:`_route` for batch policies, and :meth:`_prepare` when they fit
    state from a calibration.
    """

    name: ClassVar[str] = "router"
    requires: ClassVar[frozenset[str]] = frozenset({"prompt_len", "free_slots"})
    tags: ClassVar[frozenset[str]] = frozenset()
    calibration_needs: ClassVar[frozenset[str]] = frozenset()
    engine_queues: ClassVar[bool] = False

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.n_workers = 0
        self.rng = rng_from(seed)

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget all state and prepare for ``n_workers`` workers."""
        self.n_workers = check_int("n_workers", n_workers, low=1)
        self.rng = rng_from(self.seed if seed is None else seed)
        return self

    def prepare(self, calibration: RouterCalibration | None = None) -> Router:
        """Fit what the router needs from ``calibration`` (a no-op for routers without fitted state).

        Raises ``ValueError`` naming the items of :attr:`calibration_needs` that ``calibration`` lacks.
        Returns ``self``, prepared: :attr:`calibration_needs` is empty afterwards."""
        calibration = RouterCalibration() if calibration is None else calibration
        if not isinstance(calibration, RouterCalibration):
            raise ValueError(f"calibration must be a RouterCalibration; got {type(calibration).__name__}")
        missing = sorted(self.calibration_needs - calibration.provides())
        if missing:
            raise ValueError(f"router {self.name!r} cannot be prepared: the calibration lacks {missing} "
                             f"({'; '.join(CALIBRATION_FIELDS[m] for m in missing)}); it holds "
                             f"{sorted(calibration.provides())}")
        self._prepare(calibration)
        self.calibration_needs = frozenset()
        return self

    def _prepare(self, calibration: RouterCalibration) -> None:
        """Fit the router's state from ``calibration`` (which holds every item it needs)."""

    def _unprepared(self) -> ValueError:
        return ValueError(f"router {self.name!r} is not prepared: call prepare(RouterCalibration(...)) with "
                          f"{sorted(self.calibration_needs)} (or give them to its constructor)")

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
        if self.calibration_needs:
            raise self._unprepared()
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


def check_supplies(router: Router | type[Router], supplied: Collection[str], driver: str, *,
                   engine_queues: bool | None = None) -> None:
    """Refuse ``router`` (``ValueError`` naming the fields) when it requires a field that ``driver``
    does not supply, or, where ``engine_queues`` is given, when it needs per-engine queues that
    ``driver`` does not keep (``engine_queues=False``)."""
    supplied = _check_names(supplied, driver)
    missing = sorted(set(router.requires) - supplied)
    if missing:
        raise ValueError(f"router {router.name!r} requires {missing}, which {driver} does not supply "
                         f"(it supplies {sorted(supplied)})")
    if engine_queues is False and router.engine_queues:
        raise ValueError(f"router {router.name!r} dispatches every request to an engine's own queue, which {driver} "
                         "does not keep (it queues requests centrally until a worker has a free slot)")


#: The one registry of router names: name -> class, filled by :func:`register_router` as each router's
#: module is imported (:mod:`moelab.routers` imports them all).
ROUTERS: dict[str, type[Router]] = {}


def register_router(cls: type[Router]) -> type[Router]:
    """Class decorator: add ``cls`` to :data:`ROUTERS` under ``cls.name`` (validates ``requires`` and
    ``calibration_needs``; a second class under a taken name is refused)."""
    _check_names(cls.requires, f"{cls.__name__}.requires")
    _check_names(cls.calibration_needs, f"{cls.__name__}.calibration_needs", CALIBRATION_FIELDS)
    if ROUTERS.get(cls.name, cls) is not cls:
        raise ValueError(f"router name {cls.name!r} is taken by {ROUTERS[cls.name].__qualname__}")
    ROUTERS[cls.name] = cls
    return cls


def router_class(name: str) -> type[Router]:
    """The class registered under ``name`` (``ValueError`` listing the registry)."""
    if name not in ROUTERS:
        raise ValueError(f"router must be one of {sorted(ROUTERS)}; got {name!r} (moelab.routers registers every "
                         "router of the lab)")
    return ROUTERS[name]


def router_names(tag: str | None = None, *, supplied: Collection[str] | None = None,
                 engine_queues: bool | None = None, calibration: Collection[str] | None = None) -> tuple[str, ...]:
    """Registered names, sorted; only those tagged ``tag``, whose requirements ``supplied`` covers, that
    a driver keeping (``engine_queues=True``) or not keeping (False) engine queues can run, and whose
    :attr:`~Router.calibration_needs` the items in ``calibration`` cover (None: no filter)."""
    out = []
    for name, cls in sorted(ROUTERS.items()):
        if tag is not None and tag not in cls.tags:
            continue
        if supplied is not None and not set(cls.requires) <= set(supplied):
            continue
        if engine_queues is False and cls.engine_queues:
            continue
        if calibration is not None and not set(cls.calibration_needs) <= set(calibration):
            continue
        out.append(name)
    return tuple(out)


def available_routers() -> list[str]:
    """Names :func:`make_router` accepts (the keys of :data:`ROUTERS`)."""
    return sorted(ROUTERS)


def make_router(name: str, calibration: RouterCalibration | None = None, *,
                options: Mapping[str, Any] | None = None, **params: Any) -> Router:
    """Build a router by name (e.g. ``"jsq"``, ``"eldr"``, ``"br0"``) and prepare it.

    Parameters
    ----------
    name : str
        A key of :data:`ROUTERS`.
    calibration : RouterCalibration, optional
        Given: the router is prepared on it (``ValueError`` naming what it lacks). Without it, a router
        that needs one comes back unprepared (:meth:`Router.route` refuses it, naming what it needs).
    options : mapping, optional
        Settings a driver shares across the routers of a sweep; each goes only to routers whose
        constructor takes it (e.g. ELDR's ``tau`` in a sweep that also runs JSQ).
    **params
        Constructor parameters; every one must be accepted (``ValueError`` listing those accepted).
    """
    cls = router_class(name)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"router {name!r} takes no parameter(s) {unknown}; it takes {accepted}")
    shared = {k: v for k, v in (options or {}).items() if k in accepted and k not in params}
    router = cls(**shared, **params)
    if calibration is not None or not router.calibration_needs:
        router.prepare(calibration)
    return router


def requirements(names: Collection[str] | None = None) -> Mapping[str, frozenset[str]]:
    """What each router (all by default) requires."""
    return {n: router_class(n).requires for n in (sorted(ROUTERS) if names is None else names)}
