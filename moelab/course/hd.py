"""Notebook 02 (Hierarchy Drafting) as a lesson: its worked example and its exercises, easy to hard.

The worked example is one verification step on a toy word-level input, computed by :mod:`moelab.hd`'s
own parts (:class:`~moelab.hd.HierarchyDrafter` over real :class:`~moelab.hd.ContextStore`,
:class:`~moelab.hd.NGramTable` and :class:`~moelab.hd.SuffixStore` stores, verified by
:func:`~moelab.hd.replay_greedy` against the toy target's greedy continuation). Every expected answer
is computed the same way from the context the notebook passes, never typed in. Importing this module
registers the exercises in :data:`moelab.course.check.EXERCISES` under ``"02.<id>"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from moelab._validate import check_int
from moelab.costmodel.verify import VerifyCost
from moelab.course.check import Feedback, _describe, check_callable, check_number, exercise
from moelab.hd.decode import GenerationResult, replay_greedy
from moelab.hd.drafters import Draft, Drafter, HierarchyDrafter, check_order
from moelab.hd.ngram import NGramTable
from moelab.hd.suffix import SuffixStore

NOTEBOOK = "02"

# The toy input of the worked example (words stand for tokens). The request's own text repeats
# "the cat", so W has a continuation; S holds the toy target's earlier outputs; L is a tiny corpus.
TOY_PROMPT = "the cat sat on the mat . the cat"
TOY_MODEL_OUTPUTS = ("the cat sat on a mat .", "the cat ran away from it .")
TOY_CORPUS = ("a cat sat on a chair .", "the dog sat on the mat .")
#: what the toy target decodes greedily after the prompt (its argmax token at every position)
TOY_TARGET = "sat on a rug . the end"
#: the exercise's target: the same prompt, stores and candidates, another greedy continuation (so the worked
#: example's answer is not the exercise's)
TOY_EXERCISE_TARGET = "sat on a chair . the end"
TOY_LENGTH = 4  # tokens per candidate, as in the paper


@dataclass(frozen=True)
class ToyStores:
    """The worked example's vocabulary, stores and token ids."""

    vocab: list[str]
    S: NGramTable
    L: SuffixStore
    prompt: list[int]
    target: list[int]

    def words(self, ids: Sequence[int]) -> list[str]:
        """The words of token ``ids``."""
        return [self.vocab[int(i)] for i in ids]


def toy_stores(target: str = TOY_TARGET) -> ToyStores:
    """Build the toy stores: S from :data:`TOY_MODEL_OUTPUTS`, L from :data:`TOY_CORPUS` (W is per request);
    ``target`` is the toy target's greedy continuation (its words must be in the toy vocabulary)."""
    texts = [TOY_PROMPT, *TOY_MODEL_OUTPUTS, *TOY_CORPUS, TOY_TARGET, TOY_EXERCISE_TARGET]
    vocab = sorted({w for t in texts for w in t.split()})
    index = {w: i for i, w in enumerate(vocab)}

    def ids(text: str) -> list[int]:
        unknown = [w for w in text.split() if w not in index]
        if unknown:
            raise ValueError(f"target words must be in the toy vocabulary {vocab}; got unknown {unknown}")
        return [index[w] for w in text.split()]

    S = NGramTable.build([ids(t) for t in TOY_MODEL_OUTPUTS], key_lengths=(1, 2), length=TOY_LENGTH)
    L = SuffixStore.build([ids(t) for t in TOY_CORPUS], vocab_size=len(vocab), length=TOY_LENGTH)
    return ToyStores(vocab, S, L, ids(TOY_PROMPT), ids(target))


def _check_candidates(candidates: int) -> int:
    return check_int("candidates", candidates, low=1, high=16)


def toy_drafter(stores: ToyStores, *, order: str = "WSL", candidates: int = 4) -> HierarchyDrafter:
    """The paper's fixed hierarchy over the toy stores: ``candidates`` candidates of :data:`TOY_LENGTH` tokens."""
    return HierarchyDrafter(stores.S, stores.L, order=check_order(order), max_candidates=_check_candidates(candidates),
                            length=TOY_LENGTH)


