"""Spec-Bench questions for HD: the documented store/evaluation split and prompt formatting.

Split (fixed, no randomness): inside each of the six categories, questions are sorted by
``question_id``; every fourth one (sorted position ``% 4 == 3``: 20 per category, 120 in all) belongs to
the **store** split, used only to build the model store S from the target's own outputs; the other 360
are the **eval** split. The CI / benchmark slice takes the first ``per_category`` eval questions of each
category, so S never sees a question it is evaluated on. Only the first turn of each question is used
(MT-bench's second turn needs the model's own first answer; we keep every method on identical prompts).
"""

from __future__ import annotations

import pandas as pd

from moelab._validate import check_choice, check_int
from moelab.datasets import SPEC_BENCH_CATEGORIES, load_spec_bench
from moelab.models.lm import chat_prompt_ids

SPLITS = ("store", "eval")
STORE_EVERY = 4  # every 4th question of a category (sorted position % 4 == 3) builds the model store


def spec_bench_split(split: str = "eval", *, per_category: int | None = None,
                     categories: tuple[str, ...] = SPEC_BENCH_CATEGORIES) -> pd.DataFrame:
    """Spec-Bench questions of one side of the documented split.

    Parameters
    ----------
    split : {"eval", "store"}
        ``"store"``: the questions whose target outputs build S; ``"eval"``: the rest.
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
    pos = df.groupby("category").cumcount()
    in_store = (pos % STORE_EVERY) == STORE_EVERY - 1
    df = df[in_store if split == "store" else ~in_store]
    df = df[df["category"].isin(categories)]
    if per_category is not None:
        df = df.groupby("category", sort=False).head(per_category)
    order = {c: i for i, c in enumerate(SPEC_BENCH_CATEGORIES)}
    df = df.assign(_o=df["category"].map(order)).sort_values(["_o", "question_id"]).drop(columns="_o")
    return df.reset_index(drop=True)


__all__ = ["SPLITS", "chat_prompt_ids", "spec_bench_split"]
