"""Hostile input, round three: a notebook parameter is data, never code, and every value is checked before
any kernel starts (moelab.parameters + moelab.presets: the notebooks' parameter model)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moelab import presets
from moelab.cli import main
from moelab.notebooks import _check_injection, available_notebooks, notebook_parameters, parse_params
from moelab.parameters import FIXED, assignments, check_json_value

PWNED = "moelab-pwned-marker"


@pytest.fixture
def no_kernel(monkeypatch):
    """Fail the test if anything tries to execute a notebook."""
    import papermill

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was started")

    monkeypatch.setattr(papermill, "execute_notebook", refuse)


def test_every_parameter_of_every_notebook_is_in_the_model_and_its_defaults_pass():
    for name in available_notebooks():
        known = notebook_parameters(name)
        modelled = set(FIXED[name]) | set(presets.SIZES[name]) | {"PRESET"}
        assert set(known) == modelled, (name, set(known) ^ modelled)
        for preset in presets.PRESETS:
            presets.resolve(name, preset, known)
        for size in presets.SIZES[name].values():  # the full preset lies inside every cap
            for p in presets.PRESETS:
                size.check("x", size.at(p))


# the injection and values that are not data: bytes, set, tuple, complex, nested, quote-bearing
HOSTILE = [
    "MODEL=b'\"; __import__(\"os\").system(\"touch /tmp/" + PWNED + "\"); x = \"'",
    "MODEL={1, 2}",
    "MODEL=(1, 2)",
    "MODEL=1j",
    "MODEL=[[[[[[1]]]]]]",
    "MODEL={'a': b'x'}",
    "MODEL=[frozenset()]",
    'MODEL=x"; import os; os.system("touch /tmp/' + PWNED + '"); y="',
    "MODEL=__import__('os').system('touch /tmp/" + PWNED + "')",
]


@pytest.mark.parametrize("param", HOSTILE)
def test_no_parameter_value_runs_code(param, tmp_path, capsys, no_kernel):
    code = main(["notebooks", "run", "00", "--preset", "ci", "--out", str(tmp_path / "runs"), "-p", param])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: "), err
    assert not Path("/tmp", PWNED).exists()
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, says", [
    (["04", "-p", "ALPHA=1.5"], "ALPHA must be in [0, 1)"),
    (["03", "-p", "B=-1"], "B must be an integer in [1, 65536]"),
    (["01", "-p", "TAU=nan"], "TAU must be"),
    (["01", "-p", "TAU=1e309"], "TAU must be"),
    (["04", "-p", "RECORDING=/etc/passwd"], "RECORDING must be empty or the path of an existing .json file"),
    (["01", "-p", "USER_TRACE=/etc/passwd"], "USER_TRACE must be empty or the path of an existing .npz"),
    (["01", "-p", "N_REQUESTS=10**12"], "N_REQUESTS must be an integer"),
    (["01", "-p", "N_REQUESTS=100000000000"], "N_REQUESTS must be an integer in [50, 1000000]"),
    (["05", "-p", "SWEEP_ROUTERS=['jsq', 'no_such_router']"], "SWEEP_ROUTERS entry must be one of"),
    (["05", "-p", "REGIME_SHAPES=['gpt-9']"], "REGIME_SHAPES entry must be one of"),
    (["05", "-p", "TOY_RANK=7"], "TOY_RANK must be an index into TOY_LOADS"),
    (["02", "-p", "BUDGET=5"], "BUDGET must be one of BUDGETS"),
    (["02", "-p", "DEMO_CATEGORY=poetry"], "DEMO_CATEGORY must be one of"),
    (["00", "-p", "INTERACTIVE=1"], "INTERACTIVE must be True or False"),
    (["03", "-p", "R_VALUES=" + json.dumps(list(range(1, 40)))], "R_VALUES must be a list of 1 to 16"),
    (["01", "-p", "TAU=0.1", "-p", "TAU=0.2"], "TAU is given twice"),
    (["00", "03", "-p", "B=-1"], "B must be one of"),  # checked for every named notebook before the first runs
])
def test_every_out_of_range_value_is_refused_before_any_kernel(argv, says, tmp_path, capsys, no_kernel):
    code = main(["notebooks", "run", *argv, "--preset", "ci", "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and says in err, err
    assert not (tmp_path / "runs").exists()


def test_repeated_p_flags_merge(tmp_path):
    assert parse_params(["TAU=0.2"]) == {"TAU": 0.2}
    from moelab.cli import build_parser

    args = build_parser().parse_args(["notebooks", "run", "01", "-p", "TAU=0.2", "-p", "SEED=3"])
    assert parse_params(args.params) == {"TAU": 0.2, "SEED": 3}


json_data = st.recursive(st.none() | st.booleans() | st.integers(-2**62, 2**62)
                         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=4),
                         max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_data)
def test_data_round_trips_through_every_injection(value):
    """Any JSON value, quotes, backslashes and newlines included, is written as a literal that reads back the
    same, by moelab's own writer and by papermill's."""
    try:
        check_json_value("X", value)
    except ValueError:
        return  # nested too deep: refused, never written
    tree = ast.parse(assignments({"X": value}))
    assert [type(n) for n in tree.body] == [ast.Assign]
    assert ast.literal_eval(tree.body[0].value) == value
    _check_injection({"X": value})


@given(value=st.one_of(st.binary(max_size=8), st.sets(st.integers(), max_size=3),
                       st.tuples(st.integers()), st.complex_numbers(allow_nan=False)))
def test_values_that_are_not_data_are_refused(value):
    with pytest.raises(ValueError, match="must be data"):
        check_json_value("X", value)
    with pytest.raises(ValueError):
        assignments({"X": value})


def test_app_and_course_release_check_values_like_notebooks_run(tmp_path, capsys, no_kernel):
    assert main(["course", "release", str(tmp_path / "c"), "--labs", "00", "-p", "PRESET=bogus"]) == 2
    assert "PRESET must be one of" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert main(["course", "release", str(tmp_path / "c"), "--labs", "00", "-p", "B=3"]) == 2
    assert "B must be one of" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert main(["app", "00", "-p", "PRESET=bogus"]) == 2
    assert "PRESET must be one of" in capsys.readouterr().err
    assert main(["app", "04", "-p", "ALPHA=2"]) == 2
    assert "ALPHA must be" in capsys.readouterr().err


def test_app_refuses_a_port_in_use_instead_of_serving_on_another(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["app", "00", "--port", str(port)]) == 2
    assert f"--port {port} cannot be bound" in capsys.readouterr().err


def test_a_precomputed_run_is_outputs_only(tmp_path):
    """A run's metadata that carries code in its parameters or HTML in its timestamp is not used or shown."""
    from moelab import lecture

    runs = tmp_path / "runs"
    runs.mkdir()
    nb = lecture.load("00_overview")
    nb.setdefault("metadata", {})["papermill"] = {
        "parameters": {"B": 256, "X = 1\nimport os; os.system('touch /tmp/" + PWNED + "')\nY": 1},
        "end_time": "<script>alert(1)</script>"}
    (runs / "00_overview.ipynb").write_text(json.dumps(nb))
    pre, why = lecture.find_precomputed("00_overview", runs)
    assert pre is None and "has no parameter(s)" in why
    nb["metadata"]["papermill"]["parameters"] = {"<script>alert(1)</script>": 1}
    (runs / "00_overview.ipynb").write_text(json.dumps(nb))
    served = lecture.lecture_notebook("00_overview", {}, runs, tmp_path / "replay.json")
    assert "<script>" not in json.dumps(served.notebook)  # why it was not used is shown as text
    nb["metadata"]["papermill"]["parameters"] = {"B": 256}
    (runs / "00_overview.ipynb").write_text(json.dumps(nb))
    served = lecture.lecture_notebook("00_overview", {}, runs, tmp_path / "replay.json")
    text = json.dumps(served.notebook)
    assert "<script>" not in text and "alert(1)" not in text
