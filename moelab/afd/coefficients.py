"""The six linear stage-latency coefficients of an AFD bundle (no dependencies inside ``moelab.afd``).

:mod:`moelab.afd.theory` (the closed form) and :mod:`moelab.afd.calibration` / :mod:`moelab.afd.measured`
(coefficients fitted from measured tables) all import this module and nothing imports them back, so
there is no import cycle between the theory and its calibrations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moelab._validate import check_real


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
        Time unit of every coefficient: ``"cycles"`` for the paper's Ascend-910C fit (the default
        constructor), ``"ms"`` for GPU calibrations
        (:func:`moelab.afd.calibration.coefficients_from_tables`, :func:`moelab.afd.measured.fit_coefficients`).
    source : str
        Provenance note shown in notebooks.
    """

    a_A: float = 0.00165
    b_A: float = 50.0
    a_F: float = 0.083
    b_F: float = 100.0
    a_C: float = 0.022
    b_C: float = 20.0
    unit: str = "cycles"
    source: str = "paper's Ascend-910C fit (Lyu et al. 2026)"

    def __post_init__(self) -> None:
        for name in ("a_A", "b_A", "b_F", "a_C", "b_C"):
            object.__setattr__(self, name, check_real(name, getattr(self, name), low=0))
        # a_F > 0: with a free per-token FFN cost the bundle would want infinitely many instances
        object.__setattr__(self, "a_F", check_real("a_F", self.a_F, low=0, low_open=True))

    @classmethod
    def paper(cls) -> AFDCoefficients:
        """The paper's Ascend-910C fit (units: cycles) — the same as ``AFDCoefficients()``."""
        return cls()

    def as_dict(self) -> dict[str, float | str]:
        return asdict(self)

    def replace(self, **changes: float | str) -> AFDCoefficients:
        """A copy with some coefficients changed (validated again)."""
        return AFDCoefficients(**{**asdict(self), **changes})


def check_coefficients(coeffs: AFDCoefficients | None) -> AFDCoefficients:
    """``coeffs`` itself, or the paper's fit for None; anything else is refused."""
    if coeffs is None:
        return AFDCoefficients()
    if not isinstance(coeffs, AFDCoefficients):
        raise ValueError(f"coeffs must be an AFDCoefficients or None; got {type(coeffs).__name__}")
    return coeffs


__all__ = ["AFDCoefficients", "check_coefficients"]
