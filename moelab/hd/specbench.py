"""Spec-Bench questions for HD: the evaluation set and prompt formatting.

Every one of Spec-Bench's 480 questions is evaluated. No store is built from Spec-Bench: S comes from
the target's own outputs on ShareGPT prompts that share no 64-character stretch with any Spec-Bench
turn, and L from ShareGPT conversations (:mod:`moelab.make.hd_stores`), so no store has seen a question it
is evaluated on. (An earlier version kept every fourth question per category apart to build S from; the
``"store"`` split is gone with it.) The CI / benchmark slice takes the first ``per_category`` questions of
each category by id. Only the first turn of each question is used (MT-bench's second turn needs the
model's own first answer; we keep every method on identical prompts).
"""

from __future__ import annotations

import pandas as pd

from moelab._validate import check_choice, check_int
from moelab.datasets import SPEC_BENCH_CATEGORIES, load_spec_bench
from moelab.models.lm import chat_prompt_ids

SPLITS = ("eval",)


def spec_bench_split(split: str = "eval", *, per_category: int | None = None,
                     categories: tuple[str, ...] = SPEC_BENCH_CATEGORIES) -> pd.DataFrame:
    """Spec-Bench's evaluation questions (all of them, or a per-category slice).

    Parameters
    ----------
    split : {"eval"}
        ``"eval"``: every question (the only split; see the module docstring).
    per_category : int, optional
        Keep only the first ``per_category`` questions (by id) of each category (the benchmark slice).
    categories : tuple of str
        Which of Spec-Bench's six categories to keep.

    Returns
    -------
    DataFrame
        ``question_id, category, subcategory, turns, prompt`` sorted by category order, then id.
    """
    check_choice("split", split, SPLITS)
    for c in categories:
        check_choice("categories entry", c, SPEC_BENCH_CATEGORIES)
    if per_category is not None:
        check_int("per_category", per_category, low=1)
    df = load_spec_bench().sort_values("question_id")
    df = df[df["category"].isin(categories)]
    if per_category is not None:
        df = df.groupby("category", sort=False).head(per_category)
    order = {c: i for i, c in enumerate(SPEC_BENCH_CATEGORIES)}
    df = df.assign(_o=df["category"].map(order)).sort_values(["_o", "question_id"]).drop(columns="_o")
    return df.reset_index(drop=True)


__all__ = ["SPLITS", "chat_prompt_ids", "spec_bench_split"]