def worked_step(*, order: str = "WSL", candidates: int = 4, target: str = TOY_TARGET) -> dict[str, Any]:
    """One verification step of the fixed hierarchy on the toy input, computed by :mod:`moelab.hd`.

    ``target`` is the toy target's greedy continuation (default :data:`TOY_TARGET`, the worked example's;
    the exercise uses :data:`TOY_EXERCISE_TARGET`).

    Returns
    -------
    dict
        ``candidates``: a table (candidate words, the store it came from, how many of its tokens the
        target accepts); ``accepted``: the accepted draft words; ``sources``: their store letters;
        ``bonus``: the target's own next word; ``tokens``: tokens the step produced (accepted + 1);
        ``chain``: the single chain the walk drafts when only one candidate is verified (vLLM's case),
        with its store letter and accepted count; ``walk``: candidates each store supplied (``None``: not
        asked); ``diagram``: :func:`moelab.viz.diagrams.hd_walk_diagram`'s arguments for this step.
    """
    toy = toy_stores(target)
    drafter = toy_drafter(toy, order=order, candidates=candidates)
    drafter.start(toy.prompt)
    draft = drafter.draft()
    rows = []
    for cand, src in zip(draft.candidates, draft.sources):
        rows.append({"candidate": " ".join(toy.words(cand)), "store": src,
                     "accepted draft tokens (m)": tokens_per_step(cand, toy.target) - 1})
    step = replay_greedy(toy_drafter(toy, order=order, candidates=candidates), toy.prompt, toy.target).steps[0]
    chain_drafter = toy_drafter(toy, order=order, candidates=1)
    chain_drafter.start(toy.prompt)
    chain = chain_drafter.draft_chain(TOY_LENGTH)
    chain_ids = chain.candidates[0] if chain.candidates else ()
    # the walk as it ran: candidates per store; a store is asked only while fewer than `candidates` are held
    letters = [str(src)[:1] for src in draft.sources]
    last = max((order.index(k) for k in letters), default=len(order) - 1)
    asked = order if len(letters) < candidates else order[:last + 1]
    walk = {k: (letters.count(k) if k in asked else None) for k in "WSL"}
    accepted_words = toy.words(step.accepted)
    bonus = toy.words([step.bonus])[0] if step.bonus >= 0 else ""
    first = [str(s)[:1] for s in step.sources] or letters[:1] or [order[0]]
    # the diagram draws this step: the accepted path (or, when nothing is accepted, the first candidate) and the bonus
    path = accepted_words or (rows[0]["candidate"].split() if rows else [])
    path_sources = [str(s)[:1] for s in step.sources] if accepted_words else [first[0]] * len(path)
    diagram = {"draft": path[:8], "accepted": min(len(accepted_words), len(path[:8])), "target_token": bonus,
               "stores_hit": first[0], "store_candidates": walk, "token_sources": path_sources[:8]}
    return {"candidates": pd.DataFrame(rows), "accepted": toy.words(step.accepted), "sources": list(step.sources),
            "walk": walk, "diagram": diagram,
            "bonus": toy.words([step.bonus])[0] if step.bonus >= 0 else "", "tokens": len(step.accepted) + 1,
            "chain": {"draft": toy.words(chain_ids), "store": chain.sources[0][:1] if chain.sources else "",
                      "accepted": tokens_per_step(chain_ids, toy.target) - 1,
                      "target_token": toy.words([toy.target[tokens_per_step(chain_ids, toy.target) - 1]])[0]},
            "prompt": TOY_PROMPT, "target": target}


def walk_caption(walk: dict[str, int | None], *, order: str = "WSL", candidates: int = 4) -> str:
    """One sentence on a drawn walk: how many candidates each store supplied, in the order they were asked, and
    which stores were never asked (or why every one was).

    Parameters
    ----------
    walk : dict
        ``worked_step(...)["walk"]``: candidates each store supplied (``None``: not asked).
    order : str
        The order the walk asks the stores in (the one given to :func:`worked_step`).
    candidates : int
        The most candidates the walk holds (:func:`worked_step`'s ``candidates``).

    Returns
    -------
    str
        Markdown, e.g. "W supplied 1 candidate, S 2 and L 1: every store was asked, because the list held
        fewer than 4 candidates until L answered."
    """
    asked = [k for k in order if walk.get(k) is not None]
    never = [k for k in order if walk.get(k) is None]
    held = sum(int(walk[k] or 0) for k in asked)
    if not asked:
        return "No store was asked."
    counts = [f"{asked[0]} supplied {walk[asked[0]]} candidate{'s' if walk[asked[0]] != 1 else ''}",
              *(f"{k} {walk[k]}" for k in asked[1:])]
    listed = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
    if never:
        return (f"{listed}: the list held its {candidates} candidates after {asked[-1]}, so "
                f"{' and '.join(never)} {'was' if len(never) == 1 else 'were'} never asked.")
    if held >= candidates:
        return (f"{listed}: every store was asked, because the list held fewer than {candidates} candidates "
                f"until {asked[-1]} answered.")
    return f"{listed}: every store was asked, and together they held {held} of the {candidates} candidates allowed."


