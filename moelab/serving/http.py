"""Minimal HTTP/1.1 on asyncio streams: enough to proxy OpenAI-compatible JSON and SSE traffic.

The proxy speaks plain HTTP to loopback vLLM servers, so it needs no web framework (and no torch or
vLLM): requests are read with a size cap and deadlines, responses from a backend are relayed byte for
byte (chunked transfer encoding included, which is how vLLM streams server-sent events).

Framing is strict in both directions, because a proxy and a backend that disagree about where a
message ends is how requests get smuggled: header names must be tokens (no space before the colon, no
folded lines), ``Content-Length`` is plain decimal digits (no sign, ``_`` or spaces) and several of them
must agree, a request may not carry ``Transfer-Encoding`` (chunked request bodies are not supported) and a
backend's ``Transfer-Encoding`` must be exactly ``chunked`` and not come with a ``Content-Length``. A
client that breaks these rules gets a 4xx (:class:`HTTPError`); a backend that does raises
:class:`BackendProtocolError` (the proxy answers 502 and marks the backend down).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 16 << 20  # one chunk of a backend's chunked body
MAX_RESPONSE_BYTES = 64 << 20  # a whole backend response body (buffered or streamed)
MAX_DIGITS = 18  # Content-Length and similar: at most 10**18 - 1, well inside int64
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
           501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_DIGITS = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,8}")
_BAD_VALUE_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters other than tab


class HTTPError(Exception):
    """An error the proxy answers with ``status`` and a JSON body ``{"error": {"message": ...}}``.

    ``unread`` is how many request bytes the client may still be sending (the proxy reads and drops
    up to that many before closing, so the client receives the answer instead of a connection reset)."""

    def __init__(self, status: int, message: str, *, unread: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.unread = unread


class BackendProtocolError(ConnectionError):
    """A backend's response breaks HTTP framing (malformed status line, header or length)."""


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


