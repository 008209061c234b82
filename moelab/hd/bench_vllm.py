"""Spec-Bench in vLLM: AR, vLLM's own ``ngram`` and ``suffix`` speculators, and HD (cost-aware, fixed,
REST-alone) as a ``custom_class`` drafter — same engine, same LM, same budget, one question at a time
(Spec-Bench's batch size 1), float32, greedy or sampled.

Each method keeps one warm engine in its own process (:mod:`moelab.hd.vllm_pool`), and the methods run
back to back on each question, their order rotated (:func:`arrange_points`), so a shared machine's
changing load falls on every method alike. The runner is the ``hd-vllm`` sweep suite (:func:`moelab.sweep.suites.run_suite`,
also ``moelab sweep hd-vllm``): every (question, method) result is cached under a key of the point, the
drafting code (:data:`RUN_CODE`), vLLM's version and the data (Spec-Bench, the S store), so a rerun skips
what is done and the full benchmark is resumable. Speed = output tokens / wall time of the request (prefill included,
as Spec-Bench times it); mean accepted tokens = output tokens / target forwards, from vLLM's own
speculative-decoding counters.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import atomic_write_json, read_json
from moelab._validate import check_int, check_real
from moelab.hd.policy import VerifyCost, check_budget

VLLM_METHODS = ("AR", "ngram", "suffix", "HD", "HD-fixed", "REST")
PROBE_TOKEN = 0  # <|endoftext|> for SmolLM2: greedy decoding of a chat answer never emits it


class SuffixUnavailableError(ImportError):
    """vLLM's ``suffix`` method needs the ``arctic-inference`` package."""


def suffix_status() -> tuple[bool, str]:
    """Whether vLLM's suffix decoding can run here (``arctic-inference`` importable) and why not."""
    import importlib.util

    if importlib.util.find_spec("arctic_inference") is None:
        return False, ("vLLM's suffix decoding needs `pip install arctic-inference` (builds from source); it is not "
                       "installed here, so suffix is skipped")
    return True, "arctic-inference installed"


