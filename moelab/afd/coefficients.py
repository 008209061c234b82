"""The six linear stage-latency coefficients of an AFD bundle (no dependencies inside ``moelab.afd``).

The paper's own fit is data, not code: :func:`paper_coefficients` reads
``data/afd/paper_coefficients.csv`` (provenance in ``data/afd/PROVENANCE.md``).

:mod:`moelab.afd.theory` (the closed form) and :mod:`moelab.afd.calibration` / :mod:`moelab.afd.measured`
(coefficients fitted from measured tables) all import this module and nothing imports them back, so
there is no import cycle between the theory and its calibrations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from moelab._io import read_csv_checked
from moelab._validate import check_real
from moelab.datasets import bundled_path

COEFFICIENT_NAMES = ("a_A", "b_A", "a_F", "b_F", "a_C", "b_C")
PAPER_SOURCE = "paper's Ascend-910C fit (Lyu et al. 2026, arXiv 2601.21351; data/afd/paper_coefficients.csv)"


@dataclass(frozen=True)
class AFDCoefficients:
    """The six linear stage-latency coefficients of an AFD bundle.

    Parameters
    ----------
    a_A, b_A : float
        Attention time per cached token and fixed attention time (one instance, one microbatch).
    a_F, b_F : float
        FFN time per aggregated token and fixed FFN time (weight reads, launches).
    a_C, b_C : float
        Communication time per token of one instance's batch and fixed link latency.
    unit : str
        Time unit of every coefficient: ``"cycles"`` for the paper's Ascend-910C fit
        (:func:`paper_coefficients`), ``"ms"`` for GPU calibrations
        (:func:`moelab.afd.calibration.coefficients_from_tables`, :func:`moelab.afd.measured.fit_coefficients`).
    source : str
        Provenance note shown in notebooks.
    """

    a_A: float
    b_A: float
    a_F: float
    b_F: float
    a_C: float
    b_C: float
    unit: str
    source: str

    def __post_init__(self) -> None:
        for name in ("a_A", "b_A", "b_F", "a_C", "b_C"):
            object.__setattr__(self, name, check_real(name, getattr(self, name), low=0))
        # a_F > 0: with a free per-token FFN cost the bundle would want infinitely many instances
        object.__setattr__(self, "a_F", check_real("a_F", self.a_F, low=0, low_open=True))

    @classmethod
    def paper(cls) -> AFDCoefficients:
        """The paper's Ascend-910C fit (units: cycles), read by :func:`paper_coefficients`."""
        return paper_coefficients()

    def as_dict(self) -> dict[str, float | str]:
        """The coefficients, unit and source as a flat dict."""
        return asdict(self)

    def replace(self, **changes: float | str) -> AFDCoefficients:
        """A copy with some coefficients changed (validated again)."""
        return AFDCoefficients(**{**asdict(self), **changes})


@lru_cache(maxsize=1)
def paper_coefficients() -> AFDCoefficients:
    """The paper's six coefficients (Ascend-910C, cycles) from ``data/afd/paper_coefficients.csv``.

    Returns
    -------
    AFDCoefficients
        One row per coefficient of the table; a table missing one, repeating one or mixing units is refused.
    """
    path = bundled_path("afd", "paper_coefficients.csv")
    df = read_csv_checked(path, {"coefficient": "str", "value": "float", "unit": "str"})
    names = df["coefficient"].tolist()
    if sorted(names) != sorted(COEFFICIENT_NAMES):
        raise ValueError(f"{path}: coefficient must list each of {list(COEFFICIENT_NAMES)} once; got {names}")
    units = sorted(set(df["unit"]))
    if len(units) != 1:
        raise ValueError(f"{path}: every coefficient must share one unit; got {units}")
    values = dict(zip(names, df["value"].astype(float)))
    return AFDCoefficients(**values, unit=units[0], source=PAPER_SOURCE)


def check_coefficients(coeffs: AFDCoefficients | None) -> AFDCoefficients:
    """``coeffs`` itself, or the paper's fit for None; anything else is refused."""
    if coeffs is None:
        return paper_coefficients()
    if not isinstance(coeffs, AFDCoefficients):
        raise ValueError(f"coeffs must be an AFDCoefficients or None; got {type(coeffs).__name__}")
    return coeffs


__all__ = ["COEFFICIENT_NAMES", "PAPER_SOURCE", "AFDCoefficients", "check_coefficients", "paper_coefficients"]
