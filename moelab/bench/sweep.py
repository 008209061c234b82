"""``moelab bench sweep``: what spreading a grid over Ray buys on this machine, and what the cache costs.

Figures: ``sweep_ray_speedup`` (the same CPU-bound grid, serial vs Ray with 2 workers; Ray started
once beforehand and its workers warmed up, so start-up is not in the figure),
``sweep_cache_hit_seconds`` (a rerun of the finished grid, every point read from the cache) and
``sweep_overhead_ms_per_task`` (Ray, no-op points: scheduling + result transfer + the driver's atomic
cache write, per point). Wall-clock figures on a shared machine: the note gives the load average.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from moelab.bench.core import Figure
from moelab.sweep import run_sweep
from moelab.sweep.backends import ray_session

SUITE = "sweep"
_MASK = (1 << 64) - 1


def burn(n: int, seed: int) -> dict:
    """CPU-bound point function: ``n`` steps of a 64-bit LCG in pure Python (holds the GIL, so only
    processes run it in parallel)."""
    x, acc = seed + 1, 0
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & _MASK
        acc ^= x >> 33
    return {"acc": acc}


def noop(i: int) -> dict:
    """The cheapest point: measures the sweep machinery alone."""
    return {"i2": 2 * i}


def _load() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load average unknown"


def run(quick: bool = False) -> list[Figure]:

    n, points, n_noop = (200_000, 8, 100) if quick else (500_000, 16, 400)
    grid = {"n": [n], "seed": list(range(points))}
    kw = {"progress": False, "code": "bench"}
    ray, started = ray_session(workers=2)
    try:
        with tempfile.TemporaryDirectory(prefix="moelab-bench-sweep-") as tmp:
            root = Path(tmp)
            # warm-up: Ray's worker processes start and import moelab on their first tasks
            run_sweep(burn, {"n": [1000], "seed": list(range(100, 104))}, cache_dir=root / "warm", backend="ray", **kw)
            serial = run_sweep(burn, grid, cache_dir=root / "serial", backend="serial", **kw)
            on_ray = run_sweep(burn, grid, cache_dir=root / "ray", backend="ray", **kw)
            if not serial.frame.equals(on_ray.frame):
                raise RuntimeError("serial and Ray sweeps disagree; the speedup would compare different work")
            t0 = time.perf_counter()
            hits = [run_sweep(burn, grid, cache_dir=root / "serial", backend="serial", **kw) for _ in range(3)]
            hit_s = (time.perf_counter() - t0) / len(hits)
            assert all(h.computed == 0 for h in hits)
            idle = run_sweep(noop, {"i": list(range(n_noop))}, cache_dir=root / "noop", backend="ray", **kw)
    finally:
        if started:
            ray.shutdown()
    per_point = serial.seconds / points
    return [
        Figure(SUITE, "sweep_ray_speedup", serial.seconds / on_ray.seconds, "x", ">= 1.5",
               f"{points} points of ~{per_point:.2f} s (pure-Python LCG, n={n}): serial {serial.seconds:.1f} s, "
               f"Ray with 2 worker CPUs {on_ray.seconds:.1f} s (Ray started and warmed up first); {_load()}"),
        Figure(SUITE, "sweep_cache_hit_seconds", hit_s, "s", "<= 1",
               f"rerun of the finished {points}-point grid, every point from the cache (mean of 3); {_load()}"),
        Figure(SUITE, "sweep_overhead_ms_per_task", 1e3 * idle.seconds / n_noop, "ms", "<= 20",
               f"Ray, {n_noop} no-op points: submit, run, fetch, atomic parquet cache write per point; {_load()}"),
    ]
