"""Lossless speculative decoding with database drafts, verified by the real model in ONE forward per step.

Each step: the drafter proposes candidate continuations; they are merged into a token tree (a trie rooted
at the last generated token, which is not in the KV cache yet); the target scores the whole tree in one
forward pass (:meth:`moelab.models.lm.LMSession.forward_tree`: 4-D ancestor mask, positions = cache
length + depth); the longest accepted path is kept in the KV cache (the rest is trimmed) and the target's
own next token is appended as the bonus token.

* Greedy (``temperature == 0``): walk the tree following the target's argmax; the output is
  token-for-token the plain greedy output.
* Sampling (``temperature > 0``): at each node, the children (deterministic drafts, draft probability 1)
  are tried in order: child ``x`` is accepted with probability ``p(x)`` under the current residual ``p``;
  on rejection ``p(x)`` is zeroed and ``p`` renormalised; if every child is rejected the bonus token is
  sampled from the residual. Each emitted token is therefore distributed exactly as ``p`` — lossless.

:func:`replay_greedy` gives the exact per-step acceptance of any drafter against a known greedy output
without running the model again (greedy acceptance depends only on the target's greedy sequence).

W holds the prompt and the accepted tokens only: this engine runs no Lookahead/Jacobi window. Whether one
would pay is :func:`moelab.hd.lookahead.hf_lookahead_enabled` (measured verify-cost curve vs an upper bound
on what a window token can bring); on this CPU it does not (HF curve ~162 + 39.4 ms per extra token: the
break-even gain, 0.175 extra tokens per window token per step, is 7.7x the bound of 0.023).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moelab._validate import check_instance, check_int, check_real, check_token_ids, rng_from
from moelab.hd.drafters import Drafter, NoDrafter
from moelab.models.lm import LMSession


@dataclass
class TokenTree:
    """Candidates merged into a trie: node 0 is the root (the last generated token)."""

    tokens: np.ndarray
    parents: np.ndarray
    sources: list[str]  # store letter of the first candidate through each node ("" for the root)
    children: dict[tuple[int, int], int]  # (parent node, token) -> child node
    child_lists: list[list[int]]

    @property
    def size(self) -> int:
        return int(self.tokens.size)


def build_tree(root: int, candidates: Sequence[Sequence[int]], sources: Sequence[str]) -> TokenTree:
    """Merge candidate continuations of ``root`` into a trie (shared prefixes become one node)."""
    tokens, parents, srcs = [int(root)], [-1], [""]
    children: dict[tuple[int, int], int] = {}
    child_lists: list[list[int]] = [[]]
    for cand, src in zip(candidates, sources):
        node = 0
        per_token = len(src) == len(cand) and len(cand) > 1  # one store letter per token (stitched chains)
        for depth, t in enumerate(cand):
            key = (node, int(t))
            nxt = children.get(key)
            if nxt is None:
                nxt = len(tokens)
                children[key] = nxt
                tokens.append(int(t))
                parents.append(node)
                srcs.append(src[depth] if per_token else src)
                child_lists.append([])
                child_lists[node].append(nxt)
            node = nxt
    return TokenTree(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64), srcs, children,
                     child_lists)


@dataclass
class StepRecord:
    """One target forward: how many tree nodes it verified and what it produced."""

    tree_size: int
    n_candidates: int
    accepted: list[int]  # accepted draft tokens (the bonus token is not included)
    sources: list[str]  # store letter per accepted draft token
    bonus: int
    draft_us: float  # drafter.draft() + drafter.accept() (store lookups and W maintenance)
    verify_ms: float  # tree building + target forward + acceptance walk + KV-cache trim


@dataclass
class GenerationResult:
    """Output and per-step records of one request."""

    prompt_len: int
    tokens: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def forwards(self) -> int:
        return len(self.steps)

    @property
    def mean_accepted(self) -> float:
        """Tokens produced per target forward (Spec-Bench's mean accepted tokens; 1.00 for AR)."""
        return len(self.tokens) / max(1, len(self.steps))

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else float("nan")


def _validate(prompt_ids: Sequence[int], max_new_tokens: int, temperature: float) -> list[int]:
    ids = check_token_ids("prompt_ids", prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must not be empty (an empty prompt gives nothing to condition on)")
    check_int("max_new_tokens", max_new_tokens, low=1)
    check_real("temperature", temperature, low=0.0)
    return ids


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def _sample(p: np.ndarray, rng: np.random.Generator) -> int:
    # inverse-CDF sampling; the last index absorbs rounding so a token is always returned
    return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"), p.size - 1))


def _walk_greedy(tree: TokenTree, logits: np.ndarray) -> tuple[list[int], int]:
    """Accepted node path (excluding the root) and the bonus token under greedy verification."""
    path: list[int] = []
    node = 0
    while True:
        target = int(np.argmax(logits[node]))
        nxt = tree.children.get((node, target))
        if nxt is None:
            return path, target
        path.append(nxt)
        node = nxt


def _walk_sample(tree: TokenTree, logits: np.ndarray, temperature: float,
                 rng: np.random.Generator) -> tuple[list[int], int]:
    """Speculative sampling over the tree with deterministic drafts (accept x w.p. residual p(x))."""
    path: list[int] = []
    node = 0
    while True:
        p = _softmax(logits[node], temperature)
        moved = False
        for child in tree.child_lists[node]:
            x = int(tree.tokens[child])
            px = p[x]
            if px > 0 and rng.random() < px:
                path.append(child)
                node = child
                moved = True
                break
            p[x] = 0.0  # rejected: the residual of a deterministic draft is p without x, renormalised
            s = p.sum()
            if s <= 0:
                break
            p /= s
        if not moved:
            return path, _sample(p, rng)


def generate(model: Any, prompt_ids: Sequence[int], drafter: Drafter | None = None, *, max_new_tokens: int = 64,
             temperature: float = 0.0, seed: int | np.random.Generator | None = 0,
             eos_token_id: int | Sequence[int] | None = None) -> GenerationResult:
    """Decode ``max_new_tokens`` tokens after ``prompt_ids`` with ``drafter`` (None: plain autoregressive).

    Parameters
    ----------
    model : transformers causal LM
    prompt_ids : sequence of int
        Non-empty prompt token ids.
    drafter : Drafter, optional
        Proposes candidates each step; None or :class:`NoDrafter` decodes one token per forward.
    max_new_tokens : int
        Stop after this many tokens (>= 1), or at EOS.
    temperature : float
        0 for greedy; > 0 samples from softmax(logits / temperature) losslessly.
    seed : int or Generator
        Seeds sampling.
    eos_token_id : int or sequence of int, optional
        Stop after emitting any of these.

    Returns
    -------
    GenerationResult
    """
    ids = _validate(prompt_ids, max_new_tokens, temperature)
    rng = rng_from(seed)
    eos = set() if eos_token_id is None else ({int(eos_token_id)} if np.isscalar(eos_token_id)
                                              else {int(e) for e in eos_token_id})
    drafter = NoDrafter() if drafter is None else check_instance("drafter", drafter, Drafter,
                                                                  "a Drafter (e.g. moelab.hd.PLDDrafter()) or None")
    drafter.start(ids)
    session = LMSession(model)
    t0 = time.perf_counter()
    session.prefill(ids[:-1])
    res = GenerationResult(prompt_len=len(ids), tokens=[])
    res.prefill_s = time.perf_counter() - t0
    root = ids[-1]
    t_dec = time.perf_counter()
    while len(res.tokens) < max_new_tokens:
        td = time.perf_counter()
        d = drafter.draft()
        draft_us = (time.perf_counter() - td) * 1e6
        tv = time.perf_counter()
        tree = build_tree(root, d.candidates, d.sources)
        logits = session.forward_tree(tree.tokens, tree.parents)
        if temperature == 0:
            path, bonus = _walk_greedy(tree, logits)
        else:
            path, bonus = _walk_sample(tree, logits, temperature, rng)
        session.commit([0, *path])
        verify_ms = (time.perf_counter() - tv) * 1e3
        accepted = [int(tree.tokens[n]) for n in path]
        drafter.observe(d, accepted)
        srcs = [tree.sources[n] for n in path]
        new = [*accepted, bonus]
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        if stop is not None:
            new = new[:stop + 1]
        new = new[:max_new_tokens - len(res.tokens)]
        # EOS or the token budget may cut the accepted path: count only the draft tokens actually kept
        accepted, srcs = accepted[:len(new)], srcs[:len(new)]
        ta = time.perf_counter()
        drafter.accept(new)
        draft_us += (time.perf_counter() - ta) * 1e6
        drafter.credit(srcs[-1] if srcs else None, len(accepted))
        res.steps.append(StepRecord(tree.size, len(d.candidates), accepted, srcs, bonus, draft_us, verify_ms))
        res.tokens.extend(new)
        root = bonus
        if stop is not None:
            break
    res.decode_s = time.perf_counter() - t_dec
    return res


def replay_greedy(drafter: Drafter, prompt_ids: Sequence[int], reference: Sequence[int]) -> GenerationResult:
    """Exact greedy acceptance of ``drafter`` against the target's known greedy output ``reference``.

    Under greedy verification a draft token is accepted iff it equals the next reference token, so the
    per-step accepted lengths (and the W store's evolution) are those of a real run; only the timing of
    the target is missing (``verify_ms`` is 0). Tested against :func:`generate` for equality.
    """
    ids = _validate(prompt_ids, max(1, len(reference)), 0.0)
    ref = check_token_ids("reference", reference)
    check_instance("drafter", drafter, Drafter, "a Drafter (e.g. moelab.hd.PLDDrafter())")
    drafter.start(ids)
    res = GenerationResult(prompt_len=len(ids), tokens=[])
    root = ids[-1]
    pos = 0
    while pos < len(ref):
        td = time.perf_counter()
        d = drafter.draft()
        draft_us = (time.perf_counter() - td) * 1e6
        tree = build_tree(root, d.candidates, d.sources)
        path: list[int] = []
        node = 0
        while pos + len(path) < len(ref):
            nxt = tree.children.get((node, ref[pos + len(path)]))
            if nxt is None:
                break
            path.append(nxt)
            node = nxt
        drafter.observe(d, [int(tree.tokens[n]) for n in path])
        n_new = min(len(path) + 1, len(ref) - pos)
        new = ref[pos:pos + n_new]
        accepted = new[:min(len(path), n_new)]
        srcs = [tree.sources[n] for n in path[:len(accepted)]]
        ta = time.perf_counter()
        drafter.accept(new)
        draft_us += (time.perf_counter() - ta) * 1e6
        drafter.credit(srcs[-1] if srcs else None, len(accepted))
        bonus = new[-1] if len(new) > len(accepted) else -1
        res.steps.append(StepRecord(tree.size, len(d.candidates), accepted, srcs, bonus, draft_us, 0.0))
        res.tokens.extend(new)
        root = new[-1]
        pos += n_new
    return res


__all__ = ["GenerationResult", "StepRecord", "TokenTree", "build_tree", "generate", "replay_greedy"]