class _OneDraft(Drafter):
    """Proposes one fixed candidate at the first step, nothing afterwards (the reference for one step)."""

    name = "one draft"
    letters = "W"

    def __init__(self, candidate: Sequence[int]) -> None:
        super().__init__()
        self._candidate = tuple(int(t) for t in candidate)
        self._used = False

    def draft(self) -> Draft:
        if self._used or not self._candidate:
            return Draft([], [])
        self._used = True
        return Draft([self._candidate], ["W"])


def tokens_per_step(draft: Sequence[int], target: Sequence[int]) -> int:
    """Tokens one greedy verification step of a single chain ``draft`` produces when the target's greedy
    continuation is ``target``: the accepted prefix plus the target's own next token (computed by
    :func:`moelab.hd.replay_greedy`).

    Raises
    ------
    ValueError
        When ``target`` is not longer than ``draft`` (the step needs the token after the draft).
    """
    draft, target = [int(t) for t in draft], [int(t) for t in target]
    if len(target) <= len(draft):
        raise ValueError(f"target must be longer than draft (it holds the token after the draft); "
                         f"got {len(target)} target and {len(draft)} draft tokens")
    # a context token the draft cannot collide with: replay only reads it as the root of the tree
    root = max([*draft, *target], default=0) + 1
    step = replay_greedy(_OneDraft(draft), [root], target[:len(draft) + 1]).steps[0]
    return len(step.accepted) + 1


# 02.step_tokens (easy) -------------------------------------------------------------------------------
def check_step_tokens(answer: object, *, order: str = "WSL", candidates: int = 4,
                      target: str = TOY_EXERCISE_TARGET, **_: object) -> Feedback:
    """``answer`` should be the tokens the worked example's step (its stores, walk and candidates) produces when
    the target's greedy continuation is ``target`` (accepted draft + the bonus)."""
    step = worked_step(order=order, candidates=candidates, target=target)
    worked = worked_step(order=order, candidates=candidates)
    first = step["candidates"]["accepted draft tokens (m)"].iloc[0] if len(step["candidates"]) else 0
    slips = [(float(len(step["accepted"])), "the accepted draft tokens alone: the same forward also gives the "
                                            "target's own next token, which counts too"),
             (float(first + 1), "the first candidate alone: all the candidates are verified in one forward and "
                                "the step keeps the longest agreeing prefix over all of them")]
    if target != TOY_TARGET:
        slips.append((float(worked["tokens"]), "the worked example's step: its target continues differently"))
    return check_number("tokens", answer, step["tokens"], rtol=0.0, atol=0.0, slips=slips,
                        hint="check every candidate against the target token by token and stop at its first "
                             "mismatch; the step keeps the longest agreeing prefix over all candidates and adds the "
                             "target's own next token.")


_STEP_DEFAULTS = {"order": "WSL", "candidates": 4, "target": TOY_EXERCISE_TARGET}
exercise(NOTEBOOK, "step_tokens", "easy",
         "The worked example's candidates, verified against another target continuation: how many tokens does the "
         "step produce? Assign the number to `answer`.",
         check_step_tokens,
         solution=lambda *, order="WSL", candidates=4, target=TOY_EXERCISE_TARGET, **_:
             worked_step(order=order, candidates=candidates, target=target)["tokens"],
         wrong=lambda *, order="WSL", candidates=4, target=TOY_EXERCISE_TARGET, **_:
             len(worked_step(order=order, candidates=candidates, target=target)["accepted"]),
         context=_STEP_DEFAULTS)


# 02.accept_chain (medium) ----------------------------------------------------------------------------
_CHAIN_CASES = (((1, 2, 9, 4), (1, 2, 3, 4, 5)), ((5, 6), (5, 6, 7)), ((8, 1, 2), (1, 2, 3, 4)),
                ((), (3,)), ((4, 4, 4), (4, 4, 5, 4)))


def chain_cases() -> list[tuple[tuple, float]]:
    """``((draft, target), tokens)`` cases for ``tokens_per_step``, the tokens computed by the library."""
    return [((d, t), float(tokens_per_step(d, t))) for d, t in _CHAIN_CASES]


