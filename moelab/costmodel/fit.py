"""Non-negative linear least squares with a fit report (relative error per measured point)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls


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
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = 1.0 / y if relative else np.ones_like(y)
    coef, _ = nnls(X * w[:, None], y * w)
    fit = LinearFit(tuple(feature_names), coef)
    return fit, FitReport(y, fit.predict(X))
