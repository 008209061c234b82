"""Request traces: arrival time, prompt length and output length per request."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moelab._validate import check_int, check_real, rng_from

REQUIRED_COLUMNS = ("arrival_s", "prompt_len", "output_len")
_AZURE_COLUMNS = {"TIMESTAMP": "timestamp", "ContextTokens": "prompt_len", "GeneratedTokens": "output_len"}


@dataclass(frozen=True)
class RequestTrace:
    """A request trace: ``arrival_s`` (seconds from the first arrival, sorted), ``prompt_len``,
    ``output_len`` (tokens), optional ``prompt_key`` (a hash identifying repeated prompts) and a
    ``source`` note. ``dropped`` counts rows removed by filters so far (reported, never silent)."""

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prompt_key: np.ndarray | None = None
    source: str = "unknown"
    dropped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arrival = np.asarray(self.arrival_s, dtype=np.float64)
        prompt = np.asarray(self.prompt_len)
        output = np.asarray(self.output_len)
        n = arrival.shape[0]
        for name, arr in (("arrival_s", arrival), ("prompt_len", prompt), ("output_len", output)):
            if arr.ndim != 1 or arr.shape[0] != n:
                raise ValueError(f"{name} must be a 1-d array of length {n}; got shape {arr.shape}")
        if n and (not np.all(np.isfinite(arrival)) or arrival.min() < 0):
            raise ValueError("arrival_s must be finite and >= 0")
        if n and np.any(np.diff(arrival) < 0):
            raise ValueError("arrival_s must be sorted in non-decreasing order")
        for name, arr in (("prompt_len", prompt), ("output_len", output)):
            if n and (not np.all(np.equal(np.mod(arr, 1), 0)) or arr.min() < 1):
                raise ValueError(f"{name} must hold integers >= 1; got minimum {arr.min()!r}")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_len", prompt.astype(np.int64))
        object.__setattr__(self, "output_len", output.astype(np.int64))
        if self.prompt_key is not None:
            key = np.asarray(self.prompt_key, dtype=np.int64)
            if key.shape != (n,):
                raise ValueError(f"prompt_key must be a 1-d array of length {n}; got shape {key.shape}")
            object.__setattr__(self, "prompt_key", key)

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
        return RequestTrace(
            self.arrival_s[idx] if arrival is None else arrival,
            self.prompt_len[idx],
            self.output_len[idx],
            None if self.prompt_key is None else self.prompt_key[idx],
            self.source if note is None else f"{self.source}; {note}",
            {**self.dropped, **(dropped or {})},
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
        n = check_int("n", n, low=1)
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
        """Build from a DataFrame with ``arrival_s, prompt_len, output_len`` (and optional ``prompt_key``)."""
        missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"trace is missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
        if df[list(REQUIRED_COLUMNS)].isna().any().any():
            raise ValueError("trace has empty cells in arrival_s/prompt_len/output_len")
        df = df.sort_values("arrival_s", kind="stable")
        arrival = df["arrival_s"].to_numpy(np.float64)
        return cls(arrival - (arrival[0] if len(arrival) else 0.0), df["prompt_len"].to_numpy(), df["output_len"].to_numpy(),
                   df["prompt_key"].to_numpy() if "prompt_key" in df.columns else None, source)

    @classmethod
    def from_csv(cls, path: str | Path) -> RequestTrace:
        """Read a CSV with ``arrival_s, prompt_len, output_len`` or the Azure columns
        ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
        return _frame_to_trace(pd.read_csv(path), str(path))


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
    lengths = df[["prompt_len", "output_len"]]
    if (lengths < 0).any().any():
        raise ValueError(f"trace {source} has negative prompt_len/output_len values")
    # Azure's conversation trace has a few zero-length outputs: a request that generated nothing
    # never reaches a decode worker, so it is dropped and counted.
    zero = (lengths == 0).any(axis=1)
    trace = RequestTrace.from_frame(df[~zero], source=source)
    if "prompt_key" not in df.columns:
        trace = RequestTrace(trace.arrival_s, trace.prompt_len, trace.output_len, _prompt_key(trace.prompt_len),
                             trace.source, trace.dropped)
    return RequestTrace(trace.arrival_s, trace.prompt_len, trace.output_len, trace.prompt_key, trace.source,
                        {"zero_length": int(zero.sum())})


def load_azure_trace(kind: str = "conv", year: int = 2023, *, nrows: int | None = None,
                     chunksize: int = 1_000_000) -> RequestTrace:
    """Azure LLM inference trace (``kind`` 'code' or 'conv'; ``year`` 2023 or 2024).

    The 2023 traces (~1 h) come through :func:`moelab.datasets.public_path` (local copy via
    ``$MOELAB_PUBLIC_DATA`` or download). The 2024 week-long traces are large: they are read in
    chunks, and ``nrows`` keeps only the first rows.
    """
    from moelab.datasets import public_path

    if kind not in ("code", "conv"):
        raise ValueError(f"kind must be one of ['code', 'conv']; got {kind!r}")
    if year not in (2023, 2024):
        raise ValueError(f"year must be one of [2023, 2024]; got {year!r}")
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
