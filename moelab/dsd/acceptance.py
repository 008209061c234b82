"""Measured acceptance: what a drafter's proposals would have had accepted by a greedy target, position by position.

Under greedy verification a drafted token is accepted iff it equals the target's own greedy token, so the
target's greedy continuation (``reference``) decides every round. For each position ``p`` of the reference
the recorder stores the **run** ``m(p)``: how many leading tokens of the drafter's best proposal after the
context ``prompt + reference[:p]`` match ``reference[p:]`` (capped at ``gamma_max``), and the **nodes** the
proposal holds (tokens the target would verify; a tree of several candidates counts its distinct prefixes).

A speculative round with draft length ``gamma`` starting at ``p`` accepts ``a = min(m(p), gamma)`` tokens
and emits ``a + 1`` (the target's bonus token); the next round starts at ``p + a + 1``. So one recording
gives the exact per-round sequence for every ``gamma <= gamma_max`` (:meth:`AcceptanceTrace.rounds`), in
order, as recorded rather than drawn from an i.i.d. geometric law (:meth:`AcceptanceTrace.geometric_test`
asks whether they are consistent with one). Rounds whose block would run past the end of the reference are left
out (their acceptance is cut by the recording, not by the drafter).

The recorder is drafter-agnostic: any object with ``start(context_ids)`` and ``draft()`` returning an object
with ``.candidates`` (the Hierarchy Drafting drafters' protocol: PLD, HD), any callable
``context -> candidates``, or precomputed greedy chains (:func:`chains_proposer`, e.g. from
:func:`moelab.models.early_exit.greedy_chains`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from moelab._io import FileFormatError, atomic_write_json, read_json
from moelab._validate import check_instance, check_int, check_real, check_token_array, check_token_ids
from moelab.datasets import repo_root

MAX_GAMMA = 64
MAX_FILE_BYTES = 20_000_000

Proposer = Callable[[list[int], int], list[tuple[int, ...]]]


def drafter_proposer(drafter: Any) -> Proposer:
    """Wrap a drafter with ``start(ids)`` / ``draft().candidates`` (e.g. ``moelab.hd`` PLD or HD) as a proposer.
    Each call restarts it on the full context, so its per-request state is that of a real run at ``p``.

    Parameters
    ----------
    drafter : object
        Anything with ``start(context_ids)`` and ``draft()`` returning an object with ``.candidates``.

    Returns
    -------
    Proposer
        ``(context_ids, p) -> candidates`` for :func:`record_acceptance`.
    """
    check_instance("drafter", drafter, None, "a drafter with start(ids) and draft() returning an object with "
                   ".candidates (e.g. moelab.hd.PLDDrafter())", methods=("start", "draft"))

    def propose(context: list[int], p: int) -> list[tuple[int, ...]]:
        drafter.start(context)
        return [tuple(check_token_ids("drafter candidate", c)) for c in drafter.draft().candidates]

    return propose


def chains_proposer(chains: np.ndarray) -> Proposer:
    """A proposer that returns row ``p`` of precomputed greedy chains (one candidate per position).

    Parameters
    ----------
    chains : ndarray of int
        ``[positions, gamma_max]`` token ids (e.g. :func:`moelab.models.early_exit.greedy_chains`).

    Returns
    -------
    Proposer
    """
    chains = check_token_array("chains", chains, ndim=2)
    if chains.ndim != 2:
        raise ValueError(f"chains must be a 2-d array (positions x gamma_max); got shape {chains.shape}")
    return lambda context, p: [tuple(chains[p].tolist())]


def _tree_nodes(candidates: Sequence[Sequence[int]], cap: int) -> int:
    seen: set[tuple[int, ...]] = set()
    for c in candidates:
        c = tuple(c)[:cap]
        for i in range(1, len(c) + 1):
            seen.add(c[:i])
    return len(seen)


def _run_length(candidates: Sequence[Sequence[int]], ref: Sequence[int], p: int, cap: int) -> int:
    best = 0
    for c in candidates:
        n = 0
        for j, tok in enumerate(tuple(c)[:cap]):
            if p + j >= len(ref) or int(tok) != ref[p + j]:
                break
            n += 1
        best = max(best, n)
    return best


def wilson_interval(accepted: int, tried: int, z: float = 1.96) -> tuple[float, float, float]:
    """The share ``accepted / tried`` with its Wilson score interval at normal quantile ``z``.

    Parameters
    ----------
    accepted, tried : int
        Successes and trials, ``0 <= accepted <= tried``.
    z : float
        Normal quantile of the interval (1.96: two-sided 95%).

    Returns
    -------
    tuple of float
        ``(share, low, high)``; all NaN when ``tried`` is 0.
    """
    accepted = check_int("accepted", accepted, low=0)
    tried = check_int("tried", tried, low=0)
    z = check_real("z", z, low=0)
    if accepted > tried:
        raise ValueError(f"accepted must be at most tried; got {accepted} > {tried}")
    if tried == 0:
        return float("nan"), float("nan"), float("nan")
    p = accepted / tried
    denom = 1 + z * z / tried
    centre = (p + z * z / (2 * tried)) / denom
    half = z * float(np.sqrt(p * (1 - p) / tried + z * z / (4 * tried * tried))) / denom
    return p, max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class GeometricTest:
    """:meth:`AcceptanceTrace.geometric_test`: acceptance at draft position 1 (the fit) against positions
    2..gamma (held out), each a share of tries with its interval, and their difference."""

    gamma: int
    level: float
    first_tries: int
    first_rate: float
    first_interval: tuple[float, float]
    later_tries: int
    later_rate: float
    later_interval: tuple[float, float]
    difference: float  # later_rate - first_rate; 0 under geometric acceptance
    difference_interval: tuple[float, float]
    consistent: bool  # the difference's interval holds 0
    testable: bool  # some round reached position 2


@dataclass
class SequenceRecord:
    """One prompt's recording: per-position runs and proposal sizes."""

    question_id: int
    category: str
    run: np.ndarray  # m(p), matched leading tokens of the best proposal, <= gamma_max
    nodes: np.ndarray  # tokens the proposal asks the target to verify
    propose_us: np.ndarray  # wall-clock microseconds of each proposal (0 when precomputed)


