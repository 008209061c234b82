"""The router proxy's own behaviour, without vLLM: malformed requests, unreachable backends, limits,
metrics, loopback only. (Live servers: tests/test_vllm_live.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys

import numpy as np
import pytest

from moelab.bench.reliability import BackendInThread, FaultyBackend, dechunk
from moelab.serving import RouterProxy, validate_payload
from moelab.serving.proxy import HTTPError


def _dead_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _raw(port: int, data: bytes, timeout: float = 10.0, *, to_eof: bool = True) -> tuple[int, bytes]:
    """Send raw bytes; the answer's status and body. The proxy closes every connection after its answer
    (so reading to EOF also waits until the request is counted); ``to_eof=False`` reads only up to the
    answer's Content-Length (for an early answer while the proxy still drains an announced body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
        body = await asyncio.wait_for(reader.readexactly(lengths[0]) if lengths and not to_eof else reader.read(), timeout)
    finally:
        writer.close()
    return int(head.split(b" ")[1]), body


def _post(path: str, payload: object) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_unreachable_backends_malformed_requests_and_metrics():
    async def go():
        backends = [ScriptedBackend(), ScriptedBackend()]
        proxy, port = await _proxy_over(*backends, retries=1)
        for be in backends:  # up at start, gone after: the next request finds both refusing connections
            await be.stop()
        try:
            ok_body = {"model": "m", "prompt": "hello", "max_tokens": 4}
            status, body = await _raw(port, _post("/v1/completions", ok_body))
            assert status == 502 and b"ConnectionRefusedError" in body
            assert not any(b.up for b in proxy.backends)  # both tried, both marked down
            assert proxy.retried == 1
            status, body = await _raw(port, _post("/v1/completions", ok_body))
            assert status == 503 and b"no backend is up" in body
            assert (await _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 503
            assert (await _raw(port, _post("/v1/completions", b"{oops")))[0] == 400
            assert (await _raw(port, _post("/v1/completions", {"prompt": ""})))[0] == 400
            assert (await _raw(port, _post("/v1/completions", {"prompt": "x", "max_tokens": 0})))[0] == 400
            assert (await _raw(port, _post("/v1/chat/completions", {"messages": "hi"})))[0] == 400
            assert (await _raw(port, b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 405
            assert (await _raw(port, b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 404
            assert (await _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 411
            status, body = await _raw(port, b"GARBAGE\r\n\r\n")
            assert status == 400 and json.loads(body)["error"]["message"]  # the parser's refusal, as JSON
            big = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
            assert (await _raw(port, big, to_eof=False))[0] == 413
            status, body = await _raw(port, b"GET /metrics.json HTTP/1.1\r\nHost: x\r\n\r\n")
            m = json.loads(body)
            assert status == 200 and m["router"] == "round_robin" and len(m["backends"]) == 2
            assert m["backends"][0]["failed"] == 1 and m["backends"][0]["marked_down"] == 1
            assert m["responses_by_status"]["502"] == 1 and m["responses_by_status"]["400"] == 5
            status, body = await _raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            text = body.decode()
            assert 'moelab_proxy_backend_up{backend="0"' in text and "# TYPE moelab_proxy_routed_total counter" in text
            assert 'moelab_proxy_responses_total{code="502"} 1' in text
        finally:
            await proxy.stop()

    run(go())


def test_backends_unreachable_at_start_are_named_and_marked_down():
    async def go():
        good = ScriptedBackend()
        url = await good.start()
        dead = f"http://127.0.0.1:{_dead_port()}"
        proxy = RouterProxy([dead, url], "round_robin", health_interval_s=60, connect_timeout_s=2)
        _, port = await proxy.start()
        try:
            assert [b.index for b in proxy.down_at_start] == [0] and "ConnectionRefusedError" in proxy.backends[0].last_error
            status, body = await _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200 and json.loads(body)["down"][0]["url"] == dead
            for prompt in ("a", "b", "c"):
                assert (await _raw(port, _post("/v1/completions", {"prompt": prompt})))[0] == 200
            assert good.completions == 3 and proxy.retried == 0
        finally:
            await proxy.stop()
            await good.stop()

    run(go())


def test_client_that_never_sends_times_out():
    """A client that never finishes its request head is disconnected after client_timeout_s; one that never
    sends the body its Content-Length announced gets a 408."""
    async def go():
        proxy = RouterProxy([f"http://127.0.0.1:{_dead_port()}"], client_timeout_s=0.3, health_interval_s=60)
        _, port = await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\n")  # head never finished
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy, well within 5 s
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
            raw = await asyncio.wait_for(reader.read(), 5)
            assert raw.startswith(b"HTTP/1.1 408")
            writer.close()
        finally:
            await proxy.stop()

    run(go())


def test_validation_and_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        RouterProxy(["http://127.0.0.1:1"], host="0.0.0.0")
    with pytest.raises(ValueError, match="loopback"):
        RouterProxy(["http://10.1.2.3:8000"])
    with pytest.raises(ValueError, match="backend URL"):
        RouterProxy(["127.0.0.1:8000"])
    with pytest.raises(ValueError, match="at least one"):
        RouterProxy([])
    with pytest.raises(ValueError, match="router must be one of"):
        RouterProxy(["http://127.0.0.1:1"], "nope")
    with pytest.raises(ValueError, match="router must be one of"):
        RouterProxy(["http://127.0.0.1:1"], "domain_oracle")  # needs a domain label no live request carries
    with pytest.raises(ValueError, match="signature"):
        RouterProxy(["http://127.0.0.1:1"], "eldr")
    with pytest.raises(ValueError, match="max_inflight"):
        RouterProxy(["http://127.0.0.1:1"], max_inflight=0)
    assert validate_payload("/v1/completions", {"prompt": [1, 2, 3]})["prompt"] == [1, 2, 3]
    with pytest.raises(HTTPError) as exc:
        validate_payload("/v1/completions", {"prompt": ["a", "b"]})
    assert exc.value.status == 400


def test_cli_errors_without_starting(capsys):
    from moelab.serving.proxy import main

    assert main(["--backend", "http://127.0.0.1:1", "--router", "eldr"]) == 2
    assert "--signature-url" in capsys.readouterr().err


def test_import_needs_no_torch_or_vllm():
    import subprocess

    code = "import sys, moelab.serving.proxy, moelab.serving.signatures; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def _synthetic_trace(n: int = 12, L: int = 3, E: int = 8, k: int = 2, seed: int = 0):
    """A small SYNTHETIC ExpertTrace (random routing), only to exercise the ELDR wiring."""
    import numpy as np

    from moelab.traces import ExpertTrace, Geometry

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 100, size=int(p)) for p in rng.integers(4, 12, size=n)]
    pre = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in p]) for p in prompts]
    counts = np.stack([np.stack([np.bincount(x[:, j].ravel(), minlength=E) for j in range(L)]) for x in pre])
    dec = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(5)]) for _ in range(n)]
    return ExpertTrace.from_requests(request_ids=[f"s{i}" for i in range(n)], domains=["synthetic"] * n,
                                     prompt_tokens=prompts, prefill_counts=counts, decode_ids=dec,
                                     geometry=Geometry(L, E, k, "synthetic"), prefill_ids=pre)