def speculative_config_for(method: str, budget: int, cost: VerifyCost | None = None,
                           l_max_tokens: int | None = None) -> dict[str, Any] | None:
    """vLLM ``speculative_config`` of a method at ``budget`` draft tokens per step (None for AR)."""
    budget = check_budget(budget)
    if method == "AR":
        return None
    if method == "ngram":  # vLLM's prompt lookup (PLD): match the last 1..3 tokens
        return {"method": "ngram", "num_speculative_tokens": budget, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if method == "suffix":
        ok, why = suffix_status()
        if not ok:
            raise SuffixUnavailableError(why)
        return {"method": "suffix", "num_speculative_tokens": budget, "suffix_decoding_max_tree_depth": budget}
    from moelab.hd.vllm_adapter import speculative_config

    opts: dict[str, Any] = {}
    if l_max_tokens:
        opts["l_max_tokens"] = int(l_max_tokens)
    if method == "HD":
        if cost is None:
            raise ValueError("method 'HD' (cost-aware) needs the measured vLLM verify-cost curve `cost`")
        return speculative_config("hd", budget, cost=cost.as_dict(), **opts)
    if method == "HD-fixed":
        return speculative_config("hd-fixed", budget, **opts)
    if method == "REST":
        return speculative_config("rest", budget, **opts)
    raise ValueError(f"method must be one of {list(VLLM_METHODS)}; got {method!r}")


def _spec_counters(engine: Any) -> tuple[float, float]:
    """(accepted tokens, drafts) from vLLM's metrics, NaN when stats are off."""
    acc = drafts = float("nan")
    try:
        for m in engine.get_metrics():
            if m.name == "vllm:spec_decode_num_accepted_tokens":
                acc = float(m.value)
            elif m.name == "vllm:spec_decode_num_drafts":
                drafts = float(m.value)
    except Exception:  # noqa: BLE001 - metrics are optional
        pass
    return acc, drafts


def _make_engine(spec: dict[str, Any]) -> tuple[Any, float]:
    """The engine of ``spec`` (its method's speculative config, batch size 1), warmed up; and its start time."""
    from moelab.models.vllm_engine import generate, make_engine

    method, budget = spec["method"], int(spec["budget"])
    cost = VerifyCost(**spec["cost"]) if spec.get("cost") else None
    kw: dict[str, Any] = {}
    sc = None
    if spec.get("probe"):
        from moelab.hd.vllm_adapter import speculative_config

        sc = speculative_config("probe", max(spec["probe"]), probe_len=1, probe_token=PROBE_TOKEN)
    elif method != "AR":
        sc = speculative_config_for(method, budget, cost, spec.get("l_max_tokens"))
    if sc is not None:
        kw["speculative_config"] = sc
    t0 = time.perf_counter()
    engine = make_engine(spec["model_dir"], max_model_len=int(spec.get("max_model_len", 2048)), max_num_seqs=1,
                         seed=int(spec.get("seed", 0)), disable_log_stats=False, **kw)
    start_s = time.perf_counter() - t0
    generate(engine, [[1, 2, 3, 4]], 4, progress=False)  # warm-up
    return engine, start_s


def _run_question(engine: Any, method: str, budget: int, q: dict[str, Any], *, max_new_tokens: int,
                  temperature: float, seed: int) -> dict[str, Any]:
    """One question through a warm engine: output, wall time, vLLM's speculative counters, HD's own stats."""
    from moelab.hd import vllm_adapter
    from moelab.models.vllm_engine import generate

    acc0, dr0 = _spec_counters(engine)
    stats0 = vllm_adapter.ACTIVE.rows.stats.as_dict() if vllm_adapter.ACTIVE is not None else None
    n_us0 = len(vllm_adapter.ACTIVE.rows.stats.draft_us) if vllm_adapter.ACTIVE is not None else 0
    t = time.perf_counter()
    g = generate(engine, [q["prompt_ids"]], int(max_new_tokens), temperature=temperature, seed=seed, progress=False)[0]
    wall = time.perf_counter() - t
    acc1, dr1 = _spec_counters(engine)
    n = len(g.output_ids)
    accepted = acc1 - acc0 if method != "AR" else 0.0
    rec = {"question_id": q["question_id"], "category": q["category"], "method": method, "budget": budget,
           "engine": "vllm", "temperature": temperature, "new_tokens": n, "wall_s": wall,
           "tokens_per_s": n / wall if wall > 0 else float("nan"), "accepted_tokens": accepted,
           "drafts": dr1 - dr0 if method != "AR" else 0.0,
           "forwards": (n - accepted) if np.isfinite(accepted) else float("nan"),
           "output_ids": list(g.output_ids)}
    if vllm_adapter.ACTIVE is not None and stats0 is not None:
        st = vllm_adapter.ACTIVE.rows.stats
        us = st.draft_us[n_us0:]
        rec["draft_us_p50"] = float(np.median(us)) if us else float("nan")
        rec["hd_drafted_tokens"] = st.drafted_tokens - stats0["drafted_tokens"]
        rec["hd_accepted_tokens"] = st.accepted_tokens - stats0["accepted_tokens"]
    return rec


def serve(spec: dict[str, Any]) -> int:
    """Engine server (run by :class:`moelab.hd.vllm_pool.EngineServer` in a child process): build the
    engine of ``spec``, answer ``{"ready": true}``, then one JSON record per question read from stdin
    (one JSON object per line) until EOF. Answers go to a private copy of stdout; the process's own
    stdout and stderr (vLLM's logs) go to stderr, which the parent sends to a log file."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine, start_s = _make_engine(spec)
    answers.write(json.dumps({"ready": True, "engine_start_s": start_s}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            rec = _run_question(engine, spec["method"], int(spec["budget"]), q, max_new_tokens=int(q["max_new_tokens"]),
                                temperature=float(q["temperature"]), seed=int(q.get("seed", 0)))
            rec["engine_start_s"] = start_s
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            rec = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(rec) + "\n")
    return 0


def _worker(spec: dict[str, Any]) -> int:
    """One-shot worker (the verify-cost probe), called in a subprocess."""
    engine, start_s = _make_engine(spec)
    return _probe(engine, spec, start_s)


def _probe(engine: Any, spec: dict[str, Any], start_s: float) -> int:
    """Verify cost per chain length: chains that are always rejected, step time from two output lengths."""
    from moelab.hd import vllm_adapter
    from moelab.hd.engine import make_row_drafters
    from moelab.models.vllm_engine import generate

    prompt = spec["probe_prompt"]
    tok_path = str(engine.llm_engine.vllm_config.model_config.tokenizer)
    lengths = [0, *spec["probe"]]
    short, long_ = int(spec.get("probe_short", 4)), int(spec.get("probe_long", 20))
    best: dict[tuple[int, int], float] = {}
    # rounds over every length (not one length after another): a shared machine's load drifts, and the
    # minimum over rounds of interleaved runs is what each length costs when the machine is least busy
    for _ in range(int(spec.get("probe_repeat", 2))):
        for d in lengths:
            vllm_adapter.ACTIVE.rows = make_row_drafters({"method": "probe", "probe_len": d, "probe_token": PROBE_TOKEN},
                                                         tokenizer_path=tok_path, budget=max(spec["probe"]))
            for n in (short, long_):
                t = time.perf_counter()
                generate(engine, [prompt], n, ignore_eos=True, progress=False)
                dt = time.perf_counter() - t
                best[(d, n)] = min(best.get((d, n), float("inf")), dt)
    rows = [{"q": d + 1, "ms": (best[(d, long_)] - best[(d, short)]) / (long_ - short) * 1e3} for d in lengths]
    atomic_write_json(Path(spec["out_dir"]) / "probe.json", {"rows": rows, "engine_start_s": start_s})
    return 0


# ------------------------------------------------------------------------------------------ driver
def preload_libraries() -> str:
    """``LD_PRELOAD`` for vLLM's CPU workers: Intel OpenMP when the environment ships it (vLLM warns that
    speculative decoding on CPU is much slower without it). Every method gets the same setting."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    have = os.environ.get("LD_PRELOAD", "")
    if lib.is_file() and "libiomp" not in have:
        return f"{lib}:{have}" if have else str(lib)
    return have


