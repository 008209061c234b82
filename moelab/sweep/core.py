"""Parameter grids, content-addressed result cache and the sweep runner.

A sweep calls ``fn(**point)`` for every point of a grid (the Cartesian product of named value lists).
Each point's result is cached as one parquet file named by the SHA-256 of

    the function's name + the point's parameters + a code version + a data hash,

so a rerun computes only what is missing, an interrupted run resumes where it stopped (every
finished point is written, atomically, as soon as it arrives), and a change to the code or the data
starts afresh. An entry that cannot be read back (truncated, foreign, too large, written for another
key) is recomputed with a :class:`SweepCacheWarning` naming the file. Results are never pickled.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import itertools
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from moelab import __version__
from moelab._io import FileFormatError, atomic_write_bytes
from moelab._validate import MAX_CLI_VALUE_CHARS, check_choice, check_int, parse_cli_literal
from moelab.datasets import cache_dir as moelab_cache_dir
from moelab.sweep.backends import execute

#: Where a sweep's points run: ``serial`` (this process), ``local`` (a process pool) or ``ray`` (Ray tasks).
BACKENDS = ("serial", "local", "ray")
MAX_ENTRY_BYTES = 64 * 2**20  # one cache entry; larger files are not read
MAX_DECODED_BYTES = 256 * 2**20  # one entry's columns as its footer declares them, before decoding
MAX_ENTRY_ROWS = 1_000_000
#: points in one grid: each is a function call and a cache file, so 10^6 is already days of work; the
#: product is computed from the axis lengths before any point is built
MAX_GRID_POINTS = 1_000_000
_KEY_META = b"moelab.sweep.key"
_PARAMS_META = b"moelab.sweep.params"

Scalar = bool | int | float | str | None


class SweepCacheWarning(UserWarning):
    """A cache entry could not be used and its point is recomputed (the message names the file)."""


# ---------------------------------------------------------------------------------------------- grids

def _scalar(name: str, value: Any) -> Scalar:
    """A JSON-stable scalar (numpy scalars unwrapped); anything else is refused."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"grid parameter {name!r} must hold finite numbers; got {value!r}")
        return value
    raise ValueError(f"grid parameter {name!r} values must be numbers, strings, booleans or None; "
                     f"got {type(value).__name__} {value!r}")


def expand_grid(grid: Mapping[str, Sequence[Any]], *, allowed: Iterable[str] | None = None) -> list[dict[str, Scalar]]:
    """Every point of ``grid`` (Cartesian product, in the order the axes and values are given).

    Parameters
    ----------
    grid : mapping of str to sequence
        Parameter name -> non-empty list of distinct scalar values.
    allowed : iterable of str, optional
        The parameter names the swept function takes; any other name is an error.

    Raises
    ------
    ValueError
        An unknown parameter, an empty value list, a repeated value, or a non-scalar value.
    """
    if not isinstance(grid, Mapping):
        raise ValueError(f"grid must be a mapping of parameter name -> list of values; got {type(grid).__name__}")
    if allowed is not None:
        allowed = list(allowed)
        unknown = [k for k in grid if k not in allowed]
        if unknown:
            raise ValueError(f"unknown grid parameter(s) {unknown}; the parameters are {sorted(allowed)}")
    axes: list[list[Scalar]] = []
    for name, values in grid.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"grid parameter names must be identifiers; got {name!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ValueError(f"grid parameter {name!r} needs a list of values; got {values!r}")
        vals = [_scalar(name, v) for v in values]
        if not vals:
            raise ValueError(f"grid parameter {name!r} has an empty value list")
        seen: list[str] = []
        for v in vals:
            canon = json.dumps(v)
            if canon in seen:
                raise ValueError(f"grid parameter {name!r} repeats the value {v!r}")
            seen.append(canon)
        axes.append(vals)
    names = list(grid)
    check_grid_size(math.prod(len(a) for a in axes))
    return [dict(zip(names, combo)) for combo in itertools.product(*axes)]


def check_grid_size(points: int) -> int:
    """``points`` if a grid that size may be run, else a ``ValueError`` naming the cap and why."""
    if points > MAX_GRID_POINTS:
        raise ValueError(f"grid has {points} points, over the cap MAX_GRID_POINTS={MAX_GRID_POINTS} (every point "
                         "is a call and a cache file); split the sweep or narrow an axis")
    return points


