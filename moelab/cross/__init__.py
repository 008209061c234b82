"""Cross-paper experiments: modules that combine two papers' methods on the shared floor (the paper
folders never import each other; this package may import them)."""

from moelab.cross.experiment import (
    BASELINE_PAIR,
    CROSS_SPREAD_SEEDS,
    INSTANCE_ROUTERS,
    INTERACTION_PATTERNS,
    RANK_ROUTERS,
    CrossSetup,
    br_share_trend,
    eldr_added_summary,
    eldr_lever,
    expert_term_ms,
    gains,
    gains_by_seed,
    interaction_pattern,
    pair_gains_table,
    pair_grid,
    pair_grids,
    prepare,
    rate_for_load,
    run_pair,
    share_sweep,
    share_trend_summary,
    variant,
)

__all__ = ["BASELINE_PAIR", "CROSS_SPREAD_SEEDS", "INSTANCE_ROUTERS", "INTERACTION_PATTERNS", "RANK_ROUTERS", "CrossSetup",
           "br_share_trend", "eldr_added_summary", "eldr_lever", "expert_term_ms", "gains", "interaction_pattern",
           "gains_by_seed", "pair_gains_table", "pair_grid", "pair_grids", "prepare", "rate_for_load", "run_pair",
           "share_sweep", "share_trend_summary", "variant"]
