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


def test_the_readme_states_the_committed_tables_speedups_bounds_and_drafting_time():
    """The rest of the README's full-table sentence: each method's speedup, HD-cost / ngram with its interval, the
    lower bounds it reads off the intervals (in whole percent) and the drafting time per step, all from the table."""
    text = " ".join((repo_root() / "README.md").read_text(encoding="utf-8").split())
    overall = _overall()
    m = re.search(rf"HD-cost runs {NUM}x plain decoding, HD-fixed {NUM}x, suffix {NUM}x and ngram {NUM}x", text)
    assert m, "the README's sentence on the committed table's speedups is missing or reworded"
    for typed, method in zip(m.groups(), ("HD-cost", "HD-fixed", "suffix", "ngram")):
        assert typed == f"{overall.loc[method, 'speedup']:.{_digits(typed)}f}", f"README's {method} speedup {typed}"
    m = re.search(rf"HD-cost / ngram {NUM} \({NUM}-{NUM}\)", text)
    assert m, "the README's HD-cost / ngram ratio is missing or reworded"
    for typed, col in zip(m.groups(), ("hd_ratio", "hd_ci_low", "hd_ci_high")):
        assert typed == f"{overall.loc['ngram', col]:.{_digits(typed)}f}", f"README's HD-cost / ngram {col} {typed}"
    m = re.search(r"fixed hierarchy by at least (\d+) % and of vLLM's suffix and ngram by at least (\d+) %", text)
    assert m, "the README's lower bounds read off the intervals are missing or reworded"
    assert int(m.group(1)) == int((overall.loc["HD-fixed", "hd_ci_low"] - 1) * 100)  # floor: "at least"
    assert int(m.group(2)) == int((min(overall.loc["suffix", "hd_ci_low"], overall.loc["ngram", "hd_ci_low"]) - 1) * 100)
    m = re.search(r"HD-cost row takes (\d+) us per step \(median over questions\) against HD-fixed's (\d+), beside "
                  r"AR's (\d+) ms per token", text)
    assert m, "the README's drafting time per step is missing or reworded"
    assert int(m.group(1)) == round(overall.loc["HD-cost", "draft_us_p50"])
    assert int(m.group(2)) == round(overall.loc["HD-fixed", "draft_us_p50"])
    assert int(m.group(3)) == round(1e3 / overall.loc["AR", "tokens_per_s"])