def worker_env() -> dict[str, str]:
    """Environment of every vLLM worker process (same for every method)."""
    return dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind",
                VLLM_NO_USAGE_STATS="1", LD_PRELOAD=preload_libraries())


def _run_subprocess(spec: dict[str, Any], log: Path, timeout_s: float) -> None:
    spec_path = log.with_suffix(".spec.json")
    atomic_write_json(spec_path, spec)
    with open(log, "wb") as fh:
        proc = subprocess.run([sys.executable, "-m", "moelab.hd.bench_vllm", str(spec_path)], stdout=fh,
                              stderr=subprocess.STDOUT, env=worker_env(), timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"vLLM worker for {spec['method']} failed (exit {proc.returncode}); log {log}:\n{tail}")


#: the code a vLLM result depends on (hashed into every cached (question, method) result's key)
RUN_CODE = ("moelab.hd.drafters", "moelab.hd.stores", "moelab.hd.suffix", "moelab.hd.ngram", "moelab.hd.policy",
            "moelab.hd.rows", "moelab.hd.engine", "moelab.hd.vllm_adapter", "moelab.hd.vllm_pool", "moelab.hd.bench_vllm",
            "moelab.models.vllm_engine", "moelab.models.lm_loading")


def run_data_files() -> list[Path]:
    """The data a vLLM result depends on: Spec-Bench and the shipped S store (L is rebuilt from the
    ShareGPT package per tokenizer; its file name carries that)."""
    from moelab.datasets import public_path
    from moelab.hd.stores import default_model_store_path

    return [public_path("spec-bench", download=False), default_model_store_path()]


MAX_MODEL_LEN = 4096  # every Spec-Bench eval prompt (<= ~3.3k SmolLM2 tokens) plus 512 new tokens fits


