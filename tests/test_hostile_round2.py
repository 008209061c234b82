"""Hostile input, round two (issue 29): untrusted files bounded before work grows with them, bounds on
work, no silent wrong numbers, and property tests (hypothesis) over the file loaders and entry points."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from moelab._io import FileFormatError, json_depth, loads_json, read_json
from moelab.traces import ExpertTrace
from moelab.traces.compact import load_compact_trace, save_compact_trace
from tests.test_hostile_files import _toy_trace as toy_trace


def _toy_trace(n: int = 4, L: int = 2, E: int = 64, k: int = 8, seed: int = 0) -> ExpertTrace:
    """The hostile-files suite's toy trace at a geometry whose ids the sidecar checks can tell apart."""
    return toy_trace(n=n, L=L, E=E, k=k, seed=seed)


def _edit_sidecar(npz: Path, **geometry) -> None:
    meta_path = npz.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["geometry"].update(geometry)
    meta_path.write_text(json.dumps(meta))


# ------------------------------------------------------------------------------- class 1: files


@pytest.mark.parametrize("experts, top_k", [(65536, 1000), (200, 100), (200, 198), (65536, 30000)])
def test_compact_sidecar_geometry_is_bounded_before_any_table(tmp_path, experts, top_k):
    path = save_compact_trace(_toy_trace(), tmp_path / "t")
    _edit_sidecar(path, num_experts=experts, top_k=top_k)
    t0 = time.perf_counter()
    with pytest.raises(FileFormatError, match="top_k") as err:
        load_compact_trace(path)
    assert time.perf_counter() - t0 < 2.0
    assert "63-bit" in str(err.value)


def test_editing_a_compact_sidecars_top_k_is_detected(tmp_path):
    path = save_compact_trace(_toy_trace(E=64, k=8), tmp_path / "t")
    assert load_compact_trace(path).geometry.top_k == 8
    _edit_sidecar(path, top_k=9)  # C(64, 9) needs 5 bytes like C(64, 8): the planes alone do not tell
    with pytest.raises(FileFormatError, match="prefill_counts"):
        load_compact_trace(path)


def test_full_trace_load_checks_prefill_sums(tmp_path):
    trace = _toy_trace(E=6, k=2)
    path = trace.save(tmp_path / "t")
    npz = Path(path).with_suffix(".npz")
    meta_path = npz.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["geometry"]["top_k"] = 3
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FileFormatError):
        ExpertTrace.load(npz)


def test_json_depth_is_bounded_in_the_one_reader(tmp_path):
    assert json_depth('{"a": ["]]]", {"b": [1]}]}') == 4
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FileFormatError, match="max_depth"):
        read_json(deep)
    with pytest.raises(FileFormatError, match="max_depth"):
        loads_json("{\"a\":" * 100 + "1" + "}" * 100)
    assert loads_json('{"a": [1, "[[["]}') == {"a": [1, "[[["]}


def test_deeply_nested_hd_store_meta_is_refused(tmp_path):
    from moelab._io import atomic_save_npz
    from moelab.hd.ngram import FORMAT, NGramTable, StoreFileError

    path = tmp_path / "s.npz"
    atomic_save_npz(path, format=np.array(FORMAT), meta=np.array("[" * 100_000 + "]" * 100_000),
                    length=np.array(2), keys1=np.zeros((1, 1), np.int32), conts1=np.zeros((1, 1, 2), np.int32),
                    counts1=np.ones((1, 1), np.int32))
    with pytest.raises(StoreFileError, match="max_depth"):
        NGramTable.load(path)


def test_hd_store_continuations_outside_the_vocabulary_are_refused(tmp_path):
    from moelab._io import atomic_save_npz
    from moelab.hd.ngram import FORMAT, NGramTable, StoreFileError

    meta = json.dumps({"kind": "model", "tokenizer": {"name": "toy", "vocab_size": 100, "sha256": "x"}})
    path = tmp_path / "s.npz"
    conts = np.array([[[5, 7]]], np.int32)
    atomic_save_npz(path, format=np.array(FORMAT), meta=np.array(meta), length=np.array(2),
                    keys1=np.array([[3]], np.int32), conts1=conts, counts1=np.ones((1, 1), np.int32))
    assert NGramTable.load(path).length == 2
    atomic_save_npz(path, format=np.array(FORMAT), meta=np.array(meta), length=np.array(2),
                    keys1=np.array([[3]], np.int32), conts1=conts + 1000, counts1=np.ones((1, 1), np.int32))
    with pytest.raises(StoreFileError, match="conts1"):
        NGramTable.load(path)


