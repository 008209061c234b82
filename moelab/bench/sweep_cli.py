"""``moelab sweep SUITE [--backend serial|local|ray] [--address A] [--grid k=v1,v2 ...] [--out DIR] [--cached-only]
[--trace FILE|NAME]``.

``moelab sweep eldr --trace FILE`` sweeps a real expert trace (any :class:`~moelab.traces.ExpertTrace` file,
e.g. one ``moelab.capture`` wrote, or the name of a bundled trace such as ``tiny-moe-heldout``, which works
from a wheel too) instead of the synthetic workload: the suite :func:`eldr_trace_suite` (named
``eldr-trace``: its rows go to ``OUT/eldr-trace.parquet``, its cache to ``OUT/cache/eldr-trace``), whose
points run :func:`eldr_trace_point` (ELDR's decode cluster with the trace's real routing and the PROJECTION
step model, :func:`moelab.eldr.experiments.projection_cost`). Rates are in ELDR's one unit, req/s at 16
decode workers (scaled by K/16). A trace's request service time sets their scale (tens of thousands of
req/s on the bundled tiny trace), so the trace suite also takes ``--grid load=...``: the share of the batch
slots offered, turned into rates by :func:`trace_rates_for_load` (:func:`moelab.eldr.experiments.rate_for_load`).
"""

from __future__ import annotations

import argparse
import inspect
import io
import os
import sys
import warnings
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from moelab._io import atomic_write_bytes
from moelab._outputs import check_output_dir, claim_output_dir, record_outputs
from moelab._validate import check_choice, check_int, check_real
from moelab.bench.suites import (
    _FLOOR,
    ROUTER_MODULES_ENV,
    SWEEP_SUITES,
    get_suite,
    import_sweep_router_modules,
)
from moelab.costmodel import MODEL_SHAPES
from moelab.datasets import bundled_path
from moelab.eldr import experiments as eldr_experiments
from moelab.routers import import_router_modules
from moelab.routing import available_routers
from moelab.sweep.core import BACKENDS, parse_grid_args
from moelab.sweep.suite import Suite, coerce, run_suite
from moelab.traces import bundled_trace_path, load_trace, traces_dir


@lru_cache(maxsize=4)
def _trace_setup(trace: str, mtime_ns: int, K: int, n_pairs: int, like: str, seed: int) -> Any:
    # one setup per (file version, K, ...) in each worker process: the points of a sweep share it
    tr = load_trace(trace)
    return eldr_experiments.prepare(tr, eldr_experiments.projection_cost(tr, like), K, n_pairs=n_pairs, seed=seed)


def eldr_trace_point(trace: str, rate: float = 60.0, K: int = 16, tau: float = 0.1, router: str = "eldr",
                     n_requests: int = 2000, output_len: int = 128, n_pairs: int = 10000,
                     like: str = "qwen3-30b-a3b", seed: int = 0) -> dict[str, Any]:
    """One ELDR decode-cluster simulation on a real expert trace (a point of ``moelab sweep eldr --trace``).

    Parameters
    ----------
    trace : str
        Path of an :class:`~moelab.traces.ExpertTrace` file (``.npz`` with its ``.json`` sidecar).
    rate : float
        Arrival rate in ELDR's unit, req/s at 16 decode workers; ``K`` workers get ``rate * K / 16``.
    K : int
        Decode workers (one centroid each, fitted on the trace's calibration half).
    tau : float
        ELDR's band width (only the ``eldr`` router takes it).
    router : str
        A registered router.
    n_requests, output_len : int
        Requests replayed from the trace's pool half, and decode tokens each (the trace's captured decode
        tokens are replayed cyclically).
    n_pairs : int
        Request pairs of the signature's layer-mask search.
    like : str
        A registry MoE model (:data:`moelab.costmodel.MODEL_SHAPES`) whose expert, attention and head sizes
        price the trace's routing (:func:`moelab.eldr.experiments.projection_cost`): the trace says which
        experts each step reads and how many layers, experts and top-k there are; ``like`` says how much an
        expert and a token's attention cost on the H200 tables (a small captured model is priced as if it
        were that model's size).
    seed : int
        Seed of the split, K-means, arrivals and routers.

    Returns
    -------
    dict
        :func:`moelab.eldr.experiments.run_one`'s row (the sweep adds the point's parameters, ``trace`` too).
    """
    import_sweep_router_modules()  # a router a --router-module registers, in this worker too
    path = Path(trace)
    setup = _trace_setup(str(path), path.stat().st_mtime_ns, int(K), int(n_pairs), like, int(seed))
    return eldr_experiments.run_one(setup, router, rate=rate, n_requests=n_requests, output_len=output_len, tau=tau,
                                    seed=seed)


