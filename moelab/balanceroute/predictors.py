"""Remaining-length predictors for BR-H.

Each predictor answers, for active requests with prompt length ``s``, ``age`` tokens generated so far
and (for the oracle) the true output length: the probability ``p_fin`` that the request finishes
within the next ``H`` steps and the mean remaining length ``mu_rem`` given that it does. BR-H turns
them into the truncated remaining length ``c = (1 - p_fin) * (H + 1) + p_fin * mu_rem`` (the number
of projected steps, h = 0..H, the request is expected to stay).

* :class:`OraclePredictor` — true lengths (an upper bound, not deployable).
* :class:`SurvivalPredictor` — the empirical output-length distribution conditioned on ``O > age``.
* :class:`ExactMatchPredictor` — the same per prompt-text hash (``prompt_key``, e.g. ShareGPT via
  :mod:`moelab.balanceroute.sharegpt`), falling back to Survival when a key has fewer than ``min_count``
  samples. A trace without prompt text (Azure: its ``prompt_key`` is the prompt length) is refused.
* :class:`LearnedPredictor` — scikit-learn gradient-boosted finish-within-H classifier and
  remaining-length regressor on (prompt length, age), tabulated on a grid for fast lookup.

All are fitted on a training part of a trace that is disjoint from the simulated part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.metrics import roc_auc_score
from threadpoolctl import threadpool_limits

from moelab._validate import _as_array, check_choice, check_instance, check_int, check_product, rng_from
from moelab.traces import RequestTrace

#: longest lookahead a predictor is fitted for: BR-H's own cap (:class:`moelab.balanceroute.routers.BRH`)
MAX_HORIZON = 1024
#: most cells of the learned predictor's lookup grid (prompt bins x ages): 2 float64 tables of 128 MiB
MAX_LEARNED_GRID = 1 << 24


class Predictor:
    """How long a running request will stay: the base class of BR-H's predictors, and the one to subclass
    for a predictor of your own.

    Fit it on the training part of a trace with BR-H's horizon ``H`` (``fit(train, H)``, which returns
    ``self``; :func:`make_predictor` does this for the shipped ones), then pass it as
    ``BRH(horizon=H, predictor=...)``. At every routing decision BR-H calls :meth:`truncated_remaining` on the
    active requests, which calls :meth:`predict`: the one method a subclass must write (and :meth:`fit`, calling
    ``super().fit``, if it learns anything).

    Attributes
    ----------
    name : str
        The predictor's label in tables and figures.
    horizon : int
        ``H``, the steps ahead BR-H projects, set by :meth:`fit` (0 before).
    """

    name = "predictor"
    horizon: int = 0

    def fit(self, train: RequestTrace | None, horizon: int) -> Predictor:
        """Record ``horizon`` (``[0, MAX_HORIZON]``) and check ``train`` (a RequestTrace or None)."""
        self.horizon = check_int("horizon", horizon, low=0, high=MAX_HORIZON, high_name="MAX_HORIZON",
                                 why="BR-H's own cap: it projects every running request over horizon + 1 steps")
        if train is not None:  # an AttributeError on .output_len before
            check_instance("train", train, RequestTrace, "a RequestTrace (the training part of a trace) or None")
        return self

    def predict(self, prompt_len: np.ndarray, age: np.ndarray, prompt_key: np.ndarray | None = None,
                output_len: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(p_fin, mu_rem)`` per active request: the probability it finishes within ``H`` more steps, and
        its expected remaining steps given that it does.

        Parameters
        ----------
        prompt_len, age : ndarray
            Each active request's prompt length and tokens generated so far (1-d, one entry per request).
        prompt_key : ndarray, optional
            A key per request identifying its prompt (for predictors that have seen the prompt before).
        output_len : ndarray, optional
            True output lengths (only an oracle may read them).

        Returns
        -------
        p_fin, mu_rem : ndarray
            Both 1-d like ``age``; ``p_fin`` in [0, 1], ``mu_rem`` in [0, H] (as every shipped predictor gives).
        """
        raise NotImplementedError

    def truncated_remaining(self, prompt_len: np.ndarray, age: np.ndarray, prompt_key: np.ndarray | None = None,
                            output_len: np.ndarray | None = None) -> np.ndarray:
        """``c = (1 - p_fin) * (H + 1) + p_fin * mu_rem``: projected steps the request stays (h = 0..H)."""
        p, mu = self.predict(prompt_len, age, prompt_key, output_len)
        return (1.0 - p) * (self.horizon + 1) + p * mu


