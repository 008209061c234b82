"""The ``moelab`` command line."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from moelab import __version__
from moelab.presets import PRESETS

# Sub-commands implemented next to the code they drive; each module has ``main(argv) -> int``.
DELEGATED = {
    "train-tiny-moe": ("moelab.make.tiny_moe", "train the project's tiny MoE (= train-moe --preset tiny-moe)"),
    "train-moe": ("moelab.make.train", "train a project MoE (--preset sharegpt-moe | tiny-moe): corpus, tokenizer, model"),
    "calibrate": ("moelab.make.calibrate", "measure step costs on this machine's GPU (or --smoke on CPU)"),
    "serve-router": ("moelab.serving.proxy", "HTTP router proxy in front of OpenAI-compatible vLLM servers"),
    "sweep": ("moelab.bench.sweep_cli", "run an experiment grid (ELDR, BalanceRoute, HD) serially, on a process pool or Ray"),
    "hd-replay": ("moelab.bench.hd_replay", "replay HD's drafters on greedy outputs: per-class acceptance, variants (held-out)"),
    "build-hd-stores": ("moelab.make.hd_stores", "build Hierarchy Drafting's S (target outputs on ShareGPT) and L stores"),
    "book": ("moelab.book", "build the executed lab as a static HTML book (Sphinx + myst-nb; works offline)"),
    "course": ("moelab.course.release", "hand out the lessons as nbgrader labs (course release OUT)"),
    "app": ("moelab.app", "serve a notebook's lesson part as a Voila dashboard for a lecture (results precomputed)"),
    "doctor": ("moelab.doctor", "check this machine for the live half: torch, vLLM vs its contract, extras, data, features"),
    "slides": ("moelab.slides", "a notebook's lesson part as offline reveal.js slides (nbconvert)"),
}


def _cmd_notebooks(args: argparse.Namespace) -> int:
    # lazy: like DELEGATED's, a subcommand's module loads when it runs, so `moelab --help` stays off pandas
    from moelab.notebooks import (
        available_notebooks,
        check_run_output,
        choose_preset,
        describe_requirements,
        figures_location,
        missing_requirements,
        notebook_parameters,
        parse_params,
        resolve,
        run_notebook,
        run_parameters,
    )

    if args.action == "list":
        for name in available_notebooks():
            print(name)
        return 0
    if args.action == "copy":
        from moelab.notebooks import copy_notebooks  # lazy: like the other notebooks actions

        if len(args.names) != 1:
            raise ValueError(f"notebooks copy takes one folder, DIR; got {args.names or 'none'}")
        written = copy_notebooks(args.names[0])
        print(f"wrote {len(written)} files to {written[0].parent}; there, `moelab notebooks run NAME` runs the copies "
              "and `moelab lab` opens them")
        return 0
    names = resolve(args.names)
    if not args.names:  # running "everything": leave out notebooks whose optional packages are absent
        skipped = {n: missing_requirements(n) for n in names}
        skipped = {n: m for n, m in skipped.items() if m}
        for n, m in skipped.items():
            print(f"skipping {n}: needs {describe_requirements(m)}; or name the notebook to run it anyway")
        names = [n for n in names if n not in skipped]
    params = parse_params(args.params or [])
    preset = choose_preset(args.preset, params)
    out = Path(args.out)
    # a --params entry applies to every selected notebook that has that parameter
    known = {name: notebook_parameters(name) for name in names}
    unused = sorted(set(params) - {k for p in known.values() for k in p})
    if unused:
        raise ValueError(f"no selected notebook has parameter(s) {unused}")
    # the preset and every value checked for every notebook before the first one runs
    run_params = {name: run_parameters(name, preset, {k: v for k, v in params.items() if k in known[name]})
                  for name in names}
    check_run_output(out, names)  # and the output folder, before the first kernel starts
    runs = []
    with tqdm(names, desc="notebooks", unit="nb") as bar:
        for name in bar:
            bar.set_postfix_str(name)
            runs.append(run_notebook(name, run_params[name], out))
    print(f"\n{'notebook':<28}{'status':<8}{'seconds':>9}  output")
    for r in runs:
        print(f"{r.name:<28}{'ok' if r.ok else 'FAILED':<8}{r.seconds:>9.1f}  {r.output}" + (f"\n    {r.error}" if r.error else ""))
    print(f"figures: {figures_location(out)}")
    return 0 if all(r.ok for r in runs) else 1


def _cmd_lab(args: argparse.Namespace) -> int:
    # lazy: like DELEGATED's, a subcommand's module loads when it runs, so `moelab --help` stays off pandas
    from moelab.notebooks import notebooks_dir

    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={notebooks_dir()}"] + (["--no-browser"] if args.no_browser else [])
    return subprocess.call(cmd)


def _cmd_bench(args: argparse.Namespace) -> int:
    # lazy: the bench suites import every paper (and pandas); only `moelab bench` needs them
    from moelab._io import atomic_write_json
    from moelab._outputs import check_output_file, record_output_file
    from moelab.bench import run_suites

    if args.json:  # checked before the (long) run, not after it
        args.json = check_output_file(args.json, writer="bench", name="--json")
    if args.busy_core:
        if "hd" not in (args.suites or ["hd"]):
            raise ValueError("--busy-core is for the hd suite (moelab bench hd --busy-core)")
        os.environ["MOELAB_HD_BUSY_CORE"] = "1"  # read by moelab.bench.hd, which starts and stops the hog
    figures = run_suites(args.suites, quick=args.quick)
    print(f"{'figure':<44}{'value':>14}  {'unit':<8}{'goal':<10}{'met':<6}note")
    for f in figures:
        met = {True: "yes", False: "NO", None: "-"}[f.met]
        print(f"{f.name:<44}{f.value:>14.4g}  {f.unit:<8}{f.goal:<10}{met:<6}{f.note}")
    if args.json:
        atomic_write_json(args.json, [f.as_dict() for f in figures])
        record_output_file(args.json, "bench")
        print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moelab", description="moelab: MoE LLM serving research lab")
    parser.add_argument("--version", action="version", version=f"moelab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    nb = sub.add_parser("notebooks", help="list, run (headless, papermill) or copy the lab's notebooks",
                        description="run: execute notebooks headless; list: their names; copy DIR: write the "
                                    "notebooks, NOTATION.md and COURSE.md into DIR (then run them there)")
    nb.add_argument("action", choices=["run", "list", "copy"])
    nb.add_argument("names", nargs="*", help="notebook names or unique prefixes (default: all); for copy, the folder DIR")
    nb.add_argument("--preset", choices=PRESETS, default=None,
                    help="run size, the same in every notebook (moelab/presets.py): ci (smallest, the tests'), "
                         "classroom (the default: <= 3 min per notebook on a laptop) or full (paper scale)")
    nb.add_argument("--params", "-p", nargs="*", action="extend", metavar="K=V",
                    help="papermill parameters, e.g. N_REQUESTS=200 (a value given here wins over the preset; "
                         "repeated -p flags add up, a name given twice is refused)")
    nb.add_argument("--out", default="runs",
                    help="folder for executed notebooks (new, empty, or one this command wrote; never notebooks/); "
                         "figures go to OUT/figures")
    nb.set_defaults(func=_cmd_notebooks)

    lab = sub.add_parser("lab", help="open JupyterLab on the lab's notebooks (a copied folder, or notebooks/)",
                         description="Open JupyterLab on the notebooks: on the current folder when `moelab notebooks "
                                     "copy DIR` wrote it (run `moelab lab` inside DIR), else on the lab's notebooks/ "
                                     "folder: the clone's in a checkout; with an installed wheel, the one inside the "
                                     "installed package (edits there are lost on reinstall: run `moelab notebooks "
                                     "copy DIR`, then `cd DIR && moelab lab`).")
    lab.add_argument("--no-browser", action="store_true", help="start the server without opening a browser")
    lab.set_defaults(func=_cmd_lab)

    bench = sub.add_parser("bench", help="run benchmarks and print their figures")
    bench.add_argument("suites", nargs="*", help="suites (default: all)")
    bench.add_argument("--json", help="also write the figures to this JSON file")
    bench.add_argument("--quick", action="store_true", help="smaller sizes (for smoke tests)")
    bench.add_argument("--busy-core", action="store_true",
                       help="suite hd: keep one core busy with a spinning process during the whole run (probes "
                            "included), to check that the claims hold on a busy machine")
    bench.set_defaults(func=_cmd_bench)

    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


# OSErrors that mean "the user named a bad path or port", not a bug: answered with a message, no traceback
USER_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.EROFS,
               errno.ENOSPC, errno.ENAMETOOLONG, errno.EADDRINUSE, errno.EADDRNOTAVAIL}


def user_error_message(exc: BaseException) -> str | None:
    """The ``error: ...`` text for an exception the user caused (a bad argument, path or port), or
    ``None`` for anything else (a bug, which keeps its traceback)."""
    if isinstance(exc, OSError) and exc.errno in USER_ERRNOS:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}" if exc.strerror else str(exc)
    if isinstance(exc, ValueError):
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``moelab``: every sub-command's user errors (``ValueError``, a bad path, a port in use
    or privileged) become ``error: <message>`` on stderr and exit status 2; argparse answers usage errors
    the same way (its ``prog: error: ...`` and status 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:
            module = importlib.import_module(DELEGATED[argv[0]][0])
            return int(module.main(argv[1:]) or 0)
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except Exception as exc:
        message = user_error_message(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

