"""Property/fuzz tests (hypothesis, bounded example counts) of the router proxy's HTTP handling in both
directions and its payload validation, through a real running proxy (aiohttp) on loopback: whatever bytes a
client or a backend sends, the answer is a well-formed HTTP answer with a status the input deserves (or, for
a request whose head never ends, a closed connection), never a 500 or a hang; what is accepted is what was
framed; a backend reply that breaks framing is a 502 and marks the backend down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from moelab.bench.reliability import MALFORMED_CHUNK_SIZES, FaultyBackend, dechunk  # noqa: E402
from moelab.serving.proxy import (  # noqa: E402
    NUMERIC_FIELDS,
    HTTPError,
    RouterProxy,
    _max_tokens,
    _sequences,
    parse_json,
    validate_payload,
)

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
CLIENT_STATUSES = {400, 408, 411, 413, 501}
CAP = 2000  # the fuzzed proxy's max_body_bytes
CLIENT_TIMEOUT_S = 0.2


class RawBackend:
    """A loopback backend that answers every request with :attr:`reply` (raw bytes), then closes; with
    :attr:`pieces` set, it writes those instead, one at a time a moment apart (so the client parses each on
    its own), then closes."""

    def __init__(self) -> None:
        self.reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        self.pieces: list[bytes] | None = None
        self.server = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader, writer) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")), 0)
            await asyncio.wait_for(reader.readexactly(length), 5)
            for piece in self.pieces if self.pieces is not None else [self.reply]:
                writer.write(piece)
                await writer.drain()
                if self.pieces is not None:
                    await asyncio.sleep(0.003)
        writer.close()


class LiveProxies:
    """Two proxies served by an event loop in a thread, for the whole module: ``client`` in front of a
    well-behaved backend (client-side fuzzing), ``backend`` in front of a :class:`RawBackend` (replies)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> None:
        self.good, self.raw = FaultyBackend(), RawBackend()
        self.client = RouterProxy([await self.good.start()], "round_robin", client_timeout_s=CLIENT_TIMEOUT_S,
                                  max_body_bytes=CAP, health_interval_s=60, connect_timeout_s=2, max_model_len=512)
        self.backend = RouterProxy([await self.raw.start()], "round_robin", retries=0, health_interval_s=60,
                                   connect_timeout_s=2, response_timeout_s=2)
        await self.client.start()
        await self.backend.start()

    async def _stop(self) -> None:
        await self.client.stop()
        await self.backend.stop()
        await self.good.stop()
        self.raw.server.close()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def live():
    proxies = LiveProxies()
    yield proxies
    proxies.close()


