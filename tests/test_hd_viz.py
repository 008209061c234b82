"""moelab.viz.hd: the token-by-token legend names only the sources shown, and the store-share figure says where a
store was never asked (fifth student read of notebook 02)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from moelab.viz.hd import STORE_NAMES, acceptance_html, fig_store_shares


def test_the_demo_legend_names_only_the_sources_it_shows():
    # an HD run drafts from W, S and L only: its legend once showed a PLD swatch no token could carry
    tokenizer = SimpleNamespace(decode=lambda ids: f"t{ids[0]}")
    result = SimpleNamespace(steps=[SimpleNamespace(accepted=[1, 2], sources=["W", "S"], bonus=3),
                                    SimpleNamespace(accepted=[-1], sources=["L"], bonus=4)])
    legend = acceptance_html(tokenizer, result).split("margin-top:6px")[1]
    assert STORE_NAMES["W"] in legend and STORE_NAMES["S"] in legend and STORE_NAMES["bonus"] in legend
    assert STORE_NAMES["P"] not in legend and STORE_NAMES["L"] not in legend  # L's only token was not accepted
    pld = SimpleNamespace(steps=[SimpleNamespace(accepted=[1], sources=["P"], bonus=2)])
    assert STORE_NAMES["P"] in acceptance_html(tokenizer, pld).split("margin-top:6px")[1]


def test_a_store_never_asked_is_marked_not_asked_not_left_as_a_zero():
    rows = pd.DataFrame([{"method": "HD-cost", "category": c, "W_hit_rate": 0.4, "S_hit_rate": 0.9,
                          "L_hit_rate": np.nan if c == "math_reasoning" else 1.0, "W_accept_share": 0.5,
                          "S_accept_share": 0.5, "L_accept_share": 0.0} for c in ("qa", "math_reasoning")])
    fig = fig_store_shares(rows, "HD-cost")
    notes = [(x, t) for tr in fig.data for x, t in zip(tr.x, tr.text if tr.text is not None else ()) if t]
    assert notes == [("math_reasoning", "L not asked")]
    (marker,) = [tr for tr in fig.data if tr.text is not None]
    assert marker.offsetgroup == "L" and not marker.showlegend  # in L's slot, no second legend entry
    assert {tr.name for tr in fig.data if tr.showlegend is not False} == {STORE_NAMES[s] for s in "WSL"}
    asked = rows.assign(L_hit_rate=1.0)
    assert all(tr.text is None for tr in fig_store_shares(asked, "HD-cost").data)


def test_the_drafting_panel_title_names_the_method_and_the_settings_it_decoded_at():
    """Sixth student read: the panel's static copy said only '24 tokens in 12 forwards (a = 2.00 ...)', beside a
    reveal of the same question at another method and budget; its title now names what it ran."""
    from moelab.viz.hd import PANEL_START, drafting_panel, fixed_hd_settings

    calls = []

    def run(candidates, length, order, temperature):
        calls.append((candidates, length, order, temperature))
        steps = [SimpleNamespace(accepted=[1, 2], sources=["W", "S"], bonus=3)]
        return SimpleNamespace(steps=steps, tokens=[1, 2, 3], mean_accepted=3.0)

    tokenizer = SimpleNamespace(decode=lambda ids: f"t{ids[0]}")
    panel = drafting_panel(run, tokenizer)
    assert calls == [tuple(PANEL_START.values())]
    title = panel.children[2].layout.title.text
    settings = fixed_hd_settings(**PANEL_START)
    assert title.startswith(settings + "<br>") and "3 tokens in 1 forwards" in title
    assert settings == "HD (paper, fixed): 7 candidates × 4 tokens (budget 28), order W, S, L, temperature 0"
    panel.children[0].children[0].value = 3  # the candidates slider: the title follows it
    assert calls[-1] == (3, 4, "WSL", 0.0)
    assert panel.children[2].layout.title.text.startswith("HD (paper, fixed): 3 candidates × 4 tokens (budget 12)")
