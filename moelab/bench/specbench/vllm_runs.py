"""Spec-Bench in vLLM: AR, vLLM's own ``ngram`` and ``suffix`` speculators, and HD (cost-aware, fixed,
REST-alone) as a ``custom_class`` drafter — same engine, same LM, same budget, one question at a time
(Spec-Bench's batch size 1), float32, greedy or sampled.

Each method keeps one warm engine in its own process (:mod:`moelab.bench.specbench.engine_pool`), and the
methods run back to back on each question, their order rotated (:func:`arrange_points`), so a shared
machine's changing load falls on every method alike. The runner is the ``hd-vllm`` sweep suite
(:data:`HD_VLLM_SUITE`, also ``moelab sweep hd-vllm``): every (question, method) result is cached under a key
of the point, the drafting code (:data:`RUN_CODE`), vLLM's version and the data (Spec-Bench, the S store), so
a rerun skips what is done and the full benchmark is resumable. Speed = output tokens / wall time of the
request (prefill included, as Spec-Bench times it); mean accepted tokens = output tokens / target forwards,
from vLLM's own speculative-decoding counters.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import FileFormatError, atomic_write_text, read_csv_checked, read_json
from moelab._validate import check_int, check_real
from moelab.bench.specbench.engine_pool import free_cores, mark_done, run_once, server, settle
from moelab.bench.specbench.engine_protocol import MAX_MODEL_LEN
from moelab.costmodel.verify import VerifyCost, cached_verify_cost, fit_verify_cost, machine_id
from moelab.datasets import cache_dir, load_spec_bench, public_path, repo_root
from moelab.hd.methods import vllm_methods
from moelab.hd.policy import check_budget
from moelab.hd.results import full_table_path, summarize_vllm, with_intervals
from moelab.hd.specbench import spec_bench_split
from moelab.hd.stores import default_model_store_path
from moelab.models.lm import DEFAULT_LM, chat_prompt_ids, lm_folder
from moelab.models.vllm_engine import _installed_version
from moelab.sweep.core import Scalar
from moelab.sweep.suite import Suite, run_suite

FULL_TOKENS = 128  # new tokens per question in the full benchmark (and in moelab bench hd's vLLM half)
#: result labels of the methods vLLM runs (:data:`moelab.hd.methods.METHODS`)
VLLM_METHODS = vllm_methods()


#: the README's command that installs vLLM's suffix peer (inside the activated venv): the sdist of
#: ``arctic-inference`` does not build in pip's isolated build environment (its bundled cmake does not find Python)
SUFFIX_INSTALL = ('pip install nanobind==2.9.2 grpcio-tools && PATH=$VIRTUAL_ENV/bin:$PATH '
                  'pip install --no-build-isolation "arctic-inference>=0.3,<0.4"')


def suffix_status() -> tuple[bool, str]:
    """Whether vLLM's suffix decoding can run here (``arctic-inference`` importable) and why not (with the
    command that installs it, :data:`SUFFIX_INSTALL`)."""
    if importlib.util.find_spec("arctic_inference") is None:
        return False, ("vLLM's suffix decoding needs arctic-inference, which is not installed here, so suffix is "
                       f"skipped; install it inside the venv with `{SUFFIX_INSTALL}` (a plain pip install of its "
                       "sdist fails: see the README)")
    return True, "arctic-inference installed"


#: the code a vLLM result depends on (hashed into every cached (question, method) result's key). Every method's
#: key hashes all of it, AR's too: a speedup compares methods measured back to back on a question, so a drafter
#: change re-measures every method, never HD alone against peers timed under another load (tried and undone:
#: HD re-run alone on a quieter machine read 1.87x where the interleaved run read 1.50x).
RUN_CODE = ("moelab.hd.drafters", "moelab.hd.stores", "moelab.hd.suffix", "moelab.hd.ngram", "moelab.hd.policy",
            "moelab.hd._ngram_jit", "moelab.hd._suffix_jit",  # the compiled store lookups decide drafts too
            "moelab.hd.rows", "moelab.hd.engine", "moelab.hd.methods", "moelab.hd.vllm_adapter",
            "moelab.costmodel.verify", "moelab.bench.specbench.engine_protocol", "moelab.bench.specbench.engine_pool",
            "moelab.bench.specbench.engine_worker", "moelab.models.vllm_engine", "moelab.models.lm_loading")


def run_data_files() -> list[Path]:
    """The data a vLLM result depends on: Spec-Bench and the shipped S store (L is rebuilt from the
    ShareGPT package per tokenizer; its file name carries that)."""
    return [public_path("spec-bench", download=False), default_model_store_path()]


@lru_cache(maxsize=1)
def _question_table() -> dict[int, dict[str, Any]]:
    from transformers import AutoTokenizer  # lazy: transformers pulls in torch

    tok = AutoTokenizer.from_pretrained(str(lm_folder(DEFAULT_LM)))
    return {int(r.question_id): {"question_id": int(r.question_id), "category": str(r.category),
                                 "prompt_ids": chat_prompt_ids(tok, r.prompt)} for r in load_spec_bench().itertuples()}


def vllm_point(question_id: int, method: str = "AR", budget: int = 8, max_new_tokens: int = 128,
               temperature: float = 0.0, seed: int = 0, l_max_tokens: int = 0, cost: str = "",
               tag: str = "", threads: int = 0) -> dict[str, Any]:
    """One Spec-Bench question through one method's warm vLLM engine (SmolLM2-135M, float32, batch 1).

    The point function of the ``hd-vllm`` sweep suite and of :func:`run_vllm_methods`. ``tag`` keeps a
    repeated measurement (e.g. AR again at the end) apart in the cache; ``l_max_tokens`` 0 means L's
    default size; ``threads`` is the engine's CPU compute threads (0: the environment's default, one per
    core; :func:`~moelab.bench.specbench.engine_pool.free_cores` says how many other work leaves free). HD
    (cost-aware) reads ``cost`` (a :class:`~moelab.costmodel.verify.VerifyCost` as JSON) or, when it
    is empty, this machine's measured verify-cost curve (:func:`measure_vllm_cost`); the row records the
    curve's hash."""
    if method not in VLLM_METHODS:
        raise ValueError(f"method must be one of {list(VLLM_METHODS)}; got {method!r}")
    qs = _question_table()
    if question_id not in qs:
        raise ValueError(f"question_id must be a Spec-Bench question id; got {question_id!r}")
    spec = engine_spec(method, budget, cost=cost, l_max_tokens=l_max_tokens, threads=threads)
    srv = server(spec, _engines_dir())
    settle()
    try:
        rec = srv.ask({**qs[question_id], "max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
                       "seed": int(seed)})
    finally:
        mark_done()
    rec.pop("temperature", None)
    rec.pop("budget", None)
    rec["cost_curve"] = hashlib.sha256(json.dumps(spec["cost"], sort_keys=True).encode()).hexdigest()[:8] \
        if spec["cost"] is not None else ""
    return rec


