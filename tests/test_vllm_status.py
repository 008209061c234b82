"""vLLM missing or outside the supported range gives a clear error (no vLLM needed to run these)."""

from __future__ import annotations

import pytest

from moelab.models import vllm_engine
from moelab.models.vllm_engine import SUPPORTED_VLLM_TEXT, VLLMUnavailableError, require_vllm, vllm_status


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.32.7+cpu", True), ("0.33.0", True), ("0.31.2", False),
                                         ("0.34.0", False), ("1.0.0", False), (None, False)])
def test_version_range(monkeypatch, version, ok):
    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: version)
    monkeypatch.setattr(vllm_engine, "require_contract", lambda features: None)  # the range alone (contract: test_vllm_contract)
    usable, why = vllm_status()
    assert usable is ok
    if not ok:
        assert SUPPORTED_VLLM_TEXT in why
        with pytest.raises(VLLMUnavailableError, match="vllm"):
            require_vllm()


def test_capture_backend_vllm_says_why(monkeypatch):
    from moelab.capture import capture

    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: "0.10.1")
    with pytest.raises(VLLMUnavailableError, match="0.10.1"):
        capture("tiny-moe", [[1, 2, 3]], 2, backend="vllm")


def test_server_launch_refuses_without_supported_vllm(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: None)
    with pytest.raises(VLLMUnavailableError, match="not installed"):
        vllm_engine.launch_server(tmp_path, 8000)


def test_servers_bind_only_to_loopback():
    from moelab.models.vllm_engine import server_command

    with pytest.raises(ValueError, match="host must be a loopback address"):
        server_command("data/models/tiny-moe", 8000, host="0.0.0.0", dtype="float32")
    assert "127.0.0.2" in server_command("data/models/tiny-moe", 8000, host="127.0.0.2", dtype="float32")
