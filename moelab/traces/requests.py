"""The one request container: :class:`RequestTrace` (arrival, prompt and output length, and the optional
per-request columns a router or simulator may need) flows from the loaders to every simulator.

:func:`replay_requests` draws Poisson arrivals whose requests replay the rows of an expert trace
(the decode-cluster workload of ELDR and of the cross-paper experiment)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import DEFAULT_MAX_CSV_BYTES, FileFormatError, check_file, read_csv_checked
from moelab._validate import (
    MAX_SEQUENCE_TOKENS,
    _as_array,
    check_array,
    check_choice,
    check_instance,
    check_int,
    check_int_array,
    check_product,
    check_real,
    rng_from,
)
from moelab.datasets import public_path
from moelab.traces.expert import ExpertTrace

REQUIRED_COLUMNS = ("arrival_s", "prompt_len", "output_len")
OPTIONAL_COLUMNS = ("prompt_key", "domain", "signature", "trace_row", "trace_offset", "prefix_hashes")
_AZURE_COLUMNS = {"TIMESTAMP": "timestamp", "ContextTokens": "prompt_len", "GeneratedTokens": "output_len"}
#: most requests a generated trace holds (:func:`replay_requests`, :meth:`RequestTrace.resample`): every request
#: is at least one routing call of a simulator (the decode-tier simulator takes at most 2^20), and 4M requests'
#: columns already take ~300 MB
MAX_TRACE_REQUESTS = 1 << 22
_REQUESTS_WHY = "each request's columns are allocated up front, and a simulator routes each one"
#: most signature entries (requests x dimension) :func:`replay_requests` gathers: 1 GiB of float64
MAX_SIGNATURE_CELLS = 1 << 27


@dataclass(frozen=True)
class RequestTrace:
    """A request trace: ``arrival_s`` (seconds from the first arrival, finite, sorted), ``prompt_len``,
    ``output_len`` (tokens, integers >= 1), optional ``prompt_key`` (a hash identifying repeated prompts)
    and a ``source`` note. ``dropped`` counts rows removed by filters so far (reported, never silent).

    Optional per-request columns (``None`` when a trace does not have them): ``domain`` (integer
    domain/task codes), ``signature`` ([n, d] routing signatures, finite), ``trace_row`` (which request
    of an expert trace it replays) with ``trace_offset`` (the decode token it starts at), and
    ``prefix_hashes`` (per request, a tuple of its prompt's KV-block hashes).
    """

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prompt_key: np.ndarray | None = None
    source: str = "unknown"
    dropped: dict[str, int] = field(default_factory=dict)
    domain: np.ndarray | None = None
    signature: np.ndarray | None = None
    trace_row: np.ndarray | None = None
    trace_offset: np.ndarray | None = None
    prefix_hashes: tuple | None = None

    def __post_init__(self) -> None:
        # through _as_array: ragged lists, strings and objects are named, not numpy's words
        arrival = _as_array("arrival_s", self.arrival_s, np.float64, "a 1-d array of arrival times (s)")
        prompt = _as_array("prompt_len", self.prompt_len, what="a 1-d array of token counts")
        output = _as_array("output_len", self.output_len, what="a 1-d array of token counts")
        n = arrival.shape[0] if arrival.ndim else -1
        for name, arr in (("arrival_s", arrival), ("prompt_len", prompt), ("output_len", output)):
            if arr.ndim != 1 or arr.shape[0] != n:
                raise ValueError(f"{name} must be a 1-d array of length {n}; got shape {arr.shape}")
        if n and (not np.all(np.isfinite(arrival)) or arrival.min() < 0):
            raise ValueError("arrival_s must be finite and >= 0 (NaN/inf refused)")
        if n and np.any(np.diff(arrival) < 0):
            i = int(np.argmax(np.diff(arrival) < 0)) + 1
            raise ValueError(f"arrival_s must be sorted in non-decreasing order; element {i} ({arrival[i]!r} s) comes "
                             f"before element {i - 1} ({arrival[i - 1]!r} s)")
        for name, arr in (("prompt_len", prompt), ("output_len", output)):
            if n and (arr.dtype.kind not in "iuf" or not np.all(np.isfinite(arr))
                      or not np.all(np.equal(np.mod(arr, 1), 0)) or arr.min() < 1):
                ok = (np.isfinite(arr) & (np.mod(arr, 1) == 0) & (arr >= 1)) if arr.dtype.kind in "iuf" else None
                i = 0 if ok is None else int(np.argmin(ok))
                raise ValueError(f"{name} must hold integers >= 1; element {i} has {arr[i].item()!r}")
            if n and arr.max() > MAX_SEQUENCE_TOKENS:  # before the int64 cast: 2^63 and beyond would wrap
                raise ValueError(f"{name} must hold integers <= MAX_SEQUENCE_TOKENS={MAX_SEQUENCE_TOKENS} (longer than "
                                 f"any context window; KV-load sums stay inside int64); got maximum {arr.max()!r}")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_len", prompt.astype(np.int64))
        object.__setattr__(self, "output_len", output.astype(np.int64))
        for name in ("prompt_key", "domain", "trace_row", "trace_offset"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = _as_array(name, value, what=f"a 1-d array of {n} integers")
            if arr.shape != (n,):
                raise ValueError(f"{name} must be a 1-d array of length {n}; got shape {arr.shape}")
            if n and (arr.dtype.kind not in "iu" and not np.all(np.equal(np.mod(arr, 1), 0))):
                raise ValueError(f"{name} must hold integers")
            object.__setattr__(self, name, arr.astype(np.int64))
        for name in ("trace_row", "trace_offset"):
            arr = getattr(self, name)
            if arr is not None and n and arr.min() < 0:
                raise ValueError(f"{name} must be >= 0; got minimum {arr.min()}")
        if (self.trace_row is None) != (self.trace_offset is None):
            raise ValueError("trace_row and trace_offset must be given together")
        if self.signature is not None:
            sig = _as_array("signature", self.signature, what="an [n_requests, dim] array of numbers")
            sig = sig if sig.dtype == np.float32 else sig.astype(np.float64)  # float32 stays float32
            if sig.ndim != 2 or sig.shape[0] != n:
                raise ValueError(f"signature must have shape (n_requests={n}, dim); got {sig.shape}")
            if not np.isfinite(sig).all():
                raise ValueError("signature must contain only finite values (NaN/inf refused)")
            object.__setattr__(self, "signature", sig)
        if self.prefix_hashes is not None:
            try:
                ph = tuple(tuple(int(h) for h in row) for row in self.prefix_hashes)
            except (TypeError, ValueError, OverflowError):
                raise ValueError("prefix_hashes must hold, per request, a sequence of integer block hashes; got "
                                 f"{type(self.prefix_hashes).__name__} {self.prefix_hashes!r:.60}") from None
            if len(ph) != n:
                raise ValueError(f"prefix_hashes must have one entry per request ({n}); got {len(ph)}")
            object.__setattr__(self, "prefix_hashes", ph)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns this trace has (the three required ones plus the optional ones present)."""
        return REQUIRED_COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if getattr(self, c) is not None)

    def require(self, columns: tuple[str, ...] | list[str], user: str) -> None:
        """``ValueError`` naming the missing columns when ``user`` (a simulator) needs columns this trace lacks."""
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise ValueError(f"{user} needs trace column(s) {missing}; this trace has {list(self.columns)}")

    def with_columns(self, **columns: object) -> RequestTrace:
        """A copy with optional columns set (``domain=``, ``signature=``, ``trace_row=`` ...)."""
        unknown = sorted(set(columns) - set(OPTIONAL_COLUMNS) - {"source"})
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; optional columns: {list(OPTIONAL_COLUMNS)}")
        return replace(self, **columns)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def __iter__(self) -> Iterator[tuple[float, int, int]]:
        return zip(self.arrival_s.tolist(), self.prompt_len.tolist(), self.output_len.tolist())

    @property
    def duration_s(self) -> float:
        """Span between the first and the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate in requests per second."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else float("inf")

    def to_frame(self) -> pd.DataFrame:
        """The trace as a DataFrame with the three required columns (+ ``prompt_key``)."""
        df = pd.DataFrame({"arrival_s": self.arrival_s, "prompt_len": self.prompt_len, "output_len": self.output_len})
        if self.prompt_key is not None:
            df["prompt_key"] = self.prompt_key
        return df

    def _take(self, idx: np.ndarray, *, arrival: np.ndarray | None = None, note: str | None = None,
              dropped: dict[str, int] | None = None) -> RequestTrace:
        def pick(x: np.ndarray | None) -> np.ndarray | None:
            return None if x is None else x[idx]

        return RequestTrace(
            self.arrival_s[idx] if arrival is None else arrival,
            self.prompt_len[idx],
            self.output_len[idx],
            pick(self.prompt_key),
            self.source if note is None else f"{self.source}; {note}",
            {**self.dropped, **(dropped or {})},
            pick(self.domain), pick(self.signature), pick(self.trace_row), pick(self.trace_offset),
            None if self.prefix_hashes is None else tuple(self.prefix_hashes[i] for i in np.asarray(idx).tolist()),
        )

    def head(self, n: int) -> RequestTrace:
        """The first ``n`` requests."""
        n = check_int("n", n, low=0)
        return self._take(np.arange(min(n, len(self))), note=f"first {n}")

    def scale_rate(self, factor: float) -> RequestTrace:
        """Compress time by ``factor`` (2.0 = twice the arrival rate)."""
        factor = check_real("factor", factor, low=0, low_open=True)
        return self._take(np.arange(len(self)), arrival=self.arrival_s / factor, note=f"rate x{factor:g}")

    def filter_lengths(self, *, max_output: int | None = None, max_prompt: int | None = None) -> RequestTrace:
        """Drop requests longer than the limits; the counts are kept in ``dropped``."""
        keep = np.ones(len(self), dtype=bool)
        dropped: dict[str, int] = {}
        if max_output is not None:
            max_output = check_int("max_output", max_output, low=1)
            over = self.output_len > max_output
            dropped[f"output_len>{max_output}"] = int(over.sum())
            keep &= ~over
        if max_prompt is not None:
            max_prompt = check_int("max_prompt", max_prompt, low=1)
            over = self.prompt_len > max_prompt
            dropped[f"prompt_len>{max_prompt}"] = int((over & keep).sum())
            keep &= ~over
        idx = np.flatnonzero(keep)
        return self._take(idx, arrival=self.arrival_s[idx] - (self.arrival_s[idx][0] if idx.size else 0.0),
                          note="filtered", dropped=dropped)

    def resample(self, n: int, seed: int | None = 0, *, all_at_zero: bool = False) -> RequestTrace:
        """Draw ``n`` requests with replacement (lengths only), keeping the mean rate, or as a backlog
        with every arrival at t=0 when ``all_at_zero``."""
        n = check_int("n", n, low=1, high=MAX_TRACE_REQUESTS, high_name="MAX_TRACE_REQUESTS", why=_REQUESTS_WHY)
        if not len(self):
            raise ValueError("cannot resample an empty trace")
        rng = rng_from(seed)
        idx = rng.integers(0, len(self), size=n)
        if all_at_zero:
            arrival = np.zeros(n)
        else:
            gaps = np.diff(self.arrival_s)
            arrival = np.concatenate([[0.0], np.cumsum(rng.choice(gaps, size=n - 1))]) if gaps.size else np.zeros(n)
        return self._take(idx, arrival=arrival, note=f"resampled {n} (seed {seed})")

    @classmethod
    def from_frame(cls, df: pd.DataFrame, source: str = "frame") -> RequestTrace:
        """Build from a DataFrame with ``arrival_s, prompt_len, output_len`` (and optional ``prompt_key``).

        Every row is checked by the same validator as :meth:`from_csv` and the bundled readers
        (:class:`RequestRowError` naming the column, the 1-based row, its value and the allowed range):
        ``arrival_s`` finite seconds in non-decreasing order (an out-of-order row is refused, never
        silently sorted); ``prompt_len`` and ``output_len`` integers in ``[0, MAX_SEQUENCE_TOKENS]``. A row
        with a zero length (a request that generated nothing never reaches a decode worker) is dropped and
        counted in ``dropped["zero_length"]``. Arrivals are shifted so the first kept one is at 0 s.

        Parameters
        ----------
        df : pandas.DataFrame
            One row per request.
        source : str
            A note on where the trace comes from.

        Returns
        -------
        RequestTrace
        """
        check_instance("df", df, pd.DataFrame, "a pandas DataFrame")
        missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"trace is missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
        arrival, prompt, output = _check_rows(df)
        zero = (prompt == 0) | (output == 0)
        arrival, prompt, output = arrival[~zero], prompt[~zero], output[~zero]
        key = df["prompt_key"].to_numpy()[~zero] if "prompt_key" in df.columns else None
        return cls(arrival - (arrival[0] if len(arrival) else 0.0), prompt, output, key, source,
                   {"zero_length": int(zero.sum())})

    @classmethod
    def from_csv(cls, path: str | Path) -> RequestTrace:
        """Read a CSV with ``arrival_s, prompt_len, output_len`` or the Azure columns
        ``TIMESTAMP, ContextTokens, GeneratedTokens``; rows are checked and zero lengths dropped exactly as
        in :meth:`from_frame`, and arrivals shifted to start at 0 s.

        Untrusted files are checked as they are read (size, columns, every cell);
        anything that is not such a trace raises :class:`moelab.traces.FileFormatError` naming the file and
        the column or row at fault."""
        path = check_file(path, max_file_bytes=DEFAULT_MAX_CSV_BYTES, budget_name="max_bytes")  # not a FIFO, not huge
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                header = {c.strip() for c in fh.readline().split(",")}
        except OSError:
            header = set()  # read_csv_checked says what is wrong with the path
        schema = ({"TIMESTAMP": "str", "ContextTokens": "int", "GeneratedTokens": "int"}
                  if set(_AZURE_COLUMNS) <= header else {"arrival_s": "float", "prompt_len": "int", "output_len": "int"})
        # the lengths (and arrival_s) are read as text and checked by the one row validator every reader uses
        schema = {c: ("str" if k in ("int", "float") else k) for c, k in schema.items()}
        df = read_csv_checked(path, schema, min_rows=0)
        try:
            return _frame_to_trace(df, str(path))
        except FileFormatError:
            raise
        except RequestRowError as exc:
            raise FileFormatError(path, exc.column, exc.problem) from None
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. timestamps that do not parse, unsorted arrivals
            raise FileFormatError(path, None, f"is not a valid request trace ({exc})") from None


def _prompt_key(prompt_len: np.ndarray) -> np.ndarray:
    # Azure traces carry no prompt text; the prompt length is the only stable per-prompt identity.
    return prompt_len.astype(np.int64)


def _frame_to_trace(df: pd.DataFrame, source: str) -> RequestTrace:
    if set(_AZURE_COLUMNS) <= set(df.columns):
        df = df.rename(columns=_AZURE_COLUMNS)
        ts = pd.to_datetime(df["timestamp"], format="mixed")
        df["arrival_s"] = (ts - ts.min()).dt.total_seconds()
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"trace {source} is missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)} "
                         f"or {list(_AZURE_COLUMNS)}")
    # Azure's conversation trace has a few zero-length outputs: from_frame drops and counts them
    trace = RequestTrace.from_frame(df, source=source)
    if "prompt_key" not in df.columns:
        trace = RequestTrace(trace.arrival_s, trace.prompt_len, trace.output_len, _prompt_key(trace.prompt_len),
                             trace.source, trace.dropped)
    return trace


class RequestRowError(ValueError):
    """A bad row of a request trace (a ``ValueError``), from :meth:`RequestTrace.from_frame`,
    :meth:`RequestTrace.from_csv` (there wrapped in a ``FileFormatError`` naming the file) and the
    bundled readers alike.

    Parameters
    ----------
    column : str
        The column at fault.
    problem : str
        The 1-based row, its value and the allowed range, in words.

    Attributes
    ----------
    column, problem : str
        As given.
    """

    def __init__(self, column: str, problem: str) -> None:
        self.column, self.problem = column, problem
        super().__init__(f"{column}: {problem}")


def _shown(raw: Any) -> Any:
    """A cell as the message shows it: a whole number as an int, other numbers as floats, text as text."""
    v = pd.to_numeric(pd.Series([raw]), errors="coerce").iloc[0]
    if pd.isna(v):
        return raw
    return int(v) if float(v).is_integer() and abs(v) < 2**63 else float(v)


def _check_rows(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one row validator of request traces: ``arrival_s`` finite and non-decreasing, lengths integers
    in ``[0, MAX_SEQUENCE_TOKENS]``; returns the three columns as arrays."""
    cols = {}
    for col in REQUIRED_COLUMNS:
        raw = df[col]
        vals = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64)
        if col == "arrival_s":
            bad, allowed = ~np.isfinite(vals), "a finite number of seconds"
        else:
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(vals) | (vals < 0) | (vals > MAX_SEQUENCE_TOKENS) | (np.mod(vals, 1) != 0)
            allowed = (f"an integer in [0, MAX_SEQUENCE_TOKENS={MAX_SEQUENCE_TOKENS}] (0 drops the row, counted in "
                       f"dropped['zero_length'])")
        if bad.any():
            i = int(np.argmax(bad))
            raise RequestRowError(col, f"row {i + 1} has {_shown(raw.iloc[i])!r}; must be {allowed}")
        cols[col] = vals
    arrival = cols["arrival_s"]
    if len(arrival) > 1 and np.any(np.diff(arrival) < 0):
        i = int(np.argmax(np.diff(arrival) < 0)) + 1
        raise RequestRowError("arrival_s", f"row {i + 1} has {_shown(arrival[i])!r}, earlier than row {i} "
                                           f"({_shown(arrival[i - 1])!r}); arrivals must be in non-decreasing order "
                                           f"(sort the rows by arrival first)")
    return arrival, cols["prompt_len"].astype(np.int64), cols["output_len"].astype(np.int64)


