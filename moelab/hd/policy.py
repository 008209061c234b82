"""Cost-aware drafting: how much of a draft is worth verifying.

Each step the hierarchy proposes candidates (a token tree, or one chain in vLLM). Every draft node gets
a probability of being accepted, ``p(node) = p(parent) * alpha(store, first-or-alternative child, class)``,
where ``alpha`` is the running acceptance rate of the node's key (accepted / tried over every node whose parent
was accepted, decayed, with a prior; see below), learned from the verification outcomes of earlier steps. The
``class`` is the drafter's confidence class of the token (:func:`confidence_class`): how long a context the
store matched and how deep into the store's answer the token is. On the full Spec-Bench run's greedy outputs
(``moelab hd-replay --prompts specbench``) the first W token after a 1-token key is accepted 28 % of the time,
after a 2-token key 48 % and after a 3-token key 78 % (held-out ShareGPT prompts: 25 %, 53 %, 83 %), so one rate
per store cuts confident chains short and keeps doubtful ones. The
expected tokens of a step that verifies the ``K`` most likely nodes are ``1 + sum(p)`` (the bonus token
always comes), its cost ``c(K + 1)``, the measured time of one target forward over ``K + 1`` tokens
(:class:`VerifyCost`). The policy keeps the ``K`` that maximises expected tokens per unit of cost,
subject to the budget; ``K = 0`` (draft nothing) wins when no store is confident enough to pay for
the extra verified tokens.

The measured cost curve is cached per machine and model (:func:`moelab.costmodel.verify.cached_verify_cost`);
a curve file records both and is refused on another machine or for another model. In a live engine (vLLM) it
only seeds the curve the plan reads: :class:`moelab.costmodel.verify.OnlineVerifyCost` corrects it from the step
times the engine's drafters observe, so a curve probed on a busy machine (or a machine whose load changes) is
corrected within a few dozen steps.

**A default that is never behind the paper's policy.** Where the plan cannot at least match verifying the
hierarchy's whole chain every step (HD-fixed) on this engine, because the estimates misjudge it, the engine's
:class:`PolicyChoice` finds out from the tokens per second each policy delivers and runs the better one (a
two-armed bandit over steps, per engine, re-trying the other on a tenth of the steps). Both policies are
lossless; the choice only changes what is drafted.

Acceptance is learned per request, because it is a property of the request (a temperature-1 request rejects
drafts a greedy one accepts; a translation accepts what a chat does not): each request has its own
:class:`AcceptanceModel`, whose counts decay with a half-life of :data:`REQUEST_HALF_LIFE` observations, so a
run of rejections is forgotten once the request's text turns predictable again. A request starts from its
engine's prior (:class:`EngineAcceptance`: every request's outcomes, decayed far more slowly), never below the
cold-start prior of :func:`cold_start_prior` (derived from the committed full Spec-Bench table), so the
rejections of earlier requests can make a new request start more optimistic but never switch it off. When
the plan drafts nothing, :class:`moelab.hd.drafters.CostAwareDrafter` still proposes one token with a small,
seeded probability, so a low estimate is re-tested rather than believed for good.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moelab._validate import check_instance, check_int, check_real
from moelab.costmodel.verify import TABLE_MAX_Q, VerifyCost
from moelab.datasets import bundled_path

#: Draft-token budgets compared (tokens verified per forward); 28 = the paper's 7 candidates x 4 tokens.
BUDGETS = (4, 8, 16, 28)  # draft tokens verified per forward; 28 = the paper's 7 candidates x 4 tokens
MAX_BUDGET = TABLE_MAX_Q - 1  # the cost table covers every budget's K + 1 tokens
# A request's estimates halve the weight of an outcome after this many later outcomes of the same (store,
# first-or-alternative) key: an answer of 64-128 tokens tests a few hundred nodes, so the estimate follows a
# change inside one answer (prose -> code) while still averaging ~46 effective outcomes (standard error of a
# rate near 0.5: ~0.07).
REQUEST_HALF_LIFE = 32.0
# The engine's prior forgets an outcome after this many later ones: it follows the workload over dozens of
# requests, not the request at hand.
ENGINE_HALF_LIFE = 1024.0
PRIOR_WEIGHT = 2.0  # pseudo-outcomes the prior counts for in a request's estimate (Beta(1, 1)'s weight)
# The prior when no measured one exists: a per-node acceptance that still drafts on every verify-cost curve
# with c(2) / c(1) < 1.5 (the K = 1 break-even), the mean of a uniform Beta(1, 1) prior.
FALLBACK_PRIOR = 0.5
FULL_TABLE = ("hd", "specbench_vllm_full.csv")  # data/ file the cold-start prior is derived from
#: cost-aware HD's label in result tables (:data:`moelab.hd.methods.METHODS`; the paper's method is "HD-fixed")
COST_AWARE_LABEL = "HD-cost"


def check_budget(budget: int) -> int:
    """Validate a verification budget (draft tokens per forward, 1..64)."""
    return check_int("budget", budget, low=1, high=MAX_BUDGET)


def check_acceptance(name: str, value: float) -> float:
    """Validate an acceptance probability (``name`` in [0, 1])."""
    return check_real(name, value, low=0.0, high=1.0)


def _per_node_acceptance(mat: float, budget: int) -> float:
    """The per-node acceptance ``a`` with ``a + a^2 + ... + a^budget = mat - 1`` (bisection; 0 if mat <= 1)."""
    target = mat - 1.0
    if target <= 0.0:
        return 0.0
    if target >= budget:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** d for d in range(1, budget + 1)) < target:
            lo = mid
        else:
            hi = mid
    return lo


def cold_start_prior(path: str | Path | None = None) -> tuple[float, str]:
    """The per-node acceptance a fresh machine starts from, and where it comes from.

    Read from the committed full Spec-Bench table (``data/hd/specbench_vllm_full.csv``): its HD row's mean
    accepted tokens per forward (MAT) at budget ``b`` is turned into the per-node acceptance ``a`` that a full
    chain of ``b`` tokens would need to reach it, ``a + a^2 + ... + a^b = MAT - 1``. That is a lower bound of
    the acceptance of what HD drafted (steps that drafted less than ``b`` tokens, or nothing, are counted as
    if a full chain had been tried), so the prior is conservative. Without the file or its HD row, the
    documented :data:`FALLBACK_PRIOR`.

    Parameters
    ----------
    path : str or Path, optional
        Another table of the same columns (``method, category, budget, mean_accepted``).
    """
    try:
        file = Path(path) if path is not None else bundled_path(*FULL_TABLE)
        with open(file, newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.DictReader(fh) if r.get("method") == COST_AWARE_LABEL and r.get("category") == "overall"]
        if rows:
            mat, budget = float(rows[0]["mean_accepted"]), int(float(rows[0]["budget"]))
            a = _per_node_acceptance(mat, check_budget(budget))
            return check_acceptance("cold-start prior", a), (
                f"per-node acceptance solving a + ... + a^{budget} = MAT - 1 for HD's MAT {mat:.3f} at budget "
                f"{budget} in {file.name} (a lower bound of HD's measured acceptance)")
    except (OSError, KeyError, ValueError):
        pass  # no usable measurement: the documented fallback
    return FALLBACK_PRIOR, f"no measured HD acceptance in data/{'/'.join(FULL_TABLE)}: the fallback prior"


_COLD_START: tuple[float, str] | None = None


def default_prior() -> float:
    """:func:`cold_start_prior` of the committed table, read once per process."""
    global _COLD_START
    if _COLD_START is None:
        _COLD_START = cold_start_prior()
    return _COLD_START[0]


Key = tuple[str, bool, int]  # (store letter, alternative child, confidence class)
#: outcomes an acceptance model logs before it counts them even unread (bounds the log's memory). Outcomes are
#: counted when an estimate is next read, in the order recorded, so the numbers are those of counting at once;
#: a vLLM engine's full-chain steps read none, and on them recording is a list append
LOG_LIMIT = 1024

#: confidence classes distinguish the first ``MATCH_CLASSES - 1`` match lengths (longer ones share the last)
MATCH_CLASSES = 4
#: ... and the first ``POSITION_CLASSES - 1`` positions inside a store's answer (deeper ones share the last)
POSITION_CLASSES = 4


def class_row(match: int, n: int) -> tuple[int, ...]:
    """``(confidence_class(match, 0), ..., confidence_class(match, n - 1))``, from a table built once (a
    drafter asks for one per store answer on every step)."""
    m = match if match < MATCH_CLASSES else MATCH_CLASSES - 1
    if m < 0 or n > _ROW_LEN:
        return tuple(confidence_class(match, i) for i in range(n))
    return _CLASS_ROWS[m][:n]


def confidence_class(match: int, position: int) -> int:
    """A draft token's confidence class: the store's match length (how many context tokens its answer was
    looked up with; 0 when the store does not say) and the token's position in that answer, both capped
    (:data:`MATCH_CLASSES`, :data:`POSITION_CLASSES`). Acceptance is learned per class (:class:`AcceptanceModel`)."""
    return min(match, MATCH_CLASSES - 1) * POSITION_CLASSES + min(position, POSITION_CLASSES - 1)


_ROW_LEN = 256
_CLASS_ROWS = [tuple(min(m, MATCH_CLASSES - 1) * POSITION_CLASSES + min(i, POSITION_CLASSES - 1) for i in range(_ROW_LEN))
               for m in range(MATCH_CLASSES)]


class _OutcomeCounts:
    """Decayed counts of tested and accepted nodes per key, counted from an ordered log when read: an outcome
    is appended to ``_log`` and counted (``_settle``) when :attr:`tried` or :attr:`accepted` is next read,
    or once :data:`LOG_LIMIT` wait, in the order recorded, so the numbers are those of counting at once."""

    _keep: float

    def _start_counts(self) -> None:
        self._tried: dict[Key, float] = {}
        self._accepted: dict[Key, float] = {}
        self._log: list[tuple[Key, bool]] = []  # outcomes recorded, not yet counted, oldest first

    @property
    def tried(self) -> dict[Key, float]:
        """Decayed count of tested nodes per key (every recorded outcome counted)."""
        if self._log:
            self._settle()
        return self._tried

    @property
    def accepted(self) -> dict[Key, float]:
        """Decayed count of accepted nodes per key (every recorded outcome counted)."""
        if self._log:
            self._settle()
        return self._accepted

    def _log_outcome(self, key: Key, ok: bool) -> None:
        log = self._log
        log.append((key, bool(ok)))
        if len(log) >= LOG_LIMIT:
            self._settle()

    def _settle(self) -> None:
        """Count the logged outcomes in the order they were recorded: each key's earlier outcomes decay by one."""
        log, self._log = self._log, []
        keep, tried, acc = self._keep, self._tried, self._accepted
        for key, ok in log:
            tried[key] = tried.get(key, 0.0) * keep + 1.0
            acc[key] = acc.get(key, 0.0) * keep + (1.0 if ok else 0.0)


