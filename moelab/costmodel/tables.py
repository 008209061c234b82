"""Where measured calibration tables come from: a bundled GPU (``data/calibration/<gpu>/``) or any folder
``moelab calibrate --out DIR`` wrote (same file names, same columns).

Every reader of calibration tables (the step models here, AFD's stage tables) goes through
:func:`read_calibration_table`, so a new GPU's folder works without editing code, and a folder without a
table a model needs is refused naming the missing file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from moelab._io import FileFormatError, read_csv_checked
from moelab.costmodel.shapes import MoEShape
from moelab.datasets import repo_root

#: the tables ``moelab calibrate`` writes
CALIBRATE_TABLES = ("moe_step", "attn_step", "dense_verify", "decode_layer")

#: each table's required columns: ``"name"`` (a shape name), ``"time"`` (milliseconds, finite, > 0) or
#: ``"size"`` (an integer >= 1); other columns (e.g. ``floor_ms_per_layer``) are kept unchecked
TABLE_SCHEMA: dict[str, dict[str, str]] = {
    "moe_step": {"model": "name", "method": "name", "B": "size", "D": "size", "ms_per_layer": "time"},
    "attn_step": {"shape": "name", "B": "size", "ctx": "size", "ms_attn_core": "time", "kv_bytes": "size"},
    "dense_verify": {"shape": "name", "layers_in_model": "size", "q": "size", "ctx": "size", "ms_per_layer": "time"},
    "decode_layer": {"shape": "name", "B": "size", "ctx": "size", "D": "size", "ms_per_layer": "time"},
}


def bundled_gpus() -> list[str]:
    """The GPUs whose tables ship in ``data/calibration/``."""
    root = repo_root() / "data" / "calibration"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def calibration_folder(calibration: str | os.PathLike) -> Path:
    """The folder of ``calibration``: a bundled GPU name (e.g. ``"h200"``) or a folder path.

    Raises
    ------
    ValueError
        Neither a bundled GPU nor an existing folder (the message lists the bundled GPUs).
    """
    if isinstance(calibration, str) and calibration in bundled_gpus():
        return repo_root() / "data" / "calibration" / calibration
    if isinstance(calibration, (str, os.PathLike)) and Path(calibration).is_dir():
        return Path(calibration)
    raise ValueError(f"calibration must be a bundled GPU {bundled_gpus()} or a folder `moelab calibrate --out DIR` "
                     f"wrote; got {calibration!r}")


def calibration_moe_shapes(calibration: str | os.PathLike) -> dict[str, MoEShape]:
    """The expert shapes a ``moelab calibrate`` folder measured under its own names (``fit.json``'s
    ``shapes.moe``), so its ``moe_step.csv`` fits even when they are not in :data:`MODEL_SHAPES`;
    ``{}`` for a folder without them (a bundled GPU's tables name registry shapes).

    Parameters
    ----------
    calibration : str or path
        A bundled GPU's name or a ``moelab calibrate`` folder.

    Returns
    -------
    dict of str to MoEShape
    """
    path = calibration_folder(calibration) / "fit.json"
    if not path.is_file():
        return {}
    try:
        shapes = json.loads(path.read_text()).get("shapes", {}).get("moe", {})
        return {str(n): MoEShape(**v) for n, v in shapes.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise FileFormatError(path, "shapes.moe", f"must map shape names to MoEShape fields ({exc})") from None


def read_calibration_table(calibration: str | os.PathLike, table: str) -> pd.DataFrame:
    """``<table>.csv`` of a calibration (see :func:`calibration_folder`), checked against its schema.

    Parameters
    ----------
    calibration : str or path
        A bundled GPU's name or a folder ``moelab calibrate --out DIR`` wrote.
    table : str
        One of :data:`TABLE_SCHEMA`. Required columns (ms = milliseconds; sizes are integers >= 1):

        ================  ==============================================================
        ``moe_step``      ``model, method, B, D, ms_per_layer`` (one MoE layer's experts)
        ``attn_step``     ``shape, B, ctx, ms_attn_core, kv_bytes`` (decode attention core)
        ``dense_verify``  ``shape, layers_in_model, q, ctx, ms_per_layer`` (dense verify)
        ``decode_layer``  ``shape, B, ctx, D, ms_per_layer`` (one whole MoE decode layer;
                          ``shape`` a :data:`MODEL_SHAPES` name)
        ================  ==============================================================

        ``B`` requests in the batch, ``D`` distinct experts, ``ctx`` cached tokens per request, ``q``
        new tokens, ``kv_bytes`` K+V bytes read. Every time is finite and > 0.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    ValueError
        The folder has no ``<table>.csv`` (the message names the missing file, the tables present and
        the command that writes it).
    FileFormatError
        A required column is missing, or a value is out of range (the message names the file, the
        column and the 1-based data row).
    """
    folder = calibration_folder(calibration)
    path = folder / f"{table}.csv"
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.csv"))
        raise ValueError(f"calibration folder {folder} lacks {path.name}, which this model needs; it holds {present} "
                         f"(`moelab calibrate --out DIR` writes {[t + '.csv' for t in CALIBRATE_TABLES]}: rerun it "
                         f"with a current moelab to get {path.name})")
    df = read_csv_checked(path, {}, min_rows=1)  # size, header, parse errors: a FileFormatError naming the file
    schema = TABLE_SCHEMA.get(table, {})
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise FileFormatError(path, missing[0], f"required column missing; {path.name} needs columns "
                                                f"{list(schema)}, has {list(df.columns)}")
    for col, kind in schema.items():
        if kind == "name":
            continue
        vals = pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(vals) | (vals <= 0)
        if kind == "size":
            bad |= vals != np.round(vals)
        if bad.any():
            i = int(np.argmax(bad))
            want = "finite milliseconds > 0" if kind == "time" else "integers >= 1"
            raw = df[col].iloc[i]
            raw = raw.item() if hasattr(raw, "item") else raw  # a plain Python value in the message
            raise FileFormatError(path, col, f"must hold {want}; row {i + 1} has {raw!r}")
    for col in df.columns:  # an inf or NaN timing would become an inf/NaN cost: refused here, by column and row
        if df[col].dtype.kind in "iuf":
            vals = df[col].to_numpy(np.float64)
            bad = ~np.isfinite(vals)
            if bad.any():
                raise FileFormatError(path, col, f"must hold finite numbers; row {int(np.argmax(bad)) + 1} has "
                                                 f"{vals[bad][0]!r}")
    return df


__all__ = ["CALIBRATE_TABLES", "TABLE_SCHEMA", "bundled_gpus", "calibration_moe_shapes", "calibration_folder", "read_calibration_table"]