def test_eldr_cli_wiring_and_unreachable_signature_service(tmp_path):
    from moelab.serving.proxy import build_parser, build_proxy

    path = _synthetic_trace().save(tmp_path / "calib")
    args = build_parser().parse_args(["-b", f"http://127.0.0.1:{_dead_port()}", "-b", f"http://127.0.0.1:{_dead_port()}",
                                      "--router", "eldr", "--signature-url", f"http://127.0.0.1:{_dead_port()}",
                                      "--eldr-calibration", str(path), "--port", "0"])
    proxy = build_proxy(args)
    assert proxy.router.name == "eldr" and proxy.router.centroids.shape[0] == 2

    async def go():
        _, port = await proxy.start()
        try:
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "hello", "max_tokens": 2}))
            assert status == 502 and b"signature service failed" in body
            assert all(b.routed == 0 for b in proxy.backends)  # nothing routed without a signature
        finally:
            await proxy.stop()

    run(go())


def test_serve_router_command_runs_and_reports_health():
    import subprocess
    import time
    import urllib.error
    import urllib.request

    port = _dead_port()
    proc = subprocess.Popen([sys.executable, "-m", "moelab.cli", "serve-router", "-b", f"http://127.0.0.1:{_dead_port()}",
                             "--port", str(port), "--health-interval", "0.2"], stdout=subprocess.PIPE, text=True)
    try:
        assert "serve-router: jsq over 1 backend(s)" in proc.stdout.readline()
        deadline, status = time.monotonic() + 20, None
        while time.monotonic() < deadline and status != 503:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status
            except urllib.error.HTTPError as exc:
                status = exc.code
            time.sleep(0.1)
        assert status == 503  # the health loop found the only backend dead
    finally:
        proc.terminate()
        proc.wait(10)


