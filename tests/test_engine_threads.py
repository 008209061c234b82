"""The vLLM engines' compute threads: the free-core count they are given, and the environment that sets it."""

from __future__ import annotations

import pytest

from moelab.bench.specbench.engine_pool import free_cores, free_cores_from_cpu_times
from moelab.bench.specbench.engine_protocol import worker_env


def test_a_core_held_by_other_work_is_not_free():
    before = {0: (100, 1000), 1: (100, 1000)}
    # core 1 spent 98 of 100 jiffies busy (a spinning job), core 0 three
    after = {0: (103, 1100), 1: (198, 1100)}
    assert free_cores_from_cpu_times(before, after, [0, 1]) == 1
    quiet = {0: (103, 1100), 1: (104, 1100)}
    assert free_cores_from_cpu_times(before, quiet, [0, 1]) == 2


def test_a_load_spread_over_cores_counts_for_what_it_takes_in_all():
    before = {c: (0, 0) for c in range(4)}
    # one job migrating between four cores: half of two of them, a quarter of the others' ... 1.5 cores in all
    after = {0: (50, 100), 1: (50, 100), 2: (25, 100), 3: (25, 100)}
    assert free_cores_from_cpu_times(before, after, [0, 1, 2, 3]) == 2  # 4 - 1.5, rounded to even
    # cores outside this process's set, and a core the kernel did not tick, do not count
    assert free_cores_from_cpu_times(before, after, [0]) == 1
    assert free_cores_from_cpu_times(before, {0: (0, 0)}, [0]) == 1


def test_never_fewer_than_one_free_core():
    before = {0: (0, 0), 1: (0, 0)}
    after = {0: (100, 100), 1: (100, 100)}
    assert free_cores_from_cpu_times(before, after, [0, 1]) == 1


def test_free_cores_reads_this_machine():
    import os

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert 1 <= free_cores(0.1) <= n
    with pytest.raises(ValueError, match="window_s"):
        free_cores(0.0)


def test_the_worker_environment_sets_the_threads_only_when_given(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert worker_env()["OMP_NUM_THREADS"] == "7"  # the environment's own setting stays
    assert worker_env(1)["OMP_NUM_THREADS"] == "1"
    assert worker_env(1)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_an_engine_spec_names_its_threads_and_refuses_impossible_counts():
    import os

    from moelab.bench.specbench.vllm_runs import engine_spec

    assert "threads" not in engine_spec("AR")  # the default engine keeps its key
    assert engine_spec("AR", threads=1)["threads"] == 1
    with pytest.raises(ValueError, match="threads"):
        engine_spec("AR", threads=(os.cpu_count() or 1) + 1)
    with pytest.raises(ValueError, match="threads"):
        engine_spec("AR", threads=-1)
