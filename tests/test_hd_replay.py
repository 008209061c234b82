"""The greedy replay of HD's vLLM drafting (moelab.bench.hd_replay): step accounting, the class table, variants."""

from __future__ import annotations

import math

import pytest

from moelab.bench.hd_replay import VARIANTS, class_acceptance, compare_variants, replay, variant_rows
from moelab.costmodel.verify import VerifyCost
from moelab.hd import NGramTable, SuffixStore
from moelab.hd.drafters import Draft, Drafter
from moelab.hd.rows import RowDrafters

COST = VerifyCost([1, 9], [10.0, 14.0])
# a repetitive answer W learns inside the request, and S / L built from text that continues it
PROMPT = [1, 2, 3]
OUTPUT = [4] + [5, 6, 7, 8, 9, 10, 11] * 6 + [12, 13]


def _stores():
    S = NGramTable.build([[5, 6, 7, 8, 9, 10, 11, 5, 6]], key_lengths=(1, 2), length=4)
    L = SuffixStore.build([[20, 21, 22, 23], [9, 10, 11, 5, 6, 7]], vocab_size=32)
    return S, L


class _Oracle(Drafter):
    """Drafts the true continuation (what a perfect drafter would): every drafted token is accepted."""

    def draft(self) -> Draft:
        n = len(self.context) - len(PROMPT)
        return Draft([tuple(OUTPUT[n:n + 64])], ["O"]) if n < len(OUTPUT) else Draft([], [])


def test_an_oracle_drafter_needs_one_step_per_budget_plus_bonus_tokens():
    rows = RowDrafters(_Oracle, lambda d, m: Draft([d.draft().candidates[0][:m]], ["O"]) if d.draft().candidates
                       else Draft([], []))
    for budget in (1, 3, 8):
        df = replay(rows, [PROMPT], [OUTPUT], budget=budget, cost=COST)
        new = len(OUTPUT) - 1
        assert df["new_tokens"].iloc[0] == new
        assert df["steps"].iloc[0] == math.ceil(new / (budget + 1))  # each step: `budget` accepted + the bonus
        # the last step, short of budget + 1 tokens, accepts the output's rest and has no bonus to add
        assert df["accepted"].iloc[0] == new - df["steps"].iloc[0] + (new % (budget + 1) != 0)


def test_every_step_emits_its_accepted_tokens_and_the_bonus():
    S, L = _stores()
    for v in VARIANTS:
        df = replay(variant_rows(v, S, L, COST, budget=4), [PROMPT, PROMPT[:2]], [OUTPUT, OUTPUT[:20]], budget=4,
                    cost=COST)
        for r in df.itertuples():
            # accepted + one bonus per step, except a last step whose accepted tokens reach the output's end
            assert r.steps + r.accepted in (r.new_tokens, r.new_tokens + 1)
            assert r.accepted <= r.drafted <= 4 * r.steps
            assert r.ar_ms == pytest.approx(r.new_tokens * 10.0)
        assert df["accepted"].sum() > 0, v  # the repetition is drafted and accepted


def test_class_table_counts_conditional_acceptance():
    S, L = _stores()
    t = class_acceptance(S, L, [PROMPT], [OUTPUT], budget=8)
    assert (t["accepted"] <= t["tried"]).all() and t["rate"].between(0, 1).all()
    assert set(t["store"]) <= {"W", "S", "L"}
    w_long = t[(t["store"] == "W") & (t["match"] >= 2)]
    assert w_long["tried"].sum() > 0 and w_long["rate"].min() > 0.5  # a 2-token key of a repeated cycle


def test_variants_share_the_outputs_and_the_budget():
    S, L = _stores()
    t = compare_variants(S, L, [PROMPT] * 3, [OUTPUT] * 3, cost=COST, budget=4)
    assert list(t["variant"]) == list(VARIANTS)
    assert (t["mat"] >= 1.0).all() and (t["drafted_per_step"] <= 4).all()
    by = t.set_index("variant")
    # the cost policy keeps a prefix of the hierarchy's chain: it never verifies more than HD-fixed's full chain
    assert by.loc["HD-cost", "drafted_per_step"] <= by.loc["HD-fixed", "drafted_per_step"]
    assert by.loc["HD-cost", "vs_fixed"] == pytest.approx(by.loc["HD-cost", "projected_speedup"]
                                                          / by.loc["HD-fixed", "projected_speedup"])


@pytest.mark.parametrize("prompts, outputs, match", [
    ([PROMPT], [], "pair up"),
    ([PROMPT], [[]], "outputs\\[0\\] is empty"),
])
def test_bad_input_is_named(prompts, outputs, match):
    S, L = _stores()
    with pytest.raises(ValueError, match=match):
        replay(variant_rows("HD-fixed", S, L, COST, budget=4), prompts, outputs, budget=4, cost=COST)
    with pytest.raises(ValueError, match="variant"):
        variant_rows("HD-best", S, L, COST, budget=4)
    with pytest.raises(ValueError, match="budget"):
        replay(variant_rows("HD-fixed", S, L, COST, budget=4), [PROMPT], [OUTPUT], budget=0, cost=COST)


def test_cli_answers_a_bad_budget_with_an_error(capsys):
    from moelab.cli import main

    assert main(["hd-replay", "--budget", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "budget" in err