@dataclass
class Request:
    """One parsed client request (headers lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        """The body as strict JSON (:func:`parse_json`), or ``HTTPError(400)`` naming what is wrong."""
        return parse_json(self.body)


@dataclass
class ResponseHead:
    """Status line and headers of a backend response (header names lower-cased, order kept), with
    its checked framing: ``content_length`` (``None``: not given) and ``chunked``."""

    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_length: int | None = None
    chunked: bool = False

    def get(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return default


def _parse_headers(lines: list[bytes], error: type[Exception] = HTTPError) -> list[tuple[str, str]]:
    """``name: value`` lines, strictly: a token name right before the colon, no folded lines, no
    control characters in the value. Violations raise ``error`` (400 for a client)."""
    def fail(msg: str) -> Exception:
        return HTTPError(400, msg) if error is HTTPError else error(msg)

    out = []
    for line in lines:
        text = line.decode("latin-1")
        name, sep, value = text.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise fail(f"malformed header line {line[:80]!r} (a header is a token name, a colon, a value; "
                       "no space before the colon, no folded lines)")
        value = value.strip(" \t")
        if _BAD_VALUE_CHARS.search(value):
            raise fail(f"control character in header {name!r}")
        out.append((name.lower(), value))
    return out


def _content_length(headers: list[tuple[str, str]], fail: Any) -> int | None:
    """The one ``Content-Length`` of a message (``None`` if absent); malformed or conflicting -> ``fail``."""
    values = [v.strip(" \t") for k, val in headers if k == "content-length" for v in val.split(",")]
    if not values:
        return None
    bad = [v for v in values if not _DIGITS.fullmatch(v)]
    if bad:
        raise fail(f"Content-Length must be decimal digits (at most {MAX_DIGITS}); got {bad[0][:40]!r}")
    if len({int(v) for v in values}) > 1:
        raise fail(f"conflicting Content-Length headers {values[:4]}")
    return int(values[0])


async def _read_head(reader: asyncio.StreamReader, timeout_s: float) -> list[bytes]:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    except asyncio.LimitOverrunError:
        raise HTTPError(413, f"request head larger than {MAX_HEAD_BYTES} bytes", unread=MAX_HEAD_BYTES) from None
    if len(raw) > MAX_HEAD_BYTES:
        raise HTTPError(413, f"request head larger than {MAX_HEAD_BYTES} bytes")
    return raw[:-4].split(b"\r\n")


async def read_request(reader: asyncio.StreamReader, *, max_body_bytes: int, timeout_s: float,
                       writer: asyncio.StreamWriter | None = None) -> Request | None:
    """Read one request; ``None`` on a clean EOF before any byte. Malformed input -> ``HTTPError``.
    With ``writer``, a client that sends ``Expect: 100-continue`` (curl, for bodies over 1 KB) is
    told to go on instead of waiting a second for the body."""
    try:
        lines = await _read_head(reader, timeout_s)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise HTTPError(400, "connection closed in the middle of the request head") from None
    except asyncio.TimeoutError:
        raise HTTPError(408, f"request head not received within {timeout_s:g} s") from None
    line = lines[0].decode("latin-1")
    parts = line.split(" ")
    if (len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.0", "HTTP/1.1")
            or not (parts[1].startswith("/") or parts[1].startswith("http://")) or _BAD_VALUE_CHARS.search(parts[1])):
        raise HTTPError(400, f"malformed request line {lines[0][:80]!r}", unread=MAX_HEAD_BYTES)
    method, target, _ = parts
    header_list = _parse_headers(lines[1:])
    headers = dict(header_list)

    def fail(msg: str) -> HTTPError:
        return HTTPError(400, msg, unread=max_body_bytes)

    length = _content_length(header_list, fail)
    if "transfer-encoding" in headers:
        if length is not None:
            raise fail("a request may not carry both Transfer-Encoding and Content-Length")
        if "chunked" in headers["transfer-encoding"].lower():
            raise HTTPError(411, "chunked request bodies are not supported: send Content-Length", unread=max_body_bytes)
        raise HTTPError(501, f"Transfer-Encoding {headers['transfer-encoding'][:40]!r} is not supported",
                        unread=max_body_bytes)
    body = b""
    if method in ("POST", "PUT", "PATCH") and length is None:
        raise HTTPError(411, "a request body needs a Content-Length header")
    if length:
        if length > max_body_bytes:
            raise HTTPError(413, f"request body must be at most {max_body_bytes} bytes; got {length}", unread=length)
        if writer is not None and headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await asyncio.wait_for(reader.readexactly(length), timeout_s)
        except asyncio.IncompleteReadError:
            raise HTTPError(400, f"body shorter than its Content-Length {length}") from None
        except asyncio.TimeoutError:
            raise HTTPError(408, f"request body not received within {timeout_s:g} s") from None
    return Request(method, urlsplit(target).path or "/", headers, body)


def render_response(status: int, body: bytes, content_type: str = "application/json",
                    extra: list[tuple[str, str]] | None = None) -> bytes:
    """A complete ``Connection: close`` response."""
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (extra or [])]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def error_body(message: str, status: int) -> bytes:
    """OpenAI-style error JSON."""
    return json.dumps({"error": {"message": message, "type": REASONS.get(status, "error"), "code": status}}).encode()


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


def parse_response_head(lines: list[bytes]) -> ResponseHead:
    """A backend's status line and headers with checked framing; violations -> :class:`BackendProtocolError`."""
    m = re.fullmatch(r"HTTP/1\.[01] ([1-5][0-9][0-9])(?: (.*))?", lines[0].decode("latin-1"))
    if not m:
        raise BackendProtocolError(f"backend sent a malformed status line {lines[0][:80]!r}")
    headers = _parse_headers(lines[1:], BackendProtocolError)
    length = _content_length(headers, BackendProtocolError)
    codings = [v.strip().lower() for k, val in headers if k == "transfer-encoding" for v in val.split(",")]
    if codings and codings != ["chunked"]:
        raise BackendProtocolError(f"backend sent an unsupported Transfer-Encoding {codings[:4]}")
    if codings and length is not None:
        raise BackendProtocolError("backend sent both Transfer-Encoding and Content-Length")
    return ResponseHead(int(m.group(1)), m.group(2) or "", headers, length, bool(codings))


