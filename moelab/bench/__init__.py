"""Benchmarks: each suite measures figures (name, value, unit, goal) with warm-up and medians.

``moelab bench [SUITES] [--json PATH]`` prints one row per figure. A suite is a module
``moelab.bench.<suite>`` with a function ``run(quick: bool) -> list[Figure]``.
"""

from moelab.bench.core import BENCH_SUITES, Figure, median_time, run_suites

__all__ = ["BENCH_SUITES", "Figure", "median_time", "run_suites"]
