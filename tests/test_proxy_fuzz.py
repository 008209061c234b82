"""Property/fuzz tests (hypothesis, bounded example counts) of the router proxy's request parser, its
HTTP framing in both directions and its payload validation: whatever bytes arrive, the answer is a
parsed request or a clean HTTP error, never another exception; what is accepted is what was framed."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from moelab.serving.http import (  # noqa: E402
    MAX_DIGITS,
    BackendProtocolError,
    HTTPError,
    iter_body,
    parse_json,
    parse_response_head,
    read_request,
)
from moelab.serving.proxy import NUMERIC_FIELDS, _max_tokens, _sequences, validate_payload  # noqa: E402

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLIENT_STATUSES = {400, 408, 411, 413, 501}


def _parse(data: bytes, max_body_bytes: int = 4096):
    async def go():
        reader = asyncio.StreamReader(limit=64 * 1024)
        reader.feed_data(data)
        reader.feed_eof()
        return await read_request(reader, max_body_bytes=max_body_bytes, timeout_s=1.0)

    return asyncio.run(go())


def _outcome(data: bytes, **kw):
    try:
        return _parse(data, **kw)
    except HTTPError as exc:
        assert exc.status in CLIENT_STATUSES, exc.status
        return exc


@FUZZ
@given(st.binary(max_size=600))
def test_arbitrary_bytes_parse_or_fail_cleanly(data):
    _outcome(data)


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
def test_structured_requests_are_framed_strictly(method, target, version, headers, body):
    raw = (f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1") + body
    got = _outcome(raw)
    if isinstance(got, HTTPError) or got is None:
        return
    # accepted: the framing was exactly right and the body is what Content-Length said
    lengths = [v.strip() for k, v in headers if k.lower() == "content-length"]
    assert all(k.strip() == k and k and " " not in k for k, _ in headers)
    assert not any(k.lower() == "transfer-encoding" for k, _ in headers)
    assert version in ("HTTP/1.1", "HTTP/1.0") and target.startswith(("/", "http://")) and " " not in target
    if lengths:
        assert all(v.isdigit() and len(v) <= MAX_DIGITS and v.isascii() for v in lengths)
        assert len({int(v) for v in lengths}) == 1
        assert got.body == body[: int(lengths[0])] and len(got.body) == int(lengths[0])
    else:
        assert got.body == b"" and method not in ("POST", "PUT")


@FUZZ
@given(st.integers(min_value=0, max_value=3000), st.integers(min_value=1, max_value=2000))
def test_content_length_against_the_cap(length, cap):
    raw = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % length + b"x" * length
    got = _outcome(raw, max_body_bytes=cap)
    if length > cap:
        assert isinstance(got, HTTPError) and got.status == 413 and got.unread == length
    else:
        assert got.body == b"x" * length


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
def test_backend_responses_relay_or_raise_protocol_errors(status, headers, body):
    lines = [status.encode()] + [f"{k}: {v}".encode("latin-1") for k, v in headers]
    try:
        head = parse_response_head(lines)
    except BackendProtocolError:
        return

    async def read_all() -> bytes:
        reader = asyncio.StreamReader(limit=64 * 1024)
        reader.feed_data(body)
        reader.feed_eof()
        return b"".join([c async for c in iter_body(reader, head, 1.0)])

    try:
        got = asyncio.run(read_all())
    except (ConnectionError, asyncio.IncompleteReadError):  # BackendProtocolError is a ConnectionError
        return
    if head.content_length is not None and not head.chunked and head.status not in (204, 304):
        assert got == body[: head.content_length]
    elif not head.chunked and head.status not in (204, 304):
        assert got == body


def test_mutation_fuzzer_of_the_bench_finds_nothing():
    """The `moelab bench reliability` fuzzer (seeded byte mutations of valid requests) on a small budget."""
    from moelab.bench.reliability import fuzz_proxy_parser

    report = fuzz_proxy_parser(300, seed=1)
    assert report["cases"] == 300 and report["unexpected"] == [] and report["accepted"] > 0 and report["refused"] > 0


def test_bench_suite_figures_without_vllm(monkeypatch):
    """`moelab bench reliability` is registered and names every figure; without vLLM the soak ones say why."""
    import moelab.models.vllm_engine as vllm_engine
    from moelab.bench import BENCH_SUITES, run_suites

    monkeypatch.setattr(vllm_engine, "vllm_status", lambda: (False, "vLLM left out for this test"))
    assert "reliability" in BENCH_SUITES
    figs = {f.name: f for f in run_suites(["reliability"], quick=True)}
    assert {"fuzz_cases_run", "fuzz_unexpected", "soak_requests_ok", "soak_requests_lost", "soak_fd_growth",
            "proxy_p50_overhead_ms"} <= set(figs)
    assert figs["fuzz_cases_run"].value == 1000 and figs["fuzz_unexpected"].value == 0 and figs["fuzz_unexpected"].met
    assert math.isnan(figs["soak_requests_lost"].value) and "left out" in figs["soak_requests_lost"].note
