"""The run-size presets (``PRESET`` in every notebook, ``moelab/presets.py``): resolution, validation, the
notebooks' parameters cells that use them, and ``moelab notebooks run --preset``."""

from __future__ import annotations

import ast
import json

import pytest

from moelab import presets
from moelab.cli import main
from moelab.notebooks import available_notebooks, notebook_parameters, notebooks_dir


def _cells(name: str) -> list[dict]:
    return json.loads((notebooks_dir() / f"{name}.ipynb").read_text())["cells"]


def test_unknown_preset_names_the_parameter_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"PRESET must be one of 'ci', 'classroom', 'full'; got 'huge'"):
        presets.resolve("03_afd_ratio", "huge")
    with pytest.raises(ValueError, match="PRESET must be one of"):
        presets.resolve("03_afd_ratio", None)
    with pytest.raises(ValueError, match="notebook must be one of"):
        presets.resolve("99_nothing", "ci")


def test_an_explicit_value_wins_over_the_preset_and_none_takes_the_preset():
    ci = presets.preset_values("03_afd_ratio", "ci")
    got = presets.resolve("03_afd_ratio", "ci", {"N": 5000, "MAP_B": None, "NOT_SIZED": 1})
    assert got["N"] == 5000 != ci["N"]
    assert got["MAP_B"] == ci["MAP_B"] and "NOT_SIZED" not in got
    assert {k: v for k, v in got.items() if k != "N"} == {k: v for k, v in ci.items() if k != "N"}
    # the three presets differ (ci smallest), and each resolves to its own table
    full = presets.resolve("03_afd_ratio", "full")
    assert full["N"] > ci["N"] and len(full["MAP_B"]) > len(ci["MAP_B"])
    # a notebook cannot change the table through the lists it gets
    got["R_VALUES"].append(999)
    assert 999 not in presets.preset_values("03_afd_ratio", "ci")["R_VALUES"]


@pytest.mark.parametrize(("notebook", "params", "named"), [
    ("03_afd_ratio", {"N": 0}, "N"),
    ("03_afd_ratio", {"MAP_DISTRIBUTIONS": ["geometric", "lognormal"]}, "MAP_DISTRIBUTIONS"),
    ("01_eldr", {"RATES": []}, "RATES"),
    ("01_eldr", {"REGIME_KS": [1, 4]}, "REGIME_KS"),
    ("02_hierarchy_drafting", {"PER_CATEGORY": "most"}, "PER_CATEGORY"),
    ("05_balanceroute", {"TUNE_GRID": {"horizon": [4]}}, "TUNE_GRID"),
    ("05_balanceroute", {"TOKENIZER": "gpt2"}, "TOKENIZER"),
])
def test_an_out_of_range_value_is_named(notebook, params, named):
    with pytest.raises(ValueError, match=rf"^{named}\b"):
        presets.resolve(notebook, "classroom", params)


def test_all_means_the_whole_data_set():
    assert presets.resolve("02_hierarchy_drafting", "ci", {"PER_CATEGORY": "all"})["PER_CATEGORY"] is None
    assert presets.resolve("05_balanceroute", "full")["N_REQUESTS"] == 3000
    assert presets.resolve("05_balanceroute", "ci", {"N_REQUESTS": "all"})["N_REQUESTS"] is None


def test_every_notebook_has_a_preset_and_its_sized_parameters_left_to_it():
    assert sorted(presets.SIZES) == available_notebooks()
    for name in available_notebooks():
        known = notebook_parameters(name)
        assert known.get("PRESET") == presets.DEFAULT_PRESET, name
        sized = presets.sized_parameters(name)
        assert set(sized) <= set(known), f"{name}: sized but not a parameter: {sorted(set(sized) - set(known))}"
        assert all(known[k] is None for k in sized), f"{name}: a sized parameter with a value in the cell"
        # ... and the cell after the parameters cell applies this notebook's preset before anything reads them
        cells = _cells(name)
        at = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
        source = "".join(cells[at + 1]["source"])
        assert f'globals().update(resolve("{name}", PRESET, globals()))' in source, name
        tree = ast.parse(source)
        first_use = min((n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in sized
                         and isinstance(n.ctx, ast.Load)), default=10**9)
        call = source[:source.index("globals().update(")].count("\n") + 1
        assert call < first_use, f"{name} reads a sized parameter before the preset is applied"