def load_azure_trace(kind: str = "conv", year: int = 2023, *, nrows: int | None = None,
                     chunksize: int = 1_000_000) -> RequestTrace:
    """Azure LLM inference trace (``kind`` 'code' or 'conv'; ``year`` 2023 or 2024).

    The file is found by :func:`moelab.datasets.public_path`, in this order: the copy under
    ``$MOELAB_PUBLIC_DATA`` when that variable is set and holds it; the copy bundled with the lab in
    ``data/public/azure-llm-2023/`` (the 2023 traces, ~1 h each, CC-BY-4.0, so they load offline with no
    download); the cache (``$MOELAB_CACHE/public``, by default ``~/.cache/moelab/public``);
    else a download into that cache. The 2024 week-long traces are not bundled (too large): they come from
    the environment copy, the cache or a download on first use, are read in chunks, and ``nrows`` keeps
    only the first rows.

    Parameters
    ----------
    kind : {"conv", "code"}
        The conversation or the coding trace.
    year : {2023, 2024}
        The trace's release.
    nrows : int, optional
        Keep only the first ``nrows`` requests (>= 1); the 2024 files then stop reading early.
    chunksize : int
        Rows read at a time from a 2024 file.

    Returns
    -------
    RequestTrace
        Arrivals (seconds from the first), prompt and output lengths.
    """
    check_choice("kind", kind, ("code", "conv"))
    check_choice("year", year, (2023, 2024))
    if nrows is not None:
        nrows = check_int("nrows", nrows, low=1)
    path = public_path(f"azure-{year}-{kind}")
    if year == 2024:
        parts, seen = [], 0
        for chunk in pd.read_csv(path, chunksize=chunksize):
            parts.append(chunk)
            seen += len(chunk)
            if nrows is not None and seen >= nrows:
                break
        df = pd.concat(parts, ignore_index=True)
    else:
        df = pd.read_csv(path)
    if nrows is not None:
        df = df.head(nrows)
    return _frame_to_trace(df, f"azure-{year}-{kind}")


