"""The router contract: ``route(batch, view) -> worker per request`` (``-1`` = keep waiting).

* A router declares what it reads: :attr:`Router.requires`, a set of names from :data:`FIELDS`
  (request fields live on :class:`RequestBatch`, cluster fields on :class:`ClusterView`).
* A driver (a simulator, the proxy, an analysis) says what it supplies and calls
  :func:`check_supplies` once before it starts: a router that needs a field the driver cannot fill is
  refused with a ``ValueError`` naming the field. :meth:`Router.route` checks again per call that
  the required fields are present (a cheap ``is None`` test).
* The worker-count guard lives once, in :meth:`Router.route`; subclasses override :meth:`Router.route_batch`
  (a whole batch) or :meth:`Router.choose` (one request at a time, the view kept up to date), and
  :meth:`Router.prepare_state` when they fit state from a calibration.
* Drivers call a router through :func:`call_router`: an exception it raises, or an answer that is not one
  integer worker id in range per request (:func:`check_routed`), becomes a :class:`RouterError` naming the
  router and what it returned, before any request of the batch is placed.
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

#: The most workers (decode instances, DP ranks, backends) a router is prepared for: routers allocate per-worker
#: state in :meth:`Router.reset`, and no cluster a simulator or proxy drives comes near it.
MAX_WORKERS = 1 << 16


def _whole_counts(name: str, value: Any) -> np.ndarray:
    """``value`` as int64 counts; a float array must hold whole, finite numbers (a NaN would cast to garbage)."""
    a = np.asarray(value)
    if a.dtype.kind not in "iub":
        if a.dtype.kind != "f" or not np.isfinite(a).all() or (a != np.round(a)).any():
            raise ValueError(f"{name} must be an array of whole numbers (one per worker); got {str(value)[:60]!r}")
    return a.astype(np.int64, copy=False)


#: What a router answers for a request it keeps waiting (no worker has a free slot).
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
# the fields a driver may leave None: a router reads one only if it declares it (and the driver then supplies it)
_OPTIONAL = tuple(sorted(set(FIELDS) - _ALWAYS))


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
            object.__setattr__(self, "n_workers", check_int("n_workers", self.n_workers, low=1, high=MAX_WORKERS))
        if self.signatures is not None:
            try:
                sig = np.asarray(self.signatures, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"signatures must be a finite [n >= 1, d] array of numbers; got "
                                 f"{type(self.signatures).__name__} {str(self.signatures)[:40]!r}") from None
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
    """The running requests of a cluster, one entry per running request (routers that project future
    load read it, e.g. BalanceRoute's BR-H; field ``active_requests`` of :data:`FIELDS`).

    Attributes
    ----------
    worker : ndarray of int64, shape (n,)
        The worker each running request is on.
    workload : ndarray of int64, shape (n,)
        KV tokens its coming decode step reads (prompt plus tokens generated so far).
    age : ndarray of int64, shape (n,)
        Tokens it has generated so far.
    prompt_len : ndarray of int64, shape (n,)
        Its prompt tokens.
    prompt_key : ndarray, shape (n,), optional
        Hash of its prompt, where the driver knows it (length predictors keyed by prompt).
    output_len : ndarray of int64, shape (n,), optional
        Its true output length (oracle predictors only; None in a live deployment).
    """

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
    """What a router may see of ``G`` workers when it decides (the cluster fields of :data:`FIELDS`).

    Every per-worker array has shape ``(G,)`` and dtype int64. A router reads it and never modifies it:
    drivers pass their live state, and a router that books several requests in one call books them onto
    its own :meth:`copy` with :meth:`admit` (as :meth:`Router.route_batch` does).

    Attributes
    ----------
    active : ndarray of int64, shape (G,)
        Requests running (decoding) on each worker.
    kv_tokens : ndarray of int64, shape (G,)
        KV-cache tokens each worker holds: its running requests' prompts plus generated tokens, and (in
        the decode-cluster simulator) the prompts queued there, whose KV arrives with them.
    free_slots : ndarray of int64, shape (G,)
        Batch slots still free on each worker. Where a worker queues without limit (the decode-cluster
        simulator, engine queues) it is a large number (``2**30`` there), so every worker is open; the
        ``open_`` mask :meth:`Router.choose` gets is ``free_slots > 0``.
    waiting : ndarray of int64, shape (G,)
        Requests queued at each worker but not yet running (zeros where the driver queues centrally).
    time_s : float
        The driver's clock in seconds (simulated time; wall time in the proxy).
    step : int
        The driver's step counter (decode steps in the DP simulator; 0 where it has none).
    active_requests : ActiveRequests, optional
        Per running request its worker, workload, age and prompt (None unless a router requires it).
    waited_steps : ndarray of int64, shape (n_requests,), optional
        Per request of the batch being routed, the routing steps it has already waited (the DP
        simulator's starvation guard; None elsewhere).
    waiting_tokens : ndarray of int64, shape (G,), optional
        Prompt tokens of the requests queued at each worker (drivers with per-worker queues).
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
        self.active = _whole_counts("active", self.active)
        if self.active.ndim != 1:
            raise ValueError(f"active must be a 1-d array with one entry per worker; got shape {self.active.shape}")
        g = self.active.shape[0]
        self.kv_tokens = _whole_counts("kv_tokens", self.kv_tokens)
        self.free_slots = _whole_counts("free_slots", self.free_slots)
        self.waiting = np.zeros(g, np.int64) if self.waiting is None else _whole_counts("waiting", self.waiting)
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
    """Requests to place, in arrival order (the request fields of :data:`FIELDS`).

    Only ``prompt_len`` is required; a driver fills the rest where it knows them, and a router declares
    in :attr:`Router.requires` which it reads (the driver refuses it up front when one is missing).

    Attributes
    ----------
    prompt_len : ndarray of int64, shape (n,)
        Prompt tokens per request (the KV cache it brings), 0 .. ``MAX_SEQUENCE_TOKENS``.
    signature : ndarray, shape (n, d), optional
        Expert-routing signature per request (ELDR; see :mod:`moelab.eldr.signature`). Finite; kept
        float32 when given as float32, else float64.
    domain : ndarray of int, shape (n,), optional
        Integer domain / task label (oracle routers).
    output_len : ndarray of int64, shape (n,), optional
        True output length (oracles and oracle length predictors only; unknown in a live deployment).
    request_id : ndarray of int, shape (n,)
        The driver's id of each request (default ``0 .. n-1``).
    prompt_key : ndarray, shape (n,), optional
        Hash identifying a repeated prompt (prefix-cache-aware policies, predictors keyed by prompt).
    prefix_hashes : tuple of tuple, optional
        Per request, the hashes of its prompt's KV blocks.
    """

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


class RouterError(ValueError):
    """A router broke the contract: it raised, or returned something other than one integer worker id
    per request in range. The message names the router and what it returned; a driver raises it before
    it places any request of the batch, so nothing is lost or placed twice. A ``ValueError``, so code that
    catches bad input catches it too."""


def _router_label(router: Router) -> str:
    return f"router {getattr(router, 'name', '?')!r} ({type(router).__qualname__})"


def check_routed(router: Router, where: Any, n_requests: int, n_workers: int, *, allow_waiting: bool = True,
                 free_slots: np.ndarray | None = None, unit: str = "worker") -> np.ndarray:
    """Validate what a router returned for a batch; the one check every driver runs.

    Parameters
    ----------
    router : Router
        The router that answered (named in the error).
    where : array-like
        Its answer: one worker id per request.
    n_requests : int
        Requests in the batch (the answer's required length).
    n_workers : int
        Workers ``G``: an id must be in ``[0, G)``, or ``-1`` (keep waiting) where ``allow_waiting``.
    allow_waiting : bool
        Whether ``-1`` is allowed (False for drivers that must place every request at once).
    free_slots : ndarray, optional
        Free slots per worker; given, a worker may receive at most that many requests of the batch.
    unit : str
        What the driver calls a worker in its messages (``"rank"`` in a DP group).

    Returns
    -------
    ndarray of int64, shape (n_requests,)

    Raises
    ------
    RouterError
        Naming the router and what it returned: the wrong shape, non-integer values, an id out of range,
        or more requests than a worker has free slots.
    """
    label = _router_label(router)
    arr = np.asarray(where) if not isinstance(where, np.ndarray) else where
    if arr.shape != (n_requests,):
        raise RouterError(f"{label} returned {_describe(where)} of shape {arr.shape}; expected one {unit} id per request, "
                          f"shape ({n_requests},)")
    if arr.dtype.kind not in "iu":
        raise RouterError(f"{label} returned {arr.dtype} values {_show(arr)}; {unit} ids must be integers "
                          "(e.g. np.int64)")
    low = UNASSIGNED if allow_waiting else 0
    if n_requests and (arr.min() < low or arr.max() >= n_workers):
        bad = arr[(arr < low) | (arr >= n_workers)]
        allowed = f"[0, {n_workers})" + (" or -1 (keep waiting)" if allow_waiting else "")
        raise RouterError(f"{label} returned invalid {unit} ids {_show(bad)} (out of range; allowed: {allowed})")
    arr = arr.astype(np.int64, copy=False)
    if free_slots is not None and n_requests:
        placed = arr[arr >= 0]
        if placed.size:
            per = np.bincount(placed, minlength=n_workers)
            over = np.flatnonzero(per > free_slots)
            if over.size:
                w = int(over[0])
                raise RouterError(f"{label} over-filled a {unit}: it placed {int(per[w])} requests on {unit} {w}, "
                                  f"which has {int(free_slots[w])} free slot(s) (returned {_show(arr)})")
    return arr


def _show(x: Any, most: int = 8) -> str:
    try:
        flat = np.asarray(x).ravel()
    except Exception:  # noqa: BLE001 - whatever a user router returned, describe it without failing
        return repr(x)[:80]
    text = ", ".join(repr(v.item() if hasattr(v, "item") else v) for v in flat[:most])
    return f"[{text}{', ...' if flat.size > most else ''}]"


def _describe(x: Any) -> str:
    """What a router returned, as it returned it: a scalar as itself with its type (``7 (int)``, ``7.0
    (float64)``, ``None``), a sequence or array as its values (:func:`_show`) with its type."""
    if x is None or isinstance(x, (bool, int, float, str, bytes, np.generic)):
        value = x.item() if isinstance(x, np.generic) else x
        return repr(x)[:80] if x is None else f"{value!r:.80} ({type(x).__name__})"
    return f"{_show(x)} ({type(x).__name__})"


def _undeclared_hint(router: Router, batch: RequestBatch, view: ClusterView, exc: Exception) -> str:
    """When a router fails the way reading an absent field fails (a ``None`` where it expected an array), name
    the fields this driver left ``None`` that the router does not declare in :attr:`Router.requires`: a
    router reads only what it declares, and a declared field the driver cannot supply is refused up front."""
    if not isinstance(exc, (TypeError, AttributeError, IndexError)):
        return ""
    declared = getattr(router, "requires", frozenset())
    absent = [f"{'RequestBatch' if f in _BATCH_FIELDS else 'ClusterView'}.{f}" for f in _OPTIONAL
              if f not in declared and getattr(batch if f in _BATCH_FIELDS else view, f, None) is None]
    if not absent:
        return ""
    return (f" (this driver leaves {', '.join(absent)} None, and the router does not declare them in its requires: "
            f"a router must list every field it reads in requires (moelab.routing.FIELDS); then a driver that "
            f"cannot supply one refuses the router up front, naming the field)")


def call_router(router: Router, batch: RequestBatch, view: ClusterView, *, allow_waiting: bool = True,
                free_slots: np.ndarray | None = None, unit: str = "worker") -> np.ndarray:
    """``router.route(batch, view)`` as a driver calls it: an exception the router raises comes back as a
    :class:`RouterError` naming it (the original chained), and the answer is checked by
    :func:`check_routed`. The simulators call this; a driver of your own should too.

    Returns
    -------
    ndarray of int64, shape (len(batch),)
    """
    try:
        where = router.route(batch, view)
    except RouterError:
        raise
    except Exception as exc:
        raise RouterError(f"{_router_label(router)} raised {type(exc).__name__}: {exc}"
                          + _undeclared_hint(router, batch, view, exc)) from exc
    return check_routed(router, where, len(batch), view.n_workers, allow_waiting=allow_waiting,
                        free_slots=free_slots, unit=unit)


class Router:
    """Base class of every router: subclass it and override :meth:`choose` or :meth:`route_batch`.

    A router places requests on workers: :meth:`route` takes a :class:`RequestBatch` (the requests, in
    arrival order) and a :class:`ClusterView` (the workers' state) and returns one worker id per request
    (``-1``: keep it waiting). Drivers (the simulators, ``moelab serve-router``) call :meth:`route`; a
    router of your own overrides one of two methods:

    * :meth:`choose` -- one request at a time: return the worker of request ``i``; the base class keeps a
      copy of the view up to date between requests (:meth:`ClusterView.admit`) and passes ``open_``, the
      mask of workers with a free slot (never all False: the base class stops when none is open).
    * :meth:`route_batch` -- the whole batch at once (a policy that looks at every waiting request), e.g.
      BalanceRoute's BR-0.

    and, when it fits state from a calibration, :meth:`prepare_state`. Decorate the class with
    :func:`register_router` to give it a name (``make_router("mine")``, ``moelab sweep``, the simulators'
    router lists).

    Attributes
    ----------
    name : str
        Registry name (class attribute), e.g. ``"jsq"``.
    requires : frozenset of str
        Fields of :data:`FIELDS` the router reads (class attribute; default ``prompt_len`` and
        ``free_slots``). Drivers refuse a router needing a field they cannot fill, naming it. A router
        whose needs depend on its parameters narrows it per instance; the class attribute is the most it
        may read.
    tags : frozenset of str
        Labels such as ``"baseline"`` or ``"eldr_paper"`` (:func:`router_names` filters by them).
    calibration_needs : frozenset of str
        Items of :data:`CALIBRATION_FIELDS` :meth:`prepare` must get; an instance given that state by its
        constructor needs fewer, a prepared one none.
    engine_queues : bool
        True: every request goes at once to an engine, even a full one, and waits in that engine's queue
        (vLLM's DP balancers); the driver keeps those queues. Default False: the driver keeps a central
        queue and :meth:`route` may answer ``-1``.
    n_workers : int
        Workers the router was reset for (0 before the first :meth:`reset` or :meth:`route`).
    rng : numpy.random.Generator
        Seeded generator for tie-breaks and random policies (re-seeded by :meth:`reset`).

    Examples
    --------
    >>> import numpy as np
    >>> from moelab.routing import ClusterView, RequestBatch, Router
    >>> class FewestKV(Router):
    ...     name = "fewest_kv_example"
    ...     requires = frozenset({"prompt_len", "free_slots", "kv_tokens"})
    ...     def choose(self, batch, i, view, open_):
    ...         return self.argmin_tiebreak(view.kv_tokens, open_)
    >>> FewestKV().route(RequestBatch([10, 20]), ClusterView.idle(2)).tolist()
    [0, 1]
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
        """Forget all state and prepare for ``n_workers`` workers.

        Drivers call it before a run. Override it (calling ``super().reset(n_workers, seed)`` first) when
        the router keeps per-run state such as a round-robin pointer; return ``self``.

        Parameters
        ----------
        n_workers : int
            Workers of the coming run (>= 1).
        seed : int, optional
            Re-seeds :attr:`rng` (default: the constructor's ``seed``).
        """
        self.n_workers = check_int("n_workers", n_workers, low=1, high=MAX_WORKERS)
        self.rng = rng_from(self.seed if seed is None else seed)
        return self

    def prepare(self, calibration: RouterCalibration | None = None) -> Router:
        """Fit what the router needs from ``calibration`` (a no-op for routers without fitted state).

        Checks that ``calibration`` holds every item of :attr:`calibration_needs`, then calls
        :meth:`prepare_state`.

        Parameters
        ----------
        calibration : RouterCalibration, optional
            What the driver knows before routing starts.

        Returns
        -------
        Router
            ``self``, prepared: :attr:`calibration_needs` is empty afterwards.

        Raises
        ------
        ValueError
            Naming the items of :attr:`calibration_needs` that ``calibration`` lacks.
        """
        calibration = RouterCalibration() if calibration is None else calibration
        if not isinstance(calibration, RouterCalibration):
            raise ValueError(f"calibration must be a RouterCalibration; got {type(calibration).__name__}")
        missing = sorted(self.calibration_needs - calibration.provides())
        if missing:
            raise ValueError(f"router {self.name!r} cannot be prepared: the calibration lacks {missing} "
                             f"({'; '.join(CALIBRATION_FIELDS[m] for m in missing)}); it holds "
                             f"{sorted(calibration.provides())}")
        self.prepare_state(calibration)
        self.calibration_needs = frozenset()
        return self

    def prepare_state(self, calibration: RouterCalibration) -> None:
        """Override to fit the router's state from ``calibration`` (called by :meth:`prepare`).

        ``calibration`` holds every item of :attr:`calibration_needs` (checked before the call). The
        default does nothing.

        Parameters
        ----------
        calibration : RouterCalibration
            What the driver knows before routing starts.
        """

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
        """Assign each request of ``batch`` to a worker; what drivers call (do not override it).

        Checks the router is prepared, adopts (or checks) the view's worker count, checks the fields of
        :attr:`requires` are present, then calls :meth:`route_batch`. Drivers check the answer with
        :func:`check_routed` (:func:`call_router`).

        Parameters
        ----------
        batch : RequestBatch
            The requests to place, in arrival order.
        view : ClusterView
            The workers' state; the router must not modify it (it books onto :meth:`ClusterView.copy`).

        Returns
        -------
        ndarray of int64, shape (len(batch),)
            The worker of each request; ``-1``: keep it waiting (no worker has a free slot).
        """
        if self.calibration_needs:
            raise self._unprepared()
        self._bind(view)
        self._check_present(batch, view)
        return self.route_batch(batch, view)

    def route_batch(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """Override to place a whole batch at once; the default calls :meth:`choose` per request.

        The default books each chosen request onto a copy of ``view`` (:meth:`ClusterView.admit`), so
        :meth:`choose` sees the requests already placed, and stops (leaving ``-1``) once no worker has a
        free slot.

        Parameters
        ----------
        batch : RequestBatch
            The requests to place, in arrival order (its fields of :attr:`requires` are present).
        view : ClusterView
            The workers' state (read it; book onto :meth:`ClusterView.copy`, never onto ``view``).

        Returns
        -------
        ndarray of int64, shape (len(batch),)
            A worker in ``[0, view.n_workers)`` per request, or ``-1`` to keep it waiting (not allowed
            for :attr:`engine_queues` routers). A worker may get at most its ``free_slots`` requests.
        """
        work = view.copy()
        out = np.full(len(batch), UNASSIGNED, dtype=np.int64)
        for i in range(len(batch)):
            open_ = work.free_slots > 0
            if not open_.any():
                break
            w = self.choose(batch, i, work, open_)
            if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or not 0 <= w < work.n_workers:
                raise RouterError(f"{_router_label(self)} choose() returned {_describe(w)} for request {i}; "
                                  f"expected one integer worker id in [0, {work.n_workers})")
            out[i] = w
            work.admit(int(w), int(batch.prompt_len[i]))
        return out

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        """Override to pick the worker of one request, ``batch`` row ``i``.

        Parameters
        ----------
        batch : RequestBatch
            The batch being placed (read row ``i`` of its fields, e.g. ``batch.prompt_len[i]``).
        i : int
            The request's row.
        view : ClusterView
            The workers' state, with the batch's earlier requests already booked.
        open_ : ndarray of bool, shape (n_workers,)
            Workers with a free slot (``view.free_slots > 0``); at least one is True.

        Returns
        -------
        int
            A worker in ``[0, view.n_workers)``, normally one where ``open_`` is True.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must override choose() (one request) or "
                                  "route_batch() (a whole batch)")

    def argmin_tiebreak(self, score: np.ndarray, open_: np.ndarray) -> int:
        """Index of the smallest ``score`` among open workers, ties broken by a seeded random draw.

        Parameters
        ----------
        score : ndarray, shape (n_workers,)
            Lower is better.
        open_ : ndarray of bool, shape (n_workers,)
            Candidate workers (at least one True).

        Returns
        -------
        int
        """
        masked = np.where(open_, score, np.inf)
        best = np.flatnonzero(masked == masked.min())
        return int(best[0] if best.size == 1 else best[self.rng.integers(best.size)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seed={self.seed})"


def _router_requires(router: Router | type[Router]) -> frozenset[str]:
    """``router.requires`` checked: a collection (not a string) of :data:`FIELDS` names."""
    name = getattr(router, "name", type(router).__qualname__)
    requires = getattr(router, "requires", None)
    if isinstance(requires, (str, bytes)) or not isinstance(requires, Collection) \
            or not all(isinstance(f, str) for f in requires):
        raise TypeError(f"router {name!r}: requires must be a set of field names from moelab.routing.FIELDS, e.g. "
                        f"frozenset({{'prompt_len', 'signature'}}); got {type(requires).__name__} {requires!r:.60}")
    unknown = sorted(set(requires) - set(FIELDS))
    if unknown:
        raise ValueError(f"router {name!r} requires unknown field(s) {unknown}; fields: {sorted(FIELDS)}")
    return frozenset(requires)


def check_supplies(router: Router | type[Router], supplied: Collection[str], driver: str, *,
                   engine_queues: bool | None = None) -> None:
    """Refuse ``router`` (``ValueError`` naming the fields) when it requires a field that ``driver``
    does not supply, or, where ``engine_queues`` is given, when it needs per-engine queues that
    ``driver`` does not keep (``engine_queues=False``). Every driver calls it before it starts, so this is
    where :attr:`Router.requires` is enforced: a router whose ``requires`` is not a collection of
    :data:`FIELDS` names (a bare string, a typo) is refused here too, by name.

    Parameters
    ----------
    router : Router or type of Router
        The router (or its class).
    supplied : collection of str
        The :data:`FIELDS` the driver fills.
    driver : str
        The driver, in words (named in the error).
    engine_queues : bool, optional
        Whether the driver keeps per-engine queues (None: not checked).

    Raises
    ------
    ValueError
        Naming the router and the fields it requires that the driver does not supply.
    TypeError
        When ``router.requires`` is not a collection of field names.
    """
    supplied = _check_names(supplied, driver)
    requires = _router_requires(router)
    missing = sorted(requires - supplied)
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
    _router_requires(cls)
    _check_names(cls.calibration_needs, f"{cls.__name__}.calibration_needs", CALIBRATION_FIELDS)
    if ROUTERS.get(cls.name, cls) is not cls:
        raise ValueError(f"router name {cls.name!r} is taken by {ROUTERS[cls.name].__qualname__}")
    ROUTERS[cls.name] = cls
    return cls


def router_class(name: str) -> type[Router]:
    """The class registered under ``name`` (``ValueError`` listing the registry)."""
    if not isinstance(name, str) or name not in ROUTERS:
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
