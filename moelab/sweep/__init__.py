"""``moelab.sweep``: run a function over a parameter grid — serially, on a local process pool or on
Ray — with a content-addressed parquet result cache (reruns compute only what is missing).

>>> from moelab.sweep import run_sweep
>>> res = run_sweep(my_fn, {"rate": [20, 60], "tau": [0.1, 0.2]}, backend="local")  # doctest: +SKIP
>>> res.frame  # one row per point (parameters first)                                # doctest: +SKIP

``moelab sweep SUITE`` runs the registered experiment grids (:mod:`moelab.sweep.suites`).
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

__all__ = ["BACKENDS", "ResultCache", "SweepCacheWarning", "SweepResult", "code_version", "data_hash", "expand_grid",
           "parse_grid_args", "point_key", "run_sweep"]
