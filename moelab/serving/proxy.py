"""``moelab serve-router``: an HTTP proxy that routes OpenAI-compatible requests across N vLLM servers with
moelab's routers (round_robin, random, jsq, p2c, least_kv, eldr, ...).

Why a proxy: the routers in :mod:`moelab.routing` were written against a simulated cluster; this puts
the same objects (``Router.route(RequestBatch, ClusterView)``) in front of live servers. The proxy
keeps its own view of every backend — requests in flight, KV tokens they hold (prompt + requested
output tokens, an upper bound), whether it is up — and answers with a routing decision per request.

Why aiohttp: one maintained dependency gives both sides a proxy needs — a server whose HTTP/1.1 parser
(llhttp, the parser of Node.js) frames strictly (one decimal ``Content-Length``, no ``Content-Length`` next
to ``Transfer-Encoding``, token header names, no folded lines: the rules that stop request smuggling), and
a client that streams a backend's reply as it arrives, with connect and read deadlines. starlette +
uvicorn + httpx would be three packages (and an ASGI layer between the socket and the proxy) for the same.

Behaviour, in plain words:

* ``POST /v1/completions`` and ``/v1/chat/completions`` are routed; the response (JSON or a
  ``"stream": true`` server-sent-event stream) is relayed as the backend sends it.
* Requests go to a backend over kept-alive connections (idle at most :data:`BACKEND_KEEPALIVE_S`): no TCP
  handshake and no connection set-up in the backend per request. A kept connection the backend closed while
  idle is not the backend failing: the request is sent once more on a fresh connection, and only a failure
  there counts against the backend. Health probes always use a fresh connection.
* Each backend takes at most ``max_inflight`` requests; beyond that requests wait in a bounded queue
  (``max_queue``, ``queue_timeout_s``) and get HTTP 503 when it is full or the wait runs out.
* A backend that refuses connections, drops one before answering, answers 502/503/504, breaks HTTP
  framing (a malformed head, a malformed chunk-size line or a chunk without its CRLF), cuts its body short
  (a chunked body cut inside a chunk included) or misses a deadline is marked down, its slot is freed at
  once and the request is retried on another backend (at most ``retries`` times): every read of a
  backend's reply is bounded in bytes and time, and every failure class
  (:data:`moelab.serving.client.BACKEND_ERRORS`) means "this backend is unhealthy", never a crash. A
  malformed body fails the moment the parser refuses it (aiohttp alone would wait forever there: see
  :mod:`moelab.serving.client`). A stream is committed to a backend once its first whole event arrived; one
  that breaks after that cannot be replayed: the client connection is closed (an unfinished stream) and
  the error counted.
* Every forwarded reply has deadlines, so no backend can hold a request (or its slot) forever: its head
  within ``response_timeout_s`` of sending the request; a buffered reply's body silent at most
  ``response_timeout_s`` at a time; a stream silent at most ``stream_idle_timeout_s`` between two pieces;
  and the whole reply, head to last byte, stream or not, within ``reply_timeout_s``. Each read waits for
  the earliest deadline that applies; none is a task of its own.
* A supervised health loop (``GET /health`` every ``health_interval_s``; a reply that is not a whole 200
  is a failure) brings backends back; an exception in a round is logged and the loop goes on, and if
  the loop task itself ends it is started again. At start-up every backend is asked ``GET /v1/models``:
  those that do not answer it whole are marked down (and named), the rest serve.
* A client that does not read its answer loses it after ``client_write_timeout_s`` (its connection is
  closed), so it cannot hold a backend slot; a client that does not send its request within
  ``client_timeout_s`` is disconnected.
* Hostile input stays with its own request: HTTP framing is aiohttp's strict parser (a 400 with an
  OpenAI-style JSON error), an HTTP/1.1 request needs ``Host``, a POST without ``Content-Length`` gets 411
  (so do chunked request bodies: see :meth:`RouterProxy._dispatch` for why), a client that half-closes its
  side before the end of the body its ``Content-Length`` announced gets a 400 (and one that half-closes
  after a whole request still gets its answer), each connection carries one request (bytes after it are
  never parsed as another: every answer closes the connection), the body must be strict JSON (400
  otherwise, also for nesting too deep to parse), and every numeric field must lie in the range vLLM
  accepts, token counts within the model's context (:data:`NUMERIC_FIELDS`; 400 naming the field), so
  nothing a client sends can overflow the proxy's own load accounting. A body over ``max_body_bytes`` gets
  a 413 the client can read (aiohttp reads and drops the rest of the body for a few seconds before
  closing).
* ``GET /metrics`` (Prometheus text) and ``GET /metrics.json`` expose per-backend load, in-flight
  counts, routing decisions (per backend and the most recent ones) and errors; ``GET /health``.
  Responses are counted per status for real requests only (a bare TCP connect/close is not one).
* It binds to loopback only (the lab's setting) and never imports torch or vLLM.

ELDR needs each request's prefill expert counts. The method used here is a *prefill pass*: a
signature service (:class:`moelab.capture.vllm_service.PrefillCountServer`, a vLLM engine with
moelab's capture hooks) runs the prompt's prefill and returns its per-layer expert counts; the proxy
turns them into a signature (:class:`~moelab.serving.signatures.ELDRSignatureClient`) and the ELDR
router picks the decode server. True prefill->decode KV transfer needs a GPU KV connector; on CPU
the decode server recomputes the prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import itertools
import json
import logging
import math
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import numpy as np
from aiohttp import web
from aiohttp.helpers import DEFAULT_CHUNK_SIZE
from aiohttp.http import HttpRequestParser, HttpVersion10, HttpVersion11
from aiohttp.web_protocol import RequestPayloadError

from moelab._validate import check_choice, check_int, check_loopback_host, check_real
from moelab.eldr.signature import SignatureBuilder
from moelab.routers import check_supplies, import_router_modules, make_router, router_class, router_names
from moelab.routing import (
    ClusterView,
    RequestBatch,
    Router,
    RouterCalibration,
    RouterError,
    call_router,
)
from moelab.serving.client import (
    BACKEND_ERRORS,
    MAX_RESPONSE_BYTES,
    MAX_SMALL_REPLY_BYTES,
    ReplyDeadlineError,
    ReplyTooLargeError,
    backend_timeout,
    fetch_json,
    new_session,
    read_bounded,
    read_within,
    split_url,
    stale_connection,
    within,
)
from moelab.serving.signatures import ELDRSignatureClient
from moelab.traces import ExpertTrace

log = logging.getLogger(__name__)

ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
# what a live proxy knows (load, KV tokens, a signature from a signature source) and can calibrate a router
# with (the backends, ELDR's calibration signatures); it queues requests centrally, not per engine. The
# domain oracle and BR-H's output-length predictors need what a live request does not carry.
SUPPLIES = frozenset({"prompt_len", "active", "waiting", "kv_tokens", "free_slots", "time_s", "signature"})
CALIBRATION = frozenset({"n_workers", "signatures", "seed"})


def router_choices() -> list[str]:
    """The registered routers the proxy can run, read when asked: a router registered after this module was
    imported (``moelab serve-router --router-module``, or a script's own) is among them."""
    return router_names(supplied=SUPPLIES, engine_queues=False, calibration=CALIBRATION)


LINGER_S = 5.0  # after an early answer (a 413, say), aiohttp reads and drops the client's body this long
# idle keep-alive of a proxy->backend connection: below uvicorn's 5 s (vLLM's server), so the proxy drops an idle
# connection before the backend does and a request rarely meets one the backend closed
BACKEND_KEEPALIVE_S = 2.0
MAX_FIRST_EVENT_BYTES = 1 << 20  # a stream's bytes held back until its first whole event
MAX_TIMEOUT_S = 86_400.0  # the longest deadline a reply (or a command-line flag) takes: a day; longer is a typo
# headers of a backend reply not passed on: hop-by-hop ones, and the framing aiohttp sets for the client
NOT_RELAYED = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "content-length",
               "transfer-encoding", "server", "date"}
