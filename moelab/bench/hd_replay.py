"""Replaying HD's vLLM drafting against a target's greedy outputs (``moelab hd-replay``).

Greedy verification accepts a drafted token exactly when it equals the target's next greedy token, so a
drafter replayed against the target's greedy output of a prompt drafts, and has accepted, what it would in
vLLM at temperature 0: the replay runs the engine's own per-row drafters (:class:`moelab.hd.rows.RowDrafters`,
built as :func:`moelab.hd.engine.make_row_drafters` builds them) and emits, each step, the accepted tokens
plus the bonus token, as vLLM does. (Exact up to the tokens batching changes: the outputs are generated
batched, in float32.) It answers two questions without a GPU or an engine per method:

* **How confident is a store's answer?** :func:`class_acceptance`: the acceptance of a chain token whose
  predecessors were all accepted, per store, match length (how many context tokens the store's answer was
  looked up with) and position in that answer: the evidence for :func:`moelab.hd.policy.confidence_class`.
* **Do the confidence classes pay?** :func:`compare_variants`: HD-fixed, cost-aware HD as shipped, and
  cost-aware HD with one acceptance rate per store (classes off), on the same outputs at the same budget;
  time is *projected* as the sum of the measured verify cost ``c(K + 1)`` of every step (drafting time is
  not counted), so the speedup over AR is a projection, not a measurement.

The classes were chosen on Spec-Bench's outputs, the set the full table reports on; ``--prompts heldout``
repeats both on ShareGPT first turns that neither S nor L was built from (the conversations S's walk reaches
after its own prompts, so disjoint from Spec-Bench as S's are): evidence that the choice is not fitted to
the evaluation set.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import atomic_write_json
from moelab._outputs import check_output_file, record_output_file
from moelab._validate import check_choice, check_instance, check_int
from moelab.bench.specbench.vllm_runs import _question_table, measure_vllm_cost
from moelab.costmodel.verify import VerifyCost
from moelab.datasets import SPEC_BENCH_CATEGORIES
from moelab.hd.drafters import COST_AWARE_CONTEXT_KEYS, CostAwareDrafter, Draft, HierarchyDrafter
from moelab.hd.engine import _tokenizer as load_tokenizer
from moelab.hd.engine import cost_aware_rows, load_stores
from moelab.hd.policy import MATCH_CLASSES, POSITION_CLASSES, EngineAcceptance, check_budget
from moelab.hd.rows import RowDrafters
from moelab.hd.specbench import spec_bench_split
from moelab.hd.stores import load_default_model_store
from moelab.make.hd_stores import S_MAX_PROMPT_TOKENS, S_PROMPTS, sharegpt_s_prompts, target_outputs_vllm
from moelab.models.lm import DEFAULT_LM, lm_folder

PROMPT_SETS = ("heldout", "specbench")
#: the variants :func:`compare_variants` replays, in table order
VARIANTS = ("HD-fixed", "HD-cost", "HD-cost, one rate per store")
MAX_REQUESTS = 4000


def _check_pairs(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> None:
    if len(prompts) != len(outputs):
        raise ValueError(f"prompts and outputs must pair up; got {len(prompts)} prompts and {len(outputs)} outputs")
    check_int("number of requests", len(prompts), low=1, high=MAX_REQUESTS)


def replay(rows: RowDrafters, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
           budget: int, cost: VerifyCost) -> pd.DataFrame:
    """Replay per-row drafters against greedy ``outputs`` of ``prompts``, one request after another.

    Each request starts after its first output token (vLLM's prefill emits it without a draft); each step
    proposes a chain of at most ``budget`` tokens through ``rows.propose`` (the engine's path: the drafter
    learns what was accepted from the tokens that follow), accepts its longest prefix that matches the
    output and emits that plus the bonus token (fewer at the output's end).

    Returns
    -------
    DataFrame
        One row per request: ``steps`` (target forwards after prefill), ``drafted`` (tokens verified),
        ``accepted``, ``new_tokens`` (after the first), ``ms`` (projected: the sum of ``cost(K + 1)``) and
        ``ar_ms`` (``new_tokens`` forwards of one token).
    """
    check_instance("rows", rows, RowDrafters, "a RowDrafters (e.g. moelab.hd.engine.cost_aware_rows(...))")
    budget = check_budget(budget)
    check_instance("cost", cost, VerifyCost, "a VerifyCost (e.g. moelab.bench.specbench.measure_vllm_cost(...))")
    _check_pairs(prompts, outputs)
    table = cost.table
    out_rows = []
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        out = [int(t) for t in out]
        if not out:
            raise ValueError(f"outputs[{i}] is empty: every replayed request needs at least its prefill token")
        tokens = [int(t) for t in prompt] + out[:1]
        pos, steps, drafted, accepted, ms = 1, 0, 0, 0, 0.0
        while pos < len(out):
            # row i: each request its own row, so its first proposal makes its own drafter (as a new request does)
            chain = rows.propose(i, np.asarray(tokens), budget)
            a = 0
            while a < len(chain) and pos + a < len(out) and chain[a] == out[pos + a]:
                a += 1
            new = out[pos:pos + a + 1]
            tokens.extend(new)
            pos += len(new)
            steps += 1
            drafted += len(chain)
            accepted += a
            ms += table[len(chain) + 1]
        out_rows.append((i, steps, drafted, accepted, len(out) - 1, ms, (len(out) - 1) * table[1]))
    return pd.DataFrame(out_rows, columns=["request", "steps", "drafted", "accepted", "new_tokens", "ms", "ar_ms"])


def class_acceptance(S: Any, L: Any, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
                     budget: int = 8, order: str = "WSL", length: int = 4) -> pd.DataFrame:
    """Acceptance of HD's chain tokens per store, match length and position in the store's answer.

    Replays the full hierarchy chain (W keys :data:`COST_AWARE_CONTEXT_KEYS`, every token drafted, as HD-fixed
    drafts) and counts a token as *tried* when every token before it in the chain was accepted, *accepted*
    when it equals the output's token: the conditional acceptance the cost policy multiplies along a chain.

    Returns
    -------
    DataFrame
        ``store, match, position, tried, accepted, rate`` (match and position capped as in
        :func:`moelab.hd.policy.confidence_class`; the last value of each means "that or more").
    """
    budget = check_budget(budget)
    _check_pairs(prompts, outputs)
    tried: dict[tuple[str, int, int], int] = {}
    hits: dict[tuple[str, int, int], int] = {}
    for prompt, out in zip(prompts, outputs):
        out = [int(t) for t in out]
        d = HierarchyDrafter(S, L, order=order, length=length, context_key_lengths=COST_AWARE_CONTEXT_KEYS)
        d.start([int(t) for t in prompt] + out[:1])
        pos = 1
        while pos < len(out):
            dr = d.draft_chain(budget)
            a = 0
            if dr.candidates:
                chain, letters, classes = dr.candidates[0], dr.sources[0], dr.classes[0]
                for j, tok in enumerate(chain):
                    if pos + j >= len(out):
                        break
                    key = (letters[j], classes[j] // POSITION_CLASSES, classes[j] % POSITION_CLASSES)
                    tried[key] = tried.get(key, 0) + 1
                    if tok != out[pos + j]:
                        break
                    hits[key] = hits.get(key, 0) + 1
                    a += 1
            new = out[pos:pos + a + 1]
            d.accept(new)
            pos += len(new)
    df = pd.DataFrame([(s, m, p, n, hits.get((s, m, p), 0)) for (s, m, p), n in tried.items()],
                      columns=["store", "match", "position", "tried", "accepted"])
    df["rate"] = df["accepted"] / df["tried"]
    return df.sort_values(["store", "match", "position"]).reset_index(drop=True)


class _OneClassHierarchy(HierarchyDrafter):
    """The hierarchy with every token in confidence class 0: cost-aware HD learning one rate per store."""

    def draft_chain(self, max_len: int) -> Draft:
        d = super().draft_chain(max_len)
        return Draft(d.candidates, d.sources, [(0,) * len(c) for c in d.candidates])


def _one_class_rows(S: Any, L: Any, cost: VerifyCost, budget: int, seed: int) -> RowDrafters:
    engine = EngineAcceptance()
    numbers = iter(range(MAX_REQUESTS))

    def new_request() -> CostAwareDrafter:
        inner = _OneClassHierarchy(S, L, order="WSL", length=4, context_key_lengths=COST_AWARE_CONTEXT_KEYS)
        return CostAwareDrafter(inner, cost, budget=budget, chain=True, acceptance=engine.new_request(),
                                seed=seed * 1_000_003 + next(numbers))

    return RowDrafters(new_request, lambda d, m: d.draft(m))


def variant_rows(variant: str, S: Any, L: Any, cost: VerifyCost, *, budget: int, seed: int = 0) -> RowDrafters:
    """The per-row drafters of one of :data:`VARIANTS` (HD-fixed and HD-cost exactly as the vLLM engine builds
    them, :func:`moelab.hd.engine.make_row_drafters`)."""
    check_choice("variant", variant, VARIANTS)
    if variant == "HD-fixed":
        return RowDrafters(lambda: HierarchyDrafter(S, L, order="WSL", length=4), lambda d, m: d.draft_chain(m))
    if variant == "HD-cost":
        return cost_aware_rows(S, L, cost, budget=budget, seed=seed)
    return _one_class_rows(S, L, cost, budget, seed)


def compare_variants(S: Any, L: Any, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], *,
                     cost: VerifyCost, budget: int = 8, variants: Sequence[str] = VARIANTS) -> pd.DataFrame:
    """Replay each of ``variants`` on the same outputs at the same budget.

    Returns
    -------
    DataFrame
        One row per variant: ``mat`` (tokens per forward: 1 + accepted / steps), ``drafted_per_step``,
        ``projected_speedup`` (mean over requests of AR's projected time over the variant's; a projection
        from the measured verify-cost curve, drafting time not counted) and ``vs_fixed`` (that speedup over
        HD-fixed's).
    """
    res = []
    for v in variants:
        df = replay(variant_rows(v, S, L, cost, budget=budget), prompts, outputs, budget=budget, cost=cost)
        df = df[df["new_tokens"] > 0]
        res.append({"variant": v, "requests": len(df), "mat": 1.0 + df["accepted"].sum() / df["steps"].sum(),
                    "drafted_per_step": df["drafted"].sum() / df["steps"].sum(),
                    "projected_speedup": float((df["ar_ms"] / df["ms"]).mean())})
    out = pd.DataFrame(res)
    if "HD-fixed" in set(out["variant"]):
        out["vs_fixed"] = out["projected_speedup"] / float(out.loc[out["variant"] == "HD-fixed", "projected_speedup"].iloc[0])
    return out


# ------------------------------------------------------------------------------------------ data
def heldout_prompts(tokenizer: Any, n: int) -> tuple[list[list[int]], dict[str, Any]]:
    """``n`` ShareGPT first turns that neither S nor L was built from.

    S's prompts are the first ``S_PROMPTS`` that :func:`moelab.make.hd_stores.sharegpt_s_prompts` keeps
    walking back from the end of ShareGPT (L reads only the front): these are the next ``n`` on that walk,
    refused when the shipped S store was not built from exactly that walk."""
    n = check_int("n", n, low=1, high=MAX_REQUESTS)
    built = load_default_model_store(tokenizer).meta.get("prompts", {})
    if built.get("prompts") != S_PROMPTS or built.get("max_prompt_tokens") != S_MAX_PROMPT_TOKENS:
        raise ValueError(f"the shipped S store was not built from the first {S_PROMPTS} ShareGPT prompts of at most "
                         f"{S_MAX_PROMPT_TOKENS} tokens (its meta: {built.get('prompts')} prompts, max "
                         f"{built.get('max_prompt_tokens')} tokens), so the prompts after them are not known to be held out")
    ids, info = sharegpt_s_prompts(tokenizer, n=S_PROMPTS + n)
    if len(ids) <= S_PROMPTS:
        raise ValueError(f"ShareGPT's reserved tail holds no prompt after S's {S_PROMPTS}")
    info = dict(info, heldout=f"prompts {S_PROMPTS}..{len(ids) - 1} of S's walk (S was built from the first "
                              f"{S_PROMPTS}); {len(ids) - S_PROMPTS} of {n} requested")
    return ids[S_PROMPTS:], info


def _tokenizer() -> Any:
    tok = load_tokenizer(str(lm_folder(DEFAULT_LM)))
    tok.moelab_name = DEFAULT_LM
    return tok


def replay_inputs(prompt_set: str, n: int, *, max_new_tokens: int = 128
                  ) -> tuple[Any, Any, list[list[int]], list[list[int]], VerifyCost, dict[str, Any]]:
    """S, L, the prompts of ``prompt_set`` (:data:`PROMPT_SETS`; Spec-Bench: the first ``n / 6`` questions of each
    category), the target's greedy outputs through vLLM (cached) and this machine's verify-cost curve."""
    check_choice("prompts", prompt_set, PROMPT_SETS)
    n = check_int("n", n, low=1, high=MAX_REQUESTS)
    check_int("max_new_tokens", max_new_tokens, low=1, high=1024)
    tok = _tokenizer()
    if prompt_set == "heldout":
        prompts, info = heldout_prompts(tok, n)
    else:
        if n % len(SPEC_BENCH_CATEGORIES):
            raise ValueError(f"n must be a multiple of {len(SPEC_BENCH_CATEGORIES)} for Spec-Bench (the same number of "
                             f"questions from each category); got {n}")
        qs = _question_table()
        ids = spec_bench_split("eval", per_category=n // len(SPEC_BENCH_CATEGORIES))["question_id"]
        prompts = [qs[int(q)]["prompt_ids"] for q in ids]
        info = {"spec_bench": f"the first {n // len(SPEC_BENCH_CATEGORIES)} questions of each category by id "
                              f"({len(prompts)} of {len(qs)}; the evaluation set)"}
    outputs, gen = target_outputs_vllm(lm_folder(DEFAULT_LM), prompts, max_new_tokens=max_new_tokens,
                                      progress=True, label=f"{prompt_set} outputs")
    S, L = load_stores(tok)
    cost = measure_vllm_cost(lm_folder(DEFAULT_LM))
    return S, L, prompts, outputs, cost, {"prompts": info, "generation": gen, "cost": cost.source}


def main(argv: list[str] | None = None) -> int:
    """``moelab hd-replay``: per-class acceptance and the variants' projected speedups on greedy outputs."""
    p = argparse.ArgumentParser(prog="moelab hd-replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", choices=PROMPT_SETS, default="heldout",
                   help="heldout: ShareGPT first turns no store was built from; specbench: the evaluation set")
    p.add_argument("--n", type=int, default=240, help="requests (default 240)")
    p.add_argument("--budget", type=int, default=8, help="draft tokens per forward at most (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", help="also write both tables to this JSON file")
    args = p.parse_args(argv)
    budget = check_budget(args.budget)
    if args.json:  # checked before the (long) replay, not after it
        args.json = check_output_file(args.json, writer="hd-replay", name="--json")
    S, L, prompts, outputs, cost, info = replay_inputs(args.prompts, args.n, max_new_tokens=args.max_new_tokens)
    classes = class_acceptance(S, L, prompts, outputs, budget=budget)
    variants = compare_variants(S, L, prompts, outputs, cost=cost, budget=budget)
    print(f"{len(prompts)} {args.prompts} prompts, budget {budget}; verify cost: {cost.source}")
    print(f"\nacceptance of a chain token whose predecessors were accepted (match and position capped at "
          f"{MATCH_CLASSES - 1} and {POSITION_CLASSES - 1}):")
    print(classes.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("\nvariants at equal budget (speedup over AR is a projection from the verify-cost curve):")
    print(variants.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.json:
        atomic_write_json(args.json, {"info": info, "budget": budget, "classes": classes.to_dict("records"),
                                      "variants": variants.to_dict("records")})
        record_output_file(args.json, "hd-replay")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MAX_REQUESTS", "PROMPT_SETS", "VARIANTS", "class_acceptance", "compare_variants", "heldout_prompts",
           "replay", "replay_inputs", "variant_rows"]
