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

import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moelab._validate import check_instance, check_int, check_real, check_token_ids, rng_from
from moelab.hd.drafters import Draft, Drafter, NoDrafter
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


_INT64_END = 1 << 63  # token ids are stored as int64 (a larger int used to end in numpy's OverflowError)


def build_tree(root: int, candidates: Sequence[Sequence[int]], sources: Sequence[str]) -> TokenTree:
    """Merge candidate continuations of ``root`` into a trie (shared prefixes become one node).

    ``root`` and every candidate token are integer ids >= 0 (a float is refused, never truncated to another
    token); ``sources`` has one store letter (or one letter per token) for each candidate."""
    try:
        r = operator.index(root)
        cands = [tuple(map(operator.index, c)) for c in candidates]
    except TypeError:
        raise ValueError(f"root and candidates must hold integer token ids (candidates: a list of id sequences); "
                         f"got root={root!r:.30}, candidates={candidates!r:.60}") from None
    if isinstance(sources, str) or not isinstance(sources, Sequence) or len(sources) != len(cands) \
            or not all(isinstance(x, str) for x in sources):
        raise ValueError(f"sources must be a list of store letters, one per candidate ({len(cands)}); got "
                         f"{sources!r:.60}")  # zip() used to drop the candidates past the shorter list
    if not 0 <= r < _INT64_END or any(not 0 <= t < _INT64_END for c in cands for t in c):
        raise ValueError(f"root and candidates must hold token ids in [0, 2^63); got root={r}, "
                         f"candidates={candidates!r:.60}")
    tokens, parents, srcs = [r], [-1], [""]
    children: dict[tuple[int, int], int] = {}
    child_lists: list[list[int]] = [[]]
    for cand, src in zip(cands, sources):
        node = 0
        per_token = len(src) == len(cand) and len(cand) > 1  # one store letter per token (stitched chains)
        for depth, t in enumerate(cand):
            key = (node, t)
            nxt = children.get(key)
            if nxt is None:
                nxt = len(tokens)
                children[key] = nxt
                tokens.append(t)
                parents.append(node)
                srcs.append(src[depth] if per_token else src)
                child_lists.append([])
                child_lists[node].append(nxt)
            node = nxt
    return TokenTree(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64), srcs, children,
                     child_lists)


@dataclass
class StepRecord:
    """One target forward (one step of :func:`generate` or :func:`replay_greedy`): how many tree nodes it
    verified and what it produced. The step emitted ``accepted`` followed by ``bonus`` (unless ``bonus`` is
    -1, or EOS / ``max_new_tokens`` cut the step short), so ``len(accepted) + 1`` tokens on a full step.

    Attributes
    ----------
    tree_size : int
        Nodes of the token tree the target scored in this one forward: the root (the last token
        produced, not yet in the KV cache) plus every distinct draft token, the candidates' shared prefixes
        merged (:func:`build_tree`). 1 when nothing was drafted.
    n_candidates : int
        Candidate continuations the drafter returned this step (``len(draft.candidates)``, before merging).
    accepted : list of int
        The draft tokens accepted and kept, in order: the longest tree path the target confirmed, cut at EOS
        or at ``max_new_tokens``. The bonus token is not included; ``[]`` when the first draft token missed.
    sources : list of str
        The store letter of each accepted token (one per entry of ``accepted``): the letter of the first
        candidate through that tree node, or the token's own letter for a candidate with one letter per
        token.
    bonus : int
        The target's own next token after the accepted path (its argmax, or a sample from the residual when
        sampling); emitted unless EOS or ``max_new_tokens`` ended the step first. **-1** in
        :func:`replay_greedy` when the reference ran out: the step's tokens were all accepted drafts up to
        the reference's last token, so no bonus token follows (only ever on its last step).
    draft_us : float
        Microseconds the drafter took this step: ``drafter.draft()`` plus ``drafter.accept()`` (store
        lookups and the W store's upkeep).
    verify_ms : float
        Milliseconds of verification: building the tree, the target's forward over it, the acceptance walk
        and trimming the KV cache to the accepted path. 0.0 in :func:`replay_greedy` (no model runs).
    """

    tree_size: int
    n_candidates: int
    accepted: list[int]
    sources: list[str]
    bonus: int
    draft_us: float
    verify_ms: float


