"""Persistent vLLM engines, one per speculative method, serving one Spec-Bench question at a time.

Why servers: a fair speed comparison on a shared CPU needs the methods measured under the same
conditions. Running all of AR, then all of ngram, ... puts each method in a different stretch of the
machine's load; keeping one warm engine per method and running the methods back to back on each
question (their order rotated from question to question) puts them side by side in time, and no two
engines ever compute at once. Each engine lives in its own process (vLLM keeps per-process global
state; two engines in one process disturb each other) and answers JSON lines on a private pipe; its
own log output goes to a file.

The parent side of the process boundary (the child is :mod:`moelab.bench.specbench.engine_worker`; what
both read is :mod:`moelab.bench.specbench.engine_protocol`). The point function
:func:`moelab.bench.specbench.vllm_runs.vllm_point` uses :func:`server`; the sweep runner
(``moelab sweep hd-vllm``) caches each (question, method) result, so a run resumes where it stopped.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moelab._io import atomic_write_json
from moelab.bench.specbench.engine_protocol import worker_command, worker_env

#: at most this many engines stay warm at once (each holds the model, a KV cache and, for HD/REST, L)
MAX_ENGINES = 6
#: seconds between two questions: idle OpenMP threads of the previous engine spin for ~0.2 s after it
#: stops, and the next engine must not share the cores with them
SETTLE_S = 0.3


class EngineServer:
    """One warm vLLM engine in a child process (:func:`~moelab.bench.specbench.engine_protocol.worker_command`).

    Parameters
    ----------
    spec : dict
        Engine settings (``method``, ``budget``, ``model_dir``, ``max_model_len``, ``cost``, ...), as
        :func:`moelab.bench.specbench.engine_worker.serve` reads them.
    log_dir : path
        Where the spec file and the engine's log are written.
    start_timeout_s : float
        How long engine start may take.
    """

    def __init__(self, spec: dict[str, Any], log_dir: Path, *, start_timeout_s: float = 900.0) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        self.log = log_dir / f"{spec['method']}-b{spec['budget']}.log"
        spec_path = self.log.with_suffix(".spec.json")
        atomic_write_json(spec_path, spec)
        self._log_fh = open(self.log, "wb")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(worker_command(spec_path, serve=True), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_fh,
                                     env=worker_env(spec.get("threads")))
        self.last_used = time.monotonic()
        ready = self._read(start_timeout_s)
        if ready.get("ready") is not True:
            self.close()
            raise RuntimeError(f"vLLM engine for {spec['method']} did not start: {ready}; log {self.log}:\n{self._tail()}")
        self.start_s = float(ready.get("engine_start_s", float("nan")))
        #: the compute threads the engine runs (as its torch reports them)
        self.threads = int(ready.get("threads", 0))

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise TimeoutError(f"vLLM engine for {self.spec['method']} gave no answer in {timeout_s:.0f} s; "
                                   f"log {self.log}:\n{self._tail()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 5.0))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    code = self.proc.wait()
                    raise RuntimeError(f"vLLM engine for {self.spec['method']} exited (code {code}); log {self.log}:\n"
                                       f"{self._tail()}")
                return json.loads(line)
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM engine for {self.spec['method']} exited (code {self.proc.returncode}); "
                                   f"log {self.log}:\n{self._tail()}")

    def ask(self, question: dict[str, Any], *, timeout_s: float = 1800.0) -> dict[str, Any]:
        """Run one question (``question_id``, ``category``, ``prompt_ids``, ``max_new_tokens``,
        ``temperature``, ``seed``) and return the engine's record of it."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"vLLM engine for {self.spec['method']} is not running; log {self.log}")
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(question) + "\n").encode())
        self.proc.stdin.flush()
        rec = self._read(timeout_s)
        self.last_used = time.monotonic()
        if "error" in rec:
            raise RuntimeError(f"vLLM engine for {self.spec['method']} failed on question {question.get('question_id')}: "
                               f"{rec['error']}")
        return rec

    def close(self) -> None:
        """Stop the engine process (EOF first, then terminate, then kill)."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._log_fh.close()


_SERVERS: dict[str, EngineServer] = {}
_LAST_ASK = [0.0]


def server(spec: dict[str, Any], log_dir: Path) -> EngineServer:
    """The warm engine for ``spec`` (started on first use; the least recently used one is stopped when
    more than :data:`MAX_ENGINES` would be warm)."""
    key = json.dumps(spec, sort_keys=True)
    srv = _SERVERS.get(key)
    if srv is not None and srv.proc.poll() is None:
        return srv
    if srv is not None:
        srv.close()
        del _SERVERS[key]
    while len(_SERVERS) >= MAX_ENGINES:
        old = min(_SERVERS, key=lambda k: _SERVERS[k].last_used)
        _SERVERS.pop(old).close()
    _SERVERS[key] = EngineServer(spec, log_dir)
    return _SERVERS[key]


def settle() -> None:
    """Wait until :data:`SETTLE_S` has passed since the last question ended (see its comment)."""
    wait = SETTLE_S - (time.monotonic() - _LAST_ASK[0])
    if wait > 0:
        time.sleep(wait)


def mark_done() -> None:
    _LAST_ASK[0] = time.monotonic()


def close_all() -> None:
    """Stop every warm engine (also run at interpreter exit)."""
    while _SERVERS:
        _SERVERS.popitem()[1].close()


def run_once(spec: dict[str, Any], log: Path, timeout_s: float) -> None:
    """Run a one-shot worker (the verify-cost probe) on ``spec``; its output goes to ``log``."""
    spec_path = log.with_suffix(".spec.json")
    atomic_write_json(spec_path, spec)
    with open(log, "wb") as fh:
        proc = subprocess.run(worker_command(spec_path, serve=False), stdout=fh, stderr=subprocess.STDOUT,
                              env=worker_env(spec.get("threads")), timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"vLLM worker for {spec['method']} failed (exit {proc.returncode}); log {log}:\n{tail}")


def free_cores(window_s: float = 0.5) -> int:
    """How many of the cores this process may run on other work leaves free: the cores, less the busy time
    every process spent on them over ``window_s`` seconds (Linux ``/proc/stat``), rounded, at least 1. Where
    the kernel gives no per-core counts, all of them. What an engine's ``threads`` should be on a machine
    that also runs other work (:func:`~moelab.bench.specbench.engine_protocol.worker_env` says why)."""
    if not 0.05 <= window_s <= 60:
        raise ValueError(f"window_s must be in [0.05, 60] seconds; got {window_s!r}")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    try:
        before = _cpu_times()
        time.sleep(window_s)
        after = _cpu_times()
    except (OSError, ValueError):
        return len(cpus)
    return free_cores_from_cpu_times(before, after, cpus)


def _cpu_times() -> dict[int, tuple[int, int]]:
    """``{cpu: (busy jiffies, total jiffies)}`` from ``/proc/stat`` (idle and iowait count as not busy)."""
    out = {}
    with open("/proc/stat", "rb") as fh:
        text = fh.read(1 << 20).decode("ascii", "replace")
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        f = [int(x) for x in rest.split()]
        idle = f[3] + (f[4] if len(f) > 4 else 0)
        total = sum(f[:8])  # user..steal; guest time is already inside user
        out[int(name[3:])] = (total - idle, total)
    return out


def free_cores_from_cpu_times(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                              cpus: Sequence[int]) -> int:
    """Free cores among ``cpus`` between two ``{cpu: (busy, total)}`` readings: ``len(cpus)`` less the summed
    busy fractions, rounded, at least 1 (a spread-out load counts for what it takes in all)."""
    busy = 0.0
    for c in cpus:
        if c in before and c in after:
            d_total = after[c][1] - before[c][1]
            if d_total > 0:
                busy += min(1.0, max(0.0, (after[c][0] - before[c][0]) / d_total))
    return max(1, int(round(len(cpus) - busy)))


atexit.register(close_all)

__all__ = ["MAX_ENGINES", "SETTLE_S", "EngineServer", "close_all", "free_cores", "free_cores_from_cpu_times",
           "mark_done", "run_once", "server", "settle"]