class AcceptanceModel(_OutcomeCounts):
    """One request's running acceptance per (store letter, first child or alternative, confidence class),
    with decay.

    ``alpha = (accepted + w * prior) / (tried + w)`` where ``accepted`` and ``tried`` are exponentially
    decayed counts (an outcome weighs half after ``half_life`` later outcomes of its key) and ``w`` is
    :data:`PRIOR_WEIGHT`. ``tried`` counts draft nodes whose parent was accepted (only those were really
    tested).

    Parameters
    ----------
    prior : float, optional
        Acceptance of a key before any outcome, in [0, 1]; :func:`default_prior` by default.
    half_life : float
        Outcomes of one key after which an earlier outcome weighs half (> 0; ``inf`` never forgets).
    priors : mapping, optional
        Per-key priors (an engine's, see :meth:`EngineAcceptance.new_request`); keys not in it use ``prior``.
    engine : EngineAcceptance, optional
        Also told every outcome (it forms the prior of later requests).
    """

    def __init__(self, prior: float | None = None, *, half_life: float = REQUEST_HALF_LIFE,
                 priors: dict[Key, float] | None = None, engine: EngineAcceptance | None = None) -> None:
        self.prior = default_prior() if prior is None else check_acceptance("prior", prior)
        self.half_life = check_real("half_life", half_life, low=0.0, low_open=True) if half_life != float("inf") \
            else half_life
        self._keep = 0.5 ** (1.0 / self.half_life)
        if priors is not None and not isinstance(priors, dict):
            raise ValueError(f"priors must be a dict of (store, class) -> acceptance in [0, 1]; got "
                             f"{type(priors).__name__} {priors!r:.40}")
        self.priors = {k: check_acceptance(f"priors[{k!r}]", v) for k, v in (priors or {}).items()}
        self.engine = engine
        self._start_counts()
        # store -> class -> alphas(store, class), dropped when one of its keys' outcomes is counted: a step reads
        # a dozen alphas and changes two or three, so most reads are one dict probe (the drafting hot path;
        # one row per store: the plan probes by class, no (store, class) tuple to build per node)
        self._rows: dict[str, dict[int, tuple[float, float]]] = {}

    def _settle(self) -> None:
        """Count the logged outcomes (in order) and drop the memoised alphas they change."""
        rows = self._rows
        for (store, _, cls), _ in self._log:
            row = rows.get(store)
            if row is not None:
                row.pop(cls, None)
        super()._settle()

    def alpha(self, store: str, alternative: bool, cls: int = 0) -> float:
        key = (store, alternative, cls)
        w = PRIOR_WEIGHT
        return (self.accepted.get(key, 0.0) + w * self.priors.get(key, self.prior)) / (self.tried.get(key, 0.0) + w)

    def alphas(self, store: str, cls: int = 0) -> tuple[float, float]:
        """``(alpha(store, first child, cls), alpha(store, alternative, cls))``: what :func:`plan` reads per
        store and class."""
        if self._log:
            self._settle()
        row = self._rows.get(store)
        if row is None:
            row = self._rows[store] = {}
        pair = row.get(cls)
        if pair is None:
            pair = row[cls] = self._pair(store, cls)
        return pair

    def _pair(self, store: str, cls: int) -> tuple[float, float]:
        """``(alpha(store, False, cls), alpha(store, True, cls))`` computed (not memoised): :meth:`alpha`'s
        expression itself where :meth:`alpha` is this class's (a subclass may override it)."""
        if type(self).alpha is not AcceptanceModel.alpha:
            return self.alpha(store, False, cls), self.alpha(store, True, cls)
        w = PRIOR_WEIGHT
        if self._log:
            self._settle()
        acc, tried, priors, prior = self._accepted, self._tried, self.priors, self.prior
        k0, k1 = (store, False, cls), (store, True, cls)
        return ((acc.get(k0, 0.0) + w * priors.get(k0, prior)) / (tried.get(k0, 0.0) + w),
                (acc.get(k1, 0.0) + w * priors.get(k1, prior)) / (tried.get(k1, 0.0) + w))

    def record(self, store: str, alternative: bool, ok: bool, cls: int = 0) -> None:
        """One tested node's outcome: earlier outcomes of its key decay by one step, this one counts 1.

        Counted when the estimates are next read (:attr:`tried`, :meth:`alphas`, ...), in the order recorded:
        the same numbers as counting now. A vLLM engine mostly runs steps that read no estimate (the full
        chain, :class:`PolicyChoice`), so those steps only append to a list."""
        self._log_outcome((store, alternative, cls), ok)
        if self.engine is not None:
            self.engine.record(store, alternative, ok, cls)

    def table(self) -> list[dict[str, Any]]:
        return [{"store": s, "alternative": a, "class": c, "tried": t, "accepted": self.accepted.get((s, a, c), 0.0),
                 "alpha": self.alpha(s, a, c)} for (s, a, c), t in sorted(self.tried.items())]


