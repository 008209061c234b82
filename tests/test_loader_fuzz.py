"""Property/fuzz suite over the file loaders: whatever bytes or JSON a file holds, a loader either returns
a valid object or raises :class:`moelab._io.FileFormatError` — never another exception, never a hang, never
an allocation past its budget. Examples are bounded (a few hundred in all, seconds of CI) and
derandomised; ``MOELAB_FUZZ_EXAMPLES=<n>`` runs ``n`` random examples per test instead.

Set ``MOELAB_FUZZ_REPORT=<file.json>`` to have the suite write how many cases it ran
(``loader_fuzz_cases_run``) for ``moelab bench reliability``.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moelab._io import FileFormatError, atomic_write_json, load_npz, read_csv_checked, read_json_record
from moelab.traces import ExpertTrace, Geometry

CASES: Counter[str] = Counter()
_EXAMPLES = os.environ.get("MOELAB_FUZZ_EXAMPLES")  # e.g. 2000 for a long, randomised exploration run
FUZZ = settings(max_examples=int(_EXAMPLES or 50), deadline=None, derandomize=_EXAMPLES is None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BUDGET = 16 << 20  # the loaders run under a small budget: nothing a fuzz case declares may exceed it


@pytest.fixture(scope="module", autouse=True)
def _report_case_count():
    yield
    shutil.rmtree(_TMP, ignore_errors=True)
    out = os.environ.get("MOELAB_FUZZ_REPORT")
    if out:
        atomic_write_json(out, {"loader_fuzz_cases_run": int(sum(CASES.values())), "by_loader": dict(CASES)})


def _toy_trace() -> ExpertTrace:
    rng = np.random.default_rng(3)
    L, E, k, n = 2, 5, 2, 3
    prompts = [rng.integers(0, 100, size=3) for _ in range(n)]
    pre = [rng.integers(0, E, size=(3, L, k)) for _ in range(n)]
    counts = np.stack([np.stack([np.bincount(p[:, layer].ravel(), minlength=E) for layer in range(L)]) for p in pre])
    return ExpertTrace.from_requests(request_ids=["a", "b", "c"], domains=["x", "y", "x"], prompt_tokens=prompts,
                                     prefill_counts=counts,
                                     decode_ids=[rng.random((2, L, E)).argsort(-1)[..., :k] for _ in range(n)],  # k distinct
                                     geometry=Geometry(L, E, k, "fuzz"), prefill_ids=pre)


_TMP = Path(tempfile.mkdtemp(prefix="moelab-fuzz-"))
_GOOD = _toy_trace().save(_TMP / "good")
_GOOD_NPZ = _GOOD.read_bytes()
_GOOD_META = json.loads(_GOOD.with_suffix(".json").read_text())


def _load_trace(npz: bytes, meta: object) -> None:
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "t.npz"
        p.write_bytes(npz)
        p.with_suffix(".json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
        try:
            t = ExpertTrace.load(p, max_bytes=BUDGET)
        except FileFormatError as exc:
            assert exc.path is not None and str(exc.path.parent) == d
            return
        # what loads is a consistent trace: every view works
        assert len(t.request_ids) == len(t.domains) == t.prefill_counts.shape[0]
        t.decode_profiles()


# ---------------------------------------------------------------------------------------------- bytes

mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, len(_GOOD_NPZ))),
    st.tuples(st.just("flip"), st.integers(0, len(_GOOD_NPZ) - 1), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, len(_GOOD_NPZ)), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("zero"), st.integers(0, len(_GOOD_NPZ) - 1), st.integers(1, 64)),
)


def _mutate(blob: bytes, ops: list[tuple]) -> bytes:
    b = bytearray(blob)
    for op in ops:
        if op[0] == "truncate":
            b = b[: op[1] % (len(b) + 1)]
        elif op[0] == "flip" and b:
            b[op[1] % len(b)] ^= op[2]
        elif op[0] == "insert":
            b[op[1] % (len(b) + 1):op[1] % (len(b) + 1)] = op[2]
        elif op[0] == "zero" and b:
            i = op[1] % len(b)
            b[i:i + op[2]] = bytes(len(b[i:i + op[2]]))
    return bytes(b)


@FUZZ
@given(st.lists(mutation, min_size=1, max_size=4))
def test_mutated_npz_loads_or_raises_the_one_error(ops):
    CASES["load_npz/bytes"] += 1
    blob = _mutate(_GOOD_NPZ, ops)
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "m.npz"
        p.write_bytes(blob)
        try:
            arrays = load_npz(p, max_bytes=BUDGET)
        except FileFormatError:
            pass
        else:
            assert all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays.values())
    CASES["ExpertTrace.load/bytes"] += 1
    _load_trace(blob, _GOOD_META)


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_load_or_raise_the_one_error(blob):
    CASES["load_npz/random"] += 1
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "r.npz"
        p.write_bytes(b"PK\x03\x04" + blob if blob[:1] == b"\x00" else blob)
        try:
            assert isinstance(load_npz(p, max_bytes=BUDGET), dict)
        except FileFormatError:
            pass


# ---------------------------------------------------------------------------------------------- .npy headers

shapes = st.lists(st.one_of(st.integers(-3, 8), st.integers(0, 10**15), st.booleans(), st.floats(0, 10),
                            st.text(max_size=3)), max_size=4)
descrs = st.one_of(st.sampled_from(["<f8", "<i4", "|b1", "<U5", "|O", ">i8", "<c16", "|V8", "<M8[s]", "S3", "<f2"]),
                   st.text(max_size=6), st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["<i4", "|O"])),
                                                 max_size=2))


@FUZZ
@given(shape=shapes, descr=descrs, fortran=st.one_of(st.booleans(), st.integers(0, 2)),
       payload=st.integers(0, 256), version=st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x00\x07"]))
def test_fuzzed_npy_headers_load_or_raise_the_one_error(shape, descr, fortran, payload, version):
    CASES["load_npz/header"] += 1
    header = repr({"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}).encode("latin1", "replace")
    hlen = (len(header) + 1).to_bytes(2 if version != b"\x02\x00" else 4, "little")
    member = b"\x93NUMPY" + version + hlen + header + b"\n" + bytes(payload)
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "h.npz"
        with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("x.npy", member)
        try:
            arrays = load_npz(p, max_bytes=BUDGET)
        except FileFormatError as exc:
            assert exc.field in (None, "x")
        else:
            x = arrays["x"]
            assert not x.dtype.hasobject and x.nbytes <= BUDGET


@FUZZ
@given(arrays=st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                              st.tuples(st.sampled_from(["<f8", "<i2", "|u1", "<U3", "|b1"]),
                                        st.lists(st.integers(0, 4), max_size=3)), max_size=4))
def test_valid_npz_files_roundtrip_exactly(arrays):
    CASES["load_npz/valid"] += 1
    data = {k: np.zeros(tuple(shape), dtype=dt) for k, (dt, shape) in arrays.items()}
    buf = io.BytesIO()
    np.savez_compressed(buf, **data)
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "v.npz"
        p.write_bytes(buf.getvalue())
        back = load_npz(p)
    assert set(back) == set(data)
    for k, v in data.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v)


# ---------------------------------------------------------------------------------------------- sidecars

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
_PATHS = [("request_ids",), ("domains",), ("format",), ("format_version",), ("arrays",), ("provenance",),
          ("geometry",), ("geometry", "num_layers"), ("geometry", "num_experts"), ("geometry", "top_k"),
          ("geometry", "model_name"), ("geometry", "layer_names"), ("request_ids", 0), ("arrays", 0)]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(_PATHS), st.one_of(json_values, st.just("__delete__"))),
                      min_size=1, max_size=3))
def test_fuzzed_sidecars_load_or_raise_the_one_error(edits):
    CASES["ExpertTrace.load/sidecar"] += 1
    meta = copy.deepcopy(_GOOD_META)
    for path, value in edits:
        d = meta
        for key in path[:-1]:
            d = d.get(key) if isinstance(d, dict) else None
        if isinstance(d, dict) or (isinstance(d, list) and isinstance(path[-1], int) and path[-1] < len(d)):
            if value == "__delete__":
                if isinstance(d, dict):
                    d.pop(path[-1], None)
            else:
                d[path[-1]] = value
    _load_trace(_GOOD_NPZ, meta)


@FUZZ
@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps)))
def test_arbitrary_json_text_as_sidecar(text):
    CASES["ExpertTrace.load/json"] += 1
    _load_trace(_GOOD_NPZ, text)
    CASES["read_json_record"] += 1
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "r.json"
        p.write_text(text)
        try:
            rec = read_json_record(p)
        except FileFormatError:
            return
        for key in rec.keys()[:3]:
            for getter in (rec.get_int, rec.get_str, rec.get_real, rec.get_str_list, rec.get_record):
                try:
                    getter(key)
                except FileFormatError as exc:
                    assert exc.field is not None and exc.field.startswith(key)


# ---------------------------------------------------------------------------------------------- CSV

cells = st.one_of(st.integers(-5, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.sampled_from(["", " ", "nan", "inf", "-0", "1e400", "0x10", "1_000", "true", '"', ",", "\n"]),
                  st.text(max_size=4))


@FUZZ
@given(header=st.lists(st.sampled_from(["model", "B", "ms", "x", ""]), min_size=0, max_size=5),
       rows=st.lists(st.lists(cells, max_size=6), max_size=6))
def test_fuzzed_csv_tables_load_or_raise_the_one_error(header, rows):
    CASES["read_csv_checked"] += 1
    text = "\n".join([",".join(header)] + [",".join(r) for r in rows]) + "\n"
    with tempfile.TemporaryDirectory(dir=_TMP) as d:
        p = Path(d) / "t.csv"
        p.write_text(text)
        try:
            df = read_csv_checked(p, {"model": "str", "B": "int", "ms": "float"}, max_rows=100)
        except FileFormatError:
            return
    assert df["B"].dtype == np.int64 and (df["B"] >= 0).all()
    assert np.isfinite(df["ms"]).all() and (df["ms"] >= 0).all() and (df["model"].str.len() > 0).all()