def _states(prompt_len: object, age: object, output_len: object = None) -> tuple[np.ndarray, ...]:
    """The active requests' ``prompt_len`` and ``age`` (and ``output_len`` when given) as float64 1-d arrays of
    one length, finite and >= 0: a negative age used to index a lookup table from its end (a wrong number,
    silently), a NaN to end in numpy's words. Cheap (one min/max per array): it runs on every routing call."""
    out = []
    for name, value in (("prompt_len", prompt_len), ("age", age), ("output_len", output_len)):
        if value is None and name == "output_len":
            break
        try:
            a = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a 1-d array of numbers (one per active request); got "
                             f"{type(value).__name__} {value!r:.60}") from None
        if a.ndim != 1 or (out and a.shape != out[0].shape):
            raise ValueError(f"{name} must be a 1-d array with one entry per active request"
                             f"{f' ({out[0].size})' if out else ''}; got shape {a.shape}")
        if a.size and not (a.min() >= 0 and a.max() < np.inf):  # NaN fails both comparisons
            bad = a[~(np.isfinite(a) & (a >= 0))][0].item()
            raise ValueError(f"{name} must be finite and >= 0; got {bad!r}")
        out.append(a)
    return tuple(out)


class OraclePredictor(Predictor):
    """True remaining lengths (needs ``output_len``)."""

    name = "oracle"

    def predict(self, prompt_len, age, prompt_key=None, output_len=None):
        if output_len is None:
            raise ValueError("the oracle predictor needs output_len (true lengths) of the active requests")
        _, age, output_len = _states(prompt_len, age, output_len)
        rem = output_len - age
        fin = rem <= self.horizon
        return fin.astype(np.float64), np.where(fin, rem, 0.0)