def check_accept_chain(answer: object, **_: object) -> Feedback:
    """``answer`` should be a function ``tokens_per_step(draft, target)`` implementing greedy acceptance."""
    return check_callable("tokens_per_step", answer, chain_cases(), rtol=0.0,
                          hint="walk the draft from its first token and stop at the FIRST token that differs from "
                               "the target's; later matches do not count. Then add one for the target's own token.")


def _solution_tokens_per_step(draft: Sequence[int], target: Sequence[int]) -> int:
    m = 0
    while m < len(draft) and draft[m] == target[m]:
        m += 1
    return m + 1


def _wrong_tokens_per_step(draft: Sequence[int], target: Sequence[int]) -> int:
    # counts every position that matches, not only the prefix
    return int(sum(d == t for d, t in zip(draft, target))) + 1


exercise(NOTEBOOK, "accept_chain", "medium",
         "Write `answer = tokens_per_step`, a function (draft, target) -> tokens one greedy verification produces.",
         check_accept_chain, solution=lambda **_: _solution_tokens_per_step,
         wrong=lambda **_: _wrong_tokens_per_step, context={})


# 02.speedup_bound (medium) ---------------------------------------------------------------------------
def speedup_bound(*, qs: Sequence[int], ms: Sequence[float], a: float, q: int) -> float:
    """Speedup over AR if every forward verified ``q`` tokens and produced ``a`` tokens (drafting free):
    ``a * t(1) / t(q)`` on the verify-cost curve ``(qs, ms)``."""
    cost = VerifyCost(qs=list(qs), ms=list(ms))
    return float(a * cost(1) / cost(check_int("q", q, low=1)))


def check_speedup_bound(answer: object, *, qs: Sequence[int], ms: Sequence[float], a: float, q: int,
                        **_: object) -> Feedback:
    """``answer`` should be ``a t(1) / t(q)`` on the notebook's measured verify-cost curve."""
    cost = VerifyCost(qs=list(qs), ms=list(ms))
    return check_number("speedup", answer, speedup_bound(qs=qs, ms=ms, a=a, q=q), rtol=0.02,
                        hint=f"on the cached curve `cost` (the values printed above the answer cell), AR spends "
                             f"t(1) = {float(cost(1)):.3g} ms per token; a speculative forward spends "
                             f"t(q) = {float(cost(q)):.3g} ms at q = {q} and yields a = {a:.3g} tokens.")


_SPEEDUP_DEFAULTS = {"qs": [1, 2, 9], "ms": [10.0, 14.0, 16.0], "a": 2.0, "q": 9}
exercise(NOTEBOOK, "speedup_bound", "medium",
         "If every forward verified q = BUDGET + 1 tokens and yielded the demo's tokens per forward a, what would "
         "decoding's speed be relative to AR, drafting free (a ratio: below 1 is slower)?", check_speedup_bound,
         solution=lambda **ctx: speedup_bound(**{k: ctx[k] for k in ("qs", "ms", "a", "q")}),
         wrong=lambda *, a, **_: float(a),  # forgets that a bigger forward costs more
         context=_SPEEDUP_DEFAULTS)


# 02.walk_sources (hard) ------------------------------------------------------------------------------
def walk_sources(*, order: str, candidates: int) -> str:
    """The store letter of each candidate the fixed hierarchy drafts on the toy input, in order (e.g. ``"WSS"``)."""
    toy = toy_stores()
    drafter = toy_drafter(toy, order=order, candidates=candidates)
    drafter.start(toy.prompt)
    return "".join(drafter.draft().sources)


def check_walk_sources(answer: object, *, walk_order: str, walk_candidates: int, **_: object) -> Feedback:
    """``answer`` should be the store letters of the candidates drafted with ``walk_order``."""
    expected = walk_sources(order=walk_order, candidates=walk_candidates)
    hint = (f"walk the stores in the order {walk_order!r}, take each store's distinct continuations of the last "
            "tokens (the longest matching key first) until you hold "
            f"{walk_candidates} candidates; a continuation an earlier store already gave is skipped.")
    if not isinstance(answer, str):
        return Feedback(False, f"expected a string of store letters such as 'WS' for `walk`, got "
                               f"{_describe(answer)}. Hint: {hint}")
    got = str.upper(str.strip(answer))  # str's own methods: a str subclass cannot override them here
    if not got or set(got) - set("WSL"):
        return Feedback(False, f"`walk` must be a string of the store letters W, S and L, one per candidate; got "
                               f"{_describe(answer)}. Hint: {hint}")
    if got == expected:
        return Feedback(True, "`walk` is right: one store letter per candidate, in the order the walk collects them.")
    if sorted(got) == sorted(expected):
        return Feedback(False, f"`walk` = {got!r} has the right stores in the wrong order. Hint: {hint}")
    return Feedback(False, f"`walk` = {got!r} is not the walk (expected one letter per candidate, "
                           f"{len(expected)} candidates). Hint: {hint}")


