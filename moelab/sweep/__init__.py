"""``moelab.sweep``: run a function over a parameter grid — serially, on a local process pool or on
Ray — with a content-addressed parquet result cache (reruns compute only what is missing).

>>> from moelab.sweep import run_sweep
>>> res = run_sweep(my_fn, {"rate": [20, 60], "tau": [0.1, 0.2]}, backend="local")  # doctest: +SKIP
>>> res.frame  # one row per point (parameters first)                                # doctest: +SKIP

A :class:`Suite` names a grid with its point function, code and data (:mod:`moelab.sweep.suite`);
``moelab sweep SUITE`` runs the papers' registered grids (:mod:`moelab.bench.suites`).
"""

from moelab.sweep.core import (
    BACKENDS,
    ResultCache,
    SweepCacheWarning,
    SweepResult,
    code_version,
    data_hash,
    expand_grid,
    parse_grid_args,
    point_key,
    run_sweep,
)
from moelab.sweep.suite import Suite, coerce, run_suite

__all__ = ["BACKENDS", "ResultCache", "Suite", "SweepCacheWarning", "SweepResult", "code_version", "coerce", "data_hash",
           "expand_grid", "parse_grid_args", "point_key", "run_suite", "run_sweep"]
