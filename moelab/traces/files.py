"""The one way to read an expert trace from disk, whichever of the two file formats wrote it.

A trace is an ``.npz`` plus a JSON sidecar whose ``format`` tag names the layout:
``moelab.ExpertTrace`` (:meth:`~moelab.traces.expert.ExpertTrace.save`: plain arrays, per-token prefill
ids kept) or ``moelab.CompactExpertTrace`` (:func:`~moelab.traces.compact.save_compact_trace`: top-k sets
ranked, the bundled project-MoE traces). :func:`load_trace` reads the tag and hands the file to the
loader of that format, so callers never guess and never catch one loader's error to try the other.
"""

from __future__ import annotations

from pathlib import Path

from moelab._io import FileFormatError, read_json_record
from moelab.datasets import repo_root
from moelab.traces.compact import FORMAT as COMPACT_FORMAT
from moelab.traces.compact import load_compact_trace
from moelab.traces.expert import FORMAT as PLAIN_FORMAT
from moelab.traces.expert import ExpertTrace

#: format tag in the sidecar -> the reader of that format
FORMATS = {PLAIN_FORMAT: ExpertTrace.load, COMPACT_FORMAT: load_compact_trace}


def load_trace(path: str | Path) -> ExpertTrace:
    """An :class:`ExpertTrace` from ``path`` (``.npz``; its ``.json`` sidecar beside it), read by the
    loader its sidecar's ``format`` tag names (see :data:`FORMATS`), every field checked as untrusted input.

    Raises
    ------
    FileNotFoundError
        The ``.npz`` does not exist.
    moelab.traces.FileFormatError
        (a ``ValueError``) the sidecar is missing or names no known format, or anything malformed (naming
        the file and the field).
    """
    path = Path(path).with_suffix(".npz")
    meta_path = path.with_suffix(".json")
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if not meta_path.is_file():
        raise FileFormatError(path, None, f"is not a moelab trace: its sidecar {meta_path.name} is missing")
    fmt = read_json_record(meta_path).get("format", None)
    if fmt not in FORMATS:
        raise FileFormatError(meta_path, "format", f"is {fmt!r}; a moelab trace sidecar names one of {sorted(FORMATS)}")
    return FORMATS[fmt](path)


def traces_dir() -> Path:
    """``data/traces/`` of the repository: the bundled real traces."""
    return repo_root() / "data" / "traces"


def bundled_trace_path(name: str) -> Path:
    """``data/traces/<name>.npz`` (it may be absent: check before loading)."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"name must be a plain file stem under data/traces/ (no folders); got {name!r}")
    return traces_dir() / f"{name}.npz"


def real_trace_path() -> Path | None:
    """The real trace ELDR's real-routing figures run on: the task-labelled ShareGPT-MoE Spec-Bench trace
    when bundled under ``data/traces/`` (the paper's Task workload is task-labelled), else any other
    ShareGPT-MoE trace, else the tiny-MoE held-out trace; None when none is there."""
    root = traces_dir()
    for pattern in ("sharegpt-moe-specbench.npz", "sharegpt-moe*.npz", "tiny-moe-heldout.npz"):
        found = sorted(root.glob(pattern)) if root.is_dir() else []
        if found:
            return found[0]
    return None


__all__ = ["FORMATS", "bundled_trace_path", "load_trace", "real_trace_path", "traces_dir"]