class EngineAcceptance(_OutcomeCounts):
    """The prior that an engine's new requests start from: every request's outcomes, slowly decayed.

    Acceptance belongs to a request (temperature, task), so only the starting point is shared: a new request
    gets ``max(floor, engine estimate)`` per key and learns its own from there. The floor is the cold-start
    prior: an estimate below it would let earlier requests (e.g. at temperature 1) switch later greedy ones
    off, while one above it costs a new request at most a few wasted verifications before its own outcomes
    (weight :data:`PRIOR_WEIGHT`) take over.

    Parameters
    ----------
    floor : float, optional
        The cold-start prior in [0, 1]; :func:`default_prior` by default.
    half_life : float
        Outcomes of one key after which an earlier outcome weighs half in the engine's estimate (> 0).
    request_half_life : float
        Half-life of the requests' own estimates (:class:`AcceptanceModel`).
    """

    def __init__(self, floor: float | None = None, *, half_life: float = ENGINE_HALF_LIFE,
                 request_half_life: float = REQUEST_HALF_LIFE) -> None:
        self.floor = default_prior() if floor is None else check_acceptance("floor", floor)
        self.half_life = check_real("half_life", half_life, low=0.0, low_open=True)
        self.request_half_life = check_real("request_half_life", request_half_life, low=0.0, low_open=True)
        self._keep = 0.5 ** (1.0 / self.half_life)
        self._start_counts()  # every request's outcomes, in arrival order
        self.requests = 0

    def alpha(self, store: str, alternative: bool, cls: int = 0) -> float:
        """The engine's estimate for a key, never below the floor."""
        key = (store, alternative, cls)
        w = PRIOR_WEIGHT
        est = (self.accepted.get(key, 0.0) + w * self.floor) / (self.tried.get(key, 0.0) + w)
        return est if est > self.floor else self.floor

    def record(self, store: str, alternative: bool, ok: bool, cls: int = 0) -> None:
        """One tested node's outcome (counted when the estimates are next read, in the order recorded)."""
        self._log_outcome((store, alternative, cls), ok)

    def new_request(self) -> AcceptanceModel:
        """A request's own model, starting from this engine's current estimates (a snapshot)."""
        self.requests += 1
        return AcceptanceModel(self.floor, half_life=self.request_half_life,
                               priors={k: self.alpha(*k) for k in self.tried}, engine=self)


