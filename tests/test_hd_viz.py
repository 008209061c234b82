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
