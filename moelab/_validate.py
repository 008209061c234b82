"""Parameter validation in one place: every public function raises ``ValueError`` naming the
parameter and the allowed range, and never clamps silently."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a finite float inside the interval, else raise ``ValueError``."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number in {_interval(low, high, low_open, high_open)}; got {value!r}") from None
    bad = not math.isfinite(x)
    if low is not None:
        bad |= x <= low if low_open else x < low
    if high is not None:
        bad |= x >= high if high_open else x > high
    if bad:
        raise ValueError(f"{name} must be in {_interval(low, high, low_open, high_open)}; got {value!r}")
    return x


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an int in ``[low, high]``; floats with a fractional part are rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer in {_interval(low, high, False, False)}; got {value!r}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name} must be an integer in {_interval(low, high, False, False)}; got {value!r}")
    return v


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them."""
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def check_array(
    name: str,
    value: Any,
    *,
    ndim: int | None = None,
    low: float | None = None,
    dtype: Any = None,
    shape: tuple[int | None, ...] | None = None,
) -> np.ndarray:
    """Return ``value`` as an ndarray with the given rank/shape, all finite and ``>= low``."""
    arr = np.asarray(value, dtype=dtype)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d array; got shape {arr.shape}")
    if shape is not None:
        if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}; got {arr.shape}")
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values")
    if low is not None and arr.size and arr.min() < low:
        raise ValueError(f"{name} must be >= {low:g} everywhere; got minimum {arr.min()!r}")
    return arr


def check_loopback_host(name: str, host: str) -> str:
    """Return ``host`` if it is a loopback address (127.0.0.0/8, ::1 or ``localhost``): moelab's servers
    and the backends it talks to stay on this machine."""
    import ipaddress

    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a loopback address (127.0.0.0/8, ::1 or localhost); got {host!r}")
    return host


def rng_from(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A numpy Generator from a seed (or pass one through), so every run is reproducible."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None:
        check_int("seed", seed, low=0)
    return np.random.default_rng(seed)
