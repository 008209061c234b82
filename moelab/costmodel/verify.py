"""The verify cost of a speculative decoder: one target forward over ``q`` tokens, as a curve in ``q``.

One curve type (:class:`VerifyCost`, measured points linearly interpolated) and one fit
(:func:`fit_verify_cost`, a line ``fixed + per_token * q`` through noisy timings on the floor's
:func:`moelab.costmodel.fit.fit_linear`) serve every engine: HF transformers and vLLM alike. Curves
are cached per machine and model (:func:`cached_verify_cost`), since measuring one takes minutes. A cached
curve only seeds what a drafter plans with: :class:`OnlineVerifyCost` corrects it from the step times the
engine observes, so a curve probed while the machine was busy (or a machine whose load changes) is not
trusted for the life of the cache.
"""

from __future__ import annotations

import math
import os
import platform
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import FileFormatError, atomic_write_json, build_lock, read_json
from moelab._validate import check_finite_array
from moelab.costmodel.fit import fit_linear
from moelab.datasets import cache_dir

#: ``c(q)`` is tabulated for ``q = 0 .. TABLE_MAX_Q``: 64 draft tokens (the largest budget HD allows) + the bonus
TABLE_MAX_Q = 65


@dataclass
class VerifyCost:
    """Measured cost of one target forward over ``q`` tokens (ms), linearly interpolated in ``q``.

    Parameters
    ----------
    qs, ms : sequences
        Measured points: ``qs`` increasing and starting at 1, ``ms`` finite, > 0 and non-decreasing
        (verifying more tokens never costs less; a decreasing curve would make the planner over-draft).
    source : str
        Where the points come from (engine, machine, model, date).
    """

    qs: Sequence[int]
    ms: Sequence[float]
    source: str = ""

    def __post_init__(self) -> None:
        q = check_finite_array("qs", self.qs)  # named: strings or NaN say "qs must be ...", not numpy's words
        m = check_finite_array("ms", self.ms)
        if q.ndim != 1 or q.size < 1 or q.shape != m.shape or q[0] != 1 or np.any(np.diff(q) <= 0):
            raise ValueError("qs must be increasing, start at 1 and have one ms per entry")
        if not np.all(np.isfinite(m)) or np.any(m <= 0):
            raise ValueError("ms must be finite and > 0")
        if np.any(np.diff(m) < 0):
            raise ValueError(f"ms must not decrease as q grows (a forward over more tokens never costs less); got "
                             f"{[round(float(x), 3) for x in m]} at q = {[int(x) for x in q]}: fit noisy timings "
                             "with fit_verify_cost")
        self._q, self._m = q, m

    def __call__(self, q: np.ndarray | float) -> np.ndarray:
        q = np.asarray(q, dtype=float)
        out = np.interp(q, self._q, self._m)
        if self._q.size >= 2:  # beyond the last point: continue the last slope
            slope = (self._m[-1] - self._m[-2]) / (self._q[-1] - self._q[-2])
            out = np.where(q > self._q[-1], self._m[-1] + slope * (q - self._q[-1]), out)
        return out

    @property
    def table(self) -> list[float]:
        """``c(q)`` for ``q = 0 .. TABLE_MAX_Q`` as a plain list (the per-step planner reads it)."""
        t = getattr(self, "_table", None)
        if t is None:
            t = self._table = [float(x) for x in self(np.arange(TABLE_MAX_Q + 1))]
        return t

    def draft_threshold(self, budget: int) -> float:
        """A node probability that no draft node reaching it pays at ``budget``: when every node of a draft
        is less likely than this, ``K = 0`` beats every ``K <= budget`` (``(1 + K p) / c(K + 1) < 1 / c(1)``
        for ``p`` below ``(c(K + 1) / c(1) - 1) / K``; a 1e-9 relative margin covers rounding). Cached."""
        th = getattr(self, "_thresholds", None)
        if th is None:
            th = self._thresholds = {}
        v = th.get(budget)
        if v is None:
            t = self.table
            v = th[budget] = min((t[k + 1] / t[1] * (1 - 1e-9) - 1) / k for k in range(1, budget + 1))
        return v

    def relative(self, q: np.ndarray | float) -> np.ndarray:
        """Cost relative to one token (``c(q) / c(1)``)."""
        return self(q) / self._m[0]

    def as_dict(self) -> dict[str, Any]:
        """``{"qs", "ms", "source"}`` (JSON-ready; :func:`load_curve_json` reads it back)."""
        return {"qs": [int(x) for x in self._q], "ms": [float(x) for x in self._m], "source": self.source}


