"""Two live vLLM servers of the tiny MoE, shared by the test modules that need them (``test_soak``,
``test_vllm_live``) through the session fixture ``tiny_moe_servers`` (``tests/conftest.py``).

A server start costs ~45-90 s of CPU on a 2-core machine (vLLM's import twice: the API server and its
engine-core process), so the modules share one pair instead of starting two each. A module may kill one
(both do, on purpose); the next user gets it relaunched. The pair is stopped after the last test that uses it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def model_dir() -> Path:
    """The MoE the live tests serve: ``MOELAB_VLLM_TEST_MODEL`` or the bundled tiny MoE."""
    return Path(os.environ.get("MOELAB_VLLM_TEST_MODEL", REPO / "data" / "models" / "tiny-moe"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServers:
    """Two vLLM servers of ``model`` on loopback, launched with the soak's settings
    (:func:`moelab.bench.reliability.soak_server_settings`: one thread, ``max_model_len`` 512, 32 sequences).

    :attr:`pairs` is the list of ``(port, Popen)`` that :func:`moelab.bench.reliability.run_soak` takes as
    ``servers`` (it puts its restarted backend 1 into it)."""

    def __init__(self, model: Path, logs: Path) -> None:
        self.model = model
        self.logs = logs
        self.pairs: list[tuple[int, Any]] = []
        self.launches = 0

    def launched(self) -> list[tuple[int, Any]]:
        """Launch whichever of the two is not running (without waiting for it); returns :attr:`pairs`."""
        # lazy: conftest imports this module in every test session, vLLM or not
        from moelab.bench.reliability import soak_server_settings
        from moelab.models.vllm_engine import launch_server

        for i in range(2):
            proc = self.pairs[i][1] if i < len(self.pairs) else None
            if proc is None or proc.poll() is not None:
                port = free_port()
                self.launches += 1
                pair = (port, launch_server(self.model, port, log_path=self.logs / f"server-{self.launches}.log",
                                            **soak_server_settings(1)))
                if i < len(self.pairs):
                    self.pairs[i] = pair
                else:
                    self.pairs.append(pair)
        return self.pairs

    def stop(self) -> None:
        from moelab.models.vllm_engine import stop_server

        for _, proc in self.pairs:
            stop_server(proc)
