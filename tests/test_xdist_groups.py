"""The guard that stops a ``--dist loadgroup`` run whose tests pytest-xdist could not group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.xdist_groups import pytest_xdist_node_collection_finished as check


def _node(dist: str) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(getvalue=lambda name: dist if name == "dist" else None))


def test_ungrouped_ids_stop_the_run_and_grouped_ones_pass():
    grouped = ["tests/test_a.py::test_x@test_a.py", "tests/test_b.py::test_y@tiny_moe_servers"]
    check(_node("loadgroup"), grouped)  # nothing to say
    check(_node("load"), ["tests/test_a.py::test_x"])  # another mode: no groups expected
    with pytest.raises(pytest.exit.Exception, match="did not group") as stopped:
        check(_node("loadgroup"), [*grouped, "tests/test_c.py::test_z"])
    assert stopped.value.returncode == pytest.ExitCode.USAGE_ERROR