#: observations per ``q`` that :class:`OnlineVerifyCost` keeps (the median of an odd window; 4 of 9 can be outliers)
ONLINE_WINDOW = 9
#: observations at one ``q`` before its own median replaces the correction interpolated from its neighbours
ONLINE_MIN_OBS = 3
#: a per-``q`` median that moves by less than this (in log space, ~3 %) does not rebuild the table: the plan
#: is not that sensitive, and a rebuild (tens of microseconds) on every noisy step would sit on the hot path
ONLINE_TOLERANCE = 0.03
#: observations :class:`OnlineVerifyCost` holds before applying them even unread (bounds the list's memory)
ONLINE_PENDING = 256


class OnlineVerifyCost(VerifyCost):
    """A verify-cost curve that follows the machine: the start-up probe seeds it, the step times the engine
    observes correct it (:meth:`observe`).

    The estimate is ``c(q) = seed(q) * exp(r(q))``, where ``r(q)`` is the median of the last
    :data:`ONLINE_WINDOW` observed log ratios ``log(ms / seed(q))`` at that ``q``, once it has
    :data:`ONLINE_MIN_OBS` of them. A ``q`` with fewer takes ``r`` interpolated in ``q`` from the observed ones
    (flat beyond them): a cost-aware drafter observes mostly the few chain lengths its plan picks, and a seed
    probed on a busy machine that makes long chains look dear would otherwise never be tested on them. The
    median (in log space) is why: a preempted step (a 3-10x outlier) moves nothing until it is the typical
    step, and a curve that is off by a factor is corrected after ``ONLINE_WINDOW // 2 + 1`` steps at a ``q``.
    The table is kept non-decreasing (a running maximum in ``q``, as :class:`VerifyCost` requires). That is
    conservative: on a noisy machine a high median at a short chain lifts every longer one, so the plan errs
    toward drafting less; an engine's :class:`moelab.hd.policy.PolicyChoice` then runs the full chain instead
    where that is faster. The table is rebuilt only when a median moves by more than :data:`ONLINE_TOLERANCE`,
    so an observation costs a few microseconds on the drafting hot path.

    Parameters
    ----------
    seed : VerifyCost
        The probed curve (its points are the starting estimate).
    window, min_obs : int
        Observations kept per ``q``; observations before a ``q``'s own median is used.
    """

    def __init__(self, seed: VerifyCost, *, window: int = ONLINE_WINDOW, min_obs: int = ONLINE_MIN_OBS) -> None:
        if not isinstance(seed, VerifyCost):
            raise TypeError(f"seed must be a VerifyCost (e.g. moelab.costmodel.fit_verify_cost(qs, ms)); got "
                            f"{type(seed).__name__}")
        if type(window) is not int or window < 1:
            raise ValueError(f"window must be an integer >= 1; got {window!r}")
        if type(min_obs) is not int or not 1 <= min_obs <= window:
            raise ValueError(f"min_obs must be an integer in [1, window={window}]; got {min_obs!r}")
        super().__init__(list(seed.qs), list(seed.ms), seed.source)
        self.seed = seed
        self.window, self.min_obs = window, min_obs
        self._seed_table = np.asarray(seed.table, dtype=float)
        # a plain list: observe() runs on every engine step, where indexing a numpy array gives numpy floats
        # that make the window's sort and arithmetic several times slower than Python floats
        self._log_seed = [math.log(max(float(x), 1e-12)) for x in self._seed_table]
        self._obs: dict[int, deque[float]] = {}  # q -> its last `window` log ratios, oldest first
        self._r: dict[int, float] = {}  # q -> the median of its window (once it has min_obs)
        self.observations = 0
        self._rebuilds = 0
        self._table = [float(x) for x in self._seed_table]
        self._pending: list[tuple[int, float]] = []  # observations not yet applied, oldest first

    def observe(self, q: int, ms: float) -> None:
        """One step that verified ``q`` tokens (1 + draft) took ``ms`` milliseconds. Non-finite, non-positive
        or out-of-range observations are ignored (a clock can misbehave; the hot path must not raise).

        Applied when the curve is next read (:attr:`table`, a call, :meth:`draft_threshold`, ...), in the order
        observed, or once :data:`ONLINE_PENDING` wait: the same curve as applying each at once. A vLLM
        engine's full-chain steps read no curve, and on them an observation is a list append."""
        if not (ms > 0.0 and ms < float("inf")) or not 1 <= q <= TABLE_MAX_Q:
            return
        self.observations += 1
        pending = self._pending
        pending.append((q, ms))
        if len(pending) >= ONLINE_PENDING:
            self._settle()

    def _settle(self) -> None:
        """Apply the pending observations in order: each goes into its ``q``'s window, whose median rebuilds
        the table when it moved by more than :data:`ONLINE_TOLERANCE`."""
        pending, self._pending = self._pending, []
        obs, rs, log_seed, window, min_obs = self._obs, self._r, self._log_seed, self.window, self.min_obs
        for q, ms in pending:
            w = obs.get(q)
            if w is None:
                w = obs[q] = deque(maxlen=window)  # the oldest observation drops out by itself
            w.append(math.log(ms) - log_seed[q])
            if len(w) < min_obs:
                continue
            s = sorted(w)
            k = len(s)
            med = s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])
            old = rs.get(q)
            if old is None or abs(med - old) > ONLINE_TOLERANCE:
                rs[q] = med
                self._rebuild()

    @property
    def rebuilds(self) -> int:
        """Times the table was rebuilt (every observation applied)."""
        if self._pending:
            self._settle()
        return self._rebuilds

    def __call__(self, q: np.ndarray | float) -> np.ndarray:
        if self._pending:
            self._settle()
        return super().__call__(q)

    def draft_threshold(self, budget: int) -> float:
        if self._pending:
            self._settle()
        return super().draft_threshold(budget)

    def as_dict(self) -> dict[str, Any]:
        if self._pending:
            self._settle()
        return super().as_dict()

    def _rebuild(self) -> None:
        qs = np.fromiter(sorted(self._r), dtype=float)
        rs = np.array([self._r[int(q)] for q in qs])
        grid = np.arange(TABLE_MAX_Q + 1, dtype=float)
        t = np.maximum.accumulate(self._seed_table * np.exp(np.interp(grid, qs, rs)))
        self._table = t.tolist()
        self._q, self._m = grid[1:], t[1:]
        self._thresholds = {}
        self._rebuilds += 1

    @property
    def table(self) -> list[float]:
        """``c(q)`` for ``q = 0 .. TABLE_MAX_Q``: the current estimate."""
        if self._pending:
            self._settle()
        return self._table

    def corrections(self) -> dict[int, float]:
        """``{q: c(q) / seed(q)}`` for every ``q`` with its own median so far."""
        if self._pending:
            self._settle()
        return {q: float(math.exp(r)) for q, r in sorted(self._r.items())}