@lru_cache(maxsize=1)
def _question_table() -> dict[int, dict[str, Any]]:
    from transformers import AutoTokenizer

    from moelab.datasets import load_spec_bench
    from moelab.models.lm import DEFAULT_LM, chat_prompt_ids, lm_folder

    tok = AutoTokenizer.from_pretrained(str(lm_folder(DEFAULT_LM)))
    return {int(r.question_id): {"question_id": int(r.question_id), "category": str(r.category),
                                 "prompt_ids": chat_prompt_ids(tok, r.prompt)} for r in load_spec_bench().itertuples()}


def vllm_point(question_id: int, method: str = "AR", budget: int = 8, max_new_tokens: int = 128,
               temperature: float = 0.0, seed: int = 0, l_max_tokens: int = 0, cost: str = "",
               tag: str = "") -> dict[str, Any]:
    """One Spec-Bench question through one method's warm vLLM engine (SmolLM2-135M, float32, batch 1).

    The point function of the ``hd-vllm`` sweep suite and of :func:`run_vllm_methods`. ``tag`` keeps a
    repeated measurement (e.g. AR again at the end) apart in the cache; ``l_max_tokens`` 0 means L's
    default size. HD (cost-aware) reads ``cost`` (a :class:`~moelab.hd.policy.VerifyCost` as JSON) or, when it
    is empty, this machine's measured verify-cost curve (:func:`measure_vllm_cost`); the row records the
    curve's hash."""
    from moelab.datasets import cache_dir
    from moelab.hd import vllm_pool
    from moelab.models.lm import DEFAULT_LM, lm_folder

    if method not in VLLM_METHODS:
        raise ValueError(f"method must be one of {list(VLLM_METHODS)}; got {method!r}")
    qs = _question_table()
    if question_id not in qs:
        raise ValueError(f"question_id must be a Spec-Bench question id; got {question_id!r}")
    model_dir = str(lm_folder(DEFAULT_LM))
    curve = None
    if method == "HD":
        curve = VerifyCost(**json.loads(cost)) if cost else measure_vllm_cost(model_dir)
    spec = {"method": method, "budget": int(budget), "model_dir": model_dir, "max_model_len": MAX_MODEL_LEN,
            "cost": curve.as_dict() if curve is not None else None, "l_max_tokens": int(l_max_tokens) or None, "seed": 0}
    srv = vllm_pool.server(spec, cache_dir() / "hd" / "vllm-engines")
    vllm_pool.settle()
    try:
        rec = srv.ask({**qs[question_id], "max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
                       "seed": int(seed)})
    finally:
        vllm_pool.mark_done()
    rec.pop("temperature", None)
    rec.pop("budget", None)
    rec["cost_curve"] = hashlib.sha256(json.dumps(curve.as_dict(), sort_keys=True).encode()).hexdigest()[:8] \
        if curve is not None else ""
    return rec


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
        p = dict(p) if p.get("method") == "HD" else {**p, "cost": ""}
        key = tuple(sorted(p.items()))
        if key in seen:
            continue
        seen.add(key)
        groups.setdefault(tuple((k, v) for k, v in sorted(p.items()) if k != "method"), []).append(p)
    out: list[dict[str, Any]] = []
    for i, group in enumerate(groups.values()):
        r = i % len(group)
        out += group[r:] + group[:r]
    return out