#: the step policies :class:`PolicyChoice` chooses between: the cost-aware plan, and the full chain of the
#: hierarchy (the paper's fixed policy: every step verifies the whole budget)
ARMS = ("plan", "full")
#: steps each policy is tried before the choice trusts their rates (alternating until then)
CHOICE_WARMUP = 24
#: share of steps that re-try the policy currently behind (its rate can change with the load and the text)
CHOICE_EXPLORE = 0.1
#: an engine's policy rates forget a step after this many later steps of the same policy
CHOICE_HALF_LIFE = 2048.0

_NAN = float("nan")  # a rate before any step


class PolicyChoice:
    """Which step policy an engine's cost-aware drafter runs: the plan or the hierarchy's full chain, chosen
    online on the tokens per second each delivers (a two-armed bandit, epsilon-greedy on decayed rates).

    Why: the plan maximises *expected* tokens per unit of *estimated* verify cost; where the estimates are
    wrong for this engine (a cost curve that misjudges the machine, acceptance that the classes miss), the plan
    can lose to simply verifying the whole chain, the paper's policy (HD-fixed). The two are compared on what
    the engine really delivers: every step of a policy adds its emitted tokens (accepted + bonus) and its wall
    time (drafting + verification, as the drafter observes it) to that policy's decayed sums. After
    :data:`CHOICE_WARMUP` steps of each, a step runs the policy with the higher rate, except a share
    :data:`CHOICE_EXPLORE` that re-tries the other, so the default is never worse than the better of the two
    by more than the exploration's share of their difference. Steps are assigned at random, so both policies
    see the same mix of easy and hard text. Lossless either way: the choice changes what is drafted, never
    what is accepted.

    Parameters
    ----------
    warmup : int
        Steps of each policy before the rates are trusted (>= 1).
    explore : float
        Share of steps that run the policy behind, in [0, 0.5].
    half_life : float
        Steps of a policy after which an earlier step weighs half (> 0).
    """

    def __init__(self, *, warmup: int = CHOICE_WARMUP, explore: float = CHOICE_EXPLORE,
                 half_life: float = CHOICE_HALF_LIFE) -> None:
        self.warmup = check_int("warmup", warmup, low=1)
        self.explore = check_real("explore", explore, low=0.0, high=0.5)
        self.half_life = check_real("half_life", half_life, low=0.0, low_open=True)
        self._keep = 0.5 ** (1.0 / self.half_life)
        self.tokens = [0.0, 0.0]
        self.seconds = [0.0, 0.0]
        self.steps = [0, 0]
        self.chosen = [0, 0]

    def rate(self, arm: int) -> float:
        """Tokens per second of policy ``arm`` (0 = plan, 1 = full chain); NaN before any step."""
        s = self.seconds[arm]
        return self.tokens[arm] / s if s > 0.0 else float("nan")

    def best(self) -> int:
        """The policy with the higher rate (the plan on a tie or before both have run their warm-up)."""
        if min(self.steps) < self.warmup:
            return 0
        return 1 if self.rate(1) > self.rate(0) else 0

    def choose(self, u: float) -> int:
        """The policy of the next step, given a uniform draw ``u`` in [0, 1) (the caller's seeded stream)."""
        n0, n1 = self.steps
        if min(n0, n1) < self.warmup:
            arm = 0 if n0 <= n1 else 1  # alternate until both have their warm-up
        else:
            if type(self) is PolicyChoice:  # best() inline (the per-step path: one frame, not three)
                (t0, t1), (s0, s1) = self.tokens, self.seconds
                arm = 1 if (t1 / s1 if s1 > 0.0 else _NAN) > (t0 / s0 if s0 > 0.0 else _NAN) else 0
            else:
                arm = self.best()
            if u < self.explore:
                arm = 1 - arm
        self.chosen[arm] += 1
        return arm

    def record(self, arm: int, tokens: float, seconds: float) -> None:
        """A step of policy ``arm`` emitted ``tokens`` in ``seconds`` (ignored unless both are finite, > 0)."""
        if not (seconds > 0.0 and seconds < float("inf") and tokens > 0.0):
            return
        keep = self._keep
        self.tokens[arm] = self.tokens[arm] * keep + tokens
        self.seconds[arm] = self.seconds[arm] * keep + seconds
        self.steps[arm] += 1

    def as_dict(self) -> dict[str, Any]:
        """Steps, rates and the current choice (for logs and tests)."""
        return {"steps": list(self.steps), "chosen": list(self.chosen),
                "rates": [self.rate(0), self.rate(1)], "best": ARMS[self.best()]}