_WALK_DEFAULTS = {"walk_order": "LSW", "walk_candidates": 3}
exercise(NOTEBOOK, "walk_sources", "hard",
         "With the toy stores walked in the order WALK_ORDER for WALK_CANDIDATES candidates, which store supplies "
         "each candidate? Answer a string of letters such as 'WS'.", check_walk_sources,
         solution=lambda *, walk_order, walk_candidates, **_: walk_sources(order=walk_order,
                                                                          candidates=walk_candidates),
         wrong=lambda *, walk_order, walk_candidates, **_: walk_order[:walk_candidates],  # one candidate per store
         context=_WALK_DEFAULTS)


def _step_tokens(result: GenerationResult) -> list[int]:
    """Tokens each step of ``result`` emitted: its accepted drafts plus the bonus, the last step cut to the
    tokens the request actually kept (EOS or ``max_new_tokens`` can end it early)."""
    per = [len(st.accepted) + 1 for st in result.steps]
    if per:
        per[-1] -= max(0, sum(per) - len(result.tokens))
    return per


def speed_breakdown(spec: GenerationResult, plain: GenerationResult,
                    cost: VerifyCost | None = None) -> dict[str, float]:
    """Why one speculatively decoded request is as fast (or as slow) as it is against plain decoding of the same
    request: tokens per forward against what one forward costs.

    Both runs emit the same tokens (greedy, lossless), and plain decoding runs one forward per token, so the
    speed-up is exactly ``a / cost_ratio``: tokens per forward over the time of a speculative forward in plain
    forwards. Both conditions are checked: runs that emit different tokens, or a plain run with other than one
    forward per token, are refused (the identity would not hold).

    Parameters
    ----------
    spec : GenerationResult
        The speculative run (:func:`moelab.hd.generate` with a drafter).
    plain : GenerationResult
        Plain decoding of the same request (:func:`moelab.hd.generate` without a drafter), timed alike.
    cost : VerifyCost, optional
        The verify-cost curve the drafter planned with; adds ``planned_break_even``, the mean of
        ``cost(q) / cost(1)`` over the drafting forwards: the tokens a drafting forward had to yield to pay on
        that curve.

    Returns
    -------
    dict
        ``a`` (tokens per forward), ``forwards``, ``tokens``; ``q_mean`` (tokens each forward processed: the last
        token plus the drafted ones, the token tree's size); ``drafting_forwards`` (forwards that verified a
        draft), ``drafted`` and ``accepted`` (draft tokens verified and kept over the run), ``acceptance``
        (their ratio), ``a_drafting`` (tokens per drafting forward); ``plain_forward_ms``, ``forward_ms`` (a
        speculative forward with its drafting), ``verify_ms_drafting`` (the verification of a drafting forward),
        ``verify_ratio_drafting`` (that over a plain forward), ``draft_ms`` (drafting per forward),
        ``draft_share`` (of a speculative forward), ``cost_ratio`` (a speculative forward in plain forwards) and
        ``speedup`` (plain decode time over speculative decode time).

    Raises
    ------
    ValueError
        If either run has no step or was not timed, if the two runs emitted different tokens, or if ``plain``
        did not run one forward per token.
    """
    if not spec.steps or not plain.steps:
        raise ValueError("both runs need at least one decode step")
    if list(plain.tokens) != list(spec.tokens):
        first = next((i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens)) if a != b),
                     min(len(plain.tokens), len(spec.tokens)))
        raise ValueError(f"spec and plain must emit the same tokens (the same request, greedy); they differ from "
                         f"token {first} on ({len(spec.tokens)} against {len(plain.tokens)} tokens), so the speed-up "
                         "is not a / cost_ratio")
    if plain.forwards != len(plain.tokens):
        raise ValueError(f"plain must run one forward per token (decoding without a drafter); it ran {plain.forwards} "
                         f"forwards for {len(plain.tokens)} tokens, so the speed-up is not a / cost_ratio")
    if spec.decode_s <= 0 or plain.decode_s <= 0:
        raise ValueError("both runs must be timed (generate, not replay_greedy)")
    tokens = _step_tokens(spec)
    drafting = [i for i, st in enumerate(spec.steps) if st.tree_size > 1]
    drafted = sum(spec.steps[i].tree_size - 1 for i in drafting)
    accepted = sum(len(st.accepted) for st in spec.steps)
    plain_ms = plain.decode_s / plain.forwards * 1e3
    forward_ms = spec.decode_s / spec.forwards * 1e3
    verify_drafting = float(np.mean([spec.steps[i].verify_ms for i in drafting])) if drafting else float("nan")
    draft_ms = float(np.mean([st.draft_us for st in spec.steps])) / 1e3
    extra = {} if cost is None else {"planned_break_even": float(np.mean(
        [float(cost(spec.steps[i].tree_size)) / float(cost(1)) for i in drafting])) if drafting else float("nan")}
    return extra | {"tokens": len(spec.tokens), "forwards": spec.forwards, "a": spec.mean_accepted,
            "q_mean": float(np.mean([st.tree_size for st in spec.steps])),
            "drafting_forwards": len(drafting), "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else float("nan"),
            "a_drafting": float(np.mean([tokens[i] for i in drafting])) if drafting else float("nan"),
            "plain_forward_ms": plain_ms, "forward_ms": forward_ms, "verify_ms_drafting": verify_drafting,
            "verify_ratio_drafting": verify_drafting / plain_ms, "draft_ms": draft_ms,
            "draft_share": draft_ms / forward_ms, "cost_ratio": forward_ms / plain_ms,
            "speedup": plain.decode_s / spec.decode_s}