def fit_verify_cost(qs: Sequence[int], ms: Sequence[float], source: str = "", *,
                    first_point_apart: bool = False) -> VerifyCost:
    """A cost curve from noisy timings (e.g. minima over repeats on a shared machine).

    The non-negative least-squares line ``fixed + per_token * q`` through the points (one preempted
    measurement cannot make every larger ``q`` look expensive, as a running maximum would, nor a larger
    ``q`` look cheaper than a smaller one).

    Parameters
    ----------
    qs, ms : sequences
        Measured points (``qs`` increasing from 1).
    source : str
        Where the timings come from (the curve's ``source`` adds the fit and the raw points).
    first_point_apart : bool
        Keep ``q = 1`` as measured and fit the line through ``q >= 2`` only, never below ``q = 1``. On a
        CPU, one new token runs matrix-vector products and two or more run matrix products (a step up in
        cost, HF transformers); one line through every point hides that step and makes a 2-token
        verification look nearly free. Applies with at least 3 points starting at ``q = 1``.

    Returns
    -------
    VerifyCost
        Non-decreasing by construction (both coefficients are >= 0).
    """
    q = np.asarray(qs, dtype=float)
    m = np.asarray(ms, dtype=float)
    if q.ndim != 1 or q.shape != m.shape or q.size < 1:
        raise ValueError("qs and ms must be 1-D with one ms per q (at least one point)")
    if not np.all(np.isfinite(m)) or np.any(m <= 0):
        raise ValueError(f"ms must be finite and > 0; got {m.tolist()}")
    raw = f"the measured points {[round(float(x), 2) for x in m]} ms"
    if q.size < 2:
        return VerifyCost(q.astype(int).tolist(), m.tolist(), source)
    apart = first_point_apart and q.size >= 3 and q[0] == 1
    q_fit, m_fit = (q[1:], m[1:]) if apart else (q, m)
    line, _ = fit_linear(np.column_stack([np.ones_like(q_fit), q_fit]), m_fit, ("fixed_ms", "per_token_ms"),
                         relative=False)
    if apart:
        ms_out = [float(m[0]), *np.maximum(line.predict(np.column_stack([np.ones_like(q_fit), q_fit])), m[0]).tolist()]
        how = "q = 1 as measured (matrix-vector path), q >= 2 a linear fit a + b*q to"
    else:
        ms_out = np.maximum(line.predict(np.column_stack([np.ones_like(q), q])), 1e-3).tolist()
        how = "linear fit a + b*q to"
    return VerifyCost(q.astype(int).tolist(), ms_out, f"{source}; {how} {raw}")