def _engines_dir() -> Path:
    return cache_dir() / "hd" / "vllm-engines"


def engine_spec(method: str, budget: int = 8, *, cost: str = "", l_max_tokens: int = 0,
                threads: int = 0) -> dict[str, Any]:
    """The settings of the warm engine a :func:`vllm_point` of ``method`` runs on (the key
    :func:`~moelab.bench.specbench.engine_pool.server` keeps it under): cost-aware HD reads ``cost`` (a
    :class:`~moelab.costmodel.verify.VerifyCost` as JSON) or, when it is empty, this machine's curve measured
    with the same ``threads``; every other method ignores ``cost``. ``threads``: the engine's CPU compute
    threads, 0 for the environment's default."""
    if method not in VLLM_METHODS:
        raise ValueError(f"method must be one of {list(VLLM_METHODS)}; got {method!r}")
    threads = _check_threads(threads)
    model_dir = str(lm_folder(DEFAULT_LM))
    curve = None
    if method == "HD-cost":
        curve = VerifyCost(**json.loads(cost)) if cost else measure_vllm_cost(model_dir, threads=threads)
    spec = {"method": method, "budget": int(budget), "model_dir": model_dir, "max_model_len": MAX_MODEL_LEN,
            "cost": curve.as_dict() if curve is not None else None, "l_max_tokens": int(l_max_tokens) or None, "seed": 0}
    if threads:  # only when set, so the default engine keeps its key (and its warm process)
        spec["threads"] = threads
    return spec


