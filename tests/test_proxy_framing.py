"""The proxy cannot be hung by a backend, nor confused by a client's framing (issue 37, item 4).

Real sockets on 127.0.0.1 only: raw asyncio backends that write malformed chunk-size lines (stream or not) and
then hold their connection open, backends that never answer or trickle their bytes, and raw clients that omit
``Content-Length`` or half-close mid-body. Every deadline given to the proxy here is far longer than the time a
test allows, where the point is that an attempt ends at once (a parser's refusal), not at a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest

from moelab.bench.reliability import MALFORMED_CHUNK_SIZES, FaultyBackend, dechunk
from moelab.serving.client import ReplyFramingError, fails_fast, new_session, read_bounded
from moelab.serving.proxy import RouterProxy, build_parser, build_proxy, main

LONG = 60.0  # a deadline no test waits for: an answer within FAST seconds proves the attempt ended by itself
FAST = 5.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def _post(payload: object, path: str = "/v1/completions") -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def _exchange(port: int, data: bytes, *, half_close: bool = False, timeout: float = FAST) -> tuple[int, bytes, float]:
    """Send ``data`` (then end the sending side if ``half_close``), read until the proxy closes: ``(status,
    raw body, seconds)``; status 0 when nothing came back."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if half_close:
            writer.write_eof()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return (int(head.split(b" ")[1]) if raw else 0), body, time.monotonic() - t0


