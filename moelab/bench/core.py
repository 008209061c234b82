"""Benchmark figures, timing helpers and the suite runner."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

# suite name -> module; each module exposes run(quick: bool) -> list[Figure]
#: Every ``moelab bench`` suite: name -> module (each module's ``run(quick)`` returns its figures).
BENCH_SUITES: dict[str, str] = {
    "costmodel": "moelab.bench.costmodel",
    "afd": "moelab.bench.afd",
    "dsd": "moelab.bench.dsd",
    "eldr": "moelab.bench.eldr",
    "hd": "moelab.bench.hd",
    "balanceroute": "moelab.bench.balanceroute",
    "sweep": "moelab.bench.sweep",
    "cross": "moelab.bench.cross",
    "reliability": "moelab.bench.reliability",
    "notebooks": "moelab.bench.notebooks",
}


@dataclass(frozen=True)
class Figure:
    """One measured benchmark figure. ``goal`` is text such as ``"<= 10"``; ``met`` says whether the
    measured value satisfies it (None when there is no numeric goal)."""

    suite: str
    name: str
    value: float
    unit: str
    goal: str = ""
    note: str = ""

    @property
    def met(self) -> bool | None:
        goal = self.goal.strip()
        for op, test in (("<=", lambda v, g: v <= g), (">=", lambda v, g: v >= g)):
            if goal.startswith(op):
                try:
                    return bool(test(self.value, float(goal[len(op):].split()[0])))
                except ValueError:
                    return None
        return None

    def as_dict(self) -> dict:
        return {**asdict(self), "met": self.met}


def median_time(fn: Callable[[], object], *, repeat: int = 7, warmup: int = 1) -> tuple[float, np.ndarray]:
    """Median wall-clock seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = np.empty(repeat)
    for i in range(repeat):
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    return float(np.median(times)), times


def run_suites(names: Iterable[str] | None = None, *, quick: bool = False) -> list[Figure]:
    """Run the named suites (all when ``names`` is empty) and return their figures."""
    names = list(names or BENCH_SUITES)
    unknown = [n for n in names if n not in BENCH_SUITES]
    if unknown:
        raise ValueError(f"benchmark suite must be one of {sorted(BENCH_SUITES)}; got {unknown}")
    figures: list[Figure] = []
    for name in names:
        module = importlib.import_module(BENCH_SUITES[name])
        figures.extend(module.run(quick=quick))
    return figures
