"""Drafters: Hierarchy Drafting (stores walked in order), PLD, single stores, and none (autoregressive).

A drafter follows one request: ``start(prompt_ids)``, then per step ``draft() -> Draft`` (candidate
continuations of the current context, each tagged with the store that produced it) and
``accept(new_tokens)`` with the tokens the target produced. Counters record, per store, how often it was
queried, how often it returned something (lookup hit), and how many accepted tokens it drafted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from moelab._validate import check_instance, check_int, check_token_ids
from moelab.costmodel.verify import ONLINE_PENDING, OnlineVerifyCost, VerifyCost
from moelab.hd.ngram import NGramTable
from moelab.hd.policy import (
    LOG_LIMIT,
    MATCH_CLASSES,
    AcceptanceModel,
    EngineAcceptance,
    PolicyChoice,
    _plan,
    _plan_chain,
    check_acceptance,
    check_budget,
    class_row,
    observe,
    plan,
)
from moelab.hd.stores import ContextStore, Store, match_length
from moelab.hd.suffix import SuffixStore

#: Hierarchy Drafting's stores, in walk order: W (the context window), S (the model's own outputs), L (a large corpus).
STORE_LETTERS = "WSL"
#: W's key lengths in cost-aware HD: a 3-token key's continuation is a confidence class of its own (the
#: paper's fixed hierarchy keeps 1-2 token keys)
COST_AWARE_CONTEXT_KEYS = (1, 2, 3)


@dataclass
class Draft:
    """Candidate continuations of the current context, the store letter each came from, and (when the
    drafter knows them) every token's confidence class (:func:`moelab.hd.policy.confidence_class`)."""

    candidates: list[tuple[int, ...]]
    sources: list[str]
    classes: list[tuple[int, ...]] | None = field(default=None)


@dataclass
class StoreCounters:
    """One store's counters, accumulated over steps and requests (:meth:`Drafter.reset_counters` zeroes them).

    A drafter counts ``queries``, ``lookup_hits`` and ``candidates`` itself in :meth:`Drafter.draft`; the
    engines (:func:`moelab.hd.generate`, :func:`moelab.hd.replay_greedy`) add ``accept_steps`` and
    ``accepted_tokens`` through :meth:`Drafter.credit` after each verification.

    Attributes
    ----------
    queries : int
        Steps on which the store was asked for candidates.
    lookup_hits : int
        Queries that returned at least one candidate (``lookup_hits / queries`` is the store's hit rate).
    candidates : int
        Candidates the store contributed to drafts (after de-duplication and the per-step cap).
    accept_steps : int
        Steps whose accepted draft path ended in a token from this store.
    accepted_tokens : int
        Draft tokens accepted on those steps (the store's share of the mean accepted tokens per forward).
    """

    queries: int = 0
    lookup_hits: int = 0
    candidates: int = 0
    accept_steps: int = 0
    accepted_tokens: int = 0


def _token_list(name: str, values: Sequence[int]) -> list[int]:
    """``check_token_ids(name, values)`` with an O(len) shortcut for what a drafter is handed on every step:
    a list of plain non-negative ints below 2**63 comes back as a copy, exactly what the full check returns
    for it (the full check builds arrays and messages, the larger part of a short step's drafting time);
    anything else takes the full check, which converts it or raises."""
    if type(values) is list:
        for t in values:  # (a plain loop: a step hands over one to a few tokens, too few for all() and min/max)
            if type(t) is not int or not 0 <= t < _INT64_END:
                break
        else:
            return values.copy()
    return check_token_ids(name, values)


_INT64_END = 1 << 63
_INF = float("inf")
_NAN = float("nan")
_LAST_MATCH = MATCH_CLASSES - 1  # match lengths from here on share one confidence-class row


