"""Lecture mode: serve a notebook's lesson part as a Voila dashboard (code hidden, widgets live), instantly.

``moelab app 03`` serves the lesson part of ``notebooks/03_afd_ratio.ipynb`` (the cells before its research
part, :mod:`moelab.lecture`) with its results read from a precomputed run: ``runs/lecture/03_afd_ratio.ipynb``
(``moelab app 03 --precompute`` writes it) or ``runs/03_afd_ratio.ipynb`` (``moelab notebooks run``). Each
visitor's kernel re-displays the recorded outputs and runs only the cells the live panels need, so the first
figure shows in seconds. Without a usable precomputed run the page (and the terminal) says so and the lesson
is computed for every visitor. ``--whole`` serves the whole notebook, computed live, as before.

What a visit waits for: Voila's pre-heated kernels (``--pool``) have run the lesson before anyone arrives, so
the page's HTML (recorded figures included) is sent at once; the page then loads only the front-end
extensions a lesson needs (:data:`PAGE_EXTENSIONS`) and nothing from outside 127.0.0.1 (the template
:data:`VOILA_TEMPLATE`). The page draws the recorded plotly figures itself, with plotly.js served next to the
template (:func:`plotly_data_dir`), as soon as that script and the cells are in: Voila's front end would draw
them only once all its JupyterLab plugins had started, then evaluate plotly.js, then draw each figure twice
(the second time into a PNG for a notebook file the page never saves), in one task, seconds after the page
arrived. Widget panels and every other output are still rendered by Voila's front end. A used kernel is
replaced after ``--refill-delay`` seconds, not at once, so heating its replacement does not compete with the
visitor's page.

It binds to 127.0.0.1 by default and asks for a token; another interface is refused unless
``--allow-remote`` says so explicitly (then anyone who can reach the port and knows the token runs the
notebook on this machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from moelab import lecture
from moelab._io import read_json
from moelab._validate import check_int, check_loopback_host, check_real
from moelab.notebooks import (
    check_parameters,
    describe_requirements,
    missing_requirements,
    notebooks_dir,
    parse_params,
    resolve,
)
from moelab.parameters import assignments

#: the JupyterLab front-end extensions a lesson page needs: plotly's figures and the widgets (ipywidgets'
#: manager, Voila's own for ipywidgets 8, anywidget for plotly's FigureWidget). Voila loads every installed
#: one otherwise (nbgrader's and Notebook's among them, which fail outside JupyterLab): each costs requests
#: and script parsing before the first figure draws.
PAGE_EXTENSIONS = ("jupyterlab-plotly", "@jupyter-widgets/jupyterlab-manager", "@voila-dashboards/widgets-manager8",
                   "anywidget")
#: seconds after a visitor takes a pre-heated kernel before Voila starts heating its replacement (Voila's
#: default is 1 s): heating runs the lesson's live cells, CPU that the visitor's page and first slider moves
#: would otherwise share on a small machine. Meanwhile the rest of the pool serves the next visitors.
REFILL_DELAY_S = 30.0
#: a Jupyter data folder holding the Voila template ``moelab app`` serves with: Voila's lab template without
#: its CDN stylesheets, so a lesson page requests nothing but 127.0.0.1
VOILA_DATA = Path(__file__).parent / "slides" / "templates" / "jupyter"
VOILA_TEMPLATE = "moelab_lecture"


#: the partial plotly.js bundle vendored from npm (``plotly.js-cartesian-dist-min``, see its PROVENANCE.md) and the
#: trace types it draws: a third of the full bundle's size, so the page evaluates it in about a third of the time
CARTESIAN_BUNDLE = Path(__file__).parent / "slides" / "static" / "vendor" / "plotly.js-cartesian" / "plotly-cartesian.min.js"
CARTESIAN_TRACES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
                              "image", "pie", "scatter", "scatterternary", "violin"})


def _plotly_js_version(path: Path) -> str | None:
    """The ``vX.Y.Z`` in a plotly.js bundle's licence header (its first few hundred bytes)."""
    with open(path, "rb") as fh:
        head = fh.read(400).decode("utf-8", "replace")
    return next((w for w in head.split() if w.startswith("v") and w[1:2].isdigit()), None)


def recorded_trace_types(notebook: Path) -> set[str]:
    """Trace types of the plotly figures recorded in ``notebook``'s outputs (what the lesson page draws itself;
    widget panels are drawn by their own front end)."""
    nb = read_json(notebook)
    types: set[str] = set()
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
            if isinstance(fig, dict):
                types.update(str(t.get("type", "scatter")) for t in fig.get("data", []) if isinstance(t, dict))
    return types


