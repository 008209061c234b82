"""Capture expert activations through vLLM: the same :class:`~moelab.traces.ExpertTrace` as the HF
backend, for batched requests under continuous batching.

How (vLLM internals, pinned to :data:`moelab.models.vllm_engine.SUPPORTED_VLLM`):

* every ``MoERunner`` module's router gets a capture callback (``router.set_capture_fn``) that
  receives the ``[num_tokens, top_k]`` expert ids of the flat token batch of one forward step;
* a forward hook on every ``GateLinear`` (the router projection) gives the router logits, from
  which router probabilities are summed over prompt tokens;
* a forward pre-hook on the model reads the model runner's batch layout for that step — the
  request ids in batch order (``input_batch.req_ids``), their token spans (``query_start_loc``) and
  each token's position — so every captured row is attributed to (request, position): positions
  below the prompt length are prefill tokens, the rest are generated tokens being fed back.

The hooks are installed with ``LLM.collective_rpc`` (the callable receives the worker, hence the
runner) and are module-level functions, so they can be shipped to worker processes. vLLM's own
``enable_return_routed_experts`` needs Model Runner V2 + Triton (fails on CPU); the hooks work on
both, but on GPU they need ``enforce_eager=True`` (no CUDA graphs), which :func:`make_engine`
sets by default.

Decode convention (shared with the HF backend): ``decode_ids[t]`` is the routing of generated
token ``t`` when it is fed back as input. To record ``T`` of them vLLM generates ``T + 1`` tokens
(the last one is sampled but never fed); ``decode_tokens`` holds the first ``T``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from moelab._validate import check_choice, check_int
from moelab.models.vllm_engine import make_engine, require_vllm
from moelab.traces import ExpertTrace, Geometry, default_provenance, expert_counts

_ATTR = "_moelab_expert_recorder"
_METHODS = {"hooks": "moelab hooks (MoERunner capture_fn, GateLinear, runner batch layout)",
            "routed_experts": "vLLM enable_return_routed_experts (CompletionOutput.routed_experts)"}
_ENGINE_LOCK = threading.RLock()  # one engine call at a time (the signature service runs in a thread)
_LAYER_RE = re.compile(r"layers\.(\d+)\.")


class NoMoELayersError(ValueError):
    """The model has no MoE layer vLLM's capture hooks can attach to."""


