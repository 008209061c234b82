"""Atomic file writes and checked, pickle-free reads of untrusted files.

Every file moelab writes goes to a temporary name in the same folder and is renamed into place, so a
crash never leaves half a file. Arrays are stored as ``.npz``; metadata goes to JSON; tables to CSV.

Every file moelab reads may come from someone else, so every reader here

* checks the file's size before opening it, and every declared size against a budget the caller can
  raise (``max_file_bytes``, ``max_bytes``) *before* decompressing or allocating anything;
* never unpickles (object arrays, pickles inside an ``.npz``, and non-npy members are refused);
* closes every file it opens, also when it fails;
* raises one error type, :class:`FileFormatError` (a ``ValueError``), naming the file and the field,
  for every malformed file (missing files stay ``FileNotFoundError``).

Readers: :func:`load_npz` (arrays), :func:`read_json` / :func:`read_json_record` (JSON, the latter
with typed field getters for schema checks) and :func:`read_csv_checked` (tables with required
columns, dtypes, finiteness and sign checks).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import math
import os
import re
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Default budgets. Every reader takes them as keyword arguments, so a caller with a bigger file
#: raises the one it needs.
DEFAULT_MAX_FILE_BYTES = 1 * GiB  # on-disk size of any file before it is opened
DEFAULT_MAX_NPZ_BYTES = 512 * MiB  # all arrays of one .npz together, as declared (uncompressed)
DEFAULT_MAX_NPZ_MEMBERS = 1024
DEFAULT_MAX_JSON_BYTES = 64 * MiB
DEFAULT_MAX_JSON_DEPTH = 64  # nesting of [ and {: far above any moelab file, far below the parser's recursion limit
DEFAULT_MAX_CSV_BYTES = 256 * MiB
DEFAULT_MAX_CSV_ROWS = 5_000_000
_MAX_NPY_HEADER = 10_000  # numpy's own safe default for .npy headers
_NPY_KINDS = "biufcUS"  # bool, ints, floats, complex, fixed-width str/bytes: nothing that needs pickle


def _human(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"


class FileFormatError(ValueError):
    """A file that moelab cannot read: truncated, corrupt, over a size budget, of the wrong format or
    version, or with a field of the wrong type, range or length.

    Attributes
    ----------
    path : pathlib.Path or None
        The file.
    field : str or None
        The array, column or JSON key at fault (dotted for nested keys, e.g. ``geometry.top_k``), or
        ``None`` when the whole file is at fault.
    problem : str
        What is wrong, in words.
    """

    def __init__(self, path: str | os.PathLike | None, field: str | None, problem: str) -> None:
        self.path = None if path is None else Path(path)
        self.field = field
        self.problem = problem
        where = "<unknown file>" if path is None else str(path)
        super().__init__(f"{where}: {field}: {problem}" if field is not None else f"{where}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across process pools
        return (type(self), (self.path, self.field, self.problem))


def check_file(path: str | os.PathLike, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
               budget_name: str = "max_file_bytes") -> Path:
    """Return ``path`` if it is a regular file no larger than ``max_file_bytes``.

    Raises ``FileNotFoundError`` when it does not exist, :class:`FileFormatError` when it is not a
    regular file (a folder, a FIFO, a device) or is over the budget.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if not path.is_file():
        raise FileFormatError(path, None, "is not a regular file")
    size = path.stat().st_size
    if size > max_file_bytes:
        raise FileFormatError(path, None, f"is {_human(size)}, over the budget {budget_name}={_human(max_file_bytes)} "
                                          f"(pass a larger {budget_name} to read it)")
    return path


# ---------------------------------------------------------------------------------------------- writes


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600 files; give the result the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically (numpy scalars and arrays allowed)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> Path:
    """Save arrays to a compressed ``.npz`` atomically. Object arrays are refused (they need pickle)."""
    for key, arr in arrays.items():
        if np.asarray(arr).dtype.hasobject:
            raise ValueError(f"array {key!r} has dtype object; moelab never stores pickled data")
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