def test_sharegpt_record_nested_too_deeply_is_a_clear_error(tmp_path):
    from moelab.datasets import load_sharegpt

    path = tmp_path / "sg.json"
    path.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}, '
                    + '{"id": "b", "x": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    with pytest.raises(ValueError, match="nested too deeply"):
        load_sharegpt(path=path)


# ------------------------------------------------------------------------------- class 2: sweep cache

def _sweep_point(rate: int) -> dict:
    return {"throughput": float(rate) * 2}


def test_sweep_cache_entry_of_another_point_is_not_served(tmp_path):
    import warnings

    from moelab.sweep import ResultCache, run_sweep
    from moelab.sweep.core import decode_entry, encode_entry

    res = run_sweep(_sweep_point, {"rate": [1, 2]}, cache_dir=tmp_path, backend="serial", progress=False)
    k1, k2 = res.keys
    cache = ResultCache(tmp_path)
    # replace point 1's rows and params (keeping its key) by point 2's: must be refused, not served
    forged = encode_entry(k1, {"rate": 2}, [{"rate": 2, "throughput": 4.0}])
    cache.store(k1, forged)
    with pytest.raises(ValueError, match="stores the point"):
        decode_entry(forged, k1, params={"rate": 1})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        again = run_sweep(_sweep_point, {"rate": [1, 2]}, cache_dir=tmp_path, backend="serial", progress=False)
    assert again.recomputed == [k1]
    assert again.frame.set_index("rate").loc[1, "throughput"] == 2.0
    # rows swapped but params metadata kept: the rows are compared too
    forged_rows = encode_entry(k1, {"rate": 1}, [{"rate": 2, "throughput": 4.0}])
    with pytest.raises(ValueError, match="not the point's rows"):
        decode_entry(forged_rows, k1, params={"rate": 1})


def test_sweep_cache_entry_size_checked_from_its_footer(tmp_path):
    from moelab.sweep.core import decode_entry, encode_entry

    blob = encode_entry("k" * 64, {"rate": 1}, [{"rate": 1, "text": "x" * 100_000}])
    with pytest.raises(ValueError, match="max_decoded_bytes"):
        decode_entry(blob, "k" * 64, params={"rate": 1}, max_decoded_bytes=10_000)


def test_sweep_cache_entry_replaced_by_a_folder_is_named(tmp_path):
    from moelab.sweep import ResultCache, run_sweep

    res = run_sweep(_sweep_point, {"rate": [1]}, cache_dir=tmp_path, backend="serial", progress=False)
    path = ResultCache(tmp_path).path(res.keys[0])
    path.unlink()
    path.mkdir()
    with pytest.raises(FileFormatError, match="not a regular file"):
        run_sweep(_sweep_point, {"rate": [1]}, cache_dir=tmp_path, backend="serial", progress=False)


# ------------------------------------------------------------------------------- class 3: bounds on work

def test_grid_size_is_capped_before_expanding():
    from moelab.sweep.core import MAX_GRID_POINTS, expand_grid

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="MAX_GRID_POINTS"):
        expand_grid({f"a{i}": list(range(10)) for i in range(9)})
    assert time.perf_counter() - t0 < 1.0
    assert MAX_GRID_POINTS >= 1000


def test_cli_values_are_length_capped():
    from moelab.notebooks import parse_params
    from moelab.sweep.core import parse_grid_args

    with pytest.raises(ValueError, match="cap"):
        parse_grid_args(["rate=" + "[" * 100_000])
    with pytest.raises(ValueError, match="cap"):
        parse_params(["x=" + "(" * 100_000])
    assert parse_params(["x=[1, 2]", "y=abc"]) == {"x": [1, 2], "y": "abc"}
    assert parse_grid_args(["rate=20,60"]) == {"rate": [20, 60]}


def test_calibrate_reps_is_bounded():
    from moelab.make.calibrate import MAX_REPS, calibrate

    with pytest.raises(ValueError, match="reps.*MAX_REPS"):
        calibrate("/nonexistent-never-written", smoke=True, device="cpu", reps=10**9)
    assert MAX_REPS >= 50


# ------------------------------------------------------------------------------- class 4: no silent wrong numbers

def test_float_token_ids_are_refused_not_truncated():
    from moelab._validate import check_token_ids
    from moelab.hd.decode import generate

    assert check_token_ids("prompt_ids", [1, 2, 3]) == [1, 2, 3]
    with pytest.raises(ValueError, match="prompt_ids must hold integer token ids"):
        check_token_ids("prompt_ids", [1.7, 2.0])
    with pytest.raises(ValueError, match="prompt_ids"):
        check_token_ids("prompt_ids", [-1])
    with pytest.raises(ValueError, match="prompt_ids must hold integer token ids"):
        generate(object(), [1.7, 2.2], max_new_tokens=1)
