"""The wheel works outside the clone: build it, install it non-editable into a throwaway venv, and run a
notebook from an empty folder outside the repository.

The throwaway venv reuses this environment's heavy dependencies (numpy, pandas, jupyter, ...) through a
``.pth`` line naming this environment's site-packages: only the moelab wheel is installed into it, and
the editable install of the clone stays out of it (``.pth`` files of the reused folder are not run). The
notebook's kernel is that venv's interpreter (a kernel spec on ``JUPYTER_PATH``), so it imports the
installed wheel, never the clone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow]


def _run(cmd: list[str], *, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built once from a copy of the working tree's files (tracked and new, not ignored ones:
    what a clean clone holds), so the build leaves nothing in the checkout."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (its file list is the clean clone's)")
    tmp = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    src = tmp / "src"
    for rel in filter(None, files):
        path = ROOT / rel
        if path.is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    (whl,) = (tmp / "dist").glob("moelab-*.whl")
    return whl


def test_wheel_carries_the_package_data_and_the_lab_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in ("moelab/_tree/data/calibration/h200", "moelab/_tree/notebooks/03_afd_ratio.ipynb",
                "moelab/_tree/notebooks/NOTATION.md", "moelab/_tree/COURSE.md", "moelab/book/static/vendor"):
        assert any(n.startswith(rel) for n in names), rel
    tracked = subprocess.run(["git", "ls-files", "data"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert {f"moelab/_tree/{t}" for t in tracked} <= names


@pytest.mark.notebook
def test_installed_wheel_runs_notebook_03_from_an_empty_folder(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    (site / "_reuse_ci_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         cwd=tmp_path)
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "moelab wheel", "language": "python"}))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "MOELAB_FIGURES")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", JUPYTER_PATH=str(tmp_path / "jupyter"))
    moelab = str(venv / "bin" / "moelab")
    work = tmp_path / "empty"
    work.mkdir()

    probe = _run([str(py), "-c", "import importlib.metadata as m, moelab, moelab.datasets as d; "
                  "print(moelab.__file__); print(d.bundled_path('calibration', 'h200')); print(m.version('moelab'))"],
                 cwd=work, env=env).stdout.split()
    assert probe[0].startswith(str(venv)) and probe[1].startswith(str(site / "moelab" / "_tree"))
    assert _run([moelab, "--version"], cwd=work, env=env).stdout.strip() == f"moelab {probe[2]}"

    _run([moelab, "notebooks", "copy", "nbs"], cwd=work, env=env)
    nbs = work / "nbs"
    assert {"03_afd_ratio.ipynb", "NOTATION.md", "COURSE.md"} <= {p.name for p in nbs.iterdir()}
    assert "03_afd_ratio" in _run([moelab, "notebooks", "list"], cwd=nbs, env=env).stdout
    out = _run([moelab, "notebooks", "run", "03", "--preset", "ci"], cwd=nbs, env=env)
    assert "03_afd_ratio" in out.stdout and "FAILED" not in out.stdout
    executed = json.loads((nbs / "runs" / "03_afd_ratio.ipynb").read_text())
    assert any(c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code")
