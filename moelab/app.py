"""Lecture mode: serve one notebook as a Voila dashboard (code hidden, widgets live).

``moelab app 03`` runs ``notebooks/03_afd_ratio.ipynb`` in a fresh kernel for every visitor and shows
its text, tables, figures and live sliders without the code. It binds to 127.0.0.1 by default and asks
for a token; another interface is refused unless ``--allow-remote`` says so explicitly (then anyone who
can reach the port and knows the token runs the notebook on this machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from moelab._validate import check_int, check_loopback_host
from moelab.notebooks import (
    describe_requirements,
    missing_requirements,
    notebook_parameters,
    notebooks_dir,
    parse_params,
    resolve,
)


def voila_command(notebook: Path, *, host: str, port: int, token: str, open_browser: bool) -> list[str]:
    """The ``voila`` command line that serves ``notebook`` with its sources stripped."""
    return [sys.executable, "-m", "voila", str(notebook), f"--port={port}", f"--Voila.ip={host}", f"--token={token}",
            "--strip_sources=True", "--show_tracebacks=False", "--Voila.log_level=WARN",
            *([] if open_browser else ["--no-browser"])]


def prepare_notebook(name: str, params: dict[str, Any], workdir: Path) -> Path:
    """The notebook to serve: ``notebooks/<name>.ipynb`` itself, or (with ``params``) a copy in
    ``workdir`` with a papermill-style ``injected-parameters`` cell after its parameters cell."""
    # lazy: nbformat (with its JSON-schema validator) loads only when parameters are injected
    import nbformat

    source = notebooks_dir() / f"{name}.ipynb"
    if not params:
        return source
    known = notebook_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"notebook {name} has no parameter(s) {unknown}; its parameters are {sorted(known)}")
    nb = nbformat.read(source, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    code = "# Injected parameters (moelab app --params)\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(code, metadata={"tags": ["injected-parameters"]}))
    out = workdir / f"{name}.ipynb"
    nbformat.write(nb, out)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moelab app", description="serve one notebook as a Voila dashboard "
                                "(code hidden, widgets live) for a lecture")
    p.add_argument("notebook", help="notebook name or unique prefix, e.g. 03 or 03_afd_ratio")
    p.add_argument("--port", type=int, default=8866, help="TCP port (default 8866; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (anyone who reaches it with the token runs the notebook)")
    p.add_argument("--token", default=None, help="access token (default: a random one, printed at start)")
    p.add_argument("--params", "-p", nargs="*", metavar="K=V", help="notebook parameters, e.g. N=3000")
    p.add_argument("--open", action="store_true", help="open a browser on the dashboard")
    return p


def main(argv: list[str] | None = None) -> int:
    """``moelab app NOTEBOOK [--port P] [--host H] [--allow-remote] [--token T] [--params K=V ...]``."""
    args = build_parser().parse_args(argv)
    try:
        return serve(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


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
    if port == 0:
        port = free_port(args.host)
    if importlib.util.find_spec("voila") is None:
        raise ValueError("moelab app needs Voila: pip install 'moelab[browser]' (or pip install voila)")
    missing = missing_requirements(name)
    if missing:
        raise ValueError(f"notebook {name} needs {describe_requirements(missing)}, which is not installed")
    token = args.token or secrets.token_urlsafe(16)
    params = parse_params(args.params or [])
    with tempfile.TemporaryDirectory(prefix="moelab-app-") as tmp:
        notebook = prepare_notebook(name, params, Path(tmp))
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"serving {name} (code hidden) at http://{shown}:{port}/?token={token}   (Ctrl+C stops)", flush=True)
        cmd = voila_command(notebook, host=args.host, port=port, token=token, open_browser=args.open)
        env = dict(os.environ)
        env.setdefault("MOELAB_FIGURES", str(Path(tmp) / "figures"))  # lecture runs never overwrite figures/
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