def parse_grid_args(pairs: Sequence[str]) -> dict[str, list[Scalar]]:
    """``["rate=20,60", "router=jsq,eldr"]`` -> ``{"rate": [20, 60], "router": ["jsq", "eldr"]}``.

    Values are Python literals where they parse as one (``20``, ``0.1``, ``True``, ``None``), else
    strings. An empty list (``rate=``) and a name given twice are errors."""
    out: dict[str, list[Scalar]] = {}
    for pair in pairs:
        if len(pair) > MAX_CLI_VALUE_CHARS:
            raise ValueError(f"--grid entry {pair[:40]!r}... is {len(pair)} characters long, over the cap of "
                             f"{MAX_CLI_VALUE_CHARS} for one command-line value (pass a list of points instead)")
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"--grid entries must look like name=v1,v2,...; got {pair!r}")
        if name in out:
            raise ValueError(f"--grid names {name!r} twice; give all its values in one entry")
        items = [s.strip() for s in raw.split(",")] if raw.strip() else []
        if not items or any(s == "" for s in items):
            raise ValueError(f"grid parameter {name!r} has an empty value list (or an empty value): {pair!r}")
        values: list[Scalar] = []
        for s in items:
            values.append(_scalar(name, parse_cli_literal(f"--grid {name}", s)))
        out[name] = values
    return out


# ----------------------------------------------------------------------------- code and data versions

@lru_cache(maxsize=64)
def _tree_hash(target: str) -> str:
    try:
        spec = importlib.util.find_spec(target)
    except ValueError:  # e.g. __main__ of a script (no spec): its file stands for its code
        spec = None
        origin = getattr(sys.modules.get(target), "__file__", None)
        if origin:
            spec = importlib.util.spec_from_file_location(target, origin)
    if spec is None:
        raise ValueError(f"code_version: no module or package named {target!r}")
    if spec.submodule_search_locations:  # a package: every .py file below it
        roots = [Path(p) for p in spec.submodule_search_locations]
        files = sorted((f.relative_to(r).as_posix(), f) for r in roots for f in r.rglob("*.py"))
    elif spec.origin and spec.origin.endswith(".py"):
        files = [(Path(spec.origin).name, Path(spec.origin))]
    else:  # an extension or built-in module: its version string stands in for its code
        mod = importlib.import_module(target)
        return hashlib.sha256(f"{target}=={getattr(mod, '__version__', '?')}".encode()).hexdigest()
    h = hashlib.sha256()
    for rel, path in files:
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def code_version(*targets: str, extra: Sequence[str] = ()) -> str:
    """A short hash of the source of the named modules/packages (every ``.py`` below a package),
    moelab's version and any ``extra`` strings (e.g. a dependency's version)."""
    h = hashlib.sha256(f"moelab {__version__}".encode())
    for t in sorted(set(targets)):
        h.update(f"{t}:{_tree_hash(t)}".encode())
    for e in extra:
        h.update(b"extra:" + str(e).encode())
    return h.hexdigest()[:16]


def function_fingerprint(fn: Callable[..., Any]) -> str:
    """A hash of ``fn``'s compiled code (bytecode, names, constants, nested functions): what stands for its
    source when its module has no file. Stable across runs, unlike ``marshal`` (whose output depends on
    reference counts)."""
    def walk(code: Any, h: Any) -> None:
        h.update(code.co_code)
        h.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
        for c in code.co_consts:
            if hasattr(c, "co_code"):
                walk(c, h)
            else:
                h.update(repr(c).encode())

    code = getattr(fn, "__code__", None)
    if code is None:
        raise ValueError(f"code_version: {fn!r} has no Python code to stand for its source")
    h = hashlib.sha256(getattr(fn, "__qualname__", "").encode())
    walk(code, h)
    return h.hexdigest()[:16]


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def _file_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FILE_HASHES:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        _FILE_HASHES[key] = h.hexdigest()
    return _FILE_HASHES[key]