@contextlib.contextmanager
def build_lock(path: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive lock on ``<path>.lock`` while the cache entry ``path`` is built.

    A second process that wants the same entry (two pytest-xdist workers, two notebooks sharing
    ``MOELAB_CACHE``) blocks here until the first is done, then finds the entry built: the caller checks for
    it again inside the lock, so an expensive entry is built once. The lock is POSIX ``flock``: it is
    released when the holder exits, also when it crashes, so a stale lock file never blocks anyone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- .npz

# everything a corrupt zip or .npy can raise while we read it (FileFormatError is re-raised as is)
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, IndexError, TypeError,
                NotImplementedError, RuntimeError, UnicodeDecodeError, SyntaxError, RecursionError, MemoryError,
                OverflowError)


def _npy_header(fp: Any) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and header length of the ``.npy`` stream ``fp`` (reads the header only)."""
    fmt = np.lib.format
    version = fmt.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(fp, max_header_size=_MAX_NPY_HEADER)
    elif version == (2, 0):
        shape, fortran, dtype = fmt.read_array_header_2_0(fp, max_header_size=_MAX_NPY_HEADER)
    else:
        raise _NpyProblem(f"has .npy format version {version[0]}.{version[1]}; moelab reads 1.0 and 2.0")
    return tuple(shape), bool(fortran), dtype, fp.tell()


class _NpyProblem(Exception):
    """A problem with one member, turned into a FileFormatError naming it."""


def _zip_entry_count(fh: Any) -> int | None:
    """Entries declared by the zip's end-of-central-directory record (``None`` if not found or zip64):
    read from the file's last 64 KiB, before :mod:`zipfile` parses the whole directory."""
    size = fh.seek(0, os.SEEK_END)
    tail_len = min(size, 22 + 0xFFFF)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return None
    total = int.from_bytes(tail[at + 10:at + 12], "little")
    return None if total == 0xFFFF else total


def _checked_zip(fh: Any, path: Path, max_members: int) -> zipfile.ZipFile:
    declared = _zip_entry_count(fh)
    if declared is not None and declared > max_members:
        raise FileFormatError(path, None, f"has {declared} members, over the budget max_members={max_members}")
    fh.seek(0)
    return zipfile.ZipFile(fh)


