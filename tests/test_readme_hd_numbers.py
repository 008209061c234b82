"""The README's HD figures are the committed full Spec-Bench table's, not typed-in numbers that could drift
from it: every ratio and interval the README states is read back and compared with
``data/hd/specbench_vllm_full.csv`` (to the digits the README prints)."""

from __future__ import annotations

import re

import pandas as pd

from moelab.datasets import repo_root

NUM = r"(\d+\.\d+)"


def _overall() -> pd.DataFrame:
    table = pd.read_csv(repo_root() / "data" / "hd" / "specbench_vllm_full.csv")
    return table[table["category"] == "overall"].set_index("method")


def _digits(x: str) -> int:
    return len(x.split(".")[1])


def test_the_readme_states_the_committed_tables_ratios_and_intervals():
    text = " ".join((repo_root() / "README.md").read_text(encoding="utf-8").split())
    m = re.search(rf"HD-cost / HD-fixed is {NUM} \(95 % CI {NUM}-{NUM}\) and HD-cost / suffix {NUM} \({NUM}-{NUM}\)", text)
    assert m, "the README's sentence on the committed table's paired ratios is missing or reworded"
    overall = _overall()
    stated = {"HD-fixed": m.groups()[:3], "suffix": m.groups()[3:]}
    for peer, values in stated.items():
        row = overall.loc[peer]
        for typed, col in zip(values, ("hd_ratio", "hd_ci_low", "hd_ci_high")):
            assert typed == f"{row[col]:.{_digits(typed)}f}", (
                f"README says HD-cost / {peer} {col} = {typed}; the committed table says {row[col]:.4f}")
        assert row["hd_verdict"] == "ahead"  # the README reads both intervals as above 1