def machine_id() -> str:
    """A short name for this machine (host, CPU model, cores): the key of cached cost curves."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    raw = f"{platform.node()}|{cpu}|{os.cpu_count()}"
    return "".join(c if c.isalnum() else "-" for c in raw)[:80]


def _check_origin(d: Any, path: Path, *, engine: str | None, model: str | None) -> None:
    """Refuse a cost file's dict ``d`` unless it was measured on this machine (and for ``engine`` and
    ``model`` when given): a curve from elsewhere would plan drafts for another machine."""
    if not isinstance(d, dict):
        raise ValueError(f"cost file {path} must hold a JSON object with qs, ms, machine, engine and model")
    here = machine_id()
    for field_name, want in (("machine", here), ("engine", engine), ("model", model)):
        got = d.get(field_name)
        if want is not None and got != want:
            raise ValueError(f"cost file {path} was measured with {field_name} {got!r}, not this {field_name} "
                             f"{want!r}: refused (measure this machine's curve, e.g. moelab bench hd with an "
                             f"empty cache)")


def cached_verify_cost(engine: str, model: str, measure: Callable[[], VerifyCost], *,
                       refresh: bool = False) -> VerifyCost:
    """The verify-cost curve of ``model`` on ``engine`` for this machine: read from the cache, or measured
    once with ``measure()`` and cached (``cache_dir()/hd/verify-cost/<engine>-<model>-<machine>.json``).

    The file records machine, engine and model; one that names another is refused (``ValueError``), never
    used. An entry written before files recorded them is vouched for by its name (built from the same three)
    and gains the fields; a damaged (or decreasing) entry is measured again."""
    origin = {"machine": machine_id(), "engine": engine, "model": model}
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{engine}-{model}-{origin['machine']}")
    path = cache_dir() / "hd" / "verify-cost" / f"{slug}.json"
    with build_lock(path):  # one process measures; another that asks meanwhile waits and reads its curve
        return _cached_or_measured(path, origin, engine, model, measure, refresh)


def _cached_or_measured(path: Path, origin: dict[str, str], engine: str, model: str,
                        measure: Callable[[], VerifyCost], refresh: bool) -> VerifyCost:
    if path.is_file() and not refresh:
        try:
            d = read_json(path)
        except (OSError, ValueError):
            d = None  # a damaged cache entry is measured again
        if isinstance(d, dict):
            legacy = not any(k in d for k in origin)
            if not legacy:
                _check_origin(d, path, engine=engine, model=model)
            try:
                vc = VerifyCost(d["qs"], d["ms"], d.get("source", ""))
            except (KeyError, TypeError, ValueError):
                vc = None  # a damaged (or decreasing) cache entry is measured again
            if vc is not None:
                if legacy:
                    atomic_write_json(path, {**vc.as_dict(), **origin})
                return vc
    vc = measure()
    atomic_write_json(path, {**vc.as_dict(), **origin})
    return vc


def load_curve_json(path: str | Path, *, engine: str | None = None, model: str | None = None) -> VerifyCost:
    """A cost curve from a JSON file ``{"qs": [...], "ms": [...], "source", "machine", "engine", "model"}``
    (as :func:`cached_verify_cost` writes), refused with a ``ValueError`` unless it was measured on this
    machine and, when given, with ``engine`` for ``model``."""
    path = Path(path)
    d = read_json(path, max_bytes=1 << 20)  # size and nesting bounded; a cost curve is a few hundred bytes
    _check_origin(d, path, engine=engine, model=model)
    if "qs" not in d or "ms" not in d:
        raise FileFormatError(path, "qs" if "qs" not in d else "ms", "is missing (a cost curve has qs and ms)")
    try:
        return VerifyCost(d["qs"], d["ms"], str(d.get("source", "")))
    except ValueError as exc:
        raise FileFormatError(path, None, f"is not a valid cost curve ({exc})") from None


__all__ = ["ONLINE_MIN_OBS", "ONLINE_PENDING", "ONLINE_TOLERANCE", "ONLINE_WINDOW", "TABLE_MAX_Q", "OnlineVerifyCost", "VerifyCost", "cached_verify_cost", "fit_verify_cost", "load_curve_json", "machine_id"]
