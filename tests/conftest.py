"""Test setup: public data from the bundled copy (``data/public``), figures to a temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.xdist_groups"]  # refuses a run whose test groups pytest-xdist could not apply

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def public_data() -> Path:
    """The bundled public data sets (``data/public``): they ship with the source tree, so tests that
    read them never skip."""
    return REPO / "data" / "public"


# Static figures are written as HTML in tests; PNG export starts a browser per figure (seconds each).
os.environ.setdefault("MOELAB_PNG", "0")


@pytest.fixture(autouse=True)
def _figures_to_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_FIGURES", str(tmp_path / "figures"))


# ------------------------------------------------------------------ live vLLM servers, shared by modules
_LIVE: list = []  # the session's LiveServers, once a test asked for them
_LAST_LIVE_USER: list = []  # the last collected test that uses them: they stop after it


@pytest.fixture(scope="session")
def tiny_moe_servers(tmp_path_factory):
    """Two vLLM servers of the tiny MoE (:class:`tests.live_servers.LiveServers`), shared by every module
    that needs live servers (a start costs ~45-90 s of CPU on 2 cores). ``.launched()`` relaunches one a
    previous module killed and returns the ``(port, Popen)`` pairs without waiting for them. Stopped after
    the last test that uses them."""
    from tests.live_servers import LiveServers, model_dir

    path = model_dir()
    if not (path / "config.json").is_file():
        pytest.skip(f"no MoE model at {path} (the tiny MoE is trained by `moelab train-tiny-moe`)")
    live = LiveServers(path, tmp_path_factory.mktemp("vllm-servers"))
    _LIVE.append(live)
    yield live
    live.stop()


#: under pytest-xdist, modules start in this order of their heaviest mark: a long module started last would
#: leave the other worker idle at the end (the live-server group, ~6 min of one worker, goes first)
_HEAVY_FIRST = ("browser", "vllm", "notebook", "slow")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks this adds
def pytest_collection_modifyitems(config, items):
    """The modules that use the live servers run back to back (whole modules, in their order, where the first
    one was), so the servers are never kept idle while unrelated modules run; they stop after the last user.

    Under pytest-xdist (the README's ``python -m pytest -n 2``; ``--dist loadgroup`` is in the pytest options)
    every module is one ``xdist_group``, so a module's fixtures (servers, executed notebooks, a built book) are
    set up once, by one worker; the live-server modules are one group together, started first, and the other
    modules follow heaviest first (:data:`_HEAVY_FIRST`)."""
    uses = lambda it: "tiny_moe_servers" in getattr(it, "fixturenames", ())  # noqa: E731
    mods = list(dict.fromkeys(it.path for it in items if uses(it)))
    if len(mods) > 1:
        first = next(i for i, it in enumerate(items) if it.path in mods)
        rest = [it for it in items if it.path not in mods]
        block = [it for m in mods for it in items if it.path == m]
        items[:] = rest[:first] + block + rest[first:]
    if hasattr(config, "workerinput"):  # an xdist worker: every worker reorders the same way
        def rank(path) -> int:
            if path in mods:
                return -1
            marks = {m.name for it in by_module[path] for m in it.iter_markers()}
            return next((i for i, name in enumerate(_HEAVY_FIRST) if name in marks), len(_HEAVY_FIRST))

        by_module: dict = {}
        for it in items:
            by_module.setdefault(it.path, []).append(it)
        order = sorted(by_module, key=rank)  # stable: collection order within a rank
        items[:] = [it for path in order for it in by_module[path]]
        for it in items:
            group = "tiny_moe_servers" if it.path in mods else it.path.name
            it.add_marker(pytest.mark.xdist_group(group))
    _LAST_LIVE_USER[:] = [it for it in items if uses(it)][-1:]


def pytest_runtest_teardown(item, nextitem):
    if _LAST_LIVE_USER and item is _LAST_LIVE_USER[0]:
        for live in _LIVE:
            live.stop()  # not kept idle (memory) until the session ends