def check_order(order: str) -> str:
    """Validate a store order such as ``"WSL"`` or ``"LSW"`` (letters from W, S, L; no repeats)."""
    if not isinstance(order, str) or not order:
        raise ValueError(f"order must be a non-empty string of store letters from {STORE_LETTERS!r}; got {order!r}")
    bad = sorted(set(order) - set(STORE_LETTERS))
    if bad:
        raise ValueError(f"order must use only the store letters {list(STORE_LETTERS)}; got unknown {bad} in {order!r}")
    if len(set(order)) != len(order):
        raise ValueError(f"order must not repeat a store; got {order!r}")
    return order


class Drafter:
    """Base class of every drafter: keeps the request's context and the per-store counters.

    The engines drive a drafter through one request as ``start(prompt_ids)``, then per step ``draft()`` ->
    verification -> ``observe(draft, accepted)`` -> ``accept(new_tokens)`` -> ``credit(source, n)``. Any
    drafter is lossless under greedy verification: a draft only decides how many tokens one target forward
    may confirm. To write one, subclass this class, set :attr:`name` and :attr:`letters`, and override
    :meth:`draft` (and :meth:`start`/:meth:`accept` if it keeps per-request state of its own, calling
    ``super()`` first). The user guide's "Your own drafter" recipe is a complete example.

    Attributes
    ----------
    name : str
        Label in results, tables and error messages.
    letters : str
        One letter per store the drafter draws from (e.g. ``"WSL"``); every :class:`Draft` source must use only
        these letters, and :attr:`counters` has one entry per letter.
    context : list of int
        The request's token ids so far: the prompt, then every token the target produced.
    counters : dict of str to StoreCounters
        Per-store counters (see :class:`StoreCounters`), kept across requests until :meth:`reset_counters`.
    """

    name = "drafter"
    letters: str = ""

    def __init__(self) -> None:
        self.context: list[int] = []
        self.counters: dict[str, StoreCounters] = {c: StoreCounters() for c in self.letters}

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Begin a request with ``prompt_ids`` (per-request state is reset; counters are kept)."""
        self.context = _token_list("prompt_ids", prompt_ids)  # integer ids only: a float is refused, not truncated
        if not self.context:
            raise ValueError("prompt_ids must not be empty")

    def accept(self, new_tokens: Sequence[int]) -> None:
        """Append the tokens the target produced this step."""
        if type(new_tokens) is list:  # _token_list's check, inline: the per-step path (one frame less)
            for t in new_tokens:
                if type(t) is not int or not 0 <= t < _INT64_END:
                    break
            else:
                self.context.extend(new_tokens)
                return
        self.context.extend(check_token_ids("new_tokens", new_tokens))

    def draft(self) -> Draft:  # pragma: no cover - overridden
        """This step's proposal: candidate continuations of :attr:`context`.

        Returns
        -------
        Draft
            ``candidates``: tuples of token ids, each a guess at the tokens that follow the context (the HF
            engine verifies them all as one token tree; vLLM verifies the first, cut to its budget, as one
            chain); ``sources``: for each candidate, the letter (from :attr:`letters`) of the store it came
            from, or one letter per token; an empty ``Draft([], [])`` drafts nothing (the step decodes one
            token). A subclass also counts its store queries in :attr:`counters`.
        """
        return Draft([], [])

    def observe(self, draft: Draft, accepted: Sequence[int]) -> None:
        """Called after each verification with the step's draft and its accepted draft tokens (no-op here)."""

    def credit(self, source: str | None, n_tokens: int) -> None:
        """Record that ``n_tokens`` accepted draft tokens came from store ``source`` (one of :attr:`letters`;
        ``None`` or ``n_tokens == 0``: nothing was accepted)."""
        if source and n_tokens > 0:
            c = self.counters.get(source)
            if c is None:
                raise ValueError(f"drafter {self.name!r} was credited for store {source!r}, which is not one of "
                                 f"its declared letters {self.letters!r}")
            c.accept_steps += 1
            c.accepted_tokens += n_tokens

    def reset_counters(self) -> None:
        """Zero every store's counters (one :class:`StoreCounters` per letter in :attr:`letters`)."""
        self.counters = {c: StoreCounters() for c in self.letters}


class NoDrafter(Drafter):
    """Plain autoregressive decoding: never drafts."""

    name = "AR"