def data_hash(paths: Iterable[str | os.PathLike]) -> str:
    """A short hash of the contents of the given files (folders: every file below them)."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"data_hash: no such file or folder: {p}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + _file_sha256(f).encode())
    return h.hexdigest()[:16]


def function_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function (what the cache key and workers use)."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not mod or not qual or "<locals>" in qual or "<lambda>" in qual:
        raise ValueError(f"sweep functions must be module-level functions (picklable by name); got {fn!r}")
    return f"{mod}:{qual}"


def point_key(fn_name: str, params: Mapping[str, Scalar], code: str, data: str) -> str:
    """The cache key of one point: SHA-256 of the canonical JSON of name, parameters and versions."""
    blob = json.dumps({"fn": fn_name, "params": dict(params), "code": code, "data": data},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------------------------- cache entries

def _rows(name: str, params: Mapping[str, Scalar], result: Any) -> list[dict[str, Any]]:
    """The result of one call as rows: a dict is one row, a DataFrame or list of dicts several."""
    if isinstance(result, Mapping):
        rows = [dict(result)]
    elif isinstance(result, pd.DataFrame):
        rows = result.to_dict(orient="records")
    elif isinstance(result, list) and all(isinstance(r, Mapping) for r in result):
        rows = [dict(r) for r in result]
    else:
        raise ValueError(f"{name} must return a dict (one row), a list of dicts or a DataFrame; "
                         f"got {type(result).__name__} for {dict(params)}")
    if not rows:
        raise ValueError(f"{name} returned no rows for {dict(params)}")
    out = []
    for row in rows:
        for k, v in params.items():  # a result column named like a parameter must agree with it
            if k in row and not _same(row[k], v):
                raise ValueError(f"{name} returned {k}={row[k]!r} for the point {k}={v!r}; a result column named "
                                 "like a parameter must hold the parameter's value")
        out.append({**params, **{k: v for k, v in row.items() if k not in params}})
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.generic):
        a = a.item()
    try:
        return bool(a == b) or (a is None and b is None)
    except (TypeError, ValueError):
        return False


def encode_entry(key: str, params: Mapping[str, Scalar], rows: list[dict[str, Any]]) -> bytes:
    """Parquet bytes of one point's rows, with its key and parameters in the schema metadata."""
    table = pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False, nthreads=1)  # one thread: see decode_entry
    meta = dict(table.schema.metadata or {})
    meta[_KEY_META] = key.encode()
    meta[_PARAMS_META] = json.dumps(dict(params), sort_keys=True).encode()
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), buf)
    return buf.getvalue()


