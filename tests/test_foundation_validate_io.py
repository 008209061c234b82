"""Validation helpers and atomic, pickle-free IO."""

from __future__ import annotations

import json
from pathlib import Path

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


# ---------------------------------------------------------------------------------------------- domain helpers


def test_empty_ranges_say_so_and_name_the_bound():
    from moelab._validate import check_int, check_real

    # a bound computed from other inputs can leave nothing valid: say so, never "K must be in [1, 0]" alone
    with pytest.raises(ValueError, match=r"K must be an integer in \[1, n_signatures=0\], an empty range "
                                         r"\(n_signatures leaves no valid value\); got 3"):
        check_int("K", 3, low=1, high=0, high_name="n_signatures")
    with pytest.raises(ValueError, match=r"K must be an integer in \[1, 0\], an empty range"):
        check_int("K", 1, low=1, high=0)
    with pytest.raises(ValueError, match=r"x must be in \[0, 0\), an empty range"):
        check_real("x", 0, low=0, high=0, high_open=True)
    assert check_int("K", 2, low=1, high=3, high_name="n") == 2
    with pytest.raises(ValueError, match=r"K must be an integer in \[1, n=3\]; got 4$"):
        check_int("K", 4, low=1, high=3, high_name="n")
    with pytest.raises(ValueError, match="mode has no valid value"):
        check_choice("mode", "a", [])


def test_check_int_array_never_truncates():
    from moelab._validate import check_int_array

    assert check_int_array("ids", [1, 2, 3], low=0, high=4).dtype == np.int64
    assert check_int_array("ids", np.array([1.0, 2.0]), low=0).tolist() == [1, 2]  # integral floats are fine
    with pytest.raises(ValueError, match=r"token_ids must be an array of token ids in \[0, vocab_size=100\); "
                                         r"got 1.5 at index 0"):
        check_int_array("token_ids", [1.5, 2.7, 3.2, 4.9], low=0, high=100, high_name="vocab_size", kind="token ids")
    with pytest.raises(ValueError, match=r"got 100 at index 1"):
        check_int_array("token_ids", [3, 100], low=0, high=100)
    with pytest.raises(ValueError, match=r"got -1 at index \(1, 0\)"):
        check_int_array("ids", [[0], [-1]], low=0)
    for bad, words in (([True, False], "booleans"), (["a"], "dtype <U1"), ([[1, 2], [3]], r"got \[\[1, 2\], \[3\]\]"),
                       ([float("nan")], "nan"), ([2.0**70], "1.18"), ([10**30], r"got \[10{30}\]|dtype object")):
        with pytest.raises(ValueError, match=words):
            check_int_array("ids", bad)
    with pytest.raises(ValueError, match=r"an empty range \(E leaves no valid value\)"):
        check_int_array("ids", [0], low=0, high=0, high_name="E")
    with pytest.raises(ValueError, match="ids must be a 1-d array of integers"):
        check_int_array("ids", [[1]], ndim=1)


def test_sorted_finite_probability_count_and_top_k_helpers():
    from moelab._validate import (
        check_counts,
        check_finite_array,
        check_probabilities,
        check_sorted,
        check_top_k,
    )

    assert check_sorted("arrival_s", [0, 0, 1.5]).tolist() == [0, 0, 1.5]
    with pytest.raises(ValueError, match=r"arrival_s must be non-decreasing \(sorted\); got 2.0 at index 1 then 1.0 at index 2"):
        check_sorted("arrival_s", [0, 2, 1])
    with pytest.raises(ValueError, match="t must be increasing"):
        check_sorted("t", [0, 0], strict=True)
    with pytest.raises(ValueError, match=r"arrival_s must contain only finite values; got nan at index 1"):
        check_sorted("arrival_s", [0, float("nan"), 1])
    with pytest.raises(ValueError, match="arrival_s must be a 1-d array"):
        check_sorted("arrival_s", [[0, 1]])
    with pytest.raises(ValueError, match=r"sig must contain only finite values; got inf at index \(0, 1\)"):
        check_finite_array("sig", [[0, float("inf")]])
    with pytest.raises(ValueError, match=r"sig must be an array of numbers; got dtype <U3 \('abc'\)"):
        check_finite_array("sig", "abc")
    assert check_probabilities("p", [[0.25, 0.75]], sum_axis=1).shape == (1, 2)
    with pytest.raises(ValueError, match=r"p must hold probabilities in \[0, 1\]; got 1.5 at index 1"):
        check_probabilities("p", [0.2, 1.5])
    with pytest.raises(ValueError, match="p must sum to 1 along axis 1"):
        check_probabilities("p", [[0.2, 0.2]], sum_axis=1)
    assert check_counts("c", [0, 3]).tolist() == [0, 3]
    for bad in ([1, -1], [0.5], [float("nan")]):
        with pytest.raises(ValueError, match=r"c must be an array of integers in \[0, inf\)"):
            check_counts("c", bad)
    assert check_top_k(2, 8) == 2
    with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, num_experts=4\]; got 5"):
        check_top_k(5, 4)
    with pytest.raises(ValueError, match=r"num_experts must be an integer in \[1, inf\)"):
        check_top_k(1, 0)


def test_check_array_never_leaks_raw_numpy_text():
    with pytest.raises(ValueError, match=r"^x must be an array of numbers; got \[\[1, 2\], \[3\]\]$"):
        check_array("x", [[1, 2], [3]])
    with pytest.raises(ValueError, match=r"^x must be an array of numbers; got \['a', 'b'\]$"):
        check_array("x", ["a", "b"], dtype=np.float64)
    with pytest.raises(ValueError, match="D must be <= 8 everywhere; got maximum 9"):
        check_array("D", [1, 9], low=1, high=8)


def _build_once(entry: str, log: str) -> None:
    """A cache build as moelab's builders do it: check, lock, check again, build (slowly), mark done."""
    import time

    from moelab._io import atomic_write_text, build_lock

    with build_lock(entry):
        if not Path(entry).is_file():
            with open(log, "a") as fh:
                fh.write("built\n")
            time.sleep(0.5)  # long enough that the other process asks while this one builds
            atomic_write_text(entry, "done")


def test_build_lock_makes_concurrent_builders_build_once(tmp_path):
    import multiprocessing

    entry, log = tmp_path / "cache" / "entry.txt", tmp_path / "builds.log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_once, args=(str(entry), str(log))) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert log.read_text() == "built\n" and entry.read_text() == "done"