def _src_at(src: str, depth: int, n: int) -> str:
    """A candidate's store letter at ``depth``: one letter for the whole candidate, or one per token."""
    return src[depth] if len(src) == n and n > 1 else src[:1]


def plan(candidates: Sequence[Sequence[int]], sources: Sequence[str], model: AcceptanceModel, cost: VerifyCost,
         budget: int, classes: Sequence[Sequence[int]] | None = None) -> tuple[list[tuple[int, ...]], list[str]]:
    """The sub-tree of ``candidates`` worth verifying (see the module docstring).

    Parameters
    ----------
    candidates : sequence of sequence of int
        Candidate continuations of the context (the draft tree's root-to-leaf paths).
    sources : sequence of str
        One store letter per candidate, or a string with one letter per token (chains stitched from several
        lookups).
    model : AcceptanceModel
        The request's running acceptance per (store, first child or alternative, class).
    cost : VerifyCost
        The measured verify-cost curve.
    budget : int
        Draft tokens verified at most (1 .. :data:`MAX_BUDGET`).
    classes : sequence of sequence of int, optional
        Every token's confidence class (:func:`confidence_class`; one sequence per candidate, as long as
        it); class 0 for all when None.

    Returns
    -------
    candidates : list of tuple of int
        The kept candidates: root-to-leaf paths of the chosen prefix-closed node set, in their original
        order, truncated; empty means "draft nothing this step".
    sources : list of str
        Their sources.
    """
    if not isinstance(cost, VerifyCost):  # (check_instance only formats the message)
        check_instance("cost", cost, VerifyCost, "a VerifyCost (e.g. moelab.costmodel.fit_verify_cost(qs, ms))")
    if type(budget) is not int or not 1 <= budget <= MAX_BUDGET:  # the per-step fast path skips the checker
        budget = check_budget(budget)
    if not candidates:
        return [], []
    if classes is None:
        classes = [(0,) * len(c) for c in candidates]
    elif len(classes) != len(candidates) or not _lengths_match(classes, candidates):
        raise ValueError("classes must hold one confidence class per candidate token (as many sequences as "
                         f"candidates, each as long as its candidate); got {len(classes)} for {len(candidates)} candidates")
    out, srcs, _ = _plan(candidates, sources, classes, model, cost, budget, False)
    return out, srcs