class _Recorder:
    """Lives in the worker: collects, per forward step, the batch layout and every layer's top-k ids."""

    def __init__(self, runner: Any, layer_ids: list[int], top_k: int, num_experts: int) -> None:
        self.runner = runner
        self.slot = {lid: i for i, lid in enumerate(layer_ids)}
        self.top_k, self.num_experts = top_k, num_experts
        self.enabled = False
        self.records: list[dict[str, Any]] = []
        self.cur: dict[str, Any] | None = None
        self.handles: list[Any] = []
        self.errors: list[str] = []

    # model forward pre-hook: the batch layout of this step
    def pre_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not self.enabled:
            return
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        batch = self.runner.input_batch
        n_req = int(batch.num_reqs)
        qsl = np.asarray(self.runner.query_start_loc.np[: n_req + 1], dtype=np.int64).copy()
        n_tok = int(qsl[-1])
        L = len(self.slot)
        self.cur = {
            "req_ids": [str(r) for r in batch.req_ids[:n_req]],
            "qsl": qsl,
            "positions": positions[:n_tok].detach().to("cpu").numpy().astype(np.int64).copy(),
            "input_ids": None if input_ids is None else input_ids[:n_tok].detach().to("cpu").numpy().astype(np.int64).copy(),
            "ids": np.full((n_tok, L, self.top_k), -1, dtype=np.int32),
            "probs": np.zeros((n_tok, L, self.num_experts), dtype=np.float32),
            "seen": np.zeros(L, dtype=bool),
        }

    def post_forward(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.enabled and self.cur is not None:
            if not self.cur["seen"].all():
                self.errors.append(f"a forward step captured only {int(self.cur['seen'].sum())} of {len(self.slot)} MoE layers")
            self.records.append(self.cur)
            self.cur = None

    def capture(self, layer_id: int, topk_ids: Any) -> None:
        cur = self.cur
        if cur is None:
            return
        n = cur["ids"].shape[0]
        s = self.slot[layer_id]
        cur["ids"][:, s, :] = topk_ids[:n].detach().to("cpu").numpy()
        cur["seen"][s] = True

    def gate(self, layer_id: int, module: Any, inputs: Any, output: Any) -> None:
        cur = self.cur
        if cur is None:
            return
        import torch

        logits = output[0] if isinstance(output, tuple) else output
        n = cur["probs"].shape[0]
        cur["probs"][:, self.slot[layer_id], :] = torch.softmax(logits[:n].float(), dim=-1).detach().to("cpu").numpy()


def _moe_modules(model: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """MoE runners and router gates by decoder-layer index."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners, gates = {}, {}
    for name, mod in model.named_modules():
        m = _LAYER_RE.search(name + ".")
        if isinstance(mod, MoERunner) and isinstance(getattr(mod, "router", None), BaseRouter):
            runners[int(mod.layer_id) if mod.layer_id is not None else int(m.group(1))] = mod
        elif isinstance(mod, GateLinear) and m:
            gates[int(m.group(1))] = mod
    return runners, gates


def _install(worker: Any) -> dict[str, Any]:
    """Worker side: attach the recorder (idempotent); returns the MoE geometry vLLM sees."""
    from functools import partial

    runner = worker.model_runner
    model = runner.get_model()
    rec = getattr(worker, _ATTR, None)
    runners, gates = _moe_modules(model)
    if not runners:
        return {"num_layers": 0}
    layer_ids = sorted(runners)
    first = runners[layer_ids[0]]
    top_k = int(first.router.top_k)
    num_experts = int(first.router.global_num_experts)
    if rec is None:
        rec = _Recorder(runner, layer_ids, top_k, num_experts)
        for lid, mod in runners.items():
            mod.router.set_capture_fn(partial(rec.capture, lid))
        for lid, mod in gates.items():
            if lid in rec.slot:
                rec.handles.append(mod.register_forward_hook(partial(rec.gate, lid)))
        rec.handles.append(model.register_forward_pre_hook(rec.pre_forward, with_kwargs=True))
        rec.handles.append(model.register_forward_hook(rec.post_forward, with_kwargs=True))
        setattr(worker, _ATTR, rec)
    return {"num_layers": len(layer_ids), "layer_ids": layer_ids, "top_k": top_k, "num_experts": num_experts,
            "gates": sorted(set(gates) & set(rec.slot))}


def _set_enabled(worker: Any, enabled: bool) -> None:
    rec = getattr(worker, _ATTR)
    rec.enabled = enabled
    rec.cur = None
    if enabled:
        rec.records, rec.errors = [], []


def _drain(worker: Any) -> dict[str, Any]:
    rec = getattr(worker, _ATTR)
    out = {"records": rec.records, "errors": rec.errors}
    rec.records, rec.errors = [], []
    return out


def _remove(worker: Any) -> None:
    rec = getattr(worker, _ATTR, None)
    if rec is None:
        return
    for h in rec.handles:
        h.remove()
    for mod in _moe_modules(worker.model_runner.get_model())[0].values():
        mod.router.set_capture_fn(None)
    delattr(worker, _ATTR)


# ---------------------------------------------------------------------- parent side
def _is_engine(obj: Any) -> bool:
    return hasattr(obj, "generate") and hasattr(obj, "collective_rpc")


def install_hooks(engine: Any) -> dict[str, Any]:
    """Install moelab's capture hooks in ``engine`` (a ``vllm.LLM``); returns the MoE geometry.

    Raises :class:`NoMoELayersError` if the model has no MoE layer."""
    info = engine.collective_rpc(_install)[0]
    if not info["num_layers"]:
        raise NoMoELayersError("the model has no MoE layers (no vLLM MoERunner with a router): nothing to capture")
    return info


def remove_hooks(engine: Any) -> None:
    """Detach moelab's hooks from ``engine``."""
    engine.collective_rpc(_remove)


def resolve_model_path(model: Any) -> str:
    """``"tiny-moe"`` -> the bundled model folder; anything else unchanged."""
    if str(model) in ("tiny-moe", "moelab-tiny-moe"):
        from moelab.models.tiny_moe import TINY_MOE_PATH

        return str(TINY_MOE_PATH)
    return str(model)


def _eos_ids(engine: Any) -> set[int]:
    eos = engine.llm_engine.model_config.hf_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()


def _model_name(engine: Any) -> str:
    try:
        return str(engine.llm_engine.model_config.model)
    except AttributeError:
        return "unknown"


def capture_vllm(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], max_new_tokens: int, *,
                 request_ids: Sequence[str] | None = None, domains: Sequence[str] | None = None,
                 tokenizer: Any = None, add_special_tokens: bool = False, stop_at_eos: bool = False,
                 with_probs: bool = True, keep_prefill_ids: bool = True, model_name: str | None = None,
                 method: str = "auto", progress: bool = True, **engine_kwargs: Any) -> ExpertTrace:
    """Capture prefill expert counts and greedy-decode top-k ids of ``prompts`` through vLLM.

    Same semantics as the HF backend (:func:`moelab.capture.hf.capture_hf`), so the two traces are
    comparable token for token.

    Parameters
    ----------
    model : str, path or vllm.LLM
        A model folder / hub id / ``"tiny-moe"`` (an in-process engine is made with
        :func:`moelab.models.vllm_engine.make_engine` and ``engine_kwargs``) or an engine to reuse
        (hooks are installed once and stay; prefix caching must be off).
    prompts : list of str or of token-id lists
        Strings are tokenized with the model's tokenizer without special tokens (as the HF backend
        does); token ids are used as they are.
    max_new_tokens : int
        Greedy tokens generated per request whose routing is recorded (``T``).
    request_ids, domains : list of str, optional
        Default ``"r0", "r1", ...`` and ``"unknown"``.
    tokenizer : optional
        A Hugging Face tokenizer for string prompts (default: the engine's).
    add_special_tokens : bool
        Add BOS etc. when tokenizing strings (default False, as the HF backend).
    stop_at_eos : bool
        Stop a request after it generates end-of-sequence (that token's own decode step is still
        recorded, as in the HF backend). Default: exactly ``T`` tokens.
    with_probs, keep_prefill_ids : bool
        Record router probabilities summed over prompt tokens; keep per-token prefill ids.
    model_name : str, optional
        Name recorded in the geometry and provenance.
    method : {"auto", "hooks", "routed_experts"}
        ``"routed_experts"`` reads vLLM's own per-token routing (engines made with
        ``make_engine(..., return_routed_experts=True)``; needs a GPU: Model Runner V2 + Triton; no
        router probabilities, and CUDA graphs may stay on). ``"hooks"`` uses moelab's hooks (CPU and
        GPU, eager mode). ``"auto"``: routed_experts when the engine returns them, else hooks.
    progress : bool
        vLLM's progress bar.

    Returns
    -------
    ExpertTrace with ``prefill_counts``, ``decode_ids``, ``decode_tokens`` (+ ``prefill_ids``,
    ``prefill_probs`` with hooks).
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
    n = len(prompts)
    if n == 0:
        raise ValueError("prompts must be a non-empty list")
    request_ids = [f"r{i}" for i in range(n)] if request_ids is None else [str(r) for r in request_ids]
    domains = ["unknown"] * n if domains is None else [str(d) for d in domains]
    if len(request_ids) != n or len(domains) != n:
        raise ValueError(f"request_ids and domains must have one entry per prompt ({n})")
    require_vllm()
    engine = model if _is_engine(model) else make_engine(resolve_model_path(model), **engine_kwargs)
    token_lists = _tokenize(engine, prompts, tokenizer, add_special_tokens)
    # always generate past EOS (the EOS token's own decode step must be fed and recorded), then cut
    check_choice("method", method, ("auto", "hooks", "routed_experts"))
    native = _returns_routed_experts(engine)
    if method == "routed_experts" and not native:
        raise ValueError("method='routed_experts' needs an engine made with return_routed_experts=True (GPU only: "
                         "vLLM's routed-experts capture needs Model Runner V2 + Triton); use method='hooks'")
    if native and method != "hooks":
        method = "routed_experts"
        with_probs = False  # vLLM returns expert ids only
        info, prefill_ids, decode_ids, probs, gen = _capture_native(engine, token_lists, max_new_tokens, progress, request_ids)
    else:
        method = "hooks"
        info, prefill_ids, decode_ids, probs, gen = _capture(engine, token_lists, max_new_tokens, ignore_eos=True,
                                                             with_probs=with_probs, progress=progress, labels=request_ids)
    if stop_at_eos:
        eos = _eos_ids(engine)
        for i, g in enumerate(gen):
            hit = [t for t, tok in enumerate(g[:max_new_tokens]) if tok in eos]
            if hit:
                decode_ids[i] = decode_ids[i][: hit[0] + 1]
    L, k, E = info["num_layers"], info["top_k"], info["num_experts"]
    counts = np.zeros((n, L, E), np.int32)
    for i in range(n):
        counts[i] = expert_counts(prefill_ids[i], E)
    name = model_name or _model_name(engine)
    return ExpertTrace.from_requests(
        request_ids=request_ids, domains=domains, prompt_tokens=[np.asarray(t) for t in token_lists],
        prefill_counts=counts, decode_ids=decode_ids,
        geometry=Geometry(L, E, k, name, tuple(f"layers.{lid}.mlp" for lid in info["layer_ids"])),
        provenance=default_provenance("vllm", name, method=_METHODS[method],
                                      max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos, greedy=True,
                                      decode_semantics="decode_ids[t] = routing of the forward whose input is decode_tokens[t]"),
        prefill_ids=prefill_ids if keep_prefill_ids else None, prefill_probs=probs.astype(np.float32) if with_probs else None,
        decode_tokens=[np.asarray(g[: len(decode_ids[i])]) for i, g in enumerate(gen)],
    )


def _capture(engine: Any, token_lists: list[list[int]], max_new_tokens: int, *, ignore_eos: bool, with_probs: bool,
             progress: bool, labels: Sequence[str]) -> tuple[dict[str, Any], list[np.ndarray], list[np.ndarray], np.ndarray, list[list[int]]]:
    """Run the requests with the hooks on; per request: prefill ids ``[P, L, k]``, decode ids
    ``[T', L, k]`` (``T' <= max_new_tokens``; fewer only if generation stopped early), summed router
    probabilities ``[L, E]`` and generated token ids."""
    vllm = require_vllm()
    info = install_hooks(engine)
    L, k, E = info["num_layers"], info["top_k"], info["num_experts"]
    n = len(token_lists)
    max_len = engine.llm_engine.model_config.max_model_len
    too_long = [i for i, t in enumerate(token_lists) if len(t) + max_new_tokens + 1 > max_len]
    if too_long:
        raise ValueError(f"prompts {too_long[:5]} plus max_new_tokens+1={max_new_tokens + 1} exceed the engine's "
                         f"max_model_len={max_len}")
    params = vllm.SamplingParams(max_tokens=max_new_tokens + 1, temperature=0.0, ignore_eos=ignore_eos)
    with _ENGINE_LOCK:
        engine.collective_rpc(_set_enabled, args=(True,))
        try:
            outputs = engine.generate([{"prompt_token_ids": t} for t in token_lists], params, use_tqdm=progress)
        finally:
            engine.collective_rpc(_set_enabled, args=(False,))
            drained = engine.collective_rpc(_drain)[0]
    if drained["errors"]:
        raise RuntimeError("vLLM capture hooks missed layers: " + "; ".join(drained["errors"][:3]))
    external = {str(o.request_id): i for i, o in enumerate(outputs)}
    gen = [list(o.outputs[0].token_ids) for o in outputs]
    plen = np.array([len(t) for t in token_lists], dtype=np.int64)
    # decode rows we expect: generated tokens that were fed back, at most T per request
    dlen = np.minimum(np.array([max(len(g) - 1, 0) for g in gen], dtype=np.int64), max_new_tokens)
    prefill_ids = [np.full((plen[i], L, k), -1, np.int32) for i in range(n)]
    decode_ids = [np.full((dlen[i], L, k), -1, np.int32) for i in range(n)]
    probs = np.zeros((n, L, E), np.float64)
    for rec in drained["records"]:
        owners = np.full(rec["qsl"][-1], -1, np.int64)
        for j, rid in enumerate(rec["req_ids"]):
            # the engine-internal id is "<external id>-<8 random chars>"
            owners[rec["qsl"][j]:rec["qsl"][j + 1]] = external.get(rid.rsplit("-", 1)[0], external.get(rid, -1))
        for i in np.unique(owners[owners >= 0]):
            rows = np.flatnonzero(owners == i)
            pos = rec["positions"][rows]
            pre = pos < plen[i]
            prefill_ids[i][pos[pre]] = rec["ids"][rows[pre]]
            if with_probs:
                probs[i] += rec["probs"][rows[pre]].sum(axis=0)
            dec = ~pre & (pos - plen[i] < dlen[i])
            decode_ids[i][pos[dec] - plen[i]] = rec["ids"][rows[dec]]
    missing = [labels[i] for i in range(n) if (prefill_ids[i] < 0).any() or (decode_ids[i] < 0).any()]
    if missing:
        raise RuntimeError(f"vLLM capture lost tokens of requests {missing[:5]}: was prefix caching enabled on this "
                           "engine (cached prefixes are not recomputed)? make one with moelab.models.vllm_engine.make_engine")
    return info, prefill_ids, decode_ids, probs, gen


def _returns_routed_experts(engine: Any) -> bool:
    try:
        return bool(engine.llm_engine.vllm_config.aux_output_config.enable_return_routed_experts)
    except AttributeError:
        return False


def _capture_native(engine: Any, token_lists: list[list[int]], max_new_tokens: int, progress: bool,
                    labels: Sequence[str]) -> tuple[dict[str, Any], list[np.ndarray], list[np.ndarray], np.ndarray, list[list[int]]]:
    """Per-token routing from vLLM's ``routed_experts`` output (``[fed tokens, L, k]`` per request:
    row ``p`` is the token at position ``p``). Written to the vLLM 0.32 output format; GPU only, so
    not exercised by moelab's CPU tests."""
    vllm = require_vllm()
    cfg = engine.llm_engine.model_config.hf_config
    cfg = getattr(cfg, "text_config", None) or cfg
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None)
    if not E:
        raise NoMoELayersError("the model config names no experts (num_experts / num_local_experts): not an MoE")
    params = vllm.SamplingParams(max_tokens=max_new_tokens + 1, temperature=0.0, ignore_eos=True)
    with _ENGINE_LOCK:
        outputs = engine.generate([{"prompt_token_ids": t} for t in token_lists], params, use_tqdm=progress)
    prefill_ids, decode_ids, gen = [], [], []
    for i, (o, toks) in enumerate(zip(outputs, token_lists)):
        routed = getattr(o.outputs[0], "routed_experts", None)
        P, g = len(toks), list(o.outputs[0].token_ids)
        T = min(max(len(g) - 1, 0), max_new_tokens)
        if routed is None or routed.ndim != 3 or routed.shape[0] < P + T:
            raise RuntimeError(f"vLLM returned no usable routed_experts for request {labels[i]} "
                               f"(shape {None if routed is None else routed.shape}, need >= {P + T} rows); use method='hooks'")
        prefill_ids.append(np.asarray(routed[:P], np.int32))
        decode_ids.append(np.asarray(routed[P:P + T], np.int32))
        gen.append(g)
    L, k = prefill_ids[0].shape[1:]
    info = {"num_layers": int(L), "top_k": int(k), "num_experts": int(E), "layer_ids": list(range(int(L)))}
    return info, prefill_ids, decode_ids, np.zeros((len(token_lists), int(L), int(E))), gen


