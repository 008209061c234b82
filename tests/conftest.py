"""Test setup: point moelab's public-data loader at the shared local copy, figures at a temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if "MOELAB_PUBLIC_DATA" not in os.environ and SHARED_DATA.is_dir():
    os.environ["MOELAB_PUBLIC_DATA"] = str(SHARED_DATA)


@pytest.fixture
def public_data() -> Path:
    """The local copy of the public data sets; tests that need it are skipped only if it is absent."""
    root = os.environ.get("MOELAB_PUBLIC_DATA")
    if not root or not Path(root).is_dir():
        pytest.skip("public data not available: set MOELAB_PUBLIC_DATA to a copy of shared/data")
    return Path(root)


# Static figures are written as HTML in tests; PNG export starts a browser per figure (seconds each).
os.environ.setdefault("MOELAB_PNG", "0")


@pytest.fixture(autouse=True)
def _figures_to_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_FIGURES", str(tmp_path / "figures"))
