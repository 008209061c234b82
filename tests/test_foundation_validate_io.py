"""Validation helpers and atomic, pickle-free IO."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moelab._io import atomic_save_npz, atomic_write_json, load_npz, read_json
from moelab._validate import check_array, check_choice, check_int, check_real, rng_from


def test_check_real_names_parameter_and_range():
    assert check_real("alpha", 0.5, low=0, high=1, high_open=True) == 0.5
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\); got 1"):
        check_real("alpha", 1, low=0, high=1, high_open=True)
    with pytest.raises(ValueError, match="rtt"):
        check_real("rtt", float("nan"), low=0)
    for bad in ("fast", True):
        with pytest.raises(ValueError, match="t_a must be a real number"):
            check_real("t_a", bad, low=0)


def test_check_int_rejects_fractions_and_bools():
    assert check_int("B", 4.0, low=1) == 4
    for bad in (0, 2.5, True, "3"):
        with pytest.raises(ValueError, match="B must be an integer"):
            check_int("B", bad, low=1)


def test_check_choice_and_array():
    assert check_choice("mode", "ar", ["ar", "colocated"]) == "ar"
    with pytest.raises(ValueError, match=r"mode must be one of \['ar', 'colocated'\]"):
        check_choice("mode", "x", ["ar", "colocated"])
    with pytest.raises(ValueError, match="signature must have shape"):
        check_array("signature", np.zeros((2, 3)), shape=(None, 4))
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        check_array("lengths", [1, -1], low=0)


def test_rng_from_is_reproducible():
    assert rng_from(7).integers(1 << 30) == rng_from(7).integers(1 << 30)
    with pytest.raises(ValueError, match="seed"):
        rng_from(-1)


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_check_real_accepts_exactly_the_interval(x):
    inside = 0 <= x < 10
    if inside:
        assert check_real("x", x, low=0, high=10, high_open=True) == x
    else:
        with pytest.raises(ValueError):
            check_real("x", x, low=0, high=10, high_open=True)


def test_npz_roundtrip_and_refuses_objects(tmp_path):
    path = atomic_save_npz(tmp_path / "a.npz", x=np.arange(5), y=np.ones((2, 2)))
    back = load_npz(path)
    assert np.array_equal(back["x"], np.arange(5))
    with pytest.raises(ValueError, match="dtype object"):
        atomic_save_npz(tmp_path / "b.npz", z=np.array([{"a": 1}], dtype=object))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable"):
        load_npz(tmp_path / "junk.npz")
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind
    assert path.stat().st_mode & 0o044  # readable by others like any plain file (umask permitting)


def test_json_roundtrip(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"v": np.float64(1.5), "a": np.arange(3)})
    assert read_json(tmp_path / "r.json") == {"a": [0, 1, 2], "v": 1.5}
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_json(tmp_path / "bad.json")
    assert json.loads((tmp_path / "r.json").read_text())["v"] == 1.5


def test_check_loopback_host():
    from moelab._validate import check_loopback_host

    for ok in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert check_loopback_host("host", ok) == ok
    for bad in ("0.0.0.0", "10.0.0.1", "example.org"):
        with pytest.raises(ValueError, match="host must be a loopback address"):
            check_loopback_host("host", bad)
