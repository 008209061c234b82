"""Exercise checkers: turn a student's answer into feedback they can act on.

A checker never raises on a bad answer (a string, ``None``, NaN, a list of the wrong shape): it
returns a :class:`Feedback` that says what was expected and what was got, so a notebook cell shows a
one-line verdict instead of a traceback. :func:`require` turns a failed feedback into an
``AssertionError`` for nbgrader's locked check cells, which grade by "did the cell raise".

Exercises are registered in :data:`EXERCISES` (key ``"<notebook>.<id>"``, e.g. ``"03.r_star"``) by the
per-notebook modules of :mod:`moelab.course`; each entry carries a correct and a typical wrong answer
so the test suite can prove every checker accepts the one and rejects the other.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVELS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: never just True/False, always a message a student can act on.

    Parameters
    ----------
    ok : bool
        Whether the answer is accepted.
    message : str
        What was expected, what was got and, when wrong, where to look.
    """

    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{'✅' if self.ok else '❌'} {self.message}"

    def _repr_markdown_(self) -> str:
        return f"{'✅' if self.ok else '❌'} {self.message}"


def _describe(value: object) -> str:
    """A short description of what the student handed in, e.g. ``str 'abc'`` or ``list of shape (3,)``."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _with_hint(message: str, hint: str) -> str:
    return f"{message} Hint: {hint}" if hint else message


def _as_real(answer: object) -> float | None:
    """``answer`` as a finite float, or ``None`` when it is not one real number (bool is not a number)."""
    if isinstance(answer, (bool, np.bool_)) or answer is None or isinstance(answer, (str, bytes)):
        return None
    if isinstance(answer, numbers.Real):
        value = float(answer)
    else:
        try:
            array = np.asarray(answer)
        except Exception:  # any object numpy cannot read is simply "not a number"
            return None
        if array.size != 1 or array.dtype.kind not in "iuf":
            return None
        value = float(array.reshape(-1)[0])
    return value if math.isfinite(value) else None


def _close(got: float, expected: float, rtol: float, atol: float) -> bool:
    return abs(got - expected) <= atol + rtol * abs(expected)


def _tolerance_words(rtol: float, atol: float) -> str:
    parts = []
    if rtol > 0:
        parts.append(f"{rtol:.0%}" if rtol >= 0.01 else f"rtol={rtol:g}")
    if atol > 0:
        parts.append(f"±{atol:g}")
    return " + ".join(parts) if parts else "exactly"


def check_number(name: str, answer: object, expected: float, *, rtol: float = 0.02, atol: float = 0.0,
                 hint: str = "") -> Feedback:
    """Check one real number against ``expected`` within ``atol + rtol * |expected|``.

    Parameters
    ----------
    name : str
        The quantity's name as the notebook writes it (``"r*"``).
    answer : object
        What the student assigned; anything that is not one finite real number is reported, not raised.
    expected : float
        The correct value, computed by the library from the notebook's parameters.
    rtol, atol : float
        Relative and absolute tolerance (both >= 0).
    hint : str
        Where to look when the answer is wrong.

    Returns
    -------
    Feedback
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    got = _as_real(answer)
    if got is None:
        return Feedback(False, _with_hint(
            f"expected a number for `{name}` (a finite int or float), got {_describe(answer)}.", hint))
    if _close(got, float(expected), rtol, atol):
        return Feedback(True, f"`{name}` = {got:.4g} matches {float(expected):.4g}.")
    direction = "too high" if got > expected else "too low"
    return Feedback(False, _with_hint(
        f"your `{name}` is {got:.4g}, expected {float(expected):.4g} (within "
        f"{_tolerance_words(rtol, atol)}); it is {direction}.", hint))