def _check_threads(threads: int) -> int:
    return check_int("threads", threads, low=0, high=os.cpu_count() or 1)


def start_engines(methods: Sequence[str], *, budget: int = 8, cost: VerifyCost | None = None,
                  l_max_tokens: int | None = None, threads: int | None = None) -> None:
    """Start the warm engines that :func:`run_vllm_methods` with the same arguments will use, side by side
    (one thread per engine; each engine is its own process). An engine's start is never measured, and
    starts overlap well on a 2-core machine (imports, HD's L store); the questions still run one at a time.
    Engines already warm are kept. ``threads`` as in :func:`run_vllm_methods` (pass the same count to both)."""
    budget = check_budget(budget)
    threads = free_cores() if threads is None else _check_threads(threads)
    curve = json.dumps(cost.as_dict(), sort_keys=True) if cost is not None else ""
    specs = [engine_spec(m, budget, cost=curve, l_max_tokens=int(l_max_tokens or 0), threads=threads)
             for m in dict.fromkeys(methods)]
    with ThreadPoolExecutor(max(1, len(specs))) as pool:
        list(pool.map(lambda spec: server(spec, _engines_dir()), specs))


def measure_vllm_cost(model_dir: str | Path, *, qs: Sequence[int] = (2, 3, 5, 9), context_tokens: int = 256,
                      timeout_s: float = 900.0, refresh: bool = False, threads: int = 0) -> VerifyCost:
    """vLLM's verify cost per step on this machine for ``q`` = 1 + chain length tokens (cached per machine,
    model and the engine's compute ``threads``, 0 for the environment's default): chains of ``q - 1`` wrong
    tokens, so every step emits one token and costs a q-token forward; the median over 5 interleaved rounds. It only seeds cost-aware HD: the engine corrects it online from its
    own step times (:class:`moelab.costmodel.verify.OnlineVerifyCost`)."""
    d_lens = sorted({check_int("qs entry", q, low=2, high=65) - 1 for q in qs})
    threads = _check_threads(threads)

    def measure() -> VerifyCost:
        out = cache_dir() / "hd" / "vllm-probe" / f"probe-{int(time.time())}"
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        prompt = rng.integers(100, 20000, size=context_tokens).tolist()
        run_once({"method": "probe", "budget": max(d_lens), "probe": d_lens, "probe_prompt": prompt,
                         "model_dir": str(model_dir), "out_dir": str(out), "threads": threads or None},
                        out / "worker.log", timeout_s)
        rows = read_json(out / "probe.json")["rows"]
        return fit_verify_cost([r["q"] for r in rows], [r["ms"] for r in rows],
                            f"vLLM CPU, {Path(model_dir).name}, context {context_tokens}, median over interleaved "
                            f"rounds, {f'{threads} threads, ' if threads else ''}"
                            f"measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}")

    # "vllm-median": curves cached as "vllm" were minima over 2 rounds (the least busy moment, not the typical step)
    # a curve per thread count: a forward on 1 thread costs another time than on 2
    return cached_verify_cost("vllm-median" + (f"-t{threads}" if threads else ""), Path(model_dir).name, measure,
                              refresh=refresh)