# ---------------------------------------------------------------------- hostile input and broken backends
class ScriptedBackend:
    """A loopback HTTP server answering like a vLLM server would, scripted per test: ``/health`` and
    ``/v1/models`` (``max_model_len`` 512), and completions that echo the prompt. A prompt ``"hold"`` waits
    for :attr:`release`; ``head`` replaces the completion's response head (a broken backend)."""

    def __init__(self, head: bytes | None = None) -> None:
        self.head = head
        self.release = asyncio.Event()
        self.completions = 0
        self.server = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.release.set()
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader, writer) -> None:
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
            path = lines[0].split(" ")[1]
            length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0)
            body = await reader.readexactly(length)
            if path == "/health":
                out = b"{}"
            elif path == "/v1/models":
                out = json.dumps({"data": [{"id": "scripted", "max_model_len": 512}]}).encode()
            else:
                prompt = json.loads(body)["prompt"]
                self.completions += 1
                if prompt == "hold":
                    await self.release.wait()
                if self.head is not None:
                    writer.write(self.head + b"{}")
                    return
                out = json.dumps({"choices": [{"text": f"echo:{prompt}"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()


async def _proxy_over(*backends: ScriptedBackend, **kw) -> tuple[RouterProxy, int]:
    urls = [await b.start() for b in backends]
    proxy = RouterProxy(urls, "round_robin", health_interval_s=60, connect_timeout_s=2, **kw)
    return proxy, (await proxy.start())[1]


def test_out_of_range_numbers_are_400_and_cannot_disturb_other_requests():
    """max_tokens=10**30 used to pass and, while in flight, turn every other request into a 500 (OverflowError)."""
    async def go():
        be = ScriptedBackend()
        proxy, port = await _proxy_over(be)
        try:
            bad = asyncio.create_task(_raw(port, _post("/v1/completions", {"prompt": "hold", "max_tokens": 10**30})))
            await asyncio.sleep(0.2)
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "good", "max_tokens": 4}))
            assert status == 200 and json.loads(body)["choices"][0]["text"] == "echo:good"
            be.release.set()
            status, body = await bad
            assert status == 400 and b"max_tokens" in body and b"512" in body
            assert proxy.max_model_len == 512  # learnt from the backend's /v1/models
            cases = [{"max_tokens": 513}, {"max_tokens": 2.5}, {"max_tokens": True}, {"n": 10**6}, {"n": 0},
                     {"best_of": 10**40}, {"temperature": 2.0000001}, {"temperature": -1}, {"temperature": "hot"},
                     {"top_p": 0}, {"top_p": 1.5}, {"seed": 1 << 64}, {"logprobs": 10**9}, {"min_tokens": -1},
                     {"presence_penalty": 3}, {"repetition_penalty": 0}, {"top_k": -5}, {"stream": "yes"},
                     {"prompt": [1, 2, -3]}, {"prompt": [1 << 40]}, {"prompt": [1] * 500, "max_tokens": 100},
                     {"n": 2, "best_of": 1}, {"truncate_prompt_tokens": 10**20}]
            for extra in cases:
                payload = {"prompt": "x", **extra}
                status, body = await _raw(port, _post("/v1/completions", payload))
                key = next(iter(extra))
                assert status == 400 and key.encode() in body, (extra, status, body)
            for raw in (b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "max_tokens": Infinity}',
                        b'{"prompt": "x", "max_tokens": 1, "max_tokens": 99999999999}', b'{"prompt": "x", "n": '
                        + b"9" * 5000 + b"}", b"[" * 200_000 + b"]" * 200_000, b'{"prompt": "\xff"}'):
                status, body = await _raw(port, _post("/v1/completions", raw))
                assert status == 400 and b"JSON" in body, (raw[:60], status, body)
            status, _ = await _raw(port, _post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                        "logprobs": 3}))
            assert status == 400
            # the edges of every range pass
            ok = {"prompt": [1, 2], "max_tokens": 510, "n": 16, "best_of": 16, "temperature": 2, "top_p": 1, "seed": -(1 << 63),
                  "logprobs": 20, "top_k": -1, "min_p": 0, "presence_penalty": -2, "max_completion_tokens": None}
            assert (await _raw(port, _post("/v1/completions", ok)))[0] == 200
            assert proxy.metrics()["responses_by_status"] == {"200": 2, "400": 31}
            assert all(b.in_flight == 0 and b.kv_tokens == 0 for b in proxy.backends)
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


