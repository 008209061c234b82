"""The prefill-count service ELDR routing asks for a prompt's expert counts (loopback HTTP), and its
command line: ``python -m moelab.capture.vllm_service serve-counts --model DIR [--port P] [--capture-out TRACE.npz]``
(also reachable as ``python -m moelab.capture.vllm_backend serve-counts``).

With capture on (``--capture-out``), the service is where a deployment's expert trace is recorded: every request
``moelab serve-router --router eldr`` routes passes through it once (for its signature), and the service records
that prompt's prefill expert ids and ``--capture-tokens`` greedy decode steps (what the decode server computes for a
greedy request, on the same model) through moelab's hooks, then writes one :class:`~moelab.traces.ExpertTrace` --
the file notebook 06's ELDR analysis reads -- when it stops (or on ``POST /v1/capture/flush``), atomically.

It speaks HTTP with aiohttp, the stack of the router proxy (:mod:`moelab.serving.proxy`), so the lab has one
HTTP implementation: strict request framing, bounded bodies and deadlines come from the same parser.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from moelab._validate import check_int, check_loopback_host, check_real
from moelab.capture.vllm_driver import _tokenize, capture_vllm, prefill_counts, resolve_model_path
from moelab.capture.vllm_hooks import install_hooks
from moelab.models.vllm_contract import require_contract
from moelab.models.vllm_engine import make_engine
from moelab.traces import ExpertTrace
from moelab.traces.expert import concat_traces

log = logging.getLogger(__name__)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class PrefillCountServer:
    """A small HTTP service that answers a prompt's prefill expert counts, for ELDR routing.

    ``POST /v1/prefill_counts`` with ``{"prompt": "..." | [token ids]}`` or ``{"messages": [...]}``
    (chat template applied as vLLM's chat endpoint does) returns ``{"counts": [[...]] (L x E),
    "prompt_tokens": P, "geometry": {...}}``; ``GET /health``. Loopback only; one prefill at a time
    (the engine is shared: prefills run on one worker thread, so ``/health`` answers during one). Serves
    from an event loop in a background thread of the process that owns the engine; the port is bound
    when the object is made (``port=0`` picks a free one).

    In a PD-disaggregated deployment this is the prefill side: it computes the prompt (and its
    expert counts); the decode server the router picks recomputes the prompt on CPU, because moving
    the KV cache between servers needs a GPU KV connector.

    Parameters
    ----------
    engine : vllm.LLM
        The engine whose MoE layers are counted (capture hooks are installed on it).
    host, port : str, int
        Where to listen (loopback only).
    max_body_bytes : int
        Largest request body (413 above it).
    client_timeout_s : float
        A client's request (head and body) must arrive within this (408 / disconnect otherwise).
    capture_out : path, optional
        Capture on: record every prompt asked about (prefill expert ids + ``capture_tokens`` greedy decode
        steps) and write them as one ExpertTrace here (``.npz`` + JSON sidecar) on :meth:`flush` / :meth:`stop`.
        Must not exist yet (a capture never replaces a file).
    capture_tokens : int
        Greedy decode steps recorded per request (fewer where the prompt leaves less room in the context).
    """

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 0, *, max_body_bytes: int = 1 << 20,
                 client_timeout_s: float = 30.0, capture_out: str | os.PathLike | None = None,
                 capture_tokens: int = 32) -> None:
        host = check_loopback_host("host", host)
        port = check_int("port", port, low=0, high=65535)
        self.max_body_bytes = check_int("max_body_bytes", max_body_bytes, low=1, high=1 << 30)
        self.client_timeout_s = check_real("client_timeout_s", client_timeout_s, low=0, low_open=True, high=3600)
        self.capture_tokens = check_int("capture_tokens", capture_tokens, low=1, high=4096)
        self.capture_out = None if capture_out is None else check_capture_out(capture_out)
        self._captured: list[ExpertTrace] = []
        self._written = 0  # requests in the file last written
        self.capture_skipped = 0  # prompts too long to decode even one step within the context: counted, not traced
        self._capture_lock = threading.Lock()
        self.engine = engine
        self.info = install_hooks(engine)
        # bound here, in the caller's thread: the URL is known before start() and a port in use fails at once
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._prefill_worker = ThreadPoolExecutor(1, thread_name_prefix="prefill-counts")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def _geometry(self) -> dict[str, Any]:
        return {k: self.info[k] for k in ("num_layers", "num_experts", "top_k")}

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **self._geometry()})

    def capture_status(self) -> dict[str, Any]:
        """Capture on or off, requests recorded, requests in the written file, the file."""
        return {"capture": self.capture_out is not None, "requests": len(self._captured), "written": self._written,
                "skipped": self.capture_skipped, "path": None if self.capture_out is None else str(self.capture_out)}

    async def _capture_get(self, request: web.Request) -> web.Response:
        return web.json_response(self.capture_status())

    async def _capture_flush(self, request: web.Request) -> web.Response:
        if self.capture_out is None:
            return _error(409, "capture is off (start the service with --capture-out PATH)")
        try:
            await asyncio.get_running_loop().run_in_executor(self._prefill_worker, self.flush)
        except Exception as exc:  # a full disk, say: answered, the service keeps serving
            log.exception("writing the capture failed")
            return _error(500, f"{type(exc).__name__}: {str(exc)[:300]}")
        return web.json_response(self.capture_status())

    async def _unknown(self, request: web.Request) -> web.Response:
        return _error(404, f"unknown path {request.path!r}; POST /v1/prefill_counts, GET /health")

    async def _prefill(self, request: web.Request) -> web.Response:
        length = request.content_length
        if length is None:
            return _error(411, "a request body needs a Content-Length header")
        if not 0 < length <= self.max_body_bytes:
            return _error(413 if length else 400, f"request body must be 1 to {self.max_body_bytes} bytes; got {length}")
        try:
            body = await asyncio.wait_for(request.read(), self.client_timeout_s)
        except asyncio.TimeoutError:
            return _error(408, f"request body not received within {self.client_timeout_s:g} s")
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body must be at most {self.max_body_bytes} bytes")
        except (ConnectionError, OSError, EOFError, ValueError) as exc:
            return _error(400, f"request body broken off: {type(exc).__name__}")
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return _error(400, f"request body is not valid JSON: {str(exc)[:200]}")
        try:
            counts, n_tok = await asyncio.get_running_loop().run_in_executor(self._prefill_worker, self.counts, payload)
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, str(exc)[:500])
        except Exception as exc:  # engine failure: answer, never hang the caller
            log.exception("prefill-count request failed")
            return _error(500, f"{type(exc).__name__}: {str(exc)[:300]}")
        return web.json_response({"counts": counts.tolist(), "prompt_tokens": n_tok, "geometry": self._geometry()})

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/prefill_counts", self._prefill)
        app.router.add_get("/v1/capture", self._capture_get)
        app.router.add_post("/v1/capture/flush", self._capture_flush)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    @property
    def url(self) -> str:
        """Base URL of the running service."""
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
        if self.capture_out is not None:
            return self._count_and_capture(ids), len(ids)
        return prefill_counts(self.engine, [ids])[0], len(ids)

    def _count_and_capture(self, ids: list[int]) -> np.ndarray:
        """One capture of the prompt (prefill + decode steps) gives its counts and its trace row."""
        room = int(self.engine.llm_engine.model_config.max_model_len) - len(ids) - 1
        if room < 1:  # no decode step fits: route it all the same, leave it out of the trace
            self.capture_skipped += 1
            return prefill_counts(self.engine, [ids])[0]
        with self._capture_lock:
            rid = f"q{len(self._captured) + self.capture_skipped:06d}"
        # router probabilities only where every MoE layer has a GateLinear (else they would silently stay zero)
        with_probs = set(self.info.get("gates", ())) >= set(self.info.get("layer_ids", ()))
        trace = capture_vllm(self.engine, [ids], min(self.capture_tokens, room), request_ids=[rid],
                             with_probs=with_probs, progress=False)
        with self._capture_lock:
            self._captured.append(trace)
        return trace.prefill_counts[0]

    def flush(self) -> Path | None:
        """Write every request captured so far to :attr:`capture_out` (atomically; the file is replaced only by
        this service's own later flushes). Returns the path, or None when capture is off or nothing was captured."""
        if self.capture_out is None:
            return None
        with self._capture_lock:
            parts = list(self._captured)
        if not parts or len(parts) == self._written:
            return self.capture_out if self._written else None
        prov = dict(parts[0].provenance)
        prov.update(captured_by="moelab prefill-count service (capture on): one prefill + greedy decode per request "
                                "asked about (moelab serve-router --router eldr asks once per routed request)",
                    capture_tokens=self.capture_tokens, requests_skipped_too_long=self.capture_skipped)
        path = concat_traces(parts, provenance=prov).save(self.capture_out)
        self._written = len(parts)
        return path

    def start(self) -> PrefillCountServer:
        """Serve from an event loop in a daemon thread; returns self once it is listening."""
        if self._thread is not None:
            raise RuntimeError("PrefillCountServer.start() was called twice")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="prefill-count-service")
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(30)
        return self

    async def _serve(self) -> None:
        # keepalive_timeout also bounds the wait for a connection's first request head (aiohttp starts it at connect)
        self._runner = web.AppRunner(self._app(), handle_signals=False, access_log=None,
                                     keepalive_timeout=self.client_timeout_s, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    def stop(self) -> None:
        """Stop serving, close the socket, and write the capture (when on)."""
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._loop is not None and not self._loop.is_running():
            self._loop.close()
        self._sock.close()
        # with capture on, a capture in progress finishes first, so the file holds every answered request
        self._prefill_worker.shutdown(wait=self.capture_out is not None, cancel_futures=True)
        self.flush()


def check_capture_out(path: str | os.PathLike) -> Path:
    """The ``.npz`` a capture is written to: its folder must exist and neither it nor its JSON sidecar may
    exist yet (a capture never replaces a file it did not write)."""
    out = Path(path)
    if out.suffix != ".npz":
        raise ValueError(f"capture file must end in .npz (an ExpertTrace); got {str(path)!r}")
    if not out.parent.is_dir():
        raise ValueError(f"capture file's folder {str(out.parent)!r} does not exist")
    for p in (out, out.with_suffix(".json")):
        if p.exists():
            raise ValueError(f"{p} already exists; a capture never replaces a file: choose a new path")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m moelab.capture.vllm_backend serve-counts --model DIR [--port P] [--capture-out T.npz]``: the
    prefill-count service ELDR routing in ``moelab serve-router --router eldr --signature-url ...`` asks (and, with
    ``--capture-out``, the recorder of the deployment's expert trace). Bad input (a model without MoE layers, a vLLM
    lacking a hook target, an existing capture file) is answered with ``error: ...`` and exit status 2; SIGTERM or
    Ctrl-C stops it and writes the capture."""
    p = argparse.ArgumentParser(prog="python -m moelab.capture.vllm_backend")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve-counts", help="serve prefill expert counts over HTTP (loopback)")
    s.add_argument("--model", required=True, help="a model folder, a hub id, or tiny-moe (the project's)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8100)
    s.add_argument("--max-model-len", type=int, default=2048)
    s.add_argument("--capture-out", help="capture on: write every routed request's expert trace here (.npz, new file)")
    s.add_argument("--capture-tokens", type=int, default=32, help="greedy decode steps recorded per request (default 32)")
    args = p.parse_args(argv)
    stop = threading.Event()
    # SIGTERM (a service manager, a test) ends it like Ctrl-C: the capture is written, no engine is left behind
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        capture_out = None if args.capture_out is None else check_capture_out(args.capture_out)
        check_int("capture_tokens", args.capture_tokens, low=1, high=4096)
        require_contract(("engine", "capture"))  # the hooks' targets, checked before an engine exists
        engine = make_engine(resolve_model_path(args.model), max_model_len=args.max_model_len)
        server = PrefillCountServer(engine, args.host, args.port, capture_out=capture_out,
                                    capture_tokens=args.capture_tokens).start()
    except (ValueError, OSError) as exc:  # OSError: the port is taken
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"prefill-count service for {args.model} on {server.url}"
          + (f"; capture on -> {capture_out}" if capture_out else ""), flush=True)
    try:
        while not stop.wait(1.0):  # a timed wait: the SIGTERM handler runs between waits
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    st = server.capture_status()
    if st["capture"] and st["written"]:
        print(f"capture: {st['written']} request(s) written to {st['path']}"
              + (f" ({st['skipped']} too long to decode, left out)" if st["skipped"] else ""), flush=True)
    elif st["capture"]:
        print("capture: no request came through the service; no file written", flush=True)
    return 0


__all__ = ["PrefillCountServer", "check_capture_out", "main"]


if __name__ == "__main__":
    sys.exit(main())
