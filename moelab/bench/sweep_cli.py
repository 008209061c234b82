"""``moelab sweep SUITE [--backend serial|local|ray] [--address A] [--grid k=v1,v2 ...] [--out DIR] [--cached-only]``."""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from pathlib import Path

from moelab._io import atomic_write_bytes
from moelab.bench.suites import SWEEP_SUITES, get_suite, run_named_suite
from moelab.sweep.core import BACKENDS, parse_grid_args
from moelab.sweep.suite import coerce


def build_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {s.name:<14}{s.description}\n  {'':<14}parameters: {', '.join(s.params)}"
                      for s in SWEEP_SUITES.values())
    p = argparse.ArgumentParser(
        prog="moelab sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run an experiment grid with a result cache (reruns compute only missing points).",
        epilog=f"suites:\n{lines}\n\nexample: moelab sweep eldr --grid rate=20,60,100 K=8,16 tau=0.05,0.1 --backend ray")
    p.add_argument("suite", help=f"one of {', '.join(SWEEP_SUITES)}")
    p.add_argument("--backend", default="local", choices=BACKENDS,
                   help="serial (this process), local (process pool, default) or ray")
    p.add_argument("--address", help="Ray cluster to join (host:port, ray://host:port, auto); default $RAY_ADDRESS, "
                                     "else a Ray instance on this machine")
    p.add_argument("--workers", type=int, help="local processes / CPUs of a Ray started here (default: CPU count / "
                                               "min(4, CPU count))")
    p.add_argument("--grid", nargs="*", default=[], metavar="K=V1,V2",
                   help="values for some parameters (the others keep the suite's defaults)")
    p.add_argument("--out", default="runs/sweep", help="results go to OUT/SUITE.parquet, the cache to OUT/cache/SUITE")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--cached-only", action="store_true",
                   help="compute nothing: show the points already cached (e.g. a long run's progress while it runs)")
    return p


def _summary(res, suite, grid) -> str:  # noqa: ANN001 - internal
    varied = [k for k, v in grid.items() if len(v) > 1]
    cols = varied + [c for c in suite.columns if c in res.frame.columns and c not in varied]
    if not cols:
        cols = list(res.frame.columns[:8])
    df = res.frame[cols]
    text = df.head(40).to_string(index=False, float_format=lambda x: f"{x:.4g}")
    if len(df) > 40:
        text += f"\n... {len(df) - 40} more rows"
    return text


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings API
        print(f"warning: {message}", file=sys.stderr)

    old_show = warnings.showwarning
    warnings.showwarning = show
    try:
        suite = get_suite(args.suite)
        overrides = parse_grid_args(args.grid)
        grid = coerce(suite, suite.grid(overrides))
        res = run_named_suite(args.suite, overrides, out=args.out, backend=args.backend, workers=args.workers,
                        address=args.address, progress=not args.no_progress, compute=not args.cached_only)
        out = Path(args.out).expanduser().resolve()
        if args.cached_only:
            if len(res.frame):
                print(_summary(res, suite, grid))
            print(f"\n{res.points} points: {res.cached} cached, {res.missing} not yet computed (--cached-only: "
                  f"nothing run, no results file written)\ncache:   {res.cache_dir.resolve()}")
            return 0
        buf = io.BytesIO()
        res.frame.to_parquet(buf, index=False)
        path = atomic_write_bytes(out / f"{args.suite}.parquet", buf.getvalue())
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


if __name__ == "__main__":
    sys.exit(main())
