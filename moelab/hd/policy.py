"""Cost-aware drafting: how much of a draft is worth verifying.

Each step the hierarchy proposes candidates (a token tree, or one chain in vLLM). Every draft node gets
a probability of being accepted, ``p(node) = p(parent) * alpha(store, first-or-alternative child)``,
where ``alpha`` is the running per-store acceptance rate (accepted / tried over every node whose parent
was accepted, with a Beta(1, 1) prior), learned from the verification outcomes of earlier steps. The
expected tokens of a step that verifies the ``K`` most likely nodes are ``1 + sum(p)`` (the bonus token
always comes), its cost ``c(K + 1)``, the measured time of one target forward over ``K + 1`` tokens
(:class:`moelab.costmodel.verify.VerifyCost`). The policy keeps the ``K`` that maximises expected tokens per unit of cost,
subject to the budget; ``K = 0`` (draft nothing) wins when no store is confident enough to pay for
the extra verified tokens.

The measured cost curve is cached per machine and model (:func:`moelab.costmodel.verify.cached_verify_cost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from moelab._validate import check_int
from moelab.costmodel.verify import TABLE_MAX_Q, VerifyCost

BUDGETS = (4, 8, 16, 28)  # draft tokens verified per forward; 28 = the paper's 7 candidates x 4 tokens
MAX_BUDGET = TABLE_MAX_Q - 1  # the cost table covers every budget's K + 1 tokens


def check_budget(budget: int) -> int:
    """Validate a verification budget (draft tokens per forward, 1..64)."""
    return check_int("budget", budget, low=1, high=MAX_BUDGET)


@dataclass
class AcceptanceModel:
    """Running acceptance per (store letter, first child or alternative): accepted / tried with a Beta(1, 1)
    prior. ``tried`` counts draft nodes whose parent was accepted (only those were really tested)."""

    accepted: dict[tuple[str, bool], int] = field(default_factory=dict)
    tried: dict[tuple[str, bool], int] = field(default_factory=dict)

    def alpha(self, store: str, alternative: bool) -> float:
        key = (store, alternative)
        return (self.accepted.get(key, 0) + 1.0) / (self.tried.get(key, 0) + 2.0)

    def record(self, store: str, alternative: bool, ok: bool) -> None:
        key = (store, alternative)
        self.tried[key] = self.tried.get(key, 0) + 1
        if ok:
            self.accepted[key] = self.accepted.get(key, 0) + 1

    def table(self) -> list[dict[str, Any]]:
        return [{"store": s, "alternative": a, "tried": t, "accepted": self.accepted.get((s, a), 0),
                 "alpha": self.alpha(s, a)} for (s, a), t in sorted(self.tried.items())]


def _src_at(src: str, depth: int, n: int) -> str:
    """A candidate's store letter at ``depth``: one letter for the whole candidate, or one per token."""
    return src[depth] if len(src) == n and n > 1 else src[:1]


def _alphas(acc: dict[tuple[str, bool], int], tried: dict[tuple[str, bool], int], store: str) -> tuple[float, float]:
    """``(alpha(store, first child), alpha(store, alternative))`` from the counts (:meth:`AcceptanceModel.alpha`)."""
    return ((acc.get((store, False), 0) + 1.0) / (tried.get((store, False), 0) + 2.0),
            (acc.get((store, True), 0) + 1.0) / (tried.get((store, True), 0) + 2.0))


