"""RequestTrace and ExpertTrace: construction, validation, views, files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moelab.traces import (
    ExpertTrace,
    Geometry,
    RequestTrace,
    bundled_trace_path,
    load_azure_trace,
    load_trace,
    save_compact_trace,
)


def _toy_trace(seed: int = 0, n: int = 6, L: int = 3, E: int = 8, k: int = 2) -> ExpertTrace:
    rng = np.random.default_rng(seed)
    geo = Geometry(L, E, k, "toy")
    prompts = [rng.integers(0, 100, size=rng.integers(3, 9)) for _ in range(n)]
    prefill_ids = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in p]) for p in prompts]
    counts = np.zeros((n, L, E), np.int32)
    for i, ids in enumerate(prefill_ids):
        for layer in range(L):
            counts[i, layer] = np.bincount(ids[:, layer].ravel(), minlength=E)
    decode = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(rng.integers(2, 6))]) for _ in range(n)]
    return ExpertTrace.from_requests(request_ids=[f"r{i}" for i in range(n)], domains=["a", "b"] * (n // 2),
                                     prompt_tokens=prompts, prefill_counts=counts, decode_ids=decode, geometry=geo,
                                     prefill_ids=prefill_ids, provenance={"backend": "synthetic-test"})


def test_expert_trace_views():
    t = _toy_trace()
    assert len(t) == 6 and t.prefill_counts.sum(axis=2).tolist() == [[len(t.prompt(i)) * 2] * 3 for i in range(6)]
    prof = t.decode_profiles()
    assert prof.shape == (6, 3, 8)
    assert np.array_equal(prof.sum(axis=(1, 2)), t.decode_lens * 3 * 2)
    # distinct experts of a batch at step 0 equals a brute-force set count
    idx = np.array([0, 2, 4])
    want = [len({int(e) for i in idx for e in t.decode(i)[0, layer]}) for layer in range(3)]
    assert t.distinct_experts(idx, 0).tolist() == want
    sub = t.subset([4, 1])
    assert sub.request_ids == ["r4", "r1"] and np.array_equal(sub.decode(0), t.decode(4))
    assert np.array_equal(sub.prefill_topk(1), t.prefill_topk(1))


def test_expert_trace_roundtrip_and_foreign_files(tmp_path):
    t = _toy_trace()
    path = t.save(tmp_path / "trace")
    back = ExpertTrace.load(path)
    assert back.request_ids == t.request_ids and back.geometry == t.geometry
    assert np.array_equal(back.decode_ids, t.decode_ids) and np.array_equal(back.prefill_ids, t.prefill_ids)
    (tmp_path / "other.npz").write_bytes(b"PK")
    with pytest.raises(ValueError, match="sidecar"):
        ExpertTrace.load(tmp_path / "other.npz")
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a moelab ExpertTrace"):
        ExpertTrace.load(tmp_path / "other.npz")


def test_one_loader_reads_both_formats_by_their_sidecar_tag(tmp_path):
    t = _toy_trace()
    plain = load_trace(t.save(tmp_path / "plain"))
    compact = load_trace(save_compact_trace(t, tmp_path / "compact"))
    assert plain.prefill_ids is not None and compact.prefill_ids is None  # each format's own reader ran
    for back in (plain, compact):
        assert back.request_ids == t.request_ids and np.array_equal(back.prefill_counts, t.prefill_counts)
        assert np.array_equal(back.distinct_experts(np.arange(6), 1), t.distinct_experts(np.arange(6), 1))
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "absent.npz")
    (tmp_path / "other.npz").write_bytes(b"PK")
    with pytest.raises(ValueError, match="sidecar other.json is missing"):
        load_trace(tmp_path / "other.npz")
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="format.*moelab.CompactExpertTrace"):
        load_trace(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="name"):
        bundled_trace_path("../x")


def test_expert_trace_rejects_bad_shapes():
    t = _toy_trace()
    with pytest.raises(ValueError, match="prefill_counts must have shape"):
        ExpertTrace(t.request_ids, t.domains, t.prompt_tokens, t.prompt_offsets, t.prefill_counts[:, :2],
                    t.decode_ids, t.decode_offsets, t.geometry)
    with pytest.raises(ValueError, match="top_k"):
        Geometry(2, 4, 5)


def test_request_trace_filters_are_counted():
    tr = RequestTrace(np.array([0.0, 1.0, 2.0]), np.array([10, 20, 30]), np.array([5, 2000, 7]))
    kept = tr.filter_lengths(max_output=1000)
    assert len(kept) == 2 and kept.dropped == {"output_len>1000": 1}
    assert kept.scale_rate(2.0).arrival_s.tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="factor"):
        tr.scale_rate(0)
    with pytest.raises(ValueError, match="missing column"):
        RequestTrace.from_frame(pd.DataFrame({"arrival_s": [0.0], "prompt_len": [3]}))
    with pytest.raises(ValueError, match="prompt_len must hold integers >= 1"):
        RequestTrace(np.array([0.0]), np.array([0]), np.array([3]))
    backlog = tr.resample(50, seed=1, all_at_zero=True)
    assert len(backlog) == 50 and backlog.arrival_s.max() == 0.0


def test_request_trace_csv_negative_lengths(tmp_path):
    p = tmp_path / "t.csv"
    pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_len": [3, -1], "output_len": [4, 5]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"prompt_len: row 2 has -[12]; must be an integer in \[0, MAX_SEQUENCE_TOKENS"):
        RequestTrace.from_csv(p)


def test_azure_trace_loads_from_local_copy(public_data):
    conv = load_azure_trace("conv")
    assert len(conv) + conv.dropped["zero_length"] == 19366
    assert 3000 < conv.duration_s < 3700 and conv.prompt_len.min() >= 1
    with pytest.raises(ValueError, match="kind must be one of"):
        load_azure_trace("chat")


def test_expert_counts_is_the_per_layer_histogram():
    from moelab.traces import expert_counts

    t = _toy_trace()
    for i in range(len(t)):  # prefill counts are exactly the histogram of the prompt's top-k ids
        assert np.array_equal(expert_counts(t.prefill_topk(i), 8), t.prefill_counts[i])
    assert expert_counts(np.zeros((0, 3, 2), np.int64), 8).sum() == 0
    with pytest.raises(ValueError, match="expert ids in"):
        expert_counts(np.full((1, 3, 2), 8), 8)


def test_recorded_with_reads_a_provenance_in_words():
    from moelab.traces import default_provenance, recorded_with

    prov = default_provenance("vllm", "m")
    assert prov["created"][:10] in recorded_with(prov)
    assert recorded_with({"backend": "vllm", "versions": {"vllm": "0.32.0"}, "created": "2026-12-06T08:15:18+00:00"}) \
        == "vLLM 0.32.0 on 2026-12-06"
    assert recorded_with({"backend": "hf", "versions": {"transformers": "5.19.0"}, "created": "2026-11-30"}) \
        == "the Hugging Face backend (transformers 5.19.0) on 2026-11-30"
    for hostile in (None, [], {"backend": 5, "versions": "x", "created": "yesterday"}):  # a file's sidecar: untrusted
        assert recorded_with(hostile) == "an unknown backend on an unknown date"


def test_a_trace_you_can_build_you_can_load_inconsistent_counts_are_refused_at_construction(tmp_path):
    """Issue 38: from_requests ran fewer checks than load_trace; both now run the same ones."""
    import moelab.traces as traces_pkg
    from moelab.traces import TraceFieldError, load_trace

    L, E, k = 2, 8, 2
    good = dict(request_ids=["r0"], domains=["chat"], prompt_tokens=[np.arange(5)],
                prefill_counts=np.tile(np.array([2, 2, 2, 2, 2, 0, 0, 0]), (1, L, 1)),  # 5 tokens x top_k=2 = 10
                decode_ids=[np.tile([[0, 1]], (3, L, 1))], geometry=Geometry(L, E, k, "toy"))
    trace = ExpertTrace.from_requests(**good)
    assert load_trace(trace.save(tmp_path / "ok")).n_requests == 1
    with pytest.raises(TraceFieldError, match=r"prefill_counts of request 0 layer 0 count 35 .* makes 10") as err:
        ExpertTrace.from_requests(**{**good, "prefill_counts": np.full((1, L, E), 35 // E) + np.eye(1, E, 0, int) * 3})
    assert err.value.field == "prefill_counts" and isinstance(err.value, ValueError)
    with pytest.raises(TraceFieldError, match="decode_ids .*repeats an expert"):
        ExpertTrace.from_requests(**{**good, "decode_ids": [np.tile([[3, 3]], (3, L, 1))]})
    assert "TraceFieldError" in traces_pkg.__all__ and "[N, L, E]" in ExpertTrace.from_requests.__doc__


@pytest.mark.parametrize("rows, column, row, value", [
    ({"arrival_s": [0.0, 1.0, 2000.0, 3.0], "prompt_len": [5, 6, 7, 8], "output_len": [3, 3, 3, 3]}, "arrival_s", 4, 3),
    ({"arrival_s": [0.0, 1.0, 2.0], "prompt_len": [5, 6, 7], "output_len": [3, 3, -20]}, "output_len", 3, -20),
    ({"arrival_s": [0.0, 1.0, 2.0], "prompt_len": [5, 12.5, 7], "output_len": [3, 3, 3]}, "prompt_len", 2, 12.5),
])
def test_frame_and_csv_refuse_a_bad_row_with_the_same_named_error(tmp_path, rows, column, row, value):
    """Issue 38: one row validator; out-of-order arrivals are refused, never silently sorted."""
    from moelab._io import FileFormatError
    from moelab.traces import RequestRowError

    with pytest.raises(RequestRowError, match=rf"^{column}: row {row} has {value!r}") as frame_err:
        RequestTrace.from_frame(pd.DataFrame(rows))
    assert frame_err.value.column == column
    path = tmp_path / "t.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    with pytest.raises(FileFormatError) as csv_err:
        RequestTrace.from_csv(path)
    assert str(csv_err.value).endswith(f"{column}: {frame_err.value.problem}")


def test_frame_and_csv_drop_zero_lengths_alike_and_start_at_zero(tmp_path):
    df = pd.DataFrame({"arrival_s": [10.0, 10.5, 11.0], "prompt_len": [5, 6, 7], "output_len": [3, 0, 4]})
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    for tr in (RequestTrace.from_frame(df), RequestTrace.from_csv(path)):
        assert tr.dropped == {"zero_length": 1} and tr.arrival_s.tolist() == [0.0, 1.0]