async def open_backend(host: str, port: int, method: str, path: str, body: bytes, *,
                       connect_timeout_s: float, head_timeout_s: float,
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, ResponseHead]:
    """Send one request to a backend and read its response head (``Connection: close``).

    Raises ``ConnectionError``/``OSError`` if the backend is unreachable or drops the connection,
    :class:`BackendProtocolError` (a ``ConnectionError``) for a malformed head, ``asyncio.TimeoutError``
    past a deadline."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES), connect_timeout_s)
    try:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
        writer.write(head + body)
        await writer.drain()
        try:
            lines = await _read_head(reader, head_timeout_s)
        except asyncio.IncompleteReadError:
            raise ConnectionError("backend closed the connection before answering") from None
        except HTTPError:
            raise BackendProtocolError(f"backend response head larger than {MAX_HEAD_BYTES} bytes") from None
        return reader, writer, parse_response_head(lines)
    except BaseException:
        writer.close()
        raise


async def iter_body(reader: asyncio.StreamReader, head: ResponseHead, idle_timeout_s: float, *,
                    max_bytes: int = MAX_RESPONSE_BYTES) -> AsyncIterator[bytes]:
    """Yield the raw body bytes of a backend response as they arrive (framing kept as sent).

    Ends when the body is complete; raises ``ConnectionError`` if the backend stops early (a chunked
    body without its terminating chunk, or fewer bytes than Content-Length) and
    :class:`BackendProtocolError` for a malformed chunk or a body over ``max_bytes``."""
    if head.status in (204, 304) or head.status < 200:
        return
    total = 0

    def count(n: int) -> None:
        nonlocal total
        total += n
        if total > max_bytes:
            raise BackendProtocolError(f"backend response body larger than {max_bytes} bytes")

    try:
        if head.chunked:
            while True:
                size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), idle_timeout_s)
                digits = size_line[:-2].split(b";")[0].strip(b" \t")
                if not _HEX.fullmatch(digits):
                    raise BackendProtocolError(f"backend sent a malformed chunk size {size_line[:40]!r}")
                size = int(digits, 16)
                if size > MAX_CHUNK_BYTES:
                    raise BackendProtocolError(f"backend chunk of {size} bytes is over {MAX_CHUNK_BYTES}")
                count(size)
                if size == 0:  # last chunk, then optional trailer lines and an empty line
                    out = [size_line]
                    while True:
                        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), idle_timeout_s)
                        out.append(line)
                        count(len(line))
                        if line == b"\r\n":
                            yield b"".join(out)
                            return
                data = await asyncio.wait_for(reader.readexactly(size + 2), idle_timeout_s)
                if not data.endswith(b"\r\n"):
                    raise BackendProtocolError("backend chunk does not end with CRLF")
                yield size_line + data
        elif head.content_length is not None:
            remaining = head.content_length
            count(remaining)
            while remaining > 0:
                data = await asyncio.wait_for(reader.read(min(remaining, 65536)), idle_timeout_s)
                if not data:
                    raise ConnectionError(f"backend closed the connection {remaining} bytes before the end of the body")
                remaining -= len(data)
                yield data
        else:  # body delimited by connection close
            while True:
                data = await asyncio.wait_for(reader.read(65536), idle_timeout_s)
                if not data:
                    return
                count(len(data))
                yield data
    except asyncio.LimitOverrunError:
        raise BackendProtocolError(f"backend sent a chunk-size or trailer line longer than {MAX_HEAD_BYTES} bytes") from None


async def http_json(url: str, method: str, path: str, payload: Any = None, *, timeout_s: float = 10.0) -> tuple[int, Any]:
    """One JSON request to ``url`` (``http://host:port``); returns ``(status, parsed JSON or text)``."""
    host, port = split_url(url)
    body = b"" if payload is None else json.dumps(payload).encode()

    async def go() -> tuple[int, Any]:
        reader, writer, head = await open_backend(host, port, method, path, body, connect_timeout_s=timeout_s, head_timeout_s=timeout_s)
        try:
            data = b"".join([chunk async for chunk in iter_body(reader, head, timeout_s)])
        finally:
            writer.close()
        if head.chunked:
            data = dechunk(data)
        try:
            return head.status, json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return head.status, data.decode("utf-8", "replace")

    return await asyncio.wait_for(go(), timeout_s)


def dechunk(raw: bytes) -> bytes:
    """Decode a complete chunked-transfer body (as :func:`iter_body` yields it)."""
    out, pos = [], 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(raw[end + 2:end + 2 + size])
        pos = end + 2 + size + 2
