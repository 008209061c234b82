"""What both sides of the vLLM engine process boundary share: how a worker is started, its environment,
and the engine spec it reads (the parent, :mod:`moelab.bench.specbench.engine_pool`, and the child,
:mod:`moelab.bench.specbench.engine_worker`, import this module and never each other).

The wire format: the parent writes the engine spec (a JSON object: ``method`` (a result label of
:data:`moelab.hd.methods.METHODS`), ``budget``, ``model_dir``, ``max_model_len``, ``cost``, ``l_max_tokens``,
``seed``, ``threads``; or a verify-cost probe's ``probe``, ``probe_prompt``, ``out_dir``) to a file and starts
``python -m moelab.bench.specbench.engine_worker [--serve] SPEC.json``. A serving worker answers
``{"ready": true, "engine_start_s": ..., "threads": ...}``, then one JSON record per question line it reads from stdin
(``question_id``, ``category``, ``prompt_ids``, ``max_new_tokens``, ``temperature``, ``seed``), or
``{"error": "..."}``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WORKER_MODULE = "moelab.bench.specbench.engine_worker"
SERVE_FLAG = "--serve"
MAX_MODEL_LEN = 4096  # every Spec-Bench eval prompt (<= ~3.3k SmolLM2 tokens) plus 512 new tokens fits
PROBE_TOKEN = 0  # <|endoftext|> for SmolLM2: greedy decoding of a chat answer never emits it


def worker_command(spec_path: Path, *, serve: bool) -> list[str]:
    """The command line of a worker reading the spec at ``spec_path`` (serving, or a one-shot probe)."""
    return [sys.executable, "-m", WORKER_MODULE, *([SERVE_FLAG] if serve else []), str(spec_path)]


def preload_libraries() -> str:
    """``LD_PRELOAD`` for vLLM's CPU workers: Intel OpenMP when the environment ships it (vLLM warns that
    speculative decoding on CPU is much slower without it). Every method gets the same setting."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    have = os.environ.get("LD_PRELOAD", "")
    if lib.is_file() and "libiomp" not in have:
        return f"{lib}:{have}" if have else str(lib)
    return have


def worker_env(threads: int | None = None) -> dict[str, str]:
    """Environment of a vLLM worker process (the same for every method).

    ``threads``: the engine's CPU compute threads (``OMP_NUM_THREADS``, which torch and vLLM's CPU kernels
    read at start-up); ``None`` leaves the environment's setting (by default, one per core). On a machine
    where other work holds cores, a thread per *free* core is both faster and steadier: on 2 cores with one
    kept busy, a forward took 139 ms with 2 threads and 81 ms with 1, and back-to-back runs of one method
    differed 2.4 times more (the thread that shares the busy core holds every other at each barrier)."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_NO_USAGE_STATS="1", LD_PRELOAD=preload_libraries())
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(int(threads))
    return env


__all__ = ["MAX_MODEL_LEN", "PROBE_TOKEN", "SERVE_FLAG", "WORKER_MODULE", "preload_libraries", "worker_command",
           "worker_env"]
