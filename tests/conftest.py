"""Test setup: public data from the bundled copy (``data/public``), figures to a temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def public_data() -> Path:
    """The bundled public data sets (``data/public``): they ship with the source tree, so tests that
    read them never skip."""
    return REPO / "data" / "public"


# Static figures are written as HTML in tests; PNG export starts a browser per figure (seconds each).
os.environ.setdefault("MOELAB_PNG", "0")


@pytest.fixture(autouse=True)
def _figures_to_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_FIGURES", str(tmp_path / "figures"))