class PLDDrafter(Drafter):
    """Prompt lookup decoding: find the last ``max_ngram..min_ngram`` tokens earlier in the context (first
    occurrence) and propose the ``num_pred_tokens`` tokens that followed it (one candidate)."""

    name = "PLD"
    letters = "P"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_pred_tokens: int = 10) -> None:
        self.max_ngram = check_int("max_ngram", max_ngram, low=1, high=16)
        self.min_ngram = check_int("min_ngram", min_ngram, low=1, high=self.max_ngram)
        self.num_pred_tokens = check_int("num_pred_tokens", num_pred_tokens, low=1, high=64)
        super().__init__()
        self._buf = np.zeros(0, dtype=np.int64)

    def start(self, prompt_ids: Sequence[int]) -> None:
        super().start(prompt_ids)
        self._buf = np.asarray(self.context, dtype=np.int64)

    def accept(self, new_tokens: Sequence[int]) -> None:
        super().accept(new_tokens)
        self._buf = np.concatenate([self._buf, np.asarray(new_tokens, dtype=np.int64)])

    def draft(self) -> Draft:
        ctx = self._buf
        n = ctx.size
        c = self.counters["P"]
        c.queries += 1
        if n >= 2:
            # candidate match ends: earlier positions holding the last token (vectorised, no full window scan)
            ends = np.flatnonzero(ctx[:n - 1] == ctx[n - 1])
            for size in range(min(self.max_ngram, (n - 1) // 2), self.min_ngram - 1, -1):
                # a match of the last `size` tokens ending at e whose continuation starts before the suffix
                # (PLD's reference rule: window start < n - 2 * size)
                ok = ends[(ends >= size - 1) & (ends <= n - size - 2)]
                for j in range(1, size):
                    if not ok.size:
                        break
                    ok = ok[ctx[ok - j] == ctx[n - 1 - j]]
                if ok.size:
                    start = int(ok[0]) + 1
                    cand = tuple(ctx[start:start + self.num_pred_tokens].tolist())
                    c.lookup_hits += 1
                    c.candidates += 1
                    return Draft([cand], ["P"])
        return Draft([], [])


class HierarchyDrafter(Drafter):
    """Hierarchy Drafting: query the stores in ``order`` and stop once ``max_candidates`` are collected.

    Parameters
    ----------
    model_store, statistics_store : Store, optional
        S and L (e.g. :class:`moelab.hd.ngram.NGramTable`); required when their letter is in ``order``.
    order : str
        Store order, e.g. ``"WSL"`` (the paper's), ``"LSW"``, or one letter for a single-store drafter.
    max_candidates : int
        Candidates per step (the paper: 7).
    length : int
        Tokens per candidate (the paper: 4).
    context_key_lengths : sequence of int
        Key lengths of the per-request W store.
    """

    def __init__(self, model_store: Store | None = None, statistics_store: Store | None = None, *,
                 order: str = "WSL", max_candidates: int = 7, length: int = 4,
                 context_key_lengths: Sequence[int] = (1, 2)) -> None:
        self.order = check_order(order)
        self.max_candidates = check_int("max_candidates", max_candidates, low=1, high=64)
        self.length = check_int("length", length, low=1, high=32)
        if "S" in order and model_store is None:
            raise ValueError(f"order {order!r} uses S but model_store is None: pass "
                             "moelab.hd.load_default_model_store(tokenizer) (the shipped S of the default target) or "
                             "your own store, or drop S from order (order='W' needs no store)")
        if "L" in order and statistics_store is None:
            raise ValueError(f"order {order!r} uses L but statistics_store is None: pass "
                             "moelab.hd.load_default_statistics_store(tokenizer) (the ShareGPT suffix index; needs the "
                             "sharegpt extra) or your own store, or drop L from order")
        self.letters = order
        self.name = f"HD({order})" if len(order) > 1 else f"{order}-only"
        super().__init__()
        self.W = ContextStore(context_key_lengths, length=length)
        self._stores: dict[str, Store] = {"W": self.W}
        if model_store is not None:
            self._stores["S"] = model_store
        if statistics_store is not None:
            self._stores["L"] = statistics_store
        self._reach = _context_reach([self._stores[c] for c in order])
        # the walk: (letter, store, its lookup_matched or None, its fixed match length or None). W and L answer
        # a lookup and its match length in one probe; an n-gram table tells no match length (match_length()
        # is 0 for it); exact types only (a subclass may override lookup or add match_length); any other store
        # is asked through the Store protocol (lookup, then match_length when it answered)
        self._walk = [(c, st, st.lookup_matched if type(st) in _MATCHED_TYPES else None,
                       0 if type(st) is NGramTable and getattr(st, "match_length", None) is None else None)
                      for c, st in ((c, self._stores[c]) for c in order)]
        # class_row(m, length) per match length, capped as the classes cap it (a longer match shares the last
        # row): the walk reads one per store answer, a tuple index instead of a call and a slice
        self._class_rows = tuple(class_row(m, length) for m in range(MATCH_CLASSES))
        self._has_w = "W" in order

    def start(self, prompt_ids: Sequence[int]) -> None:
        super().start(prompt_ids)
        if "W" in self.order:
            self.W.reset(self.context)

    def accept(self, new_tokens: Sequence[int]) -> None:
        super().accept(new_tokens)
        if self._has_w:
            self.W.extend(new_tokens)

    def draft(self) -> Draft:
        cands: list[tuple[int, ...]] = []
        sources: list[str] = []
        classes: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        ctx = self.context
        L, G = self.length, self.max_candidates
        counters = self.counters
        for letter, store, matched, fixed in self._walk:
            c = counters[letter]
            c.queries += 1
            if matched is not None:
                got, m = matched(ctx, G)
                if not got:
                    continue
            else:
                got = store.lookup(ctx, G)
                if not got:
                    continue
                m = fixed if fixed is not None else match_length(store, ctx)
            c.lookup_hits += 1
            # every answer of this store has match length m: a shorter candidate's classes are a prefix of a
            # full-length one's (one class_row per store, not per candidate)
            row = self._class_rows[m if m < _LAST_MATCH else _LAST_MATCH]
            for cand in got:
                if len(cand) > L:
                    cand = cand[:L]
                if cand and cand not in seen:
                    seen.add(cand)
                    cands.append(cand)
                    sources.append(letter)
                    classes.append(row if len(cand) == L else row[:len(cand)])
                    c.candidates += 1
                    if len(cands) >= G:
                        return Draft(cands, sources, classes)
        return Draft(cands, sources, classes)

    def draft_chain(self, max_len: int) -> Draft:
        """One chain of up to ``max_len`` tokens (what vLLM verifies): the hierarchy's first candidate,
        extended by querying the hierarchy again after it; sources hold one store letter per token, classes
        one confidence class per token (the store's match length and the token's position in its answer)."""
        if type(max_len) is not int or not 1 <= max_len <= 256:
            check_int("max_len", max_len, low=1, high=256)  # raises (or converts a numpy integer)
            max_len = int(max_len)
        # the walk reads only the context's last `_reach` tokens: copy those, not the whole request
        ctx = list(self.context) if self._reach is None else self.context[-self._reach:]
        walk = self._walk
        # the first round counts queries and hits per store; later rounds (extending the chain) do not
        got = None
        counters = self.counters
        for letter, store, matched, fixed in walk:
            c = counters[letter]
            c.queries += 1
            if matched is not None:
                cands, m = matched(ctx, 1)
            else:
                cands = store.lookup(ctx, 1)
                m = fixed  # None: asked for only when the store answered
            if cands and cands[0]:
                got = (cands[0], letter, m if m is not None else match_length(store, ctx))
                c.lookup_hits += 1
                c.candidates += 1
                break
        if got is None:
            return Draft([], [], [])
        seg, letter, m = got
        if len(seg) >= max_len:  # one answer fills the chain: no second round, no list to build
            seg = tuple(seg[:max_len])
            return Draft([seg], [letter * len(seg)], [class_row(m, len(seg))])
        chain = list(seg)
        letters = letter * len(seg)
        classes = list(class_row(m, len(seg)))
        while True:
            ctx.extend(seg)
            got = None
            for name, store, matched, fixed in walk:  # (inline, not a helper: a frame costs with cold caches)
                if matched is not None:
                    cands, m = matched(ctx, 1)
                else:
                    cands = store.lookup(ctx, 1)
                    m = fixed
                if cands and cands[0]:
                    got, letter = cands[0], name
                    if m is None:
                        m = match_length(store, ctx)
                    break
            if got is None:
                break
            seg = got[:max_len - len(chain)]
            chain.extend(seg)
            letters += letter * len(seg)
            classes.extend(class_row(m, len(seg)))
            if len(chain) >= max_len:
                break
        return Draft([tuple(chain)], [letters], [tuple(classes)])


def _context_reach(stores: Sequence[Store]) -> int | None:
    """How many of the context's last tokens ``stores`` read at most, or None when one of them may read
    more (a store type this module does not know). W and an n-gram table read their longest key, a
    suffix index its ``depth``; exact types only (a subclass may read further)."""
    reach = 0
    for st in stores:
        if type(st) is ContextStore:
            reach = max(reach, max(st.key_lengths))
        elif type(st) is NGramTable:
            reach = max(reach, st.max_key_length)
        elif type(st) is SuffixStore:
            reach = max(reach, st.depth)
        else:
            return None
    return max(reach, 1)


# the store types that answer lookup_matched (HierarchyDrafter's walk); an NGramTable has no match length, so
# it is asked through the protocol (match_length() says 0 for it)
_MATCHED_TYPES = (ContextStore, SuffixStore)

# Exploration spends at most this share of the verify time re-testing estimates the plan does not draft on,
# and re-tests at most every MAX_EXPLORE_RATE-th such step (where verification is nearly free).
EXPLORE_OVERHEAD = 0.02
MAX_EXPLORE_RATE = 0.125


def explore_rate(cost: VerifyCost) -> float:
    """The default exploration rate on ``cost``: one extra verified token costs ``c(2) / c(1) - 1`` of a
    step, so re-testing with probability ``EXPLORE_OVERHEAD / (c(2) / c(1) - 1)`` (at most
    ``MAX_EXPLORE_RATE``) spends at most ``EXPLORE_OVERHEAD`` of the time of the steps that draft nothing."""
    check_instance("cost", cost, VerifyCost, "a VerifyCost (e.g. moelab.costmodel.fit_verify_cost(qs, ms))")
    extra = float(cost.relative(2)) - 1.0
    return MAX_EXPLORE_RATE if extra <= EXPLORE_OVERHEAD / MAX_EXPLORE_RATE else EXPLORE_OVERHEAD / extra


class CostAwareDrafter(Drafter):
    """Cost-aware Hierarchy Drafting (the default HD drafter): the hierarchy's candidates, cut each step to
    the sub-tree that maximises expected accepted tokens per unit of measured verify cost
    (:func:`moelab.hd.policy.plan`, every token's acceptance learned per store and confidence class: how long a
    context the store matched, how deep into its answer the token is), within ``budget`` draft tokens; nothing when no store is confident,
    except that such a step proposes the first token of one candidate (picked at random) with probability
    ``explore`` when the request's starting estimates would have drafted there, so a low estimate is
    re-tested (an acceptance raises it again) but a cost curve that forbids drafting is not argued with.

    Parameters
    ----------
    inner : HierarchyDrafter
        The store walk (W per request; S and L shared); cost-aware HD's W keys are
        :data:`COST_AWARE_CONTEXT_KEYS`.
    cost : VerifyCost
        The target's measured verify-cost curve on this machine.
    budget : int
        Draft tokens verified per forward at most.
    chain : bool
        Propose one chain (vLLM) instead of a tree (HF).
    acceptance : AcceptanceModel, optional
        This request's running acceptance (:meth:`moelab.hd.policy.EngineAcceptance.new_request` starts one
        from an engine's prior); a fresh one from the cold-start prior by default. :meth:`start` keeps it:
        one drafter follows one request.
    explore : float, optional
        Probability in [0, 1] that a step the plan leaves empty re-tests one token; :func:`explore_rate`
        of ``cost`` by default.
    seed : int
        Seeds the exploration draws (deterministic given the seed and the drafts).
    timed : bool
        Time the engine's steps from the drafter's side (a step = from one :meth:`draft` call to the next):
        the verification of ``q = 1 +`` drafted tokens (the end of one draft to the start of the next) goes to
        ``cost`` when it is an :class:`~moelab.costmodel.verify.OnlineVerifyCost`, and the step's emitted
        tokens and whole time to ``choice``. Only where a target forward runs between two drafts (a live
        engine): a replay has none, and its near-zero gaps would teach the curve that verification is free.
    choice : PolicyChoice, optional
        The engine's choice between the plan and the hierarchy's full chain (:class:`moelab.hd.policy.PolicyChoice`;
        chains only, and only with ``timed``): each step runs the policy it picks. None: always the plan.
    """

    def __init__(self, inner: HierarchyDrafter, cost: VerifyCost, *, budget: int = 8, chain: bool = False,
                 acceptance: AcceptanceModel | None = None, explore: float | None = None, seed: int = 0,
                 timed: bool = False, choice: PolicyChoice | None = None) -> None:
        self.inner = check_instance("inner", inner, Drafter, "a Drafter (e.g. HierarchyDrafter(S, L))")
        self.cost = check_instance("cost", cost, VerifyCost, "a VerifyCost (e.g. moelab.costmodel.fit_verify_cost(qs, ms))")
        self.budget = check_budget(budget)
        self.chain = bool(chain)
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        self.explore = explore_rate(cost) if explore is None else check_acceptance("explore", explore)
        self._rng = random.Random(check_int("seed", seed, low=0))
        # the request's starting estimates, never updated: what the plan would do before any outcome
        self._untested = AcceptanceModel(self.acceptance.prior, priors=self.acceptance.priors)
        self.explored = 0  # steps that re-tested a token the plan left out
        self.letters = inner.letters
        self.name = f"{inner.name}-cost"
        super().__init__()
        self.counters = inner.counters
        self._last = Draft([], [])
        self.timed = bool(timed)
        self._online = cost if (self.timed and isinstance(cost, OnlineVerifyCost)) else None
        if choice is not None:
            check_instance("choice", choice, PolicyChoice, "a PolicyChoice (moelab.hd.policy) or None")
        self.choice = choice if (self.timed and self.chain) else None
        self.arms = [0, 0]  # steps this request ran the plan / the full chain
        self._arm = 0
        self._q = 1  # tokens the last step verifies (1 + drafted)
        self._t_start = self._t_end = -1.0  # when the last draft began and ended (perf_counter); < 0: none yet
        self._step_tokens = 0  # tokens emitted since the last draft

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.inner.start(prompt_ids)
        self.context = self.inner.context
        self._t_start = -1.0  # the gap before a request's first draft is its prefill, not a step

    def accept(self, new_tokens: Sequence[int]) -> None:
        inner = self.inner
        if type(inner) is HierarchyDrafter and type(new_tokens) is list:
            # HierarchyDrafter.accept inline (the per-step path: two frames less): the tokens' check of
            # Drafter.accept, the context, then W
            for t in new_tokens:
                if type(t) is not int or not 0 <= t < _INT64_END:
                    inner.accept(new_tokens)  # the full check: converts or raises, as it always did
                    break
            else:
                inner.context.extend(new_tokens)
                if inner._has_w:
                    inner.W.extend(new_tokens)
        else:
            inner.accept(new_tokens)
        self.context = inner.context
        self._step_tokens += len(new_tokens)

    def reset_counters(self) -> None:
        self.inner.reset_counters()
        self.counters = self.inner.counters

    def draft(self, budget: int | None = None) -> Draft:
        """The planned draft; ``budget`` lowers this step's budget (e.g. near the context limit)."""
        if self.timed:
            now = time.perf_counter()
            if self._t_start >= 0.0:  # the step since the last draft: its verification and its whole time
                online = self._online
                if type(online) is OnlineVerifyCost:  # OnlineVerifyCost.observe inline: q is in range here
                    ms = (now - self._t_end) * 1e3
                    if ms > 0.0 and ms < _INF:
                        online.observations += 1
                        pending = online._pending
                        pending.append((self._q, ms))
                        if len(pending) >= ONLINE_PENDING:
                            online._settle()
                elif online is not None:
                    online.observe(self._q, (now - self._t_end) * 1e3)
                choice = self.choice
                if type(choice) is PolicyChoice:  # PolicyChoice.record inline (a live engine's every step)
                    tokens, seconds = self._step_tokens, now - self._t_start
                    if seconds > 0.0 and seconds < _INF and tokens > 0.0:
                        arm, keep = self._arm, choice._keep
                        choice.tokens[arm] = choice.tokens[arm] * keep + tokens
                        choice.seconds[arm] = choice.seconds[arm] * keep + seconds
                        choice.steps[arm] += 1
                elif choice is not None:
                    choice.record(self._arm, self._step_tokens, now - self._t_start)
            self._t_start = now
            self._step_tokens = 0
        if budget is None:
            b = self.budget
        elif type(budget) is int and 1 <= budget:  # the per-step fast path (the checker formats its messages)
            b = min(self.budget, budget)
        else:
            b = min(self.budget, check_budget(budget))
        inner = self.inner
        d = inner.draft_chain(b) if self.chain else inner.draft()
        choice = self.choice
        if choice is None:
            arm = 0
        elif type(choice) is PolicyChoice:  # PolicyChoice.choose inline (a live engine's every step)
            u = self._rng.random()
            n0, n1 = choice.steps
            if n0 < choice.warmup or n1 < choice.warmup:
                arm = 0 if n0 <= n1 else 1  # alternate until both have their warm-up
            else:
                (t0, t1), (s0, s1) = choice.tokens, choice.seconds
                arm = 1 if (t1 / s1 if s1 > 0.0 else _NAN) > (t0 / s0 if s0 > 0.0 else _NAN) else 0
                if u < choice.explore:
                    arm = 1 - arm
            choice.chosen[arm] += 1
        else:
            arm = choice.choose(self._rng.random())
        self._arm = arm
        self.arms[arm] += 1
        kept = None  # the kept candidates' classes, where the plan gave them
        # the hierarchy's own draft (one store letter per tree candidate, one class per token); self.cost is a
        # VerifyCost (checked in __init__)
        own = type(inner) is HierarchyDrafter
        if not d.candidates and own:  # nothing drafted: nothing to plan, nothing to re-test
            cands, srcs, kept = [], [], []
        elif arm == 1:  # the hierarchy's full chain (the paper's policy), the engine's choice for this step
            cands, srcs = list(d.candidates), list(d.sources)
            if d.classes is not None:  # every candidate kept whole: its classes are the draft's
                kept = list(d.classes)
        elif own:
            # the hierarchy's own draft, well-formed by construction (one class per token): plan()'s checks
            # are skipped, and its tree pass also gives the kept candidates' classes (a chain's: its prefix)
            # (a chain straight to _plan_chain where asking again is free: an AcceptanceModel's alphas are a memo)
            got = _plan_chain(d.candidates[0], d.sources[0], d.classes[0], self.acceptance, self.cost, b) \
                if self.chain and type(self.acceptance) is AcceptanceModel else None
            if got is not None:
                cands, srcs = got
                kept = [d.classes[0][:len(cands[0])]] if cands else []
            else:
                cands, srcs, kept = _plan(d.candidates, d.sources, d.classes, self.acceptance, self.cost, b, True)
        else:
            cands, srcs = plan(d.candidates, d.sources, self.acceptance, self.cost, b, d.classes)
        if (arm == 0 and not cands and d.candidates and self.explore > 0.0 and self._rng.random() < self.explore
                and plan(d.candidates, d.sources, self._untested, self.cost, b, d.classes)[0]):
            # a re-test only where the request's own outcomes, not the cost curve, stopped the drafting: with
            # untested (prior) estimates this draft would pay, so a low estimate is what is being re-tested
            i = self._rng.randrange(len(d.candidates))
            cands, srcs = [tuple(d.candidates[i][:1])], [d.sources[i][:1]]
            kept = None
            self.explored += 1
        if arm == 1 and own and self.chain:
            last = d  # the hierarchy's chain as draft_chain made it (fresh lists, classes included): no copy
        else:
            last = Draft(cands, srcs, kept if kept is not None else _kept_classes(cands, d))
        self._last = last
        if self.timed:
            # q of the step this draft starts: the bonus token plus every drafted node (a chain: its length)
            self._q = 1 + (len(cands[0]) if self.chain and cands else len({c[:i + 1] for c in cands for i in range(len(c))}))
            self._t_end = time.perf_counter()
        if self.chain:
            return last
        # a tree's sources are one letter per candidate (the hierarchy's are already)
        return Draft(cands, list(srcs) if own else [x[:1] for x in srcs], last.classes)

    def observe(self, draft: Draft, accepted: Sequence[int]) -> None:
        last = self._last
        model = self.acceptance
        engine = model.engine if type(model) is AcceptanceModel else None
        if len(last.candidates) != 1 or last.classes is None or type(model) is not AcceptanceModel or \
                (engine is not None and type(engine) is not EngineAcceptance):
            observe(model, last.candidates, last.sources, accepted, last.classes)
            if not self.chain and type(model) is AcceptanceModel and model._log:
                model._settle()  # a tree's next draft reads every estimate it plans with: count them now
            return
        # policy.observe's chain case with AcceptanceModel.record and EngineAcceptance.record inline (a vLLM
        # row's every step; with the caches an engine's forward leaves cold, each frame costs microseconds):
        # node d was tested iff the d nodes before it were accepted; the same outcomes logged in the same order
        acc = list(map(int, accepted))
        cand, src, cls = last.candidates[0], last.sources[0], last.classes[0]
        n = len(cand)
        per_token = n > 1 and len(src) == n
        n_acc = len(acc)
        log = model._log
        elog = engine._log if engine is not None else None
        for depth in range(n):
            ok = depth < n_acc and acc[depth] == int(cand[depth])
            outcome = ((src[depth] if per_token else src[:1], False, int(cls[depth])), ok)
            log.append(outcome)
            if elog is not None:
                elog.append(outcome)
            if not ok:
                break
        if len(log) >= LOG_LIMIT or not self.chain:
            # (a tree's next draft reads every estimate it plans with: count them now; a chain's full-chain
            # steps read none, and a vLLM engine runs mostly those)
            model._settle()
        if elog is not None and len(elog) >= LOG_LIMIT:
            engine._settle()


def _kept_classes(kept: Sequence[tuple[int, ...]], draft: Draft) -> list[tuple[int, ...]] | None:
    """The confidence classes of the ``kept`` prefixes of ``draft``'s candidates: a node's class is that of
    the first candidate holding its path (the candidate that made the node in :func:`plan`'s tree)."""
    if draft.classes is None:
        return None
    if len(draft.candidates) == 1:  # a chain (vLLM): the kept prefix's classes
        return [draft.classes[0][:len(c)] for c in kept]
    # every node's path -> its class, the first candidate holding the path winning (one pass, no rescans)
    first: dict[tuple[int, ...], int] = {}
    for cand, k in zip(draft.candidates, draft.classes):
        for d in range(len(cand)):
            first.setdefault(tuple(cand[:d + 1]), k[d])
    return [tuple(first[c[:d + 1]] for d in range(len(c))) for c in kept]


__all__ = ["COST_AWARE_CONTEXT_KEYS", "EXPLORE_OVERHEAD", "MAX_EXPLORE_RATE", "STORE_LETTERS", "CostAwareDrafter", "Draft", "Drafter",
           "HierarchyDrafter", "NoDrafter", "PLDDrafter", "StoreCounters", "check_order", "explore_rate"]