def _trace_check(points: list[dict]) -> None:
    routers = available_routers()
    for p in points:
        check_choice("router", p["router"], routers)
        check_real("rate", p["rate"], low=0, low_open=True)
        check_int("K", p["K"], low=1, high=1024)
        check_real("tau", p["tau"], low=0)
        check_int("n_requests", p["n_requests"], low=1, high=1_000_000)
        check_int("output_len", p["output_len"], low=1, high=100_000)
        check_int("n_pairs", p["n_pairs"], low=100, high=1_000_000)
        check_choice("like", p["like"], _moe_models())
        check_int("seed", p["seed"], low=0)


def bundled_trace_names() -> list[str]:
    """Names of the expert traces bundled with the lab (``data/traces/*.npz``, in a clone or a wheel).

    Returns
    -------
    list of str
        File stems, e.g. ``"tiny-moe-heldout"``; each works as ``moelab sweep eldr --trace NAME``.
    """
    root = traces_dir()
    return sorted(p.stem for p in root.glob("*.npz")) if root.is_dir() else []


def resolve_trace(trace: str | Path) -> Path:
    """The expert-trace file ``trace`` names: a path to an existing file, else a bundled trace's name
    (:func:`bundled_trace_names`, resolved through :func:`moelab.traces.bundled_trace_path`).

    Parameters
    ----------
    trace : str or path
        A ``.npz`` :class:`~moelab.traces.ExpertTrace` file, or a bundled name such as ``"tiny-moe-heldout"``.

    Returns
    -------
    pathlib.Path
        The resolved absolute file.

    Raises
    ------
    ValueError
        When ``trace`` is neither an existing file nor a bundled name (the message lists the names).
    """
    if not isinstance(trace, (str, Path)) or not str(trace):
        raise ValueError(f"--trace must be an ExpertTrace file (.npz) or a bundled trace name; got {trace!r}")
    path = Path(trace).expanduser()
    if path.is_file():
        return path.resolve()
    text = str(trace)
    stem = text[:-len(".npz")] if text.endswith(".npz") else text
    if "/" not in stem and "\\" not in stem and not stem.startswith(".") and stem:
        bundled = bundled_trace_path(stem)
        if bundled.is_file():
            return bundled.resolve()
    names = bundled_trace_names()
    raise ValueError(f"--trace must be an ExpertTrace file (.npz) or the name of a bundled trace "
                     f"({', '.join(names) if names else 'none bundled here'}); {text!r} is neither")


#: the trace suite's default rates (ELDR's unit; the paper's, usually far below a trace's scale: give load=...)
TRACE_DEFAULT_RATES = (20.0, 40.0, 60.0, 80.0, 100.0)
#: the trace suite's default routers: the paper's four load balancers and ELDR
TRACE_DEFAULT_ROUTERS = (*eldr_experiments.BASELINES, "eldr")