def _conditional(sorted_out: np.ndarray, prefix: np.ndarray, lo: np.ndarray, hi: np.ndarray, start: np.ndarray,
                 stop: np.ndarray, age: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For segments ``[start, stop)`` of a sorted array: n(O > age), P(O <= age+H | O > age) and
    E[O - age | age < O <= age+H] — all via searchsorted on the segment bounds (``lo``/``hi`` are
    the positions of ``age`` and ``age + H``)."""
    n_alive = stop - lo
    n_fin = hi - lo
    s = prefix[hi] - prefix[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(n_alive > 0, n_fin / np.maximum(n_alive, 1), 0.0)
        mu = np.where(n_fin > 0, s / np.maximum(n_fin, 1) - age, 0.0)
    return n_alive, p, mu


@dataclass
class SurvivalPredictor(Predictor):
    """Empirical output-length distribution of the training trace, conditioned on ``O > age``.
    A request older than every training sample is assumed to keep running (``p_fin = 0``)."""

    name = "survival"
    sorted_out: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def fit(self, train: RequestTrace | None, horizon: int) -> SurvivalPredictor:
        super().fit(train, horizon)
        if train is None or len(train) == 0:
            raise ValueError("the survival predictor needs a non-empty training trace")
        self.sorted_out = np.sort(train.output_len.astype(np.float64))
        self._prefix = np.concatenate([[0.0], np.cumsum(self.sorted_out)])
        return self

    def predict(self, prompt_len, age, prompt_key=None, output_len=None):
        _, age = _states(prompt_len, age)
        lo = np.searchsorted(self.sorted_out, age, side="right")
        hi = np.searchsorted(self.sorted_out, age + self.horizon, side="right")
        n = np.full(age.shape, self.sorted_out.size)
        _, p, mu = _conditional(self.sorted_out, self._prefix, lo, hi, np.zeros_like(n), n, age, self.horizon)
        return p, mu


@dataclass
class ExactMatchPredictor(Predictor):
    """Per-prompt-key empirical CDF of output lengths, with :class:`SurvivalPredictor` as fallback
    for keys seen fewer than ``min_count`` times or with no sample still alive at this age."""

    name = "exact_match"
    min_count: int = 3

    def fit(self, train: RequestTrace | None, horizon: int) -> ExactMatchPredictor:
        super().fit(train, horizon)
        self.min_count = check_int("min_count", self.min_count, low=1)
        if train is None or len(train) == 0:
            raise ValueError("the exact-match predictor needs a non-empty training trace")
        if train.prompt_key is None or np.array_equal(train.prompt_key, train.prompt_len):
            raise ValueError(f"the exact-match predictor keys on prompt-text hashes (prompt_key), but trace "
                             f"{train.source!r} has none (Azure traces carry no text: their key is the prompt "
                             f"length); use a trace with text, e.g. moelab.balanceroute.sharegpt.sharegpt_trace")
        key = train.prompt_key
        self.fallback = SurvivalPredictor().fit(train, horizon)
        order = np.lexsort((train.output_len, key))
        self.keys_sorted = np.asarray(key)[order]
        self.out_sorted = train.output_len[order].astype(np.float64)
        self.uniq, self.starts, counts = np.unique(self.keys_sorted, return_index=True, return_counts=True)
        self.stops = self.starts + counts
        self._prefix = np.concatenate([[0.0], np.cumsum(self.out_sorted)])
        # composite sort key so one searchsorted finds positions inside each key's segment
        self._rank_of_row = np.repeat(np.arange(self.uniq.size), counts)
        self._span = float(self.out_sorted.max() + 2 * horizon + 2)
        self._composite = self._rank_of_row * self._span + self.out_sorted
        return self

    def predict(self, prompt_len, age, prompt_key=None, output_len=None):
        prompt_len, age = _states(prompt_len, age)
        key = prompt_len if prompt_key is None else _as_array("prompt_key", prompt_key, what="an array of integer keys")
        if key.shape != age.shape or key.dtype.kind not in "iuf":  # keys are integer hashes
            raise ValueError(f"prompt_key must be a 1-d array of integer keys, one per active request ({age.size}); "
                             f"got {prompt_key!r:.60}")
        p, mu = self.fallback.predict(prompt_len, age)
        pos = np.searchsorted(self.uniq, key)
        pos = np.minimum(pos, self.uniq.size - 1)
        known = self.uniq[pos] == key
        known &= (self.stops[pos] - self.starts[pos]) >= self.min_count
        if not known.any():
            return p, mu
        r, a = pos[known], np.minimum(age[known], self._span - self.horizon - 2)
        lo = np.searchsorted(self._composite, r * self._span + a, side="right")
        hi = np.searchsorted(self._composite, r * self._span + a + self.horizon, side="right")
        n_alive, pk, muk = _conditional(self.out_sorted, self._prefix, lo, hi, self.starts[r], self.stops[r], a,
                                        self.horizon)
        use = n_alive > 0
        idx = np.flatnonzero(known)[use]
        p, mu = p.copy(), mu.copy()
        p[idx], mu[idx] = pk[use], muk[use]
        return p, mu


def sample_decode_states(trace: RequestTrace, horizon: int, per_request: int = 4,
                         seed: int | None = 0) -> dict[str, np.ndarray]:
    """Training/test rows for the learned predictor: ``per_request`` ages drawn uniformly from each
    request's decode (0 .. output_len-1), with features (prompt_len, age) and labels
    ``finish`` (remaining <= H) and ``remaining``."""
    rng = rng_from(seed)
    rows = np.repeat(np.arange(len(trace)), per_request)
    out = trace.output_len[rows]
    age = np.floor(rng.random(rows.size) * out).astype(np.int64)
    remaining = out - age
    return {"prompt_len": trace.prompt_len[rows].astype(np.float64), "age": age.astype(np.float64),
            "finish": remaining <= horizon, "remaining": remaining.astype(np.float64)}


@dataclass
class LearnedPredictor(Predictor):
    """Gradient-boosted (scikit-learn) finish-within-H classifier + remaining-length regressor on the
    features known at admission and during decode: prompt length and age (tokens generated).

    For speed inside the simulation the fitted models are evaluated once on a grid (``prompt_bins``
    quantile bins of prompt length x every age up to ``max_age``) and looked up; the AUC / MAE in
    :meth:`evaluate` are those of the lookup, i.e. of what the router actually uses.
    """

    name = "learned"
    prompt_bins: int = 48
    max_age: int = 2048
    seed: int = 0

    def fit(self, train: RequestTrace | None, horizon: int) -> LearnedPredictor:
        super().fit(train, horizon)
        if train is None or len(train) < 20:
            raise ValueError("the learned predictor needs a training trace of at least 20 requests")
        bins = check_int("prompt_bins", self.prompt_bins, low=1)
        ages = check_int("max_age", self.max_age, low=0)
        check_product(("prompt_bins", "max_age + 1"), (bins, ages + 1), cap=MAX_LEARNED_GRID,
                      cap_name="MAX_LEARNED_GRID", why="the fitted models are tabulated on this grid up front")
        rows = sample_decode_states(train, horizon, seed=self.seed)
        X = np.stack([rows["prompt_len"], rows["age"]], axis=1)
        y = rows["finish"]
        if y.all() or not y.any():
            raise ValueError("training rows have a single finish-within-H class; use a longer trace or another H")
        # one OpenMP thread: on a shared, busy machine spinning worker threads cost far more than they give
        with threadpool_limits(limits=1):
            clf = HistGradientBoostingClassifier(max_iter=150, learning_rate=0.1, random_state=self.seed).fit(X, y)
            reg = HistGradientBoostingRegressor(max_iter=150, learning_rate=0.1, random_state=self.seed)
            reg.fit(X[y], rows["remaining"][y])
        # tabulate on (prompt bin representative, age) so lookups cost one index per request
        edges = np.unique(np.quantile(train.prompt_len, np.linspace(0, 1, self.prompt_bins + 1)))
        self.edges = edges[1:-1]
        bins = self._bin(train.prompt_len)
        reps = np.array([np.median(train.prompt_len[bins == b]) if np.any(bins == b) else edges[min(b, edges.size - 1)]
                         for b in range(self.edges.size + 1)])
        ages = np.arange(self.max_age + 1, dtype=np.float64)
        grid = np.stack([np.repeat(reps, ages.size), np.tile(ages, reps.size)], axis=1)
        shape = (reps.size, ages.size)
        with threadpool_limits(limits=1):
            self.p_table = clf.predict_proba(grid)[:, 1].reshape(shape)
            self.mu_table = np.clip(reg.predict(grid), 1.0, max(horizon, 1)).reshape(shape)
        return self

    def _bin(self, prompt_len: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.edges, np.asarray(prompt_len), side="right")

    def predict(self, prompt_len, age, prompt_key=None, output_len=None):
        prompt_len, age = _states(prompt_len, age)
        b = self._bin(prompt_len)
        a = np.minimum(age, self.max_age).astype(np.int64)  # ages are whole tokens; past max_age: the last column
        return self.p_table[b, a], self.mu_table[b, a]

    def evaluate(self, test: RequestTrace, seed: int | None = 1) -> dict[str, float]:
        """AUC of the finish-within-H classifier and MAE (tokens) of the remaining-length regressor
        on requests that finish within H, on a held-out trace; also the same for the base rate."""
        rows = sample_decode_states(test, self.horizon, seed=seed)
        p, mu = self.predict(rows["prompt_len"], rows["age"])
        fin = rows["finish"]
        auc = float(roc_auc_score(fin, p)) if 0 < fin.sum() < fin.size else float("nan")
        mae = float(np.mean(np.abs(mu[fin] - rows["remaining"][fin]))) if fin.any() else float("nan")
        mae_mean = float(np.mean(np.abs(rows["remaining"][fin].mean() - rows["remaining"][fin]))) if fin.any() else float("nan")
        return {"auc": auc, "mae_tokens": mae, "mae_constant_tokens": mae_mean, "n_test_rows": int(fin.size),
                "finish_rate": float(fin.mean())}


PREDICTORS: dict[str, type[Predictor]] = {
    "oracle": OraclePredictor, "survival": SurvivalPredictor, "exact_match": ExactMatchPredictor,
    "learned": LearnedPredictor,
}


def make_predictor(name: str, train: RequestTrace | None, horizon: int, **kwargs) -> Predictor:
    """Build and fit a predictor by name (``oracle`` needs no training trace)."""
    if not isinstance(name, str) or name not in PREDICTORS:  # a list was a bare "unhashable type" TypeError
        check_choice("predictor", name, sorted(PREDICTORS))
    return PREDICTORS[name](**kwargs).fit(train, horizon)
