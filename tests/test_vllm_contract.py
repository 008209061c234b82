"""moelab's vLLM contract (:mod:`moelab.models.vllm_contract`): it holds on the released 0.32.0 and 0.33.0 wheels
(read as files: no import, no GPU), a tree with one symbol removed or changed fails with that symbol named, and
every live entry point refuses such a vLLM before an engine or a server starts.

The wheels are downloaded once with pip into ``$MOELAB_CACHE/vllm-wheels`` (~330 MB each, seconds on CI's link)
and reused by every later run; without network (and outside CI) those tests skip.
"""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from moelab.cli import main as cli_main
from moelab.models import vllm_contract, vllm_engine
from moelab.models.vllm_contract import (
    CONTRACT,
    VERIFIED,
    ContractReport,
    Finding,
    SourceTree,
    VLLMContractError,
    check_source,
    fetch_release,
)

BASE_ROUTER = "vllm/model_executor/layers/fused_moe/router/base_router.py"
RUNNER = "vllm/v1/worker/gpu_model_runner.py"


@pytest.fixture(scope="session")
def wheels() -> dict[str, Path]:
    """The verified releases' wheels, downloaded once into the cache (a session fixture: one pip call per version)."""
    out = {}
    for v in VERIFIED:
        try:
            out[v] = fetch_release(v)
        except ValueError as exc:
            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"vLLM {v}'s wheel is not cached and cannot be downloaded here: {exc}")
    return out


@pytest.fixture(scope="module")
def tree032(wheels, tmp_path_factory) -> Path:
    """The files of 0.32.0 the contract reads (about 45 modules), as a source folder."""
    report = check_source(wheels["0.32.0"])
    root = tmp_path_factory.mktemp("vllm-0.32-tree")
    with zipfile.ZipFile(wheels["0.32.0"]) as z:
        names = set(z.namelist())
        for mod in report.modules:
            base = mod.replace(".", "/")
            for rel in (f"{base}.py", f"{base}/__init__.py"):
                if rel in names:
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_bytes(z.read(rel))
        (root / "vllm/_version.py").write_bytes(z.read("vllm/_version.py"))
    return root


def _copy_tree(src: Path, dst: Path) -> Path:
    for p in src.rglob("*.py"):
        q = dst / p.relative_to(src)
        q.parent.mkdir(parents=True, exist_ok=True)
        q.write_bytes(p.read_bytes())
    return dst


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}: the test's doctoring is out of date"
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("version", VERIFIED)
def test_contract_holds_on_the_verified_wheels(wheels, version, capsys):
    report = check_source(wheels[version])
    assert report.version == version
    assert report.ok(), report.format()
    assert len(report.findings) >= 80 and {f.feature for f in report.findings} == set(vllm_contract.FEATURES)
    assert cli_main(["doctor", "--against", str(wheels[version])]) == 0
    assert "the contract holds" in capsys.readouterr().out


def test_the_shim_finds_an_internal_where_each_release_keeps_it(wheels):
    """FrontendArgs (launch_server's --host/--port) moved in 0.33: both homes are in the contract."""
    homes = {v: [f.symbol for f in check_source(wheels[v], ["serve"]).findings if "FrontendArgs" in f.symbol][0]
             for v in VERIFIED}
    assert "launchers.cli_args" in homes["0.32.0"] and "found in vllm.entrypoints.common.cli_args" in homes["0.33.0"]


def test_a_doctored_tree_fails_naming_the_symbol(tree032, tmp_path, capsys):
    assert check_source(tree032).ok()  # the extracted files alone hold the contract
    root = _copy_tree(tree032, tmp_path / "doctored")
    # one symbol removed: the model runner's query_start_loc (the capture hooks read each step's token spans there)
    _edit(root, RUNNER, "self.query_start_loc = self._make_buffer(", "self.query_start = self._make_buffer(")
    report = check_source(root)
    bad = report.problems()
    assert [f.symbol for f in bad] == ["vllm.v1.worker.gpu_model_runner.GPUModelRunner.query_start_loc"], report.format()
    assert bad[0].status == "missing" and bad[0].feature == "capture"
    assert not report.ok(["capture"]) and report.ok(["engine", "hd-vllm", "serve", "dp-balancer"])
    assert cli_main(["doctor", "--against", str(root)]) == 2
    out = capsys.readouterr().out
    assert "GPUModelRunner.query_start_loc" in out and "MISSING" in out and "FAILS" in out