@dataclass
class AcceptanceTrace:
    """Recorded acceptance of one drafter against one greedy target over several prompts."""

    drafter: str
    target: str
    gamma_max: int
    sequences: list[SequenceRecord]
    provenance: dict[str, Any] = field(default_factory=dict)

    def _gamma(self, gamma: int | None) -> int:
        return self.gamma_max if gamma is None else check_int("gamma", gamma, low=1, high=self.gamma_max)

    def rounds(self, gamma: int | None = None) -> dict[str, np.ndarray]:
        """The per-round sequence at draft length ``gamma`` (default ``gamma_max``), prompts concatenated.

        Returns ``accepted`` (a), ``nodes`` (tokens verified, <= gamma), ``valid_next`` (the draft's
        continuation past the block also matched, i.e. ``m(p) >= gamma + 1``: a pipelined edge that kept
        drafting during the round trip drafted valid tokens; only known for ``gamma < gamma_max``, else
        False) and ``sequence`` (prompt index)."""
        g = self._gamma(gamma)
        acc, nodes, valid, seq = [], [], [], []
        for i, s in enumerate(self.sequences):
            n, p = len(s.run), 0
            while p + g < n:
                a = int(min(s.run[p], g))
                acc.append(a)
                nodes.append(int(min(s.nodes[p], g)) if s.nodes[p] <= self.gamma_max else int(s.nodes[p]))
                valid.append(bool(g < self.gamma_max and s.run[p] >= g + 1))
                seq.append(i)
                p += a + 1
        return {"accepted": np.asarray(acc, np.int64), "nodes": np.asarray(nodes, np.int64),
                "valid_next": np.asarray(valid, bool), "sequence": np.asarray(seq, np.int64)}

    def tokens_per_round(self, gamma: int | None = None) -> float:
        """Measured mean tokens per round (accepted + the bonus token)."""
        a = self.rounds(gamma)["accepted"]
        if a.size == 0:
            raise ValueError("the recording holds no complete round at this gamma")
        return float(a.mean() + 1.0)

    def alpha(self, gamma: int | None = None) -> float:
        """Per-token acceptance fitted to the rounds: the maximum-likelihood alpha of the truncated
        geometric law, ``sum(a) / sum(a + [a < gamma])`` (accepted tokens over tokens tried)."""
        g = self._gamma(gamma)
        a = self.rounds(g)["accepted"]
        tried = a.sum() + np.sum(a < g)
        return float(a.sum() / tried) if tried else 0.0

    def position_acceptance(self, gamma: int | None = None) -> dict[str, np.ndarray]:
        """Acceptance at each draft position of the rounds at draft length ``gamma`` (default ``gamma_max``).

        Draft token ``j`` of a round is tried when the first ``j - 1`` were accepted; the rounds cover disjoint
        stretches of the reference, so each try is a distinct target decision.

        Returns
        -------
        dict
            ``position`` (j = 1..gamma), ``tried`` (rounds that reached token j), ``accepted`` (rounds that
            accepted it) and ``rate`` (accepted / tried; NaN where no round reached j). Geometric (i.i.d.)
            acceptance makes ``rate`` the same at every j.
        """
        g = self._gamma(gamma)
        a = self.rounds(g)["accepted"]
        j = np.arange(1, g + 1)
        tried = np.array([np.sum(a >= k - 1) for k in j], np.int64)
        accepted = np.array([np.sum(a >= k) for k in j], np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(tried > 0, accepted / np.maximum(tried, 1), np.nan)
        return {"position": j, "tried": tried, "accepted": accepted, "rate": rate}

    def first_token_rate(self, gamma: int | None = None) -> float:
        """Share of the rounds at draft length ``gamma`` (default ``gamma_max``) whose first draft token the
        target accepts: the per-token acceptance fitted on draft position 1 alone."""
        pos = self.position_acceptance(gamma)
        return float(pos["accepted"][0] / pos["tried"][0]) if pos["tried"][0] else 0.0

    def geometric_test(self, gamma: int | None = None, level: float = 0.95) -> GeometricTest:
        """Does acceptance stay the same past the first draft token, as the geometric law assumes?

        The per-token acceptance is fitted on draft position 1 of the rounds (:meth:`first_token_rate`) and
        compared with the acceptance at positions 2..gamma pooled, tries the fit never saw. Geometric
        acceptance makes the two equal; the test reports their difference with a ``level`` interval (Wilson
        score intervals combined by Newcombe's method) and is consistent with the geometric law when that
        interval holds 0.

        Parameters
        ----------
        gamma : int, optional
            Draft length of the rounds (default ``gamma_max``); at least 2 for a later position to exist.
        level : float
            Coverage of the intervals, in (0, 1).

        Returns
        -------
        GeometricTest
        """
        g = self._gamma(gamma)
        level = check_real("level", level, low=0, high=1, low_open=True, high_open=True)
        z = NormalDist().inv_cdf(0.5 + level / 2)
        pos = self.position_acceptance(g)
        k1, n1 = int(pos["accepted"][0]), int(pos["tried"][0])
        kl, nl = int(pos["accepted"][1:].sum()), int(pos["tried"][1:].sum())
        p1, lo1, hi1 = wilson_interval(k1, n1, z)
        pl, lol, hil = wilson_interval(kl, nl, z)
        diff = pl - p1
        diff_lo = diff - float(np.hypot(pl - lol, hi1 - p1))
        diff_hi = diff + float(np.hypot(hil - pl, p1 - lo1))
        testable = n1 > 0 and nl > 0
        return GeometricTest(gamma=g, level=level, first_tries=n1, first_rate=p1, first_interval=(lo1, hi1),
                             later_tries=nl, later_rate=pl, later_interval=(lol, hil), difference=diff,
                             difference_interval=(diff_lo, diff_hi),
                             consistent=bool(testable and diff_lo <= 0.0 <= diff_hi), testable=bool(testable))

    def conditional_acceptance(self) -> np.ndarray:
        """``P(accept token j+1 | first j accepted)`` for j = 0..gamma_max-1 over all positions; i.i.d.
        acceptance would make this flat at alpha."""
        runs = np.concatenate([s.run for s in self.sequences])
        out = np.full(self.gamma_max, np.nan)
        for j in range(self.gamma_max):
            reached = runs >= j
            if reached.any():
                out[j] = float(np.mean(runs[reached] >= j + 1))
        return out

    # ---- files ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "target": self.target, "gamma_max": self.gamma_max,
                "provenance": self.provenance,
                "sequences": [{"question_id": s.question_id, "category": s.category, "run": s.run.tolist(),
                               "nodes": s.nodes.tolist(), "propose_us": np.round(s.propose_us, 1).tolist()}
                              for s in self.sequences]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AcceptanceTrace:
        try:
            g = check_int("gamma_max", d["gamma_max"], low=1, high=MAX_GAMMA)
            seqs = []
            for s in d["sequences"]:
                run = np.asarray(s["run"], dtype=np.int64)
                nodes = np.asarray(s["nodes"], dtype=np.int64)
                us = np.asarray(s.get("propose_us", np.zeros(run.size)), dtype=np.float64)
                if run.ndim != 1 or nodes.shape != run.shape or us.shape != run.shape:
                    raise ValueError("run, nodes and propose_us must be 1-d arrays of one length")
                if run.size and (run.min() < 0 or run.max() > g or nodes.min() < 0):
                    raise ValueError(f"run must be in [0, gamma_max={g}] and nodes >= 0")
                seqs.append(SequenceRecord(int(s["question_id"]), str(s["category"]), run, nodes, us))
            return cls(str(d["drafter"]), str(d["target"]), g, seqs, dict(d.get("provenance", {})))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an acceptance recording: missing or bad field ({exc})") from None


def record_acceptance(proposer: Proposer | Any, prompt_ids: Sequence[int], reference: Sequence[int], *,
                      gamma_max: int, question_id: int = -1, category: str = "") -> SequenceRecord:
    """Record the run ``m(p)`` and proposal size at every position of ``reference``.

    Parameters
    ----------
    proposer : callable or drafter
        ``proposer(context_ids, p) -> candidates`` or an object with ``start``/``draft`` (see module doc).
    prompt_ids, reference : sequences of int
        The prompt and the target's greedy continuation after it.
    gamma_max : int
        Longest draft considered (1..:data:`MAX_GAMMA`).
    question_id : int
        An id stored with the record.
    category : str
        A label stored with the record (e.g. a Spec-Bench category).

    Returns
    -------
    SequenceRecord
        Per position of ``reference``: the matched run, the proposal's size in tokens and the proposal's
        wall-clock time (microseconds).
    """
    gamma_max = check_int("gamma_max", gamma_max, low=1, high=MAX_GAMMA)
    prompt = check_token_ids("prompt_ids", prompt_ids)
    ref = check_token_ids("reference", reference)
    if not prompt:
        raise ValueError("prompt_ids must hold at least one token")
    if len(ref) > 100_000:
        raise ValueError(f"reference must hold at most 100000 tokens; got {len(ref)}")
    if not callable(proposer):
        proposer = drafter_proposer(proposer)
    run = np.zeros(len(ref), np.int64)
    nodes = np.zeros(len(ref), np.int64)
    us = np.zeros(len(ref))
    for p in range(len(ref)):
        t0 = time.perf_counter()
        cands = proposer(prompt + ref[:p], p)
        us[p] = (time.perf_counter() - t0) * 1e6
        run[p] = _run_length(cands, ref, p, gamma_max)
        nodes[p] = _tree_nodes(cands, gamma_max if len(cands) <= 1 else 10**9)
    return SequenceRecord(int(question_id), str(category), run, nodes, us)


def save_traces(path: str | Path, traces: dict[str, AcceptanceTrace], extra: dict[str, Any] | None = None) -> Path:
    """Write recordings (and e.g. measured timings in ``extra``) to one JSON file, atomically.

    Parameters
    ----------
    path : str or path
        The JSON file.
    traces : dict of str to AcceptanceTrace
        Recordings by name.
    extra : dict, optional
        More top-level fields (e.g. ``timings_ms``, read back by :func:`moelab.dsd.cpu_costs`).

    Returns
    -------
    pathlib.Path
        The file written.
    """
    return atomic_write_json(path, {"format": "moelab-dsd-acceptance-1", **(extra or {}),
                                    "traces": {k: t.to_dict() for k, t in traces.items()}})


def load_traces(path: str | Path) -> tuple[dict[str, AcceptanceTrace], dict[str, Any]]:
    """Read a file written by :func:`save_traces` (size-checked, JSON only): the traces and the rest.

    Parameters
    ----------
    path : str or path
        The JSON file.

    Returns
    -------
    traces : dict of str to AcceptanceTrace
    extra : dict
        The file's other top-level fields.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"acceptance recording {path} not found")
    d = read_json(path, max_bytes=MAX_FILE_BYTES)  # size and nesting bounded before parsing
    if not isinstance(d, dict) or d.get("format") != "moelab-dsd-acceptance-1":
        raise FileFormatError(path, "format", "is not moelab-dsd-acceptance-1 (not a moelab DSD acceptance recording)")
    if not isinstance(d.get("traces"), dict):
        raise FileFormatError(path, "traces", "must be an object of recorded traces by name")
    traces = {}
    for k, v in d["traces"].items():
        try:
            traces[k] = AcceptanceTrace.from_dict(v)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise FileFormatError(path, f"traces.{k}", f"is not a valid acceptance trace ({type(exc).__name__}: "
                                                       f"{exc})") from None
    return traces, {k: v for k, v in d.items() if k != "traces"}


def shipped_path() -> Path:
    """The recording bundled with moelab (``data/dsd/acceptance_smollm2.json``)."""
    return repo_root() / "data" / "dsd" / "acceptance_smollm2.json"


def load_shipped() -> tuple[dict[str, AcceptanceTrace], dict[str, Any]]:
    """The bundled recording: SmolLM2-135M-Instruct as target; early-exit, PLD and HD drafters.

    Returns
    -------
    traces : dict of str to AcceptanceTrace
    extra : dict
        The recording's measured CPU timings and provenance (:func:`moelab.dsd.cpu_costs` reads them).
    """
    return load_traces(shipped_path())


__all__ = ["MAX_GAMMA", "AcceptanceTrace", "GeometricTest", "Proposer", "SequenceRecord", "chains_proposer", "drafter_proposer",
           "load_shipped", "load_traces", "record_acceptance", "save_traces", "shipped_path", "wilson_interval"]