REASONS = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Payload Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class HTTPError(Exception):
    """An error the proxy answers with ``status`` and a JSON body ``{"error": {"message": ...}}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(message: str, status: int) -> bytes:
    """OpenAI-style error JSON."""
    return json.dumps({"error": {"message": message, "type": REASONS.get(status, "error"), "code": status}}).encode()


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r} in a JSON object")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json(body: bytes) -> Any:
    """Strict JSON: UTF-8, no ``NaN``/``Infinity``, no duplicate keys; anything else (nesting past
    the interpreter's recursion limit, integers of more than 4300 digits) is ``HTTPError(400)``."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise HTTPError(400, "request body is not acceptable JSON: nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise HTTPError(400, f"request body is not valid JSON: {exc}") from None


def _describe(exc: BaseException) -> str:
    """``Type: message`` of a failure, naming the OS error under an aiohttp connection error."""
    inner = getattr(exc, "os_error", None)
    if isinstance(inner, OSError):
        return f"{type(inner).__name__}: {inner}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # tab allowed


def _printable(text: str) -> str:
    """``text`` without control characters (tab kept): what may go into a response head."""
    return _CONTROL_CHARACTER.sub("", text)


class SignatureSource(Protocol):
    """Anything that turns a request payload into a routing signature (``None``: no signature)."""

    async def signature(self, payload: dict[str, Any]) -> np.ndarray | None: ...


@dataclass
class Backend:
    """The proxy's view of one vLLM server."""

    index: int
    url: str
    up: bool = True
    in_flight: int = 0
    kv_tokens: int = 0
    routed: int = 0
    completed: int = 0
    failed: int = 0
    marked_down: int = 0
    health_failures: int = 0
    last_error: str = ""
    host: str = field(init=False)
    port: int = field(init=False)

    def __post_init__(self) -> None:
        self.host, self.port = split_url(self.url)


def _prompt_len(payload: dict[str, Any]) -> int:
    """Prompt size in tokens if the client sent token ids, else UTF-8 bytes / 4 (a rough token
    estimate used only for load accounting; routing by load needs relative sizes, not exact ones)."""
    if "messages" in payload:
        text = "".join(str(m.get("content", "")) for m in payload["messages"] if isinstance(m, dict))
        return max(1, len(text.encode()) // 4)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return max(1, len(str(prompt).encode()) // 4)


CONTEXT = "context"  # placeholder in NUMERIC_FIELDS: the model's context length (max_model_len)
INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_TOKEN_ID = (1 << 31) - 1
DEFAULT_CONTEXT_CAP = 1 << 20  # max_tokens bound until a backend has told its max_model_len
DEFAULT_MAX_N = 16
# Every numeric request field the proxy lets through and its range: (integer?, low, high, low_open). The
# ranges are vLLM's own (vllm/sampling_params.py _verify_args, the OpenAI protocol models; logprobs: vLLM's
# default max_logprobs=20); "n" is the proxy's cap (max_n), token counts are capped by the model's context.
# A number outside its range, a non-finite one or a boolean is a 400 naming the field and the range, so no
# request can carry a value the proxy's own accounting (or a backend) cannot handle.
NUMERIC_FIELDS: dict[str, tuple[bool, float | str, float | str, bool]] = {
    "max_tokens": (True, 1, CONTEXT, False),
    "max_completion_tokens": (True, 1, CONTEXT, False),
    "min_tokens": (True, 0, CONTEXT, False),
    "n": (True, 1, "max_n", False),
    "best_of": (True, 1, "max_n", False),
    "temperature": (False, 0.0, 2.0, False),
    "top_p": (False, 0.0, 1.0, True),
    "top_k": (True, -1, MAX_TOKEN_ID, False),
    "min_p": (False, 0.0, 1.0, False),
    "presence_penalty": (False, -2.0, 2.0, False),
    "frequency_penalty": (False, -2.0, 2.0, False),
    "repetition_penalty": (False, 0.0, 1e6, True),
    "length_penalty": (False, -1e6, 1e6, False),
    "seed": (True, INT64[0], INT64[1], False),
    "logprobs": (True, -1, 20, False),
    "top_logprobs": (True, 0, 20, False),
    "prompt_logprobs": (True, -1, 20, False),
    "truncate_prompt_tokens": (True, -1, CONTEXT, False),
    "priority": (True, INT64[0], INT64[1], False),
    "stream_interval": (True, 1, CONTEXT, False),
}
BOOL_FIELDS = ("stream", "echo", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "add_special_tokens",
               "use_beam_search")


def _check_number(key: str, value: Any, integer: bool, low: float, high: float, low_open: bool) -> None:
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        what = f"an integer in [{low}, {high}]"
    else:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and (low < value if low_open else low <= value) and value <= high)
        what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
    if not ok:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise HTTPError(400, f"'{key}' must be {what}; got {shown}")


def validate_payload(path: str, payload: Any, *, max_model_len: int = DEFAULT_CONTEXT_CAP,
                     max_n: int = DEFAULT_MAX_N) -> dict[str, Any]:
    """Reject malformed OpenAI requests with HTTP 400 before they reach a backend.

    Checks the prompt (or chat messages), every field of :data:`NUMERIC_FIELDS` against its range
    (token counts against ``max_model_len``, ``n``/``best_of`` against ``max_n``), the boolean flags and,
    for token-id prompts, ids in ``[0, 2**31)`` and ``len(prompt) + max_tokens <= max_model_len``.
    Fields the proxy does not know are passed through for the backend to judge."""
    if not isinstance(payload, dict):
        raise HTTPError(400, "request body must be a JSON object")
    if path == "/v1/chat/completions":
        msgs = payload.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise HTTPError(400, "'messages' must be a non-empty list of {role, content} objects")
    else:
        prompt = payload.get("prompt")
        ok = (isinstance(prompt, str) and prompt) or (isinstance(prompt, list) and prompt
                                                     and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
        if not ok:
            raise HTTPError(400, "'prompt' must be a non-empty string or a non-empty list of token ids "
                                 "(batched prompts are not routed: send one request per prompt)")
        if isinstance(prompt, list) and not all(0 <= t <= MAX_TOKEN_ID for t in prompt):
            raise HTTPError(400, f"token ids in 'prompt' must be integers in [0, {MAX_TOKEN_ID}]")
    limits = {CONTEXT: max_model_len, "max_n": max_n}
    chat = path == "/v1/chat/completions"
    if chat and payload.get("logprobs") is not None and not isinstance(payload["logprobs"], bool):
        raise HTTPError(400, f"'logprobs' of a chat request must be true or false; got {payload['logprobs']!r}"[:200])
    for key, (integer, low, high, low_open) in NUMERIC_FIELDS.items():
        if chat and key == "logprobs":  # a boolean in the chat API, checked above
            continue
        if payload.get(key) is not None:  # null means "backend default", as in the OpenAI API
            _check_number(key, payload[key], integer, limits.get(low, low), limits.get(high, high), low_open)
    for key in BOOL_FIELDS:
        if payload.get(key) is not None and not isinstance(payload[key], bool):
            raise HTTPError(400, f"'{key}' must be true or false; got {payload[key]!r}"[:200])
    if payload.get("n") is not None and payload.get("best_of") is not None and payload["best_of"] < payload["n"]:
        raise HTTPError(400, f"'best_of' must be >= 'n'; got best_of={payload['best_of']}, n={payload['n']}")
    if isinstance(payload.get("prompt"), list):
        out = _max_tokens(payload)
        if len(payload["prompt"]) + out > max_model_len:
            raise HTTPError(400, f"prompt of {len(payload['prompt'])} tokens + max_tokens {out} exceeds the model's "
                                 f"context of {max_model_len} tokens")
    if payload.get("stream_options") is not None and not isinstance(payload["stream_options"], dict):
        raise HTTPError(400, "'stream_options' must be an object")
    return payload


def _max_tokens(payload: dict[str, Any]) -> int:
    """Requested output tokens (the OpenAI default of 16 when absent)."""
    for key in ("max_tokens", "max_completion_tokens"):
        if payload.get(key) is not None:
            return int(payload[key])
    return 16


def _sequences(payload: dict[str, Any]) -> int:
    return max(int(payload.get("n") or 1), int(payload.get("best_of") or 1))


class _ProxyRequestHandler(web.RequestHandler):
    """aiohttp's per-connection protocol with three changes:

    * a request aiohttp's parser refuses (bad framing, no ``Host``) is answered with the proxy's
      OpenAI-style JSON error and counted in its metrics;
    * one request per connection: the parser (llhttp, as aiohttp's own) pauses after the first request, so
      bytes after it are never parsed as a second one. Every answer closes the connection, so they could
      never be served; parsed, they would replace the first request's answer with a 400 for themselves (a
      POST without ``Content-Length`` followed by its JSON was answered "invalid method" that way);
    * a half-close: aiohttp lets asyncio close the whole connection when the client ends its sending side,
      so a request still in progress never got its answer. Here the connection stays open for the answer,
      and a body still expected ends with an error there (a 400 naming the half-close).
    """

    proxy: RouterProxy

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, max_line_size: int = 8190,
                 max_field_size: int = 8190, max_headers: int = 128, read_bufsize: int = DEFAULT_CHUNK_SIZE,
                 auto_decompress: bool = True, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, max_line_size=max_line_size, max_field_size=max_field_size,
                         max_headers=max_headers, read_bufsize=read_bufsize, auto_decompress=auto_decompress, **kwargs)
        # aiohttp's own parser, as aiohttp's RequestHandler makes it, but pausing after one message (aiohttp
        # has no option for it); bytes after the first request stay unparsed until the connection closes
        self._parser = HttpRequestParser(self, loop, read_bufsize, max_line_size=max_line_size,
                                         max_field_size=max_field_size, max_headers=max_headers,
                                         payload_exception=RequestPayloadError, auto_decompress=auto_decompress,
                                         max_msg_queue_size=1)
        self._bodies: list[Any] = []  # the body readers of the requests parsed on this connection
        self.half_closed = False  # the client ended its sending side

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        # aiohttp queues each parsed request with its body reader; remember them for a half-close (a request
        # may already be taken from the queue, and not yet be "current", when the client half-closes)
        self._bodies.extend(body for _, body in list(self._messages)[queued:])

    def eof_received(self) -> bool:
        """The client ended its sending side. Nothing parsed yet: nothing to answer, close (as aiohttp does).
        Otherwise keep the connection open for the answer; a body that has not reached its end ends here, short
        of its ``Content-Length`` (the proxy answers 400 naming the half-close)."""
        self.half_closed = True
        if not self._bodies:
            return False
        for body in self._bodies:
            # an end, not an error: whoever waits on the body (the proxy, or aiohttp reading and dropping the
            # rest of one after an early answer) sees it short and stops, without an exception to log
            if not body.is_eof():
                body.feed_eof()
        return True

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp's own: an answer already started cannot be replaced
            raise ConnectionError("response already started; cannot send an error answer")
        text = " ".join(line.strip() for line in (message or REASONS.get(status, "error")).splitlines()
                        if line.strip().strip("^"))
        log.debug("refused a malformed request with %s: %s", status, text)
        self.proxy.status_counts[status] = self.proxy.status_counts.get(status, 0) + 1
        resp = web.Response(status=status, body=error_body(f"malformed HTTP request: {text}"[:500], status),
                            content_type="application/json")
        resp.force_close()
        return resp


class _ProxyServer(web.Server):
    """aiohttp's low-level server making :class:`_ProxyRequestHandler` protocols (``_kwargs``/``_loop`` are
    what aiohttp's own ``__call__`` passes: the per-connection limits and timeouts set below)."""

    def __init__(self, proxy: RouterProxy, **kwargs: Any) -> None:
        super().__init__(proxy._handle, **kwargs)
        self.proxy = proxy

    def __call__(self) -> web.RequestHandler:
        handler = _ProxyRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.proxy = self.proxy
        return handler


class RouterProxy:
    """Route OpenAI-compatible requests across loopback vLLM servers with a moelab :class:`Router`.

    Parameters
    ----------
    backends : list of str
        Server URLs, ``http://127.0.0.1:PORT``.
    router : str or Router
        A name for :func:`moelab.routers.make_router` (prepared for the backends) or a router object.
    host, port : str, int
        Where to listen (loopback only; port 0 picks a free one).
    max_inflight : int
        Requests in flight per backend before requests queue at the proxy.
    max_queue : int
        Requests that may wait for a slot; more get HTTP 503 at once.
    queue_timeout_s, connect_timeout_s, client_timeout_s, client_write_timeout_s : float
        Wait for a slot; connect to a backend (also the bound of a health probe); receiving a client's
        request; one write to a client that does not read (past it the client's connection is closed and the
        backend's slot freed).
    response_timeout_s : float
        A backend's reply head must arrive within this of sending the request (a buffered reply is sent
        whole, so for vLLM this is its generation time); a buffered reply's body may then be silent at most
        this long at a time. In (0, 86400] seconds.
    stream_idle_timeout_s : float, optional
        A streamed reply may be silent at most this long between two pieces (its head and first event
        included: a busy vLLM queues a request before its first token). In (0, 86400] seconds; default
        ``response_timeout_s``.
    reply_timeout_s : float
        The whole reply, from sending the request to its last byte, stream or not: past it the attempt
        fails (the backend is marked down and its slot freed), however the backend trickles its bytes. In
        (0, 86400] seconds; the default (10 minutes) leaves a long generation room.
    retries : int
        Further backends tried after a failed attempt.
    health_interval_s : float
        Period of the ``GET /health`` loop over backends.
    signature_source : SignatureSource, optional
        Gives each request its routing signature (ELDR).
    max_body_bytes : int
        Largest accepted request body.
    max_model_len : int, optional
        The model's context in tokens: ``max_tokens`` (and a token-id prompt plus ``max_tokens``) must fit.
        Default: the smallest ``max_model_len`` the backends report in ``/v1/models`` (asked at start and by
        the health loop until one answers; until then :data:`DEFAULT_CONTEXT_CAP`).
    max_n : int
        Largest ``n`` / ``best_of`` of one request (each sequence holds its own KV cache).
    decisions_kept : int
        Recent routing decisions kept for ``/metrics.json``.
    """

    def __init__(self, backends: list[str], router: str | Router = "jsq", *, host: str = "127.0.0.1", port: int = 0,
                 max_inflight: int = 32, max_queue: int = 256, queue_timeout_s: float = 60.0, connect_timeout_s: float = 3.0,
                 response_timeout_s: float = 120.0, client_timeout_s: float = 30.0, client_write_timeout_s: float = 30.0,
                 stream_idle_timeout_s: float | None = None, reply_timeout_s: float = 600.0, retries: int = 2,
                 health_interval_s: float = 2.0, signature_source: SignatureSource | None = None,
                 max_body_bytes: int = 1 << 20, decisions_kept: int = 200, seed: int = 0,
                 max_model_len: int | None = None, max_n: int = DEFAULT_MAX_N) -> None:
        if not backends:
            raise ValueError("backends must list at least one server URL")
        check_loopback_host("host", host)
        self.backends = [Backend(i, url.rstrip("/")) for i, url in enumerate(backends)]
        for b in self.backends:
            check_loopback_host(f"backend URL {b.url!r} host", b.host)
        if isinstance(router, str):
            check_choice("router", router, router_choices())
            router = make_router(router, RouterCalibration(n_workers=len(self.backends), seed=seed), seed=seed)
        self.router = router
        check_supplies(router, SUPPLIES if signature_source is not None else SUPPLIES - {"signature"},
                       "the serving proxy" + ("" if signature_source is not None else " without signature_source="),
                       engine_queues=False)
        self.router.reset(len(self.backends))
        self.host, self.port = host, check_int("port", port, low=0, high=65535)
        self.max_inflight = check_int("max_inflight", max_inflight, low=1)
        self.max_queue = check_int("max_queue", max_queue, low=0)
        self.queue_timeout_s = check_real("queue_timeout_s", queue_timeout_s, low=0, low_open=True)
        self.connect_timeout_s = check_real("connect_timeout_s", connect_timeout_s, low=0, low_open=True)
        self.response_timeout_s = check_real("response_timeout_s", response_timeout_s, low=0, low_open=True,
                                             high=MAX_TIMEOUT_S)
        self.stream_idle_timeout_s = self.response_timeout_s if stream_idle_timeout_s is None else check_real(
            "stream_idle_timeout_s", stream_idle_timeout_s, low=0, low_open=True, high=MAX_TIMEOUT_S)
        self.reply_timeout_s = check_real("reply_timeout_s", reply_timeout_s, low=0, low_open=True, high=MAX_TIMEOUT_S)
        self.client_timeout_s = check_real("client_timeout_s", client_timeout_s, low=0, low_open=True)
        self.client_write_timeout_s = check_real("client_write_timeout_s", client_write_timeout_s, low=0, low_open=True)
        self.retries = check_int("retries", retries, low=0)
        self.health_interval_s = check_real("health_interval_s", health_interval_s, low=0, low_open=True)
        self.max_body_bytes = check_int("max_body_bytes", max_body_bytes, low=1)
        self.max_model_len = None if max_model_len is None else check_int("max_model_len", max_model_len, low=1,
                                                                         high=DEFAULT_CONTEXT_CAP)
        self._context_known = max_model_len is not None
        self.max_n = check_int("max_n", max_n, low=1, high=4096)
        self.signature_source = signature_source
        self.waiting = 0
        self.decisions: deque[dict[str, Any]] = deque(maxlen=check_int("decisions_kept", decisions_kept, low=1))
        self.status_counts: dict[int, int] = {}
        self.retried = 0
        self.rejected_queue_full = 0
        self.timed_out_in_queue = 0
        self.slow_clients_dropped = 0
        self.health_round_errors = 0
        self.health_loop_restarts = 0
        self.down_at_start: list[Backend] = []
        self._ids = itertools.count()
        self._slot_freed = asyncio.Condition()
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None  # fresh connections: health probes, /v1/models
        self._pool: aiohttp.ClientSession | None = None  # kept-alive connections: forwarded requests
        # connecting is aiohttp's deadline; every read of the reply (head, body, stream) has the proxy's own
        # (_forward: one timer handle per read, no task), as aiohttp's sock_read cannot tell a head from a stream
        self._backend_timeout = backend_timeout(self.connect_timeout_s, None)
        self._health_task: asyncio.Task | None = None
        self._stopping = False
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> tuple[str, int]:
        """Start listening and the health loop; returns the bound ``(host, port)``.

        Every backend is asked ``GET /v1/models`` first: one that does not answer it whole is marked down
        (listed in :attr:`down_at_start`; the health loop brings it back), the others serve."""
        self._stopping = False
        self._session = new_session()
        self._pool = new_session(keepalive_s=BACKEND_KEEPALIVE_S)
        # keepalive_timeout also bounds the wait for a connection's first request head (aiohttp starts it
        # at connect), so a client that never finishes its head is disconnected after client_timeout_s
        server = _ProxyServer(self, keepalive_timeout=self.client_timeout_s, lingering_time=min(LINGER_S, self.client_timeout_s),
                              max_line_size=8190, max_field_size=8190, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await self.stop()
            raise
        self.port = self._runner.addresses[0][1]
        answered = await self._learn_context(mark_down=True)
        self.down_at_start = [b for b in self.backends if b.index not in answered]
        self._start_health_task()
        return self.host, self.port

    async def stop(self) -> None:
        """Stop listening, the health loop and the client session."""
        self._stopping = True
        if self._health_task:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self._runner:
            await self._runner.cleanup()
        for session in (self._session, self._pool):
            if session:
                await session.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _start_health_task(self) -> None:
        self._health_task = asyncio.create_task(self._health_loop(), name="moelab-proxy-health")
        self._health_task.add_done_callback(self._health_task_ended)

    def _health_task_ended(self, task: asyncio.Task) -> None:
        """Supervision: the health loop never ends by itself, so if its task ends (cancelled or killed by an
        error that escaped a round) while the proxy runs, say so and start a new one."""
        if self._stopping:
            return
        why = "cancelled" if task.cancelled() else _describe(task.exception()) if task.exception() else "returned"
        log.error("proxy health loop ended (%s); starting it again", why)
        self.health_loop_restarts += 1
        self._start_health_task()

    async def _health_loop(self) -> None:
        while True:  # backends start "up"; failed requests mark them down sooner than this loop
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_health()
                if not self._context_known:
                    await self._learn_context()
            except Exception:  # a bug or a failure no probe caught must not end recovery: log, go on
                self.health_round_errors += 1
                log.exception("proxy health round failed; the loop goes on")

    async def _learn_context(self, *, mark_down: bool = False) -> set[int]:
        """Ask every backend's ``/v1/models`` (each within ``connect_timeout_s``) and take ``max_model_len``
        from the answers (the smallest one reported). Returns the indices of the backends that answered it
        whole; with ``mark_down`` the others are marked down, naming what went wrong."""
        async def ask(b: Backend) -> tuple[Backend, int | None, str]:
            try:
                status, data = await fetch_json(self._session, b.url, "GET", "/v1/models", timeout_s=self.connect_timeout_s)
            except BACKEND_ERRORS as exc:
                return b, None, f"GET /v1/models failed: {_describe(exc)}"
            if status != 200:
                return b, None, f"GET /v1/models answered {status}"
            lens = []
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                lens = [m.get("max_model_len") for m in data["data"] if isinstance(m, dict)]
            lens = [n for n in lens if isinstance(n, int) and not isinstance(n, bool) and n >= 1]
            return b, (min(lens) if lens else 0), ""

        answered, found = set(), []
        for b, n, why in await asyncio.gather(*(ask(b) for b in self.backends)):
            if n is None:
                if mark_down:
                    self._mark_down(b, why)
                continue
            answered.add(b.index)
            if n:
                found.append(n)
        if found and not self._context_known:
            self.max_model_len = min(min(found), DEFAULT_CONTEXT_CAP)
            self._context_known = True
        return answered

    async def check_health(self) -> None:
        """``GET /health`` every backend once (bounded by ``connect_timeout_s``) and update ``up``: only a whole
        200 reply counts as healthy (a cut, oversized or late reply is a failure)."""
        async def probe(b: Backend) -> None:
            try:
                status, _ = await fetch_json(self._session, b.url, "GET", "/health", timeout_s=self.connect_timeout_s)
                healthy, why = status == 200, f"health check answered {status}"
            except BACKEND_ERRORS as exc:
                healthy, why = False, f"health check failed: {_describe(exc)}"
            b.health_failures = 0 if healthy else b.health_failures + 1
            if healthy and not b.up:
                b.up = True
                async with self._slot_freed:
                    self._slot_freed.notify_all()
            elif b.health_failures >= 2 and b.up:  # one slow answer from a busy server is not death
                self._mark_down(b, why + " (twice)")

        await asyncio.gather(*(probe(b) for b in self.backends))

    def _mark_down(self, b: Backend, reason: str) -> None:
        if b.up:
            b.marked_down += 1
        b.up = False
        b.last_error = reason

    # ------------------------------------------------------------------ routing
    def view(self) -> ClusterView:
        """The cluster as the router sees it: down backends have no free slot."""
        active = np.array([b.in_flight for b in self.backends], dtype=np.int64)
        free = np.array([(self.max_inflight - b.in_flight) if b.up else 0 for b in self.backends], dtype=np.int64)
        return ClusterView(active, np.array([b.kv_tokens for b in self.backends], dtype=np.int64), np.maximum(free, 0),
                           time_s=time.monotonic() - self._t0)

    async def _acquire(self, rid: int, prompt_len: int, kv: int, signature: np.ndarray | None,
                       exclude: set[int]) -> Backend:
        """Pick a backend with the router, waiting in the bounded queue for a free slot.

        Routing and waiting happen under the condition's lock, so a slot freed in between cannot
        be missed; the wait is also bounded by ``health_interval_s`` (backends may come back)."""
        deadline = time.monotonic() + self.queue_timeout_s
        queued = False
        async with self._slot_freed:
            try:
                while True:
                    view = self.view()
                    for i in exclude:
                        view.free_slots[i] = 0
                    if not any(b.up for b in self.backends if b.index not in exclude):
                        raise HTTPError(503, "no backend is up" + (" (all failed for this request)" if exclude else ""))
                    batch = RequestBatch(np.array([prompt_len]), signature=None if signature is None else signature[None, :])
                    try:  # a router of the user's that raises or answers nonsense fails this request, named
                        w = (int(call_router(self.router, batch, view, free_slots=view.free_slots)[0])
                             if view.free_slots.max() > 0 else -1)
                    except RouterError as exc:
                        raise HTTPError(500, f"the router failed: {exc}") from None
                    if w >= 0:
                        b = self.backends[w]
                        b.in_flight += 1
                        b.kv_tokens += kv
                        b.routed += 1
                        self.decisions.append({"request": rid, "backend": w, "router": self.router.name,
                                               "t_s": round(view.time_s, 4), "in_flight": view.active.tolist(),
                                               "kv_tokens": view.kv_tokens.tolist(), "prompt_len": prompt_len})
                        return b
                    if not queued:
                        if self.waiting >= self.max_queue:
                            self.rejected_queue_full += 1
                            raise HTTPError(503, f"proxy queue is full ({self.max_queue} requests waiting)")
                        self.waiting += 1
                        queued = True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.timed_out_in_queue += 1
                        raise HTTPError(503, f"no backend slot freed within queue_timeout_s={self.queue_timeout_s:g}")
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._slot_freed.wait(), min(left, self.health_interval_s))
            finally:
                if queued:
                    self.waiting -= 1

    async def _release(self, b: Backend, kv: int, ok: bool) -> None:
        async with self._slot_freed:
            b.in_flight -= 1
            b.kv_tokens -= kv
            if ok:
                b.completed += 1
            else:
                b.failed += 1
            self._slot_freed.notify_all()

    # ------------------------------------------------------------------ request handling
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request aiohttp parsed: answer it, count its status, never raise (a bug answers 500)."""
        status = 500
        try:
            resp, status = await self._dispatch(request)
        except HTTPError as exc:
            resp, status = self._error(exc.status, exc.message), exc.status
        except Exception as exc:  # a bug must answer 500, never hang the client
            log.exception("proxy error on %s %s", request.method, request.path)
            resp = self._error(500, f"proxy error: {type(exc).__name__}: {exc}")
        finally:
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        return resp

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        resp = web.Response(status=status, body=error_body(message, status), content_type="application/json")
        resp.force_close()
        return resp

    @staticmethod
    def _json(obj: Any, status: int = 200) -> web.Response:
        resp = web.Response(status=status, body=json.dumps(obj).encode(), content_type="application/json")
        resp.force_close()
        return resp

    async def _dispatch(self, request: web.BaseRequest) -> tuple[web.StreamResponse, int]:
        """Answer one parsed request by method and path.

        A request body must come with ``Content-Length``: a chunked one gets 411 (RFC 9110 lets a server
        require the length), although aiohttp could decode it. Why: the proxy refuses an oversized body (413)
        from its head, before reading a byte, and one framing leaves nothing for a client and the proxy to
        read differently; the clients of an OpenAI API (the ``openai`` SDK over httpx, curl, vLLM's benchmark
        clients) all send ``Content-Length`` with their JSON bodies. Backends get the body re-framed by
        aiohttp's client either way."""
        if request.version not in (HttpVersion10, HttpVersion11):
            raise HTTPError(400, f"HTTP/{request.version.major}.{request.version.minor} is not supported (HTTP/1.0 or 1.1)")
        if "Transfer-Encoding" in request.headers:  # aiohttp refuses every coding but a well-formed chunked body
            raise HTTPError(411, "chunked request bodies are not supported: send Content-Length")
        path = request.path
        if request.method == "GET" and path == "/health":
            up = sum(b.up for b in self.backends)
            down = [{"index": b.index, "url": b.url, "last_error": b.last_error} for b in self.backends if not b.up]
            return self._json({"backends_up": up, "backends": len(self.backends), "down": down}, 200 if up else 503), \
                200 if up else 503
        if request.method == "GET" and path == "/metrics":
            resp = web.Response(status=200, text=self.prometheus(), content_type="text/plain")
            resp.headers["Content-Type"] = "text/plain; version=0.0.4"
            resp.force_close()
            return resp, 200
        if request.method == "GET" and path == "/metrics.json":
            return self._json(self.metrics()), 200
        if request.method == "GET" and path == "/v1/models":
            for b in self.backends:
                if b.up:
                    with contextlib.suppress(*BACKEND_ERRORS):
                        status, data = await fetch_json(self._session, b.url, "GET", "/v1/models",
                                                        timeout_s=self.connect_timeout_s)
                        return self._json(data, status), status
            raise HTTPError(503, "no backend is up")
        if path in ROUTED_PATHS:
            if request.method != "POST":
                raise HTTPError(405, f"{path} takes POST")
            return await self._proxy(request, await self._read_body(request))
        raise HTTPError(404, f"unknown path {path!r}; routed: {list(ROUTED_PATHS)}, also GET /health, /metrics, "
                             "/metrics.json, /v1/models")

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        """The request body: it needs a ``Content-Length`` of at most ``max_body_bytes`` and must arrive
        within ``client_timeout_s`` (408 otherwise; 400 if the client stops before its length, a half-close
        included)."""
        length = request.content_length
        if length is None:  # bytes after such a head are no body of it (HTTP/1.1), and are never parsed
            raise HTTPError(411, f"{request.method} {request.path} needs a Content-Length header (the length of its "
                                 "JSON body; chunked bodies are not accepted)")
        if length > self.max_body_bytes:
            raise HTTPError(413, f"request body must be at most {self.max_body_bytes} bytes; got {length}")
        if request.headers.get("Expect", "").lower() == "100-continue":  # curl waits a second for this otherwise
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await asyncio.wait_for(read_bounded(request.content, self.max_body_bytes), self.client_timeout_s)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"request body not received within {self.client_timeout_s:g} s") from None
        except ReplyTooLargeError:
            raise HTTPError(413, f"request body must be at most {self.max_body_bytes} bytes") from None
        except (aiohttp.ClientError, ConnectionError, OSError, EOFError, ValueError) as exc:
            raise HTTPError(400, f"request body broken off before its Content-Length {length}: {_describe(exc)}") from None
        if len(body) != length:
            why = " (the client half-closed the connection)" if getattr(request.protocol, "half_closed", False) else ""
            raise HTTPError(400, f"body of {len(body)} bytes, shorter than its Content-Length {length}{why}")
        return body

    async def _proxy(self, request: web.BaseRequest, body: bytes) -> tuple[web.StreamResponse, int]:
        payload = validate_payload(request.path, parse_json(body), max_model_len=self.max_model_len or DEFAULT_CONTEXT_CAP,
                                   max_n=self.max_n)
        rid = next(self._ids)
        prompt_len = _prompt_len(payload)
        kv = prompt_len + _max_tokens(payload) * _sequences(payload)  # bounded: every term was range-checked
        signature = None
        if self.signature_source is not None:
            try:
                signature = await self.signature_source.signature(payload)
            except (*BACKEND_ERRORS, ConnectionError) as exc:
                raise HTTPError(502, f"signature service failed: {_describe(exc)}") from None
        tried: set[int] = set()
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                b = await self._acquire(rid, prompt_len, kv, signature, tried)
            except HTTPError as exc:
                if tried and exc.status == 503:
                    raise HTTPError(502, f"every backend tried failed; last error: {last_error}") from None
                raise
            self.retried += attempt > 0
            tried.add(b.index)
            ok = False
            try:
                resp, status, ok, retryable, last_error = await self._forward(b, request, body,
                                                                              stream=bool(payload.get("stream")))
            finally:
                await self._release(b, kv, ok)
            if not retryable:
                return resp, status
        raise HTTPError(502, f"request failed on {len(tried)} backend(s) ({self.retries} retries); last error: {last_error}")

    async def _to_client(self, request: web.BaseRequest, resp: web.StreamResponse, data: bytes, *,
                         last: bool = False) -> bool:
        """Write ``data`` to the client (preparing the response first if needed; ``last``: then end it) within
        ``client_write_timeout_s``; ``False`` if the client is gone or does not read, and then its connection is
        closed. One deadline for the steps together: each ``asyncio.wait_for`` is a task of its own."""
        async def send() -> None:
            if not resp.prepared:
                await resp.prepare(request)
            if data:
                await resp.write(data)
            if last:
                await resp.write_eof()

        try:
            await asyncio.wait_for(send(), self.client_write_timeout_s)
            return True
        except asyncio.TimeoutError:
            self.slow_clients_dropped += 1
        except (ConnectionError, OSError, RuntimeError):  # RuntimeError: aiohttp's "connection closed"
            pass
        if request.transport is not None:
            request.transport.abort()
        return False

    def _client_response(self, up: aiohttp.ClientResponse, body: bytes | None = None) -> web.StreamResponse:
        """The client's response from a backend's: its status and end-to-end headers, less any header aiohttp's
        client let through with a control character (aiohttp's server refuses to write those). ``body``: the
        whole reply, which goes out with the head in one write; ``None``: a stream, whose head goes out at once."""
        headers = [(k, v) for k, v in up.headers.items()
                   if k.lower() not in NOT_RELAYED and not (_CONTROL_CHARACTER.search(k) or _CONTROL_CHARACTER.search(v))]
        reason = _printable(up.reason or "")
        if body is None:
            resp = web.StreamResponse(status=up.status, reason=reason, headers=headers)
        else:
            resp = web.Response(status=up.status, reason=reason, headers=headers, body=body)
        resp.force_close()
        return resp

    async def _send_to_backend(self, b: Backend, path: str, body: bytes) -> aiohttp.ClientResponse:
        """POST ``body`` to backend ``b`` and return its reply once its head arrived: on a kept-alive connection
        (no TCP handshake, and no connection set-up in the backend, per request), and once more on a fresh
        connection if the kept one turns out closed by the backend while idle, or its head malformed (bytes an
        earlier reply left after its end read as this head): that is not this request failing; a backend that
        is down or answers malformed heads fails the fresh connection too, and only that counts."""
        kw = dict(data=body, headers={"Content-Type": "application/json"}, timeout=self._backend_timeout,
                  allow_redirects=False)
        try:
            return await self._pool.post(b.url + path, **kw)
        except BACKEND_ERRORS as exc:
            if not stale_connection(exc):
                raise
        return await self._session.post(b.url + path, **kw)

    async def _forward(self, b: Backend, request: web.BaseRequest, body: bytes, *, stream: bool
                       ) -> tuple[web.StreamResponse, int, bool, bool, str]:
        """One attempt on backend ``b``: returns ``(response, status, ok, retryable, error)``.

        Non-streaming replies are read whole (bounded) before the client sees a byte, so a backend failing
        mid-reply is retried; a stream is held back until its first whole event (``\\n\\n``) and relayed as
        it arrives after that, so it can be retried only until then. Every read of the reply has its deadlines
        (the class docstring: head, body silence, stream silence, the whole reply); a missed one, a framing
        error or a cut is the backend's failure (marked down; the caller frees the slot). A client that goes
        away or does not read is not the backend's fault (status 499, backend not marked down)."""
        resp: web.StreamResponse | None = None
        committed = False  # bytes of this attempt went to the client: it can no longer be retried
        end = asyncio.get_running_loop().time() + self.reply_timeout_s  # the whole reply, stream or not
        phase = "head"

        def failed(msg: str) -> tuple[web.StreamResponse, int, bool, bool, str]:
            self._mark_down(b, msg)
            if resp is not None and committed:  # part of a stream reached the client: close it unfinished
                if request.transport is not None:
                    request.transport.abort()
                return resp, 502, False, False, msg
            return self._error(502, msg), 502, False, True, msg

        try:
            up = await within(self._send_to_backend(b, request.path, body), idle_s=self.response_timeout_s, deadline=end)
            async with up:
                # Only "gateway/unavailable" answers say the backend itself is unwell; another 5xx belongs to
                # this one request and is passed through, so a poison request cannot mark every backend down.
                phase = "body"
                if up.status in (502, 503, 504):
                    text = await read_bounded(up.content, MAX_SMALL_REPLY_BYTES, idle_s=self.response_timeout_s,
                                              deadline=end)
                    return failed(f"backend {b.index} answered {up.status}: {text[:200]!r}")
                if not stream:
                    data = await read_bounded(up.content, MAX_RESPONSE_BYTES, idle_s=self.response_timeout_s, deadline=end)
                    resp = self._client_response(up, data)
                    committed = True
                    if not await self._to_client(request, resp, b"", last=True):
                        return resp, 499, True, False, "client closed the connection or did not read"
                    return resp, up.status, up.status < 400, False, ""
                phase = "stream"
                first = b""
                while b"\n\n" not in first:
                    chunk = await read_within(up.content, idle_s=self.stream_idle_timeout_s, deadline=end)
                    if not chunk:
                        break
                    first += chunk
                    if len(first) > MAX_FIRST_EVENT_BYTES:
                        raise ReplyTooLargeError(f"first stream event larger than {MAX_FIRST_EVENT_BYTES} bytes")
                resp = self._client_response(up)
                committed = True
                if not await self._to_client(request, resp, first):
                    return resp, 499, True, False, "client closed the connection or did not read"
                total = len(first)
                while chunk := await read_within(up.content, idle_s=self.stream_idle_timeout_s, deadline=end):
                    total += len(chunk)
                    if total > MAX_RESPONSE_BYTES:
                        raise ReplyTooLargeError(f"backend reply larger than {MAX_RESPONSE_BYTES} bytes")
                    if not await self._to_client(request, resp, chunk):
                        return resp, 499, True, False, "client closed the connection or did not read"
            if not await self._to_client(request, resp, b"", last=True):
                return resp, 499, True, False, "client closed the connection or did not read"
            return resp, up.status, up.status < 400, False, ""
        except ReplyDeadlineError as exc:
            return failed(f"backend {b.index} ({b.url}) failed: {self._deadline_missed(exc, phase)}")
        except BACKEND_ERRORS as exc:
            return failed(f"backend {b.index} ({b.url}) failed: {_describe(exc)}")

    def _deadline_missed(self, exc: ReplyDeadlineError, phase: str) -> str:
        """Which deadline a reply missed, by the name of its parameter."""
        if exc.which == "total":
            return f"reply not complete within reply_timeout_s={self.reply_timeout_s:g} s"
        if phase == "head":
            return f"no reply head within response_timeout_s={self.response_timeout_s:g} s"
        if phase == "body":
            return f"reply body silent for response_timeout_s={self.response_timeout_s:g} s"
        return f"stream silent for stream_idle_timeout_s={self.stream_idle_timeout_s:g} s"

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, Any]:
        """Per-backend load and counters, queue state and the most recent routing decisions."""
        return {
            "router": self.router.name,
            "uptime_s": round(time.monotonic() - self._t0, 3),
            "waiting": self.waiting, "max_queue": self.max_queue, "max_inflight": self.max_inflight,
            "retried": self.retried, "rejected_queue_full": self.rejected_queue_full,
            "timed_out_in_queue": self.timed_out_in_queue, "slow_clients_dropped": self.slow_clients_dropped,
            "health_round_errors": self.health_round_errors, "health_loop_restarts": self.health_loop_restarts,
            "responses_by_status": {str(k): v for k, v in sorted(self.status_counts.items())},
            "backends": [{"index": b.index, "url": b.url, "up": b.up, "in_flight": b.in_flight, "kv_tokens": b.kv_tokens,
                          "routed": b.routed, "completed": b.completed, "failed": b.failed, "marked_down": b.marked_down,
                          "last_error": b.last_error} for b in self.backends],
            "recent_decisions": list(self.decisions),
        }

    def prometheus(self) -> str:
        """The metrics in Prometheus' text exposition format."""
        lines = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP moelab_proxy_{name} {help_text}")
            lines.append(f"# TYPE moelab_proxy_{name} {kind}")
            lines.extend(f"moelab_proxy_{name}{labels} {value:g}" for labels, value in samples)

        def per_backend(attr: str) -> list[tuple[str, float]]:
            return [(f'{{backend="{b.index}",url="{b.url}"}}', float(getattr(b, attr))) for b in self.backends]

        family("backend_up", "gauge", "1 if the backend is considered up", per_backend("up"))
        family("backend_in_flight", "gauge", "requests in flight on the backend", per_backend("in_flight"))
        family("backend_kv_tokens", "gauge", "prompt + requested output tokens of in-flight requests", per_backend("kv_tokens"))
        family("routed_total", "counter", "routing decisions per backend", per_backend("routed"))
        family("backend_completed_total", "counter", "requests completed per backend", per_backend("completed"))
        family("backend_failed_total", "counter", "failed attempts per backend", per_backend("failed"))
        family("backend_marked_down_total", "counter", "times the backend was marked down", per_backend("marked_down"))
        family("queue_waiting", "gauge", "requests waiting for a backend slot", [("", float(self.waiting))])
        family("retries_total", "counter", "attempts retried on another backend", [("", float(self.retried))])
        family("rejected_total", "counter", "requests rejected because the queue was full or timed out",
               [('{reason="queue_full"}', float(self.rejected_queue_full)), ('{reason="queue_timeout"}', float(self.timed_out_in_queue))])
        family("slow_clients_dropped_total", "counter", "client connections closed for not reading within the write deadline",
               [("", float(self.slow_clients_dropped))])
        family("health_loop_restarts_total", "counter", "times the supervised health loop was started again",
               [("", float(self.health_loop_restarts))])
        family("responses_total", "counter", "responses by HTTP status",
               [(f'{{code="{k}"}}', float(v)) for k, v in sorted(self.status_counts.items())])
        return "\n".join(lines) + "\n"



# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moelab serve-router", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", "-b", action="append", required=True, metavar="URL",
                   help="an OpenAI-compatible vLLM server, e.g. http://127.0.0.1:8001 (repeat for each)")
    p.add_argument("--router", default="jsq",
                   help="routing policy (default jsq): a registered router that needs only what a live proxy knows "
                        f"({', '.join(router_choices())}, or one a --router-module registers)")
    p.add_argument("--router-module", action="append", default=[], metavar="MODULE",
                   help="import this module first (repeatable): a module of yours that registers a router "
                        "(moelab.routing.register_router) so --router can name it; it must be importable by this "
                        "command (installed, or its folder on PYTHONPATH, e.g. PYTHONPATH=. moelab serve-router ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-inflight", type=int, default=32, help="requests in flight per backend")
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--queue-timeout", type=float, default=60.0)
    p.add_argument("--connect-timeout", type=float, default=3.0)
    p.add_argument("--response-timeout", type=float, default=120.0,
                   help="seconds a backend's reply head may take (and a buffered body may be silent); default 120")
    p.add_argument("--stream-idle-timeout", type=float, default=None,
                   help="seconds a streamed reply may be silent between two pieces; default: --response-timeout")
    p.add_argument("--reply-timeout", type=float, default=600.0,
                   help="seconds one whole forwarded reply may take, head to last byte, stream or not; default 600")
    p.add_argument("--client-write-timeout", type=float, default=30.0,
                   help="seconds one write to a client may wait for it to read (then its stream is closed)")
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--health-interval", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--signature-url", help="ELDR: the prefill-count service (moelab.capture.vllm_backend serve-counts)")
    p.add_argument("--eldr-calibration", help="ELDR: an ExpertTrace (.npz) of calibration requests to fit signatures + centroids")
    p.add_argument("--tau", type=float, default=0.1, help="ELDR locality band width")
    return p