def _lengths_match(classes: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]]) -> bool:
    """Whether every class sequence is as long as its candidate (both sequences of one length): one
    ``map(len)`` per side, falling back to the pairwise check (which stops at the first mismatch) when a
    length cannot be taken, so a malformed input fails as it always did."""
    try:
        if list(map(len, classes)) == list(map(len, candidates)):
            return True
    except TypeError:
        pass
    return not any(len(k) != len(c) for k, c in zip(classes, candidates))


def _plan(candidates: Sequence[Sequence[int]], sources: Sequence[str], classes: Sequence[Sequence[int]],
          model: AcceptanceModel, cost: VerifyCost, budget: int,
          with_classes: bool) -> tuple[list[tuple[int, ...]], list[str], list[tuple[int, ...]] | None]:
    """:func:`plan` of checked, non-empty arguments (``classes`` given), and, with ``with_classes``, the
    confidence classes of the kept candidates (a node's class is that of the first candidate holding its
    path: the candidate that made the node) so a drafter need not rebuild them. The drafter's per-step
    entry: it built the candidates itself, so the checks of :func:`plan` would only cost time."""
    if len(candidates) == 1:  # one chain (vLLM's proposals): no tree to build
        got = _plan_chain(candidates[0], sources[0], classes[0], model, cost, budget)
        if got is not None:  # (kept classes: the kept prefix's, when it keeps one)
            return got[0], got[1], ([classes[0][:len(got[0][0])]] if got[0] else []) if with_classes else None
    threshold = cost.draft_threshold(budget)
    # An AcceptanceModel's alphas are <= 1 by construction (accepted <= tried, priors <= 1), so no node is
    # likelier than the root child it descends from: the first candidate's first-child alpha or a later
    # candidate's alternative alpha. Below the threshold nothing pays, and the answer is empty. The tree pass
    # below takes that maximum (``hi``) on its way; another model's alphas are all checked first, here.
    consistent = type(model) is AcceptanceModel
    # store -> class -> (alpha first child, alpha alternative), read once per step: an AcceptanceModel's own
    # memo of them (one dict probe per node), else a per-step memo in front of the model's alphas()
    if consistent and model._log:  # the memo rows are current once the logged outcomes are counted
        model._settle()
    rows: dict[str, dict[int, tuple[float, float]]] = model._rows if consistent else {}
    pair = model._pair if consistent else model.alphas
    if threshold > 0.0 and not consistent and _below_threshold(candidates, sources, classes, model, threshold, rows):
        return [], [], [] if with_classes else None
    # The trie of the candidates, built one candidate at a time: a candidate shares its first ``l`` nodes
    # with the (first) earlier candidate it has the longest common prefix with, and adds ``len - l`` new
    # nodes (ids in creation order, as a node-by-node trie would number them). Plain Python: a step has a
    # dozen nodes, where numpy's per-call overhead dominates. Paths are not materialised: candidate ``i``
    # keeps ``segs[i] = (j, l, first, end)``: the candidate it branches from, ``l``, and its new node ids
    # ``first:end``, which is all the final count of its kept prefix needs.
    prob: list[float] = [1.0]
    root_used = False  # whether the root has a child yet (node 0's children are alternatives after the first)
    branched: set[int] = set()  # other nodes given a second child by a later candidate
    segs: list[tuple[int, int, int, int]] = []
    hi = -1.0  # the likeliest root child's alpha (see above)
    for i, (cand, src, cls) in enumerate(zip(candidates, sources, classes)):
        n_c = len(cand)
        best, j_best = 0, -1
        if n_c:
            first = cand[0]
            for j in range(i):  # the earlier candidates
                other = candidates[j]
                if other and other[0] == first:
                    lim = min(n_c, len(other))
                    lcp = 1
                    while lcp < lim and cand[lcp] == other[lcp]:
                        lcp += 1
                    if lcp > best:
                        best, j_best = lcp, j
            if best and consistent:  # (a candidate that starts a root child reads its alpha below)
                ab = _alphas(rows, pair, src[:1], cls[0])
                if ab[root_used] > hi:  # root_used: a non-empty candidate came before (the first one starts a child)
                    hi = ab[root_used]
        if best == n_c:  # nothing new: a prefix of (or equal to) an earlier candidate
            segs.append((j_best, best, 0, 0))
            continue
        if best:  # the node at depth best - 1 of candidate j_best's path, in the segment that created it
            j, d = j_best, best - 1
            while d < segs[j][1]:
                j = segs[j][0]
            parent = segs[j][2] + d - segs[j][1]
            # it has a child already if it is inside its segment or an earlier candidate branched there
            alt = parent != segs[j][3] - 1 or parent in branched
            branched.add(parent)
        else:
            parent, alt, root_used = 0, root_used, True
        nid = len(prob)
        if n_c > 1 and len(src) == n_c:  # one store letter per token (stitched chains)
            pp = prob[parent] * _alphas(rows, pair, src[best], cls[best])[alt]
            prob.append(pp)
            for depth in range(best + 1, n_c):  # the rest of the chain: first children
                pp *= _alphas(rows, pair, src[depth], cls[depth])[0]
                prob.append(pp)
        else:
            letter = src[:1]
            row = rows.get(letter)
            if row is None:
                row = rows[letter] = {}
            c = cls[best]
            ab = row.get(c)
            if ab is None:
                ab = row[c] = pair(letter, c)
            pp = prob[parent] * ab[alt]  # the first new node: an alternative child if its parent has one
            prob.append(pp)
            for c in cls[best + 1:n_c]:  # the rest of the chain: first children
                ab = row.get(c)
                if ab is None:
                    ab = row[c] = pair(letter, c)
                pp *= ab[0]
                prob.append(pp)
        if not best and prob[nid] > hi:  # a root child: its probability is its alpha
            hi = prob[nid]
        segs.append((j_best, best, nid, len(prob)))
    if consistent and threshold > 0.0 and hi < threshold:  # (another model was checked before the tree)
        return [], [], [] if with_classes else None
    # the likeliest K nodes, for every K: expected tokens per unit of cost (the values alone suffice)
    # likeliest first, ties in node order (stable): parents before children (p(child) < p(parent)), so the
    # kept set is prefix-closed and a candidate's kept prefix is counted node by node (one sort for both)
    ranked = sorted(range(1, len(prob)), key=prob.__getitem__, reverse=True)
    table = cost.table
    best_k, best_ratio, gain = 0, 1.0 / table[1], 1.0
    for k, x in enumerate(ranked[:budget], 1):
        gain += prob[x]
        r = gain / table[k + 1]
        if r > best_ratio:
            best_k, best_ratio = k, r
    if best_k == 0:
        return [], [], [] if with_classes else None
    kept = [False] * len(prob)
    for x in ranked[:best_k]:
        kept[x] = True
    ns: list[int] = []
    kcs: list[tuple[int, ...]] = []  # per candidate: the classes of its kept prefix (with_classes)
    out, srcs, out_cls = [], [], []
    seen: set[tuple[int, ...]] = set()
    for (j, shared, nid, end), cand, src, cls in zip(segs, candidates, sources, classes):
        n = min(ns[j], shared) if shared else 0  # kept nodes among those shared with candidate j
        if n == shared:
            x = nid
            while x < end and kept[x]:
                x += 1
            n += x - nid
        ns.append(n)
        if with_classes:
            # the shared nodes were made by candidate j's path (their classes are its), the rest by this one
            kc = kcs[j][:min(n, shared)] if shared else ()
            if n > shared:
                kc += tuple(cls[shared:n])
            kcs.append(kc)
        if not n:
            continue
        c = cand[:n]
        if type(c) is not tuple:
            c = tuple(map(int, c))
        if c not in seen:
            # the same kept prefix through two candidates is proposed once
            seen.add(c)
            out.append(c)
            srcs.append(src[:n] if len(src) == len(cand) and len(cand) > 1 else src)
            if with_classes:
                out_cls.append(kc)
    return out, srcs, out_cls if with_classes else None