def plotly_data_dir(workdir: Path, notebook: Path | None = None) -> Path:
    """A Jupyter data folder under ``workdir`` that serves plotly.js as a static file of :data:`VOILA_TEMPLATE`
    (a copy: Voila's static files refuse symlinks out of their folder): the lesson page draws its recorded
    figures with it as soon as it arrives, before Voila's front end has started.

    The copy is the vendored partial bundle (:data:`CARTESIAN_BUNDLE`) when every trace recorded in ``notebook``
    is one of its :data:`CARTESIAN_TRACES` and it is the same plotly.js version as the installed plotly's;
    otherwise the installed plotly package's own full ``plotly.min.js``."""
    spec = importlib.util.find_spec("plotly")  # found, not imported: the kernel imports plotly, not this process
    full = Path(next(iter(spec.submodule_search_locations or ()), "")) / "package_data" / "plotly.min.js" \
        if spec else Path("plotly") / "package_data" / "plotly.min.js"
    if not full.is_file():
        raise FileNotFoundError(f"the installed plotly has no {full}; reinstall plotly")
    source = full
    if (notebook is not None and CARTESIAN_BUNDLE.is_file() and recorded_trace_types(notebook) <= CARTESIAN_TRACES
            and _plotly_js_version(CARTESIAN_BUNDLE) == _plotly_js_version(full)):
        source = CARTESIAN_BUNDLE
    static = workdir / "jupyter" / "voila" / "templates" / VOILA_TEMPLATE / "static"
    static.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, static / "plotly.min.js")
    return workdir / "jupyter"


def voila_command(notebook: Path, *, host: str, port: int, token: str, open_browser: bool,
                  pool: int = 0, refill_delay_s: float = REFILL_DELAY_S) -> list[str]:
    """The ``voila`` command line that serves ``notebook`` with its sources stripped and only the
    :data:`PAGE_EXTENSIONS` loaded; with ``pool`` > 0, that many kernels have already run the notebook
    before a visitor arrives (Voila's pre-heated kernels), and a used one is replaced ``refill_delay_s``
    seconds after a visitor took it."""
    # port_retries=0: Voila would otherwise serve on the next free port while we printed this one's URL
    return [sys.executable, "-m", "voila", str(notebook), f"--port={port}", "--Voila.port_retries=0",
            f"--Voila.ip={host}", f"--token={token}",
            "--strip_sources=True", "--show_tracebacks=False", "--Voila.log_level=WARN", f"--template={VOILA_TEMPLATE}",
            *(f"--VoilaConfiguration.extension_allowlist={name}" for name in PAGE_EXTENSIONS),
            *(["--preheat_kernel=True", f"--pool_size={pool}", f"--VoilaKernelManager.fill_delay={refill_delay_s:g}"]
              if pool > 0 else []),
            *([] if open_browser else ["--no-browser"])]


def prepare_notebook(name: str, params: dict[str, Any], workdir: Path) -> Path:
    """The notebook to serve: ``notebooks/<name>.ipynb`` itself, or (with ``params``) a copy in
    ``workdir`` with a papermill-style ``injected-parameters`` cell after its parameters cell."""
    # lazy: nbformat (with its JSON-schema validator) loads only when parameters are injected
    import nbformat

    source = notebooks_dir() / f"{name}.ipynb"
    if not params:
        return source
    params = check_parameters(name, params)
    nb = nbformat.read(source, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    code = assignments(params, header="# Injected parameters (moelab app --params)")
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(code, metadata={"tags": ["injected-parameters"]}))
    out = workdir / f"{name}.ipynb"
    nbformat.write(nb, out)
    return out


def prepare_lecture(name: str, params: dict[str, Any], runs: str, workdir: Path, *, precompute: bool = False) -> Path:
    """Write the lesson notebook to serve into ``workdir`` (see :func:`moelab.lecture.lecture_notebook`),
    precomputing the lesson part first when asked; print where its results come from."""
    params = check_parameters(name, params)
    if precompute:
        print(f"precomputing the lesson part of {name} ...", flush=True)
        print(f"wrote {lecture.precompute(name, params, runs)}", flush=True)
    served = lecture.lecture_notebook(name, params, runs, workdir / "replay.json")
    if served.precomputed is None:
        print(f"note: no precomputed results for {name} ({served.why_not}); every visitor's kernel computes the "
              f"lesson, which can take minutes. To make it instant: {lecture.precompute_command(name, runs)}",
              file=sys.stderr, flush=True)
    else:
        print(f"lesson of {name}: results from {served.precomputed.path} ({served.precomputed.finished}); "
              f"{len(served.live)} code cells run live, {len(served.replayed)} replayed", flush=True)
    out = workdir / f"{name}.ipynb"
    out.write_text(json.dumps(served.notebook))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moelab app", description="serve a notebook's lesson part as a Voila dashboard "
                                "(code hidden, widgets live, results precomputed) for a lecture")
    p.add_argument("notebook", help="notebook name or unique prefix, e.g. 03 or 03_afd_ratio")
    p.add_argument("--port", type=int, default=8866, help="TCP port (default 8866; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (anyone who reaches it with the token runs the notebook)")
    p.add_argument("--token", default=None, help="access token (default: a random one, printed at start)")
    p.add_argument("--params", "-p", nargs="*", action="extend", metavar="K=V",
                   help="notebook parameters, e.g. N=3000 (checked like 'moelab notebooks run' does)")
    p.add_argument("--open", action="store_true", help="open a browser on the dashboard")
    p.add_argument("--from", dest="runs", default="runs",
                   help="folder of precomputed runs: RUNS/lecture/NAME.ipynb (--precompute) or RUNS/NAME.ipynb "
                        "('moelab notebooks run'); default: runs")
    p.add_argument("--precompute", action="store_true",
                   help="first execute the lesson part into RUNS/lecture/ (once; every visitor then reads it)")
    p.add_argument("--pool", type=int, default=2,
                   help="kernels that run the lesson before visitors arrive, so pages open at once (default 2; "
                        "0: each visitor's kernel starts when they arrive; ignored with --whole)")
    p.add_argument("--refill-delay", type=float, default=REFILL_DELAY_S, metavar="S",
                   help=f"seconds after a visitor takes a pre-heated kernel before its replacement starts heating "
                        f"(default {REFILL_DELAY_S:g}: the heating does not slow that visitor's page; 0 to 600)")
    p.add_argument("--whole", action="store_true",
                   help="serve the whole notebook (research part included), computed live for every visitor")
    return p


