"""The child side of the vLLM engine process boundary: one warm engine per process, one Spec-Bench question
at a time (Spec-Bench's batch size 1), float32; AR, vLLM's own ``ngram`` and ``suffix`` speculators, and HD
(cost-aware, fixed, REST-alone) as a ``custom_class`` drafter at the same budget
(:func:`moelab.hd.methods.vllm_speculative_config`).

Run as ``python -m moelab.bench.specbench.engine_worker [--serve] SPEC.json`` by
:mod:`moelab.bench.specbench.engine_pool` (the wire format: :mod:`moelab.bench.specbench.engine_protocol`).
Speed = output tokens / wall time of the request (prefill included, as Spec-Bench times it); mean accepted
tokens = output tokens / target forwards, from vLLM's own speculative-decoding counters.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_write_json, read_json
from moelab.bench.specbench.engine_protocol import PROBE_TOKEN, SERVE_FLAG
from moelab.costmodel.verify import VerifyCost
from moelab.hd import vllm_adapter
from moelab.hd.engine import make_row_drafters
from moelab.hd.methods import vllm_speculative_config
from moelab.hd.vllm_adapter import adapter_config, publish_adapter_config, speculative_config
from moelab.models.vllm_engine import generate, make_engine


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
    method, budget = spec["method"], int(spec["budget"])
    cost = VerifyCost(**spec["cost"]) if spec.get("cost") else None
    kw: dict[str, Any] = {}
    if spec.get("probe"):
        sc, adapter = speculative_config(max(spec["probe"])), adapter_config("probe", probe_len=1,
                                                                             probe_token=PROBE_TOKEN)
    else:  # HD's proposer times its calls here: the rows report drafting latency per question
        sc, adapter = vllm_speculative_config(method, budget, cost=cost, l_max_tokens=spec.get("l_max_tokens"),
                                              timing=True)
    if adapter is not None:
        publish_adapter_config(adapter)
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
    acc0, dr0 = _spec_counters(engine)
    stats0 = vllm_adapter.ACTIVE.rows.stats.as_dict() if vllm_adapter.ACTIVE is not None else None
    n_us0 = vllm_adapter.ACTIVE.rows.stats.timed if vllm_adapter.ACTIVE is not None else 0
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
        us = st.draft_us_since(n_us0)
        rec["draft_us_p50"] = float(np.median(us)) if us.size else float("nan")
        rec["hd_drafted_tokens"] = st.drafted_tokens - stats0["drafted_tokens"]
        rec["hd_accepted_tokens"] = st.accepted_tokens - stats0["accepted_tokens"]
        rows = vllm_adapter.ACTIVE.rows
        if getattr(rows, "policy_choice", None) is not None:  # the engine's choice after this question
            ch = rows.policy_choice.as_dict()
            rec["hd_policy"] = ch["best"]
            rec["hd_policy_steps"] = ch["steps"]
        if getattr(rows, "cost_model", None) is not None:  # the online curve after this question
            rec["hd_cost_rel_q2"] = float(rows.cost_model.relative(2))
            rec["hd_cost_rel_q9"] = float(rows.cost_model.relative(9))
    return rec


def _compute_threads() -> int:
    """The engine's CPU compute threads, as torch runs them (what ``OMP_NUM_THREADS`` set, or its default)."""
    import torch  # lazy: the engine has imported it by now

    return int(torch.get_num_threads())


def serve(spec: dict[str, Any]) -> int:
    """Engine server (run by :class:`moelab.bench.specbench.engine_pool.EngineServer` in a child process): build the
    engine of ``spec``, answer ``{"ready": true}``, then one JSON record per question read from stdin
    (one JSON object per line) until EOF. Answers go to a private copy of stdout; the process's own
    stdout and stderr (vLLM's logs) go to stderr, which the parent sends to a log file."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine, start_s = _make_engine(spec)
    threads = _compute_threads()
    answers.write(json.dumps({"ready": True, "engine_start_s": start_s, "threads": threads}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            rec = _run_question(engine, spec["method"], int(spec["budget"]), q, max_new_tokens=int(q["max_new_tokens"]),
                                temperature=float(q["temperature"]), seed=int(q.get("seed", 0)))
            rec["engine_start_s"] = start_s
            rec["engine_threads"] = threads
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
    prompt = spec["probe_prompt"]
    tok_path = str(engine.llm_engine.vllm_config.model_config.tokenizer)
    lengths = [0, *spec["probe"]]
    short, long_ = int(spec.get("probe_short", 4)), int(spec.get("probe_long", 20))
    per_step: dict[int, list[float]] = {d: [] for d in lengths}
    # rounds over every length (not one length after another): a shared machine's load drifts; each round
    # gives one per-step time per length (the long run minus the short one: prefill cancels), and the median
    # over rounds is the typical cost (a minimum is the cost of the least busy moment, which a busy machine's
    # steps never see; the online curve then corrects the seed from the engine's own steps)
    for _ in range(int(spec.get("probe_repeat", 5))):
        for d in lengths:
            vllm_adapter.ACTIVE.rows = make_row_drafters({"method": "probe", "probe_len": d, "probe_token": PROBE_TOKEN},
                                                         tokenizer_path=tok_path, budget=max(spec["probe"]))
            dt = {}
            for n in (short, long_):
                t = time.perf_counter()
                generate(engine, [prompt], n, ignore_eos=True, progress=False)
                dt[n] = time.perf_counter() - t
            per_step[d].append((dt[long_] - dt[short]) / (long_ - short) * 1e3)
    # a preempted short run can make one round's difference tiny or negative: the median ignores it, and a
    # floor keeps the fit's input positive
    rows = [{"q": d + 1, "ms": max(float(np.median(per_step[d])), 1e-3), "rounds": per_step[d]} for d in lengths]
    atomic_write_json(Path(spec["out_dir"]) / "probe.json", {"rows": rows, "engine_start_s": start_s})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == SERVE_FLAG:
        return serve(read_json(args[1]))
    if len(args) != 1:
        print("usage: python -m moelab.bench.specbench.engine_worker [--serve] SPEC.json (internal worker)", file=sys.stderr)
        return 2
    return _worker(read_json(args[0]))


__all__ = ["main", "serve"]


if __name__ == "__main__":
    raise SystemExit(main())
