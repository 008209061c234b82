"""The lesson diagrams: one picture of each paper's mechanism, drawn with plotly shapes.

Each notebook opens with "the problem" and one of these diagrams, before any measurement. They are
schematic (boxes and arrows) except where the mechanism *is* a time or load budget (the DSD timeline,
the DP barrier): those are drawn to scale from the arguments, so a reader who changes a parameter sees
the picture change. Schematic canvases hide both axes; to-scale ones title the axis they use, so
:func:`moelab.viz.untitled_axes` finds nothing in any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from moelab._validate import check_int, check_real
from moelab.viz.common import color_for

# neutral colours of the schematic parts (methods keep the lab's palette via color_for)
BOX_FILL = "#f2f2f2"
BOX_LINE = "#555555"
REJECTED = "#d62728"
IDLE = "#d9d9d9"


def _canvas(title: str, *, width: float, height: float, fig_height: int = 380) -> go.Figure:
    """An empty figure on a ``width`` x ``height`` data canvas with both axes hidden (a schematic)."""
    fig = go.Figure()
    fig.update_xaxes(visible=False, range=[0, width], fixedrange=True)
    fig.update_yaxes(visible=False, range=[0, height], fixedrange=True, scaleanchor="x", scaleratio=1)
    fig.update_layout(title=title, template="plotly_white", height=fig_height, showlegend=False,
                      margin={"l": 10, "r": 10, "t": 60, "b": 10})
    return fig


def _box(fig: go.Figure, x0: float, y0: float, x1: float, y1: float, text: str = "", *,
         fill: str = BOX_FILL, line: str = BOX_LINE, font_size: int = 12, font_color: str = "#222") -> None:
    fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, fillcolor=fill, line={"color": line, "width": 1.5},
                  layer="below")
    if text:
        fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=text, showarrow=False,
                           font={"size": font_size, "color": font_color})


def _arrow(fig: go.Figure, x0: float, y0: float, x1: float, y1: float, text: str = "", *,
           color: str = BOX_LINE, dash: bool = False, label_at: float = 0.5) -> None:
    """An arrow from (x0, y0) to (x1, y1) with an optional label ``label_at`` of the way along it."""
    fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", text="",
                       showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.5, arrowcolor=color)
    if dash:  # a dashed shaft drawn over the arrow's (solid) one
        fig.add_shape(type="line", x0=x0, y0=y0, x1=x1, y1=y1, line={"color": "white", "width": 1.5, "dash": "dot"})
    if text:
        fig.add_annotation(x=x0 + label_at * (x1 - x0), y=y0 + label_at * (y1 - y0), text=text, showarrow=False, yshift=9,
                           font={"size": 11, "color": color}, bgcolor="rgba(255,255,255,0.85)")


def eldr_tier_diagram(n_prefill: int = 2, n_decode: int = 3, routed_to: int = 1) -> go.Figure:
    """ELDR's prefill/decode tier: a prefill worker computes the request's expert signature ``v`` (which
    experts its prompt used; notebooks/NOTATION.md), the router compares it with each decode worker's centroid
    ``c_j`` (similarity ``s_j = cos(v, c_j)``) and sends the request into the locality band (similarity within
    ``tau`` of the best), least loaded first.

    Parameters
    ----------
    n_prefill : int
        Prefill workers drawn, 1..6.
    n_decode : int
        Decode workers drawn, 1..8.
    routed_to : int
        Index of the decode worker the example request goes to, ``0 <= routed_to < n_decode``.
    """
    n_prefill = check_int("n_prefill", n_prefill, low=1, high=6)
    n_decode = check_int("n_decode", n_decode, low=1, high=8)
    routed_to = check_int("routed_to", routed_to, low=0, high=n_decode - 1)
    height = max(n_prefill, n_decode) * 1.2 + 0.6
    fig = _canvas("ELDR: prefill computes the expert signature;<br>the router sends it to a decode worker "
                  "with similar experts", width=12, height=height)
    _box(fig, 0.1, height / 2 - 0.5, 1.7, height / 2 + 0.5, "requests")
    for i in range(n_prefill):
        y = height / 2 + (i - (n_prefill - 1) / 2) * 1.2
        _box(fig, 2.6, y - 0.4, 4.6, y + 0.4, f"prefill {i}")
        _arrow(fig, 1.7, height / 2, 2.6, y)
        # the topmost arrow carries the label (drawn above it): no other arrow runs through it
        _arrow(fig, 4.6, y, 6.0, height / 2, "signature v" if i == n_prefill - 1 else "")
    _box(fig, 6.0, height / 2 - 0.7, 8.0, height / 2 + 0.7, "router<br>band: cos(v, c<sub>j</sub>)<br>≥ best − τ",
         fill="#fde0dd", line=color_for("eldr"), font_size=11)
    for j in range(n_decode):
        y = height / 2 + ((n_decode - 1) / 2 - j) * 1.2
        chosen = j == routed_to
        # the chosen worker says why inside its own box: a label on its arrow would sit among the other arrows
        _box(fig, 9.4, y - 0.4, 11.8, y + 0.4, f"decode {j}: centroid c<sub>{j}</sub>"
             + ("<br><b>in band, least loaded</b>" if chosen else ""),
             fill="#fde0dd" if chosen else BOX_FILL, line=color_for("eldr") if chosen else BOX_LINE, font_size=11)
        _arrow(fig, 8.0, height / 2, 9.4, y, color=color_for("eldr") if chosen else IDLE)
    fig.update_layout(margin_t=80)  # the title's two lines (one line ran past a book column's width)
    return fig


def hd_walk_diagram(draft: Sequence[str] = ("the", "cat", "sat", "on"), accepted: int = 2,
                    target_token: str = "lay", stores_hit: str = "S",
                    store_candidates: Mapping[str, int | None] | None = None,
                    token_sources: Sequence[str] | None = None) -> go.Figure:
    """Hierarchy Drafting: the draft walks the stores W (this request's own text) -> S (the target
    model's own earlier outputs) -> L (a large static corpus) and takes the first that continues the last tokens; the target then
    verifies the whole draft in one forward and keeps its greedy tokens up to the first mismatch, plus
    its own next token (the bonus).

    Parameters
    ----------
    draft : sequence of str
        The drafted tokens (1..8).
    accepted : int
        How many leading draft tokens match the target's greedy choice, ``0..len(draft)``.
    target_token : str
        The target's own token at the first mismatch (or after the last accepted token).
    stores_hit : str
        The store that supplied the draft, one of ``"W"``, ``"S"``, ``"L"``.
    store_candidates : mapping, optional
        The walk as it ran: candidates each store supplied (``None`` or absent: not asked). Without it the
        walk is drawn as a single chain (stores before ``stores_hit`` missed, later ones not asked).
    token_sources : sequence of str, optional
        The store of each drafted token (``"W"``, ``"S"`` or ``"L"``, one per token of ``draft``): a path
        through the draft tree can take its tokens from several stores, and each store that supplied one
        gets its own arrow to the first token it supplied. Without it every token is ``stores_hit``'s.
    """
    draft = [str(t) for t in draft]
    if not 1 <= len(draft) <= 8:
        raise ValueError(f"draft must hold 1..8 tokens; got {len(draft)}")
    accepted = check_int("accepted", accepted, low=0, high=len(draft))
    if stores_hit not in ("W", "S", "L"):
        raise ValueError(f"stores_hit must be one of 'W', 'S', 'L'; got {stores_hit!r}")
    token_sources = [stores_hit] * len(draft) if token_sources is None else [str(k) for k in token_sources]
    if len(token_sources) != len(draft) or any(k not in ("W", "S", "L") for k in token_sources):
        raise ValueError(f"token_sources must give one of 'W', 'S', 'L' for each of the {len(draft)} draft tokens; "
                         f"got {token_sources!r}")
    fig = _canvas("Hierarchy Drafting: walk W → S → L for a draft, then one verification step", width=12,
                  height=6, fig_height=420)
    names = {"W": "W: this request's text", "S": "S: the model's own outputs", "L": "L: static corpus"}
    order = ("W", "S", "L")
    if store_candidates is None:  # a single chain: the walk stops at the first store that answers
        store_candidates = {k: (1 if k == stores_hit else 0) for k in order[:order.index(stores_hit) + 1]}
    counts = {k: (None if store_candidates.get(k) is None else int(store_candidates[k])) for k in order}
    for i, key in enumerate(order):
        x0 = 0.3 + 3.2 * i
        n = counts[key]
        label = ("<br>(not asked)" if n is None else "<br>miss" if n == 0 else
                 f"<br><b>{n} candidate{'s' if n != 1 else ''}</b>")
        _box(fig, x0, 4.3, x0 + 2.6, 5.5, names[key] + label,
             line=color_for(key.lower()), font_size=11)  # one fill for every store: its border is its colour
        if i < 2:
            asked_next = counts[order[i + 1]] is not None
            _arrow(fig, x0 + 2.6, 4.9, x0 + 3.2, 4.9, color=BOX_LINE if asked_next else IDLE)
            if asked_next:  # the label sits above the gap: the gap between two boxes is narrower than the words
                fig.add_annotation(x=x0 + 2.9, y=5.75, text="miss" if n == 0 else "need more", showarrow=False,
                                   font={"size": 11, "color": BOX_LINE})
    for key in dict.fromkeys(token_sources):  # one arrow per supplying store, to the first token it supplied
        first = token_sources.index(key)
        _arrow(fig, 0.3 + 3.2 * order.index(key) + 1.3, 4.3, 1.6 + 1.25 * first + 0.55, 3.25,
               "draft" if first == 0 else "", color=color_for(key.lower()))
    fig.add_annotation(x=0.2, y=2.8, text="draft:", showarrow=False, xanchor="left")
    fig.add_annotation(x=0.2, y=1.3, text="target:", showarrow=False, xanchor="left")
    # a draft token is filled with the colour of the store that drafted it (the colour of that store's border);
    # whether the target kept it is a mark under it, not a colour: a check mark, a cross at the first mismatch
    for i, tok in enumerate(draft):
        x0 = 1.6 + 1.25 * i
        _box(fig, x0, 2.4, x0 + 1.1, 3.2, tok, fill=color_for(token_sources[i].lower()), line=BOX_LINE,
             font_color="white")
        if i <= accepted:
            fig.add_annotation(x=x0 + 0.55, y=2.05, text="✓" if i < accepted else "✗", showarrow=False,
                               font={"size": 14, "color": BOX_LINE})
        if i < accepted:
            _box(fig, x0, 0.9, x0 + 1.1, 1.7, tok)
    x_bonus = 1.6 + 1.25 * accepted
    _box(fig, x_bonus, 0.9, x_bonus + 1.1, 1.7, target_token, fill="#fff7bc", line=color_for("hd"))
    fig.add_annotation(x=x_bonus + 0.55, y=0.55, text="target's own token", showarrow=False, font={"size": 10})
    fig.add_annotation(x=11.8, y=2.0, xanchor="right", showarrow=False, font={"size": 11},
                       text=f"{accepted} accepted + 1 = {accepted + 1} tokens<br>from one target forward")
    fig.add_annotation(x=0.2, y=0.1, xanchor="left", showarrow=False, font={"size": 10, "color": BOX_LINE},
                       text="a draft token's colour: the store that drafted it (its border above); "
                            "✓ the target agreed, ✗ the first mismatch")
    return fig


def dsd_timeline(*, gamma: int, t_a: float, rtt: float, t_v: float, rounds: int = 2) -> dict[str, list[tuple]]:
    """The segments of the DSD timeline drawn by :func:`dsd_timeline_diagram`, as data.

    Returns ``{"dsd_sync": [...], "dsd_pipelined": [...]}``, each a list of ``(lane, kind, start, end)``
    with lane ``"edge"``, ``"network"`` or ``"cloud"`` and kind ``"draft"``, ``"uplink"``, ``"verify"`` or
    ``"downlink"``. Synchronous: every round is draft (``gamma*t_a``), uplink (``rtt/2``), verify
    (``t_v``), downlink (``rtt/2``). Pipelined: the edge drafts the next block while the previous one is
    on the wire, so a round starts every ``max(gamma*t_a, rtt) + t_v`` (all drafts accepted)."""
    gamma = check_int("gamma", gamma, low=1)
    t_a = check_real("t_a", t_a, low=0)
    rtt = check_real("rtt", rtt, low=0)
    t_v = check_real("t_v", t_v, low=0)
    rounds = check_int("rounds", rounds, low=1, high=10)
    draft = gamma * t_a
    sync, t = [], 0.0
    for _ in range(rounds):
        sync += [("edge", "draft", t, t + draft), ("network", "uplink", t + draft, t + draft + rtt / 2),
                 ("cloud", "verify", t + draft + rtt / 2, t + draft + rtt / 2 + t_v),
                 ("network", "downlink", t + draft + rtt / 2 + t_v, t + draft + rtt + t_v)]
        t += draft + rtt + t_v
    pipe, sent = [("edge", "draft", 0.0, draft)], draft
    period = max(draft, rtt) + t_v
    for k in range(rounds):
        start = sent + k * period
        pipe += [("network", "uplink", start, start + rtt / 2),
                 ("cloud", "verify", start + rtt / 2, start + rtt / 2 + t_v),
                 ("network", "downlink", start + rtt / 2 + t_v, start + rtt + t_v)]
        if k + 1 < rounds:  # the next block is drafted while this one travels and is verified
            pipe.append(("edge", "draft", start, start + draft))
    return {"dsd_sync": sync, "dsd_pipelined": pipe}


def dsd_timeline_diagram(*, gamma: int = 5, t_a: float = 10.0, rtt: float = 60.0, t_v: float = 50.0,
                         rounds: int = 2) -> go.Figure:
    """Edge-cloud speculative decoding drawn to scale: for synchronous and pipelined DSD, the edge
    drafts ``gamma`` tokens (``gamma*t_a`` ms), the block goes up (half the round trip), the cloud
    verifies it (``t_v``), the verdict comes down (the other half). Segments from :func:`dsd_timeline`.

    Parameters
    ----------
    gamma : int
        Draft length, >= 1.
    t_a, rtt, t_v : float
        Edge draft time per token, round trip and one verification pass, ms, >= 0.
    rounds : int
        Speculation rounds drawn per mode, 1..10.
    """
    segments = dsd_timeline(gamma=gamma, t_a=t_a, rtt=rtt, t_v=t_v, rounds=rounds)
    colors = {"draft": "#1f77b4", "uplink": "#ff7f0e", "verify": "#d62728", "downlink": "#9467bd"}
    labels = {"dsd_sync": "sync", "dsd_pipelined": "pipelined"}
    lanes = ("edge", "network", "cloud")
    y_of = {}
    ticks, names = [], []
    for m, mode in enumerate(("dsd_sync", "dsd_pipelined")):
        for i, lane in enumerate(lanes):
            y_of[(mode, lane)] = (1 - m) * 4.5 + (2 - i)
            ticks.append(y_of[(mode, lane)])
            names.append(f"{labels[mode]}: {lane}")
    fig = go.Figure()
    seen = set()
    for mode, segs in segments.items():
        for lane, kind, start, end in segs:
            y = y_of[(mode, lane)]
            fig.add_trace(go.Bar(x=[end - start], base=[start], y=[y], orientation="h", width=0.7,
                                 marker_color=colors[kind], name=kind, legendgroup=kind,
                                 showlegend=kind not in seen,
                                 hovertemplate=f"{labels[mode]} {kind}: %{{base:.0f}}-%{{x:.0f}} ms<extra></extra>"))
            seen.add(kind)
    for mode in ("dsd_sync", "dsd_pipelined"):
        done = max(end for _, kind, _, end in segments[mode] if kind == "downlink")
        # the end line spans its own mode's lanes only: a full-height line ran through the other mode's label
        fig.add_shape(type="line", x0=done, x1=done, y0=y_of[(mode, "cloud")] - 0.5, y1=y_of[(mode, "edge")] + 0.85,
                      line={"dash": "dot", "color": "#777"})
        fig.add_annotation(x=done, y=y_of[(mode, "edge")] + 0.6, text=f"{labels[mode]}: {rounds} rounds in {done:.0f} ms",
                           showarrow=False, xanchor="right", font={"size": 11})
    fig.update_xaxes(title_text="time (ms)")
    fig.update_yaxes(title_text="mode and lane", tickvals=ticks, ticktext=names, range=[-0.6, 7.4])
    # the settings on a line of their own: at a book page's width one line cut them off
    fig.update_layout(title=f"DSD timeline: draft on the edge, uplink, verify in the cloud, downlink"
                            f"<br><sup>gamma={gamma}, t_a={t_a:g}, RTT={rtt:g}, t_v={t_v:g} ms</sup>",
                      template="plotly_white", barmode="overlay", height=380, legend_title_text="segment")
    return fig


def dp_barrier_diagram(loads: Sequence[float] = (6.0, 9.0, 4.0, 7.0), *, new_request: float = 2.0) -> go.Figure:
    """The data-parallel barrier: every rank of a DP-attention + EP group waits for the slowest before
    the expert all-to-all, so the step costs the *envelope* ``M = max_g L_g``; a rank's *margin*
    ``m_g = M - L_g`` is work it could take for free. BalanceRoute sends a new request (size
    ``new_request``) where it fits inside a margin.

    Parameters
    ----------
    loads : sequence of float
        Per-rank load (e.g. KV tokens to attend), >= 0, 1..16 ranks.
    new_request : float
        Size of the request to place, >= 0.
    """
    loads_arr = np.asarray(loads, dtype=np.float64)
    if loads_arr.ndim != 1 or not 1 <= loads_arr.size <= 16 or not np.all(np.isfinite(loads_arr)) \
            or np.any(loads_arr < 0):
        raise ValueError(f"loads must be 1..16 finite numbers >= 0; got {loads!r}")
    new_request = check_real("new_request", new_request, low=0)
    envelope = float(loads_arr.max())
    margins = envelope - loads_arr
    fits = np.flatnonzero(margins >= new_request)
    target = int(fits[np.argmax(margins[fits])]) if fits.size else int(np.argmin(loads_arr))
    ranks = [f"rank {g}" for g in range(loads_arr.size)]
    fig = go.Figure()
    fig.add_bar(x=ranks, y=loads_arr, name="load L<sub>g</sub>", marker_color="#1f77b4")
    fig.add_bar(x=ranks, y=margins, base=loads_arr, name="margin m<sub>g</sub> = M − L<sub>g</sub> (idle at the barrier)",
                marker={"color": "rgba(0,0,0,0)", "line": {"color": "#7f7f7f", "width": 1.5}},
                marker_pattern_shape="/")
    fig.add_bar(x=[ranks[target]], y=[new_request], base=[loads_arr[target]], name="new request",
                marker_color=color_for("br0"), width=0.4)
    fig.add_hline(y=envelope, line_color="#000", line_dash="dash", annotation_text="envelope M = max L<sub>g</sub> (barrier)",
                  annotation_position="top left")
    fig.update_layout(title="DP barrier: the step waits for the slowest rank; margins are free capacity",
                      xaxis_title="DP rank g", yaxis_title="load (e.g. KV tokens attended)", barmode="overlay",
                      template="plotly_white", height=380)
    return fig


def two_level_routing_diagram(n_instances: int = 2, ranks: int = 4, instance: int = 1, rank: int = 2) -> go.Figure:
    """The cross-paper system of notebook 07: at arrival an *instance router* (ELDR's locality band)
    picks one of ``n_instances`` instances; inside it, at every step boundary, a *rank router*
    (BalanceRoute) picks one of its ``ranks`` barrier-synchronised DP ranks.

    Parameters
    ----------
    n_instances : int
        Instances, 1..6.
    ranks : int
        DP ranks per instance, 1..8.
    instance, rank : int
        Where the example request goes (``0 <= instance < n_instances``, ``0 <= rank < ranks``).
    """
    n_instances = check_int("n_instances", n_instances, low=1, high=6)
    ranks = check_int("ranks", ranks, low=1, high=8)
    instance = check_int("instance", instance, low=0, high=n_instances - 1)
    rank = check_int("rank", rank, low=0, high=ranks - 1)
    width = 4.2 + ranks * 1.1 + 0.4
    row_h = 1.6
    height = n_instances * row_h + 0.6
    fig = _canvas("Two levels of routing: ELDR picks the instance, BalanceRoute picks the rank", width=width,
                  height=height, fig_height=max(300, 110 * n_instances + 120))
    mid = height / 2
    _box(fig, 0.1, mid - 0.6, 1.7, mid + 0.6, "instance router<br>(ELDR band)", fill="#fde0dd",
         line=color_for("eldr"), font_size=10)
    for i in range(n_instances):
        y = height - 0.3 - (i + 0.5) * row_h
        chosen = i == instance
        _arrow(fig, 1.7, mid, 2.4, y, color=color_for("eldr") if chosen else IDLE)
        _box(fig, 2.4, y - 0.6, width - 0.2, y + 0.6, "", fill="#fafafa" if not chosen else "#fff5f0")
        _box(fig, 2.5, y - 0.45, 4.0, y + 0.45, f"instance {i}<br>rank router<br>(BalanceRoute)", font_size=9,
             fill="#efedf5" if chosen else BOX_FILL, line=color_for("br0") if chosen else BOX_LINE)
        for g in range(ranks):
            x0 = 4.2 + g * 1.1
            hit = chosen and g == rank
            _box(fig, x0, y - 0.35, x0 + 0.95, y + 0.35, f"rank {g}", font_size=9,
                 fill="#fde0dd" if hit else BOX_FILL, line=color_for("br0") if hit else BOX_LINE)
            if hit:  # over the ranks before it, onto the chosen rank's top edge: it never crosses a label
                _arrow(fig, 4.0, y + 0.5, x0 + 0.475, y + 0.36, color=color_for("br0"))
    return fig


__all__ = ["dp_barrier_diagram", "dsd_timeline", "dsd_timeline_diagram",
           "eldr_tier_diagram", "hd_walk_diagram", "two_level_routing_diagram"]
