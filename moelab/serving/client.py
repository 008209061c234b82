"""The client side of moelab's serving HTTP, on aiohttp: bounded requests to loopback servers.

Every read of a server's reply is bounded in bytes and in time, and every way a reply can fail (refused
or dropped connection, a malformed head, a body cut short or a chunked body cut inside a chunk, a
deadline) surfaces as one of :data:`BACKEND_ERRORS`, so a caller has exactly one class of failure to turn
into "this server is unhealthy". ``asyncio.IncompleteReadError`` is an ``EOFError`` (not an ``OSError``)
and aiohttp's ``ClientPayloadError`` a ``ClientError``: both are in the tuple on purpose.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import http_exceptions

MAX_RESPONSE_BYTES = 64 << 20  # a whole backend response body, buffered or relayed
MAX_SMALL_REPLY_BYTES = 1 << 20  # /health, /v1/models and other JSON replies the proxy reads itself
MAX_HEAD_BYTES = 64 * 1024  # status line + headers of a backend reply (aiohttp's limits, stated here)

# everything a request to a server can raise when the server (not the caller) is at fault
BACKEND_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, http_exceptions.HttpProcessingError,
                                                   asyncio.TimeoutError, OSError, EOFError, ValueError)


class ReplyTooLargeError(aiohttp.ClientPayloadError):
    """A server's reply body is larger than the reader's bound."""


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
    request on a kept connection the server closed meanwhile fails as :func:`stale_connection` says."""
    if keepalive_s is None:
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
    else:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive_s)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, max_line_size=MAX_HEAD_BYTES,
                                 max_field_size=MAX_HEAD_BYTES, raise_for_status=False,
                                 cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("Accept-Encoding",))


def stale_connection(exc: BaseException) -> bool:
    """Whether a request failed the way one on a kept-alive connection fails when the server closed that
    connection while it was idle: disconnected or reset before any reply (a refused connect is not)."""
    return (isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
            and not isinstance(exc, aiohttp.ClientConnectorError))


def backend_timeout(connect_s: float, read_s: float, total_s: float | None = None) -> aiohttp.ClientTimeout:
    """Deadlines of one request: ``connect_s`` to connect, ``read_s`` for every read of the reply (its head,
    each body chunk), ``total_s`` for the whole exchange (``None``: none)."""
    return aiohttp.ClientTimeout(total=total_s, sock_connect=connect_s, sock_read=read_s)


async def read_bounded(content: aiohttp.StreamReader, max_bytes: int) -> bytes:
    """The rest of a reply body: at most ``max_bytes`` (else :class:`ReplyTooLargeError`); a body cut short
    raises ``ClientPayloadError``. Time is the caller's bound: a backend reply's reads are bounded by its
    session's ``sock_read`` deadline (:func:`backend_timeout`), a client's body by the caller's deadline
    (no timer per read: on Python 3.11 each ``asyncio.wait_for`` is a task of its own)."""
    parts, total = [], 0
    while data := await content.readany():
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


__all__ = ["BACKEND_ERRORS", "MAX_RESPONSE_BYTES", "ReplyTooLargeError", "backend_timeout", "fetch_json", "new_session", "read_bounded", "stale_connection",
           "split_url"]