def eldr_trace_suite(trace: str | Path) -> Suite:
    """The ``eldr`` suite on a real expert trace: rate x K x tau x router, one :func:`eldr_trace_point` each.

    The trace is read once here (a bad file is refused before anything runs, with the loaders' named
    errors); its contents (and its sidecar) are hashed into every cache key. The suite is named
    ``eldr-trace``: ``moelab sweep eldr --trace`` writes its rows to ``OUT/eldr-trace.parquet``, so a trace
    sweep never overwrites a synthetic one (``OUT/eldr.parquet``) in the same folder.

    Parameters
    ----------
    trace : str or path
        An :class:`~moelab.traces.ExpertTrace` file, or a bundled trace's name (:func:`resolve_trace`).

    Returns
    -------
    moelab.sweep.suite.Suite
    """
    path = resolve_trace(trace)
    tr = load_trace(path)
    n_half = max(1, tr.n_requests // 2)

    def data() -> list[Path]:
        side = path.with_suffix(".json")
        return [path, *([side] if side.is_file() else []), bundled_path("calibration", "h200")]

    return Suite(
        "eldr-trace", eldr_trace_point,
        {"trace": [str(path)], "rate": list(TRACE_DEFAULT_RATES), "K": [min(16, n_half)], "tau": [0.1],
         "router": list(TRACE_DEFAULT_ROUTERS), "n_requests": [2000], "output_len": [128],
         "n_pairs": [10000], "like": ["qwen3-30b-a3b"], "seed": [0]},
        f"ELDR decode cluster on the real trace {path.name} ({tr.geometry.model_name}, {tr.n_requests} requests): "
        "rate x K x tau x router", ("moelab.eldr", "moelab.bench.sweep_cli", *_FLOOR), data,
        ("tpot_ms_p50", "tpot_ms_p99", "distinct_per_layer_step"), check=_trace_check)


def trace_rates_for_load(trace: str | Path, loads, *, K: int = 16, output_len: int = 128, n_pairs: int = 10000,
                         like: str = "qwen3-30b-a3b", seed: int = 0) -> list[float]:
    """The rates, in ELDR's unit (req/s at 16 decode workers), that offer each of ``loads`` on a trace:
    :func:`moelab.eldr.experiments.rate_for_load` on the setup :func:`eldr_trace_point` builds (256 slots per
    worker, as its runs use). What ``moelab sweep eldr --trace T --grid load=...`` runs.

    Parameters
    ----------
    trace : str or path
        An :class:`~moelab.traces.ExpertTrace` file, or a bundled trace's name (:func:`resolve_trace`).
    loads : sequence of float
        Offered loads, each a share of the cluster's batch slots in
        :data:`moelab.eldr.experiments.LOAD_RANGE` (0.5: half the slots; above 1 requests queue).
    K : int
        Decode workers of the split's check (the rate itself is per worker: it does not depend on K).
    output_len : int
        Decode tokens per request, as the points use (the rate is inversely proportional to it).
    n_pairs, like, seed
        As in :func:`eldr_trace_point` (``like`` prices the trace's routing, ``seed`` draws the split).

    Returns
    -------
    list of float
        One rate per load, in the order given.
    """
    path = resolve_trace(trace)
    check_int("K", K, low=1, high=1024)
    check_int("output_len", output_len, low=1, high=100_000)
    check_int("n_pairs", n_pairs, low=100, high=1_000_000)
    check_choice("like", like, sorted(k for k, v in MODEL_SHAPES.items() if v.is_moe))
    check_int("seed", seed, low=0)
    if isinstance(loads, (str, bytes)) or not hasattr(loads, "__iter__"):
        raise ValueError(f"loads must be a sequence of numbers in {list(eldr_experiments.LOAD_RANGE)}; got {loads!r}")
    setup = _trace_setup(str(path), path.stat().st_mtime_ns, int(K), int(n_pairs), like, int(seed))
    return [float(eldr_experiments.rate_for_load(setup, x, output_len=output_len)) for x in loads]


def _rates_for_load_grid(suite: Suite, overrides: dict[str, list]) -> tuple[list[float], list[float]]:
    """``--grid load=...`` of the trace suite as rates: (loads, rates). The rate depends on the trace,
    ``output_len``, ``like``, ``n_pairs`` and ``seed``, so each must have one value here."""
    loads = overrides.pop("load")
    if "rate" in overrides:
        raise ValueError("--grid takes load=... or rate=..., not both (load sets the rates)")
    grid = coerce(suite, suite.grid(overrides))
    several = [k for k in ("output_len", "like", "n_pairs", "seed") if len(grid[k]) > 1]
    if several:
        raise ValueError(f"--grid load=... needs one value of {several} (the rate for a load depends on them); "
                         f"sweep them in separate runs or give rate=... instead")
    for x in loads:
        check_real("load", x, low=eldr_experiments.LOAD_RANGE[0], high=eldr_experiments.LOAD_RANGE[1])
    rates = trace_rates_for_load(grid["trace"][0], loads, K=min(grid["K"]), output_len=grid["output_len"][0],
                                 n_pairs=grid["n_pairs"][0], like=grid["like"][0], seed=grid["seed"][0])
    return [float(x) for x in loads], rates


def _fmt(x: float) -> str:
    """A table number: thousands separated and no exponent from 1,000 up (rates of tens of thousands of
    req/s), else 4 significant digits."""
    return f"{x:,.0f}" if abs(x) >= 1000 and abs(x) < 1e15 else f"{x:.4g}"


def _defaults(values: Any) -> str:
    """A parameter's default values as ``--grid`` writes them (a long list shortened)."""
    vals = list(values() if callable(values) else values)
    text = ",".join(f"{v:g}" if isinstance(v, float) else repr(v) if v == "" else str(v) for v in vals[:6])
    return text + (f",... ({len(vals)} values)" if len(vals) > 6 else "")


def _wrap_params(pairs: list[str]) -> str:
    """``pairs`` two spaces apart, in lines of at most about 96 characters indented under a suite's name."""
    lines, line = [], ""
    for item in pairs:
        if line and len(line) + len(item) + 2 > 96:
            lines.append(line)
            line = ""
        line = f"{line}  {item}" if line else item
    lines.append(line)
    return "\n".join(f"  {'':<14}{x}" for x in lines)


def _suite_help() -> str:
    lines = []
    for s in SWEEP_SUITES.values():
        try:
            pairs = [f"{k}={_defaults(v)}" for k, v in s.params.items()]
        except (OSError, ValueError, ImportError):  # a default read from data that is not here (hd's question ids)
            pairs = [f"{k}={_defaults(v) if not callable(v) else '(from data)'}" for k, v in s.params.items()]
        lines.append(f"  {s.name:<14}{s.description}\n  {'':<14}parameters (defaults):\n{_wrap_params(pairs)}")
    sig = inspect.signature(eldr_trace_point).parameters
    special = {"rate": f"rate={_defaults(TRACE_DEFAULT_RATES)} (or load=...)",
               "K": "K=16 (at most half the trace's requests)",
               "router": f"router={_defaults(TRACE_DEFAULT_ROUTERS)}"}
    trace_pairs = [special.get(p, f"{p}={_defaults([v.default])}") for p, v in sig.items() if p != "trace"]
    pad = " " * 16
    lines.append(f"  {'eldr-trace':<14}ELDR decode cluster on a REAL expert trace, moelab sweep eldr --trace FILE|NAME "
                 f"(rows to OUT/eldr-trace.parquet)\n{pad}parameters (defaults; the trace is --trace's; no slots: "
                 f"256 per worker):\n{_wrap_params(trace_pairs)}\n"
                 f"{pad}like: the registry MoE model whose expert, attention and head sizes price the trace's\n"
                 f"{pad}routing (the trace gives the layers, experts, top-k and which experts each step reads; like,\n"
                 f"{pad}how much each costs on the H200 tables), one of:\n{_wrap_params(_moe_models())}")
    return "\n".join(lines)


def _moe_models() -> list[str]:
    return sorted(k for k, v in MODEL_SHAPES.items() if v.is_moe)


EPILOG = """rates (eldr, eldr-trace): req/s offered to the paper's 16 decode workers (K workers get rate * K / 16). The
synthetic suite's paper rates are 20..100; a trace's scale depends on its requests' service time (on the bundled
tiny-moe-heldout trace, half the batch slots at the default output_len=128 is about 13,500 req/s). For a trace
give --grid load=0.2,0.5 (the share of the batch slots offered, moelab.eldr.experiments.rate_for_load; printed
with the rate it sets) and moelab picks the rates.

examples:
  moelab sweep eldr --grid rate=20,60,100 K=8,16 tau=0.05,0.1 --backend ray
  moelab sweep eldr --trace tiny-moe-heldout --grid load=0.2,0.5 K=4 router=jsq,eldr"""


#: the writer's name in the output folder's marker (``.moelab-output.json``)
WRITER = "sweep"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moelab sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run an experiment grid with a result cache (reruns compute only missing points).",
        epilog=f"suites:\n{_suite_help()}\n\n{EPILOG}")
    p.add_argument("suite", help=f"one of {', '.join(SWEEP_SUITES)}")
    p.add_argument("--backend", default="local", choices=BACKENDS,
                   help="serial (this process), local (process pool, default) or ray")
    p.add_argument("--address", help="Ray cluster to join (host:port, ray://host:port, auto); default $RAY_ADDRESS, "
                                     "else a Ray instance on this machine")
    p.add_argument("--workers", type=int, help="local processes / CPUs of a Ray started here (default: CPU count / "
                                               "min(4, CPU count))")
    p.add_argument("--grid", nargs="*", default=[], metavar="K=V1,V2",
                   help="values for some parameters (the others keep the suite's defaults); eldr --trace also "
                        "takes load=... instead of rate=...")
    p.add_argument("--out", default="runs/sweep", help="results go to OUT/SUITE.parquet (OUT/eldr-trace.parquet for "
                   "eldr --trace), the cache to OUT/cache/SUITE (OUT: new, empty, or a folder moelab sweep wrote)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--trace", metavar="FILE|NAME",
                   help="eldr only: sweep this real ExpertTrace file (.npz), or a bundled trace by name (e.g. "
                        "tiny-moe-heldout), instead of the synthetic workload (suite eldr-trace)")
    p.add_argument("--router-module", action="append", default=[], metavar="MODULE",
                   help="eldr suites: import this module first (repeatable), as moelab serve-router --router-module "
                        "does: a module of yours that registers a router (moelab.routing.register_router) so "
                        "--grid router=NAME can name it; it must be importable (installed, or its folder on "
                        "PYTHONPATH, e.g. PYTHONPATH=. moelab sweep ...). The serial and local backends import it "
                        "in every worker; --backend ray is refused with it. Its source joins the cache key")
    p.add_argument("--cached-only", action="store_true",
                   help="compute nothing: show the points already cached (e.g. a long run's progress while it runs)")
    return p


