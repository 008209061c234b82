"""Non-negative linear least squares with a fit report (relative error per measured point)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from moelab._validate import check_array, check_finite_array


@dataclass(frozen=True)
class FitReport:
    """Measured vs predicted values of the points a model was fitted (or validated) on."""

    measured: np.ndarray
    predicted: np.ndarray

    @property
    def rel_err(self) -> np.ndarray:
        """Relative error ``(predicted - measured) / measured`` per point."""
        return (self.predicted - self.measured) / self.measured

    @property
    def median_abs_err_pct(self) -> float:
        """Median absolute relative error (%)."""
        return float(100 * np.median(np.abs(self.rel_err)))

    @property
    def max_abs_err_pct(self) -> float:
        """Largest absolute relative error (%)."""
        return float(100 * np.max(np.abs(self.rel_err)))

    def to_frame(self) -> pd.DataFrame:
        """Measured, predicted and relative error (%) per point."""
        return pd.DataFrame({"measured": self.measured, "predicted": self.predicted, "rel_err_pct": 100 * self.rel_err})


@dataclass(frozen=True)
class LinearFit:
    """``y = X @ coef`` with non-negative coefficients (each feature is a physical cost)."""

    feature_names: tuple[str, ...]
    coef: np.ndarray

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``X @ coef`` (rows of ``X`` are feature vectors)."""
        return np.asarray(X, dtype=np.float64) @ self.coef

    def as_dict(self) -> dict[str, float]:
        """Coefficients by feature name."""
        return dict(zip(self.feature_names, map(float, self.coef)))


def fit_linear(X: np.ndarray, y: np.ndarray, feature_names: tuple[str, ...], *, relative: bool = True) -> tuple[LinearFit, FitReport]:
    """Fit non-negative coefficients; ``relative`` weights every point by ``1/y`` so small and large
    points count alike (the error that matters is relative)."""
    X = check_finite_array("X", X, ndim=2)
    y = check_array("y", check_finite_array("y", y, ndim=1), shape=(X.shape[0],))
    names = tuple(feature_names) if not isinstance(feature_names, str) else (feature_names,)
    if len(names) != X.shape[1]:
        raise ValueError(f"feature_names must name the {X.shape[1]} columns of X; got {len(names)} names")
    if X.shape[0] == 0:
        raise ValueError("X must hold at least one measured point; got 0 rows")
    if relative and np.any(y <= 0):
        raise ValueError(f"y must be > 0 everywhere with relative=True (each point is weighted by 1/y); got minimum {y.min()!r}")
    w = 1.0 / y if relative else np.ones_like(y)
    coef, _ = nnls(X * w[:, None], y * w)
    fit = LinearFit(names, coef)
    return fit, FitReport(y, fit.predict(X))