def first_tokens(result: GenerationResult, n: int) -> dict[str, float]:
    """The forwards ``result`` took for its first ``n`` tokens and its tokens per forward over them.

    Parameters
    ----------
    result : GenerationResult
        A decoded request (:func:`moelab.hd.generate`, with or without a drafter).
    n : int
        Tokens to count (>= 1); capped at the tokens ``result`` has.

    Returns
    -------
    dict
        ``tokens`` (``n`` after the cap), ``forwards`` (the forwards until those tokens were emitted; the last
        one may emit more than needed) and ``a`` (``tokens / forwards``).
    """
    n = min(check_int("n", n, low=1), len(result.tokens))
    done, forwards = 0, 0
    for k in _step_tokens(result):
        if done >= n:
            break
        done, forwards = done + k, forwards + 1
    return {"tokens": n, "forwards": forwards, "a": n / max(1, forwards)}


def slice_breakdown(questions: pd.DataFrame, steps: pd.DataFrame, method: str) -> dict[str, float]:
    """Tokens per forward, tokens processed per forward and (where ``method`` ran for real) the cost of its
    forwards against plain decoding's over a Spec-Bench slice.

    Parameters
    ----------
    questions : pandas.DataFrame
        One row per (``method``, ``question_id``) with ``new_tokens``, ``forwards``, ``measured`` and
        ``decode_s`` (:class:`moelab.hd.experiments.SpecBenchRun`'s ``questions``).
    steps : pandas.DataFrame
        One row per decode step with ``method``, ``mode`` (``"run"`` or ``"replay"``), ``tree_size`` and
        ``accepted`` (the run's ``steps``).
    method : str
        The method to break down, as named in ``questions`` (e.g. ``"HD-cost@8"``).

    Returns
    -------
    dict
        ``a`` and ``q_mean`` (over the slice's steps of ``method``: the real run's where it ran for real, else the
        exact replay's), ``acceptance`` (accepted over drafted tokens); for a measured method also
        ``forward_ms``, ``plain_forward_ms`` (AR's on the same questions), ``cost_ratio`` (their ratio) and
        ``speedup_total`` (AR's total decode time over the method's: ``a / cost_ratio``).

    Raises
    ------
    ValueError
        If ``method`` is not in the slice, or if it ran for real on a question that AR did not (its cost would be
        priced against plain decoding on fewer questions); the missing questions are named.
    """
    rows = questions[questions["method"] == method]
    if rows.empty:
        raise ValueError(f"method {method!r} is not in the slice; methods: {sorted(questions['method'].unique())}")
    own = steps[steps["method"] == method]
    measured = bool(rows["measured"].all())
    mode = "run" if measured and (own["mode"] == "run").any() else "replay"
    own = own[own["mode"] == mode]
    drafted = float((own["tree_size"] - 1).sum())
    out: dict[str, float] = {"a": float(rows["new_tokens"].sum() / max(1, rows["forwards"].sum())),
                             "q_mean": float(own["tree_size"].mean()),
                             "acceptance": float(own["accepted"].sum() / drafted) if drafted else float("nan")}
    if measured:
        ar = questions[(questions["method"] == "AR") & questions["question_id"].isin(rows["question_id"])]
        missing = sorted(set(rows["question_id"]) - set(ar["question_id"]))
        if missing:
            raise ValueError(f"AR (plain decoding) is missing question{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(str, missing))} of {method!r}: its forwards cannot be priced against "
                             "plain decoding on the same questions")
        forward_ms = float(rows["decode_s"].sum() / rows["forwards"].sum() * 1e3)
        plain_ms = float(ar["decode_s"].sum() / ar["forwards"].sum() * 1e3)
        out.update({"forward_ms": forward_ms, "plain_forward_ms": plain_ms, "cost_ratio": forward_ms / plain_ms,
                    "speedup_total": float(ar["decode_s"].sum() / rows["decode_s"].sum())})
    return out