class RawBackend:
    """A loopback backend: ``/v1/models`` answers whole (so the proxy starts with it up); every other request
    is answered by ``script(writer)``, after which the connection stays open until the peer closes it."""

    def __init__(self, script) -> None:
        self.script = script
        self.requests = 0
        self.server = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.server.close()

    async def _handle(self, reader, writer) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if head.startswith(b"GET /v1/models"):
                out = json.dumps({"data": [{"id": "raw", "max_model_len": 512}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
            else:
                self.requests += 1
                await self.script(writer)
            await writer.drain()
            await asyncio.wait_for(reader.read(), 30)  # held open: only the client ends this reply
        writer.close()


def _malformed_after_head(line: bytes):
    async def script(writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)  # the head is parsed first: the body is under way when the line arrives
        writer.write(b"5\r\ndata:\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(line + b"\r\n")
    return script


# ---------------------------------------------------------------------- the client session: framing errors fail fast
def test_session_hands_a_malformed_chunk_size_to_the_body_reader_at_once():
    """aiohttp 3.14's C parser refuses these lines but, after the reply's head, told only the connection: the
    body's reader waited forever (sock_read dropped too). The proxy's sessions fail the read at once."""
    async def go():
        for line in MALFORMED_CHUNK_SIZES:
            be = RawBackend(_malformed_after_head(line))
            url = await be.start()
            async with new_session() as session:
                assert fails_fast(session)
                t0 = time.monotonic()
                with pytest.raises(aiohttp.ClientPayloadError) as exc:  # a framing error, never a timeout
                    async with session.post(url + "/v1/completions", data=b"{}",
                                            timeout=aiohttp.ClientTimeout(sock_read=LONG)) as resp:
                        await read_bounded(resp.content, 1 << 20)
                assert time.monotonic() - t0 < FAST, line
                assert isinstance(exc.value, ReplyFramingError) or "chunk" in str(exc.value).lower(), (line, exc.value)
            await be.stop()

    run(go())


# ---------------------------------------------------------------------- a backend breaking framing: one attempt, no hang
@pytest.mark.parametrize("stream", [False, True])
def test_malformed_chunk_size_is_a_prompt_502_frees_the_slot_and_marks_the_backend_down(stream):
    async def go():
        bad = FaultyBackend(completion="bad_chunk_size")
        proxy = RouterProxy([await bad.start()], retries=0, max_inflight=1, health_interval_s=60, connect_timeout_s=2,
                            response_timeout_s=LONG, stream_idle_timeout_s=LONG, reply_timeout_s=LONG)
        _, port = await proxy.start()
        try:
            for i in range(3):  # the one slot is freed each time (max_inflight=1): the next attempt gets it
                proxy.backends[0].up = True
                status, body, took = await _exchange(port, _post({"prompt": f"p{i}", "stream": stream}))
                assert status == 502 and took < FAST, (status, body, took)
                assert b"framing" in body and b"chunk size" in body, body
                assert proxy.backends[0].in_flight == 0 and not proxy.backends[0].up
            b = proxy.metrics()["backends"][0]
            assert b["routed"] == 3 and b["failed"] == 3 and b["marked_down"] == 3 and b["kv_tokens"] == 0
            assert bad.malformed_sent == 3
        finally:
            await proxy.stop()
            await bad.stop()

    run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_framing_is_retried_on_another_backend(stream):
    async def go():
        bad, good = FaultyBackend(completion="bad_chunk_size"), FaultyBackend()
        proxy = RouterProxy([await bad.start(), await good.start()], "round_robin", health_interval_s=60,
                            connect_timeout_s=2, response_timeout_s=LONG, stream_idle_timeout_s=LONG, reply_timeout_s=LONG)
        _, port = await proxy.start()
        try:
            for i in range(4):
                proxy.backends[0].up = True
                status, body, took = await _exchange(port, _post({"prompt": f"p{i}", "stream": stream}))
                assert status == 200 and took < FAST, (status, body)
                text = dechunk(body) if stream else body
                assert (b"data: [DONE]" in text) if stream else json.loads(text)["choices"][0]["text"] == f"echo:p{i}"
            assert bad.requests["/v1/completions"] >= 2 and proxy.backends[0].marked_down >= 2 and proxy.retried >= 2
            assert all(b.in_flight == 0 and b.kv_tokens == 0 for b in proxy.backends)
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    run(go())


def test_stream_broken_after_its_first_event_is_closed_at_once():
    """The first event reached the client, so the stream cannot be replayed: the client's connection is closed
    unfinished at once (not after a deadline), the slot freed and the backend marked down."""
    async def go():
        bad = FaultyBackend(completion="bad_chunk_after_event")
        proxy = RouterProxy([await bad.start()], health_interval_s=60, connect_timeout_s=2, response_timeout_s=LONG,
                            stream_idle_timeout_s=LONG, reply_timeout_s=LONG)
        _, port = await proxy.start()
        try:
            status, body, took = await _exchange(port, _post({"prompt": "x", "stream": True}))
            assert status == 200 and took < FAST and b"data: " in body and b"[DONE]" not in body
            assert not body.endswith(b"0\r\n\r\n")  # no last chunk: the client sees an unfinished stream
            assert not proxy.backends[0].up and proxy.backends[0].in_flight == 0 and proxy.status_counts == {502: 1}
        finally:
            await proxy.stop()
            await bad.stop()

    run(go())


def test_one_bad_backend_never_affects_other_requests():
    """Many requests at once, streamed and not, over a backend breaking framing and a good one, together with
    clients that omit Content-Length or half-close mid-body: every good request is answered whole, every bad
    one gets its own 4xx, and every slot is free at the end."""
    async def go():
        bad, good = FaultyBackend(completion="bad_chunk_size"), FaultyBackend()
        proxy = RouterProxy([await bad.start(), await good.start()], "round_robin", health_interval_s=0.05,
                            connect_timeout_s=2, retries=1, client_timeout_s=2)
        _, port = await proxy.start()
        try:
            good_reqs = [_exchange(port, _post({"prompt": f"g{i}", "stream": i % 2 == 1})) for i in range(24)]
            no_length = [_exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n" + b'{"prompt": "n"}')
                         for _ in range(4)]
            half = [_exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{\"pro",
                              half_close=True) for _ in range(4)]
            answers = await asyncio.gather(*good_reqs, *no_length, *half)
            for i, (status, body, _) in enumerate(answers[:24]):
                assert status == 200, (i, status, body[:200])
                if i % 2:
                    assert dechunk(body).endswith(b"data: [DONE]\n\n")
                else:
                    assert json.loads(body)["choices"][0]["text"] == f"echo:g{i}"
            assert [a[0] for a in answers[24:28]] == [411] * 4 and [a[0] for a in answers[28:]] == [400] * 4
            assert bad.requests["/v1/completions"] > 0 and proxy.backends[0].marked_down > 0
            assert all(b.in_flight == 0 and b.kv_tokens == 0 for b in proxy.backends) and proxy.waiting == 0
        finally:
            await proxy.stop()
            await bad.stop()
            await good.stop()

    run(go())


# ---------------------------------------------------------------------- deadlines: head, body, stream idle, whole reply
async def _never_answers(writer) -> None:
    pass


async def _trickles_a_buffered_body(writer) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(200):  # a byte every 50 ms: never silent for long, never done
        writer.write(b" ")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _trickles_a_stream(writer) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i in range(200):  # a whole event every 50 ms, forever
        event = b'data: {"choices": [{"text": "%d"}]}\n\n' % i
        writer.write(b"%x\r\n" % len(event) + event + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _one_event_then_silence(writer) -> None:
    event = b'data: {"choices": [{"text": "0"}]}\n\n'
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(event) + event + b"\r\n")


@pytest.mark.parametrize("script, stream, deadlines, named, committed", [
    (_never_answers, False, dict(response_timeout_s=0.3), "response_timeout_s=0.3", False),
    (_never_answers, True, dict(response_timeout_s=0.3), "response_timeout_s=0.3", False),
    (_trickles_a_buffered_body, False, dict(reply_timeout_s=0.6), "reply_timeout_s=0.6", False),
    (_trickles_a_stream, True, dict(reply_timeout_s=0.6), "reply_timeout_s=0.6", True),
    (_one_event_then_silence, True, dict(stream_idle_timeout_s=0.3), "stream_idle_timeout_s=0.3", True),
], ids=["head-buffered", "head-stream", "trickled-body", "trickled-stream", "silent-stream"])
def test_every_forwarded_reply_has_a_deadline(script, stream, deadlines, named, committed):
    """A backend that never answers, trickles a body or a stream forever, or falls silent mid-stream: the
    attempt ends at its deadline (named in the error), the slot is freed and the backend marked down."""
    async def go():
        be = RawBackend(script)
        kw = dict(response_timeout_s=LONG, stream_idle_timeout_s=LONG, reply_timeout_s=LONG) | deadlines
        proxy = RouterProxy([await be.start()], retries=0, health_interval_s=60, connect_timeout_s=2, **kw)
        _, port = await proxy.start()
        try:
            status, body, took = await _exchange(port, _post({"prompt": "x", "stream": stream}))
            assert took < FAST
            if committed:  # the stream was under way: closed unfinished
                assert status == 200 and b"[DONE]" not in body and not body.endswith(b"0\r\n\r\n")
            else:
                assert status == 502 and named.encode() in body, body
            b = proxy.backends[0]
            assert named in b.last_error and not b.up and b.in_flight == 0 and b.failed == 1
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


def test_a_client_that_leaves_does_not_hold_a_slot_past_the_deadline():
    """The client leaves while the backend stays silent: the attempt still ends (here at the stream idle
    deadline), and the slot is free for the next request."""
    async def go():
        be = RawBackend(_one_event_then_silence)
        proxy = RouterProxy([await be.start()], retries=0, max_inflight=1, health_interval_s=60, connect_timeout_s=2,
                            stream_idle_timeout_s=0.3)
        _, port = await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post({"prompt": "x", "stream": True}))
            await writer.drain()
            while proxy.backends[0].in_flight == 0:
                await asyncio.sleep(0.01)
            writer.close()  # gone
            t0 = time.monotonic()
            while proxy.backends[0].in_flight:
                await asyncio.sleep(0.01)
                assert time.monotonic() - t0 < FAST
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


# ---------------------------------------------------------------------- clients: missing length, half-close, pipelining
def test_post_without_content_length_is_411_whatever_follows_its_head():
    """It used to be answered 400 "Invalid method" (the JSON after the head parsed as a second request)."""
    async def go():
        be = FaultyBackend()
        proxy = RouterProxy([await be.start()], health_interval_s=60, client_timeout_s=2)
        _, port = await proxy.start()
        try:
            body = b'{"prompt": "x"}'
            for head in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n\r\n", b"POST /v1/completions HTTP/1.0\r\n\r\n"):
                for tail, half_close in ((b"", False), (body, False), (body, True), (b"GET / HTTP/1.1\r\n\r\n", False)):
                    status, answer, _ = await _exchange(port, head + tail, half_close=half_close)
                    assert status == 411 and b"Content-Length" in answer, (head, tail, half_close, status, answer)
                    assert json.loads(answer)["error"]["code"] == 411
            # chunked request bodies are refused too (documented in RouterProxy._dispatch)
            chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nf\r\n" + body + b"\r\n0\r\n\r\n"
            assert (await _exchange(port, chunked))[0] == 411
            # bytes after a whole request are never parsed as a second one: the first is answered
            status, answer, _ = await _exchange(port, _post(body) + b"GARBAGE\r\n\r\n")
            assert status == 200 and json.loads(answer)["choices"][0]["text"] == "echo:x"
            assert be.requests["/v1/completions"] == 1 and proxy.status_counts == {411: 13, 200: 1}
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


def test_half_closed_body_gets_a_400_and_a_whole_request_still_its_answer():
    """A client that ends its sending side before its Content-Length used to get no status at all (the
    connection was closed under the request); one that half-closes after a whole request lost its answer."""
    async def go():
        be = FaultyBackend()
        proxy = RouterProxy([await be.start()], health_interval_s=60, client_timeout_s=LONG)
        _, port = await proxy.start()
        try:
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n"
            for sent in (b"", b'{"prompt"', b'{"prompt": "x"}'):
                status, answer, took = await _exchange(port, head + sent, half_close=True)
                assert status == 400 and took < FAST, (sent, status, answer)
                assert b"half-closed" in answer and b"Content-Length 50" in answer
            status, answer, _ = await _exchange(port, _post({"prompt": "whole"}), half_close=True)
            assert status == 200 and json.loads(answer)["choices"][0]["text"] == "echo:whole"
            # a head cut short and half-closed: nothing to answer, the connection is closed at once
            status, answer, took = await _exchange(port, b"POST /v1/completions HTTP/1.1\r\nHo", half_close=True)
            assert status == 0 and took < FAST
            assert proxy.status_counts == {400: 3, 200: 1}
        finally:
            await proxy.stop()
            await be.stop()

    run(go())


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize("name", ["response_timeout_s", "stream_idle_timeout_s", "reply_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 86_401, "soon", True])
def test_deadlines_are_checked(name, value):
    with pytest.raises(ValueError, match=name):
        RouterProxy(["http://127.0.0.1:1"], **{name: value})


@pytest.mark.parametrize("flag", ["--response-timeout", "--stream-idle-timeout", "--reply-timeout", "--queue-timeout"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_deadline_flags_are_refused_with_error_and_exit_2(flag, value, capsys):
    assert main(["-b", "http://127.0.0.1:1", flag, value, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and flag in err and "(0, 86400]" in err, err


def test_deadline_flags_reach_the_proxy_and_non_numbers_are_argparse_errors(capsys):
    args = build_parser().parse_args(["-b", "http://127.0.0.1:1", "--response-timeout", "7", "--stream-idle-timeout", "8",
                                      "--reply-timeout", "9"])
    proxy = build_proxy(args)
    assert (proxy.response_timeout_s, proxy.stream_idle_timeout_s, proxy.reply_timeout_s) == (7, 8, 9)
    defaults = build_proxy(build_parser().parse_args(["-b", "http://127.0.0.1:1"]))
    assert (defaults.response_timeout_s, defaults.stream_idle_timeout_s, defaults.reply_timeout_s) == (120, 120, 600)
    follows = build_proxy(build_parser().parse_args(["-b", "http://127.0.0.1:1", "--response-timeout", "7"]))
    assert follows.stream_idle_timeout_s == 7  # the stream's silence bound follows the head's unless given
    with pytest.raises(SystemExit) as exc:
        main(["-b", "http://127.0.0.1:1", "--reply-timeout", "soon"])
    assert exc.value.code == 2 and "--reply-timeout" in capsys.readouterr().err