def measure_vllm_cost(model_dir: str | Path, *, qs: Sequence[int] = (2, 3, 5, 9), context_tokens: int = 256,
                      timeout_s: float = 900.0, refresh: bool = False) -> VerifyCost:
    """vLLM's verify cost per step on this machine for ``q`` = 1 + chain length tokens (cached per machine
    and model): chains of ``q - 1`` wrong tokens, so every step emits one token and costs a q-token forward."""
    from moelab.datasets import cache_dir
    from moelab.hd.policy import cached_verify_cost, robust_curve

    d_lens = sorted({check_int("qs entry", q, low=2, high=65) - 1 for q in qs})

    def measure() -> VerifyCost:
        out = cache_dir() / "hd" / "vllm-probe" / f"probe-{int(time.time())}"
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        prompt = rng.integers(100, 20000, size=context_tokens).tolist()
        _run_subprocess({"method": "probe", "budget": max(d_lens), "probe": d_lens, "probe_prompt": prompt,
                         "model_dir": str(model_dir), "out_dir": str(out)}, out / "worker.log", timeout_s)
        rows = read_json(out / "probe.json")["rows"]
        return robust_curve([r["q"] for r in rows], [r["ms"] for r in rows],
                            f"vLLM CPU, {Path(model_dir).name}, context {context_tokens}, min over interleaved rounds, "
                            f"measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}")

    return cached_verify_cost("vllm", Path(model_dir).name, measure, refresh=refresh)


def run_vllm_methods(questions: pd.DataFrame, tokenizer: Any = None, *, methods: Sequence[str] = VLLM_METHODS,
                     budget: int = 8, max_new_tokens: int = 128, temperature: float = 0.0,
                     cost: VerifyCost | None = None, l_max_tokens: int | None = None, run_tag: str = "",
                     out: str | Path | None = None, progress: bool = True) -> tuple[pd.DataFrame, dict[str, str]]:
    """Run ``methods`` in vLLM on ``questions`` (Spec-Bench rows), interleaved question by question
    (:func:`arrange_points`, one warm engine per method), as the ``hd-vllm`` sweep suite with its cache in
    ``out`` (default :func:`default_runs_dir`): every (question, method) result is cached, so an
    interrupted run resumes, and ``moelab sweep hd-vllm --out`` the same folder shares the results. Returns the per-question
    table and ``{method: reason}`` for methods skipped (e.g. suffix without arctic-inference).
    ``run_tag`` keeps a repeated run of a method (e.g. AR measured again at the end) apart from the first.
    ``cost``: the verify-cost curve cost-aware HD reads (default: this machine's, measured once and cached).
    Speeds are only comparable when nothing else runs the engines' cores (the runner is serial for that).
    ``tokenizer`` is unused (kept for callers; prompts come from Spec-Bench by question id)."""
    from moelab.sweep.suites import run_suite

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
    grid = {"question_id": [int(q) for q in questions["question_id"]], "method": run, "budget": [budget],
            "max_new_tokens": [int(max_new_tokens)], "temperature": [float(temperature)], "seed": [0],
            "l_max_tokens": [int(l_max_tokens or 0)],
            "cost": [json.dumps(cost.as_dict(), sort_keys=True) if cost is not None else ""], "tag": [str(run_tag)]}
    res = run_suite("hd-vllm", grid, out=Path(out) if out else default_runs_dir(), backend="serial", progress=progress)
    df = res.frame
    if len(df):
        ar = df[df["method"] == "AR"].set_index("question_id")["output_ids"]
        df["identical"] = [None if temperature > 0 or qid not in ar.index else list(o) == list(ar.loc[qid])
                           for qid, o in zip(df["question_id"], df["output_ids"])]
    return df, skipped


def default_runs_dir() -> Path:
    """Where :func:`run_vllm_methods` and :func:`full_benchmark` keep results (``$MOELAB_CACHE/hd/vllm-runs``);
    ``moelab sweep hd-vllm --out`` this folder runs and resumes the same cached points."""
    from moelab.datasets import cache_dir

    return cache_dir() / "hd" / "vllm-runs"