def exchange(port: int, data: bytes, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """Send ``data``; the answer as ``(status, body)`` (a ``100 Continue`` skipped): status 0 if the proxy
    closed without answering. A malformed or cut answer fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        raw = b""
        while chunk := s.recv(1 << 16):
            raw += chunk
    if not raw:
        return 0, b""
    while raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        raw = raw[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"answer without a complete head: {raw[:200]!r}"
    lines = head.split(b"\r\n")
    version, status = lines[0].split(b" ")[:2]
    assert version in (b"HTTP/1.1", b"HTTP/1.0", b"HTTP/0.9"), lines[0]  # 0.9: aiohttp's label for a versionless line
    lengths = [int(line.split(b":")[1]) for line in lines[1:] if line.lower().startswith(b"content-length:")]
    if lengths:
        assert len(lengths) == 1 and len(body) == lengths[0], (lines, len(body))
    return int(status), body


def _is_complete_head(data: bytes) -> bool:
    return b"\r\n\r\n" in data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=600))
def test_arbitrary_bytes_get_a_clean_answer(live, data):
    status, _ = exchange(live.client.port, data)
    assert status in CLIENT_STATUSES | {200, 404, 405} or (status == 0 and not _is_complete_head(data)), status


header_name = st.sampled_from(["Host", "Content-Length", "content-length", "Transfer-Encoding", "Expect", "X-A",
                               "Bad Name", "Content-Length ", ""])
header_value = st.one_of(st.sampled_from(["5", "05", "5_0", "+5", "-1", " 5", "5 ", "0x5", "5,5", "5, 6", "chunked",
                                          "gzip", "1" * 25, "", "\x00", "\x7f"]),
                         st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12))


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "P OST", "", "G\x00T"]),
       target=st.sampled_from(["/v1/completions", "/health", "x", "http://h/v1/completions", "/a b", ""]),
       version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/1.1 ", "http/1.1"]),
       headers=st.lists(st.tuples(header_name, header_value), max_size=5),
       body=st.binary(max_size=40))
def test_structured_requests_are_framed_strictly(live, method, target, version, headers, body):
    raw = (f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1") + body
    status, answer = exchange(live.client.port, raw)
    assert status in CLIENT_STATUSES | {200, 404, 405, 503} or status == 0, (status, answer)
    if status in CLIENT_STATUSES or status == 0:
        if status:
            assert json.loads(answer)["error"]["message"]  # every refusal names what is wrong, as JSON
        return
    # accepted (routed, or answered by path): the framing was exactly right
    assert all(k.strip() == k and k and " " not in k for k, _ in headers)
    assert not any(k.lower() == "transfer-encoding" for k, _ in headers)
    assert version in ("HTTP/1.1", "HTTP/1.0") and target.startswith(("/", "http://")) and " " not in target
    lengths = [v.strip() for k, v in headers if k.lower() == "content-length"]
    assert len(lengths) <= 1 and all(v.isdigit() and v.isascii() for v in lengths)
    if version == "HTTP/1.1":
        assert any(k.lower() == "host" for k, _ in headers)


@FUZZ
@given(st.integers(min_value=0, max_value=2 * CAP))
def test_content_length_against_the_cap(live, length):
    raw = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length + b"x" * length
    status, answer = exchange(live.client.port, raw)
    if length > CAP:
        assert status == 413 and b"at most 2000 bytes" in answer
    else:
        assert status == 400 and b"JSON" in answer  # read whole, then refused as JSON


@FUZZ
@given(st.binary(max_size=300))
def test_json_bytes_parse_or_400(data):
    try:
        parse_json(data)
    except HTTPError as exc:
        assert exc.status == 400


json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_value = st.recursive(json_scalar, lambda c: st.one_of(st.lists(c, max_size=4),
                                                           st.dictionaries(st.text(max_size=6), c, max_size=4)),
                          max_leaves=12)
field_name = st.sampled_from(sorted(NUMERIC_FIELDS) + ["prompt", "messages", "stream", "echo", "stream_options", "model"])


@FUZZ
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       payload=st.dictionaries(field_name, json_value, max_size=8),
       prompt=st.one_of(st.text(min_size=1, max_size=20), st.lists(st.integers(-5, 2**32), min_size=1, max_size=8)))
def test_payload_validation_bounds_every_number(path, payload, prompt):
    if path == "/v1/completions":
        payload.setdefault("prompt", prompt)
    else:
        payload.setdefault("messages", [{"role": "user", "content": "x"}])
    try:
        out = validate_payload(path, json.loads(json.dumps(payload)), max_model_len=512, max_n=16)
    except HTTPError as exc:
        assert exc.status == 400
        return
    for key, (integer, *_rest) in NUMERIC_FIELDS.items():
        v = out.get(key)
        if v is None or (key == "logprobs" and path.endswith("chat/completions")):
            continue
        assert not isinstance(v, bool) and (isinstance(v, int) if integer else math.isfinite(v))
    assert 1 <= _max_tokens(out) <= 512 and 1 <= _sequences(out) <= 16  # the proxy's KV accounting stays small


status_line = st.sampled_from(["HTTP/1.1 200 OK", "HTTP/1.1 200", "HTTP/1.0 503 Busy", "HTTP/1.1 2OO OK", "HTTP/3 200 OK",
                               "HTTP/1.1 99 x", "garbage"])


@FUZZ
@given(status=status_line, headers=st.lists(st.tuples(header_name, header_value), max_size=4), body=st.binary(max_size=80))
def test_backend_replies_are_relayed_or_502(live, status, headers, body):
    """Whatever a backend replies, the client gets it relayed as framed, or a 502 and the backend is marked
    down; never a 500, a hang or a broken answer."""
    live.raw.reply = (status + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1") + body

    async def reset() -> None:
        live.backend.backends[0].up = True

    live.call(reset())
    got, answer = exchange(live.backend.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n"
                           b'{"prompt": "x"}')
    if got == 502:
        assert not live.backend.backends[0].up and json.loads(answer)["error"]["message"]
        return
    assert got == int(status.split(" ")[1]) == 200, (got, answer)
    clean = all(k and k == k.strip() and " " not in k for k, _ in headers)
    lengths = [v for k, v in headers if k.lower() == "content-length"]
    if clean and not any(k.lower() == "transfer-encoding" for k, _ in headers):
        if lengths:
            assert answer == body[: int(lengths[0])]
        else:
            assert answer == body  # delimited by the connection's close


def _strict_dechunk(raw: bytes) -> bytes | None:
    """RFC 9112 chunked decoding without extensions or trailers: the body, or ``None`` if ``raw`` is not one."""
    out, pos = [], 0
    while True:
        end = raw.find(b"\r\n", pos)
        line = raw[pos:end]
        if end < 0 or not line or len(line) > 8 or not all(c in b"0123456789abcdefABCDEF" for c in line):
            return None
        size = int(line, 16)
        if size == 0:
            return b"".join(out) if raw[end + 2:] == b"\r\n" else None
        data = raw[end + 2:end + 2 + size]
        if len(data) != size or raw[end + 2 + size:end + 4 + size] != b"\r\n":
            return None
        out.append(data)
        pos = end + 4 + size


chunk_size_line = st.one_of(st.sampled_from(MALFORMED_CHUNK_SIZES), st.binary(max_size=6))
chunk_data = st.binary(max_size=24).map(lambda d: d.replace(b"\n", b""))  # no event end: nothing is relayed early


@FUZZ
@given(chunks=st.lists(st.tuples(st.booleans(), chunk_size_line, chunk_data), min_size=1, max_size=4),
       stream=st.booleans())
def test_chunked_replies_arriving_in_pieces_are_relayed_or_a_prompt_502(live, chunks, stream):
    """A chunked reply written a piece at a time after its head (each chunk, valid or with a malformed size
    line): a valid one is relayed whole; anything the parser refuses is a 502 at once (it used to hang the
    request forever, its slot held); either way the slot is free afterwards."""
    pieces = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
    for valid, line, data in chunks:
        pieces.append((b"%x" % len(data) if valid else line) + b"\r\n" + data + b"\r\n")
    pieces.append(b"0\r\n\r\n")
    expected = _strict_dechunk(b"".join(pieces[1:]))

    async def set_up(value: list[bytes] | None) -> None:
        live.raw.pieces = value
        if value is not None:
            live.backend.backends[0].up = True

    request = json.dumps({"prompt": "x", "stream": stream}).encode()
    live.call(set_up(pieces))
    try:
        t0 = time.monotonic()
        got, answer = exchange(live.backend.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                               % len(request) + request)
        took = time.monotonic() - t0
    finally:
        live.call(set_up(None))
    assert took < 1.5, took  # far below the backend proxy's 2 s deadlines: a refusal ends the attempt at once
    assert live.backend.backends[0].in_flight == 0
    if expected is not None:
        assert got == 200 and (dechunk(answer) if stream else answer) == expected, (got, answer)
    elif got == 502:
        assert not live.backend.backends[0].up and json.loads(answer)["error"]["message"]
    else:  # llhttp accepted what the strict reading refuses (a chunk extension, say): relayed as parsed
        assert got == 200, (got, answer)


def test_mutation_fuzzer_of_the_bench_finds_nothing():
    """The `moelab bench reliability` fuzzer (seeded byte mutations of valid requests, sent to a running
    proxy) on a small budget."""
    from moelab.bench.reliability import fuzz_proxy_server

    report = fuzz_proxy_server(300, seed=1)
    assert report["cases"] == 300 and report["unexpected"] == [] and report["n_unexpected"] == 0
    assert report["refused"] > 0 and report["accepted"] + report["refused"] + report["closed"] == 300


def test_bench_suite_figures_without_vllm(monkeypatch):
    """`moelab bench reliability` is registered and names every figure; without vLLM the soak ones say why."""
    import moelab.models.vllm_engine as vllm_engine
    from moelab.bench import BENCH_SUITES, run_suites

    monkeypatch.setattr(vllm_engine, "vllm_status", lambda: (False, "vLLM left out for this test"))
    assert "reliability" in BENCH_SUITES
    figs = {f.name: f for f in run_suites(["reliability"], quick=True)}
    assert {"fuzz_cases_run", "fuzz_unexpected", "proxy_recovers_after_cut_health", "soak_requests_ok",
            "soak_requests_lost", "soak_fd_growth", "proxy_p50_overhead_ms"} <= set(figs)
    assert figs["proxy_recovers_after_cut_health"].value == 1 and figs["proxy_recovers_after_cut_health"].met
    assert figs["fuzz_cases_run"].value == 1000 and figs["fuzz_unexpected"].value == 0 and figs["fuzz_unexpected"].met
    assert math.isnan(figs["soak_requests_lost"].value) and "left out" in figs["soak_requests_lost"].note
