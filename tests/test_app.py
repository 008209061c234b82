"""``moelab app`` (lecture mode): bad input is an ``error: ...`` line and exit code 2, never a traceback;
the served copy carries the parameters; the Voila command hides code and binds where it was told.
The dashboard itself is checked in a real browser in ``tests/test_browser.py``."""

from __future__ import annotations

import nbformat
import pytest

from moelab import app
from moelab.cli import main


@pytest.mark.parametrize("argv, needle", [
    (["app", "no_such_notebook"], "notebook must be one of"),
    (["app", "04", "--host", "0.0.0.0"], "--allow-remote"),
    (["app", "04", "--host", "example.org"], "loopback"),
    (["app", "04", "--port", "70000"], "--port"),
    (["app", "04", "--params", "not_a_parameter=1"], "has no parameter"),
])
def test_bad_input_is_an_error_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err


def test_served_copy_has_the_parameters(tmp_path):
    path = app.prepare_notebook("04_dsd_rtt", {"MC_ROUNDS": 500}, tmp_path)
    nb = nbformat.read(path, as_version=4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    at = next(i for i, t in enumerate(tags) if "parameters" in t)
    assert "injected-parameters" in tags[at + 1] and "MC_ROUNDS = 500" in nb.cells[at + 1].source
    assert app.prepare_notebook("04_dsd_rtt", {}, tmp_path).parent.name == "notebooks"  # no params: the original


def test_voila_command_hides_code_and_binds_as_told():
    cmd = app.voila_command(app.Path("x.ipynb"), host="127.0.0.1", port=8866, token="t", open_browser=False)
    assert "--strip_sources=True" in cmd and "--Voila.ip=127.0.0.1" in cmd and "--token=t" in cmd
    assert "--no-browser" in cmd and "--port=8866" in cmd
