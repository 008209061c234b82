"""A fixed, seeded battery of hostile files through every file loader (issue 29): the figures
``file_cases_run`` and ``file_cases_unexpected`` of ``moelab bench reliability``.

Each loader starts from a small valid file it wrote itself (an expert trace in both formats, its JSON
sidecar, HD n-gram and suffix stores, a sweep-cache entry, a calibration table, an acceptance recording,
a request-trace CSV, a verify-cost curve, a JSON record); the battery mutates the file's bytes
(truncations, flipped and inserted bytes, random garbage, an empty file, deep JSON nesting, numbers
replaced by huge, negative, fractional or non-finite ones) and loads each result. The expected outcomes
are a correct load or one of the project's clear errors (:data:`EXPECTED`: ``ValueError``, which
:class:`moelab.traces.FileFormatError` and the HD stores' ``StoreFileError`` are); anything else (an
``IndexError``, a ``RecursionError``, a ``MemoryError``, a pandas parser error that is not a
``ValueError``...) or a load slower than :data:`MAX_CASE_S` is *unexpected*. The property-based tests
(``tests/test_hypothesis_files.py``) drive the same loaders with hypothesis-chosen mutations.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import read_json_record
from moelab._validate import check_int
from moelab.costmodel.models import AttentionModel
from moelab.costmodel.tables import calibration_folder, read_calibration_table
from moelab.costmodel.verify import load_curve_json, machine_id
from moelab.dsd.acceptance import (
    AcceptanceTrace,
    chains_proposer,
    load_traces,
    record_acceptance,
    save_traces,
)
from moelab.hd.ngram import NGramTable
from moelab.hd.suffix import SuffixStore
from moelab.sweep.core import decode_entry, encode_entry
from moelab.traces import ExpertTrace, Geometry, RequestTrace, load_trace
from moelab.traces.compact import save_compact_trace

#: what a loader may raise on a hostile file: the project's clear errors (FileFormatError, StoreFileError
#: and every parameter error are ValueErrors)
EXPECTED: tuple[type[BaseException], ...] = (ValueError,)
#: a single hostile file that takes longer than this to load or refuse counts as unexpected
MAX_CASE_S = 10.0


@dataclass(frozen=True)
class Loader:
    """One loader of untrusted files: ``make(folder)`` writes a valid file and returns the path whose
    bytes the battery mutates; ``load(path)`` reads it as moelab does."""

    name: str
    make: Callable[[Path], Path]
    load: Callable[[Path], Any]


# --------------------------------------------------------------------------------------- valid files

def toy_trace(n: int = 4, L: int = 2, E: int = 8, k: int = 2, seed: int = 0) -> ExpertTrace:
    """A tiny seeded :class:`~moelab.traces.ExpertTrace` (prefill ids, counts and decode ids)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 500, size=int(rng.integers(2, 6))) for _ in range(n)]
    pre = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in p]) for p in prompts]
    counts = np.stack([np.stack([np.bincount(ids[:, layer].ravel(), minlength=E) for layer in range(L)]) for ids in pre])
    dec = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(3)]) for _ in range(n)]
    return ExpertTrace.from_requests(request_ids=[f"r{i}" for i in range(n)], domains=["a", "b"] * (n // 2),
                                     prompt_tokens=prompts, prefill_counts=counts, decode_ids=dec,
                                     geometry=Geometry(L, E, k, "toy"), prefill_ids=pre,
                                     decode_tokens=[rng.integers(0, 500, 3) for _ in range(n)])


def _plain_trace(folder: Path) -> Path:
    return Path(toy_trace().save(folder / "t")).with_suffix(".npz")


def _compact_trace(folder: Path) -> Path:
    return Path(save_compact_trace(toy_trace(), folder / "c")).with_suffix(".npz")


def _load_trace(path: Path) -> Any:
    return load_trace(path.with_suffix(".npz"))


_TOY_TOKENIZER = {"name": "toy", "vocab_size": 64, "sha256": "0" * 64}


def _ngram_store(folder: Path) -> Path:
    seqs = [np.random.default_rng(i).integers(0, 64, 40) for i in range(4)]
    table = NGramTable.build(seqs, length=4, meta={"kind": "model", "tokenizer": _TOY_TOKENIZER})
    return Path(table.save(folder / "s.npz"))


def _load_ngram(path: Path) -> Any:
    return NGramTable.load(path)


def _suffix_store(folder: Path) -> Path:
    docs = [np.random.default_rng(i).integers(0, 64, 50) for i in range(3)]
    store = SuffixStore.build(docs, vocab_size=64, meta={"kind": "statistics", "tokenizer": _TOY_TOKENIZER})
    return Path(store.save(folder / "l.npz"))


def _load_suffix(path: Path) -> Any:
    return SuffixStore.load(path)


_SWEEP_KEY = "a" * 64
_SWEEP_PARAMS = {"rate": 1.0, "router": "jsq"}


def _sweep_entry(folder: Path) -> Path:
    path = folder / f"{_SWEEP_KEY}.parquet"
    path.write_bytes(encode_entry(_SWEEP_KEY, _SWEEP_PARAMS, [{**_SWEEP_PARAMS, "tpot_ms": 12.5, "n": 3}]))
    return path


def _load_sweep(path: Path) -> Any:
    return decode_entry(path.read_bytes(), _SWEEP_KEY, str(path), params=_SWEEP_PARAMS)


def _calibration_table(folder: Path) -> Path:
    src = calibration_folder("h200") / "attn_step.csv"
    lines = src.read_text(encoding="utf-8").splitlines()[:40]
    (folder / "cal").mkdir(exist_ok=True)
    path = folder / "cal" / "attn_step.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _load_calibration(path: Path) -> Any:
    return AttentionModel.from_table(read_calibration_table(path.parent, path.stem))


def _acceptance(folder: Path) -> Path:
    rec = record_acceptance(chains_proposer(np.array([[2, 3], [3, 9], [4, 5], [5, 6]])), [1, 2], [3, 4, 5, 6],
                            gamma_max=2, question_id=7, category="toy")
    trace = AcceptanceTrace("chains", "toy", 2, [rec], {"note": "toy"})
    return Path(save_traces(folder / "acc.json", {"chains": trace}))


def _load_acceptance(path: Path) -> Any:
    traces, _ = load_traces(path)
    for t in traces.values():
        t.rounds()
    return traces


def _request_csv(folder: Path) -> Path:
    path = folder / "requests.csv"
    path.write_text("arrival_s,prompt_len,output_len\n0,12,4\n0.5,30,7\n1.25,8,0\n2,100,16\n", encoding="utf-8")
    return path


def _load_request_csv(path: Path) -> Any:
    return RequestTrace.from_csv(path)


def _verify_curve(folder: Path) -> Path:
    path = folder / "curve.json"
    path.write_text(json.dumps({"qs": [1, 2, 4, 8], "ms": [10.0, 10.5, 11.0, 13.0], "source": "toy",
                                "machine": machine_id(), "engine": "hf", "model": "toy"}), encoding="utf-8")
    return path


def _load_verify_curve(path: Path) -> Any:
    cost = load_curve_json(path)
    return cost(np.arange(1, 9))


def _json_record(folder: Path) -> Path:
    path = folder / "record.json"
    path.write_text(json.dumps({"a": [1, 2.5, "x"], "b": {"c": None, "d": [True, {"e": -3}]}}), encoding="utf-8")
    return path


def _load_json(path: Path) -> Any:
    rec = read_json_record(path)
    return rec.get("a", None)


LOADERS: tuple[Loader, ...] = (
    Loader("trace-npz", _plain_trace, _load_trace),
    Loader("trace-sidecar", lambda d: _plain_trace(d).with_suffix(".json"), _load_trace),
    Loader("compact-trace-npz", _compact_trace, _load_trace),
    Loader("compact-trace-sidecar", lambda d: _compact_trace(d).with_suffix(".json"), _load_trace),
    Loader("hd-ngram-store", _ngram_store, _load_ngram),
    Loader("hd-suffix-store", _suffix_store, _load_suffix),
    Loader("sweep-cache-entry", _sweep_entry, _load_sweep),
    Loader("calibration-table", _calibration_table, _load_calibration),
    Loader("acceptance-recording", _acceptance, _load_acceptance),
    Loader("request-trace-csv", _request_csv, _load_request_csv),
    Loader("verify-cost-curve", _verify_curve, _load_verify_curve),
    Loader("json-record", _json_record, _load_json),
)


# --------------------------------------------------------------------------------------- mutations

_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_HOSTILE_NUMBERS = (b"-1", b"0", b"2.5", b"1e400", b"-1e400", b"NaN", b"Infinity", b"99999999999999999999999",
                    b"4611686018427387904", b"65536")


def mutate(data: bytes, kind: str, rng: np.random.Generator) -> bytes:
    """``data`` mutated by ``kind`` (one of :data:`MUTATIONS`), positions and values from ``rng``."""
    n = len(data)
    if kind == "empty":
        return b""
    if kind == "truncate":
        return data[: int(rng.integers(0, max(n, 1)))]
    if kind == "flip":
        out = bytearray(data)
        for i in rng.integers(0, max(n, 1), size=int(rng.integers(1, 9))):
            if out:
                out[int(i)] ^= int(rng.integers(1, 256))
        return bytes(out)
    if kind == "insert":
        i = int(rng.integers(0, n + 1))
        return data[:i] + rng.bytes(int(rng.integers(1, 64))) + data[i:]
    if kind == "garbage":
        return rng.bytes(max(n, 1))
    if kind == "deep":
        return b"[" * 100_000 + b"]" * 100_000 if rng.random() < 0.5 else b'{"a":' * 5_000 + b"1" + b"}" * 5_000
    if kind == "numbers":
        spans = list(_NUMBER.finditer(data))
        if not spans:
            return data
        out, last = [], 0
        chosen = set(rng.choice(len(spans), size=min(len(spans), int(rng.integers(1, 4))), replace=False).tolist())
        for j, m in enumerate(spans):
            if j in chosen:
                out += [data[last:m.start()], _HOSTILE_NUMBERS[int(rng.integers(len(_HOSTILE_NUMBERS)))]]
                last = m.end()
        return b"".join(out) + data[last:]
    raise ValueError(f"kind must be one of {list(MUTATIONS)}; got {kind!r}")


MUTATIONS = ("empty", "truncate", "flip", "insert", "garbage", "deep", "numbers")


def load_outcome(loader: Loader, path: Path, *, max_s: float = MAX_CASE_S) -> str:
    """``"ok"`` (loaded), ``"refused"`` (one of :data:`EXPECTED`) or ``"unexpected: <what>"``."""
    t0 = time.perf_counter()
    try:
        loader.load(path)
        outcome = "ok"
    except EXPECTED:
        outcome = "refused"
    except Exception as exc:  # the battery's point: anything else is counted, not raised
        return f"unexpected: {type(exc).__name__}: {str(exc)[:160]}"
    took = time.perf_counter() - t0
    return f"unexpected: took {took:.1f} s (> {max_s:g} s)" if took > max_s else outcome


def run_battery(*, seed: int = 0, cases_per_loader: int = 21, loaders: tuple[Loader, ...] = LOADERS) -> dict[str, Any]:
    """Load ``cases_per_loader`` hostile variants of each loader's valid file (mutations cycled, seeded).

    Returns ``file_cases_run``, ``file_cases_unexpected``, outcome counts per loader and up to 20
    unexpected cases (loader, mutation, what happened)."""
    cases_per_loader = check_int("cases_per_loader", cases_per_loader, low=1, high=10_000)
    rng = np.random.default_rng(check_int("seed", seed, low=0))
    run, unexpected, per = 0, [], {}
    with tempfile.TemporaryDirectory(prefix="moelab-files-") as tmp:
        for loader in loaders:
            folder = Path(tmp) / loader.name
            folder.mkdir()
            target = loader.make(folder)
            if load_outcome(loader, target) != "ok":
                raise RuntimeError(f"the battery's valid {loader.name} file does not load")
            pristine = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
            counts = {"ok": 0, "refused": 0, "unexpected": 0}
            for i in range(cases_per_loader):
                kind = MUTATIONS[i % len(MUTATIONS)]
                for p, data in pristine.items():
                    p.write_bytes(data)
                target.write_bytes(mutate(pristine[target], kind, rng))
                outcome = load_outcome(loader, target)
                run += 1
                key = outcome.split(":")[0]
                counts[key] += 1
                if key == "unexpected" and len(unexpected) < 20:
                    unexpected.append({"loader": loader.name, "mutation": kind, "outcome": outcome})
            per[loader.name] = counts
            shutil.rmtree(folder, ignore_errors=True)
    return {"file_cases_run": run, "file_cases_unexpected": sum(c["unexpected"] for c in per.values()),
            "per_loader": per, "unexpected": unexpected}


__all__ = ["EXPECTED", "LOADERS", "MAX_CASE_S", "MUTATIONS", "Loader", "load_outcome", "mutate", "run_battery",
           "toy_trace"]
