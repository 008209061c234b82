"""Request signatures: what a request's prefill says about the experts its decode will use.

A signature is built from the prefill expert counts ``C[l, e]`` (prompt tokens whose top-k picked
expert ``e`` in layer ``l``):

* ``count_idf`` (default): ``x = C * idf`` with ``idf[l,e] = log((N+1) / (#{requests with C[l,e]>0} + 1))``
  fitted on ``N`` calibration requests, restricted to a greedy Spearman layer mask;
* ``count``: raw counts, all layers;
* ``gate_prob``: router probabilities summed over prompt tokens (``ExpertTrace.prefill_probs``), all layers.

Then ``v = flatten(x[mask]) / ||.||_2``. The layer mask is chosen by forward-greedy selection that
maximises the Spearman correlation between pairwise cosine distances of prefill signatures (chosen
layers only) and of decode profiles over random request pairs; the greedy prefix at which the
correlation peaks is kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moelab._validate import _as_array, check_choice, check_finite_array, check_instance, check_int, rng_from
from moelab.traces import ExpertTrace

#: Signature kinds: IDF-weighted prefill expert counts (``count_idf``, the default), raw counts (``count``), summed gate probabilities (``gate_prob``).
KINDS = ("count_idf", "count", "gate_prob")
#: most request pairs one correlation compares: the greedy layer search holds three ``L x n_pairs`` float
#: arrays (48 layers: ~1.2 GB at the cap) and its time is linear in them (the paper uses 30,000)
MAX_PAIRS = 1_000_000
_PAIRS_WHY = "the greedy layer search's memory and time grow linearly with it"
#: the greedy layer search stops after this many additions in a row without a new best (the curve has peaked)
GREEDY_PATIENCE = 6


def _check_pairs(n_pairs: object) -> int:
    return check_int("n_pairs", n_pairs, low=10, high=MAX_PAIRS, high_name="MAX_PAIRS", why=_PAIRS_WHY)


def _profiles(prefill: object, decode: object) -> tuple[np.ndarray, np.ndarray]:
    """``prefill`` and ``decode`` as finite float64 ``[N, L, E]`` arrays of one shape, decode counts >= 0."""
    p = check_finite_array("prefill", prefill, ndim=3)
    d = check_finite_array("decode", decode, ndim=3, low=0)
    if p.shape != d.shape:
        raise ValueError(f"prefill and decode must both have shape (N, L, E); got {p.shape} and {d.shape}")
    return p, d


def _sample_pairs(n: int, n_pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random distinct request pairs (i != j), with replacement across pairs."""
    if n < 2:
        raise ValueError(f"need at least 2 requests to compare pairs; got {n}")
    a = rng.integers(0, n, size=n_pairs)
    b = (a + rng.integers(1, n, size=n_pairs)) % n
    return a, b


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks along the last axis (ties broken by position; distances are continuous)."""
    r = np.empty_like(x, dtype=np.float64)
    idx = np.argsort(x, axis=-1, kind="stable")
    np.put_along_axis(r, idx, np.broadcast_to(np.arange(x.shape[-1], dtype=np.float64), x.shape), axis=-1)
    return r


_PAIR_CHUNK = 2048  # pairs gathered at a time: bounds memory at chunk x dim floats


def _cos_dist(X: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1)
    dots = np.empty(a.size)
    for s in range(0, a.size, _PAIR_CHUNK):
        dots[s:s + _PAIR_CHUNK] = np.einsum("pd,pd->p", X[a[s:s + _PAIR_CHUNK]], X[b[s:s + _PAIR_CHUNK]])
    return 1.0 - dots / np.maximum(norms[a] * norms[b], 1e-12)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = _ranks(x), _ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    return float(rx @ ry / np.sqrt((rx @ rx) * (ry @ ry)))


def decode_recall(prefill: np.ndarray, decode: np.ndarray) -> float:
    """Recall of decode experts from the prefill signal: per (request, layer), predict the
    ``m`` experts with the largest prefill value, ``m`` = number of distinct experts the decode used;
    recall = predicted-and-used / used, over all requests and layers.

    Both are ``[..., E]`` arrays of one shape (``[N, L, E]`` in practice), finite, decode counts >= 0."""
    prefill = check_finite_array("prefill", prefill)
    decode = check_finite_array("decode", decode, low=0)
    if prefill.ndim < 1 or prefill.shape != decode.shape:
        raise ValueError(f"prefill and decode must have one shape (..., E), e.g. (N, L, E); got {prefill.shape} "
                         f"and {decode.shape}")
    used = decode > 0
    order = np.argsort(-prefill, axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(prefill.shape[-1]), order.shape), axis=-1)
    predicted = rank < used.sum(axis=-1, keepdims=True)
    return float((predicted & used).sum() / max(used.sum(), 1))


def predictability(prefill: np.ndarray, decode: np.ndarray, *, n_pairs: int = 30000, seed: int = 0) -> dict[str, float]:
    """Prefill->decode predictability of ``[N, L, E]`` prefill signals vs decode profiles: Spearman
    rho between pairwise cosine distances (``n_pairs`` random pairs) and :func:`decode_recall`."""
    prefill, decode = _profiles(prefill, decode)
    n_pairs = _check_pairs(n_pairs)
    a, b = _sample_pairs(prefill.shape[0], n_pairs, rng_from(seed))
    n = prefill.shape[0]
    rho = _spearman(_cos_dist(prefill.reshape(n, -1), a, b), _cos_dist(decode.reshape(n, -1), a, b))
    return {"rho": rho, "recall": decode_recall(prefill, decode), "n_pairs": n_pairs}


def greedy_layer_mask(
    prefill: np.ndarray,
    decode: np.ndarray,
    *,
    n_pairs: int = 30000,
    patience: int = GREEDY_PATIENCE,
    seed: int = 0,
) -> tuple[np.ndarray, list[float], list[int]]:
    """Forward-greedy layer selection maximising the Spearman correlation between pairwise cosine
    distances of ``prefill`` (restricted to the chosen layers) and of ``decode`` profiles.

    Greedy stops after ``patience`` additions without a new best (the curve has peaked). Returns the
    boolean mask of the best greedy prefix, the correlation after each addition, and the order."""
    prefill, decode = _profiles(prefill, decode)
    n, L, _ = prefill.shape
    n_pairs = _check_pairs(n_pairs)
    patience = check_int("patience", patience, low=1)
    a, b = _sample_pairs(n, n_pairs, rng_from(seed))
    target = _ranks(_cos_dist(decode.reshape(n, -1), a, b))
    target -= target.mean()
    target /= np.linalg.norm(target)
    # per-layer pair dot products and squared norms: cosines of any layer subset are sums of these
    dots = np.empty((L, n_pairs))
    for s in range(0, n_pairs, _PAIR_CHUNK):
        sl = slice(s, s + _PAIR_CHUNK)
        dots[:, sl] = np.einsum("ple,ple->lp", prefill[a[sl]], prefill[b[sl]])
    sq = np.einsum("nle,nle->ln", prefill, prefill)
    sqa, sqb = sq[:, a], sq[:, b]
    chosen: list[int] = []
    curve: list[float] = []
    cur_d = np.zeros(n_pairs)
    cur_a = np.zeros(n_pairs)
    cur_b = np.zeros(n_pairs)
    remaining = list(range(L))
    best, since_best = -np.inf, 0
    centre = (n_pairs - 1) / 2.0
    scale = np.sqrt(((np.arange(n_pairs) - centre) ** 2).sum())
    while remaining:
        rem = np.array(remaining)
        cos = (cur_d + dots[rem]) / np.maximum(np.sqrt((cur_a + sqa[rem]) * (cur_b + sqb[rem])), 1e-12)
        r = _ranks(1.0 - cos) - centre  # rank ties are broken by position; a permutation has a fixed norm
        corr = (r @ target) / scale
        j = int(np.argmax(corr))
        layer = remaining.pop(j)
        chosen.append(layer)
        curve.append(float(corr[j]))
        cur_d, cur_a, cur_b = cur_d + dots[layer], cur_a + sqa[layer], cur_b + sqb[layer]
        if curve[-1] > best:
            best, since_best = curve[-1], 0
        else:
            since_best += 1
            if since_best >= patience:
                break
    k_best = int(np.argmax(curve)) + 1
    mask = np.zeros(L, dtype=bool)
    mask[chosen[:k_best]] = True
    return mask, curve, chosen


class SignatureBuilder:
    """Fit on calibration requests, then turn any request's prefill into a unit signature vector.

    Parameters
    ----------
    kind : {"count_idf", "count", "gate_prob"}
        What a layer's vector holds: expert counts weighted by IDF (the paper's, the default), raw counts, or
        summed router probabilities.
    layer_mask : {"greedy", "all"}, array of bool, or None
        Which layers the signature uses: picked greedily by Spearman correlation, all of them, or a boolean
        array of length L. None: greedy for ``count_idf``, all layers for the ablations.
    n_pairs : int
        Request pairs for the greedy Spearman selection (paper: 30,000).
    seed : int
        Pair sampling seed.
    """

    def __init__(self, kind: str = "count_idf", layer_mask: Any = None, *, n_pairs: int = 30000, seed: int = 0) -> None:
        self.kind = check_choice("kind", kind, KINDS)
        if layer_mask is None:
            layer_mask = "greedy" if kind == "count_idf" else "all"
        if isinstance(layer_mask, str):
            check_choice("layer_mask", layer_mask, ("greedy", "all"))
        elif layer_mask is not None:
            layer_mask = _as_array("layer_mask", layer_mask, what="'greedy', 'all' or a boolean array of length L")
        self.layer_mask_spec = layer_mask
        self.n_pairs = _check_pairs(n_pairs)
        self.seed = seed
        self.idf: np.ndarray | None = None
        self.mask: np.ndarray | None = None
        self.curve: list[float] = []  # greedy: Spearman rho on the calibration requests after each layer added
        self.patience = GREEDY_PATIENCE
        self.n_calibration = 0
        self.shape: tuple[int, int] | None = None
        self.columns: np.ndarray = np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ inputs
    def _signal(self, trace: ExpertTrace) -> np.ndarray:
        if self.kind == "gate_prob":
            if trace.prefill_probs is None:
                raise ValueError("kind='gate_prob' needs a trace with prefill_probs (summed router probabilities)")
            return trace.prefill_probs.astype(np.float64)
        return trace.prefill_counts.astype(np.float64)

    def _weighted(self, signal: np.ndarray) -> np.ndarray:
        return signal * self.idf if self.kind == "count_idf" else signal

    # ------------------------------------------------------------------ fit / transform
    def fit(self, trace: ExpertTrace) -> SignatureBuilder:
        """Fit idf weights and the layer mask on calibration requests (decode profiles from ``trace``)."""
        check_instance("trace", trace, ExpertTrace, "an ExpertTrace (the calibration requests)")
        if trace.n_requests < 2:
            raise ValueError(f"trace must hold at least 2 calibration requests; got {trace.n_requests}")
        sig = self._signal(trace)
        n, L, E = sig.shape
        self.shape = (L, E)
        self.n_calibration = n
        self.curve = []
        df = (trace.prefill_counts > 0).sum(axis=0)
        self.idf = np.log((n + 1.0) / (df + 1.0))
        spec = self.layer_mask_spec
        if isinstance(spec, str) and spec == "greedy":
            self.mask, self.curve, _ = greedy_layer_mask(self._weighted(sig), trace.decode_profiles(),
                                                         n_pairs=self.n_pairs, patience=self.patience, seed=self.seed)
        elif isinstance(spec, str):
            self.mask = np.ones(L, dtype=bool)
        else:
            if spec.dtype != bool:  # integers could be layer indices ([0, 2]): read as a mask they pick other layers
                raise ValueError(f"layer_mask must be 'greedy', 'all' or a boolean array of length num_layers={L}; "
                                 f"got dtype {spec.dtype}")
            mask = spec
            if mask.shape != (L,) or not mask.any():
                raise ValueError(f"layer_mask must be a boolean array of length num_layers={L} with a True entry")
            self.mask = mask
        # count_idf: an expert every calibration request used has idf == 0, so its coordinate is 0 in
        # every signature and centroid; dropping it is lossless and shrinks the routing dot products
        cols = np.ones((int(self.mask.sum()), E), dtype=bool)
        if self.kind == "count_idf":
            cols = self.idf[self.mask] > 0
            if not cols.any():
                raise ValueError("every expert was used by every calibration request (all idf = 0); use kind='count'")
        self.columns = np.flatnonzero(cols.ravel())
        return self

    def greedy_summary(self) -> dict[str, Any]:
        """What :attr:`curve` measures and where the greedy search stopped (for a figure's caption).

        Returns
        -------
        dict
            ``calibration_requests`` (the requests the curve's rho is measured on: the ones :meth:`fit` saw, not
            held-out ones), ``layers_tried`` (the curve's length), ``num_layers``, ``layers_kept`` and ``best_rho``
            (the curve's peak, the kept mask), ``patience`` and ``stopped_early`` (True when the search stopped
            after ``patience`` additions without a new best, before trying every layer).
        """
        self._check_fitted()
        if not self.curve:
            raise ValueError("no greedy curve: this builder's layer_mask was not 'greedy'")
        best = int(np.argmax(self.curve))
        return {"calibration_requests": self.n_calibration, "layers_tried": len(self.curve), "num_layers": self.shape[0],
                "layers_kept": best + 1, "best_rho": float(self.curve[best]), "patience": self.patience,
                "stopped_early": len(self.curve) < self.shape[0]}

    @property
    def dim(self) -> int:
        """Signature dimension (chosen layers x experts, less coordinates that are zero for everyone)."""
        self._check_fitted()
        return int(self.columns.size)

    def _check_fitted(self) -> None:
        if self.mask is None or self.shape is None:
            raise ValueError("SignatureBuilder is not fitted; call fit(calibration_trace) first")

    def transform(self, signal: np.ndarray | ExpertTrace) -> np.ndarray:
        """Unit signatures ``[N, dim]`` from prefill signals ``[N, L, E]`` (or ``[L, E]``, or a trace)."""
        self._check_fitted()
        if isinstance(signal, ExpertTrace):
            signal = self._signal(signal)
        # counts (or summed probabilities): finite and >= 0, named; a NaN or negative count would give a
        # plausible-looking signature (a NaN one breaks every dot product of the router downstream)
        x = check_finite_array("signal", signal, low=0)
        x = x[None] if x.ndim == 2 else x
        if x.ndim != 3 or x.shape[1:] != self.shape:
            raise ValueError(f"signal must have shape (N, L, E) with (L, E)={self.shape}; got {np.shape(signal)}")
        v = self._weighted(x)[:, self.mask].reshape(x.shape[0], -1)[:, self.columns]
        # C order: a router reads one row per decision, which must be contiguous to be fast
        return np.ascontiguousarray(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12))

    def report(self, trace: ExpertTrace, n_pairs: int | None = None) -> dict[str, float]:
        """Prefill->decode rho (the signature's layers vs whole decode profiles) and decode-expert recall.

        ``rho`` scores the signature's pair distances against the **raw** decode profiles' (how often each expert
        served a generated token); ``rho_idf_decode`` against the decode profiles weighted by the same idf as
        ``count_idf`` (experts every calibration request used count zero): the distinctive experts, which
        decide how many distinct experts a batch of similar requests saves. Each kind scores highest against
        decode profiles weighted its own way, so the two rhos can rank the kinds differently."""
        self._check_fitted()
        check_instance("trace", trace, ExpertTrace, "an ExpertTrace")
        if (trace.geometry.num_layers, trace.geometry.num_experts) != self.shape:
            raise ValueError(f"trace must have the (L, E)={self.shape} the builder was fitted on; got "
                             f"{(trace.geometry.num_layers, trace.geometry.num_experts)}")
        n_pairs = self.n_pairs if n_pairs is None else _check_pairs(n_pairs)
        sig = self._weighted(self._signal(trace))
        dec = trace.decode_profiles()
        n = sig.shape[0]
        a, b = _sample_pairs(n, n_pairs, rng_from(self.seed))
        dist = _cos_dist(sig[:, self.mask].reshape(n, -1), a, b)
        rho = _spearman(dist, _cos_dist(dec.reshape(n, -1), a, b))
        rho_idf = _spearman(dist, _cos_dist((dec * self.idf).reshape(n, -1), a, b))
        return {"rho": rho, "rho_idf_decode": rho_idf, "recall": decode_recall(sig, dec),
                "layers_kept": int(self.mask.sum()), "num_layers": self.shape[0]}


__all__ = ["GREEDY_PATIENCE", "KINDS", "MAX_PAIRS", "SignatureBuilder", "decode_recall", "greedy_layer_mask", "predictability"]