def arrange_points(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normal form and run order of vLLM sweep points (the ``hd-vllm`` suite's ``arrange``).

    Only cost-aware HD reads ``cost``: the other methods' points drop it, so their results (and cache
    keys) do not depend on a curve they never read, and the duplicates this makes merge. Then question by
    question: every method of a question back to back with the others, their order rotated from one
    question to the next, so no method is always first after a question change and a shared machine's
    changing load falls on every method alike."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    seen: set[tuple] = set()
    for p in points:
        p = dict(p) if p.get("method") == "HD-cost" else {**p, "cost": ""}
        key = tuple(sorted(p.items()))
        if key in seen:
            continue
        seen.add(key)
        # a question's group: every method of it, HD at whatever curve (so HD rotates with its peers too)
        groups.setdefault(tuple((k, v) for k, v in sorted(p.items()) if k not in ("method", "cost")), []).append(p)
    out: list[dict[str, Any]] = []
    for i, group in enumerate(groups.values()):
        r = i % len(group)
        out += group[r:] + group[:r]
    return out


def _question_ids() -> list[int]:
    return [int(i) for i in spec_bench_split("eval")["question_id"]]


def _check_points(points: list[dict[str, Scalar]]) -> None:
    ids = set(_question_ids())
    for p in points:
        if p["question_id"] not in ids:
            raise ValueError(f"question_id must be a Spec-Bench evaluation id ({len(ids)} ids in "
                             f"{min(ids)}..{max(ids)}, see moelab.hd.spec_bench_split('eval')); got {p['question_id']!r}")
        check_int("max_new_tokens", p["max_new_tokens"], low=1, high=MAX_MODEL_LEN // 2)
        check_real("temperature", p["temperature"], low=0)
        check_int("seed", p["seed"], low=0)
        if p["method"] not in VLLM_METHODS:
            raise ValueError(f"method must be one of {list(VLLM_METHODS)}; got {p['method']!r}")
        if p["method"] == "suffix" and not suffix_status()[0]:
            raise ValueError(suffix_status()[1])


def _vllm_version() -> list[str]:
    return [f"vllm=={_installed_version()}"]


#: the methods of the full benchmark: AR, vLLM's two speculators, and HD as cost-aware (the default) and fixed (the
#: paper's hierarchy), so the table answers both "HD vs its peers" and "does the cost policy pay"
FULL_METHODS = ("AR", "ngram", "suffix", "HD-cost", "HD-fixed")

#: the ``hd-vllm`` sweep suite: one (question, method) per point (``moelab sweep hd-vllm``); its default grid
#: is the full benchmark (all 480 questions x 5 methods, 128 tokens, greedy), the points and cache of
#: :func:`full_benchmark` with ``--out $MOELAB_CACHE/hd/vllm-runs``
HD_VLLM_SUITE = Suite(
    "hd-vllm", vllm_point,
    {"question_id": _question_ids, "method": list(FULL_METHODS), "budget": [8], "max_new_tokens": [128],
     "temperature": [0.0], "seed": [0], "l_max_tokens": [0], "cost": [""], "tag": [""], "threads": [0]},
    "Spec-Bench in vLLM, one (question, method) per point, methods interleaved (SmolLM2-135M, float32)",
    RUN_CODE, run_data_files, ("method", "category", "tokens_per_s", "new_tokens"), _vllm_version, _check_points,
    arrange=arrange_points)


def run_vllm_methods(questions: pd.DataFrame, *, methods: Sequence[str] = VLLM_METHODS,
                     budget: int = 8, max_new_tokens: int = FULL_TOKENS, temperature: float = 0.0,
                     cost: VerifyCost | None = None, l_max_tokens: int | None = None, run_tag: str = "",
                     out: str | Path | None = None, progress: bool = True,
                     compute: bool = True, threads: int | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """Run ``methods`` in vLLM on ``questions`` (Spec-Bench rows), interleaved question by question
    (:func:`arrange_points`, one warm engine per method), as the ``hd-vllm`` sweep suite with its cache in
    ``out`` (default :func:`default_runs_dir`): every (question, method) result is cached, so an
    interrupted run resumes, and ``moelab sweep hd-vllm --out`` the same folder shares the results. Returns the per-question
    table and ``{method: reason}`` for methods skipped (e.g. suffix without arctic-inference).
    ``run_tag`` keeps a repeated run of a method (e.g. AR measured again at the end) apart from the first.
    ``cost``: the verify-cost curve cost-aware HD reads (default: this machine's, measured once and cached).
    Speeds are only comparable when nothing else runs the engines' cores (the runner is serial for that).
    ``compute=False`` runs nothing and returns the results cached so far. Prompts come from Spec-Bench by
    question id (the workers tokenize them with the target's own chat template). ``threads``: every engine's
    CPU compute threads, part of each result's key; ``None`` counts the cores other work leaves free now
    (:func:`~moelab.bench.specbench.engine_pool.free_cores`): pass one count to calls whose results are
    compared."""
    budget = check_budget(budget)
    check_int("max_new_tokens", max_new_tokens, low=1, high=MAX_MODEL_LEN // 2)
    check_real("temperature", temperature, low=0.0)
    bad = sorted(set(methods) - set(VLLM_METHODS))
    if bad:
        raise ValueError(f"methods must be among {list(VLLM_METHODS)}; got unknown {bad}")
    skipped: dict[str, str] = {}
    if "suffix" in methods:
        ok, why = suffix_status()
        if not ok:
            skipped["suffix"] = why
    run = [m for m in methods if m not in skipped]
    if not run:
        return pd.DataFrame(), skipped
    threads = free_cores() if threads is None else _check_threads(threads)
    grid = {"question_id": [int(q) for q in questions["question_id"]], "method": run, "budget": [budget],
            "max_new_tokens": [int(max_new_tokens)], "temperature": [float(temperature)], "seed": [0],
            "l_max_tokens": [int(l_max_tokens or 0)],
            "cost": [json.dumps(cost.as_dict(), sort_keys=True) if cost is not None else ""], "tag": [str(run_tag)],
            "threads": [threads]}
    res = run_suite(HD_VLLM_SUITE, grid, out=Path(out) if out else default_runs_dir(), backend="serial", progress=progress,
                    compute=compute)
    df = res.frame
    if len(df):
        ar = df[df["method"] == "AR"].set_index("question_id")["output_ids"]
        df["identical"] = [None if temperature > 0 or qid not in ar.index else list(o) == list(ar.loc[qid])
                           for qid, o in zip(df["question_id"], df["output_ids"])]
    return df, skipped


def default_runs_dir() -> Path:
    """Where :func:`run_vllm_methods` and :func:`full_benchmark` keep results (``$MOELAB_CACHE/hd/vllm-runs``);
    ``moelab sweep hd-vllm --out`` this folder runs and resumes the same cached points."""
    return cache_dir() / "hd" / "vllm-runs"


#: the full run's progress, committed beside its table (``data/hd/``): one row per (question, method) of every
#: question all methods have finished, so the run resumes on another machine or in another session
POINTS_LEDGER = "specbench_vllm_points.csv"
#: a ledger's columns and their kinds (:func:`moelab._io.read_csv_checked`); ``draft_us_p50`` is empty for
#: methods that are not HD, ``identical`` is ``True``/``False`` (greedy) or empty (sampled)
LEDGER_COLUMNS = {"question_id": "int", "category": "str", "method": "str", "budget": "int", "max_new_tokens": "int",
                  "temperature": "float", "tokens_per_s": "float", "new_tokens": "int", "forwards": "float",
                  "run_code": "str", "machine": "str", "date": "str"}
LEDGER_EXTRA = ("accepted_tokens", "drafts", "draft_us_p50", "identical", "output_sha", "cost_curve", "engine_threads")
LEDGER_CHUNK = 12  # questions run between two ledger writes (2 per category: a few minutes of a 2-core machine)


def ledger_path() -> Path:
    """The committed progress of the full run (``data/hd/specbench_vllm_points.csv``, :data:`POINTS_LEDGER`)."""
    return full_table_path().with_name(POINTS_LEDGER)


def read_ledger(path: str | Path) -> pd.DataFrame:
    """A points ledger (:data:`LEDGER_COLUMNS`; size, columns and every value checked), or an empty table
    when ``path`` does not exist. Raises :class:`moelab.traces.FileFormatError` naming the file and the column."""
    path = Path(path)
    if not path.exists():
        return pd.DataFrame(columns=[*LEDGER_COLUMNS, *LEDGER_EXTRA])
    df = read_csv_checked(path, LEDGER_COLUMNS, non_negative=["question_id", "budget", "max_new_tokens", "temperature",
                                                             "tokens_per_s", "new_tokens", "forwards"])
    if "identical" in df:
        ident = df["identical"].astype(str).str.strip()
        bad = ~ident.isin(["True", "False", "", "nan", "None"])
        if bad.any():
            raise FileFormatError(path, "identical", f"must be True, False or empty; row {int(np.argmax(bad)) + 1} "
                                                     f"has {df['identical'].iloc[int(np.argmax(bad))]!r}")
        df["identical"] = [True if v == "True" else False if v == "False" else None for v in ident]
    bad_m = sorted(set(df["method"]) - set(VLLM_METHODS))
    if bad_m:
        raise FileFormatError(path, "method", f"must name a vLLM method {list(VLLM_METHODS)}; got {bad_m[0]!r}")
    return df


def _ledger_rows(df: pd.DataFrame, *, run_code: str, machine: str, date: str) -> pd.DataFrame:
    """Ledger rows of a :func:`run_vllm_methods` table (its questions that every method finished)."""
    out = df.assign(output_sha=[hashlib.sha256(json.dumps([int(t) for t in o]).encode()).hexdigest()[:16]
                                for o in df["output_ids"]],
                    run_code=run_code, machine=machine, date=date)
    for c in LEDGER_EXTRA:
        if c not in out:
            out[c] = np.nan
    return out[[*LEDGER_COLUMNS, *LEDGER_EXTRA]]


def _complete(df: pd.DataFrame, n_methods: int) -> pd.DataFrame:
    """The rows of the questions that ``n_methods`` methods have finished."""
    if not len(df):
        return df
    per_q = df.groupby("question_id")["method"].nunique()
    return df[df["question_id"].isin(per_q.index[per_q == n_methods])]


def full_benchmark(*, methods: Sequence[str] = FULL_METHODS, budget: int = 8, max_new_tokens: int = FULL_TOKENS,
                   temperatures: Sequence[float] = (0.0,), per_category: int | None = None,
                   out: str | Path | None = None, cache: str | Path | None = None,
                   ledger: str | Path | None = None, progress: bool = True, compute: bool = True,
                   threads: int | None = None) -> pd.DataFrame:
    """The whole Spec-Bench evaluation in vLLM (every category, all 480 questions, ``max_new_tokens``
    tokens, each temperature), the methods interleaved question by question (:func:`run_vllm_methods`),
    then one table with one row per method, category and temperature (each speedup and each HD-cost / method
    ratio with its paired 95 % bootstrap interval over questions and a verdict,
    :func:`moelab.hd.results.with_intervals`), stamped with date, commit, machine and
    the measuring code's version (``run_code``), written to ``out`` (default ``data/hd/specbench_vllm_full.csv``)
    once every question is done — the committed table is only ever a complete run.

    Resumable twice over: every (question, method) result is cached in ``cache`` (default
    :func:`default_runs_dir`; ``moelab sweep hd-vllm --out`` that folder runs the same points), and every
    question all methods have finished is recorded in the points ``ledger`` (default :func:`ledger_path`,
    rewritten every :data:`LEDGER_CHUNK` questions), which is committed: a run that takes longer than one
    machine's session (hours on a 2-core CPU) continues elsewhere from the questions still missing. A ledger
    row counts only for the measuring code it was measured with (``run_code``): rows of another code (the run
    the committed table summarises) stay in the ledger, never counted, until this code's run is complete,
    so a committed partial run never orphans the committed table. A question keeps all its methods from one
    machine and one sitting, so
    every per-question speedup compares methods measured back to back. Give it a quiet machine.

    ``threads``: every engine's CPU compute threads (:func:`run_vllm_methods`); ``None`` keeps the count the
    ledger's rows of this code were measured with (column ``engine_threads``), so a resumed run measures as it
    began, or on a fresh run counts the cores free now (:func:`~moelab.bench.specbench.engine_pool.free_cores`).

    ``compute=False`` runs nothing: the questions finished so far (ledger and cache) are recorded in the
    ledger and summarised (column ``complete`` False while some are missing); the summary is written only
    where ``out`` says."""
    questions = spec_bench_split("eval", per_category=per_category)
    # categories in turn (1st question of each, then the 2nd, ...): a run stopped part-way has covered every
    # category alike, so partial tables mean something before the end
    rank = questions.groupby("category", sort=False).cumcount()
    questions = questions.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank")
    run_code, machine, today = HD_VLLM_SUITE.code_version(), machine_id(), time.strftime("%Y-%m-%d", time.gmtime())
    ledger_file = Path(ledger) if ledger is not None else ledger_path()
    book = read_ledger(ledger_file)
    others = book[book["run_code"] != run_code]  # another code's run: kept, never counted, until this one is done
    book = book[book["run_code"] == run_code]
    if threads is None:
        measured = pd.to_numeric(book["engine_threads"], errors="coerce").dropna() if "engine_threads" in book else []
        threads = int(measured.iloc[0]) if len(measured) else (free_cores() if compute else 0)
    tables, used = [], []
    for t in temperatures:
        ok, why = suffix_status()
        skipped = {} if ("suffix" not in methods or ok) else {"suffix": why}
        ran = [m for m in methods if m not in skipped]
        for m, why in skipped.items():
            tables.append(pd.DataFrame([{"engine": "vllm", "method": m, "category": "overall", "budget": budget,
                                         "temperature": float(t), "skipped": why}]))
        mine = book[(book["budget"] == budget) & (book["max_new_tokens"] == max_new_tokens)
                    & np.isclose(book["temperature"].astype(float), float(t)) & book["method"].isin(ran)]
        mine = _complete(mine, len(ran))
        todo = questions[~questions["question_id"].isin(mine["question_id"])]
        step = LEDGER_CHUNK if compute else max(1, len(todo))
        for i in range(0, len(todo), step):
            df, _ = run_vllm_methods(todo.iloc[i:i + step], methods=ran, budget=budget, max_new_tokens=max_new_tokens,
                                     temperature=float(t), out=cache, progress=progress, compute=compute,
                                     threads=threads)
            new = _complete(df, len(ran))
            if len(new):
                mine = pd.concat([mine, _ledger_rows(new, run_code=run_code, machine=machine, date=today)],
                                 ignore_index=True)
                book = pd.concat([book[~(np.isclose(book["temperature"].astype(float), float(t))
                                         & book["question_id"].isin(new["question_id"]))], mine], ignore_index=True)
                book = book.drop_duplicates(["question_id", "method", "budget", "max_new_tokens", "temperature"],
                                            keep="last")
                done = all(_complete(book[np.isclose(book["temperature"].astype(float), float(x))],
                                     len(ran))["question_id"].nunique() == len(questions) for x in temperatures)
                atomic_write_text(ledger_file, pd.concat([book] if done else [others, book], ignore_index=True)
                                  .sort_values(["run_code", "temperature", "question_id", "method"]).to_csv(index=False))
        mine = mine[mine["question_id"].isin(questions["question_id"])]
        complete = mine["question_id"].nunique() == len(questions)
        used.append(mine)
        if not len(mine):
            tables.append(pd.DataFrame([{"engine": "vllm", "method": m, "category": "overall", "budget": budget,
                                         "temperature": float(t), "questions": 0, "complete": False} for m in ran]))
            continue
        # every speedup and every HD-cost / peer ratio with its paired 95 % bootstrap interval over questions
        # (each question's methods ran back to back, rotated: arrange_points)
        summ = with_intervals(summarize_vllm(mine), mine)
        summ["complete"] = complete
        summ["temperature"] = float(t)
        tables.append(summ)
    res = pd.concat(tables, ignore_index=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                        check=False).stdout.strip()
    except OSError:
        commit = ""
    # when the summarised rows were measured (a table summarised again later keeps its measurement's dates)
    rows = pd.concat(used, ignore_index=True) if used else book.iloc[:0]
    dates = sorted(set(rows["date"].astype(str))) if len(rows) else [today]
    res["date"] = dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"
    res["commit"] = commit
    # the measuring code's version every result is keyed on (RUN_CODE, vLLM's version): a table written at a
    # later commit is still that code's measurement
    res["run_code"] = run_code
    # where the summarised rows were measured: one machine, or every machine their questions came from
    machines = sorted(set(rows["machine"].astype(str))) if len(rows) else [machine]
    res["machine"] = "+".join(machines)
    res["questions_per_category"] = per_category or "all"
    res["max_new_tokens"] = max_new_tokens
    if out is not None or ("complete" in res and bool(res["complete"].fillna(True).all())):
        atomic_write_text(Path(out) if out else full_table_path(), res.to_csv(index=False))
    return res


__all__ = ["FULL_METHODS", "FULL_TOKENS", "HD_VLLM_SUITE", "LEDGER_CHUNK", "POINTS_LEDGER", "RUN_CODE", "VLLM_METHODS",
           "arrange_points", "default_runs_dir", "full_benchmark", "ledger_path", "measure_vllm_cost", "read_ledger",
           "run_data_files", "run_vllm_methods",
           "SUFFIX_INSTALL", "engine_spec", "start_engines", "suffix_status", "vllm_point"]