def policy_contrast(questions: pd.DataFrame, steps: pd.DataFrame, summary: pd.DataFrame, methods: Sequence[str],
                    category: str, cost: VerifyCost | None = None) -> dict[str, dict[str, Any]]:
    """What each of ``methods`` did on one Spec-Bench ``category`` of a slice: the numbers that explain why one
    produced more tokens per forward than another (e.g. HD (cost-aware) ahead of HD (paper, fixed)).

    Parameters
    ----------
    questions, steps : pandas.DataFrame
        :class:`moelab.hd.experiments.SpecBenchRun`'s ``questions`` and ``steps``.
    summary : pandas.DataFrame
        Its :meth:`~moelab.hd.experiments.SpecBenchRun.summary` (per-store hit rates).
    methods : sequence of str
        Row labels, e.g. ``("HD-cost@8", "HD-fixed@8")``.
    category : str
        The category.
    cost : VerifyCost, optional
        A verify-cost curve: adds ``verify_ratio``, what a forward of the method's mean tree size costs in
        single-token forwards on it.

    Returns
    -------
    dict
        Per method: ``questions``, ``tokens``, ``forwards``, ``a`` (tokens per forward), ``drafting_forwards``,
        ``misses`` (drafting forwards that accepted no draft token), ``accepted`` (draft tokens accepted, m summed),
        ``longest`` (the most draft tokens one forward accepted), ``no_bonus`` (forwards whose accepted draft
        tokens already reached the end of the output, the token limit or EOS, so no bonus token followed:
        ``tokens == forwards + accepted - no_bonus``), ``tree_mean`` (tokens a forward processed),
        ``store_accepted`` (accepted draft tokens per store letter) and ``hit_rate`` (per store, the summary's
        lookup-hit rate), the exact replay's steps (every method has them).

    Raises
    ------
    ValueError
        If a method has no row of ``category`` in the slice.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        rows = questions[(questions["method"] == m) & (questions["category"] == category)]
        st = steps[(steps["method"] == m) & (steps["category"] == category) & (steps["mode"] == "replay")]
        if rows.empty or st.empty:
            raise ValueError(f"{m!r} has no {category!r} question in the slice")
        drafting = st[st["tree_size"] > 1]
        letters = "".join(str(x) for x in st["sources"].fillna(""))
        srow = summary[(summary["method"] == m) & (summary["category"] == category)]
        info: dict[str, Any] = {
            "questions": int(len(rows)), "tokens": int(rows["new_tokens"].sum()), "forwards": int(len(st)),
            "a": float(rows["new_tokens"].sum() / len(st)), "drafting_forwards": int(len(drafting)),
            "misses": int((drafting["accepted"] == 0).sum()), "accepted": int(st["accepted"].sum()),
            "longest": int(st["accepted"].max()),
            "no_bonus": int(len(st) + st["accepted"].sum() - rows["new_tokens"].sum()),
            "tree_mean": float(st["tree_size"].mean()),
            "store_accepted": {k: letters.count(k) for k in "WSL"},
            "hit_rate": {k: float(srow[f"{k}_hit_rate"].iloc[0]) for k in "WSL"
                         if len(srow) and f"{k}_hit_rate" in srow and pd.notna(srow[f"{k}_hit_rate"].iloc[0])}}
        if cost is not None:
            info["verify_ratio"] = float(cost(info["tree_mean"]) / cost(1))
        out[m] = info
    return out


def panel_start_numbers(start: GenerationResult, reveal: GenerationResult, *, candidates: int, length: int,
                        **_: object) -> dict[str, float]:
    """What :func:`panel_start_note` states, for the notebook's results: the panel's first decode ``start``
    (tokens, forwards, ``a``, tokens one forward processed on average: the last token plus the drafts) beside the
    reveal's cost-aware decode ``reveal`` of the same question, and the panel's budget ``candidates * length``."""
    def q_mean(result: GenerationResult) -> float:
        return float(np.mean([st.tree_size for st in result.steps])) if result.steps else 1.0

    return {"budget": int(candidates) * int(length), "tokens": len(start.tokens), "forwards": start.forwards,
            "a": start.mean_accepted, "q_mean": q_mean(start), "reveal_tokens": len(reveal.tokens),
            "reveal_forwards": reveal.forwards, "reveal_a": reveal.mean_accepted, "reveal_q_mean": q_mean(reveal)}


def panel_start_note(start: GenerationResult, reveal: GenerationResult, *, budget: int, question_id: int,
                     candidates: int, length: int, order: str, temperature: float) -> str:
    """The sentence beside the drafting panel: the method and settings it starts at, what it measures there on
    the demo question, and why that ``a`` differs from the reveal's (HD (cost-aware) at ``budget``).

    ``start`` is the panel's first decode (HD (paper, fixed) at ``candidates`` x ``length``, ``order``,
    ``temperature``); ``reveal`` the cost-aware decode of the same question shown earlier. Its numbers are
    :func:`panel_start_numbers`'."""
    n = panel_start_numbers(start, reveal, candidates=candidates, length=length)
    greedy = "greedy (temperature 0)" if temperature == 0 else f"sampling at temperature {temperature:g}"
    q_fixed, q_cost, a_fixed, a_cost = n["q_mean"], n["reveal_q_mean"], n["a"], n["reveal_a"]
    text = (f"**The panel starts at the paper's settings, not at this notebook's `BUDGET`:** HD (paper, fixed) with "
            f"{candidates} candidates of {length} tokens (a budget of {n['budget']} draft tokens per forward, against "
            f"`BUDGET` = {budget} above), stores asked in the order {', '.join(order)}, {greedy}. On question "
            f"{question_id} it makes {n['tokens']} tokens in {n['forwards']} forwards, $a$ = {a_fixed:.2f}; "
            f"the reveal above made {n['reveal_tokens']} in {n['reveal_forwards']}, $a$ = {a_cost:.2f}, with HD "
            f"(cost-aware) at budget {budget}. ")
    if round(a_fixed, 2) == round(a_cost, 2):
        return text + ("The two policies produce the same tokens per forward here although their forwards process "
                       f"{q_fixed:.1f} and {q_cost:.1f} tokens on average: the extra drafts gained no accepted token "
                       "overall.")
    more = a_fixed > a_cost
    if more and q_fixed > q_cost:
        why = (f"the fixed policy verifies every draft it finds, {q_fixed:.1f} tokens per forward on average against "
               f"{q_cost:.1f} for the cost-aware one, which drafts only what its cost curve says pays, so more of the "
               "target's tokens are found in a draft. $a$ counts tokens per forward, not what a forward costs: "
               "on this CPU a forward over more tokens costs more (\"What verification costs\" above).")
    elif not more and q_fixed < q_cost:
        why = (f"the fixed policy's forwards process {q_fixed:.1f} tokens on average against {q_cost:.1f} for the "
               "cost-aware one, so fewer of the target's tokens are found in a draft.")
    else:
        why = (f"although the fixed policy's forwards process {q_fixed:.1f} tokens on average against {q_cost:.1f}, "
               "what counts is which drafted tokens the target accepts, not how many are drafted.")
    return text + f"Its $a$ is {'higher' if more else 'lower'}: " + why


def speedup_context(cost: VerifyCost, a: float, q: int) -> dict[str, Any]:
    """The ``speedup_bound`` exercise's context from the notebook's curve ``cost``, tokens per forward ``a``
    and verified tokens ``q``."""
    return {"qs": [int(x) for x in np.asarray(cost.qs)], "ms": [float(x) for x in np.asarray(cost.ms)],
            "a": float(a), "q": int(q)}


__all__ = ["TOY_CORPUS", "TOY_EXERCISE_TARGET", "TOY_LENGTH", "TOY_MODEL_OUTPUTS", "TOY_PROMPT", "TOY_TARGET",
           "ToyStores", "chain_cases", "first_tokens", "panel_start_note", "panel_start_numbers",
           "policy_contrast", "slice_breakdown", "speed_breakdown", "speedup_bound",
           "speedup_context", "tokens_per_step", "toy_drafter", "toy_stores", "walk_caption", "walk_sources", "worked_step"]