def plan(candidates: Sequence[Sequence[int]], sources: Sequence[str], model: AcceptanceModel, cost: VerifyCost,
         budget: int) -> tuple[list[tuple[int, ...]], list[str]]:
    """The sub-tree of ``candidates`` worth verifying (see the module docstring).

    A source is one store letter per candidate, or a string with one letter per token (chains
    stitched from several lookups). Returns the kept candidates (root-to-leaf paths of the chosen
    prefix-closed node set, in their original order, truncated) and their sources; empty lists mean
    "draft nothing this step".
    """
    if type(budget) is not int or not 1 <= budget <= MAX_BUDGET:  # the per-step fast path skips the checker
        budget = check_budget(budget)
    if not candidates:
        return [], []
    # The trie of the candidates, built one candidate at a time: a candidate shares its first ``l`` nodes
    # with the (first) earlier candidate it has the longest common prefix with, and adds ``len - l`` new
    # nodes (ids in creation order, as a node-by-node trie would number them). Plain Python: a step has a
    # dozen nodes, where numpy's per-call overhead dominates. Paths are not materialised: candidate ``i``
    # keeps ``segs[i] = (j, l, first, end)``: the candidate it branches from, ``l``, and its new node ids
    # ``first:end``, which is all the final count of its kept prefix needs.
    acc, tried = model.accepted, model.tried
    alphas: dict[str, tuple[float, float]] = {}  # store -> (alpha first child, alpha alternative), once per step
    threshold = cost.draft_threshold(budget)
    if threshold > 0.0:
        # A node's probability is a product of alphas (each <= 1 for consistent counts), so none exceeds
        # that of the root child it descends from: the first candidate's first-child alpha or a later
        # candidate's alternative alpha. Below the threshold nothing pays: no tree is needed.
        hi, first, ok = -1.0, True, True
        for cand, src in zip(candidates, sources):
            if not cand:
                continue
            for letter in (src if len(cand) > 1 and len(src) == len(cand) else (src[:1],)):
                if letter not in alphas:
                    ab = alphas[letter] = _alphas(acc, tried, letter)
                    ok = ok and ab[0] <= 1.0 and ab[1] <= 1.0
            a = alphas[src[:1]][not first]
            first = False
            if a > hi:
                hi = a
        if ok and hi < threshold:
            return [], []
    prob: list[float] = [1.0]
    root_used = False  # whether the root has a child yet (node 0's children are alternatives after the first)
    branched: set[int] = set()  # other nodes given a second child by a later candidate
    segs: list[tuple[int, int, int, int]] = []
    for i, (cand, src) in enumerate(zip(candidates, sources)):
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
            pp = prob[parent]
            for depth in range(best, n_c):
                letter = src[depth]
                ab = alphas.get(letter)
                if ab is None:
                    ab = alphas[letter] = _alphas(acc, tried, letter)
                pp *= ab[alt and depth == best]
                prob.append(pp)
        else:
            letter = src[:1]
            ab = alphas.get(letter)
            if ab is None:
                ab = alphas[letter] = _alphas(acc, tried, letter)
            pp = prob[parent] * ab[alt]
            prob.append(pp)
            a = ab[0]
            for _ in range(best + 1, n_c):  # the rest of the chain: first children
                pp *= a
                prob.append(pp)
        segs.append((j_best, best, nid, len(prob)))
    # the likeliest K nodes, for every K: expected tokens per unit of cost (the values alone suffice)
    ps = sorted(prob[1:], reverse=True)
    table = cost.table
    best_k, best_ratio, gain = 0, 1.0 / table[1], 1.0
    for k in range(1, min(budget, len(ps)) + 1):
        gain += ps[k - 1]
        r = gain / table[k + 1]
        if r > best_ratio:
            best_k, best_ratio = k, r
    if best_k == 0:
        return [], []
    # likeliest first, ties in node order (stable): parents before children (p(child) < p(parent)), so the
    # kept set is prefix-closed and a candidate's kept prefix is counted node by node
    kept = [False] * len(prob)
    for x in sorted(range(1, len(prob)), key=prob.__getitem__, reverse=True)[:best_k]:
        kept[x] = True
    ns: list[int] = []
    out, srcs = [], []
    seen: set[tuple[int, ...]] = set()
    for (j, shared, nid, end), cand, src in zip(segs, candidates, sources):
        n = min(ns[j], shared) if shared else 0  # kept nodes among those shared with candidate j
        if n == shared:
            x = nid
            while x < end and kept[x]:
                x += 1
            n += x - nid
        ns.append(n)
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
    return out, srcs


def observe(model: AcceptanceModel, candidates: Sequence[Sequence[int]], sources: Sequence[str],
            accepted: Sequence[int]) -> None:
    """Update ``model`` from one verification: ``accepted`` = the accepted draft tokens (longest accepted
    path). Every node whose parent was on the accepted path was tested: accepted iff it is the next token."""
    acc = [int(t) for t in accepted]
    tested: dict[tuple[int, int], tuple[str, bool]] = {}
    n_children: dict[int, int] = {}
    seen: dict[tuple[int, ...], int] = {(): 0}
    for cand, src in zip(candidates, sources):
        prefix: tuple[int, ...] = ()
        for depth, t in enumerate(cand):
            nxt = prefix + (int(t),)
            if nxt not in seen:
                pid = seen[prefix]
                alt = n_children.get(pid, 0) > 0
                n_children[pid] = n_children.get(pid, 0) + 1
                seen[nxt] = len(seen)
                if list(prefix) == acc[:depth]:  # parent accepted: this node was tested
                    tested[(depth, int(t))] = (_src_at(src, depth, len(cand)), alt)
            prefix = nxt
    for (depth, t), (src, alt) in tested.items():
        model.record(src, alt, depth < len(acc) and acc[depth] == t)


__all__ = ["BUDGETS", "MAX_BUDGET", "AcceptanceModel", "check_budget", "observe", "plan"]