def _alphas(rows: dict[str, dict[int, tuple[float, float]]], pair: Any, store: str,
            cls: int) -> tuple[float, float]:
    """``rows[store][cls]``, made with ``pair(store, cls)`` when missing (:func:`_plan`'s memo of alphas)."""
    row = rows.get(store)
    if row is None:
        row = rows[store] = {}
    ab = row.get(cls)
    if ab is None:
        ab = row[cls] = pair(store, cls)
    return ab


def _below_threshold(candidates: Sequence[Sequence[int]], sources: Sequence[str], classes: Sequence[Sequence[int]],
                     model: AcceptanceModel, threshold: float, rows: dict[str, dict[int, tuple[float, float]]]) -> bool:
    """Whether every alpha of the draft is <= 1 (consistent counts) and the likeliest root child's alpha is
    below ``threshold`` (then nothing pays): the check for a model other than :class:`AcceptanceModel`. The
    alphas read go to ``rows`` (the tree pass reads them from there: one alphas() call per key and step)."""
    hi, first, ok = -1.0, True, True
    for cand, src, cls in zip(candidates, sources, classes):
        if not cand:
            continue
        per_token = len(cand) > 1 and len(src) == len(cand)
        for depth in range(len(cand)):
            letter, c = src[depth] if per_token else src[:1], cls[depth]
            if c not in rows.get(letter, ()):
                ab = _alphas(rows, model.alphas, letter, c)
                ok = ok and ab[0] <= 1.0 and ab[1] <= 1.0
        a = rows[src[:1]][cls[0]][not first]
        first = False
        if a > hi:
            hi = a
    return ok and hi < threshold


