"""Spec-Bench measured in vLLM: the runs (:mod:`~moelab.bench.specbench.vllm_runs`), and the engine pool
(parent side, :mod:`~moelab.bench.specbench.engine_pool`) and engine worker (child side,
:mod:`~moelab.bench.specbench.engine_worker`) split along the process boundary, with what both read in
:mod:`~moelab.bench.specbench.engine_protocol`.

The questions are :func:`moelab.hd.spec_bench_split`; the HF experiment is :mod:`moelab.hd.experiments`;
the method configs are :mod:`moelab.hd.methods`; result tables are :mod:`moelab.hd.results`.
"""

from moelab.bench.specbench.vllm_runs import (
    FULL_METHODS,
    FULL_TOKENS,
    HD_VLLM_SUITE,
    VLLM_METHODS,
    default_runs_dir,
    full_benchmark,
    measure_vllm_cost,
    run_vllm_methods,
)

__all__ = ["FULL_METHODS", "FULL_TOKENS", "HD_VLLM_SUITE", "VLLM_METHODS", "default_runs_dir", "full_benchmark",
           "measure_vllm_cost", "run_vllm_methods"]
