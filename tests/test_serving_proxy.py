"""The router proxy's own behaviour, without vLLM: malformed requests, unreachable backends, limits,
metrics, loopback only. (Live servers: tests/test_vllm_live.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import pytest

from moelab.serving import RouterProxy, validate_payload
from moelab.serving.http import HTTPError


def _dead_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _raw(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def _post(path: str, payload: object) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_unreachable_backends_malformed_requests_and_metrics():
    async def go():
        proxy = RouterProxy([f"http://127.0.0.1:{_dead_port()}", f"http://127.0.0.1:{_dead_port()}"], "round_robin",
                            connect_timeout_s=1, health_interval_s=60, retries=1)
        _, port = await proxy.start()
        try:
            ok_body = {"model": "m", "prompt": "hello", "max_tokens": 4}
            status, body = await _raw(port, _post("/v1/completions", ok_body))
            assert status == 502 and b"ConnectionRefusedError" in body
            assert not any(b.up for b in proxy.backends)  # both tried, both marked down
            assert proxy.retried == 1
            status, body = await _raw(port, _post("/v1/completions", ok_body))
            assert status == 503 and b"no backend is up" in body
            assert (await _raw(port, b"GET /health HTTP/1.1\r\n\r\n"))[0] == 503
            assert (await _raw(port, _post("/v1/completions", b"{oops")))[0] == 400
            assert (await _raw(port, _post("/v1/completions", {"prompt": ""})))[0] == 400
            assert (await _raw(port, _post("/v1/completions", {"prompt": "x", "max_tokens": 0})))[0] == 400
            assert (await _raw(port, _post("/v1/chat/completions", {"messages": "hi"})))[0] == 400
            assert (await _raw(port, b"GET /v1/completions HTTP/1.1\r\n\r\n"))[0] == 405
            assert (await _raw(port, b"GET /nowhere HTTP/1.1\r\n\r\n"))[0] == 404
            assert (await _raw(port, b"POST /v1/completions HTTP/1.1\r\n\r\n"))[0] == 411
            assert (await _raw(port, b"GARBAGE\r\n\r\n"))[0] == 400
            big = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"
            assert (await _raw(port, big))[0] == 413
            status, body = await _raw(port, b"GET /metrics.json HTTP/1.1\r\n\r\n")
            m = json.loads(body)
            assert status == 200 and m["router"] == "round_robin" and len(m["backends"]) == 2
            assert m["backends"][0]["failed"] == 1 and m["backends"][0]["marked_down"] == 1
            assert m["responses_by_status"]["502"] == 1 and m["responses_by_status"]["400"] == 5
            status, body = await _raw(port, b"GET /metrics HTTP/1.1\r\n\r\n")
            text = body.decode()
            assert 'moelab_proxy_backend_up{backend="0"' in text and "# TYPE moelab_proxy_routed_total counter" in text
            assert 'moelab_proxy_responses_total{code="502"} 1' in text
        finally:
            await proxy.stop()

    run(go())


def test_client_that_never_sends_times_out():
    async def go():
        proxy = RouterProxy([f"http://127.0.0.1:{_dead_port()}"], client_timeout_s=0.3, health_interval_s=60)
        _, port = await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\n")  # head never finished
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
