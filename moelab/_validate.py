"""Parameter validation in one place: every public function raises ``ValueError`` naming the
parameter and the allowed range, and never clamps silently."""

from __future__ import annotations

import ast
import ipaddress
import math
import operator
from collections.abc import Iterable
from typing import Any

import numpy as np


def _bound(value: float | None, name: str | None, default: str) -> str:
    if value is None:
        return default
    text = f"{value:g}" if isinstance(value, float) else f"{value}"
    return f"{name}={text}" if name else text


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool,
              low_name: str | None = None, high_name: str | None = None) -> str:
    lo, hi = _bound(low, low_name, "-inf"), _bound(high, high_name, "inf")
    return f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"


def _is_empty(low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    if low is None or high is None:
        return False
    return low > high or (low == high and (low_open or high_open))


def _empty_note(low: float | None, high: float | None, low_open: bool, high_open: bool,
                low_name: str | None, high_name: str | None) -> str:
    """Words for a range that holds no value: the inputs that set its bounds are the problem."""
    if not _is_empty(low, high, low_open, high_open):
        return ""
    named = [n for n in (low_name, high_name) if n]
    why = f"{' and '.join(named)} leave{'s' if len(named) == 1 else ''} no valid value" if named else \
        "the other inputs leave no valid value"
    return f", an empty range ({why})"


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    low_name: str | None = None,
    high_name: str | None = None,
) -> float:
    """Return ``value`` as a finite float inside the interval, else raise ``ValueError``.

    ``low_name`` / ``high_name`` name a bound that comes from another input (``high=n, high_name="n"``
    reads ``[0, n=5]``), so a message about an empty range says which input makes it empty.
    """
    interval = _interval(low, high, low_open, high_open, low_name, high_name)
    note = _empty_note(low, high, low_open, high_open, low_name, high_name)
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a real number in {interval}{note}; got {value!r}") from None
    bad = not math.isfinite(x)
    if low is not None:
        bad |= x <= low if low_open else x < low
    if high is not None:
        bad |= x >= high if high_open else x > high
    if bad:
        raise ValueError(f"{name} must be in {interval}{note}; got {value!r}")
    return x


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None,
              low_name: str | None = None, high_name: str | None = None, why: str | None = None) -> int:
    """Return ``value`` as an int in ``[low, high]``; floats with a fractional part are rejected.

    ``low_name`` / ``high_name`` name a bound that comes from another input (see :func:`check_real`);
    ``why`` says why a cap is where it is (a bound on work: ``"the run's memory grows with it"``).
    """
    interval = _interval(low, high, False, False, low_name, high_name)
    note = _empty_note(low, high, False, False, low_name, high_name) + (f" ({why})" if why else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer in {interval}{note}; got {value!r}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name} must be an integer in {interval}{note}; got {value!r}")
    return v


#: longest prompt or output of one request (tokens): far above any model's context window, and small enough
#: that no sum of KV loads over the requests a simulator accepts can overflow int64 (2^24 x 2^38 < 2^63)
MAX_SEQUENCE_TOKENS = 1 << 24

#: one command-line value (a ``--grid`` or ``--params`` entry): real entries are a few dozen characters;
#: the cap keeps Python's literal parser (recursive) far from its stack and memory limits
MAX_CLI_VALUE_CHARS = 4096


def parse_cli_literal(name: str, text: Any, *, max_chars: int = MAX_CLI_VALUE_CHARS) -> Any:
    """A command-line value as a Python literal when it is one (``20``, ``0.1``, ``[1, 2]``, ``None``),
    else the text itself; longer than ``max_chars`` is a ``ValueError`` naming ``name`` and the cap."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string; got {type(text).__name__}")
    if len(text) > max_chars:
        raise ValueError(f"{name} is {len(text)} characters long, over the cap of {max_chars} for one command-line "
                         "value (put large inputs in a file)")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def check_product(names: tuple[str, ...], values: tuple[int, ...], *, cap: int, cap_name: str, why: str) -> int:
    """The product of sizes that together set a buffer (``N x L x E`` cells), or a ``ValueError`` naming
    every factor, the cap and why it is there, before anything is allocated.

    Each value must already be a checked int (:func:`check_int`); the product is exact (Python ints)."""
    total = math.prod(int(v) for v in values)
    if total > cap:
        raise ValueError(f"{' x '.join(names)} must be <= {cap_name}={cap} ({why}); got "
                         f"{' x '.join(str(int(v)) for v in values)} = {total}")
    return total


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them."""
    options = list(choices)
    if not options:
        raise ValueError(f"{name} has no valid value: there are no choices; got {value!r}")
    try:
        ok = value in options
    except (TypeError, ValueError):  # e.g. an array compared with strings
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def _as_array(name: str, value: Any, dtype: Any = None, what: str = "an array of numbers") -> np.ndarray:
    """``np.asarray`` whose failures (ragged lists, strings, huge ints) name the parameter."""
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be {what}; got {_clip(value)}") from None
    if dtype is None and arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be {what}; got dtype {arr.dtype} ({_clip(value)})")
    return arr