def summarize_vllm(df: pd.DataFrame) -> pd.DataFrame:
    """Per (method, category) and overall: speedup over AR (mean per-question tokens/s ratio, Spec-Bench),
    mean accepted tokens, identical outputs."""
    from moelab.datasets import SPEC_BENCH_CATEGORIES

    ar = df[df["method"] == "AR"].set_index("question_id")["tokens_per_s"]
    out = []
    for (m, cat), g in list(df.groupby(["method", "category"], sort=False)) + \
            [((m, "overall"), g) for m, g in df.groupby("method", sort=False)]:
        base = ar.reindex(g["question_id"]).to_numpy()
        fw = g["forwards"].sum()
        out.append({"engine": "vllm", "method": m, "category": cat, "budget": int(g["budget"].iloc[0]),
                    "questions": len(g), "tokens_per_s": float(g["tokens_per_s"].mean()),
                    "speedup": float(g["tokens_per_s"].mean() / np.nanmean(base)),
                    "mean_accepted": float(g["new_tokens"].sum() / fw) if fw > 0 else float("nan"),
                    "identical": None if g["identical"].isna().any() else bool(g["identical"].all()),
                    "draft_us_p50": float(g["draft_us_p50"].median()) if "draft_us_p50" in g else float("nan")})
    res = pd.DataFrame(out)
    order = {c: i for i, c in enumerate([*SPEC_BENCH_CATEGORIES, "overall"])}
    return res.assign(_o=res["category"].map(order)).sort_values(["method", "_o"]).drop(columns="_o") \
        .reset_index(drop=True)


FULL_TABLE = "specbench_vllm_full.csv"  # in data/hd/: the committed full-benchmark table (when it has been run)


def full_table_path() -> Path:
    from moelab.datasets import repo_root

    return repo_root() / "data" / "hd" / FULL_TABLE


FULL_METHODS = ("AR", "ngram", "suffix", "HD")


def full_benchmark(*, methods: Sequence[str] = FULL_METHODS, budget: int = 8, max_new_tokens: int = 128,
                   temperatures: Sequence[float] = (0.0,), per_category: int | None = None,
                   out: str | Path | None = None, cache: str | Path | None = None,
                   progress: bool = True) -> pd.DataFrame:
    """The whole Spec-Bench evaluation in vLLM (every category, all 480 questions, ``max_new_tokens``
    tokens, each temperature), the methods interleaved question by question (:func:`run_vllm_methods`):
    resumable (every (question, method) result cached; a rerun skips what is done), then one table with
    one row per method, category and temperature, stamped with date, commit and machine, written to
    ``out`` (default ``data/hd/specbench_vllm_full.csv``). Hours on a 2-core CPU: give it a quiet machine
    (``moelab sweep hd-vllm`` runs the same points)."""
    import subprocess as sp

    from moelab.datasets import repo_root
    from moelab.hd.policy import machine_id
    from moelab.hd.specbench import spec_bench_split

    questions = spec_bench_split("eval", per_category=per_category)
    tables = []
    for t in temperatures:
        df, skipped = run_vllm_methods(questions, methods=methods, budget=budget, max_new_tokens=max_new_tokens,
                                       temperature=float(t), out=cache, progress=progress)
        summ = summarize_vllm(df)
        summ["temperature"] = float(t)
        tables.append(summ)
        for m, why in skipped.items():
            tables.append(pd.DataFrame([{"engine": "vllm", "method": m, "category": "overall", "budget": budget,
                                         "temperature": float(t), "skipped": why}]))
    res = pd.concat(tables, ignore_index=True)
    try:
        commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                        check=False).stdout.strip()
    except OSError:
        commit = ""
    res["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    res["commit"] = commit
    res["machine"] = machine_id()
    res["questions_per_category"] = per_category or "all"
    res["max_new_tokens"] = max_new_tokens
    from moelab._io import atomic_write_text

    atomic_write_text(Path(out) if out else full_table_path(), res.to_csv(index=False))
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--serve":
        return serve(read_json(args[1]))
    if len(args) != 1:
        print("usage: python -m moelab.hd.bench_vllm [--serve] SPEC.json (internal worker)", file=sys.stderr)
        return 2
    return _worker(read_json(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["FULL_METHODS", "FULL_TABLE", "MAX_MODEL_LEN", "RUN_CODE", "VLLM_METHODS", "full_benchmark", "full_table_path",
           "arrange_points", "default_runs_dir", "measure_vllm_cost", "run_data_files", "run_vllm_methods", "serve",
           "speculative_config_for", "suffix_status", "summarize_vllm", "vllm_point", "worker_env"]
