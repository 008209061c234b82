"""``moelab.viz.readable``: the tables the notebooks show, rounded for reading."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moelab.viz import readable


def test_readable_rounds_each_value_on_its_own_scale():
    df = pd.DataFrame({"tok_s": [37571.270352, 21814.878], "ms": [14.93214, np.nan], "mixed": [1600.8371, 0.021234],
                       "blocks": [4096.0, 598.0], "name": ["a", "b"], "inf": [np.inf, 1.23456], "neg": [-0.35872, 0.0]})
    out = readable(df)
    assert out["tok_s"].tolist() == [37571, 21815] and str(out["tok_s"].dtype) == "Int64"
    assert out["ms"].tolist() == [14.93, "—"]  # a missing value reads as a dash (the book showed NaN, <NA>, None)
    assert out["mixed"].tolist() == [1601.0, 0.02123]  # a small value beside a large one keeps its digits
    assert out["blocks"].tolist() == [4096, 598]
    assert out["name"].tolist() == ["a", "b"] and out["inf"].tolist() == [np.inf, 1.235]
    assert out["neg"].tolist() == [-0.3587, 0.0]
    assert readable(df, digits=2)["ms"].iloc[0] == 15.0
    assert df["tok_s"].iloc[0] == 37571.270352  # the input is not changed
    with pytest.raises(ValueError, match="digits"):
        readable(df, digits=0)


def test_readable_shows_every_kind_of_missing_value_as_a_dash():
    df = pd.DataFrame({"n": pd.array([1, None], dtype="Int64"), "ok": [True, None], "x": [1.0, 2.0]})
    out = readable(df)
    assert out["n"].tolist() == [1, "—"] and out["ok"].tolist() == [True, "—"]
    assert out["x"].tolist() == [1, 2] and str(out["x"].dtype) == "Int64"  # a column with nothing missing keeps its type
