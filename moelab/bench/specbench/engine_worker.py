"""The measuring side of Spec-Bench in vLLM: one warm engine per method in its own process, one question
at a time (Spec-Bench's batch size 1), float32; AR, vLLM's own ``ngram`` and ``suffix`` speculators, and HD
(cost-aware, fixed, REST-alone) as a ``custom_class`` drafter at the same budget.

Everything a cached result depends on lives here or in the modules of :data:`RUN_CODE` (hashed into every
(question, method) result's key); the driver and the tables (:mod:`moelab.hd.bench_vllm`) are not, so
they can change without invalidating hours of measurements. Speed = output tokens / wall time of the
request (prefill included, as Spec-Bench times it); mean accepted tokens = output tokens / target forwards,
from vLLM's own speculative-decoding counters.
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

from moelab._io import atomic_write_json, read_json
from moelab._validate import check_int
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
        proc = subprocess.run([sys.executable, "-m", "moelab.hd.vllm_worker", str(spec_path)], stdout=fh,
                              stderr=subprocess.STDOUT, env=worker_env(), timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"vLLM worker for {spec['method']} failed (exit {proc.returncode}); log {log}:\n{tail}")


#: the code a vLLM result depends on (hashed into every cached (question, method) result's key). Every method's
#: key hashes all of it, AR's too: a speedup compares methods measured back to back on a question, so a drafter
#: change re-measures every method, never HD alone against peers timed under another load (tried and undone:
#: HD re-run alone on a quieter machine read 1.87x where the interleaved run read 1.50x).
RUN_CODE = ("moelab.hd.drafters", "moelab.hd.stores", "moelab.hd.suffix", "moelab.hd.ngram", "moelab.hd.policy",
            "moelab.hd.rows", "moelab.hd.engine", "moelab.hd.vllm_adapter", "moelab.hd.vllm_pool", "moelab.hd.vllm_worker",
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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--serve":
        return serve(read_json(args[1]))
    if len(args) != 1:
        print("usage: python -m moelab.hd.vllm_worker [--serve] SPEC.json (internal worker)", file=sys.stderr)
        return 2
    return _worker(read_json(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())



if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["MAX_MODEL_LEN", "PROBE_TOKEN", "RUN_CODE", "VLLM_METHODS", "SuffixUnavailableError", "measure_vllm_cost",
           "run_data_files", "serve", "speculative_config_for", "suffix_status", "vllm_point", "worker_env"]