def stable_hash(text: str) -> int:
    """A stable 63-bit hash of a prompt text (for ExactMatch-style per-prompt statistics)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def replay_requests(
    trace: ExpertTrace,
    *,
    rate: float,
    n_requests: int,
    output_len: int | np.ndarray = 512,
    seed: int = 0,
    signatures: np.ndarray | None = None,
) -> RequestTrace:
    """Poisson arrivals at ``rate`` req/s; each request replays a uniformly drawn request of the expert
    ``trace`` (its prompt length and domain included) from a random decode offset, with fixed or given
    output lengths. Trace requests without captured decode tokens have no experts to replay and are
    not drawn. ``signatures`` ([trace.n_requests, d]) gives each request its trace row's signature."""
    check_instance("trace", trace, ExpertTrace, "an ExpertTrace")
    rate = check_real("rate", rate, low=0, low_open=True)
    n = check_int("n_requests", n_requests, low=1, high=MAX_TRACE_REQUESTS, high_name="MAX_TRACE_REQUESTS",
                  why=_REQUESTS_WHY)
    # every input is checked before the draws: a bad output_len or signatures used to fail after them, in numpy
    out = check_int_array("output_len", output_len, low=1, high=MAX_SEQUENCE_TOKENS + 1,
                          high_name="MAX_SEQUENCE_TOKENS + 1", kind="token counts")
    if out.ndim > 1 or (out.ndim == 1 and out.shape[0] not in (1, n)):
        raise ValueError(f"output_len must be one length or one per request (n_requests={n}); got shape {out.shape}")
    if signatures is not None:
        signatures = check_array("signatures", signatures, ndim=2, dtype=np.float64)
        if signatures.shape[0] != trace.n_requests:
            raise ValueError(f"signatures must have one row per trace request ({trace.n_requests}); "
                             f"got {signatures.shape[0]}")
        check_product(("n_requests", "signature dim"), (n, signatures.shape[1]), cap=MAX_SIGNATURE_CELLS,
                      cap_name="MAX_SIGNATURE_CELLS", why="each request gets its own copy of its row's signature")
    eligible = np.flatnonzero(trace.decode_lens > 0)
    if eligible.size == 0:
        raise ValueError("trace has no request with decode tokens to replay")
    rng = rng_from(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    arrival -= arrival[0]
    idx = eligible[rng.integers(0, eligible.size, size=n)]
    lens = trace.decode_lens[idx]
    out = np.broadcast_to(out, (n,)).copy()
    codes, _ = trace.domain_codes()
    sig = None
    if signatures is not None:
        sig = signatures[idx]
    return RequestTrace(arrival, trace.prompt_lens[idx], out, None, f"replay of an expert trace at "
                        f"{rate:g} req/s (seed {seed})", {}, codes[idx], sig, idx, rng.integers(0, lens))
