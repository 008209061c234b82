"""A named grid: parameter defaults, a point function, the code and data its results depend on.

Generic: the suites themselves (the papers' experiment grids) are registered by their owners
(:mod:`moelab.bench.suites`); this module only knows how to expand, check, order and run one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab.sweep.core import Scalar, SweepResult, code_version, data_hash, expand_grid, run_sweep


@dataclass(frozen=True)
class Suite:
    """A registered grid: parameter defaults, the point function, code and data it depends on.

    ``params`` values are default lists (or callables returning them); ``code`` names modules hashed into
    the cache key (``code_fn`` names more, looked up when needed); ``data`` lists the data files read;
    ``check`` refuses bad points before anything runs; ``arrange`` sets the run order of the points."""

    name: str
    fn: Callable[..., Any]
    params: Mapping[str, Sequence[Scalar] | Callable[[], Sequence[Scalar]]]
    description: str
    code: tuple[str, ...]
    data: Callable[[], list[Path]]
    columns: tuple[str, ...] = ()  # result columns worth printing in the CLI summary
    extra_versions: Callable[[], list[str]] = field(default=lambda: [])
    check: Callable[[list[dict[str, Scalar]]], None] | None = None
    code_fn: Callable[[], Sequence[str]] | None = None
    arrange: Callable[[list[dict[str, Scalar]]], list[dict[str, Scalar]]] | None = None

    def default(self, name: str) -> list[Scalar]:
        """The default values of parameter ``name``."""
        v = self.params[name]
        return list(v() if callable(v) else v)

    def grid(self, overrides: Mapping[str, Sequence[Scalar]] | None = None) -> dict[str, list[Scalar]]:
        """The suite's default grid with ``overrides`` for some axes (unknown names are refused)."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self.params))
        if unknown:
            raise ValueError(f"suite {self.name!r} has no parameter(s) {unknown}; its parameters are "
                             f"{sorted(self.params)}")
        return {k: list(overrides[k]) if k in overrides else self.default(k) for k in self.params}

    def points(self, overrides: Mapping[str, Sequence[Scalar]] | None = None) -> list[dict[str, Scalar]]:
        """Every point of the grid (defaults with ``overrides``), typed (:func:`coerce`), checked by
        ``check`` and in ``arrange``'s order: what :func:`run_suite` runs. A bad grid raises here, before
        anything is written.

        Parameters
        ----------
        overrides : mapping of str to sequence, optional
            Values for some parameters (the others keep their defaults).

        Returns
        -------
        list of dict
            One dict of parameter values per point.
        """
        points = expand_grid(coerce(self, self.grid(overrides)), allowed=self.params)
        if self.check is not None:
            self.check(points)
        return self.arrange(points) if self.arrange is not None else points

    def code_version(self) -> str:
        """Hash of the code the suite's results depend on (part of every cache key)."""
        more = tuple(self.code_fn()) if self.code_fn is not None else ()
        return code_version(*self.code, *more, extra=self.extra_versions())

    def data_hash(self) -> str:
        """Hash of the data files the suite reads (part of every cache key)."""
        return data_hash(self.data())


def coerce(suite: Suite, grid: Mapping[str, Sequence[Scalar]]) -> dict[str, list[Scalar]]:
    """Give values the type of the parameter's default (``--grid rate=20`` -> 20.0 for a float
    parameter), so the same point always has the same cache key; a wrong type is an error."""
    out: dict[str, list[Scalar]] = {}
    for name, values in grid.items():
        defaults = suite.default(name)
        kind = type(defaults[0]) if defaults else None
        vals: list[Scalar] = []
        for v in values:
            if kind is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            elif kind is int and isinstance(v, float) and v.is_integer():
                v = int(v)
            if kind is not None and type(v) is not kind:
                raise ValueError(f"suite {suite.name!r} parameter {name!r} takes {kind.__name__} values; got {v!r}")
            vals.append(v)
        out[name] = vals
    return out


def run_suite(suite: Suite, overrides: Mapping[str, Sequence[Scalar]] | None = None, *,
              out: str | Path = "runs/sweep", backend: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool = True, compute: bool = True) -> SweepResult:
    """Run ``suite``'s grid (defaults with ``overrides``); the cache is ``out/cache/<suite name>``.
    ``compute=False`` runs nothing and returns the cached points (see :func:`~moelab.sweep.core.run_sweep`)."""
    points = suite.points(overrides)
    return run_sweep(suite.fn, points, cache_dir=Path(out) / "cache" / suite.name, backend=backend, workers=workers,
                     address=address, code=suite.code_version(), data=suite.data_hash(), allowed=suite.params,
                     progress=progress, desc=f"sweep {suite.name}", compute=compute)


__all__ = ["Suite", "coerce", "run_suite"]
