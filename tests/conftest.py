"""Test setup: public data from the bundled copy (``data/public``), figures to a temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


def pytest_collection_modifyitems(config, items):
    """The modules that use the live servers run back to back (whole modules, in their order, where the first
    one was), so the servers are never kept idle while unrelated modules run; they stop after the last user."""
    uses = lambda it: "tiny_moe_servers" in getattr(it, "fixturenames", ())  # noqa: E731
    mods = list(dict.fromkeys(it.path for it in items if uses(it)))
    if len(mods) > 1:
        first = next(i for i, it in enumerate(items) if it.path in mods)
        rest = [it for it in items if it.path not in mods]
        block = [it for m in mods for it in items if it.path == m]
        items[:] = rest[:first] + block + rest[first:]
    _LAST_LIVE_USER[:] = [it for it in items if uses(it)][-1:]


def pytest_runtest_teardown(item, nextitem):
    if _LAST_LIVE_USER and item is _LAST_LIVE_USER[0]:
        for live in _LIVE:
            live.stop()  # not kept idle (memory) until the session ends