def test_oversized_body_gets_a_413_the_client_reads():
    """The 413 used to be written and the socket closed with the body unread: the client saw a reset."""
    async def go():
        proxy = RouterProxy([f"http://127.0.0.1:{_dead_port()}"], health_interval_s=60)
        _, port = await proxy.start()

        def send_all_then_read() -> bytes:
            body = b'{"prompt": "' + b"x" * (10 << 20) + b'"}'
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            return out

        try:
            raw = await asyncio.to_thread(send_all_then_read)
            assert raw.startswith(b"HTTP/1.1 413") and b"at most 1048576 bytes" in raw
        finally:
            await proxy.stop()

    run(go())


def test_strict_request_framing():
    async def go():
        be = ScriptedBackend()
        proxy, port = await _proxy_over(be)
        body = b'{"prompt": "framing test payload of fifty bytes."}'
        assert len(body) == 50

        def req(*headers: str) -> bytes:
            return ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode() + body

        try:
            assert (await _raw(port, req("Content-Length: 50")))[0] == 200
            for headers in (["Content-Length: 50", "Content-Length: 50"],  # equal duplicates too (RFC 9112 allows refusing)
                            ["Content-Length: 5_0"], ["Content-Length: +50"], ["Content-Length: 0x32"], ["Content-Length: 5 0"],
                            ["Content-Length: -1"], ["Content-Length: 50", "Content-Length: 49"], ["Content-Length: 50, 51"],
                            ["Content-Length: 1" + "0" * 30], ["Content-Length: 50", "Transfer-Encoding: chunked"],
                            ["Content-Length : 50"], ["Content-Length: 50", " folded: line"], ["Bad Name: 1", "Content-Length: 50"],
                            ["Transfer-Encoding: gzip"], ["Transfer-Encoding: chunked"]):  # neither a gzip nor a chunked body
                status, resp = await _raw(port, req(*headers))
                assert status == 400, (headers, status, resp)
            chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n" + body + b"\r\n0\r\n\r\n"
            assert (await _raw(port, chunked))[0] == 411  # a well-formed chunked body: not supported
            assert (await _raw(port, b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n"))[0] == 400
            assert (await _raw(port, b"GET health HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 400
            assert (await _raw(port, b"GET /health HTTP/1.1\r\n\r\n"))[0] == 400  # HTTP/1.1 needs Host
            assert be.completions == 1
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                                  b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n"])
def test_broken_backend_response_is_502_and_marks_it_down(head):
    """A backend's `Content-Length: abc` used to be a 500 that left the backend up."""
    async def go():
        broken, good = ScriptedBackend(head), ScriptedBackend()
        proxy, port = await _proxy_over(broken, good)
        try:
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "a", "max_tokens": 2}))
            assert status == 200 and b"echo:a" in body  # retried on the good backend
            assert not proxy.backends[0].up and proxy.backends[0].marked_down == 1 and proxy.retried == 1
            assert proxy.backends[1].up
            proxy.backends[1].up = False
            proxy.backends[0].up = True
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "b", "max_tokens": 2}))
            assert status == 502 and b"backend 0" in body, body
            assert proxy.status_counts == {200: 1, 502: 1}
        finally:
            await proxy.stop()
            await broken.stop()
            await good.stop()

    run(go())