def _clip(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _first_bad(arr: np.ndarray, bad: np.ndarray) -> str:
    """"<value> at index <i>" for the first True of ``bad``."""
    idx = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    where = f" at index {idx[0] if len(idx) == 1 else tuple(int(i) for i in idx)}" if idx else ""
    return f"{arr[idx].item()!r}{where}"


def check_array(
    name: str,
    value: Any,
    *,
    ndim: int | None = None,
    low: float | None = None,
    high: float | None = None,
    dtype: Any = None,
    shape: tuple[int | None, ...] | None = None,
) -> np.ndarray:
    """Return ``value`` as an ndarray with the given rank/shape, all finite and in ``[low, high]``."""
    arr = _as_array(name, value, dtype) if dtype is not None else np.asarray(_as_array(name, value))
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d array; got shape {arr.shape}")
    if shape is not None:
        if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}; got {arr.shape}")
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values; got {_first_bad(arr, ~np.isfinite(arr))}")
    if low is not None and arr.size and arr.min() < low:
        raise ValueError(f"{name} must be >= {low:g} everywhere; got minimum {arr.min().item()!r}")
    if high is not None and arr.size and arr.max() > high:
        raise ValueError(f"{name} must be <= {high:g} everywhere; got maximum {arr.max().item()!r}")
    return arr


def check_finite_array(name: str, value: Any, *, ndim: int | None = None, low: float | None = None,
                       high: float | None = None) -> np.ndarray:
    """``value`` as a float64 array with no NaN or infinity (optionally of rank ``ndim``, in ``[low, high]``)."""
    return check_array(name, _as_array(name, value), ndim=ndim, low=low, high=high, dtype=np.float64)


def check_sorted(name: str, value: Any, *, strict: bool = False, low: float | None = None) -> np.ndarray:
    """``value`` as a finite 1-d float64 array in non-decreasing order (increasing when ``strict``),
    e.g. arrival times; the message gives the first index where the order breaks."""
    arr = check_finite_array(name, value, ndim=1, low=low)
    step = np.diff(arr)
    bad = step <= 0 if strict else step < 0
    if bad.any():
        i = int(np.argmax(bad))
        order = "increasing" if strict else "non-decreasing (sorted)"
        raise ValueError(f"{name} must be {order}; got {arr[i].item()!r} at index {i} then {arr[i + 1].item()!r} at index {i + 1}")
    return arr


def check_int_array(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    ndim: int | None = None,
    high_name: str | None = None,
    kind: str = "integers",
) -> np.ndarray:
    """``value`` as an int64 array of integers in the half-open range ``[low, high)``, e.g. token ids in
    ``[0, vocab_size)`` or expert ids in ``[0, num_experts)``.

    Integer dtypes pass; float arrays pass only when every value is integral (``2.0`` yes, ``2.7``
    never: nothing is truncated); booleans, strings and objects are refused. ``high_name`` names the
    input that sets ``high`` (``[0, vocab_size=49152)``); ``kind`` words the values in messages
    (``"token ids"``, ``"expert ids"``).
    """
    rng = f"[{'-inf' if low is None else low}, {_bound(high, high_name, 'inf')})"
    note = ""
    if low is not None and high is not None and low >= high:
        note = f", an empty range ({high_name or 'the other inputs'} leave{'s' if high_name else ''} no valid value)"
    what = f"an array of {kind} in {rng}{note}"
    arr = _as_array(name, value, what=what)
    if arr.dtype.kind == "b":
        raise ValueError(f"{name} must be {what}; got booleans")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d array of {kind}; got shape {arr.shape}")
    if arr.dtype.kind == "f":
        bad = np.asarray(~np.isfinite(arr))  # an array even for a 0-d input (a scalar is not assignable)
        bad[~bad] = arr[~bad] != np.round(arr[~bad])
        if bad.any():
            raise ValueError(f"{name} must be {what}; got {_first_bad(arr, bad)}")
        if arr.size and np.abs(arr).max() >= 2.0**63:
            raise ValueError(f"{name} must be {what}; got {_first_bad(arr, np.abs(arr) >= 2.0**63)}")
    if arr.size:
        below = arr < low if low is not None else None
        above = arr >= high if high is not None else None
        for bad in (below, above):
            if bad is not None and bad.any():
                raise ValueError(f"{name} must be {what}; got {_first_bad(arr, bad)}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must be {what}; got {arr.max().item()!r}")
    return arr.astype(np.int64, copy=False)