def _summary(res, suite, grid) -> str:  # noqa: ANN001 - internal
    varied = [k for k, v in grid.items() if len(v) > 1]
    cols = varied + [c for c in suite.columns if c in res.frame.columns and c not in varied]
    if not cols:
        cols = list(res.frame.columns[:8])
    df = res.frame[cols]
    text = df.head(40).to_string(index=False, float_format=_fmt)
    if len(df) > 40:
        text += f"\n... {len(df) - 40} more rows"
    return text


def _with_router_modules(suite: Suite, modules: list[str], backend: str) -> Suite:
    """``suite`` after importing the ``--router-module`` modules here and, through :data:`ROUTER_MODULES_ENV`,
    in every worker the serial and local backends start; their source joins the cache key."""
    if suite.name not in ("eldr", "eldr-trace"):
        raise ValueError(f"--router-module is for the eldr suites (their router parameter); suite {suite.name!r} "
                         "takes no router")
    if backend == "ray":
        raise ValueError("--router-module runs with --backend serial or local: Ray's workers (on other machines "
                         "too) would not import it; install the module on every node and register the router "
                         "there, or drop --backend ray")
    modules = import_router_modules(modules)
    os.environ[ROUTER_MODULES_ENV] = ",".join(modules)  # spawned local workers inherit it
    return replace(suite, code=(*suite.code, *modules))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings API
        print(f"warning: {message}", file=sys.stderr)

    old_show = warnings.showwarning
    old_env = os.environ.get(ROUTER_MODULES_ENV)
    warnings.showwarning = show
    try:
        suite = get_suite(args.suite)
        if args.trace is not None:
            if args.suite != "eldr":
                raise ValueError(f"--trace is for the eldr suite only; got suite {args.suite!r}")
            suite = eldr_trace_suite(args.trace)
        overrides = parse_grid_args(args.grid)
        loads: list[float] = []
        if "load" in overrides:
            if args.trace is None:
                raise ValueError(f"--grid load=... is for eldr --trace (the trace suite) only; suite {args.suite!r} "
                                 "takes its own parameters (eldr: rate=..., req/s at 16 workers)")
            loads, rates = _rates_for_load_grid(suite, overrides)
            overrides["rate"] = rates
            print("load -> rate (req/s at 16 workers): "
                  + ", ".join(f"{x:g} -> {_fmt(r)}" for x, r in zip(loads, rates)))
        if args.router_module:
            suite = _with_router_modules(suite, args.router_module, args.backend)
        grid = coerce(suite, suite.grid(overrides))
        suite.points(overrides)  # the whole grid checked before the output folder is claimed
        if args.workers is not None:
            check_int("--workers", args.workers, low=1, high=1024)
        if not args.cached_only:  # the output folder checked and claimed before any point runs
            claim_output_dir(check_output_dir(args.out, writer=WRITER, name="--out",
                                              overwrites=[f"{suite.name}.parquet"]), WRITER)
        res = run_suite(suite, overrides, out=args.out, backend=args.backend, workers=args.workers,
                        address=args.address, progress=not args.no_progress, compute=not args.cached_only)
        if loads and len(res.frame):  # the load each rate was computed for, beside it
            res.frame.insert(0, "load", res.frame["rate"].map(dict(zip(overrides["rate"], loads))))
            grid = {"load": loads, **grid}
        out = Path(args.out).expanduser().resolve()
        if args.cached_only:
            if len(res.frame):
                print(_summary(res, suite, grid))
            print(f"\n{res.points} points: {res.cached} cached, {res.missing} not yet computed (--cached-only: "
                  f"nothing run, no results file written)\ncache:   {res.cache_dir.resolve()}")
            return 0
        buf = io.BytesIO()
        res.frame.to_parquet(buf, index=False)
        path = atomic_write_bytes(out / f"{suite.name}.parquet", buf.getvalue())
        record_outputs(out, WRITER, [path])
        print(_summary(res, suite, grid))
        print(f"\n{res.points} points: {res.computed} computed, {res.cached} from the cache"
              + (f" ({len(res.recomputed)} corrupt entries recomputed)" if res.recomputed else "")
              + f"; {res.seconds:.1f} s on {args.backend}")
        print(f"results: {path}\ncache:   {res.cache_dir.resolve()}")
        return 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional part the suite needs (torch for hd, ray for --backend ray)
        print(f"error: {exc} (the suite or backend needs it; see the README's install extras)", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # e.g. a local Ray that could not start
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: finished points are cached; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = old_show
        if args.router_module:  # the workers have run: leave this process's environment as it was
            if old_env is None:
                os.environ.pop(ROUTER_MODULES_ENV, None)
            else:
                os.environ[ROUTER_MODULES_ENV] = old_env


if __name__ == "__main__":
    sys.exit(main())
