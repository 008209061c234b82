"""Minimal HTTP/1.1 on asyncio streams: enough to proxy OpenAI-compatible JSON and SSE traffic.

The proxy speaks plain HTTP to loopback vLLM servers, so it needs no web framework (and no torch or
vLLM): requests are read with a size cap and deadlines, responses from a backend are relayed byte for
byte (chunked transfer encoding included, which is how vLLM streams server-sent events).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class HTTPError(Exception):
    """An error the proxy answers with ``status`` and a JSON body ``{"error": {"message": ...}}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """One parsed client request (headers lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        """The body as JSON, or ``HTTPError(400)`` naming what is wrong."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HTTPError(400, f"request body is not valid JSON: {exc}") from None


@dataclass
class ResponseHead:
    """Status line and headers of a backend response (header names lower-cased, order kept)."""

    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return default


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name.strip():
            raise HTTPError(400, f"malformed header line {line[:80]!r}")
        out.append((name.strip().lower(), value.strip()))
    return out


async def _read_head(reader: asyncio.StreamReader, timeout_s: float) -> list[bytes]:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    except asyncio.LimitOverrunError:
        raise HTTPError(413, f"request head larger than {MAX_HEAD_BYTES} bytes") from None
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
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HTTPError(400, f"malformed request line {lines[0][:80]!r}")
    method, target, _ = parts
    headers = dict(_parse_headers(lines[1:]))
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HTTPError(411, "chunked request bodies are not supported: send Content-Length")
    body = b""
    if method in ("POST", "PUT", "PATCH"):
        if "content-length" not in headers:
            raise HTTPError(411, "a request body needs a Content-Length header")
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise HTTPError(400, f"Content-Length must be an integer; got {headers['content-length']!r}") from None
        if length < 0 or length > max_body_bytes:
            raise HTTPError(413, f"request body must be at most {max_body_bytes} bytes; got {length}")
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
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"backend URL must look like http://127.0.0.1:8000; got {url!r}")
    return parts.hostname, parts.port


async def open_backend(host: str, port: int, method: str, path: str, body: bytes, *,
                       connect_timeout_s: float, head_timeout_s: float,
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, ResponseHead]:
    """Send one request to a backend and read its response head (``Connection: close``).

    Raises ``ConnectionError``/``OSError`` if the backend is unreachable or drops the connection,
    ``asyncio.TimeoutError`` past a deadline."""
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
        status_parts = lines[0].decode("latin-1").split(" ", 2)
        if len(status_parts) < 2 or not status_parts[1].isdigit():
            raise ConnectionError(f"backend sent a malformed status line {lines[0][:80]!r}")
        return reader, writer, ResponseHead(int(status_parts[1]), status_parts[2] if len(status_parts) > 2 else "",
                                            _parse_headers(lines[1:]))
    except BaseException:
        writer.close()
        raise


async def iter_body(reader: asyncio.StreamReader, head: ResponseHead, idle_timeout_s: float):
    """Yield the raw body bytes of a backend response as they arrive (framing kept as sent).

    Ends when the body is complete; raises ``ConnectionError`` if the backend stops early (a chunked
    body without its terminating chunk, or fewer bytes than Content-Length)."""
    if "chunked" in (head.get("transfer-encoding") or "").lower():
        while True:
            size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), idle_timeout_s)
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ConnectionError(f"backend sent a malformed chunk size {size_line[:40]!r}") from None
            data = await asyncio.wait_for(reader.readexactly(size + 2), idle_timeout_s)
            yield size_line + data
            if size == 0:
                return
    elif head.get("content-length") is not None:
        remaining = int(head.get("content-length") or 0)
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
            yield data


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
        if "chunked" in (head.get("transfer-encoding") or "").lower():
            data = dechunk(data)
        try:
            return head.status, json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return head.status, data.decode("utf-8", "replace")

    return await asyncio.wait_for(go(), timeout_s)


def dechunk(raw: bytes) -> bytes:
    """Decode a complete chunked-transfer body."""
    out, pos = [], 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(raw[end + 2:end + 2 + size])
        pos = end + 2 + size + 2
