"""The moelab command line: version, notebook selection, parameters, benchmarks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moelab import __version__
from moelab.cli import main
from moelab.notebooks import parse_params, resolve


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "moelab.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"moelab {__version__}"


def test_params_parse_literals_and_reject_garbage():
    assert parse_params(["n=3", "rate=2.5", "name=jsq", "flags=[1, 2]"]) == {"n": 3, "rate": 2.5, "name": "jsq", "flags": [1, 2]}
    with pytest.raises(ValueError, match="name=value"):
        parse_params(["oops"])


def test_unknown_notebook_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="notebook must be one of"):
        resolve(["99_nothing"])
    assert main(["notebooks", "run", "99_nothing"]) == 2
    assert "notebook must be one of" in capsys.readouterr().err


def test_bench_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "costmodel", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = {r["name"] for r in rows}
    assert "costmodel_moe_median_abs_err_pct" in names
    assert all(set(r) >= {"name", "value", "unit", "goal", "met"} for r in rows)
    assert "costmodel_moe_median_abs_err_pct" in capsys.readouterr().out
    assert main(["bench", "nope"]) == 2


def test_notebooks_declare_optional_requirements(monkeypatch):
    import importlib.util

    from moelab import notebooks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert notebooks.missing_requirements("06_from_your_deployment") == ["vllm"]
    assert notebooks.missing_requirements("03_afd_ratio") == []