def test_changed_signatures_call_sites_options_and_mirrored_rules_are_named(tree032, tmp_path):
    root = _copy_tree(tree032, tmp_path / "changed")
    _edit(root, BASE_ROUTER, "def set_capture_fn(self, capture_fn:", "def set_capture_fn(self, fn:")
    _edit(root, BASE_ROUTER, "self.capture_fn(topk_ids)", "self.capture_fn(topk_ids, topk_weights)")
    _edit(root, RUNNER, """                self.input_batch.token_ids_cpu,
                slot_mappings=slot_mappings,
            )
        elif spec_config.use_ngram_gpu():""", """                slot_mappings=slot_mappings,
            )
        elif spec_config.use_ngram_gpu():""")
    _edit(root, "vllm/config/speculative.py", '"custom_class"', '"custom_cls"')
    _edit(root, "vllm/v1/engine/core_client.py", "score += waiting * 6.0 *", "score += waiting * 4.0 *")
    (root / "vllm/entrypoints/openai/models/api_router.py").unlink()
    report = check_source(root)
    got = {f.symbol: f.detail for f in report.problems()}
    assert set(got) == {
        "vllm.model_executor.layers.fused_moe.router.base_router.BaseRouter.set_capture_fn(capture_fn)",
        "vllm.model_executor.layers.fused_moe.router.base_router.BaseRouter._select_experts -> .capture_fn()",
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids -> .propose()",
        "vllm.config.speculative.SpeculativeConfig 'custom_class'",
        next(s for s in got if s.startswith("vllm.v1.engine.core_client.DPLBAsyncMPClient.get_core_engine_for_request")),
        "vllm.entrypoints.openai.models.api_router",
    }, report.format()
    assert "moelab passes (capture_fn)" in got["vllm.model_executor.layers.fused_moe.router.base_router.BaseRouter"
                                               ".set_capture_fn(capture_fn)"]
    assert "2 positional" in got["vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids -> .propose()"]
    assert any("rule changed" in d and "VLLMDP032" in d for d in got.values())
    assert {f.feature for f in report.problems()} == {"capture", "hd-vllm", "dp-balancer", "serve"}


def test_a_moved_internal_with_no_home_left_is_missing(tree032, tmp_path):
    root = _copy_tree(tree032, tmp_path / "moved")
    (root / "vllm/entrypoints/launchers/cli_args.py").unlink()
    bad = check_source(root, ["serve"]).problems()
    assert len(bad) == 1 and "FrontendArgs" in bad[0].symbol and "launchers.cli_args or vllm.entrypoints.common" in bad[0].detail


def test_wheels_sdists_and_folders_read_alike(tree032, tmp_path):
    sdist = tmp_path / "vllm-0.32.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for p in sorted(tree032.rglob("*.py")):
            tar.add(p, arcname=f"vllm-0.32.0/{p.relative_to(tree032)}")
        info = tarfile.TarInfo("vllm-0.32.0/PKG-INFO")
        data = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    wheel = tmp_path / "vllm-0.32.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for p in sorted(tree032.rglob("*.py")):
            z.write(p, str(p.relative_to(tree032)))
    # engine + serve: every kind of item, without re-reading the big model-runner file four times
    reports = [check_source(p, ["engine", "serve"]) for p in (tree032, tree032 / "vllm", sdist, wheel)]
    assert all(r.ok() and r.version == "0.32.0" for r in reports)
    assert len({len(r.findings) for r in reports}) == 1