def test_no_parameter_is_set_twice():
    for name in available_notebooks():
        cell = next(c for c in _cells(name) if "parameters" in c["metadata"].get("tags", []))
        targets = [t.id for n in ast.parse("".join(cell["source"])).body if isinstance(n, ast.Assign)
                   for t in ast.walk(n.targets[0]) if isinstance(t, ast.Name)]
        assert len(targets) == len(set(targets)), f"{name}: {sorted(t for t in targets if targets.count(t) > 1)}"


def _size(v):
    return len(v) if isinstance(v, (list, dict)) else v


def test_presets_grow_and_classroom_still_teaches():
    for name, table in presets.SIZES.items():
        for k, s in table.items():
            if isinstance(s.ci, (int, float, list)) and not isinstance(s.ci, bool) and isinstance(s.full, type(s.ci)):
                assert _size(s.ci) <= _size(s.classroom) <= _size(s.full), f"{name}.{k}"
    room = {n: presets.preset_values(n, "classroom") for n in presets.SIZES}
    # rate and load curves with >= 3 points, regime maps >= 2 x 2 cells, sliders with >= 2 stops
    for curve in (room["01_eldr"]["RATES"], room["01_eldr"]["REAL_RATES"], room["04_dsd_rtt"]["RTT_MEANS"],
                  room["05_balanceroute"]["LOADS"], room["03_afd_ratio"]["R_VALUES"]):
        assert len(curve) >= 3
    for a, b in (("REGIME_SCALES", "REGIME_KS"), ("REGIME_KS", "REGIME_TAUS")):
        assert len(room["01_eldr"][a]) >= 2 and len(room["01_eldr"][b]) >= 2
    assert len(room["03_afd_ratio"]["MAP_B"]) >= 2 and len(room["03_afd_ratio"]["MAP_MU_P"]) >= 2
    assert len(room["05_balanceroute"]["REGIME_SHAPES"]) >= 2 and len(room["05_balanceroute"]["REGIME_CONTEXT"]) >= 2
    assert len(room["07_cross_paper"]["SHARES"]) >= 2


def test_cli_refuses_a_bad_preset_or_value_before_running(capsys, tmp_path):
    out = str(tmp_path / "runs")
    with pytest.raises(SystemExit) as exc:
        main(["notebooks", "run", "03", "--preset", "huge", "--out", out])
    assert exc.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    assert main(["notebooks", "run", "03", "--params", "PRESET=huge", "--out", out]) == 2
    assert "error: PRESET must be one of 'ci', 'classroom', 'full'; got 'huge'" in capsys.readouterr().err
    assert main(["notebooks", "run", "03", "--preset", "ci", "--params", "N=-3", "--out", out]) == 2
    assert "error: N must be an integer in [1, 1000000]; got -3" in capsys.readouterr().err
    assert main(["notebooks", "run", "03", "--preset", "ci", "--params", "PRESET=full", "--out", out]) == 2
    assert "disagree" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_papermill_reads_every_parameter():
    """papermill's own parser (it injects PRESET and the overrides) sees every parameter of the cell: a
    comment holding ``=`` makes it skip that line ("Unable to parse line ...")."""
    pm = pytest.importorskip("papermill")
    for name in available_notebooks():
        assert set(pm.inspect_notebook(str(notebooks_dir() / f"{name}.ipynb"))) == set(notebook_parameters(name)), name


@pytest.mark.parametrize("preset", presets.PRESETS)
def test_each_preset_meets_the_notebooks_own_cross_checks(preset):
    """Limits that tie two parameters together (checked inside the notebooks, not by :func:`presets.resolve`)."""
    eldr = presets.preset_values("01_eldr", preset)
    assert eldr["N_WORKERS"] <= eldr["N_TRACE"] // 2 and max(eldr["REGIME_KS"]) <= eldr["N_TRACE"] // 2
    afd = presets.preset_values("03_afd_ratio", preset)
    assert afd["MAP_REQUESTS"] >= max(afd["MAP_B"])  # a horizon of at least one fill of the slots
    assert afd["N"] >= notebook_parameters("03_afd_ratio")["B"]
    hd = presets.preset_values("02_hierarchy_drafting", preset)
    assert notebook_parameters("02_hierarchy_drafting")["BUDGET"] in hd["BUDGETS"]
    assert hd["CURVE_QS"][0] == 1 and hd["CURVE_QS"] == sorted(set(hd["CURVE_QS"]))
