"""The client side of moelab's serving HTTP, on aiohttp: bounded requests to loopback servers.

Every read of a server's reply is bounded in bytes and in time, and every way a reply can fail (refused
or dropped connection, a malformed head, a body cut short or a chunked body cut inside a chunk, malformed
body framing, a deadline) surfaces as one of :data:`BACKEND_ERRORS`, so a caller has exactly one class of
failure to turn into "this server is unhealthy". ``asyncio.IncompleteReadError`` is an ``EOFError`` (not an
``OSError``) and aiohttp's ``ClientPayloadError`` a ``ClientError``: both are in the tuple on purpose.

Malformed body framing fails at once. aiohttp 3.14's C parser (llhttp) refuses a malformed chunk-size line
(``zz``, ``5_0``, ``+5``, a size of 40 digits) or a chunk without its CRLF, but when that happens after the
reply's head was handed out, aiohttp records the error on the connection only: the body's reader is never
told and waits forever (the connection's ``sock_read`` timer is dropped with the error, so not even that
ends it). Its pure-Python parser raises into the reader, but only ``AIOHTTP_NO_EXTENSIONS`` selects it, for
the whole process: the proxy's server side would lose llhttp's strict request framing, and the Python
parser waits (until a deadline) on several lines llhttp refuses (``5;``, ``5\\r\\r``, a space before the
size). So the sessions here keep llhttp and use a protocol (:class:`FailFastResponseHandler`) that hands a
parser error to the body's reader. Deadlines (:func:`within`, :func:`read_within`) bound whatever a parser
accepts and then waits on (a huge chunk size, a body that never ends).
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
from aiohttp import http_exceptions
from aiohttp.client_proto import ResponseHandler

if sys.version_info >= (3, 11):
    from asyncio import timeout_at as _timeout_at
else:  # pragma: no cover - aiohttp's own dependency on Python 3.10 (what aiohttp itself uses there)
    from async_timeout import timeout_at as _timeout_at

T = TypeVar("T")

MAX_RESPONSE_BYTES = 64 << 20  # a whole backend response body, buffered or relayed
MAX_SMALL_REPLY_BYTES = 1 << 20  # /health, /v1/models and other JSON replies the proxy reads itself
MAX_HEAD_BYTES = 64 * 1024  # status line + headers of a backend reply (aiohttp's limits, stated here)

# everything a request to a server can raise when the server (not the caller) is at fault
BACKEND_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, http_exceptions.HttpProcessingError,
                                                   asyncio.TimeoutError, OSError, EOFError, ValueError)


class ReplyTooLargeError(aiohttp.ClientPayloadError):
    """A server's reply body is larger than the reader's bound."""


class ReplyFramingError(aiohttp.ClientPayloadError):
    """A server's reply body broke HTTP framing (a malformed chunk-size line, a chunk without its CRLF)."""


class ReplyDeadlineError(asyncio.TimeoutError):
    """A read of a server's reply missed a deadline: ``which`` is ``"idle"`` (no byte for ``idle_s``) or
    ``"total"`` (the reply's own deadline passed)."""

    def __init__(self, which: str, message: str) -> None:
        super().__init__(message)
        self.which = which


class FailFastResponseHandler(ResponseHandler):
    """aiohttp's client connection protocol with one change: when the HTTP parser refuses bytes of a reply
    body (llhttp: a malformed chunk-size line, a chunk without its CRLF), the error reaches the body's reader
    as :class:`ReplyFramingError` at once. aiohttp 3.14 sets it on the connection only and the reader waits
    forever; with the pure-Python parser (``AIOHTTP_NO_EXTENSIONS``) the reader already has it and nothing
    changes."""

    def data_received(self, data: bytes) -> None:
        payload = getattr(self, "_payload", None)  # the body being read (aiohttp's own attribute)
        super().data_received(data)
        error = self.exception()
        if error is None or payload is None or payload.is_eof() or payload.exception() is not None:
            return
        text = getattr(error, "message", None) or str(error)  # llhttp's message, without its "^" pointer line
        reason = " ".join(line.strip() for line in str(text).splitlines() if line.strip().strip("^")) or type(error).__name__
        payload.set_exception(ReplyFramingError(f"reply body framing refused by the parser: {reason[:300]}"), error)


def _fail_fast(connector: aiohttp.TCPConnector) -> aiohttp.TCPConnector:
    """``connector`` making :class:`FailFastResponseHandler` protocols. aiohttp has no public switch for
    the protocol class; its connectors make every connection with ``_factory()`` (aiohttp 3.14, the version
    pyproject asks for). If a later aiohttp drops that attribute the sessions still work, bounded by the read
    deadlines only, and :func:`fails_fast` (asserted by the tests of framing errors) says so."""
    factory = getattr(connector, "_factory", None)
    if isinstance(factory, functools.partial) and factory.func is ResponseHandler:
        connector._factory = functools.partial(FailFastResponseHandler, *factory.args, **factory.keywords)
    return connector


def fails_fast(session: aiohttp.ClientSession) -> bool:
    """Whether ``session``'s connections hand a body framing error to the reader at once."""
    factory = getattr(session.connector, "_factory", None)
    return isinstance(factory, functools.partial) and factory.func is FailFastResponseHandler