def _plan_chain(cand: Sequence[int], src: str, cls: Sequence[int], model: AcceptanceModel, cost: VerifyCost,
                budget: int) -> tuple[list[tuple[int, ...]], list[str]] | None:
    """:func:`plan` of a single chain, the same answer without the trie: every node is its parent's first
    child, so ``p(node d) = alpha_1 * ... * alpha_d`` never grows along the chain (each alpha <= 1) and the
    likeliest ``K`` nodes are the chain's first ``K`` (ties keep node order, as the general plan's stable sort
    does). None when an alpha exceeds 1 (inconsistent counts): the general plan decides then."""
    n = len(cand)
    if not n:
        return [], []
    per_token = n > 1 and len(src) == n
    first = src[:1]
    table = cost.table
    # alphas as in _plan: an AcceptanceModel's own memo rows, else a per-call memo in front of alphas()
    consistent = type(model) is AcceptanceModel
    if consistent and model._log:  # the memo rows are current once the logged outcomes are counted
        model._settle()
    rows: dict[str, dict[int, tuple[float, float]]] = model._rows if consistent else {}
    pair = model._pair if consistent else model.alphas
    a = _alphas(rows, pair, src[0] if per_token else first, cls[0])[0]
    if a > 1.0:
        return None
    if a < cost.draft_threshold(budget):  # no node is likelier than the first: nothing pays
        return [], []
    best_k, best_ratio = 0, 1.0 / table[1]
    p, gain = 1.0, 1.0
    for k in range(1, min(budget, n) + 1):
        letter, c = src[k - 1] if per_token else first, cls[k - 1]
        row = rows.get(letter)
        ab = row.get(c) if row is not None else None
        if ab is None:
            ab = _alphas(rows, pair, letter, c)
        a = ab[0]
        if a > 1.0:
            return None
        p *= a
        gain += p
        r = gain / table[k + 1]
        if r > best_ratio:
            best_k, best_ratio = k, r
    if best_k == 0:
        return [], []
    c = cand[:best_k]
    if type(c) is not tuple:
        c = tuple(map(int, c))
    return [c], [src[:best_k] if per_token else src]


def observe(model: AcceptanceModel, candidates: Sequence[Sequence[int]], sources: Sequence[str],
            accepted: Sequence[int], classes: Sequence[Sequence[int]] | None = None) -> None:
    """Update ``model`` from one verification: ``accepted`` = the accepted draft tokens (longest accepted
    path). Every node whose parent was on the accepted path was tested: accepted iff it is the next token.
    ``classes``: the tokens' confidence classes as given to :func:`plan` (class 0 for all when None)."""
    acc = list(map(int, accepted))
    if len(candidates) == 1:  # one chain: node d was tested iff the d nodes before it were accepted
        cand, src = candidates[0], sources[0]
        n = len(cand)
        cls = classes[0] if classes is not None else (0,) * n
        per_token = n > 1 and len(src) == n
        n_acc = len(acc)
        for depth in range(n):
            t = int(cand[depth])
            ok = depth < n_acc and acc[depth] == t
            model.record(src[depth] if per_token else src[:1], False, ok, int(cls[depth]))
            if not ok:
                break
        return
    tested: dict[tuple[int, int], tuple[str, bool, int]] = {}
    n_children: dict[int, int] = {}
    seen: dict[tuple[int, ...], int] = {(): 0}
    if classes is None:
        classes = [(0,) * len(c) for c in candidates]
    for cand, src, cls in zip(candidates, sources, classes):
        prefix: tuple[int, ...] = ()
        for depth, t in enumerate(cand):
            nxt = prefix + (int(t),)
            if nxt not in seen:
                pid = seen[prefix]
                alt = n_children.get(pid, 0) > 0
                n_children[pid] = n_children.get(pid, 0) + 1
                seen[nxt] = len(seen)
                if list(prefix) == acc[:depth]:  # parent accepted: this node was tested
                    tested[(depth, int(t))] = (_src_at(src, depth, len(cand)), alt, int(cls[depth]))
            prefix = nxt
    for (depth, t), (src, alt, c) in tested.items():
        model.record(src, alt, depth < len(acc) and acc[depth] == t, c)


__all__ = ["ARMS", "CHOICE_EXPLORE", "CHOICE_HALF_LIFE", "CHOICE_WARMUP", "BUDGETS", "PolicyChoice", "COST_AWARE_LABEL", "ENGINE_HALF_LIFE", "FALLBACK_PRIOR", "MATCH_CLASSES", "MAX_BUDGET",
           "POSITION_CLASSES", "PRIOR_WEIGHT", "REQUEST_HALF_LIFE", "AcceptanceModel", "EngineAcceptance",
           "check_acceptance", "check_budget", "class_row", "cold_start_prior", "confidence_class", "default_prior", "observe",
           "plan"]