def test_metrics_count_only_real_requests():
    async def go():
        be = ScriptedBackend()
        proxy, port = await _proxy_over(be)
        try:
            for _ in range(5):  # bare TCP connect/close: no request, nothing counted
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
            await asyncio.sleep(0.2)
            assert (await _raw(port, _post("/v1/completions", {"prompt": "a"})))[0] == 200
            assert (await _raw(port, b"GET /metrics.json HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 200
            assert proxy.status_counts == {200: 2}
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


def test_queue_full_and_queue_timeout_are_503():
    async def go():
        be = ScriptedBackend()
        proxy, port = await _proxy_over(be, max_inflight=1, max_queue=1, queue_timeout_s=0.5)
        try:
            holding = asyncio.create_task(_raw(port, _post("/v1/completions", {"prompt": "hold"})))
            while proxy.backends[0].in_flight == 0:
                await asyncio.sleep(0.01)
            queued = asyncio.create_task(_raw(port, _post("/v1/completions", {"prompt": "q"})))
            while proxy.waiting == 0:
                await asyncio.sleep(0.01)
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "full"}))
            assert status == 503 and b"queue is full" in body and proxy.rejected_queue_full == 1
            status, body = await queued
            assert status == 503 and b"queue_timeout_s=0.5" in body and proxy.timed_out_in_queue == 1
            be.release.set()
            assert (await holding)[0] == 200
            prom = proxy.prometheus()
            assert 'rejected_total{reason="queue_full"} 1' in prom and 'rejected_total{reason="queue_timeout"} 1' in prom
            assert proxy.waiting == 0 and proxy.backends[0].in_flight == 0 and be.completions == 1
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


# ---------------------------------------------------------------------- faults: a proxy that degrades, never dies
def _completion_ok(body: bytes, stream: bool) -> bool:
    """A whole answer of the well-behaved fake backend (an echo, or a stream ending in [DONE])."""
    return (dechunk(body).rstrip().endswith(b"data: [DONE]") if stream
            else json.loads(body)["choices"][0]["text"].startswith("echo:"))


@pytest.mark.parametrize("mode", ["cut_body", "cut_chunked", "hang", "status_503"])
def test_cut_or_silent_backend_replies_are_retried_and_mark_it_down(mode):
    """A reply cut inside its Content-Length body or inside a chunk (EOF mid-body), a silent one and a 503:
    each marks that backend down and the request (streamed or not) is answered whole by another one."""
    async def go():
        bad, good = FaultyBackend(completion=mode), FaultyBackend()
        proxy = RouterProxy([await bad.start(), await good.start()], "jsq", health_interval_s=60, connect_timeout_s=2,
                            response_timeout_s=0.5)
        _, port = await proxy.start()
        try:
            for stream in (False, True):
                hits = bad.requests["/v1/completions"]
                for attempt in range(8):  # until the router has picked the bad backend once
                    proxy.backends[0].up = True
                    status, body = await _raw(port, _post("/v1/completions", {"prompt": f"p{attempt}", "stream": stream}))
                    assert status == 200 and _completion_ok(body, stream), (mode, stream, status, body[:200])
                    if bad.requests["/v1/completions"] > hits:
                        break
                assert bad.requests["/v1/completions"] > hits and not proxy.backends[0].up, (mode, stream)
            assert proxy.backends[0].marked_down >= 2 and proxy.retried >= 2 and proxy.backends[1].up
            assert all(b.in_flight == 0 and b.kv_tokens == 0 for b in proxy.backends)
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    run(go())


def test_stream_cut_after_its_first_event_is_closed_unfinished():
    """Bytes of the stream reached the client: it cannot be replayed, so the client's connection is closed
    without the stream's last chunk (it sees an unfinished stream, never a complete-looking one)."""
    async def go():
        bad = FaultyBackend(completion="cut_after_event")
        proxy = RouterProxy([await bad.start()], health_interval_s=60, connect_timeout_s=2)
        _, port = await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post("/v1/completions", {"prompt": "x", "stream": True}))
            raw = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert raw.startswith(b"HTTP/1.1 200") and b"data: " in raw
            assert not raw.endswith(b"0\r\n\r\n") and b"[DONE]" not in raw
            assert not proxy.backends[0].up and proxy.status_counts == {502: 1}
        finally:
            await proxy.stop()
            await bad.stop()

    run(go())


