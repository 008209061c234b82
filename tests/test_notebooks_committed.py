"""The committed notebooks: valid nbformat 4.5 (every cell has an id, so papermill/nbformat print no
MissingIDFieldWarning into a run), no outputs or execution counts, one papermill ``parameters`` cell."""

from __future__ import annotations

import warnings

import nbformat
import pytest

from moelab.notebooks import available_notebooks, notebooks_dir


@pytest.mark.parametrize("name", available_notebooks())
def test_notebook_is_committed_clean(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing cell id is a warning in nbformat: fail on it here
        nb = nbformat.read(notebooks_dir() / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), f"{name} has outputs"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{name} must have exactly one papermill parameters cell; has {len(tagged)}"