def main(argv: list[str] | None = None) -> int:
    """``moelab app NOTEBOOK [--port P] [--host H] [--allow-remote] [--token T] [--params K=V ...]
    [--from RUNS] [--precompute] [--whole]``."""
    args = build_parser().parse_args(argv)
    try:
        return serve(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def check_port_free(host: str, port: int) -> None:
    """``ValueError`` naming ``--port`` when ``port`` cannot be bound on ``host`` now (in use, or privileged),
    so the URL printed is the one served."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((host, port))
    except OSError as exc:
        raise ValueError(f"--port {port} cannot be bound on {host} ({exc.strerror or exc}); choose another port, "
                         "or --port 0 for a free one") from None


def free_port(host: str) -> int:
    """A free TCP port on ``host`` (IPv4 or IPv6, e.g. ``::1``); a host that cannot be bound is a
    ``ValueError`` naming ``--host`` (not a ``socket.gaierror``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError as exc:  # socket.gaierror is an OSError
        raise ValueError(f"--host {host!r} cannot be bound on this machine ({exc})") from None


def serve(args: argparse.Namespace) -> int:
    (name,) = resolve([args.notebook])
    if not args.allow_remote:
        try:
            check_loopback_host("--host", args.host)
        except ValueError as exc:
            raise ValueError(f"{exc} (pass --allow-remote to serve on another interface)") from None
    port = check_int("--port", args.port, low=0, high=65535)
    pool = check_int("--pool", args.pool, low=0, high=16)
    refill_delay_s = check_real("--refill-delay", args.refill_delay, low=0, high=600)
    if port == 0:
        port = free_port(args.host)
    else:
        check_port_free(args.host, port)
    if importlib.util.find_spec("voila") is None:
        raise ValueError("moelab app needs Voila: pip install 'moelab[browser]' (or pip install voila)")
    missing = missing_requirements(name)
    if missing:
        raise ValueError(f"notebook {name} needs {describe_requirements(missing)}, which is not installed")
    token = args.token or secrets.token_urlsafe(16)
    if args.token is not None and not (1 <= len(token) <= 256 and all(c.isalnum() or c in "-_." for c in token)):
        raise ValueError("--token must be 1 to 256 letters, digits, '-', '_' or '.'")
    params = check_parameters(name, parse_params(args.params or []))
    if args.whole and args.precompute:
        raise ValueError("--precompute prepares the lesson part; it cannot be combined with --whole")
    with tempfile.TemporaryDirectory(prefix="moelab-app-") as tmp:
        if args.whole:
            notebook = prepare_notebook(name, params, Path(tmp))
        else:
            notebook = prepare_lecture(name, params, args.runs, Path(tmp), precompute=args.precompute)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"serving {name} (code hidden) at http://{shown}:{port}/?token={token}   (Ctrl+C stops)", flush=True)
        cmd = voila_command(notebook, host=args.host, port=port, token=token, open_browser=args.open,
                            pool=0 if args.whole else pool, refill_delay_s=refill_delay_s)
        env = dict(os.environ)
        env.setdefault("MOELAB_FIGURES", str(Path(tmp) / "figures"))  # lecture runs never overwrite figures/
        # Voila finds the lecture template (VOILA_TEMPLATE) and its plotly.js in these extra Jupyter data folders
        env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(VOILA_DATA), str(plotly_data_dir(Path(tmp), notebook)),
                                                          env.get("JUPYTER_PATH", "")) if p)
        proc = subprocess.Popen(cmd, env=env)
        previous = signal.signal(signal.SIGTERM, _interrupt)  # a terminated app stops its Voila too
        try:
            return proc.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