def check_array(name: str, answer: object, expected: Any, *, rtol: float = 0.02, atol: float = 0.0,
                hint: str = "") -> Feedback:
    """Check an array element-wise: the shape first, then the first element that differs.

    Parameters
    ----------
    name : str
        The array's name as the notebook writes it.
    answer : object
        What the student assigned (list, tuple or ndarray of numbers).
    expected : array_like
        The correct values, computed by the library.
    rtol, atol : float
        Relative and absolute tolerance per element (both >= 0).
    hint : str
        Where to look when the answer is wrong.

    Returns
    -------
    Feedback
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    want = np.asarray(expected, dtype=float)
    if answer is None or isinstance(answer, (str, bytes)):
        return Feedback(False, _with_hint(
            f"expected an array of numbers of shape {want.shape} for `{name}`, got {_describe(answer)}.", hint))
    try:
        got = np.asarray(answer, dtype=float)
    except (TypeError, ValueError):
        return Feedback(False, _with_hint(
            f"expected an array of numbers of shape {want.shape} for `{name}`, got {_describe(answer)} "
            "which is not all numbers (or is ragged).", hint))
    if got.shape != want.shape:
        return Feedback(False, _with_hint(
            f"`{name}` should have shape {want.shape}, got shape {got.shape}.", hint))
    if not np.all(np.isfinite(got)):
        index = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return Feedback(False, _with_hint(f"`{name}`{list(index)} is {got[index]}, not a finite number.", hint))
    wrong = np.abs(got - want) > atol + rtol * np.abs(want)
    if not wrong.any():
        return Feedback(True, f"all {want.size} values of `{name}` match.")
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    return Feedback(False, _with_hint(
        f"{int(wrong.sum())} of {want.size} values of `{name}` differ; the first is `{name}`{list(index)} = "
        f"{got[index]:.4g}, expected {want[index]:.4g} (within {_tolerance_words(rtol, atol)}).", hint))


def check_choice(name: str, answer: object, expected: str, options: Sequence[str], *, hint: str = "") -> Feedback:
    """Check a multiple-choice answer (case and surrounding spaces ignored).

    Parameters
    ----------
    name : str
        The question's name.
    answer : object
        What the student assigned; should be one of ``options``.
    expected : str
        The correct option (must be in ``options``).
    options : Sequence[str]
        All allowed options.
    hint : str
        Where to look when the answer is wrong.

    Returns
    -------
    Feedback
    """
    normal = {str(option).strip().lower(): str(option) for option in options}
    if str(expected).strip().lower() not in normal:
        raise ValueError(f"expected must be one of options {list(options)}, got {expected!r}")
    listed = ", ".join(repr(str(option)) for option in options)
    if not isinstance(answer, str):
        return Feedback(False, _with_hint(f"expected one of {listed} for `{name}`, got {_describe(answer)}.", hint))
    key = answer.strip().lower()
    if key not in normal:
        return Feedback(False, _with_hint(f"`{name}` must be one of {listed}, got {answer!r}.", hint))
    if key == str(expected).strip().lower():
        return Feedback(True, f"`{name}` = {normal[key]!r} is right.")
    return Feedback(False, _with_hint(f"`{name}` = {normal[key]!r} is not right.", hint))


def check_callable(name: str, fn: object, cases: Sequence[tuple[tuple, float]], *, rtol: float = 0.02,
                   hint: str = "") -> Feedback:
    """Check a student's implementation of a formula on a list of cases.

    Parameters
    ----------
    name : str
        The function's name as the notebook writes it.
    fn : object
        The student's function; it is called as ``fn(*args)`` for each case.
    cases : Sequence[tuple[tuple, float]]
        ``(args, expected)`` pairs, the expected values computed by the library.
    rtol : float
        Relative tolerance per case (>= 0).
    hint : str
        Where to look when a case differs.

    Returns
    -------
    Feedback
        Names the first case that differs or raises.
    """
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    if not callable(fn):
        return Feedback(False, _with_hint(f"expected a function for `{name}`, got {_describe(fn)}.", hint))
    for args, expected in cases:
        call = f"{name}({', '.join(repr(a) for a in args)})"
        try:
            result = fn(*args)
        except Exception as error:  # the student's code failing is feedback, not a crash of the checker
            return Feedback(False, _with_hint(f"{call} raised {type(error).__name__}: {error}.", hint))
        got = _as_real(result)
        if got is None:
            return Feedback(False, _with_hint(f"{call} should return a number, returned {_describe(result)}.", hint))
        if not _close(got, float(expected), rtol, 0.0):
            return Feedback(False, _with_hint(
                f"{call} returned {got:.4g}, expected {float(expected):.4g} (within {_tolerance_words(rtol, 0.0)}).",
                hint))
    return Feedback(True, f"`{name}` agrees with the library on all {len(cases)} cases.")


def require(feedback: Feedback) -> Feedback:
    """Raise ``AssertionError(feedback.message)`` when the feedback is not ok (nbgrader grades by raising).

    Parameters
    ----------
    feedback : Feedback
        A checker's verdict.

    Returns
    -------
    Feedback
        The same feedback when ok, so the check cell still displays it.
    """
    if not isinstance(feedback, Feedback):
        raise TypeError(f"require expects a Feedback from a checker, got {type(feedback).__name__}")
    if not feedback.ok:
        raise AssertionError(feedback.message)
    return feedback


@dataclass(frozen=True)
class Exercise:
    """One registered exercise.

    Parameters
    ----------
    notebook : str
        The notebook's number, e.g. ``"03"``.
    id : str
        The exercise's id inside the notebook, e.g. ``"r_star"``.
    level : str
        ``"easy"``, ``"medium"`` or ``"hard"``.
    prompt : str
        The question as the notebook asks it.
    check : Callable[..., Feedback]
        ``check(answer, **context) -> Feedback``; ``context`` are the notebook's parameters.
    solution : Callable[..., object]
        ``solution(**context)`` -> a correct answer.
    wrong : Callable[..., object]
        ``wrong(**context)`` -> a typical wrong answer (for the tests).
    context : dict
        Default context (the notebook's default parameters) the tests call with.
    """

    notebook: str
    id: str
    level: str
    prompt: str
    check: Callable[..., Feedback]
    solution: Callable[..., object]
    wrong: Callable[..., object]
    context: dict | None = None

    @property
    def key(self) -> str:
        """The registry key ``"<notebook>.<id>"``."""
        return f"{self.notebook}.{self.id}"


EXERCISES: dict[str, Exercise] = {}


def exercise(notebook: str, id: str, level: str, prompt: str, check: Callable[..., Feedback],
             solution: Callable[..., object], wrong: Callable[..., object],
             context: dict | None = None) -> Exercise:
    """Register an exercise in :data:`EXERCISES` under ``"<notebook>.<id>"`` and return it.

    Raises
    ------
    ValueError
        When ``level`` is not one of ``"easy"``, ``"medium"``, ``"hard"`` or the key is already taken.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    entry = Exercise(notebook=notebook, id=id, level=level, prompt=prompt, check=check, solution=solution,
                     wrong=wrong, context=dict(context or {}))
    if entry.key in EXERCISES and EXERCISES[entry.key] != entry:
        raise ValueError(f"exercise {entry.key!r} is already registered")
    EXERCISES[entry.key] = entry
    return entry