def decode_entry(data: bytes, key: str, source: str = "<bytes>", params: Mapping[str, Scalar] | None = None, *,
                 max_decoded_bytes: int = MAX_DECODED_BYTES) -> pd.DataFrame:
    """The rows of a cache entry; ``ValueError`` when it is unreadable, too big, or not this point's.

    Only the parquet footer is read first: the stored key, the stored parameters (compared with ``params``
    when given) and the declared uncompressed size (at most ``max_decoded_bytes``) are checked before a
    single column is decoded. After decoding, every parameter column must hold the requested value, so an
    entry whose rows were swapped for another point's is never served as this point.
    """
    try:
        meta = pq.read_metadata(io.BytesIO(data))
        schema_meta = meta.schema.to_arrow_schema().metadata or {}
        declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        raise ValueError(f"{source} is not a readable parquet file ({exc})") from None
    stored = schema_meta.get(_KEY_META, b"").decode(errors="replace")
    if stored != key:
        raise ValueError(f"{source} holds the entry for key {stored[:16] or '(none)'}..., not {key[:16]}...")
    if declared > max_decoded_bytes or meta.num_rows > MAX_ENTRY_ROWS:
        raise ValueError(f"{source} declares {meta.num_rows} rows and {declared} uncompressed bytes, over the cap "
                         f"of {MAX_ENTRY_ROWS} rows and max_decoded_bytes={max_decoded_bytes} for one sweep point")
    if params is not None:
        want = json.dumps(dict(params), sort_keys=True)
        have = schema_meta.get(_PARAMS_META, b"").decode(errors="replace")
        if have != want:
            raise ValueError(f"{source} stores the point {have[:120] or '(none)'}, not the requested {want[:120]}")
    try:
        # all on this thread: a point is a few rows, and work left on Arrow's thread pools aborted the
        # interpreter at exit ("terminate called without an active exception"): read_table goes through the
        # dataset scanner, whose I/O thread dropped the Python-owned buffer during shutdown and died taking
        # the GIL. ParquetFile.read is the plain synchronous reader
        with pq.ParquetFile(pa.BufferReader(data), pre_buffer=False) as pf:
            frame = pf.read(use_threads=False).to_pandas(use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ValueError(f"{source} is not a readable parquet file ({exc})") from None
    for name, value in (params or {}).items():
        if name not in frame.columns or not all(_same(v, value) for v in frame[name].tolist()):
            raise ValueError(f"{source}: its rows are not the point's rows (column {name!r} does not hold {value!r})")
    return frame


class ResultCache:
    """One parquet file per point under ``root`` (``<root>/<key[:2]>/<key>.parquet``)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.parquet"

    def load(self, key: str, params: Mapping[str, Scalar] | None = None) -> pd.DataFrame | None:
        """The cached rows, or None when absent; an unusable entry warns (naming it) and gives None.

        With ``params``, the entry must store that point (see :func:`decode_entry`).

        Raises
        ------
        moelab.traces.FileFormatError
            The entry's path is taken by something other than a file (e.g. a folder): the sweep cannot
            write the point there, so it says so before computing anything.
        """
        path = self.path(key)
        if path.exists() and not path.is_file():
            raise FileFormatError(path, None, "is not a regular file (a folder?) where a sweep cache entry belongs; "
                                              "remove it and rerun")
        if not path.is_file():
            return None
        size = path.stat().st_size
        if size > MAX_ENTRY_BYTES:
            warnings.warn(f"sweep cache entry {path} is {size} bytes (> {MAX_ENTRY_BYTES}); not read, recomputing",
                          SweepCacheWarning, stacklevel=3)
            return None
        try:
            return decode_entry(path.read_bytes(), key, str(path), params)
        except ValueError as exc:
            warnings.warn(f"sweep cache entry {path} is corrupt ({exc}); recomputing it", SweepCacheWarning,
                          stacklevel=3)
            return None

    def store(self, key: str, data: bytes) -> Path:
        return atomic_write_bytes(self.path(key), data)


# --------------------------------------------------------------------------------------------- runs

@dataclass
class SweepResult:
    """The rows of a sweep (parameters first, in grid order) and how they were obtained."""

    frame: pd.DataFrame
    keys: list[str]
    computed: int
    cached: int
    recomputed: list[str] = field(default_factory=list)  # keys of corrupt entries that were recomputed
    seconds: float = 0.0
    backend: str = "serial"
    cache_dir: Path | None = None
    missing: int = 0  # points neither cached nor computed (``compute=False``): not in ``frame``

    @property
    def points(self) -> int:
        return len(self.keys)


def _call(fn: Callable[..., Any], name: str, key: str, params: dict[str, Scalar]) -> tuple[str, bytes]:
    """Run one point (in whatever process the backend chose) and return its encoded entry."""
    return key, encode_entry(key, params, _rows(name, params, fn(**params)))


def run_sweep(
    fn: Callable[..., Any],
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
    *,
    cache_dir: str | os.PathLike | None = None,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    code: str | None = None,
    data: str = "",
    allowed: Iterable[str] | None = None,
    progress: bool = True,
    desc: str | None = None,
    compute: bool = True,
) -> SweepResult:
    """Run ``fn(**point)`` over ``grid`` with a result cache; only missing points are computed.

    The rows of every point, in grid order, are in the result's ``frame``; each point is also stored
    under ``cache_dir`` as soon as it is computed (see ``code`` for what a cache entry's key covers).

    Parameters
    ----------
    fn : callable
        A module-level (top-level) function, called as ``fn(**point)`` (workers import it by name),
        returning a dict (one row), a list of dicts or a DataFrame (several rows); the point's parameters
        are prepended to every row. It must be deterministic in its parameters for the cache to make sense.
        It may live in the running script or notebook: the ``local`` backend then forks its workers
        (:func:`moelab.sweep.backends.start_method`), so a plain script needs no
        ``if __name__ == "__main__":`` guard. Lambdas and functions defined inside another function are
        refused (workers could not find them).
    grid : mapping of str to list, or list of dicts
        Parameter name -> values (see :func:`expand_grid`), or explicit points.
    cache_dir : path, optional
        Where entries live, one parquet file per point (default ``$MOELAB_CACHE/sweep``, with
        ``$MOELAB_CACHE`` defaulting to ``~/.cache/moelab``).
    backend : {"serial", "local", "ray"}
        ``serial`` in this process, ``local`` a process pool (default), ``ray`` Ray tasks.
    workers : int, optional
        Processes for ``local`` (default: CPU count) or CPUs of a Ray instance started here
        (default: ``min(4, CPU count)``); ignored when joining a Ray cluster.
    address : str, optional
        Ray cluster to join (``host:port``, ``ray://host:port`` or ``auto``); default ``$RAY_ADDRESS``,
        else a Ray instance on this machine (reused when ``ray.init`` was already called).
    code, data : str
        Code version and data hash in the key. A point's key is the SHA-256 of ``fn``'s
        ``module:qualname``, the point's parameters, ``code`` and ``data``. Default ``code``: a hash of
        moelab's version and the whole source file of ``fn``'s module (every ``.py`` below it for a
        package), so any edit of that file, even of a comment or of an unrelated function, recomputes
        every point; where the module has no file (a notebook, exec'd code), a hash of ``fn``'s own
        compiled code instead. Not covered by default: other modules ``fn`` calls, moelab's own code
        (only its version string) and other libraries. Pass ``code=code_version(fn.__module__,
        "moelab.eldr", ...)`` (:func:`code_version`) to cover them; a ``code`` you pass replaces the
        default, so name ``fn.__module__`` in it too (``"__main__"`` for a script). ``data`` (default
        ``""``): e.g. :func:`data_hash` of the input files.
    allowed : iterable of str, optional
        Parameter names ``fn`` takes (unknown grid names are refused).
    progress : bool
        Show a tqdm progress bar.
    compute : bool
        ``False``: compute nothing, return the cached points only (``missing`` counts the others), e.g. to
        look at a long run's progress while it runs.
    """
    check_choice("backend", backend, BACKENDS)
    if workers is not None:
        workers = check_int("workers", workers, low=1, high=1024)
    name = function_name(fn)
    if isinstance(grid, Mapping):
        points = expand_grid(grid, allowed=allowed)
    else:
        if isinstance(grid, Sized):
            check_grid_size(len(grid))
        points = [{k: _scalar(k, v) for k, v in p.items()} for p in grid]
        if not points:
            raise ValueError("grid has no points")
        if allowed is not None:
            bad = sorted({k for p in points for k in p} - set(allowed))
            if bad:
                raise ValueError(f"unknown grid parameter(s) {bad}; the parameters are {sorted(allowed)}")
    if code is None:
        try:
            code = code_version(fn.__module__)
        except ValueError:  # defined where no file stands for its module (exec'd code, some runners' __main__)
            code = code_version(extra=[function_fingerprint(fn)])
    if cache_dir is None:
        cache_dir = moelab_cache_dir() / "sweep"
    cache = ResultCache(cache_dir)
    keys = [point_key(name, p, code, data) for p in points]
    if len(set(keys)) != len(keys):
        raise ValueError("grid has repeated points")

    t0 = time.perf_counter()
    frames: dict[str, pd.DataFrame] = {}
    recomputed: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SweepCacheWarning)
        for key, point in zip(keys, points):
            df = cache.load(key, point)
            if df is not None:
                frames[key] = df
            elif cache.path(key).is_file():
                recomputed.append(key)
    for w in caught:  # re-emit outside the recorder, so callers see (and filter) them as usual
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    todo = [(k, p) for k, p in zip(keys, points) if k not in frames]
    todo_params = dict(todo)
    n_cached = len(keys) - len(todo)
    if not compute:
        done = [k for k in keys if k in frames]
        frame = pd.concat([frames[k] for k in done], ignore_index=True) if done else pd.DataFrame()
        return SweepResult(frame, keys, 0, n_cached, [], time.perf_counter() - t0, backend, Path(cache_dir),
                           missing=len(todo))

    bar = tqdm(total=len(keys), initial=n_cached, desc=desc or name.split(":")[-1], unit="pt",
               disable=not progress, leave=progress)
    try:
        for key, blob in execute(backend, _call, fn, name, todo, workers=workers, address=address):
            cache.store(key, blob)  # at once: an interrupted sweep keeps every finished point
            frames[key] = decode_entry(blob, key, params=dict(todo_params[key]))
            bar.update(1)
    finally:
        bar.close()
    frame = pd.concat([frames[k] for k in keys], ignore_index=True)
    return SweepResult(frame, keys, len(todo), n_cached, recomputed, time.perf_counter() - t0, backend,
                       Path(cache_dir))