def prefill_counts(engine: Any, prompts: Sequence[str] | Sequence[Sequence[int]], *, tokenizer: Any = None,
                   add_special_tokens: bool = True) -> np.ndarray:
    """Prefill expert counts ``[N, L, E]`` of ``prompts`` (one prefill pass each; no decode recorded).

    This is how ELDR signatures are obtained for live routing: a prefill pass on an engine with
    moelab's hooks (see :class:`PrefillCountServer`, ``python -m moelab.capture.vllm_backend serve-counts``)."""
    token_lists = _tokenize(engine, prompts, tokenizer, add_special_tokens)
    info, prefill_ids, _, _, _ = _capture(engine, token_lists, 0, ignore_eos=True, with_probs=False, progress=False,
                                          labels=[str(i) for i in range(len(token_lists))])
    return np.stack([expert_counts(p, info["num_experts"]) for p in prefill_ids]).astype(np.int32)


def _tokenize(engine: Any, prompts: Sequence[Any], tokenizer: Any, add_special_tokens: bool) -> list[list[int]]:
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompts[{i}] is an empty string")
            if tokenizer is None:
                tokenizer = engine.get_tokenizer()
            ids = list(tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"])
        else:
            ids = [int(t) for t in p]
        if not ids:
            raise ValueError(f"prompts[{i}] has no tokens")
        out.append(ids)
    return out


# ---------------------------------------------------------------------- prefill-count service (for ELDR routing)
class PrefillCountServer:
    """A small HTTP service that answers a prompt's prefill expert counts, for ELDR routing.

    ``POST /v1/prefill_counts`` with ``{"prompt": "..." | [token ids]}`` or ``{"messages": [...]}``
    (chat template applied as vLLM's chat endpoint does) returns ``{"counts": [[...]] (L x E),
    "prompt_tokens": P, "geometry": {...}}``; ``GET /health``. Loopback only; one prefill at a time
    (the engine is shared). Runs in a background thread of the process that owns the engine.

    In a PD-disaggregated deployment this is the prefill side: it computes the prompt (and its
    expert counts); the decode server the router picks recomputes the prompt on CPU, because moving
    the KV cache between servers needs a GPU KV connector.
    """

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 0, *, max_body_bytes: int = 1 << 20) -> None:
        import http.server

        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"host must be a loopback address; got {host!r}")
        self.engine = engine
        self.info = install_hooks(engine)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 30  # seconds a client may take to send its request

            def log_message(self, *args: Any) -> None:  # quiet: the proxy logs decisions
                pass

            def _send(self, status: int, obj: Any) -> None:
                import json

                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path == "/health":
                    self._send(200, {"status": "ok", **{k: server.info[k] for k in ("num_layers", "num_experts", "top_k")}})
                else:
                    self._send(404, {"error": {"message": f"unknown path {self.path!r}"}})

            def do_POST(self) -> None:  # noqa: N802
                import json

                if self.path != "/v1/prefill_counts":
                    return self._send(404, {"error": {"message": f"unknown path {self.path!r}; POST /v1/prefill_counts"}})
                try:
                    length = int(self.headers.get("Content-Length", "-1"))
                    if not 0 < length <= max_body_bytes:
                        return self._send(411 if length < 0 else 413, {"error": {"message": "bad Content-Length"}})
                    payload = json.loads(self.rfile.read(length))
                    counts, n_tok = server.counts(payload)
                except (ValueError, TypeError, KeyError) as exc:
                    return self._send(400, {"error": {"message": str(exc)}})
                except Exception as exc:  # engine failure: answer, never hang the caller
                    return self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                self._send(200, {"counts": counts.tolist(), "prompt_tokens": n_tok,
                                 "geometry": {k: server.info[k] for k in ("num_layers", "num_experts", "top_k")}})

        self.httpd = http.server.HTTPServer((host, port), Handler)
        self.host, self.port = host, int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def counts(self, payload: Any) -> tuple[np.ndarray, int]:
        """Prefill counts ``[L, E]`` and prompt length of one OpenAI-style payload."""
        if not isinstance(payload, dict):
            raise ValueError("request body must be a JSON object")
        if "messages" in payload:
            tok = self.engine.get_tokenizer()
            if not getattr(tok, "chat_template", None):
                raise ValueError("this model's tokenizer has no chat template: send 'prompt' instead of 'messages'")
            # transformers 5 returns a dict unless told otherwise
            ids = list(tok.apply_chat_template(payload["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=False))
        else:
            prompt = payload.get("prompt")
            if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt
                                                                 and all(isinstance(t, int) for t in prompt)):
                raise ValueError("'prompt' must be a non-empty string or list of token ids")
            ids = _tokenize(self.engine, [prompt], None, True)[0]
        return prefill_counts(self.engine, [ids])[0], len(ids)

    def start(self) -> PrefillCountServer:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    """``python -m moelab.capture.vllm_backend serve-counts --model DIR [--port P]``: the prefill-count
    service ELDR routing in ``moelab serve-router --router eldr --signature-url ...`` asks."""
    import argparse
    import time

    p = argparse.ArgumentParser(prog="python -m moelab.capture.vllm_backend")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve-counts", help="serve prefill expert counts over HTTP (loopback)")
    s.add_argument("--model", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8100)
    s.add_argument("--max-model-len", type=int, default=2048)
    args = p.parse_args(argv)
    engine = make_engine(args.model, max_model_len=args.max_model_len)
    server = PrefillCountServer(engine, args.host, args.port).start()
    print(f"prefill-count service for {args.model} on {server.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