def check_token_array(name: str, value: Any, *, vocab_size: int | None = None, ndim: int = 1) -> np.ndarray:
    """``value`` as an int64 array of token ids (rank ``ndim``, integer dtype, in ``[0, vocab_size)``).
    Floats are refused, even integral ones: a token id that arrives as a float came from the wrong array
    and truncating it would decode a different token."""
    arr = _as_array(name, [] if value is None else value, what=f"a {ndim}-d array of integer token ids")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer token ids; got dtype {arr.dtype} ({_clip(value)})")
    return check_int_array(name, arr.astype(np.int64) if not arr.size else arr, low=0, high=vocab_size, ndim=ndim,
                           high_name="vocab_size" if vocab_size is not None else None, kind="token ids")


def token_tuple(name: str, values: Any) -> tuple[int, ...]:
    """``values`` as a tuple of Python ints for a hot path (a drafter's lookup key): ints and numpy integers
    pass; a float (even ``2.0``), a string or ``None`` is a ``ValueError`` naming ``name`` (never truncated)."""
    try:
        return tuple(map(operator.index, values))
    except TypeError:
        raise ValueError(f"{name} must hold integer token ids; got {_clip(values)}") from None


def check_token_ids(name: str, value: Any, *, vocab_size: int | None = None) -> list[int]:
    """``value`` as a list of token ids (1-d, integer dtype, in ``[0, vocab_size)``; see
    :func:`check_token_array`: floats are refused, never truncated)."""
    return check_token_array(name, value, vocab_size=vocab_size).tolist()


def check_counts(name: str, value: Any, *, ndim: int | None = None) -> np.ndarray:
    """``value`` as an int64 array of non-negative integer counts (fractions, NaN, negatives refused)."""
    return check_int_array(name, value, low=0, ndim=ndim)


def check_probabilities(name: str, value: Any, *, ndim: int | None = None, sum_axis: int | None = None,
                        atol: float = 1e-6) -> np.ndarray:
    """``value`` as a float64 array of probabilities in ``[0, 1]``; with ``sum_axis``, each slice along
    that axis must also sum to 1 (within ``atol``)."""
    arr = check_finite_array(name, value, ndim=ndim)
    bad = (arr < 0) | (arr > 1)
    if bad.any():
        raise ValueError(f"{name} must hold probabilities in [0, 1]; got {_first_bad(arr, bad)}")
    if sum_axis is not None and arr.size:
        tot = arr.sum(axis=sum_axis)
        off = np.abs(tot - 1) > atol
        if np.any(off):
            raise ValueError(f"{name} must sum to 1 along axis {sum_axis} (within {atol:g}); got a sum of "
                             f"{float(np.asarray(tot)[np.asarray(off)].ravel()[0])!r}")
    return arr


def check_top_k(top_k: Any, num_experts: Any, *, name: str = "top_k", experts_name: str = "num_experts") -> int:
    """``top_k`` as an int in ``[1, num_experts]`` (a token cannot pick more experts than a layer has)."""
    e = check_int(experts_name, num_experts, low=1)
    return check_int(name, top_k, low=1, high=e, high_name=experts_name)


def check_loopback_host(name: str, host: str) -> str:
    """Return ``host`` if it is a loopback address (127.0.0.0/8, ::1 or ``localhost``): moelab's servers
    and the backends it talks to stay on this machine."""
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


def check_instance(name: str, value: Any, kind: type | tuple[type, ...] | None, what: str, *,
                   methods: tuple[str, ...] = ()) -> Any:
    """Return ``value`` if it is what a parameter takes, else a ``ValueError`` naming the parameter, what
    it takes and what came (``router must be a Router (e.g. make_router('jsq')); got str 'jsq'``).

    ``kind`` is a class, a tuple of classes or a ``runtime_checkable`` protocol (``None``: any object);
    ``methods`` names callables the value must also have (duck-typed kinds such as a tokenizer, whose
    libraries share no base class). Used at every public entry point that takes a router, a cost model,
    a tokenizer or a drafter, so a wrong object fails there and not as an ``AttributeError`` deep inside.
    """
    ok = kind is None or isinstance(value, kind)
    missing = [m for m in methods if not callable(getattr(value, m, None))] if ok else []
    if not ok or missing:
        lacks = f" (it has no {', '.join(repr(m) for m in missing)} method)" if missing else ""
        raise ValueError(f"{name} must be {what}; got {type(value).__name__} {_clip(value)}{lacks}")
    return value