def test_client_that_never_reads_loses_its_stream_not_the_backend_slot():
    async def go():
        be = FaultyBackend(stream_bytes=48 << 20)
        proxy = RouterProxy([await be.start()], max_inflight=1, health_interval_s=60, connect_timeout_s=2,
                            client_write_timeout_s=0.5)
        _, port = await proxy.start()
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            await asyncio.get_running_loop().sock_sendall(sock, _post("/v1/completions", {"prompt": "x", "stream": True}))
            while proxy.backends[0].in_flight == 0:
                await asyncio.sleep(0.01)
            t0 = asyncio.get_running_loop().time()
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "next"}))  # waits for the one slot
            assert status == 200 and b"echo:next" in body
            assert asyncio.get_running_loop().time() - t0 < 10
            assert proxy.slow_clients_dropped == 1 and proxy.backends[0].up  # the client's fault, not the backend's
            assert proxy.status_counts.get(499) == 1 and proxy.backends[0].in_flight == 0
        finally:
            sock.close()
            await proxy.stop()
            await be.stop()

    run(go())


@pytest.mark.parametrize("health", ["cut_chunked", "cut_body", "hang", "status_503"])
def test_health_replies_that_lie_mark_down_and_recovery_follows(health):
    """A /health reply cut inside its body, one that never ends, or a 503: the backend is marked down and
    the proxy keeps answering; once the replies are whole it is marked up again."""
    async def go():
        bad, good = FaultyBackend(health=health, hang_s=5), FaultyBackend()
        proxy = RouterProxy([await bad.start(), await good.start()], "round_robin", health_interval_s=0.05,
                            connect_timeout_s=0.3)
        _, port = await proxy.start()
        try:
            for _ in range(200):
                if not proxy.backends[0].up:
                    break
                await asyncio.sleep(0.02)
            assert not proxy.backends[0].up and "health check" in proxy.backends[0].last_error
            status, body = await _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200 and json.loads(body)["down"][0]["index"] == 0
            assert (await _raw(port, _post("/v1/completions", {"prompt": "a"})))[0] == 200
            bad.health = "ok"
            for _ in range(200):
                if proxy.backends[0].up:
                    break
                await asyncio.sleep(0.02)
            assert proxy.backends[0].up and proxy.health_round_errors == 0 and proxy.health_loop_restarts == 0
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    run(go())


def test_health_loop_survives_an_error_and_being_killed(caplog):
    async def go():
        be = FaultyBackend()
        proxy = RouterProxy([await be.start()], health_interval_s=0.05, connect_timeout_s=1)
        await proxy.start()
        real_check = proxy.check_health
        calls = 0

        async def check_that_fails_once() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in one health round")
            await real_check()

        proxy.check_health = check_that_fails_once
        try:
            for _ in range(200):
                if calls >= 3:
                    break
                await asyncio.sleep(0.02)
            assert calls >= 3 and proxy.health_round_errors == 1  # logged, and the loop went on
            killed = proxy._health_task
            killed.cancel()  # kill the loop on purpose: the supervisor starts another
            await asyncio.sleep(0.1)
            assert proxy.health_loop_restarts == 1 and proxy._health_task is not killed and not proxy._health_task.done()
            proxy.backends[0].up = False
            for _ in range(200):
                if proxy.backends[0].up:
                    break
                await asyncio.sleep(0.02)
            assert proxy.backends[0].up  # the new loop brings backends back
            assert proxy.metrics()["health_loop_restarts"] == 1
        finally:
            await proxy.stop()
            await be.stop()
        assert proxy._health_task.done() and proxy.health_loop_restarts == 1  # stop() is not restarted

    with caplog.at_level("ERROR", logger="moelab.serving.proxy"):
        run(go())
    assert "a bug in one health round" in caplog.text and "starting it again" in caplog.text


