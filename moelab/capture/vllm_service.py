"""The prefill-count service ELDR routing asks for a prompt's expert counts (loopback HTTP), and its
command line: ``python -m moelab.capture.vllm_service serve-counts --model DIR [--port P]`` (also
reachable as ``python -m moelab.capture.vllm_backend serve-counts``)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from moelab._validate import check_loopback_host
from moelab.capture.vllm_driver import _tokenize, prefill_counts
from moelab.capture.vllm_hooks import install_hooks
from moelab.models.vllm_engine import make_engine


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

        host = check_loopback_host("host", host)
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
        return prefill_counts(self.engine, [ids])[0], len(ids)

    def start(self) -> PrefillCountServer:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
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


__all__ = ["PrefillCountServer", "main"]


if __name__ == "__main__":
    import sys

    sys.exit(main())