@dataclass
class GenerationResult:
    """Output and per-step records of one request (what :func:`generate` and :func:`replay_greedy` return).

    Attributes
    ----------
    prompt_len : int
        Tokens of the prompt.
    tokens : list of int
        The generated token ids, after the prompt (the prompt is not included).
    steps : list of StepRecord
        One record per target forward, in order.
    prefill_s : float
        Seconds of the prompt's prefill forward (0.0 in :func:`replay_greedy`).
    decode_s : float
        Seconds of the decode loop, drafting and verification together (0.0 in :func:`replay_greedy`).
    """

    prompt_len: int
    tokens: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def forwards(self) -> int:
        """Target forwards of the decode (one per step; AR needs one per token)."""
        return len(self.steps)

    @property
    def mean_accepted(self) -> float:
        """Tokens produced per target forward (Spec-Bench's mean accepted tokens; 1.00 for AR)."""
        return len(self.tokens) / max(1, len(self.steps))

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decode (NaN when nothing was timed, as in :func:`replay_greedy`)."""
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else float("nan")


def model_vocab_size(model: Any) -> int | None:
    """The token ids ``model`` can embed: its input embedding's rows (the bound past which a forward fails
    with a bare ``IndexError``), else ``config.vocab_size``; None when the model states neither."""
    emb = getattr(model, "get_input_embeddings", None)
    rows = getattr(emb(), "num_embeddings", None) if callable(emb) else None
    if rows is None:
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
    return None if rows is None else int(rows)


def drafter_label(drafter: Any) -> str:
    """How messages name a drafter: its class and its ``name`` (``PLDDrafter 'PLD'``); a string is its own label."""
    if isinstance(drafter, str):
        return drafter
    name = getattr(drafter, "name", None)
    return f"{type(drafter).__name__} {name!r}" if name is not None else type(drafter).__name__


def check_draft_ids(drafter: Any, candidates: Sequence[Sequence[int]], vocab_size: int | None) -> None:
    """Every token of ``candidates`` (a drafter's proposal, on its way into verification) is an integer id
    in ``[0, vocab_size)``, else a ``ValueError`` naming the drafter, the id and the vocabulary size.

    HD's boundary with the target: a drafter whose stores were built for another tokenizer (or a buggy one)
    would otherwise crash the target's embedding lookup with a bare torch ``IndexError``, or have a float
    id silently truncated to another token. ``vocab_size=None`` checks only that the ids are integers >= 0."""
    for cand in candidates:
        for t in cand:
            if type(t) is int and 0 <= t and (vocab_size is None or t < vocab_size):
                continue  # the common case: a plain int in range
            try:
                v = operator.index(t)
            except TypeError:
                raise ValueError(f"drafter {drafter_label(drafter)} proposed a non-integer token id {t!r} "
                                 f"(type {type(t).__name__}); token ids are integers in [0, vocab_size="
                                 f"{vocab_size})") from None
            if v < 0 or (vocab_size is not None and v >= vocab_size):
                raise ValueError(f"drafter {drafter_label(drafter)} proposed token id {v}, outside the target's "
                                 f"vocabulary [0, vocab_size={vocab_size}) (were its stores built for another "
                                 "tokenizer?)")


def check_draft(drafter: Drafter, draft: Any, vocab_size: int | None) -> None:
    """A drafter's whole proposal on its way into verification: a :class:`~moelab.hd.drafters.Draft` with one
    source per candidate, every source made of the drafter's declared :attr:`~moelab.hd.drafters.Drafter.letters`
    (a letter it never declared would be credited to no store, its counters silently lost), and every token
    id checked by :func:`check_draft_ids`; else a ``ValueError`` naming the drafter."""
    if not isinstance(draft, Draft):
        raise ValueError(f"drafter {drafter_label(drafter)}.draft() returned {type(draft).__name__}; it must "
                             "return a moelab.hd.Draft(candidates, sources)")
    cands, srcs = draft.candidates, draft.sources
    if len(srcs) != len(cands):
        raise ValueError(f"drafter {drafter_label(drafter)} returned {len(cands)} candidates but {len(srcs)} "
                         "sources; a Draft needs one source (store letter) per candidate")
    letters = drafter.letters
    for src in srcs:
        if not (type(src) is str and src and (src in letters or all(ch in letters for ch in src))):
            raise ValueError(f"drafter {drafter_label(drafter)} named source {src!r}, not made of its declared "
                             f"store letters {letters!r} (set the class attribute letters to every store it drafts from)")
    check_draft_ids(drafter, cands, vocab_size)


def _validate(prompt_ids: Sequence[int], max_new_tokens: int, temperature: float,
              vocab_size: int | None = None) -> list[int]:
    ids = check_token_ids("prompt_ids", prompt_ids, vocab_size=vocab_size)
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
        The target: any ``transformers`` model with a causal-LM head (as :func:`moelab.models.load_lm` returns it).
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
    vocab = model_vocab_size(model)
    ids = _validate(prompt_ids, max_new_tokens, temperature, vocab)  # prompt ids past the vocabulary, named
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
        check_draft(drafter, d, vocab)  # before the target's embedding lookup sees them
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
    ref = check_token_ids("reference", reference)  # first: len() of a scalar was a bare TypeError
    ids = _validate(prompt_ids, max(1, len(ref)), 0.0)
    check_instance("drafter", drafter, Drafter, "a Drafter (e.g. moelab.hd.PLDDrafter())")
    drafter.start(ids)
    res = GenerationResult(prompt_len=len(ids), tokens=[])
    root = ids[-1]
    pos = 0
    while pos < len(ref):
        td = time.perf_counter()
        d = drafter.draft()
        draft_us = (time.perf_counter() - td) * 1e6
        check_draft(drafter, d, None)  # no target here: integers >= 0, named by drafter
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


__all__ = ["GenerationResult", "StepRecord", "TokenTree", "build_tree", "check_draft", "check_draft_ids", "drafter_label", "generate",
           "model_vocab_size", "replay_greedy"]