def load_npz(
    path: str | os.PathLike,
    *,
    required: Iterable[str] = (),
    allowed: Iterable[str] | None = None,
    dtypes: Mapping[str, str] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_bytes: int = DEFAULT_MAX_NPZ_BYTES,
    max_members: int = DEFAULT_MAX_NPZ_MEMBERS,
) -> dict[str, np.ndarray]:
    """Load every array of an untrusted ``.npz``, checking every size before decompressing it.

    In order, before any array data is inflated: the file's size (``max_file_bytes``); the zip central
    directory (at most ``max_members`` members, each a plain or deflated ``<name>.npy``, no duplicates,
    no encryption; the sum of declared uncompressed sizes within ``max_bytes``); each member's ``.npy``
    header (version 1.0/2.0, a dtype that needs no pickle, ``shape x itemsize`` within ``max_bytes`` and
    equal to the member's declared size, so a truncated or padded member is caught). Then the arrays are
    read (reading never goes past a member's declared size) and their CRCs checked.

    Parameters
    ----------
    path : path-like
    required : names of arrays that must be present
    allowed : if given, the only array names accepted (an unknown array is an error)
    dtypes : ``{array: kinds}`` with numpy kind letters the array's dtype must have, e.g.
        ``{"decode_ids": "iu"}`` (integers only)
    max_file_bytes, max_bytes, max_members : budgets (bytes on disk; bytes of all arrays uncompressed;
        number of arrays)

    Returns
    -------
    dict of str to ndarray

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    FileFormatError
        Anything else: not a zip, truncated, corrupt, over budget, pickled/object data, missing arrays.
    """
    path = check_file(path, max_file_bytes=max_file_bytes)
    required = list(required)
    allowed_set = None if allowed is None else set(allowed) | set(required)
    dtypes = dict(dtypes or {})
    member = None
    try:
        with open(path, "rb") as fh, _checked_zip(fh, path, max_members) as zf:
            infos = zf.infolist()
            if len(infos) > max_members:
                raise FileFormatError(path, None, f"has {len(infos)} members, over the budget max_members={max_members}")
            names: dict[str, zipfile.ZipInfo] = {}
            total = 0
            for info in infos:
                member = info.filename
                if not member.endswith(".npy") or "/" in member or member in ("", ".npy"):
                    raise FileFormatError(path, member, "is not an array: an .npz holds only <name>.npy members")
                name = member[:-4]
                if name in names:
                    raise FileFormatError(path, name, "appears twice in the archive")
                if info.flag_bits & 0x1:
                    raise FileFormatError(path, name, "is encrypted")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise FileFormatError(path, name, f"uses zip compression method {info.compress_type}; "
                                                      "moelab reads stored or deflated members only")
                if allowed_set is not None and name not in allowed_set:
                    raise FileFormatError(path, name, f"is not an array of this format (expected {sorted(allowed_set)})")
                names[name] = info
                total += info.file_size
            member = None
            missing = [r for r in required if r not in names]
            if missing:
                raise FileFormatError(path, missing[0], f"is missing (required arrays: {required}; "
                                                        f"the file has {sorted(names)})")
            if total > max_bytes:
                raise FileFormatError(path, None, f"declares {_human(total)} of uncompressed arrays, over the budget "
                                                  f"max_bytes={_human(max_bytes)} (pass a larger max_bytes to read it)")
            # pass 1: every header, before any array data is inflated
            plans = {}
            for name, info in names.items():
                member = name
                with zf.open(info) as fp:
                    try:
                        shape, fortran, dtype, header_len = _npy_header(fp)
                    except _NpyProblem as exc:
                        raise FileFormatError(path, name, str(exc)) from None
                    except _READ_ERRORS as exc:
                        raise FileFormatError(path, name, f"has no valid .npy header ({exc})") from None
                if any(type(s) is not int or s < 0 for s in shape):
                    raise FileFormatError(path, name, f"declares an invalid shape {shape!r}")
                if dtype.hasobject or dtype.kind not in _NPY_KINDS or dtype.fields is not None:
                    raise FileFormatError(path, name, f"has dtype {dtype.str!r}; moelab reads plain numeric or "
                                                      "string arrays only (never pickled objects)")
                if name in dtypes and dtype.kind not in dtypes[name]:
                    raise FileFormatError(path, name, f"has dtype {dtype.str!r}; expected kind "
                                                      f"{' or '.join(repr(k) for k in dtypes[name])} "
                                                      "(numpy dtype kinds: i/u integers, f floats, b bool, U str)")
                nbytes = math.prod(shape) * dtype.itemsize
                if nbytes > max_bytes:
                    raise FileFormatError(path, name, f"declares shape {shape} of {dtype.str} = {_human(nbytes)}, "
                                                      f"over the budget max_bytes={_human(max_bytes)}")
                if header_len + nbytes != info.file_size:
                    raise FileFormatError(path, name, f"declares shape {shape} of {dtype.str} ({nbytes} bytes of data) "
                                                      f"but the member holds {info.file_size - header_len} "
                                                      "(truncated or padded)")
                plans[name] = (info, shape, fortran, dtype, nbytes)
            # pass 2: the data, each member read to its end so its CRC is checked
            out = {}
            for name, (info, shape, fortran, dtype, nbytes) in plans.items():
                member = name
                with zf.open(info) as fp:
                    _npy_header(fp)
                    buf = np.empty(nbytes, dtype=np.uint8)
                    got = fp.readinto(buf) if nbytes else 0
                    if got != nbytes or fp.read(1):
                        raise FileFormatError(path, name, f"is truncated: {got} of {nbytes} data bytes")
                if nbytes:
                    arr = buf.view(dtype).reshape(shape, order="F" if fortran else "C")
                else:
                    arr = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
                out[name] = arr
            return out
    except FileFormatError:
        raise
    except _READ_ERRORS as exc:
        raise FileFormatError(path, member, f"is not a readable moelab .npz file ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------- JSON


def read_json(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES,
              max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    """Read a JSON file (at most ``max_bytes``, nested at most ``max_depth``) with a clear error when it is
    missing or malformed (parsed by :func:`loads_json`).

    Raises ``FileNotFoundError`` when missing and :class:`FileFormatError` when too big, not UTF-8, not
    valid JSON or nested too deeply.
    """
    path = check_file(path, max_file_bytes=max_bytes, budget_name="max_bytes")
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:  # grew since the size check
            raise FileFormatError(path, None, f"is over the budget max_bytes={_human(max_bytes)}")
        return loads_json(data, path=path, max_depth=max_depth)
    except FileFormatError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise FileFormatError(path, None, f"is not valid JSON ({type(exc).__name__}: {exc})") from None


# a JSON string (escapes included): its brackets are text, not nesting
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(data: bytes | str) -> int:
    """Deepest nesting of ``[`` / ``{`` in JSON text (brackets inside strings do not count), found by a
    linear scan so a deeply nested document is measured without recursing into it."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    if not codes.size:
        return 0
    step = (codes == ord("[")).astype(np.int64) + (codes == ord("{"))
    step -= (codes == ord("]")).astype(np.int64) + (codes == ord("}"))
    return int(max(np.cumsum(step).max(), 0))


def loads_json(data: bytes | str, *, path: str | os.PathLike | None = None,
               max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    """Parse untrusted JSON text with its nesting bounded before the (recursive) parser sees it.

    Every JSON moelab reads from a file or a stream goes through here, so a deeply nested document is a
    :class:`FileFormatError` naming ``path`` and ``max_depth``, never a ``RecursionError``.

    Raises
    ------
    FileFormatError
        Nested deeper than ``max_depth``, not UTF-8, or not valid JSON.
    """
    depth = json_depth(data)
    if depth > max_depth:
        raise FileFormatError(path, None, f"is not valid JSON for moelab: it nests {depth} levels deep, over the budget "
                                          f"max_depth={max_depth} (moelab's files nest a few levels)")

    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise FileFormatError(path, None, f"is not valid JSON ({type(exc).__name__}: {exc})") from None


_MISSING: Any = object()


class JsonRecord:
    """A JSON object read from a file, with typed getters for schema checks.

    Every getter raises :class:`FileFormatError` naming the file and the (dotted) key when the key is
    missing (and has no default) or holds the wrong type, range or length. Nested objects are records
    too (:meth:`get_record`).

    Examples
    --------
    >>> rec = read_json_record("trace.json")  # doctest: +SKIP
    >>> rec.get_int("format_version", low=1)  # doctest: +SKIP
    >>> geo = rec.get_record("geometry"); geo.get_int("top_k", low=1, high=geo.get_int("num_experts", low=1))  # doctest: +SKIP
    """

    def __init__(self, data: Mapping[str, Any], path: str | os.PathLike | None, prefix: str = "") -> None:
        if not isinstance(data, Mapping):
            raise FileFormatError(path, prefix.rstrip(".") or None, f"must be a JSON object; got {_kind(data)}")
        self.data, self.path, self.prefix = data, path, prefix

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def keys(self) -> list[str]:
        return list(self.data)

    def error(self, key: str | None, problem: str) -> FileFormatError:
        """The :class:`FileFormatError` for ``key`` of this record (for checks the getters do not cover)."""
        return FileFormatError(self.path, f"{self.prefix}{key}" if key is not None else (self.prefix.rstrip(".") or None),
                               problem)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The raw value of ``key`` (``default`` if absent; an error if absent without a default)."""
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, "is missing")
        return default

    def get_str(self, key: str, default: Any = _MISSING, *, choices: Iterable[str] | None = None) -> str:
        v = self.get(key, default)
        if not isinstance(v, str):
            raise self.error(key, f"must be a string; got {_kind(v)}")
        if choices is not None and v not in (opts := list(choices)):
            raise self.error(key, f"must be one of {opts}; got {v!r}")
        return v

    def get_int(self, key: str, default: Any = _MISSING, *, low: int | None = None, high: int | None = None) -> int:
        """An integer in ``[low, high]`` (JSON floats with a fractional part and booleans are refused)."""
        v = self.get(key, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or (low is not None and v < low) or (high is not None and v > high):
            rng = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            raise self.error(key, f"must be an integer in {rng}; got {_kind(v)}")
        return v

    def get_real(self, key: str, default: Any = _MISSING, *, low: float | None = None, high: float | None = None) -> float:
        """A finite number in ``[low, high]``."""
        v = self.get(key, default)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (low is not None and v < low) or (high is not None and v > high):
            rng = f"[{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
            raise self.error(key, f"must be a finite number in {rng}; got {_kind(v)}")
        return float(v)

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise self.error(key, f"must be true or false; got {_kind(v)}")
        return v

    def get_list(self, key: str, default: Any = _MISSING, *, length: int | None = None,
                 max_length: int | None = None) -> list[Any]:
        v = self.get(key, default)
        if not isinstance(v, list):
            raise self.error(key, f"must be a list; got {_kind(v)}")
        if length is not None and len(v) != length:
            raise self.error(key, f"must have {length} entries; got {len(v)}")
        if max_length is not None and len(v) > max_length:
            raise self.error(key, f"must have at most {max_length} entries; got {len(v)}")
        return v

    def get_str_list(self, key: str, default: Any = _MISSING, *, length: int | None = None,
                     unique: bool = False) -> list[str]:
        """A list of strings (a bare string is refused, not split into characters)."""
        v = self.get_list(key, default, length=length)
        for i, s in enumerate(v):
            if not isinstance(s, str):
                raise self.error(f"{key}[{i}]", f"must be a string; got {_kind(s)}")
        if unique and len(set(v)) != len(v):
            dup = next(s for i, s in enumerate(v) if s in v[:i])
            raise self.error(key, f"must hold unique strings; {dup!r} appears more than once")
        return list(v)

    def get_dict(self, key: str, default: Any = _MISSING) -> dict[str, Any]:
        """A JSON object as a plain dict (for free-form data such as provenance)."""
        v = self.get(key, default)
        if not isinstance(v, Mapping):
            raise self.error(key, f"must be a JSON object; got {_kind(v)}")
        return dict(v)

    def get_record(self, key: str, default: Any = _MISSING) -> JsonRecord:
        """A nested JSON object as a record whose errors name ``key.<field>``."""
        return JsonRecord(self.get_dict(key, default), self.path, f"{self.prefix}{key}.")


def _kind(v: Any) -> str:
    """A short description of a JSON value for error messages: type and a clipped repr."""
    r = repr(v)
    r = r if len(r) <= 40 else r[:37] + "..."
    return f"{type(v).__name__} {r}"


def read_json_record(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> JsonRecord:
    """:func:`read_json` of a file whose top level must be a JSON object, as a :class:`JsonRecord`."""
    return JsonRecord(read_json(path, max_bytes=max_bytes), path)


# ---------------------------------------------------------------------------------------------- CSV

_CSV_KINDS = ("int", "float", "str")


def read_csv_checked(
    path: str | os.PathLike,
    columns: Mapping[str, str],
    *,
    non_negative: bool | Iterable[str] = True,
    min_rows: int = 1,
    max_rows: int = DEFAULT_MAX_CSV_ROWS,
    max_bytes: int = DEFAULT_MAX_CSV_BYTES,
) -> pd.DataFrame:
    """Read an untrusted CSV table, checking its size, required columns and every value.

    The file's size is checked before it is opened and at most ``max_rows`` rows are parsed. Every
    column in ``columns`` must be present and each of its cells must parse as its kind: ``"int"``
    (integral numbers; ``3.0`` is accepted, ``2.5`` is not), ``"float"`` (finite numbers) or ``"str"``
    (non-empty). Numeric columns named by ``non_negative`` (all numeric columns when ``True``) must be
    ``>= 0``. Other columns are kept as pandas infers them.

    Returns
    -------
    pandas.DataFrame
        ``int`` columns as int64, ``float`` columns as float64, ``str`` columns as object.

    Raises
    ------
    FileFormatError
        Naming the file, the column and the first bad row (1-based, as a spreadsheet counts data rows).
    """
    for col, kind in columns.items():
        if kind not in _CSV_KINDS:
            raise ValueError(f"columns[{col!r}] must be one of {list(_CSV_KINDS)}; got {kind!r}")
    path = check_file(path, max_file_bytes=max_bytes, budget_name="max_bytes")
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            header = next(csv.reader([fh.readline()]), [])
            dup = sorted({c for c in header if header.count(c) > 1})
            if dup:
                raise FileFormatError(path, dup[0], "column appears more than once in the header")
            fh.seek(0)
            with warnings.catch_warnings():
                # rows longer than the header: pandas would silently drop or shift cells
                warnings.simplefilter("error", pd.errors.ParserWarning)
                df = pd.read_csv(fh, dtype=str, keep_default_na=False, index_col=False, nrows=max_rows + 1)
    except FileFormatError:
        raise
    except (ValueError, UnicodeDecodeError, csv.Error, pd.errors.ParserError, pd.errors.EmptyDataError,
            pd.errors.ParserWarning, OSError) as exc:
        raise FileFormatError(path, None, f"is not a readable CSV table ({type(exc).__name__}: {exc})") from None
    if len(df) > max_rows:
        raise FileFormatError(path, None, f"has more than max_rows={max_rows} rows (pass a larger max_rows to read it)")
    if len(df) < min_rows:
        raise FileFormatError(path, None, f"has {len(df)} data rows; at least {min_rows} needed")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise FileFormatError(path, missing[0], f"column is missing (required: {list(columns)}; the file has {list(df.columns)})")
    nonneg = set(c for c, k in columns.items() if k != "str") if non_negative is True else set(non_negative or ())
    for col, kind in columns.items():
        raw = df[col].str.strip()
        if kind == "str":
            bad = raw == ""
            if bad.any():
                raise FileFormatError(path, col, f"row {int(np.argmax(bad.to_numpy())) + 1} is empty")
            df[col] = raw.astype(object)
            continue
        vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(vals)
        what = "a finite number"
        if kind == "int":
            bad |= np.isfinite(vals) & (vals != np.round(vals))
            bad |= np.abs(np.where(np.isfinite(vals), vals, 0)) > 2**53
            what = "an integer"
        if col in nonneg:
            bad |= vals < 0
            what += " >= 0"
        if bad.any():
            row = int(np.argmax(bad))
            raise FileFormatError(path, col, f"must hold {what} in every row; row {row + 1} has {df[col].iloc[row]!r}")
        df[col] = vals.astype(np.int64) if kind == "int" else vals
    # columns not in the schema: let pandas infer them as it would for a plain read_csv
    for col in df.columns:
        if col not in columns:
            df[col] = _infer(df[col])
    return df


def _infer(s: Any) -> Any:
    try:
        return pd.to_numeric(s)
    except (ValueError, TypeError):
        return s
