"""Hostile trace, store, JSON and CSV files: every one is refused with the one error type, naming the file
and the field, before any big allocation, and no file handle is left open.

The corpus is generated here, at test time, in ``tmp_path`` (nothing hostile is committed).
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import struct
import time
import tracemalloc
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from moelab._io import FileFormatError, JsonRecord, load_npz, read_csv_checked, read_json, read_json_record
from moelab.bench.files import toy_trace
from moelab.traces import ExpertTrace, Geometry

# ---------------------------------------------------------------------------------------------- builders


def _toy_trace(n: int = 4, L: int = 2, E: int = 6, k: int = 2, seed: int = 0) -> ExpertTrace:
    return toy_trace(n, L, E, k, seed)  # the hostile-file battery's builder, at this file's geometry


def _npy(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=True)
    return buf.getvalue()


def _npy_header(shape: tuple, descr: str = "<f8", version: tuple[int, int] = (1, 0)) -> bytes:
    import io

    buf = io.BytesIO()
    d = {"descr": descr, "fortran_order": False, "shape": shape}
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buf, d)
    else:
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def _raw_zip(path: Path, members: list[tuple[str, bytes, int, int, int]]) -> Path:
    """A zip written byte by byte: ``(name, stored bytes, crc, declared uncompressed size, method)``.
    Lets a test put precompressed data (a bomb) or lying sizes into the central directory."""
    out, central = bytearray(), bytearray()
    for name, data, crc, usize, method in members:
        raw = name.encode()
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data), usize, len(raw), 0)
        out += raw + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, len(data), usize,
                               len(raw), 0, 0, 0, 0, 0, offset)
        central += raw
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + eocd))
    return path


def _zip_bomb(path: Path, n_mib: int = 768) -> Path:
    """One ``x.npy`` member of ``n_mib`` MiB of float64 zeros, deflated to ~1/1000 (768 MiB -> ~780 KB).

    Built in milliseconds: after a full flush deflate restarts from an empty state, so every further
    MiB of zeros compresses to the same bytes, which are repeated."""
    chunk = 1 << 20
    header = _npy_header(((n_mib * chunk - 128) // 8,))  # the member is exactly n_mib MiB, header included
    assert len(header) == 128
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(header + bytes(chunk - len(header))) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH) == block
    data = first + block * (n_mib - 1) + c.flush()
    crc = zlib.crc32(header + bytes(chunk - len(header)))
    zeros = bytes(chunk)
    for _ in range(n_mib - 1):
        crc = zlib.crc32(zeros, crc)
    return _raw_zip(path, [("x.npy", data, crc, n_mib * chunk, zipfile.ZIP_DEFLATED)])


def _write_pair(trace: ExpertTrace, path: Path, *, meta_edit=None, arrays_edit=None) -> Path:
    """Save ``trace`` and then rewrite its sidecar / arrays through the edit callbacks."""
    npz = trace.save(path)
    if meta_edit is not None:
        meta = json.loads(npz.with_suffix(".json").read_text())
        meta_edit(meta)
        npz.with_suffix(".json").write_text(json.dumps(meta))
    if arrays_edit is not None:
        with np.load(npz) as z:
            arrays = {k: z[k] for k in z.files}
        arrays_edit(arrays)
        np.savez(npz, **arrays)
    return npz


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")


# ---------------------------------------------------------------------------------------------- .npz


def test_zip_bomb_is_refused_before_inflating(tmp_path):
    bomb = _zip_bomb(tmp_path / "bomb.npz")
    assert os.path.getsize(bomb) < 1_000_000  # ~780 KB on disk, 768 MiB declared
    with zipfile.ZipFile(bomb) as zf:  # a well-formed zip: the sizes are honest, just huge
        assert zf.infolist()[0].file_size == 768 << 20
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(FileFormatError, match=r"768 MiB.*over the budget max_bytes=512 MiB") as exc:
            load_npz(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 2.0
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB allocated while refusing a zip bomb"
    assert exc.value.path == bomb and isinstance(exc.value, ValueError)
    # a caller who trusts the file can raise the budget; a small bomb then loads exactly
    small = _zip_bomb(tmp_path / "small.npz", n_mib=2)
    x = load_npz(small, max_bytes=4 << 20)["x"]
    assert x.shape == (((2 << 20) - 128) // 8,) and not x.any()
    with pytest.raises(FileFormatError, match="over the budget"):
        load_npz(small, max_bytes=1 << 20)


def test_lying_central_directory_never_inflates_past_the_declared_size(tmp_path):
    # the directory says 1 MiB, the deflate stream holds 64 MiB: reading stops at the declared size and
    # the .npy header's claim (64 MiB of data) disagrees with it
    bomb = _zip_bomb(tmp_path / "b.npz", n_mib=64)
    with zipfile.ZipFile(bomb) as zf:
        info = zf.infolist()[0]
        with open(bomb, "rb") as fh:
            fh.seek(info.header_offset + 30 + len(info.filename))
            data = fh.read(info.compress_size)
    liar = _raw_zip(tmp_path / "liar.npz", [("x.npy", data, info.CRC, 1 << 20, zipfile.ZIP_DEFLATED)])
    tracemalloc.start()
    try:
        with pytest.raises(FileFormatError, match="x: declares shape .* but the member holds"):
            load_npz(liar)
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()


def test_huge_declared_shape_is_refused_without_allocating(tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", _npy_header((10**11,)) + bytes(64))  # claims 1e11 float64 = 745 GiB
    with pytest.raises(FileFormatError, match=r"x: declares shape \(100000000000,\) of <f8 = 745\.1 GiB, over the budget"):
        load_npz(path)
    with zipfile.ZipFile(tmp_path / "neg.npz", "w") as zf:
        zf.writestr("x.npy", _npy_header((-5,)))
    with pytest.raises(FileFormatError, match="x: declares an invalid shape"):
        load_npz(tmp_path / "neg.npz")


def test_truncated_and_corrupt_files(tmp_path):
    good = _toy_trace().save(tmp_path / "good")
    blob = good.read_bytes()
    for cut in (0, 1, 2, 22, len(blob) // 3, len(blob) // 2, len(blob) - 23, len(blob) - 1):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(blob[:cut])
        with pytest.raises(FileFormatError, match=str(bad)):
            load_npz(bad)
    flipped = bytearray(blob)
    flipped[len(blob) // 4] ^= 0xFF
    (tmp_path / "flip.npz").write_bytes(bytes(flipped))
    with pytest.raises(FileFormatError):
        load_npz(tmp_path / "flip.npz")
    # a zipfile.BadZipFile never escapes, and the documented type is a ValueError
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04" + os.urandom(200))
    with pytest.raises(ValueError, match="is not a readable moelab .npz file"):
        load_npz(tmp_path / "junk.npz")


def test_pickles_objects_and_foreign_members_are_refused(tmp_path):
    np.savez(tmp_path / "obj.npz", ok=np.arange(3), o=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(FileFormatError, match=r"o: has dtype '\|O'.*never pickled"):
        load_npz(tmp_path / "obj.npz")
    with zipfile.ZipFile(tmp_path / "pkl.npz", "w") as zf:  # a raw pickle named like an array
        zf.writestr("x.npy", pickle.dumps({"evil": 1}))
    with pytest.raises(FileFormatError, match="x: has no valid .npy header"):
        load_npz(tmp_path / "pkl.npz")
    with zipfile.ZipFile(tmp_path / "foreign.npz", "w") as zf:
        zf.writestr("a.npy", _npy(np.arange(3)))
        zf.writestr("payload.pkl", pickle.dumps(1))
    with pytest.raises(FileFormatError, match="payload.pkl: is not an array"):
        load_npz(tmp_path / "foreign.npz")
    with zipfile.ZipFile(tmp_path / "struct.npz", "w") as zf:
        zf.writestr("s.npy", _npy(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])))
    with pytest.raises(FileFormatError, match="s: has dtype"):
        load_npz(tmp_path / "struct.npz")


def test_wrong_versions_methods_and_duplicates(tmp_path):
    with zipfile.ZipFile(tmp_path / "v3.npz", "w") as zf:
        zf.writestr("x.npy", b"\x93NUMPY\x03\x00" + _npy(np.arange(3))[8:])
    with pytest.raises(FileFormatError, match="x: has .npy format version 3.0; moelab reads 1.0 and 2.0"):
        load_npz(tmp_path / "v3.npz")
    with zipfile.ZipFile(tmp_path / "v9.npz", "w") as zf:
        zf.writestr("x.npy", b"\x93NUMPY\x09\x00" + bytes(20))
    with pytest.raises(FileFormatError, match="x: "):
        load_npz(tmp_path / "v9.npz")
    # version 2.0 headers (numpy writes them for big headers) are fine
    with zipfile.ZipFile(tmp_path / "v2.npz", "w") as zf:
        zf.writestr("x.npy", _npy_header((3,), "<i8", (2, 0)) + np.arange(3).tobytes())
    assert load_npz(tmp_path / "v2.npz")["x"].tolist() == [0, 1, 2]
    with zipfile.ZipFile(tmp_path / "bz.npz", "w", compression=zipfile.ZIP_BZIP2) as zf:
        zf.writestr("x.npy", _npy(np.arange(3)))  # bzip2 inflates unboundedly per read: refused
    with pytest.raises(FileFormatError, match="x: uses zip compression method 12"):
        load_npz(tmp_path / "bz.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        with zipfile.ZipFile(tmp_path / "dup.npz", "w") as zf:
            zf.writestr("x.npy", _npy(np.arange(3)))
            zf.writestr("x.npy", _npy(np.arange(4)))
    with pytest.raises(FileFormatError, match="x: appears twice"):
        load_npz(tmp_path / "dup.npz")


def test_missing_arrays_budgets_and_non_files(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.arange(3))
    with pytest.raises(FileFormatError, match=r"a.npz: y: is missing \(required arrays: \['x', 'y'\]"):
        load_npz(tmp_path / "a.npz", required=["x", "y"])
    with pytest.raises(FileFormatError, match="x: has dtype '<i8'; expected kind 'f'"):
        load_npz(tmp_path / "a.npz", dtypes={"x": "f"})
    with pytest.raises(FileFormatError, match="x: is not an array of this format"):
        load_npz(tmp_path / "a.npz", allowed=["z"])
    with pytest.raises(FileFormatError, match="over the budget max_file_bytes"):
        load_npz(tmp_path / "a.npz", max_file_bytes=10)
    np.savez(tmp_path / "many.npz", **{f"a{i}": np.zeros(1) for i in range(20)})
    with pytest.raises(FileFormatError, match="has 20 members, over the budget max_members=5"):
        load_npz(tmp_path / "many.npz", max_members=5)
    # the end record's entry count is checked before zipfile parses a (possibly huge) central directory
    (tmp_path / "eocd.npz").write_bytes(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFE, 0xFFFE, 0, 0, 0))
    with pytest.raises(FileFormatError, match="has 65534 members, over the budget max_members=1024"):
        load_npz(tmp_path / "eocd.npz")
    with pytest.raises(FileFormatError, match="is not a regular file"):
        load_npz(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_npz(tmp_path / "nope.npz")


def test_error_type_is_picklable_and_names_the_field(tmp_path):
    err = FileFormatError(tmp_path / "t.npz", "decode_ids", "is bad")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) == f"{tmp_path / 't.npz'}: decode_ids: is bad"
    assert back.field == "decode_ids" and back.path == tmp_path / "t.npz" and isinstance(back, ValueError)


# ---------------------------------------------------------------------------------------------- ExpertTrace files


def test_trace_roundtrip_and_bundled_trace_still_load(tmp_path):
    t = _toy_trace()
    back = ExpertTrace.load(t.save(tmp_path / "t"))
    assert back.request_ids == t.request_ids and np.array_equal(back.decode_tokens, t.decode_tokens)
    from moelab.datasets import bundled_path

    bundled = ExpertTrace.load(bundled_path("traces", "tiny-moe-heldout.npz"))
    assert len(bundled) == 400
    with pytest.raises(FileNotFoundError, match="no such file"):
        ExpertTrace.load(tmp_path / "absent")


def _set(path: str, value):
    def edit(meta):
        *head, last = path.split(".")
        d = meta
        for key in head:
            d = d[key]
        if value is _DELETE:
            del d[last]
        else:
            d[last] = value
    return edit


_DELETE = object()


def _both(*edits):
    def edit(meta):
        for e in edits:
            e(meta)
    return edit

SIDECAR_CASES = [
    # (edit, field named in the error, words in the problem)
    (_set("request_ids", "abcd"), "request_ids", "must be a list; got str"),
    (_set("request_ids", ["r0", "r1", "r2", 3]), r"request_ids\[3\]", "must be a string; got int"),
    (_set("request_ids", ["r0", "r0", "r2", "r3"]), "request_ids", "unique"),
    (_both(_set("request_ids", ["r0", "r1", "r2"]), _set("domains", ["a", "b", "a"])), "prompt_offsets", r"length N\+1=4"),
    (_set("domains", ["a"]), "domains", "must have 4 entries; got 1"),
    (_set("domains", "abab"), "domains", "must be a list; got str"),
    (_set("request_ids", _DELETE), "request_ids", "is missing"),
    (_set("geometry", _DELETE), "geometry", "is missing"),
    (_set("geometry", [2, 6, 2]), "geometry", "must be a JSON object"),
    (_set("geometry.num_layers", 2.5), "geometry.num_layers", r"must be an integer in \[1, 4096\]; got float 2.5"),
    (_set("geometry.num_layers", "2"), "geometry.num_layers", "must be an integer"),
    (_set("geometry.num_layers", True), "geometry.num_layers", "must be an integer"),
    (_set("geometry.num_layers", 3), "prefill_counts", r"must have shape \(N, L, E\)"),
    (_set("geometry.num_experts", 0), "geometry.num_experts", r"\[1, 65536\]"),
    (_set("geometry.num_experts", 10**12), "geometry.num_experts", r"\[1, 65536\]"),
    (_set("geometry.top_k", 7), "geometry.top_k", r"must be an integer in \[1, 6\]"),
    (_set("geometry.layer_names", ["only-one"]), "geometry.layer_names", "num_layers=2"),
    (_set("geometry.model_name", 5), "geometry.model_name", "must be a string"),
    (_set("provenance", "x"), "provenance", "must be a JSON object"),
    (_set("format_version", 2), "format_version", "this moelab reads version 1"),
    (_set("format_version", "1"), "format_version", "must be an integer"),
    (_set("format", "moelab.Other"), "format", "not a moelab ExpertTrace sidecar"),
    (_set("arrays", ["prompt_tokens"]), "arrays", "must list the core array"),
    (_set("arrays", "decode_ids"), "arrays", "must be a list"),
    (_set("arrays", ["prompt_tokens", "prompt_offsets", "prefill_counts", "decode_ids", "decode_offsets",
                     "prefill_ids", "decode_tokens", "evil"]), "arrays", "unknown array 'evil'"),
]


@pytest.mark.parametrize(("edit", "field", "words"), SIDECAR_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(SIDECAR_CASES)])
def test_bad_sidecars_are_refused_naming_the_field(tmp_path, edit, field, words):
    npz = _write_pair(_toy_trace(), tmp_path / "t", meta_edit=edit)
    with pytest.raises(FileFormatError, match=rf"{field}: .*{words}") as exc:
        ExpertTrace.load(npz)
    assert exc.value.field is not None and str(tmp_path) in str(exc.value)


def _arr(name: str, fn):
    def edit(arrays):
        arrays[name] = fn(arrays[name])
    return edit


def _drop(name: str):
    def edit(arrays):
        del arrays[name]
    return edit


ARRAY_CASES = [
    (_arr("prefill_counts", lambda a: a - 100), "prefill_counts", r"integers in \[0, inf\); got values from -"),
    (_arr("prefill_counts", lambda a: a.astype(np.float64) + 0.5), "prefill_counts", "has dtype '<f8'; expected kind"),
    (_arr("decode_ids", lambda a: a.astype(np.float32) + 0.5), "decode_ids", "has dtype '<f4'; expected kind"),
    (_arr("decode_ids", lambda a: a + 6), "decode_ids", r"integers in \[0, num_experts=6\)"),
    (_arr("prefill_ids", lambda a: -a - 1), "prefill_ids", r"integers in \[0, num_experts=6\)"),
    (_arr("prompt_tokens", lambda a: a - 1000), "prompt_tokens", r"integers in \[0, inf\)"),
    (_arr("prompt_offsets", lambda a: a[::-1].copy()), "prompt_offsets", "non-decreasing"),
    (_arr("decode_offsets", lambda a: a[:-1]), "decode_offsets", r"length N\+1=5"),
    (_arr("decode_tokens", lambda a: a[:-1]), "decode_tokens", r"shape \(sum T,\)"),
    (_arr("decode_ids", lambda a: np.array([{"x": 1}], dtype=object)), "decode_ids", "never pickled"),
    (_drop("decode_ids"), "decode_ids", "is missing"),
    (_drop("prefill_ids"), "prefill_ids", "is missing"),
]


@pytest.mark.parametrize(("edit", "field", "words"), ARRAY_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(ARRAY_CASES)])
def test_bad_trace_arrays_are_refused_naming_the_field(tmp_path, edit, field, words):
    npz = _write_pair(_toy_trace(), tmp_path / "t", arrays_edit=edit)
    with pytest.raises(FileFormatError, match=rf"t.npz: {field}: .*{words}"):
        ExpertTrace.load(npz)


def test_extra_array_not_in_sidecar_and_trace_budgets(tmp_path):
    npz = _write_pair(_toy_trace(), tmp_path / "t", arrays_edit=lambda a: a.update(prefill_probs=np.zeros((4, 2, 6))))
    with pytest.raises(FileFormatError, match="prefill_probs: is not an array of this format"):
        ExpertTrace.load(npz)
    npz = _toy_trace().save(tmp_path / "u")
    with pytest.raises(FileFormatError, match="over the budget max_bytes"):
        ExpertTrace.load(npz, max_bytes=100)
    with pytest.raises(FileFormatError, match=r"u.json: is .*over the budget max_bytes"):
        ExpertTrace.load(npz, max_sidecar_bytes=10)
    npz.with_suffix(".json").write_bytes(b"\xff\xfe{")
    with pytest.raises(FileFormatError, match="not valid JSON"):
        ExpertTrace.load(npz)
    npz.with_suffix(".json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FileFormatError, match="not valid JSON"):
        ExpertTrace.load(npz)
    npz.with_suffix(".json").write_text("[1, 2]")
    with pytest.raises(FileFormatError, match="must be a JSON object; got list"):
        ExpertTrace.load(npz)


def test_constructors_refuse_what_files_would_smuggle_in():
    t = _toy_trace()
    g = t.geometry
    with pytest.raises(ValueError, match="num_layers must be an integer"):
        Geometry(2.5, 6, 2)
    with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, num_experts=6\]"):
        Geometry(2, 6, 7)
    with pytest.raises(ValueError, match="request_ids must be a list of strings"):
        ExpertTrace("abcd", t.domains, t.prompt_tokens, t.prompt_offsets, t.prefill_counts, t.decode_ids,
                    t.decode_offsets, g)
    with pytest.raises(ValueError, match="prefill_counts must hold integers"):
        ExpertTrace(t.request_ids, t.domains, t.prompt_tokens, t.prompt_offsets, -t.prefill_counts, t.decode_ids,
                    t.decode_offsets, g)
    with pytest.raises(ValueError, match="decode_ids must be an integer array"):
        ExpertTrace(t.request_ids, t.domains, t.prompt_tokens, t.prompt_offsets, t.prefill_counts,
                    t.decode_ids.astype(np.float64), t.decode_offsets, g)
    base = dict(request_ids=["a"], domains=["x"], prompt_tokens=[np.arange(3)], prefill_counts=np.zeros((1, 2, 6)),
                geometry=g)
    with pytest.raises(ValueError, match=r"decode_ids\[0\] must be an array of expert ids in \[0, num_experts=6\); got 1.5"):
        ExpertTrace.from_requests(**base, decode_ids=[np.full((1, 2, 2), 1.5)])
    with pytest.raises(ValueError, match=r"decode_ids\[0\] must have shape \(T, 2, 2\); got shape \(5,\)"):
        ExpertTrace.from_requests(**base, decode_ids=[np.arange(5)])
    with pytest.raises(ValueError, match="request_ids must be a list of strings, one per request; got a single str"):
        ExpertTrace.from_requests(**{**base, "request_ids": "a"}, decode_ids=[np.zeros((1, 2, 2))])
    with pytest.raises(ValueError, match=r"prompt_tokens\[0\] must be an array of token ids"):
        ExpertTrace.from_requests(**{**base, "prompt_tokens": [np.array([1.5, 2.7])]}, decode_ids=[np.zeros((1, 2, 2))])
    with pytest.raises(ValueError, match="prefill_counts must be an array of integers"):
        ExpertTrace.from_requests(**{**base, "prefill_counts": -np.ones((1, 2, 6))}, decode_ids=[np.zeros((1, 2, 2))])
    with pytest.raises(ValueError, match=r"requests must be an array of integers in \[0, number of requests=4\)"):
        t.distinct_experts(np.array([0, 9]))
    with pytest.raises(ValueError, match=r"idx must be an array of integers in \[0, number of requests=4\)"):
        t.subset([-1])
    from moelab.traces import expert_counts

    with pytest.raises(ValueError, match="topk_ids must be an array of expert ids.*got 1.5"):
        expert_counts(np.full((1, 2, 2), 1.5), 6)


# ---------------------------------------------------------------------------------------------- handles


@needs_proc
def test_no_file_handle_leaks_on_any_hostile_file(tmp_path):
    good = _toy_trace().save(tmp_path / "good")
    blob = good.read_bytes()
    corpus = []
    for i, cut in enumerate((1, 30, len(blob) // 2, len(blob) - 5)):
        (tmp_path / f"c{i}.npz").write_bytes(blob[:cut])
        corpus.append(tmp_path / f"c{i}.npz")
    np.savez(tmp_path / "obj.npz", o=np.array([None], dtype=object))
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as zf:
        zf.writestr("x.npy", _npy_header((10**11,)))
    corpus += [tmp_path / "obj.npz", tmp_path / "huge.npz", _zip_bomb(tmp_path / "bomb.npz", n_mib=600)]
    errors = []  # kept alive on purpose: a handle referenced from a traceback would stay open
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        before = _open_fds()
        for path in corpus:
            for _ in range(3):
                try:
                    load_npz(path)
                except FileFormatError as exc:
                    errors.append(exc)
        assert len(errors) == 3 * len(corpus)
        assert _open_fds() == before
        del errors
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


# ---------------------------------------------------------------------------------------------- JSON


def test_json_records_name_file_and_dotted_key(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"a": 1, "s": "x", "xs": ["p", "q"], "n": {"k": 2.0, "f": 0.5}, "b": True}))
    rec = read_json_record(p)
    assert rec.get_int("a", low=0) == 1 and rec.get_record("n").get_int("k") == 2
    assert rec.get_str_list("xs", length=2) == ["p", "q"] and rec.get_bool("b") is True
    assert rec.get_record("n").get_real("f", low=0, high=1) == 0.5
    assert rec.get_str("missing", "dflt") == "dflt"
    for call, pattern in (
        (lambda: rec.get_int("a", high=0), r"r.json: a: must be an integer in \[-inf, 0\]; got int 1"),
        (lambda: rec.get_record("n").get_int("f"), r"n.f: must be an integer"),
        (lambda: rec.get_record("n").get_real("f", low=1), r"n.f: must be a finite number in \[1, inf\]"),
        (lambda: rec.get_str("s", choices=["y"]), r"s: must be one of \['y'\]"),
        (lambda: rec.get_str_list("s"), "s: must be a list; got str 'x'"),
        (lambda: rec.get_str_list("xs", length=3), "xs: must have 3 entries; got 2"),
        (lambda: rec.get_bool("a"), "a: must be true or false"),
        (lambda: rec.get("nope"), "nope: is missing"),
        (lambda: rec.get_list("a", max_length=1), "a: must be a list"),
    ):
        with pytest.raises(FileFormatError, match=pattern):
            call()
    p.write_text('{"v": NaN}')
    with pytest.raises(FileFormatError, match="v: must be a finite number"):
        read_json_record(p).get_real("v")
    p.write_text("1" * 5000)  # Python refuses ints this long: still our error
    with pytest.raises(FileFormatError, match="not valid JSON"):
        read_json(p)
    with pytest.raises(FileFormatError, match="must be a JSON object"):
        JsonRecord([1], p)


# ---------------------------------------------------------------------------------------------- CSV

COLUMNS = {"model": "str", "B": "int", "ms": "float"}


def _csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "table.csv"
    p.write_text(text)
    return p


def test_checked_csv_reads_good_tables_and_the_bundled_calibration(tmp_path):
    df = read_csv_checked(_csv(tmp_path, "model,B,ms,note\nm1,1,0.5,x\nm2, 4 ,1e-3,y\nm3,8.0,2,z\n"), COLUMNS)
    assert df["B"].tolist() == [1, 4, 8] and df["B"].dtype == np.int64 and df["ms"].dtype == np.float64
    assert df["note"].tolist() == ["x", "y", "z"]
    from moelab.datasets import repo_root

    for table in sorted((repo_root() / "data" / "calibration" / "h200").glob("*.csv")):
        cols = {c: "float" for c in table.read_text().splitlines()[0].split(",") if c not in ("model", "method", "shape")}
        assert len(read_csv_checked(table, cols)) > 0


@pytest.mark.parametrize(("text", "pattern", "kwargs"), [
    ("model,B\nm,1\n", r"table.csv: ms: column is missing", {}),
    ("model,B,ms\nm,1,fast\n", r"ms: must hold a finite number >= 0 in every row; row 1 has 'fast'", {}),
    ("model,B,ms\nm,1,0.1\nm,2,nan\n", r"ms: .*row 2 has 'nan'", {}),
    ("model,B,ms\nm,1,inf\n", r"ms: .*row 1 has 'inf'", {}),
    ("model,B,ms\nm,-1,0.1\n", r"B: must hold an integer >= 0 in every row; row 1 has '-1'", {}),
    ("model,B,ms\nm,2.5,0.1\n", r"B: must hold an integer .*row 1 has '2.5'", {}),
    ("model,B,ms\nm,1e30,0.1\n", r"B: must hold an integer", {}),
    ("model,B,ms\nm,,0.1\n", r"B: .*row 1 has ''", {}),
    ("model,B,ms\n,1,0.1\n", r"model: row 1 is empty", {}),
    ("model,B,ms\n", r"has 0 data rows; at least 1 needed", {}),
    ("", r"is not a readable CSV table", {}),
    ('model,B,ms\n"m,1,0.1\n', r"is not a readable CSV table", {}),
    ("model,B,ms\nm,1,0.1,extra,more\n", r"is not a readable CSV table", {}),
    ("model,B,ms\nm,1,0.1\nm,1,0.1,x\n", r"is not a readable CSV table", {}),
    ("model,B,ms\nm,1\n", r"ms: .*row 1 has ''", {}),
    ("model,B,B,ms\nm,1,2,0.1\n", r"B: column appears more than once", {}),
    ("model,B,ms\n" + "m,1,0.1\n" * 20, r"more than max_rows=10 rows", {"max_rows": 10}),
    ("model,B,ms\nm,1,0.1\n", r"over the budget max_bytes", {"max_bytes": 8}),
])
def test_checked_csv_refuses_bad_tables(tmp_path, text, pattern, kwargs):
    with pytest.raises(FileFormatError, match=pattern):
        read_csv_checked(_csv(tmp_path, text), COLUMNS, **kwargs)


def test_checked_csv_sign_checks_only_the_named_columns(tmp_path):
    p = _csv(tmp_path, "model,B,ms\nm,1,-0.1\n")
    assert read_csv_checked(p, COLUMNS, non_negative=["B"])["ms"].tolist() == [-0.1]
    with pytest.raises(FileFormatError, match="ms: must hold a finite number >= 0"):
        read_csv_checked(p, COLUMNS)


def test_checked_csv_refuses_non_utf8_and_bad_schemas(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(b"model,B,ms\n\xff\xfe,1,2\n")
    with pytest.raises(FileFormatError, match="not a readable CSV"):
        read_csv_checked(p, COLUMNS)
    with pytest.raises(ValueError, match=r"columns\['B'\] must be one of \['int', 'float', 'str'\]"):
        read_csv_checked(p, {"B": "integer"})