def split_url(url: str) -> tuple[str, int]:
    """``http://host:port`` -> ``(host, port)``; anything else is a ``ValueError``."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # a port outside 0-65535 or not a number
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(f"backend URL must look like http://127.0.0.1:8000; got {url!r}")
    return parts.hostname, port


def new_session(*, keepalive_s: float | None = None) -> aiohttp.ClientSession:
    """A client session for loopback servers: bytes passed through as sent (no decompression, no
    ``Accept-Encoding`` asked), no cookies (nothing a backend sets may leak into another client's request, and
    no cookie filtering per request), bounded reply heads.

    ``keepalive_s=None``: one fresh connection per request (what a health probe needs: it tests that the
    server accepts connections). Otherwise connections are kept for reuse while idle at most ``keepalive_s``
    (keep it below the servers' own idle limit, uvicorn's 5 s, so the client drops a connection first); a
    request on a kept connection the server closed meanwhile fails as :func:`stale_connection` says.
    A reply body that breaks HTTP framing fails its read at once (:class:`FailFastResponseHandler`)."""
    if keepalive_s is None:
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
    else:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive_s)
    _fail_fast(connector)  # a malformed reply body fails its read at once (see the module's docstring)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, max_line_size=MAX_HEAD_BYTES,
                                 max_field_size=MAX_HEAD_BYTES, raise_for_status=False,
                                 cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("Accept-Encoding",))


def stale_connection(exc: BaseException) -> bool:
    """Whether a request failed the way one on a kept-alive connection fails when the connection, not the
    request, is at fault: the server closed it while it was idle (disconnected or reset before any reply; a
    refused connect is not), or bytes an earlier reply left on it after its end were read as this reply's
    head (a malformed head: the server's earlier fault, which a fresh connection tells apart)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientResponseError,
                            http_exceptions.HttpProcessingError))


def backend_timeout(connect_s: float, read_s: float | None, total_s: float | None = None) -> aiohttp.ClientTimeout:
    """Deadlines of one request: ``connect_s`` to connect, ``read_s`` for every read of the reply (its head,
    each body chunk; ``None``: none, the caller bounds its reads), ``total_s`` for the whole exchange
    (``None``: none)."""
    return aiohttp.ClientTimeout(total=total_s, sock_connect=connect_s, sock_read=read_s)


def _expired(cm: Any) -> bool:
    flag = cm.expired  # a method of asyncio's Timeout (3.11+), a property of async_timeout's (3.10)
    return bool(flag() if callable(flag) else flag)


async def within(aw: Awaitable[T], *, idle_s: float | None = None, deadline: float | None = None) -> T:
    """``await aw`` within ``idle_s`` seconds from now and before ``deadline`` (event-loop time), else
    :class:`ReplyDeadlineError` (``which``: ``"idle"`` when ``idle_s`` ran out first, else ``"total"``). No
    task of its own (a timer handle, as aiohttp's own ``sock_read``): on Python 3.11 each
    ``asyncio.wait_for`` is a task."""
    if idle_s is None and deadline is None:
        return await aw
    now = asyncio.get_running_loop().time()
    idle_end = None if idle_s is None else now + idle_s
    until = min(t for t in (idle_end, deadline) if t is not None)
    cm = _timeout_at(until)
    try:
        async with cm:
            return await aw
    except asyncio.TimeoutError:
        if not _expired(cm):  # a timeout of something inside, not this deadline
            raise
        if idle_end is not None and (deadline is None or idle_end < deadline):
            raise ReplyDeadlineError("idle", f"nothing for {idle_s:g} s") from None
        raise ReplyDeadlineError("total", "the deadline passed") from None


async def read_within(content: aiohttp.StreamReader, *, idle_s: float | None = None,
                      deadline: float | None = None) -> bytes:
    """``content.readany()`` bounded as :func:`within` says (``b""``: the end of the body)."""
    return await within(content.readany(), idle_s=idle_s, deadline=deadline)


async def read_bounded(content: aiohttp.StreamReader, max_bytes: int, *, idle_s: float | None = None,
                       deadline: float | None = None) -> bytes:
    """The rest of a reply body: at most ``max_bytes`` (else :class:`ReplyTooLargeError`); a body cut short
    raises ``ClientPayloadError`` (:class:`ReplyFramingError` when its framing is malformed). ``idle_s`` and
    ``deadline`` bound every read as :func:`read_within` does; without them time is the caller's bound (a
    client's body: the caller's deadline; a reply of :func:`fetch_json`: the request's total deadline)."""
    parts, total = [], 0
    while data := await read_within(content, idle_s=idle_s, deadline=deadline):
        total += len(data)
        if total > max_bytes:
            raise ReplyTooLargeError(f"reply body larger than {max_bytes} bytes")
        parts.append(data)
    return b"".join(parts)


async def fetch_json(session: aiohttp.ClientSession | None, url: str, method: str, path: str, payload: Any = None, *,
                     timeout_s: float = 10.0, max_bytes: int = MAX_SMALL_REPLY_BYTES) -> tuple[int, Any]:
    """One JSON request to ``url`` (``http://host:port``), the whole exchange within ``timeout_s``.

    Returns ``(status, parsed JSON or the text when it is not JSON)``; a broken reply raises one of
    :data:`BACKEND_ERRORS`. ``session=None`` opens (and closes) a session for this one request."""
    split_url(url)
    if session is None:
        async with new_session() as own:
            return await fetch_json(own, url, method, path, payload, timeout_s=timeout_s, max_bytes=max_bytes)
    body = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"} if body is not None else {}
    # aiohttp's own deadline bounds the whole exchange, connect and body included (no wait_for task)
    async with session.request(method, url + path, data=body, headers=headers, allow_redirects=False,
                               timeout=backend_timeout(timeout_s, timeout_s, timeout_s)) as resp:
        data = await read_bounded(resp.content, max_bytes)
        status = resp.status
    try:
        return status, json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return status, data.decode("utf-8", "replace")


__all__ = ["BACKEND_ERRORS", "MAX_RESPONSE_BYTES", "FailFastResponseHandler", "ReplyDeadlineError", "ReplyFramingError",
           "ReplyTooLargeError", "backend_timeout", "fails_fast", "fetch_json", "new_session", "read_bounded", "read_within",
           "stale_connection", "split_url", "within"]
