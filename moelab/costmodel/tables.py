"""Where measured calibration tables come from: a bundled GPU (``data/calibration/<gpu>/``) or any folder
``moelab calibrate --out DIR`` wrote (same file names, same columns).

Every reader of calibration tables (the step models here, AFD's stage tables) goes through
:func:`read_calibration_table`, so a new GPU's folder works without editing code, and a folder without a
table a model needs is refused naming the missing file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from moelab._io import FileFormatError, read_csv_checked
from moelab.datasets import repo_root

#: the tables ``moelab calibrate`` writes (``decode_layer.csv`` is bundled for the H200 only)
CALIBRATE_TABLES = ("moe_step", "attn_step", "dense_verify")


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


def read_calibration_table(calibration: str | os.PathLike, table: str) -> pd.DataFrame:
    """``<table>.csv`` of a calibration (see :func:`calibration_folder`).

    Raises
    ------
    ValueError
        The folder has no ``<table>.csv`` (the message names the missing file and the tables present).
    """
    folder = calibration_folder(calibration)
    path = folder / f"{table}.csv"
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.csv"))
        raise ValueError(f"calibration folder {folder} lacks {path.name}, which this model needs; it holds {present} "
                         f"(`moelab calibrate --out DIR` writes {[t + '.csv' for t in CALIBRATE_TABLES]})")
    df = read_csv_checked(path, {}, min_rows=1)  # size, header, parse errors: a FileFormatError naming the file
    for col in df.columns:  # an inf or NaN timing would become an inf/NaN cost: refused here, by column and row
        if df[col].dtype.kind in "iuf":
            vals = df[col].to_numpy(np.float64)
            bad = ~np.isfinite(vals)
            if bad.any():
                raise FileFormatError(path, col, f"must hold finite numbers; row {int(np.argmax(bad)) + 1} has "
                                                 f"{vals[bad][0]!r}")
    return df


__all__ = ["CALIBRATE_TABLES", "bundled_gpus", "calibration_folder", "read_calibration_table"]