@pytest.mark.parametrize("bad", ["missing", "empty-dir", "text-file", "bad-zip"])
def test_what_is_not_a_vllm_is_refused_with_its_reason(tmp_path, bad, capsys):
    path = tmp_path / {"missing": "nope", "empty-dir": "d", "text-file": "x.txt", "bad-zip": "v.whl"}[bad]
    if bad == "empty-dir":
        path.mkdir()
    elif bad != "missing":
        path.write_text("not a vLLM")
    with pytest.raises(ValueError):
        SourceTree(path)
    assert cli_main(["doctor", "--against", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    with pytest.raises(ValueError, match="not a vLLM version"):
        fetch_release("latest")


def _broken_report() -> ContractReport:
    return ContractReport("/site-packages/vllm", "0.32.0", [
        Finding("engine", "vllm.entrypoints.llm.LLM.generate", "ok"),
        Finding("capture", "vllm.model_executor.layers.fused_moe.router.base_router.BaseRouter.set_capture_fn",
                "missing", "BaseRouter (and its vLLM base classes) define no 'set_capture_fn'", "the hooks"),
        Finding("hd-vllm", "vllm.config.speculative.SpeculativeConfig 'custom_class'", "changed",
                "no longer mentions 'custom_class'", "HD plugs in"),
        Finding("serve", "vllm.entrypoints.openai.models.api_router", "missing", "module not found", "serve-router"),
    ])


@pytest.fixture
def broken_vllm(monkeypatch):
    """The installed vLLM (as the contract sees it) lacks a hook target, HD's option and a server route."""
    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: "0.32.0")
    monkeypatch.setattr(vllm_contract, "check_installed", lambda features=None: _broken_report())


def test_live_entry_points_refuse_a_vllm_that_breaks_the_contract_before_starting(broken_vllm, tmp_path, monkeypatch):
    import subprocess

    started = []
    # the engine alone is fine (its items hold) ...
    assert vllm_engine.vllm_status() == (True, "vLLM 0.32.0")
    # ... capture, HD and the servers are refused, naming the symbol and the fix; nothing is started
    with pytest.raises(VLLMContractError, match=r"BaseRouter\.set_capture_fn: missing.*Fix: install"):
        vllm_engine.require_vllm(("engine", "capture"))
    from moelab.capture.vllm_backend import capture_vllm

    with pytest.raises(VLLMContractError, match="set_capture_fn"):
        capture_vllm("tiny-moe", [[1, 2, 3]], 2)
    from moelab.hd.vllm_adapter import speculative_config

    with pytest.raises(VLLMContractError, match="custom_class"):
        speculative_config(4)
    with monkeypatch.context() as m, pytest.raises(vllm_engine.VLLMUnavailableError, match="api_router"):
        m.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))  # a server start would be recorded
        vllm_engine.launch_server("data/models/tiny-moe", 8000)
    assert started == []
    # the command-line entry point answers error: and exit status 2 before an engine exists
    from moelab.capture.vllm_service import main as serve_counts

    assert serve_counts(["serve-counts", "--model", "tiny-moe", "--capture-out", str(tmp_path / "t.npz")]) == 2
    assert not list(tmp_path.iterdir())  # no partial trace file


def test_every_contract_item_names_its_feature_and_why():
    assert {s.feature for s in CONTRACT} == set(vllm_contract.FEATURES)
    assert all(s.why and s.modules for s in CONTRACT)
    # the hook targets moelab's code imports are in the contract
    src = (Path(vllm_contract.__file__).parents[1] / "capture" / "vllm_hooks.py").read_text()
    for line in src.splitlines():
        if line.strip().startswith("from vllm."):
            module, name = line.split()[1], line.split()[3]
            assert any(module in s.modules and s.name == name for s in CONTRACT), line


def test_the_installed_check_is_cached_on_disk(tmp_path, monkeypatch):
    if vllm_contract.installed_vllm_dir() is None:
        pytest.skip("vLLM is not installed")
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path))
    vllm_contract._installed_report.cache_clear()
    try:
        first = vllm_contract.check_installed()
        assert list((tmp_path / "vllm-contract").glob("*.json"))
        vllm_contract._installed_report.cache_clear()
        again = vllm_contract.check_installed()
        assert [f.as_dict() for f in again.findings] == [f.as_dict() for f in first.findings]
    finally:
        vllm_contract._installed_report.cache_clear()