def test_start_up_with_a_models_reply_cut_inside_its_chunked_body():
    """This used to end `moelab serve-router` with a traceback at start-up: it now serves with the rest and
    says which backend is down (in the API and on the command line)."""
    async def go():
        bad, good = FaultyBackend(models="cut_chunked"), FaultyBackend()
        proxy = RouterProxy([await bad.start(), await good.start()], health_interval_s=60, connect_timeout_s=2)
        _, port = await proxy.start()
        try:
            assert [b.index for b in proxy.down_at_start] == [0] and "/v1/models" in proxy.backends[0].last_error
            assert proxy.max_model_len == 512  # learnt from the backend that answered
            assert (await _raw(port, _post("/v1/completions", {"prompt": "a"})))[0] == 200
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    run(go())

    import subprocess

    bad = BackendInThread(FaultyBackend(models="cut_chunked"))
    proc = subprocess.Popen([sys.executable, "-m", "moelab.cli", "serve-router", "-b", bad.url, "--port", str(_dead_port())],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "serve-router: jsq over 1 backend(s)" in proc.stdout.readline()
        line = proc.stdout.readline()
        assert f"backend 0 ({bad.url}) is down at start" in line and "/v1/models" in line
        assert proc.poll() is None  # still serving
    finally:
        proc.terminate()
        proc.wait(10)
        bad.stop()


def test_signature_service_with_a_cut_reply_is_a_502(tmp_path):
    from moelab.serving.proxy import build_parser, build_proxy

    async def go():
        cut = FaultyBackend(completion="cut_chunked")
        path = _synthetic_trace().save(tmp_path / "calib")
        args = build_parser().parse_args(["-b", f"http://127.0.0.1:{_dead_port()}", "--router", "eldr", "--signature-url",
                                          await cut.start(), "--eldr-calibration", str(path), "--port", "0"])
        proxy = build_proxy(args)
        _, port = await proxy.start()
        try:
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "hello", "max_tokens": 2}))
            assert status == 502 and b"signature service failed" in body
        finally:
            await proxy.stop()
            await cut.stop()

    run(go())


def test_kept_connection_closed_by_the_backend_is_retried_fresh_and_not_held_against_it():
    """The proxy keeps backend connections alive; a backend may close an idle one just as a request is sent on it.
    This backend answers the first request of every connection and keeps it open, then closes it on the next
    request without answering: that request must be answered (sent again on a fresh connection, to the same
    and only backend) and the backend stays up with no failed attempt."""
    seen = {"connections": 0, "completions": 0}

    async def handle(reader, writer) -> None:
        seen["connections"] += 1
        try:
            for n_on_connection in range(2):
                lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                if n_on_connection == 1:
                    return  # closed without an answer, as a server closing an idle connection does
                if lines[0].startswith("POST"):
                    seen["completions"] += 1
                    out = json.dumps({"choices": [{"text": "echo:" + json.loads(body)["prompt"]}]}).encode()
                else:
                    out = json.dumps({"data": [{"id": "kept", "max_model_len": 512}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out)
                             + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        proxy = RouterProxy([f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"], "round_robin",
                            health_interval_s=60, connect_timeout_s=2, retries=0)
        port = (await proxy.start())[1]
        try:
            for i in range(3):
                status, body = await _raw(port, _post("/v1/completions", {"prompt": f"p{i}", "max_tokens": 2}))
                assert status == 200 and json.loads(body)["choices"][0]["text"] == f"echo:p{i}", (status, body)
            b = proxy.metrics()["backends"][0]
            assert b["up"] and b["failed"] == 0 and b["marked_down"] == 0 and b["completed"] == 3, b
            assert seen["completions"] == 3 and seen["connections"] >= 3, seen
        finally:
            await proxy.stop()
            server.close()
            await server.wait_closed()

    run(go())


def test_a_router_that_fails_answers_that_request_with_a_named_500_and_frees_nothing_it_did_not_take():
    """A user's router that raises or answers a worker out of range fails the request it routed, by name; the
    proxy keeps serving (every slot free, the next request routed by the same router when it answers well)."""
    from moelab.routing import Router

    class Flaky(Router):
        name = "test_flaky"
        answers = iter(["raise", 7, 0])

        def route_batch(self, batch, view):
            a = next(self.answers)
            if a == "raise":
                raise RuntimeError("boom")
            return np.array([a])

    async def go():
        be = ScriptedBackend()
        url = await be.start()
        proxy = RouterProxy([url], Flaky(), health_interval_s=60, connect_timeout_s=2)
        port = (await proxy.start())[1]
        try:
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "a", "max_tokens": 2}))
            assert status == 500 and b"test_flaky" in body and b"boom" in body, body
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "b", "max_tokens": 2}))
            assert status == 500 and b"test_flaky" in body, body
            status, body = await _raw(port, _post("/v1/completions", {"prompt": "c", "max_tokens": 2}))
            assert status == 200 and json.loads(body)["choices"][0]["text"] == "echo:c"
            assert all(b.in_flight == 0 and b.kv_tokens == 0 for b in proxy.backends)
        finally:
            await proxy.stop()
            await be.stop()

    run(go())