# the command line's deadlines and the range each must lie in, checked by flag name before anything starts
TIMEOUT_FLAGS = ("queue_timeout", "connect_timeout", "response_timeout", "stream_idle_timeout", "reply_timeout",
                 "client_write_timeout", "health_interval")


def build_proxy(args: argparse.Namespace) -> RouterProxy:
    """A :class:`RouterProxy` from parsed command-line arguments (``ValueError`` naming the flag for a value
    out of its range)."""
    for name in TIMEOUT_FLAGS:
        if getattr(args, name) is not None:  # None: the default that follows another flag
            check_real("--" + name.replace("_", "-"), getattr(args, name), low=0, low_open=True, high=MAX_TIMEOUT_S)
    import_router_modules(args.router_module)
    check_choice("--router", args.router, router_choices())
    source, calibration = None, RouterCalibration(n_workers=len(args.backend), seed=args.seed)
    if "signature" in router_class(args.router).requires:  # signatures: calibration ones, then one per request
        if not (args.signature_url and args.eldr_calibration):
            raise ValueError(f"--router {args.router} reads each request's signature: it needs --signature-url and "
                             "--eldr-calibration")
        calib = ExpertTrace.load(args.eldr_calibration)
        builder = SignatureBuilder("count_idf", seed=args.seed).fit(calib)
        calibration = RouterCalibration(n_workers=len(args.backend), signatures=builder.transform(calib), seed=args.seed)
        source = ELDRSignatureClient(args.signature_url, builder)
    router = make_router(args.router, calibration, seed=args.seed, options={"tau": args.tau})
    return RouterProxy(args.backend, router, host=args.host, port=args.port, max_inflight=args.max_inflight,
                       max_queue=args.max_queue, queue_timeout_s=args.queue_timeout, connect_timeout_s=args.connect_timeout,
                       response_timeout_s=args.response_timeout, stream_idle_timeout_s=args.stream_idle_timeout,
                       reply_timeout_s=args.reply_timeout, client_write_timeout_s=args.client_write_timeout,
                       retries=args.retries, health_interval_s=args.health_interval, signature_source=source,
                       seed=args.seed)


async def _serve(proxy: RouterProxy) -> None:
    host, port = await proxy.start()
    print(f"moelab serve-router: {proxy.router.name} over {len(proxy.backends)} backend(s) on http://{host}:{port}", flush=True)
    for b in proxy.down_at_start:
        print(f"moelab serve-router: backend {b.index} ({b.url}) is down at start ({b.last_error}); serving with the "
              "rest, the health loop brings it back", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``moelab serve-router``."""
    args = build_parser().parse_args(argv)
    try:
        proxy = build_proxy(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(proxy))
    except OSError as exc:  # port in use, privileged or not on this machine: the user's choice, not a bug
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EPERM, errno.EADDRNOTAVAIL):
            raise
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
