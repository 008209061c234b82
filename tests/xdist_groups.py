"""A check that ``--dist loadgroup`` really groups the tests (loaded by ``tests/conftest.py``)."""

from __future__ import annotations

import pytest


def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup`` every test's node id ends in its group's name (``...@group``), which the
    controller schedules by. Without it (pytest 9.2 keeps node ids where pytest-xdist 3.8 does not write) each
    test is scheduled alone: a module's fixtures (JupyterLab, the live vLLM servers, an executed notebook) are set
    up on both workers, and the suite runs slower and starved. The run is stopped rather than run that way."""
    if node.config.getvalue("dist") == "loadgroup" and ids and not all("@" in i for i in ids):
        import xdist

        pytest.exit(f"pytest-xdist {xdist.__version__} did not group the tests under pytest {pytest.__version__} (no "
                    "'@group' in their node ids): install the versions the dev extra allows (pip install -e '.[dev]')",
                    returncode=pytest.ExitCode.USAGE_ERROR)
